//! Bias epilogue fusion: `MatMul(a, W) + c`, where `c` is a constant vector over the
//! output's last dim (`[N]`, or `[1, .., 1, N]`), becomes one MatMul that starts its
//! accumulation from `c` (CPU) or adds it before storing (WGSL): one pass over the
//! output and one kernel launch fewer per linear layer of an exported transformer.
//! The MatMul's result must have no other reader, and its dtype must be f32.
use super::{matmul_plus, producers, use_counts};
use super::PassContext;
use kiln_graph::{Attr, DType, Graph, Tensor};
use kiln_ops::elementwise::ACTIVATION_ATTR;
use kiln_ops::MATMUL_BIAS_ATTR;

/// Fuses constant bias adds into MatMuls; returns how many.
pub fn fuse_bias(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let uses = use_counts(g);
    let prod = producers(g);
    let mut dead = vec![];
    for a in 0..g.nodes.len() {
        // Which side is the MatMul and which the constant.
        let Some((m, mm_out, c)) = matmul_plus(g, &prod, a, |_, c| g.initializers.contains_key(&c)) else { continue };
        let mm = &g.nodes[m];
        if uses[mm_out] != 1 || mm.inputs.len() != 2 || mm.attrs.contains_key(ACTIVATION_ATTR) || mm.attrs.contains_key(MATMUL_BIAS_ATTR) {
            continue;
        }
        let f32_out = types.get(mm_out).cloned().flatten().is_some_and(|t| t.dtype == DType::F32);
        let n = mm.inputs[1].and_then(|w| g.initializers.get(&w)).and_then(|w| (w.rank() >= 2).then(|| w.dims()[w.rank() - 1]));
        let bias = &g.initializers[&c];
        let vector = bias.dtype() == DType::F32 && Some(bias.len()) == n && bias.dims().iter().rev().skip(1).all(|&d| d == 1);
        // The Add must not broadcast the product to a higher rank.
        let rank_ok = types.get(mm_out).cloned().flatten().is_some_and(|t| bias.rank() <= t.shape.rank());
        if !(f32_out && vector && rank_ok) {
            continue;
        }
        let flat = Tensor::from_bytes(DType::F32, &[bias.len()], bias.bytes()).expect("same bytes, one dim");
        let name = format!("{}.bias", g.nodes[m].name);
        let cid = g.add_value(name, None);
        g.initializers.insert(cid, flat);
        let out = g.nodes[a].outputs[0];
        let mm = &mut g.nodes[m];
        mm.inputs.push(Some(cid));
        mm.attrs.insert(MATMUL_BIAS_ATTR.into(), Attr::Int(1));
        mm.outputs[0] = out;
        dead.push(a);
    }
    super::remove_nodes(g, &dead);
    dead.len()
}
