//! LayerNormalization from its decomposed form, as exporters before opset 17 write it:
//!
//! ```text
//! m = ReduceMean(x, axes=[-1]);  d = Sub(x, m);  v = ReduceMean(Pow(d, 2), axes=[-1])
//! y = Div(d, Sqrt(Add(v, eps)))  [ * gamma ]  [ + beta ]
//! ```
//!
//! becomes one `LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps)` (one kernel, one
//! pass over the row instead of nine). Every intermediate must be read only inside the
//! pattern, the reductions must be over the last axis only with keepdims, and eps,
//! gamma and beta must be constants. Without gamma (or beta) a ones (zeros) vector of the
//! normalised dim's size is added, when that size is known.
use super::{producers, use_counts};
use super::PassContext;
use kiln_graph::{Attr, DType, Graph, NodeId, Tensor, ValueId};

struct Found {
    x: ValueId,
    eps: f32,
    gamma: Option<ValueId>,
    beta: Option<ValueId>,
    out: ValueId,
    nodes: Vec<NodeId>,
}

fn last_axis_mean(g: &Graph, n: NodeId) -> bool {
    let node = &g.nodes[n];
    if node.op_type != "ReduceMean" || !node.domain.is_empty() {
        return false;
    }
    let keep = !matches!(node.attrs.get("keepdims"), Some(Attr::Int(0)));
    let axes: Option<Vec<i64>> = match (node.attrs.get("axes"), node.inputs.get(1).copied().flatten()) {
        (Some(Attr::Ints(a)), _) => Some(a.clone()),
        (None, Some(v)) => g.initializers.get(&v).and_then(|t| t.to_i64_vec().ok()),
        _ => None,
    };
    keep && axes.as_deref() == Some(&[-1])
}

fn scalar(g: &Graph, v: Option<ValueId>) -> Option<f64> {
    let t = g.initializers.get(&v?)?;
    (t.len() == 1).then(|| t.to_f64_vec()[0])
}

/// The producer of `v` if it is op `op`, read only once.
fn only(g: &Graph, prod: &[Option<NodeId>], uses: &[usize], v: ValueId, op: &str) -> Option<NodeId> {
    let p = prod[v]?;
    (g.nodes[p].op_type == op && g.nodes[p].domain.is_empty() && uses[v] == 1).then_some(p)
}

/// The other input of binary node `n` besides `v`.
fn other(g: &Graph, n: NodeId, v: ValueId) -> Option<ValueId> {
    let i = &g.nodes[n].inputs;
    match (i.first().copied().flatten(), i.get(1).copied().flatten()) {
        (Some(a), Some(b)) if a == v => Some(b),
        (Some(a), Some(b)) if b == v => Some(a),
        _ => None,
    }
}

