//! Scan (opset 9+): runs `body` once per slice of the scan inputs, threading N state
//! values through. Inputs: N initial states, M scan inputs (`num_scan_inputs`), then
//! the enclosing graph's values the body reads. The body takes (N states, one slice of
//! each scan input, outer values) and returns (N states, K scan output elements); the
//! node returns the N final states and the K elements stacked. Axes and directions per
//! scan input and output are attributes.
use super::{stack, store, take, Body};
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
        if spec.opset < 9 {
            return Err(OpError::Unsupported("Scan before opset 9 (with a batch axis and sequence_lens)".into()));
        }
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
        if spec.n_inputs() != body.n_inputs() {
            return Err(OpError::invalid(format!("the node has {} inputs, its body {}", spec.n_inputs(), body.n_inputs())));
        }
        Ok(Scan {
            states,
            scan_inputs,
            scan_outputs,
            input_axes: per_item(spec, "scan_input_axes", scan_inputs)?,
            input_reverse: directions(spec, "scan_input_directions", scan_inputs)?,
            output_axes: per_item(spec, "scan_output_axes", scan_outputs)?,
            output_reverse: directions(spec, "scan_output_directions", scan_outputs)?,
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
        for t in 0..len {
            let slices: Vec<Tensor> = scans
                .iter()
                .enumerate()
                .map(|(k, x)| take(x, axes[k], if self.input_reverse[k] { len - 1 - t } else { t }))
                .collect::<Result<_>>()?;
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
        let types = if len == 0 { Some(self.types(&all.iter().map(|t| (TensorType::new(t.dtype(), t.dims()), Some(*t))).collect::<Vec<_>>())?) } else { None };
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
        let args: Vec<(TensorType, Option<&Tensor>)> =
            inputs.iter().enumerate().map(|(i, a)| a.as_ref().map(|a| (a.ty.clone(), a.value)).ok_or_else(|| OpError::input(i, "required"))).collect::<Result<_>>()?;
        self.types(&args)
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
        let outs = self.run_scan(inputs)?;
        for (k, (o, t)) in outputs.iter_mut().zip(&outs).enumerate() {
            store(o, t, &format!("Scan's output {k}"))?;
        }
        Ok(())
    }
}
