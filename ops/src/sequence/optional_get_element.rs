//! OptionalGetElement: the value an optional holds (an error when it is empty); a
//! tensor or a sequence input is returned as it is.
use super::{input_type, HostOp};
use crate::{Arg, OpError, Result, TensorType};
use kiln_graph::{Tensor, Value};

#[derive(Debug)]
pub struct OptionalGetElement;

impl HostOp for OptionalGetElement {
    fn name(&self) -> &str {
        "OptionalGetElement"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let a = crate::required(inputs, 0)?;
        let t = input_type(inputs, 0)?;
        let kind = t.kind.element();
        Ok(vec![match (kind.is_tensor(), a.value) {
            // A tensor's shape is the one the optional holds.
            (true, Some(v)) => TensorType::of(&self.compute(&[Some(v)])?[0]),
            (true, None) if !t.kind.is_optional() => t.clone(),
            (true, None) => return Err(OpError::NeedsValue { index: 0, what: "the optional (the shape of the tensor it holds)".into() }),
            (false, _) => TensorType::container(kind, t.dtype),
        }])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let t = crate::cpu::input(inputs, 0)?;
        Ok(vec![match t.composite() {
            Some(Value::Optional { value: Some(v), .. }) => Tensor::from_value((**v).clone()),
            Some(v @ Value::Optional { value: None, .. }) => return Err(OpError::input(0, format!("the optional is empty ({})", v.describe()))),
            _ => t.clone(),
        }])
    }
}
