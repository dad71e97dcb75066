//! `kiln profile`: a Chrome trace-event JSON file (Perfetto's UI and chrome://tracing
//! open it) of loading and running a model: host phases (import, passes, session,
//! first run with specialisation and kernel compiles, upload, submit, readback) and one
//! slice per kernel on its device's track, GPU-timed by timestamp queries where the
//! adapter has them.
use crate::args::SessionArgs;
use crate::io;
use anyhow::{bail, Context, Result};
use kiln::runtime::{Session, SessionOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: SessionArgs,
    /// The trace file to write.
    #[arg(short, long, default_value = "trace.json")]
    output: PathBuf,
    /// Runs before the traced one (the first plans and compiles; later ones are warm).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
}

/// One trace slice: a complete event ("ph": "X") in microseconds from the start.
struct Slice {
    track: String,
    name: String,
    cat: &'static str,
    start_us: f64,
    dur_us: f64,
}

pub fn main(args: Args) -> Result<()> {
    let a = &args.session;
    if !a.place.is_empty() {
        bail!("--place: a profile traces one device; run it once per device instead");
    }
    let t0 = Instant::now();
    let us = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e6;
    let mut slices: Vec<Slice> = vec![];
    let mut host = |name: &str, from: Instant, to: Instant| slices.push(Slice { track: "host".into(), name: name.into(), cat: "host", start_us: us(from), dur_us: us(to) - us(from) });
    let target = io::pass_target(&a.device)?;
    let custom = io::custom_ops(&a.custom_ops)?;
    let is_artifact = a.model.extension().is_some_and(|e| e == "kiln");
    let source = kiln::load::Source::File(&a.model);
    let loaded = kiln::load::load(source, target, false, &custom).with_context(|| format!("cannot load {}", a.model.display()))?;
    let t_import = Instant::now();
    host(if is_artifact { "load artifact" } else { "import" }, t0, t_import);
    let (mut graph, registry) = (loaded.graph, loaded.registry);
    if !is_artifact && !a.no_passes {
        let ops = registry.as_ref().unwrap_or_else(|| kiln::ops::Registry::builtin());
        kiln::compiler::passes::optimize_with(&mut graph, target, &mut kiln::compiler::passes::PassContext::new(ops));
    }
    let t_passes = Instant::now();
    if !is_artifact && !a.no_passes {
        host("graph passes", t_import, t_passes);
    }
    let options = SessionOptions { device: a.device.clone(), threads: a.threads, registry, memory_limit: a.memory_limit, denormals_are_zero: !a.keep_denormals, tuning: a.tuning.tuning(loaded.info.as_ref()), ..Default::default() };
    let open = |graph| Session::new(graph, options.clone()).with_context(|| format!("cannot prepare {} for device '{}'", a.model.display(), a.device));
    let mut session = open(graph)?;
    let t_session = Instant::now();
    host("open session (devices, op checks)", t_passes, t_session);
    // A tuned pass choice other than the target's defaults: the graph again with it.
    if let (Some(hash), false, false) = (&loaded.model_hash, a.no_passes, a.tuning.no_tuning) {
        if let Some(chosen) = kiln::graph_tuning::stored(&session, hash, target)? {
            let again = kiln::load::load_with(kiln::load::Source::File(&a.model), target, Some(&chosen), &custom).with_context(|| format!("cannot load {}", a.model.display()))?;
            session = open(again.graph)?;
            host("tuned passes and their session", t_session, Instant::now());
        }
    }
    let inputs = io::session_inputs(&session, a)?;
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let t_inputs = Instant::now();
    for k in 0..args.warmup {
        let t = Instant::now();
        session.run(&refs)?;
        host(if k == 0 { "first run (specialise, place, compile kernels)" } else { "warm-up run" }, t, Instant::now());
        if k == 0 {
            // Inside the first run: its planning phases.
            for (name, from, to) in session.last_plan_phases() {
                host(name, from, to);
            }
        }
    }
    let _ = t_inputs;
    let trace = session.trace(&refs)?;
    for s in &trace.slices {
        slices.push(Slice { track: s.track.clone(), name: s.name.clone(), cat: s.category, start_us: us(s.start), dur_us: s.duration.as_secs_f64() * 1e6 });
    }
    // Tracks: the host first, then the devices in order of appearance.
    let mut tracks: Vec<String> = vec!["host".into()];
    for s in &slices {
        if !tracks.contains(&s.track) {
            tracks.push(s.track.clone());
        }
    }
    let mut events: Vec<serde_json::Value> = vec![serde_json::json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": format!("kiln {}", a.model.display())}})];
    for (i, t) in tracks.iter().enumerate() {
        events.push(serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": i + 1, "args": {"name": t}}));
        events.push(serde_json::json!({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": i + 1, "args": {"sort_index": i}}));
    }
    for s in &slices {
        let tid = tracks.iter().position(|t| *t == s.track).expect("listed") + 1;
        events.push(serde_json::json!({"name": s.name, "cat": s.cat, "ph": "X", "ts": s.start_us, "dur": s.dur_us, "pid": 1, "tid": tid}));
    }
    let json = serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"device": session.device_name(), "gpu_timestamps": trace.gpu_timestamps, "kernels": trace.kernels}});
    std::fs::write(&args.output, serde_json::to_vec(&json)?).with_context(|| format!("cannot write {}", args.output.display()))?;
    let kernels: Vec<&Slice> = slices.iter().filter(|s| s.cat != "host").collect();
    if a.json {
        println!("{}", serde_json::json!({"trace": args.output, "device": session.device_name(), "kernels": trace.kernels, "kernel_slices": kernels.len(), "gpu_timestamps": trace.gpu_timestamps}));
        return Ok(());
    }
    let how = match (session.device_kind(), trace.gpu_timestamps) {
        (kiln::runtime::DeviceKind::Cpu, _) => "CPU timers",
        (_, true) => "GPU timestamp queries",
        (_, false) => "no per-kernel GPU timing: the adapter has no timestamp queries",
    };
    println!("{}: {} slices ({} kernels, {how}) on {} -> {}", a.model.display(), slices.len(), kernels.len(), session.device_name(), args.output.display());
    let mut top: Vec<&&Slice> = kernels.iter().collect();
    top.sort_by(|x, y| y.dur_us.total_cmp(&x.dur_us));
    for s in top.iter().take(5) {
        println!("  {:>9.1} us  {}", s.dur_us, s.name);
    }
    println!("open it in https://ui.perfetto.dev or chrome://tracing");
    Ok(())
}
