//! Scaled dot-product attention from its decomposed form, as transformer exporters
//! write it on 4-D `[batch, heads, seq, head_dim]` tensors:
//!
//! ```text
//! s = MatMul(Q, Kt)  [ * c | / c ]  [ + mask ];  p = Softmax(s, axis=-1);  y = MatMul(p, V)
//! ```
//!
//! becomes one ai.onnx `Attention(Q, K, V[, mask]) {scale}` node: one kernel that never
//! writes the `seq x seq` scores to memory. `Kt` is K transposed: when it comes from a
//! Transpose read only here, that Transpose is changed to produce K itself (swapping the
//! last two axes of its perm); otherwise a Transpose is inserted.
//!
//! The ONNX op fits exactly under these conditions, which the pass checks: Q, Kt, V are
//! f32, rank 4, with the same batch and head dims (no broadcasting between them); the
//! scale `c` is a constant scalar (the op's `scale` attribute is set to `c` or `1/c`, or
//! 1 without one); the mask has the scores' dtype, rank <= 4, broadcasts to the scores
//! without changing their shape, and has the full key length as its last dim (the op pads
//! a shorter mask row with masked keys where numpy broadcasting would repeat it, so a
//! last dim of 1 is not fused). Every intermediate must be read only inside the pattern.
//! One difference remains, on purpose: a query row whose keys are all masked with -inf
//! gives zeros from Attention where the decomposed Softmax gives NaN (finite masks such
//! as `f32::MIN`, which exporters write, behave identically).
use super::{producers, use_counts};
use super::PassContext;
use kiln_graph::{Attr, DType, Dim, Graph, Node, NodeId, Shape, Tensor, ValueId, ValueType};

struct Found {
    q: ValueId,
    kt: ValueId,
    v: ValueId,
    mask: Option<ValueId>,
    scale: f32,
    /// The nodes replaced, the second MatMul (which becomes the Attention node) last.
    nodes: Vec<NodeId>,
}

fn is(g: &Graph, n: NodeId, op: &str) -> bool {
    g.nodes[n].op_type == op && g.nodes[n].domain.is_empty()
}

/// The producer of `v` when it is op `op` and `v` is read once.
fn only(g: &Graph, prod: &[Option<NodeId>], uses: &[usize], v: ValueId, op: &str) -> Option<NodeId> {
    prod[v].filter(|&p| is(g, p, op) && uses[v] == 1)
}

/// `v` = `MatMul(Q, Kt)`, optionally times or divided by a constant scalar: (MatMul,
/// scale, the nodes).
fn scores(g: &Graph, prod: &[Option<NodeId>], uses: &[usize], v: ValueId) -> Option<(NodeId, f32, Vec<NodeId>)> {
    if let Some(mm) = only(g, prod, uses, v, "MatMul") {
        return Some((mm, 1.0, vec![mm]));
    }
    let p = prod[v].filter(|_| uses[v] == 1)?;
    let ins = &g.nodes[p].inputs;
    let (a, b) = (ins.first().copied().flatten()?, ins.get(1).copied().flatten()?);
    let (x, scale) = if is(g, p, "Mul") {
        match (super::scalar_const(g, Some(a)), super::scalar_const(g, Some(b))) {
            (None, Some(c)) => (a, c),
            (Some(c), None) => (b, c),
            _ => return None,
        }
    } else if is(g, p, "Div") {
        (a, 1.0 / super::scalar_const(g, Some(b))?)
    } else {
        return None;
    };
    let mm = only(g, prod, uses, x, "MatMul")?;
    scale.is_finite().then(|| (mm, scale, vec![mm, p]))
}

fn softmax_last_axis(g: &Graph, n: NodeId, rank: usize) -> bool {
    let default = if g.opsets.get("").copied().unwrap_or(13) >= 13 { -1 } else { 1 };
    let axis = match g.nodes[n].attrs.get("axis") {
        Some(Attr::Int(a)) => *a,
        None => default,
        _ => return false,
    };
    // Before opset 13 Softmax flattens to 2-D at `axis`: the last axis is the same row.
    axis == -1 || axis == rank as i64 - 1
}

fn known(d: &Dim) -> bool {
    !matches!(d, Dim::Sym(s) if s == "?")
}

