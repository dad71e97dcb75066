use kiln_graph::GraphError;
use kiln_ops::OpError;
use thiserror::Error;

/// Errors from building or running a session.
#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("node '{node}' ({op}): {error}")]
    Node { node: String, op: String, error: OpError },
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    #[error("unknown input '{name}': the model's inputs are {expected}")]
    UnknownInput { name: String, expected: String },
    #[error("input '{0}' was given more than once")]
    DuplicateInput(String),
    #[error("missing input '{name}' ({ty})")]
    MissingInput { name: String, ty: String },
    #[error("input '{name}': expected {expected}, got {got}")]
    InputMismatch { name: String, expected: String, got: String },
    #[error("no GPU: {0}")]
    NoGpu(String),
    #[error("GPU error: {0}")]
    Gpu(String),
    /// An adapter that wgpu lists but whose device does not open (NVIDIA's headless
    /// EGL offers a GL 3.3 context without compute shaders, for one).
    #[error("GPU unavailable: {0}")]
    GpuUnavailable(String),
    #[error("{node}: {what}")]
    Unsupported { node: String, what: String },
    #[error("value out of range for the device: {0}")]
    OutOfRange(String),
    #[error("artifact {0}")]
    Artifact(String),
    #[error("placement {0}")]
    Placement(String),
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl From<kiln_ops::infer::InferError> for RuntimeError {
    fn from(e: kiln_ops::infer::InferError) -> Self {
        use kiln_ops::infer::InferError;
        match e {
            InferError::Node { node, op, error } => RuntimeError::Node { node, op, error },
            InferError::Graph(g) => RuntimeError::Graph(g),
            InferError::Unsupported { node, what } => RuntimeError::Unsupported { node, what },
            e @ InferError::TooLarge { .. } => RuntimeError::OutOfRange(e.to_string()),
        }
    }
}

/// The error of a lock whose holder panicked.
pub(crate) fn poisoned() -> RuntimeError {
    RuntimeError::Gpu("a previous run panicked while holding a lock".into())
}

impl RuntimeError {
    pub(crate) fn node(node: &kiln_graph::Node, source: OpError) -> RuntimeError {
        RuntimeError::Node { node: node.name.clone(), op: node.op_type.clone(), error: source }
    }
}
