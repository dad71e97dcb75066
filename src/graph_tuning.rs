//! Graph-level tuned choices: which of the optional passes
//! ([`passes::tunable_passes`]: fuse-attention, the channel-blocked layouts) run for one
//! model on one device. Whether a fusion or a layout pays depends on the device and the
//! model, so beside the target's fixed defaults the tuner measures the model both ways.
//!
//! Key ([`key`]): the model's structure hash ([`crate::load::Loaded::model_hash`]), the
//! pass target, the device fingerprint, and the sources of the compiler and the kernels
//! (a changed pass or kernel never reuses an old choice). Values: one parameter per
//! tunable pass, 1 on, 0 off; stored in the same database as the kernels' choices. A
//! `.kiln` artifact holds the graph its passes made, so its choice travels with it.
//!
//! Invariants: the defaults are measured first and lead; a variant is one pass toggled
//! from the leader (coordinate descent), skipped when it makes the same graph; it wins
//! only when its outputs match the defaults' ([`same_outputs`]) and it is more than
//! [`TIE`] faster, measured alternately with the leader in one call
//! ([`compare_latency`]); a descent the deadline cut short is neither stored nor used
//! ([`settled`]).
use kiln_compiler::passes::{self, PassChoices, Target};
use kiln_graph::{Graph, Tensor};
use kiln_ops::TuneParam;
use kiln_runtime::tune::{same_outputs, KeyReport, KeyStatus, TuneEntry, TuneKey, TIE};
use kiln_runtime::Session;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The name of a pass target in keys.
fn target_name(target: Target) -> &'static str {
    match target {
        Target::Any => "any",
        Target::Cpu => "cpu",
        Target::Gpu => "gpu",
    }
}

/// One parameter per pass a tuner may toggle for `target`: candidates 0 (off) and 1
/// (on), the target's default first.
pub fn params(target: Target) -> Vec<TuneParam> {
    passes::tunable_passes(target).into_iter().map(|(name, on)| TuneParam { name, default: on as u32, candidates: vec![on as u32, !on as u32] }).collect()
}

/// The key of `model_hash`'s pass choice for `target` on `session`'s device.
pub fn key(session: &Session, model_hash: &str, target: Target) -> TuneKey {
    let version = format!("passes-{}-{}", kiln_compiler::SOURCE_HASH, kiln_ops::SOURCE_HASH);
    TuneKey::graph(model_hash, target_name(target), &session.device_fingerprint(), version)
}

/// Stored values (parameters left out are at their defaults) as pass choices.
pub fn choices_of(values: &BTreeMap<String, u32>) -> PassChoices {
    values.iter().map(|(k, &v)| (k.clone(), v != 0)).collect()
}

/// The pass choice a [`tune_passes`] report settled on, when it differs from the
/// defaults: None also for a descent the budget cut short (its leader is neither stored
/// nor used, as with kernels).
pub fn settled(report: &KeyReport) -> Option<PassChoices> {
    matches!(report.status, KeyStatus::Tuned | KeyStatus::AlreadyTuned).then(|| choices_of(&report.values)).filter(|c| !c.is_empty())
}

/// The stored pass choice for the model on `session`'s device, when one differs from
/// the target's defaults (None also for [`Target::Any`] and for a stale entry, which
/// is ignored with a warning).
pub fn stored(session: &Session, model_hash: &str, target: Target) -> kiln_runtime::Result<Option<PassChoices>> {
    let ps = params(target);
    if ps.is_empty() {
        return Ok(None);
    }
    Ok(session.stored_choice(&key(session, model_hash, target), &ps)?.map(|(e, _)| choices_of(&e.values)).filter(|c| !c.is_empty()))
}

/// Median milliseconds per run of two sessions of one model, measured alternately (a
/// run of one, then of the other, after a few warm-up runs each) for about `span`
/// (5 to 200 runs each), so that drift and other load on the machine hit both alike.
pub fn compare_latency(a: &Session, b: &Session, inputs: &[(String, Tensor)], span: Duration) -> kiln_runtime::Result<(f64, f64)> {
    let ms = latencies(&[a, b], inputs, span)?;
    Ok((ms[0], ms[1]))
}

