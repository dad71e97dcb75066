//! QuantizeLinear: `y = saturate(round_half_to_even(x / y_scale) + y_zero_point)`, per
//! tensor, per axis or blocked ([`ScaleLayout`]). The output dtype is the zero point's,
//! else `output_dtype`, else uint8. The division is in f32, as onnxruntime does it.
//! Into float8, `y = x / y_scale` rounds to nearest even (the zero point is ignored, as
//! in ONNX's reference) and saturates unless `saturate` is 0; into float4,
//! `y = x / y_scale + y_zero_point`, rounded and saturated likewise.
use super::{range, ScaleLayout, LINEAR_QUANT_DTYPES};
use crate::tensor::cast::{wgsl_narrow_float, Rounding, NARROW_WGSL};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::narrow::{E8M0Round, MiniFloat};
use kiln_graph::{DType, Tensor};

const X_DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::I32];
pub(crate) const SCALE_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeLinear {
    pub axis: i64,
    pub block_size: i64,
    /// `output_dtype` (opset 21), when set.
    pub output_dtype: Option<DType>,
    /// `saturate` (opset 19): float8 outputs clamp to their largest value.
    pub saturate: bool,
}

impl QuantizeLinear {
    fn parse(spec: &NodeSpec) -> Result<QuantizeLinear> {
        let output_dtype = match spec.int("output_dtype", 0)? {
            0 => None,
            code => Some(DType::from_onnx_code(code as i32).filter(|d| LINEAR_QUANT_DTYPES.contains(d)).ok_or_else(|| {
                let names: Vec<_> = LINEAR_QUANT_DTYPES.iter().map(|d| d.name()).collect();
                spec.bad("output_dtype", format!("ONNX data type {code} is not supported (expected one of {})", names.join(", ")))
            })?),
        };
        let saturate = spec.int("saturate", 1)? != 0;
        Ok(QuantizeLinear { axis: spec.int("axis", 1)?, block_size: spec.int("block_size", 0)?, output_dtype, saturate })
    }

    fn out_dtype(&self, inputs: &[Option<Arg>]) -> Result<DType> {
        match inputs.get(2).copied().flatten() {
            Some(z) => {
                let d = expect_dtype(inputs, 2, &LINEAR_QUANT_DTYPES)?;
                if self.output_dtype.is_some_and(|o| o != d) {
                    return Err(OpError::input(2, format!("zero point dtype {} differs from output_dtype {}", z.dtype(), self.output_dtype.unwrap_or(d))));
                }
                Ok(d)
            }
            None => Ok(self.output_dtype.unwrap_or(DType::U8)),
        }
    }
}

impl Op for QuantizeLinear {
    fn name(&self) -> &str {
        "QuantizeLinear"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &X_DTYPES)?;
        expect_dtype(inputs, 1, &SCALE_DTYPES)?;
        let out = self.out_dtype(inputs)?;
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

/// One element: `x / scale`, rounded half to even, plus the zero point, clamped.
#[inline(always)]
fn quantize(x: f32, scale: f32, zp: f32, (lo, hi): (f32, f32)) -> f32 {
    // NaN saturates to 0 below (`as` on a NaN float).
    ((x / scale).round_ties_even() + zp).clamp(lo, hi)
}

/// An integer output element.
pub(crate) trait QOut: Copy + Send + Sync + bytemuck::Pod {
    /// For one-byte types, whether signed (the AVX2 path packs those 8 at a time).
    const BYTE_SIGNED: Option<bool>;
    fn from_f32(v: f32) -> Self;
}

macro_rules! q_out {
    ($($t:ty: $byte:expr),*) => {$(
        impl QOut for $t {
            const BYTE_SIGNED: Option<bool> = $byte;
            #[inline(always)]
            fn from_f32(v: f32) -> Self { v as $t }
        }
    )*};
}
q_out!(u8: Some(false), i8: Some(true), u16: None, i16: None);

/// A run of elements with one scale and zero point (vectorised: compiled for AVX2
/// where the CPU has it, so that the rounding is one instruction).
pub(crate) fn run_const<T: QOut>(x: &[f32], y: &mut [T], scale: f32, zp: f32, bounds: (f32, f32)) {
    #[inline(always)]
    fn body<T: QOut>(x: &[f32], y: &mut [T], scale: f32, zp: f32, bounds: (f32, f32)) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = T::from_f32(quantize(v, scale, zp, bounds));
        }
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<T: QOut>(x: &[f32], y: &mut [T], scale: f32, zp: f32, bounds: (f32, f32)) {
            let done = match T::BYTE_SIGNED {
                Some(signed) => bytes_avx2(x, bytemuck::cast_slice_mut(y), scale, zp, bounds, signed),
                None => 0,
            };
            body(&x[done..], &mut y[done..], scale, zp, bounds)
        }
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { avx2(x, y, scale, zp, bounds) };
    }
    body(x, y, scale, zp, bounds)
}

