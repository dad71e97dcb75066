//! DequantizeLinear: `y = (x - x_zero_point) * x_scale`, per tensor, per axis or
//! blocked ([`ScaleLayout`]); y has the scale's dtype. The difference is exact (in
//! i64), the product in f32, as onnxruntime computes it. Float8 and float4 data
//! subtract their (float) zero point in f32.
use super::quantize_linear::SCALE_DTYPES;
use super::{ScaleLayout, LINEAR_QUANT_DTYPES};
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
        let x = expect_dtype(inputs, 0, &[&LINEAR_QUANT_DTYPES[..], &[DType::I32]].concat())?;
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

    fn handles_narrow(&self) -> bool {
        true
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Integer data into f32 `y`, in parallel chunks of runs.
fn dequantize<T: Copy + Into<i64> + Send + Sync>(layout: &ScaleLayout, x: &[T], scale: &[f32], zp: &[i64], y: &mut [f32]) {
    cpu::par_chunks_mut(y, 1, 4, |first, part| {
        layout.runs(first, first + part.len(), |i0, i1, s0, step| {
            let (xs, ys) = (&x[i0..i1], &mut part[i0 - first..i1 - first]);
            if step == 0 {
                let (s, z) = (scale[s0], zp[s0]);
                for (o, &v) in ys.iter_mut().zip(xs) {
                    *o = (v.into() - z) as f32 * s;
                }
            } else {
                for (k, (o, &v)) in ys.iter_mut().zip(xs).enumerate() {
                    let si = s0 + k * step;
                    *o = (v.into() - zp[si]) as f32 * scale[si];
                }
            }
        });
    });
}

impl CpuKernel for DequantizeLinear {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let layout = ScaleLayout::of_tensors(inputs, 1, 2, self.axis, self.block_size)?;
        let x = cpu::input(inputs, 0)?;
        let scale: Vec<f32> = cpu::input(inputs, 1)?.to_f64_vec().into_iter().map(|v| v as f32).collect();
        let narrow_float = x.dtype().is_narrow_float();
        let zp: Vec<i64> = match inputs.get(2).copied().flatten() {
            Some(z) if !narrow_float => z.to_i64_vec()?,
            _ => vec![0; scale.len()],
        };
        let out = &mut outputs[0];
        let (dtype, dims) = (out.dtype(), out.dims().to_vec());
        let mut f32_out;
        let y: &mut [f32] = if dtype == DType::F32 {
            out.as_mut_slice::<f32>()?
        } else {
            f32_out = vec![0f32; out.len()];
            &mut f32_out
        };
        match x.dtype() {
            DType::U8 => dequantize(&layout, x.as_slice::<u8>()?, &scale, &zp, y),
            DType::I8 => dequantize(&layout, x.as_slice::<i8>()?, &scale, &zp, y),
            DType::U16 => dequantize(&layout, x.as_slice::<u16>()?, &scale, &zp, y),
            DType::I16 => dequantize(&layout, x.as_slice::<i16>()?, &scale, &zp, y),
            DType::I32 => dequantize(&layout, x.as_slice::<i32>()?, &scale, &zp, y),
            DType::I4 | DType::I2 => dequantize(&layout, bytemuck::cast_slice::<u8, i8>(x.bytes()), &scale, &zp, y),
            DType::U4 | DType::U2 => dequantize(&layout, x.bytes(), &scale, &zp, y),
            _ if narrow_float => {
                let xv = x.to_f64_vec();
                let zf = inputs.get(2).copied().flatten().map(|z| z.to_f64_vec()).unwrap_or_else(|| vec![0.0; scale.len()]);
                cpu::par_chunks_mut(y, 1, 4, |first, part| {
                    layout.runs(first, first + part.len(), |i0, i1, s0, step| {
                        for (k, o) in part[i0 - first..i1 - first].iter_mut().enumerate() {
                            let si = s0 + k * step;
                            *o = (xv[i0 + k] as f32 - zf[si] as f32) * scale[si];
                        }
                    });
                });
            }
            d => return Err(OpError::Unsupported(format!("DequantizeLinear of {d}"))),
        }
        if dtype != DType::F32 {
            let v: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            outputs[0] = Tensor::from_f64(dtype, &dims, &v)?;
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
