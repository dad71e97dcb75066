//! The fast CPU depthwise integer convolution of QLinearConv and ConvInteger (one input
//! channel per group, any channel multiplier): per output channel, the input plane is
//! widened once into a zero-padded i32 plane of `x - zx` (so padding reads 0), and each
//! filter tap adds `(w - zw) * x` along whole output rows, a loop the compiler
//! vectorises. Sums are exact in int32; the epilogue is the packed kernel's
//! ([`super::qconv_packed::run_params`]): ConvInteger stores the sums, QLinearConv
//! requantizes `(acc + B) * (sx * sw[m] / sy)` in f32, rounded half to even.
use super::conv_cpu::ConvProblem;
use super::qconv_packed::{run_params, Epilogue};
use crate::cpu::{self, CpuKernel, SharedPtr};
use crate::linalg::int8_kernel::{self, Int8Isa};
use crate::quant::qlinear;
use crate::{OpError, Result, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

/// Constant depthwise filters, shifted by their zero points.
pub(super) struct DepthwiseIntConv {
    p: ConvProblem,
    epilogue: Epilogue,
    /// `[out_channels][kh * kw]`: `w - zw`.
    w: Vec<i32>,
    x_signed: bool,
    /// The AVX2 kernel ([`Self::channel_avx2`]), else the portable one.
    avx2: bool,
}

/// 1.5 * 2^23: the f32 `v + ROUND` of an f32 `|v| <= 2^22` holds `v` rounded half to
/// even in its low mantissa bits.
const ROUND: f32 = 12582912.0;

/// i32 lanes of one AVX2 register: the interleaved plane carries this many words of
/// slack, so that a row's last run loads whole registers.
const LANES: usize = 8;

thread_local! {
    /// Per thread: the padded plane (i32, or i16 in its bytes for AVX2), and one
    /// output row of sums (portable) or the plane's interleaved row pairs (AVX2).
    static SCRATCH: std::cell::RefCell<(Vec<i32>, Vec<i32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl DepthwiseIntConv {
    /// Whether this problem takes the depthwise path: one input channel per group,
    /// at most two spatial dims.
    pub(super) fn eligible(p: &ConvProblem) -> bool {
        p.in_per_group() == 1 && p.group > 1 && p.geo.input[0] == 1 && p.geo.kernel[0] == 1 && p.geo.output[0] == 1
    }

    /// The instruction-set choice: AVX2 where the CPU has it, and the portable kernel.
    pub(super) fn params() -> Vec<TuneParam> {
        vec![int8_kernel::isa_param(false)]
    }

    pub(super) fn new(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], tune: &TuneValues) -> Result<DepthwiseIntConv> {
        let taps = p.geo.kernel_size();
        let wv = qlinear::ints(w)?;
        if wv.len() != p.out_channels * taps || (zw.len() != 1 && zw.len() != p.out_channels) {
            return Err(OpError::Invalid(format!("depthwise filters of {} values and {} zero points for {} output channels", wv.len(), zw.len(), p.out_channels)));
        }
        let w = wv.iter().enumerate().map(|(i, &v)| v - zw[if zw.len() == 1 { 0 } else { i / taps }]).collect();
        let avx2 = cfg!(target_arch = "x86_64") && int8_kernel::chosen(tune, false).0 == Int8Isa::Avx2;
        Ok(DepthwiseIntConv { p, epilogue, w, x_signed: x == DType::I8, avx2 })
    }
}

/// The plane geometry of a run.
struct Shape {
    ih: usize,
    iw: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sy: usize,
    sx: usize,
    dy: usize,
    dx: usize,
    /// Where input pixel (0, 0) lands in the padded plane (negative pads crop).
    top: i64,
    left: i64,
    /// Rows of the padded plane, and its width per phase: column `col` of the padded
    /// plane sits in phase `col % sx` at `col / sx`, so that a tap reads one
    /// contiguous run of each row whatever the stride.
    rows: usize,
    pw: usize,
}

impl Shape {
    fn of(p: &ConvProblem) -> Shape {
        let g = &p.geo;
        let ([_, ih, iw], [_, oh, ow], [_, kh, kw]) = (g.input, g.output, g.kernel);
        let (sy, sx, dy, dx) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
        let rows = ((oh - 1) * sy + (kh - 1) * dy + 1).max(1);
        let width = (ow - 1) * sx + (kw - 1) * dx + 1;
        Shape { ih, iw, oh, ow, kh, kw, sy, sx, dy, dx, top: g.pad_begin[1], left: g.pad_begin[2], rows, pw: width.div_ceil(sx) * sx }
    }
}

/// The epilogue of a run.
struct Epi<'a> {
    int32: bool,
    mult: &'a [f32],
    bias: &'a [i32],
    lo: f32,
    hi: f32,
    zy: i32,
}

impl DepthwiseIntConv {
    /// One input channel with AVX2: the plane is padded as i16, and its rows `r` and
    /// `r + dy` are interleaved into i16 pairs (`words`), so that filter rows `2k` and
    /// `2k + 1` of a column take one `vpmaddwd` per 8 output pixels against their two
    /// weights; the 8 sums stay in a register over all taps, then are requantized 8 at
    /// a time. `padded` and `words` carry [`LANES`] elements of slack past the plane.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn channel_avx2(&self, s: &Shape, src: &[u8], zx: i32, b: usize, ms: std::ops::Range<usize>, epi: &Epi, padded: &mut [i16], words: &mut [i32], out: SharedPtr<u8>) {
        use std::arch::x86_64::*;
        let pw = s.pw;
        let plane_len = s.rows * pw;
        assert!(padded.len() >= plane_len + LANES && words.len() >= plane_len + LANES);
        let signed = self.x_signed;
        // SAFETY: this function runs only where the CPU has AVX2.
        Self::pad_plane(s, src, &mut padded[..plane_len], |vals, step, dst| unsafe { Self::put_avx2(signed, zx as i16, vals, step, dst) });
        padded[plane_len..].fill(0);
        // Row r's pairs; a row's last register may spill into the next row's first
        // words, which that row overwrites next (rows go in order), or into the slack.
        for r in 0..s.rows {
            let lo = padded.as_ptr().add(r * pw);
            let hi = (r + s.dy < s.rows).then(|| padded.as_ptr().add((r + s.dy) * pw));
            let dst = words.as_mut_ptr().add(r * pw);
            for c in (0..pw).step_by(LANES) {
                let l = _mm_loadu_si128(lo.add(c) as *const __m128i);
                let h = hi.map_or(_mm_setzero_si128(), |h| _mm_loadu_si128(h.add(c) as *const __m128i));
                _mm_storeu_si128(dst.add(c) as *mut __m128i, _mm_unpacklo_epi16(l, h));
                _mm_storeu_si128(dst.add(c + 4) as *mut __m128i, _mm_unpackhi_epi16(l, h));
            }
        }
        let plane = s.oh * s.ow;
        let tap_cols = Self::tap_cols(s);
        let pairs = s.kh.div_ceil(2);
        // The last register any tap loads ends within the plane's slack.
        let last_row = ((s.oh - 1) * s.sy + 2 * (pairs - 1) * s.dy) * pw;
        let last_col = tap_cols.iter().max().copied().unwrap_or(0) + (s.ow - 1) / LANES * LANES + LANES;
        assert!(last_row + last_col <= words.len());
        let mut wpairs = vec![_mm256_setzero_si256(); pairs * s.kw];
        let (round, bias_bits) = (_mm256_set1_ps(ROUND), _mm256_set1_epi32(epi.zy.wrapping_sub(ROUND.to_bits() as i32)));
        let (lo_v, hi_v) = (_mm256_set1_ps(epi.lo), _mm256_set1_ps(epi.hi));
        // The low byte of each i16.
        let low_bytes = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
        let base = words.as_ptr();
        for m in ms {
            let wm = &self.w[m * s.kh * s.kw..(m + 1) * s.kh * s.kw];
            for (i, wp) in wpairs.iter_mut().enumerate() {
                let (k, kx) = (i / s.kw, i % s.kw);
                let second = if 2 * k + 1 < s.kh { wm[(2 * k + 1) * s.kw + kx] } else { 0 };
                *wp = _mm256_set1_epi32(((wm[2 * k * s.kw + kx] as u16 as u32) | ((second as u16 as u32) << 16)) as i32);
            }
            let at = (b * self.p.out_channels + m) * plane;
            let k_mult = _mm256_set1_ps(epi.mult.get(m).copied().unwrap_or(0.0));
            let bias = _mm256_set1_epi32(epi.bias[m]);
            let w3x3: Option<[__m256i; 6]> = (s.kh == 3 && s.kw == 3).then(|| std::array::from_fn(|i| wpairs[i]));
            for oy in 0..s.oh {
                let mut j = 0;
                while j < s.ow {
                    let n = (s.ow - j).min(LANES);
                    let mut a = bias;
                    if let Some([w0, w1, w2, w3, w4, w5]) = w3x3 {
                        // 3x3: both row pairs and the three columns unrolled, the
                        // weights in registers.
                        let r0 = base.add((oy * s.sy) * pw + j);
                        let r1 = r0.add(2 * s.dy * pw);
                        macro_rules! ld {
                            ($p:expr, $t:expr) => {
                                _mm256_loadu_si256($p.add($t) as *const __m256i)
                            };
                        }
                        let (t0, t1, t2) = (tap_cols[0], tap_cols[1], tap_cols[2]);
                        let s0 = _mm256_add_epi32(_mm256_madd_epi16(ld!(r0, t0), w0), _mm256_madd_epi16(ld!(r0, t1), w1));
                        let s1 = _mm256_add_epi32(_mm256_madd_epi16(ld!(r0, t2), w2), _mm256_madd_epi16(ld!(r1, t0), w3));
                        let s2 = _mm256_add_epi32(_mm256_madd_epi16(ld!(r1, t1), w4), _mm256_madd_epi16(ld!(r1, t2), w5));
                        a = _mm256_add_epi32(a, _mm256_add_epi32(s0, _mm256_add_epi32(s1, s2)));
                    } else {
                        for k in 0..pairs {
                            let row = base.add((oy * s.sy + 2 * k * s.dy) * pw + j);
                            for (kx, &start) in tap_cols.iter().enumerate() {
                                let v = _mm256_loadu_si256(row.add(start) as *const __m256i);
                                a = _mm256_add_epi32(a, _mm256_madd_epi16(v, wpairs[k * s.kw + kx]));
                            }
                        }
                    }
                    if epi.int32 {
                        let dst = (out.get() as *mut i32).add(at + oy * s.ow + j);
                        if n == LANES {
                            _mm256_storeu_si256(dst as *mut __m256i, a);
                        } else {
                            let mut sums = [0i32; LANES];
                            _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, a);
                            std::ptr::copy_nonoverlapping(sums.as_ptr(), dst, n);
                        }
                    } else {
                        let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), k_mult), lo_v), hi_v);
                        // The low mantissa bits of v + 1.5 * 2^23 are v rounded half to even.
                        let q = _mm256_add_epi32(_mm256_castps_si256(_mm256_add_ps(v, round)), bias_bits);
                        // Clamped to the output type's range, so i16 holds each exactly;
                        // its low byte is the u8 or i8 bits.
                        let q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                        let bytes = _mm_shuffle_epi8(q16, low_bytes);
                        let dst = out.get().add(at + oy * s.ow + j);
                        if n == LANES {
                            _mm_storel_epi64(dst as *mut __m128i, bytes);
                        } else {
                            let mut tail = [0u8; 16];
                            _mm_storeu_si128(tail.as_mut_ptr() as *mut __m128i, bytes);
                            std::ptr::copy_nonoverlapping(tail.as_ptr(), dst, n);
                        }
                    }
                    j += n;
                }
            }
        }
    }

    /// One input channel's plane as `x - zx`, zero-padded and split into stride phases.
    /// `put(vals, step, dst)` writes every `step`-th value of `vals`, less `zx`, to
    /// `dst` (as many as both allow).
    fn pad_plane<T: Copy + Default>(s: &Shape, src: &[u8], padded: &mut [T], put: impl Fn(&[u8], usize, &mut [T])) {
        let (pw, phase_w) = (s.pw, s.pw / s.sx);
        padded.fill(T::default());
        for yy in 0..s.ih {
            let r = yy as i64 + s.top;
            if r < 0 || r >= s.rows as i64 {
                continue;
            }
            let row = &mut padded[r as usize * pw..(r as usize + 1) * pw];
            let line = &src[yy * s.iw..(yy + 1) * s.iw];
            // Input columns that land in the plane: left + xx in [0, pw).
            let x0 = (-s.left).max(0) as usize;
            let x1 = ((pw as i64 - s.left).max(0) as usize).min(s.iw);
            for phase in 0..s.sx {
                // The first xx >= x0 whose column is in this phase, then every sx-th.
                let first = x0 + ((phase as i64 - (x0 as i64 + s.left)).rem_euclid(s.sx as i64)) as usize;
                if first >= x1 {
                    continue;
                }
                let col = (first as i64 + s.left) as usize;
                put(&line[first..x1], s.sx, &mut row[phase * phase_w + col / s.sx..]);
            }
        }
    }

    /// [`Self::pad_plane`]'s `put` in plain Rust.
    fn put_scalar<T: From<i16>>(&self, zx: i16) -> impl Fn(&[u8], usize, &mut [T]) {
        let signed = self.x_signed;
        move |vals, step, dst| {
            let vals = vals.iter().step_by(step);
            if signed {
                dst.iter_mut().zip(vals).for_each(|(d, &v)| *d = T::from(v as i8 as i16 - zx));
            } else {
                dst.iter_mut().zip(vals).for_each(|(d, &v)| *d = T::from(v as i16 - zx));
            }
        }
    }

    /// [`Self::pad_plane`]'s `put` into i16 with AVX2: 16 values per step for strides 1
    /// and 2 (the even bytes of 32), the rest in plain Rust.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn put_avx2(signed: bool, zx: i16, vals: &[u8], step: usize, dst: &mut [i16]) {
        use std::arch::x86_64::*;
        let count = vals.len().div_ceil(step).min(dst.len());
        let mut i = 0;
        if step <= 2 {
            let (z, evens) = (_mm256_set1_epi16(zx), _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1));
            // 16 outputs read inputs i * step .. (i + 16) * step.
            while i + 16 <= count && (i + 16) * step <= vals.len() {
                let p = vals.as_ptr().add(i * step);
                let bytes = if step == 1 {
                    _mm_loadu_si128(p as *const __m128i)
                } else {
                    let (a, b) = (_mm_loadu_si128(p as *const __m128i), _mm_loadu_si128(p.add(16) as *const __m128i));
                    _mm_unpacklo_epi64(_mm_shuffle_epi8(a, evens), _mm_shuffle_epi8(b, evens))
                };
                let wide = if signed { _mm256_cvtepi8_epi16(bytes) } else { _mm256_cvtepu8_epi16(bytes) };
                _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, _mm256_sub_epi16(wide, z));
                i += 16;
            }
        }
        for (d, &v) in dst[i..count].iter_mut().zip(vals[i * step..].iter().step_by(step)) {
            *d = if signed { v as i8 as i16 } else { v as i16 } - zx;
        }
    }

    /// Where filter column kx's run starts in a padded row.
    fn tap_cols(s: &Shape) -> Vec<usize> {
        let phase_w = s.pw / s.sx;
        (0..s.kw).map(|kx| ((kx * s.dx) % s.sx) * phase_w + kx * s.dx / s.sx).collect()
    }

    /// One input channel, portable: its plane padded, then each output channel `ms`
    /// row by row, one tap at a time over the row.
    #[allow(clippy::too_many_arguments)]
    fn channel(&self, s: &Shape, src: &[u8], zx: i32, b: usize, ms: std::ops::Range<usize>, epi: &Epi, padded: &mut [i32], acc: &mut [i32], out: SharedPtr<u8>) {
        let pw = s.pw;
        Self::pad_plane(s, src, padded, self.put_scalar(zx as i16));
        let plane = s.oh * s.ow;
        let tap_cols = Self::tap_cols(s);
        for m in ms {
            let wm = &self.w[m * s.kh * s.kw..(m + 1) * s.kh * s.kw];
            let at = (b * self.p.out_channels + m) * plane;
            for oy in 0..s.oh {
                acc.fill(epi.bias[m]);
                for ky in 0..s.kh {
                    let row = &padded[(oy * s.sy + ky * s.dy) * pw..];
                    for (kx, &start) in tap_cols.iter().enumerate() {
                        let run = &row[start..][..s.ow];
                        let wv = wm[ky * s.kw + kx];
                        for (a, &v) in acc.iter_mut().zip(run) {
                            *a = a.wrapping_add(wv.wrapping_mul(v));
                        }
                    }
                }
                // SAFETY: row oy of output channel m of image b belongs to this task.
                unsafe {
                    if epi.int32 {
                        std::slice::from_raw_parts_mut((out.get() as *mut i32).add(at + oy * s.ow), s.ow).copy_from_slice(acc);
                    } else {
                        let dst = std::slice::from_raw_parts_mut(out.get().add(at + oy * s.ow), s.ow);
                        let k = epi.mult[m];
                        let bias = epi.zy.wrapping_sub(ROUND.to_bits() as i32);
                        for (d, &a) in dst.iter_mut().zip(acc.iter()) {
                            let v = (a as f32 * k).max(epi.lo).min(epi.hi);
                            *d = ((v + ROUND).to_bits() as i32).wrapping_add(bias) as u8;
                        }
                    }
                }
            }
        }
    }
}

