//! Integer products back to float in one kernel: `MatMulInteger -> Cast(float) ->
//! Mul(s)`, where `s = Mul(a_scale, b_scale)` (what onnxruntime's dynamic quantization
//! writes for every linear layer), becomes one com.microsoft `MatMulIntegerToFloat`,
//! and a following `Add` of a constant `[N]` bias moves into it as well. The fused
//! kernel computes `f32(acc) * (a_scale * b_scale[n]) + bias[n]`: the same f32
//! operations in the same order as the nodes it replaces, so the result is the same
//! bit for bit, without the int32 and float intermediates.
//!
//! The scales' Mul goes too when nothing else reads it. Conditions: each intermediate
//! has no other reader; the Cast is to f32; one scale is
//! a single value (A's), the other one value or one per column of B (rank <= 1); A's
//! zero point, if any, is a single value.
use super::{producers, use_counts, PassContext};
use kiln_graph::{Attr, DType, Graph, Node, NodeId, ValueId, ValueType};

/// Fuses the integer products' dequantizing tails; returns how many products.
pub fn fuse_matmul_integer(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g).to_vec();
    let uses = use_counts(g);
    let prod = producers(g);
    let readers = readers(g);
    let ty = |v: ValueId| types.get(v).cloned().flatten();
    let len = |v: ValueId| ty(v).and_then(|t| t.shape.as_fixed()).map(|d| d.iter().product::<usize>());
    let rank = |v: ValueId| ty(v).map(|t| t.shape.rank());
    let mut dead = vec![];
    let mut fused = 0;
    for m in 0..g.nodes.len() {
        let mm = &g.nodes[m];
        if !is(mm, "MatMulInteger") || mm.outputs.len() != 1 || mm.inputs.len() < 2 {
            continue;
        }
        let acc = mm.outputs[0];
        // A's zero point must be one value (MatMulIntegerToFloat's is per tensor).
        if mm.inputs.get(2).copied().flatten().is_some_and(|z| len(z) != Some(1)) {
            continue;
        }
        let Some(cast) = only_reader(&readers, &uses, acc).filter(|&c| is(&g.nodes[c], "Cast")) else { continue };
        if g.nodes[cast].attr("to") != Some(&Attr::Int(DType::F32.onnx_code() as i64)) {
            continue;
        }
        let float = g.nodes[cast].outputs[0];
        let Some(mul) = only_reader(&readers, &uses, float).filter(|&u| is(&g.nodes[u], "Mul") && g.nodes[u].inputs.len() == 2) else { continue };
        let Some(s) = g.nodes[mul].inputs.iter().flatten().copied().find(|&v| v != float) else { continue };
        if g.nodes[mul].inputs.iter().flatten().filter(|&&v| v == float).count() != 1 {
            continue;
        }
        // s = a_scale * b_scale: one of them a single value.
        let Some(sm) = prod.get(s).copied().flatten().filter(|&p| is(&g.nodes[p], "Mul") && g.nodes[p].inputs.len() == 2) else { continue };
        let (Some(s0), Some(s1)) = (g.nodes[sm].inputs[0], g.nodes[sm].inputs[1]) else { continue };
        let n = ty(acc).and_then(|t| t.shape.0.last().and_then(|d| d.fixed()));
        let f32_scalar = |v: ValueId| ty(v).is_some_and(|t| t.dtype == DType::F32) && len(v) == Some(1);
        let per_column = |v: ValueId| ty(v).is_some_and(|t| t.dtype == DType::F32) && rank(v).is_some_and(|r| r <= 1) && (len(v) == Some(1) || (len(v).is_some() && len(v) == n));
        let (a_scale, b_scale) = if f32_scalar(s0) && per_column(s1) {
            (s0, s1)
        } else if f32_scalar(s1) && per_column(s0) {
            (s1, s0)
        } else {
            continue;
        };
        // The Mul must not broadcast the product to a higher rank.
        if rank(s).zip(rank(acc)).is_none_or(|(rs, ra)| rs > ra) {
            continue;
        }
        let mut out = g.nodes[mul].outputs[0];
        let mut bias = None;
        let mut gone = vec![cast, mul];
        if let Some(add) = only_reader(&readers, &uses, out).filter(|&a| is(&g.nodes[a], "Add") && g.nodes[a].inputs.len() == 2) {
            let other = g.nodes[add].inputs.iter().flatten().copied().find(|&v| v != out);
            let vector = other.and_then(|c| g.initializers.get(&c).map(|t| (c, t))).filter(|(_, t)| {
                t.dtype() == DType::F32 && Some(t.len()) == n && t.dims().iter().rev().skip(1).all(|&d| d == 1) && rank(out).is_some_and(|r| t.rank() <= r)
            });
            if let Some((_, t)) = vector {
                let flat = kiln_graph::Tensor::from_bytes(DType::F32, &[t.len()], t.bytes()).expect("same bytes, one dim");
                let id = g.add_value(format!("{}.bias", g.nodes[m].name), Some(ValueType::new(DType::F32, kiln_graph::Shape::fixed(&[flat.len()]))));
                g.initializers.insert(id, flat);
                bias = Some(id);
                out = g.nodes[add].outputs[0];
                gone.push(add);
            }
        }
        // The scales' product has no reader left unless something else reads it.
        if uses[s] == 1 {
            gone.push(sm);
        }
        let mm = &g.nodes[m];
        let mut inputs = vec![mm.inputs[0], mm.inputs[1], Some(a_scale), Some(b_scale), mm.inputs.get(2).copied().flatten(), mm.inputs.get(3).copied().flatten(), bias];
        while inputs.last() == Some(&None) {
            inputs.pop();
        }
        g.nodes[m] = Node { name: mm.name.clone(), op_type: "MatMulIntegerToFloat".into(), domain: "com.microsoft".into(), attrs: Default::default(), inputs, outputs: vec![out] };
        dead.extend(gone);
        fused += 1;
    }
    super::remove_nodes(g, &dead);
    fused
}

fn is(n: &Node, op: &str) -> bool {
    n.op_type == op && n.domain.is_empty()
}

/// Every value's reading nodes.
fn readers(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut r = vec![vec![]; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            r[*v].push(i);
        }
    }
    r
}

/// The one node reading `v`, when nothing else (no other node, no graph output) does.
fn only_reader(readers: &[Vec<NodeId>], uses: &[usize], v: ValueId) -> Option<NodeId> {
    (uses[v] == 1 && readers[v].len() == 1).then(|| readers[v][0])
}
