//! Placing buffers with known lifetimes at offsets of one arena, so that buffers alive
//! at the same step never overlap: the memory plans of both backends use it (the CPU
//! in 8-byte words, the GPU in bytes), and the CPU's arena itself: the memory behind
//! the tensors of a CPU plan.
use kiln_graph::WordMemory;
use std::cell::UnsafeCell;

/// The memory plan's figures, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Total size of the buffers the plan allocates for intermediates.
    pub planned: u64,
    /// The most bytes of intermediates alive at one step (no plan can do better; an
    /// output written in place over its input counts once).
    pub lower_bound: u64,
    /// Every intermediate in its own buffer (no reuse).
    pub unshared: u64,
    /// Steps that write their output over an input's memory (CPU).
    pub in_place: usize,
}

/// A buffer to place: alive from step `first` to step `last` (inclusive), `size` units
/// long (the caller's unit: words on the CPU, bytes on the GPU).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub first: usize,
    pub last: usize,
    pub size: usize,
}

/// Places every span in one arena so that spans alive at the same step get disjoint
/// ranges. Six greedy orders (largest first, in step order, largest size x duration
/// first, longest-lived first, latest end first, largest first by end), each putting a
/// span into the tightest gap left by the spans already placed that overlap it in time;
/// the best order is then improved by a bounded local search until it reaches the
/// lower bound or its budget. A span of size `n` starts at a multiple of `align(n)`. Returns
/// each span's offset (in the order given) and the arena's size.
pub(crate) fn place(spans: &[Span], align: &dyn Fn(usize) -> usize) -> (Vec<usize>, usize) {
    let order = |key: &dyn Fn(usize) -> (usize, usize)| -> Vec<usize> {
        let mut o: Vec<usize> = (0..spans.len()).collect();
        o.sort_by_key(|&i| (key(i), i));
        o
    };
    let duration = |s: &Span| s.last.saturating_sub(s.first).min(1 << 20) + 1;
    let orders = [
        order(&|i| (usize::MAX - spans[i].size, spans[i].first)),
        order(&|i| (spans[i].first, usize::MAX - spans[i].size)),
        order(&|i| (usize::MAX - spans[i].size.saturating_mul(duration(&spans[i])), spans[i].first)),
        order(&|i| (usize::MAX - duration(&spans[i]), usize::MAX - spans[i].size)),
        order(&|i| (usize::MAX - spans[i].last.min(1 << 40), usize::MAX - spans[i].size)),
        order(&|i| (usize::MAX - spans[i].size, usize::MAX - spans[i].last.min(1 << 40))),
    ];
    let (mut order, (mut offsets, mut total)) =
        orders.into_iter().map(|o| (o.clone(), place_in(spans, &o, align))).min_by_key(|(_, (_, total))| *total).expect("six orders");
    // Then a bounded local search: swap spans of the best order, keep improvements
    // (deterministic; each try places every span against the others, so the budget of
    // about 2e6 span pairs keeps it to a few ms at any graph size).
    let n = spans.len();
    let floor = lower_bound(spans);
    let tries = (2_000_000 / (n * n).max(1)).min(500);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
    for _ in 0..tries {
        if total <= floor || n < 2 {
            break;
        }
        let mut candidate = order.clone();
        for _ in 0..3 {
            let (a, b) = (next(n), next(n));
            candidate.swap(a, b);
        }
        let (o, t) = place_in(spans, &candidate, align);
        if t < total {
            (order, offsets, total) = (candidate, o, t);
        }
    }
    (offsets, total)
}

/// The most units alive at one step: no placement can use less.
pub(crate) fn lower_bound(spans: &[Span]) -> usize {
    spans.iter().map(|s| spans.iter().filter(|o| o.first <= s.first && s.first <= o.last).map(|o| o.size).sum::<usize>()).max().unwrap_or(0)
}

