//! ScatterND: a copy of `data` where each index tuple `indices[m, :]` (of length
//! `q <= rank(data)`) selects a slice `data[t0, .., tq-1, ...]` that receives
//! `updates[m, ...]` (reductions none/add/mul/max/min). Updates apply in order of `m`,
//! so with duplicate tuples and `reduction=none` the last wins (on CPU and GPU).
//!
//! Out-of-range indices (after adding the dim to negative ones) are an error on the
//! CPU and, for constant indices, at specialisation; the GPU kernel reports a run-time
//! one through the run's status word (the run fails naming the node).
//!
//! GPU: one invocation per output element scans all index tuples (at most
//! [`wgsl::MAX_LOOP_ITERATIONS`] of them) in order.
use super::scatter_elements::{apply_updates, norm_index, Reduction};
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;
use std::fmt::Write;

#[derive(Debug)]
pub struct ScatterNd {
    reduction: Reduction,
}

/// (number of tuples M, tuple length q, slice size S).
fn plan(inputs: &[Option<Arg>]) -> Result<(usize, usize, usize)> {
    let (data, idx, upd) = (required(inputs, 0)?, required(inputs, 1)?, required(inputs, 2)?);
    if !idx.dtype().is_int() {
        return Err(OpError::input(1, format!("indices must be integers, found {}", idx.dtype())));
    }
    if upd.dtype() != data.dtype() {
        return Err(OpError::input(2, format!("updates ({}) must have the dtype of data ({})", upd.dtype(), data.dtype())));
    }
    let (d, i) = (data.dims(), idx.dims());
    let q = *i.last().ok_or_else(|| OpError::input(1, "indices must have rank >= 1"))?;
    if q > d.len() || d.is_empty() {
        return Err(OpError::input(1, format!("index tuples of length {q} do not fit data of shape {d:?}")));
    }
    let mut want = i[..i.len() - 1].to_vec();
    want.extend_from_slice(&d[q..]);
    if upd.dims() != want.as_slice() {
        return Err(OpError::input(
            2,
            format!("updates must have shape {want:?} (indices {i:?} without the last dim, then data {d:?} from dim {q}), found {:?}", upd.dims()),
        ));
    }
    Ok((i[..i.len() - 1].iter().product(), q, d[q..].iter().product()))
}

/// Flat output offset of every update element, in order (validating the tuples).
fn targets(data: &[usize], idx: &[i64], (m, q, s): (usize, usize, usize)) -> Result<Vec<usize>> {
    let ds = strides(data);
    let mut out = Vec::with_capacity(m * s);
    for t in 0..m {
        let mut base = 0;
        for k in 0..q {
            base += norm_index(idx[t * q + k], data[k], &format!("dim {k} of data {data:?}"))? * ds[k];
        }
        out.extend(base..base + s);
    }
    Ok(out)
}

