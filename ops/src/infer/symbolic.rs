//! Symbolic shapes, checked when a session is created.
//!
//! A model's inputs may have named symbolic dims (batch, sequence). Before any input is
//! seen, the session infers the whole graph for several generic bindings of the symbols
//! (probes: distinct primes), reusing every op's concrete inference and the host folding
//! of shape subgraphs. Each dim of each value is then fitted, across the probes, by a
//! small polynomial in the symbols (`48`, `seq`, `seq+1`, `2*seq`, `batch*seq`,
//! `past+seq`): shape arithmetic stays symbolic where it can, and the session reports
//! its outputs' symbolic shapes.
//!
//! When every probe fails at the same node, the node is re-checked alone: its inputs'
//! symbolic dims (and symbolic values of shape tensors) are evaluated for candidate
//! values of the symbols (1 and the fixed sizes the node sees). If none works, the model
//! can never run and the session fails now, naming the node and the symbols ("for
//! every value of seq: ..."). If some work, the model runs only for those values, and a
//! warning says which. Failures that depend on values rather than types (an index out
//! of range while folding) or on dims that cannot be fitted are left to run time.
use super::walk::{Limits, SpecializeError, Walk};
use super::{InferError, Result};
use crate::{Arg, Op, OpError, Registry, TensorType};
use kiln_graph::{DType, Dim, Graph, NodeId, Shape, Tensor, ValueId};
use std::collections::BTreeSet;

/// Probe values: symbol `i` of probe `k` gets `PRIMES[k * symbols + i]`.
const PRIMES: [i64; 40] = [
    37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181,
    191, 193, 197, 199, 211, 223, 227, 229, 233,
];
const PROBES: usize = 4;
/// Most symbols probed (PROBES * MAX_SYMBOLS <= PRIMES.len()).
const MAX_SYMBOLS: usize = 10;
/// Largest integer tensor whose elements are fitted as symbolic values.
const MAX_SYMBOLIC_VALUE: usize = 64;
/// Most assignments tried when re-checking a failing node.
const MAX_ASSIGNMENTS: usize = 20_000;

/// A polynomial in the symbols: sum of `coef * product(symbols)` (degree <= 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SymExpr {
    terms: Vec<(i64, Vec<usize>)>,
}

impl SymExpr {
    fn constant(c: i64) -> SymExpr {
        SymExpr { terms: vec![(c, vec![])] }
    }

    fn new(mut terms: Vec<(i64, Vec<usize>)>) -> SymExpr {
        terms.retain(|(c, _)| *c != 0);
        terms.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
        if terms.is_empty() {
            terms.push((0, vec![]));
        }
        SymExpr { terms }
    }

    fn eval(&self, vals: &[i64]) -> i64 {
        self.terms.iter().map(|(c, m)| c * m.iter().map(|&s| vals[s]).product::<i64>()).sum()
    }

    fn as_constant(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [(c, m)] if m.is_empty() => Some(*c),
            _ => None,
        }
    }

    fn symbols(&self) -> impl Iterator<Item = usize> + '_ {
        self.terms.iter().flat_map(|(_, m)| m.iter().copied())
    }

    fn render(&self, names: &[String]) -> String {
        let mut out = String::new();
        for (i, (c, m)) in self.terms.iter().enumerate() {
            let mono = m.iter().map(|&s| names[s].as_str()).collect::<Vec<_>>().join("*");
            let (sign, mag) = if *c < 0 { ("-", -c) } else { ("+", *c) };
            if i > 0 || sign == "-" {
                out += sign;
            }
            out += &match (mag, mono.is_empty()) {
                (_, true) => mag.to_string(),
                (1, false) => mono,
                (_, false) => format!("{mag}*{mono}"),
            };
        }
        out
    }
}

