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

thread_local! {
    /// Per thread: the padded plane, and one output row of sums (portable) or the
    /// plane's interleaved row pairs (AVX2).
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
    /// One input channel with AVX2: the padded plane's rows `r` and `r + dy` are
    /// interleaved into i16 pairs (`words`), so that filter rows `2k` and `2k + 1` of a
    /// column take one `vpmaddwd` per 8 output pixels against their two weights; the 8
    /// sums stay in a register over all taps, then are requantized 8 at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn channel_avx2(&self, s: &Shape, src: &[u8], zx: i32, b: usize, ms: std::ops::Range<usize>, epi: &Epi, padded: &mut [i32], words: &mut [i32], out: SharedPtr<u8>) {
        use std::arch::x86_64::*;
        let pw = s.pw;
        self.pad_plane(s, src, zx, padded);
        for r in 0..s.rows {
            let (lo, hi) = (&padded[r * pw..][..pw], padded.get((r + s.dy) * pw..(r + s.dy + 1) * pw));
            for (c, w) in words[r * pw..][..pw].iter_mut().enumerate() {
                *w = ((lo[c] as u16 as u32) | ((hi.map_or(0, |h| h[c]) as u16 as u32) << 16)) as i32;
            }
        }
        let plane = s.oh * s.ow;
        let tap_cols = Self::tap_cols(s);
        let pairs = s.kh.div_ceil(2);
        let mut wpairs = vec![0i32; pairs * s.kw];
        let (round, bias_bits) = (_mm256_set1_ps(ROUND), _mm256_set1_epi32(epi.zy.wrapping_sub(ROUND.to_bits() as i32)));
        let (lo_v, hi_v) = (_mm256_set1_ps(epi.lo), _mm256_set1_ps(epi.hi));
        for m in ms {
            let wm = &self.w[m * s.kh * s.kw..(m + 1) * s.kh * s.kw];
            for (i, wp) in wpairs.iter_mut().enumerate() {
                let (k, kx) = (i / s.kw, i % s.kw);
                let second = if 2 * k + 1 < s.kh { wm[(2 * k + 1) * s.kw + kx] } else { 0 };
                *wp = ((wm[2 * k * s.kw + kx] as u16 as u32) | ((second as u16 as u32) << 16)) as i32;
            }
            let at = (b * self.p.out_channels + m) * plane;
            let k_mult = _mm256_set1_ps(epi.mult.get(m).copied().unwrap_or(0.0));
            for oy in 0..s.oh {
                let mut j = 0;
                while j < s.ow {
                    let n = (s.ow - j).min(8);
                    let mut a = _mm256_set1_epi32(epi.bias[m]);
                    for k in 0..pairs {
                        let row = &words[(oy * s.sy + 2 * k * s.dy) * pw..];
                        for (kx, &start) in tap_cols.iter().enumerate() {
                            let run = &row[start + j..][..n];
                            let v = if n == 8 {
                                _mm256_loadu_si256(run.as_ptr() as *const __m256i)
                            } else {
                                let mut tail = [0i32; 8];
                                tail[..n].copy_from_slice(run);
                                _mm256_loadu_si256(tail.as_ptr() as *const __m256i)
                            };
                            a = _mm256_add_epi32(a, _mm256_madd_epi16(v, _mm256_set1_epi32(wpairs[k * s.kw + kx])));
                        }
                    }
                    let mut sums = [0i32; 8];
                    if epi.int32 {
                        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, a);
                        let dst = std::slice::from_raw_parts_mut((out.get() as *mut i32).add(at + oy * s.ow + j), n);
                        dst.copy_from_slice(&sums[..n]);
                    } else {
                        let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), k_mult), lo_v), hi_v);
                        // The low mantissa bits of v + 1.5 * 2^23 are v rounded half to even.
                        let q = _mm256_add_epi32(_mm256_castps_si256(_mm256_add_ps(v, round)), bias_bits);
                        _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, q);
                        let dst = std::slice::from_raw_parts_mut(out.get().add(at + oy * s.ow + j), n);
                        for (d, &q) in dst.iter_mut().zip(&sums) {
                            *d = q as u8;
                        }
                    }
                    j += n;
                }
            }
        }
    }

    /// One input channel's plane as `x - zx`, zero-padded and split into stride phases.
    fn pad_plane(&self, s: &Shape, src: &[u8], zx: i32, padded: &mut [i32]) {
        let (pw, phase_w) = (s.pw, s.pw / s.sx);
        padded.fill(0);
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
                let dst = &mut row[phase * phase_w + col / s.sx..];
                let vals = line[first..x1].iter().step_by(s.sx);
                if self.x_signed {
                    dst.iter_mut().zip(vals).for_each(|(d, &v)| *d = v as i8 as i32 - zx);
                } else {
                    dst.iter_mut().zip(vals).for_each(|(d, &v)| *d = v as i32 - zx);
                }
            }
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
        self.pad_plane(s, src, zx, padded);
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
            padded.resize(plane, 0);
            acc.resize(if self.avx2 { plane } else { shape.ow }, 0);
            let (padded, acc) = (&mut padded[..plane], &mut acc[..if self.avx2 { plane } else { shape.ow }]);
            for bg in start..end {
                let (b, c) = (bg / p.group, bg % p.group);
                let src = &x.bytes()[(b * p.in_channels + c) * plane_in..][..plane_in];
                let ms = c * mg..(c + 1) * mg;
                #[cfg(target_arch = "x86_64")]
                if self.avx2 {
                    // SAFETY: the tuning chose AVX2 among the available instruction sets.
                    unsafe { self.channel_avx2(&shape, src, zx, b, ms, &epi, padded, acc, out) };
                    continue;
                }
                self.channel(&shape, src, zx, b, ms, &epi, padded, acc, out);
            }
            })
        });
        Ok(())
    }
}
