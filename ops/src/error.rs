use thiserror::Error;

/// Errors from an operator. They do not name the node: the caller (compiler, runtime)
/// wraps them with the node's name and op type.
#[derive(Debug, Error)]
pub enum OpError {
    #[error("attribute '{attr}': {what}")]
    Attr { attr: String, what: String },
    #[error("input {index}: {what}")]
    Input { index: usize, what: String },
    /// The op needs the *value* of an input (a shape, axes, pads) to infer its outputs,
    /// and the value is not known. Sessions react by binding the graph inputs it comes
    /// from by value.
    #[error("input {index}: {what} must be known when the model is specialized (a constant, computable from shapes, or a small integer graph input)")]
    NeedsValue { index: usize, what: String },
    #[error("{0}")]
    Invalid(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Graph(#[from] kiln_graph::GraphError),
}

impl OpError {
    pub fn input(index: usize, what: impl Into<String>) -> OpError {
        OpError::Input { index, what: what.into() }
    }
    pub fn invalid(what: impl Into<String>) -> OpError {
        OpError::Invalid(what.into())
    }
}

pub type Result<T, E = OpError> = std::result::Result<T, E>;
