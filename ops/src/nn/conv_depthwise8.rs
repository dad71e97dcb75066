//! Depthwise 2-D convolution eight channels at a time (AVX2 + FMA), for NCHW tensors.
//!
//! The per-plane kernel of `conv_cpu.rs` pays a fixed cost per channel plane (its
//! padded phase copies, short rows): on MobileNet's 7x7 and 14x14 planes that cost is
//! most of the work, and a strided plane is deinterleaved first. Here a block of eight
//! channels is transposed into a zero-padded pixel-major scratch (`[row][col][8]`, 8x8
//! blocks transposed in registers), so that every tap of every output pixel is one
//! 8-lane load and one FMA whatever the stride, and the result is transposed back into
//! the eight output planes with the epilogue (bias, residual, Relu/Clip bounds).
use super::blocked8;
use super::conv_cpu::ConvProblem;

use blocked8::MAX_TAPS;

/// Whether this path computes the problem (2-D depthwise, multiplier 1, an AVX2 CPU,
/// a block's scratch within 512 KiB so that it stays in L2: ppocr_det's 240x320 planes
/// ran 1.7x slower here than per plane, MobileNet's 112x112 ones level); channels past
/// the last full block of eight go to the per-plane kernel.
pub(crate) fn applies(p: &ConvProblem) -> bool {
    let g = &p.geo;
    p.is_depthwise()
        && g.output_size() > 0
        && p.out_channels == p.in_channels
        && g.input[0] == 1
        && g.kernel[0] == 1
        && g.kernel_size() <= MAX_TAPS
        && p.in_channels >= 8
        && scratch_len(p) <= 128 * 1024
        && crate::cpu::has_avx2()
}

/// Scratch floats per task: the padded input block and the output block.
pub(crate) fn scratch_len(p: &ConvProblem) -> usize {
    let (hp, wp) = blocked8::padded(&p.geo);
    8 * (hp * wp + p.geo.output_size())
}


/// Channels `c0..c0 + 8` of one image: `x` and `y` point at the image's first plane.
/// `clamp`: Relu/Clip bounds applied after the residual.
///
/// # Safety
/// [`applies`] holds; `x`/`y` hold the image's planes, and no other thread touches
/// output planes `c0..c0 + 8` meanwhile; `scratch` has [`scratch_len`] floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block8(p: &ConvProblem, x: *const f32, w: &[f32], c0: usize, bias: Option<&[f32]>, clamp: Option<(f32, f32)>, residual: bool, y: *mut f32, scratch: &mut [f32]) {
    use std::arch::x86_64::*;
    let g = &p.geo;
    let [_, ih_n, iw_n] = g.input;
    let [_, oh_n, ow_n] = g.output;
    let (hp, wp) = blocked8::padded(g);
    let (in_plane, out_plane) = (ih_n * iw_n, oh_n * ow_n);
    let (xs, os) = scratch.split_at_mut(8 * hp * wp);
    // The padded block, pixel-major, borders zero (a NaN simply propagates here).
    blocked8::load(g, x.add(c0 * in_plane), xs, 0.0);
    // Weights per tap, one lane per channel, and the bias.
    let taps = g.kernel_size();
    let mut wv = [_mm256_setzero_ps(); MAX_TAPS];
    for (t, v) in wv.iter_mut().enumerate().take(taps) {
        let lanes: [f32; 8] = std::array::from_fn(|j| w[(c0 + j) * taps + t]);
        *v = _mm256_loadu_ps(lanes.as_ptr());
    }
    let b = bias.map_or(_mm256_setzero_ps(), |b| _mm256_loadu_ps(b.as_ptr().add(c0)));
    blocked8::slide(g, xs, blocked8::padded(g).1, os, b, |acc, t, v| _mm256_fmadd_ps(wv[t], v, acc), |v| v);
    // Back to the eight output planes, with the residual and the bounds.
    let (lo_v, hi_v) = clamp.map_or((_mm256_setzero_ps(), _mm256_setzero_ps()), |(lo, hi)| (_mm256_set1_ps(lo), _mm256_set1_ps(hi)));
    let finish = |mut v: __m256, o: *const f32| {
        if residual {
            v = _mm256_add_ps(v, _mm256_loadu_ps(o));
        }
        if clamp.is_some() {
            // max(v, lo) then min(., hi): a NaN takes `lo`, as the scalar form.
            v = _mm256_min_ps(_mm256_max_ps(v, lo_v), hi_v);
        }
        v
    };
    let finish1 = |v: f32, prev: f32| {
        let v = if residual { v + prev } else { v };
        match clamp {
            // As `UnaryKind::Clip` (a NaN becomes `lo`), as single max/min ops.
            Some((lo, hi)) => {
                let v = if v > lo { v } else { lo };
                if v < hi {
                    v
                } else {
                    hi
                }
            }
            None => v,
        }
    };
    blocked8::store(os, y.add(c0 * out_plane), out_plane, finish, finish1);
}
