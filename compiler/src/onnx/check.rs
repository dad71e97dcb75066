//! Op checks: every node must name an operator of the registry, and its attributes
//! must parse (the op factory accepts them). All problems are collected and reported
//! together.

use super::error::{ImportError, NodeProblem, UnsupportedOp, EXAMPLE_NODES};
use kiln_graph::{Graph, NodeId};
use kiln_ops::{canonical_domain, NodeSpec, Registry};
use std::collections::BTreeMap;

/// The opset version a node of `domain` is interpreted with: the model's import for that
/// domain (the default domain falls back to [`Graph::opset`]).
pub fn node_opset(graph: &Graph, domain: &str) -> Option<i64> {
    let d = canonical_domain(domain);
    match graph.opsets.get(d) {
        Some(&v) => Some(v),
        None if d.is_empty() => Some(graph.opset()),
        None => None,
    }
}

/// Checks every node of `graph` against `registry`: unsupported ops first (all of them,
/// grouped by domain, op type and opset), then attribute problems of supported nodes.
pub fn check_ops(graph: &Graph, registry: &Registry) -> Result<(), ImportError> {
    check_nodes(graph, registry, Vec::new(), Vec::new())
}

/// [`check_ops`], plus problems found at import: `invalid` (violations of the ONNX spec)
/// and `import_problems` (unrepresentable attributes), reported for the nodes whose op
/// is supported.
pub(crate) fn check_nodes(
    graph: &Graph,
    registry: &Registry,
    import_problems: Vec<(NodeId, String)>,
    invalid: Vec<NodeProblem>,
) -> Result<(), ImportError> {
    let mut unsupported: BTreeMap<(String, String), UnsupportedOp> = BTreeMap::new();
    for n in &graph.nodes {
        if registry.supports(&n.domain, &n.op_type) {
            continue;
        }
        let domain = canonical_domain(&n.domain).to_string();
        let e = unsupported.entry((domain.clone(), n.op_type.clone())).or_insert_with(|| UnsupportedOp {
            domain,
            op_type: n.op_type.clone(),
            opset: node_opset(graph, &n.domain),
            count: 0,
            nodes: Vec::new(),
        });
        e.count += 1;
        if e.nodes.len() < EXAMPLE_NODES {
            e.nodes.push(n.name.clone());
        }
    }
    if !unsupported.is_empty() {
        return Err(ImportError::UnsupportedOps(unsupported.into_values().collect()));
    }

    let problem = |id: NodeId, what: String| {
        let n = &graph.nodes[id];
        NodeProblem { node: n.name.clone(), op_type: n.op_type.clone(), domain: n.domain.clone(), problem: what }
    };
    let mut problems = invalid;
    problems.extend(import_problems.into_iter().map(|(id, what)| problem(id, what)));
    for (id, n) in graph.nodes.iter().enumerate() {
        if problems.iter().any(|p| p.node == n.name) {
            continue; // already reported; the attribute the op needs is missing
        }
        let opset = node_opset(graph, &n.domain).unwrap_or(1);
        if let Err(e) = registry.create(&NodeSpec::new(n, opset)) {
            problems.push(problem(id, e.to_string()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ImportError::InvalidNodes(problems))
    }
}
