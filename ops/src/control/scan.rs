//! Scan: runs `body` once per slice of the scan inputs, threading N state values
//! through. Inputs: N initial states, M scan inputs (`num_scan_inputs`), then the
//! enclosing graph's values the body reads. The body takes (N states, one slice of each
//! scan input, outer values) and returns (N states, K scan output elements); the node
//! returns the N final states and the K elements stacked. Axes and directions per scan
//! input and output are attributes. Opset 8's Scan has a leading batch axis on every
//! state and scan input, scans axis 1, and takes `sequence_lens` first: it runs as one
//! opset-9 scan per batch item (sequences of the full length only).
use super::{chain_length, stack, store, take, unchain, Body, Feed};
use crate::cpu::CpuKernel;
use crate::op::norm_axis;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Result, TensorType};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Scan {
    body: Body,
    states: usize,
    scan_inputs: usize,
    scan_outputs: usize,
    input_axes: Vec<i64>,
    input_reverse: Vec<bool>,
    output_axes: Vec<i64>,
    output_reverse: Vec<bool>,
    /// Opset 8: a batch axis first, and `sequence_lens` as input 0.
    batched: bool,
}

fn per_item(spec: &NodeSpec, name: &str, n: usize) -> Result<Vec<i64>> {
    let v = spec.ints(name, &vec![0; n])?;
    if v.len() != n {
        return Err(spec.bad(name, format!("needs {n} values, one per scan {}, got {}", if name.contains("input") { "input" } else { "output" }, v.len())));
    }
    Ok(v)
}

fn directions(spec: &NodeSpec, name: &str, n: usize) -> Result<Vec<bool>> {
    per_item(spec, name, n)?
        .into_iter()
        .map(|d| match d {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(spec.bad(name, format!("directions are 0 (forward) or 1 (reverse), got {d}"))),
        })
        .collect()
}

impl Scan {
    pub fn parse(spec: &NodeSpec) -> Result<Scan> {
        let batched = spec.opset < 9;
        let body = Body::parse(spec, "body")?;
        let scan_inputs = spec.int_opt("num_scan_inputs")?.ok_or_else(|| spec.bad("num_scan_inputs", "required"))?;
        let declared = body.declared();
        if scan_inputs < 1 || scan_inputs as usize > declared {
            return Err(spec.bad("num_scan_inputs", format!("must be in 1..={declared} (the body declares {declared} inputs), got {scan_inputs}")));
        }
        let scan_inputs = scan_inputs as usize;
        let states = declared - scan_inputs;
        if body.n_outputs() < states {
            return Err(OpError::invalid(format!("Scan's body returns its {states} states first; it returns {} outputs", body.n_outputs())));
        }
        let scan_outputs = body.n_outputs() - states;
        if spec.n_inputs() != body.n_inputs() + batched as usize {
            return Err(OpError::invalid(format!("the node has {} inputs, its body {}", spec.n_inputs(), body.n_inputs())));
        }
        if batched {
            return Ok(Scan {
                states,
                scan_inputs,
                scan_outputs,
                input_axes: vec![0; scan_inputs],
                input_reverse: directions(spec, "directions", scan_inputs)?,
                output_axes: vec![0; scan_outputs],
                output_reverse: vec![false; scan_outputs],
                batched,
                body,
            });
        }
        Ok(Scan {
            states,
            scan_inputs,
            scan_outputs,
            input_axes: per_item(spec, "scan_input_axes", scan_inputs)?,
            input_reverse: directions(spec, "scan_input_directions", scan_inputs)?,
            output_axes: per_item(spec, "scan_output_axes", scan_outputs)?,
            output_reverse: directions(spec, "scan_output_directions", scan_outputs)?,
            batched,
            body,
        })
    }

    /// The scan axis of each scan input, and the sequence length they share.
    fn sequence(&self, dims: &[&[usize]]) -> Result<(Vec<usize>, usize)> {
        let mut axes = vec![];
        let mut len = None;
        for (k, d) in dims.iter().enumerate() {
            let axis = norm_axis(self.input_axes[k], d.len()).map_err(|e| OpError::input(self.states + k, format!("scan axis: {e}")))?;
            match len {
                None => len = Some(d[axis]),
                Some(l) if l != d[axis] => {
                    return Err(OpError::input(self.states + k, format!("has {} elements along its scan axis, scan input 0 has {l}", d[axis])));
                }
                _ => {}
            }
            axes.push(axis);
        }
        Ok((axes, len.unwrap_or(0)))
    }

