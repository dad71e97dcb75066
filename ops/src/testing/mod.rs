//! Test support for every op test, in this crate and in the crates above it: one
//! builder of a node and its inputs ([`Case`]), deterministic data ([`rand`], ...), one
//! CPU runner that also validates the generated WGSL ([`run`]), and comparisons with
//! per-dtype tolerances ([`Tolerance`], [`compare`]).
//!
//! Compiled for this crate's own tests and, behind the `testing` cargo feature, for
//! the dev-dependencies of kiln-runtime and kiln-compiler, whose tests run the same
//! [`Case`]s as sessions on every device.
mod case;
mod compare;
mod data;
mod msft_cases;
mod ort_cases;

pub use case::{Case, Input, DEFAULT_OPSET};
pub use compare::{assert_close, compare, compare_values, Tolerance};
pub use ort_cases::{all_ort_cases, check_ort_cases, creation_error, ort_cases, OrtCase, A as OrtAttr, V as OrtValue};
pub use data::{bools, cast, f32s, i64_vec, i64s, ints, iota_f32, iota_i64, rand, rand_f32, rand_f32_map, rand_values, string, strs};

use crate::{Arg, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{Attr, Tensor};

/// An op of type `op_type` at `opset` with `n_in` inputs (all present) and `n_out`
/// outputs, for tests that run one op on several inputs ([`Case`] without inputs).
pub fn make(op_type: &str, opset: i64, attrs: &[(&str, Attr)], n_in: usize, n_out: usize) -> Result<Box<dyn Op>> {
    let mut case = Case::new(op_type).opset(opset).attrs(attrs).outputs(n_out);
    case.inputs = (0..n_in).map(|_| Input::Data(Tensor::scalar(0f32))).collect();
    case.op()
}

/// Runs `op` on the CPU: infers the output types (constants' values visible, run-time
/// inputs' not), runs the CPU kernel, checks the outputs against the inferred types,
/// and generates and validates (naga) the WGSL with the default tuning and each of
/// `tunes` (an op without a WGSL kernel, or refusing these inputs with
/// `OpError::Unsupported`, is left to the CPU). Returns the CPU outputs.
pub fn run(op: &dyn Op, inputs: &[Input], tunes: &[TuneValues]) -> Result<Vec<Tensor>> {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|x| x.tensor().map(|t| TensorType::of(t))).collect();
    let args: Vec<Option<Arg>> =
        types.iter().zip(inputs).map(|(ty, x)| ty.as_ref().map(|ty| Arg { ty, value: x.known_value() })).collect();
    let out_types = op.infer(&args)?;
    let tensors: Vec<Option<&Tensor>> = inputs.iter().map(Input::tensor).collect();
    let mut outs: Vec<Tensor> = out_types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
    op.cpu().ok_or_else(|| OpError::Unsupported(format!("{} has no CPU kernel", op.name())))?.run(&tensors, &mut outs)?;
    for (k, (o, t)) in outs.iter().zip(&out_types).enumerate() {
        assert_eq!((o.dtype(), o.dims(), o.kind()), (t.dtype, t.dims.as_slice(), t.kind), "{} output {k}: the CPU kernel's type differs from the inferred one", op.name());
    }
    if let Some(k) = op.wgsl() {
        for tune in std::iter::once(&TuneValues::default()).chain(tunes) {
            match k.generate(&args, &out_types, tune) {
                Ok(prog) => prog.dispatches.iter().for_each(|d| validate_wgsl(&d.source)),
                Err(OpError::Unsupported(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(outs)
}

/// Runs every CPU variant of `op` at these inputs: the plain kernel, its `prepare`d
/// kernel at the defaults, then each candidate of each [`crate::CpuKernel::params`]
/// entry, one at a time (the others at their defaults). Returns `(variant name,
/// outputs)` pairs; the candidate name is `param=value`.
pub fn run_cpu_variants(op: &dyn Op, inputs: &[Input]) -> Result<Vec<(String, Vec<Tensor>)>> {
    let mut out = vec![("plain".to_string(), run_cpu_tuned(op, inputs, None)?), ("defaults".to_string(), run_cpu_tuned(op, inputs, Some(&TuneValues::default()))?)];
    for p in cpu_params(op, inputs)? {
        for &c in &p.candidates {
            out.push((format!("{}={c}", p.name), run_cpu_tuned(op, inputs, Some(&tune(&[(p.name, c)])))?));
        }
    }
    Ok(out)
}

/// The tunable parameters `op`'s CPU kernel declares at these inputs.
pub fn cpu_params(op: &dyn Op, inputs: &[Input]) -> Result<Vec<crate::TuneParam>> {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|x| x.tensor().map(|t| TensorType::of(t))).collect();
    let args: Vec<Option<Arg>> =
        types.iter().zip(inputs).map(|(ty, x)| ty.as_ref().map(|ty| Arg { ty, value: x.known_value() })).collect();
    let out_types = op.infer(&args)?;
    let kernel = op.cpu().ok_or_else(|| OpError::Unsupported(format!("{} has no CPU kernel", op.name())))?;
    Ok(kernel.params(&args, &out_types))
}

/// Runs `op`'s CPU kernel at these inputs: `prepare`d with `tune` (the kernel itself
/// where it prepares nothing), or unprepared when `tune` is None.
pub fn run_cpu_tuned(op: &dyn Op, inputs: &[Input], tune: Option<&TuneValues>) -> Result<Vec<Tensor>> {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|x| x.tensor().map(|t| TensorType::of(t))).collect();
    let args: Vec<Option<Arg>> =
        types.iter().zip(inputs).map(|(ty, x)| ty.as_ref().map(|ty| Arg { ty, value: x.known_value() })).collect();
    let out_types = op.infer(&args)?;
    let tensors: Vec<Option<&Tensor>> = inputs.iter().map(Input::tensor).collect();
    let kernel = op.cpu().ok_or_else(|| OpError::Unsupported(format!("{} has no CPU kernel", op.name())))?;
    let prepared = match tune {
        Some(t) => kernel.prepare(&args, &out_types, t)?,
        None => None,
    };
    let mut outs: Vec<Tensor> = out_types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
    prepared.as_deref().unwrap_or(kernel).run(&tensors, &mut outs)?;
    Ok(outs)
}

/// Inputs from optional tensors: `None` is omitted, indices in `consts` are constants,
/// the others run-time values.
pub fn as_inputs(tensors: &[Option<&Tensor>], consts: &[usize]) -> Vec<Input> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            None => Input::Omitted,
            Some(t) if consts.contains(&i) => Input::Const((*t).clone()),
            Some(t) => Input::Data((*t).clone()),
        })
        .collect()
}

/// The first output (for `run(..).map(first)` on single-output ops).
pub fn first(mut outputs: Vec<Tensor>) -> Tensor {
    outputs.swap_remove(0)
}

/// [`run`] with every input a run-time value.
pub fn run_data(op: &dyn Op, inputs: &[&Tensor], tunes: &[TuneValues]) -> Result<Vec<Tensor>> {
    let inputs: Vec<Input> = inputs.iter().map(|t| Input::Data((*t).clone())).collect();
    run(op, &inputs, tunes)
}

/// Tunings that set the named parameters.
pub fn tune(pairs: &[(&str, u32)]) -> TuneValues {
    TuneValues(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
}

/// Parses and validates generated WGSL with naga (every capability allowed), so that
/// op tests catch shader errors without a GPU; panics with the source on an error.
pub fn validate_wgsl(src: &str) {
    let module = match naga::front::wgsl::parse_str(src) {
        Ok(m) => m,
        Err(e) => panic!("WGSL parse error:\n{}\n--- source ---\n{src}", e.emit_to_string(src)),
    };
    let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    if let Err(e) = v.validate(&module) {
        panic!("WGSL validation error: {e:?}\n--- source ---\n{src}");
    }
}
