//! The tuner: for each distinct key of a specialisation, coordinate descent over the
//! kernel's parameters (one parameter varied at a time from the best so far), each
//! variant checked against the default's outputs before it is timed.
//!
//! Invariants: the default is always measured in full and is the first leader; a
//! variant wins only when its outputs match the default's on the same inputs
//! ([`same_outputs`]) and it is more than [`TIE`] faster than the leader (near-ties go
//! to the leader, so to the default first); nothing is stored for a key the budget cut
//! short.
use super::choices::Choices;
use super::cpu_bench::CpuBench;
use super::gpu_bench::GpuBench;
use super::key::{DeviceFingerprint, TuneKey};
use super::measure::{same_outputs, time_variant, Sampling, Timing, Variant};
use super::report::{values_text, KeyReport, KeyStatus, TuneOptions, TuneProgress, TuneReport};
use super::step::{cpu_key, gpu_key};
use super::TuneEntry;
use crate::gpu::GpuContext;
use crate::Result;
use kiln_graph::Graph;
use kiln_ops::infer::{Specialized, Step};
use kiln_ops::{Op, TuneParam, TuneValues};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// A variant must be this much faster than the leader to take its place.
pub const TIE: f64 = 0.03;

/// Something that builds variants of one kernel.
pub(crate) trait Bench {
    fn variant(&self, tune: &TuneValues) -> std::result::Result<Box<dyn Variant + '_>, String>;
}

impl Bench for CpuBench<'_> {
    fn variant(&self, tune: &TuneValues) -> std::result::Result<Box<dyn Variant + '_>, String> {
        CpuBench::variant(self, tune)
    }
}

impl Bench for GpuBench<'_> {
    fn variant(&self, tune: &TuneValues) -> std::result::Result<Box<dyn Variant + '_>, String> {
        GpuBench::variant(self, tune)
    }
}

/// The result of a descent.
pub(crate) struct Outcome {
    pub default_s: f64,
    pub best_s: f64,
    pub best: TuneValues,
    pub tried: usize,
    pub rejected: Vec<(String, String)>,
    /// False when the deadline cut the descent short.
    pub complete: bool,
}

/// `values` with `name` set to `v`; values equal to their default are left out, so the
/// defaults are the empty set.
fn with(values: &TuneValues, p: &TuneParam, v: u32) -> TuneValues {
    let mut out = values.clone();
    if v == p.default {
        out.0.remove(p.name);
    } else {
        out.0.insert(p.name.to_string(), v);
    }
    out
}

/// Coordinate descent over `params` (see the module docs). An error when the default
/// variant itself cannot be built, run or timed.
pub(crate) fn descend(bench: &dyn Bench, params: &[TuneParam], what: &str, cfg: &Sampling, deadline: Instant) -> std::result::Result<Outcome, String> {
    let (reference, default_s) = {
        let mut v = bench.variant(&TuneValues::default())?;
        let outs = v.outputs()?;
        (outs, time_variant(v.as_mut(), cfg, None, deadline)?.seconds())
    };
    let mut out = Outcome { default_s, best_s: default_s, best: TuneValues::default(), tried: 1, rejected: vec![], complete: true };
    let mut seen: HashSet<TuneValues> = [TuneValues::default()].into_iter().collect();
    'params: for p in params {
        let mut values: Vec<u32> = p.candidates.clone();
        if !values.contains(&p.default) {
            values.push(p.default);
        }
        for v in values {
            let tv = with(&out.best, p, v);
            if !seen.insert(tv.clone()) {
                continue;
            }
            if Instant::now() >= deadline {
                out.complete = false;
                break 'params;
            }
            out.tried += 1;
            let label = values_text(&tv.0);
            let mut variant = match bench.variant(&tv) {
                Ok(v) => v,
                Err(e) => {
                    log::info!("{what}: variant {label} does not build: {e}");
                    out.rejected.push((label, format!("does not build: {e}")));
                    continue;
                }
            };
            let checked = variant.outputs().and_then(|o| same_outputs(&reference, &o));
            if let Err(why) = checked {
                log::warn!("{what}: variant {label} rejected: {why}");
                out.rejected.push((label, why));
                continue;
            }
            match time_variant(variant.as_mut(), cfg, Some(out.best_s), deadline) {
                Ok(Timing::Done(s)) if s < out.best_s * (1.0 - TIE) => {
                    log::debug!("{what}: {label} leads with {:.4} ms (was {:.4} ms)", s * 1e3, out.best_s * 1e3);
                    out.best = tv;
                    out.best_s = s;
                }
                Ok(t) => log::debug!("{what}: {label} {:.4} ms{}", t.seconds() * 1e3, if matches!(t, Timing::Pruned(_)) { " (pruned)" } else { "" }),
                Err(e) => {
                    log::info!("{what}: variant {label} failed while timed: {e}");
                    out.rejected.push((label, format!("failed while timed: {e}")));
                }
            }
        }
    }
    Ok(out)
}

/// Where a step runs, for the tuner.
#[derive(Clone)]
pub(crate) enum StepDevice {
    Cpu,
    Gpu(Arc<GpuContext>),
}

