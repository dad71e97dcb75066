//! Algebraic clean-ups:
//! - `Transpose(Transpose(x, p), q)` becomes one Transpose by the composed permutation
//!   (or nothing, when that is the identity);
//! - `Reshape(Reshape(x, a), b)` becomes `Reshape(x, b)` when `b` is a constant without
//!   0 entries (a 0 copies a dim of the input, which would change meaning);
//! - `x * 1`, `x / 1`, `x + 0`, `x - 0` with a constant whose broadcast does not grow
//!   `x` (it has at most `x`'s rank and one element) become `x`.
//!
//! The inner node must have no other reader; it is left for dead-code elimination.
use super::{bypass, producers, use_counts};
use super::PassContext;
use kiln_graph::{Attr, Graph};

/// Applies the rewrites; returns how many.
pub fn simplify_algebra(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let uses = use_counts(g);
    let prod = producers(g);
    let mut changes = 0;
    let mut dead = vec![];
    for n in 0..g.nodes.len() {
        let node = g.nodes[n].clone();
        if !(node.domain.is_empty() || node.domain == "ai.onnx") || dead.contains(&n) {
            continue;
        }
        let Some(x) = node.inputs.first().copied().flatten() else { continue };
        let inner = prod[x].filter(|&p| uses[x] == 1 && g.nodes[p].op_type == node.op_type && g.nodes[p].domain == node.domain);
        match node.op_type.as_str() {
            "Transpose" => {
                let (Some(p), Some(Attr::Ints(q))) = (inner, node.attrs.get("perm")) else { continue };
                let Some(Attr::Ints(first)) = g.nodes[p].attrs.get("perm").cloned() else { continue };
                if first.len() != q.len() {
                    continue;
                }
                // out[i] = mid[q[i]] = in[first[q[i]]]
                let Some(composed) = q.iter().map(|&i| usize::try_from(i).ok().and_then(|i| first.get(i).copied())).collect::<Option<Vec<i64>>>() else { continue };
                let Some(src) = g.nodes[p].inputs.first().copied().flatten() else { continue };
                g.nodes[n].inputs[0] = Some(src);
                g.nodes[n].attrs.insert("perm".into(), Attr::Ints(composed.clone()));
                changes += 1;
                if composed.iter().enumerate().all(|(i, &x)| x == i as i64) {
                    if bypass(g, node.outputs[0], src) {
                        dead.push(n);
                    }
                }
            }
            "Reshape" => {
                let Some(p) = inner else { continue };
                let shape = node.inputs.get(1).copied().flatten().and_then(|v| g.initializers.get(&v));
                let no_zero = shape.and_then(|t| t.to_i64_vec().ok()).is_some_and(|s| !s.contains(&0));
                let allowzero = matches!(node.attrs.get("allowzero"), Some(Attr::Int(1)));
                let Some(src) = g.nodes[p].inputs.first().copied().flatten() else { continue };
                if no_zero || allowzero {
                    g.nodes[n].inputs[0] = Some(src);
                    changes += 1;
                }
            }
            "Mul" | "Div" | "Add" | "Sub" => {
                let Some(c) = node.inputs.get(1).copied().flatten() else { continue };
                let Some(t) = g.initializers.get(&c) else { continue };
                let neutral = if matches!(node.op_type.as_str(), "Mul" | "Div") { 1.0 } else { 0.0 };
                let rank_ok = types.get(x).cloned().flatten().is_some_and(|tx| t.rank() <= tx.shape.rank() && Some(tx.dtype) == Some(t.dtype()));
                if t.len() == 1 && t.to_f64_vec()[0] == neutral && rank_ok && bypass(g, node.outputs[0], x) {
                    dead.push(n);
                    changes += 1;
                }
            }
            _ => {}
        }
    }
    super::remove_nodes(g, &dead);
    changes
}
