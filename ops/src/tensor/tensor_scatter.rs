//! TensorScatter (opset 24): writes `update` into a copy of `past_cache` along the
//! sequence `axis` (default -2; never the batch axis 0), at each batch row's offset
//! `write_indices[b]` (int64 `[batch]`, default zeros) — the in-place KV-cache update.
//! `mode` `linear` needs `offset + update length <= cache length`; `circular` wraps the
//! positions modulo the cache length. Every other dim of the two tensors must agree.
//!
//! Both kernels compute each output element by gathering: position `j` of batch `b`
//! reads `update[.., j - offset, ..]` (modulo the cache length when circular) when that position was written, else the
//! cache. A bad offset is an error (the GPU reports it through the node's status).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct TensorScatter {
    axis: i64,
    circular: bool,
}

/// The geometry: batch, cache length `max`, update length `len`, `inner` (elements after
/// the axis), `mid` (elements between batch and axis).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    batch: usize,
    mid: usize,
    max: usize,
    len: usize,
    inner: usize,
}

impl TensorScatter {
    fn geometry(&self, inputs: &[Option<Arg>]) -> Result<Geometry> {
        let (cache, update) = (required(inputs, 0)?, required(inputs, 1)?);
        let r = cache.rank();
        if update.dtype() != cache.dtype() || update.rank() != r || r < 2 {
            return Err(OpError::input(1, format!("update {} must have past_cache's dtype and rank ({}, rank >= 2)", update.ty, cache.ty)));
        }
        let axis = crate::norm_axis(self.axis, r)?;
        if axis == 0 {
            return Err(OpError::invalid("axis must not be the batch axis 0"));
        }
        let (c, u) = (cache.dims(), update.dims());
        for d in 0..r {
            if (d != axis && c[d] != u[d]) || (d == axis && u[d] > c[d]) {
                return Err(OpError::input(1, format!("update shape {u:?} does not fit past_cache shape {c:?} along axis {axis}")));
            }
        }
        if inputs.get(2).copied().flatten().is_some() {
            expect_dtype(inputs, 2, &[DType::I64])?;
            let w = required(inputs, 2)?;
            if w.dims() != [c[0]] {
                return Err(OpError::input(2, format!("write_indices must have shape [{}], found {:?}", c[0], w.dims())));
            }
        }
        Ok(Geometry { batch: c[0], mid: c[1..axis].iter().product(), max: c[axis], len: u[axis], inner: c[axis + 1..].iter().product() })
    }
}

