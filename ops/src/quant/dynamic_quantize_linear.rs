//! DynamicQuantizeLinear: uint8 quantization with the scale and zero point computed
//! from the data: `scale = (max(0, max x) - min(0, min x)) / 255`, `zero_point =
//! round(saturate(-min(0, min x) / scale))`, then QuantizeLinear. A tensor of zeros
//! (scale 0) quantizes to zeros with zero point 0.
use super::quantize_linear::run_const;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub struct DynamicQuantizeLinear;

/// The scale and zero point of data whose range (zero included) is `lo..=hi`.
pub(crate) fn dynamic_params(lo: f32, hi: f32) -> (f32, f32) {
    let scale = (hi - lo) / 255.0;
    if scale == 0.0 || !scale.is_finite() {
        return (scale, 0.0);
    }
    (scale, (-lo / scale).clamp(0.0, 255.0).round_ties_even())
}

/// The range of `x` with zero included, `(min(0, min x), max(0, max x))`; NaNs are
/// ignored.
pub(crate) fn range(x: &[f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { range_avx2(x) };
    }
    x.iter().fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)))
}

/// [`range`] 32 values at a time: `vminps(v, acc)` returns `acc` where `v` is NaN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn range_avx2(x: &[f32]) -> (f32, f32) {
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let chunks = x.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        for q in 0..4 {
            let v = _mm256_loadu_ps(c.as_ptr().add(8 * q));
            lo[q] = _mm256_min_ps(v, lo[q]);
            hi[q] = _mm256_max_ps(v, hi[q]);
        }
    }
    let (l, h) = (_mm256_min_ps(_mm256_min_ps(lo[0], lo[1]), _mm256_min_ps(lo[2], lo[3])), _mm256_max_ps(_mm256_max_ps(hi[0], hi[1]), _mm256_max_ps(hi[2], hi[3])));
    let (mut ls, mut hs) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(ls.as_mut_ptr(), l);
    _mm256_storeu_ps(hs.as_mut_ptr(), h);
    let fold = |init: (f32, f32), vals: &[f32]| vals.iter().fold(init, |(a, b), &v| (a.min(v), b.max(v)));
    let start = (ls.iter().fold(0f32, |a, &v| a.min(v)), hs.iter().fold(0f32, |a, &v| a.max(v)));
    fold(start, rest)
}

