//! onnxruntime's GELU contrib ops (domain `com.microsoft`): `Gelu` (exact, erf),
//! `FastGelu` (the tanh approximation of an input plus an optional bias) and `BiasGelu`
//! (exact GELU of an input plus a bias). The bias is a vector as long as the input's
//! last dim, added to every row. The GELU itself is the unary table's `Gelu` kind, so
//! the formulas (CPU and WGSL) are the ones of ONNX's Gelu.
use super::unary::FLOATS;
use super::UnaryKind;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct MsGelu {
    name: &'static str,
    /// The tanh approximation (FastGelu) instead of erf.
    tanh: bool,
    /// Whether input 1 (the bias) must be given (BiasGelu), may be (FastGelu) or must
    /// not (Gelu).
    bias: BiasRule,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum BiasRule {
    Required,
    Optional,
    None,
}

impl MsGelu {
    fn kind(&self) -> UnaryKind {
        UnaryKind::Gelu { tanh: self.tanh }
    }

    /// The bias length (the input's last dim) when input 1 is present; checks its shape.
    fn bias_len(&self, x: &[usize], b: Option<&[usize]>) -> Result<Option<usize>> {
        match (b, self.bias) {
            (None, BiasRule::Required) => Err(OpError::input(1, format!("{} needs a bias", self.name))),
            (Some(_), BiasRule::None) => Err(OpError::invalid(format!("{} takes one input", self.name))),
            (None, _) => Ok(None),
            (Some(b), _) => {
                let last = x.last().copied().unwrap_or(1);
                if b != [last] {
                    return Err(OpError::input(1, format!("the bias must be a vector of the input's last dim {last}, found shape {b:?}")));
                }
                Ok(Some(last))
            }
        }
    }
}

impl Op for MsGelu {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        self.name
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        let b = inputs.get(1).copied().flatten();
        if let Some(b) = b {
            if b.dtype() != dtype {
                return Err(OpError::input(1, format!("bias dtype {} differs from the input's {dtype}", b.dtype())));
            }
        }
        self.bias_len(x.dims(), b.map(|b| b.dims()))?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 10 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MsGelu {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let b = inputs.get(1).copied().flatten();
        let n = self.bias_len(x.dims(), b.map(|b| b.dims()))?;
        let kind = self.kind();
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let bias: Option<Vec<f32>> = b.map(|b| b.to_f64_vec().into_iter().map(|v| v as f32).collect());
            let unit = n.unwrap_or(1).max(1);
            cpu::par_chunks_mut(outputs[0].as_mut_slice::<f32>()?, unit, 8 * unit, |first, part| {
                // `first` counts units (rows of the bias's length).
                let start = first * unit;
                part.copy_from_slice(&xs[start..start + part.len()]);
                if let (Some(bias), Some(n)) = (&bias, n) {
                    for (k, v) in part.iter_mut().enumerate() {
                        *v += bias[(start + k) % n];
                    }
                }
                kind.apply_slice_f32_fast(part);
            });
        } else {
            let bias = b.map(|b| b.to_f64_vec());
            let v: Vec<f64> = x
                .to_f64_vec()
                .into_iter()
                .enumerate()
                .map(|(i, v)| kind.apply_f64(v + bias.as_ref().zip(n).map_or(0.0, |(b, n)| b[i % n])))
                .collect();
            outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &v)?;
        }
        Ok(())
    }
}

impl WgslKernel for MsGelu {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let b = inputs.get(1).copied().flatten();
        let n = self.bias_len(x.dims(), b.map(|b| b.dims()))?;
        let mut buffers = vec![("x", "f32", true)];
        let mut bindings = vec![Binding::Input(0)];
        let mut load = "let v = x[i];".to_string();
        if let Some(n) = n {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(1));
            load = format!("let v = x[i] + bias[i % {n}u];");
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        let body = format!("{load}\n    y[i] = {};", self.kind().wgsl_expr("v", "f32"));
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name, outputs[0].len(), wg, &buffers, bindings, self.kind().wgsl_helpers(), &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for (name, tanh, bias) in [("Gelu", false, BiasRule::None), ("FastGelu", true, BiasRule::Optional), ("BiasGelu", false, BiasRule::Required)] {
        r.register(MS_DOMAIN, name, move |_| Ok(Box::new(MsGelu { name, tanh, bias })));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, rand_f32, Case};

    #[test]
    fn gelu_ops_match_onnxruntime() {
        check_ort_cases("Gelu", 1e-5);
        check_ort_cases("FastGelu", 1e-5);
        check_ort_cases("BiasGelu", 1e-5);
    }

    #[test]
    fn many_rows_match_a_reference() {
        // Enough rows that the CPU splits them over several chunks.
        let (x, b) = (rand_f32(&[301, 129], 4), rand_f32(&[129], 5));
        for (op, tanh) in [("FastGelu", true), ("BiasGelu", false)] {
            let y = Case::new(op).domain("com.microsoft").input(x.clone()).input(b.clone()).run_cpu().unwrap().remove(0);
            let (xv, bv) = (x.to_f64_vec(), b.to_f64_vec());
            let want: Vec<f64> = xv
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let v = v + bv[i % 129];
                    if tanh { 0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044715 * v * v * v)).tanh()) } else { 0.5 * v * (1.0 + libm::erf(v / 2f64.sqrt())) }
                })
                .collect();
            crate::testing::assert_close(&y, &want, 1e-5, op);
        }
    }

    #[test]
    fn bias_rules_are_checked() {
        let ms = |op: &str| Case::new(op).domain("com.microsoft").input(rand_f32(&[2, 5], 1));
        let err = ms("BiasGelu").run_cpu().unwrap_err();
        assert!(err.to_string().contains("needs a bias"), "{err}");
        let err = ms("FastGelu").input(rand_f32(&[4], 2)).run_cpu().unwrap_err();
        assert!(err.to_string().contains("last dim 5"), "{err}");
        assert!(ms("Gelu").input(rand_f32(&[5], 2)).run_cpu().is_err());
    }
}
