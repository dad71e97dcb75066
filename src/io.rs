//! Loading models and input tensors for the CLI, random inputs, output summaries.
use crate::args::SessionArgs;
use kiln::graph::rng::Rng;
use anyhow::{anyhow, bail, Context, Result};
use kiln::graph::{size, DType, Dim, Tensor, ValueType};
use kiln::compiler::passes::{PassChoices, Target};
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The pass target for a device choice (passes that pay on one kind of device).
pub fn pass_target(device: &DeviceChoice) -> Result<Target> {
    Ok(match kiln::runtime::device_kind(device)? {
        kiln::runtime::DeviceKind::Cpu => Target::Cpu,
        kiln::runtime::DeviceKind::Gpu => Target::Gpu,
    })
}

pub use kiln::load::Loaded;

/// Loads the custom ops of `--custom-op` manifests.
pub fn custom_ops(manifests: &[std::path::PathBuf]) -> Result<Vec<kiln::ops::custom::CustomOp>> {
    manifests.iter().map(|p| kiln::ops::custom::CustomOp::load(p).map_err(|e| anyhow!("--custom-op: {e}"))).collect()
}

/// Opens a model for a session (`kiln::load`): a `.kiln` artifact as compiled,
/// with the custom ops it embeds; an `.onnx` file imported and, unless `no_passes`,
/// optimised for `target`. The ops of `custom` manifests join.
pub fn load_model(model: &Path, no_passes: bool, target: Target, custom: &[std::path::PathBuf]) -> Result<Loaded> {
    load_model_with(model, (!no_passes).then(PassChoices::new).as_ref(), target, custom)
}

/// [`load_model`] with the optional passes `passes` turns on or off (None: no passes).
pub fn load_model_with(model: &Path, passes: Option<&PassChoices>, target: Target, custom: &[std::path::PathBuf]) -> Result<Loaded> {
    let no_passes = passes.is_none();
    let custom = custom_ops(custom)?;
    match model.extension().and_then(|e| e.to_str()) {
        Some("kiln") | Some("onnx") | None => {}
        Some(ext) => bail!("{}: unknown model format '.{ext}' (expected .onnx or .kiln)", model.display()),
    }
    let is_artifact = model.extension().is_some_and(|e| e == "kiln");
    if is_artifact && no_passes {
        log::warn!("--no-passes has no effect on {}: a compiled artifact holds the graph its passes made", model.display());
    }
    let loaded = kiln::load::load_with(kiln::load::Source::File(model), target, passes, &custom).with_context(|| format!("cannot {} {}", if is_artifact { "load" } else { "import" }, model.display()))?;
    if let Some(info) = &loaded.info {
        log::info!("loaded {} (compiled by kiln {} from {} for device '{}')", model.display(), info.kiln_version, info.source, info.device);
    }
    Ok(loaded)
}

/// Loads a model (see [`load_model`]; passes for the device's kind) and opens a session
/// on its device, with placement overrides (`OP_OR_NODE=cpu|gpu`) and the memory limit.
pub fn open_session(args: &SessionArgs) -> Result<Session> {
    open_session_with(args, |_| {})
}

