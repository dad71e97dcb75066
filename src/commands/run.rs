//! `kiln run`: run a model once, print a summary of its outputs, optionally save them.
use crate::io;
use anyhow::{Context, Result};
use kiln::runtime::DeviceChoice;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The model (.onnx, or a .kiln artifact from `kiln compile`).
    model: PathBuf,
    /// cpu, gpu, auto, or an adapter name / gpu:N (see `kiln devices`).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// An input as NAME=FILE (.npy or ONNX TensorProto .pb); random values for the rest.
    #[arg(long = "input", short = 'i')]
    inputs: Vec<String>,
    /// Size of a symbolic dim for random inputs, NAME=VALUE (default 1).
    #[arg(long = "dim")]
    dims: Vec<String>,
    /// Write each output to DIR/NAME.npy.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Run the imported graph as is, without the graph passes (fusion, ...).
    #[arg(long)]
    no_passes: bool,
    /// Place nodes (by name or op type) on a device: OP_OR_NODE=DEVICE with cpu, gpu,
    /// gpu:N or an adapter name (repeatable); `auto` places the rest by the cost model
    /// (devices measured once); otherwise a GPU session runs the rest on the GPU where a
    /// kernel exists, else on the CPU.
    #[arg(long = "place")]
    place: Vec<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let session = io::open_session(&args.model, &args.device, args.no_passes, &args.place)?;
    let given = io::parse_inputs(&args.inputs)?;
    let inputs = io::complete_inputs(&session, given, &io::parse_dims(&args.dims)?);
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let start = std::time::Instant::now();
    let (outputs, stats) = session.run_with_stats(&refs)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, t) in session.output_names().iter().zip(&outputs) {
            let path = dir.join(io::output_file_name(name));
            kiln::runtime::npy::write_file(&path, t).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    if args.json {
        let outs: Vec<serde_json::Value> = session
            .output_shapes()
            .iter()
            .zip(&outputs)
            .map(|((n, symbolic), t)| {
                let v = t.to_f64_vec();
                serde_json::json!({"name": n, "dtype": t.dtype().name(), "shape": t.dims(),
                    "symbolic_shape": symbolic.as_ref().map(|s| s.to_string()),
                    "min": v.iter().copied().fold(f64::INFINITY, f64::min),
                    "max": v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    "mean": if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }})
            })
            .collect();
        let j = serde_json::json!({"model": args.model, "device": session.device_name(), "first_run_ms": ms,
            "kernels": stats.kernels, "submits": stats.submits, "outputs": outs});
        println!("{j}");
        return Ok(());
    }
    println!("{} on {} ({ms:.1} ms including specialisation; {} kernels, {} submits)", args.model.display(), session.device_name(), stats.kernels, stats.submits);
    for ((name, shape), t) in session.output_shapes().iter().zip(&outputs) {
        let symbolic = shape.as_ref().filter(|s| !s.is_fixed()).map(|s| format!(" (symbolically {s})")).unwrap_or_default();
        println!("  {name}: {}{:?}{symbolic}  {}", t.dtype(), t.dims(), io::summary(t));
    }
    if let Some(dir) = &args.output_dir {
        println!("outputs written to {}", dir.display());
    }
    Ok(())
}
