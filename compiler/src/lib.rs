//! kiln-compiler: the ONNX frontend ([`onnx`]), the graph passes ([`passes`]) that
//! prepare a graph for the runtime, and automatic differentiation ([`autodiff`]), which
//! turns a model into a training step. (.npy files are read and written by
//! `kiln_runtime::npy`.)
//!
//! Depends on kiln-graph and kiln-ops, never on kiln-runtime: applications that only
//! run models do not link it.

pub mod autodiff;
pub mod onnx;
pub mod passes;

/// A hash of this crate's sources (every `.rs` file under `src/`, FNV-1a 64 in hex,
/// computed by `build.rs`): part of the version of graph-level tuned choices, so that
/// changed passes never reuse a choice measured on older ones.
pub const SOURCE_HASH: &str = env!("KILN_SOURCE_HASH");
