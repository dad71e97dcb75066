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

/// Where each step runs: the last rule that names the node or its op type; else, with
/// `auto` (the CPU's and the main GPU's profiles), the cheapest device by the cost model
/// ([`cheapest`]); else the main GPU (if the session has one) when the op's kernel
/// generates for these inputs; else the CPU.
pub(crate) fn place(
    graph: &Graph,
    ops: &[Box<dyn Op>],
    spec: &Specialized,
    rules: &[PlacementRule],
    rule_devs: &[Dev],
    has_main_gpu: bool,
    auto: Option<(DeviceProfile, DeviceProfile)>,
) -> Result<Vec<Dev>> {
    let mut fixed = vec![];
    let mut gpu_oks = vec![];
    for s in &spec.steps {
        let node = &graph.nodes[s.node];
        let op = &ops[s.node];
        let ruled = rules.iter().zip(rule_devs).rev().find(|(r, _)| r.pattern == node.name || r.pattern == node.op_type).map(|(_, d)| *d);
        let gpu_ok = op.is_view() || op.wgsl().is_some_and(|k| k.generate(&spec.args(&s.inputs), &out_types(spec, s), &TuneValues::default()).is_ok());
        let cpu_ok = op.is_view() || op.cpu().is_some();
        let pinned = ruled.or(if !gpu_ok || !has_main_gpu { Some(Dev::Cpu) } else if !cpu_ok { Some(Dev::Gpu(0)) } else { None });
        fixed.push(pinned);
        gpu_oks.push((gpu_ok, cpu_ok));
    }
    let chosen: Vec<Dev> = match auto {
        Some((cpu, gpu)) if has_main_gpu => {
            let costs: Vec<kiln_ops::Cost> = spec.steps.iter().map(|s| ops[s.node].cost(&spec.args(&s.inputs), &out_types(spec, s))).collect();
            let input_bytes: Vec<u64> = spec.steps.iter().map(|s| s.inputs.iter().flatten().filter(|v| !spec.constants.contains_key(v)).map(|&v| spec.ty(v).bytes() as u64).sum()).collect();
            cheapest(&costs, &input_bytes, &fixed, &cpu, &gpu)
        }
        _ => fixed.iter().map(|f| f.unwrap_or(Dev::Gpu(0))).collect(),
    };
    spec.steps
        .iter()
        .zip(chosen)
        .zip(gpu_oks)
        .map(|((s, device), (gpu_ok, cpu_ok))| {
            let node = &graph.nodes[s.node];
            match device {
                Dev::Gpu(_) if !gpu_ok => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on a GPU, but it has no GPU kernel for these inputs",
                    node.name, node.op_type
                ))),
                Dev::Cpu if !cpu_ok => Err(RuntimeError::Placement(format!(
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

/// What a device costs, measured on it (see [`calibrate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceProfile {
    /// Sustained f32 multiply-adds, as FLOP/s, on a 256x256 matrix product.
    pub flops_per_s: f64,
    /// Bytes per second through an elementwise op over 4 MiB.
    pub bytes_per_s: f64,
    /// Seconds per kernel launch.
    pub launch_s: f64,
    /// Seconds per run of a segment (a GPU submit and readback; ~0 on the CPU).
    pub segment_s: f64,
    /// Bytes per second moved between host memory and the device (uploads and
    /// readbacks; the CPU's own bandwidth on the CPU).
    pub transfer_bytes_per_s: f64,
}

impl DeviceProfile {
    fn step(&self, c: kiln_ops::Cost) -> f64 {
        c.flops as f64 / self.flops_per_s + c.bytes as f64 / self.bytes_per_s + self.launch_s
    }
}

/// Measures a device by running small graphs on it with the ordinary session machinery:
/// a matrix product (FLOP/s); chains of 1 and 9 tiny ops (the difference is 8 launches,
/// the rest the per-run cost); chains of 1 and 9 Relus over 4 MiB (the difference is 8
/// passes over memory: bytes/s; what the single pass leaves is moving 4 MiB to the
/// device and back: transfer bytes/s). Cached per device name.
pub fn calibrate(device: &DeviceChoice) -> Result<DeviceProfile> {
    use kiln_graph::{DType, GraphBuilder, Shape};
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, DeviceProfile>>> = OnceLock::new();
    let key = device.to_string();
    if let Some(p) = CACHE.get_or_init(Default::default).lock().ok().and_then(|c| c.get(&key).copied()) {
        return Ok(p);
    }
    let time = |g: kiln_graph::Graph, x: Tensor| -> Result<f64> {
        let s = crate::Session::new(g, crate::SessionOptions::device(device.clone()))?;
        s.run(&[("x", &x)])?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            s.run(&[("x", &x)])?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let chain = |n: usize, dims: &[usize], op: &str| {
        let mut b = GraphBuilder::new("calibration");
        let mut v = b.input("x", DType::F32, Shape::fixed(dims));
        for _ in 0..n {
            v = b.node(op, &[v], &[]);
        }
        b.output(v);
        b.finish().expect("a valid chain")
    };
    let n = 256;
    let mut b = GraphBuilder::new("calibration");
    let x = b.input("x", DType::F32, Shape::fixed(&[n, n]));
    let y = b.node("MatMul", &[x, x], &[]);
    b.output(y);
    let mm = time(b.finish().expect("a valid graph"), Tensor::zeros(DType::F32, &[n, n]))?;
    let big = 1 << 20;
    let one_big = time(chain(1, &[big], "Relu"), Tensor::zeros(DType::F32, &[big]))?;
    let nine_big = time(chain(9, &[big], "Relu"), Tensor::zeros(DType::F32, &[big]))?;
    let one = time(chain(1, &[4], "Relu"), Tensor::zeros(DType::F32, &[4]))?;
    let nine = time(chain(9, &[4], "Relu"), Tensor::zeros(DType::F32, &[4]))?;
    let launch_s = ((nine - one) / 8.0).max(1e-7);
    let segment_s = (one - launch_s).max(0.0);
    // One pass reads and writes 4 bytes per element.
    let pass_s = ((nine_big - one_big) / 8.0 - launch_s).max(1e-7);
    let bytes_per_s = 8.0 * big as f64 / pass_s;
    let transfer_bytes_per_s = if *device == DeviceChoice::Cpu { bytes_per_s } else { 8.0 * big as f64 / (one_big - segment_s - launch_s - pass_s).max(1e-7) };
    let profile = DeviceProfile {
        flops_per_s: 2.0 * (n * n * n) as f64 / (mm - segment_s - launch_s).max(1e-7),
        bytes_per_s,
        launch_s,
        segment_s,
        transfer_bytes_per_s,
    };
    log::info!("calibrated {key}: {profile:?}");
    if let Ok(mut c) = CACHE.get_or_init(Default::default).lock() {
        c.insert(key, profile);
    }
    Ok(profile)
}

/// Chooses CPU or GPU for each step by cost: each step's FLOPs and bytes against each
/// device's profile, plus the cost of leaving a device (a GPU segment's run overhead, and
/// moving the step's inputs at the GPU's measured transfer bandwidth). A shortest path over the steps
/// (two states: the device of the previous step). `fixed[i]` pins step `i` (user rules,
/// ops one device lacks).
pub(crate) fn cheapest(costs: &[kiln_ops::Cost], input_bytes: &[u64], fixed: &[Option<Dev>], cpu: &DeviceProfile, gpu: &DeviceProfile) -> Vec<Dev> {
    let devs = [Dev::Cpu, Dev::Gpu(0)];
    let prof = |d: Dev| if d == Dev::Cpu { cpu } else { gpu };
    let n = costs.len();
    let mut best = vec![[f64::INFINITY; 2]; n + 1];
    let mut from = vec![[0usize; 2]; n + 1];
    best[0] = [0.0, 0.0];
    for i in 0..n {
        for (b, &db) in devs.iter().enumerate() {
            if fixed[i].is_some_and(|f| f != db) {
                continue;
            }
            let here = prof(db).step(costs[i]);
            for a in 0..2 {
                let switch = if i > 0 && a != b { prof(db).segment_s + input_bytes[i] as f64 / gpu.transfer_bytes_per_s } else if i == 0 { prof(db).segment_s } else { 0.0 };
                let total = best[i][a] + here + switch;
                if total < best[i + 1][b] {
                    best[i + 1][b] = total;
                    from[i + 1][b] = a;
                }
            }
        }
    }
    let mut out = vec![Dev::Cpu; n];
    let mut s = if best[n][0] <= best[n][1] { 0 } else { 1 };
    for i in (0..n).rev() {
        out[i] = devs[s];
        s = from[i + 1][s];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ops::Cost;

    fn p(flops: f64, bytes: f64, launch: f64, seg: f64) -> DeviceProfile {
        DeviceProfile { flops_per_s: flops, bytes_per_s: bytes, launch_s: launch, segment_s: seg, transfer_bytes_per_s: bytes }
    }

    #[test]
    fn the_cheapest_placement_weighs_work_against_switching() {
        let cpu = p(1e11, 1e10, 1e-6, 0.0);
        let fast_gpu = p(1e13, 1e11, 5e-6, 1e-4);
        let heavy = Cost { flops: 1_000_000_000, bytes: 1 << 20 };
        let light = Cost { flops: 1000, bytes: 4096 };
        // Heavy work goes to the fast GPU; a light step between heavy ones stays there
        // rather than paying two switches.
        let costs = [heavy, light, heavy];
        let got = cheapest(&costs, &[1 << 20; 3], &[None; 3], &cpu, &fast_gpu);
        assert_eq!(got, vec![Dev::Gpu(0); 3]);
        // Only light work: the GPU's run overhead is not worth it.
        let got = cheapest(&[light; 4], &[4096; 4], &[None; 4], &cpu, &fast_gpu);
        assert_eq!(got, vec![Dev::Cpu; 4]);
        // A step pinned to the CPU splits the run; the others still choose.
        let got = cheapest(&costs, &[1 << 20; 3], &[None, Some(Dev::Cpu), None], &cpu, &fast_gpu);
        assert_eq!(got, vec![Dev::Gpu(0), Dev::Cpu, Dev::Gpu(0)]);
        // A slow (software) GPU gets nothing.
        let slow_gpu = p(1e9, 1e9, 1e-4, 1e-3);
        assert_eq!(cheapest(&costs, &[1 << 20; 3], &[None; 3], &cpu, &slow_gpu), vec![Dev::Cpu; 3]);
    }
}
