//! `kiln tune`: measure which optional passes pay for a model on a device, then its
//! kernel choices, and store the winners in the tuning database, which `kiln run` and
//! `kiln bench` then use; `--list` and `--clear` manage the database.
use crate::args::TuningArgs;
use crate::io;
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use kiln::compiler::passes::{PassChoices, Target};
use kiln::graph::Graph;
use kiln::graph_tuning::compare_latency;
use kiln::runtime::tune::{db, values_text, KeyReport, KeyStatus, TuneOptions, TuneReport};
use kiln::runtime::{DeviceChoice, Session, SessionOptions, Tuning};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// The model (.onnx, or a .kiln artifact).
    #[arg(required_unless_present_any = ["list", "clear"])]
    model: Option<PathBuf>,
    /// cpu, gpu, auto, or an adapter name / gpu:N (see `kiln devices`).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Seconds the command may take (loading and the latency measurements included);
    /// keys left when it runs out keep their defaults.
    #[arg(long, default_value_t = 60.0)]
    budget: f64,
    /// Size of a symbolic dim, NAME=VALUE (default 1): tuning is per shape.
    #[arg(long = "dim")]
    dims: Vec<String>,
    /// Measure keys that already have a stored choice again.
    #[arg(long)]
    retune: bool,
    /// The database file (default: one file per device under $XDG_CACHE_HOME/kiln/tuning).
    #[arg(long, value_name = "FILE")]
    tuning_db: Option<PathBuf>,
    /// List the database's entries instead of tuning.
    #[arg(long, conflicts_with = "clear")]
    list: bool,
    /// Delete the database (every device's file under the cache directory, or --tuning-db).
    #[arg(long)]
    clear: bool,
    /// A custom op's manifest, for models that use it (repeatable).
    #[arg(long = "custom-op", value_name = "MANIFEST")]
    custom_ops: Vec<PathBuf>,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The database files `--list` and `--clear` work on.
fn db_files(explicit: Option<&Path>) -> Result<Vec<PathBuf>> {
    if let Some(p) = explicit {
        return Ok(if p.exists() { vec![p.to_path_buf()] } else { vec![] });
    }
    let Some(dir) = db::default_dir() else { bail!("no cache directory: set XDG_CACHE_HOME or HOME, or pass --tuning-db") };
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect(),
        Err(_) => vec![],
    };
    files.sort();
    Ok(files)
}

fn list(args: &Args) -> Result<()> {
    let files = db_files(args.tuning_db.as_deref())?;
    let mut out = vec![];
    for f in &files {
        let loaded = db::load(f);
        out.push((f, loaded));
    }
    if args.json {
        let j: Vec<serde_json::Value> = out
            .iter()
            .map(|(f, l)| {
                let entries: Vec<serde_json::Value> = l
                    .body
                    .entries
                    .iter()
                    .map(|(k, e)| serde_json::json!({"key": k, "summary": e.summary, "config": e.values, "default_ms": e.default_ms, "best_ms": e.best_ms}))
                    .collect();
                serde_json::json!({"db": f, "problem": l.problem, "devices": l.body.devices, "entries": entries})
            })
            .collect();
        println!("{}", serde_json::json!({ "databases": j }));
        return Ok(());
    }
    if files.is_empty() {
        println!("no tuning database{}", args.tuning_db.as_ref().map(|p| format!(" at {}", p.display())).unwrap_or_default());
    }
    for (f, l) in &out {
        println!("{}: {} entries{}", f.display(), l.body.entries.len(), l.problem.as_ref().map(|p| format!(" (ignored: {p})")).unwrap_or_default());
        for d in l.body.devices.values() {
            println!("  device: {d}");
        }
        for e in l.body.entries.values() {
            println!("  {:60} {:>10.4} -> {:>10.4} ms  {:5.2}x  {}", e.summary, e.default_ms, e.best_ms, e.default_ms / e.best_ms.max(1e-12), values_text(&e.values));
        }
    }
    Ok(())
}

