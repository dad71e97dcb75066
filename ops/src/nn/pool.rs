//! Sliding-window pooling: MaxPool (with the optional Indices output, storage_order),
//! AveragePool (count_include_pad) and LpPool; all with strides, pads, auto_pad,
//! dilations and ceil_mode over 1 to 3 spatial dims.
//!
//! Padding semantics (as onnxruntime): windows start at `o*stride - pad_begin`; padded
//! positions never win a max; with `count_include_pad` the average divides by the taps
//! inside the padded extent `[-pad_begin, input + pad_end)`, otherwise by the taps
//! inside the input.
use super::conv_cpu::SharedOut;
use super::pool_blocked8;
use super::window::{Geometry, WindowAttrs};
use crate::cpu::{self, CpuKernel};
use crate::elementwise;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
enum PoolKind {
    Max { storage_order: i64 },
    Average { count_include_pad: bool },
    Lp { p: i64 },
}

#[derive(Debug)]
pub struct Pool {
    kind: PoolKind,
    window: WindowAttrs,
    ceil_mode: bool,
    with_indices: bool,
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
const MAX_TYPES: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8];

impl Pool {
    fn parse(spec: &NodeSpec, kind: PoolKind) -> Result<Pool> {
        let kind = match kind {
            PoolKind::Max { .. } => {
                let storage_order = spec.int("storage_order", 0)?;
                if !(0..=1).contains(&storage_order) {
                    return Err(spec.bad("storage_order", format!("must be 0 or 1, found {storage_order}")));
                }
                PoolKind::Max { storage_order }
            }
            PoolKind::Average { .. } => PoolKind::Average { count_include_pad: spec.int("count_include_pad", 0)? != 0 },
            PoolKind::Lp { .. } => {
                let p = spec.int("p", 2)?;
                if p < 1 {
                    return Err(spec.bad("p", format!("must be >= 1, found {p}")));
                }
                PoolKind::Lp { p }
            }
        };
        let window = WindowAttrs::parse(spec)?;
        if window.kernel.is_none() {
            return Err(spec.bad("kernel_shape", "is required"));
        }
        let with_indices = matches!(kind, PoolKind::Max { .. }) && spec.n_outputs() > 1;
        Ok(Pool { kind, window, ceil_mode: spec.int("ceil_mode", 0)? != 0, with_indices })
    }

    fn geometry(&self, x: &[usize]) -> Result<Geometry> {
        if x.len() < 3 || x.len() > 5 {
            return Err(OpError::input(0, format!("expected N x C x D1 [x D2 [x D3]] (rank 3 to 5), found shape {x:?}")));
        }
        let n = x.len() - 2;
        let kernel = self.window.kernel(n, None)?;
        let g = self.window.resolve(&x[2..], &kernel, self.ceil_mode)?;
        if self.with_indices && self.kind == (PoolKind::Max { storage_order: 1 }) && n != 2 {
            return Err(OpError::Unsupported("MaxPool Indices with storage_order=1 on other than 2-D input".into()));
        }
        Ok(g)
    }

    /// Number of taps the average divides by, for output position `o` on dim `d`.
    fn divisor_taps(&self, g: &Geometry, d: usize, o: usize) -> usize {
        let start = (o * g.stride[d]) as i64 - g.pad_begin[d];
        let (lo, hi) = match self.kind {
            PoolKind::Average { count_include_pad: true } => (-g.pad_begin[d], g.input[d] as i64 + g.pad_end[d]),
            _ => (0, g.input[d] as i64),
        };
        (0..g.kernel[d]).filter(|&k| (lo..hi).contains(&(start + (k * g.dilation[d]) as i64))).count()
    }
}

/// An element the separable pooling passes fold: floats, and the 8-bit integers of
/// MaxPool (which never sum them).
trait PoolElem: Copy + PartialOrd + Send + Sync + std::ops::Add<Output = Self> {
    /// The identity of max: -inf, or the type's least value.
    const NEG_INF: Self;
    const ZERO: Self;
}

/// Arithmetic the CPU pooling loop needs, for f32 (fast path) and f64 (other dtypes).
trait PoolFloat: PoolElem {
    fn lp_term(self, p: i64) -> Self;
    fn lp_root(self, p: i64) -> Self;
    fn div_count(self, n: usize) -> Self;
}

