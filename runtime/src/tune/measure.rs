//! Timing one variant of a kernel, and checking that a variant computes what the
//! default computes.
//!
//! Timing: two warm-up runs (the first pays for compilation, packing and caches), then
//! samples of `reps` runs each, `reps` chosen so a sample lasts about
//! [`Sampling::sample_s`]; sampling stops when the median is within 2% of the minimum
//! (after [`Sampling::min_samples`]), after [`Sampling::max_samples`], or at the
//! variant's time cap. The estimate is the minimum (noise only adds time). A variant
//! whose minimum is [`Sampling::prune_ratio`] times the leader's after two samples is
//! dropped early.
use kiln_graph::{DType, Tensor};
use std::time::{Duration, Instant};

/// One variant under measurement.
pub(crate) trait Variant {
    /// Runs once and returns the outputs (for the comparison with the default).
    fn outputs(&mut self) -> Result<Vec<Tensor>, String>;
    /// Runs `reps` times back to back; seconds per run.
    fn time(&mut self, reps: usize) -> Result<f64, String>;
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Sampling {
    pub sample_s: f64,
    pub min_samples: usize,
    pub max_samples: usize,
    /// Most time spent on one variant.
    pub cap: Duration,
    pub prune_ratio: f64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { sample_s: 2e-3, min_samples: 3, max_samples: 12, cap: Duration::from_millis(400), prune_ratio: 1.5 }
    }
}

/// How a measurement ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Timing {
    /// Seconds per run.
    Done(f64),
    /// Far slower than the leader: seconds per run so far.
    Pruned(f64),
}

impl Timing {
    pub fn seconds(self) -> f64 {
        match self {
            Timing::Done(s) | Timing::Pruned(s) => s,
        }
    }
}

/// Times `v` (see the module docs); `leader` is the best time so far (None for the
/// default, which is never pruned); stops at `deadline`.
pub(crate) fn time_variant(v: &mut dyn Variant, cfg: &Sampling, leader: Option<f64>, deadline: Instant) -> Result<Timing, String> {
    let start = Instant::now();
    let end = deadline.min(start + cfg.cap);
    v.time(1)?;
    let once = v.time(1)?.max(1e-9);
    let reps = ((cfg.sample_s / once).ceil() as usize).clamp(1, 100_000);
    let mut samples: Vec<f64> = vec![];
    loop {
        samples.push(v.time(reps)?);
        let best = samples.iter().copied().fold(f64::INFINITY, f64::min);
        if let Some(l) = leader {
            if samples.len() >= 2 && best > cfg.prune_ratio * l {
                return Ok(Timing::Pruned(best));
            }
        }
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let settled = samples.len() >= cfg.min_samples && (median - best) <= 0.02 * best;
        if settled || samples.len() >= cfg.max_samples || Instant::now() >= end {
            return Ok(Timing::Done(best));
        }
    }
}

/// Whether `got` matches `want` (the default variant's outputs on the same inputs):
/// same dtypes and dims; integers and bools equal; floats within a tolerance relative
/// to each element and to the output's magnitude, NaN where the default has NaN.
pub fn same_outputs(want: &[Tensor], got: &[Tensor]) -> Result<(), String> {
    if want.len() != got.len() {
        return Err(format!("{} outputs instead of {}", got.len(), want.len()));
    }
    for (k, (w, g)) in want.iter().zip(got).enumerate() {
        if w.dtype() != g.dtype() || w.dims() != g.dims() {
            return Err(format!("output {k} is {}{:?} instead of {}{:?}", g.dtype(), g.dims(), w.dtype(), w.dims()));
        }
        let rtol = match w.dtype() {
            DType::F32 => 1e-3,
            DType::F64 => 1e-9,
            DType::F16 | DType::BF16 => 1e-2,
            _ => 0.0,
        };
        let (wv, gv) = (w.to_f64_vec(), g.to_f64_vec());
        let scale = wv.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
        for (i, (a, b)) in wv.iter().zip(&gv).enumerate() {
            let ok = if a.is_nan() || b.is_nan() {
                a.is_nan() && b.is_nan()
            } else if a.is_infinite() || b.is_infinite() {
                a == b
            } else {
                (a - b).abs() <= rtol * (a.abs() + 0.1 * scale) + if rtol > 0.0 { 1e-6 } else { 0.0 }
            };
            if !ok {
                return Err(format!("output {k} differs from the default's at element {i}: {b} instead of {a}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        per_run: f64,
        runs: usize,
    }

    impl Variant for Fake {
        fn outputs(&mut self) -> Result<Vec<Tensor>, String> {
            Ok(vec![])
        }
        fn time(&mut self, reps: usize) -> Result<f64, String> {
            self.runs += reps;
            Ok(self.per_run)
        }
    }

    #[test]
    fn slow_variants_are_pruned_and_steady_ones_settle() {
        let far = Instant::now() + Duration::from_secs(60);
        let cfg = Sampling::default();
        let mut fast = Fake { per_run: 1e-4, runs: 0 };
        assert_eq!(time_variant(&mut fast, &cfg, None, far).unwrap(), Timing::Done(1e-4));
        let mut slow = Fake { per_run: 1e-3, runs: 0 };
        assert!(matches!(time_variant(&mut slow, &cfg, Some(1e-4), far).unwrap(), Timing::Pruned(_)));
        // The default (no leader) is never pruned.
        assert!(matches!(time_variant(&mut slow, &cfg, None, far).unwrap(), Timing::Done(_)));
    }

    #[test]
    fn outputs_compare_relative_to_magnitude() {
        let t = |v: &[f32]| Tensor::from_slice(&[v.len()], v).unwrap();
        assert!(same_outputs(&[t(&[1000.0, 1.0])], &[t(&[1000.2, 1.0])]).is_ok());
        assert!(same_outputs(&[t(&[1.0, 2.0])], &[t(&[1.0, 2.1])]).is_err());
        assert!(same_outputs(&[t(&[f32::NAN])], &[t(&[f32::NAN])]).is_ok());
        assert!(same_outputs(&[t(&[f32::NAN])], &[t(&[0.0])]).is_err());
        assert!(same_outputs(&[t(&[1.0])], &[t(&[1.0, 2.0])]).is_err());
        let i = |v: &[i64]| Tensor::from_slice(&[v.len()], v).unwrap();
        assert!(same_outputs(&[i(&[5])], &[i(&[6])]).is_err());
    }
}