/// [`open_session`], with `edit` applied to the graph (after its passes) before the
/// session is made.
pub fn open_session_with(args: &SessionArgs, edit: impl Fn(&mut kiln::graph::Graph)) -> Result<Session> {
    let (model, device, place) = (&args.model, &args.device, &args.place);
    let t0 = std::time::Instant::now();
    // Passes for the device kind, unless rules place nodes on several devices.
    let target = if place.is_empty() { pass_target(device)? } else { Target::Any };
    let passes = (!args.no_passes).then(PassChoices::new);
    let auto_place = place.iter().any(|p| p == "auto");
    let placement = place.iter().filter(|p| *p != "auto").map(|p| p.parse::<kiln::runtime::PlacementRule>().map_err(|e| anyhow!("--place: {e}"))).collect::<Result<Vec<_>>>()?;
    let open = |passes: Option<&PassChoices>| -> Result<(Session, Loaded)> {
        let mut loaded = load_model_with(model, passes, target, &args.custom_ops)?;
        edit(&mut loaded.graph);
        let tuning = args.tuning.tuning(loaded.info.as_ref());
        let options = SessionOptions {
            device: device.clone(),
            placement: placement.clone(),
            auto_place,
            memory_limit: args.memory_limit,
            threads: args.threads,
            denormals_are_zero: !args.keep_denormals,
            tuning,
            registry: loaded.registry.clone(),
            ..Default::default()
        };
        let session = Session::new(std::mem::take(&mut loaded.graph), options).with_context(|| format!("cannot prepare {} for device '{device}'", model.display()))?;
        Ok((session, loaded))
    };
    let (mut session, mut loaded) = open(passes.as_ref())?;
    // A tuned pass choice for this model on this device (`kiln tune`) other than the
    // defaults: the graph again with those passes.
    if let (Some(hash), Some(_), false) = (&loaded.model_hash, &passes, args.tuning.no_tuning) {
        if let Some(chosen) = kiln::graph_tuning::stored(&session, hash, target)? {
            log::info!("passes as tuned for this model on this device: {chosen:?}");
            (session, loaded) = open(Some(&chosen))?;
        }
    }
    let info = loaded.info;
    if let Some(n) = info.as_ref().map(|i| i.tuning.len()).filter(|&n| n > 0) {
        log::info!("{} embeds {n} tuned kernel choices", model.display());
    }
    let opened = t0.elapsed();
    if let Some(info) = info {
        // A fixed-shape model: plan it now (kernels generated and compiled), from the
        // driver's stored pipeline cache when it was made for this adapter and driver.
        let cached = match &info.pipeline_cache {
            Some(c) => session.use_pipeline_cache(c)?,
            None => false,
        };
        if session.device_kind() == kiln::runtime::DeviceKind::Gpu && session.warm_up()? {
            log::info!("planned the fixed input shapes{}", if cached { " (from the stored pipeline cache)" } else { "" });
        }
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    log::info!("load: model and session {:.1} ms, kernels {:.1} ms", ms(opened), ms(t0.elapsed() - opened));
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

/// The memory limit for a run's tensors: `--memory-limit`, else three quarters of the
/// machine's physical memory (the session's default; 64 GiB where that is unknown).
pub fn memory_limit(flag: Option<u64>) -> u64 {
    flag.unwrap_or_else(|| {
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
        });
        total.map_or(64 << 30, |t| t / 4 * 3)
    })
}

/// The concrete dims of a declared input type: symbolic dims take their binding, else 1.
fn input_dims(ty: &ValueType, dims: &HashMap<String, usize>) -> Vec<usize> {
    ty.shape
        .0
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            Dim::Sym(s) => dims.get(s).copied().unwrap_or(1),
        })
        .collect()
}

/// The symbol bindings for random inputs: `--dim` values (every name must be a symbolic
/// dim of some input), then the symbols that given inputs' shapes bind (a given input
/// that contradicts a `--dim` is an error naming both).
fn bind_symbols(declared: &[(String, ValueType)], given: &[(String, Tensor)], dims: &HashMap<String, usize>) -> Result<HashMap<String, usize>> {
    let symbols: Vec<&str> = declared.iter().flat_map(|(_, ty)| ty.shape.symbols()).collect();
    let mut names: Vec<&String> = dims.keys().collect();
    names.sort();
    for name in names {
        if !symbols.contains(&name.as_str()) {
            let mut known: Vec<&str> = symbols.clone();
            known.sort_unstable();
            known.dedup();
            let known = if known.is_empty() { "none: every input dim is fixed".to_string() } else { known.join(", ") };
            bail!("--dim {name}: no input of the model has a symbolic dim '{name}' (its symbols: {known})");
        }
    }
    let mut bound = dims.clone();
    for (name, t) in given {
        let Some((_, ty)) = declared.iter().find(|(n, _)| n == name) else { continue };
        if ty.shape.rank() != t.dims().len() {
            continue; // The session reports the rank mismatch, naming the input.
        }
        for (d, &size) in ty.shape.0.iter().zip(t.dims()) {
            let Dim::Sym(sym) = d else { continue };
            match bound.get(sym) {
                Some(&v) if v != size => {
                    let by = if dims.contains_key(sym) { "--dim".to_string() } else { "another given input".to_string() };
                    bail!("input '{name}' of shape {:?} binds '{sym}' to {size}, but {by} sets it to {v}", t.dims());
                }
                _ => {
                    bound.insert(sym.clone(), size);
                }
            }
        }
    }
    Ok(bound)
}

