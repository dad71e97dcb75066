//! kiln-graph: the intermediate representation every other Kiln layer speaks.
//!
//! Typed values (a [`DType`] and a [`Shape`] whose dims are fixed or named symbols),
//! constant [`Tensor`]s, [`Node`]s with [`Attr`]ibutes, and the [`Graph`] that ties them
//! together, plus a [`GraphBuilder`] to construct graphs in code. ONNX's sequences and
//! optionals are [`Value`]s, which travel through tensor interfaces as composite tensors
//! ([`Tensor::from_value`]).
//!
//! Invariants: this crate does no I/O (no file formats, no protobuf) and knows nothing
//! of devices; it depends on no other Kiln crate.

mod arena;
mod attr;
mod builder;
mod dtype;
mod error;
mod graph;
pub mod narrow;
mod shape;
pub mod rng;
pub mod size;
mod tensor;
mod value;

pub use arena::WordMemory;
pub use attr::{Attr, Attributes};
pub use builder::GraphBuilder;
pub use dtype::{DType, Element};
pub use error::{GraphError, Result};
pub use graph::{Graph, Node, NodeId, ValueId, ValueInfo};
pub use shape::{Dim, Shape, ValueKind, ValueType};
pub use size::SizeError;
pub use tensor::Tensor;
pub use value::Value;
