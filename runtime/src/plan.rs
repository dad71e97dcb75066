//! The plan of one specialisation: its steps in segments, each a run of consecutive
//! steps on one device, planned as an ordinary CPU plan or GPU plan (one submit). A
//! model on one device is the one-segment case. Tensors cross between segments at the
//! boundaries (downloaded from and uploaded to a GPU). A segment is a plan over a view
//! of the graph whose inputs are the values the segment reads from outside and whose
//! outputs are the values later segments (or the caller) read, so the CPU and GPU plans
//! run unchanged.
use crate::arena::MemoryPlan;
use crate::bodies::{GpuBodies, RunBodies};
use crate::cpu::CpuPlan;
use crate::gpu::{self, GpuContext, GpuPlan};
use crate::placement::{Dev, Placement};
use crate::tune::{ChoiceSource, Choices, DeviceFingerprint};
use crate::{Result, RuntimeError};
use kiln_graph::{Graph, NodeId, Tensor, ValueId};
use kiln_ops::infer::{Limits, Specialized, Step};
use kiln_ops::Op;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

enum SegmentPlan {
    Cpu(CpuPlan),
    Gpu(GpuPlan),
}

struct Segment {
    /// The view of the graph with this segment's inputs and outputs; `None` when the
    /// segment is the only one (it runs on the session's graph itself).
    view: Option<Graph>,
    plan: SegmentPlan,
}

impl Segment {
    fn graph<'a>(&'a self, whole: &'a Graph) -> &'a Graph {
        self.view.as_ref().unwrap_or(whole)
    }

    fn run(&self, whole: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor]) -> Result<(Vec<Tensor>, usize, usize)> {
        match &self.plan {
            SegmentPlan::Cpu(p) => Ok((p.run(self.graph(whole), ops, inputs, None)?, p.kernel_count(), 0)),
            SegmentPlan::Gpu(p) => {
                let (outs, submits) = p.run(inputs)?;
                Ok((outs, p.dispatch_count(), submits))
            }
        }
    }
}

/// A specialisation ready to run: its segments, where each step runs, and the graph
/// outputs that were folded to constants.
pub(crate) struct Plan {
    segments: Vec<Segment>,
    /// The device of every step, by node.
    pub devices: Vec<(NodeId, Dev)>,
    /// Nodes evaluated once on the host when this specialisation was built.
    pub folded: usize,
    constants: HashMap<ValueId, Tensor>,
    /// Whether the whole run is too small to pay for handing it to the worker threads
    /// (it then stays on the calling thread, `threads::Workers::run_here`).
    pub serial: bool,
    /// With a GPU, what runs the control-flow bodies of the run's host steps.
    pub bodies: Option<Arc<GpuBodies>>,
}

/// A CPU run of fewer flops (and fewer than four times as many bytes) stays on the
/// calling thread: handing a run to the workers costs about as much as 4 MFLOP of
/// kernels on one core saves by sharing them out.
const SERIAL_RUN_FLOPS: u64 = 1 << 22;

/// What one run did: outputs, kernels launched, queue submits.
pub(crate) type RunResult = (Vec<Tensor>, usize, usize);

