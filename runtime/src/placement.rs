//! Placement: where each step of a specialisation runs. In order of precedence: a user
//! rule naming the node or its op type (`SessionOptions::placement`); with cost-model
//! placement, the cheapest device for the step and its neighbours; the CPU when the op
//! has no GPU kernel, or its kernel cannot be generated for these shapes (a loop too
//! long for the driver, ...); else the session's GPU. Decided once per specialisation.
use crate::gpu::{self, GpuContext};
use crate::{DeviceChoice, Result, RuntimeError};
use kiln_graph::Graph;
use kiln_ops::infer::{Specialized, Step};
use kiln_ops::{Op, WgslProgram};
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

/// What a device costs, measured on it (see `calibrate`).
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
    pub(crate) fn step(&self, c: kiln_ops::Cost) -> f64 {
        c.flops as f64 / self.flops_per_s + c.bytes as f64 / self.bytes_per_s + self.launch_s
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

/// Where each step of a specialisation runs, decided once per specialisation, with the
/// GPU kernels generated to decide it (handed on to the GPU plans).
pub(crate) struct Placement {
    pub devices: Vec<Dev>,
    pub programs: Vec<Option<WgslProgram>>,
}

/// What a session may place steps on.
pub(crate) struct Devices<'a> {
    pub rules: &'a [PlacementRule],
    pub rule_devs: &'a [Dev],
    pub has_main_gpu: bool,
    /// The CPU's and the main GPU's profiles, for cost-model placement.
    pub auto: Option<(DeviceProfile, DeviceProfile)>,
}

/// Where each step runs: the last rule that names the node or its op type; else, with
/// `auto`, the cheapest device by the cost model ([`cheapest`]); else the main GPU (if
/// the session has one) when the op's kernel generates for these inputs; else the CPU.
/// Each device's kernel provider answers whether it runs a step: the CPU when the op
/// has a CPU kernel, a GPU when its WGSL generates for these types (the program kept).
pub(crate) fn place(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, on: &Devices) -> Result<Placement> {
    let n = spec.steps.len();
    if !on.has_main_gpu && on.rules.is_empty() {
        return Ok(Placement { devices: vec![Dev::Cpu; n], programs: (0..n).map(|_| None).collect() });
    }
    let mut fixed = vec![];
    let mut oks = vec![];
    let mut programs = vec![];
    for s in &spec.steps {
        let node = &graph.nodes[s.node];
        let op = &ops[s.node];
        let ruled = on.rules.iter().zip(on.rule_devs).rev().find(|(r, _)| r.pattern == node.name || r.pattern == node.op_type).map(|(_, d)| *d);
        let wanted_on_gpu = on.has_main_gpu && ruled.is_none_or(|d| d != Dev::Cpu) || matches!(ruled, Some(Dev::Gpu(_)));
        // String tensors never enter GPU buffers: steps that touch one run on the host.
        let strings = s.inputs.iter().flatten().chain(&s.outputs).any(|&v| spec.ty(v).dtype.is_string());
        let program = if wanted_on_gpu && !op.is_view() && !strings { crate::gpu::generate(op.as_ref(), spec, s).ok().flatten() } else { None };
        let gpu_ok = (op.is_view() && !strings) || program.is_some();
        let cpu_ok = op.is_view() || op.cpu().is_some();
        let pinned = ruled.or(if !gpu_ok || !on.has_main_gpu { Some(Dev::Cpu) } else if !cpu_ok { Some(Dev::Gpu(0)) } else { None });
        fixed.push(pinned);
        oks.push((gpu_ok, cpu_ok));
        programs.push(program);
    }
    let chosen: Vec<Dev> = match on.auto {
        Some((cpu, gpu)) if on.has_main_gpu => {
            let costs: Vec<kiln_ops::Cost> = spec.steps.iter().map(|s| ops[s.node].cost(&spec.args(&s.inputs), &out_types(spec, s))).collect();
            let input_bytes: Vec<u64> = spec.steps.iter().map(|s| s.inputs.iter().flatten().filter(|v| !spec.constants.contains_key(v)).map(|&v| spec.ty(v).bytes() as u64).sum()).collect();
            cheapest(&costs, &input_bytes, &fixed, &cpu, &gpu)
        }
        _ => fixed.iter().map(|f| f.unwrap_or(Dev::Gpu(0))).collect(),
    };
    let devices = spec.steps
        .iter()
        .zip(chosen)
        .zip(oks)
        .map(|((s, device), (gpu_ok, cpu_ok))| {
            let node = &graph.nodes[s.node];
            match device {
                Dev::Gpu(_) if !gpu_ok => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on a GPU, but it has no GPU kernel for these inputs{}",
                    node.name, node.op_type,
                    if s.inputs.iter().flatten().chain(&s.outputs).any(|&v| spec.ty(v).dtype.is_string()) { " (string tensors stay on the host)" } else { "" }
                ))),
                Dev::Cpu if !cpu_ok => Err(RuntimeError::Placement(format!(
                    "node '{}' ({}) is placed on the CPU, but it has no CPU kernel",
                    node.name, node.op_type
                ))),
                d => Ok(d),
            }
        })
        .collect::<Result<Vec<Dev>>>()?;
    // Kernels of steps that run elsewhere are not needed.
    let programs = programs.into_iter().zip(&devices).map(|(p, d)| p.filter(|_| *d != Dev::Cpu)).collect();
    Ok(Placement { devices, programs })
}

fn out_types(spec: &Specialized, s: &Step) -> Vec<kiln_ops::TensorType> {
    s.outputs.iter().map(|&o| spec.ty(o).clone()).collect()
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
