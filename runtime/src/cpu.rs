//! The CPU execution plan of one specialisation: native kernels in step order, with
//! every intermediate tensor allocated once per concurrent runner and reused, so a
//! steady-state run allocates only the tensors it returns.
use crate::specialize::Specialized;
use crate::{gpu::poisoned, Result, RuntimeError};
use kiln_graph::{Graph, Tensor, ValueId};
use kiln_ops::Op;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug)]
enum Slot {
    Const(usize),
    Input(usize),
    Temp(usize),
}

struct CpuStep {
    node: usize,
    inputs: Vec<Option<Slot>>,
    outputs: Vec<usize>,
    view: bool,
}

pub(crate) struct CpuPlan {
    consts: Vec<Tensor>,
    temps: Vec<(kiln_graph::DType, Vec<usize>)>,
    steps: Vec<CpuStep>,
    outputs: Vec<Slot>,
    pool: Mutex<Vec<Vec<Tensor>>>,
    /// What view slots hold between runs (shared, so resetting them does not allocate).
    placeholder: Tensor,
}

/// The most memory the CPU backend plans to use: the machine's RAM (from
/// /proc/meminfo), or 64 GiB where that is unknown.
fn memory_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
        })
        .unwrap_or(64 << 30)
}

impl CpuPlan {
    pub fn build(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized) -> Result<CpuPlan> {
        let limit = memory_limit();
        let mut planned: u64 = 0;
        let mut consts = vec![];
        let mut slot_of: HashMap<ValueId, Slot> = HashMap::new();
        for (i, &v) in graph.inputs.iter().enumerate() {
            slot_of.insert(v, Slot::Input(i));
        }
        let slot = |v: ValueId, slot_of: &mut HashMap<ValueId, Slot>, consts: &mut Vec<Tensor>| -> Slot {
            *slot_of.entry(v).or_insert_with(|| {
                consts.push(spec.constants[&v].clone());
                Slot::Const(consts.len() - 1)
            })
        };
        let mut temps = vec![];
        let mut steps = vec![];
        for s in &spec.steps {
            let node = &graph.nodes[s.node];
            let op = &ops[s.node];
            if op.cpu().is_none() && !op.is_view() {
                return Err(RuntimeError::Unsupported {
                    node: format!("node '{}' ({})", node.name, node.op_type),
                    what: "this op has no CPU kernel".into(),
                });
            }
            let inputs = s.inputs.iter().map(|v| v.map(|v| slot(v, &mut slot_of, &mut consts))).collect();
            let mut outputs = vec![];
            for &o in &s.outputs {
                let ty = spec.ty(o);
                let bytes = (ty.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)))
                    .and_then(|n| n.checked_mul(ty.dtype.size() as u64))
                    .unwrap_or(u64::MAX);
                planned = planned.saturating_add(bytes);
                if planned > limit {
                    return Err(RuntimeError::OutOfRange(format!(
                        "node '{}' ({}): its output {} needs {bytes} bytes, which brings the plan to {planned} bytes, \
                         more than this machine's {limit} bytes of memory",
                        node.name, node.op_type, ty
                    )));
                }
                temps.push((ty.dtype, ty.dims.clone()));
                outputs.push(temps.len() - 1);
                slot_of.insert(o, Slot::Temp(temps.len() - 1));
            }
            steps.push(CpuStep { node: s.node, inputs, outputs, view: op.is_view() });
        }
        let outputs = graph.outputs.iter().map(|&o| slot(o, &mut slot_of, &mut consts)).collect();
        Ok(CpuPlan { consts, temps, steps, outputs, pool: Mutex::default(), placeholder: Tensor::zeros(kiln_graph::DType::U8, &[0]) })
    }

    pub fn kernel_count(&self) -> usize {
        self.steps.iter().filter(|s| !s.view).count()
    }

    /// Runs once; with `profile`, records each step's wall time (node index, seconds).
    pub fn run(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor], profile: Option<&mut Vec<(usize, f64)>>) -> Result<Vec<Tensor>> {
        let temps = self.pool.lock().map_err(|_| poisoned())?.pop();
        let mut temps = match temps {
            Some(t) => t,
            None => self.temps.iter().map(|(d, dims)| Tensor::zeros(*d, dims)).collect(),
        };
        let result = self.run_with(graph, ops, inputs, &mut temps, profile);
        // Views alias their inputs: point them back at their own (unused) storage so
        // that the next run's kernels write in place instead of copying on write.
        for s in self.steps.iter().filter(|s| s.view) {
            for &o in &s.outputs {
                temps[o] = self.placeholder.clone();
            }
        }
        self.pool.lock().map_err(|_| poisoned())?.push(temps);
        result
    }

    fn run_with(
        &self,
        graph: &Graph,
        ops: &[Box<dyn Op>],
        inputs: &[&Tensor],
        temps: &mut [Tensor],
        mut profile: Option<&mut Vec<(usize, f64)>>,
    ) -> Result<Vec<Tensor>> {
        for s in &self.steps {
            let started = profile.as_ref().map(|_| std::time::Instant::now());
            let node = &graph.nodes[s.node];
            // A step's outputs are consecutive temps after every temp it reads.
            let first = s.outputs[0];
            let (done, rest) = temps.split_at_mut(first);
            let outs = &mut rest[..s.outputs.len()];
            let ins: Vec<Option<&Tensor>> = s
                .inputs
                .iter()
                .map(|sl| {
                    sl.map(|sl| match sl {
                        Slot::Const(c) => &self.consts[c],
                        Slot::Input(i) => inputs[i],
                        Slot::Temp(t) => &done[t],
                    })
                })
                .collect();
            let r = if s.view {
                match ins.first().copied().flatten() {
                    Some(src) => src.reshaped(&self.temps[first].1).map(|t| outs[0] = t).map_err(kiln_ops::OpError::from),
                    None => Err(kiln_ops::OpError::input(0, "a view op needs its data input")),
                }
            } else {
                match ops[s.node].cpu() {
                    Some(k) => k.run(&ins, outs),
                    None => Err(kiln_ops::OpError::Unsupported("no CPU kernel".into())),
                }
            };
            r.map_err(|e| RuntimeError::node(node, e))?;
            if let (Some(p), Some(t)) = (profile.as_deref_mut(), started) {
                p.push((s.node, t.elapsed().as_secs_f64()));
            }
        }
        Ok(self
            .outputs
            .iter()
            .map(|sl| match *sl {
                Slot::Const(c) => self.consts[c].clone(),
                Slot::Input(i) => inputs[i].clone(),
                Slot::Temp(t) => temps[t].clone(),
            })
            .collect())
    }
}
