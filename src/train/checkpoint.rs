//! Checkpoints: every state variable by name, the step count and a fingerprint of the
//! training step (state names, dtypes and dims, and the optimizer), in one .npz file.
//! Mixed precision's loss scale is saved but not fingerprinted: a run may go on with or
//! without mixed precision (a scale missing from the checkpoint starts afresh).
use super::{Result, TrainError, Trainer};
use kiln_compiler::autodiff::StateKind;
use kiln_graph::Tensor;
use kiln_runtime::npz;
use std::path::Path;

const STEP: &str = "kiln.step";
const FINGERPRINT: &str = "kiln.fingerprint";

/// FNV-1a over the state's names, dtypes and dims and the optimizer's description.
fn fingerprint(t: &Trainer) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |s: &str| {
        for b in s.bytes().chain([0]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    for s in t.state_vars.iter().filter(|s| s.kind != StateKind::LossScale) {
        eat(&format!("{}:{}:{:?}", s.name, s.initial.dtype(), s.initial.dims()));
    }
    eat(&format!("{:?}", t.optimizer.kind));
    h as i64
}

pub fn save(t: &Trainer, path: &Path) -> Result<()> {
    let step = Tensor::from_vec(&[1], vec![t.step as i64]).expect("a vector");
    let fp = Tensor::from_vec(&[1], vec![fingerprint(t)]).expect("a vector");
    let state = t.state()?;
    let mut arrays: Vec<(&str, &Tensor)> = state.iter().map(|(s, v)| (s.name.as_str(), v)).collect();
    arrays.push((STEP, &step));
    arrays.push((FINGERPRINT, &fp));
    npz::write_file(path, &arrays).map_err(|e| TrainError::Checkpoint { path: path.display().to_string(), what: e.to_string() })
}

pub fn load(t: &mut Trainer, path: &Path) -> Result<()> {
    let fail = |what: String| TrainError::Checkpoint { path: path.display().to_string(), what };
    let arrays = npz::read_file(path).map_err(|e| fail(e.to_string()))?;
    let get = |name: &str| arrays.iter().find(|(n, _)| n == name).map(|(_, t)| t);
    let scalar = |name: &str| -> Result<i64> {
        get(name).and_then(|v| v.to_i64_vec().ok()).and_then(|v| v.first().copied()).ok_or_else(|| fail(format!("no '{name}' entry: not a Kiln checkpoint")))
    };
    let step = scalar(STEP)?;
    // Say what differs before the fingerprint's verdict, so a user sees why.
    let mut next = Vec::with_capacity(t.state_vars.len());
    for s in &t.state_vars {
        let cur = &s.initial;
        let v = match get(&s.name) {
            Some(v) => v,
            None if s.kind == StateKind::LossScale => cur,
            None => return Err(fail(format!("no '{}': a checkpoint of another model or optimizer", s.name))),
        };
        if v.dtype() != cur.dtype() || v.dims() != cur.dims() {
            return Err(fail(format!("'{}' is {}{:?}, this model's is {}{:?}: a checkpoint of another model", s.name, v.dtype(), v.dims(), cur.dtype(), cur.dims())));
        }
        next.push(v.clone());
    }
    if scalar(FINGERPRINT)? != fingerprint(t) {
        return Err(fail("made for another model or optimizer (its fingerprint differs)".into()));
    }
    if step < 0 {
        return Err(fail(format!("step {step} is negative")));
    }
    for (s, v) in t.state_vars.iter().zip(next) {
        t.carried.set(&s.name, v)?;
    }
    t.step = step as u64;
    Ok(())
}
