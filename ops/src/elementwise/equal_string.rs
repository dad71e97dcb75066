//! Equal over string tensors (opset 19): elementwise, broadcasting, byte-for-byte
//! comparison of the UTF-8 strings into a bool tensor. The numeric Equal lives in the
//! binary table; `Binary` hands string inputs here.
use crate::broadcast::{broadcast_shapes, broadcast_strides, for_each_offset};
use crate::op::required;
use crate::{Arg, OpError, Result, TensorType};
use kiln_graph::{DType, Tensor};

/// The output type of Equal when input 0 is a string tensor: input 1 must be one too.
pub(super) fn infer(inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
    if inputs.len() != 2 {
        return Err(OpError::invalid(format!("Equal takes 2 inputs, got {}", inputs.len())));
    }
    let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
    if b.dtype() != DType::String {
        return Err(OpError::input(1, format!("dtype {} differs from input 0's string", b.dtype())));
    }
    Ok(vec![TensorType::new(DType::Bool, broadcast_shapes(&[a.dims(), b.dims()])?)])
}

/// `out = a == b` with broadcasting.
pub(super) fn run(a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<()> {
    let (x, y) = (a.as_strings()?, b.as_strings()?);
    let dims = broadcast_shapes(&[a.dims(), b.dims()])?;
    let strides = [broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)];
    let mut eq = Vec::with_capacity(dims.iter().product());
    for_each_offset(&dims, &strides, |_, at| eq.push(x[at[0]] == y[at[1]]));
    *out = Tensor::from_bools(&dims, &eq)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn strings_compare_with_broadcasting() {
        let a = strs(&[2, 2], &["a", "bc", "é", ""]);
        let got = Case::new("Equal").opset(19).input(a.clone()).input(strs(&[2], &["a", "bc"])).run_cpu().unwrap();
        assert_eq!(got[0].as_slice::<u8>().unwrap(), &[1, 1, 0, 0]);
        let got = Case::new("Equal").opset(19).input(a.clone()).input(strs(&[], &[""])).run_cpu().unwrap();
        assert_eq!((got[0].dims(), got[0].as_slice::<u8>().unwrap()), (&[2usize, 2][..], &[0u8, 0, 0, 1][..]));
        let e = Case::new("Equal").opset(19).input(a).input(i64_vec(&[1, 2])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("differs"), "{e}");
    }
}