/// Fits `samples[k]` (the value seen under probe `k`) by a polynomial in the symbols.
fn fit(samples: &[i64], probes: &[Vec<i64>]) -> Option<SymExpr> {
    let n = probes.first().map_or(0, |p| p.len());
    let ok = |e: &SymExpr| probes.iter().zip(samples).all(|(p, &v)| e.eval(p) == v);
    if samples.iter().all(|&v| v == samples[0]) {
        return Some(SymExpr::constant(samples[0]));
    }
    let (p0, p1, v0, v1) = (&probes[0], &probes[1], samples[0], samples[1]);
    // a*s + b
    for s in 0..n {
        let den = p1[s] - p0[s];
        if den != 0 && (v1 - v0) % den == 0 {
            let a = (v1 - v0) / den;
            let e = SymExpr::new(vec![(a, vec![s]), (v0 - a * p0[s], vec![])]);
            if ok(&e) {
                return Some(e);
            }
        }
    }
    for s in 0..n {
        for t in s..n {
            // a*s*t + b
            let (m0, m1) = (p0[s] * p0[t], p1[s] * p1[t]);
            if m1 != m0 && (v1 - v0) % (m1 - m0) == 0 {
                let a = (v1 - v0) / (m1 - m0);
                let e = SymExpr::new(vec![(a, vec![s, t]), (v0 - a * m0, vec![])]);
                if ok(&e) {
                    return Some(e);
                }
            }
            // a*s + b*t + c (three probes solve it, the others check it)
            if t != s && probes.len() >= 4 {
                if let Some(e) = fit_two_linear(s, t, samples, probes) {
                    if ok(&e) {
                        return Some(e);
                    }
                }
            }
        }
    }
    None
}

fn fit_two_linear(s: usize, t: usize, v: &[i64], p: &[Vec<i64>]) -> Option<SymExpr> {
    // Rows (p_k[s], p_k[t], 1) . (a, b, c) = v_k for k = 0..3, by Cramer's rule.
    let m = [[p[0][s], p[0][t], 1], [p[1][s], p[1][t], 1], [p[2][s], p[2][t], 1]];
    let det3 = |m: [[i64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det3(m);
    if d == 0 {
        return None;
    }
    let mut coef = [0i64; 3];
    for (col, c) in coef.iter_mut().enumerate() {
        let mut mm = m;
        for row in 0..3 {
            mm[row][col] = v[row];
        }
        let n = det3(mm);
        if n % d != 0 {
            return None;
        }
        *c = n / d;
    }
    Some(SymExpr::new(vec![(coef[0], vec![s]), (coef[1], vec![t]), (coef[2], vec![])]))
}

/// What the checks found: the outputs' symbolic shapes.
#[derive(Clone, Debug, Default)]
pub struct SymbolicShapes {
    /// Per graph output: its shape with fitted dims (`Dim::Sym("batch*seq")`), unknown
    /// dims as `Dim::Sym("?")`; `None` when the rank is unknown.
    pub outputs: Vec<Option<Shape>>,
}

/// The model's symbols, their probe bindings, and the inference walk of each probe
/// (with the node it stopped at, if any). `None` when there are too many symbols.
#[allow(clippy::type_complexity)]
fn probe(graph: &Graph, ops: &[Box<dyn Op>], order: &[NodeId]) -> Option<(Vec<String>, Vec<Vec<i64>>, Vec<Walk>, Vec<Option<(NodeId, SpecializeError)>>)> {
    let mut names: Vec<String> = vec![];
    for &v in &graph.inputs {
        for d in &graph.values[v].ty.as_ref()?.shape.0 {
            if let Dim::Sym(s) = d {
                if !names.contains(s) {
                    names.push(s.clone());
                }
            }
        }
    }
    if names.len() > MAX_SYMBOLS {
        log::info!("'{}' has {} symbolic dims; shapes are checked when inputs are bound", graph.name, names.len());
        return None;
    }
    let probe_count = if names.is_empty() { 1 } else { PROBES };
    let probes: Vec<Vec<i64>> = (0..probe_count).map(|k| (0..names.len()).map(|i| PRIMES[k * names.len() + i]).collect()).collect();
    let mut walks = vec![];
    let mut failures: Vec<Option<(NodeId, SpecializeError)>> = vec![];
    for p in &probes {
        let mut types = vec![];
        for &v in &graph.inputs {
            let ty = graph.values[v].ty.as_ref()?;
            let dims = ty.shape.0.iter().map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Sym(s) => p[names.iter().position(|x| x == s).expect("collected above")] as usize,
            });
            types.push(match ty.kind {
                kiln_graph::ValueKind::Tensor => TensorType::new(ty.dtype, dims.collect::<Vec<_>>()),
                kind => TensorType::container(kind, ty.dtype),
            });
        }
        let mut walk = Walk::new(graph, &types, &vec![None; types.len()], Limits::default());
        failures.push(walk.run(graph, ops, order).err());
        walks.push(walk);
    }
    Some((names, probes, walks, failures))
}

