//! ConcatFromSequence: the tensors of a sequence joined along `axis`, or stacked along
//! a new `axis` when `new_axis` is 1.
use super::{concat_axis, expect_kind, sequence, types_from_values, HostOp};
use crate::{norm_axis, Arg, NodeSpec, OpError, Result, TensorType};
use kiln_graph::{Tensor, ValueKind};

#[derive(Debug)]
pub struct ConcatFromSequence {
    axis: i64,
    new_axis: bool,
}

impl ConcatFromSequence {
    pub fn parse(spec: &NodeSpec) -> Result<ConcatFromSequence> {
        let axis = spec.int_opt("axis")?.ok_or_else(|| spec.bad("axis", "required"))?;
        let new_axis = match spec.int("new_axis", 0)? {
            0 => false,
            1 => true,
            n => return Err(spec.bad("new_axis", format!("must be 0 or 1, got {n}"))),
        };
        Ok(ConcatFromSequence { axis, new_axis })
    }
}

impl HostOp for ConcatFromSequence {
    fn name(&self) -> &str {
        "ConcatFromSequence"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_kind(inputs, 0, ValueKind::Sequence)?;
        types_from_values(self, inputs, "the sequence (the result's shape)")
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let (_, tensors) = sequence(inputs, 0)?;
        let first = tensors.first().ok_or_else(|| OpError::input(0, "cannot concatenate an empty sequence"))?;
        let rank = first.rank() + usize::from(self.new_axis);
        let axis = norm_axis(self.axis, rank).map_err(|e| OpError::Attr { attr: "axis".into(), what: e.to_string() })?;
        if !self.new_axis {
            return Ok(vec![concat_axis(&tensors, axis)?]);
        }
        // Stacking: each tensor gets a new axis of length 1, then they are joined.
        let parts: Vec<Tensor> = tensors
            .iter()
            .map(|t| {
                let mut dims = t.dims().to_vec();
                dims.insert(axis.min(dims.len()), 1);
                t.reshaped(&dims)
            })
            .collect::<kiln_graph::Result<_>>()?;
        Ok(vec![concat_axis(&parts, axis)?])
    }
}
