//! Graph passes: each a named function `&mut Graph -> changes`, testable alone, run in
//! order by [`optimize`].
mod fuse_activation;
mod fuse_elementwise;

pub use fuse_activation::fuse_activation;
pub use fuse_elementwise::fuse_elementwise;

use kiln_graph::{Graph, NodeId, ValueId};

/// A graph pass: its name and the function that applies it, returning how many
/// rewrites it made.
pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Graph) -> usize,
}

/// The passes [`optimize`] runs, in order.
pub const PASSES: &[Pass] = &[
    Pass { name: "fuse-activation", run: fuse_activation },
    Pass { name: "fuse-elementwise", run: fuse_elementwise },
];

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassReport {
    pub name: &'static str,
    pub changes: usize,
}

/// Runs every pass in order.
pub fn optimize(graph: &mut Graph) -> Vec<PassReport> {
    PASSES
        .iter()
        .map(|p| {
            let changes = (p.run)(graph);
            log::info!("pass {}: {changes} change(s)", p.name);
            PassReport { name: p.name, changes }
        })
        .collect()
}

/// How many nodes read each value, plus one for each graph output it is.
pub(crate) fn use_counts(g: &Graph) -> Vec<usize> {
    let mut uses = vec![0usize; g.values.len()];
    for n in &g.nodes {
        for v in n.inputs.iter().flatten() {
            uses[*v] += 1;
        }
    }
    for &o in &g.outputs {
        uses[o] += 1;
    }
    uses
}

/// The node producing each value.
pub(crate) fn producers(g: &Graph) -> Vec<Option<NodeId>> {
    let mut p = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &o in &n.outputs {
            p[o] = Some(i);
        }
    }
    p
}

/// Removes the nodes in `dead` (indices), keeping the order of the others.
pub(crate) fn remove_nodes(g: &mut Graph, dead: &[NodeId]) {
    let mut i = 0;
    g.nodes.retain(|_| {
        let keep = !dead.contains(&i);
        i += 1;
        keep
    });
}

/// The scalar f32 value of a constant input, if it is one.
pub(crate) fn scalar_const(g: &Graph, v: Option<ValueId>) -> Option<f32> {
    let t = g.initializers.get(&v?)?;
    (t.len() == 1).then(|| t.to_f64_vec()[0] as f32)
}
