//! Signal-processing ops: the Fourier transforms DFT and STFT over one shared line
//! transform ([`spectrum`]) and MelWeightMatrix. (The window functions HannWindow,
//! HammingWindow and BlackmanWindow live with the tensor generators, `tensor/window_fn.rs`.)
use crate::op::constant;
use crate::{Arg, OpError, Registry, Result};

mod dft;
mod mel_weight_matrix;
mod spectrum;
mod stft;

pub(crate) fn register(r: &mut Registry) {
    dft::register(r);
    stft::register(r);
    mel_weight_matrix::register(r);
}

/// The value of scalar integer input `i` (a length, a step, an axis), which must be known.
pub(crate) fn scalar_int(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<i64> {
    let t = constant(inputs, i, what)?;
    if !t.dtype().is_int() {
        return Err(OpError::input(i, format!("{what} must be an integer, found {}", t.dtype())));
    }
    match t.to_i64_vec()?.as_slice() {
        [v] => Ok(*v),
        _ => Err(OpError::input(i, format!("{what} must be a scalar, found shape {:?}", t.dims()))),
    }
}
