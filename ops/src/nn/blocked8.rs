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

/// The most taps a window of these kernels may have (offsets kept on the stack).
pub(crate) const MAX_TAPS: usize = 64;

/// Slides the 2-D window of `g` over the block `xs` (see [`load`]; rows `wp` pixels
/// long) into `os` (`[oh][ow][8]`): each output is `finish` of `init` folded with
/// `step(acc, tap, value)` over the window's taps, four pixels at a time so that the
/// four folds overlap.
///
/// # Safety
/// The CPU has AVX (and whatever `step` uses); inline into a function compiled for it.
/// `g.kernel_size() <= MAX_TAPS`; `xs` holds the block of [`padded`] with rows `wp`
/// (at least its width) pixels apart, `os` the output plane.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn slide(
    g: &Geometry,
    xs: &[f32],
    wp: usize,
    os: &mut [f32],
    init: std::arch::x86_64::__m256,
    step: impl Fn(std::arch::x86_64::__m256, usize, std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
    finish: impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
) {
    use std::arch::x86_64::*;
    let [_, oh_n, ow_n] = g.output;
    let [_, _, kw_n] = g.kernel;
    let (sh, sw, dh, dw) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
    let taps = g.kernel_size();
    let offs: [usize; MAX_TAPS] = std::array::from_fn(|t| if t < taps { ((t / kw_n) * dh * wp + (t % kw_n) * dw) * 8 } else { 0 });
    const PX: usize = 4;
    for oh in 0..oh_n {
        let row = xs.as_ptr().add(oh * sh * wp * 8);
        let dst = os.as_mut_ptr().add(oh * ow_n * 8);
        let mut ow = 0;
        while ow + PX <= ow_n {
            let at: [*const f32; PX] = std::array::from_fn(|i| row.add((ow + i) * sw * 8));
            let mut acc = [init; PX];
            for (t, &o) in offs[..taps].iter().enumerate() {
                for i in 0..PX {
                    acc[i] = step(acc[i], t, _mm256_loadu_ps(at[i].add(o)));
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(dst.add((ow + i) * 8), finish(*a));
            }
            ow += PX;
        }
        for ow in ow..ow_n {
            let at = row.add(ow * sw * 8);
            let acc = offs[..taps].iter().enumerate().fold(init, |a, (t, &o)| step(a, t, _mm256_loadu_ps(at.add(o))));
            _mm256_storeu_ps(dst.add(ow * 8), finish(acc));
        }
    }
}

/// Stores the output block `os` (`[pixel][8]`) into the eight planes at `y`
/// (`out_plane` floats apart): `finish(value, out)` gives each 8-pixel run of a plane
/// (`out` points at it, for a residual), `finish1(value, previous)` each odd pixel.
///
/// # Safety
/// The CPU has AVX; inline into a function compiled for it. `y` holds eight planes no
/// other thread touches meanwhile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store(
    os: &[f32],
    y: *mut f32,
    out_plane: usize,
    finish: impl Fn(std::arch::x86_64::__m256, *const f32) -> std::arch::x86_64::__m256,
    finish1: impl Fn(f32, f32) -> f32,
) {
    use crate::linalg::microkernel::transpose8x8;
    use std::arch::x86_64::*;
    let mut pix = 0;
    while pix + 8 <= out_plane {
        let rows: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(os.as_ptr().add((pix + k) * 8)));
        for (j, v) in transpose8x8(rows).into_iter().enumerate() {
            let o = y.add(j * out_plane + pix);
            _mm256_storeu_ps(o, finish(v, o));
        }
        pix += 8;
    }
    for pix in pix..out_plane {
        for j in 0..8 {
            let o = y.add(j * out_plane + pix);
            *o = finish1(os[pix * 8 + j], *o);
        }
    }
}

/// Copies one channel block of a blocked tensor (`xb`: `[row][col][8]` of `g.input`)
/// into the padded block `xs` of [`padded`], `fill` outside the input.
pub(crate) fn load_blocked(g: &Geometry, xb: &[f32], xs: &mut [f32], fill: f32) {
    let [_, ih_n, iw_n] = g.input;
    let (top, left) = (g.pad_begin[1], g.pad_begin[2]);
    let (hp, wp) = padded(g);
    let (c_lo, c_hi) = ((left.max(0) as usize).min(wp), ((iw_n as i64 + left).max(0) as usize).min(wp));
    for r in 0..hp {
        let ih = r as i64 - top;
        let row = &mut xs[r * wp * 8..(r + 1) * wp * 8];
        if ih < 0 || ih >= ih_n as i64 || c_hi <= c_lo {
            row.fill(fill);
            continue;
        }
        row[..c_lo * 8].fill(fill);
        row[c_hi * 8..].fill(fill);
        let from = (ih as usize * iw_n + (c_lo as i64 - left) as usize) * 8;
        row[c_lo * 8..c_hi * 8].copy_from_slice(&xb[from..from + (c_hi - c_lo) * 8]);
    }
}
