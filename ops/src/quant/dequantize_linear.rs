//! DequantizeLinear: `y = (x - x_zero_point) * x_scale`, per tensor, per axis or
//! blocked ([`ScaleLayout`]); y has the scale's dtype. The difference is exact (in
//! i64), the product in f32, as onnxruntime computes it.
use super::quantize_linear::SCALE_DTYPES;
use super::{ScaleLayout, QUANT_DTYPES};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub struct DequantizeLinear {
    pub axis: i64,
    pub block_size: i64,
}

impl Op for DequantizeLinear {
    fn name(&self) -> &str {
        "DequantizeLinear"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = expect_dtype(inputs, 0, &QUANT_DTYPES)?;
        let out = expect_dtype(inputs, 1, &SCALE_DTYPES)?;
        if let Some(z) = inputs.get(2).copied().flatten() {
            if z.dtype() != x {
                return Err(OpError::input(2, format!("zero point dtype {} differs from x's {x}", z.dtype())));
            }
        }
        ScaleLayout::resolve(inputs, 1, 2, self.axis, self.block_size)?;
        Ok(vec![TensorType::new(out, required(inputs, 0)?.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for DequantizeLinear {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let layout = ScaleLayout::of_tensors(inputs, 1, 2, self.axis, self.block_size)?;
        let x = cpu::input(inputs, 0)?;
        let scale: Vec<f32> = cpu::input(inputs, 1)?.to_f64_vec().into_iter().map(|v| v as f32).collect();
        let zp: Vec<i64> = match inputs.get(2).copied().flatten() {
            Some(z) => z.to_i64_vec()?,
            None => vec![0; scale.len()],
        };
        let out = &mut outputs[0];
        let dq = |i: usize, v: i64| {
            let s = layout.index(i);
            (v - zp[s]) as f32 * scale[s]
        };
        match (x.dtype(), out.dtype()) {
            (DType::U8, DType::F32) => {
                for (i, (o, &v)) in out.as_mut_slice::<f32>()?.iter_mut().zip(x.as_slice::<u8>()?).enumerate() {
                    *o = dq(i, v as i64);
                }
            }
            (DType::I8, DType::F32) => {
                for (i, (o, &v)) in out.as_mut_slice::<f32>()?.iter_mut().zip(x.as_slice::<i8>()?).enumerate() {
                    *o = dq(i, v as i64);
                }
            }
            _ => {
                let v: Vec<f64> = x.to_i64_vec()?.into_iter().enumerate().map(|(i, v)| dq(i, v) as f64).collect();
                *out = Tensor::from_f64(out.dtype(), &out.dims().to_vec(), &v)?;
            }
        }
        Ok(())
    }
}

impl WgslKernel for DequantizeLinear {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let layout = ScaleLayout::resolve(inputs, 1, 2, self.axis, self.block_size)?;
        let xe = wgsl::elem(required(inputs, 0)?.dtype());
        let has_zp = inputs.get(2).copied().flatten().is_some();
        let mut buffers = vec![("x", xe, true), ("scale", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_zp {
            buffers.push(("zp", xe, true));
            bindings.push(Binding::Input(2));
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        // Exact differences: unsigned data (stored as u32) subtracts in f32 (8 and 16
        // bits), signed data in i32.
        let diff = match (has_zp, xe) {
            (false, _) => "f32(x[i])",
            (true, "u32") => "(f32(x[i]) - f32(zp[s]))",
            (true, _) => "f32(x[i] - zp[s])",
        };
        let body = format!("let s = {};\n    y[i] = {diff} * scale[s];", layout.wgsl());
        Ok(WgslProgram::single(wgsl::simple_kernel("DequantizeLinear", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, "", &body)))
    }
}

fn parse(spec: &NodeSpec) -> Result<DequantizeLinear> {
    Ok(DequantizeLinear { axis: spec.int("axis", 1)?, block_size: spec.int("block_size", 0)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "DequantizeLinear", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    #[test]
    fn per_tensor_per_axis_and_blocked() {
        let op = make("DequantizeLinear", 21, &[], 3, 1).unwrap();
        let x = Tensor::from_f64(DType::U8, &[4], &[0., 3., 128., 255.]).unwrap();
        let (s, z) = (f32s(&[], &[0.5]), Tensor::from_f64(DType::U8, &[], &[128.]).unwrap());
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s), Some(&z)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![-64., -62.5, 0., 63.5]);
        // int8 [2, 2], per axis 0 (scales 1 and 10), zero points 1 and -1.
        let op = make("DequantizeLinear", 21, &[("axis", Attr::Int(0))], 3, 1).unwrap();
        let x = Tensor::from_f64(DType::I8, &[2, 2], &[-128., 127., 0., 5.]).unwrap();
        let (s, z) = (f32s(&[2], &[1., 10.]), Tensor::from_f64(DType::I8, &[2], &[1., -1.]).unwrap());
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s), Some(&z)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![-129., 126., 10., 60.]);
        // int16, blocks of 2 along axis 1 of [1, 3].
        let op = make("DequantizeLinear", 21, &[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))], 2, 1).unwrap();
        let x = Tensor::from_f64(DType::I16, &[1, 3], &[-300., 2., 7.]).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&f32s(&[1, 2], &[2., 0.5]))], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![-600., 4., 3.5]);
        let e = make("DequantizeLinear", 21, &[], 2, 1).unwrap();
        let bad = run(e.as_ref(), &as_inputs(&[Some(&f32s(&[1], &[1.])), Some(&s)], &[]), &[]).unwrap_err().to_string();
        assert!(bad.contains("dtype f32") || bad.contains("float"), "{bad}");
    }
}