/// Median milliseconds per run of each session, run in turn (see [`compare_latency`]).
fn latencies(sessions: &[&Session], inputs: &[(String, Tensor)], span: Duration) -> kiln_runtime::Result<Vec<f64>> {
    let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for _ in 0..3 {
        for s in sessions {
            s.run(&refs)?;
        }
    }
    let start = Instant::now();
    let mut times: Vec<Vec<f64>> = vec![vec![]; sessions.len()];
    while times[0].len() < 5 || (times[0].len() < 200 && start.elapsed() < span) {
        for (s, t) in sessions.iter().zip(&mut times) {
            let t0 = Instant::now();
            s.run(&refs)?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(times
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect())
}

/// A graph the passes made for some choices, and an untuned session of it (kernels at
/// their defaults, so that only the graph differs between variants).
pub type Build<'a> = dyn Fn(&PassChoices) -> Result<(Graph, Session), Error> + 'a;

/// Why a graph could not be built or measured.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Tunes the pass choice of the model `model_hash` for `target` (see the module docs).
/// `session`: a session of the model with the default passes on the device to tune for,
/// whose database the choice is looked up in and stored to; `build` makes the variants.
/// Returns the report (its values: the chosen passes that differ from the defaults) and
/// the database written, if any.
pub fn tune_passes(session: &Session, model_hash: &str, target: Target, build: &Build, inputs: &[(String, Tensor)], retune: bool, deadline: Instant) -> Result<(KeyReport, Option<PathBuf>), Error> {
    let ps = params(target);
    let k = key(session, model_hash, target);
    let summary = format!("passes ({})", ps.iter().map(|p| p.name).collect::<Vec<_>>().join(", "));
    let mut report = KeyReport::pending(k.text(), summary, String::new(), session.device_fingerprint().name);
    if ps.is_empty() {
        report.status = KeyStatus::Failed(format!("no pass choices for target '{}'", target_name(target)));
        return Ok((report, None));
    }
    if !retune {
        if let Some((e, src)) = session.stored_choice(&k, &ps)? {
            log::info!("pass choice for this model found ({src:?})");
            (report.default_ms, report.best_ms, report.values, report.status) = (e.default_ms, e.best_ms, e.values, KeyStatus::AlreadyTuned);
            return Ok((report, None));
        }
    }
    if Instant::now() >= deadline {
        return Ok((report, None));
    }
    let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut best = PassChoices::new();
    let (graph, mut leader) = build(&best)?;
    let reference = leader.run(&refs)?;
    let mut seen = vec![passes::dump(&graph)];
    // The defaults' time (from the first comparison) and the leader's latest.
    let (mut default_ms, mut leader_ms) = (None, 0.0);
    report.tried = 1;
    let mut complete = true;
    for p in &ps {
        if Instant::now() >= deadline {
            complete = false;
            break;
        }
        let mut variant = best.clone();
        let on = !best.get(p.name).copied().unwrap_or(p.default != 0);
        if on == (p.default != 0) {
            variant.remove(p.name);
        } else {
            variant.insert(p.name.to_string(), on);
        }
        let label = format!("{}={}", p.name, on as u32);
        let (graph, candidate) = match build(&variant) {
            Ok(v) => v,
            Err(e) => {
                report.rejected.push((label, format!("does not build: {e}")));
                continue;
            }
        };
        let text = passes::dump(&graph);
        if seen.contains(&text) {
            log::debug!("{label}: the same graph as a variant measured already");
            continue;
        }
        seen.push(text);
        report.tried += 1;
        let outputs = candidate.run(&refs).map_err(|e| e.to_string());
        if let Err(why) = outputs.and_then(|o| same_outputs(&reference, &o)) {
            log::warn!("pass choice {label} rejected: {why}");
            report.rejected.push((label, why));
            continue;
        }
        let (lead_ms, cand_ms) = compare_latency(&leader, &candidate, inputs, Duration::from_secs(1))?;
        default_ms.get_or_insert(lead_ms);
        leader_ms = lead_ms;
        log::info!("pass choice {label}: {cand_ms:.4} ms against {lead_ms:.4} ms");
        if cand_ms < lead_ms * (1.0 - TIE) {
            (best, leader, leader_ms) = (variant, candidate, cand_ms);
        }
    }
    let default_ms = match default_ms {
        Some(ms) => ms,
        None => {
            // No variant made another graph: the defaults, timed alone.
            let ms = latencies(&[&leader], inputs, Duration::from_millis(300))?[0];
            leader_ms = ms;
            ms
        }
    };
    report.default_ms = default_ms;
    report.best_ms = leader_ms;
    report.values = best.iter().map(|(k, &v)| (k.clone(), v as u32)).collect();
    if !complete {
        return Ok((report, None));
    }
    report.status = KeyStatus::Tuned;
    let entry = TuneEntry { values: report.values.clone(), default_ms: report.default_ms, best_ms: report.best_ms, summary: report.summary.clone() };
    let db = session.store_choice(&k, entry)?;
    Ok((report, db))
}