/// [`run_const`] into bytes, 8 values at a time; returns how many it wrote (the
/// caller does the rest). The same operations as [`quantize`]: an IEEE division,
/// rounding half to even, the zero point, the clamp; NaN gives 0 as `as` does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bytes_avx2(x: &[f32], y: &mut [u8], scale: f32, zp: f32, (lo, hi): (f32, f32), signed: bool) -> usize {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len()) / 8 * 8;
    let (s, z, l, h) = (_mm256_set1_ps(scale), _mm256_set1_ps(zp), _mm256_set1_ps(lo), _mm256_set1_ps(hi));
    for i in (0..n).step_by(8) {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s));
        let a = _mm256_add_ps(r, z);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a);
        let c = _mm256_andnot_ps(nan, _mm256_min_ps(_mm256_max_ps(a, l), h));
        // Whole numbers within the type's range: the conversions below are exact.
        let q = _mm256_cvtps_epi32(c);
        let q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        let q8 = if signed { _mm_packs_epi16(q16, q16) } else { _mm_packus_epi16(q16, q16) };
        _mm_storel_epi64(y.as_mut_ptr().add(i) as *mut __m128i, q8);
    }
    n
}

/// f32 data into `T`, in parallel chunks of runs.
fn quantize_f32<T: QOut>(layout: &ScaleLayout, x: &[f32], scale: &[f32], zp: &[f32], bounds: (f32, f32), y: &mut [T]) {
    cpu::par_chunks_mut(y, 1, 8, |first, part| {
        let end = first + part.len();
        layout.runs(first, end, |i0, i1, s0, step| {
            let (xs, ys) = (&x[i0..i1], &mut part[i0 - first..i1 - first]);
            if step == 0 {
                run_const(xs, ys, scale[s0], zp[s0], bounds);
            } else {
                for (k, (o, &v)) in ys.iter_mut().zip(xs).enumerate() {
                    let s = s0 + k * step;
                    *o = T::from_f32(quantize(v, scale[s], zp[s], bounds));
                }
            }
        });
    });
}

