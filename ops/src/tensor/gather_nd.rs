//! GatherND: each index tuple `indices[..., :]` (length `q`) picks the slice
//! `data[batch..., t0, .., tq-1, ...]`; the first `batch_dims` dims of data and indices
//! are batch dims that pair up. Output shape: `indices.shape[..-1] ++ data.shape[b+q..]`.
//! Negative indices count from the end. Out-of-range indices are an error on the CPU
//! and, when the indices are a constant, at specialisation; the GPU kernel reports a
//! run-time one through the run's status word (the run fails naming the node).
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;
use std::fmt::Write;

#[derive(Debug)]
pub struct GatherNd {
    batch_dims: usize,
}

/// Shape facts of one GatherND application.
struct Plan {
    out_dims: Vec<usize>,
    /// Number of batches, index tuples per batch, tuple length, slice size.
    batches: usize,
    tuples: usize,
    q: usize,
    slice: usize,
}

impl GatherNd {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<Plan> {
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        if !idx.dtype().is_int() {
            return Err(OpError::input(1, format!("indices must be integers, found {}", idx.dtype())));
        }
        let (d, i, b) = (data.dims(), idx.dims(), self.batch_dims);
        let q = *i.last().ok_or_else(|| OpError::input(1, "indices must have rank >= 1"))?;
        if b >= i.len() || b >= d.len() || d[..b] != i[..b] {
            return Err(OpError::invalid(format!("batch_dims {b} must be below both ranks and the leading dims must agree (data {d:?}, indices {i:?})")));
        }
        if b + q > d.len() {
            return Err(OpError::input(1, format!("index tuples of length {q} do not fit data {d:?} after {b} batch dims")));
        }
        let mut out_dims = i[..i.len() - 1].to_vec();
        out_dims.extend_from_slice(&d[b + q..]);
        Ok(Plan {
            out_dims,
            batches: d[..b].iter().product(),
            tuples: i[b..i.len() - 1].iter().product(),
            q,
            slice: d[b + q..].iter().product(),
        })
    }

    /// Source offset (in data elements) of the slice of every tuple, validating indices.
    fn offsets(&self, d: &[usize], idx: &[i64], p: &Plan) -> Result<Vec<usize>> {
        let ds = strides(d);
        let b = self.batch_dims;
        let batch_len: usize = d[b..].iter().product();
        let mut out = Vec::with_capacity(p.batches * p.tuples);
        for t in 0..p.batches * p.tuples {
            let mut off = (t / p.tuples.max(1)) * batch_len;
            for k in 0..p.q {
                let n = d[b + k];
                let raw = idx[t * p.q + k];
                let j = if raw < 0 { raw + n as i64 } else { raw };
                if !(0..n as i64).contains(&j) {
                    return Err(OpError::input(1, format!("index {raw} is out of range for dim {} of data {d:?} (size {n})", b + k)));
                }
                off += j as usize * ds[b + k];
            }
            out.push(off);
        }
        Ok(out)
    }
}

impl Op for GatherNd {
    fn name(&self) -> &str {
        "GatherND"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let p = self.plan(inputs)?;
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        if let Some(v) = idx.value {
            self.offsets(data.dims(), &v.to_i64_vec()?, &p)?;
        }
        Ok(vec![TensorType::new(data.dtype(), p.out_dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GatherNd {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let (data, idx) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let offs = self.offsets(data.dims(), &idx.to_i64_vec()?, &p)?;
        let row = p.slice * data.dtype().size();
        let src = data.bytes();
        if row == 0 {
            return Ok(());
        }
        for (out, &o) in outputs[0].bytes_mut().chunks_mut(row).zip(&offs) {
            let s = o * data.dtype().size();
            out.copy_from_slice(&src[s..s + row]);
        }
        Ok(())
    }
}

impl WgslKernel for GatherNd {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.plan(inputs)?;
        let data = required(inputs, 0)?;
        let d = data.dims();
        let ds = strides(d);
        let b = self.batch_dims;
        let batch_len: usize = d[b..].iter().product();
        let (slice, tuples) = (p.slice.max(1), p.tuples.max(1));
        let mut body = format!(
            "let s = i % {slice}u;\n    let t = i / {slice}u;\n    var off = (t / {tuples}u) * {batch_len}u + s;\n"
        );
        for k in 0..p.q {
            let n = d[b + k];
            let _ = writeln!(
                body,
                "    var j{k} = idx[t * {q}u + {k}u];\n    if (j{k} < 0i) {{ j{k} = j{k} + {n}i; }}\n    \
                 if (j{k} < 0i || j{k} >= {n}i) {{ {} dst[i] = {}; return; }}\n    \
                 off = off + u32(j{k}) * {}u;",
                wgsl::report_index_error(&format!("idx[t * {}u + {k}u]", p.q), &format!("{n}i")),
                wgsl::literal(wgsl::elem(data.dtype()), 0.0),
                ds[b + k],
                q = p.q
            );
        }
        body += "    dst[i] = src[off];";
        let ty = wgsl::elem(data.dtype());
        let buffers = [("src", ty, true), ("idx", "i32", true), ("dst", ty, false)];
        let bnd = vec![Binding::Input(0), Binding::Input(1), Binding::Output(0), Binding::Status];
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("GatherND", outputs[0].len(), wg, &buffers, bnd, &wgsl::status_decl(3), &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GatherND", |spec| {
        let b = spec.int("batch_dims", 0)?;
        if b < 0 {
            return Err(spec.bad("batch_dims", format!("must be >= 0, found {b}")));
        }
        Ok(Box::new(GatherNd { batch_dims: b as usize }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    #[test]
    fn gather_nd_examples_and_batches() {
        let op = make("GatherND", 13, &[], 2, 1).unwrap();
        let data = iota_f32(&[2, 2]);
        // element tuples, row tuples
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[2, 2], &[0, 0, 1, 1]))], &[]), &[]).unwrap()[0], f32s(&[2], &[0.0, 3.0]));
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[2, 1], &[1, -2]))], &[]), &[]).unwrap()[0], f32s(&[2, 2], &[2.0, 3.0, 0.0, 1.0]));
        // batch_dims = 1: data [2, 3, 2], indices [2, 2, 1] -> out [2, 2, 2]
        let data = iota_i64(&[2, 3, 2]);
        let bop = make("GatherND", 13, &[("batch_dims", Attr::Int(1))], 2, 1).unwrap();
        let got = run(bop.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[2, 2, 1], &[2, 0, -1, 1]))], &[1]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[2, 2, 2], &[4, 5, 0, 1, 10, 11, 8, 9]));
        let got = run(bop.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[2, 2], &[2, 1, 0, 0]))], &[]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[2], &[5, 6]));
        for consts in [vec![1usize], vec![]] {
            let e = run(op.as_ref(), &as_inputs(&[Some(&iota_f32(&[2, 2])), Some(&i64s(&[1, 2], &[0, 2]))], &consts), &[]).unwrap_err().to_string();
            assert!(e.contains("index 2 is out of range") && e.contains("size 2"), "{e}");
        }
        assert!(run(op.as_ref(), &as_inputs(&[Some(&iota_f32(&[2, 2])), Some(&i64s(&[1, 3], &[0, 0, 0]))], &[]), &[]).is_err());
        assert!(run(bop.as_ref(), &as_inputs(&[Some(&iota_f32(&[2, 2])), Some(&i64s(&[3, 1], &[0, 0, 0]))], &[]), &[]).is_err());
    }
}