/// Deterministic random tensor of `dtype` and `shape`: floats uniform in [-1, 1),
/// integers in 0..10, bools half true. The caller has checked the size.
pub fn random_tensor(dtype: DType, shape: &[usize], seed: u64) -> Result<Tensor> {
    let mut t = Tensor::try_zeros(dtype, shape)?;
    let mut rng = Rng::new(seed);
    if dtype == DType::String {
        // Strings of the integers 0..10 (what a string input holds is the model's business).
        let v: Vec<String> = (0..t.len()).map(|_| (((rng.next_f32() as f64 + 1.0) * 5.0).floor() as i64).to_string()).collect();
        return Ok(Tensor::from_strings(shape, v)?);
    }
    let mut next = move || {
        let r = rng.next_f32() as f64;
        if dtype.is_float() || dtype.is_narrow_float() {
            r
        } else if dtype == DType::Bool {
            (r > 0.0) as u8 as f64
        } else {
            ((r + 1.0) * 5.0).floor()
        }
    };
    macro_rules! fill {
        ($t:ty, $f:expr) => {
            t.as_mut_slice::<$t>()?.iter_mut().for_each(|x| *x = $f(next()))
        };
    }
    match dtype {
        DType::F32 => fill!(f32, |v| v as f32),
        DType::F64 => fill!(f64, |v| v),
        DType::F16 => fill!(half::f16, half::f16::from_f64),
        DType::BF16 => fill!(half::bf16, half::bf16::from_f64),
        DType::I8 => fill!(i8, |v| v as i8),
        DType::I16 => fill!(i16, |v| v as i16),
        DType::I32 => fill!(i32, |v| v as i32),
        DType::I64 => fill!(i64, |v| v as i64),
        DType::U8 | DType::Bool => fill!(u8, |v| v as u8),
        DType::U16 => fill!(u16, |v| v as u16),
        DType::U32 => fill!(u32, |v| v as u32),
        DType::U64 => fill!(u64, |v| v as u64),
        // Floats in [-1, 1) and integers 0..10 rounded or wrapped into the narrow type.
        d => {
            let v: Vec<f64> = (0..t.len()).map(|_| next()).collect();
            t = Tensor::from_f64(d, shape, &v)?;
        }
    }
    Ok(t)
}

/// All inputs of a session: given ones first, random for the rest (seeded with `seed`;
/// symbolic dims as `dims` and the given inputs bind them, else 1). The sizes of the
/// random inputs are checked (no overflow, and all inputs together within `limit`
/// bytes) before anything is allocated.
pub fn complete_inputs(session: &Session, given: Vec<(String, Tensor)>, dims: &HashMap<String, usize>, limit: u64, seed: u64) -> Result<Vec<(String, Tensor)>> {
    let declared = session.inputs();
    let dims = bind_symbols(&declared, &given, dims)?;
    let mut used: u64 = given.iter().map(|(_, t)| t.bytes().len() as u64).sum();
    let mut all = given;
    for (i, (name, ty)) in declared.into_iter().enumerate() {
        if all.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let shape = input_dims(&ty, &dims);
        let bytes = size::bytes(ty.dtype, &shape).map_err(|e| anyhow!("random input '{name}': {e}"))? as u64;
        used = used.saturating_add(bytes);
        if used > limit {
            bail!(
                "random input '{name}' ({} of shape {shape:?}, {bytes} bytes) takes the inputs to {used} bytes, over the memory limit of {limit} bytes (set --dim smaller or --memory-limit larger)",
                ty.dtype
            );
        }
        log::info!("input '{name}' not given: using random values of type {ty}, shape {shape:?}");
        all.push((name, random_tensor(ty.dtype, &shape, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1 + i as u64))?));
    }
    Ok(all)
}

