//! QDQ fusion: the integer ops hidden in a QDQ-format model (every quantized tensor
//! written as `QuantizeLinear` and read through `DequantizeLinear`), rewritten the way
//! onnxruntime's QDQ transformer does, so that the model runs on 8-bit data with exact
//! int32 accumulation instead of as f32 between fake quantizations:
//!
//! - `Q(Conv(DQ(x), DQ(w const), [DQ(b int32)]))` becomes `QLinearConv(x, .., w, .., y
//!   params, b)`: the int32 bias is taken as it is (onnxruntime ignores its DQ scale,
//!   which the quantizer sets to `x_scale * w_scale`); a constant f32 bias is quantized
//!   as onnxruntime's quantizer does, `round_half_even(b / (x_scale * w_scale[m]))`;
//! - `Q(MatMul(DQ(a), DQ(b)))` becomes `QLinearMatMul`;
//! - `Q(Gemm(DQ(a), DQ(b const), [DQ(c int32)]))` (beta 1) becomes com.microsoft
//!   `QGemm`, and without the Q, a `QGemm` with an f32 output;
//! - `Q(Add(DQ(a), DQ(b)))` becomes com.microsoft `QLinearAdd`, `Q(GlobalAveragePool(DQ(x)))`
//!   com.microsoft `QLinearGlobalAveragePool`;
//! - ops that commute with quantization (MaxPool, Flatten, Reshape, Transpose, Squeeze,
//!   Unsqueeze) run on the 8-bit tensor when their DQ and Q have equal parameters;
//! - `Q(DQ(x))` with equal parameters is `x`.
//!
//! Scales and zero points must be constants; the op's result must have the Q as its only
//! reader; x, y and activations are per tensor, weights per tensor or per output
//! channel. DQs left without readers are removed.
use super::{producers, remove_nodes, use_counts, PassContext};
use kiln_graph::{Attr, DType, Graph, Node, NodeId, Tensor, ValueId};

/// A DequantizeLinear's operands: the quantized value, its scale and zero point.
#[derive(Clone, Copy)]
struct Dq {
    q: ValueId,
    scale: ValueId,
    zp: Option<ValueId>,
}

fn is(n: &Node, op: &str) -> bool {
    n.op_type == op && n.domain.is_empty()
}

fn input(n: &Node, i: usize) -> Option<ValueId> {
    n.inputs.get(i).copied().flatten()
}

/// `v`'s DequantizeLinear, when its scale and zero point are constants; `per_tensor`
/// asks for one scale.
fn dq(g: &Graph, prod: &[Option<NodeId>], v: ValueId, per_tensor: bool) -> Option<Dq> {
    let n = &g.nodes[prod[v]?];
    if !is(n, "DequantizeLinear") || n.attrs.contains_key("block_size") {
        return None;
    }
    let (q, scale, zp) = (input(n, 0)?, input(n, 1)?, input(n, 2));
    let s = g.initializers.get(&scale)?;
    if s.dtype() != DType::F32 || per_tensor && s.len() != 1 {
        return None;
    }
    if let Some(z) = zp {
        if g.initializers.get(&z)?.len() != s.len() {
            return None;
        }
    }
    Some(Dq { q, scale, zp })
}

/// The QuantizeLinear that is the only reader of `v`, with per-tensor constant params.
fn q_after(g: &Graph, uses: &[usize], readers: &[Vec<NodeId>], v: ValueId) -> Option<NodeId> {
    if uses[v] != 1 || g.outputs.contains(&v) {
        return None;
    }
    let r = *readers[v].first()?;
    let n = &g.nodes[r];
    let scalar = |i: usize| input(n, i).and_then(|x| g.initializers.get(&x)).is_some_and(|t| t.len() == 1);
    let zp_ok = input(n, 2).is_some_and(|z| g.initializers.get(&z).is_some_and(|t| t.len() == 1 && matches!(t.dtype(), DType::U8 | DType::I8)));
    // A Q without an output (a hand-built graph) is left alone: [`q_io`] reads output 0.
    (is(n, "QuantizeLinear") && input(n, 0) == Some(v) && !n.outputs.is_empty() && scalar(1) && zp_ok && !n.attrs.contains_key("block_size")).then_some(r)
}

/// Whether two constants hold the same values (a scalar of shape [] equals one of [1]).
fn same_const(g: &Graph, a: Option<ValueId>, b: Option<ValueId>) -> bool {
    match (a.and_then(|a| g.initializers.get(&a)), b.and_then(|b| g.initializers.get(&b))) {
        (Some(x), Some(y)) => x.dtype() == y.dtype() && x.len() == y.len() && x.bytes() == y.bytes(),
        _ => false,
    }
}

