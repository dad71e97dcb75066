//! SequenceAt: the tensor at a position of a sequence (negative counts from the end).
use super::{check_position_type, expect_kind, position, sequence, types_from_values, HostOp};
use crate::{Arg, Result, TensorType};
use kiln_graph::{Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceAt;

impl HostOp for SequenceAt {
    fn name(&self) -> &str {
        "SequenceAt"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_kind(inputs, 0, ValueKind::Sequence)?;
        check_position_type(inputs, 1)?;
        types_from_values(self, inputs, "the sequence and the position (the tensor's shape)")
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (_, tensors) = sequence(inputs, 0)?;
        let p = position(inputs, 1, tensors.len(), false)?;
        Ok(vec![tensors[p].clone()])
    }
}
