//! MaxPool over 2-D f32 planes eight at a time (AVX2), for NCHW tensors without NaNs.
//!
//! Eight planes are transposed into a pixel-major scratch padded with -inf
//! (`[row][col][8]`, 8x8 blocks transposed in registers), so that every tap of every
//! output pixel is one 8-lane load and one max whatever the stride, and the result is
//! transposed back into the eight output planes: what a channel-blocked layout does,
//! paid for by two transposes. The copy in also looks for NaNs: a block that held one
//! reports it, and the caller redoes the input with the per-plane passes, which
//! propagate it (`vmaxps` alone would not).
use super::blocked8;
use super::window::Geometry;

/// Whether this path pools `planes` planes of this geometry: 2-D, at most
/// `MAX_TAPS` taps, at least one block of eight, a block's scratch within 512 KiB (it stays in L2), an AVX2 CPU.
pub(crate) fn applies(g: &Geometry, planes: usize) -> bool {
    g.output_size() > 0 && g.kernel_size() <= blocked8::MAX_TAPS && g.input[0] == 1 && g.kernel[0] == 1 && g.stride[0] == 1 && g.output[0] == 1 && planes >= 8 && scratch_len(g) <= 128 * 1024 && crate::cpu::has_avx2()
}

/// Scratch floats per task: the padded input block and the output block.
pub(crate) fn scratch_len(g: &Geometry) -> usize {
    let (hp, wp) = blocked8::padded(g);
    8 * (hp * wp + g.output[1] * g.output[2])
}


/// Max-pools the eight planes at `x` into the eight at `y`; false (outputs unusable)
/// when the planes hold a NaN.
///
/// # Safety
/// [`applies`] holds, `x` and `y` hold eight planes each, no other thread touches
/// those outputs meanwhile, and `scratch` has [`scratch_len`] floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn max_block8(g: &Geometry, x: *const f32, y: *mut f32, scratch: &mut [f32]) -> bool {
    use std::arch::x86_64::*;
    let (hp, wp) = blocked8::padded(g);
    let out_plane = g.output_size();
    let (xs, os) = scratch.split_at_mut(8 * hp * wp);
    if blocked8::load(g, x, xs, f32::NEG_INFINITY) {
        return false;
    }
    let neg = _mm256_set1_ps(f32::NEG_INFINITY);
    blocked8::slide(g, xs, blocked8::padded(g).1, os, neg, |acc, _, v| _mm256_max_ps(acc, v), |v| v);
    blocked8::store(os, y, out_plane, |v, _| v, |v, _| v);
    true
}
