//! RMSNormalization (opset 23): each row `X[.., axis..]` divided by its root mean
//! square `sqrt(mean(x^2) + epsilon)`, then multiplied by `scale` (broadcast to the
//! row). WGSL: one invocation per row, or a workgroup of lanes per long row
//! ([`super::plane_lanes`]). onnxruntime's SimplifiedLayerNormalization (domains `""`
//! and `com.microsoft`) is the same op with an optional second output: the inverse
//! root mean square of each row (X's dims with 1 from `axis` on).
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::broadcast::{broadcast_strides, for_each_offset};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct RmsNorm {
    axis: i64,
    epsilon: f32,
    /// "RMSNormalization", or "SimplifiedLayerNormalization" (with output 1).
    name: &'static str,
}

impl RmsNorm {
    /// (rows, row length, row dims).
    fn split(&self, x: &[usize]) -> Result<(usize, usize, Vec<usize>)> {
        let axis = norm_axis(self.axis, x.len())?;
        Ok((x[..axis].iter().product(), x[axis..].iter().product(), x[axis..].to_vec()))
    }

    /// Offsets of `scale` (dims `p`) for each element of a row of dims `row`.
    fn scale_strides(p: &[usize], row: &[usize]) -> Result<Vec<usize>> {
        if p.len() > row.len() || p.iter().rev().zip(row.iter().rev()).any(|(&a, &b)| a != 1 && a != b) {
            return Err(OpError::input(1, format!("scale shape {p:?} does not broadcast to the normalised shape {row:?}")));
        }
        Ok(broadcast_strides(p, row))
    }
}

