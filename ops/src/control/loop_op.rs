//! Loop: runs `body` while the trip count `M` is not reached and the condition holds.
//! Inputs: M (optional int64 scalar), cond (optional bool scalar), the N loop-carried
//! initial values, then the enclosing graph's values the body reads. The body takes
//! (iteration number, condition, N carried values, outer values) and returns (condition,
//! N carried values, K scan outputs); the node returns the N final carried values and
//! the K scan outputs stacked along a new first axis.
use super::{all_values, chain_length, first_unknown, stack, store, truth, unchain, Body, Feed, Memo};
use crate::cpu::CpuKernel;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Loop {
    body: Body,
    /// Loop-carried values.
    carried: usize,
    /// Scan outputs.
    scans: usize,
    memo: Memo,
}

impl Loop {
    pub fn parse(spec: &NodeSpec) -> Result<Loop> {
        let body = Body::parse(spec, "body")?;
        let declared = body.declared();
        if declared < 2 {
            return Err(OpError::invalid(format!("Loop's body takes the iteration number and the condition first; it declares {declared} inputs")));
        }
        let carried = declared - 2;
        if body.n_outputs() < 1 + carried {
            return Err(OpError::invalid(format!(
                "Loop's body returns the condition and its {carried} carried values first; it returns {} outputs",
                body.n_outputs()
            )));
        }
        let scans = body.n_outputs() - 1 - carried;
        if spec.n_inputs() != body.n_inputs() {
            return Err(OpError::invalid(format!(
                "the node has {} inputs, its body {} (M, cond, {carried} carried values, {} outer values)",
                spec.n_inputs(),
                body.n_inputs(),
                body.graph.outer_inputs
            )));
        }
        if spec.n_outputs() > carried + scans {
            return Err(OpError::invalid(format!("the node has {} outputs, its body gives {carried} carried values and {scans} scan outputs", spec.n_outputs())));
        }
        Ok(Loop { body, carried, scans, memo: Memo::default() })
    }

    /// Runs the loop on known inputs: the final carried values, then the scan outputs.
    fn run_loop(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let trips = match inputs.first().copied().flatten() {
            Some(m) if m.len() == 1 => Some(m.to_i64_vec()?[0]),
            Some(m) => return Err(OpError::input(0, format!("the trip count must hold one element, got shape {:?}", m.dims()))),
            None => None,
        };
        let cond_in = inputs.get(1).copied().flatten();
        if trips.is_none() && cond_in.is_none() {
            return Err(OpError::invalid("a Loop with neither a trip count nor a condition would run forever"));
        }
        let mut cond = match cond_in {
            Some(c) => truth(c, "Loop's condition")?,
            None => true,
        };
        let mut carried: Vec<Tensor> = (0..self.carried)
            .map(|k| inputs[2 + k].cloned().ok_or_else(|| OpError::input(2 + k, "a loop-carried initial value is required")))
            .collect::<Result<_>>()?;
        let outer: Vec<&Tensor> = inputs[2 + self.carried..].iter().map(|t| t.ok_or_else(|| OpError::invalid("an outer value of Loop is missing"))).collect::<Result<_>>()?;
        let mut scans: Vec<Vec<Tensor>> = vec![vec![]; self.scans];
        let mut i: i64 = 0;
        // With a trip count and a condition the body does not change, the iterations
        // run in chains of up to CHAIN (one piece of work each where a runner takes
        // them; otherwise one by one below).
        let chained = trips.filter(|_| cond_in.is_none() || self.body.keeps_condition());
        let feeds: Vec<Feed> = [Feed::Iteration, Feed::True].into_iter().chain((0..self.carried).map(Feed::Carried)).chain(outer.iter().map(|_| Feed::Shared)).collect();
        let carried_out: Vec<usize> = (1..1 + self.carried).collect();
        let emitted: Vec<usize> = (1 + self.carried..1 + self.carried + self.scans).collect();
        while let Some(m) = chained.filter(|&m| cond && m - i >= 2) {
            let k = chain_length((m - i) as usize);
            let i0 = Tensor::scalar(i);
            let mut args: Vec<&Tensor> = vec![&i0];
            args.extend(carried.iter());
            args.extend(outer.iter().copied());
            let Some(outs) = self.body.run_chain(k, &feeds, &carried_out, &emitted, &args)? else { break };
            carried = unchain(outs, self.carried, k, &mut scans, "Loop")?;
            i += k as i64;
        }
        while cond && trips.is_none_or(|m| i < m) {
            let iter = Tensor::scalar(i);
            let c = Tensor::from_bools(&[], &[cond])?;
            let mut args: Vec<&Tensor> = vec![&iter, &c];
            args.extend(carried.iter());
            args.extend(outer.iter().copied());
            let mut outs = self.body.run(&args)?.into_iter();
            let c_out = outs.next().ok_or_else(|| OpError::invalid("Loop's body returned no condition"))?;
            // Without a condition input the body's condition is ignored (the spec's
            // `for` loop over the trip count).
            if cond_in.is_some() {
                cond = truth(&c_out, "the condition Loop's body returns")?;
            }
            carried = outs.by_ref().take(self.carried).collect();
            for (s, t) in scans.iter_mut().zip(outs) {
                s.push(t);
            }
            i += 1;
        }
        let mut result = carried;
        for (k, parts) in scans.into_iter().enumerate() {
            let what = format!("scan output {k} of Loop");
            result.push(if parts.is_empty() { self.empty_scan(inputs, k)? } else { stack(&parts, 0, &what)? });
        }
        Ok(result)
    }

