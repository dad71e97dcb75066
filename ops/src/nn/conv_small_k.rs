//! Direct kernel for convolutions with a short reduction (pointwise convolutions with
//! few input channels, im2col tiles of small stems):
//! `y[m, p] = act(b[m] + sum_k w[m, k] * x[k, p])`, or with `accumulate`
//! `y[m, p] = act(y[m, p] + b[m] + sum_k ...)` (a fused residual already in `y`).
//!
//! The GEMM is register-blocked over 6 output channels x 16 pixels (AVX2 + FMA,
//! runtime-detected), so each output is written exactly once with the bias folded into
//! the accumulators and a clamp activation (Relu, Clip) applied in registers; other
//! activations run over each finished block while it is still in L1. Pixels are
//! processed in tiles whose `k x tile` input block fits in L1, reused by every channel
//! block. Without AVX2 a plain row-axpy loop (auto-vectorised) computes the same.
use crate::elementwise::UnaryKind;

/// Longest reduction this kernel is used for (beyond it the packed GEMM wins).
pub(crate) const MAX_REDUCTION: usize = 32;

/// Output channels per register block.
const MR: usize = 6;

/// One small-reduction product: weights `w` ([m, k] row-major), optional bias, and the
/// fused activation; with `accumulate` the output's previous values (a fused residual)
/// are added before the activation.
pub(crate) struct SmallK<'a> {
    pub w: &'a [f32],
    pub k: usize,
    pub bias: Option<&'a [f32]>,
    pub act: Option<UnaryKind>,
    pub accumulate: bool,
}

/// The activation as a clamp `[lo, hi]` when it is one (applied in registers).
pub(crate) fn as_clamp(act: Option<UnaryKind>) -> Option<(f32, f32)> {
    match act {
        Some(UnaryKind::Relu) => Some((0.0, f32::INFINITY)),
        Some(UnaryKind::Clip { min, max }) => Some((min, max)),
        _ => None,
    }
}

