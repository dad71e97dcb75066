//! The channels-last depthwise integer convolution (QLinearConv or ConvInteger with
//! `kiln_channels_last`, one input and one output channel per group, 2-D): each output
//! pixel sums, per filter tap, `(x - zx) * (w - zw)` over a contiguous run of channels.
//! With AVX2 and a multiple of 16 channels, a row of output pixels at a time and two
//! taps per instruction: the input columns under the row are widened to `x - zx` (i16)
//! once per block of 16 channels, with two filter rows interleaved per column, and one
//! `vpmaddwd` against the two taps' interleaved weights adds both products into 8 int32
//! sums; the filters are interleaved once per plan in the order the kernel reads them.
//! Taps outside the input add nothing (they read `zx`). With AVX-512 (and VNNI's
//! `vpdpwssd`, the multiply and the add in one instruction) blocks are 32 channels wide,
//! a remaining block of 16 taking the AVX2 path. Sums are exact; the epilogue is
//! the packed kernel's ([`super::qconv_packed::run_params`]): `(acc + B) * (sx * sw[m] /
//! sy)` in f32, rounded half to even, clamped around y's zero point, bit for bit the
//! reference.
use super::conv_cpu::ConvProblem;
use super::qconv_packed::{run_params, Epilogue};
use crate::cpu::{self, CpuKernel, SharedPtr};
use crate::linalg::int8_kernel::{self, Int8Isa};
use crate::quant::qlinear;
use crate::{OpError, Result, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

/// Channels per AVX2 block, and per AVX-512 block.
const BLOCK: usize = 16;
const WIDE: usize = 32;
/// Weight vectors [`DepthwiseNhwc::row_avx512`] keeps in registers: a 3x3 kernel's.
const HELD: usize = 10;

/// The channel (within a block of `width`) whose sum lies in lane `p` of the block's two
/// `vpmaddwd` sums (lanes `0..width / 2`: the first). `unpacklo` / `unpackhi` of 16-bit
/// values work per 128-bit lane of eight channels: the first sum holds channels `8i..8i
/// + 4` of each, the second `8i + 4..8i + 8`.
fn lane(width: usize, p: usize) -> usize {
    let (half, q) = (p / (width / 2), p % (width / 2));
    8 * (q / 4) + 4 * half + q % 4
}

/// The pair groups of one output pixel in the order `new` lays out their weights: per
/// filter column `e` the row pairs, then (an odd height) the last row in pairs of
/// neighbouring columns; `f` gets each group's offset, in vectors, from the pixel's first
/// padded column of widened input (`per_col` vectors per column, columns `dw` apart).
#[inline(always)]
fn pair_offsets(kw: usize, dw: usize, vpairs: usize, odd: bool, per_col: usize, mut f: impl FnMut(usize)) {
    for e in 0..kw {
        for r in 0..vpairs {
            f(e * dw * per_col + 2 * r);
        }
    }
    if odd {
        for e in (0..kw).step_by(2) {
            f(e * dw * per_col + 2 * vpairs);
        }
    }
}

/// Which row kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Portable,
    /// Blocks of 16 channels.
    Avx2,
    /// Blocks of 32 channels (and a last block of 16 on the AVX2 path).
    Avx512,
}

pub(super) struct DepthwiseNhwc {
    p: ConvProblem,
    epilogue: Epilogue,
    /// `[tap][channel]`: `w - zw`.
    w: Vec<i32>,
    /// Vector kinds only: per block of channels (first the [`WIDE`] blocks, then the
    /// [`BLOCK`] ones) and pair of taps (in the order the row kernels add them, a missing
    /// partner a zero tap), the `vpmaddwd` operands of the block's two sums, lanes in
    /// [`lane`] order: `[block][pair][2][width]` i16.
    pairs: Vec<i16>,
    /// Pairs of taps per block.
    groups: usize,
    /// Blocks of [`WIDE`] channels (AVX-512 only), before those of [`BLOCK`].
    wide: usize,
    x_signed: bool,
    kind: Kind,
}

