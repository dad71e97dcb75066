//! SplitToSequence: a tensor split along `axis` into a sequence. Without `split`, into
//! pieces of length 1 (the axis removed when `keepdims` is 0); with a scalar `split`,
//! into pieces of that length (the last may be shorter); with a 1-D `split`, into
//! pieces of those lengths, which must add up to the axis' length.
use super::{expect_kind, sequence_tensor, slice_axis, HostOp};
use crate::{norm_axis, Arg, NodeSpec, OpError, Result, TensorType};
use kiln_graph::{DType, Tensor, ValueKind};

#[derive(Debug)]
pub struct SplitToSequence {
    axis: i64,
    keepdims: bool,
}

impl SplitToSequence {
    pub fn parse(spec: &NodeSpec) -> Result<SplitToSequence> {
        Ok(SplitToSequence { axis: spec.int("axis", 0)?, keepdims: spec.int("keepdims", 1)? != 0 })
    }

    /// The lengths of the pieces of an axis of length `len`.
    fn lengths(split: Option<&Tensor>, len: usize) -> Result<Vec<usize>> {
        let Some(s) = split else { return Ok(vec![1; len]) };
        if !matches!(s.dtype(), DType::I32 | DType::I64) || s.rank() > 1 || !s.kind().is_tensor() {
            return Err(OpError::input(1, format!("split must be an int32 or int64 scalar or 1-D tensor, got {}", s.to_value().describe())));
        }
        let v = s.to_i64_vec()?;
        if s.rank() == 0 {
            let n = v[0];
            if n <= 0 {
                return Err(OpError::input(1, format!("a scalar split must be positive, got {n}")));
            }
            let n = n as usize;
            return Ok((0..len.div_ceil(n)).map(|k| n.min(len - k * n)).collect());
        }
        if v.iter().any(|&n| n < 0) || v.iter().sum::<i64>() != len as i64 {
            return Err(OpError::input(1, format!("split {v:?} must be lengths that add up to the axis' length {len}")));
        }
        Ok(v.into_iter().map(|n| n as usize).collect())
    }
}

impl HostOp for SplitToSequence {
    fn name(&self) -> &str {
        "SplitToSequence"
    }

    fn types(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = expect_kind(inputs, 0, ValueKind::Tensor)?;
        norm_axis(self.axis, x.rank())?;
        if x.rank() == 0 {
            return Err(OpError::input(0, "cannot split a scalar"));
        }
        Ok(vec![TensorType::container(ValueKind::Sequence, x.dtype)])
    }

    fn compute(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let x = crate::cpu::input(inputs, 0)?;
        if x.rank() == 0 {
            return Err(OpError::input(0, "cannot split a scalar"));
        }
        let axis = norm_axis(self.axis, x.rank())?;
        let split = inputs.get(1).copied().flatten();
        let lengths = Self::lengths(split, x.dims()[axis])?;
        let squeeze = split.is_none() && !self.keepdims;
        let mut tensors = vec![];
        let mut start = 0;
        for n in lengths {
            let mut piece = slice_axis(x, axis, start, n)?;
            if squeeze {
                let mut dims = piece.dims().to_vec();
                dims.remove(axis);
                piece = piece.reshaped(&dims)?;
            }
            tensors.push(piece);
            start += n;
        }
        Ok(vec![sequence_tensor(x.dtype(), tensors)])
    }
}
