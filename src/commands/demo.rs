//! `kiln demo`: a sample network built in code, run on every available device, timed,
//! and checked for agreement against the CPU. An adapter whose device does not open is
//! named and skipped; a device that opens and fails or disagrees fails the demo.
use anyhow::{bail, Result};
use kiln::graph::Tensor;
use kiln::runtime::{list_devices, DeviceChoice, RuntimeError, Session, SessionOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Input image size of the sample network.
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
    let graph = kiln_samples::tiny_cnn(args.size, 10, 42)?;
    let image = kiln::graph::rng::Rng::new(7).tensor(&[args.batch, 3, args.size, args.size], 1.0)?;
    let inputs = vec![("image".to_string(), image)];
    let mut devices = vec![("cpu".to_string(), DeviceChoice::Cpu)];
    for a in list_devices().adapters {
        devices.push((format!("gpu:{}", a.index), DeviceChoice::Adapter(format!("gpu:{}", a.index))));
    }
    if !args.json {
        println!(
            "Kiln demo: '{}' ({} nodes) built in code, batch {} of {}x{} images, on {} device(s)",
            graph.name,
            graph.nodes.len(),
            args.batch,
            args.size,
            args.size,
            devices.len()
        );
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
        let result = super::bench::time_runs(&session, &inputs, 1, args.iters, true);
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
        let out = session.run(&[("image", &inputs[0].1)])?.remove(0);
        let err = reference.as_ref().map(|r| out.rel_l2_error(r));
        let agree = err.is_none_or(|e| e <= 1e-3);
        failed |= !agree;
        let s = super::bench::stats(times);
        let top: Vec<usize> = out
            .as_slice::<f32>()?
            .chunks(10)
            .map(|row| row.iter().enumerate().fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a }).0)
            .collect();
        if !args.json {
            println!(
                "  {id:6} {:44} first run {:8.1} ms, median {:8.3} ms, {:3} kernels, {} submit(s), classes {:?}, {}",
                session.device_name(),
                first_ms,
                s.median,
                stats.kernels,
                stats.submits,
                top,
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
    if args.json {
        println!("{}", serde_json::json!({"model": graph.name, "devices": rows, "ok": !failed}));
    }
    if failed {
        bail!("the devices did not all run the sample network and agree");
    }
    Ok(())
}
