//! Common-subexpression elimination: two nodes with the same op, attributes and inputs
//! compute the same values; the later one goes and its readers read the first's
//! outputs. Runs to a fixed point, so duplicated chains collapse from their roots.
use super::replace_uses;
use super::PassContext;
use kiln_graph::Graph;
use std::collections::HashMap;

/// Merges duplicate nodes; returns how many were removed.
pub fn eliminate_common_subexpressions(g: &mut Graph, _cx: &mut PassContext) -> usize {
    let mut removed = 0;
    loop {
        let Ok(order) = g.validate() else { return removed };
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut dup: Option<(usize, usize)> = None;
        for &n in &order {
            let node = &g.nodes[n];
            if node.op_type.starts_with("Random") || node.op_type == "Bernoulli" || node.op_type == "Multinomial" || kiln_ops::collective::is_collective(&node.domain, &node.op_type) {
                continue;
            }
            let key = format!("{}|{}|{:?}|{:?}|{}", node.domain, node.op_type, node.attrs, node.inputs, node.outputs.len());
            match seen.get(&key) {
                Some(&first) if !node.outputs.iter().any(|o| g.outputs.contains(o)) => {
                    dup = Some((first, n));
                    break;
                }
                Some(_) => {}
                None => {
                    seen.insert(key, n);
                }
            }
        }
        let Some((first, n)) = dup else { return removed };
        for (a, b) in g.nodes[first].outputs.clone().into_iter().zip(g.nodes[n].outputs.clone()) {
            replace_uses(g, b, a);
        }
        super::remove_nodes(g, &[n]);
        removed += 1;
    }
}
