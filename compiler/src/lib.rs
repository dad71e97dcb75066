//! kiln-compiler: the ONNX frontend ([`onnx`]) and the graph passes ([`passes`]) that
//! prepare a graph for the runtime. (.npy files are read and written by
//! `kiln_runtime::npy`.)
//!
//! Depends on kiln-graph, kiln-ops and kiln-runtime (never the reverse): applications
//! that only run models do not link it.

pub mod onnx;
pub mod passes;
