//! The CPU side of an op: the [`CpuKernel`] trait and helpers shared by kernels
//! (parallel loops, per-thread scratch memory).
use crate::Result;
use kiln_graph::Tensor;
use std::cell::RefCell;

/// A native kernel. `outputs` arrive allocated with the inferred dtypes and dims and
/// are overwritten; `inputs[i]` is `None` for an omitted optional input.
pub trait CpuKernel: Send + Sync {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()>;
}

/// Input `i`, which the op's inference already proved present.
pub fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor> {
    inputs.get(i).copied().flatten().ok_or_else(|| crate::OpError::input(i, "required input is missing"))
}

/// Below this many elements of work a loop runs on the calling thread.
pub const PAR_GRAIN: usize = 1 << 14;

/// Runs `f(start, end)` over `0..n` in chunks, in parallel when `n * work_per_item` is
/// large enough to pay for it.
pub fn par_ranges(n: usize, work_per_item: usize, f: impl Fn(usize, usize) + Sync + Send) {
    let total = n.saturating_mul(work_per_item.max(1));
    let threads = rayon::current_num_threads().max(1);
    if total < PAR_GRAIN || threads == 1 || n < 2 {
        f(0, n);
        return;
    }
    let chunks = (threads * 4).min(n).min(total / (PAR_GRAIN / 4)).max(2);
    let size = n.div_ceil(chunks);
    rayon::scope(|s| {
        for c in 0..chunks {
            let (a, b) = (c * size, ((c + 1) * size).min(n));
            if a < b {
                let f = &f;
                s.spawn(move |_| f(a, b));
            }
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
    let threads = rayon::current_num_threads().max(1);
    if total < PAR_GRAIN || threads == 1 || n < 2 {
        f(0, out);
        return;
    }
    let chunks = (threads * 4).min(n).max(2);
    let items = n.div_ceil(chunks);
    rayon::scope(|s| {
        for (c, part) in out.chunks_mut(items * per_item).enumerate() {
            let f = &f;
            s.spawn(move |_| f(c * items, part));
        }
    });
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Lends `f` a per-thread f32 scratch buffer of at least `len` elements (contents
/// unspecified). It grows once and is reused, so steady-state runs do not allocate.
pub fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let taken = s.try_borrow_mut().ok().map(|mut b| std::mem::take(&mut *b));
        let mut buf = taken.unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        let r = f(&mut buf[..len]);
        if let Ok(mut b) = s.try_borrow_mut() {
            if b.len() < buf.len() {
                *b = buf;
            }
        }
        r
    })
}
