//! Residual epilogue fusion: `MatMul(a, W)[+bias] + r`, where `r` is a tensor computed
//! elsewhere with exactly the product's shape (the skip connection of a transformer
//! block), becomes one MatMul that starts its accumulation from `r` on the CPU and adds
//! it before storing in WGSL: one pass over the output and one launch fewer per block.
//! The MatMul's result must have no other reader and no fused activation yet.
use super::{matmul_plus, producers, use_counts};
use kiln_graph::{Attr, DType, Dim, Graph};
use kiln_ops::elementwise::ACTIVATION_ATTR;
use kiln_ops::{Registry, MATMUL_RESIDUAL_ATTR};

/// Fuses residual adds into MatMuls; returns how many.
pub fn fuse_residual(g: &mut Graph) -> usize {
    let types = kiln_runtime::value_types(g, Registry::builtin());
    let uses = use_counts(g);
    let prod = producers(g);
    let mut dead = vec![];
    for a in 0..g.nodes.len() {
        let same_known = |p: usize, q: usize| match (types.get(p).cloned().flatten(), types.get(q).cloned().flatten()) {
            (Some(s), Some(t)) => s == t && s.dtype == DType::F32 && !s.shape.0.iter().any(|d| matches!(d, Dim::Sym(n) if n == "?")),
            _ => false,
        };
        let Some((m, mm_out, r)) = matmul_plus(g, &prod, a, |m, r| !g.initializers.contains_key(&r) && same_known(m, r)) else { continue };
        let mm = &g.nodes[m];
        if uses[mm_out] != 1 || mm.attrs.contains_key(ACTIVATION_ATTR) || mm.attrs.contains_key(MATMUL_RESIDUAL_ATTR) || mm.inputs.len() > 3 {
            continue;
        }
        let out = g.nodes[a].outputs[0];
        let mm = &mut g.nodes[m];
        mm.inputs.resize(3, None);
        mm.inputs.push(Some(r));
        mm.attrs.insert(MATMUL_RESIDUAL_ATTR.into(), Attr::Int(1));
        mm.outputs[0] = out;
        dead.push(a);
    }
    super::remove_nodes(g, &dead);
    dead.len()
}
