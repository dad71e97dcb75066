//! Eight NCHW planes as one pixel-major block (`[row][col][8]`), the layout that the
//! eight-channel depthwise convolution and MaxPool compute in: every tap of every
//! output pixel is then one 8-lane load.
use super::window::Geometry;

/// Rows and columns of the padded block that a 2-D window of `g` reads.
pub(crate) fn padded(g: &Geometry) -> (usize, usize) {
    let [_, oh, ow] = g.output;
    ((oh - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dilation[1] + 1, (ow - 1) * g.stride[2] + (g.kernel[2] - 1) * g.dilation[2] + 1)
}

/// Copies the eight planes at `x` (`in_plane` floats apart) into `xs` (the padded
/// block of [`padded`]), `fill` outside the input, 8x8 blocks transposed in registers.
/// Returns whether the planes held a NaN.
///
/// # Safety
/// The CPU has AVX; `x` holds eight planes of `g.input`, `xs` `8 * hp * wp` floats.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load(g: &Geometry, x: *const f32, xs: &mut [f32], fill: f32) -> bool {
    use crate::linalg::microkernel::transpose8x8;
    use std::arch::x86_64::*;
    let [_, ih_n, iw_n] = g.input;
    let (top, left) = (g.pad_begin[1], g.pad_begin[2]);
    let (hp, wp) = padded(g);
    let in_plane = ih_n * iw_n;
    let (c_lo, c_hi) = ((left.max(0) as usize).min(wp), ((iw_n as i64 + left).max(0) as usize).min(wp));
    let (mut nan, mut scalar_nan) = (_mm256_setzero_ps(), false);
    for r in 0..hp {
        let ih = r as i64 - top;
        let row = &mut xs[r * wp * 8..(r + 1) * wp * 8];
        if ih < 0 || ih >= ih_n as i64 || c_hi <= c_lo {
            row.fill(fill);
            continue;
        }
        row[..c_lo * 8].fill(fill);
        row[c_hi * 8..].fill(fill);
        let src = x.add(ih as usize * iw_n + (c_lo as i64 - left) as usize);
        let dst = row.as_mut_ptr().add(c_lo * 8);
        let n = c_hi - c_lo;
        let mut i = 0;
        while i + 8 <= n {
            let rows: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.add(j * in_plane + i)));
            for r in rows {
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r));
            }
            for (k, v) in transpose8x8(rows).into_iter().enumerate() {
                _mm256_storeu_ps(dst.add((i + k) * 8), v);
            }
            i += 8;
        }
        for i in i..n {
            for j in 0..8 {
                let v = *src.add(j * in_plane + i);
                scalar_nan |= v.is_nan();
                *dst.add(i * 8 + j) = v;
            }
        }
    }
    scalar_nan || _mm256_movemask_ps(nan) != 0
}
