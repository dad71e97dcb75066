//! The ONNX frontend: decodes .onnx files (protobuf, via prost) into a
//! [`kiln_graph::Graph`], with initializers (inline or external data) as tensors,
//! `Constant` nodes folded into initializers, and errors that list every problem at once.
//! Models are checked against the ONNX specification first (IR version, opset imports,
//! and each node against its operator's schema at the model's opset: `schema`).
//!
//! ```no_run
//! let graph = kiln_compiler::onnx::import_file("model.onnx")?;
//! println!("{} nodes", graph.nodes.len());
//! # Ok::<(), kiln_compiler::onnx::ImportError>(())
//! ```

mod attrs;
mod check;
mod error;
mod file;
mod import;
pub mod proto;
mod schema;
mod schemas;
mod tensor;

pub use check::{check_ops, node_opset};
pub use error::{ImportError, NodeProblem, UnsupportedOp, EXAMPLE_NODES};
pub use import::{
    build, decode_model, import_bytes, import_bytes_with, import_file, import_file_unchecked, import_file_with,
    ImportOptions,
};
pub use tensor::{read_tensor_pb, read_value_pb, tensor_from_proto, tensor_to_proto, write_tensor_pb};
