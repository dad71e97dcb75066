//! Sequences and optionals (ONNX): SequenceConstruct, SequenceEmpty, SequenceAt,
//! SequenceInsert, SequenceErase, SequenceLength, SplitToSequence, ConcatFromSequence,
//! SequenceMap, Optional, OptionalHasElement and OptionalGetElement.
//!
//! Their values live on the host (`kiln_graph::Value`, carried as composite tensors), so
//! each op is a [`HostOp`]: a type rule and a computation on known inputs, wrapped by
//! [`Host`] into an [`Op`] whose CPU kernel and folding run that computation. Inference
//! walks fold such nodes once their inputs are known; sessions evaluate them between
//! stages, in CPU and GPU sessions alike.
mod concat_from_sequence;
mod optional;
mod optional_get_element;
mod optional_has_element;
mod sequence_at;
mod sequence_construct;
mod sequence_empty;
mod sequence_erase;
mod sequence_insert;
mod sequence_length;
mod sequence_map;
mod split_to_sequence;

use crate::cpu::CpuKernel;
use crate::wgsl::WgslKernel;
use crate::{Arg, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor, Value, ValueKind};
use std::fmt::Debug;

pub(crate) fn register(r: &mut Registry) {
    r.register("", "SequenceConstruct", |_| Ok(Box::new(Host(sequence_construct::SequenceConstruct))));
    r.register("", "SequenceEmpty", |s| Ok(Box::new(Host(sequence_empty::SequenceEmpty::parse(s)?))));
    r.register("", "SequenceAt", |_| Ok(Box::new(Host(sequence_at::SequenceAt))));
    r.register("", "SequenceInsert", |_| Ok(Box::new(Host(sequence_insert::SequenceInsert))));
    r.register("", "SequenceErase", |_| Ok(Box::new(Host(sequence_erase::SequenceErase))));
    r.register("", "SequenceLength", |_| Ok(Box::new(Host(sequence_length::SequenceLength))));
    r.register("", "SplitToSequence", |s| Ok(Box::new(Host(split_to_sequence::SplitToSequence::parse(s)?))));
    r.register("", "ConcatFromSequence", |s| Ok(Box::new(Host(concat_from_sequence::ConcatFromSequence::parse(s)?))));
    r.register("", "SequenceMap", |s| Ok(Box::new(Host(sequence_map::SequenceMap::parse(s)?))));
    r.register("", "Optional", |s| Ok(Box::new(Host(optional::Optional::parse(s)?))));
    r.register("", "OptionalHasElement", |_| Ok(Box::new(Host(optional_has_element::OptionalHasElement))));
    r.register("", "OptionalGetElement", |_| Ok(Box::new(Host(optional_get_element::OptionalGetElement))));
}

/// An op over host values: its output types, and its outputs from known inputs.
pub(crate) trait HostOp: Send + Sync + Debug {
    fn name(&self) -> &str;

    /// Output types from the inputs' types (and values, where the op needs them:
    /// `OpError::NeedsValue` when they are not known).
    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>>;

    /// The outputs, every present input known.
    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>>;
}

/// A [`HostOp`] as an [`Op`]: folded wherever its inputs are known, a CPU kernel that
/// replaces its outputs with the values it computes, no WGSL.
#[derive(Debug)]
pub(crate) struct Host<T>(pub T);

impl<T: HostOp> Op for Host<T> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        self.0.types(inputs)
    }

    fn eval_from_types(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        let values: Option<Vec<Option<&Tensor>>> = inputs.iter().map(|a| match a {
            None => Some(None),
            Some(a) => a.value.map(Some),
        }).collect();
        values.map(|v| self.0.compute(&v))
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn handles_containers(&self) -> bool {
        true
    }
}

impl<T: HostOp> CpuKernel for Host<T> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        for (o, t) in outputs.iter_mut().zip(self.0.compute(inputs)?) {
            *o = t;
        }
        Ok(())
    }
}

/// The type of present input `i`.
fn input_type<'a>(inputs: &[Option<Arg<'a>>], i: usize) -> Result<&'a TensorType> {
    Ok(crate::required(inputs, i)?.ty)
}

/// The type of input `i`, which must be of `kind`.
fn expect_kind<'a>(inputs: &[Option<Arg<'a>>], i: usize, kind: ValueKind) -> Result<&'a TensorType> {
    let ty = input_type(inputs, i)?;
    if ty.kind != kind {
        return Err(OpError::input(i, format!("expected a {}, got {ty}", kind.describe("tensor"))));
    }
    Ok(ty)
}

/// Present input `i`'s value.
fn value(inputs: &[Option<&Tensor>], i: usize) -> Result<Value> {
    Ok(Value::from(crate::cpu::input(inputs, i)?.clone()))
}

/// Input `i` as a sequence: the dtype and the tensors.
fn sequence(inputs: &[Option<&Tensor>], i: usize) -> Result<(DType, Vec<Tensor>)> {
    match value(inputs, i)? {
        Value::Sequence { dtype, tensors } => Ok((dtype, tensors)),
        v => Err(OpError::input(i, format!("expected a sequence, got {}", v.describe()))),
    }
}

