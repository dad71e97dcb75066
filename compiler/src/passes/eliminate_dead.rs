//! Dead-code elimination: nodes none of whose outputs reach a graph output, and weights
//! no node reads, are removed.
use super::PassContext;
use kiln_graph::Graph;

/// Removes dead nodes and unused weights; returns how many of both.
pub fn eliminate_dead(g: &mut Graph, _cx: &mut PassContext) -> usize {
    let Ok(order) = g.validate() else { return 0 };
    let mut live = vec![false; g.values.len()];
    for &o in &g.outputs {
        live[o] = true;
    }
    let mut keep = vec![false; g.nodes.len()];
    for &n in order.iter().rev() {
        if g.nodes[n].outputs.iter().any(|&o| live[o]) {
            keep[n] = true;
            for v in g.nodes[n].inputs.iter().flatten() {
                live[*v] = true;
            }
        }
    }
    let dead: Vec<usize> = (0..g.nodes.len()).filter(|&n| !keep[n]).collect();
    super::remove_nodes(g, &dead);
    let unused: Vec<usize> = g.initializers.keys().copied().filter(|&v| !live[v]).collect();
    for v in &unused {
        g.initializers.remove(v);
    }
    dead.len() + unused.len()
}
