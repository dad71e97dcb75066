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
/// `step(acc, tap, value)` over the window's taps, several pixels at a time so that
/// their folds overlap ([`slide_row`]).
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
    let [_, oh_n, ow_n] = g.output;
    let [_, _, kw_n] = g.kernel;
    let (sh, sw, dh, dw) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
    let taps = g.kernel_size();
    let offs: [(isize, usize); MAX_TAPS] = std::array::from_fn(|t| if t < taps { ((((t / kw_n) * dh * wp + (t % kw_n) * dw) * 8) as isize, t) } else { (0, 0) });
    for oh in 0..oh_n {
        let row = xs.as_ptr().add(oh * sh * wp * 8);
        let dst = os.as_mut_ptr().add(oh * ow_n * 8);
        slide_row(row, dst, 0..ow_n, sw, &offs[..taps], init, &step, &finish);
    }
}

/// [`slide`] straight from the unpadded block `xb` (`[ih][iw][8]` of `g.input`),
/// output rows `rows` into `os` (`[oh - rows.start][ow][8]`): taps outside the input
/// are left out of the fold (a zero-padded convolution or a max pool need nothing
/// else), so no padded copy of the input is made. Interior pixels of a row run
/// several at a time on the row's taps; the few pixels at the row's ends, each on its
/// own taps.
///
/// # Safety
/// As [`slide`], with `xb` holding the block and `os` the rows' output.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn slide_direct(
    g: &Geometry,
    xb: &[f32],
    rows: std::ops::Range<usize>,
    os: &mut [f32],
    init: std::arch::x86_64::__m256,
    step: impl Fn(std::arch::x86_64::__m256, usize, std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
    finish: impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
) {
    let [_, ih_n, iw_n] = g.input;
    let [_, _, ow_n] = g.output;
    let [_, kh_n, kw_n] = g.kernel;
    let (sh, sw, dh, dw) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
    let (top, left) = (g.pad_begin[1], g.pad_begin[2]);
    debug_assert!(xb.len() >= ih_n * iw_n * 8 && kh_n * kw_n <= MAX_TAPS);
    // Columns whose every tap is inside the input: ow_lo..ow_hi.
    let ow_lo = (left.max(0) as usize).div_ceil(sw).min(ow_n);
    let last = iw_n as i64 - 1 - ((kw_n - 1) * dw) as i64 + left;
    let ow_hi = if last < 0 { 0 } else { (last as usize / sw + 1).min(ow_n) }.max(ow_lo);
    // A pixel's base (its window's first tap, possibly outside the input) is element
    // `(oh * sh - top) * iw_n + ow * sw - left`: pointers are formed with wrapping
    // arithmetic and only taps inside the input are read.
    let base = |oh: usize| xb.as_ptr().wrapping_offset((((oh * sh) as i64 - top) * iw_n as i64 - left) as isize * 8);
    let mut row_taps = [(0isize, 0usize); MAX_TAPS];
    let mut px_taps = [(0isize, 0usize); MAX_TAPS];
    for oh in rows.clone() {
        let ih0 = (oh * sh) as i64 - top;
        let kh_ok = |kh: usize| (0..ih_n as i64).contains(&(ih0 + (kh * dh) as i64));
        let mut n = 0;
        for kh in (0..kh_n).filter(|&kh| kh_ok(kh)) {
            for kw in 0..kw_n {
                row_taps[n] = (((kh * dh * iw_n + kw * dw) * 8) as isize, kh * kw_n + kw);
                n += 1;
            }
        }
        let row = base(oh);
        let dst = os.as_mut_ptr().add((oh - rows.start) * ow_n * 8);
        slide_row(row, dst, ow_lo..ow_hi, sw, &row_taps[..n], init, &step, &finish);
        for ow in (0..ow_lo).chain(ow_hi..ow_n) {
            let iw0 = (ow * sw) as i64 - left;
            let m = row_taps[..n].iter().filter(|&&(_, t)| (0..iw_n as i64).contains(&(iw0 + ((t % kw_n) * dw) as i64))).fold(0, |m, &tap| {
                px_taps[m] = tap;
                m + 1
            });
            slide_row(row, dst, ow..ow + 1, sw, &px_taps[..m], init, &step, &finish);
        }
    }
}

/// Output pixels `cols` of one row of [`slide`] (`row`: the window base of pixel 0,
/// `dst`: its output), each the fold of `taps` (offset from the pixel's base, tap
/// index); eight pixels at a time (eight independent folds cover an FMA's latency
/// on two pipes), then four, then one.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn slide_row(
    row: *const f32,
    dst: *mut f32,
    cols: std::ops::Range<usize>,
    sw: usize,
    taps: &[(isize, usize)],
    init: std::arch::x86_64::__m256,
    step: &impl Fn(std::arch::x86_64::__m256, usize, std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
    finish: &impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
) {
    let mut ow = slide_run::<8>(row, dst, cols.start, cols.end, sw, taps, init, step, finish);
    ow = slide_run::<4>(row, dst, ow, cols.end, sw, taps, init, step, finish);
    slide_run::<1>(row, dst, ow, cols.end, sw, taps, init, step, finish);
}

/// The pixels of one output row from `ow` to `ow_n`, `PX` at a time while `PX` are
/// left ([`slide_row`]); returns the first pixel not done.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn slide_run<const PX: usize>(
    row: *const f32,
    dst: *mut f32,
    mut ow: usize,
    ow_n: usize,
    sw: usize,
    taps: &[(isize, usize)],
    init: std::arch::x86_64::__m256,
    step: &impl Fn(std::arch::x86_64::__m256, usize, std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
    finish: &impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
) -> usize {
    use std::arch::x86_64::*;
    while ow + PX <= ow_n {
        let at: [*const f32; PX] = std::array::from_fn(|i| row.wrapping_add((ow + i) * sw * 8));
        let mut acc = [init; PX];
        for &(o, t) in taps {
            for i in 0..PX {
                acc[i] = step(acc[i], t, _mm256_loadu_ps(at[i].wrapping_offset(o)));
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(dst.add((ow + i) * 8), finish(*a));
        }
        ow += PX;
    }
    ow
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
