//! BatchNormalization folded into the linear layer before it. With constant statistics
//! BN is per channel `y * s + t` with `s = scale / sqrt(var + eps)` and
//! `t = B - mean * s`, so:
//!
//! - `BN(Conv(x, W, b))` is `Conv(x, W', b')`: each output channel's filter scaled by
//!   `s`, `b' = b * s + t`;
//! - `BN(Gemm(A, B, C))` (rank-2 output, channel = column) is `Gemm(A, B', C')`: column
//!   `n` of `op(B)` scaled by `s_n` (a row of B when `transB`), `C' = beta * C * s + t`
//!   (C broadcast to `[1 or M, N]`, beta set to 1);
//! - `BN(MatMul(A, W))` with a constant 2-D W and a rank-2 output is
//!   `Gemm(A, W', t)`: the bias appears where there was none.
//!
//! The layer's result must have no other reader and its weights must be constants.
//! New weights are written (the old ones may be shared) and dead-code elimination drops
//! the unused ones.
use super::use_counts;
use super::PassContext;
use kiln_graph::{Attr, Graph, Node, NodeId, Tensor, ValueId};
use kiln_ops::elementwise::ACTIVATION_ATTR;
use kiln_ops::{MATMUL_BIAS_ATTR, MATMUL_RESIDUAL_ATTR};

fn f64s(g: &Graph, v: Option<ValueId>) -> Option<Vec<f64>> {
    g.initializers.get(&v?).map(|t| t.to_f64_vec())
}

/// An inference-mode BatchNormalization with constant statistics, as `y * s + t`.
struct Affine {
    input: ValueId,
    s: Vec<f64>,
    t: Vec<f64>,
}

fn affine(g: &Graph, node: &Node) -> Option<Affine> {
    if node.op_type != "BatchNormalization" || !node.domain.is_empty() || node.inputs.len() < 5 {
        return None;
    }
    if matches!(node.attrs.get("training_mode"), Some(Attr::Int(t)) if *t != 0) || node.outputs.len() > 1 {
        return None;
    }
    let eps = match node.attrs.get("epsilon") {
        Some(Attr::Float(e)) => *e as f64,
        _ => 1e-5,
    };
    let (scale, shift, mean, var) = (f64s(g, node.inputs[1])?, f64s(g, node.inputs[2])?, f64s(g, node.inputs[3])?, f64s(g, node.inputs[4])?);
    let m = scale.len();
    if m == 0 || [shift.len(), mean.len(), var.len()].iter().any(|&l| l != m) {
        return None;
    }
    let s: Vec<f64> = (0..m).map(|k| scale[k] / (var[k] + eps).sqrt()).collect();
    let t = (0..m).map(|k| shift[k] - mean[k] * s[k]).collect();
    Some(Affine { input: node.inputs.get(0).copied().flatten()?, s, t })
}

/// The new weight and bias of a layer with BN folded in, and whether the node becomes
/// a Gemm with beta 1.
struct Folded {
    weight: Tensor,
    bias: Tensor,
    to_gemm: bool,
}

fn fold_conv(g: &Graph, conv: &Node, a: &Affine) -> Option<Folded> {
    let w = g.initializers.get(&conv.inputs.get(1).copied().flatten()?)?;
    let m = a.s.len();
    if w.dims().first() != Some(&m) {
        return None;
    }
    let bias = match conv.inputs.get(2).copied().flatten() {
        Some(b) => f64s(g, Some(b)).filter(|b| b.len() == m)?,
        None => vec![0.0; m],
    };
    let per = (w.len() / m).max(1);
    let wv: Vec<f64> = w.to_f64_vec().iter().enumerate().map(|(i, &x)| x * a.s[i / per]).collect();
    let bv: Vec<f64> = (0..m).map(|k| bias[k] * a.s[k] + a.t[k]).collect();
    Some(Folded { weight: Tensor::from_f64(w.dtype(), w.dims(), &wv).ok()?, bias: Tensor::from_f64(w.dtype(), &[m], &bv).ok()?, to_gemm: false })
}