impl Op for DynamicQuantizeLinear {
    fn name(&self) -> &str {
        "DynamicQuantizeLinear"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let x = required(inputs, 0)?;
        Ok(vec![TensorType::new(DType::U8, x.dims()), TensorType::new(DType::F32, &[]), TensorType::new(DType::U8, &[])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for DynamicQuantizeLinear {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?.as_slice::<f32>()?;
        // The range, zero included (min and max ignore NaNs).
        let (lo, hi) = range(x);
        let (scale, zp) = dynamic_params(lo, hi);
        let y = outputs[0].as_mut_slice::<u8>()?;
        if scale == 0.0 || !scale.is_finite() {
            y.fill(0);
        } else {
            cpu::par_chunks_mut(y, 1, 8, |first, part| {
                run_const(&x[first..first + part.len()], part, scale, zp, (0.0, 255.0));
            });
        }
        // The node may leave the scale and zero point unused (no output).
        if let Some(o) = outputs.get_mut(1) {
            o.as_mut_slice::<f32>()?[0] = scale;
        }
        if let Some(o) = outputs.get_mut(2) {
            o.as_mut_slice::<u8>()?[0] = zp as u8;
        }
        Ok(())
    }
}

/// Lanes of the workgroup that finds a range on the GPU ([`wgsl_range`]).
pub(crate) const RANGE_LANES: usize = 256;

/// Module-scope declarations of [`wgsl_range`].
pub(crate) const RANGE_DECL: &str = "var<workgroup> lo: array<f32, 256>;\nvar<workgroup> hi: array<f32, 256>;\n";

/// WGSL statements for a workgroup of [`RANGE_LANES`] lanes (`lid` its local id)
/// that leave in `lo[0]` and `hi[0]` the range, zero included, of the f32 expression
/// `value` of `e` for `e` in `0..count` (a u32 expression).
pub(crate) fn wgsl_range(value: &str, count: &str) -> String {
    format!(
        "    let l = lid.x;\n    var a = 0.0;\n    var b = 0.0;\n\
         \x20   for (var e = l; e < {count}; e += {RANGE_LANES}u) {{ let v = {value}; a = min(a, v); b = max(b, v); }}\n\
         \x20   lo[l] = a;\n    hi[l] = b;\n    workgroupBarrier();\n\
         \x20   for (var s = {}u; s > 0u; s = s >> 1u) {{\n\
         \x20       if (l < s) {{ lo[l] = min(lo[l], lo[l + s]); hi[l] = max(hi[l], hi[l + s]); }}\n\
         \x20       workgroupBarrier();\n    }}\n",
        RANGE_LANES / 2
    )
}

impl WgslKernel for DynamicQuantizeLinear {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let n = outputs[0].len();
        if n.div_ceil(RANGE_LANES) > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("DynamicQuantizeLinear of {n} elements on the GPU (at most {})", RANGE_LANES * wgsl::MAX_LOOP_ITERATIONS)));
        }
        // One workgroup finds the range and writes the scale and zero point...
        let range = format!(
            "{}{}{}@compute @workgroup_size({RANGE_LANES})\nfn main(@builtin(local_invocation_id) lid: vec3<u32>) {{\n{}\
             \x20   if (lid.x == 0u) {{\n\
             \x20       let scale = q_div(hi[0] - lo[0], 255.0);\n        scale_out[0] = scale;\n\
             \x20       zp_out[0] = select(u32(round(clamp(-q_div(lo[0], scale), 0.0, 255.0))), 0u, scale == 0.0);\n    }}\n}}\n",
            wgsl::declare(&[("x", "f32", true), ("scale_out", "f32", false), ("zp_out", "u32", false)]),
            RANGE_DECL,
            crate::quant::qlinear::WGSL_REQUANTIZE,
            wgsl_range("x[e]", &format!("{n}u"))
        );
        let first = Dispatch { label: "DynamicQuantizeLinear range".into(), source: range, entry_point: "main".into(), workgroups: [1, 1, 1], bindings: vec![Binding::Input(0), Binding::Output(1), Binding::Output(2)] };
        // ... then every element is quantized with them.
        let body = "let s = scale_out[0];\n    let v = clamp(round(q_div(x[i], s)) + f32(zp_out[0]), 0.0, 255.0);\n    y[i] = select(u32(v), 0u, s == 0.0);";
        let second = wgsl::simple_kernel(
            "DynamicQuantizeLinear",
            n,
            tune.get(&wgsl::workgroup_param()),
            &[("x", "f32", true), ("scale_out", "f32", false), ("zp_out", "u32", false), ("y", "u32", false)],
            vec![Binding::Input(0), Binding::Output(1), Binding::Output(2), Binding::Output(0)],
            crate::quant::qlinear::WGSL_REQUANTIZE,
            body,
        );
        Ok(WgslProgram { dispatches: vec![first, second], scratch_bytes: vec![] })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "DynamicQuantizeLinear", |_| Ok(Box::new(DynamicQuantizeLinear)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    /// The vector range equals the plain fold on every length around its 32-value
    /// steps, with NaNs (ignored) anywhere, all-positive and all-negative data.
    #[test]
    fn vector_range_equals_the_plain_fold() {
        let plain = |x: &[f32]| x.iter().fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
        for len in [0, 1, 7, 31, 32, 33, 64, 95, 200] {
            for shift in [-3.0f32, 0.0, 5.0] {
                let mut x: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.13 + shift * 20.0).collect();
                if len > 3 {
                    x[len / 2] = f32::NAN;
                    x[len - 1] = f32::NAN;
                }
                assert_eq!(super::range(&x), plain(&x), "len {len} shift {shift}");
            }
        }
    }

    #[test]
    fn range_scale_and_zero_point() {
        let op = make("DynamicQuantizeLinear", 11, &[], 1, 3).unwrap();
        // Range [-1, 2] (zero inside): scale 3/255, zero point round(85) = 85.
        let x = f32s(&[4], &[-1.0, 0.0, 1.0, 2.0]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert!((out[1].to_f64_vec()[0] - 3.0 / 255.0).abs() < 1e-7);
        assert_eq!(out[2].to_f64_vec(), vec![85.0]);
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 85.0, 170.0, 255.0]);
        // Positive data still includes zero in the range; zeros give scale 0.
        let out = run(op.as_ref(), &as_inputs(&[Some(&f32s(&[2], &[1.0, 2.55]))], &[]), &[]).unwrap();
        assert_eq!((out[0].to_f64_vec(), out[2].to_f64_vec()), (vec![100.0, 255.0], vec![0.0]));
        let zeros = Tensor::from_vec(&[3], vec![0f32; 3]).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&zeros)], &[]), &[]).unwrap();
        assert_eq!((out[0].to_f64_vec(), out[1].to_f64_vec(), out[2].to_f64_vec()), (vec![0.0; 3], vec![0.0], vec![0.0]));
    }
}