/// Whether two optional zero points are equal (both absent: both 0 of type u8).
fn same_zero_point(g: &Graph, a: Option<ValueId>, b: Option<ValueId>) -> bool {
    (a.is_none() && b.is_none()) || same_const(g, a, b)
}

/// The 8-bit dtype of a value (a weight's or a declared/inferred one).
fn dtype(g: &Graph, types: &[Option<kiln_graph::ValueType>], v: ValueId) -> Option<DType> {
    g.initializers.get(&v).map(|t| t.dtype()).or_else(|| types.get(v).cloned().flatten().map(|t| t.dtype))
}

fn is8(d: Option<DType>) -> bool {
    matches!(d, Some(DType::U8 | DType::I8))
}

/// A zero point input: the DQ's, or a new constant 0 of the operand's dtype.
fn zero_point(g: &mut Graph, d: &Dq, dt: DType, name: &str) -> ValueId {
    d.zp.unwrap_or_else(|| {
        let v = g.add_value(format!("{name}.zero_point"), None);
        g.initializers.insert(v, Tensor::zeros(dt, &[]));
        v
    })
}

/// A rewrite: the new node (replacing the op at `op`) and the Q it absorbs, if any.
struct Rewrite {
    op: NodeId,
    q: Option<NodeId>,
    node: Node,
}

/// Fuses QDQ patterns into integer ops; returns how many rewrites it made.
pub fn fuse_qdq(g: &mut Graph, cx: &mut PassContext) -> usize {
    if !g.nodes.iter().any(|n| is(n, "DequantizeLinear")) {
        return 0;
    }
    let types = cx.types(g).to_vec();
    let prod = producers(g);
    let uses = use_counts(g);
    let mut readers = vec![vec![]; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            readers[*v].push(i);
        }
    }
    let mut rewrites = vec![];
    let mut passthrough = vec![];
    for i in 0..g.nodes.len() {
        if !g.nodes[i].domain.is_empty() {
            continue;
        }
        let out = g.nodes[i].outputs.first().copied();
        let q = out.and_then(|o| q_after(g, &uses, &readers, o));
        let op = g.nodes[i].op_type.clone();
        let r = match op.as_str() {
            "Conv" => q.and_then(|q| conv(g, &types, &prod, i, q)),
            "MatMul" => q.and_then(|q| matmul(g, &types, &prod, i, q)),
            "Gemm" => gemm(g, &types, &prod, i, q),
            "Add" => q.and_then(|q| binary(g, &types, &prod, i, q, "QLinearAdd")),
            "GlobalAveragePool" => q.and_then(|q| global_average(g, &types, &prod, i, q)),
            "MaxPool" | "Flatten" | "Reshape" | "Transpose" | "Squeeze" | "Unsqueeze" => q.and_then(|q| commuting(g, &prod, i, q)),
            "QuantizeLinear" => {
                // Q(DQ(x)) with equal parameters: readers of the Q read x.
                let n = &g.nodes[i];
                let d = input(n, 0).and_then(|v| dq(g, &prod, v, false));
                if let (Some(d), Some(&out)) = (d.filter(|d| same_const(g, Some(d.scale), input(n, 1)) && same_zero_point(g, d.zp, input(n, 2)) && !n.attrs.contains_key("output_dtype")), n.outputs.first()) {
                    passthrough.push((i, out, d.q));
                }
                None
            }
            _ => None,
        };
        rewrites.extend(r);
    }
    let mut dead = vec![];
    let changes = rewrites.len();
    for r in rewrites {
        if let Some(q) = r.q {
            dead.push(q);
        }
        g.nodes[r.op] = r.node;
    }
    let mut bypassed = 0;
    for (i, out, src) in passthrough {
        if super::bypass(g, out, src) {
            dead.push(i);
            bypassed += 1;
        }
    }
    remove_nodes(g, &dead);
    super::eliminate_dead(g, cx);
    changes + bypassed
}

/// A new node named like `old`, writing `out`.
fn new_node(old: &Node, op: &str, domain: &str, inputs: Vec<Option<ValueId>>, out: ValueId, attrs: &[&str]) -> Node {
    let attrs = old.attrs.iter().filter(|(k, _)| attrs.contains(&k.as_str())).map(|(k, a)| (k.clone(), a.clone())).collect();
    Node { name: old.name.clone(), op_type: op.into(), domain: domain.into(), attrs, inputs, outputs: vec![out] }
}

/// The Q's output and its scale and zero point inputs (a Q that [`q_after`] found: it
/// has an output).
fn q_io(g: &Graph, q: NodeId) -> (ValueId, Option<ValueId>, Option<ValueId>) {
    let n = &g.nodes[q];
    (n.outputs[0], input(n, 1), input(n, 2))
}