fn match_at(g: &Graph, prod: &[Option<NodeId>], uses: &[usize], div: NodeId) -> Option<Found> {
    let dn = &g.nodes[div];
    if dn.op_type != "Div" || !dn.domain.is_empty() {
        return None;
    }
    let (d, std) = (dn.inputs.first().copied().flatten()?, dn.inputs.get(1).copied().flatten()?);
    let sqrt = only(g, prod, uses, std, "Sqrt")?;
    let add_eps = only(g, prod, uses, g.nodes[sqrt].inputs.get(0).copied().flatten()?, "Add")?;
    let var = g.nodes[add_eps].inputs.iter().flatten().copied().find(|&v| scalar(g, Some(v)).is_none())?;
    let eps = scalar(g, other(g, add_eps, var))?;
    let var_mean = only(g, prod, uses, var, "ReduceMean")?;
    if !last_axis_mean(g, var_mean) {
        return None;
    }
    let pow = only(g, prod, uses, g.nodes[var_mean].inputs.get(0).copied().flatten()?, "Pow")?;
    if g.nodes[pow].inputs[0] != Some(d) || scalar(g, g.nodes[pow].inputs.get(1).copied().flatten()) != Some(2.0) {
        return None;
    }
    // d = x - mean: read by Pow and Div only.
    let sub = prod[d].filter(|&p| g.nodes[p].op_type == "Sub" && uses[d] == 2)?;
    let (x, mean) = (g.nodes[sub].inputs.get(0).copied().flatten()?, g.nodes[sub].inputs.get(1).copied().flatten()?);
    let mean_node = only(g, prod, uses, mean, "ReduceMean")?;
    if !last_axis_mean(g, mean_node) || g.nodes[mean_node].inputs[0] != Some(x) {
        return None;
    }
    let mut nodes = vec![mean_node, sub, pow, var_mean, add_eps, sqrt, div];
    let mut out = dn.outputs[0];
    // Optional affine: * gamma, + beta (constants).
    let reader = |v: ValueId| (uses[v] == 1).then(|| g.nodes.iter().position(|n| n.inputs.contains(&Some(v)))).flatten();
    let mut gamma = None;
    if let Some(m) = reader(out).filter(|&m| g.nodes[m].op_type == "Mul" && g.nodes[m].domain.is_empty()) {
        if let Some(c) = other(g, m, out).filter(|c| g.initializers.contains_key(c)) {
            gamma = Some(c);
            nodes.push(m);
            out = g.nodes[m].outputs[0];
        }
    }
    let mut beta = None;
    if let Some(a) = reader(out).filter(|&a| g.nodes[a].op_type == "Add" && g.nodes[a].domain.is_empty()) {
        if let Some(c) = other(g, a, out).filter(|c| g.initializers.contains_key(c)) {
            beta = Some(c);
            nodes.push(a);
            out = g.nodes[a].outputs[0];
        }
    }
    Some(Found { x, eps: eps as f32, gamma, beta, out, nodes })
}

/// Replaces decomposed layer norms; returns how many.
pub fn fuse_layernorm(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let mut fused = 0;
    // Patterns found but not fusable (by their output): skipped, the scan goes on.
    let mut rejected: Vec<ValueId> = vec![];
    loop {
        let (prod, uses) = (producers(g), use_counts(g));
        let found = (0..g.nodes.len()).find_map(|n| match_at(g, &prod, &uses, n).filter(|f| !rejected.contains(&f.out)));
        let Some(f) = found else { return fused };
        let ty = types.get(f.x).cloned().flatten();
        let width = ty.as_ref().and_then(|t| t.shape.0.last()).and_then(|d| d.fixed());
        let f32_input = ty.as_ref().is_some_and(|t| t.dtype == DType::F32);
        let vector = |v: Option<ValueId>| v.and_then(|v| g.initializers.get(&v)).map(|t| t.len());
        // The normalised width must be known, and gamma and beta vectors of it.
        let n = width.or(vector(f.gamma)).or(vector(f.beta));
        let widths_ok = |n: usize| [vector(f.gamma), vector(f.beta)].iter().flatten().all(|&l| l == n);
        let Some(n) = n.filter(|&n| f32_input && widths_ok(n)) else {
            rejected.push(f.out);
            continue;
        };
        let base = g.nodes[*f.nodes.last().expect("a pattern has nodes")].name.clone();
        let mut param = |v: Option<ValueId>, fill: f32, name: &str| -> ValueId {
            let t = match v.and_then(|v| g.initializers.get(&v)) {
                Some(t) => Tensor::from_f64(DType::F32, &[n], &t.to_f64_vec()).expect("n values"),
                None => Tensor::from_vec(&[n], vec![fill; n]).expect("n values"),
            };
            let id = g.add_value(name.to_string(), None);
            g.initializers.insert(id, t);
            id
        };
        let scale = param(f.gamma, 1.0, &format!("{base}.scale"));
        let bias = param(f.beta, 0.0, &format!("{base}.bias"));
        let last = *f.nodes.last().expect("a pattern has nodes");
        let node = &mut g.nodes[last];
        node.op_type = "LayerNormalization".into();
        node.domain = String::new();
        node.attrs = [("axis".to_string(), Attr::Int(-1)), ("epsilon".to_string(), Attr::Float(f.eps))].into_iter().collect();
        node.inputs = vec![Some(f.x), Some(scale), Some(bias)];
        node.outputs = vec![f.out];
        let dead: Vec<NodeId> = f.nodes.iter().copied().filter(|&n| n != last).collect();
        super::remove_nodes(g, &dead);
        fused += 1;
    }
}