fn place_in(spans: &[Span], order: &[usize], align: &dyn Fn(usize) -> usize) -> (Vec<usize>, usize) {
    let mut offsets = vec![0usize; spans.len()];
    let mut placed: Vec<usize> = vec![];
    let mut total = 0;
    let mut busy: Vec<(usize, usize)> = vec![];
    for &i in order {
        let s = spans[i];
        let align = align(s.size).max(1);
        busy.clear();
        busy.extend(placed.iter().filter(|&&j| spans[j].first <= s.last && s.first <= spans[j].last).map(|&j| (offsets[j], offsets[j] + spans[j].size)));
        busy.sort_unstable();
        // The tightest gap between busy ranges that fits, else the end.
        let mut best: Option<(usize, usize)> = None;
        let mut end = 0usize;
        for &(start, stop) in &busy {
            let at = end.next_multiple_of(align);
            if at + s.size <= start {
                let gap = start - end;
                if best.is_none_or(|(_, g)| gap < g) {
                    best = Some((at, gap));
                }
            }
            end = end.max(stop);
        }
        let offset = best.map(|(at, _)| at).unwrap_or_else(|| end.next_multiple_of(align));
        offsets[i] = offset;
        total = total.max(offset + s.size);
        placed.push(i);
    }
    (offsets, total)
}

/// A zeroed block of 8-byte words, shared by the tensors a memory plan places in it
/// (see `kiln_graph::WordMemory` for the rules that keep this sound).
pub(crate) struct Arena {
    words: Box<[UnsafeCell<u64>]>,
}

// SAFETY: the words are only reached through tensors placed by a memory plan, which
// never gives two live tensors overlapping ranges where one of them is written.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

// SAFETY: one boxed slice of `words` u64s, never moved or resized while it lives;
// UnsafeCell<u64> has the layout of u64 and allows writes through `&self`.
unsafe impl WordMemory for Arena {
    fn words(&self) -> usize {
        self.words.len()
    }

    fn word_ptr(&self, offset: usize) -> *mut u64 {
        debug_assert!(offset <= self.words.len());
        UnsafeCell::raw_get(self.words.as_ptr()).wrapping_add(offset)
    }
}

impl Arena {
    /// An arena of `words` zeroed 8-byte words.
    pub fn new(words: usize) -> Arena {
        Arena { words: (0..words).map(|_| UnsafeCell::new(0)).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans alive at the same step never share words, and every range is aligned.
    fn check(spans: &[Span]) -> usize {
        let align = |n: usize| if n >= 64 { 8 } else { 1 };
        let (offsets, total) = place(spans, &align);
        for (i, a) in spans.iter().enumerate() {
            assert_eq!(offsets[i] % align(a.size), 0);
            assert!(offsets[i] + a.size <= total);
            for (j, b) in spans.iter().enumerate().skip(i + 1) {
                let together = a.first <= b.last && b.first <= a.last;
                let apart = offsets[i] + a.size <= offsets[j] || offsets[j] + b.size <= offsets[i];
                assert!(!together || apart, "{a:?} at {} overlaps {b:?} at {}", offsets[i], offsets[j]);
            }
        }
        total
    }

    #[test]
    fn placement_reuses_gaps_of_larger_ranges() {
        // A big tensor, then two smaller ones alive together after it: both fit its range.
        let span = |first, last, size| Span { first, last, size };
        let total = check(&[span(0, 1, 400), span(1, 2, 100), span(2, 4, 100), span(3, 4, 100)]);
        assert_eq!(total, 500, "the lower bound: 400 + 100 words alive at step 1");
    }

    #[test]
    fn placement_is_disjoint_on_random_lifetimes() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as usize
        };
        for _ in 0..50 {
            let n = 1 + next(60);
            let spans: Vec<Span> = (0..n)
                .map(|_| {
                    let first = next(40);
                    Span { first, last: first + next(10), size: 1 + next(300) }
                })
                .collect();
            let total = check(&spans);
            let peak = (0..50).map(|k| spans.iter().filter(|s| s.first <= k && k <= s.last).map(|s| s.size).sum::<usize>()).max().unwrap();
            assert!(total >= peak);
        }
    }
}
