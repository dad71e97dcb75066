//! [`GraphError`]: what building, validating or querying the IR can report.

use thiserror::Error;

/// Errors raised while building, validating or querying a graph.
#[derive(Debug, Error)]
pub enum GraphError {
    #[error("the graph has a cycle through node '{node}' ({op})")]
    Cycle { node: String, op: String },
    #[error("node '{node}' ({op}) reads value '{value}', which no node, input or initializer produces")]
    DanglingInput { node: String, op: String, value: String },
    #[error("graph output '{0}' is produced by no node, input or initializer")]
    DanglingOutput(String),
    #[error("value '{value}' is produced twice: by {first} and by {second}")]
    DuplicateProducer { value: String, first: String, second: String },
    #[error("tensor '{name}': {what}")]
    BadTensor { name: String, what: String },
    #[error("attribute '{attr}' of node '{node}' ({op}): {what}")]
    BadAttribute { node: String, op: String, attr: String, what: String },
    /// A size computation that overflows ([`crate::size`]).
    #[error(transparent)]
    Size(#[from] crate::size::SizeError),
}

pub type Result<T, E = GraphError> = std::result::Result<T, E>;
