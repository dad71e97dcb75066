//! Constant folding: a node whose inputs are all weights is evaluated now, with the same
//! CPU kernel the runtime would use, and its outputs become weights. So is a node whose
//! result follows from its inputs' types alone (Shape, Size, ...) once those types are
//! fully known (after `kiln compile --fix`): exported shape subgraphs
//! (Shape -> Gather -> Concat -> Reshape) fold away. Random ops are left alone, and so
//! are results larger than [`MAX_FOLDED_ELEMENTS`] (a folded ConstantOfShape must not
//! turn a tiny model into a huge file).
use super::PassContext;
use kiln_graph::{Graph, Tensor};
use kiln_ops::{Arg, NodeSpec, Registry, TensorType};

/// Largest tensor (elements) a folded node may produce.
pub const MAX_FOLDED_ELEMENTS: usize = 1 << 22;

fn evaluate(g: &Graph, n: usize, types: &[Option<kiln_graph::ValueType>], registry: &Registry) -> Option<Vec<Tensor>> {
    let node = &g.nodes[n];
    if node.op_type.starts_with("Random") || node.op_type == "Bernoulli" || node.outputs.is_empty() {
        return None;
    }
    let opset = g.opsets.get(&node.domain).copied().unwrap_or_else(|| g.opset());
    let op = registry.create(&NodeSpec::new(node, opset)).ok()?;
    let values: Vec<Option<&Tensor>> = node.inputs.iter().map(|v| v.and_then(|v| g.initializers.get(&v))).collect();
    // Types of the inputs: from the weights, else fully fixed inferred types.
    let fixed = |v: usize| -> Option<TensorType> {
        let t = types.get(v)?.as_ref()?;
        // Sequences and optionals are never weights: a node that reads one stays.
        if !t.kind.is_tensor() {
            return None;
        }
        Some(TensorType::new(t.dtype, t.shape.as_fixed()?))
    };
    let in_types: Vec<Option<TensorType>> = node
        .inputs
        .iter()
        .zip(&values)
        .map(|(v, t)| match (v, t) {
            (None, _) => Some(None),
            (_, Some(t)) => Some(Some(TensorType::of(t))),
            (Some(v), None) => fixed(*v).map(Some),
        })
        .collect::<Option<_>>()?;
    let args: Vec<Option<Arg>> = in_types.iter().zip(&values).map(|(t, v)| t.as_ref().map(|t| Arg { ty: t, value: *v })).collect();
    let all_constant = node.inputs.iter().zip(&values).all(|(v, t)| v.is_none() || t.is_some());
    let out_types = op.infer(&args).ok()?;
    if out_types.len() < node.outputs.len() || out_types.iter().any(|t| t.checked_len().is_none_or(|n| n > MAX_FOLDED_ELEMENTS)) {
        return None;
    }
    if out_types.iter().any(|t| !t.is_tensor()) {
        return None; // not a weight either
    }
    if let Some(r) = op.eval_from_types(&args) {
        return r.ok();
    }
    if !all_constant || op.varies_between_runs() {
        return None;
    }
    let values: Vec<Option<&Tensor>> = values.clone();
    let mut outs: Vec<Tensor> = out_types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
    op.cpu()?.run(&values, &mut outs).ok()?;
    Some(outs)
}

/// Folds nodes whose inputs are all constant (repeatedly, in topological order);
/// returns how many.
pub fn fold_constants(g: &mut Graph, cx: &mut PassContext) -> usize {
    let Ok(order) = g.validate() else { return 0 };
    let registry = cx.registry();
    let types = cx.types(g);
    let mut dead = vec![];
    for n in order {
        // Graph outputs stay computed by a node (a run returns them by name either way).
        if g.nodes[n].outputs.iter().any(|o| g.outputs.contains(o)) {
            continue;
        }
        if let Some(outs) = evaluate(g, n, types, registry) {
            for (&o, t) in g.nodes[n].outputs.clone().iter().zip(outs) {
                g.initializers.insert(o, t);
            }
            dead.push(n);
        }
    }
    super::remove_nodes(g, &dead);
    dead.len()
}
