//! Checked size arithmetic: the one place where element counts, byte sizes, strides and
//! offsets of tensors are computed from dims that may come from a model, an artifact,
//! an input file or a command-line flag.
//!
//! Every function fails with a [`SizeError`] naming the dims (and dtype) instead of
//! wrapping. A shape is *representable* when the product of its non-zero dims, times
//! the element size, fits in `isize::MAX` bytes (the most one allocation can hold): then
//! every partial product (a stride, a row length, an offset below the end) fits too,
//! whatever the order of the dims, and so does the byte size of an empty tensor's
//! non-empty siblings. [`crate::Tensor`] keeps that invariant for every tensor it makes.

use crate::DType;
use std::fmt;
use thiserror::Error;

/// The largest byte size Kiln represents (Rust's limit for one allocation).
pub const MAX_BYTES: usize = isize::MAX as usize;

/// A size computation that does not fit: which dims, which dtype, what was computed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{what} of {} shape {dims:?} overflows (more than {MAX_BYTES} bytes)", Dtype(*.dtype))]
pub struct SizeError {
    pub what: &'static str,
    pub dims: Vec<usize>,
    pub dtype: Option<DType>,
}

struct Dtype(Option<DType>);

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, "a {d} tensor of"),
            None => f.write_str("a tensor of"),
        }
    }
}

fn err(what: &'static str, dims: &[usize], dtype: Option<DType>) -> SizeError {
    SizeError { what, dims: dims.to_vec(), dtype }
}

/// The product of the non-zero dims times `unit`, if it stays within [`MAX_BYTES`].
fn nonzero_product(dims: &[usize], unit: usize) -> Option<usize> {
    dims.iter().filter(|&&d| d != 0).try_fold(unit, |a, &d| a.checked_mul(d)).filter(|&n| n <= MAX_BYTES)
}

/// Checks that a shape of `dtype` is representable (see the module docs).
pub fn check(dtype: DType, dims: &[usize]) -> Result<(), SizeError> {
    nonzero_product(dims, dtype.size()).map(|_| ()).ok_or_else(|| err("the size", dims, Some(dtype)))
}

/// Number of elements of a shape (1 for a scalar), for any dtype of at most 8 bytes.
pub fn elements(dims: &[usize]) -> Result<usize, SizeError> {
    nonzero_product(dims, 8).ok_or_else(|| err("the element count", dims, None))?;
    Ok(if dims.contains(&0) { 0 } else { dims.iter().product() })
}

/// Byte size of a `dtype` tensor of shape `dims`.
pub fn bytes(dtype: DType, dims: &[usize]) -> Result<usize, SizeError> {
    check(dtype, dims)?;
    Ok(if dims.contains(&0) { 0 } else { dims.iter().product::<usize>() * dtype.size() })
}

/// Row-major strides, in elements, of a shape.
pub fn strides(dims: &[usize]) -> Result<Vec<usize>, SizeError> {
    nonzero_product(dims, 8).ok_or_else(|| err("the strides", dims, None))?;
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        // Within the check above: every partial product of non-zero dims fits.
        s[i] = s[i + 1] * dims[i + 1].max(1);
    }
    Ok(s)
}

/// Element offset of `index` in a row-major tensor of shape `dims`; every coordinate
/// must be below its dim.
pub fn offset(dims: &[usize], index: &[usize]) -> Result<usize, SizeError> {
    if index.len() != dims.len() || index.iter().zip(dims).any(|(i, d)| i >= d) {
        return Err(err("an index out of range", dims, None));
    }
    let s = strides(dims)?;
    Ok(index.iter().zip(&s).map(|(i, s)| i * s).sum())
}

/// Dims from signed values (ONNX dims, shape tensors, .npy headers): each must be
/// non-negative and the shape representable for `dtype`.
pub fn dims_from_i64(dtype: DType, values: &[i64]) -> Result<Vec<usize>, SizeError> {
    let dims: Vec<usize> = values.iter().map(|&v| usize::try_from(v).unwrap_or(usize::MAX)).collect();
    if values.iter().any(|&v| v < 0) {
        return Err(SizeError { what: "a negative dimension in", dims, dtype: Some(dtype) });
    }
    check(dtype, &dims)?;
    Ok(dims)
}

/// `a * b`, checked (sizes built up step by step: rows times row bytes, ...).
pub fn mul(a: usize, b: usize) -> Result<usize, SizeError> {
    a.checked_mul(b).filter(|&n| n <= MAX_BYTES).ok_or_else(|| err("the product", &[a, b], None))
}

/// `a + b`, checked (an offset plus a length, ...).
pub fn add(a: usize, b: usize) -> Result<usize, SizeError> {
    a.checked_add(b).filter(|&n| n <= MAX_BYTES).ok_or_else(|| err("the sum", &[a, b], None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_fit() {
        assert_eq!(elements(&[]).unwrap(), 1);
        assert_eq!(elements(&[2, 3, 4]).unwrap(), 24);
        assert_eq!(bytes(DType::F32, &[2, 3]).unwrap(), 24);
        assert_eq!(bytes(DType::Bool, &[]).unwrap(), 1);
        assert_eq!(strides(&[2, 3, 4]).unwrap(), vec![12, 4, 1]);
        assert_eq!(strides(&[2, 0, 4]).unwrap(), vec![4, 4, 1]);
        assert_eq!(offset(&[2, 3, 4], &[1, 2, 3]).unwrap(), 23);
        assert_eq!(dims_from_i64(DType::F32, &[3, 0, 5]).unwrap(), vec![3, 0, 5]);
        assert_eq!(mul(1 << 20, 1 << 20).unwrap(), 1 << 40);
        assert_eq!(add(5, 6).unwrap(), 11);
    }

    #[test]
    fn overflow_is_an_error_naming_the_dims_and_dtype() {
        // 2^32 * 2^32 wraps to 0 in usize arithmetic.
        let e = bytes(DType::F32, &[1 << 32, 1 << 32]).unwrap_err();
        assert_eq!(e.dims, vec![1 << 32, 1 << 32]);
        let msg = e.to_string();
        assert!(msg.contains("f32") && msg.contains("[4294967296, 4294967296]"), "{msg}");
        // Byte sizes past isize::MAX are refused even when the element count fits.
        assert!(bytes(DType::F64, &[1 << 61]).is_err());
        assert!(bytes(DType::U8, &[1 << 61]).is_ok());
        assert!(elements(&[usize::MAX, 2]).is_err());
        // An empty tensor does not excuse a huge sibling dim (its strides would overflow),
        // whatever the order of the dims.
        assert!(bytes(DType::F32, &[0, usize::MAX, 2]).is_err());
        assert!(bytes(DType::F32, &[usize::MAX, 2, 0]).is_err());
        assert!(strides(&[1 << 40, 1 << 40, 0]).is_err());
        assert!(offset(&[2, 3], &[2, 0]).is_err());
        assert!(offset(&[2, 3], &[1]).is_err());
        assert!(dims_from_i64(DType::F32, &[2, -1]).unwrap_err().to_string().contains("negative"));
        assert!(dims_from_i64(DType::F32, &[1 << 40, 1 << 40]).is_err());
        assert!(mul(usize::MAX, 2).is_err());
        assert!(add(usize::MAX, 1).is_err());
    }
}