fn clear(args: &Args) -> Result<()> {
    let files = db_files(args.tuning_db.as_deref())?;
    for f in &files {
        std::fs::remove_file(f).with_context(|| format!("cannot delete {}", f.display()))?;
    }
    if args.json {
        println!("{}", serde_json::json!({ "deleted": files }));
    } else {
        println!("deleted {} tuning database file(s)", files.len());
        for f in &files {
            println!("  {}", f.display());
        }
    }
    Ok(())
}

/// [`kiln::graph_tuning::tune_passes`] within half the time from now to `end`, with a
/// spinner on stderr.
#[allow(clippy::too_many_arguments)]
fn tune_passes(session: &Session, hash: &str, target: Target, build: &dyn Fn(&PassChoices) -> Result<Session>, inputs: &[(String, kiln::graph::Tensor)], retune: bool, end: Instant, json: bool) -> Result<(KeyReport, Option<PathBuf>)> {
    let now = Instant::now();
    let deadline = now + end.saturating_duration_since(now) / 2;
    let bar = Progress::spinner("pass choices: the model measured with each optional pass toggled", json);
    let build = |c: &PassChoices| -> std::result::Result<(Graph, Session), kiln::graph_tuning::Error> {
        let s = build(c)?;
        Ok((s.graph().clone(), s))
    };
    let out = kiln::graph_tuning::tune_passes(session, hash, target, &build, inputs, retune, deadline).map_err(|e| anyhow::anyhow!(e));
    bar.finish();
    out
}

/// Tunes `session` on `inputs` with a progress bar on stderr.
pub fn tune_with_progress(session: &Session, inputs: &[(String, kiln::graph::Tensor)], opts: &TuneOptions, json: bool) -> Result<TuneReport> {
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let bar = Progress::bar(0, "keys", json);
    let report = session.tune(&refs, opts, &mut |p| {
        bar.set_total(p.total as u64);
        bar.set(p.done as u64, &format!("(budget {:.0} s) {}", p.budget.as_secs_f64(), p.current));
    });
    bar.finish();
    Ok(report?)
}

