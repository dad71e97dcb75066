//! Heterogeneous execution: the steps of a specialisation placed on the GPU or the CPU,
//! and run as consecutive segments, each a GPU plan (one submit) or a CPU plan, with
//! tensors handed across at the boundaries (downloaded from and uploaded to the GPU).
//!
//! Placement of each step, in order of precedence: a user rule naming the node or its
//! op type (`SessionOptions::placement`); the CPU when the op has no GPU kernel, or its
//! kernel cannot be generated for these shapes (a loop too long for the driver, ...);
//! else the session's GPU. A segment is a plan over a view of the graph whose inputs
//! are the values the segment reads from outside and whose outputs are the values
//! later segments (or the caller) read, so the CPU and GPU plans run unchanged.
use crate::cpu::CpuPlan;
use crate::gpu::{self, GpuContext, GpuPlan};
use crate::specialize::{Specialized, Step};
use crate::{DeviceChoice, Result, RuntimeError};
use kiln_graph::{Graph, Tensor, ValueId};
use kiln_ops::{Op, TuneValues};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A user's placement rule: nodes named `pattern`, or of op type `pattern`, run on
/// `device`: `cpu`, `gpu` (the session's GPU, or the best adapter for a CPU session),
/// or a particular adapter (`gpu:1`, a name as `kiln devices` lists it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRule {
    pub pattern: String,
    pub device: DeviceChoice,
}

impl std::str::FromStr for PlacementRule {
    type Err = String;
    /// `PATTERN=DEVICE`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (p, d) = s.rsplit_once('=').ok_or_else(|| format!("placement '{s}': expected OP_OR_NODE=DEVICE (cpu, gpu, gpu:N or an adapter name)"))?;
        let device: DeviceChoice = d.parse().map_err(|e| format!("placement '{s}': {e}"))?;
        if device == DeviceChoice::Auto || p.is_empty() {
            return Err(format!("placement '{s}': name an op type or node, and a device (cpu, gpu, gpu:N or an adapter name), not 'auto'"));
        }
        Ok(PlacementRule { pattern: p.to_string(), device })
    }
}

/// Where a step runs: the CPU, or GPU number `k` of the session (0 = its main GPU, or
/// the first adapter a rule names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dev {
    Cpu,
    Gpu(usize),
}

/// Checks the rules against the graph and opens the adapters they name. `main` is the
/// session's own GPU, if any. Returns every GPU the session may use (main first) and,
/// per rule, its device.
#[allow(clippy::type_complexity)]
pub(crate) fn resolve_rules(graph: &Graph, rules: &[PlacementRule], main: Option<Arc<GpuContext>>) -> Result<(Vec<Arc<GpuContext>>, Vec<Dev>)> {
    let mut gpus: Vec<Arc<GpuContext>> = main.into_iter().collect();
    let mut devs = vec![];
    for r in rules {
        if !graph.nodes.iter().any(|n| n.name == r.pattern || n.op_type == r.pattern) {
            return Err(RuntimeError::Placement(format!("'{}': no node and no op type of that name in '{}'", r.pattern, graph.name)));
        }
        let dev = match &r.device {
            DeviceChoice::Cpu => Dev::Cpu,
            DeviceChoice::Gpu if !gpus.is_empty() => Dev::Gpu(0),
            choice => {
                let adapter = gpu::select(choice)
                    .map_err(|e| RuntimeError::Placement(format!("'{}={}': {e}", r.pattern, r.device)))?
                    .ok_or_else(|| RuntimeError::Placement(format!("'{}={}': no such GPU", r.pattern, r.device)))?;
                let ctx = gpu::context_for(adapter)?;
                match gpus.iter().position(|g| Arc::ptr_eq(g, &ctx)) {
                    Some(k) => Dev::Gpu(k),
                    None => {
                        gpus.push(ctx);
                        Dev::Gpu(gpus.len() - 1)
                    }
                }
            }
        };
        devs.push(dev);
    }
    Ok((gpus, devs))
}

/// Where each step runs: the last rule that names the node or its op type, else the
/// main GPU (if the session has one) when the op's kernel generates for these inputs,
/// else the CPU.
pub(crate) fn place(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, rules: &[PlacementRule], rule_devs: &[Dev], has_main_gpu: bool) -> Result<Vec<Dev>> {
    spec.steps
        .iter()
        .map(|s| {
            let node = &graph.nodes[s.node];
            let op = &ops[s.node];
            let ruled = rules.iter().zip(rule_devs).rev().find(|(r, _)| r.pattern == node.name || r.pattern == node.op_type).map(|(_, d)| *d);
            let gpu_ok = op.is_view() || op.wgsl().is_some_and(|k| k.generate(&spec.args(&s.inputs), &out_types(spec, s), &TuneValues::default()).is_ok());
            let device = ruled.unwrap_or(if gpu_ok && has_main_gpu { Dev::Gpu(0) } else { Dev::Cpu });
            match device {
                Dev::Gpu(_) if !gpu_ok => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on a GPU, but it has no GPU kernel for these inputs",
                    node.name, node.op_type
                ))),
                Dev::Cpu if op.cpu().is_none() && !op.is_view() => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on the CPU, but it has no CPU kernel",
                    node.name, node.op_type
                ))),
                d => Ok(d),
            }
        })
        .collect()
}