impl DepthwiseNhwc {
    /// Whether this problem takes the kernel: one input and one output channel per
    /// group, at most two spatial dims.
    pub(super) fn eligible(p: &ConvProblem) -> bool {
        p.group > 1 && p.in_per_group() == 1 && p.out_per_group() == 1 && p.geo.input[0] == 1 && p.geo.kernel[0] == 1 && p.geo.output[0] == 1
    }

    pub(super) fn params() -> Vec<TuneParam> {
        vec![int8_kernel::isa_param_any()]
    }

    pub(super) fn new(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], tune: &TuneValues) -> Result<DepthwiseNhwc> {
        let (taps, c) = (p.geo.kernel_size(), p.out_channels);
        let wv = qlinear::ints(w)?;
        if wv.len() != c * taps || (zw.len() != 1 && zw.len() != c) {
            return Err(OpError::Invalid(format!("depthwise filters of {} values and {} zero points for {c} channels", wv.len(), zw.len())));
        }
        let mut wt = vec![0i32; taps * c];
        for (m, row) in wv.chunks_exact(taps).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                wt[t * c + m] = v - zw[if zw.len() == 1 { 0 } else { m }];
            }
        }
        let kind = match int8_kernel::chosen_any(tune) {
            _ if !cfg!(target_arch = "x86_64") || c % BLOCK != 0 => Kind::Portable,
            Int8Isa::Avx512Vnni => Kind::Avx512,
            Int8Isa::Avx2 => Kind::Avx2,
            Int8Isa::Portable => Kind::Portable,
        };
        let wide = if kind == Kind::Avx512 { c / WIDE } else { 0 };
        let [_, kh, kw] = p.geo.kernel;
        // The order the row kernels read them ([`pair_offsets`]): per column the row
        // pairs, then the last row of an odd height in pairs of neighbouring columns.
        let mut order = vec![];
        for e in 0..kw {
            order.extend((0..kh / 2).map(|r| [(2 * r, e), (2 * r + 1, e)]));
        }
        if kh % 2 == 1 {
            order.extend((0..kw).step_by(2).map(|e| [(kh - 1, e), (kh - 1, e + 1)]));
        }
        let mut pairs = vec![];
        if kind != Kind::Portable {
            // Tap (row a, column e) of channel m, zero past the kernel's width.
            let tap = |a: usize, e: usize, m: usize| if e < kw { wt[(a * kw + e) * c + m] as i16 } else { 0 };
            let blocks = (0..wide).map(|b| (b * WIDE, WIDE)).chain((wide * WIDE..c).step_by(BLOCK).map(|m0| (m0, BLOCK)));
            for (m0, width) in blocks {
                for &[(a0, e0), (a1, e1)] in &order {
                    for q in 0..width {
                        let l = lane(width, q);
                        pairs.extend([tap(a0, e0, m0 + l), tap(a1, e1, m0 + l)]);
                    }
                }
            }
        }
        Ok(DepthwiseNhwc { p, epilogue, w: wt, pairs, groups: order.len(), wide, x_signed: x == DType::I8, kind })
    }

    /// The channel whose multiplier and bias go to lane-ordered position `m` (see
    /// [`lane`]).
    fn lane_of(&self, m: usize) -> usize {
        let split = self.wide * WIDE;
        if m < split {
            m / WIDE * WIDE + lane(WIDE, m % WIDE)
        } else {
            split + (m - split) / BLOCK * BLOCK + lane(BLOCK, (m - split) % BLOCK)
        }
    }

    /// Where the weights of the block starting at channel `m0` begin in `pairs`.
    fn block_pairs(&self, m0: usize) -> usize {
        let split = self.wide * WIDE;
        let per = self.groups * 2;
        if m0 < split {
            m0 / WIDE * per * WIDE
        } else {
            split * per + (m0 - split) / BLOCK * per * BLOCK
        }
    }
}

