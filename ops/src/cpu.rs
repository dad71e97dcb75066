//! The CPU side of an op: the [`CpuKernel`] trait and helpers shared by kernels
//! (parallel loops, per-thread scratch memory, vectorising f32 math) and the CPU's
//! feature detection ([`CpuFeatures`]).
use crate::{Arg, Result, TensorType, TuneParam, TuneValues};
use kiln_graph::Tensor;
use std::cell::RefCell;

/// A native kernel. `outputs` arrive allocated with the inferred dtypes and dims and
/// are overwritten; `inputs[i]` is `None` for an omitted optional input.
///
/// In place: a kernel with one output that reads each element of an input before it
/// writes the output element at the same index can let the output take over that
/// input's memory. [`CpuKernel::in_place_inputs`] names the inputs for which this holds
/// at given types (they must have the output's dtype and element count); a memory plan
/// that picks input `i` calls [`CpuKernel::run_in_place`] with `outputs[0]` holding
/// input `i`'s values and `inputs[i]` set to `None`.
pub trait CpuKernel: Send + Sync {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()>;

    /// Inputs whose memory the output may take over at these types (none by default).
    fn in_place_inputs(&self, _inputs: &[Option<&TensorType>], _output: &TensorType) -> Vec<usize> {
        vec![]
    }

    /// Runs with input `i`'s memory taken over by `outputs[0]` (see the trait's doc).
    fn run_in_place(&self, _inputs: &[Option<&Tensor>], i: usize, _outputs: &mut [Tensor]) -> Result<()> {
        Err(crate::OpError::Unsupported(format!("this kernel cannot run in place of input {i}")))
    }

    /// The choices this kernel offers at these types (algorithm, blocking, thread
    /// split), each with its default and candidates; the tuner measures them. None by
    /// default.
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        vec![]
    }

    /// A kernel specialised once per plan for these types, the values of constant
    /// inputs (`Arg::value`, e.g. weights to pack) and the chosen `tune` values (missing
    /// ones take their defaults). It is then run with the same inputs as `self` would
    /// be. `None` (the default): `self` runs as is.
    fn prepare(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType], _tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        Ok(None)
    }
}

/// Input `i`, which the op's inference already proved present.
pub fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor> {
    inputs.get(i).copied().flatten().ok_or_else(|| crate::OpError::input(i, "required input is missing"))
}

#[path = "cpu_features.rs"]
mod features;
#[path = "cpu_gang.rs"]
mod gang_impl;
#[path = "cpu_aligned.rs"]
mod aligned;
pub use aligned::{Aligned, AlignedF32};
pub use gang_impl::gang;
pub use features::CpuFeatures;
/// The f32 GEMM micro-kernels and the packed-operand GEMM built on them (kernels of
/// custom ops may use them too).
pub use crate::linalg::microkernel::{BlockedStore, Isa};
pub use crate::linalg::packed;

/// Whether the CPU has AVX2 and FMA (kernels compiled for them run 8 f32 lanes wide):
/// [`CpuFeatures::avx2_fma`] of the cached detection.
#[inline]
pub fn has_avx2() -> bool {
    CpuFeatures::get().avx2_fma()
}

/// Whether the CPU has AVX-512 F, BW, VL and DQ with AVX2 and FMA (what the kernels
/// compiled for 512-bit vectors assume).
pub fn has_avx512() -> bool {
    let f = CpuFeatures::get();
    f.avx2_fma() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq
}

/// A raw output pointer that parallel tasks write through at disjoint places.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// A raw pointer that parallel tasks share, each reading it or writing disjoint elements
/// through it (the caller's SAFETY comment says why they are disjoint).
#[derive(Clone, Copy)]
pub(crate) struct SharedPtr<T>(pub(crate) *mut T);
unsafe impl<T> Send for SharedPtr<T> {}
unsafe impl<T> Sync for SharedPtr<T> {}