    /// The axis scan output `k` (of rank `rank`) is stacked along.
    fn output_axis(&self, k: usize, rank: usize) -> Result<usize> {
        norm_axis(self.output_axes[k], rank).map_err(|e| OpError::invalid(format!("scan_output_axes[{k}]: {e}")))
    }

    fn run_scan(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let all: Vec<&Tensor> = inputs.iter().enumerate().map(|(i, t)| t.ok_or_else(|| OpError::input(i, "required"))).collect::<Result<_>>()?;
        let (states, rest) = all.split_at(self.states);
        let (scans, outer) = rest.split_at(self.scan_inputs);
        let (axes, len) = self.sequence(&scans.iter().map(|t| t.dims()).collect::<Vec<_>>())?;
        let mut state: Vec<Tensor> = states.iter().map(|t| (*t).clone()).collect();
        let mut elems: Vec<Vec<Tensor>> = vec![vec![]; self.scan_outputs];
        let slice = |t: usize| -> Result<Vec<Tensor>> {
            scans.iter().enumerate().map(|(k, x)| take(x, axes[k], if self.input_reverse[k] { len - 1 - t } else { t })).collect()
        };
        // The sequence length is known: iterations run in chains of up to CHAIN (one
        // piece of work each where a runner takes them; otherwise one by one below).
        let feeds: Vec<Feed> = (0..self.states).map(Feed::Carried).chain((0..self.scan_inputs).map(|_| Feed::PerApplication)).chain(outer.iter().map(|_| Feed::Shared)).collect();
        let carried_out: Vec<usize> = (0..self.states).collect();
        let emitted: Vec<usize> = (self.states..self.states + self.scan_outputs).collect();
        let mut t = 0;
        while len - t >= 2 {
            let k = chain_length(len - t);
            let slices: Vec<Tensor> = (t..t + k).map(&slice).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
            let mut args: Vec<&Tensor> = state.iter().collect();
            args.extend(slices.iter());
            args.extend(outer.iter().copied());
            let Some(outs) = self.body.run_chain(k, &feeds, &carried_out, &emitted, &args)? else { break };
            state = unchain(outs, self.states, k, &mut elems, "Scan")?;
            t += k;
        }
        for t in t..len {
            let slices = slice(t)?;
            let mut args: Vec<&Tensor> = state.iter().collect();
            args.extend(slices.iter());
            args.extend(outer.iter().copied());
            let mut outs = self.body.run(&args)?.into_iter();
            state = outs.by_ref().take(self.states).collect();
            for (e, o) in elems.iter_mut().zip(outs) {
                e.push(o);
            }
        }
        let mut result = state;
        let types = if len == 0 { Some(self.types(&all.iter().map(|t| (TensorType::of(*t), Some(*t))).collect::<Vec<_>>())?) } else { None };
        for (k, mut parts) in elems.into_iter().enumerate() {
            if let Some(types) = &types {
                let ty = &types[self.states + k];
                result.push(Tensor::zeros(ty.dtype, &ty.dims));
                continue;
            }
            if self.output_reverse[k] {
                parts.reverse();
            }
            let axis = self.output_axis(k, parts[0].rank() + 1)?;
            result.push(stack(&parts, axis, &format!("scan output {k} of Scan"))?);
        }
        Ok(result)
    }

    /// Opset 8: one scan per batch item, the results stacked along the batch axis.
    fn run_batched(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let rest = &inputs[1..];
        let all: Vec<&Tensor> = rest.iter().enumerate().map(|(i, t)| t.ok_or_else(|| OpError::input(i + 1, "required"))).collect::<Result<_>>()?;
        let batch = self.batch(&all.iter().map(|t| t.dims()).collect::<Vec<_>>())?;
        if let Some(lens) = inputs[0] {
            let full = all[self.states].dims()[1] as i64;
            if lens.to_i64_vec()?.iter().any(|&l| l != full) {
                return Err(OpError::Unsupported(format!("Scan (opset 8) with sequence_lens shorter than the scan inputs' length {full}")));
            }
        }
        let mut per_item: Vec<Vec<Tensor>> = vec![];
        for b in 0..batch {
            let items: Vec<Tensor> = all[..self.states + self.scan_inputs].iter().map(|t| take(t, 0, b)).collect::<Result<_>>()?;
            let args: Vec<Option<&Tensor>> = items.iter().map(Some).chain(all[self.states + self.scan_inputs..].iter().map(|t| Some(*t))).collect();
            per_item.push(self.run_scan(&args)?);
        }
        (0..self.states + self.scan_outputs)
            .map(|k| stack(&per_item.iter().map(|o| o[k].clone()).collect::<Vec<_>>(), 0, &format!("output {k} of Scan")))
            .collect()
    }

