//! SequenceLength: the number of tensors of a sequence, an int64 scalar.
use super::{expect_kind, sequence, HostOp};
use crate::{Arg, Result, TensorType};
use kiln_graph::{DType, Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceLength;

impl HostOp for SequenceLength {
    fn name(&self) -> &str {
        "SequenceLength"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_kind(inputs, 0, ValueKind::Sequence)?;
        Ok(vec![TensorType::new(DType::I64, vec![])])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (_, tensors) = sequence(inputs, 0)?;
        Ok(vec![Tensor::scalar(tensors.len() as i64)])
    }
}