/// One key to tune: the first step with it, where it runs, its parameters.
struct Job<'s> {
    key: TuneKey,
    /// The op's cost estimate (flops + bytes): expensive kernels are measured first, so
    /// that a short budget goes where it pays most.
    cost: u64,
    step: &'s Step,
    device: StepDevice,
    fingerprint: DeviceFingerprint,
    params: Vec<TuneParam>,
}

/// Tunes the steps of a placed specialisation (`devices[i]` runs `spec.steps[i]`):
/// every distinct key whose kernel has parameters, most expensive first (by the ops'
/// cost estimates), within the budget; stores what it measured in the session's
/// choices and in its database.
pub(crate) fn tune_steps(
    graph: &Graph,
    ops: &[Box<dyn Op>],
    spec: &Specialized,
    devices: &[StepDevice],
    choices: &Choices,
    opts: &TuneOptions,
    progress: &mut dyn FnMut(&TuneProgress),
) -> Result<TuneReport> {
    let start = Instant::now();
    let deadline = start + opts.budget;
    let mut jobs: Vec<Job> = vec![];
    let mut seen: HashSet<String> = HashSet::new();
    for (step, dev) in spec.steps.iter().zip(devices) {
        let op = ops[step.node].as_ref();
        if op.is_view() {
            continue;
        }
        let args = spec.args(&step.inputs);
        let outs: Vec<kiln_ops::TensorType> = step.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
        let (key, fingerprint, params) = match dev {
            StepDevice::Cpu => {
                let Some(k) = op.cpu() else { continue };
                let fp = choices.cpu_device().clone();
                (cpu_key(graph, op, spec, step, &fp), fp, k.params(&args, &outs))
            }
            StepDevice::Gpu(ctx) => {
                let Some(k) = op.wgsl() else { continue };
                let Ok(default) = k.generate(&args, &outs, &TuneValues::default()) else { continue };
                let fp = DeviceFingerprint::gpu(&ctx.info);
                (gpu_key(graph, spec, step, &fp, &default), fp, k.params(&args, &outs))
            }
        };
        if !params.iter().any(|p| p.candidates.iter().any(|&c| c != p.default)) || !seen.insert(key.text()) {
            continue;
        }
        let c = op.cost(&args, &outs);
        jobs.push(Job { key, cost: c.flops.saturating_add(c.bytes), step, device: dev.clone(), fingerprint, params });
    }
    jobs.sort_by_key(|j| std::cmp::Reverse(j.cost));
    let total = jobs.len();
    let mut report = TuneReport::default();
    let mut measured: BTreeMap<String, (DeviceFingerprint, BTreeMap<String, TuneEntry>)> = BTreeMap::new();
    let cfg = Sampling::default();
    for (done, job) in jobs.iter().enumerate() {
        let summary = job.key.summary();
        progress(&TuneProgress { done, total, current: summary.clone(), elapsed: start.elapsed(), budget: opts.budget });
        if !report.devices.contains(&job.fingerprint.name) {
            report.devices.push(job.fingerprint.name.clone());
        }
        let node = graph.nodes[job.step.node].name.clone();
        let mut kr = KeyReport::pending(job.key.text(), summary.clone(), node, job.fingerprint.name.clone());
        if !opts.retune {
            if let Some((e, _)) = choices.find(&job.key, &job.fingerprint, &job.params)? {
                kr.default_ms = e.default_ms;
                kr.best_ms = e.best_ms;
                kr.values = e.values;
                kr.status = KeyStatus::AlreadyTuned;
                report.keys.push(kr);
                continue;
            }
        }
        if Instant::now() >= deadline {
            report.keys.push(kr);
            continue;
        }
        let op = ops[job.step.node].as_ref();
        let what = format!("{summary} on {}", job.fingerprint.name);
        let outcome = match &job.device {
            StepDevice::Cpu => CpuBench::new(op, spec, job.step).and_then(|b| descend(&b, &job.params, &what, &cfg, deadline)),
            StepDevice::Gpu(ctx) => GpuBench::new(ctx.clone(), op, spec, job.step).and_then(|b| descend(&b, &job.params, &what, &cfg, deadline)),
        };
        match outcome {
            Ok(o) => {
                kr.default_ms = o.default_s * 1e3;
                kr.best_ms = o.best_s * 1e3;
                kr.values = o.best.0;
                kr.tried = o.tried;
                kr.rejected = o.rejected;
                if o.complete {
                    kr.status = KeyStatus::Tuned;
                    let e = kr.entry().expect("tuned keys have entries");
                    let slot = measured.entry(job.fingerprint.id()).or_insert_with(|| (job.fingerprint.clone(), BTreeMap::new()));
                    slot.1.insert(kr.key.clone(), e);
                }
            }
            Err(e) => {
                log::warn!("{what}: not tuned: {e}");
                kr.status = KeyStatus::Failed(e);
            }
        }
        report.keys.push(kr);
    }
    progress(&TuneProgress { done: total, total, current: String::new(), elapsed: start.elapsed(), budget: opts.budget });
    let mut paths: Vec<PathBuf> = vec![];
    for (fp, entries) in measured.values() {
        if let Some(path) = choices.store(fp, entries)? {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    report.databases = paths;
    report.elapsed = start.elapsed();
    log::info!("tuned {} of {} keys in {:.1} s", report.keys.iter().filter(|k| k.status == KeyStatus::Tuned).count(), total, report.elapsed.as_secs_f64());
    Ok(report)
}
