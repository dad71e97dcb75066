//! Shared helpers for the end-to-end tests: where the zoo and the conformance data
//! are, reading ONNX test data sets, comparing tensors, choosing devices.
#![allow(dead_code)]
use kiln::graph::Tensor;
use kiln::runtime::DeviceChoice;
use std::path::{Path, PathBuf};

pub mod runs;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The model zoo: $KILN_ZOO, default ../shared/zoo. Panics loudly when missing.
pub fn zoo() -> PathBuf {
    let p = std::env::var_os("KILN_ZOO").map(PathBuf::from).unwrap_or_else(|| workspace().join("../shared/zoo"));
    assert!(
        p.is_dir(),
        "\n\n!!! The model zoo is missing at {}.\n!!! Put the shared zoo beside this repository (../shared/zoo) or set KILN_ZOO.\n",
        p.display()
    );
    p
}

/// The training references: $KILN_TRAINING, default ../shared/training. Panics loudly
/// when missing.
pub fn training_dir() -> PathBuf {
    let p = std::env::var_os("KILN_TRAINING").map(PathBuf::from).unwrap_or_else(|| workspace().join("../shared/training"));
    assert!(p.is_dir(), "\n\n!!! The training references are missing at {}: put ../shared beside this repository or set KILN_TRAINING.\n", p.display());
    p
}

/// onnxruntime's transformer-optimized zoo models: $KILN_OPTIMIZED_ZOO, default
/// .cache/optimized-zoo (scripts/optimize_transformers.py writes it; scripts/test.sh
/// runs that). Panics loudly when the model is missing.
pub fn optimized_zoo_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("KILN_OPTIMIZED_ZOO").map(PathBuf::from).unwrap_or_else(|| workspace().join(".cache/optimized-zoo"));
    let p = dir.join(name).join("model.onnx");
    assert!(
        p.is_file(),
        "\n\n!!! The onnxruntime-optimized model is missing at {}.\n!!! Run scripts/test.sh (or: python3 scripts/optimize_transformers.py {}).\n",
        p.display(),
        dir.display()
    );
    p
}

/// The exact-integer references of the QDQ model: $KILN_EXACT_INT_ZOO, default
/// .cache/exact-int-zoo, holding `NAME/test_data_set_N/` (scripts/qdq_int_reference.py
/// --write fills it; scripts/test.sh runs that). Panics loudly when it is missing.
pub fn exact_int_zoo(name: &str) -> PathBuf {
    let dir = std::env::var_os("KILN_EXACT_INT_ZOO").map(PathBuf::from).unwrap_or_else(|| workspace().join(".cache/exact-int-zoo"));
    let p = dir.join(name);
    assert!(
        p.join("test_data_set_0").is_dir(),
        "\n\n!!! The exact-integer reference is missing at {}.\n!!! Run scripts/test.sh (or: python3 scripts/qdq_int_reference.py --write {}).\n",
        p.display(),
        dir.display()
    );
    p
}

/// The materialised ONNX backend node tests: $KILN_ONNX_TESTS, default
/// .cache/onnx-node-tests (scripts/test.sh fills it).
pub fn onnx_tests() -> PathBuf {
    let p = std::env::var_os("KILN_ONNX_TESTS").map(PathBuf::from).unwrap_or_else(|| workspace().join(".cache/onnx-node-tests"));
    assert!(
        p.join(".complete").is_file(),
        "\n\n!!! The ONNX node tests are missing at {}.\n!!! Run scripts/test.sh (or: python3 scripts/materialize_onnx_tests.py {}).\n",
        p.display(),
        p.display()
    );
    p
}