/// The inputs of `kiln run` and `kiln bench`: `--input` files, random values for the
/// rest (`--seed`, `--dim`), written to `--save-inputs DIR` as NAME.npy when asked.
pub fn session_inputs(session: &Session, args: &SessionArgs) -> Result<Vec<(String, Tensor)>> {
    let given = parse_inputs(&args.inputs)?;
    let inputs = complete_inputs(session, given, &parse_dims(&args.dims)?, memory_limit(args.memory_limit), args.seed)?;
    if let Some(dir) = &args.save_inputs {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let names: Vec<String> = inputs.iter().map(|(n, _)| n.clone()).collect();
        for (file, (_, t)) in output_file_names(&names).iter().zip(&inputs) {
            let path = dir.join(file);
            kiln::runtime::npy::write_file(&path, t).with_context(|| format!("cannot write {}", path.display()))?;
        }
        log::info!("inputs written to {}", dir.display());
    }
    Ok(inputs)
}

/// A short summary of a tensor's values.
pub fn summary(t: &Tensor) -> String {
    if let Some(v) = t.composite() {
        return format!("{v:?}");
    }
    if let Ok(s) = t.as_strings() {
        let head: Vec<String> = s.iter().take(5).map(|x| format!("{x:?}")).collect();
        return format!("[{}{}]", head.join(", "), if s.len() > 5 { ", ..." } else { "" });
    }
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

/// File names for outputs, in order: every character outside [A-Za-z0-9._-] becomes
/// '_', and names that would collide (`a/b` and `a_b`; compared ignoring case, for
/// case-insensitive file systems) get a suffix `_2`, `_3`, ..., said in a warning.
pub fn output_file_names(names: &[String]) -> Vec<String> {
    let mut taken: HashSet<String> = HashSet::new();
    let mut first_of: HashMap<String, &str> = HashMap::new();
    names
        .iter()
        .map(|name| {
            let base: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
            let mut file = format!("{base}.npy");
            let mut k = 2;
            while taken.contains(&file.to_lowercase()) {
                file = format!("{base}_{k}.npy");
                k += 1;
            }
            if k > 2 {
                let other = first_of.get(&format!("{base}.npy").to_lowercase()).copied().unwrap_or("another output");
                log::warn!("outputs '{other}' and '{name}' would both be written to {base}.npy: '{name}' goes to {file}");
            }
            taken.insert(file.to_lowercase());
            first_of.entry(format!("{base}.npy").to_lowercase()).or_insert(name);
            file
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_file_names_never_collide() {
        let names: Vec<String> = ["a/b", "a_b", "a:b", "A_B", "y", "a_b_2"].iter().map(|s| s.to_string()).collect();
        let files = output_file_names(&names);
        assert_eq!(files, ["a_b.npy", "a_b_2.npy", "a_b_3.npy", "A_B_4.npy", "y.npy", "a_b_2_2.npy"]);
        let unique: HashSet<String> = files.iter().map(|f| f.to_lowercase()).collect();
        assert_eq!(unique.len(), files.len());
    }

    #[test]
    fn random_tensors_of_every_dtype() {
        assert_eq!(summary(&random_tensor(DType::String, &[7], 3).unwrap()).matches(',').count(), 5);
        for dtype in DType::ALL.into_iter().chain([DType::String]) {
            let t = random_tensor(dtype, &[3, 4], 7).unwrap();
            assert_eq!((t.dtype(), t.dims()), (dtype, &[3usize, 4][..]));
            assert_eq!(t, random_tensor(dtype, &[3, 4], 7).unwrap());
        }
        // Values as the f64 path made them.
        let f = random_tensor(DType::F32, &[5], 1).unwrap();
        let mut rng = Rng::new(1);
        let want: Vec<f32> = (0..5).map(|_| rng.next_f32()).collect();
        assert_eq!(f.as_slice::<f32>().unwrap(), &want[..]);
        assert!(random_tensor(DType::F32, &[1 << 40, 1 << 40], 1).is_err());
    }
}