impl CpuKernel for QuantizeLinear {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let layout = ScaleLayout::of_tensors(inputs, 1, 2, self.axis, self.block_size)?;
        let x = cpu::input(inputs, 0)?;
        let scale: Vec<f32> = cpu::input(inputs, 1)?.to_f64_vec().into_iter().map(|v| v as f32).collect();
        let zp: Vec<f32> = match inputs.get(2).copied().flatten() {
            Some(z) => z.to_f64_vec().into_iter().map(|v| v as f32).collect(),
            None => vec![0.0; scale.len()],
        };
        let out = &mut outputs[0];
        let bounds = range(out.dtype());
        let converted;
        let xf: &[f32] = match x.dtype() {
            DType::F32 => x.as_slice::<f32>()?,
            _ => {
                converted = x.to_f64_vec().into_iter().map(|v| v as f32).collect::<Vec<f32>>();
                &converted
            }
        };
        match out.dtype() {
            DType::U8 => quantize_f32(&layout, xf, &scale, &zp, bounds, out.as_mut_slice::<u8>()?),
            DType::I8 => quantize_f32(&layout, xf, &scale, &zp, bounds, out.as_mut_slice::<i8>()?),
            DType::U16 => quantize_f32(&layout, xf, &scale, &zp, bounds, out.as_mut_slice::<u16>()?),
            DType::I16 => quantize_f32(&layout, xf, &scale, &zp, bounds, out.as_mut_slice::<i16>()?),
            // 4- and 2-bit integers: their values, one byte each.
            DType::I4 | DType::I2 => quantize_f32(&layout, xf, &scale, &zp, bounds, bytemuck::cast_slice_mut::<u8, i8>(out.bytes_mut())),
            DType::U4 | DType::U2 => quantize_f32(&layout, xf, &scale, &zp, bounds, out.bytes_mut()),
            d => {
                let f = MiniFloat::of(d).ok_or_else(|| OpError::Unsupported(format!("QuantizeLinear to {d}")))?;
                // float8 ignores the zero point; float4 adds it (as ONNX's reference does).
                let add_zp = d == DType::F4E2M1;
                let saturate = self.saturate || add_zp;
                let y = out.bytes_mut();
                cpu::par_chunks_mut(y, 1, 8, |first, part| {
                    layout.runs(first, first + part.len(), |i0, i1, s0, step| {
                        for (k, o) in part[i0 - first..i1 - first].iter_mut().enumerate() {
                            let si = s0 + k * step;
                            let v = xf[i0 + k] / scale[si] + if add_zp { zp[si] } else { 0.0 };
                            *o = f.encode(v as f64, saturate);
                        }
                    });
                });
            }
        }
        Ok(())
    }
}

