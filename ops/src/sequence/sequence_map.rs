//! SequenceMap: runs `body` once per position of the input sequences. Inputs: a
//! sequence, then more sequences (of the same length) or tensors, then the enclosing
//! graph's values the body reads. The body takes, for position i, element i of each
//! sequence and each tensor whole; the node returns one sequence per body output.
use super::{sequence_tensor, types_from_values, HostOp};
use crate::control::Body;
use crate::{Arg, NodeSpec, OpError, Result, TensorType};
use kiln_graph::{Tensor, Value, ValueKind};

#[derive(Debug)]
pub struct SequenceMap {
    body: Body,
}

impl SequenceMap {
    pub fn parse(spec: &NodeSpec) -> Result<SequenceMap> {
        let body = Body::parse(spec, "body")?;
        if body.declared() < 1 {
            return Err(OpError::invalid("SequenceMap's body takes at least one input (an element of the first sequence)"));
        }
        if spec.n_inputs() != body.n_inputs() {
            return Err(OpError::invalid(format!(
                "the node has {} inputs, its body {} ({} declared, the rest values of the enclosing graph)",
                spec.n_inputs(),
                body.n_inputs(),
                body.declared()
            )));
        }
        if spec.n_outputs() != body.n_outputs() {
            return Err(OpError::invalid(format!("the node has {} outputs, its body {}: one sequence per body output", spec.n_outputs(), body.n_outputs())));
        }
        Ok(SequenceMap { body })
    }

    /// The number of positions: the common length of the sequence inputs.
    fn length(&self, values: &[Value]) -> Result<usize> {
        let mut len = None;
        for (i, v) in values.iter().enumerate().take(self.body.declared()) {
            if let Value::Sequence { tensors, .. } = v {
                match len {
                    None => len = Some(tensors.len()),
                    Some(n) if n != tensors.len() => {
                        return Err(OpError::input(i, format!("a sequence of {} tensors, but input 0 has {n}: SequenceMap's sequences must have one length", tensors.len())));
                    }
                    _ => {}
                }
            } else if i == 0 {
                return Err(OpError::input(0, format!("expected a sequence, got {}", v.describe())));
            } else if !v.kind().is_tensor() {
                return Err(OpError::input(i, format!("expected a sequence or a tensor, got {}", v.describe())));
            }
        }
        Ok(len.unwrap_or(0))
    }

    /// The body's output dtypes for a map over empty sequences: inferred with each
    /// sequence's elements taken as scalars of its dtype.
    fn empty_outputs(&self, values: &[Value], inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let mut args: Vec<(TensorType, Option<&Tensor>)> = vec![];
        for (k, v) in values.iter().enumerate() {
            let t = inputs[k].ok_or_else(|| OpError::input(k, "required input is missing"))?;
            args.push(match v {
                Value::Sequence { dtype, .. } => (TensorType::new(*dtype, vec![]), None),
                _ => (TensorType::of(t), Some(t)),
            });
        }
        let types = self.body.infer(&args, 0)?;
        Ok(types.iter().map(|t| sequence_tensor(t.dtype, vec![])).collect())
    }
}

impl HostOp for SequenceMap {
    fn name(&self) -> &str {
        "SequenceMap"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let first = crate::required(inputs, 0)?;
        if first.ty.kind != ValueKind::Sequence {
            return Err(OpError::input(0, format!("expected a sequence, got {}", first.ty)));
        }
        types_from_values(self, inputs, "the sequences (the body runs once per element)")
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let values: Vec<Value> = (0..inputs.len()).map(|i| super::value(inputs, i)).collect::<Result<_>>()?;
        let len = self.length(&values)?;
        if len == 0 {
            return self.empty_outputs(&values, inputs);
        }
        let mut outs: Vec<Vec<Tensor>> = vec![vec![]; self.body.n_outputs()];
        for i in 0..len {
            let args: Vec<&Tensor> = values
                .iter()
                .zip(inputs)
                .enumerate()
                .map(|(k, (v, t))| match v {
                    Value::Sequence { tensors, .. } if k < self.body.declared() => Ok(&tensors[i]),
                    _ => t.ok_or_else(|| OpError::input(k, "required input is missing")),
                })
                .collect::<Result<_>>()?;
            for (o, t) in outs.iter_mut().zip(self.body.run(&args)?) {
                if !t.kind().is_tensor() {
                    return Err(OpError::invalid(format!("SequenceMap's body returned {} at position {i}; it must return tensors", t.to_value().describe())));
                }
                o.push(t);
            }
        }
        outs.into_iter()
            .enumerate()
            .map(|(k, tensors)| {
                let dtype = tensors[0].dtype();
                if let Some(t) = tensors.iter().find(|t| t.dtype() != dtype) {
                    return Err(OpError::invalid(format!("SequenceMap's body output {k} changes dtype from {dtype} to {}", t.dtype())));
                }
                Ok(sequence_tensor(dtype, tensors))
            })
            .collect()
    }
}