/// What [`DepthwiseNhwc::row_avx2`] keeps between the rows of a task: the widened
/// input columns, and each filter row's first pixel in x (`None` in the padding).
#[cfg(target_arch = "x86_64")]
struct RowScratch {
    cols: Vec<std::arch::x86_64::__m256i>,
    wide: Vec<std::arch::x86_64::__m512i>,
    rows: Vec<Option<usize>>,
}

/// What the row kernels need of an output row's geometry ([`DepthwiseNhwc::row_shape`]):
/// the kernel's size, input and output widths, stride, dilation and padding along the
/// width, the channels, the filter rows' pairs (and an odd last row), vectors per padded
/// column, and padded columns under the row.
struct RowShape {
    kh: usize,
    kw: usize,
    iw: usize,
    ow: usize,
    sw: usize,
    dw: usize,
    pw: i64,
    c: usize,
    vpairs: usize,
    odd: bool,
    per_col: usize,
    span: usize,
}

/// The epilogue of a run, per channel.
struct Epi<'a> {
    int32: bool,
    mult: &'a [f32],
    bias: &'a [i32],
    /// Vector kinds: the multipliers and biases of each block in [`lane`] order.
    lane_mult: Vec<f32>,
    lane_bias: Vec<i32>,
    lo: f32,
    hi: f32,
    zy: i32,
}

impl Epi<'_> {
    #[inline(always)]
    fn requantize(&self, acc: i32, m: usize) -> i32 {
        ((acc.wrapping_add(self.bias[m]) as f32 * self.mult[m]).round_ties_even().clamp(self.lo, self.hi)) as i32 + self.zy
    }
}

