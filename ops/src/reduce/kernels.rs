//! What each ReduceX computes (initial value, fold, finish; on f64 and i64 and as WGSL)
//! and the parallel CPU driver that applies a fold over a [`ReduceLayout`].
use super::layout::ReduceLayout;
use crate::cpu;
use kiln_graph::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

/// A float accumulator: `a` is the running value; `m` the running max (LogSumExp only,
/// where `a` is the sum of `exp(x - m)`).
#[derive(Clone, Copy, Debug)]
pub struct Acc {
    pub a: f64,
    pub m: f64,
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}
fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 10] = [
        ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod,
        ReduceKind::L1, ReduceKind::L2, ReduceKind::LogSum, ReduceKind::LogSumExp, ReduceKind::SumSquare,
    ];

    pub fn op_name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }

    /// Whether integer inputs reduce exactly in i64 (the others go through f64).
    pub fn exact_on_ints(self) -> bool {
        !matches!(self, ReduceKind::L2 | ReduceKind::LogSum | ReduceKind::LogSumExp)
    }

    pub fn init_f64(self) -> Acc {
        let a = match self {
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
            ReduceKind::Prod => 1.0,
            _ => 0.0,
        };
        Acc { a, m: f64::NEG_INFINITY }
    }

    #[inline]
    pub fn fold_f64(self, acc: Acc, x: f64) -> Acc {
        let a = acc.a;
        match self {
            ReduceKind::Sum | ReduceKind::Mean | ReduceKind::LogSum => Acc { a: a + x, m: acc.m },
            ReduceKind::Max => Acc { a: nan_max(a, x), m: acc.m },
            ReduceKind::Min => Acc { a: nan_min(a, x), m: acc.m },
            ReduceKind::Prod => Acc { a: a * x, m: acc.m },
            ReduceKind::L1 => Acc { a: a + x.abs(), m: acc.m },
            ReduceKind::L2 | ReduceKind::SumSquare => Acc { a: a + x * x, m: acc.m },
            ReduceKind::LogSumExp => {
                // Online log-sum-exp: rescale the sum when the max grows.
                if x > acc.m {
                    let scale = if acc.m == f64::NEG_INFINITY { 0.0 } else { (acc.m - x).exp() };
                    Acc { a: a * scale + 1.0, m: x }
                } else if x == f64::NEG_INFINITY && acc.m == f64::NEG_INFINITY {
                    acc
                } else {
                    Acc { a: a + (x - acc.m).exp(), m: acc.m }
                }
            }
        }
    }

    /// Combines two partial accumulators (of disjoint parts of one reduction).
    pub fn merge_f64(self, x: Acc, y: Acc) -> Acc {
        match self {
            ReduceKind::Max => Acc { a: nan_max(x.a, y.a), m: x.m },
            ReduceKind::Min => Acc { a: nan_min(x.a, y.a), m: x.m },
            ReduceKind::Prod => Acc { a: x.a * y.a, m: x.m },
            ReduceKind::LogSumExp => {
                if y.m == f64::NEG_INFINITY {
                    return x;
                }
                if x.m == f64::NEG_INFINITY {
                    return y;
                }
                let m = x.m.max(y.m);
                let scale = |v: f64| if v == m { 1.0 } else { (v - m).exp() };
                Acc { a: x.a * scale(x.m) + y.a * scale(y.m), m }
            }
            _ => Acc { a: x.a + y.a, m: x.m },
        }
    }

    pub fn merge_i64(self, x: i64, y: i64) -> i64 {
        match self {
            ReduceKind::Max => x.max(y),
            ReduceKind::Min => x.min(y),
            ReduceKind::Prod => x.wrapping_mul(y),
            _ => x.wrapping_add(y),
        }
    }

    pub fn finish_f64(self, acc: Acc, count: usize) -> f64 {
        match self {
            ReduceKind::Mean => acc.a / count as f64,
            ReduceKind::L2 => acc.a.sqrt(),
            ReduceKind::LogSum => acc.a.ln(),
            ReduceKind::LogSumExp => {
                if acc.m.is_infinite() && !acc.a.is_nan() { acc.m } else { acc.m + acc.a.ln() }
            }
            _ => acc.a,
        }
    }

    /// Initial value on integers; Max/Min start at the dtype's extremes.
    pub fn init_i64(self, dtype: DType) -> i64 {
        let (lo, hi) = match dtype {
            DType::I8 => (i8::MIN as i64, i8::MAX as i64),
            DType::I16 => (i16::MIN as i64, i16::MAX as i64),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::U8 => (0, u8::MAX as i64),
            DType::U16 => (0, u16::MAX as i64),
            DType::U32 => (0, u32::MAX as i64),
            DType::U64 => (0, i64::MAX),
            DType::Bool => (0, 1),
            _ => (i64::MIN, i64::MAX),
        };
        match self {
            ReduceKind::Max => lo,
            ReduceKind::Min => hi,
            ReduceKind::Prod => 1,
            _ => 0,
        }
    }

    #[inline]
    pub fn fold_i64(self, a: i64, x: i64) -> i64 {
        match self {
            ReduceKind::Max => a.max(x),
            ReduceKind::Min => a.min(x),
            ReduceKind::Prod => a.wrapping_mul(x),
            ReduceKind::L1 => a.wrapping_add(x.wrapping_abs()),
            ReduceKind::SumSquare | ReduceKind::L2 => a.wrapping_add(x.wrapping_mul(x)),
            _ => a.wrapping_add(x),
        }
    }

    pub fn finish_i64(self, a: i64, count: usize) -> i64 {
        match self {
            ReduceKind::Mean if count > 0 => a / count as i64,
            _ => a,
        }
    }

    /// WGSL initial value for accumulator type `ty`.
    pub fn wgsl_init(self, ty: &str) -> String {
        let v = match (self, ty) {
            (ReduceKind::Max, "f32") => f64::NEG_INFINITY,
            (ReduceKind::Min, "f32") => f64::INFINITY,
            (ReduceKind::Max, "i32") => i32::MIN as f64,
            (ReduceKind::Min, "i32") => i32::MAX as f64,
            (ReduceKind::Max, _) => 0.0,
            (ReduceKind::Min, _) => u32::MAX as f64,
            (ReduceKind::Prod, _) => 1.0,
            _ => 0.0,
        };
        crate::wgsl::literal(ty, v)
    }

    /// WGSL expression folding `v` into `acc`, of type `ty` (LogSumExp is generated
    /// separately). On f32, Max and Min propagate NaN (WGSL's max/min need not).
    pub fn wgsl_fold(self, acc: &str, v: &str, ty: &str) -> String {
        match self {
            ReduceKind::Max if ty == "f32" => crate::elementwise::wgsl_max(acc, v),
            ReduceKind::Min if ty == "f32" => crate::elementwise::wgsl_min(acc, v),
            ReduceKind::Max => format!("max({acc}, {v})"),
            ReduceKind::Min => format!("min({acc}, {v})"),
            ReduceKind::Prod => format!("{acc} * {v}"),
            ReduceKind::L1 => format!("{acc} + abs({v})"),
            ReduceKind::L2 | ReduceKind::SumSquare => format!("{acc} + {v} * {v}"),
            _ => format!("{acc} + {v}"),
        }
    }

    /// WGSL expression of the result from `acc` after `count` elements.
    pub fn wgsl_finish(self, acc: &str, count: usize, ty: &str) -> String {
        match self {
            ReduceKind::Mean if ty == "f32" => format!("{acc} / {}", crate::wgsl::literal("f32", count as f64)),
            ReduceKind::Mean if count > 0 => format!("{acc} / {}", crate::wgsl::literal(ty, count as f64)),
            ReduceKind::L2 => format!("sqrt({acc})"),
            ReduceKind::LogSum => format!("log({acc})"),
            _ => acc.to_string(),
        }
    }
}

