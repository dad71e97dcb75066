//! EyeLike: a 2-D tensor of the input's shape with ones on diagonal `k` (`col - row
//! == k`) and zeros elsewhere, of `dtype` (default: the input's). Only the input's
//! type matters, so the compiler folds it to a constant ([`Op::eval_from_types`]).
use crate::cpu::CpuKernel;
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct EyeLike {
    dtype: Option<DType>,
    k: i64,
}

impl EyeLike {
    fn out_type(&self, inputs: &[Option<Arg>]) -> Result<TensorType> {
        let x = required(inputs, 0)?;
        if x.rank() != 2 {
            return Err(OpError::input(0, format!("EyeLike needs a 2-D input, found shape {:?}", x.dims())));
        }
        Ok(TensorType::new(self.dtype.unwrap_or(x.dtype()), x.dims()))
    }

    fn eye(&self, ty: &TensorType) -> Result<Tensor> {
        let (rows, cols) = (ty.dims[0], ty.dims[1]);
        let v: Vec<f64> = (0..rows * cols).map(|e| ((e % cols) as i64 - (e / cols) as i64 == self.k) as u8 as f64).collect();
        Ok(Tensor::from_f64(ty.dtype, &ty.dims, &v)?)
    }
}

impl Op for EyeLike {
    fn name(&self) -> &str {
        "EyeLike"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![self.out_type(inputs)?])
    }

    fn eval_from_types(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        Some(self.out_type(inputs).and_then(|t| Ok(vec![self.eye(&t)?])))
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for EyeLike {
    fn run(&self, _inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let ty = TensorType::new(outputs[0].dtype(), outputs[0].dims());
        outputs[0] = self.eye(&ty)?;
        Ok(())
    }
}

impl WgslKernel for EyeLike {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let cols = outputs[0].dims.get(1).copied().unwrap_or(1).max(1);
        let k = self.k.clamp(-(1 << 30), 1 << 30);
        let body = format!(
            "dst[i] = select({}, {}, i32(i % {cols}u) - i32(i / {cols}u) == {k}i);",
            wgsl::literal(ty, 0.0),
            wgsl::literal(ty, 1.0)
        );
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("EyeLike", outputs[0].len(), wg, &[("dst", ty, false)], vec![Binding::Output(0)], "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "EyeLike", |spec| {
        let dtype = match spec.int_opt("dtype")? {
            None => None,
            Some(c) => Some(DType::from_onnx_code(c as i32).ok_or_else(|| spec.bad("dtype", format!("unsupported data type code {c}")))?),
        };
        Ok(Box::new(EyeLike { dtype, k: spec.int("k", 0)? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::Attr;

    #[test]
    fn eye_like_diagonals_and_dtypes() {
        for (dims, k) in [([3usize, 4], 0i64), ([4, 3], -2), ([2, 5], 3), ([3, 3], 7)] {
            let x = iota_i64(&dims);
            let op = make("EyeLike", 9, &[("k", Attr::Int(k)), ("dtype", Attr::Int(1))], 1, 1).unwrap();
            let got = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
            assert_eq!(got.dtype(), DType::F32);
            let want: Vec<f64> = (0..dims[0] * dims[1]).map(|e| ((e % dims[1]) as i64 - (e / dims[1]) as i64 == k) as u8 as f64).collect();
            assert_eq!(got.to_f64_vec(), want);
            let same = make("EyeLike", 9, &[("k", Attr::Int(k))], 1, 1).unwrap();
            assert_eq!(run(same.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dtype(), DType::I64);
            let (t, a) = (TensorType::new(DType::I64, dims.to_vec()), None);
            let folded = same.eval_from_types(&[Some(Arg { ty: &t, value: a })]).unwrap().unwrap();
            assert_eq!(folded[0].to_f64_vec(), want);
        }
        let op = make("EyeLike", 9, &[], 1, 1).unwrap();
        assert!(run(op.as_ref(), &as_inputs(&[Some(&iota_f32(&[2, 2, 2]))], &[]), &[]).is_err());
        assert!(make("EyeLike", 9, &[("dtype", Attr::Int(99))], 1, 1).is_err());
    }
}
