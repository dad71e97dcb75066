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
use crate::{DeviceKind, Result, RuntimeError};
use kiln_graph::{Graph, Tensor, ValueId};
use kiln_ops::{Op, TuneValues};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A user's placement rule: nodes named `pattern`, or of op type `pattern`, run on
/// `device`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRule {
    pub pattern: String,
    pub device: DeviceKind,
}

impl std::str::FromStr for PlacementRule {
    type Err = String;
    /// `PATTERN=cpu|gpu`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (p, d) = s.rsplit_once('=').ok_or_else(|| format!("placement '{s}': expected OP_OR_NODE=cpu|gpu"))?;
        let device = match d {
            "cpu" => DeviceKind::Cpu,
            "gpu" => DeviceKind::Gpu,
            other => return Err(format!("placement '{s}': device '{other}' is not cpu or gpu")),
        };
        Ok(PlacementRule { pattern: p.to_string(), device })
    }
}

/// Checks rules against the graph and the session's devices.
pub(crate) fn check_rules(graph: &Graph, rules: &[PlacementRule], has_gpu: bool) -> Result<()> {
    for r in rules {
        if !graph.nodes.iter().any(|n| n.name == r.pattern || n.op_type == r.pattern) {
            return Err(RuntimeError::Placement(format!("'{}': no node and no op type of that name in '{}'", r.pattern, graph.name)));
        }
        if r.device == DeviceKind::Gpu && !has_gpu {
            return Err(RuntimeError::Placement(format!("'{}={}': this session has no GPU (it runs on the CPU); open it with a GPU device", r.pattern, "gpu")));
        }
    }
    Ok(())
}

/// Where each step runs.
pub(crate) fn place(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, rules: &[PlacementRule]) -> Result<Vec<DeviceKind>> {
    spec.steps
        .iter()
        .map(|s| {
            let node = &graph.nodes[s.node];
            let op = &ops[s.node];
            let ruled = rules.iter().rev().find(|r| r.pattern == node.name || r.pattern == node.op_type).map(|r| r.device);
            let gpu_ok = op.is_view() || op.wgsl().is_some_and(|k| k.generate(&spec.args(&s.inputs), &out_types(spec, s), &TuneValues::default()).is_ok());
            let device = ruled.unwrap_or(if gpu_ok { DeviceKind::Gpu } else { DeviceKind::Cpu });
            match device {
                DeviceKind::Gpu if !gpu_ok => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on the GPU, but it has no GPU kernel for these inputs",
                    node.name, node.op_type
                ))),
                DeviceKind::Cpu if op.cpu().is_none() && !op.is_view() => Err(RuntimeError::Placement(format!(
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
    pub fn build(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, devices: &[DeviceKind], ctx: &Arc<GpuContext>, weights: &gpu::WeightCache) -> Result<HeteroPlan> {
        // Split the steps into runs of one device.
        let mut runs: Vec<(DeviceKind, Vec<Step>)> = vec![];
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
                DeviceKind::Cpu => SegmentPlan::Cpu(CpuPlan::build(&view, ops, &sub)?),
                DeviceKind::Gpu => SegmentPlan::Gpu(GpuPlan::build(ctx.clone(), &view, ops, &sub, weights)?),
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
