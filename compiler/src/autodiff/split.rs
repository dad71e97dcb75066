//! The training step cut where data parallelism sums the gradients across workers:
//! a backward graph (forward, loss, gradients) and an update graph (everything after
//! the gradients: finiteness checks, clipping, the optimizer, the loss scale).
//!
//! Run one after the other, with each gradient output fed to the update as it is, they
//! compute exactly what the whole step computes. Between them a worker replaces each
//! gradient with the mean over workers. Other values the update reads from the backward
//! part (the loss, for the finite-loss guard) pass through unreduced.
use super::training::TrainingGraph;
use super::{AutodiffError, Result};
use kiln_graph::{Graph, ValueId};
use std::collections::{HashMap, HashSet};

/// The two halves of a training step.
#[derive(Clone, Debug)]
pub struct SplitStep {
    /// Inputs: those of the step it reads (model inputs, label, dropout seed, state).
    /// Outputs: the loss, the prediction, each gradient ([`Self::gradients`], in the
    /// step's reverse layer order), the next values of state that does not depend on
    /// the gradients (running statistics), then those of [`Self::passed`] not among
    /// them.
    pub backward: Graph,
    /// Inputs: the gradients and [`Self::passed`] by name, and those of the step it
    /// reads (optimizer scalars, state). Outputs: every other output of the step.
    pub update: Graph,
    /// Names of the gradient values, as both graphs name them.
    pub gradients: Vec<String>,
    /// Other values computed by the backward graph that the update reads.
    pub passed: Vec<String>,
}

/// Nodes needed for `targets`, not looking past the values of `stop`.
fn cone(g: &Graph, producer: &HashMap<ValueId, usize>, targets: &[ValueId], stop: &HashSet<ValueId>) -> HashSet<usize> {
    let mut nodes = HashSet::new();
    let mut stack: Vec<ValueId> = targets.to_vec();
    let mut seen: HashSet<ValueId> = stack.iter().copied().collect();
    while let Some(v) = stack.pop() {
        if stop.contains(&v) {
            continue;
        }
        if let Some(&k) = producer.get(&v) {
            if nodes.insert(k) {
                for &i in g.nodes[k].inputs.iter().flatten() {
                    if seen.insert(i) {
                        stack.push(i);
                    }
                }
            }
        }
    }
    nodes
}

/// A graph of `g`'s values with the nodes `keep` (in `g`'s order), these inputs and
/// outputs, and the initializers they read.
fn subgraph(g: &Graph, name: &str, keep: &HashSet<usize>, inputs: Vec<ValueId>, outputs: Vec<ValueId>) -> Graph {
    let mut s = g.clone();
    s.name = format!("{}:{name}", g.name);
    s.nodes = g.nodes.iter().enumerate().filter(|(k, _)| keep.contains(k)).map(|(_, n)| n.clone()).collect();
    let read: HashSet<ValueId> = s.nodes.iter().flat_map(|n| n.inputs.iter().flatten().copied()).chain(outputs.iter().copied()).collect();
    s.initializers.retain(|v, _| read.contains(v));
    s.inputs = inputs;
    s.outputs = outputs;
    s
}

impl TrainingGraph {
    /// The step cut at [`TrainingGraph::gradients`] (see the module docs).
    pub fn split_at_gradients(&self) -> Result<SplitStep> {
        let g = &self.graph;
        let fail = |what: String| AutodiffError::Model(format!("splitting the training step: {what}"));
        let find = |name: &str| g.find_value(name).ok_or_else(|| fail(format!("it has no value '{name}'")));
        let grads: Vec<ValueId> = self.gradients.iter().map(|(_, gr)| find(gr)).collect::<Result<_>>()?;
        let mut producer: HashMap<ValueId, usize> = HashMap::new();
        for (k, n) in g.nodes.iter().enumerate() {
            for &o in &n.outputs {
                producer.insert(o, k);
            }
        }
        // Values that depend on a gradient.
        let order = g.validate().map_err(|e| fail(e.to_string()))?;
        let mut after: HashSet<ValueId> = grads.iter().copied().collect();
        for &k in &order {
            let n = &g.nodes[k];
            if n.inputs.iter().flatten().any(|v| after.contains(v)) {
                after.extend(n.outputs.iter().copied());
            }
        }
        let (loss, pred) = (find(&self.loss)?, find(&self.prediction)?);
        let (late, early): (Vec<ValueId>, Vec<ValueId>) = g.outputs.iter().copied().filter(|&o| o != loss && o != pred).partition(|o| after.contains(o));
        let mut b_out: Vec<ValueId> = vec![loss, pred];
        b_out.extend(&grads);
        b_out.extend(&early);
        let b_nodes = cone(g, &producer, &b_out, &HashSet::new());
        let computed: HashSet<ValueId> = b_nodes.iter().flat_map(|&k| g.nodes[k].outputs.iter().copied()).collect();
        let u_nodes = cone(g, &producer, &late, &computed);
        // What the update reads from the backward part, beyond the gradients.
        let mut passed: Vec<ValueId> = vec![];
        for &k in &order {
            if !u_nodes.contains(&k) {
                continue;
            }
            for &v in g.nodes[k].inputs.iter().flatten() {
                if computed.contains(&v) && !grads.contains(&v) && !passed.contains(&v) {
                    passed.push(v);
                }
            }
        }
        for &o in &late {
            if computed.contains(&o) && !grads.contains(&o) && !passed.contains(&o) {
                passed.push(o);
            }
        }
        let reads = |nodes: &HashSet<usize>, extra: &[ValueId]| -> HashSet<ValueId> {
            nodes.iter().flat_map(|&k| g.nodes[k].inputs.iter().flatten().copied()).chain(extra.iter().copied()).collect()
        };
        let b_reads = reads(&b_nodes, &b_out);
        let b_inputs: Vec<ValueId> = g.inputs.iter().copied().filter(|v| b_reads.contains(v)).collect();
        let u_reads = reads(&u_nodes, &late);
        let mut u_inputs: Vec<ValueId> = grads.clone();
        u_inputs.extend(&passed);
        let from_step: Vec<ValueId> = g.inputs.iter().copied().filter(|v| u_reads.contains(v) && !u_inputs.contains(v)).collect();
        u_inputs.extend(from_step);
        let mut b_outputs = b_out;
        for &v in &passed {
            if !b_outputs.contains(&v) {
                b_outputs.push(v);
            }
        }
        let backward = subgraph(g, "backward", &b_nodes, b_inputs, b_outputs);
        let update = subgraph(g, "update", &u_nodes, u_inputs, late);
        backward.validate().map_err(|e| fail(format!("the backward graph: {e}")))?;
        update.validate().map_err(|e| fail(format!("the update graph: {e}")))?;
        let name = |v: &ValueId| g.values[*v].name.clone();
        Ok(SplitStep { backward, update, gradients: grads.iter().map(name).collect(), passed: passed.iter().map(name).collect() })
    }
}
