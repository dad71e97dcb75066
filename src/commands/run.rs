//! `kiln run`: run a model once, print a summary of its outputs, optionally save them.
use crate::args::SessionArgs;
use crate::data_set;
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
    /// Run ONNX backend-test data sets instead of given or random inputs: a
    /// test_data_set_N directory (input_K.pb, output_K.pb), or a directory of them; each
    /// output is compared elementwise with its reference, and a mismatch exits with 1.
    #[arg(long, value_name = "DIR")]
    data_set: Option<PathBuf>,
    /// Relative tolerance of --data-set: |got - want| <= atol + rtol * |want|.
    #[arg(long, default_value_t = 1e-3)]
    rtol: f64,
    /// Absolute tolerance of --data-set.
    #[arg(long, default_value_t = 1e-5)]
    atol: f64,
    /// Also write every intermediate tensor of the graph that runs (after its passes:
    /// fused nodes' insides do not exist; --no-passes keeps every value of the model)
    /// to DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    dump_intermediates: Option<PathBuf>,
}

pub fn main(args: Args) -> Result<()> {
    let a = &args.session;
    if args.data_set.is_some() && !a.inputs.is_empty() {
        anyhow::bail!("--data-set reads the inputs of its data sets: leave out --input");
    }
    let model_outputs = std::cell::Cell::new(0);
    let session = io::open_session_with(a, |g| {
        model_outputs.set(g.outputs.len());
        if args.dump_intermediates.is_some() {
            expose_intermediates(g);
        }
    })?;
    let model_outputs = model_outputs.get();
    if let Some(dir) = &args.data_set {
        return run_data_sets(&session, &args, dir, model_outputs);
    }
    let inputs = io::session_inputs(&session, a)?;
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let start = std::time::Instant::now();
    let (mut outputs, stats) = session.run_with_stats(&refs)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if let Some(dir) = &args.dump_intermediates {
        dump(&session, &outputs, dir)?;
        outputs.truncate(model_outputs);
    }
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (file, t) in io::output_file_names(&session.output_names()[..model_outputs]).iter().zip(&outputs) {
            let path = dir.join(file);
            kiln::runtime::npy::write_file(&path, t).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    if a.json {
        let outs: Vec<serde_json::Value> = session.output_shapes()[..model_outputs]
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
    for ((name, shape), t) in session.output_shapes()[..model_outputs].iter().zip(&outputs) {
        let symbolic = shape.as_ref().filter(|s| !s.is_fixed()).map(|s| format!(" (symbolically {s})")).unwrap_or_default();
        println!("  {name}: {}{:?}{symbolic}  {}", t.dtype(), t.dims(), io::summary(t));
    }
    if let Some(dir) = &args.output_dir {
        println!("outputs written to {}", dir.display());
    }
    Ok(())
}

/// Makes every value a top-level node produces a graph output too (after the model's
/// own outputs, which keep their places).
fn expose_intermediates(g: &mut kiln::graph::Graph) {
    let mut seen: std::collections::HashSet<usize> = g.outputs.iter().copied().collect();
    let produced: Vec<usize> = g.nodes.iter().flat_map(|n| n.outputs.iter().copied()).collect();
    for v in produced {
        if seen.insert(v) {
            g.outputs.push(v);
        }
    }
}

/// Writes every output of a run (the model's and the exposed intermediates) to DIR;
/// values .npy cannot hold (sequences, optionals) are said and skipped.
fn dump(session: &kiln::runtime::Session, outputs: &[kiln::graph::Tensor], dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let names = session.output_names();
    let mut written = 0;
    for ((file, name), t) in io::output_file_names(&names).iter().zip(&names).zip(outputs) {
        if t.composite().is_some() {
            log::warn!("intermediate '{name}' is a sequence or optional value: .npy cannot hold it, not written");
            continue;
        }
        let path = dir.join(file);
        kiln::runtime::npy::write_file(&path, t).with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    eprintln!("{written} tensors written to {}", dir.display());
    Ok(())
}

/// `kiln run --data-set`: every data set through the session, each output compared with
/// its reference; an error (exit code 1) when any differs.
fn run_data_sets(session: &kiln::runtime::Session, args: &Args, dir: &std::path::Path, model_outputs: usize) -> Result<()> {
    let tol = data_set::Tolerance { rtol: args.rtol, atol: args.atol };
    let input_names: Vec<String> = session.inputs().into_iter().map(|(n, _)| n).collect();
    let output_names: Vec<String> = session.output_names()[..model_outputs].to_vec();
    let (mut failed, mut total) = (vec![], 0);
    let mut report = vec![];
    for set_dir in data_set::find(dir)? {
        let set = data_set::read(&set_dir)?;
        let inputs = data_set::by_name(&set.dir, "input", set.inputs, &input_names)?;
        let wants = data_set::by_name(&set.dir, "output", set.outputs, &output_names)?;
        let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut outputs = session.run(&refs).with_context(|| format!("data set {}", set.dir.display()))?;
        if let Some(d) = &args.dump_intermediates {
            dump(session, &outputs, &d.join(set.dir.file_name().unwrap_or_default()))?;
        }
        outputs.truncate(model_outputs);
        for (name, want) in &wants {
            let i = output_names.iter().position(|n| n == name).expect("by_name checked the name");
            let c = data_set::compare(name, &outputs[i], want, tol);
            total += 1;
            if !c.ok() {
                failed.push(format!("{} {name}", set.dir.display()));
            }
            report.push((set.dir.clone(), c));
        }
    }
    if args.session.json {
        let sets: Vec<serde_json::Value> = report
            .iter()
            .map(|(d, c)| serde_json::json!({"data_set": d, "output": c.name, "ok": c.ok(), "mismatch": c.mismatch, "bad_elements": c.bad, "elements": c.len, "max_abs": c.max_abs, "rel_l2": c.rel_l2}))
            .collect();
        println!("{}", serde_json::json!({"model": args.session.model, "device": session.device_name(), "rtol": tol.rtol, "atol": tol.atol, "ok": failed.is_empty(), "outputs": sets}));
    } else {
        println!("{} on {} (rtol {}, atol {})", args.session.model.display(), session.device_name(), tol.rtol, tol.atol);
        for (d, c) in &report {
            let verdict = match &c.mismatch {
                Some(m) => format!("MISMATCH: {m}"),
                None if c.bad > 0 => format!("MISMATCH: {} of {} elements outside the tolerance", c.bad, c.len),
                None => "ok".to_string(),
            };
            println!("  {} {}: max abs {:.3e}, rel. L2 {:.3e}  {verdict}", d.display(), c.name, c.max_abs, c.rel_l2);
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {total} outputs differ from their data sets: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}