impl WgslKernel for QuantizeLinear {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let layout = ScaleLayout::resolve(inputs, 1, 2, self.axis, self.block_size)?;
        let x = required(inputs, 0)?.dtype();
        let out = outputs[0].dtype;
        let (lo, hi) = range(out);
        let oe = wgsl::elem(out);
        let has_zp = inputs.get(2).copied().flatten().is_some();
        let mut buffers = vec![("x", wgsl::elem(x), true), ("scale", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_zp {
            buffers.push(("zp", oe, true));
            bindings.push(Binding::Input(2));
        }
        buffers.push(("y", oe, false));
        bindings.push(Binding::Output(0));
        let zp = if has_zp { "f32(zp[s])" } else { "0.0" };
        let (body, helpers) = if out.is_narrow_float() {
            let v = if out == DType::F4E2M1 { format!("q_div(f32(x[i]), scale[s]) + {zp}") } else { "q_div(f32(x[i]), scale[s])".into() };
            let rounding = Rounding { saturate: self.saturate || out == DType::F4E2M1, e8m0: E8M0Round::Up };
            (format!("let s = {};\n    y[i] = {};", layout.wgsl(), wgsl_narrow_float(&v, out, rounding)), format!("{NARROW_WGSL}{}", crate::quant::qlinear::WGSL_REQUANTIZE))
        } else {
            let body = format!(
                "let s = {};\n    let v = clamp(round(q_div(f32(x[i]), scale[s])) + {zp}, {}, {});\n    y[i] = {oe}(v);",
                layout.wgsl(),
                wgsl::literal("f32", lo as f64),
                wgsl::literal("f32", hi as f64)
            );
            (body, crate::quant::qlinear::WGSL_REQUANTIZE.to_string())
        };
        Ok(WgslProgram::single(wgsl::simple_kernel("QuantizeLinear", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "QuantizeLinear", |spec| Ok(Box::new(QuantizeLinear::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn quantize(attrs: &[(&str, Attr)], x: &Tensor, s: &Tensor, z: Option<&Tensor>) -> crate::Result<Tensor> {
        let n = if z.is_some() { 3 } else { 2 };
        let op = make("QuantizeLinear", 21, attrs, n, 1)?;
        Ok(run(op.as_ref(), &as_inputs(&[Some(x), Some(s), z], &[]), &[])?.remove(0))
    }

    /// The byte path of run_const (8 at a time with AVX2) equals the scalar rule on
    /// ties, NaNs, infinities and out-of-range values, for every tail length.
    #[test]
    fn byte_runs_equal_the_scalar_rule() {
        let special = [0.5f32, 1.5, 2.5, -0.5, -1.5, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e9, -1e9, 127.5, -128.5, 254.5, 0.0, -0.0];
        for len in [0usize, 3, 8, 13, 16, 31] {
            let x: Vec<f32> = (0..len).map(|i| if i % 3 == 0 { special[i % special.len()] } else { (i as f32 - 9.0) * 7.3 }).collect();
            for (scale, zp) in [(1.0f32, 0.0f32), (0.37, 128.0), (2.0, -3.0)] {
                let mut u = vec![0u8; len];
                super::run_const(&x, &mut u, scale, zp, (0.0, 255.0));
                let want: Vec<u8> = x.iter().map(|&v| super::quantize(v, scale, zp, (0.0, 255.0)) as u8).collect();
                assert_eq!(u, want, "u8 len {len} scale {scale}");
                let mut i = vec![0i8; len];
                super::run_const(&x, &mut i, scale, zp - 128.0, (-128.0, 127.0));
                let want: Vec<i8> = x.iter().map(|&v| super::quantize(v, scale, zp - 128.0, (-128.0, 127.0)) as i8).collect();
                assert_eq!(i, want, "i8 len {len} scale {scale}");
            }
        }
    }

    #[test]
    fn ties_round_to_even_and_results_saturate() {
        let x = f32s(&[8], &[0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0, f32::NAN]);
        let s = f32s(&[], &[1.0]);
        let z = Tensor::from_f64(DType::U8, &[], &[10.0]).unwrap();
        let y = quantize(&[], &x, &s, Some(&z)).unwrap();
        assert_eq!(y.dtype(), DType::U8);
        assert_eq!(y.to_f64_vec(), vec![10., 12., 12., 10., 8., 255., 0., 0.]);
        let z = Tensor::from_f64(DType::I8, &[], &[-3.0]).unwrap();
        let y = quantize(&[], &x, &s, Some(&z)).unwrap();
        assert_eq!(y.to_f64_vec(), vec![-3., -1., -1., -3., -5., 127., -128., 0.]);
        // No zero point: uint8, or output_dtype.
        let y = quantize(&[("output_dtype", Attr::Int(DType::I16.onnx_code() as i64))], &x, &f32s(&[], &[0.01]), None).unwrap();
        assert_eq!(y.to_f64_vec(), vec![50., 150., 250., -50., -150., 32767., -32768., 0.]);
    }

    #[test]
    fn per_axis_and_blocked_scales() {
        // [2, 3, 2], axis 1: scales 1, 2, 4.
        let x = f32s(&[2, 3, 2], &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.]);
        let y = quantize(&[("axis", Attr::Int(1))], &x, &f32s(&[3], &[1., 2., 4.]), None).unwrap();
        assert_eq!(y.to_f64_vec(), vec![1., 2., 2., 2., 1., 2., 7., 8., 4., 5., 3., 3.]);
        // Blocks of 2 along axis 1 (3 -> 2 blocks): scale [2, 2, 2].
        let s = f32s(&[2, 2, 2], &[1., 1., 2., 2., 1., 1., 4., 4.]);
        let y = quantize(&[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))], &x, &s, None).unwrap();
        assert_eq!(y.to_f64_vec(), vec![1., 2., 3., 4., 2., 3., 7., 8., 9., 10., 3., 3.]);
        let e = quantize(&[("axis", Attr::Int(1))], &x, &f32s(&[2], &[1., 2.]), None).unwrap_err().to_string();
        assert!(e.contains("[3]"), "{e}");
    }
}
