//! Expand into broadcasting: an `Expand` read by Add, Sub, Mul or Div whose other
//! operand already has the result's shape is redundant there, since the operator
//! broadcasts its input to the same result. The reader takes the Expand's input, and an
//! Expand left without readers is removed. Gradients produce this pattern: the
//! gradient of a reduction is an Expand, added to or multiplied with full-size tensors.
use super::{remove_nodes, use_counts, PassContext};
use kiln_graph::{Dim, Graph, ValueType};

/// Same dtype and the same dims (named symbolic dims count as known).
fn known_same(a: &ValueType, b: &ValueType) -> bool {
    a.shape == b.shape && a.dtype == b.dtype && !a.shape.0.iter().any(|d| matches!(d, Dim::Sym(s) if s == "?"))
}

/// Rewires the readers; returns how many inputs were rewired.
pub fn broadcast_expand(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let ty = |v: usize| types.get(v).cloned().flatten();
    // Each Expand's output -> its input.
    let mut source = vec![None; g.values.len()];
    for n in &g.nodes {
        if n.op_type == "Expand" && n.domain.is_empty() {
            if let (Some(Some(x)), Some(&y)) = (n.inputs.first(), n.outputs.first()) {
                if ty(*x).zip(ty(y)).is_some_and(|(a, b)| a.dtype == b.dtype) {
                    source[y] = Some(*x);
                }
            }
        }
    }
    let mut rewired = 0;
    for node in &mut g.nodes {
        if !(node.domain.is_empty() && matches!(node.op_type.as_str(), "Add" | "Sub" | "Mul" | "Div") && node.inputs.len() == 2) {
            continue;
        }
        let Some(out) = node.outputs.first().and_then(|&o| ty(o)) else { continue };
        for i in 0..2 {
            let (Some(e), Some(other)) = (node.inputs[i], node.inputs[1 - i]) else { continue };
            let Some(x) = source[e] else { continue };
            if ty(other).is_some_and(|t| known_same(&t, &out)) && ty(e).is_some_and(|t| known_same(&t, &out)) {
                node.inputs[i] = Some(x);
                rewired += 1;
                break;
            }
        }
    }
    if rewired > 0 {
        let uses = use_counts(g);
        let dead: Vec<usize> = (0..g.nodes.len())
            .filter(|&n| {
                let node = &g.nodes[n];
                node.op_type == "Expand" && node.domain.is_empty() && node.outputs.iter().all(|&o| uses[o] == 0)
            })
            .collect();
        remove_nodes(g, &dead);
    }
    rewired
}