impl<T> SharedPtr<T> {
    /// The pointer (a method, so that closures capture the whole `SharedPtr`).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

thread_local! {
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The threads kernels may share work between: the current rayon pool's, or 1 inside
/// [`serial`] and inside a chunk of a [`gang`]'s loop.
#[inline]
pub fn threads() -> usize {
    if SERIAL.with(|s| s.get()) || gang_impl::in_chunk() {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Runs `f` with every kernel it calls on the calling thread ([`threads`] is 1): for
/// runs too small to pay for waking other threads.
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _reset = Reset(SERIAL.with(|s| s.replace(true)));
    f()
}

/// Below this many elements of work a loop runs on the calling thread.
pub const PAR_GRAIN: usize = 1 << 14;

/// Runs `f(start, end)` over `0..n` in chunks, in parallel when `n * work_per_item` is
/// large enough to pay for it.
pub fn par_ranges(n: usize, work_per_item: usize, f: impl Fn(usize, usize) + Sync + Send) {
    par_chunks(n, work_per_item, |threads, total| (threads * 4).min(total / (PAR_GRAIN / 4)), f)
}

/// Like [`par_ranges`], in one contiguous range per thread (claimed like any chunk, so
/// a late thread's range is run by another): for loops whose neighbouring items share
/// data (a convolution's tiles of one filter panel), which each thread then reads once.
pub fn par_split(n: usize, work_per_item: usize, f: impl Fn(usize, usize) + Sync + Send) {
    par_chunks(n, work_per_item, |threads, _| threads, f)
}

/// `f` over `0..n` in about `chunks(threads, total work)` equal ranges (at least two,
/// at most `n`), on the gang where the caller holds one, else as rayon tasks; serial
/// when the work is too small or there is one thread.
fn par_chunks(n: usize, work_per_item: usize, chunks: impl Fn(usize, usize) -> usize, f: impl Fn(usize, usize) + Sync + Send) {
    let total = n.saturating_mul(work_per_item.max(1));
    let threads = threads().max(1);
    if total < PAR_GRAIN || threads == 1 || n < 2 {
        f(0, n);
        return;
    }
    let size = n.div_ceil(chunks(threads, total).min(n).max(2));
    let chunks = n.div_ceil(size);
    let body = |c: usize| f(c * size, ((c + 1) * size).min(n));
    if gang_impl::run(chunks, &body).is_some() {
        return;
    }
    rayon::scope(|s| {
        for c in 0..chunks {
            let body = &body;
            s.spawn(move |_| body(c));
        }
    });
}

/// Like [`par_ranges`] but hands each chunk its own disjoint slice of `out`
/// (`out.len() == n * per_item`).
pub fn par_chunks_mut<T: Send>(
    out: &mut [T],
    per_item: usize,
    work_per_item: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let per_item = per_item.max(1);
    let n = out.len() / per_item;
    let total = n.saturating_mul(work_per_item.max(1)).saturating_mul(per_item);
    let threads = threads().max(1);
    if total < PAR_GRAIN || threads == 1 || n < 2 {
        f(0, out);
        return;
    }
    let chunks = (threads * 4).min(n).max(2);
    let items = n.div_ceil(chunks);
    let (step, len) = (items * per_item, out.len());
    /// The output's address, shared by the chunks (each takes a disjoint part).
    struct Base<T>(*mut T);
    // SAFETY: only disjoint sub-slices are formed from it, one per chunk.
    unsafe impl<T: Send> Sync for Base<T> {}
    impl<T> Base<T> {
        fn at(&self, i: usize) -> *mut T {
            self.0.wrapping_add(i)
        }
    }
    let base = Base(out.as_mut_ptr());
    let body = |c: usize| {
        let start = c * step;
        let end = (start + step).min(len);
        // SAFETY: chunk `c` owns out[start..end], disjoint from every other chunk's,
        // and `out` is borrowed mutably for the whole loop.
        let part = unsafe { std::slice::from_raw_parts_mut(base.at(start), end - start) };
        f(c * items, part)
    };
    if gang_impl::run(len.div_ceil(step), &body).is_some() {
        return;
    }
    rayon::scope(|s| {
        for (c, part) in out.chunks_mut(step).enumerate() {
            let f = &f;
            s.spawn(move |_| f(c * items, part));
        }
    });
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Lends `f` a per-thread f32 scratch buffer of `len` elements starting on a cache line (contents
/// unspecified). It grows once and is reused, so steady-state runs do not allocate.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let taken = s.try_borrow_mut().ok().map(|mut b| std::mem::take(&mut *b));
        let mut buf = taken.unwrap_or_default();
        // Slack to start on a cache line (vector loads of packed panels never split).
        let want = len + aligned::LINE / 4;
        if buf.len() < want {
            buf.resize(want, 0.0);
        }
        let start = buf.as_ptr().align_offset(aligned::LINE).min(aligned::LINE / 4);
        let r = f(&mut buf[start..start + len]);
        if let Ok(mut b) = s.try_borrow_mut() {
            if b.len() < buf.len() {
                *b = buf;
            }
        }
        r
    })
}

/// `exp` for f32 by range reduction and a degree-6 polynomial (relative error ~2e-7),
/// written so that loops over it vectorize; inputs are clamped to [-87.3, 88.3].
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.3, 88.3);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((t.to_bits() as i32 - 0x4B40_0000 + 127) << 23) as u32);
    p * scale
}


