//! The small expression language of custom-op manifests: output dims, invocation
//! counts and costs as integer expressions over the dims of the op's values and its
//! integer attributes.
//!
//! ```text
//! expr   := term (("+" | "-") term)*
//! term   := factor (("*" | "/" | "%") factor)*        / and % round towards -inf
//! factor := INT | NAME | NAME "[" INT "]" | FUNC "(" args ")" | "(" expr ")" | "-" factor
//! FUNC   := max | min | ceil_div | rank | numel     rank(NAME), numel(NAME): of a value
//! ```
//!
//! `x[1]` is dim 1 of value `x` (negative indices count from the end); a bare `NAME` is
//! an integer attribute.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Int(i64),
    Attr(String),
    Dim(String, i64),
    Rank(String),
    Numel(String),
    Call(Func, Vec<Expr>),
    Neg(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Max,
    Min,
    CeilDiv,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// What an expression's names refer to when it is evaluated.
pub trait Scope {
    /// The dims of value `name` (an input, or for some rules an output).
    fn dims(&self, name: &str) -> Option<&[usize]>;
    /// The value of integer attribute `name`.
    fn attr(&self, name: &str) -> Option<i64>;
}

impl Expr {
    /// Parses `text`; the error says what was expected where.
    pub fn parse(text: &str) -> Result<Expr, String> {
        let tokens = lex(text)?;
        let mut p = Parser { tokens, pos: 0 };
        let e = p.expr()?;
        match p.peek() {
            None => Ok(e),
            Some(t) => Err(format!("unexpected '{t}' after a complete expression")),
        }
    }

    /// Every value name (dims, rank, numel) and attribute name the expression reads.
    pub fn names(&self, values: &mut Vec<String>, attrs: &mut Vec<String>) {
        match self {
            Expr::Int(_) => {}
            Expr::Attr(a) => attrs.push(a.clone()),
            Expr::Dim(v, _) | Expr::Rank(v) | Expr::Numel(v) => values.push(v.clone()),
            Expr::Call(_, args) => args.iter().for_each(|a| a.names(values, attrs)),
            Expr::Neg(e) => e.names(values, attrs),
            Expr::Bin(_, a, b) => {
                a.names(values, attrs);
                b.names(values, attrs);
            }
        }
    }

    pub fn eval(&self, scope: &dyn Scope) -> Result<i64, String> {
        let dims = |v: &str| scope.dims(v).ok_or_else(|| format!("no value named '{v}'"));
        let checked = |r: Option<i64>| r.ok_or_else(|| format!("'{self}' overflows 64 bits"));
        Ok(match self {
            Expr::Int(i) => *i,
            Expr::Attr(a) => scope.attr(a).ok_or_else(|| format!("no integer attribute named '{a}'"))?,
            Expr::Dim(v, i) => {
                let d = dims(v)?;
                let k = if *i < 0 { *i + d.len() as i64 } else { *i };
                if k < 0 || k >= d.len() as i64 {
                    return Err(format!("{v}[{i}]: '{v}' has rank {} (dims {d:?})", d.len()));
                }
                d[k as usize] as i64
            }
            Expr::Rank(v) => dims(v)?.len() as i64,
            Expr::Numel(v) => checked(dims(v)?.iter().try_fold(1i64, |a, &d| a.checked_mul(d as i64)))?,
            Expr::Neg(e) => checked(e.eval(scope)?.checked_neg())?,
            Expr::Call(f, args) => {
                let a = args[0].eval(scope)?;
                let b = args[1].eval(scope)?;
                match f {
                    Func::Max => a.max(b),
                    Func::Min => a.min(b),
                    Func::CeilDiv => {
                        if b == 0 {
                            return Err(format!("'{self}' divides by zero"));
                        }
                        checked(a.checked_add(b - b.signum()).and_then(|n| n.checked_div_euclid(b)))?
                    }
                }
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(scope)?, b.eval(scope)?);
                if matches!(op, BinOp::Div | BinOp::Rem) && b == 0 {
                    return Err(format!("'{self}' divides by zero"));
                }
                checked(match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::Div => floor_div(a, b),
                    BinOp::Rem => floor_div(a, b).and_then(|q| b.checked_mul(q)).and_then(|bq| a.checked_sub(bq)),
                })?
            }
        })
    }
}

/// `a / b` rounded towards negative infinity (None on overflow; `b` is not 0).
fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div_euclid(b)?;
    Some(if b < 0 && a.checked_rem_euclid(b)? != 0 { q - 1 } else { q })
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Int(i) => write!(f, "{i}"),
            Expr::Attr(a) => f.write_str(a),
            Expr::Dim(v, i) => write!(f, "{v}[{i}]"),
            Expr::Rank(v) => write!(f, "rank({v})"),
            Expr::Numel(v) => write!(f, "numel({v})"),
            Expr::Call(func, args) => {
                let name = match func {
                    Func::Max => "max",
                    Func::Min => "min",
                    Func::CeilDiv => "ceil_div",
                };
                write!(f, "{name}({}, {})", args[0], args[1])
            }
            Expr::Neg(e) => write!(f, "-({e})"),
            Expr::Bin(op, a, b) => {
                let s = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                    BinOp::Rem => "%",
                };
                write!(f, "({a} {s} {b})")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Int(i64),
    Name(String),
    Sym(char),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Int(i) => write!(f, "{i}"),
            Token::Name(n) => f.write_str(n),
            Token::Sym(c) => write!(f, "{c}"),
        }
    }
}