fn out_types(spec: &Specialized, s: &Step) -> Vec<kiln_ops::TensorType> {
    s.outputs.iter().map(|&o| spec.ty(o).clone()).collect()
}

enum SegmentPlan {
    Cpu(CpuPlan),
    Gpu(GpuPlan),
}

struct Segment {
    graph: Graph,
    plan: SegmentPlan,
}

/// Consecutive runs of steps on one device.
pub(crate) struct HeteroPlan {
    segments: Vec<Segment>,
}

impl HeteroPlan {
    pub fn build(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, devices: &[Dev], gpus: &[(Arc<GpuContext>, gpu::WeightCache)]) -> Result<HeteroPlan> {
        // Split the steps into runs of one device.
        let mut runs: Vec<(Dev, Vec<Step>)> = vec![];
        for (s, &d) in spec.steps.iter().zip(devices) {
            match runs.last_mut() {
                Some((dev, steps)) if *dev == d => steps.push(s.clone()),
                _ => runs.push((d, vec![s.clone()])),
            }
        }
        // Which values each run reads and writes.
        let produced: Vec<HashSet<ValueId>> = runs.iter().map(|(_, st)| st.iter().flat_map(|s| s.outputs.iter().copied()).collect()).collect();
        let read: Vec<HashSet<ValueId>> = runs.iter().map(|(_, st)| st.iter().flat_map(|s| s.inputs.iter().flatten().copied()).collect()).collect();
        let mut segments = vec![];
        for (k, (device, steps)) in runs.into_iter().enumerate() {
            let mut inputs: Vec<ValueId> = read[k].iter().copied().filter(|v| !produced[k].contains(v) && !spec.constants.contains_key(v)).collect();
            inputs.sort_unstable();
            let mut outputs: Vec<ValueId> = produced[k]
                .iter()
                .copied()
                .filter(|v| graph.outputs.contains(v) || read[k + 1..].iter().any(|r| r.contains(v)))
                .collect();
            outputs.sort_unstable();
            let mut view = graph.clone();
            view.inputs = inputs;
            view.outputs = outputs;
            let sub = Specialized { types: spec.types.clone(), constants: spec.constants.clone(), steps, folded: 0 };
            let plan = match device {
                Dev::Cpu => SegmentPlan::Cpu(CpuPlan::build(&view, ops, &sub)?),
                Dev::Gpu(k) => {
                    let (ctx, weights) = &gpus[k];
                    SegmentPlan::Gpu(GpuPlan::build(ctx.clone(), &view, ops, &sub, weights)?)
                }
            };
            segments.push(Segment { graph: view, plan });
        }
        Ok(HeteroPlan { segments })
    }

    /// Runs every segment in order; returns the graph outputs, kernels and submits.
    pub fn run(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor], constants: &HashMap<ValueId, Tensor>) -> Result<(Vec<Tensor>, usize, usize)> {
        let mut values: HashMap<ValueId, Tensor> = graph.inputs.iter().zip(inputs).map(|(&v, &t)| (v, t.clone())).collect();
        let (mut kernels, mut submits) = (0, 0);
        for seg in &self.segments {
            let ins: Vec<&Tensor> = seg
                .graph
                .inputs
                .iter()
                .map(|v| values.get(v).ok_or_else(|| RuntimeError::Gpu(format!("value '{}' is needed before it is computed", graph.values[*v].name))))
                .collect::<Result<_>>()?;
            let outs = match &seg.plan {
                SegmentPlan::Cpu(p) => {
                    kernels += p.kernel_count();
                    p.run(&seg.graph, ops, &ins, None)?
                }
                SegmentPlan::Gpu(p) => {
                    kernels += p.dispatch_count();
                    let (o, s) = p.run(&ins)?;
                    submits += s;
                    o
                }
            };
            for (&v, t) in seg.graph.outputs.iter().zip(outs) {
                values.insert(v, t);
            }
        }
        let outs = graph
            .outputs
            .iter()
            .map(|v| {
                values.get(v).or_else(|| constants.get(v)).cloned().ok_or_else(|| RuntimeError::Gpu(format!("output '{}' was not computed", graph.values[*v].name)))
            })
            .collect::<Result<_>>()?;
        Ok((outs, kernels, submits))
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}