/// Reduces into every output element `o` (row-major): folds `fold(acc, offset)` over the
/// input offsets reduced into it, starting at `init`, then writes `finish(acc)`.
/// Parallel over output elements when the work is large.
pub fn reduce_rows<A: Copy + Send + Sync, O: Send>(
    layout: &ReduceLayout,
    out: &mut [O],
    init: A,
    fold: impl Fn(A, usize) -> A + Sync + Send,
    merge: impl Fn(A, A) -> A + Sync + Send,
    finish: impl Fn(A) -> O + Sync + Send,
) {
    let count = layout.reduced_len();
    let inner = layout.inner;
    if out.len() != layout.out_len() {
        return;
    }
    if layout.contiguous_rows() {
        cpu::par_chunks_mut(out, 1, count, |first, part| {
            for (q, o) in part.iter_mut().enumerate() {
                // Four independent accumulators, merged at the end.
                let base = layout.base(first + q);
                let mut accs = [init; 4];
                let whole = count / 4 * 4;
                for c in (base..base + whole).step_by(4) {
                    for (l, acc) in accs.iter_mut().enumerate() {
                        *acc = fold(*acc, c + l);
                    }
                }
                for i in base + whole..base + count {
                    accs[0] = fold(accs[0], i);
                }
                *o = finish(merge(merge(accs[0], accs[1]), merge(accs[2], accs[3])));
            }
        });
        return;
    }
    let offsets = layout.reduced_offsets();
    const BLOCK: usize = 64;
    cpu::par_chunks_mut(out, 1, count, |first, part| {
        // Walk the chunk in runs of up to BLOCK outputs sharing one outer index, so
        // each reduced offset reads a contiguous run of the input.
        let mut q = 0;
        while q < part.len() {
            let o = first + q;
            let (outer, j) = (o / inner, o % inner);
            let run = (inner - j).min(BLOCK).min(part.len() - q);
            let base = layout.base(outer) + j;
            let mut accs = [init; BLOCK];
            for &r in &offsets {
                for (t, acc) in accs[..run].iter_mut().enumerate() {
                    *acc = fold(*acc, base + r + t);
                }
            }
            for t in 0..run {
                part[q + t] = finish(accs[t]);
            }
            q += run;
        }
    });
}
