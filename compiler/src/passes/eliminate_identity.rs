//! Identity elimination: nodes that pass their input through unchanged disappear and
//! their readers read the input: Identity, inference-mode Dropout (when its mask is
//! unused), Cast to the dtype the value already has, Reshape/Expand/Flatten/Squeeze/
//! Unsqueeze whose output shape equals the input's (symbolic shapes compared as fitted),
//! Slice with positive constant steps whose output shape equals the input's (exporters
//! emit whole-range slices, e.g. `[0:INT_MAX]` on every axis), and Transpose by the
//! identity permutation.
use super::{bypass, use_counts};
use super::PassContext;
use kiln_graph::{Attr, Dim, Graph, ValueId, ValueType};
use std::collections::HashSet;

fn same_known_shape(a: &ValueType, b: &ValueType) -> bool {
    a.shape == b.shape && a.dtype == b.dtype && !a.shape.0.iter().any(|d| matches!(d, Dim::Sym(s) if s == "?"))
}

/// Removes pass-through nodes; returns how many.
pub fn eliminate_identity(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g);
    let uses = use_counts(g);
    let mut candidates = vec![];
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        if !(node.domain.is_empty() || node.domain == "ai.onnx") || node.outputs.is_empty() {
            continue;
        }
        let (Some(src), out) = (node.inputs.first().copied().flatten(), node.outputs[0]) else { continue };
        let extra_outputs_unused = node.outputs[1..].iter().all(|&o| uses[o] == 0);
        let ty = |v: usize| types.get(v).cloned().flatten();
        let passes = match node.op_type.as_str() {
            "Identity" => true,
            "Dropout" => {
                // Inference: training_mode absent or a constant false.
                let training = node.inputs.get(2).copied().flatten().map(|v| g.initializers.get(&v).map(|t| t.to_f64_vec().first().copied().unwrap_or(0.0) != 0.0));
                extra_outputs_unused && matches!(training, None | Some(Some(false)))
            }
            "Cast" => matches!((node.attrs.get("to"), ty(src)), (Some(Attr::Int(to)), Some(t)) if t.dtype.onnx_code() as i64 == *to),
            "Reshape" | "Expand" | "Flatten" | "Squeeze" | "Unsqueeze" => matches!((ty(src), ty(out)), (Some(a), Some(b)) if same_known_shape(&a, &b)),
            // Same shape and forward steps: every element is taken, in order.
            "Slice" => {
                let forward = match node.inputs.get(4).copied().flatten() {
                    None => true,
                    Some(v) => g.initializers.get(&v).is_some_and(|t| t.to_f64_vec().iter().all(|&s| s > 0.0)),
                };
                forward && matches!((ty(src), ty(out)), (Some(a), Some(b)) if same_known_shape(&a, &b))
            }
            "Transpose" => match node.attrs.get("perm") {
                Some(Attr::Ints(p)) => p.iter().enumerate().all(|(i, &x)| x == i as i64),
                _ => matches!(ty(src), Some(t) if t.shape.rank() <= 1),
            },
            _ => false,
        };
        if passes && extra_outputs_unused {
            candidates.push(n);
        }
    }
    // Readers of a removed node's output read its input instead: one substitution map
    // (chains resolved with path compression) applied in one sweep over the graph.
    let is_output: HashSet<ValueId> = g.outputs.iter().copied().collect();
    let mut subst: Vec<Option<ValueId>> = vec![None; g.values.len()];
    let mut dead = vec![];
    for &n in &candidates {
        let node = &g.nodes[n];
        if let (Some(src), out) = (node.inputs[0], node.outputs[0]) {
            if !is_output.contains(&out) {
                subst[out] = Some(src);
                dead.push(n);
            }
        }
    }
    let mut resolve = |v: ValueId| -> ValueId {
        let mut root = v;
        while let Some(s) = subst[root] {
            root = s;
        }
        let mut at = v;
        while let Some(s) = subst[at] {
            subst[at] = Some(root);
            at = s;
        }
        root
    };
    for node in &mut g.nodes {
        for v in node.inputs.iter_mut().flatten() {
            *v = resolve(*v);
        }
    }
    // A graph output keeps its name: the producer of the input writes it instead
    // (a few per graph: one sweep each).
    for &n in &candidates {
        let node = &g.nodes[n];
        let (src, out) = (node.inputs[0].expect("candidates have an input"), node.outputs[0]);
        if is_output.contains(&out) && bypass(g, out, src) {
            dead.push(n);
        }
    }
    dead.sort_unstable();
    super::remove_nodes(g, &dead);
    dead.len()
}
