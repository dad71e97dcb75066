//! GlobalAveragePool and GlobalMaxPool: one value per (n, c) plane over all spatial
//! dims (N x C x D1.. -> N x C x 1..). On the GPU, one invocation per plane, or a
//! workgroup of lanes per plane for big planes (see [`super::plane_lanes`]).
use super::conv::FLOATS;
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::elementwise::wgsl_max;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct GlobalPool {
    max: bool,
}

fn plane_size(dims: &[usize]) -> Result<usize> {
    if dims.len() < 3 {
        return Err(OpError::input(0, format!("expected N x C x D1 .., found shape {dims:?}")));
    }
    Ok(dims[2..].iter().product())
}

impl Op for GlobalPool {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        if self.max { "GlobalMaxPool" } else { "GlobalAveragePool" }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        plane_size(x.dims())?;
        let mut dims = x.dims().to_vec();
        dims[2..].iter_mut().for_each(|d| *d = 1);
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GlobalPool {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        let x = cpu::input(inputs, 0)?;
        let size = plane_size(x.dims())?;
        let y = &mut outputs[0];
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let max = self.max;
            cpu::par_chunks_mut(y.as_mut_slice::<f32>()?, 1, size, |first, out| {
                for (i, o) in out.iter_mut().enumerate() {
                    let plane = &xs[(first + i) * size..][..size];
                    *o = if max {
                        max_f32(plane)
                    } else {
                        // Eight partial sums: vectorises and keeps rounding error low.
                        let mut acc = [0f32; 8];
                        let chunks = plane.chunks_exact(8);
                        let tail: f32 = chunks.remainder().iter().sum();
                        for c in chunks {
                            for k in 0..8 {
                                acc[k] += c[k];
                            }
                        }
                        (acc.iter().sum::<f32>() + tail) / size as f32
                    };
                }
            });
        } else {
            let xs = x.to_f64_vec();
            let out: Vec<f64> = xs
                .chunks(size.max(1))
                .map(|p| {
                    if self.max { p.iter().copied().fold(f64::NEG_INFINITY, max_nan) } else { p.iter().sum::<f64>() / size as f64 }
                })
                .collect();
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        Ok(())
    }
}

impl WgslKernel for GlobalPool {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(WgslProgram::default());
        }
        let size = plane_size(required(inputs, 0)?.dims())?;
        let planes = outputs[0].len();
        let buffers = [("x", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Output(0)];
        // Max: NaN propagates (WGSL's max need not).
        let (init, fold, combine) = if self.max {
            ("bitcast<f32>(0xff800000u)", format!("t = {};", wgsl_max("t", "x[base + j]")), wgsl_max("red[lid.x]", "red[lid.x + w]"))
        } else {
            ("0.0", "t = t + x[base + j];".to_string(), "red[lid.x] + red[lid.x + w]".to_string())
        };
        let finish = |acc: &str| if self.max { acc.to_string() } else { format!("{acc} / {}", wgsl::literal("f32", size.max(1) as f64)) };
        let lanes = plane_lanes(self.name(), size, 1, 1)?;
        if lanes == 1 {
            // One invocation per plane.
            let wg = tune.get(&wgsl::workgroup_param());
            let body = format!(
                "let base = i * {size}u;\n    var t = {init};\n    for (var j = 0u; j < {size}u; j++) {{ {fold} }}\n    y[i] = {};",
                finish("t")
            );
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), planes, wg, &buffers, bindings, "", &body)));
        }
        let body = format!(
            "let base = i * {size}u;\n    var t = {init};\n    {}    {}    if (lid.x == 0u) {{ y[i] = {}; }}",
            lane_loop(size, lanes, &fold),
            tree(lanes, &combine),
            finish("red[0]")
        );
        Ok(WgslProgram::single(lanes_dispatch(self.name(), planes, lanes, &buffers, bindings, &body)))
    }
}

/// The larger of `a` and `v`, NaN once either is (NaN propagates, as in ReduceMax).
#[inline(always)]
#[allow(clippy::eq_op)]
fn max_nan<T: PartialOrd>(a: T, v: T) -> T {
    if v > a || v != v { v } else { a }
}

/// The maximum of a plane (NaN if any element is), eight lanes at a time.
fn max_f32(plane: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = plane.chunks_exact(8);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, max_nan);
    for c in chunks {
        for k in 0..8 {
            acc[k] = max_nan(acc[k], c[k]);
        }
    }
    acc.into_iter().fold(tail, max_nan)
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GlobalAveragePool", |_: &NodeSpec| Ok(Box::new(GlobalPool { max: false })));
    r.register("", "GlobalMaxPool", |_: &NodeSpec| Ok(Box::new(GlobalPool { max: true })));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};

    #[test]
    fn global_pools_match_reference() {
        // Small planes (one invocation each) and big ones (a workgroup of lanes each).
        for dims in [vec![2, 3, 7, 5], vec![1, 4, 13], vec![1, 2, 3, 4, 5], vec![3, 5, 1, 1], vec![2, 3, 2049], vec![1, 4, 300, 300]] {
            let x = rand_f32(&dims, 11);
            let size: usize = dims[2..].iter().product();
            let xv = x.to_f64_vec();
            for (op, max) in [("GlobalAveragePool", false), ("GlobalMaxPool", true)] {
                let y = run(make(op, 19, &[], 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
                assert_eq!(&y.dims()[..2], &dims[..2]);
                let want: Vec<f64> = xv
                    .chunks(size)
                    .map(|p| if max { p.iter().cloned().fold(f64::MIN, f64::max) } else { p.iter().sum::<f64>() / size as f64 })
                    .collect();
                assert_close(&y, &want, 1e-5, op);
            }
        }
    }

    #[test]
    fn wgsl_uses_lanes_for_big_planes_and_rejects_planes_past_the_loop_budget() {
        use crate::{Arg, TensorType};
        use kiln_graph::DType;
        for (dims, label) in [(vec![1, 4, 300, 300], "[64 lanes]"), (vec![1, 2, 16_000_000], "[256 lanes]"), (vec![8, 512, 7, 7], "GlobalAveragePool")] {
            let op = make("GlobalAveragePool", 19, &[], 1, 1).unwrap();
            let ty = TensorType::new(DType::F32, dims);
            let args = [Some(Arg { ty: &ty, value: None })];
            let outs = op.infer(&args).unwrap();
            let prog = op.wgsl().unwrap().generate(&args, &outs, &Default::default()).unwrap();
            assert!(prog.dispatches[0].label.ends_with(label), "{}", prog.dispatches[0].label);
            crate::wgsl::testing::validate(&prog.dispatches[0].source);
        }
        for op in ["GlobalAveragePool", "GlobalMaxPool"] {
            let op = make(op, 19, &[], 1, 1).unwrap();
            let ty = TensorType::new(DType::F32, vec![1, 1, 4096, 4096]);
            let args = [Some(Arg { ty: &ty, value: None })];
            let outs = op.infer(&args).unwrap();
            let err = op.wgsl().unwrap().generate(&args, &outs, &Default::default()).unwrap_err();
            assert!(matches!(&err, crate::OpError::Unsupported(m) if m.contains("loop budget")), "{err}");
        }
    }
}
