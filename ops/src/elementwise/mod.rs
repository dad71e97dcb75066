//! Elementwise operators: unary math/activations, broadcasting binary ops, and the
//! binary ops with their own semantics (bitwise, BitShift, Mod, PRelu, SwiGLU) and float
//! classification (IsNaN, IsInf); onnxruntime's GELU contrib ops (Gelu, FastGelu,
//! BiasGelu in `gelu_msft.rs`, over the unary table's Gelu). Unary and plain binary ops
//! are tables, one entry per
//! op (`unary_ops!` in unary.rs, `binary_ops!` in binary.rs: CPU function + WGSL
//! expression), so the fuser can compose them.
use crate::Registry;

mod epilogue;
mod equal_string;
mod gelu_msft;
mod binary;
mod binary_op;
mod binary_table;
mod bitshift;
mod bitwise;
mod classify;
mod modulo;
mod prelu;
mod swiglu;
mod unary;
mod unary_op;
mod unary_table;
mod unary_wgsl;
mod zip;

pub use binary::BinaryKind;
pub use epilogue::{activation_wgsl, apply_activation, fused_activation, ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR, BIAS_ATTR, RESIDUAL_ATTR};
pub use unary::UnaryKind;
pub use unary_op::unary_kind_of;
pub(crate) use unary_wgsl::{wgsl_isnan, wgsl_max, wgsl_min};

pub(crate) fn register(r: &mut Registry) {
    unary_op::register(r);
    binary_op::register(r);
    bitwise::register(r);
    bitshift::register(r);
    classify::register(r);
    modulo::register(r);
    prelu::register(r);
    swiglu::register(r);
    gelu_msft::register(r);
}