macro_rules! pool_float {
    ($t:ty) => {
        impl PoolElem for $t {
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            const ZERO: Self = 0.0;
        }
        impl PoolFloat for $t {
            fn lp_term(self, p: i64) -> Self {
                match p {
                    1 => self.abs(),
                    2 => self * self,
                    _ => self.abs().powi(p as i32),
                }
            }
            fn lp_root(self, p: i64) -> Self {
                match p {
                    1 => self,
                    2 => self.sqrt(),
                    _ => self.powf(1.0 / p as $t),
                }
            }
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}
pool_float!(f32);
pool_float!(f64);

macro_rules! pool_int {
    ($t:ty) => {
        impl PoolElem for $t {
            const NEG_INF: Self = <$t>::MIN;
            const ZERO: Self = 0;
        }
    };
}
pool_int!(u8);
pool_int!(i8);

/// The larger of `acc` and `v`, NaN once either is (NaN propagates through max
/// pooling, as through ONNX's Max and numpy's maximum).
#[inline(always)]
#[allow(clippy::eq_op)]
fn max_nan<T: PartialOrd>(acc: T, v: T) -> T {
    if v > acc || v != v { v } else { acc }
}

/// Max or sum of a pooling window: with `NAN` (the plane holds a NaN) NaN-propagating,
/// else a plain compare (one instruction per lane).
#[inline(always)]
fn fold_tap<T: PoolElem, const MAX: bool, const NAN: bool>(acc: T, v: T) -> T {
    match (MAX, NAN) {
        (true, true) => max_nan(acc, v),
        (true, false) => {
            if v > acc {
                v
            } else {
                acc
            }
        }
        _ => acc + v,
    }
}

/// Whether a plane holds a NaN (blocks of lanes, so that the scan vectorises).
#[allow(clippy::eq_op)]
fn has_nan<T: PoolElem>(xs: &[T]) -> bool {
    xs.chunks(64).any(|c| c.iter().fold(false, |a, &v| a | (v != v)))
}

impl Pool {
    /// Pools every (n, c) plane of `x` into `y`; `indices` receives MaxPool argmaxes.
    fn run_typed<T: PoolFloat>(&self, g: &Geometry, x: &[T], y: &mut [T], indices: Option<&mut [i64]>) {
        let (in_size, out_size) = (g.input_size(), g.output_size());
        let [_, oh_n, ow_n] = g.output;
        // Per-dim tap ranges and divisors, precomputed per output coordinate.
        let ranges = window_ranges(g);
        let divisors: Vec<Vec<usize>> =
            (0..3).map(|d| (0..g.output[d]).map(|o| self.divisor_taps(g, d, o)).collect()).collect();
        let kind = self.kind;
        let plane_job = |plane: usize, out: &mut [T], mut idx: Option<&mut [i64]>| {
            let xc = &x[plane * in_size..][..in_size];
            for (pix, o) in out.iter_mut().enumerate() {
                let (od, oh, ow) = (pix / (oh_n * ow_n), pix / ow_n % oh_n, pix % ow_n);
                let [(sd, d0, d1), (sh, h0, h1), (sw, w0, w1)] = [ranges[0][od], ranges[1][oh], ranges[2][ow]];
                let mut acc = if matches!(kind, PoolKind::Max { .. }) { T::NEG_INF } else { T::ZERO };
                let mut arg = 0usize;
                for kd in d0..d1 {
                    let id = (sd + (kd * g.dilation[0]) as i64) as usize;
                    for kh in h0..h1 {
                        let ih = (sh + (kh * g.dilation[1]) as i64) as usize;
                        let row = (id * g.input[1] + ih) * g.input[2];
                        for kw in w0..w1 {
                            let iw = (sw + (kw * g.dilation[2]) as i64) as usize;
                            let v = xc[row + iw];
                            match kind {
                                PoolKind::Max { .. } => {
                                    // The first NaN wins (and stays): NaN propagates.
                                    #[allow(clippy::eq_op)]
                                    if v > acc || (v != v && acc == acc) {
                                        acc = v;
                                        arg = row + iw;
                                    }
                                }
                                PoolKind::Average { .. } => acc = acc + v,
                                PoolKind::Lp { p } => acc = acc + v.lp_term(p),
                            }
                        }
                    }
                }
                *o = match kind {
                    PoolKind::Max { .. } => acc,
                    PoolKind::Average { .. } => {
                        acc.div_count(divisors[0][od] * divisors[1][oh] * divisors[2][ow])
                    }
                    PoolKind::Lp { p } => acc.lp_root(p),
                };
                if let Some(idx) = idx.as_deref_mut() {
                    let local = if kind == (PoolKind::Max { storage_order: 1 }) {
                        let (h, w) = (arg / g.input[2], arg % g.input[2]);
                        w * g.input[1] + h
                    } else {
                        arg
                    };
                    idx[pix] = (plane * in_size + local) as i64;
                }
            }
        };
        match indices {
            Some(idx) => {
                let ip = cpu::SharedPtr(idx.as_mut_ptr());
                cpu::par_chunks_mut(y, out_size, g.kernel_size(), |first, part| {
                    for (i, out) in part.chunks_mut(out_size).enumerate() {
                        let plane = first + i;
                        // SAFETY: `idx` has one `out_size` range per plane, like `y`; the
                        // task that holds a plane's output chunk is the only one to write
                        // its range of indices.
                        let ix = unsafe { std::slice::from_raw_parts_mut(ip.get().add(plane * out_size), out_size) };
                        plane_job(plane, out, Some(ix));
                    }
                })
            }
            None => cpu::par_chunks_mut(y, out_size, g.kernel_size(), |first, part| {
                for (i, out) in part.chunks_mut(out_size).enumerate() {
                    plane_job(first + i, out, None);
                }
            }),
        }
    }
}

/// `dst[i] = fold over taps t of src[t + i]` (`taps`: offsets into `src`), a block of
/// lanes at a time so that the accumulators stay in registers (one store per output,
/// not one per tap).
#[inline(always)]
fn fold_slices<T: PoolElem, const MAX: bool, const NAN: bool>(dst: &mut [T], src: &[T], taps: &[usize]) {
    const LANES: usize = 16;
    let init = if MAX { T::NEG_INF } else { T::ZERO };
    let n = dst.len();
    if n < LANES {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = taps.iter().fold(init, |a, &t| fold_tap::<T, MAX, NAN>(a, src[t + j]));
        }
        return;
    }
    // Blocks at 0, LANES, ..., and a last one ending at n (overlapping the one before:
    // each output is a pure function of its position, so recomputing it is harmless).
    let blocks = n.div_ceil(LANES);
    for b in 0..blocks {
        let at = (b * LANES).min(n - LANES);
        let mut acc = [init; LANES];
        for &tap in taps {
            let t = &src[tap + at..][..LANES];
            for l in 0..LANES {
                acc[l] = fold_tap::<T, MAX, NAN>(acc[l], t[l]);
            }
        }
        dst[at..at + LANES].copy_from_slice(&acc);
    }
}

/// Pooling over one axis of a plane viewed as `outer x n_in x inner` (window along
/// the middle axis) into `outer x n_out x inner`; rows of `inner` elements are
/// combined whole, so the H and D passes vectorise.
#[inline(always)]
fn pool_axis<T: PoolElem, const MAX: bool, const NAN: bool>(g: &Geometry, d: usize, outer: usize, inner: usize, src: &[T], dst: &mut [T]) {
    let (n_in, n_out) = (g.input[d], g.output[d]);
    let mut taps: Vec<usize> = Vec::with_capacity(g.kernel[d]);
    for o in 0..outer {
        for out_i in 0..n_out {
            let start = (out_i * g.stride[d]) as i64 - g.pad_begin[d];
            let (k0, k1) = tap_range(g, d, start);
            taps.clear();
            taps.extend((k0..k1).map(|k| {
                let pos = (start + (k * g.dilation[d]) as i64) as usize;
                (o * n_in + pos) * inner
            }));
            fold_slices::<T, MAX, NAN>(&mut dst[(o * n_out + out_i) * inner..][..inner], src, &taps);
        }
    }
}

/// Pooling over the last axis (W). Outputs whose window lies wholly inside the row
/// (one run `[lo, hi)`) are computed over the whole run at once: the row is first
/// split into its `stride` phases (`row[p], row[p + stride], ...`), so that tap `t`
/// of consecutive outputs is a contiguous slice of phase `t % stride` and the folds
/// vectorise. The borders take the general loop.
#[inline(always)]
fn pool_last_axis<T: PoolElem, const MAX: bool, const NAN: bool>(g: &Geometry, rows: usize, src: &[T], dst: &mut [T]) {
    let (n_in, n_out) = (g.input[2], g.output[2]);
    let taps: Vec<(i64, usize, usize)> = (0..n_out)
        .map(|o| {
            let start = (o * g.stride[2]) as i64 - g.pad_begin[2];
            let (k0, k1) = tap_range(g, 2, start);
            (start, k0, k1)
        })
        .collect();
    let (k, dil, stride) = (g.kernel[2], g.dilation[2], g.stride[2].max(1));
    let full = |&(_, k0, k1): &(i64, usize, usize)| k0 == 0 && k1 == k;
    let lo = taps.iter().position(full).unwrap_or(n_out);
    let hi = lo + taps[lo..].iter().take_while(|t| full(t)).count();
    let init = if MAX { T::NEG_INF } else { T::ZERO };
    // Phase buffers: phase p of the run's span, each `phase_len` long.
    let run = hi - lo;
    let window = (k.max(1) - 1) * dil + 1;
    let phase_len = run + (window - 1) / stride + 1;
    let mut phases = vec![init; if run > 0 && stride > 1 { stride * phase_len } else { 0 }];
    let mut tap_at: Vec<usize> = Vec::with_capacity(k);
    for r in 0..rows {
        let srow = &src[r * n_in..][..n_in];
        let drow = &mut dst[r * n_out..][..n_out];
        for o in (0..lo).chain(hi..n_out) {
            let (start, k0, k1) = taps[o];
            drow[o] = (k0..k1).fold(init, |acc, t| fold_tap::<T, MAX, NAN>(acc, srow[(start + (t * dil) as i64) as usize]));
        }
        if run == 0 {
            continue;
        }
        let first = taps[lo].0 as usize;
        let span = &srow[first..first + (run - 1) * stride + window];
        tap_at.clear();
        if stride == 1 {
            tap_at.extend((0..k).map(|t| t * dil));
            fold_slices::<T, MAX, NAN>(&mut drow[lo..hi], span, &tap_at);
        } else {
            if stride == 2 {
                let (even, odd) = phases.split_at_mut(phase_len);
                for ((pair, e), o) in span.chunks_exact(2).zip(even.iter_mut()).zip(odd.iter_mut()) {
                    *e = pair[0];
                    *o = pair[1];
                }
                if span.len() % 2 == 1 {
                    even[span.len() / 2] = span[span.len() - 1];
                }
            } else {
                for (i, chunk) in span.chunks(stride).enumerate() {
                    for (p, &v) in chunk.iter().enumerate() {
                        phases[p * phase_len + i] = v;
                    }
                }
            }
            tap_at.extend((0..k).map(|t| (t * dil % stride) * phase_len + t * dil / stride));
            fold_slices::<T, MAX, NAN>(&mut drow[lo..hi], &phases, &tap_at);
        }
    }
}

impl Pool {
    /// MaxPool eight planes at a time (see `pool_blocked8.rs`), the odd planes by the
    /// separable passes; all by the separable passes when a block met a NaN.
    fn run_blocked8(&self, g: &Geometry, x: &[f32], y: &mut [f32]) {
        let (in_size, out_size) = (g.input_size(), g.output_size());
        let blocks = x.len() / in_size / 8;
        let out = SharedOut(y.as_mut_ptr());
        let nan = std::sync::atomic::AtomicBool::new(false);
        #[cfg(target_arch = "x86_64")]
        cpu::par_ranges(blocks, 8 * out_size * g.kernel_size(), |a, b| {
            cpu::with_scratch(pool_blocked8::scratch_len(g), |scratch| {
                for blk in a..b {
                    // SAFETY: applies() held, and this task alone writes planes
                    // 8 * blk .. 8 * blk + 8.
                    let clean = unsafe { pool_blocked8::max_block8(g, x[blk * 8 * in_size..].as_ptr(), out.ptr().add(blk * 8 * out_size), scratch) };
                    if !clean {
                        nan.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        });
        if nan.into_inner() {
            return self.run_separable(g, x, y);
        }
        let done = blocks * 8;
        self.run_separable(g, &x[done * in_size..], &mut y[done * out_size..]);
    }

    /// Separable pooling (no Indices output): W, then H, then D passes per plane.
    fn run_separable<T: PoolFloat>(&self, g: &Geometry, x: &[T], y: &mut [T]) {
        match self.kind {
            PoolKind::Max { .. } => self.separable::<T, true>(g, x, y),
            _ => self.separable::<T, false>(g, x, y),
        }
    }

    fn separable<T: PoolFloat, const MAX: bool>(&self, g: &Geometry, x: &[T], y: &mut [T]) {
        let (in_size, out_size) = (g.input_size(), g.output_size());
        let [_, ih_n, iw_n] = g.input;
        let [od_n, oh_n, ow_n] = g.output;
        // D, then H (whole rows: vectorised), then W on the fewest rows. A 1-tap,
        // stride-1, unpadded D (every 2-D pool) is skipped.
        let d_trivial = d_trivial(g);
        let (t1_len, t2_len) = (if d_trivial { 0 } else { od_n * ih_n * iw_n }, od_n * oh_n * iw_n);
        let kind = self.kind;
        let divisor: Vec<Vec<usize>> =
            (0..3).map(|d| (0..g.output[d]).map(|o| self.divisor_taps(g, d, o)).collect()).collect();
        cpu::par_chunks_mut(y, out_size, g.kernel_size() / g.kernel[2].max(1) + g.kernel[2], |first, part| {
            let mut t1 = vec![T::ZERO; t1_len];
            let mut t2 = vec![T::ZERO; t2_len];
            let mut lp = if let PoolKind::Lp { .. } = kind { vec![T::ZERO; in_size] } else { vec![] };
            for (i, out) in part.chunks_mut(out_size).enumerate() {
                let mut xc = &x[(first + i) * in_size..][..in_size];
                if let PoolKind::Lp { p } = kind {
                    for (t, &v) in lp.iter_mut().zip(xc) {
                        *t = v.lp_term(p);
                    }
                    xc = &lp;
                }
                if MAX && has_nan(xc) {
                    Self::passes::<T, MAX, true>(g, d_trivial, xc, &mut t1, &mut t2, out);
                } else {
                    Self::passes::<T, MAX, false>(g, d_trivial, xc, &mut t1, &mut t2, out);
                }
                match kind {
                    PoolKind::Max { .. } => {}
                    PoolKind::Average { .. } => {
                        for od in 0..od_n {
                            for oh in 0..oh_n {
                                let row = &mut out[(od * oh_n + oh) * ow_n..][..ow_n];
                                for (ow, v) in row.iter_mut().enumerate() {
                                    *v = v.div_count(divisor[0][od] * divisor[1][oh] * divisor[2][ow]);
                                }
                            }
                        }
                    }
                    PoolKind::Lp { p } => out.iter_mut().for_each(|v| *v = v.lp_root(p)),
                }
            }
        });
    }
}

impl Pool {
    /// MaxPool of 8-bit integers (no Indices output) by the separable passes: max is
    /// exact and associative, and integers have no NaN, so this equals the per-tap
    /// loop of [`Self::run_typed`] (a window without taps gives the type's least
    /// value, as the f64 loop's -inf converts to).
    fn max_ints<T: PoolElem>(&self, g: &Geometry, x: &[T], y: &mut [T]) {
        let (in_size, out_size) = (g.input_size(), g.output_size());
        let (t1_len, t2_len) = (if d_trivial(g) { 0 } else { g.output[0] * g.input[1] * g.input[2] }, g.output[0] * g.output[1] * g.input[2]);
        cpu::par_chunks_mut(y, out_size, g.kernel_size() / g.kernel[2].max(1) + g.kernel[2], |first, part| {
            let (mut t1, mut t2) = (vec![T::ZERO; t1_len], vec![T::ZERO; t2_len]);
            for (i, out) in part.chunks_mut(out_size).enumerate() {
                let xc = &x[(first + i) * in_size..][..in_size];
                Self::passes::<T, true, false>(g, d_trivial(g), xc, &mut t1, &mut t2, out);
            }
        });
    }
}

impl Pool {
    /// The D, H and W passes of one plane (see [`Self::plane_passes`]), compiled for
    /// AVX2 where the CPU has it.
    fn passes<T: PoolElem, const MAX: bool, const NAN: bool>(g: &Geometry, d_trivial: bool, xc: &[T], t1: &mut [T], t2: &mut [T], out: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        if cpu::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { Self::passes_avx2::<T, MAX, NAN>(g, d_trivial, xc, t1, t2, out) };
        }
        Self::plane_passes::<T, MAX, NAN>(g, d_trivial, xc, t1, t2, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn passes_avx2<T: PoolElem, const MAX: bool, const NAN: bool>(g: &Geometry, d_trivial: bool, xc: &[T], t1: &mut [T], t2: &mut [T], out: &mut [T]) {
        Self::plane_passes::<T, MAX, NAN>(g, d_trivial, xc, t1, t2, out)
    }

    /// The D, H and W passes of one plane `xc` into `out` (`t1`, `t2`: scratch).
    #[inline(always)]
    fn plane_passes<T: PoolElem, const MAX: bool, const NAN: bool>(g: &Geometry, d_trivial: bool, xc: &[T], t1: &mut [T], t2: &mut [T], out: &mut [T]) {
        let [_, ih_n, iw_n] = g.input;
        let [od_n, oh_n, _] = g.output;
        let after_d: &[T] = if d_trivial {
            xc
        } else {
            pool_axis::<T, MAX, NAN>(g, 0, 1, ih_n * iw_n, xc, t1);
            t1
        };
        pool_axis::<T, MAX, NAN>(g, 1, od_n, iw_n, after_d, t2);
        pool_last_axis::<T, MAX, NAN>(g, od_n * oh_n, t2, out);
    }
}

/// Whether the D pass of a plane is the identity (a 1-tap, stride-1, unpadded D: every
/// 2-D pool), so that the passes skip it.
fn d_trivial(g: &Geometry) -> bool {
    g.kernel[0] == 1 && g.stride[0] == 1 && g.pad_begin[0] == 0 && g.input[0] == g.output[0]
}

/// For each dim and output coordinate: the window's first input coordinate and the
/// range of its taps that land inside the input.
pub(super) fn window_ranges(g: &Geometry) -> Vec<Vec<(i64, usize, usize)>> {
    (0..3)
        .map(|d| {
            (0..g.output[d])
                .map(|o| {
                    let start = (o * g.stride[d]) as i64 - g.pad_begin[d];
                    let (lo, hi) = tap_range(g, d, start);
                    (start, lo, hi)
                })
                .collect()
        })
        .collect()
}

/// Taps `k` of dim `d` whose position `start + k*dilation` is inside the input.
fn tap_range(g: &Geometry, d: usize, start: i64) -> (usize, usize) {
    let dil = g.dilation[d] as i64;
    let lo = if start >= 0 { 0 } else { (-start + dil - 1) / dil };
    let last = g.input[d] as i64 - 1 - start;
    let hi = if last < 0 { 0 } else { (last / dil + 1).min(g.kernel[d] as i64) };
    (lo.min(hi.max(0)) as usize, hi.max(0) as usize)
}

impl Op for Pool {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        match self.kind {
            PoolKind::Max { .. } => "MaxPool",
            PoolKind::Average { .. } => "AveragePool",
            PoolKind::Lp { .. } => "LpPool",
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let allowed = if matches!(self.kind, PoolKind::Max { .. }) { MAX_TYPES } else { FLOATS };
        let dtype = expect_dtype(inputs, 0, allowed)?;
        let x = required(inputs, 0)?;
        let g = self.geometry(x.dims())?;
        let mut dims = x.dims()[..2].to_vec();
        dims.extend(g.output_dims());
        let mut out = vec![TensorType::new(dtype, dims.clone())];
        if self.with_indices {
            out.push(TensorType::new(DType::I64, dims));
        }
        Ok(out)
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let taps = inputs
            .first()
            .copied()
            .flatten()
            .and_then(|x| self.geometry(x.dims()).ok())
            .map_or(1, |g| g.kernel_size());
        Cost { flops: (outputs[0].len() * taps) as u64, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Pool {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        let x = cpu::input(inputs, 0)?;
        let g = self.geometry(x.dims())?;
        let (y, rest) = outputs.split_first_mut().ok_or_else(|| OpError::invalid("missing output"))?;
        let mut idx = match (self.with_indices, rest.first_mut()) {
            (true, Some(t)) => Some(t.as_mut_slice::<i64>()?),
            _ => None,
        };
        if x.dtype() == DType::F32 {
            let (xs, ys) = (x.as_slice::<f32>()?, y.as_mut_slice::<f32>()?);
            if idx.is_some() {
                self.run_typed(&g, xs, ys, idx.as_deref_mut());
            } else if matches!(self.kind, PoolKind::Max { .. }) && pool_blocked8::applies(&g, xs.len() / g.input_size().max(1)) {
                self.run_blocked8(&g, xs, ys);
            } else {
                self.run_separable(&g, xs, ys);
            }
        } else if idx.is_none() && matches!(self.kind, PoolKind::Max { .. }) && x.dtype() == DType::U8 {
            self.max_ints(&g, x.as_slice::<u8>()?, y.as_mut_slice::<u8>()?);
        } else if idx.is_none() && matches!(self.kind, PoolKind::Max { .. }) && x.dtype() == DType::I8 {
            self.max_ints(&g, x.as_slice::<i8>()?, y.as_mut_slice::<i8>()?);
        } else {
            let mut out = vec![0.0; y.len()];
            self.run_typed(&g, &x.to_f64_vec(), &mut out, idx);
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        Ok(())
    }
}

impl WgslKernel for Pool {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// An f16 input or output stored as halves is computed on in f32.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(WgslProgram::default());
        }
        let x = required(inputs, 0)?;
        let g = self.geometry(x.dims())?;
        let ty = wgsl::elem(x.dtype());
        let (hx, hy) = (halves.input(0), halves.output(0));
        if halves.any() && ty != "f32" {
            return Err(OpError::Unsupported(format!("halves for {} of {}", self.name(), x.dtype())));
        }
        let wg = tune.get(&wgsl::workgroup_param());
        let mut buffers = vec![("x", if hx { "f16" } else { ty }, true), ("y", if hy { "f16" } else { ty }, false)];
        let mut bindings = vec![Binding::Input(0), Binding::Output(0)];
        if self.with_indices {
            buffers.push(("idx", "i32", false));
            bindings.push(Binding::Output(1));
        }
        let include_pad = self.kind == PoolKind::Average { count_include_pad: true };
        let init = match self.kind {
            PoolKind::Max { .. } if ty == "f32" => "bitcast<f32>(0xff800000u)".to_string(),
            PoolKind::Max { .. } => format!("{ty}({})", if ty == "i32" { "-2147483647 - 1" } else { "0u" }),
            _ => "0.0".into(),
        };
        let accumulate = match self.kind {
            // NaN propagates on floats: the first NaN is taken and kept.
            PoolKind::Max { .. } if ty == "f32" => {
                format!("if (v > acc || ({} && !{})) {{ acc = v; arg = j; }}", elementwise::wgsl_isnan("v"), elementwise::wgsl_isnan("acc"))
            }
            PoolKind::Max { .. } => "if (v > acc) { acc = v; arg = j; }".to_string(),
            PoolKind::Average { .. } => "acc += v;".into(),
            PoolKind::Lp { p } => format!("acc += pow(abs(v), {p}.0);"),
        };
        let finish = match self.kind {
            PoolKind::Max { .. } => "acc".to_string(),
            PoolKind::Average { .. } => "acc / f32(count)".into(),
            PoolKind::Lp { p } => format!("pow(acc, {})", wgsl::literal("f32", 1.0 / p as f64)),
        };
        // The divisor counts taps in [-pad_begin, input + pad_end) with count_include_pad,
        // else in [0, input).
        let begins = ["PD", "PH", "PW"].map(|p| if include_pad { format!("-{p}") } else { "0".to_string() });
        let ends = [("ID", 0), ("IH", 1), ("IW", 2)]
            .map(|(n, d)| if include_pad { format!("i32({n}) + {}", g.pad_end[d]) } else { format!("i32({n})") });
        let index_out = if !self.with_indices {
            String::new()
        } else if self.kind == (PoolKind::Max { storage_order: 1 }) {
            "let ah = (arg / IW) % IH;\n    let aw = arg % IW;\n    idx[i] = i32(plane * IH * IW + aw * IH + ah);".into()
        } else {
            "idx[i] = i32(plane * ID * IH * IW + arg);".into()
        };
        let helpers = g.wgsl_consts();
        let body = format!(
            "let ow = i % OW;
    let oh = (i / OW) % OH;
    let od = (i / (OW * OH)) % OD;
    let plane = i / (OW * OH * OD);
    let xbase = plane * ID * IH * IW;
    var acc: {ty} = {init};
    var arg = 0u;
    var count = 0u;
    for (var kd = 0u; kd < KD; kd++) {{
        let id = i32(od * SD + kd * DD) - PD;
        for (var kh = 0u; kh < KH; kh++) {{
            let ih = i32(oh * SH + kh * DH) - PH;
            for (var kw = 0u; kw < KW; kw++) {{
                let iw = i32(ow * SW + kw * DW) - PW;
                if (id >= {b0} && id < {e0} && ih >= {b1} && ih < {e1} && iw >= {b2} && iw < {e2}) {{ count += 1u; }}
                if (id < 0 || id >= i32(ID) || ih < 0 || ih >= i32(IH) || iw < 0 || iw >= i32(IW)) {{ continue; }}
                let j = (u32(id) * IH + u32(ih)) * IW + u32(iw);
                let v = {load};
                {accumulate}
            }}
        }}
    }}
    y[i] = {store};
    {index_out}",
            b0 = begins[0],
            b1 = begins[1],
            b2 = begins[2],
            e0 = ends[0],
            e1 = ends[1],
            e2 = ends[2],
            load = wgsl::load("x[xbase + j]", ty, hx),
            store = wgsl::store(&finish, ty, hy),
        );
        let n = outputs[0].len();
        let mut d = wgsl::simple_kernel(self.name(), n, wg, &buffers, bindings, &helpers, &body);
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MaxPool", |spec| Ok(Box::new(Pool::parse(spec, PoolKind::Max { storage_order: 0 })?)));
    r.register("", "AveragePool", |spec| {
        Ok(Box::new(Pool::parse(spec, PoolKind::Average { count_include_pad: false })?))
    });
    r.register("", "LpPool", |spec| Ok(Box::new(Pool::parse(spec, PoolKind::Lp { p: 2 })?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, ints, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    /// Naive 2-D pooling reference with explicit pads (begin, end) per dim.
    #[allow(clippy::too_many_arguments)]
    fn reference(x: &Tensor, kind: &str, k: [usize; 2], s: [usize; 2], d: [usize; 2], pb: [i64; 2], pe: [i64; 2], out: [usize; 2], include_pad: bool) -> Vec<f64> {
        let xd = x.dims();
        let xv = x.to_f64_vec();
        let (h, w) = (xd[2], xd[3]);
        let mut y = vec![];
        for plane in 0..xd[0] * xd[1] {
            for oh in 0..out[0] {
                for ow in 0..out[1] {
                    let mut vals = vec![];
                    let mut padded_count = 0;
                    for kh in 0..k[0] {
                        for kw in 0..k[1] {
                            let ih = (oh * s[0] + kh * d[0]) as i64 - pb[0];
                            let iw = (ow * s[1] + kw * d[1]) as i64 - pb[1];
                            if ih >= -pb[0] && ih < h as i64 + pe[0] && iw >= -pb[1] && iw < w as i64 + pe[1] {
                                padded_count += 1;
                            }
                            if ih >= 0 && ih < h as i64 && iw >= 0 && iw < w as i64 {
                                vals.push(xv[plane * h * w + ih as usize * w + iw as usize]);
                            }
                        }
                    }
                    y.push(match kind {
                        "MaxPool" => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                        "AveragePool" => vals.iter().sum::<f64>() / if include_pad { padded_count } else { vals.len() } as f64,
                        _ => vals.iter().map(|v| v * v).sum::<f64>().sqrt(),
                    });
                }
            }
        }
        y
    }

    #[test]
    fn pools_match_reference() {
        // Small planes (scalar paths), wide ones (blocks of lanes, overlapping tails),
        // and 18 planes (MaxPool: two blocks of eight planes and two odd ones).
        for (kind, x) in ["MaxPool", "AveragePool", "LpPool"]
            .into_iter()
            .flat_map(|k| [(k, rand_f32(&[2, 3, 11, 9], 7)), (k, rand_f32(&[1, 2, 37, 53], 8)), (k, rand_f32(&[2, 9, 17, 19], 9))])
        {
            for (k, s, d, pads, ceil, include) in [
                ([3, 3], [2, 2], [1, 1], [1i64, 1, 1, 1], false, false),
                ([3, 2], [2, 3], [1, 1], [0, 1, 2, 0], true, false),
                ([2, 2], [1, 1], [2, 2], [1, 0, 0, 1], false, true),
                ([3, 3], [3, 2], [2, 1], [2, 2, 2, 2], true, true),
                ([1, 4], [1, 2], [1, 1], [0, 0, 0, 0], true, false),
                ([2, 2], [2, 2], [1, 1], [2, 2, 2, 2], false, true),
                ([2, 3], [2, 3], [1, 2], [0, 1, 1, 0], false, false),
            ] {
                let attrs = vec![
                    ("kernel_shape", ints(&k.map(|v| v as i64))),
                    ("strides", ints(&s.map(|v| v as i64))),
                    ("dilations", ints(&d.map(|v| v as i64))),
                    ("pads", ints(&pads)),
                    ("ceil_mode", Attr::Int(ceil as i64)),
                    ("count_include_pad", Attr::Int(include as i64)),
                ];
                let op = make(kind, 19, &attrs, 1, 1).unwrap();
                let y = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
                let out = [y.dims()[2], y.dims()[3]];
                let want = reference(&x, kind, k, s, d, [pads[0], pads[1]], [pads[2], pads[3]], out, include);
                assert_close(&y, &want, 1e-5, &format!("{kind} k{k:?} s{s:?} d{d:?} p{pads:?} ceil{ceil}"));
            }
        }
    }

    /// A NaN in one plane of many propagates to its windows (the blocked path defers to
    /// the NaN-aware passes).
    #[test]
    fn maxpool_propagates_nan_across_blocks() {
        // Rows of 10: the NaN sits in a block of eight columns (the vector check).
        let mut v = rand_f32(&[1, 16, 6, 10], 3).to_f64_vec();
        v[5 * 60 + 11] = f64::NAN; // plane 5, row 1, column 1
        let x = Tensor::from_f64(kiln_graph::DType::F32, &[1, 16, 6, 10], &v).unwrap();
        let attrs = vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
        let op = make("MaxPool", 19, &attrs, 1, 1).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0).to_f64_vec();
        assert!(y[5 * 15].is_nan(), "the window over the NaN");
        assert_eq!(y.iter().filter(|v| v.is_nan()).count(), 1);
    }

    #[test]
    fn maxpool_indices_and_ceil_rules() {
        // test_maxpool_with_argmax_2d_precomputed_strides: 5x5, k2 s2, storage_order 1.
        let x = Tensor::from_vec(&[1, 1, 5, 5], (1..=25).map(|v| v as f32).collect()).unwrap();
        let op = make("MaxPool", 19, &[("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2])), ("storage_order", Attr::Int(1))], 1, 2).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[7.0, 9.0, 17.0, 19.0]);
        assert_eq!(out[1].as_slice::<i64>().unwrap(), &[6, 16, 8, 18]);
        // test_maxpool_2d_ceil_output_size_reduce_by_one: 2x2, k1 s2 ceil -> 1x1.
        let x = rand_f32(&[1, 1, 2, 2], 1);
        let op = make("MaxPool", 19, &[("kernel_shape", ints(&[1, 1])), ("strides", ints(&[2, 2])), ("ceil_mode", Attr::Int(1))], 1, 1).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[1, 1, 1, 1]);
        // uint8 max pooling, 1-D and 3-D shapes.
        let x = Tensor::from_vec(&[1, 1, 6], vec![3u8, 9, 1, 200, 4, 4]).unwrap();
        let op = make("MaxPool", 19, &[("kernel_shape", ints(&[2])), ("strides", ints(&[2]))], 1, 1).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].as_slice::<u8>().unwrap(), &[9, 200, 4]);
        let x = rand_f32(&[1, 2, 4, 5, 6], 3);
        let op = make("AveragePool", 19, &[("kernel_shape", ints(&[2, 2, 2])), ("auto_pad", Attr::String("SAME_UPPER".into()))], 1, 1).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[1, 2, 4, 5, 6]);
        assert!(make("MaxPool", 19, &[], 1, 1).is_err());
        // Empty inputs give empty outputs (no panics, no shader).
        let x = Tensor::from_vec(&[0, 3, 5, 5], Vec::<f32>::new()).unwrap();
        for op in ["MaxPool", "AveragePool", "LpPool"] {
            let o = make(op, 19, &[("kernel_shape", ints(&[2, 2]))], 1, 1).unwrap();
            assert_eq!(run(o.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[0, 3, 4, 4]);
        }
        let o = make("Conv", 19, &[], 2, 1).unwrap();
        let w = rand_f32(&[2, 3, 2, 2], 1);
        assert_eq!(run(o.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap()[0].dims(), &[0, 2, 4, 4]);
        let o = make("Conv", 19, &[("auto_pad", Attr::String("SAME_UPPER".into()))], 2, 1).unwrap();
        let x = Tensor::from_vec(&[1, 3, 0, 5], Vec::<f32>::new()).unwrap();
        assert_eq!(run(o.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap()[0].dims(), &[1, 2, 0, 5]);
    }
}

#[cfg(test)]
#[path = "pool_int_tests.rs"]
mod int_tests;