/// Gemm (any transB, optional C) or MatMul with a constant 2-D weight; `rank2` says
/// the layer's output is known to be 2-D (BN's channel axis is then its last dim).
fn fold_linear(g: &Graph, node: &Node, a: &Affine, rank2: bool) -> Option<Folded> {
    let gemm = node.op_type == "Gemm";
    let float = |name: &str, default: f64| match node.attrs.get(name) {
        Some(Attr::Float(f)) => *f as f64,
        _ => default,
    };
    let int = |name: &str| matches!(node.attrs.get(name), Some(Attr::Int(v)) if *v != 0);
    if !rank2 || node.inputs.len() > if gemm { 3 } else { 2 } {
        return None;
    }
    let w = g.initializers.get(&node.inputs.get(1).copied().flatten()?)?;
    let trans_b = gemm && int("transB");
    let (k, n) = match *w.dims() {
        [r, c] if trans_b => (c, r),
        [r, c] => (r, c),
        _ => return None,
    };
    if a.s.len() != n || n == 0 {
        return None;
    }
    // Column j of op(B) is scaled by s_j: element (r, c) of B is in column c, or r when transposed.
    let wv: Vec<f64> = w.to_f64_vec().iter().enumerate().map(|(i, &x)| x * a.s[if trans_b { i / k } else { i % n }]).collect();
    let c = if gemm { node.inputs.get(2).copied().flatten() } else { None };
    let (rows, bv) = match c {
        None => (None, a.t.clone()),
        Some(c) => {
            let ct = g.initializers.get(&c)?;
            let cv = ct.to_f64_vec();
            let beta = float("beta", 1.0);
            // C right-aligned to 2-D: [cr, cc] with cc in {1, n}.
            let (cr, cc) = match *ct.dims() {
                [] => (1, 1),
                [c] => (1, c),
                [r, c] => (r, c),
                _ => return None,
            };
            if cc != 1 && cc != n {
                return None;
            }
            let at = |i: usize, j: usize| cv[i * cc + if cc == 1 { 0 } else { j }];
            let bv: Vec<f64> = (0..cr * n).map(|e| beta * at(e / n, e % n) * a.s[e % n] + a.t[e % n]).collect();
            ((cr > 1).then_some(cr), bv)
        }
    };
    let bias_dims: Vec<usize> = rows.map_or(vec![n], |r| vec![r, n]);
    Some(Folded {
        weight: Tensor::from_f64(w.dtype(), w.dims(), &wv).ok()?,
        bias: Tensor::from_f64(w.dtype(), &bias_dims, &bv).ok()?,
        to_gemm: true,
    })
}

/// Folds BatchNormalization into preceding Convs, Gemms and MatMuls; returns how many.
pub fn fold_batchnorm(g: &mut Graph, cx: &mut PassContext) -> usize {
    let uses = use_counts(g);
    let prod = super::producers(g);
    let mut dead = vec![];
    for bn in 0..g.nodes.len() {
        let Some(a) = affine(g, &g.nodes[bn]) else { continue };
        let y = a.input;
        let Some(l) = prod[y].filter(|&l| g.nodes[l].outputs.first() == Some(&y)) else { continue };
        let layer = &g.nodes[l];
        let internal = [ACTIVATION_ATTR, MATMUL_BIAS_ATTR, MATMUL_RESIDUAL_ATTR].iter().any(|k| layer.attrs.contains_key(*k));
        if !layer.domain.is_empty() || uses[y] != 1 || internal {
            continue;
        }
        let folded = match layer.op_type.as_str() {
            "Conv" => fold_conv(g, layer, &a),
            "Gemm" | "MatMul" => {
                let rank2 = cx.types(g).get(y).cloned().flatten().is_some_and(|t| t.shape.rank() == 2);
                fold_linear(g, layer, &a, rank2)
            }
            _ => None,
        };
        let Some(f) = folded else { continue };
        replace(g, l, bn, f);
        dead.push(bn);
    }
    super::remove_nodes(g, &dead);
    dead.len()
}

/// Layer `l` takes the folded weight and bias and writes BN `bn`'s output.
fn replace(g: &mut Graph, l: NodeId, bn: NodeId, f: Folded) {
    let name = g.nodes[l].name.clone();
    let wid = g.add_value(format!("{name}.folded_weight"), None);
    let bid = g.add_value(format!("{name}.folded_bias"), None);
    g.initializers.insert(wid, f.weight);
    g.initializers.insert(bid, f.bias);
    let out = g.nodes[bn].outputs[0];
    let layer = &mut g.nodes[l];
    layer.inputs.resize(3, None);
    layer.inputs[1] = Some(wid);
    layer.inputs[2] = Some(bid);
    layer.outputs[0] = out;
    if f.to_gemm {
        // A MatMul becomes Gemm(A, W', b'); a Gemm's beta is folded into C'.
        layer.op_type = "Gemm".into();
        layer.attrs.remove("beta");
    }
}
