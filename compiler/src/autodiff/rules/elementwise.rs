//! Elementwise ops: arithmetic with numpy broadcasting (each gradient summed back to
//! its operand's dims), activations, casts, Where.
use super::{input, unsupported, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Attr, Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Add", add),
    ("Sub", sub),
    ("Mul", mul),
    ("Div", div),
    ("Neg", neg),
    ("Identity", identity),
    ("Relu", relu),
    ("Sigmoid", sigmoid),
    ("Tanh", tanh),
    ("Exp", exp),
    ("Log", log),
    ("Sqrt", sqrt),
    ("Reciprocal", reciprocal),
    ("Erf", erf),
    ("Pow", pow),
    ("Cast", cast),
    ("Where", where_),
];

fn out(node: &Node) -> ValueId {
    node.outputs[0]
}

/// `dy` summed to input `i`'s dims, when it needs a gradient.
fn to_input(e: &mut Emit, node: &Node, i: usize, g: ValueId) -> Result<ValueId> {
    let dims = e.dims(input(node, i));
    e.sum_to(g, &dims)
}

fn add(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let a = if need[0] { Some(to_input(e, n, 0, dy)?) } else { None };
    let b = if need[1] { Some(to_input(e, n, 1, dy)?) } else { None };
    Ok(vec![a, b])
}

fn sub(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let a = if need[0] { Some(to_input(e, n, 0, dy)?) } else { None };
    let b = if need[1] {
        let s = to_input(e, n, 1, dy)?;
        Some(e.neg(s)?)
    } else {
        None
    };
    Ok(vec![a, b])
}

fn mul(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let (a, b) = (input(n, 0), input(n, 1));
    let da = if need[0] {
        let p = e.mul(dy, b)?;
        Some(to_input(e, n, 0, p)?)
    } else {
        None
    };
    let db = if need[1] {
        let p = e.mul(dy, a)?;
        Some(to_input(e, n, 1, p)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn div(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let b = input(n, 1);
    let da = if need[0] {
        let q = e.div(dy, b)?;
        Some(to_input(e, n, 0, q)?)
    } else {
        None
    };
    // d(a/b)/db = -y/b
    let db = if need[1] {
        let p = e.mul(dy, out(n))?;
        let q = e.div(p, b)?;
        let q = e.neg(q)?;
        Some(to_input(e, n, 1, q)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn neg(e: &mut Emit, _: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    Ok(vec![Some(e.neg(dy[0].unwrap())?)])
}

fn identity(_: &mut Emit, _: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    Ok(vec![dy[0]])
}

fn relu(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // Where the output is positive the gradient passes, elsewhere 0 (PyTorch's choice
    // at 0): the output's sign is 1 or 0, and `dy * sign(y)` fuses with its neighbours
    // into one elementwise kernel.
    let s = e.op("Sign", &[out(n)], &[])?;
    Ok(vec![Some(e.mul(dy[0].unwrap(), s)?)])
}

fn sigmoid(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let y = out(n);
    let one = e.scalar(1.0, e.dtype(y));
    let c = e.sub(one, y)?;
    let d = e.mul(y, c)?;
    Ok(vec![Some(e.mul(dy[0].unwrap(), d)?)])
}

fn tanh(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let y = out(n);
    let one = e.scalar(1.0, e.dtype(y));
    let y2 = e.mul(y, y)?;
    let d = e.sub(one, y2)?;
    Ok(vec![Some(e.mul(dy[0].unwrap(), d)?)])
}

fn exp(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    Ok(vec![Some(e.mul(dy[0].unwrap(), out(n))?)])
}

fn log(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    Ok(vec![Some(e.div(dy[0].unwrap(), input(n, 0))?)])
}

fn sqrt(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let h = e.scale(dy[0].unwrap(), 0.5)?;
    Ok(vec![Some(e.div(h, out(n))?)])
}

fn reciprocal(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let y = out(n);
    let y2 = e.mul(y, y)?;
    let p = e.mul(dy[0].unwrap(), y2)?;
    Ok(vec![Some(e.neg(p)?)])
}

fn erf(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // d erf(x)/dx = 2/sqrt(pi) exp(-x^2)
    let x = input(n, 0);
    let x2 = e.mul(x, x)?;
    let m = e.neg(x2)?;
    let ex = e.op("Exp", &[m], &[])?;
    let d = e.scale(ex, std::f64::consts::FRAC_2_SQRT_PI)?;
    Ok(vec![Some(e.mul(dy[0].unwrap(), d)?)])
}

fn pow(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let (x, p) = (input(n, 0), input(n, 1));
    if e.dtype(p) != e.dtype(x) {
        return Err(unsupported(n, "an exponent of another dtype than the base"));
    }
    let dx = if need[0] {
        // p * x^(p-1)
        let one = e.scalar(1.0, e.dtype(x));
        let pm1 = e.sub(p, one)?;
        let xp = e.op("Pow", &[x, pm1], &[])?;
        let d = e.mul(xp, p)?;
        let g = e.mul(dy, d)?;
        Some(to_input(e, n, 0, g)?)
    } else {
        None
    };
    let dp = if need[1] {
        // y * ln(x)
        let l = e.op("Log", &[x], &[])?;
        let d = e.mul(out(n), l)?;
        let g = e.mul(dy, d)?;
        Some(to_input(e, n, 1, g)?)
    } else {
        None
    };
    Ok(vec![dx, dp])
}

fn cast(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    if !need[0] {
        return Ok(vec![None]);
    }
    let to = e.dtype(input(n, 0));
    Ok(vec![Some(e.op("Cast", &[dy[0].unwrap()], &[("to", Attr::Int(onnx_dtype(to)))])?)])
}

fn where_(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let dy = dy[0].unwrap();
    let c = input(n, 0);
    let zero = e.scalar(0.0, e.dtype(dy));
    let da = if need[1] {
        let w = e.op("Where", &[c, dy, zero], &[])?;
        Some(to_input(e, n, 1, w)?)
    } else {
        None
    };
    let db = if need[2] {
        let w = e.op("Where", &[c, zero, dy], &[])?;
        Some(to_input(e, n, 2, w)?)
    } else {
        None
    };
    Ok(vec![None, da, db])
}

/// The ONNX TensorProto code of a dtype (Cast's `to`).
pub(crate) fn onnx_dtype(d: kiln_graph::DType) -> i64 {
    d.onnx_code() as i64
}
