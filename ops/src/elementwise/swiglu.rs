//! SwiGLU (opset 28): `Swish_alpha(A) * B = A * sigmoid(alpha * A) * B` (alpha default
//! 1) of two tensors of one shape and float dtype (no broadcasting, as the spec says).
//! The CPU computes in f64 and rounds once; WGSL computes in f32, one invocation per
//! element.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct SwiGlu {
    alpha: f32,
}

impl Op for SwiGlu {
    fn name(&self) -> &str {
        "SwiGLU"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
        if a.ty != b.ty {
            return Err(OpError::input(1, format!("B must have A's type {} (SwiGLU does not broadcast), found {}", a.ty, b.ty)));
        }
        Ok(vec![a.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for SwiGlu {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let alpha = self.alpha as f64;
        let y: Vec<f64> = a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(&a, b)| a / (1.0 + (-alpha * a).exp()) * b).collect();
        outputs[0] = Tensor::from_f64(a.dtype(), a.dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for SwiGlu {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let body = format!("let v = a[i];\n    y[i] = v / (1.0 + exp(-{} * v)) * b[i];", wgsl::literal("f32", self.alpha as f64));
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "SwiGLU",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("a", "f32", true), ("b", "f32", true), ("y", "f32", false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "SwiGLU", |spec| Ok(Box::new(SwiGlu { alpha: spec.float("alpha", 1.0)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    #[test]
    fn swish_gate_times_b() {
        let (a, b) = (rand_f32(&[3, 7], 1), rand_f32(&[3, 7], 2));
        for alpha in [1.0f32, 0.5, 1.702] {
            let want: Vec<f64> = a
                .to_f64_vec()
                .iter()
                .zip(b.to_f64_vec())
                .map(|(&x, y)| x * (1.0 / (1.0 + (-(alpha as f64) * x).exp())) * y)
                .collect();
            let got = Case::new("SwiGLU").opset(28).input(a.clone()).input(b.clone()).attr("alpha", Attr::Float(alpha)).run_cpu().unwrap();
            assert_close(&got[0], &want, 1e-6, &format!("alpha {alpha}"));
        }
        let half = Case::new("SwiGLU").opset(28).input(cast(&a, DType::F16)).input(cast(&b, DType::F16)).run_cpu().unwrap();
        assert_eq!(half[0].dtype(), DType::F16);
        assert!(Case::new("SwiGLU").opset(28).input(a.clone()).input(rand_f32(&[1, 7], 3)).run_cpu().is_err(), "no broadcasting");
        assert!(Case::new("SwiGLU").opset(28).input(a).input(cast(&b, DType::F64)).run_cpu().is_err(), "one dtype");
    }
}
