//! Binarizer (ai.onnx.ml 1): 1 where `X > threshold` (default 0), else 0, in `X`'s
//! dtype (f32, f64, i64, i32). NaN is not greater than anything: 0.
use crate::cpu::{self, CpuKernel};
use crate::op::expect_dtype;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Binarizer {
    threshold: f32,
}

impl Op for Binarizer {
    fn name(&self) -> &str {
        "Binarizer"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::I64, DType::I32])?;
        Ok(vec![crate::required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Binarizer {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let t = self.threshold as f64;
        let y: Vec<f64> = x.to_f64_vec().iter().map(|&v| if v > t { 1.0 } else { 0.0 }).collect();
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for Binarizer {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        // Integers compare in f32 as the CPU compares in f64 (exact for |x| < 2^24).
        let body = format!(
            "y[i] = select({}, {}, f32(x[i]) > {});",
            wgsl::literal(ty, 0.0),
            wgsl::literal(ty, 1.0),
            wgsl::literal("f32", self.threshold as f64)
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Binarizer",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", ty, true), ("y", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.ml", "Binarizer", |spec| Ok(Box::new(Binarizer { threshold: spec.float("threshold", 0.0)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    #[test]
    fn above_the_threshold_is_one() {
        let x = f32s(&[6], &[-1.0, 0.5, 1.0, 1.5, f32::NAN, 7.0]);
        let got = Case::new("Binarizer").domain("ai.onnx.ml").opset(1).input(x).attr("threshold", Attr::Float(1.0)).run_cpu().unwrap();
        assert_close(&got[0], &[0.0, 0.0, 0.0, 1.0, 0.0, 1.0], 0.0, "f32");
        let got = Case::new("Binarizer").domain("ai.onnx.ml").opset(1).input(i64_vec(&[-2, 0, 3])).run_cpu().unwrap();
        assert_eq!(got[0].to_i64_vec().unwrap(), vec![0, 0, 1]);
    }
}
