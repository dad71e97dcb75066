//! SequenceInsert: a sequence with a tensor inserted at a position (the end when the
//! position is omitted; negative counts from the end).
use super::{check_element, check_position_type, expect_kind, position, sequence, sequence_tensor, HostOp};
use crate::{Arg, OpError, Result, TensorType};
use kiln_graph::{Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceInsert;

impl HostOp for SequenceInsert {
    fn name(&self) -> &str {
        "SequenceInsert"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let seq = expect_kind(inputs, 0, ValueKind::Sequence)?;
        let t = expect_kind(inputs, 1, ValueKind::Tensor)?;
        if t.dtype != seq.dtype {
            return Err(OpError::input(1, format!("a tensor of {} cannot join a sequence of {}", t.dtype, seq.dtype)));
        }
        check_position_type(inputs, 2)?;
        Ok(vec![seq.clone()])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (dtype, mut tensors) = sequence(inputs, 0)?;
        let t = crate::cpu::input(inputs, 1)?;
        check_element(t, dtype, 1)?;
        let at = match inputs.get(2).copied().flatten() {
            Some(_) => position(inputs, 2, tensors.len(), true)?,
            None => tensors.len(),
        };
        tensors.insert(at, t.clone());
        Ok(vec![sequence_tensor(dtype, tensors)])
    }
}