/// Runs the probes; fails only when some node can never run.
pub fn check(graph: &Graph, ops: &[Box<dyn Op>], order: &[NodeId]) -> Result<SymbolicShapes> {
    let Some((names, probes, walks, failures)) = probe(graph, ops, order) else { return Ok(SymbolicShapes::default()) };
    let probe_set = ProbeSet { names: &names, probes: &probes, walks: &walks };
    let first = failures.iter().map(|f| f.as_ref().map(|(n, _)| *n)).collect::<Vec<_>>();
    for (p, f) in probes.iter().zip(&failures) {
        if let Some((node, e)) = f {
            let e = match e {
                SpecializeError::Other(e) | SpecializeError::NeedsValue { error: e, .. } => e,
            };
            log::debug!("symbolic probe {p:?} of {names:?} stopped at node '{}': {e}", graph.nodes[*node].name);
        }
    }
    if let Some((node, SpecializeError::Other(error))) = &failures[0] {
        if first.iter().all(|f| *f == Some(*node)) {
            probe_set.recheck(graph, ops, *node, error)?;
        }
    }
    let outputs = graph.outputs.iter().map(|&v| probe_set.value_type(v).map(|t| t.shape)).collect();
    Ok(SymbolicShapes { outputs })
}

/// The type of every value as far as inference reaches, with dims fitted in terms of
/// the input symbols (`Dim::Sym("batch*seq")`; `?` for a dim that does not fit): what
/// graph passes know about shapes before inputs are bound. `None` for values past a
/// node that cannot be inferred without input values, and for every value of a graph
/// that cannot be inferred at all.
pub fn value_types(graph: &Graph, registry: &Registry) -> Vec<Option<kiln_graph::ValueType>> {
    let none = vec![None; graph.values.len()];
    let (Ok(order), Ok(ops)) = (graph.validate(), super::create_ops(graph, registry)) else { return none };
    let Some((names, probes, walks, _)) = probe(graph, &ops, &order) else { return none };
    let probe_set = ProbeSet { names: &names, probes: &probes, walks: &walks };
    (0..graph.values.len()).map(|v| probe_set.value_type(v)).collect()
}

struct ProbeSet<'a> {
    names: &'a [String],
    probes: &'a [Vec<i64>],
    walks: &'a [Walk],
}

/// A node input seen symbolically: dtype, dims, and (for small integer tensors) values.
struct SymInput {
    dtype: DType,
    dims: Vec<SymExpr>,
    value: Option<SymValue>,
}

enum SymValue {
    Fixed(Tensor),
    Exprs(Vec<SymExpr>),
}

