//! Pattern fusion of GELU: the exported forms `x * 0.5 * (1 + erf(x / sqrt(2)))` and
//! `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, in whatever order of
//! operands and factors the exporter wrote them, become one `Gelu` node (approximate
//! "none" or "tanh"), which the activation and elementwise fusions then fold further.
//!
//! Matching is by value, not by shape of the expression: around every Erf or Tanh the
//! pass takes the elementwise nodes between one source value and an end value (the
//! Erf/Tanh itself or up to three single-use nodes after it), whose other inputs are
//! scalar constants and whose intermediate results nobody else reads, evaluates that
//! subgraph in f64 at points across [-6, 6], and replaces it when it equals one of the
//! two GELU forms there (to 1e-5, the rounding of f32 constants).
use super::{producers, remove_nodes, use_counts};
use super::PassContext;
use kiln_graph::{Attr, DType, Graph, NodeId, ValueId};
use std::collections::BTreeSet;

/// Ops a GELU expression is written with.
const ALLOWED: &[&str] = &["Add", "Sub", "Mul", "Div", "Pow", "Erf", "Tanh", "Sqrt"];
/// The largest expression the pass looks at (the tanh form has 8 nodes).
const MAX_NODES: usize = 12;

fn allowed(g: &Graph, n: NodeId) -> bool {
    let node = &g.nodes[n];
    node.domain.is_empty() && node.outputs.len() == 1 && ALLOWED.contains(&node.op_type.as_str())
}

/// A scalar constant usable inside the expression of `x` (it must not widen x's rank).
fn scalar(g: &Graph, v: ValueId, x_rank: Option<usize>) -> Option<f64> {
    let t = g.initializers.get(&v)?;
    let fits = t.rank() == 0 || x_rank.is_some_and(|r| t.rank() <= r);
    (t.len() == 1 && fits).then(|| t.to_f64_vec()[0])
}

/// The nodes computing `end` from `x` and scalar constants alone, or None.
fn region(g: &Graph, prod: &[Option<NodeId>], x: ValueId, rank: Option<usize>, end: NodeId) -> Option<BTreeSet<NodeId>> {
    let mut set = BTreeSet::new();
    let mut todo = vec![end];
    let mut reads_x = false;
    while let Some(n) = todo.pop() {
        if !set.insert(n) {
            continue;
        }
        if set.len() > MAX_NODES || !allowed(g, n) {
            return None;
        }
        for &v in g.nodes[n].inputs.iter().flatten() {
            if v == x {
                reads_x = true;
            } else if scalar(g, v, rank).is_none() {
                todo.push(prod[v]?);
            }
        }
    }
    reads_x.then_some(set)
}

/// The expression's values at `points` (node order is topological), or None when an
/// input is missing.
fn evaluate(g: &Graph, set: &BTreeSet<NodeId>, x: ValueId, rank: Option<usize>, end: NodeId, points: &[f64]) -> Option<Vec<f64>> {
    points
        .iter()
        .map(|&p| {
            let mut vals: std::collections::HashMap<ValueId, f64> = [(x, p)].into();
            for &n in set {
                let node = &g.nodes[n];
                let arg = |i: usize| -> Option<f64> {
                    let v = node.inputs.get(i).copied().flatten()?;
                    vals.get(&v).copied().or_else(|| scalar(g, v, rank))
                };
                let a = arg(0)?;
                let r = match node.op_type.as_str() {
                    "Add" => a + arg(1)?,
                    "Sub" => a - arg(1)?,
                    "Mul" => a * arg(1)?,
                    "Div" => a / arg(1)?,
                    "Pow" => a.powf(arg(1)?),
                    "Erf" => libm::erf(a),
                    "Tanh" => a.tanh(),
                    "Sqrt" => a.sqrt(),
                    _ => return None,
                };
                vals.insert(node.outputs[0], r);
            }
            vals.get(&g.nodes[end].outputs[0]).copied()
        })
        .collect()
}

