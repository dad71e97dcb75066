//! Dtype-generic element access for the tensor ops that compute (CumSum, Scatter
//! reductions, TopK, Hardmax, Einsum, ...): floats are handled as f64 and integers
//! (and bool) as i64, which is exact for every dtype Kiln holds (u64 round-trips
//! through i64 bit for bit; wrapping add/mul agree with the unsigned result).
use crate::{OpError, Result};
use kiln_graph::{DType, Tensor};

/// The elements of a tensor, widened.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Num {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Num {
    pub fn of(t: &Tensor) -> Num {
        if t.dtype().is_float() {
            Num::F(t.to_f64_vec())
        } else {
            Num::I(t.to_i64_vec().unwrap_or_else(|_| t.to_f64_vec().iter().map(|&v| v as i64).collect()))
        }
    }

    /// Writes the values into a tensor of `dtype` (C-style casts, as `Cast` does).
    pub fn into_tensor(self, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        Ok(match self {
            Num::F(v) => Tensor::from_f64(dtype, dims, &v)?,
            Num::I(v) => from_i64(dtype, dims, &v)?,
        })
    }
}

/// A tensor of `dtype` from i64 values: integers wrap to the dtype's width like a C cast
/// (so a u64 round-trips through its i64 bit pattern), bools are `x != 0`, floats are
/// converted. The one i64-to-tensor conversion of kiln-ops.
pub(crate) fn from_i64(dtype: DType, dims: &[usize], v: &[i64]) -> Result<Tensor> {
    if !(dtype.is_int() || dtype == DType::Bool) {
        return Ok(Tensor::from_f64(dtype, dims, &v.iter().map(|&x| x as f64).collect::<Vec<_>>())?);
    }
    let mut t = Tensor::zeros(dtype, dims);
    if t.len() != v.len() {
        return Err(crate::OpError::invalid(format!("{} values for a tensor of dims {dims:?}", v.len())));
    }
    write_i64(&mut t, v)?;
    Ok(t)
}

/// Writes i64 values into an integer or bool tensor in place (as [`from_i64`] converts).
pub(crate) fn write_i64(out: &mut Tensor, v: &[i64]) -> Result<()> {
    macro_rules! put {
        ($t:ty) => {{
            for (o, &x) in out.as_mut_slice::<$t>()?.iter_mut().zip(v) {
                *o = x as $t;
            }
        }};
    }
    match out.dtype() {
        DType::I8 => put!(i8),
        DType::I16 => put!(i16),
        DType::I32 => put!(i32),
        DType::I64 => put!(i64),
        DType::U8 => put!(u8),
        DType::U16 => put!(u16),
        DType::U32 => put!(u32),
        DType::U64 => put!(u64),
        DType::Bool => {
            for (o, &x) in out.as_mut_slice::<u8>()?.iter_mut().zip(v) {
                *o = (x != 0) as u8;
            }
        }
        d => return Err(crate::OpError::invalid(format!("i64 values written into a {d} tensor"))),
    }
    Ok(())
}

/// Stores `t` (already of the output's dtype and element count) into `out`.
pub(crate) fn store(out: &mut Tensor, t: Tensor) -> Result<()> {
    if t.dtype() != out.dtype() || t.len() != out.len() {
        return Err(OpError::invalid(format!(
            "internal: result {}{:?} does not fit output {}{:?}",
            t.dtype(),
            t.dims(),
            out.dtype(),
            out.dims()
        )));
    }
    *out = t.reshaped(out.dims())?;
    Ok(())
}

/// (outer, axis size, inner) of `dims` split at `axis`.
pub(crate) fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// Dtypes an arithmetic tensor op accepts (every numeric dtype; not bool).
pub(crate) const NUMERIC: [DType; 12] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
];
