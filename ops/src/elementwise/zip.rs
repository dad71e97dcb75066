//! Helpers shared by the binary elementwise ops with their own semantics (bitwise,
//! BitShift, Mod, PRelu): integer tensors as i64 bit patterns on the CPU, and the WGSL
//! kernel of a broadcasting two-input expression.
use crate::broadcast::broadcast_strides;
use crate::wgsl::{self, Binding, Dispatch};
use crate::{Arg, Result, TensorType};
use crate::tensor::from_i64;
use kiln_graph::{DType, Tensor};

/// Type of a two-input op whose inputs share a dtype from `allowed` and broadcast.
pub(crate) fn infer_same_dtype_pair(op: &str, inputs: &[Option<Arg>], allowed: &[DType]) -> Result<Vec<TensorType>> {
    if inputs.len() != 2 {
        return Err(crate::OpError::invalid(format!("{op} takes 2 inputs, got {}", inputs.len())));
    }
    let dtype = crate::expect_dtype(inputs, 0, allowed)?;
    let (a, b) = (crate::required(inputs, 0)?, crate::required(inputs, 1)?);
    if b.dtype() != dtype {
        return Err(crate::OpError::input(1, format!("dtype {} differs from input 0's {dtype}", b.dtype())));
    }
    Ok(vec![TensorType::new(dtype, crate::broadcast::broadcast_shapes(&[a.dims(), b.dims()])?)])
}

/// Every integer dtype (signed and unsigned).
pub(crate) const INTEGERS: &[DType] =
    &[DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64];

/// Bits of an integer dtype.
pub(crate) fn int_width(d: DType) -> u32 {
    (d.size() * 8) as u32
}

/// Whether `d` is an unsigned integer dtype.
pub(crate) fn is_unsigned(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64)
}

/// An integer tensor as an i64 tensor of the same dims (bit patterns kept for u64).
pub(crate) fn as_i64_tensor(t: &Tensor) -> Result<Tensor> {
    if t.dtype() == DType::I64 {
        return Ok(t.clone());
    }
    Ok(Tensor::from_vec(t.dims(), t.to_i64_vec()?)?)
}

/// `out = f(a, b)` elementwise with broadcasting on integer tensors, computed on i64
/// bit patterns and truncated to `out`'s dtype.
pub(crate) fn zip_ints(a: &Tensor, b: &Tensor, out: &mut Tensor, f: impl Fn(i64, i64) -> i64 + Sync) -> Result<()> {
    let (ia, ib) = (as_i64_tensor(a)?, as_i64_tensor(b)?);
    let dims = out.dims().to_vec();
    let mut tmp = Tensor::zeros(DType::I64, &dims);
    super::binary::map2(&ia, &ib, &mut tmp, f)?;
    *out = if out.dtype() == DType::I64 { tmp } else { from_i64(out.dtype(), &dims, tmp.as_slice::<i64>()?)? };
    Ok(())
}

/// A one-dispatch kernel computing `out[i] = expr` for a broadcasting two-input op,
/// where `expr` reads `a` and `b` (the inputs' elements, in their storage types).
pub(crate) fn binary_kernel(
    label: &str,
    a: Arg,
    b: Arg,
    out: &TensorType,
    wg: u32,
    helpers: &str,
    expr: &str,
) -> Dispatch {
    let (ta, tb, to) = (wgsl::elem(a.dtype()), wgsl::elem(b.dtype()), wgsl::elem(out.dtype));
    let mut fns = wgsl::offset_fn("off_a", &out.dims, &broadcast_strides(a.dims(), &out.dims));
    fns += &wgsl::offset_fn("off_b", &out.dims, &broadcast_strides(b.dims(), &out.dims));
    fns += helpers;
    let body = format!("let a = in_a[off_a(i)];\n    let b = in_b[off_b(i)];\n    out[i] = {expr};");
    wgsl::simple_kernel(
        label,
        out.len(),
        wg,
        &[("in_a", ta, true), ("in_b", tb, true), ("out", to, false)],
        vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)],
        &fns,
        &body,
    )
}

/// A one-dispatch kernel computing `out[i] = expr` of `x = input[i]`.
pub(crate) fn unary_kernel(label: &str, input: Arg, out: &TensorType, wg: u32, helpers: &str, expr: &str) -> Dispatch {
    wgsl::simple_kernel(
        label,
        out.len(),
        wg,
        &[("x_in", wgsl::elem(input.dtype()), true), ("out", wgsl::elem(out.dtype), false)],
        vec![Binding::Input(0), Binding::Output(0)],
        helpers,
        &format!("let x = x_in[i];\n    out[i] = {expr};"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i64_bits_round_trip_every_integer_dtype() {
        let u = Tensor::from_slice(&[2], &[u64::MAX, 1u64 << 63]).unwrap();
        let back = from_i64(DType::U64, &[2], &u.to_i64_vec().unwrap()).unwrap();
        assert_eq!(back, u);
        let t = from_i64(DType::U8, &[2], &[256 + 7, -1]).unwrap();
        assert_eq!(t.as_slice::<u8>().unwrap(), &[7, 255]);
        let t = from_i64(DType::I8, &[2], &[128, -129]).unwrap();
        assert_eq!(t.as_slice::<i8>().unwrap(), &[-128, 127]);
        assert_eq!(int_width(DType::U16), 16);
        assert!(is_unsigned(DType::U64) && !is_unsigned(DType::I64));
    }
}
