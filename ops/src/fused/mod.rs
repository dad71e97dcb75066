//! Ops that the graph compiler creates (domain `kiln`): fused kernels that replace
//! groups of ONNX nodes.
use crate::Registry;

pub mod elementwise;

pub use elementwise::{fusible_binary, FusedElementwise, Instr};

pub(crate) fn register(r: &mut Registry) {
    elementwise::register(r);
}