/// A sequence as a (composite) tensor.
fn sequence_tensor(dtype: DType, tensors: Vec<Tensor>) -> Tensor {
    Tensor::from_value(Value::sequence(dtype, tensors))
}

/// Checks that a tensor going into a sequence of `dtype` is of that dtype.
fn check_element(t: &Tensor, dtype: DType, i: usize) -> Result<()> {
    if !t.kind().is_tensor() {
        return Err(OpError::input(i, format!("expected a tensor, got {}", t.to_value().describe())));
    }
    if t.dtype() != dtype {
        return Err(OpError::input(i, format!("a tensor of {} cannot join a sequence of {dtype}", t.dtype())));
    }
    Ok(())
}

/// The position given by input `i` (a scalar int32 or int64, negative counting from
/// the end) in a sequence of `len`, checked against `[-len, len - 1]`, or `[-len, len]`
/// when it may point past the end (`insert`).
fn position(inputs: &[Option<&Tensor>], i: usize, len: usize, insert: bool) -> Result<usize> {
    let t = crate::cpu::input(inputs, i)?;
    if !matches!(t.dtype(), DType::I32 | DType::I64) || t.len() != 1 || !t.kind().is_tensor() {
        return Err(OpError::input(i, format!("the position must be one int32 or int64, got {}", t.to_value().describe())));
    }
    let p = t.to_i64_vec()?[0];
    let n = len as i64;
    let hi = if insert { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(OpError::input(i, format!("position {p} is out of range [{}, {hi}] for a sequence of {len} tensors", -n)));
    }
    Ok(if p < 0 { (p + n) as usize } else { p as usize })
}

/// Checks the position input's type (when present) at inference.
fn check_position_type(inputs: &[Option<Arg>], i: usize) -> Result<()> {
    if let Some(a) = inputs.get(i).copied().flatten() {
        if !a.ty.is_tensor() || !matches!(a.dtype(), DType::I32 | DType::I64) || a.ty.len() != 1 {
            return Err(OpError::input(i, format!("the position must be one int32 or int64, got {}", a.ty)));
        }
    }
    Ok(())
}

/// `dims` split around `axis`: (outer count, inner bytes).
fn around(dims: &[usize], axis: usize, dtype: DType) -> (usize, usize) {
    (dims[..axis].iter().product(), dims[axis + 1..].iter().product::<usize>() * dtype.size())
}

/// Rows `start..start + n` of `t` along `axis`.
fn slice_axis(t: &Tensor, axis: usize, start: usize, n: usize) -> Result<Tensor> {
    let (outer, inner) = around(t.dims(), axis, t.dtype());
    let len = t.dims()[axis];
    let mut dims = t.dims().to_vec();
    dims[axis] = n;
    let src = t.bytes();
    let mut bytes = Vec::with_capacity(outer * n * inner);
    for o in 0..outer {
        let at = (o * len + start) * inner;
        bytes.extend_from_slice(&src[at..at + n * inner]);
    }
    Ok(Tensor::from_bytes(t.dtype(), &dims, &bytes)?)
}

/// The tensors of `parts` joined along `axis` (every other dim equal).
fn concat_axis(parts: &[Tensor], axis: usize) -> Result<Tensor> {
    let first = parts.first().ok_or_else(|| OpError::input(0, "cannot concatenate an empty sequence"))?;
    for (k, p) in parts.iter().enumerate() {
        let same = p.rank() == first.rank() && p.dims().iter().zip(first.dims()).enumerate().all(|(d, (a, b))| d == axis || a == b);
        if !same || p.dtype() != first.dtype() {
            return Err(OpError::input(0, format!("tensor {k} is {}{:?}, tensor 0 {}{:?}: they differ outside axis {axis}", p.dtype(), p.dims(), first.dtype(), first.dims())));
        }
    }
    let (outer, inner) = around(first.dims(), axis, first.dtype());
    let mut dims = first.dims().to_vec();
    dims[axis] = parts.iter().map(|p| p.dims()[axis]).sum();
    let total = kiln_graph::size::bytes(first.dtype(), &dims).map_err(|e| OpError::invalid(e.to_string()))?;
    let mut bytes = Vec::with_capacity(total);
    for o in 0..outer {
        for p in parts {
            let row = p.dims()[axis] * inner;
            bytes.extend_from_slice(&p.bytes()[o * row..(o + 1) * row]);
        }
    }
    Ok(Tensor::from_bytes(first.dtype(), &dims, &bytes)?)
}

/// The types of computed outputs, when every present input is known; else which input
/// is needed (for ops whose output types depend on values: element shapes).
fn types_from_values<T: HostOp + ?Sized>(op: &T, inputs: &[Option<Arg>], what: &str) -> Result<Vec<TensorType>> {
    let mut values = vec![];
    for (i, a) in inputs.iter().enumerate() {
        match a {
            None => values.push(None),
            Some(a) => values.push(Some(a.value.ok_or_else(|| OpError::NeedsValue { index: i, what: what.to_string() })?)),
        }
    }
    Ok(op.compute(&values)?.iter().map(TensorType::of).collect())
}

#[cfg(test)]
mod tests;
