//! `kiln compile`: import, fix symbols, optimise, and write a `.kiln` artifact that
//! `kiln run`/`kiln bench` and the runtime load without the compiler.
use crate::io;
use anyhow::{bail, Context, Result};
use kiln::compiler::passes::PassChoices;
use kiln::runtime::artifact::{self, ArtifactInfo};
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The model (.onnx).
    model: PathBuf,
    /// Where to write the artifact (default: the model's path with .kiln).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// The device to compile for: cpu, gpu, auto, or an adapter name / gpu:N. The model
    /// is checked on it (and, with every dim fixed, its kernels are generated).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Fix a symbolic dim, NAME=VALUE (repeatable): shape computations that depend on it
    /// are folded now.
    #[arg(long = "fix")]
    fix: Vec<String>,
    /// Tune the model's kernels on the target device (with every symbolic dim fixed by
    /// --fix, else 1) and embed the choices in the artifact: it then runs tuned wherever
    /// that device is found. Choices already in the tuning database are reused.
    #[arg(long)]
    tune: bool,
    /// Seconds `--tune` may spend measuring.
    #[arg(long, default_value_t = 60.0, requires = "tune")]
    budget: f64,
    /// The tuning database `--tune` reads and writes (default: the user's cache).
    #[arg(long, value_name = "FILE", requires = "tune")]
    tuning_db: Option<PathBuf>,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// A custom op's manifest, for models that use it (repeatable): the artifact embeds
    /// the op (manifest, WGSL, CPU library) and runs without the files.
    #[arg(long = "custom-op", value_name = "MANIFEST")]
    custom_ops: Vec<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let start = Instant::now();
    if args.model.extension().and_then(|e| e.to_str()) == Some("kiln") {
        bail!("{} is already a compiled artifact; compile the .onnx model", args.model.display());
    }
    let custom = io::custom_ops(&args.custom_ops)?;
    let fixed = io::parse_dims(&args.fix)?;
    let target = io::pass_target(&args.device)?;
    let compile = |chosen: &PassChoices| {
        kiln::load::compile(&args.model, target, &fixed, &custom, chosen).map_err(|e| match e {
            kiln::load::CompileError::UnknownSymbol { name, symbols } => anyhow::anyhow!("--fix {name}: the model's inputs have no symbolic dim '{name}' (they have: {symbols})"),
            e => anyhow::Error::new(e).context(format!("cannot import {}", args.model.display())),
        })
    };
    let kiln::load::Compiled { mut graph, registry, info: mut compiled, model_hash } = compile(&PassChoices::new())?;
    // Check the result on the target device (the session's symbolic check and device
    // limits) before writing anything.
    let tuning = match (&args.tune, &args.tuning_db) {
        (false, _) => kiln::runtime::Tuning::off(),
        (true, Some(p)) => kiln::runtime::Tuning::file(p),
        (true, None) => kiln::runtime::Tuning::user_cache(),
    };
    let open = |graph: kiln::graph::Graph, tuning: kiln::runtime::Tuning| {
        Session::new(graph, SessionOptions { device: args.device.clone(), tuning, threads: args.threads, registry: registry.clone(), ..Default::default() })
            .with_context(|| format!("{} does not compile for device '{}'", args.model.display(), args.device))
    };
    let mut session = open(graph.clone(), tuning.clone())?;
    // Tuned choices first, so that the kernels compiled below are the tuned ones: which
    // optional passes run (within half the budget), then the kernels.
    let tuned = if args.tune {
        if !(args.budget.is_finite() && args.budget >= 0.0) {
            bail!("--budget must be a number of seconds, at least 0");
        }
        // The --fix dims are fixed in the graph's input types by now.
        let inputs = io::complete_inputs(&session, vec![], &Default::default(), io::memory_limit(None), 0)?;
        let end = start + std::time::Duration::from_secs_f64(args.budget);
        if let Some(hash) = &model_hash {
            let build = |c: &PassChoices| -> Result<(kiln::graph::Graph, Session), kiln::graph_tuning::Error> {
                let g = compile(c)?.graph;
                Ok((g.clone(), open(g, kiln::runtime::Tuning::off())?))
            };
            let half = start + std::time::Duration::from_secs_f64(args.budget / 2.0);
            let (passes, _) = kiln::graph_tuning::tune_passes(&session, hash, target, &build, &inputs, false, half).map_err(|e| anyhow::anyhow!(e))?;
            if let Some(chosen) = kiln::graph_tuning::settled(&passes) {
                log::info!("passes as tuned: {}", kiln::runtime::tune::values_text(&passes.values));
                let again = compile(&chosen)?;
                (graph, compiled) = (again.graph, again.info);
                session = open(graph.clone(), tuning)?;
            }
        }
        let opts = kiln::runtime::TuneOptions { budget: end.saturating_duration_since(std::time::Instant::now()), retune: false };
        let report = super::tune::tune_with_progress(&session, &inputs, &opts, args.json)?;
        log::info!("tuned {} of {} keys for {}", report.tuned(), report.keys.len(), session.device_name());
        report.entries()
    } else {
        Default::default()
    };
    // With every input dim fixed, a GPU target runs once now, so that the driver's
    // pipeline cache holds its kernels.
    let fixed_shapes = graph.inputs.iter().all(|&v| graph.values[v].ty.as_ref().is_some_and(|t| t.shape.is_fixed()));
    let kernels = if fixed_shapes && session.device_kind() == kiln::runtime::DeviceKind::Gpu {
        let inputs = io::complete_inputs(&session, vec![], &Default::default(), io::memory_limit(None), 0)?;
        let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        session.run(&refs).with_context(|| format!("{} does not run on '{}' with its fixed shapes", args.model.display(), args.device))?;
        session.kernel_records()?
    } else {
        vec![]
    };
    // The driver's compiled pipelines of those kernels (the device opened for this
    // command with an empty cache), for loading on the same adapter and driver.
    let pipeline_cache = if kernels.is_empty() { None } else { session.pipeline_cache()? };
    let info = ArtifactInfo { device: args.device.to_string(), pipeline_cache, tuning: tuned, ..compiled };
    let out = args.output.clone().unwrap_or_else(|| args.model.with_extension("kiln"));
    artifact::save(&out, &graph, &info)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    if args.json {
        let cache_bytes = info.pipeline_cache.as_ref().map(|c| c.data.len());
        println!("{}", serde_json::json!({"model": args.model, "artifact": out, "bytes": bytes, "compile_ms": ms, "nodes": graph.nodes.len(), "device": session.device_name(), "passes": info.passes, "kernels": kernels.len(), "pipeline_cache_bytes": cache_bytes, "tuned_keys": info.tuning.len()}));
    } else {
        println!(
            "{} -> {} ({} bytes, {} nodes, {} WGSL kernels{}{}) for {} in {ms:.0} ms",
            args.model.display(),
            out.display(),
            bytes,
            graph.nodes.len(),
            kernels.len(),
            info.pipeline_cache.as_ref().map(|c| format!(", pipeline cache {} bytes", c.data.len())).unwrap_or_default(),
            if args.tune { format!(", {} tuned choices", info.tuning.len()) } else { String::new() },
            session.device_name()
        );
        for (name, n) in &info.passes {
            println!("  pass {name}: {n} change(s)");
        }
    }
    Ok(())
}