impl SmallK<'_> {
    fn rows(&self) -> usize {
        self.w.len() / self.k.max(1)
    }

    /// Computes every output row for pixels `[0, cols)`.
    ///
    /// # Safety
    /// `x` must address `k` rows of `cols` floats, `x_rs` apart; `y` must address
    /// `rows` rows of `cols` writable (and, with `accumulate`, initialised) floats,
    /// `y_rs` apart, not overlapping `x`, and nothing else may access them meanwhile.
    pub(crate) unsafe fn run(&self, x: *const f32, x_rs: usize, cols: usize, y: *mut f32, y_rs: usize) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2() {
            return self.run_avx(x, x_rs, cols, y, y_rs);
        }
        self.run_plain(x, x_rs, cols, y, y_rs)
    }

    /// Pixel tile such that the `k x tile` input block is about 16 KiB.
    fn tile(&self) -> usize {
        (4096 / self.k.max(1)).next_multiple_of(16).max(16)
    }

    unsafe fn run_plain(&self, x: *const f32, x_rs: usize, cols: usize, y: *mut f32, y_rs: usize) {
        let k = self.k;
        let tile = self.tile();
        let mut p0 = 0;
        while p0 < cols {
            let n = tile.min(cols - p0);
            for m in 0..self.rows() {
                // SAFETY: row m, pixels [p0, p0 + n) of the caller's output block.
                let row = std::slice::from_raw_parts_mut(y.add(m * y_rs + p0), n);
                let b = self.bias.map_or(0.0, |b| b[m]);
                if self.accumulate {
                    row.iter_mut().for_each(|o| *o += b);
                } else {
                    row.fill(b);
                }
                for (kk, &wv) in self.w[m * k..][..k].iter().enumerate() {
                    // SAFETY: input row kk, pixels [p0, p0 + n).
                    let src = std::slice::from_raw_parts(x.add(kk * x_rs + p0), n);
                    for (o, &v) in row.iter_mut().zip(src) {
                        *o += wv * v;
                    }
                }
                if let Some(a) = self.act {
                    a.apply_slice_f32_fast(row);
                }
            }
            p0 += n;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx(&self, x: *const f32, x_rs: usize, cols: usize, y: *mut f32, y_rs: usize) {
        let clamp = as_clamp(self.act);
        // Without an activation: no clamp at all (NaN must stay NaN).
        let (lo, hi) = clamp.unwrap_or((f32::NAN, f32::NAN));
        let rows = self.rows();
        let tile = self.tile();
        let mut p0 = 0;
        while p0 < cols {
            let n = tile.min(cols - p0);
            let mut m = 0;
            while m < rows {
                let mr = MR.min(rows - m);
                let w = self.w.as_ptr().add(m * self.k);
                let mut b = [0.0f32; MR];
                if let Some(bias) = self.bias {
                    b[..mr].copy_from_slice(&bias[m..m + mr]);
                }
                let (xs, ys) = (x.add(p0), y.add(m * y_rs + p0));
                let blk = Block { w, k: self.k, b, x: xs, x_rs, y: ys, y_rs, cols: n, accumulate: self.accumulate, clamp: clamp.is_some(), lo, hi };
                match mr {
                    6 => blk.run::<6>(),
                    5 => blk.run::<5>(),
                    4 => blk.run::<4>(),
                    3 => blk.run::<3>(),
                    2 => blk.run::<2>(),
                    _ => blk.run::<1>(),
                }
                if let (None, Some(a)) = (clamp, self.act) {
                    for r in 0..mr {
                        // SAFETY: the block just written, still in L1.
                        a.apply_slice_f32_fast(std::slice::from_raw_parts_mut(ys.add(r * y_rs), n));
                    }
                }
                m += mr;
            }
            p0 += n;
        }
    }
}

/// One register block: up to `MR` output rows over `cols` pixels.
#[cfg(target_arch = "x86_64")]
struct Block {
    w: *const f32,
    k: usize,
    b: [f32; MR],
    x: *const f32,
    x_rs: usize,
    y: *mut f32,
    y_rs: usize,
    cols: usize,
    /// Whether the accumulators start from `y`'s values (plus the bias).
    accumulate: bool,
    /// Whether to clamp the results to `[lo, hi]`.
    clamp: bool,
    lo: f32,
    hi: f32,
}

#[cfg(target_arch = "x86_64")]
impl Block {
    // Row r indexes both the accumulators and the weight rows: fully unrolled loops.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<const R: usize>(&self) {
        use std::arch::x86_64::*;
        let (k, x_rs) = (self.k, self.x_rs);
        let (lo, hi) = (_mm256_set1_ps(self.lo), _mm256_set1_ps(self.hi));
        let clamp = self.clamp;
        // max_ps/min_ps return their second operand when either is NaN: a NaN result
        // stays NaN and a NaN bound is ignored, as `UnaryKind::Clip` does.
        let act = |v: __m256| if clamp { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) } else { v };
        let mut p = 0;
        while p + 16 <= self.cols {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for r in 0..R {
                let b = _mm256_set1_ps(self.b[r]);
                acc[r] = [b, b];
                if self.accumulate {
                    let yp = self.y.add(r * self.y_rs + p);
                    acc[r] = [_mm256_add_ps(b, _mm256_loadu_ps(yp)), _mm256_add_ps(b, _mm256_loadu_ps(yp.add(8)))];
                }
            }
            let mut xp = self.x.add(p);
            for kk in 0..k {
                let x0 = _mm256_loadu_ps(xp);
                let x1 = _mm256_loadu_ps(xp.add(8));
                for r in 0..R {
                    let wv = _mm256_broadcast_ss(&*self.w.add(r * k + kk));
                    acc[r][0] = _mm256_fmadd_ps(wv, x0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(wv, x1, acc[r][1]);
                }
                xp = xp.add(x_rs);
            }
            for r in 0..R {
                let yp = self.y.add(r * self.y_rs + p);
                _mm256_storeu_ps(yp, act(acc[r][0]));
                _mm256_storeu_ps(yp.add(8), act(acc[r][1]));
            }
            p += 16;
        }
        if p + 8 <= self.cols {
            let mut acc = [_mm256_setzero_ps(); R];
            for r in 0..R {
                acc[r] = _mm256_set1_ps(self.b[r]);
                if self.accumulate {
                    acc[r] = _mm256_add_ps(acc[r], _mm256_loadu_ps(self.y.add(r * self.y_rs + p)));
                }
            }
            let mut xp = self.x.add(p);
            for kk in 0..k {
                let x0 = _mm256_loadu_ps(xp);
                for r in 0..R {
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*self.w.add(r * k + kk)), x0, acc[r]);
                }
                xp = xp.add(x_rs);
            }
            for r in 0..R {
                _mm256_storeu_ps(self.y.add(r * self.y_rs + p), act(acc[r]));
            }
            p += 8;
        }
        for q in p..self.cols {
            for r in 0..R {
                let yq = self.y.add(r * self.y_rs + q);
                let mut acc = if self.accumulate { self.b[r] + *yq } else { self.b[r] };
                for kk in 0..k {
                    acc = (*self.w.add(r * k + kk)).mul_add(*self.x.add(kk * x_rs + q), acc);
                }
                if clamp {
                    // Same NaN behaviour as max_ps/min_ps above: a NaN stays NaN.
                    let v = if acc < self.lo { self.lo } else { acc };
                    acc = if v > self.hi { self.hi } else { v };
                }
                *yq = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference in f64 (activation applied in f32 like the op), with an optional
    /// residual (`rows x cols`) added before the activation.
    fn reference(w: &[f32], k: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, x: &[f32], cols: usize) -> Vec<f32> {
        reference_res(w, k, bias, None, act, x, cols)
    }

    fn reference_res(w: &[f32], k: usize, bias: Option<&[f32]>, res: Option<&[f32]>, act: Option<UnaryKind>, x: &[f32], cols: usize) -> Vec<f32> {
        let rows = w.len() / k;
        let mut y = vec![0.0f32; rows * cols];
        for m in 0..rows {
            for p in 0..cols {
                let mut acc = bias.map_or(0.0, |b| b[m] as f64) + res.map_or(0.0, |r| r[m * cols + p] as f64);
                for kk in 0..k {
                    acc += w[m * k + kk] as f64 * x[kk * cols + p] as f64;
                }
                y[m * cols + p] = acc as f32;
            }
            if let Some(a) = act {
                a.apply_slice_f32_fast(&mut y[m * cols..][..cols]);
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0).collect()
    }

    #[test]
    fn matches_reference_on_odd_shapes_and_activations() {
        let acts = [
            None,
            Some(UnaryKind::Relu),
            Some(UnaryKind::Clip { min: 0.0, max: 6.0 }),
            Some(UnaryKind::HardSwish),
            Some(UnaryKind::LeakyRelu { alpha: 0.1 }),
        ];
        for &(rows, k, cols) in &[(1, 1, 1), (7, 3, 23), (16, 16, 300), (13, 27, 1000), (6, 32, 16), (5, 9, 8), (96, 16, 49)] {
            let w = values(rows * k, 1);
            let x = values(k * cols, 2);
            let b = values(rows, 3);
            let res = values(rows * cols, 4);
            for act in acts {
                for (bias, residual) in [(None, false), (Some(&b[..]), false), (None, true), (Some(&b[..]), true)] {
                    let want = reference_res(&w, k, bias, residual.then_some(&res[..]), act, &x, cols);
                    let op = SmallK { w: &w, k, bias, act, accumulate: residual };
                    let start = if residual { res.clone() } else { vec![f32::NAN; rows * cols] };
                    let mut got = start.clone();
                    // SAFETY: x is k x cols, got is rows x cols, both dense.
                    unsafe { op.run(x.as_ptr(), cols, cols, got.as_mut_ptr(), cols) };
                    let mut plain = start;
                    // SAFETY: as above.
                    unsafe { op.run_plain(x.as_ptr(), cols, cols, plain.as_mut_ptr(), cols) };
                    for (i, ((g, p), r)) in got.iter().zip(&plain).zip(&want).enumerate() {
                        assert!((g - r).abs() <= 1e-4 * (1.0 + r.abs()), "{rows}x{k}x{cols} {act:?} at {i}: {g} vs {r}");
                        assert!((p - r).abs() <= 1e-4 * (1.0 + r.abs()), "plain {rows}x{k}x{cols} {act:?} at {i}: {p} vs {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn nan_propagates_through_every_activation_like_clip() {
        let (rows, k, cols) = (3, 2, 27);
        let w = values(rows * k, 6);
        let mut x = values(k * cols, 7);
        for p in [0, 9, 20, 26] {
            x[p] = f32::NAN; // vector body, 8-wide step and scalar tail
        }
        for act in [None, Some(UnaryKind::Relu), Some(UnaryKind::Clip { min: -1.0, max: 1.0 })] {
            let want = reference(&w, k, None, act, &x, cols);
            let mut got = vec![0.0f32; rows * cols];
            let op = SmallK { w: &w, k, bias: None, act, accumulate: false };
            // SAFETY: dense k x cols input, rows x cols output.
            unsafe { op.run(x.as_ptr(), cols, cols, got.as_mut_ptr(), cols) };
            for (g, r) in got.iter().zip(&want) {
                assert!(g.to_bits() == r.to_bits() || (g.is_nan() && r.is_nan()) || (g - r).abs() < 1e-4, "{act:?}: {g} vs {r}");
            }
        }
    }

    #[test]
    fn strided_rows() {
        // x rows 40 apart (only the first 33 used), y rows 50 apart.
        let (rows, k, cols) = (8, 5, 33);
        let w = values(rows * k, 4);
        let xs = values(k * 40, 5);
        let dense: Vec<f32> = (0..k).flat_map(|kk| xs[kk * 40..][..cols].to_vec()).collect();
        let want = reference(&w, k, None, None, &dense, cols);
        let mut y = vec![-7.0f32; rows * 50];
        let op = SmallK { w: &w, k, bias: None, act: None, accumulate: false };
        // SAFETY: strides and sizes as allocated.
        unsafe { op.run(xs.as_ptr(), 40, cols, y.as_mut_ptr(), 50) };
        for m in 0..rows {
            for p in 0..50 {
                let g = y[m * 50 + p];
                if p < cols {
                    assert!((g - want[m * cols + p]).abs() < 1e-4);
                } else {
                    assert_eq!(g, -7.0, "wrote outside the block");
                }
            }
        }
    }
}
