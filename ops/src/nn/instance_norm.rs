//! InstanceNormalization: each (n, c) plane normalised by its own mean and variance,
//! then `scale[c] * x_hat + B[c]`. On the GPU, one invocation per plane, or a
//! workgroup of lanes per plane for big planes (see [`super::plane_lanes`]).
use super::conv::FLOATS;
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct InstanceNorm {
    epsilon: f32,
}

fn layout(dims: &[usize]) -> Result<(usize, usize)> {
    if dims.len() < 3 {
        return Err(OpError::input(0, format!("expected N x C x D1 .., found shape {dims:?}")));
    }
    Ok((dims[1], dims[2..].iter().product()))
}

/// Normalises one plane in place (f64 statistics).
fn normalize(plane: &[f64], scale: f64, bias: f64, eps: f64, out: &mut [f64]) {
    let n = plane.len().max(1) as f64;
    let mean = plane.iter().sum::<f64>() / n;
    let var = plane.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let a = scale / (var + eps).sqrt();
    for (o, &v) in out.iter_mut().zip(plane) {
        *o = (v - mean) * a + bias;
    }
}

impl Op for InstanceNorm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "InstanceNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        let (c, _) = layout(x.dims())?;
        for (i, what) in [(1, "scale"), (2, "B")] {
            let a = required(inputs, i)?;
            if a.dims() != [c] {
                return Err(OpError::input(i, format!("{what} must be a vector of {c} (the channels), found {}", a.ty)));
            }
        }
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        Cost { flops: 5 * outputs[0].len() as u64, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for InstanceNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        let x = cpu::input(inputs, 0)?;
        let (c, inner) = layout(x.dims())?;
        let (scale, bias) = (cpu::input(inputs, 1)?.to_f64_vec(), cpu::input(inputs, 2)?.to_f64_vec());
        for (i, v) in [(1, &scale), (2, &bias)] {
            if v.len() != c {
                return Err(OpError::input(i, format!("expected {c} values (one per channel), found {}", v.len())));
            }
        }
        let eps = self.epsilon as f64;
        let y = &mut outputs[0];
        if x.dtype() == DType::F32 && inner > 0 {
            let xs = x.as_slice::<f32>()?;
            cpu::par_chunks_mut(y.as_mut_slice::<f32>()?, inner, 4, |first, part| {
                for (i, out) in part.chunks_mut(inner).enumerate() {
                    let plane = first + i;
                    let src = &xs[plane * inner..][..inner];
                    let mean = src.iter().map(|&v| v as f64).sum::<f64>() / inner as f64;
                    let var = src.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / inner as f64;
                    let a = scale[plane % c] / (var + eps).sqrt();
                    let b = bias[plane % c] - mean * a;
                    let (a, b) = (a as f32, b as f32);
                    for (o, &v) in out.iter_mut().zip(src) {
                        *o = v * a + b;
                    }
                }
            });
        } else {
            let xs = x.to_f64_vec();
            let mut out = vec![0.0; xs.len()];
            for (plane, (src, dst)) in xs.chunks(inner.max(1)).zip(out.chunks_mut(inner.max(1))).enumerate() {
                normalize(src, scale[plane % c], bias[plane % c], eps, dst);
            }
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        Ok(())
    }
}