fn match_at(g: &Graph, types: &[Option<ValueType>], prod: &[Option<NodeId>], uses: &[usize], sm: NodeId) -> Option<Found> {
    if !is(g, sm, "Softmax") {
        return None;
    }
    let (x, p) = (g.nodes[sm].inputs.first().copied().flatten()?, g.nodes[sm].outputs[0]);
    let ty = |v: ValueId| types.get(v).cloned().flatten();
    let st = ty(x)?;
    if st.dtype != DType::F32 || st.shape.rank() != 4 || !softmax_last_axis(g, sm, 4) || !st.shape.0.iter().all(known) {
        return None;
    }
    // p read once, as the first operand of the second MatMul.
    let mm2 = g.nodes.iter().position(|n| n.inputs.first() == Some(&Some(p)))?;
    if uses[p] != 1 || !is(g, mm2, "MatMul") || g.nodes[mm2].inputs.len() != 2 {
        return None;
    }
    let v = g.nodes[mm2].inputs.get(1).copied().flatten()?;
    // Scores, optionally plus a mask.
    let (mm1, scale, mut nodes, mask) = match scores(g, prod, uses, x) {
        Some((mm, s, n)) => (mm, s, n, None),
        None => {
            let add = only(g, prod, uses, x, "Add")?;
            let ins = &g.nodes[add].inputs;
            let (a, b) = (ins.first().copied().flatten()?, ins.get(1).copied().flatten()?);
            let (s, m, (mm, sc, mut n)) = [(a, b), (b, a)].into_iter().find_map(|(s, m)| Some((s, m, scores(g, prod, uses, s)?)))?;
            // The Add must not change the scores' shape (no broadcasting of the scores).
            if ty(s)? != st {
                return None;
            }
            n.push(add);
            (mm, sc, n, Some(m))
        }
    };
    if g.nodes[mm1].inputs.len() != 2 {
        return None;
    }
    let (q, kt) = (g.nodes[mm1].inputs.get(0).copied().flatten()?, g.nodes[mm1].inputs.get(1).copied().flatten()?);
    let (qt, ktt, vt) = (ty(q)?, ty(kt)?, ty(v)?);
    let four = |t: &ValueType| t.dtype == DType::F32 && t.shape.rank() == 4 && t.shape.0.iter().all(known);
    if !(four(&qt) && four(&ktt) && four(&vt)) {
        return None;
    }
    let d = |t: &ValueType, i: usize| t.shape.0[i].clone();
    // Same batch and heads everywhere; Kt is [.., head_dim, keys], V [.., keys, v_dim].
    let same = (0..2).all(|i| d(&qt, i) == d(&ktt, i) && d(&qt, i) == d(&vt, i));
    if !same || d(&qt, 3) != d(&ktt, 2) || d(&ktt, 3) != d(&vt, 2) {
        return None;
    }
    if let Some(m) = mask {
        let mt = ty(m)?;
        let r = mt.shape.rank();
        if mt.dtype != DType::F32 || r == 0 || r > 4 || !mt.shape.0.iter().all(known) {
            return None;
        }
        // Right-aligned, every dim 1 or the scores' dim; the last one the key length.
        let fits = mt.shape.0.iter().enumerate().all(|(i, md)| *md == Dim::Fixed(1) || *md == st.shape.0[4 - r + i]);
        if !fits || mt.shape.0[r - 1] != st.shape.0[3] {
            return None;
        }
    }
    nodes.push(sm);
    nodes.push(mm2);
    Some(Found { q, kt, v, mask, scale, nodes })
}

/// K from Kt: the Transpose producing Kt (read only here) gets the last two axes of its
/// perm swapped (and is dropped, returned, when that is the identity), or a new
/// Transpose is added. Returns K.
fn untranspose(g: &mut Graph, prod: &[Option<NodeId>], uses: &[usize], kt: ValueId, base: &str) -> (ValueId, Option<NodeId>) {
    if let Some(t) = only(g, prod, uses, kt, "Transpose") {
        if let (Some(Attr::Ints(perm)), Some(src)) = (g.nodes[t].attrs.get("perm"), g.nodes[t].inputs.first().copied().flatten()) {
            if perm.len() == 4 {
                let perm = vec![perm[0], perm[1], perm[3], perm[2]];
                if perm == [0, 1, 2, 3] {
                    return (src, Some(t));
                }
                let k = g.add_value(format!("{base}.keys"), None);
                let node = &mut g.nodes[t];
                node.attrs.insert("perm".into(), Attr::Ints(perm));
                node.outputs[0] = k;
                return (k, None);
            }
        }
    }
    let k = g.add_value(format!("{base}.keys"), None);
    g.nodes.push(Node {
        name: format!("{base}.keys"),
        op_type: "Transpose".into(),
        domain: String::new(),
        attrs: [("perm".to_string(), Attr::Ints(vec![0, 1, 3, 2]))].into_iter().collect(),
        inputs: vec![Some(kt)],
        outputs: vec![k],
    });
    (k, None)
}