impl Op for ScatterNd {
    fn name(&self) -> &str {
        "ScatterND"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let p = plan(inputs)?;
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        if let Some(v) = idx.value {
            targets(data.dims(), &v.to_i64_vec()?, p)?;
        }
        Ok(vec![data.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ScatterNd {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = super::common::tensor_args(inputs, plan)?;
        let (data, idx, upd) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, cpu::input(inputs, 2)?);
        let t = targets(data.dims(), &idx.to_i64_vec()?, p)?;
        apply_updates(data, upd, &t, self.reduction, &mut outputs[0])
    }
}

impl WgslKernel for ScatterNd {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (m, q, s) = plan(inputs)?;
        if m > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "ScatterND with {m} index tuples: the GPU kernel scans them in one invocation, at most {}; \
                 run this model on the CPU",
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let data = required(inputs, 0)?;
        let d = data.dims();
        let ty = wgsl::elem(data.dtype());
        let s = s.max(1);
        let mut body = format!("let s = i % {s}u;\n    var r = i / {s}u;\n");
        for k in (0..q).rev() {
            let _ = writeln!(body, "    let c{k} = i32(r % {}u);\n    r = r / {}u;", d[k].max(1), d[k].max(1));
        }
        let mut matches = vec!["true".to_string()];
        let mut loads = String::new();
        for (k, &dk) in d.iter().enumerate().take(q) {
            let _ = writeln!(
                loads,
                "        var t{k} = idx[k * {q}u + {k}u];\n        if (t{k} < 0i) {{ t{k} = t{k} + {dk}i; }}\n        \
                 if (t{k} < 0i || t{k} >= {dk}i) {{ {} }}",
                wgsl::report_index_error(&format!("idx[k * {q}u + {k}u]"), &format!("{dk}i"))
            );
            matches.push(format!("t{k} == c{k}"));
        }
        let _ = write!(
            body,
            "    var acc = data[i];\n    for (var k = 0u; k < {m}u; k = k + 1u) {{\n{loads}        \
             if ({}) {{\n            let u = upd[k * {s}u + s];\n            acc = {};\n        }}\n    }}\n    out[i] = acc;",
            matches.join(" && "),
            self.reduction.wgsl()
        );
        let buffers = [("data", ty, true), ("idx", "i32", true), ("upd", ty, true), ("out", ty, false)];
        let b = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0), Binding::Status];
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("ScatterND", outputs[0].len(), wg, &buffers, b, &wgsl::status_decl(4), &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ScatterND", |spec| Ok(Box::new(ScatterNd { reduction: Reduction::parse(spec)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::{Attr, DType};

    #[test]
    fn scatter_nd_matches_reference() {
        let d = [4usize, 3, 2];
        let data = iota_f32(&d);
        // q = 1 (whole rows), q = 2 (pairs), q = 3 (elements), with duplicates and negatives
        for (idx_dims, idx) in [(vec![3usize, 1], vec![1i64, -1, 1]), (vec![2, 2, 2], vec![0, 2, -4, -1, 3, 0, 0, 2]), (vec![2, 3], vec![3, 2, 1, -4, 0, -2])] {
            let q = idx_dims[idx_dims.len() - 1];
            let m: usize = idx_dims[..idx_dims.len() - 1].iter().product();
            let s: usize = d[q..].iter().product();
            let mut ud = idx_dims[..idx_dims.len() - 1].to_vec();
            ud.extend_from_slice(&d[q..]);
            let upd = Tensor::from_f64(DType::F32, &ud, &(0..m * s).map(|v| v as f64 - 2.5).collect::<Vec<_>>()).unwrap();
            let it = Tensor::from_slice(&idx_dims, &idx).unwrap();
            for (name, red) in [("none", Reduction::None), ("add", Reduction::Add), ("mul", Reduction::Mul), ("max", Reduction::Max), ("min", Reduction::Min)] {
                let mut want = data.to_f64_vec();
                let uv = upd.to_f64_vec();
                for t in 0..m {
                    let mut base = 0usize;
                    let st = strides(&d);
                    for k in 0..q {
                        let v = idx[t * q + k];
                        base += (if v < 0 { v + d[k] as i64 } else { v }) as usize * st[k];
                    }
                    for e in 0..s {
                        want[base + e] = red.apply_f(want[base + e], uv[t * s + e]);
                    }
                }
                let op = make("ScatterND", 18, &[("reduction", Attr::String(name.into()))], 3, 1).unwrap();
                let got = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&it), Some(&upd)], &[]), &[]).unwrap();
                assert_eq!(got[0].to_f64_vec(), want, "{idx_dims:?} {name}");
            }
        }
    }

    #[test]
    fn scatter_nd_rejects_bad_input() {
        let op = make("ScatterND", 11, &[], 3, 1).unwrap();
        let data = iota_f32(&[2, 3]);
        let idx = i64s(&[1, 2], &[1, 3]);
        let upd = f32s(&[1], &[5.0]);
        for consts in [vec![1usize], vec![]] {
            let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&idx), Some(&upd)], &consts), &[]).unwrap_err().to_string();
            assert!(e.contains("index 3 is out of range") && e.contains("size 3"), "{e}");
        }
        let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[1, 1], &[0])), Some(&upd)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("updates must have shape [1, 3]"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[1, 3], &[0, 0, 0])), Some(&upd)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
    }
}
