//! OneHot: `indices` expanded by a new dim of size `depth` (a constant) at `axis`,
//! holding `values[1]` where the coordinate equals the index and `values[0]` elsewhere.
//! Negative indices count from the end (`index + depth`); indices outside
//! `-depth..depth` give a row of `values[0]`. Float indices are truncated.
use super::numeric::split_at_axis;
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct OneHot {
    axis: i64,
}

impl OneHot {
    /// (output dims, axis, depth).
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(Vec<usize>, usize, usize)> {
        let idx = required(inputs, 0)?;
        if idx.dtype() == kiln_graph::DType::Bool {
            return Err(OpError::input(0, "indices must be numeric, found bool"));
        }
        let depth = constant(inputs, 1, "depth")?.to_f64_vec();
        if depth.len() != 1 || depth[0].is_nan() || depth[0] < 1.0 || depth[0] > 1e9 {
            return Err(OpError::input(1, format!("depth must be one positive number, found {depth:?}")));
        }
        let depth = depth[0] as usize;
        let values = required(inputs, 2)?;
        if values.ty.len() != 2 {
            return Err(OpError::input(2, format!("values must hold [off, on] (2 elements), found shape {:?}", values.dims())));
        }
        let axis = norm_axis(self.axis, idx.rank() + 1)?;
        let mut dims = idx.dims().to_vec();
        dims.insert(axis, depth);
        Ok((dims, axis, depth))
    }
}

impl Op for OneHot {
    fn name(&self) -> &str {
        "OneHot"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (dims, _, _) = self.plan(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 2)?.dtype(), dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for OneHot {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (dims, axis, depth) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let idx: Vec<i64> = cpu::input(inputs, 0)?.to_f64_vec().iter().map(|&v| v as i64).collect();
        let values = cpu::input(inputs, 2)?;
        let es = values.dtype().size();
        let (off, on) = values.bytes().split_at(es);
        let (_, _, inner) = split_at_axis(&dims, axis);
        let dst = outputs[0].bytes_mut();
        for (e, out) in dst.chunks_mut(es).enumerate() {
            let (o, d, r) = (e / (depth * inner), (e / inner) % depth, e % inner);
            let mut j = idx[o * inner + r];
            if j < 0 {
                j += depth as i64;
            }
            out.copy_from_slice(if j == d as i64 { on } else { off });
        }
        Ok(())
    }
}

impl WgslKernel for OneHot {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (dims, axis, depth) = self.plan(inputs)?;
        let (_, _, inner) = split_at_axis(&dims, axis);
        let ity = wgsl::elem(required(inputs, 0)?.dtype());
        let ty = wgsl::elem(outputs[0].dtype);
        let inner = inner.max(1);
        let body = format!(
            "let r = i % {inner}u;\n    let d = i32((i / {inner}u) % {depth}u);\n    let o = i / ({inner}u * {depth}u);\n    \
             var j = i32(idx[o * {inner}u + r]);\n    if (j < 0i) {{ j = j + {depth}i; }}\n    \
             dst[i] = select(vals[0], vals[1], j == d);"
        );
        let buffers = [("idx", ity, true), ("vals", ty, true), ("dst", ty, false)];
        let b = vec![Binding::Input(0), Binding::Input(2), Binding::Output(0)];
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("OneHot", outputs[0].len(), wg, &buffers, b, "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "OneHot", |spec| Ok(Box::new(OneHot { axis: spec.int("axis", -1)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn one_hot_axes_negative_and_out_of_range() {
        let idx = i64s(&[2, 3], &[0, 2, -1, 3, -4, 1]);
        let values = f32s(&[2], &[-1.0, 5.0]);
        let depth = Tensor::scalar(3.0f32);
        for axis in [-1i64, 0, 1, 2, -3] {
            let op = make("OneHot", 11, &[("axis", Attr::Int(axis))], 3, 1).unwrap();
            let got = run(op.as_ref(), &as_inputs(&[Some(&idx), Some(&depth), Some(&values)], &[1]), &[]).unwrap();
            let a = axis.rem_euclid(3) as usize;
            let mut dims = vec![2usize, 3];
            dims.insert(a, 3);
            assert_eq!(got[0].dims(), dims.as_slice());
            let mut want = vec![];
            let iv = [0i64, 2, -1, 3, -4, 1];
            for e in 0..18usize {
                let mut c = vec![];
                let mut rem = e;
                for d in (0..3).rev() {
                    c.insert(0, rem % dims[d]);
                    rem /= dims[d];
                }
                let k = c.remove(a);
                let j = iv[c[0] * 3 + c[1]];
                let j = if j < 0 { j + 3 } else { j };
                want.push(if j == k as i64 { 5.0 } else { -1.0 });
            }
            assert_eq!(got[0].to_f64_vec(), want, "axis {axis}");
        }
        // float indices, i64 values
        let op = make("OneHot", 11, &[], 3, 1).unwrap();
        let got = run(op.as_ref(), &as_inputs(&[Some(&f32s(&[2], &[1.7, -1.0])), Some(&Tensor::scalar(2i64)), Some(&i64s(&[2], &[0, 9]))], &[1]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[2, 2], &[0, 9, 0, 9]));
        let e = run(op.as_ref(), &as_inputs(&[Some(&idx), Some(&Tensor::scalar(0i64)), Some(&values)], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("depth must be one positive number"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&idx), Some(&depth), Some(&f32s(&[3], &[0.0; 3]))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("2 elements"), "{e}");
        let bad = make("OneHot", 11, &[("axis", Attr::Int(3))], 3, 1).unwrap();
        assert!(run(bad.as_ref(), &as_inputs(&[Some(&idx), Some(&depth), Some(&values)], &[1]), &[]).is_err());
    }
}
