//! LayerNormalization (opset 17): normalises each row `X[.., axis..]` to zero mean and
//! unit variance, then scales and shifts by `Scale` and `B` (broadcast to the row).
//! Optional outputs: the row means and inverse standard deviations.
use crate::broadcast::broadcast_strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

#[derive(Debug)]
pub struct LayerNorm {
    axis: i64,
    epsilon: f32,
}

impl LayerNorm {
    /// (rows, row length, row dims) of an input of dims `x`.
    fn split(&self, x: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
        let axis = norm_axis(self.axis, x.len())?;
        Ok((x[..axis].iter().product(), x[axis..].iter().product(), x[axis..].to_vec()))
    }

    /// Offsets of a parameter of dims `p` for each element of a row of dims `row`.
    fn param_strides(&self, p: &[usize], row: &[usize], which: usize) -> Result<Vec<usize>> {
        if p.len() > row.len() || p.iter().rev().zip(row.iter().rev()).any(|(&a, &b)| a != 1 && a != b) {
            return Err(OpError::input(which, format!("shape {p:?} does not broadcast to the normalised shape {row:?}")));
        }
        Ok(broadcast_strides(p, row))
    }
}

impl Op for LayerNorm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "LayerNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        let (_, _, row) = self.split(x.dims())?;
        for i in [1, 2] {
            if let Some(p) = inputs.get(i).copied().flatten() {
                self.param_strides(p.dims(), &row, i)?;
                if p.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from X's {dtype}", p.dtype())));
                }
            } else if i == 1 {
                return Err(OpError::input(1, "Scale is required"));
            }
        }
        let axis = x.rank() - row.len();
        let stat: Vec<usize> = x.dims().iter().enumerate().map(|(d, &n)| if d < axis { n } else { 1 }).collect();
        Ok(vec![TensorType::new(dtype, x.dims()), TensorType::new(DType::F32, stat.clone()), TensorType::new(DType::F32, stat)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// The f64 sum of `f(v)` over a row, in eight interleaved partial sums (a dependency
/// chain of one add per element would leave the vector units idle).
#[inline(always)]
fn lanes_sum(xr: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = xr.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// A row's mean and `1 / sqrt(variance + eps)`, in f64.
#[inline(always)]
fn row_stats(xr: &[f32], eps: f64) -> (f64, f64) {
    let n = xr.len().max(1) as f64;
    let mean = lanes_sum(xr, |v| v as f64) / n;
    let var = lanes_sum(xr, |v| (v as f64 - mean) * (v as f64 - mean)) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Normalizes the rows of `part` (rows `first..` of x, each `sc.len()` values).
#[inline(always)]
fn normalize_rows(xs: &[f32], first: usize, part: &mut [f32], sc: &[f32], bs: &[f32], eps: f64) {
    let n = sc.len();
    for (r, yr) in part.chunks_mut(n.max(1)).enumerate() {
        let xr = &xs[(first + r) * n..][..n];
        let (mean, inv) = row_stats(xr, eps);
        let (m, s) = (mean as f32, inv as f32);
        for (((y, &x), &c), &b) in yr.iter_mut().zip(xr).zip(sc).zip(bs) {
            *y = (x - m) * s * c + b;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn normalize_rows_avx2(xs: &[f32], first: usize, part: &mut [f32], sc: &[f32], bs: &[f32], eps: f64) {
    normalize_rows(xs, first, part, sc, bs, eps)
}

impl CpuKernel for LayerNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (rows, n, row) = self.split(x.dims())?;
        // Scale and bias expanded to one row (they are small: the normalised shape).
        let expand = |i: usize| -> Result<Option<Vec<f64>>> {
            let Some(p) = inputs.get(i).copied().flatten() else { return Ok(None) };
            let st = self.param_strides(p.dims(), &row, i)?;
            let v = p.to_f64_vec();
            let mut out = Vec::with_capacity(n);
            crate::broadcast::for_each_offset(&row, &[st], |_, o| out.push(v[o[0]]));
            Ok(Some(out))
        };
        let scale = expand(1)?.unwrap_or_else(|| vec![1.0; n]);
        let bias = expand(2)?;
        let eps = self.epsilon as f64;
        let mut means = vec![0f32; rows];
        let mut invs = vec![0f32; rows];
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let (sc, bs): (Vec<f32>, Vec<f32>) = (scale.iter().map(|&v| v as f32).collect(), bias.as_ref().map(|b| b.iter().map(|&v| v as f32).collect()).unwrap_or_else(|| vec![0.0; n]));
            let y = outputs[0].as_mut_slice::<f32>()?;
            cpu::par_chunks_mut(y, n.max(1), n, |first, part| {
                #[cfg(target_arch = "x86_64")]
                if cpu::has_avx2() {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { normalize_rows_avx2(xs, first, part, &sc, &bs, eps) };
                }
                normalize_rows(xs, first, part, &sc, &bs, eps)
            });
            // The statistics outputs, when the node has them.
            for r in (0..rows).filter(|_| outputs.len() > 1) {
                let (mean, inv) = row_stats(&xs[r * n..][..n], eps);
                means[r] = mean as f32;
                invs[r] = inv as f32;
            }
        } else {
            let xs = x.to_f64_vec();
            let mut y = vec![0f64; xs.len()];
            for r in 0..rows {
                let xr = &xs[r * n..][..n];
                let mean = xr.iter().sum::<f64>() / n.max(1) as f64;
                let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n.max(1) as f64;
                let inv = 1.0 / (var + eps).sqrt();
                for k in 0..n {
                    y[r * n + k] = (xr[k] - mean) * inv * scale[k] + bias.as_ref().map_or(0.0, |b| b[k]);
                }
                means[r] = mean as f32;
                invs[r] = inv as f32;
            }
            outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        }
        if outputs.len() > 1 {
            outputs[1].as_mut_slice::<f32>()?.copy_from_slice(&means);
        }
        if outputs.len() > 2 {
            outputs[2].as_mut_slice::<f32>()?.copy_from_slice(&invs);
        }
        Ok(())
    }
}

impl WgslKernel for LayerNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (rows, n, row) = self.split(x.dims())?;
        // Three passes over a row per invocation must fit the driver's loop budget.
        if wgsl::lanes_for(3 * n) != Some(1) {
            return Err(OpError::Unsupported(format!("LayerNormalization rows of {n} elements exceed the GPU loop budget")));
        }
        let wg = tune.get(&wgsl::workgroup_param());
        let mut buffers = vec![("x", "f32", true), ("scale", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        let mut helpers = wgsl::offset_fn("scale_at", &row, &self.param_strides(required(inputs, 1)?.dims(), &row, 1)?);
        let has_bias = inputs.get(2).copied().flatten().is_some();
        if let Some(b) = inputs.get(2).copied().flatten() {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(2));
            helpers += &wgsl::offset_fn("bias_at", &row, &self.param_strides(b.dims(), &row, 2)?);
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        for k in 1..outputs.len() {
            buffers.push(if k == 1 { ("mean_out", "f32", false) } else { ("inv_out", "f32", false) });
            bindings.push(Binding::Output(k));
        }
        let eps = wgsl::literal("f32", self.epsilon as f64);
        let nl = wgsl::literal("f32", n as f64);
        let mut body = format!("let base = i * {n}u;\n    var mean = 0.0;\n");
        body += &wgsl::for_loop("k", "0u", &format!("{n}u"), "1u", "mean = mean + x[base + k];");
        let _ = write!(body, "    mean = mean / {nl};\n    var v = 0.0;\n");
        body += &wgsl::for_loop("k", "0u", &format!("{n}u"), "1u", "let d = x[base + k] - mean;\nv = v + d * d;");
        let _ = writeln!(body, "    let inv = 1.0 / sqrt(v / {nl} + {eps});");
        let b = if has_bias { "bias[bias_at(k)]" } else { "0.0" };
        body += &wgsl::for_loop("k", "0u", &format!("{n}u"), "1u", &format!("y[base + k] = (x[base + k] - mean) * inv * scale[scale_at(k)] + {b};"));
        if outputs.len() > 1 {
            body += "    mean_out[i] = mean;\n";
        }
        if outputs.len() > 2 {
            body += "    inv_out[i] = inv;\n";
        }
        Ok(WgslProgram::single(wgsl::simple_kernel("LayerNormalization", rows, wg, &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "LayerNormalization", |spec: &NodeSpec| {
        if spec.int("stash_type", 1)? != 1 {
            return Err(spec.bad("stash_type", "only stash_type=1 (f32 statistics) is supported"));
        }
        Ok(Box::new(LayerNorm { axis: spec.int("axis", -1)?, epsilon: spec.float("epsilon", 1e-5)? }))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::Node;

    fn op(axis: i64) -> Box<dyn Op> {
        let node = Node {
            name: "ln".into(),
            op_type: "LayerNormalization".into(),
            domain: String::new(),
            attrs: [("axis".to_string(), kiln_graph::Attr::Int(axis))].into_iter().collect(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3, 4, 5],
        };
        Registry::builtin().create(&NodeSpec::new(&node, 17)).unwrap()
    }

    #[test]
    fn matches_a_reference_and_wgsl_validates() {
        let x: Vec<f32> = (0..3 * 5 * 7).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3).collect();
        let xt = Tensor::from_slice(&[3, 5, 7], &x).unwrap();
        let scale = Tensor::from_slice(&[7], &[1.0f32, 0.5, 2.0, -1.0, 0.3, 1.5, 0.9]).unwrap();
        let bias = Tensor::from_slice(&[1], &[0.25f32]).unwrap();
        let ln = op(-1);
        let tys = [TensorType::new(DType::F32, vec![3, 5, 7]), TensorType::new(DType::F32, vec![7]), TensorType::new(DType::F32, vec![1])];
        let args: Vec<Option<Arg>> = tys.iter().map(|t| Some(Arg { ty: t, value: None })).collect();
        let out_ty = ln.infer(&args).unwrap();
        assert_eq!(out_ty[1].dims, vec![3, 5, 1]);
        let mut outs: Vec<Tensor> = out_ty.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
        ln.cpu().unwrap().run(&[Some(&xt), Some(&scale), Some(&bias)], &mut outs).unwrap();
        let y = outs[0].as_slice::<f32>().unwrap();
        let s = scale.as_slice::<f32>().unwrap();
        for r in 0..15 {
            let row = &x[r * 7..][..7];
            let m = row.iter().map(|&v| v as f64).sum::<f64>() / 7.0;
            let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / 7.0;
            for k in 0..7 {
                let want = (row[k] as f64 - m) / (var + 1e-5).sqrt() * s[k] as f64 + 0.25;
                assert!((y[r * 7 + k] as f64 - want).abs() < 1e-5, "row {r} col {k}");
            }
            assert!((outs[1].as_slice::<f32>().unwrap()[r] as f64 - m).abs() < 1e-5);
        }
        let prog = ln.wgsl().unwrap().generate(&args, &out_ty, &TuneValues::default()).unwrap();
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        // Scale that does not broadcast to the normalised shape is an error.
        let bad = TensorType::new(DType::F32, vec![5]);
        assert!(ln.infer(&[args[0], Some(Arg { ty: &bad, value: None }), None]).is_err());
    }
}