/// Which GELU `ys` (at `points`) is: Some(false) the erf form, Some(true) the tanh form.
fn gelu_form(points: &[f64], ys: &[f64]) -> Option<bool> {
    let erf = |x: f64| 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
    let tanh = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
    let close = |f: &dyn Fn(f64) -> f64| points.iter().zip(ys).all(|(&p, &y)| (y - f(p)).abs() <= 1e-5 * f(p).abs().max(1.0));
    if close(&erf) {
        Some(false)
    } else if close(&tanh) {
        Some(true)
    } else {
        None
    }
}

/// Replaces GELU expressions with Gelu nodes; returns how many.
pub fn fuse_gelu(g: &mut Graph, cx: &mut PassContext) -> usize {
    // Ranks as inferred (a constant like [1, 1, 1] is a scalar only where x has at least
    // its rank).
    let ranks: Vec<Option<usize>> = cx.types(g).iter().map(|t| t.as_ref().map(|t| t.shape.rank())).collect();
    let uses = use_counts(g);
    let prod = producers(g);
    let mut readers: Vec<Vec<NodeId>> = vec![vec![]; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &v in n.inputs.iter().flatten() {
            readers[v].push(i);
        }
    }
    let points: Vec<f64> = (0..=48).map(|i| -6.0 + 0.25 * i as f64 + 0.0137).collect();
    let mut taken: BTreeSet<NodeId> = BTreeSet::new();
    let mut found: Vec<(BTreeSet<NodeId>, ValueId, NodeId, bool)> = vec![];
    for t in 0..g.nodes.len() {
        if !matches!(g.nodes[t].op_type.as_str(), "Erf" | "Tanh") || !allowed(g, t) || taken.contains(&t) {
            continue;
        }
        // Ends: the Erf/Tanh and up to three single-reader elementwise nodes after it.
        let mut ends = vec![t];
        while ends.len() < 4 {
            let out = g.nodes[*ends.last().expect("not empty")].outputs[0];
            match readers[out].as_slice() {
                [next] if uses[out] == 1 && allowed(g, *next) => ends.push(*next),
                _ => break,
            }
        }
        // Sources: non-constant values read within the ends' expressions.
        let mut sources: BTreeSet<ValueId> = BTreeSet::new();
        let mut todo = vec![(*ends.last().expect("not empty"), 0)];
        while let Some((n, depth)) = todo.pop() {
            for &v in g.nodes[n].inputs.iter().flatten() {
                if g.initializers.contains_key(&v) {
                    continue;
                }
                sources.insert(v);
                if let Some(p) = prod[v].filter(|&p| depth < MAX_NODES && allowed(g, p)) {
                    todo.push((p, depth + 1));
                }
            }
        }
        let hit = ends.iter().rev().find_map(|&end| {
            sources.iter().find_map(|&x| {
                if g.values[x].ty.as_ref().is_some_and(|ty| ty.dtype != DType::F32) {
                    return None;
                }
                let set = region(g, &prod, x, ranks.get(x).copied().flatten(), end)?;
                // Intermediate results must be read inside the expression only.
                let private = set.iter().filter(|&&n| n != end).all(|&n| {
                    let v = g.nodes[n].outputs[0];
                    !g.outputs.contains(&v) && readers[v].iter().all(|r| set.contains(r))
                });
                if !private || set.iter().any(|n| taken.contains(n)) {
                    return None;
                }
                let ys = evaluate(g, &set, x, ranks.get(x).copied().flatten(), end, &points)?;
                gelu_form(&points, &ys).map(|tanh| (set, x, end, tanh))
            })
        });
        if let Some((set, x, end, tanh)) = hit {
            taken.extend(set.iter().copied());
            found.push((set, x, end, tanh));
        }
    }
    let mut dead = vec![];
    for (set, x, end, tanh) in &found {
        let node = &mut g.nodes[*end];
        node.op_type = "Gelu".into();
        node.domain = String::new();
        node.inputs = vec![Some(*x)];
        node.attrs = [("approximate".to_string(), Attr::String(if *tanh { "tanh" } else { "none" }.into()))].into_iter().collect();
        dead.extend(set.iter().copied().filter(|n| n != end));
    }
    dead.sort_unstable();
    remove_nodes(g, &dead);
    found.len()
}