impl Plan {
    /// Plans `spec` as placed; `gpus[k]` is the context and weight cache of `Dev::Gpu(k)`.
    /// Each step's tunable kernel takes its values from `choices` (see `crate::tune`).
    pub fn build(
        graph: &Graph,
        ops: &[Box<dyn Op>],
        spec: &Specialized,
        placement: Placement,
        gpus: &[(Arc<GpuContext>, gpu::WeightCache)],
        limits: Limits,
        choices: &Choices,
    ) -> Result<Plan> {
        let Placement { devices, mut programs } = placement;
        if devices.len() != spec.steps.len() {
            return Err(RuntimeError::Placement(format!("{} devices for {} steps", devices.len(), spec.steps.len())));
        }
        programs.resize_with(spec.steps.len(), || None);
        let cpu_tune = choose(graph, ops, spec, &devices, &mut programs, gpus, choices)?;
        let (mut flops, mut bytes) = (0u64, 0u64);
        for s in &spec.steps {
            let outs: Vec<kiln_ops::TensorType> = s.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
            let c = ops[s.node].cost(&spec.args(&s.inputs), &outs);
            (flops, bytes) = (flops.saturating_add(c.flops), bytes.saturating_add(c.bytes));
        }
        let serial = devices.iter().all(|d| *d == Dev::Cpu) && flops < SERIAL_RUN_FLOPS && bytes < 4 * SERIAL_RUN_FLOPS;
        let step_devices = spec.steps.iter().map(|s| s.node).zip(devices.iter().copied()).collect();
        // Split the steps into runs of one device (a model without steps runs on the CPU).
        let mut runs: Vec<(Dev, Vec<Step>, Vec<Option<kiln_ops::WgslProgram>>)> = vec![];
        for ((s, &d), p) in spec.steps.iter().zip(&devices).zip(programs) {
            match runs.last_mut() {
                Some((dev, steps, progs)) if *dev == d => {
                    steps.push(s.clone());
                    progs.push(p);
                }
                _ => runs.push((d, vec![s.clone()], vec![p])),
            }
        }
        if runs.is_empty() {
            runs.push((Dev::Cpu, vec![], vec![]));
        }
        let whole = runs.len() == 1;
        // Which values each run reads and writes.
        let produced: Vec<HashSet<ValueId>> = runs.iter().map(|(_, st, _)| st.iter().flat_map(|s| s.outputs.iter().copied()).collect()).collect();
        let read: Vec<HashSet<ValueId>> = runs.iter().map(|(_, st, _)| st.iter().flat_map(|s| s.inputs.iter().flatten().copied()).collect()).collect();
        let graph_outputs: HashSet<ValueId> = graph.outputs.iter().copied().collect();
        let mut segments = vec![];
        for (k, (device, steps, programs)) in runs.into_iter().enumerate() {
            let mut view = None;
            if !whole {
                let mut inputs: Vec<ValueId> = read[k].iter().copied().filter(|v| !produced[k].contains(v) && !spec.constants.contains_key(v)).collect();
                inputs.sort_unstable();
                let mut outputs: Vec<ValueId> =
                    produced[k].iter().copied().filter(|v| graph_outputs.contains(v) || read[k + 1..].iter().any(|r| r.contains(v))).collect();
                outputs.sort_unstable();
                let mut g = graph.clone();
                g.inputs = inputs;
                g.outputs = outputs;
                view = Some(g);
            }
            let sub;
            let seg_spec = if whole {
                spec
            } else {
                sub = Specialized { types: spec.types.clone(), constants: spec.constants.clone(), steps, folded: 0 };
                &sub
            };
            let seg_graph = view.as_ref().unwrap_or(graph);
            let plan = match device {
                Dev::Cpu => {
                    let tune = |n| {
                        let mut v: kiln_ops::TuneValues = cpu_tune.get(&n).cloned().unwrap_or_default();
                        v.0.extend(forced_tune_values().0);
                        v
                    };
                    SegmentPlan::Cpu(CpuPlan::build(seg_graph, ops, seg_spec, limits.memory, &tune)?)
                }
                Dev::Gpu(g) => {
                    let (ctx, weights) = &gpus[g];
                    SegmentPlan::Gpu(GpuPlan::build(ctx.clone(), seg_graph, ops, seg_spec, weights, programs)?)
                }
            };
            segments.push(Segment { view, plan });
        }
        let constants = if whole { HashMap::new() } else { graph.outputs.iter().filter_map(|o| spec.constants.get(o).map(|t| (*o, t.clone()))).collect() };
        Ok(Plan { segments, devices: step_devices, folded: spec.folded, constants, serial, bodies: None })
    }

