//! kiln-compiler: the ONNX frontend ([`onnx`]), .npy tensor files ([`npy`]), and (in
//! later layers) the passes that prepare a graph for the runtime.

pub mod npy;
pub mod onnx;
