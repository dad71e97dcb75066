//! A run's node order: the graph's topological order, except for nodes that ask for
//! a place of their own ([`kiln_ops::Schedule`]). A node that starts background work
//! (kiln.AllReduceStart) moves up to just after its last input's producer; a node
//! that waits for it (kiln.AllReduceWait) moves, with everything that depends on it,
//! after every node that does not. So the work between them (the rest of a backward
//! pass) overlaps the background work (a gradient bucket's all-reduce).
use kiln_graph::{Graph, NodeId};
use kiln_ops::{Op, Schedule};
use std::collections::{HashMap, HashSet};

pub fn order(graph: &Graph, ops: &[Box<dyn Op>], topo: Vec<NodeId>) -> Vec<NodeId> {
    if ops.iter().all(|o| o.schedule() == Schedule::Any) {
        return topo;
    }
    let mut producer = HashMap::new();
    for (k, n) in graph.nodes.iter().enumerate() {
        for &o in &n.outputs {
            producer.insert(o, k);
        }
    }
    let inputs_of = |k: NodeId| graph.nodes[k].inputs.iter().flatten().filter_map(|v| producer.get(v).copied()).collect::<Vec<_>>();
    // The late nodes and everything downstream of them (in topological order, so a
    // node's producers are classified before it).
    let mut tail: HashSet<NodeId> = HashSet::new();
    for &k in &topo {
        if ops[k].schedule() == Schedule::Late || inputs_of(k).iter().any(|p| tail.contains(p)) {
            tail.insert(k);
        }
    }
    let mut head: Vec<NodeId> = topo.iter().copied().filter(|k| !tail.contains(k)).collect();
    for k in head.clone() {
        if ops[k].schedule() != Schedule::Early {
            continue;
        }
        let at = head.iter().position(|&h| h == k).expect("in the head");
        head.remove(at);
        let deps = inputs_of(k);
        let after = head.iter().rposition(|h| deps.contains(h)).map_or(0, |p| p + 1);
        head.insert(after, k);
    }
    head.extend(topo.iter().copied().filter(|k| tail.contains(k)));
    head
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::GraphBuilder;
    use kiln_graph::DType;
    use kiln_ops::collective::{ALL_REDUCE_START, ALL_REDUCE_WAIT, DOMAIN};

    /// A start moves up to its input's producer; its wait, and what reads the wait,
    /// go after every node that does not depend on it, whatever the topological order
    /// the graph gave (here the nodes are listed in the worst order: wait first).
    #[test]
    fn starts_go_early_and_waits_late() {
        let mut b = GraphBuilder::new("overlap");
        let x = b.input("x", DType::F32, [4usize]);
        let g = b.node("Relu", &[x], &[]);
        let mut chain = g;
        for _ in 0..5 {
            chain = b.node("Neg", &[chain], &[]);
        }
        let ticket = b.node("AllReduceStart", &[g], &[]);
        let summed = b.node("AllReduceWait", &[ticket, g], &[]);
        let out = b.node("Add", &[summed, chain], &[]);
        b.output(out);
        let mut graph = b.finish().unwrap();
        for n in &mut graph.nodes {
            if n.op_type.starts_with("AllReduce") {
                n.domain = DOMAIN.into();
            }
        }
        // Wait, start and add listed first: a topological order may put them anywhere.
        graph.nodes.rotate_right(3);
        let ops = kiln_ops::infer::create_ops(&graph, kiln_ops::Registry::builtin()).unwrap();
        let topo = graph.validate().unwrap();
        let order = order(&graph, &ops, topo);
        let names: Vec<&str> = order.iter().map(|&k| graph.nodes[k].op_type.as_str()).collect();
        assert_eq!(names, ["Relu", ALL_REDUCE_START, "Neg", "Neg", "Neg", "Neg", "Neg", ALL_REDUCE_WAIT, "Add"]);
    }
}
