//! Ops that the graph compiler creates (domain `kiln`): fused kernels that replace
//! groups of ONNX nodes.
use crate::Registry;

pub mod elementwise;

pub use elementwise::{fusible_binary, CustomFn, FusedElementwise, Instr, CUSTOM_NODES_ATTR};

pub(crate) fn register(r: &mut Registry) {
    elementwise::register(r);
}