impl WgslKernel for InstanceNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(WgslProgram::default());
        }
        let dims = required(inputs, 0)?.dims();
        let (c, inner) = layout(dims)?;
        let planes = dims[0] * c;
        let n = wgsl::literal("f32", inner.max(1) as f64);
        let eps = wgsl::literal("f32", self.epsilon as f64);
        let buffers = [("x", "f32", true), ("scale", "f32", true), ("bias", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0)];
        // Three passes over the plane: the mean, the variance, the normalised output.
        let lanes = plane_lanes(self.name(), inner, 3, 2)?;
        if lanes == 1 {
            // One invocation per plane.
            let wg = tune.get(&wgsl::workgroup_param());
            let body = format!(
                "let base = i * {inner}u;
    let k = i % {c}u;
    var mean = 0.0;
    for (var j = 0u; j < {inner}u; j++) {{ mean += x[base + j]; }}
    mean = mean / {n};
    var var_acc = 0.0;
    for (var j = 0u; j < {inner}u; j++) {{ let d = x[base + j] - mean; var_acc += d * d; }}
    let a = scale[k] / sqrt(var_acc / {n} + {eps});
    for (var j = 0u; j < {inner}u; j++) {{ y[base + j] = (x[base + j] - mean) * a + bias[k]; }}"
            );
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), planes, wg, &buffers, bindings, "", &body)));
        }
        // A workgroup per plane: strided partial sums combined in workgroup memory.
        let sum = "red[lid.x] + red[lid.x + w]";
        let body = format!(
            "let base = i * {inner}u;
    let k = i % {c}u;
    var t = 0.0;
    {}    {}    let mean = red[0] / {n};
    workgroupBarrier();
    t = 0.0;
    {}    {}    let a = scale[k] / sqrt(red[0] / {n} + {eps});
    {}",
            lane_loop(inner, lanes, "t = t + x[base + j];"),
            tree(lanes, sum),
            lane_loop(inner, lanes, "let d = x[base + j] - mean;\nt = t + d * d;"),
            tree(lanes, sum),
            lane_loop(inner, lanes, "y[base + j] = (x[base + j] - mean) * a + bias[k];"),
        );
        Ok(WgslProgram::single(lanes_dispatch(self.name(), planes, lanes, &buffers, bindings, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "InstanceNormalization", |spec: &NodeSpec| Ok(Box::new(InstanceNorm { epsilon: spec.float("epsilon", 1e-5)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};

    #[test]
    fn instancenorm_matches_reference() {
        // Small planes (one invocation each) and big ones (a workgroup of lanes each).
        for dims in [vec![2usize, 3, 5, 7], vec![1, 2, 50, 61], vec![1, 4, 300, 300]] {
            let c = dims[1];
            let inner: usize = dims[2..].iter().product();
            let x = rand_f32(&dims, 1);
            let (s, b) = (rand_f32(&[c], 2), rand_f32(&[c], 3));
            let y = run(make("InstanceNormalization", 19, &[], 3, 1).unwrap().as_ref(), &as_inputs(&[Some(&x), Some(&s), Some(&b)], &[]), &[]).unwrap().remove(0);
            let mut want = vec![0.0; x.len()];
            let (sv, bv) = (s.to_f64_vec(), b.to_f64_vec());
            for (p, (src, dst)) in x.to_f64_vec().chunks(inner).zip(want.chunks_mut(inner)).enumerate() {
                super::normalize(src, sv[p % c], bv[p % c], 1e-5f32 as f64, dst);
            }
            assert_close(&y, &want, 1e-4, &format!("InstanceNormalization {dims:?}"));
        }
    }

    #[test]
    fn wgsl_uses_lanes_for_big_planes_and_rejects_planes_past_the_loop_budget() {
        use crate::{Arg, TensorType};
        use kiln_graph::DType;
        let generate = |dims: Vec<usize>| {
            let op = make("InstanceNormalization", 19, &[], 3, 1).unwrap();
            let types = [TensorType::new(DType::F32, dims.clone()), TensorType::new(DType::F32, vec![dims[1]]), TensorType::new(DType::F32, vec![dims[1]])];
            let args: Vec<Option<Arg>> = types.iter().map(|ty| Some(Arg { ty, value: None })).collect();
            let outs = op.infer(&args).unwrap();
            op.wgsl().unwrap().generate(&args, &outs, &Default::default())
        };
        for (dims, label) in [(vec![1, 4, 300, 300], "[64 lanes]"), (vec![1, 2, 2000, 2000], "[256 lanes]"), (vec![2, 8, 5, 7], "InstanceNormalization")] {
            let prog = generate(dims).unwrap();
            assert!(prog.dispatches[0].label.ends_with(label), "{}", prog.dispatches[0].label);
            crate::wgsl::testing::validate(&prog.dispatches[0].source);
        }
        let err = generate(vec![1, 1, 4096, 4096]).unwrap_err();
        assert!(matches!(&err, crate::OpError::Unsupported(m) if m.contains("loop budget")), "{err}");
    }
}
