//! Reductions: the ReduceX family, Softmax/LogSoftmax and ArgMax/ArgMin, sharing one
//! index layout ([`layout::ReduceLayout`]) between CPU kernels and WGSL generators.
use crate::Registry;

mod argminmax;
mod kernels;
mod layout;
mod reduce;
mod softmax;

pub(crate) fn register(r: &mut Registry) {
    reduce::register(r);
    softmax::register(r);
    argminmax::register(r);
}
