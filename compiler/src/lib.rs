//! kiln-compiler: the ONNX frontend ([`onnx`]), .npy tensor files ([`npy`]), and the
//! graph passes ([`passes`]) that prepare a graph for the runtime.
//!
//! Depends on kiln-graph, kiln-ops and kiln-runtime (never the reverse): applications
//! that only run models do not link it.

pub mod npy;
pub mod onnx;
pub mod passes;
