//! StringConcat (opset 20): `X + Y` elementwise, with numpy broadcasting.
use super::expect_strings;
use crate::broadcast::{broadcast_shapes, broadcast_strides, for_each_offset};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::{Arg, Op, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct StringConcat;

impl Op for StringConcat {
    fn name(&self) -> &str {
        "StringConcat"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_strings(inputs, 0)?;
        expect_strings(inputs, 1)?;
        let dims = broadcast_shapes(&[required(inputs, 0)?.dims(), required(inputs, 1)?.dims()])?;
        Ok(vec![TensorType::new(DType::String, dims)])
    }

    fn handles_strings(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn crate::WgslKernel> {
        None
    }
}

impl CpuKernel for StringConcat {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let (x, y) = (a.as_strings()?, b.as_strings()?);
        let dims = broadcast_shapes(&[a.dims(), b.dims()])?;
        let strides = [broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)];
        let mut out = Vec::with_capacity(dims.iter().product());
        for_each_offset(&dims, &strides, |_, at| out.push(format!("{}{}", x[at[0]], y[at[1]])));
        outputs[0] = Tensor::from_strings(&dims, out)?;
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "StringConcat", |_| Ok(Box::new(StringConcat)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn concatenates_with_broadcasting() {
        let got = Case::new("StringConcat").opset(20).input(strs(&[2, 2], &["a", "", "ü", "d"])).input(strs(&[2], &["x", "yz"])).run_cpu().unwrap();
        assert_eq!(got[0].dims(), &[2, 2]);
        assert_eq!(got[0].as_strings().unwrap(), ["ax", "yz", "üx", "dyz"]);
        let got = Case::new("StringConcat").opset(20).input(strs(&[], &["a"])).input(strs(&[], &["b"])).run_cpu().unwrap();
        assert_eq!((got[0].dims(), got[0].as_strings().unwrap()), (&[][..], &["ab".to_string()][..]));
        assert!(Case::new("StringConcat").opset(20).input(strs(&[1], &["a"])).input(i64_vec(&[1])).run_cpu().is_err());
        assert!(Case::new("StringConcat").opset(20).input(strs(&[2], &["a", "b"])).input(strs(&[3], &["a", "b", "c"])).run_cpu().is_err());
    }
}