fn lex(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            out.push(Token::Int(s.parse().map_err(|_| format!("'{s}' is too large for a 64-bit integer"))?));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Name(chars[start..i].iter().collect()));
        } else if "+-*/%()[],".contains(c) {
            out.push(Token::Sym(c));
            i += 1;
        } else {
            return Err(format!("unexpected character '{c}' (expected a number, a name, an operator + - * / %, or brackets)"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        match self.next() {
            Some(Token::Sym(s)) if s == c => Ok(()),
            Some(t) => Err(format!("expected '{c}', found '{t}'")),
            None => Err(format!("expected '{c}', found the end of the expression")),
        }
    }
    fn expr(&mut self) -> Result<Expr, String> {
        let mut e = self.term()?;
        while let Some(Token::Sym(c @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            let op = if c == '+' { BinOp::Add } else { BinOp::Sub };
            e = Expr::Bin(op, Box::new(e), Box::new(self.term()?));
        }
        Ok(e)
    }
    fn term(&mut self) -> Result<Expr, String> {
        let mut e = self.factor()?;
        while let Some(Token::Sym(c @ ('*' | '/' | '%'))) = self.peek().cloned() {
            self.pos += 1;
            let op = match c {
                '*' => BinOp::Mul,
                '/' => BinOp::Div,
                _ => BinOp::Rem,
            };
            e = Expr::Bin(op, Box::new(e), Box::new(self.factor()?));
        }
        Ok(e)
    }
    fn factor(&mut self) -> Result<Expr, String> {
        match self.next() {
            Some(Token::Int(i)) => Ok(Expr::Int(i)),
            Some(Token::Sym('-')) => Ok(Expr::Neg(Box::new(self.factor()?))),
            Some(Token::Sym('(')) => {
                let e = self.expr()?;
                self.expect(')')?;
                Ok(e)
            }
            Some(Token::Name(name)) => match self.peek() {
                Some(Token::Sym('[')) => {
                    self.pos += 1;
                    let neg = matches!(self.peek(), Some(Token::Sym('-')));
                    if neg {
                        self.pos += 1;
                    }
                    let i = match self.next() {
                        Some(Token::Int(i)) => i,
                        Some(t) => return Err(format!("{name}[...]: expected a dim index (an integer), found '{t}'")),
                        None => return Err(format!("{name}[...]: expected a dim index, found the end of the expression")),
                    };
                    self.expect(']')?;
                    Ok(Expr::Dim(name, if neg { -i } else { i }))
                }
                Some(Token::Sym('(')) => {
                    self.pos += 1;
                    let e = match name.as_str() {
                        "rank" | "numel" => {
                            let v = match self.next() {
                                Some(Token::Name(v)) => v,
                                _ => return Err(format!("{name}(...) takes the name of an input or output")),
                            };
                            if name == "rank" {
                                Expr::Rank(v)
                            } else {
                                Expr::Numel(v)
                            }
                        }
                        "max" | "min" | "ceil_div" => {
                            let a = self.expr()?;
                            self.expect(',')?;
                            let b = self.expr()?;
                            let f = match name.as_str() {
                                "max" => Func::Max,
                                "min" => Func::Min,
                                _ => Func::CeilDiv,
                            };
                            Expr::Call(f, vec![a, b])
                        }
                        _ => return Err(format!("unknown function '{name}' (expected max, min, ceil_div, rank or numel)")),
                    };
                    self.expect(')')?;
                    Ok(e)
                }
                _ => Ok(Expr::Attr(name)),
            },
            Some(t) => Err(format!("expected a number, a name or '(', found '{t}'")),
            None => Err("expected a number, a name or '(', found the end of the expression".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct S(HashMap<&'static str, Vec<usize>>, HashMap<&'static str, i64>);
    impl Scope for S {
        fn dims(&self, name: &str) -> Option<&[usize]> {
            self.0.get(name).map(|d| d.as_slice())
        }
        fn attr(&self, name: &str) -> Option<i64> {
            self.1.get(name).copied()
        }
    }

    fn eval(text: &str) -> Result<i64, String> {
        let s = S([("x", vec![2, 3, 5])].into(), [("k", 4), ("neg", -7)].into());
        Expr::parse(text)?.eval(&s)
    }

    #[test]
    fn expressions_evaluate_with_precedence_and_floor_division() {
        assert_eq!(eval("x[0] * x[1] + x[-1]").unwrap(), 11);
        assert_eq!(eval("(x[0] + x[1]) * k").unwrap(), 20);
        assert_eq!(eval("rank(x) + numel(x)").unwrap(), 33);
        assert_eq!(eval("ceil_div(x[2], 2) + max(k, 9) - min(1, -2)").unwrap(), 14);
        assert_eq!(eval("neg / 2").unwrap(), -4);
        assert_eq!(eval("neg % 2").unwrap(), 1);
        assert_eq!(eval("7 / -2").unwrap(), -4);
        assert_eq!(eval("7 % -2").unwrap(), -1);
        assert_eq!(eval("-x[0]").unwrap(), -2);
    }

    #[test]
    fn mistakes_say_what_was_expected() {
        for (text, want) in [
            ("x[0] +", "found the end"),
            ("x[a]", "expected a dim index"),
            ("foo(x)", "unknown function 'foo'"),
            ("x[0] $ 2", "unexpected character '$'"),
            ("x[0] 2", "unexpected '2'"),
            ("(x[0]", "expected ')'"),
        ] {
            let e = Expr::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        for (text, want) in [("x[3]", "rank 3"), ("y[0]", "no value named 'y'"), ("q", "no integer attribute named 'q'"), ("k / (x[0] - 2)", "divides by zero")] {
            let e = eval(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