/// A weight's DQ: a constant 8-bit tensor, per tensor or per output channel along
/// `axis` (whose length is `channels`).
fn weight_dq(g: &Graph, prod: &[Option<NodeId>], v: ValueId, axis: usize, channels: usize) -> Option<Dq> {
    let d = dq(g, prod, v, false)?;
    let w = g.initializers.get(&d.q)?;
    // [`dq`] found the scale (and zero point) among the initializers.
    let n = g.initializers[&d.scale].len();
    if !is8(Some(w.dtype())) || n != 1 && n != channels {
        return None;
    }
    if n != 1 {
        let node = &g.nodes[prod[v]?];
        let a = match node.attrs.get("axis") {
            Some(Attr::Int(a)) => *a,
            _ => 1,
        };
        let rank = w.rank() as i64;
        if (if a < 0 { a + rank } else { a }) != axis as i64 {
            return None;
        }
    }
    Some(d)
}

/// A bias for an int32 accumulator: `DQ(int32 b)` (b as is, zero point 0), or a constant
/// f32 `b` quantized with scale `x_scale * w_scale[m]`.
fn int_bias(g: &mut Graph, prod: &[Option<NodeId>], b: ValueId, x: &Dq, w: &Dq, m: usize) -> Option<ValueId> {
    if let Some(d) = dq(g, prod, b, false) {
        let t = g.initializers.get(&d.q)?;
        let zero = d.zp.is_none_or(|z| g.initializers[&z].to_f64_vec().iter().all(|&v| v == 0.0));
        return (t.dtype() == DType::I32 && t.len() == m && zero).then_some(d.q);
    }
    let t = g.initializers.get(&b)?;
    if t.dtype() != DType::F32 || t.len() != m {
        return None;
    }
    // `x` is a per-tensor DQ and `w` a weight DQ: [`dq`] found their f32 scales (one for
    // `x`, one or `m` for `w`, which [`weight_dq`] checked) among the initializers.
    let sx = *g.initializers[&x.scale].as_slice::<f32>().ok()?.first()?;
    let sw = g.initializers[&w.scale].as_slice::<f32>().ok()?.to_vec();
    let bv = t.as_slice::<f32>().ok()?;
    let mut q = Vec::with_capacity(m);
    for (c, &b) in bv.iter().enumerate() {
        let s = sx * sw[if sw.len() == 1 { 0 } else { c }];
        let v = (b as f64 / s as f64).round_ties_even();
        if s == 0.0 || !v.is_finite() || v.abs() > i32::MAX as f64 {
            return None;
        }
        q.push(v as i32);
    }
    let v = g.add_value(format!("{}.quantized", g.values[b].name), None);
    g.initializers.insert(v, Tensor::from_vec(&[m], q).ok()?);
    Some(v)
}

fn conv(g: &mut Graph, types: &[Option<kiln_graph::ValueType>], prod: &[Option<NodeId>], i: NodeId, q: NodeId) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    let x = dq(g, prod, input(&n, 0)?, true)?;
    let wv = input(&n, 1)?;
    let channels = *g.initializers.get(&dq(g, prod, wv, false)?.q)?.dims().first()?;
    let w = weight_dq(g, prod, wv, 0, channels)?;
    let (dx, dw) = (dtype(g, types, x.q)?, g.initializers[&w.q].dtype());
    if !is8(Some(dx)) || n.inputs.len() > 3 {
        return None;
    }
    let bias = match input(&n, 2) {
        Some(b) => Some(int_bias(g, prod, b, &x, &w, channels)?),
        None => None,
    };
    let (y, sy, zy) = q_io(g, q);
    let (zx, zw) = (zero_point(g, &x, dx, &n.name), zero_point(g, &w, dw, &n.name));
    let mut inputs = vec![Some(x.q), Some(x.scale), Some(zx), Some(w.q), Some(w.scale), Some(zw), sy, zy];
    if bias.is_some() {
        inputs.push(bias);
    }
    let node = new_node(&n, "QLinearConv", "", inputs, y, &["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"]);
    Some(Rewrite { op: i, q: Some(q), node })
}

