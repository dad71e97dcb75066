//! Quantization: QuantizeLinear and DequantizeLinear, per tensor, per axis and blocked
//! (one file each), sharing how a scale (and zero point) is laid out against the data;
//! DynamicQuantizeLinear. onnxruntime's quantized contrib ops (domain `com.microsoft`,
//! one file each, sharing [`qlinear`]): QLinearAdd and QLinearMul (over
//! `qlinear_binary`), QLinearSigmoid and QLinearLeakyRelu (over `qlinear_lookup`),
//! QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat.
use crate::cpu;
use crate::op::required;
use crate::{Arg, OpError, Registry, Result};
use kiln_graph::{DType, Tensor};

mod dequantize_linear;
pub(crate) mod dynamic_quantize_linear;
pub(crate) mod qlinear;
mod qlinear_add;
mod qlinear_average_pool;
mod qlinear_binary;
mod qlinear_binary_cpu;
mod qlinear_concat;
mod qlinear_global_average_pool;
mod qlinear_leaky_relu;
mod qlinear_lookup;
mod qlinear_mul;
mod qlinear_sigmoid;
pub(crate) mod quantize_linear;

pub(crate) fn register(r: &mut Registry) {
    quantize_linear::register(r);
    dequantize_linear::register(r);
    dynamic_quantize_linear::register(r);
    qlinear_add::register(r);
    qlinear_mul::register(r);
    qlinear_sigmoid::register(r);
    qlinear_leaky_relu::register(r);
    qlinear_global_average_pool::register(r);
    qlinear_average_pool::register(r);
    qlinear_concat::register(r);
}

/// What QuantizeLinear produces and DequantizeLinear reads: the integer dtypes, the 4-
/// and 2-bit integers, float8 and float4.
pub(crate) const LINEAR_QUANT_DTYPES: [DType; 13] = [
    DType::I8, DType::U8, DType::I16, DType::U16, DType::I4, DType::U4, DType::I2, DType::U2,
    DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F4E2M1,
];

/// The ranges of the integer dtypes a quantized tensor may have.
pub(crate) fn range(d: DType) -> (f32, f32) {
    match d {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::U16 => (0.0, 65535.0),
        DType::I4 => (-8.0, 7.0),
        DType::U4 => (0.0, 15.0),
        DType::I2 => (-2.0, 1.0),
        DType::U2 => (0.0, 3.0),
        _ => (i32::MIN as f32, i32::MAX as f32),
    }
}

/// Which scale element serves data element `i` (see [`ScaleLayout::runs`]):
/// `(i / (axis_len * inner)) * c_outer + ((i / inner) % axis_len) / block * c_axis +
/// (i % inner) * c_inner`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScaleLayout {
    pub axis_len: usize,
    pub inner: usize,
    pub block: usize,
    pub c_outer: usize,
    pub c_axis: usize,
    pub c_inner: usize,
}

impl ScaleLayout {
    /// The layout of scale input `si` (and of the zero point `zi`, which must have the
    /// same shape) against data input 0 of shape `x`: one element (per tensor), a 1-D
    /// run along `axis` (per axis), or `x`'s rank with `axis` cut into blocks of
    /// `block_size` (blocked).
    pub fn resolve(inputs: &[Option<Arg>], si: usize, zi: usize, axis: i64, block_size: i64) -> Result<ScaleLayout> {
        let z = inputs.get(zi).copied().flatten().map(|z| z.dims());
        Self::of_dims(required(inputs, 0)?.dims(), (si, required(inputs, si)?.dims()), (zi, z), axis, block_size)
    }

    /// [`ScaleLayout::resolve`] of the tensors a kernel runs on.
    pub fn of_tensors(inputs: &[Option<&Tensor>], si: usize, zi: usize, axis: i64, block_size: i64) -> Result<ScaleLayout> {
        let dims = |i: usize| cpu::input(inputs, i).map(|t| t.dims());
        let z = inputs.get(zi).copied().flatten().map(|z| z.dims());
        Self::of_dims(dims(0)?, (si, dims(si)?), (zi, z), axis, block_size)
    }

    fn of_dims(x: &[usize], (si, s): (usize, &[usize]), (zi, z): (usize, Option<&[usize]>), axis: i64, block_size: i64) -> Result<ScaleLayout> {
        let (x, s) = (x.to_vec(), s.to_vec());
        if let Some(z) = z {
            // A one-element zero point serves a one-element scale whatever their ranks.
            let single = |d: &[usize]| d.len() <= 1 && d.iter().product::<usize>() == 1;
            if z != s.as_slice() && !(single(z) && single(&s)) {
                return Err(OpError::input(zi, format!("zero point of shape {z:?} differs from the scale's {s:?}")));
            }
        }
        let n: usize = s.iter().product();
        let rank = x.len() as i64;
        let per_tensor = ScaleLayout { axis_len: 1, inner: 1, block: 1, c_outer: 0, c_axis: 0, c_inner: 0 };
        if block_size == 0 && n == 1 && s.len() <= 1 {
            return Ok(per_tensor);
        }
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            return Err(OpError::invalid(format!("axis {axis} is out of range for an input of rank {rank}")));
        }
        let a = a as usize;
        let (d, inner) = (x[a], x[a + 1..].iter().product::<usize>());
        if block_size < 0 {
            return Err(OpError::invalid(format!("block_size must not be negative, got {block_size}")));
        }
        if block_size == 0 {
            if s.len() != 1 || s[0] != d {
                return Err(OpError::input(si, format!("a per-axis scale needs shape [{d}] (axis {a} of the input {x:?}), got {s:?}")));
            }
            return Ok(ScaleLayout { axis_len: d, inner, block: 1, c_outer: 0, c_axis: 1, c_inner: 0 });
        }
        let b = block_size as usize;
        let mut want = x.clone();
        want[a] = d.div_ceil(b);
        if s != want {
            return Err(OpError::input(si, format!("a blocked scale (block_size {b} along axis {a} of {x:?}) needs shape {want:?}, got {s:?}")));
        }
        Ok(ScaleLayout { axis_len: d, inner, block: b, c_outer: want[a] * inner, c_axis: inner, c_inner: 1 })
    }

    /// Calls `f(i0, i1, s0, step)` for the runs of consecutive elements that cover
    /// `start..end`: element `i` of run `i0..i1` uses scale element `s0 + (i - i0) *
    /// step` (step 0: one scale for the whole run).
    pub fn runs(&self, start: usize, end: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        if self.c_outer == 0 && self.c_axis == 0 && self.c_inner == 0 {
            return f(start, end, 0, 0);
        }
        let mut i = start;
        while i < end {
            let (row, j) = (i / self.inner, i % self.inner);
            let i1 = ((row + 1) * self.inner).min(end);
            let (o, a) = (row / self.axis_len, row % self.axis_len);
            f(i, i1, o * self.c_outer + a / self.block * self.c_axis + j * self.c_inner, self.c_inner);
            i = i1;
        }
    }

    /// The same as a WGSL expression of the `u32` index `i`.
    pub fn wgsl(&self) -> String {
        if self.c_outer == 0 && self.c_axis == 0 && self.c_inner == 0 {
            return "0u".into();
        }
        format!(
            "(i / {}u) * {}u + ((i / {}u) % {}u) / {}u * {}u + (i % {}u) * {}u",
            self.axis_len * self.inner,
            self.c_outer,
            self.inner,
            self.axis_len,
            self.block,
            self.c_axis,
            self.inner,
            self.c_inner
        )
    }
}