/// `tanh` for f32 that vectorises: `(e^2x - 1) / (e^2x + 1)` through [`fast_exp`], and
/// an odd polynomial near 0 where that formula would cancel.
#[inline(always)]
pub fn fast_tanh(x: f32) -> f32 {
    let y = x.clamp(-9.0, 9.0);
    let e = fast_exp(2.0 * y);
    let big = (e - 1.0) / (e + 1.0);
    let x2 = x * x;
    let small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))));
    if x.abs() < 0.05 {
        small
    } else {
        big
    }
}

/// `erf` for f32 that vectorises: a Taylor series below |x| = 0.5 (relative error
/// under 1e-7 there, where erf is small) and Abramowitz & Stegun 7.1.26 through
/// [`fast_exp`] above (absolute error under 1.5e-7, where |erf| > 0.52).
#[inline(always)]
pub fn fast_erf(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let small = x * 1.128_379_2 * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 - x2 / 1320.0)))));
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let p = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let big = (1.0 - p * fast_exp(-a * a)).copysign(x);
    if a < 0.5 {
        small
    } else {
        big
    }
}

/// The logistic function for f32 through [`fast_exp`].
#[inline(always)]
pub fn fast_sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp(-x))
}

#[cfg(test)]
mod fast_math_tests {
    use super::{fast_erf, fast_exp, fast_sigmoid, fast_tanh};

    #[test]
    fn fast_erf_is_accurate() {
        for i in -6000..=6000 {
            let x = i as f32 * 0.0013;
            let (g, w) = (fast_erf(x) as f64, libm::erf(x as f64));
            assert!((g - w).abs() <= 2e-7 + 3e-7 * w.abs(), "erf({x}) = {g}, expected {w}");
        }
        for x in [1e-30f32, -1e-6, 3.0, -10.0, 1e30] {
            let (g, w) = (fast_erf(x) as f64, libm::erf(x as f64));
            assert!((g - w).abs() <= 1e-7 * w.abs().max(1e-30) + 2e-7, "erf({x}) = {g}, expected {w}");
        }
        assert!(fast_erf(f32::NAN).is_nan());
    }

    #[test]
    fn fast_exp_is_accurate() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.043;
            let (g, w) = (fast_exp(x) as f64, (x as f64).exp());
            assert!((g - w).abs() <= 1e-6 * w, "exp({x}) = {g}, expected {w}");
        }
        assert!(fast_exp(f32::NAN).is_nan());
        assert!(fast_exp(f32::NEG_INFINITY) < 1e-37);
        assert!(fast_exp(100.0).is_finite());
    }

    #[test]
    fn fast_tanh_and_sigmoid_are_accurate() {
        for i in -3000..=3000 {
            let x = i as f32 * 0.0037;
            let (t, w) = (fast_tanh(x) as f64, (x as f64).tanh());
            assert!((t - w).abs() <= 2e-7 + 1e-6 * w.abs(), "tanh({x}) = {t}, expected {w}");
            let (s, sw) = (fast_sigmoid(x) as f64, 1.0 / (1.0 + (-(x as f64)).exp()));
            assert!((s - sw).abs() <= 1e-6 * sw, "sigmoid({x}) = {s}, expected {sw}");
        }
        assert_eq!(fast_tanh(50.0), 1.0);
        assert_eq!(fast_tanh(-50.0), -1.0);
        assert!(fast_tanh(f32::NAN).is_nan());
    }
}