fn matmul(g: &mut Graph, types: &[Option<kiln_graph::ValueType>], prod: &[Option<NodeId>], i: NodeId, q: NodeId) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    let a = dq(g, prod, input(&n, 0)?, true)?;
    let bv = input(&n, 1)?;
    let bt = g.initializers.get(&dq(g, prod, bv, false)?.q)?;
    if bt.rank() != 2 {
        return None;
    }
    let b = weight_dq(g, prod, bv, 1, bt.dims()[1])?;
    let (da, db) = (dtype(g, types, a.q)?, g.initializers[&b.q].dtype());
    if !is8(Some(da)) {
        return None;
    }
    let (y, sy, zy) = q_io(g, q);
    let (za, zb) = (zero_point(g, &a, da, &n.name), zero_point(g, &b, db, &n.name));
    let node = new_node(&n, "QLinearMatMul", "", vec![Some(a.q), Some(a.scale), Some(za), Some(b.q), Some(b.scale), Some(zb), sy, zy], y, &[]);
    Some(Rewrite { op: i, q: Some(q), node })
}

fn gemm(g: &mut Graph, types: &[Option<kiln_graph::ValueType>], prod: &[Option<NodeId>], i: NodeId, q: Option<NodeId>) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    let float = |k: &str| match n.attrs.get(k) {
        Some(Attr::Float(f)) => *f,
        _ => 1.0,
    };
    let trans_b = matches!(n.attrs.get("transB"), Some(Attr::Int(t)) if *t != 0);
    if float("beta") != 1.0 && input(&n, 2).is_some() {
        return None;
    }
    let a = dq(g, prod, input(&n, 0)?, true)?;
    let bv = input(&n, 1)?;
    let bt = g.initializers.get(&dq(g, prod, bv, false)?.q)?;
    if bt.rank() != 2 {
        return None;
    }
    let (axis, cols) = if trans_b { (0, bt.dims()[0]) } else { (1, bt.dims()[1]) };
    let b = weight_dq(g, prod, bv, axis, cols)?;
    let da = dtype(g, types, a.q)?;
    if !is8(Some(da)) {
        return None;
    }
    let c = match input(&n, 2) {
        Some(c) => Some(int_bias(g, prod, c, &a, &b, cols)?),
        None => None,
    };
    let (y, sy, zy) = match q {
        Some(q) => q_io(g, q),
        None => (*n.outputs.first()?, None, None),
    };
    let inputs = vec![Some(a.q), Some(a.scale), a.zp, Some(b.q), Some(b.scale), b.zp, c, sy, zy];
    let node = new_node(&n, "QGemm", "com.microsoft", inputs, y, &["alpha", "transA", "transB"]);
    Some(Rewrite { op: i, q, node })
}

fn binary(g: &mut Graph, types: &[Option<kiln_graph::ValueType>], prod: &[Option<NodeId>], i: NodeId, q: NodeId, op: &str) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    let (a, b) = (dq(g, prod, input(&n, 0)?, true)?, dq(g, prod, input(&n, 1)?, true)?);
    let (y, sy, zy) = q_io(g, q);
    let dy = g.initializers.get(&zy?)?.dtype();
    if dtype(g, types, a.q)? != dy || dtype(g, types, b.q)? != dy {
        return None;
    }
    let node = new_node(&n, op, "com.microsoft", vec![Some(a.q), Some(a.scale), a.zp, Some(b.q), Some(b.scale), b.zp, sy, zy], y, &[]);
    Some(Rewrite { op: i, q: Some(q), node })
}

fn global_average(g: &mut Graph, types: &[Option<kiln_graph::ValueType>], prod: &[Option<NodeId>], i: NodeId, q: NodeId) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    let x = dq(g, prod, input(&n, 0)?, true)?;
    let (y, sy, zy) = q_io(g, q);
    let dy = g.initializers.get(&zy?)?.dtype();
    if dtype(g, types, x.q)? != dy {
        return None;
    }
    let mut node = new_node(&n, "QLinearGlobalAveragePool", "com.microsoft", vec![Some(x.q), Some(x.scale), x.zp, sy, zy], y, &[]);
    node.attrs.insert("channels_last".into(), Attr::Int(0));
    Some(Rewrite { op: i, q: Some(q), node })
}

/// MaxPool and data movement between a DQ and a Q with equal parameters: the op runs on
/// the quantized tensor (its other inputs, such as a Reshape's shape, stay).
fn commuting(g: &mut Graph, prod: &[Option<NodeId>], i: NodeId, q: NodeId) -> Option<Rewrite> {
    let n = g.nodes[i].clone();
    if n.outputs.len() != 1 {
        return None;
    }
    let x = dq(g, prod, input(&n, 0)?, true)?;
    let (y, sy, zy) = q_io(g, q);
    if !same_const(g, Some(x.scale), sy) || !same_zero_point(g, x.zp, zy) {
        return None;
    }
    let mut node = n.clone();
    node.inputs[0] = Some(x.q);
    node.outputs = vec![y];
    Some(Rewrite { op: i, q: Some(q), node })
}
