//! Kiln: a cross-vendor heterogeneous compute architecture. This facade re-exports the
//! layers: the graph IR, the operator library, the runtime and the compiler.
pub use kiln_compiler as compiler;
pub use kiln_distributed as distributed;
pub use kiln_graph as graph;
pub use kiln_ops as ops;
pub use kiln_runtime as runtime;

pub mod graph_tuning;
pub mod load;
pub mod train;

/// The user guide (docs/guide.md): its Rust blocks are this crate's doctests.
#[doc = include_str!("../docs/guide.md")]
pub mod guide {}

/// The training guide (docs/training.md): its Rust block is a doctest.
#[doc = include_str!("../docs/training.md")]
pub mod training_guide {}
