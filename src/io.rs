//! Loading models and input tensors for the CLI, random inputs, output summaries.
use anyhow::{anyhow, bail, Context, Result};
use kiln::graph::{DType, Dim, Tensor, ValueType};
use kiln::compiler::passes::Target;
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::collections::HashMap;
use std::path::Path;


/// The pass target for a device choice (passes that pay on one kind of device).
pub fn pass_target(device: &DeviceChoice) -> Result<Target> {
    Ok(match device.kind()? {
        kiln::runtime::DeviceKind::Cpu => Target::Cpu,
        kiln::runtime::DeviceKind::Gpu => Target::Gpu,
    })
}

/// Opens a model for a session: a `.kiln` artifact is loaded as compiled (no import, no
/// passes) and returned with its info; an `.onnx` file is imported and, unless
/// `no_passes`, optimised for `target`.
pub fn load_model(model: &Path, no_passes: bool, target: Target) -> Result<(kiln::graph::Graph, Option<kiln::runtime::artifact::ArtifactInfo>)> {
    match model.extension().and_then(|e| e.to_str()) {
        Some("kiln") => {
            let (graph, info) = kiln::runtime::artifact::load(model)?;
            log::info!("loaded {} (compiled by kiln {} from {} for device '{}')", model.display(), info.kiln_version, info.source, info.device);
            Ok((graph, Some(info)))
        }
        Some("onnx") | None => {
            let mut graph = kiln::compiler::onnx::import_file(model).with_context(|| format!("cannot import {}", model.display()))?;
            if !no_passes {
                for r in kiln::compiler::passes::optimize_for(&mut graph, target) {
                    log::info!("pass {}: {} change(s)", r.name, r.changes);
                }
            }
            Ok((graph, None))
        }
        Some(ext) => bail!("{}: unknown model format '.{ext}' (expected .onnx or .kiln)", model.display()),
    }
}

/// Loads a model (see [`load_model`]; passes for the device's kind) and opens a session on `device`, with placement
/// overrides (`OP_OR_NODE=cpu|gpu`).
pub fn open_session(model: &Path, device: &DeviceChoice, no_passes: bool, place: &[String]) -> Result<Session> {
    let t0 = std::time::Instant::now();
    // Passes for the device kind, unless rules place nodes on several devices.
    let target = if place.is_empty() { pass_target(device)? } else { Target::Any };
    let (graph, info) = load_model(model, no_passes, target)?;
    let loaded = t0.elapsed();
    let auto_place = place.iter().any(|p| p == "auto");
    let placement = place.iter().filter(|p| *p != "auto").map(|p| p.parse::<kiln::runtime::PlacementRule>().map_err(|e| anyhow!("--place: {e}"))).collect::<Result<Vec<_>>>()?;
    let options = SessionOptions { device: device.clone(), registry: None, placement, auto_place };
    let session = Session::new(graph, options).with_context(|| format!("cannot prepare {} for device '{device}'", model.display()))?;
    let opened = t0.elapsed();
    if let Some(info) = info {
        // Kernels generated at compile time: build their pipelines now, from the
        // driver's stored cache when it was made for this adapter and driver.
        let cached = match &info.pipeline_cache {
            Some(c) => session.use_pipeline_cache(c)?,
            None => false,
        };
        let n = session.prebuild_kernels(&info.wgsl)?;
        log::info!("built {n} stored kernels{}", if cached { " (from the stored pipeline cache)" } else { "" });
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    log::info!("load: read {:.1} ms, session {:.1} ms, kernels {:.1} ms", ms(loaded), ms(opened - loaded), ms(t0.elapsed() - opened));
    Ok(session)
}

/// Reads a tensor from .npy or from a serialized ONNX TensorProto (.pb).
pub fn read_tensor(path: &Path) -> Result<Tensor> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => kiln::runtime::npy::read_file(path).with_context(|| format!("cannot read {}", path.display())),
        Some("pb") => Ok(kiln::compiler::onnx::read_tensor_pb(path).with_context(|| format!("cannot read {}", path.display()))?.1),
        _ => bail!("{}: inputs must be .npy or .pb (ONNX TensorProto) files", path.display()),
    }
}

/// Parses `NAME=FILE` pairs.
pub fn parse_inputs(specs: &[String]) -> Result<Vec<(String, Tensor)>> {
    specs
        .iter()
        .map(|s| {
            let (name, file) = s.split_once('=').ok_or_else(|| anyhow!("--input '{s}': expected NAME=FILE"))?;
            Ok((name.to_string(), read_tensor(Path::new(file))?))
        })
        .collect()
}

/// Parses `NAME=VALUE` symbol bindings.
pub fn parse_dims(specs: &[String]) -> Result<HashMap<String, usize>> {
    specs
        .iter()
        .map(|s| {
            let (name, v) = s.split_once('=').ok_or_else(|| anyhow!("--dim '{s}': expected NAME=VALUE"))?;
            let v: usize = v.parse().map_err(|_| anyhow!("--dim '{s}': '{v}' is not a size"))?;
            Ok((name.to_string(), v))
        })
        .collect()
}

/// Deterministic random tensor for a declared input type; symbolic dims take their
/// `--dim` binding, else 1.
pub fn random_input(ty: &ValueType, dims: &HashMap<String, usize>, seed: u64) -> Tensor {
    let shape: Vec<usize> = ty
        .shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            Dim::Sym(s) => dims.get(s).copied().unwrap_or(1),
        })
        .collect();
    let mut rng = kiln_samples::Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let r = rng.next_f32() as f64;
            if ty.dtype.is_float() {
                r
            } else if ty.dtype == DType::Bool {
                (r > 0.0) as u8 as f64
            } else {
                ((r + 1.0) * 5.0).floor()
            }
        })
        .collect();
    Tensor::from_f64(ty.dtype, &shape, &v).expect("length matches shape")
}

/// All inputs of a session: given ones first, random for the rest.
pub fn complete_inputs(session: &Session, given: Vec<(String, Tensor)>, dims: &HashMap<String, usize>) -> Vec<(String, Tensor)> {
    let mut all = given;
    for (i, (name, ty)) in session.inputs().into_iter().enumerate() {
        if !all.iter().any(|(n, _)| *n == name) {
            log::info!("input '{name}' not given: using random values of type {ty}");
            all.push((name, random_input(&ty, dims, 1 + i as u64)));
        }
    }
    all
}

/// A short summary of a tensor's values.
pub fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    if v.is_empty() {
        return "(empty)".into();
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let head: Vec<String> = v.iter().take(5).map(|x| format!("{x:.5}")).collect();
    format!("min {min:.5} max {max:.5} mean {mean:.5} first [{}{}]", head.join(", "), if v.len() > 5 { ", ..." } else { "" })
}

/// File name for an output: every character outside [A-Za-z0-9._-] becomes '_'.
pub fn output_file_name(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    format!("{s}.npy")
}
