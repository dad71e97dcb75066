//! `kiln run`: run a model once, print a summary of its outputs, optionally save them.
use crate::args::SessionArgs;
use crate::io;
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: SessionArgs,
    /// Write each output to DIR/NAME.npy (names made file-safe; a clash gets a suffix).
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

pub fn main(args: Args) -> Result<()> {
    let a = &args.session;
    let session = io::open_session(a)?;
    let inputs = io::session_inputs(&session, a)?;
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let start = std::time::Instant::now();
    let (outputs, stats) = session.run_with_stats(&refs)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (file, t) in io::output_file_names(&session.output_names()).iter().zip(&outputs) {
            let path = dir.join(file);
            kiln::runtime::npy::write_file(&path, t).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    if a.json {
        let outs: Vec<serde_json::Value> = session
            .output_shapes()
            .iter()
            .zip(&outputs)
            .map(|((n, symbolic), t)| {
                if let Ok(s) = t.as_strings() {
                    return serde_json::json!({"name": n, "dtype": t.dtype().name(), "shape": t.dims(),
                        "symbolic_shape": symbolic.as_ref().map(|s| s.to_string()), "first": &s[..s.len().min(5)]});
                }
                let v = t.to_f64_vec();
                serde_json::json!({"name": n, "dtype": t.dtype().name(), "shape": t.dims(),
                    "symbolic_shape": symbolic.as_ref().map(|s| s.to_string()),
                    "min": v.iter().copied().fold(f64::INFINITY, f64::min),
                    "max": v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    "mean": if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }})
            })
            .collect();
        let j = serde_json::json!({"model": a.model, "device": session.device_name(), "first_run_ms": ms,
            "kernels": stats.kernels, "submits": stats.submits, "outputs": outs});
        println!("{j}");
        return Ok(());
    }
    println!("{} on {} ({ms:.1} ms including specialisation; {} kernels, {} submits)", a.model.display(), session.device_name(), stats.kernels, stats.submits);
    for ((name, shape), t) in session.output_shapes().iter().zip(&outputs) {
        let symbolic = shape.as_ref().filter(|s| !s.is_fixed()).map(|s| format!(" (symbolically {s})")).unwrap_or_default();
        println!("  {name}: {}{:?}{symbolic}  {}", t.dtype(), t.dims(), io::summary(t));
    }
    if let Some(dir) = &args.output_dir {
        println!("outputs written to {}", dir.display());
    }
    Ok(())
}
