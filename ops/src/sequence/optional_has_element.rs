//! OptionalHasElement: whether an optional holds a value, a bool scalar. An omitted
//! input is an empty optional; a tensor or a sequence input is a value.
use super::HostOp;
use crate::{Arg, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct OptionalHasElement;

impl HostOp for OptionalHasElement {
    fn name(&self) -> &str {
        "OptionalHasElement"
    }

    fn types(&self, _inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(DType::Bool, vec![])])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let has = match inputs.first().copied().flatten() {
            None => false,
            Some(t) => t.composite().and_then(|v| v.as_optional()).is_none_or(|inner| inner.is_some()),
        };
        Ok(vec![Tensor::from_bools(&[], &[has])?])
    }
}
