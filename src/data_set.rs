//! ONNX backend-test data sets (`test_data_set_N/input_K.pb`, `output_K.pb`), as
//! onnxruntime's onnx_test_runner reads them: finding them, reading them, and comparing
//! a run's outputs with them elementwise (`|got - want| <= atol + rtol * |want|`).
use anyhow::{bail, Context, Result};
use kiln::graph::Tensor;
use std::path::{Path, PathBuf};

/// One data set: its directory and its tensors in file order, each with the name its
/// TensorProto carries (None when empty).
pub struct DataSet {
    pub dir: PathBuf,
    pub inputs: Vec<(Option<String>, Tensor)>,
    pub outputs: Vec<(Option<String>, Tensor)>,
}

/// The data sets `dir` names: itself when it holds `input_0.pb`, else its
/// `test_data_set_*` subdirectories in numeric order.
pub fn find(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("input_0.pb").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("--data-set {}", dir.display()))?;
    let mut sets: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .filter_map(|p| {
            let n = p.file_name()?.to_str()?.strip_prefix("test_data_set_")?.parse().ok()?;
            Some((n, p))
        })
        .collect();
    sets.sort();
    if sets.is_empty() {
        bail!("--data-set {}: neither a data set (input_0.pb) nor a directory of test_data_set_N directories", dir.display());
    }
    Ok(sets.into_iter().map(|(_, p)| p).collect())
}

/// Reads `prefix_0.pb`, `prefix_1.pb`, ... until one is missing.
fn numbered(dir: &Path, prefix: &str) -> Result<Vec<(Option<String>, Tensor)>> {
    let mut out = vec![];
    loop {
        let path = dir.join(format!("{prefix}_{}.pb", out.len()));
        if !path.is_file() {
            return Ok(out);
        }
        let (name, t) = kiln::compiler::onnx::read_tensor_pb(&path).with_context(|| format!("cannot read {}", path.display()))?;
        out.push(((!name.is_empty()).then_some(name), t));
    }
}

pub fn read(dir: &Path) -> Result<DataSet> {
    let (inputs, outputs) = (numbered(dir, "input")?, numbered(dir, "output")?);
    if outputs.is_empty() {
        bail!("{}: no output_0.pb to compare with", dir.display());
    }
    Ok(DataSet { dir: dir.to_path_buf(), inputs, outputs })
}

/// Pairs tensors with the model's names: by the name a tensor carries, else by position.
/// A name the model does not have is an error naming the file's data set.
pub fn by_name(dir: &Path, what: &str, tensors: Vec<(Option<String>, Tensor)>, names: &[String]) -> Result<Vec<(String, Tensor)>> {
    if tensors.len() > names.len() {
        bail!("{}: {} {what} files, the model has {} {what}s ({})", dir.display(), tensors.len(), names.len(), names.join(", "));
    }
    tensors
        .into_iter()
        .enumerate()
        .map(|(i, (name, t))| match name {
            Some(n) if names.contains(&n) => Ok((n, t)),
            Some(n) => bail!("{}: {what}_{i}.pb is named '{n}', which is not one of the model's {what}s ({})", dir.display(), names.join(", ")),
            None => Ok((names[i].clone(), t)),
        })
        .collect()
}

/// Tolerances of the elementwise comparison.
#[derive(Clone, Copy)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

/// How one output compares with its reference.
pub struct Comparison {
    pub name: String,
    /// Why the output cannot match at all (dtype or shape), else None.
    pub mismatch: Option<String>,
    /// Elements outside the tolerance, of `len`.
    pub bad: usize,
    pub len: usize,
    pub max_abs: f64,
    pub rel_l2: f64,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.mismatch.is_none() && self.bad == 0
    }
}

/// Compares `got` with `want` elementwise; NaN matches NaN, and infinities must be equal.
pub fn compare(name: &str, got: &Tensor, want: &Tensor, tol: Tolerance) -> Comparison {
    let mut c = Comparison { name: name.to_string(), mismatch: None, bad: 0, len: want.len(), max_abs: 0.0, rel_l2: 0.0 };
    if got.dtype() != want.dtype() || got.dims() != want.dims() {
        c.mismatch = Some(format!("expected {}{:?}, got {}{:?}", want.dtype(), want.dims(), got.dtype(), got.dims()));
        return c;
    }
    if let (Ok(g), Ok(w)) = (got.as_strings(), want.as_strings()) {
        c.bad = g.iter().zip(w).filter(|(a, b)| a != b).count();
        return c;
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (&a, &b) in g.iter().zip(&w) {
        let same = (a.is_nan() && b.is_nan()) || a == b;
        let d = (a - b).abs();
        if !same && !(d <= tol.atol + tol.rtol * b.abs()) {
            c.bad += 1;
        }
        if d.is_finite() {
            c.max_abs = c.max_abs.max(d);
        }
    }
    c.rel_l2 = got.rel_l2_error(want);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons() {
        let t = |v: Vec<f32>| Tensor::from_vec(&[v.len()], v).unwrap();
        let tol = Tolerance { rtol: 1e-3, atol: 1e-5 };
        let want = t(vec![1.0, -2.0, f32::NAN, 0.0]);
        assert!(compare("y", &t(vec![1.0005, -2.001, f32::NAN, 5e-6]), &want, tol).ok());
        let c = compare("y", &t(vec![1.01, -2.0, 0.0, 0.0]), &want, tol);
        assert_eq!((c.bad, c.ok()), (2, false));
        let c = compare("y", &t(vec![1.0, 2.0]), &want, tol);
        assert!(c.mismatch.unwrap().contains("expected f32[4]"));
    }
}
