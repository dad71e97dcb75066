//! Optional: an optional holding its input (a tensor or a sequence). Without an input,
//! an empty optional of the type the `type` attribute names, which Kiln's importer
//! does not read yet: such a node is refused when created.
use super::{input_type, HostOp};
use crate::{Arg, NodeSpec, OpError, Result, TensorType};
use kiln_graph::{Tensor, Value};

#[derive(Debug)]
pub struct Optional;

impl Optional {
    pub fn parse(spec: &NodeSpec) -> Result<Optional> {
        if !spec.has_input(0) {
            return Err(OpError::Unsupported("an Optional without an input (an empty optional of the type its 'type' attribute names; Kiln does not read TypeProto attributes)".into()));
        }
        Ok(Optional)
    }
}

impl HostOp for Optional {
    fn name(&self) -> &str {
        "Optional"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let t = input_type(inputs, 0)?;
        if t.kind.is_optional() {
            return Err(OpError::input(0, format!("expected a tensor or a sequence, got {t}")));
        }
        Ok(vec![TensorType::container(t.kind.optional(), t.dtype)])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let v = super::value(inputs, 0)?;
        if v.kind().is_optional() {
            return Err(OpError::input(0, format!("expected a tensor or a sequence, got {}", v.describe())));
        }
        Ok(vec![Tensor::from_value(Value::some(v))])
    }
}