pub fn main(args: Args) -> Result<()> {
    if args.list {
        return list(&args);
    }
    if args.clear {
        return clear(&args);
    }
    if !(args.budget.is_finite() && args.budget >= 0.0) {
        bail!("--budget must be a number of seconds, at least 0");
    }
    let model = args.model.clone().expect("clap requires the model");
    let started = Instant::now();
    let target = io::pass_target(&args.device)?;
    let io::Loaded { graph, info, registry, model_hash, .. } = io::load_model(&model, false, target, &args.custom_ops)?;
    let tuning = TuningArgs { no_tuning: false, tuning_db: args.tuning_db.clone() }.tuning(info.as_ref());
    let open = |graph: Graph, tuning: Tuning| -> Result<Session> {
        let options = SessionOptions { device: args.device.clone(), tuning, threads: args.threads, registry: registry.clone(), ..Default::default() };
        Session::new(graph, options).with_context(|| format!("cannot prepare {} for device '{}'", model.display(), args.device))
    };
    let mut session = open(graph.clone(), tuning.clone())?;
    let inputs = io::complete_inputs(&session, vec![], &io::parse_dims(&args.dims)?, io::memory_limit(None), 0)?;
    let untuned = open(graph, Tuning::off())?;
    // One run of each now: what is left of the budget keeps time for the latency
    // comparison at the end (warm-up runs and about a second of runs).
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let t = Instant::now();
    untuned.run(&refs)?;
    let reserve = 1.5 + 8.0 * t.elapsed().as_secs_f64();
    let budget_end = started + Duration::from_secs_f64((args.budget - reserve).max(0.0));
    // Which optional passes pay for this model here (an ONNX model: an artifact's passes
    // ran when it was compiled), within half of what is left; then the kernels.
    let graph_tuned = match &model_hash {
        Some(hash) => {
            let (passes, db) = tune_passes(&session, hash, target, &|c| open(io::load_model_with(&model, Some(c), target, &args.custom_ops)?.graph, Tuning::off()), &inputs, args.retune, budget_end, args.json)?;
            if let Some(chosen) = kiln::graph_tuning::settled(&passes) {
                session = open(io::load_model_with(&model, Some(&chosen), target, &args.custom_ops)?.graph, tuning)?;
            }
            Some((passes, db))
        }
        None => None,
    };
    let left = budget_end.saturating_duration_since(Instant::now());
    let opts = TuneOptions { budget: left, retune: args.retune };
    let mut report = tune_with_progress(&session, &inputs, &opts, args.json)?;
    if let Some((_, Some(db))) = &graph_tuned {
        if !report.databases.contains(db) {
            report.databases.push(db.clone());
        }
    }
    // Latency with the default passes and every kernel at its defaults against tuned.
    let (before_ms, after_ms) = compare_latency(&untuned, &session, &inputs, Duration::from_secs(1))?;
    let total_s = started.elapsed().as_secs_f64();
    let status = |s: &KeyStatus| match s {
        KeyStatus::Tuned => "tuned".to_string(),
        KeyStatus::AlreadyTuned => "already tuned".to_string(),
        KeyStatus::OutOfBudget => "out of budget".to_string(),
        KeyStatus::Failed(e) => format!("failed: {e}"),
    };
    if args.json {
        let key_json = |k: &KeyReport| {
            serde_json::json!({"key": k.key, "summary": k.summary, "node": k.node, "device": k.device, "status": status(&k.status),
                "default_ms": k.default_ms, "best_ms": k.best_ms, "speedup": k.speedup(), "config": k.values,
                "tried": k.tried, "rejected": k.rejected})
        };
        let keys: Vec<serde_json::Value> = report.keys.iter().map(key_json).collect();
        let j = serde_json::json!({
            "model": model, "device": session.device_name(), "devices": report.devices,
            "passes": graph_tuned.as_ref().map(|(k, _)| key_json(k)),
            "keys": keys, "tuned": report.tuned(),
            "measured": report.keys.iter().filter(|k| k.status == KeyStatus::Tuned).count(),
            "before_ms": before_ms, "after_ms": after_ms, "speedup": before_ms / after_ms.max(1e-12),
            "db": report.databases, "tune_s": report.elapsed.as_secs_f64(), "total_s": total_s,
        });
        println!("{j}");
        return Ok(());
    }
    println!("{} on {}: {} keys with choices, {} tuned ({} measured now) in {:.1} s", model.display(), session.device_name(), report.keys.len(), report.tuned(), report.keys.iter().filter(|k| k.status == KeyStatus::Tuned).count(), report.elapsed.as_secs_f64());
    if !report.keys.is_empty() || graph_tuned.is_some() {
        println!("  {:56} {:>11} {:>11} {:>8}  config", "key (op and inputs)", "default ms", "best ms", "speedup");
    }
    // The model's pass choice first (its times are the whole model's, kernels untuned).
    for k in graph_tuned.iter().map(|(k, _)| k).chain(&report.keys) {
        let note = match &k.status {
            KeyStatus::Tuned => String::new(),
            s => format!("  ({})", status(s)),
        };
        let rejected = if k.rejected.is_empty() { String::new() } else { format!("  [{} rejected]", k.rejected.len()) };
        println!("  {:56} {:>11.4} {:>11.4} {:>7.2}x  {}{note}{rejected}", k.summary.chars().take(56).collect::<String>(), k.default_ms, k.best_ms, k.speedup(), values_text(&k.values));
    }
    println!("  latency: {before_ms:.3} ms untuned -> {after_ms:.3} ms tuned ({:.2}x)", before_ms / after_ms.max(1e-12));
    match report.databases.as_slice() {
        [] => println!("  database: nothing new to store"),
        dbs => println!("  database: {}", dbs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")),
    }
    Ok(())
}