    /// The batch size every state and scan input of an opset-8 Scan shares.
    fn batch(&self, dims: &[&[usize]]) -> Result<usize> {
        let mut batch = None;
        for (i, d) in dims[..self.states + self.scan_inputs].iter().enumerate() {
            let Some(&b) = d.first() else { return Err(OpError::input(i + 1, "needs a batch axis (Scan before opset 9)")) };
            if batch.is_some_and(|x| x != b) {
                return Err(OpError::input(i + 1, format!("has batch size {b}, input 1 has {}", batch.unwrap_or(0))));
            }
            batch = Some(b);
        }
        batch.ok_or_else(|| OpError::invalid("Scan has no state or scan input"))
    }

    /// Output types from input types (and values where known).
    fn types(&self, inputs: &[(TensorType, Option<&Tensor>)]) -> Result<Vec<TensorType>> {
        let (axes, len) = self.sequence(&inputs[self.states..self.states + self.scan_inputs].iter().map(|(t, _)| t.dims.as_slice()).collect::<Vec<_>>())?;
        let mut args: Vec<(TensorType, Option<&Tensor>)> = vec![];
        for (i, (t, v)) in inputs.iter().enumerate() {
            if (self.states..self.states + self.scan_inputs).contains(&i) {
                let mut dims = t.dims.clone();
                dims.remove(axes[i - self.states]);
                args.push((TensorType::new(t.dtype, dims), None));
            } else {
                args.push((t.clone(), *v));
            }
        }
        let unknown = inputs.iter().position(|(_, v)| v.is_none()).unwrap_or(0);
        let out = self.body.infer(&args, unknown)?;
        let mut result: Vec<TensorType> = out[..self.states].to_vec();
        for (k, t) in out[self.states..].iter().enumerate() {
            let axis = self.output_axis(k, t.rank() + 1)?;
            let mut dims = t.dims.clone();
            dims.insert(axis, len);
            result.push(TensorType::new(t.dtype, dims));
        }
        if let Some(k) = (0..self.states).find(|&k| result[k] != inputs[k].0) {
            return Err(OpError::invalid(format!("Scan's body turns state {k} from {} into {}: states keep their types", inputs[k].0, result[k])));
        }
        Ok(result)
    }
}

impl Op for Scan {
    fn name(&self) -> &str {
        "Scan"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let skip = self.batched as usize;
        let args: Vec<(TensorType, Option<&Tensor>)> = inputs[skip..]
            .iter()
            .enumerate()
            .map(|(i, a)| a.as_ref().map(|a| (a.ty.clone(), a.value)).ok_or_else(|| OpError::input(i + skip, "required")))
            .collect::<Result<_>>()?;
        if !self.batched {
            return self.types(&args);
        }
        let batch = self.batch(&args.iter().map(|(t, _)| t.dims.as_slice()).collect::<Vec<_>>())?;
        let items: Vec<(TensorType, Option<&Tensor>)> = args
            .iter()
            .enumerate()
            .map(|(i, (t, v))| if i < self.states + self.scan_inputs { (TensorType::new(t.dtype, t.dims[1..].to_vec()), None) } else { (t.clone(), *v) })
            .collect();
        let mut out = self.types(&items)?;
        for t in &mut out {
            t.dims.insert(0, batch);
        }
        Ok(out)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for Scan {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let outs = if self.batched { self.run_batched(inputs)? } else { self.run_scan(inputs)? };
        for (k, (o, t)) in outputs.iter_mut().zip(&outs).enumerate() {
            store(o, t, &format!("Scan's output {k}"))?;
        }
        Ok(())
    }
}
