//! Errors of graph-level inference: each names the node (as the source model calls it)
//! and its op.
use crate::OpError;
use kiln_graph::GraphError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum InferError {
    #[error("node '{node}' ({op}): {error}")]
    Node { node: String, op: String, error: OpError },
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    /// Ops that cannot be created (unknown op, bad attributes), all of them at once.
    #[error("{node}: {what}")]
    Unsupported { node: String, what: String },
    /// A value larger than the memory limit, or whose size does not fit in memory at all.
    #[error("node '{node}' ({op}): output {output} ({ty}) needs {bytes}, more than the memory limit of {limit} bytes")]
    TooLarge { node: String, op: String, output: String, ty: String, bytes: String, limit: u64 },
}

impl InferError {
    pub fn node(node: &kiln_graph::Node, source: OpError) -> InferError {
        InferError::Node { node: node.name.clone(), op: node.op_type.clone(), error: source }
    }
}