impl Op for TensorScatter {
    fn name(&self) -> &str {
        "TensorScatter"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        self.geometry(inputs)?;
        Ok(vec![required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for TensorScatter {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let g = crate::tensor::tensor_args(inputs, |a| self.geometry(a))?;
        let (cache, update) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let offsets = match inputs.get(2).copied().flatten() {
            Some(w) => w.to_i64_vec()?,
            None => vec![0; g.batch],
        };
        for &w in &offsets {
            let ok = if self.circular { w >= 0 } else { w >= 0 && w as usize + g.len <= g.max };
            if !ok {
                return Err(OpError::input(2, format!("write index {w} with {} updates does not fit a cache of {}", g.len, g.max)));
            }
        }
        let size = cache.dtype().size();
        let mut out = cache.bytes().to_vec();
        let src = update.bytes();
        let row = g.inner * size;
        for b in 0..g.batch {
            for m in 0..g.mid {
                for s in 0..g.len {
                    let mut j = offsets[b] as usize + s;
                    if self.circular {
                        j %= g.max;
                    }
                    let to = ((b * g.mid + m) * g.max + j) * row;
                    let from = ((b * g.mid + m) * g.len + s) * row;
                    out[to..to + row].copy_from_slice(&src[from..from + row]);
                }
            }
        }
        outputs[0] = Tensor::from_bytes(cache.dtype(), cache.dims(), &out)?;
        Ok(())
    }
}

impl WgslKernel for TensorScatter {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let g = self.geometry(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let has_w = inputs.get(2).copied().flatten().is_some();
        let (inner, max, mid, len) = (g.inner, g.max, g.mid, g.len);
        let offset = if has_w { "w[b]" } else { "0" };
        let bad = if self.circular { "w0 < 0".to_string() } else { format!("w0 < 0 || w0 + {len}i > {max}i") };
        let pos = if self.circular { format!("(j + {max}u - u32(w0) % {max}u) % {max}u") } else { "u32(j - u32(w0))".into() };
        let body = format!(
            "let e = i % {inner}u;\n    let j = (i / {inner}u) % {max}u;\n    let bm = i / ({inner}u * {max}u);\n    let b = bm / {mid}u;\n    \
             let w0 = {offset};\n    if ({bad}) {{ {report} y[i] = cache[i]; return; }}\n    \
             let s = {pos};\n    let written = {cond};\n    \
             if (written) {{ y[i] = upd[(bm * {len}u + s) * {inner}u + e]; }} else {{ y[i] = cache[i]; }}",
            report = wgsl::report_index_error("w0", &format!("{max}i")),
            cond = if self.circular { format!("s < {len}u") } else { format!("j >= u32(w0) && s < {len}u") },
        );
        let mut buffers = vec![("cache", ty, true), ("upd", ty, true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_w {
            buffers.push(("w", "i32", true));
            bindings.push(Binding::Input(2));
        }
        buffers.push(("y", ty, false));
        bindings.extend([Binding::Output(0), Binding::Status]);
        let status = wgsl::status_decl(buffers.len());
        Ok(WgslProgram::single(wgsl::simple_kernel("TensorScatter", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, &status, &body)))
    }
}

fn parse(spec: &NodeSpec) -> Result<TensorScatter> {
    let circular = match spec.string("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        m => return Err(spec.bad("mode", format!("expected linear or circular, found {m:?}"))),
    };
    Ok(TensorScatter { axis: spec.int("axis", -2)?, circular })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "TensorScatter", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    /// The reference: copy, then write each update row at its (wrapped) position.
    fn reference(cache: &[f64], upd: &[f64], w: &[i64], dims: (usize, usize, usize, usize), len: usize, circular: bool) -> Vec<f64> {
        let (b, mid, max, inner) = dims;
        let mut out = cache.to_vec();
        for bi in 0..b {
            for m in 0..mid {
                for s in 0..len {
                    let j = (w[bi] as usize + s) % if circular { max } else { usize::MAX };
                    for e in 0..inner {
                        out[((bi * mid + m) * max + j) * inner + e] = upd[((bi * mid + m) * len + s) * inner + e];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn linear_and_circular_updates() {
        let cache = rand_f32(&[2, 3, 5, 4], 1);
        let upd = rand_f32(&[2, 3, 2, 4], 2);
        for (mode, w) in [("linear", [3i64, 0]), ("circular", [4, 6])] {
            let case = Case::new("TensorScatter").opset(24).input(cache.clone()).input(upd.clone()).input(i64_vec(&w)).attr("mode", string(mode));
            let want = reference(&cache.to_f64_vec(), &upd.to_f64_vec(), &w, (2, 3, 5, 4), 2, mode == "circular");
            assert_close(&case.run_cpu().unwrap()[0], &want, 0.0, mode);
        }
        // Default offsets (zeros), and a 3-D cache along axis 1.
        let (c3, u3) = (rand_f32(&[3, 4, 5], 3), rand_f32(&[3, 2, 5], 4));
        let got = Case::new("TensorScatter").opset(24).input(c3.clone()).input(u3.clone()).run_cpu().unwrap();
        assert_close(&got[0], &reference(&c3.to_f64_vec(), &u3.to_f64_vec(), &[0, 0, 0], (3, 1, 4, 5), 2, false), 0.0, "3-D");
        // A linear write past the end and a mismatched update are errors.
        let past = Case::new("TensorScatter").opset(24).input(c3.clone()).input(u3.clone()).input(i64_vec(&[0, 3, 0]));
        assert!(past.run_cpu().is_err());
        assert!(Case::new("TensorScatter").opset(24).input(c3).input(rand_f32(&[3, 2, 4], 5)).run_cpu().is_err());
    }
}