impl CpuKernel for DepthwiseNhwc {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let y = &mut outputs[0];
        let (zx, mult, (lo, hi, zy), bias) = run_params(&self.p, self.epilogue, inputs, x, y)?;
        let vector = self.kind != Kind::Portable;
        let (lane_mult, lane_bias) = if vector && !mult.is_empty() { ((0..mult.len()).map(|m| mult[self.lane_of(m)]).collect(), (0..bias.len()).map(|m| bias[self.lane_of(m)]).collect()) } else { (vec![], vec![]) };
        let epi = Epi { int32: self.epilogue == Epilogue::Int32, mult: &mult, bias: &bias, lane_mult, lane_bias, lo, hi, zy };
        let y_signed = y.dtype() == DType::I8;
        let g = &self.p.geo;
        let (oh, ow) = (g.output[1], g.output[2]);
        let c = self.p.out_channels;
        let xs = x.bytes();
        let out = SharedPtr(y.bytes_mut().as_mut_ptr());
        cpu::par_ranges(self.p.batch * oh, ow * c * g.kernel_size(), |start, end| {
            let mut taps: Vec<Option<usize>> = vec![None; g.kernel_size()];
            let mut acc = vec![0i32; c];
            #[cfg(target_arch = "x86_64")]
            let mut scratch = RowScratch { cols: Vec::new(), wide: Vec::new(), rows: Vec::new() };
            for row in start..end {
                let (b, oy) = (row / oh, row % oh);
                #[cfg(target_arch = "x86_64")]
                if vector && !epi.int32 {
                    // SAFETY: the kind's ISA is available (chosen at plan time), x has the
                    // planned size (run_params), and output row (b, oy) is this task's.
                    unsafe {
                        let dst = out.get().add((b * oh + oy) * ow * c);
                        let split = self.wide * WIDE;
                        if split > 0 {
                            match (g.kernel[1..] == [3, 3], self.x_signed) {
                                (true, false) => self.row_avx512::<3, 3, false>(xs, b, oy, zx, &epi, y_signed, dst, &mut scratch),
                                (true, true) => self.row_avx512::<3, 3, true>(xs, b, oy, zx, &epi, y_signed, dst, &mut scratch),
                                (false, false) => self.row_avx512::<0, 0, false>(xs, b, oy, zx, &epi, y_signed, dst, &mut scratch),
                                (false, true) => self.row_avx512::<0, 0, true>(xs, b, oy, zx, &epi, y_signed, dst, &mut scratch),
                            }
                        }
                        if split < c {
                            match (g.kernel[1..] == [3, 3], self.x_signed) {
                                (true, false) => self.row_avx2::<3, 3, false>(xs, b, oy, zx, &epi, y_signed, dst, split, &mut scratch),
                                (true, true) => self.row_avx2::<3, 3, true>(xs, b, oy, zx, &epi, y_signed, dst, split, &mut scratch),
                                (false, false) => self.row_avx2::<0, 0, false>(xs, b, oy, zx, &epi, y_signed, dst, split, &mut scratch),
                                (false, true) => self.row_avx2::<0, 0, true>(xs, b, oy, zx, &epi, y_signed, dst, split, &mut scratch),
                            }
                        }
                    }
                    continue;
                }
                for ox in 0..ow {
                    self.tap_offsets(b, oy, ox, &mut taps);
                    let at = ((b * oh + oy) * ow + ox) * c;
                    self.pixel(xs, &taps, zx, &mut acc);
                    // SAFETY: output pixel (b, oy, ox) belongs to this task alone; an Int32
                    // epilogue's output is i32, else one byte per value.
                    unsafe {
                        if epi.int32 {
                            let dst = (out.get() as *mut i32).add(at);
                            for (m, &a) in acc.iter().enumerate() {
                                *dst.add(m) = a.wrapping_add(epi.bias[m]);
                            }
                        } else {
                            let dst = out.get().add(at);
                            for (m, &a) in acc.iter().enumerate() {
                                *dst.add(m) = epi.requantize(a, m) as u8;
                            }
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

impl DepthwiseNhwc {
    /// The byte offset into x of each filter tap's input pixel under output pixel
    /// `(b, oy, ox)`, or `None` where the tap falls in the padding.
    fn tap_offsets(&self, b: usize, oy: usize, ox: usize, taps: &mut [Option<usize>]) {
        let g = &self.p.geo;
        let ([_, ih, iw], [_, kh, kw]) = (g.input, g.kernel);
        let c = self.p.in_channels;
        let y0 = (oy * g.stride[1]) as i64 - g.pad_begin[1];
        let x0 = (ox * g.stride[2]) as i64 - g.pad_begin[2];
        for a in 0..kh {
            let yy = y0 + (a * g.dilation[1]) as i64;
            for e in 0..kw {
                let xx = x0 + (e * g.dilation[2]) as i64;
                let inside = (0..ih as i64).contains(&yy) && (0..iw as i64).contains(&xx);
                taps[a * kw + e] = inside.then(|| ((b * ih + yy as usize) * iw + xx as usize) * c);
            }
        }
    }

    /// One output pixel's int32 sums, every channel.
    fn pixel(&self, xs: &[u8], taps: &[Option<usize>], zx: i32, acc: &mut [i32]) {
        let c = acc.len();
        acc.fill(0);
        for (t, off) in taps.iter().enumerate() {
            let Some(off) = *off else { continue };
            let (src, w) = (&xs[off..off + c], &self.w[t * c..(t + 1) * c]);
            if self.x_signed {
                acc.iter_mut().zip(src).zip(w).for_each(|((a, &v), &w)| *a = a.wrapping_add((v as i8 as i32 - zx) * w));
            } else {
                acc.iter_mut().zip(src).zip(w).for_each(|((a, &v), &w)| *a = a.wrapping_add((v as i32 - zx) * w));
            }
        }
    }

    /// The shape of output row `(b, oy)` for the row kernels, with each filter row's
    /// first pixel in x (`None` in the padding) in `rows`. A 3x3 kernel is compiled
    /// with its size known (`KH`, `KW`); 0 takes the geometry's.
    #[inline(always)]
    fn row_shape<const KH: usize, const KW: usize>(&self, b: usize, oy: usize, rows: &mut Vec<Option<usize>>) -> RowShape {
        let g = &self.p.geo;
        let (kh, kw) = if KH > 0 { (KH, KW) } else { (g.kernel[1], g.kernel[2]) };
        let ([_, ih, iw], [_, ow]) = (g.input, [g.output[1], g.output[2]]);
        let (sw, (dh, dw), pw) = (g.stride[2], (g.dilation[1], g.dilation[2]), g.pad_begin[2]);
        let (vpairs, odd) = (kh / 2, kh % 2 == 1);
        let y0 = (oy * g.stride[1]) as i64 - g.pad_begin[1];
        rows.clear();
        rows.extend((0..kh).map(|a| y0 + (a * dh) as i64).map(|yy| (0..ih as i64).contains(&yy).then(|| (b * ih + yy as usize) * iw)));
        RowShape { kh, kw, iw, ow, sw, dw, pw, c: self.p.out_channels, vpairs, odd, per_col: 2 * (vpairs + odd as usize), span: (ow - 1) * sw + (kw - 1) * dw + 1 }
    }

    /// One output row, requantized, 16 channels at a time with AVX2, channels `first..`
    /// (the rest of [`Self::row_avx512`]'s). Per block of channels the input columns under the row are widened once into `cols`: per
    /// padded column `u` (input column `u - pad`), the filter rows in pairs `(2r, 2r +
    /// 1)` interleaved, and with an odd kernel height the last row interleaved with
    /// itself `dilation` columns on, so that each output pixel adds its taps with
    /// `kw * (kh / 2) + kw.div_ceil(2) * (kh % 2)` pairs of `vpmaddwd` reading columns
    /// its neighbours share.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx2<const KH: usize, const KW: usize, const SIGNED: bool>(&self, xs: &[u8], b: usize, oy: usize, zx: i32, epi: &Epi, y_signed: bool, dst: *mut u8, first: usize, scratch: &mut RowScratch) {
        use std::arch::x86_64::*;
        let RowScratch { cols, rows, .. } = scratch;
        let RowShape { kh, kw, iw, ow, sw, dw, pw, c, vpairs, odd, per_col, span } = self.row_shape::<KH, KW>(b, oy, rows);
        cols.resize(span * per_col, _mm256_setzero_si256());
        let zxv = _mm256_set1_epi16(zx as i16);
        let load = |row: Option<usize>, xx: i64, m0: usize| -> __m256i {
            match row {
                // SAFETY: pixel (row, xx) lies in x, and its channels m0..m0 + 16 too.
                Some(r) if (0..iw as i64).contains(&xx) => unsafe {
                    let raw = _mm_loadu_si128(xs.as_ptr().add((r + xx as usize) * c + m0) as *const __m128i);
                    let wide = if SIGNED { _mm256_cvtepi8_epi16(raw) } else { _mm256_cvtepu8_epi16(raw) };
                    _mm256_sub_epi16(wide, zxv)
                },
                _ => _mm256_setzero_si256(),
            }
        };
        let (hi, zy) = (_mm256_set1_ps(epi.hi), _mm256_set1_epi16(epi.zy as i16));
        for m0 in (first..c).step_by(BLOCK) {
            for (u, col) in cols.chunks_exact_mut(per_col).enumerate() {
                let xx = u as i64 - pw;
                for r in 0..vpairs {
                    let (x0, x1) = (load(rows[2 * r], xx, m0), load(rows[2 * r + 1], xx, m0));
                    col[2 * r] = _mm256_unpacklo_epi16(x0, x1);
                    col[2 * r + 1] = _mm256_unpackhi_epi16(x0, x1);
                }
                if odd {
                    let (x0, x1) = (load(rows[kh - 1], xx, m0), load(rows[kh - 1], xx + dw as i64, m0));
                    col[2 * vpairs] = _mm256_unpacklo_epi16(x0, x1);
                    col[2 * vpairs + 1] = _mm256_unpackhi_epi16(x0, x1);
                }
            }
            let w = self.pairs.as_ptr().add(self.block_pairs(m0)) as *const __m256i;
            let bias = (_mm256_loadu_si256(epi.lane_bias.as_ptr().add(m0) as *const __m256i), _mm256_loadu_si256(epi.lane_bias.as_ptr().add(m0 + 8) as *const __m256i));
            let mult = (_mm256_loadu_ps(epi.lane_mult.as_ptr().add(m0)), _mm256_loadu_ps(epi.lane_mult.as_ptr().add(m0 + 8)));
            for ox in 0..ow {
                let (mut acc_a, mut acc_b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                let mut wi = 0;
                let mut add = |v: *const __m256i| {
                    // SAFETY: v points at a column's pair of vectors; wi counts the
                    // block's pair groups.
                    unsafe {
                        acc_a = _mm256_add_epi32(acc_a, _mm256_madd_epi16(*v, _mm256_loadu_si256(w.add(2 * wi))));
                        acc_b = _mm256_add_epi32(acc_b, _mm256_madd_epi16(*v.add(1), _mm256_loadu_si256(w.add(2 * wi + 1))));
                    }
                    wi += 1;
                };
                let base = cols.as_ptr().add(ox * sw * per_col);
                pair_offsets(kw, dw, vpairs, odd, per_col, |o| add(base.add(o)));
                // acc_a holds channels [0..4, 8..12] of the block, acc_b [4..8, 12..16]: the
                // lane-ordered multipliers and biases line up with them.
                // The product capped at hi, rounded half to even; the saturating packs
                // clamp from below (as in `int8_kernel::requantize_rows_avx2`).
                let requant = |acc: __m256i, b: __m256i, m: __m256| -> __m256i { _mm256_cvtps_epi32(_mm256_min_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(acc, b)), m), hi)) };
                // packs_epi32 per 128-bit lane puts [0..4, 4..8 | 8..12, 12..16] back in order.
                let words = _mm256_adds_epi16(_mm256_packs_epi32(requant(acc_a, bias.0, mult.0), requant(acc_b, bias.1, mult.1)), zy);
                let bytes = if y_signed { _mm256_packs_epi16(words, words) } else { _mm256_packus_epi16(words, words) };
                let ordered = _mm256_permute4x64_epi64(bytes, 0b1000);
                _mm_storeu_si128(dst.add(ox * c + m0) as *mut __m128i, _mm256_castsi256_si128(ordered));
            }
        }
    }

    /// [`Self::row_avx2`] for the first `wide` blocks of 32 channels, with 512-bit
    /// registers and VNNI's `vpdpwssd`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_avx512<const KH: usize, const KW: usize, const SIGNED: bool>(&self, xs: &[u8], b: usize, oy: usize, zx: i32, epi: &Epi, y_signed: bool, dst: *mut u8, scratch: &mut RowScratch) {
        use std::arch::x86_64::*;
        let RowScratch { wide: cols, rows, .. } = scratch;
        let RowShape { kh, kw, iw, ow, sw, dw, pw, c, vpairs, odd, per_col, span } = self.row_shape::<KH, KW>(b, oy, rows);
        cols.resize(span * per_col, _mm512_setzero_si512());
        let zxv = _mm512_set1_epi16(zx as i16);
        let load = |row: Option<usize>, xx: i64, m0: usize| -> __m512i {
            match row {
                // SAFETY: pixel (row, xx) lies in x, and its channels m0..m0 + 32 too.
                Some(r) if (0..iw as i64).contains(&xx) => unsafe {
                    let raw = _mm256_loadu_si256(xs.as_ptr().add((r + xx as usize) * c + m0) as *const __m256i);
                    let wide = if SIGNED { _mm512_cvtepi8_epi16(raw) } else { _mm512_cvtepu8_epi16(raw) };
                    _mm512_sub_epi16(wide, zxv)
                },
                _ => _mm512_setzero_si512(),
            }
        };
        let hi = _mm512_set1_ps(epi.hi);
        let zy = _mm512_set1_epi16(epi.zy as i16);
        let (lo8, hi8) = if y_signed { (_mm512_set1_epi16(-128), _mm512_set1_epi16(127)) } else { (_mm512_setzero_si512(), _mm512_set1_epi16(255)) };
        for blk in 0..self.wide {
            let m0 = blk * WIDE;
            for (u, col) in cols.chunks_exact_mut(per_col).enumerate() {
                let xx = u as i64 - pw;
                for r in 0..vpairs {
                    let (x0, x1) = (load(rows[2 * r], xx, m0), load(rows[2 * r + 1], xx, m0));
                    col[2 * r] = _mm512_unpacklo_epi16(x0, x1);
                    col[2 * r + 1] = _mm512_unpackhi_epi16(x0, x1);
                }
                if odd {
                    let (x0, x1) = (load(rows[kh - 1], xx, m0), load(rows[kh - 1], xx + dw as i64, m0));
                    col[2 * vpairs] = _mm512_unpacklo_epi16(x0, x1);
                    col[2 * vpairs + 1] = _mm512_unpackhi_epi16(x0, x1);
                }
            }
            let w = self.pairs.as_ptr().add(self.block_pairs(m0)) as *const __m512i;
            // The block's weights held in registers across the row (a 3x3 kernel's ten;
            // larger kernels read the rest from memory).
            let mut held = [_mm512_setzero_si512(); HELD];
            for (i, h) in held.iter_mut().enumerate().take(2 * self.groups) {
                *h = _mm512_loadu_si512(w.add(i) as *const _);
            }
            let weight = |i: usize| if i < HELD { held[i] } else { _mm512_loadu_si512(w.add(i) as *const _) };
            let ld = |v: &[i32]| _mm512_loadu_si512(v.as_ptr() as *const _);
            let bias = (ld(&epi.lane_bias[m0..]), ld(&epi.lane_bias[m0 + 16..]));
            let mult = (_mm512_loadu_ps(epi.lane_mult.as_ptr().add(m0)), _mm512_loadu_ps(epi.lane_mult.as_ptr().add(m0 + 16)));
            for ox in 0..ow {
                let (mut acc_a, mut acc_b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                let mut wi = 0;
                let mut add = |v: *const __m512i| {
                    // SAFETY: v points at a column's pair of vectors; wi counts the
                    // block's pair groups.
                    unsafe {
                        acc_a = _mm512_dpwssd_epi32(acc_a, *v, weight(2 * wi));
                        acc_b = _mm512_dpwssd_epi32(acc_b, *v.add(1), weight(2 * wi + 1));
                    }
                    wi += 1;
                };
                let base = cols.as_ptr().add(ox * sw * per_col);
                pair_offsets(kw, dw, vpairs, odd, per_col, |o| add(base.add(o)));
                // As in row_avx2: capped at hi and rounded half to even, the saturating
                // pack and the 8-bit clamp below; packs_epi32 per 128-bit lane restores
                // the channels' order.
                let requant = |acc: __m512i, b: __m512i, m: __m512| -> __m512i { _mm512_cvtps_epi32(_mm512_min_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, b)), m), hi)) };
                let words = _mm512_adds_epi16(_mm512_packs_epi32(requant(acc_a, bias.0, mult.0), requant(acc_b, bias.1, mult.1)), zy);
                let clamped = _mm512_min_epi16(_mm512_max_epi16(words, lo8), hi8);
                _mm256_storeu_si256(dst.add(ox * c + m0) as *mut __m256i, _mm512_cvtepi16_epi8(clamped));
            }
        }
    }
}