impl CpuKernel for DepthwiseIntConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let p = &self.p;
        let y = &mut outputs[0];
        let (zx, mult, (lo, hi, zy), bias) = run_params(p, self.epilogue, inputs, x, y)?;
        let shape = Shape::of(p);
        let mg = p.out_per_group();
        let plane_in = shape.ih * shape.iw;
        let out = SharedPtr(y.bytes_mut().as_mut_ptr());
        let epi = Epi { int32: self.epilogue == Epilogue::Int32, mult: &mult, bias: &bias, lo, hi, zy };
        cpu::par_ranges(p.batch * p.group, shape.rows * shape.pw + shape.oh * shape.ow * shape.kh * shape.kw * mg, |start, end| {
            SCRATCH.with(|cell| {
            let (padded, acc) = &mut *cell.borrow_mut();
            let plane = shape.rows * shape.pw;
            padded.resize(plane + LANES, 0);
            let acc_len = if self.avx2 { plane + LANES } else { shape.ow };
            acc.resize(acc_len, 0);
            let acc = &mut acc[..acc_len];
            for bg in start..end {
                let (b, c) = (bg / p.group, bg % p.group);
                let src = &x.bytes()[(b * p.in_channels + c) * plane_in..][..plane_in];
                let ms = c * mg..(c + 1) * mg;
                #[cfg(target_arch = "x86_64")]
                if self.avx2 {
                    // SAFETY: the tuning chose AVX2 among the available instruction sets.
                    // The i16 plane lives in the first half of the i32 one's bytes.
                    let padded16: &mut [i16] = bytemuck::cast_slice_mut(&mut padded[..]);
                    unsafe { self.channel_avx2(&shape, src, zx, b, ms, &epi, &mut padded16[..plane + LANES], acc, out) };
                    continue;
                }
                self.channel(&shape, src, zx, b, ms, &epi, &mut padded[..plane], acc, out);
            }
            })
        });
        Ok(())
    }
}
