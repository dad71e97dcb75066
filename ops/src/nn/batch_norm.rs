//! BatchNormalization in inference mode:
//! `y = (x - mean) / sqrt(var + epsilon) * scale + B` per channel (dim 1). Training mode (`training_mode=1`, or the running statistics
//! outputs of older opsets) is rejected as unsupported.
use super::conv::FLOATS;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct BatchNorm {
    epsilon: f32,
}

impl BatchNorm {
    fn parse(spec: &NodeSpec) -> Result<BatchNorm> {
        if spec.int("training_mode", 0)? != 0 {
            return Err(OpError::Unsupported("BatchNormalization with training_mode=1 (only inference is supported)".into()));
        }
        if spec.n_outputs() > 1 {
            return Err(OpError::Unsupported(format!(
                "BatchNormalization with {} outputs (the running statistics outputs exist only in training mode)",
                spec.n_outputs()
            )));
        }
        if spec.int("spatial", 1)? != 1 {
            return Err(spec.bad("spatial", "only spatial=1 is supported"));
        }
        Ok(BatchNorm { epsilon: spec.float("epsilon", 1e-5)? })
    }
}

/// Channel count and the number of elements per channel within one batch item.
fn layout(dims: &[usize]) -> Result<(usize, usize)> {
    if dims.len() < 2 {
        return Err(OpError::input(0, format!("expected N x C x .., found shape {dims:?}")));
    }
    Ok((dims[1], dims[2..].iter().product()))
}

impl Op for BatchNorm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "BatchNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        let (c, _) = layout(x.dims())?;
        for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
            let a = required(inputs, i)?;
            if a.dims() != [c] || !a.dtype().is_float() {
                return Err(OpError::input(i, format!("{what} must be a float vector of {c} (the channels), found {}", a.ty)));
            }
        }
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        Cost { flops: 2 * outputs[0].len() as u64, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for BatchNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        let x = cpu::input(inputs, 0)?;
        let (c, inner) = layout(x.dims())?;
        let p: Vec<Vec<f64>> = (1..5).map(|i| cpu::input(inputs, i).map(|t| t.to_f64_vec())).collect::<Result<_>>()?;
        if let Some(i) = p.iter().position(|v| v.len() != c) {
            return Err(OpError::input(i + 1, format!("expected {c} values (one per channel), found {}", p[i].len())));
        }
        // y = x * a + b per channel.
        let a: Vec<f64> = (0..c).map(|k| p[0][k] / (p[3][k] + self.epsilon as f64).sqrt()).collect();
        let b: Vec<f64> = (0..c).map(|k| p[1][k] - p[2][k] * a[k]).collect();
        let y = &mut outputs[0];
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let (a32, b32): (Vec<f32>, Vec<f32>) = a.iter().zip(&b).map(|(&a, &b)| (a as f32, b as f32)).unzip();
            cpu::par_chunks_mut(y.as_mut_slice::<f32>()?, inner.max(1), 2, |first, part| {
                for (i, out) in part.chunks_mut(inner.max(1)).enumerate() {
                    let plane = first + i;
                    let k = plane % c;
                    let src = &xs[plane * inner..][..out.len()];
                    for (o, &v) in out.iter_mut().zip(src) {
                        *o = v * a32[k] + b32[k];
                    }
                }
            });
        } else {
            let xs = x.to_f64_vec();
            let out: Vec<f64> =
                xs.iter().enumerate().map(|(i, &v)| { let k = i / inner.max(1) % c; v * a[k] + b[k] }).collect();
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        Ok(())
    }
}

impl WgslKernel for BatchNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(WgslProgram::default());
        }
        let (c, inner) = layout(required(inputs, 0)?.dims())?;
        let wg = tune.get(&wgsl::workgroup_param());
        let body = format!(
            "let k = (i / {inner}u) % {c}u;\n    let a = scale[k] / sqrt(variance[k] + {eps});\n    y[i] = (x[i] - mean[k]) * a + bias[k];",
            inner = inner.max(1),
            eps = wgsl::literal("f32", self.epsilon as f64)
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "BatchNormalization",
            outputs[0].len(),
            wg,
            &[("x", "f32", true), ("scale", "f32", true), ("bias", "f32", true), ("mean", "f32", true), ("variance", "f32", true), ("y", "f32", false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Input(3), Binding::Input(4), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "BatchNormalization", |spec| Ok(Box::new(BatchNorm::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn batchnorm_matches_reference() {
        for dims in [vec![2, 3, 4, 5], vec![3, 4], vec![1, 5, 7]] {
            let c = dims[1];
            let x = rand_f32(&dims, 1);
            let (s, b, m) = (rand_f32(&[c], 2), rand_f32(&[c], 3), rand_f32(&[c], 4));
            let v = Tensor::from_vec(&[c], rand_f32(&[c], 5).as_slice::<f32>().unwrap().iter().map(|v| v.abs() + 0.1).collect()).unwrap();
            let op = make("BatchNormalization", 19, &[("epsilon", Attr::Float(1e-2))], 5, 1).unwrap();
            let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s), Some(&b), Some(&m), Some(&v)], &[]), &[]).unwrap().remove(0);
            let inner: usize = dims[2..].iter().product();
            let (xv, sv, bv, mv, vv) = (x.to_f64_vec(), s.to_f64_vec(), b.to_f64_vec(), m.to_f64_vec(), v.to_f64_vec());
            let want: Vec<f64> = xv
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    let k = i / inner % c;
                    (x - mv[k]) / (vv[k] + 1e-2f32 as f64).sqrt() * sv[k] + bv[k]
                })
                .collect();
            assert_close(&y, &want, 1e-5, "BatchNormalization");
        }
        assert!(make("BatchNormalization", 19, &[("training_mode", Attr::Int(1))], 5, 1).is_err());
        assert!(make("BatchNormalization", 19, &[], 5, 3).is_err());
    }
}
