//! SequenceEmpty: an empty sequence of the `dtype` attribute (float by default).
use super::{sequence_tensor, HostOp};
use crate::{Arg, NodeSpec, Result, TensorType};
use kiln_graph::{DType, Tensor, ValueKind};

#[derive(Debug)]
pub struct SequenceEmpty {
    dtype: DType,
}

impl SequenceEmpty {
    pub fn parse(spec: &NodeSpec) -> Result<SequenceEmpty> {
        let code = spec.int("dtype", 1)?;
        let dtype = i32::try_from(code).ok().and_then(DType::from_onnx_code).ok_or_else(|| spec.bad("dtype", format!("{code} is not a dtype Kiln supports")))?;
        Ok(SequenceEmpty { dtype })
    }
}

impl HostOp for SequenceEmpty {
    fn name(&self) -> &str {
        "SequenceEmpty"
    }

    fn types(&self, _inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::container(ValueKind::Sequence, self.dtype)])
    }

    fn compute(&self, _inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        Ok(vec![sequence_tensor(self.dtype, vec![])])
    }
}