impl Op for RmsNorm {
    fn name(&self) -> &str {
        self.name
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        let (_, _, row) = self.split(x.dims())?;
        let s = required(inputs, 1)?;
        Self::scale_strides(s.dims(), &row)?;
        if s.dtype() != dtype {
            return Err(OpError::input(1, format!("scale dtype {} differs from X's {dtype}", s.dtype())));
        }
        let mut types = vec![TensorType::new(dtype, x.dims())];
        if self.name != "RMSNormalization" {
            let axis = x.rank() - row.len();
            types.push(TensorType::new(DType::F32, x.dims().iter().enumerate().map(|(d, &n)| if d < axis { n } else { 1 }).collect::<Vec<_>>()));
        }
        Ok(types)
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 4 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for RmsNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (rows, n, row) = self.split(x.dims())?;
        let s = cpu::input(inputs, 1)?;
        let st = Self::scale_strides(s.dims(), &row)?;
        let sv = s.to_f64_vec();
        let mut scale = Vec::with_capacity(n);
        for_each_offset(&row, &[st], |_, o| scale.push(sv[o[0]]));
        let eps = self.epsilon as f64;
        if n == 0 || rows == 0 {
            return Ok(());
        }
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let sc: Vec<f32> = scale.iter().map(|&v| v as f32).collect();
            cpu::par_chunks_mut(outputs[0].as_mut_slice::<f32>()?, n, n, |first, part| {
                for (r, yr) in part.chunks_mut(n).enumerate() {
                    let xr = &xs[(first + r) * n..][..n];
                    let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
                    let inv = (1.0 / (ms + eps).sqrt()) as f32;
                    for ((y, &v), &w) in yr.iter_mut().zip(xr).zip(&sc) {
                        *y = v * inv * w;
                    }
                }
            });
        } else {
            let mut y = x.to_f64_vec();
            for yr in y.chunks_mut(n) {
                let inv = 1.0 / (yr.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
                yr.iter_mut().zip(&scale).for_each(|(v, w)| *v *= inv * w);
            }
            outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        }
        if let Some(o) = outputs.get_mut(1) {
            // The inverse root mean squares (SimplifiedLayerNormalization's output 1).
            let xs = x.to_f64_vec();
            let invs: Vec<f32> = xs.chunks(n).map(|r| (1.0 / (r.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt()) as f32).collect();
            o.as_mut_slice::<f32>()?.copy_from_slice(&invs);
        }
        Ok(())
    }
}

impl WgslKernel for RmsNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (rows, n, row) = self.split(x.dims())?;
        if rows * n == 0 {
            return Ok(WgslProgram::default());
        }
        let helpers = wgsl::offset_fn("scale_at", &row, &Self::scale_strides(required(inputs, 1)?.dims(), &row)?);
        let mut buffers = vec![("x", "f32", true), ("scale", "f32", true), ("y", "f32", false)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)];
        let inv_out = outputs.get(1).is_some_and(|t| !t.is_empty());
        if inv_out {
            buffers.push(("inv_out", "f32", false));
            bindings.push(Binding::Output(1));
        }
        let eps = wgsl::literal("f32", self.epsilon as f64);
        let nl = wgsl::literal("f32", n as f64);
        let write = "y[base + j] = x[base + j] * inv * scale[scale_at(j)];";
        let lanes = plane_lanes(self.name(), n, 2, 1)?;
        if lanes == 1 {
            let nu = format!("{n}u");
            let store = if inv_out { "inv_out[i] = inv;\n    " } else { "" };
            let body = format!(
                "let base = i * {n}u;\n    var t = 0.0;\n    {}    let inv = 1.0 / sqrt(t / {nl} + {eps});\n    {store}{}",
                wgsl::for_loop("j", "0u", &nu, "1u", "let v = x[base + j];\nt = t + v * v;"),
                wgsl::for_loop("j", "0u", &nu, "1u", write)
            );
            let wg = tune.get(&wgsl::workgroup_param());
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), rows, wg, &buffers, bindings, &helpers, &body)));
        }
        let body = format!(
            "let base = i * {n}u;\n    var t = 0.0;\n    {}    {}    let inv = 1.0 / sqrt(red[0] / {nl} + {eps});\n    {}{}",
            lane_loop(n, lanes, "let v = x[base + j];\nt = t + v * v;"),
            tree(lanes, "red[lid.x] + red[lid.x + w]"),
            if inv_out { "if (lid.x == 0u) { inv_out[i] = inv; }\n    " } else { "" },
            lane_loop(n, lanes, write)
        );
        let mut d = lanes_dispatch(self.name(), rows, lanes, &buffers, bindings, &body);
        d.source = format!("{helpers}\n{}", d.source);
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for (domain, name) in [("", "RMSNormalization"), ("", "SimplifiedLayerNormalization"), (MS_DOMAIN, "SimplifiedLayerNormalization")] {
        r.register(domain, name, move |spec: &NodeSpec| {
            if spec.int("stash_type", 1)? != 1 {
                return Err(spec.bad("stash_type", "only stash_type=1 (f32 statistics) is supported"));
            }
            Ok(Box::new(RmsNorm { axis: spec.int("axis", -1)?, epsilon: spec.float("epsilon", 1e-5)?, name }))
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::Attr;

    #[test]
    fn simplified_layer_norm_matches_onnxruntime() {
        crate::testing::check_ort_cases("SimplifiedLayerNormalization", 1e-5);
    }

    #[test]
    fn rms_norm_matches_a_reference() {
        for (dims, axis, sdims) in [(vec![3usize, 5, 7], -1i64, vec![7usize]), (vec![2, 3, 5], 1, vec![1, 5]), (vec![2, 3], 0, vec![2, 3]), (vec![2, 3000], -1, vec![3000])] {
            let x = rand_f32(&dims, 1);
            let s = rand_f32(&sdims, 2);
            let op = make("RMSNormalization", 19, &[("axis", Attr::Int(axis)), ("epsilon", Attr::Float(0.01))], 2, 1).unwrap();
            let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s)], &[]), &[]).unwrap().remove(0);
            let a = if axis < 0 { dims.len() as i64 + axis } else { axis } as usize;
            let n: usize = dims[a..].iter().product();
            let (xv, sv) = (x.to_f64_vec(), s.to_f64_vec());
            let mut want = vec![];
            for r in xv.chunks(n) {
                let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / n as f64 + 0.01f32 as f64).sqrt();
                // The scale broadcasts along the row: its flat index is the element's index
                // modulo the scale's size (scale dims are a suffix, possibly with leading 1s).
                want.extend(r.iter().enumerate().map(|(k, v)| v * inv * sv[k % sv.len()]));
            }
            assert_close(&y, &want, 1e-5, &format!("RMSNormalization {dims:?} axis {axis}"));
        }
        let op = make("RMSNormalization", 19, &[], 2, 1).unwrap();
        let err = run(op.as_ref(), &as_inputs(&[Some(&rand_f32(&[2, 3], 1)), Some(&rand_f32(&[2], 2))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("does not broadcast"), "{err}");
        assert!(make("RMSNormalization", 19, &[("stash_type", Attr::Int(0))], 2, 1).is_err());
    }
}
