//! `kiln demo`: sample networks built in code (`kiln_samples`), each run on every
//! available device, timed, and checked for agreement against the CPU. An adapter whose
//! device does not open is named and skipped; a device that opens and fails or
//! disagrees fails the demo.
use anyhow::{bail, Result};
use kiln::graph::Tensor;
use kiln::runtime::{list_devices, DeviceChoice, RuntimeError, Session, SessionOptions};

#[derive(clap::Args)]
pub struct Args {
    /// The sample network: tiny_cnn, mlp, lenet, resnet_blocks, transformer_block,
    /// attention_kv_cache, or all of them in turn.
    #[arg(long, default_value = "tiny_cnn")]
    sample: String,
    /// Input image size of the image samples (tiny_cnn, resnet_blocks).
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Batch size.
    #[arg(long, default_value_t = 2)]
    batch: usize,
    /// Timed runs per device.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let names: Vec<&str> = if args.sample == "all" { kiln_samples::SAMPLES.to_vec() } else { vec![args.sample.as_str()] };
    let mut failed = vec![];
    let mut reports = vec![];
    for name in names {
        let Some(sample) = kiln_samples::sample(name, args.batch, args.size)? else {
            bail!("no sample named '{name}' (samples: {}, or all)", kiln_samples::SAMPLES.join(", "));
        };
        let (ok, report) = run_sample(&sample, &args)?;
        if !ok {
            failed.push(name);
        }
        reports.push(report);
    }
    if args.json {
        let out = if reports.len() == 1 { reports.remove(0) } else { serde_json::json!({"samples": reports, "ok": failed.is_empty()}) };
        println!("{out}");
    }
    if !failed.is_empty() {
        bail!("the devices did not all run the sample network(s) {} and agree", failed.join(", "));
    }
    Ok(())
}

/// Runs one sample on every device; whether all that opened ran it and agree, and the
/// JSON report.
fn run_sample(sample: &kiln_samples::Sample, args: &Args) -> Result<(bool, serde_json::Value)> {
    let graph = &sample.graph;
    let inputs = &sample.inputs;
    let mut devices = vec![("cpu".to_string(), DeviceChoice::Cpu)];
    for a in list_devices().adapters {
        devices.push((format!("gpu:{}", a.index), DeviceChoice::Adapter(format!("gpu:{}", a.index))));
    }
    if !args.json {
        let dims: Vec<String> = inputs.iter().map(|(n, t)| format!("{n} {:?}", t.dims())).collect();
        println!("Kiln demo: '{}' ({}; {} nodes) built in code, input {}, on {} device(s)", sample.name, sample.about, graph.nodes.len(), dims.join(", "), devices.len());
    }
    let mut reference: Option<Tensor> = None;
    let mut rows = vec![];
    let mut failed = false;
    for (id, choice) in devices {
        let session = match Session::new(graph.clone(), SessionOptions { threads: args.threads, ..SessionOptions::device(choice) }) {
            Ok(s) => s,
            Err(e) => {
                // An adapter whose device does not open is not an available device: it is
                // named, and the demo goes on. Any other error fails it.
                let unavailable = matches!(e, RuntimeError::GpuUnavailable(_));
                if !args.json {
                    println!("  {id:6} {}: {e}", if unavailable { "skipped" } else { "failed" });
                }
                rows.push(serde_json::json!({"device": id, "error": e.to_string(), "unavailable": unavailable}));
                failed |= !unavailable;
                continue;
            }
        };
        let result = super::bench::time_runs(&session, inputs, 1, args.iters, true);
        let (times, stats, first_ms) = match result {
            Ok(r) => r,
            Err(e) => {
                if !args.json {
                    println!("  {id:6} {}: failed: {e}", session.device_name());
                }
                rows.push(serde_json::json!({"device": id, "name": session.device_name(), "error": e.to_string()}));
                failed = true;
                continue;
            }
        };
        let feeds: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let out = session.run(&feeds)?.remove(0);
        let err = reference.as_ref().map(|r| out.rel_l2_error(r));
        let agree = err.is_none_or(|e| e <= 1e-3);
        failed |= !agree;
        let s = super::bench::stats(times);
        // Classifiers ([batch, classes]) show each row's top class.
        let classes = out.dims().get(1).copied().filter(|_| out.dims().len() == 2).unwrap_or(0);
        let top: Vec<usize> = if classes > 0 {
            out.as_slice::<f32>()?.chunks(classes).map(|row| row.iter().enumerate().fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a }).0).collect()
        } else {
            vec![]
        };
        if !args.json {
            println!(
                "  {id:6} {:44} first run {:8.1} ms, median {:8.3} ms, {:3} kernels, {} submit(s), {}, {}",
                session.device_name(),
                first_ms,
                s.median,
                stats.kernels,
                stats.submits,
                if top.is_empty() { format!("output {:?}", out.dims()) } else { format!("classes {top:?}") },
                match err {
                    None => "reference".to_string(),
                    Some(e) if agree => format!("agrees with cpu (rel. L2 {e:.1e})"),
                    Some(e) => format!("DISAGREES with cpu (rel. L2 {e:.1e})"),
                }
            );
        }
        rows.push(serde_json::json!({"device": id, "name": session.device_name(), "first_run_ms": first_ms,
            "median_ms": s.median, "kernels": stats.kernels, "submits": stats.submits, "classes": top, "rel_l2_vs_cpu": err}));
        if reference.is_none() {
            reference = Some(out);
        }
    }
    Ok((!failed, serde_json::json!({"model": graph.name, "devices": rows, "ok": !failed})))
}
