//! Range: `start, start + delta, ...` below `limit` (above it for negative deltas). The
//! output length depends on the values, so inference needs them constant.
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Range;

/// (start, delta, length) from the three scalar tensors.
fn params(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<(f64, f64, usize)> {
    let one = |i: usize, t: &Tensor| -> Result<f64> {
        if t.len() != 1 {
            return Err(OpError::input(i, format!("Range needs a scalar, found shape {:?}", t.dims())));
        }
        Ok(t.to_f64_vec()[0])
    };
    let (s, l, d) = (one(0, start)?, one(1, limit)?, one(2, delta)?);
    if d == 0.0 {
        return Err(OpError::input(2, "Range delta is 0"));
    }
    let n = ((l - s) / d).ceil();
    if !n.is_finite() || n > 1e12 {
        return Err(OpError::invalid(format!("Range({s}, {l}, {d}) has no finite size")));
    }
    Ok((s, d, n.max(0.0) as usize))
}

impl Op for Range {
    fn name(&self) -> &str {
        "Range"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = required(inputs, 0)?.dtype();
        for i in 1..3 {
            if required(inputs, i)?.dtype() != dtype {
                return Err(OpError::input(i, format!("dtype differs from start's {dtype}")));
            }
        }
        let (_, _, n) = params(
            constant(inputs, 0, "Range's start")?,
            constant(inputs, 1, "Range's limit")?,
            constant(inputs, 2, "Range's delta")?,
        )?;
        Ok(vec![TensorType::new(dtype, vec![n])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Range {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (s0, l0, d0) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, cpu::input(inputs, 2)?);
        let out = &mut outputs[0];
        let (s, d, n) = params(s0, l0, d0)?;
        if n != out.len() {
            return Err(OpError::invalid(format!("Range of {n} elements does not fit the planned {}", out.len())));
        }
        match out.dtype() {
            DType::I64 => {
                let (s, d) = (s0.to_i64_vec()?[0], d0.to_i64_vec()?[0]);
                for (k, o) in out.as_mut_slice::<i64>()?.iter_mut().enumerate() {
                    *o = s.wrapping_add(d.wrapping_mul(k as i64));
                }
            }
            DType::F32 => {
                // ONNX's reference accumulates in the element type.
                let (s, d) = (s as f32, d as f32);
                for (k, o) in out.as_mut_slice::<f32>()?.iter_mut().enumerate() {
                    *o = s + d * k as f32;
                }
            }
            dt => {
                let v: Vec<f64> = (0..n).map(|k| s + d * k as f64).collect();
                *out = Tensor::from_f64(dt, &[n], &v)?;
            }
        }
        Ok(())
    }
}

impl WgslKernel for Range {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (s, d, _) = params(
            constant(inputs, 0, "Range's start")?,
            constant(inputs, 1, "Range's limit")?,
            constant(inputs, 2, "Range's delta")?,
        )?;
        let ty = wgsl::elem(outputs[0].dtype);
        let body = format!("dst[i] = {} + {} * {ty}(i);", wgsl::literal(ty, s), wgsl::literal(ty, d));
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Range",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("dst", ty, false)],
            vec![Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Range", |_| Ok(Box::new(Range)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    #[test]
    fn range_values() {
        let op = make("Range", 11, &[], 3, 1).unwrap();
        let (s, l, d) = (Tensor::scalar(10i64), Tensor::scalar(1i64), Tensor::scalar(-3i64));
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&s), Some(&l), Some(&d)], &[0, 1, 2]), &[]).unwrap()[0], i64s(&[3], &[10, 7, 4]));
        let (s, l, d) = (Tensor::scalar(1f32), Tensor::scalar(2f32), Tensor::scalar(0.25f32));
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&s), Some(&l), Some(&d)], &[0, 1, 2]), &[]).unwrap()[0], f32s(&[4], &[1., 1.25, 1.5, 1.75]));
        let (s, l, d) = (Tensor::scalar(5i32), Tensor::scalar(1i32), Tensor::scalar(2i32));
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&s), Some(&l), Some(&d)], &[0, 1, 2]), &[]).unwrap()[0].dims(), &[0]);
        let z = Tensor::scalar(0i32);
        assert!(run(op.as_ref(), &as_inputs(&[Some(&s), Some(&l), Some(&z)], &[0, 1, 2]), &[]).unwrap_err().to_string().contains("delta is 0"));
        assert!(run(op.as_ref(), &as_inputs(&[Some(&s), Some(&l), Some(&d)], &[0, 1]), &[]).unwrap_err().to_string().contains("constant"));
    }
}
