//! Identity and Dropout (inference): views that pass input 0 through. Dropout's
//! optional mask output is all true; a Dropout that is asked to train is rejected.
use super::common::COPY;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Identity;

impl Op for Identity {
    fn name(&self) -> &str {
        "Identity"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(&COPY)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(&COPY)
    }

    fn is_view(&self) -> bool {
        true
    }

    /// Passes sequences and optionals through too (on the host).
    fn handles_containers(&self) -> bool {
        true
    }

    fn eval_from_types(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        let x = inputs.first().copied().flatten()?;
        if x.ty.is_tensor() {
            return None;
        }
        Some(x.value.map(|v| vec![v.clone()]).ok_or_else(|| OpError::NeedsValue { index: 0, what: "the sequence or optional".into() }))
    }
}

/// Dropout at inference: output = input; the mask output (if wanted) is all true.
#[derive(Debug)]
pub struct Dropout {
    /// Whether the node has the mask output.
    mask: bool,
}

impl Op for Dropout {
    fn name(&self) -> &str {
        "Dropout"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        if let Some(t) = inputs.get(2).copied().flatten() {
            let training = match t.value {
                Some(v) => v.to_f64_vec().first().copied().unwrap_or(0.0) != 0.0,
                None => {
                    return Err(OpError::input(2, "Dropout's training_mode must be a constant (Kiln runs inference only)"))
                }
            };
            let ratio = match inputs.get(1).copied().flatten() {
                None => 0.5,
                Some(Arg { value: Some(r), .. }) => r.to_f64_vec().first().copied().unwrap_or(0.5),
                Some(_) => 0.5,
            };
            if training && ratio != 0.0 {
                return Err(OpError::Unsupported(format!(
                    "Dropout in training mode (training_mode=true, ratio={ratio}): Kiln runs inference only"
                )));
            }
        }
        let mut out = vec![x.ty.clone()];
        if self.mask {
            out.push(TensorType::new(DType::Bool, x.dims()));
        }
        Ok(out)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn is_view(&self) -> bool {
        !self.mask
    }
}

impl CpuKernel for Dropout {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        outputs[0] = x.reshaped(outputs[0].dims())?;
        if let Some(m) = outputs.get_mut(1) {
            m.bytes_mut().fill(1);
        }
        Ok(())
    }
}

impl WgslKernel for Dropout {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        if !self.mask {
            return COPY.generate(inputs, outputs, tune);
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Dropout",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false), ("mask", "u32", false)],
            vec![Binding::Input(0), Binding::Output(0), Binding::Output(1)],
            "",
            "dst[i] = src[i];\n    mask[i] = 1u;",
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Identity", |_| Ok(Box::new(Identity)));
    r.register("", "Dropout", |spec| Ok(Box::new(Dropout { mask: spec.n_outputs() > 1 })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{DType, Tensor};

    #[test]
    fn identity_and_dropout() {
        let x = iota_f32(&[3, 7]);
        let id = make("Identity", 19, &[], 1, 1).unwrap();
        assert_eq!(run(id.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], x);
        let d = make("Dropout", 13, &[], 1, 2).unwrap();
        assert!(!d.is_view());
        let out = run(d.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_eq!(out[0], x);
        assert_eq!(out[1].dtype(), DType::Bool);
        assert!(out[1].bytes().iter().all(|&b| b == 1));
        let d3 = make("Dropout", 13, &[], 3, 1).unwrap();
        let (ratio, train, eval) = (Tensor::scalar(0.3f32), Tensor::from_bools(&[], &[true]).unwrap(), Tensor::from_bools(&[], &[false]).unwrap());
        assert_eq!(run(d3.as_ref(), &as_inputs(&[Some(&x), Some(&ratio), Some(&eval)], &[1, 2]), &[]).unwrap()[0], x);
        let e = run(d3.as_ref(), &as_inputs(&[Some(&x), Some(&ratio), Some(&train)], &[1, 2]), &[]).unwrap_err().to_string();
        assert!(e.contains("training"), "{e}");
        let old = make("Dropout", 7, &[("ratio", kiln_graph::Attr::Float(0.2))], 1, 1).unwrap();
        assert!(old.is_view());
        assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], x);
    }
}
