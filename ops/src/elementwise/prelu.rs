//! PRelu: `x` where `x >= 0`, `slope * x` below, with `slope` broadcast to `x`'s shape
//! (unidirectional broadcasting: the output has `x`'s shape). Before opset 7 a 1-D
//! slope of `x`'s channel count applies per channel (axis 1).
use super::binary::map2;
use super::zip;
use crate::broadcast::broadcast_shapes;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct PRelu {
    opset: i64,
}

const DTYPES: &[DType] =
    &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U64];

impl PRelu {
    /// The dims `slope` is read with (its own, or per-channel for opset < 7).
    fn slope_dims(&self, x: &[usize], slope: &[usize]) -> Vec<usize> {
        if self.opset < 7 && slope.len() == 1 && x.len() > 2 && x[1] == slope[0] && x.last() != Some(&slope[0]) {
            let mut d = vec![slope[0]];
            d.resize(x.len() - 1, 1);
            return d;
        }
        slope.to_vec()
    }
}

impl Op for PRelu {
    fn name(&self) -> &str {
        "PRelu"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if inputs.len() != 2 {
            return Err(OpError::invalid(format!("PRelu takes 2 inputs, got {}", inputs.len())));
        }
        let dtype = expect_dtype(inputs, 0, DTYPES)?;
        let (x, s) = (required(inputs, 0)?, required(inputs, 1)?);
        if s.dtype() != dtype {
            return Err(OpError::input(1, format!("slope dtype {} differs from X's {dtype}", s.dtype())));
        }
        let sd = self.slope_dims(x.dims(), s.dims());
        let dims = broadcast_shapes(&[x.dims(), &sd]).ok().filter(|d| d.as_slice() == x.dims()).ok_or_else(|| {
            OpError::input(1, format!("slope of shape {:?} does not broadcast to X's shape {:?}", s.dims(), x.dims()))
        })?;
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

fn prelu_f64(x: f64, s: f64) -> f64 {
    if x < 0.0 {
        s * x
    } else {
        x
    }
}

impl CpuKernel for PRelu {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (x, s) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let s = s.reshaped(&self.slope_dims(x.dims(), s.dims()))?;
        let out = &mut outputs[0];
        match x.dtype() {
            DType::F32 => map2(x, &s, out, |v: f32, k: f32| if v < 0.0 { k * v } else { v }),
            DType::F64 => map2(x, &s, out, prelu_f64),
            d if d.is_float() => {
                let dims = out.dims().to_vec();
                let fx = Tensor::from_f64(DType::F64, x.dims(), &x.to_f64_vec())?;
                let fs = Tensor::from_f64(DType::F64, s.dims(), &s.to_f64_vec())?;
                let mut tmp = Tensor::zeros(DType::F64, &dims);
                map2(&fx, &fs, &mut tmp, prelu_f64)?;
                *out = Tensor::from_f64(d, &dims, tmp.as_slice::<f64>()?)?;
                Ok(())
            }
            // Unsigned values are never negative: X itself.
            DType::U32 | DType::U64 => zip::zip_ints(x, &s, out, |v, _| v),
            _ => zip::zip_ints(x, &s, out, |v, k| if v < 0 { k.wrapping_mul(v) } else { v }),
        }
    }
}

impl WgslKernel for PRelu {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let wg = tune.get(&wgsl::workgroup_param());
        let (x, s) = (required(inputs, 0)?, required(inputs, 1)?);
        let sty = TensorType::new(s.dtype(), self.slope_dims(x.dims(), s.dims()));
        let s = Arg { ty: &sty, value: None };
        let expr = match wgsl::elem(x.dtype()) {
            "u32" => "a",
            "i32" => "select(a, b * a, a < 0)",
            _ => "select(a, b * a, a < 0.0)",
        };
        Ok(WgslProgram::single(zip::binary_kernel("PRelu", x, s, &outputs[0], wg, "", expr)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "PRelu", |spec: &NodeSpec| Ok(Box::new(PRelu { opset: spec.opset })));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(opset: i64, x: &Tensor, s: &Tensor) -> Result<Tensor> {
        let op = PRelu { opset };
        let (tx, ts) = (TensorType::new(x.dtype(), x.dims()), TensorType::new(s.dtype(), s.dims()));
        let args = [Some(Arg { ty: &tx, value: None }), Some(Arg { ty: &ts, value: None })];
        let ty = op.infer(&args)?;
        let prog = op.generate(&args, &ty, &TuneValues::default())?;
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(ty[0].dtype, &ty[0].dims)];
        op.run(&[Some(x), Some(s)], &mut out)?;
        Ok(out.remove(0))
    }

    #[test]
    fn slope_broadcasts_to_x() {
        let xs: Vec<f32> = (0..30).map(|i| (i as f32 - 15.0) * 0.3).collect();
        let x = Tensor::from_slice(&[2, 3, 5], &xs).unwrap();
        let sl = [0.1f32, -0.5, 2.0, 0.0, 1.0];
        let s = Tensor::from_slice(&[5], &sl).unwrap();
        let got = run(16, &x, &s).unwrap();
        for (i, &g) in got.as_slice::<f32>().unwrap().iter().enumerate() {
            let want = prelu_f64(xs[i] as f64, sl[i % 5] as f64) as f32;
            assert_eq!(g, want);
        }
        // Per-channel slope, spelled [C, 1] or (opset 6) [C].
        let c = Tensor::from_slice(&[3, 1], &[0.1f32, 0.2, 0.3]).unwrap();
        let a = run(16, &x, &c).unwrap();
        let b = run(6, &x, &c.reshaped(&[3]).unwrap()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_slice::<f32>().unwrap()[0], xs[0] * 0.1);
        let i = Tensor::from_slice(&[3], &[-4i64, 0, 9]).unwrap();
        assert_eq!(run(16, &i, &Tensor::scalar(3i64)).unwrap().as_slice::<i64>().unwrap(), &[-12, 0, 9]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let x = Tensor::from_slice(&[2, 3], &[1f32; 6]).unwrap();
        assert!(run(16, &x, &Tensor::from_slice(&[2], &[1f32, 2.]).unwrap()).is_err(), "shape");
        assert!(run(16, &Tensor::from_slice(&[3], &[1f32; 3]).unwrap(), &Tensor::from_slice(&[2, 3], &[1f32; 6]).unwrap()).is_err(), "slope larger than X");
        assert!(run(16, &x, &Tensor::scalar(1f64)).is_err(), "dtype");
        let b = Tensor::from_bools(&[1], &[true]).unwrap();
        assert!(run(16, &b, &b).is_err(), "bool");
    }
}