/// The 3-D activation `x` [batch, seq, heads * dim] whose heads `v` [batch, heads, seq,
/// dim] are (Reshape to [batch, seq, heads, dim], then Transpose [0, 2, 1, 3], each read
/// once): (x, heads, the two nodes).
fn split_heads(g: &Graph, types: &[Option<ValueType>], prod: &[Option<NodeId>], uses: &[usize], v: ValueId) -> Option<(ValueId, usize, [NodeId; 2])> {
    let ty = |v: ValueId| types.get(v).cloned().flatten();
    let t = only(g, prod, uses, v, "Transpose")?;
    if g.nodes[t].attrs.get("perm") != Some(&Attr::Ints(vec![0, 2, 1, 3])) {
        return None;
    }
    let r = only(g, prod, uses, g.nodes[t].inputs.first().copied().flatten()?, "Reshape")?;
    let x = g.nodes[r].inputs.first().copied().flatten()?;
    let (xt, rt) = (ty(x)?, ty(g.nodes[r].outputs[0])?);
    let (xs, rs) = (&xt.shape.0, &rt.shape.0);
    if xs.len() != 3 || rs.len() != 4 || xs[0] != rs[0] || xs[1] != rs[1] || !known(&xs[0]) || !known(&xs[1]) {
        return None;
    }
    match (&xs[2], &rs[2], &rs[3]) {
        (Dim::Fixed(w), Dim::Fixed(h), Dim::Fixed(d)) if h * d == *w && *h > 0 => Some((x, *h, [t, r])),
        _ => None,
    }
}

/// What [`heads_around`] found around one Attention node.
struct Around {
    /// Q, K, V as 3-D activations.
    xs: [ValueId; 3],
    /// Query and KV heads.
    heads: [usize; 2],
    /// The merged 3-D output.
    out: ValueId,
    /// The six reshapes and transposes to drop.
    dead: Vec<NodeId>,
    /// Shape nodes that read the output's 4-D `[batch, seq, heads, dim]` (GPT-2's export
    /// computes the merged shape from it), with heads and dim.
    shapes: Vec<NodeId>,
    head_dims: [usize; 2],
}

/// Attention node `a` on heads split from 3-D activations whose output is merged back
/// the same way (Transpose [0, 2, 1, 3], then Reshape to [batch, seq, heads * dim]).
fn heads_around(g: &Graph, types: &[Option<ValueType>], prod: &[Option<NodeId>], uses: &[usize], a: NodeId) -> Option<Around> {
    let node = &g.nodes[a];
    if !is(g, a, "Attention") || node.outputs.len() != 1 || !(3..=4).contains(&node.inputs.len()) || node.attrs.contains_key("q_num_heads") {
        return None;
    }
    let mut xs = [0; 3];
    let mut heads = [0; 3];
    let mut dead = vec![];
    for i in 0..3 {
        let (x, h, nodes) = split_heads(g, types, prod, uses, node.inputs[i]?)?;
        (xs[i], heads[i]) = (x, h);
        dead.extend(nodes);
    }
    if heads[1] != heads[2] {
        return None;
    }
    // The output: Transpose back, read once, then Reshape to 3-D; besides the Reshape,
    // only Shape nodes (whole shapes) may read the transposed value.
    let y = node.outputs[0];
    let readers = |v: ValueId| -> Vec<NodeId> { (0..g.nodes.len()).filter(|&n| g.nodes[n].inputs.contains(&Some(v))).collect() };
    let t = readers(y).into_iter().next().filter(|&t| uses[y] == 1 && !g.outputs.contains(&y) && is(g, t, "Transpose"))?;
    if g.nodes[t].attrs.get("perm") != Some(&Attr::Ints(vec![0, 2, 1, 3])) {
        return None;
    }
    let tv = g.nodes[t].outputs[0];
    let (mut r, mut shapes) = (None, vec![]);
    for n in readers(tv) {
        let only_input = g.nodes[n].inputs.iter().filter(|i| **i == Some(tv)).count() == 1 && g.nodes[n].inputs[0] == Some(tv);
        if !only_input || g.outputs.contains(&tv) {
            return None;
        }
        if is(g, n, "Reshape") && r.is_none() {
            r = Some(n);
        } else if is(g, n, "Shape") && g.nodes[n].attrs.is_empty() {
            shapes.push(n);
        } else {
            return None;
        }
    }
    let r = r?;
    let out = g.nodes[r].outputs[0];
    let (yt, ot) = (types.get(y).cloned().flatten()?, types.get(out).cloned().flatten()?);
    let (ys, os) = (&yt.shape.0, &ot.shape.0);
    if os.len() != 3 || ys.len() != 4 || os[0] != ys[0] || os[1] != ys[2] {
        return None;
    }
    let (Dim::Fixed(w), Dim::Fixed(h), Dim::Fixed(d)) = (&os[2], &ys[1], &ys[3]) else { return None };
    if h * d != *w {
        return None;
    }
    dead.extend([t, r]);
    Some(Around { xs, heads: [heads[0], heads[1]], out, dead, shapes, head_dims: [*h, *d] })
}

