//! Elementwise operators: unary math/activations and broadcasting binary ops.
//! Each op is a variant described once (CPU function + WGSL expression), so the fuser
//! can compose them.
use crate::Registry;

mod binary;
mod unary;

pub use binary::BinaryKind;
pub use unary::{activation_wgsl, apply_activation, fused_activation, unary_kind_of, UnaryKind, ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};

pub(crate) fn register(r: &mut Registry) {
    unary::register(r);
    binary::register(r);
}
