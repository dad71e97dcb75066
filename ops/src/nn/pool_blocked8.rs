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

/// Whether this path pools `planes` planes of this geometry: 2-D, at least one block
/// of eight, a block's scratch within 512 KiB (it stays in L2), an AVX2 CPU.
pub(crate) fn applies(g: &Geometry, planes: usize) -> bool {
    g.output_size() > 0 && g.input[0] == 1 && g.kernel[0] == 1 && g.stride[0] == 1 && g.output[0] == 1 && planes >= 8 && scratch_len(g) <= 128 * 1024 && crate::cpu::has_avx2()
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
    use crate::linalg::microkernel::transpose8x8;
    use std::arch::x86_64::*;
    let [_, oh_n, ow_n] = g.output;
    let [_, kh_n, kw_n] = g.kernel;
    let (sh, sw, dh, dw) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
    let (hp, wp) = blocked8::padded(g);
    let out_plane = oh_n * ow_n;
    let (xs, os) = scratch.split_at_mut(8 * hp * wp);
    if blocked8::load(g, x, xs, f32::NEG_INFINITY) {
        return false;
    }
    let taps = kh_n * kw_n;
    let offs: Vec<usize> = (0..taps).map(|t| ((t / kw_n) * dh * wp + (t % kw_n) * dw) * 8).collect();
    const PX: usize = 4;
    let neg = _mm256_set1_ps(f32::NEG_INFINITY);
    for oh in 0..oh_n {
        let row = xs.as_ptr().add(oh * sh * wp * 8);
        let dst = os.as_mut_ptr().add(oh * ow_n * 8);
        let mut ow = 0;
        while ow + PX <= ow_n {
            let at: [*const f32; PX] = std::array::from_fn(|i| row.add((ow + i) * sw * 8));
            let mut acc = [neg; PX];
            for &o in &offs {
                for i in 0..PX {
                    acc[i] = _mm256_max_ps(acc[i], _mm256_loadu_ps(at[i].add(o)));
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(dst.add((ow + i) * 8), *a);
            }
            ow += PX;
        }
        for ow in ow..ow_n {
            let at = row.add(ow * sw * 8);
            let acc = offs.iter().fold(neg, |a, &o| _mm256_max_ps(a, _mm256_loadu_ps(at.add(o))));
            _mm256_storeu_ps(dst.add(ow * 8), acc);
        }
    }
    let mut pix = 0;
    while pix + 8 <= out_plane {
        let rows: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(os.as_ptr().add((pix + k) * 8)));
        for (j, v) in transpose8x8(rows).into_iter().enumerate() {
            _mm256_storeu_ps(y.add(j * out_plane + pix), v);
        }
        pix += 8;
    }
    for pix in pix..out_plane {
        for j in 0..8 {
            *y.add(j * out_plane + pix) = os[pix * 8 + j];
        }
    }
    true
}