    /// Scan output `k` of a loop that ran no iteration: `[0, ...]` of the type the body
    /// would give it.
    fn empty_scan(&self, inputs: &[Option<&Tensor>], k: usize) -> Result<Tensor> {
        let mut args: Vec<(TensorType, Option<&Tensor>)> = vec![(TensorType::new(DType::I64, vec![]), None), (TensorType::new(DType::Bool, vec![]), None)];
        for t in inputs[2..].iter() {
            let t = t.ok_or_else(|| OpError::invalid("an input of Loop is missing"))?;
            args.push((TensorType::of(t), Some(t)));
        }
        let types = self.body.infer(&args, 0)?;
        let t = &types[1 + self.carried + k];
        let mut dims = vec![0];
        dims.extend_from_slice(&t.dims);
        Ok(Tensor::zeros(t.dtype, &dims))
    }

    fn run_known(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        self.memo.get_or(inputs, || self.run_loop(inputs))
    }
}

impl Op for Loop {
    fn name(&self) -> &str {
        "Loop"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if let Some(values) = all_values(inputs) {
            return Ok(self.run_known(&values)?.iter().map(|t| TensorType::of(t)).collect());
        }
        let unknown = first_unknown(inputs);
        let needs = || OpError::NeedsValue { index: unknown, what: "the inputs of Loop (its scan outputs' lengths or its carried values' shapes depend on them)".into() };
        if self.scans > 0 {
            return Err(needs());
        }
        // Without scan outputs, a loop whose body keeps the carried types has them.
        let mut args: Vec<(TensorType, Option<&Tensor>)> = vec![(TensorType::new(DType::I64, vec![]), None), (TensorType::new(DType::Bool, vec![]), None)];
        for (k, a) in inputs[2..].iter().enumerate() {
            let a = a.as_ref().ok_or_else(|| OpError::input(2 + k, "a loop-carried or outer value is missing"))?;
            args.push((a.ty.clone(), a.value));
        }
        let out = self.body.infer(&args, unknown)?;
        let carried_in: Vec<&TensorType> = args[2..2 + self.carried].iter().map(|(t, _)| t).collect();
        if out[1..1 + self.carried].iter().zip(&carried_in).any(|(o, i)| o != *i) {
            return Err(needs());
        }
        Ok(out[1..].to_vec())
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

impl CpuKernel for Loop {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let outs = self.run_loop(inputs)?;
        for (k, (o, t)) in outputs.iter_mut().zip(&outs).enumerate() {
            store(o, t, &format!("Loop's output {k}"))?;
        }
        Ok(())
    }
}
