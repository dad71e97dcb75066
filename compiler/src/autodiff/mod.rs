//! Reverse-mode automatic differentiation over the IR, and the training step built
//! with it: forward, loss, backward and optimizer update as one graph of Kiln ops.
//!
//! - [`training::build`] is the entry point: a forward model in, a [`TrainingGraph`]
//!   out, whose every value has a concrete type (the batch is fixed).
//! - `lower`: rewrites what has no rule of its own into primitives (BatchNormalization
//!   in training mode, LayerNormalization) before differentiation.
//! - [`gradients`]: the reverse sweep. Each op's gradient is a rule in `rules/`, one file
//!   per op family, written in Kiln ops, so every backend runs it.
//! - `loss` and `optimizer`: losses and update rules, also graphs of Kiln ops.
//! - `mixed`: mixed precision (chosen ops in f16, dynamic loss scaling).
//! - `parallel`: data parallelism (the loss, gradients and BatchNormalization statistics
//!   summed across workers by `kiln.AllReduce` nodes).
//! - `split`: the step cut at the gradients, where data parallelism reduces them.
use kiln_graph::{Graph, NodeId, ValueId};
use std::collections::HashMap;

pub mod emit;
mod loss;
pub mod lower;
mod mixed;
pub mod optimizer;
pub mod parallel;
pub mod rules;
mod split;
pub mod training;

pub use emit::Emit;
pub use loss::Loss;
pub use mixed::MixedPrecision;
pub use optimizer::{Optimizer, OptimizerKind};
pub use parallel::DataParallel;
pub use split::SplitStep;
pub use training::{build, StateKind, StateVar, TrainConfig, Trainable, TrainingGraph};

#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// Ops on the path from the parameters to the loss that have no gradient, all of them.
    #[error("{} node(s) on the path to the loss have no gradient:\n  {}", nodes.len(), nodes.iter().map(|(n, w)| format!("node '{n}' ({w})")).collect::<Vec<_>>().join("\n  "))]
    NoGradient { nodes: Vec<(String, String)> },
    /// A node a gradient rule, loss or optimizer built does not type-check.
    #[error("building node '{node}' ({op}): {what}")]
    Build { node: String, op: String, what: String },
    /// The model or the configuration does not fit training.
    #[error("{0}")]
    Model(String),
}

pub type Result<T, E = AutodiffError> = std::result::Result<T, E>;

/// Adds to `e`'s graph the gradient of the scalar `loss` with respect to each of `wrt`,
/// by a reverse sweep over `order` (the forward nodes, topologically sorted). A value
/// of `wrt` that the loss does not depend on gets a zero gradient.
///
/// Only nodes on a path from `wrt` to the loss are differentiated; every one of them
/// without a rule is reported, all at once, before anything is added.
pub fn gradients(e: &mut Emit, order: &[NodeId], loss: ValueId, wrt: &[ValueId]) -> Result<Vec<ValueId>> {
    let nodes: Vec<kiln_graph::Node> = order.iter().map(|&n| e.graph.nodes[n].clone()).collect();
    let nv = e.graph.values.len();
    // Values that depend on a parameter (forward) and that the loss depends on (backward).
    let mut varies = vec![false; nv];
    for &w in wrt {
        varies[w] = true;
    }
    for n in &nodes {
        if n.inputs.iter().flatten().any(|&v| varies[v]) {
            for &o in &n.outputs {
                varies[o] = e.ty(o).dtype.is_float();
            }
        }
    }
    let mut reaches = vec![false; nv];
    reaches[loss] = true;
    let mut active = vec![false; nodes.len()];
    for (k, n) in nodes.iter().enumerate().rev() {
        if n.outputs.iter().any(|&o| reaches[o] && varies[o]) {
            active[k] = true;
            for &v in n.inputs.iter().flatten() {
                reaches[v] = true;
            }
        }
    }
    let missing: Vec<(String, String)> = nodes
        .iter()
        .zip(&active)
        .filter(|(n, &a)| a && rules::find(&n.domain, &n.op_type).is_none())
        .map(|(n, _)| (n.name.clone(), format!("{}{}", if n.domain.is_empty() { String::new() } else { format!("{}.", n.domain) }, n.op_type)))
        .collect();
    if !missing.is_empty() {
        return Err(AutodiffError::NoGradient { nodes: missing });
    }

    let mut grads: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    let seed = e.scalar(1.0, e.dtype(loss));
    let ld = e.dims(loss);
    let seed = e.expand(seed, &ld)?;
    grads.insert(loss, vec![seed]);
    for (k, n) in nodes.iter().enumerate().rev() {
        if !active[k] {
            continue;
        }
        let dy: Vec<Option<ValueId>> = n.outputs.iter().map(|o| sum(e, grads.remove(o).unwrap_or_default())).collect::<Result<_>>()?;
        if dy.iter().all(Option::is_none) {
            continue;
        }
        let need: Vec<bool> = n.inputs.iter().map(|v| v.is_some_and(|v| varies[v] && reaches[v])).collect();
        if !need.iter().any(|&b| b) {
            continue;
        }
        e.set_scope(format!("{}/grad", n.name));
        let rule = rules::find(&n.domain, &n.op_type).expect("checked above");
        let dx = rule(e, n, &dy, &need)?;
        for (i, g) in dx.into_iter().enumerate() {
            if let (Some(g), Some(Some(v))) = (g, n.inputs.get(i)) {
                if need[i] {
                    grads.entry(*v).or_default().push(g);
                }
            }
        }
    }
    e.set_scope("grad");
    let mut out = vec![];
    for &w in wrt {
        out.push(match sum(e, grads.remove(&w).unwrap_or_default())? {
            Some(g) => g,
            None => {
                let d = e.dims(w);
                e.zeros(e.dtype(w), &d)?
            }
        });
    }
    Ok(out)
}

/// The sum of a value's gradient contributions.
fn sum(e: &mut Emit, parts: Vec<ValueId>) -> Result<Option<ValueId>> {
    let mut it = parts.into_iter();
    let Some(mut acc) = it.next() else { return Ok(None) };
    for p in it {
        acc = e.add(acc, p)?;
    }
    Ok(Some(acc))
}

/// Replaces every read of `old` (node inputs and graph outputs) by `new`.
pub(crate) fn replace_uses(g: &mut Graph, old: ValueId, new: ValueId) {
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            if *v == old {
                *v = new;
            }
        }
    }
    for o in &mut g.outputs {
        if *o == old {
            *o = new;
        }
    }
}
