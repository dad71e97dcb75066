//! If: runs `then_branch` or `else_branch` on a scalar condition. Inputs: the condition,
//! then the enclosing graph's values the branches read (both branches take all of
//! them). The output types are known without the condition when both branches infer
//! to the same types.
use super::{all_values, first_unknown, store, truth, Body, Memo};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Result, TensorType};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct If {
    then_branch: Body,
    else_branch: Body,
    memo: Memo,
}

impl If {
    pub fn parse(spec: &NodeSpec) -> Result<If> {
        let then_branch = Body::parse(spec, "then_branch")?;
        let else_branch = Body::parse(spec, "else_branch")?;
        for b in [&then_branch, &else_branch] {
            if b.declared() != 0 {
                return Err(OpError::invalid(format!("an If branch declares no inputs, '{}' declares {}", b.graph.name, b.declared())));
            }
        }
        if then_branch.n_outputs() != else_branch.n_outputs() {
            return Err(OpError::invalid(format!(
                "then_branch has {} outputs, else_branch {}: they must match",
                then_branch.n_outputs(),
                else_branch.n_outputs()
            )));
        }
        if spec.n_outputs() > then_branch.n_outputs() {
            return Err(OpError::invalid(format!("the node has {} outputs, its branches {}", spec.n_outputs(), then_branch.n_outputs())));
        }
        Ok(If { then_branch, else_branch, memo: Memo::default() })
    }

    fn branch(&self, cond: &Tensor) -> Result<&Body> {
        Ok(if truth(cond, "If's condition")? { &self.then_branch } else { &self.else_branch })
    }

    /// Runs the branch the condition picks.
    fn run_branch(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let cond = inputs.first().copied().flatten().ok_or_else(|| OpError::input(0, "the condition is required"))?;
        let outer: Vec<&Tensor> = inputs[1..].iter().map(|t| t.ok_or_else(|| OpError::invalid("an outer value of If is missing"))).collect::<Result<_>>()?;
        self.branch(cond)?.run(&outer)
    }

    /// Like `run_branch`, for constant inputs (inference, then folding, run it once).
    fn run_known(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        self.memo.get_or(inputs, || self.run_branch(inputs))
    }
}

impl Op for If {
    fn name(&self) -> &str {
        "If"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let cond = required(inputs, 0)?;
        if cond.ty.len() != 1 {
            return Err(OpError::input(0, format!("the condition must hold one element, got {}", cond.ty)));
        }
        if let Some(values) = all_values(inputs) {
            return Ok(self.run_known(&values)?.iter().map(|t| TensorType::of(t)).collect());
        }
        let outer: Vec<(TensorType, Option<&Tensor>)> = inputs[1..]
            .iter()
            .enumerate()
            .map(|(i, a)| a.as_ref().map(|a| (a.ty.clone(), a.value)).ok_or_else(|| OpError::input(i + 1, "an outer value is missing")))
            .collect::<Result<_>>()?;
        let unknown = first_unknown(inputs);
        if let Some(c) = cond.value {
            return self.branch(c)?.infer(&outer, unknown);
        }
        let then_types = self.then_branch.infer(&outer, unknown)?;
        let else_types = self.else_branch.infer(&outer, unknown)?;
        if then_types != else_types {
            return Err(OpError::NeedsValue { index: 0, what: "the condition (the branches produce different types)".into() });
        }
        Ok(then_types)
    }

    fn eval_from_types(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        all_values(inputs).map(|v| self.run_known(&v))
    }

    /// Bodies may take and return sequences and optionals (run on the host anyway).
    fn handles_containers(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for If {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        cpu::input(inputs, 0)?;
        let outs = self.run_branch(inputs)?;
        for (k, (o, t)) in outputs.iter_mut().zip(&outs).enumerate() {
            store(o, t, &format!("If's output {k}"))?;
        }
        Ok(())
    }
}