    /// Runs every segment in order (control-flow bodies through `bodies`, when set);
    /// returns the graph outputs, kernels and submits.
    pub fn run(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor]) -> Result<RunResult> {
        let Some(b) = &self.bodies else { return self.run_segments(graph, ops, inputs) };
        let runner = RunBodies::new(b);
        let (result, kernels, submits) = runner.scope(|| self.run_segments(graph, ops, inputs));
        let (outs, k, s) = result?;
        Ok((outs, k + kernels, s + submits))
    }

    fn run_segments(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor]) -> Result<RunResult> {
        if let [only] = self.segments.as_slice() {
            return only.run(graph, ops, inputs);
        }
        let mut values: HashMap<ValueId, Tensor> = graph.inputs.iter().zip(inputs).map(|(&v, &t)| (v, t.clone())).collect();
        let (mut kernels, mut submits) = (0, 0);
        for seg in &self.segments {
            let seg_graph = seg.graph(graph);
            let ins: Vec<&Tensor> = seg_graph
                .inputs
                .iter()
                .map(|v| values.get(v).ok_or_else(|| RuntimeError::Gpu(format!("value '{}' is needed before it is computed", graph.values[*v].name))))
                .collect::<Result<_>>()?;
            let (outs, k, s) = seg.run(graph, ops, &ins)?;
            kernels += k;
            submits += s;
            for (&v, t) in seg_graph.outputs.iter().zip(outs) {
                values.insert(v, t);
            }
        }
        let outs = graph
            .outputs
            .iter()
            .map(|v| {
                values
                    .get(v)
                    .or_else(|| self.constants.get(v))
                    .cloned()
                    .ok_or_else(|| RuntimeError::Gpu(format!("output '{}' was not computed", graph.values[*v].name)))
            })
            .collect::<Result<_>>()?;
        Ok((outs, kernels, submits))
    }

    /// The memory plan of the intermediates when the plan is one segment.
    pub fn memory(&self) -> Option<MemoryPlan> {
        match self.segments.as_slice() {
            [only] => Some(match &only.plan {
                SegmentPlan::Cpu(p) => p.memory,
                SegmentPlan::Gpu(p) => p.memory,
            }),
            _ => None,
        }
    }

    /// The CPU plan when the whole specialisation runs on the CPU (on the session's graph).
    pub fn cpu_only(&self) -> Option<&CpuPlan> {
        match self.segments.as_slice() {
            [Segment { view: None, plan: SegmentPlan::Cpu(p) }] => Some(p),
            _ => None,
        }
    }

    /// The GPU plan when the whole specialisation runs as one GPU segment.
    pub fn gpu_only(&self) -> Option<&GpuPlan> {
        match self.segments.as_slice() {
            [Segment { view: None, plan: SegmentPlan::Gpu(p) }] => Some(p),
            _ => None,
        }
    }

    /// The GPU kernels of every GPU segment.
    pub fn kernel_records(&self) -> Vec<gpu::KernelRecord> {
        self.segments
            .iter()
            .flat_map(|s| match &s.plan {
                SegmentPlan::Gpu(p) => p.kernel_records(),
                SegmentPlan::Cpu(_) => vec![],
            })
            .collect()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// Tune values forced on every kernel by `KILN_FORCE_TUNE=name=value,...` (a debugging
/// and measuring aid: one variant for a whole run); empty when unset.
pub(crate) fn forced_tune_values() -> kiln_ops::TuneValues {
    static FORCED: std::sync::OnceLock<kiln_ops::TuneValues> = std::sync::OnceLock::new();
    FORCED
        .get_or_init(|| {
            let mut values = kiln_ops::TuneValues::default();
            for pair in std::env::var("KILN_FORCE_TUNE").unwrap_or_default().split(',').filter(|p| !p.is_empty()) {
                match pair.split_once('=').map(|(n, v)| (n.trim(), v.trim().parse::<u32>())) {
                    Some((name, Ok(v))) => {
                        values.0.insert(name.to_string(), v);
                    }
                    _ => log::warn!("KILN_FORCE_TUNE: '{pair}' is not NAME=NUMBER; ignored"),
                }
            }
            values
        })
        .clone()
}

/// The tuned values of every step: CPU steps' values by node (for `CpuPlan::build`);
/// GPU steps' programs regenerated in place with theirs. Logs the keys without a choice.
fn choose(
    graph: &Graph,
    ops: &[Box<dyn Op>],
    spec: &Specialized,
    devices: &[Dev],
    programs: &mut [Option<kiln_ops::WgslProgram>],
    gpus: &[(Arc<GpuContext>, gpu::WeightCache)],
    choices: &Choices,
) -> Result<HashMap<NodeId, kiln_ops::TuneValues>> {
    let mut cpu = HashMap::new();
    let (mut tunable, mut untuned) = (0usize, vec![]);
    let mut gpu_fp: HashMap<usize, DeviceFingerprint> = HashMap::new();
    for ((s, dev), program) in spec.steps.iter().zip(devices).zip(programs.iter_mut()) {
        let op = ops[s.node].as_ref();
        if op.is_view() {
            continue;
        }
        let args = spec.args(&s.inputs);
        let outs: Vec<kiln_ops::TensorType> = s.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
        match *dev {
            Dev::Cpu => {
                let Some(k) = op.cpu() else { continue };
                let params = k.params(&args, &outs);
                if params.is_empty() {
                    continue;
                }
                tunable += 1;
                let fp = choices.cpu_device();
                let key = crate::tune::cpu_key(graph, op, spec, s, fp);
                let (values, src) = choices.lookup(&key, fp, &params)?;
                if src == ChoiceSource::Default {
                    untuned.push(key.summary());
                }
                cpu.insert(s.node, values);
            }
            Dev::Gpu(g) => {
                let Some(k) = op.wgsl() else { continue };
                if program.is_none() {
                    *program = gpu::generate(op, spec, s).ok().flatten();
                }
                let Some(default) = program.as_ref() else { continue };
                let params = k.params(&args, &outs);
                if params.is_empty() {
                    continue;
                }
                tunable += 1;
                let fp = gpu_fp.entry(g).or_insert_with(|| DeviceFingerprint::gpu(&gpus[g].0.info));
                let key = crate::tune::gpu_key(graph, spec, s, fp, default);
                let (values, src) = choices.lookup(&key, fp, &params)?;
                if src == ChoiceSource::Default {
                    untuned.push(key.summary());
                }
                if !values.0.is_empty() {
                    match k.generate(&args, &outs, &values) {
                        Ok(p) => *program = Some(p),
                        Err(e) => log::warn!("node '{}': the tuned values {:?} do not generate ({e}); using the defaults", graph.nodes[s.node].name, values.0),
                    }
                }
            }
        }
    }
    if !untuned.is_empty() {
        untuned.sort();
        untuned.dedup();
        let shown: Vec<&str> = untuned.iter().take(8).map(String::as_str).collect();
        log::info!(
            "'{}': {} tuning keys (of {} tunable steps) have no tuned choice, defaults used (`kiln tune` measures them): {}{}",
            graph.name,
            untuned.len(),
            tunable,
            shown.join("; "),
            if untuned.len() > shown.len() { "; ..." } else { "" }
        );
    }
    Ok(cpu)
}
