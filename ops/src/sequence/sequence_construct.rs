//! SequenceConstruct: a sequence of its inputs (tensors of one dtype).
use super::{check_element, input_type, sequence_tensor, HostOp};
use crate::{Arg, OpError, Result, TensorType};
use kiln_graph::{Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceConstruct;

impl HostOp for SequenceConstruct {
    fn name(&self) -> &str {
        "SequenceConstruct"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let first = input_type(inputs, 0)?;
        for i in 0..inputs.len() {
            let t = input_type(inputs, i)?;
            if !t.is_tensor() || t.dtype != first.dtype {
                return Err(OpError::input(i, format!("expected a tensor of {} (as input 0), got {t}", first.dtype)));
            }
        }
        Ok(vec![TensorType::container(ValueKind::Sequence, first.dtype)])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let first = crate::cpu::input(inputs, 0)?;
        let mut tensors = vec![];
        for i in 0..inputs.len() {
            let t = crate::cpu::input(inputs, i)?;
            check_element(t, first.dtype(), i)?;
            tensors.push(t.clone());
        }
        Ok(vec![sequence_tensor(first.dtype(), tensors)])
    }
}