/// Lets Attention nodes take and give 3-D activations where their heads are split and
/// merged by reshapes and transposes around them (what BERT and GPT-2 exports do): the
/// op splits heads itself (`q_num_heads`, `kv_num_heads`), and the transposes go. A
/// Shape node that read the merged 4-D output reads the 3-D one instead:
/// `Concat(Shape(out, end = 2), [heads, dim])`, the same values.
fn absorb_head_layout(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g).to_vec();
    let mut absorbed = 0;
    loop {
        let (prod, uses) = (producers(g), use_counts(g));
        let Some((a, found)) = (0..g.nodes.len()).find_map(|a| Some((a, heads_around(g, &types, &prod, &uses, a)?))) else { return absorbed };
        let node = &mut g.nodes[a];
        for (i, x) in found.xs.into_iter().enumerate() {
            node.inputs[i] = Some(x);
        }
        node.attrs.insert("q_num_heads".into(), Attr::Int(found.heads[0] as i64));
        node.attrs.insert("kv_num_heads".into(), Attr::Int(found.heads[1] as i64));
        node.outputs[0] = found.out;
        for s in found.shapes {
            let name = g.nodes[s].name.clone();
            let outer = g.add_value(format!("{name}.outer"), Some(ValueType::new(DType::I64, Shape::fixed(&[2]))));
            let dims = g.add_value(format!("{name}.heads"), Some(ValueType::new(DType::I64, Shape::fixed(&[2]))));
            let [h, d] = found.head_dims;
            g.initializers.insert(dims, Tensor::from_vec(&[2], vec![h as i64, d as i64]).expect("two dims"));
            g.nodes.push(Node {
                name: format!("{name}.outer"),
                op_type: "Shape".into(),
                domain: String::new(),
                attrs: [("start".to_string(), Attr::Int(0)), ("end".to_string(), Attr::Int(2))].into_iter().collect(),
                inputs: vec![Some(found.out)],
                outputs: vec![outer],
            });
            let shape = &mut g.nodes[s];
            shape.op_type = "Concat".into();
            shape.attrs = [("axis".to_string(), Attr::Int(0))].into_iter().collect();
            shape.inputs = vec![Some(outer), Some(dims)];
        }
        super::remove_nodes(g, &found.dead);
        absorbed += 1;
    }
}

/// Replaces decomposed attention with Attention nodes (on 3-D activations where the
/// heads are split around them); returns how many.
pub fn fuse_attention(g: &mut Graph, cx: &mut PassContext) -> usize {
    let fused = fuse_4d(g, cx);
    if fused > 0 {
        absorb_head_layout(g, cx);
    }
    fused
}

fn fuse_4d(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let mut fused = 0;
    loop {
        let (prod, uses) = (producers(g), use_counts(g));
        let Some(f) = (0..g.nodes.len()).find_map(|n| match_at(g, &types, &prod, &uses, n)) else { return fused };
        let last = *f.nodes.last().expect("a pattern has nodes");
        let softmax = &g.nodes[f.nodes[f.nodes.len() - 2]].name;
        let base = if softmax.contains("Softmax") { softmax.replace("Softmax", "Attention") } else { format!("{softmax}.attention") };
        // A new Transpose goes last: the indices of the pattern stay valid.
        let (k, dropped) = untranspose(g, &prod, &uses, f.kt, &base);
        let node = &mut g.nodes[last];
        node.name = base;
        node.op_type = "Attention".into();
        node.attrs = [("scale".to_string(), Attr::Float(f.scale))].into_iter().collect();
        node.inputs = vec![Some(f.q), Some(k), Some(f.v)];
        if let Some(m) = f.mask {
            node.inputs.push(Some(m));
        }
        let dead: Vec<NodeId> = f.nodes.iter().copied().filter(|&n| n != last).chain(dropped).collect();
        super::remove_nodes(g, &dead);
        fused += 1;
    }
}
