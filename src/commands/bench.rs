//! `kiln bench`: warm up, then time repeated runs and report latency statistics.
use crate::args::SessionArgs;
use crate::io;
use crate::progress::Progress;
use anyhow::{bail, Result};
use kiln::runtime::Session;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: SessionArgs,
    /// Timed runs (after warm-up).
    #[arg(long, default_value_t = 50)]
    iters: usize,
    /// Warm-up runs (the first also specialises the model).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Also time every node (CPU) and print the slowest nodes and op types (with --json: every node's time).
    #[arg(long)]
    profile: bool,
}

/// Latency statistics of a series of runs, in milliseconds.
pub struct Stats {
    pub median: f64,
    pub p90: f64,
    pub min: f64,
    pub mean: f64,
}

pub fn stats(mut ms: Vec<f64>) -> Stats {
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    Stats { median: at(0.5), p90: at(0.9), min: ms[0], mean: ms.iter().sum::<f64>() / ms.len() as f64 }
}

/// Times `iters` runs after `warmup` runs; returns per-run milliseconds and the last stats.
/// Progress is drawn unless `json` (see [`Progress`]).
pub fn time_runs(session: &Session, inputs: &[(String, kiln::graph::Tensor)], warmup: usize, iters: usize, json: bool) -> Result<(Vec<f64>, kiln::runtime::RunStats, f64)> {
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let t0 = Instant::now();
    let first = Progress::spinner("first run: specialising the model and compiling its kernels", json);
    let (_, mut last) = session.run_with_stats(&refs)?;
    first.finish();
    let first_ms = t0.elapsed().as_secs_f64() * 1e3;
    let warm = warmup.max(1) - 1;
    let bar = Progress::bar((warm + iters) as u64, "runs", json);
    bar.set(0, "warm-up");
    for i in 0..warm {
        bar.position(i as u64);
        session.run(&refs)?;
    }
    bar.set(warm as u64, "timed");
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters {
        bar.position((warm + i) as u64);
        let t = Instant::now();
        let (_, s) = session.run_with_stats(&refs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        last = s;
    }
    bar.finish();
    Ok((times, last, first_ms))
}

pub fn main(args: Args) -> Result<()> {
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let t0 = Instant::now();
    let a = &args.session;
    let session = io::open_session(a)?;
    if args.profile && session.device_kind() != kiln::runtime::DeviceKind::Cpu {
        // Said before the timed runs, not after them.
        bail!("--profile times the nodes of CPU sessions; for {}, `kiln profile MODEL --device ... -o trace.json` traces every kernel with GPU timestamps", session.device_name());
    }
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let inputs = io::session_inputs(&session, a)?;
    let (times, run, first_ms) = time_runs(&session, &inputs, args.warmup, args.iters, a.json)?;
    let s = stats(times);
    // Tuning keys of this model's kernels without a stored choice (defaults used).
    let untuned = session.untuned()?;
    let prof = if args.profile {
        let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Some(session.profile(&refs, args.iters)?)
    } else {
        None
    };
    if a.json {
        let j = serde_json::json!({
            "model": a.model, "device": session.device_name(), "iters": args.iters,
            "median_ms": s.median, "p90_ms": s.p90, "min_ms": s.min, "mean_ms": s.mean,
            "throughput_per_s": 1e3 / s.median, "load_ms": load_ms, "first_run_ms": first_ms,
            "kernels_per_run": run.kernels, "submits_per_run": run.submits, "untuned_keys": untuned.len(),
            "memory": run.memory.map(|m| serde_json::json!({"planned_bytes": m.planned, "lower_bound_bytes": m.lower_bound, "unshared_bytes": m.unshared, "in_place_steps": m.in_place})),
            "profile": prof.as_ref().map(|p| p.iter().map(|n| serde_json::json!({"node": n.node, "op": n.op, "ms": n.seconds * 1e3})).collect::<Vec<_>>()),
        });
        println!("{j}");
        return Ok(());
    }
    println!("{} on {}", a.model.display(), session.device_name());
    println!("  load {load_ms:.1} ms, first run {first_ms:.1} ms (specialisation + shader compilation)");
    println!(
        "  {} runs: median {:.3} ms, p90 {:.3} ms, min {:.3} ms, mean {:.3} ms, {:.1} runs/s",
        args.iters, s.median, s.p90, s.min, s.mean, 1e3 / s.median
    );
    println!("  {} kernels per run, {} submits per run", run.kernels, run.submits);
    if !untuned.is_empty() && !a.tuning.no_tuning {
        println!("  {} kernel configurations untuned (defaults used; `kiln tune` measures them)", untuned.len());
    }
    if let Some(m) = run.memory {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "  intermediates: planned {:.2} MiB = {:.2}x the lower bound {:.2} MiB (unshared {:.2} MiB; {} steps in place)",
            mib(m.planned),
            m.planned as f64 / m.lower_bound.max(1) as f64,
            mib(m.lower_bound),
            mib(m.unshared),
            m.in_place
        );
    }
    if let Some(prof) = prof {
        let total: f64 = prof.iter().map(|p| p.seconds).sum();
        let mut by_op: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
        for p in &prof {
            let e = by_op.entry(p.op.as_str()).or_default();
            e.0 += p.seconds;
            e.1 += 1;
        }
        let mut ops: Vec<_> = by_op.into_iter().collect();
        ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        println!("  per op type (sum of node times {:.3} ms):", total * 1e3);
        for (op, (t, n)) in ops {
            println!("    {op:24} {:8.3} ms {:5.1}%  ({n} nodes)", t * 1e3, 100.0 * t / total);
        }
        println!("  slowest nodes:");
        for p in prof.iter().take(15) {
            println!("    {:40} {:16} {:8.3} ms", p.node, p.op, p.seconds * 1e3);
        }
    }
    Ok(())
}
