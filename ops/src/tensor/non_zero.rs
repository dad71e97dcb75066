//! NonZero: the coordinates of the non-zero elements, as an i64 tensor of shape
//! `[rank, count]` in row-major order. The output shape depends on the input's values,
//! so inference needs the value (a constant, or a graph input the session binds by
//! value); with the value known, specialisation folds the node on the host. There is
//! no GPU kernel: an input computed on the device at run time cannot be handled (the
//! session reports that the value must be known when the model is specialised).
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::wgsl::WgslKernel;
use crate::{Arg, Op, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct NonZero;

/// Row-major coordinates of the non-zero elements of `t`, as `[rank, count]` values.
fn coordinates(t: &Tensor) -> (usize, Vec<i64>) {
    let dims: Vec<usize> = if t.rank() == 0 { vec![1] } else { t.dims().to_vec() };
    let v = t.to_f64_vec();
    let hits: Vec<usize> = v.iter().enumerate().filter(|(_, &x)| x != 0.0).map(|(i, _)| i).collect();
    let rank = dims.len();
    let mut out = vec![0i64; rank * hits.len()];
    for (j, &e) in hits.iter().enumerate() {
        let mut rem = e;
        for d in (0..rank).rev() {
            out[d * hits.len() + j] = (rem % dims[d]) as i64;
            rem /= dims[d];
        }
    }
    (hits.len(), out)
}

impl Op for NonZero {
    fn name(&self) -> &str {
        "NonZero"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        let v = constant(inputs, 0, "the input of NonZero (its output shape depends on its values)")?;
        Ok(vec![TensorType::new(DType::I64, vec![x.rank().max(1), coordinates(v).0])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for NonZero {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (count, coords) = coordinates(x);
        outputs[0] = Tensor::from_slice(&[x.rank().max(1), count], &coords)?;
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "NonZero", |_| Ok(Box::new(NonZero)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    #[test]
    fn non_zero_coordinates() {
        let op = make("NonZero", 13, &[], 1, 1).unwrap();
        let x = Tensor::from_bools(&[2, 2], &[true, false, true, true]).unwrap();
        let got = run(op.as_ref(), &as_inputs(&[Some(&x)], &[0]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[2, 3], &[0, 1, 1, 0, 0, 1]));
        let f = f32s(&[2, 1, 3], &[0.0, 2.0, -1.0, 0.0, 0.0, 0.5]);
        let got = run(op.as_ref(), &as_inputs(&[Some(&f)], &[0]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[3, 3], &[0, 0, 1, 0, 0, 0, 1, 2, 2]));
        let zeros = f32s(&[3], &[0.0; 3]);
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&zeros)], &[0]), &[]).unwrap()[0].dims(), &[1, 0]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("must be known"), "{e}");
        assert!(op.wgsl().is_none());
    }
}
