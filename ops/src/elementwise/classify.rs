//! IsNaN and IsInf (with detect_positive / detect_negative): float tensors to bool
//! masks. The GPU tests the f32 bit patterns, so no driver shortcut on NaN or infinity
//! comparisons can change the answer.
use super::zip;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Classify {
    IsNaN,
    IsInf { positive: bool, negative: bool },
}

impl Classify {
    fn test(self, x: f64) -> bool {
        match self {
            Classify::IsNaN => x.is_nan(),
            Classify::IsInf { positive, negative } => {
                x.is_infinite() && ((x > 0.0 && positive) || (x < 0.0 && negative))
            }
        }
    }

    fn wgsl_expr(self) -> String {
        let bits = "(bitcast<u32>(x) & 0x7fffffffu)";
        match self {
            Classify::IsNaN => format!("u32({bits} > 0x7f800000u)"),
            Classify::IsInf { positive, negative } => {
                let sign = match (positive, negative) {
                    (true, true) => "true".to_string(),
                    (true, false) => "(bitcast<u32>(x) >> 31u) == 0u".to_string(),
                    (false, true) => "(bitcast<u32>(x) >> 31u) == 1u".to_string(),
                    (false, false) => "false".to_string(),
                };
                format!("u32({bits} == 0x7f800000u && {sign})")
            }
        }
    }
}

#[derive(Debug)]
pub struct ClassifyOp {
    pub kind: Classify,
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

impl Op for ClassifyOp {
    fn name(&self) -> &str {
        match self.kind {
            Classify::IsNaN => "IsNaN",
            Classify::IsInf { .. } => "IsInf",
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if inputs.len() != 1 {
            return Err(OpError::invalid(format!("{} takes 1 input, got {}", self.name(), inputs.len())));
        }
        expect_dtype(inputs, 0, FLOATS)?;
        Ok(vec![TensorType::new(DType::Bool, required(inputs, 0)?.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ClassifyOp {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let dst = outputs[0].as_mut_slice::<u8>()?;
        let kind = self.kind;
        if x.dtype() == DType::F32 {
            let src = x.as_slice::<f32>()?;
            dst.iter_mut().zip(src).for_each(|(o, &v)| *o = kind.test(v as f64) as u8);
        } else {
            dst.iter_mut().zip(x.to_f64_vec()).for_each(|(o, v)| *o = kind.test(v) as u8);
        }
        Ok(())
    }
}

impl WgslKernel for ClassifyOp {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let wg = tune.get(&wgsl::workgroup_param());
        let x = required(inputs, 0)?;
        Ok(WgslProgram::single(zip::unary_kernel(self.name(), x, &outputs[0], wg, "", &self.kind.wgsl_expr())))
    }
}

fn flag(spec: &NodeSpec, name: &str) -> Result<bool> {
    match spec.int(name, 1)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(spec.bad(name, format!("expected 0 or 1, found {v}"))),
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "IsNaN", |_| Ok(Box::new(ClassifyOp { kind: Classify::IsNaN })));
    r.register("", "IsInf", |spec| {
        let kind = Classify::IsInf { positive: flag(spec, "detect_positive")?, negative: flag(spec, "detect_negative")? };
        Ok(Box::new(ClassifyOp { kind }))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: Classify, x: &Tensor) -> Result<Vec<u8>> {
        let op = ClassifyOp { kind };
        let tx = TensorType::new(x.dtype(), x.dims());
        let args = [Some(Arg { ty: &tx, value: None })];
        let ty = op.infer(&args)?;
        assert_eq!(ty[0].dtype, DType::Bool);
        let prog = op.generate(&args, &ty, &TuneValues::default())?;
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(DType::Bool, &ty[0].dims)];
        op.run(&[Some(x)], &mut out)?;
        Ok(out[0].as_slice::<u8>()?.to_vec())
    }

    #[test]
    fn special_values_in_every_float_dtype() {
        let v = [-1.7, f64::NAN, f64::INFINITY, -0.0, f64::NEG_INFINITY, 3.0e38, f64::MIN_POSITIVE];
        for d in FLOATS {
            let x = Tensor::from_f64(*d, &[7], &v).unwrap();
            let big_is_inf = (*d == DType::F16) as u8; // 3e38 overflows f16
            assert_eq!(run(Classify::IsNaN, &x).unwrap(), vec![0, 1, 0, 0, 0, 0, 0], "{d}");
            let all = Classify::IsInf { positive: true, negative: true };
            assert_eq!(run(all, &x).unwrap(), vec![0, 0, 1, 0, 1, big_is_inf, 0], "{d}");
            let pos = Classify::IsInf { positive: true, negative: false };
            assert_eq!(run(pos, &x).unwrap(), vec![0, 0, 1, 0, 0, big_is_inf, 0], "{d}");
            let neg = Classify::IsInf { positive: false, negative: true };
            assert_eq!(run(neg, &x).unwrap(), vec![0, 0, 0, 0, 1, 0, 0], "{d}");
        }
        assert!(run(Classify::IsNaN, &Tensor::from_slice(&[1], &[1i32]).unwrap()).is_err());
    }
}