/// One data set: named inputs (in file order) and reference outputs.
pub struct DataSet {
    pub dir: PathBuf,
    pub inputs: Vec<(String, Tensor)>,
    pub outputs: Vec<Tensor>,
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    let n = name.strip_prefix(prefix)?.strip_suffix(".pb")?.parse().ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// Data sets of a test/model folder (test_data_set_*), sorted.
pub fn data_sets(dir: &Path) -> Vec<DataSet> {
    data_sets_of(dir, &[], &[])
}

/// Reads value file `p` of the declared type `ty` (a tensor when undeclared).
fn read_value(p: &Path, ty: Option<&kiln::graph::ValueType>) -> (String, Tensor) {
    let read = match ty {
        Some(ty) => kiln::compiler::onnx::read_value_pb(p, ty),
        None => kiln::compiler::onnx::read_tensor_pb(p),
    };
    read.unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Like [`data_sets`], with the declared types of the inputs and outputs: sequences and
/// optionals are read from SequenceProto and OptionalProto files.
pub fn data_sets_of(dir: &Path, inputs: &[kiln::graph::ValueType], outputs: &[Option<kiln::graph::ValueType>]) -> Vec<DataSet> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))).collect())
        .unwrap_or_default();
    sets.sort();
    sets.into_iter()
        .map(|d| {
            let inputs = numbered(&d, "input_").iter().enumerate().map(|(i, p)| read_value(p, inputs.get(i))).collect();
            let outputs = numbered(&d, "output_").iter().enumerate().map(|(i, p)| read_value(p, outputs.get(i).and_then(Option::as_ref)).1).collect();
            DataSet { dir: d, inputs, outputs }
        })
        .collect()
}

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    got.rel_l2_error(want)
}

/// numpy.allclose-style comparison (NaNs equal; strings exactly); returns a
/// description of the first mismatch.
pub fn allclose(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!("shape {:?}, expected {:?}", got.dims(), want.dims()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    // Strings compare exactly.
    if let (Ok(g), Ok(w)) = (got.as_strings(), want.as_strings()) {
        return match g.iter().zip(w).position(|(a, b)| a != b) {
            Some(i) => Err(format!("element {i}: {:?} vs expected {:?}", g[i], w[i])),
            None => Ok(()),
        };
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
        if !ok {
            return Err(format!("element {i}: {a} vs expected {b}"));
        }
    }
    Ok(())
}

/// [`allclose`] for values that may be sequences or optionals: the same kind, and
/// their tensors compared in order.
pub fn allclose_value(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    use kiln::graph::Value;
    match (Value::from(got.clone()), Value::from(want.clone())) {
        (Value::Tensor(g), Value::Tensor(w)) => allclose(&g, &w, rtol, atol),
        (Value::Sequence { dtype: gd, tensors: g }, Value::Sequence { dtype: wd, tensors: w }) => {
            if gd != wd || g.len() != w.len() {
                return Err(format!("a sequence of {} {gd} tensors, expected {} of {wd}", g.len(), w.len()));
            }
            g.iter().zip(&w).enumerate().try_for_each(|(i, (g, w))| allclose(g, w, rtol, atol).map_err(|e| format!("tensor {i}: {e}")))
        }
        (Value::Optional { value: g, .. }, Value::Optional { value: w, .. }) => match (g, w) {
            (None, None) => Ok(()),
            (Some(g), Some(w)) => allclose_value(&Tensor::from_value(*g), &Tensor::from_value(*w), rtol, atol),
            (g, w) => Err(format!("optional {}, expected {}", if g.is_some() { "holds a value" } else { "is empty" }, if w.is_some() { "a value" } else { "empty" })),
        },
        (g, w) => Err(format!("a {}, expected a {}", g.describe(), w.describe())),
    }
}

/// Quiets Mesa's warning about XDG_RUNTIME_DIR.
pub fn gpu_env() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let d = std::env::temp_dir().join("kiln-xdg");
        let _ = std::fs::create_dir_all(&d);
        std::env::set_var("XDG_RUNTIME_DIR", d);
    }
}

/// The two backends every end-to-end test runs on. `gpu` is the best adapter,
/// software ones included: CI has lavapipe, and a missing adapter is a failure.
pub fn backends() -> [(&'static str, DeviceChoice); 2] {
    [("cpu", DeviceChoice::Cpu), ("gpu", DeviceChoice::Gpu)]
}
