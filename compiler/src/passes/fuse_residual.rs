//! Residual epilogue fusion: `MatMul(a, W)[+bias] + r` or `Conv(x, W[, b]) + r`, where
//! `r` is a tensor computed elsewhere with exactly the product's shape (the skip
//! connection of a transformer or ResNet block), becomes one MatMul / Conv that adds
//! `r` in its epilogue (after the bias, before any activation): one pass over the
//! output and one launch fewer per block. Run before `fuse-activation`, a following
//! Relu then fuses too (ResNet's `Conv -> Add -> Relu` becomes one Conv).
//! The product's result must have no other reader and no fused activation yet: an
//! activation already fused would apply before the add.
use super::{matmul_plus, producers, use_counts};
use super::PassContext;
use kiln_graph::{Attr, DType, Dim, Graph, NodeId, ValueId};
use kiln_ops::elementwise::ACTIVATION_ATTR;
use kiln_ops::MATMUL_RESIDUAL_ATTR;

/// For node `a` = `Add(x, y)` where one side is a Conv's output `c` and the other, `o`,
/// passes `other_ok(c, o)`: (the Conv node, `c`, `o`).
fn conv_plus(g: &Graph, prod: &[Option<NodeId>], a: NodeId, other_ok: impl Fn(ValueId, ValueId) -> bool) -> Option<(NodeId, ValueId, ValueId)> {
    let add = &g.nodes[a];
    if add.op_type != "Add" || !add.domain.is_empty() || add.inputs.len() != 2 {
        return None;
    }
    let (x, y) = (add.inputs.get(0).copied().flatten()?, add.inputs.get(1).copied().flatten()?);
    let is_conv = |v: ValueId| prod[v].filter(|&p| g.nodes[p].op_type == "Conv" && g.nodes[p].domain.is_empty() && g.nodes[p].outputs.len() == 1);
    [(x, y), (y, x)].into_iter().find_map(|(c, o)| Some((is_conv(c)?, c, o)).filter(|_| other_ok(c, o)))
}

/// Fuses residual adds into MatMuls (`fuse-residual`); returns how many.
pub fn fuse_residual(g: &mut Graph, cx: &mut PassContext) -> usize {
    fuse_into(g, cx, Into::MatMul)
}

/// Fuses residual adds into Convs (`fuse-conv-residual`); returns how many.
pub fn fuse_conv_residual(g: &mut Graph, cx: &mut PassContext) -> usize {
    fuse_into(g, cx, Into::Conv)
}

/// Which products take residuals (two passes, so that each can be measured or skipped
/// alone: on the CPU the MatMul epilogue took bert_tiny from 1.72 to 1.53 ms once it
/// added the skip per block of rows, the Conv one resnet18 from 32.2 to 31.7 ms).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Into {
    MatMul,
    Conv,
}

fn fuse_into(g: &mut Graph, cx: &mut PassContext, into: Into) -> usize {
    let types = cx.types(g);
    let uses = use_counts(g);
    let prod = producers(g);
    let mut dead = vec![];
    for a in 0..g.nodes.len() {
        let same_known = |p: usize, q: usize| match (types.get(p).cloned().flatten(), types.get(q).cloned().flatten()) {
            (Some(s), Some(t)) => s == t && s.dtype == DType::F32 && !s.shape.0.iter().any(|d| matches!(d, Dim::Sym(n) if n == "?")),
            _ => false,
        };
        // The product `m` (read only here, no activation or residual yet) and `r`.
        let fusible = |m: ValueId, r: ValueId| {
            let node = prod[m].map(|p| &g.nodes[p]);
            let free = node.is_some_and(|n| {
                !n.attrs.contains_key(ACTIVATION_ATTR) && !n.attrs.contains_key(MATMUL_RESIDUAL_ATTR) && n.inputs.len() <= 3
            });
            free && uses[m] == 1 && !g.initializers.contains_key(&r) && same_known(m, r)
        };
        let found = match into {
            Into::MatMul => matmul_plus(g, &prod, a, fusible),
            Into::Conv => conv_plus(g, &prod, a, fusible),
        };
        let Some((m, _, r)) = found else { continue };
        let out = g.nodes[a].outputs[0];
        let node = &mut g.nodes[m];
        node.inputs.resize(3, None);
        node.inputs.push(Some(r));
        node.attrs.insert(MATMUL_RESIDUAL_ATTR.into(), Attr::Int(1));
        node.outputs[0] = out;
        dead.push(a);
    }
    super::remove_nodes(g, &dead);
    dead.len()
}
