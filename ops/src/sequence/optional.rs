//! Optional: an optional holding its input (a tensor or a sequence); without an input,
//! an empty optional of the type its `type` attribute names (a tensor or a sequence
//! type).
use super::{input_type, HostOp};
use crate::{Arg, NodeSpec, OpError, Result, TensorType};
use kiln_graph::{Attr, DType, Tensor, Value, ValueKind};

#[derive(Debug)]
pub struct Optional {
    /// The element kind and dtype of an Optional without an input.
    empty: Option<(ValueKind, DType)>,
}

impl Optional {
    pub fn parse(spec: &NodeSpec) -> Result<Optional> {
        if spec.has_input(0) {
            return Ok(Optional { empty: None });
        }
        match spec.node.attrs.get("type") {
            Some(Attr::Type(t)) if !t.kind.is_optional() => Ok(Optional { empty: Some((t.kind, t.dtype)) }),
            Some(Attr::Type(t)) => Err(spec.bad("type", format!("an optional holds a tensor or a sequence, not {t}"))),
            Some(other) => Err(spec.bad("type", format!("expected a type, found {}", other.kind()))),
            None => Err(spec.bad("type", "required when the input is omitted (the type of the empty optional's element)")),
        }
    }
}

impl HostOp for Optional {
    fn name(&self) -> &str {
        "Optional"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if let Some((kind, dtype)) = self.empty {
            return Ok(vec![TensorType::container(kind.optional(), dtype)]);
        }
        let t = input_type(inputs, 0)?;
        if t.kind.is_optional() {
            return Err(OpError::input(0, format!("expected a tensor or a sequence, got {t}")));
        }
        Ok(vec![TensorType::container(t.kind.optional(), t.dtype)])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        if let Some((kind, dtype)) = self.empty {
            return Ok(vec![Tensor::from_value(Value::none(kind, dtype))]);
        }
        let v = super::value(inputs, 0)?;
        if v.kind().is_optional() {
            return Err(OpError::input(0, format!("expected a tensor or a sequence, got {}", v.describe())));
        }
        Ok(vec![Tensor::from_value(Value::some(v))])
    }
}