impl ProbeSet<'_> {
    fn dim(&self, e: &SymExpr) -> Dim {
        match e.as_constant() {
            Some(c) if c >= 0 => Dim::Fixed(c as usize),
            _ => Dim::Sym(e.render(self.names)),
        }
    }

    /// Value `v`'s dtype and fitted shape (unknown dims as `?`).
    fn value_type(&self, v: ValueId) -> Option<kiln_graph::ValueType> {
        let ty = self.walks.first()?.types[v].as_ref()?;
        let dtype = ty.dtype;
        if !ty.is_tensor() {
            return Some(kiln_graph::ValueType::container(ty.kind, dtype, Shape::default()));
        }
        let dims = self.shape(v)?;
        Some(kiln_graph::ValueType { kind: kiln_graph::ValueKind::Tensor, dtype, shape: Shape(dims.into_iter().map(|d| d.map_or(Dim::Sym("?".into()), |e| self.dim(&e))).collect()) })
    }

    /// Fitted dims of value `v` (None per dim that does not fit; None if untyped).
    fn shape(&self, v: ValueId) -> Option<Vec<Option<SymExpr>>> {
        let types: Vec<&TensorType> = self.walks.iter().map(|w| w.types[v].as_ref()).collect::<Option<_>>()?;
        let rank = types[0].rank();
        if types.iter().any(|t| t.rank() != rank) {
            return None;
        }
        Some((0..rank).map(|d| fit(&types.iter().map(|t| t.dims[d] as i64).collect::<Vec<_>>(), self.probes)).collect())
    }

    fn input(&self, v: ValueId) -> Option<SymInput> {
        if !self.walks.first()?.types[v].as_ref()?.is_tensor() {
            return None;
        }
        let dims: Vec<SymExpr> = self.shape(v)?.into_iter().collect::<Option<_>>()?;
        let dtype = self.walks[0].types[v].as_ref()?.dtype;
        let values: Vec<Option<&Tensor>> = self.walks.iter().map(|w| w.constants.get(&v)).collect();
        let value = if values.iter().all(|x| x.is_none()) {
            None
        } else {
            let values: Vec<&Tensor> = values.into_iter().collect::<Option<_>>()?;
            if values.iter().all(|t| t.dims() == values[0].dims() && t.bytes() == values[0].bytes()) {
                Some(SymValue::Fixed(values[0].clone()))
            } else if dtype.is_float() || values[0].len() > MAX_SYMBOLIC_VALUE || values.iter().any(|t| t.len() != values[0].len()) {
                return None;
            } else {
                let per_probe: Vec<Vec<i64>> = values.iter().map(|t| t.to_i64_vec()).collect::<Result<_, _>>().ok()?;
                let exprs = (0..values[0].len()).map(|i| fit(&per_probe.iter().map(|p| p[i]).collect::<Vec<_>>(), self.probes)).collect::<Option<_>>()?;
                Some(SymValue::Exprs(exprs))
            }
        };
        Some(SymInput { dtype, dims, value })
    }

    /// Every probe failed at `node` with a type error: can any binding of the symbols
    /// make the node work?
    fn recheck(&self, graph: &Graph, ops: &[Box<dyn Op>], node: NodeId, error: &InferError) -> Result<()> {
        let n = &graph.nodes[node];
        let inputs: Option<Vec<Option<SymInput>>> = n.inputs.iter().map(|v| match v {
            Some(v) => self.input(*v).map(Some),
            None => Some(None),
        }).collect();
        let Some(inputs) = inputs else {
            log::info!("'{}' does not run with generic sizes of its symbolic dims ({error}); the shapes it accepts are checked at run time", graph.name);
            return Ok(());
        };
        let mut symbols = BTreeSet::new();
        let mut sizes = BTreeSet::from([1i64]);
        for i in inputs.iter().flatten() {
            let exprs = i.dims.iter().chain(match &i.value {
                Some(SymValue::Exprs(e)) => e.as_slice(),
                _ => &[],
            });
            for e in exprs {
                symbols.extend(e.symbols());
                if let Some(c) = e.as_constant() {
                    if c > 1 && c <= 1 << 20 {
                        sizes.insert(c);
                    }
                }
            }
        }
        let symbols: Vec<usize> = symbols.into_iter().collect();
        let mut candidates: Vec<i64> = sizes.into_iter().take(12).collect();
        if let Some(&s) = symbols.first() {
            candidates.push(self.probes[0][s]);
        }
        let combos = candidates.len().checked_pow(symbols.len() as u32).unwrap_or(usize::MAX);
        if combos > MAX_ASSIGNMENTS {
            return Ok(());
        }
        // The failure must be one of types, not of values met while folding.
        let probe0 = self.probes[0].clone();
        if self.node_infers(ops, node, &inputs, &probe0) {
            return Ok(());
        }
        let mut works: Vec<String> = vec![];
        for c in 0..combos {
            let mut vals = probe0.clone();
            let mut k = c;
            for &s in &symbols {
                vals[s] = candidates[k % candidates.len()];
                k /= candidates.len();
            }
            if self.node_infers(ops, node, &inputs, &vals) {
                works.push(symbols.iter().map(|&s| format!("{}={}", self.names[s], vals[s])).collect::<Vec<_>>().join(", "));
            }
        }
        let source = match error {
            InferError::Node { error, .. } => self.symbolize(&error.to_string()),
            other => self.symbolize(&other.to_string()),
        };
        if works.is_empty() {
            let what = if symbols.is_empty() {
                source
            } else {
                format!("for every value of {}: {source}", symbols.iter().map(|&s| self.names[s].as_str()).collect::<Vec<_>>().join(", "))
            };
            return Err(InferError::Node { node: n.name.clone(), op: n.op_type.clone(), error: OpError::invalid(what) });
        }
        works.truncate(6);
        log::warn!(
            "'{}' runs only for particular values of its symbolic dims: node '{}' ({}) accepts {} (for other sizes: {source})",
            graph.name,
            n.name,
            n.op_type,
            works.join(" or ")
        );
        Ok(())
    }

    /// Whether `node`'s inference succeeds with the symbols bound to `vals`.
    fn node_infers(&self, ops: &[Box<dyn Op>], node: NodeId, inputs: &[Option<SymInput>], vals: &[i64]) -> bool {
        let mut types = vec![];
        let mut values = vec![];
        for i in inputs {
            let Some(i) = i else {
                types.push(None);
                values.push(None);
                continue;
            };
            let dims: Vec<i64> = i.dims.iter().map(|e| e.eval(vals)).collect();
            if dims.iter().any(|&d| d < 0) {
                return false;
            }
            let dims: Vec<usize> = dims.into_iter().map(|d| d as usize).collect();
            let value = match &i.value {
                None => None,
                Some(SymValue::Fixed(t)) => Some(t.clone()),
                Some(SymValue::Exprs(e)) => {
                    let data: Vec<f64> = e.iter().map(|e| e.eval(vals) as f64).collect();
                    match Tensor::from_f64(i.dtype, &dims, &data) {
                        Ok(t) => Some(t),
                        Err(_) => return false,
                    }
                }
            };
            if value.as_ref().is_some_and(|t| t.dims() != dims.as_slice()) {
                return false;
            }
            types.push(Some(TensorType::new(i.dtype, dims)));
            values.push(value);
        }
        let args: Vec<Option<Arg>> = types.iter().zip(&values).map(|(t, v)| t.as_ref().map(|t| Arg { ty: t, value: v.as_ref() })).collect();
        ops[node].infer(&args).is_ok()
    }

    /// Writes probe 0's symbol values back as names in an error message.
    fn symbolize(&self, msg: &str) -> String {
        let mut out = String::new();
        let mut digits = String::new();
        let flush = |digits: &mut String, out: &mut String| {
            if let Ok(n) = digits.parse::<i64>() {
                match self.probes[0].iter().position(|&p| p == n) {
                    Some(s) => out.push_str(&self.names[s]),
                    None => out.push_str(digits),
                }
            }
            digits.clear();
        };
        for ch in msg.chars() {
            if ch.is_ascii_digit() {
                digits.push(ch);
            } else {
                flush(&mut digits, &mut out);
                out.push(ch);
            }
        }
        flush(&mut digits, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes(n: usize) -> Vec<Vec<i64>> {
        (0..PROBES).map(|k| (0..n).map(|i| PRIMES[k * n + i]).collect()).collect()
    }

    fn fitted(f: impl Fn(&[i64]) -> i64, n: usize) -> Option<String> {
        let p = probes(n);
        let names: Vec<String> = ["batch", "seq", "past"][..n].iter().map(|s| s.to_string()).collect();
        fit(&p.iter().map(|p| f(p)).collect::<Vec<_>>(), &p).map(|e| e.render(&names))
    }

    #[test]
    fn fits_the_shape_arithmetic_of_exported_models() {
        assert_eq!(fitted(|_| 768, 2).as_deref(), Some("768"));
        assert_eq!(fitted(|p| p[1], 2).as_deref(), Some("seq"));
        assert_eq!(fitted(|p| p[1] - 1, 2).as_deref(), Some("seq-1"));
        assert_eq!(fitted(|p| 2 * p[0] + 3, 2).as_deref(), Some("2*batch+3"));
        assert_eq!(fitted(|p| p[0] * p[1], 2).as_deref(), Some("batch*seq"));
        assert_eq!(fitted(|p| 12 * p[0] * p[1], 2).as_deref(), Some("12*batch*seq"));
        assert_eq!(fitted(|p| p[1] * p[1], 2).as_deref(), Some("seq*seq"));
        assert_eq!(fitted(|p| p[2] + p[1], 3).as_deref(), Some("seq+past"));
        assert_eq!(fitted(|p| -p[1], 2).as_deref(), Some("-seq"));
        // Floor division is not a polynomial: left unknown, never fitted wrongly.
        assert_eq!(fitted(|p| (p[1] + 1) / 2, 2), None);
    }

    #[test]
    fn symbolize_names_probe_values() {
        let names = vec!["batch".to_string(), "seq".to_string()];
        let p = probes(2);
        let set = ProbeSet { names: &names, probes: &p, walks: &[] };
        assert_eq!(set.symbolize("dims [37, 41, 64] and [1, 128]"), "dims [batch, seq, 64] and [1, 128]");
    }
}
