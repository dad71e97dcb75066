//! Pooling in the channel-blocked layout (`[N, C/8, H, W, 8]`, see `conv_nchwc.rs`),
//! for the compiler's `layout-nchwc` pass: `kiln.MaxPoolNchwc` (MaxPool's window
//! attributes and ceil_mode, 2-D, one output) and `kiln.GlobalAveragePoolNchwc`
//! (`[N, C/8, 1, 1, 8]` out). f32, CPU only.
//!
//! MaxPool slides an 8-lane max over each block (`blocked8::slide`): in place where
//! the windows stay inside the input, else over a copy padded with -inf. A window that
//! holds a NaN gives NaN, as MaxPool does elsewhere (the max keeps NaN lanes sticky).
use super::blocked8::{self, MAX_TAPS};
use super::conv_cpu::SharedOut;
use super::nchwc_reorder::BLOCK;
use super::window::{Geometry, WindowAttrs};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

/// A blocked `[N, C/8, H, W, 8]` input's dims, checked.
fn blocked_dims(x: &[usize]) -> Result<[usize; 4]> {
    match x {
        &[n, cb, h, w, l] if l == BLOCK => Ok([n, cb, h, w]),
        _ => Err(OpError::input(0, format!("expected a blocked input [N, C/{BLOCK}, H, W, {BLOCK}], found {x:?}"))),
    }
}

#[derive(Debug)]
pub struct MaxPoolNchwc {
    window: WindowAttrs,
    ceil_mode: bool,
}

impl MaxPoolNchwc {
    fn parse(spec: &NodeSpec) -> Result<MaxPoolNchwc> {
        let window = WindowAttrs::parse(spec)?;
        if window.kernel.is_none() {
            return Err(spec.bad("kernel_shape", "is required"));
        }
        Ok(MaxPoolNchwc { window, ceil_mode: spec.int("ceil_mode", 0)? != 0 })
    }

    fn geometry(&self, x: &[usize]) -> Result<(usize, Geometry)> {
        let [n, cb, h, w] = blocked_dims(x)?;
        let kernel = self.window.kernel(2, None)?;
        Ok((n * cb, self.window.resolve(&[h, w], &kernel, self.ceil_mode)?))
    }
}

impl Op for MaxPoolNchwc {
    fn name(&self) -> &str {
        "MaxPoolNchwc"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let x = required(inputs, 0)?.dims().to_vec();
        let (_, g) = self.geometry(&x)?;
        Ok(vec![TensorType::new(DType::F32, vec![x[0], x[1], g.output[1], g.output[2], BLOCK])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for MaxPoolNchwc {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (units, g) = self.geometry(x.dims())?;
        let y = &mut outputs[0];
        if y.is_empty() {
            return Ok(());
        }
        let (ipx, opx) = (g.input_size(), g.output_size());
        let (hp, wp) = blocked8::padded(&g);
        let x = x.as_slice::<f32>()?;
        let out = SharedOut(y.as_mut_slice::<f32>()?.as_mut_ptr());
        let vector = cpu::has_avx2() && g.kernel_size() <= MAX_TAPS;
        // Windows that stay inside the input read it in place (no padded copy).
        let in_place = g.pad_begin[1..].iter().all(|&p| p == 0) && hp <= g.input[1] && wp <= g.input[2];
        cpu::par_ranges(units, opx * g.kernel_size() * BLOCK, |a, b| {
            cpu::with_scratch(if in_place { 0 } else { BLOCK * hp * wp }, |xs| {
                for u in a..b {
                    let xb = &x[u * ipx * BLOCK..][..ipx * BLOCK];
                    // SAFETY: unit u's output block is written by this iteration only.
                    let yb = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(u * opx * BLOCK), opx * BLOCK) };
                    let (src, row) = if in_place {
                        (xb, g.input[2])
                    } else {
                        blocked8::load_blocked(&g, xb, xs, f32::NEG_INFINITY);
                        (&xs[..], wp)
                    };
                    #[cfg(target_arch = "x86_64")]
                    if vector {
                        // SAFETY: AVX2 checked; taps <= MAX_TAPS.
                        unsafe { max_avx2(&g, src, row, yb) };
                        continue;
                    }
                    let _ = vector;
                    max_scalar(&g, src, row, yb);
                }
            });
        });
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_avx2(g: &Geometry, xs: &[f32], wp: usize, yb: &mut [f32]) {
    use std::arch::x86_64::*;
    // `vmaxps` returns its second operand when either is NaN: with the running max
    // second a NaN already in it stays; a NaN tap is ORed in (its bits make any lane
    // NaN), so a window holding a NaN gives NaN, as the scalar fold.
    let step = |acc, _, v| _mm256_or_ps(_mm256_max_ps(v, acc), _mm256_and_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v), v));
    blocked8::slide(g, xs, wp, yb, _mm256_set1_ps(f32::NEG_INFINITY), step, |v| v);
}

/// The NaN-propagating fold over each window of the block `xs` (rows `wp` pixels
/// apart).
fn max_scalar(g: &Geometry, xs: &[f32], wp: usize, yb: &mut [f32]) {
    let [_, oh_n, ow_n] = g.output;
    let [_, kh_n, kw_n] = g.kernel;
    for oh in 0..oh_n {
        for ow in 0..ow_n {
            let mut acc = [f32::NEG_INFINITY; BLOCK];
            for kh in 0..kh_n {
                for kw in 0..kw_n {
                    let (r, c) = (oh * g.stride[1] + kh * g.dilation[1], ow * g.stride[2] + kw * g.dilation[2]);
                    for (a, &v) in acc.iter_mut().zip(&xs[(r * wp + c) * BLOCK..][..BLOCK]) {
                        *a = if a.is_nan() || v.is_nan() { f32::NAN } else { a.max(v) };
                    }
                }
            }
            yb[(oh * ow_n + ow) * BLOCK..][..BLOCK].copy_from_slice(&acc);
        }
    }
}

#[derive(Debug)]
pub struct GlobalAveragePoolNchwc;

impl Op for GlobalAveragePoolNchwc {
    fn name(&self) -> &str {
        "GlobalAveragePoolNchwc"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let [n, cb, _, _] = blocked_dims(required(inputs, 0)?.dims())?;
        Ok(vec![TensorType::new(DType::F32, vec![n, cb, 1, 1, BLOCK])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for GlobalAveragePoolNchwc {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let [n, cb, h, w] = blocked_dims(x.dims())?;
        let px = h * w;
        let x = x.as_slice::<f32>()?;
        let y = outputs[0].as_mut_slice::<f32>()?;
        for u in 0..n * cb {
            // f64 sums per lane (as the plain GlobalAveragePool's accuracy).
            let mut acc = [0f64; BLOCK];
            for p in x[u * px * BLOCK..][..px * BLOCK].chunks_exact(BLOCK) {
                acc.iter_mut().zip(p).for_each(|(a, &v)| *a += v as f64);
            }
            for l in 0..BLOCK {
                y[u * BLOCK + l] = if px == 0 { f32::NAN } else { (acc[l] / px as f64) as f32 };
            }
        }
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "MaxPoolNchwc", |spec| Ok(Box::new(MaxPoolNchwc::parse(spec)?)));
    r.register("kiln", "GlobalAveragePoolNchwc", |_spec| Ok(Box::new(GlobalAveragePoolNchwc)));
}
