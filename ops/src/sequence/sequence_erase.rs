//! SequenceErase: a sequence without the tensor at a position (the last when the
//! position is omitted; negative counts from the end).
use super::{check_position_type, expect_kind, position, sequence, sequence_tensor, HostOp};
use crate::{Arg, OpError, Result, TensorType};
use kiln_graph::{Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceErase;

impl HostOp for SequenceErase {
    fn name(&self) -> &str {
        "SequenceErase"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let seq = expect_kind(inputs, 0, ValueKind::Sequence)?;
        check_position_type(inputs, 1)?;
        Ok(vec![seq.clone()])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (dtype, mut tensors) = sequence(inputs, 0)?;
        if tensors.is_empty() {
            return Err(OpError::input(0, "cannot erase from an empty sequence"));
        }
        let at = match inputs.get(1).copied().flatten() {
            Some(_) => position(inputs, 1, tensors.len(), false)?,
            None => tensors.len() - 1,
        };
        tensors.remove(at);
        Ok(vec![sequence_tensor(dtype, tensors)])
    }
}
