//! Gather: picks slices of `data` along `axis` by an index tensor (negative indices
//! count from the end). Out-of-range indices are an error on the CPU and are clamped
//! on the GPU (where indices arrive as i32).
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Gather {
    axis: i64,
}

/// (outer, axis size, inner) of gathering on `axis` of `dims`.
fn split_dims(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

impl Op for Gather {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Gather"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let data = required(inputs, 0)?;
        let idx = required(inputs, 1)?;
        if !idx.dtype().is_int() {
            return Err(OpError::input(1, format!("indices must be integers, found {}", idx.dtype())));
        }
        let axis = norm_axis(self.axis, data.rank())?;
        if data.rank() == 0 {
            return Err(OpError::input(0, "Gather needs data of rank >= 1"));
        }
        let mut dims = data.dims()[..axis].to_vec();
        dims.extend_from_slice(idx.dims());
        dims.extend_from_slice(&data.dims()[axis + 1..]);
        Ok(vec![TensorType::new(data.dtype(), dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Gather {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let data = cpu::input(inputs, 0)?;
        let idx = cpu::input(inputs, 1)?.to_i64_vec()?;
        let axis = norm_axis(self.axis, data.rank())?;
        let (outer, n, inner) = split_dims(data.dims(), axis);
        let idx: Vec<usize> = idx
            .iter()
            .map(|&i| {
                let j = if i < 0 { i + n as i64 } else { i };
                if (0..n as i64).contains(&j) {
                    Ok(j as usize)
                } else {
                    Err(OpError::input(1, format!("index {i} is out of range for axis {axis} of size {n} (data shape {:?})", data.dims())))
                }
            })
            .collect::<Result<_>>()?;
        let row = inner * data.dtype().size();
        let src = data.bytes();
        let dst = outputs[0].bytes_mut();
        if row == 0 || dst.is_empty() {
            return Ok(());
        }
        let k = idx.len();
        cpu::par_chunks_mut(dst, row, 1, |r0, part| {
            for (r, out) in part.chunks_mut(row).enumerate() {
                let (o, j) = ((r0 + r) / k, (r0 + r) % k);
                let s = (o * n + idx[j]) * row;
                out.copy_from_slice(&src[s..s + row]);
            }
        });
        let _ = outer;
        Ok(())
    }
}

impl WgslKernel for Gather {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let data = required(inputs, 0)?;
        let k = required(inputs, 1)?.ty.len();
        let axis = norm_axis(self.axis, data.rank())?;
        let (_, n, inner) = split_dims(data.dims(), axis);
        let (k, inner) = (k.max(1), inner.max(1));
        let ty = wgsl::elem(data.dtype());
        let wg = tune.get(&wgsl::workgroup_param());
        let body = format!(
            "let r = i % {inner}u;\n    let q = i / {inner}u;\n    let j = q % {k}u;\n    let o = q / {k}u;\n    \
             let raw = idx[j];\n    var ix = raw;\n    if (ix < 0i) {{ ix = ix + {n}i; }}\n    \
             if (ix < 0i || ix >= {n}i) {{ {} dst[i] = {}; return; }}\n    \
             dst[i] = src[(o * {n}u + u32(ix)) * {inner}u + r];",
            wgsl::report_index_error("raw", &format!("{n}i")),
            wgsl::literal(ty, 0.0)
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Gather",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("idx", "i32", true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Output(0), Binding::Status],
            &wgsl::status_decl(3),
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Gather", |spec| Ok(Box::new(Gather { axis: spec.int("axis", 0)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn gather_axes_and_negative_indices() {
        let x = iota_f32(&[3, 4, 5]);
        let xv = x.to_f64_vec();
        let idx = i64s(&[2, 2], &[0, -1, 2, 1]);
        for axis in [0i64, 1, 2, -1] {
            let op = make("Gather", 13, &[("axis", Attr::Int(axis))], 2, 1).unwrap();
            let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&idx)], &[]), &[]).unwrap();
            let a = axis.rem_euclid(3) as usize;
            let dims = [3usize, 4, 5];
            let mut want_dims = dims[..a].to_vec();
            want_dims.extend([2, 2]);
            want_dims.extend(&dims[a + 1..]);
            assert_eq!(out[0].dims(), want_dims.as_slice());
            // naive reference
            let mut want = vec![];
            let outer: usize = dims[..a].iter().product();
            let inner: usize = dims[a + 1..].iter().product();
            for o in 0..outer {
                for &j in &[0i64, -1, 2, 1] {
                    let j = if j < 0 { j + dims[a] as i64 } else { j } as usize;
                    for r in 0..inner {
                        want.push(xv[(o * dims[a] + j) * inner + r]);
                    }
                }
            }
            assert_eq!(out[0].to_f64_vec(), want, "axis {axis}");
        }
        // scalar index on i64 data (shape-subgraph style), i32 indices
        let shape = i64s(&[4], &[1, 3, 224, 224]);
        let op = make("Gather", 13, &[], 2, 1).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&shape), Some(&Tensor::scalar(1i32))], &[0, 1]), &[]).unwrap();
        assert_eq!(out[0], Tensor::scalar(3i64));
        let e = run(op.as_ref(), &as_inputs(&[Some(&shape), Some(&Tensor::scalar(4i64))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("index 4 is out of range"), "{e}");
        let b = Tensor::from_bools(&[3], &[true, false, true]).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&b), Some(&i64s(&[2], &[1, 2]))], &[]), &[]).unwrap();
        assert_eq!(out[0].bytes(), &[0, 1]);
    }
}
