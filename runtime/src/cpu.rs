//! The CPU execution plan of one specialisation: native kernels in step order.
//!
//! Memory plan: every intermediate's lifetime (the step that writes it to the last step
//! that reads it, views included: a Reshape's output keeps its source alive) is known
//! when the plan is built. Intermediates whose lifetimes do not overlap share a buffer
//! ("slot"): slots are assigned greedily in step order, best fit by size, and a slot
//! grows to its largest tenant. At run time a slot's storage moves from tensor to
//! tensor (never shared while in use, so kernels write in place), and slots persist
//! per concurrent runner, so a steady-state run allocates only the tensors it returns.
//! Recycled buffers hold stale data: ops that do not overwrite every output element
//! (`Op::overwrites_outputs` false) get zeroed outputs. `KILN_POISON_BUFFERS=1` fills
//! recycled buffers with NaN instead of stale data, to catch ops that claim otherwise.
use crate::specialize::Specialized;
use crate::{gpu::poisoned, Result, RuntimeError};
use kiln_graph::{Graph, Tensor, ValueId};
use kiln_ops::Op;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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

/// The plan of one specialisation (internal; its [`MemoryPlan`] is reported in `RunStats`).
pub(crate) struct CpuPlan {
    consts: Vec<Tensor>,
    temps: Vec<(kiln_graph::DType, Vec<usize>)>,
    steps: Vec<CpuStep>,
    outputs: Vec<Slot>,
    /// The buffer each non-view temp lives in.
    slot_of: Vec<Option<usize>>,
    /// Size of each buffer, in 8-byte words.
    slot_words: Vec<usize>,
    /// Temps whose buffers go back to their slots after each step (last readers).
    frees: Vec<Vec<usize>>,
    /// Temps that are views of each temp (reset with it).
    views_of: Vec<Vec<usize>>,
    pub memory: MemoryPlan,
    pool: Mutex<Vec<Vec<Arc<Vec<u64>>>>>,
    /// What temps hold when they have no buffer (shared, so resetting does not allocate).
    placeholder: Tensor,
}

/// The memory plan's figures, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Total size of the buffers the plan allocates for intermediates.
    pub planned: u64,
    /// The most bytes of intermediates alive at one step (no plan can do better).
    pub lower_bound: u64,
    /// Every intermediate in its own buffer (no reuse).
    pub unshared: u64,
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
        let outputs: Vec<Slot> = graph.outputs.iter().map(|&o| slot(o, &mut slot_of, &mut consts)).collect();
        let (slot_of, slot_words, frees, views_of, memory) = plan_memory(&temps, &steps, &outputs);
        log::debug!("CPU memory plan: {} bytes in {} buffers; lower bound {}, unshared {}", memory.planned, slot_words.len(), memory.lower_bound, memory.unshared);
        Ok(CpuPlan {
            consts,
            temps,
            steps,
            outputs,
            slot_of,
            slot_words,
            frees,
            views_of,
            memory,
            pool: Mutex::default(),
            placeholder: Tensor::zeros(kiln_graph::DType::U8, &[0]),
        })
    }

    pub fn kernel_count(&self) -> usize {
        self.steps.iter().filter(|s| !s.view).count()
    }

    /// Runs once; with `profile`, records each step's wall time (node index, seconds).
    pub fn run(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor], profile: Option<&mut Vec<(usize, f64)>>) -> Result<Vec<Tensor>> {
        let slots = self.pool.lock().map_err(|_| poisoned())?.pop();
        let mut slots = match slots {
            Some(s) => s,
            None => self.slot_words.iter().map(|&w| Arc::new(vec![0u64; w])).collect(),
        };
        let mut temps: Vec<Tensor> = vec![self.placeholder.clone(); self.temps.len()];
        let result = self.run_with(graph, ops, inputs, &mut temps, &mut slots, profile);
        // Buffers still held (graph outputs, or everything after an error) go back.
        for (t, tensor) in temps.into_iter().enumerate() {
            if let Some(s) = self.slot_of[t] {
                let storage = tensor.into_storage();
                if storage.len() == self.slot_words[s] {
                    slots[s] = storage;
                }
            }
        }
        self.pool.lock().map_err(|_| poisoned())?.push(slots);
        result
    }

    fn run_with(
        &self,
        graph: &Graph,
        ops: &[Box<dyn Op>],
        inputs: &[&Tensor],
        temps: &mut [Tensor],
        slots: &mut [Arc<Vec<u64>>],
        mut profile: Option<&mut Vec<(usize, f64)>>,
    ) -> Result<Vec<Tensor>> {
        let empty = || Arc::new(Vec::new());
        for (k, s) in self.steps.iter().enumerate() {
            let started = profile.as_ref().map(|_| std::time::Instant::now());
            let node = &graph.nodes[s.node];
            // Give the step's outputs their buffers.
            if !s.view {
                let zero = !ops[s.node].overwrites_outputs();
                for &o in &s.outputs {
                    let slot = self.slot_of[o].expect("non-view temps have a buffer");
                    let (dtype, dims) = &self.temps[o];
                    let mut storage = std::mem::replace(&mut slots[slot], empty());
                    if storage.len() != self.slot_words[slot] {
                        storage = Arc::new(vec![0u64; self.slot_words[slot]]);
                    }
                    let mut t = Tensor::on_storage(*dtype, dims, storage).map_err(|e| RuntimeError::node(node, e.into()))?;
                    if poison() && !zero {
                        fill_nan(&mut t);
                    } else if zero {
                        t.bytes_mut().fill(0);
                    }
                    temps[o] = t;
                }
            }
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
            drop(ins);
            r.map_err(|e| RuntimeError::node(node, e))?;
            // Buffers whose last reader this was go back to their slots (with the views
            // that alias them, so that nothing else holds the storage).
            for &t in &self.frees[k] {
                for &v in &self.views_of[t] {
                    temps[v] = self.placeholder.clone();
                }
                let storage = std::mem::replace(&mut temps[t], self.placeholder.clone()).into_storage();
                if let Some(slot) = self.slot_of[t] {
                    slots[slot] = storage;
                }
            }
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

fn poison() -> bool {
    static POISON: OnceLock<bool> = OnceLock::new();
    *POISON.get_or_init(|| std::env::var_os("KILN_POISON_BUFFERS").is_some())
}

fn fill_nan(t: &mut Tensor) {
    match t.dtype() {
        kiln_graph::DType::F32 => {
            if let Ok(v) = t.as_mut_slice::<f32>() {
                v.fill(f32::NAN);
            }
        }
        _ => t.bytes_mut().fill(0xA5),
    }
}

/// The memory plan: which buffer each temp lives in, the buffers' sizes (words), the
/// temps freed after each step, each temp's views, and the plan's figures.
#[allow(clippy::type_complexity)]
fn plan_memory(temps: &[(kiln_graph::DType, Vec<usize>)], steps: &[CpuStep], outputs: &[Slot]) -> (Vec<Option<usize>>, Vec<usize>, Vec<Vec<usize>>, Vec<Vec<usize>>, MemoryPlan) {
    let words = |t: usize| -> usize {
        let (d, dims) = &temps[t];
        (dims.iter().product::<usize>() * d.size()).div_ceil(8).max(1)
    };
    // Views alias the buffer of their source (a temp, or a constant/input: no buffer).
    let mut root: Vec<Option<usize>> = vec![None; temps.len()];
    let mut def = vec![0usize; temps.len()];
    for (k, s) in steps.iter().enumerate() {
        for &o in &s.outputs {
            def[o] = k;
            root[o] = Some(o);
        }
        if s.view {
            let src = match s.inputs.first().copied().flatten() {
                Some(Slot::Temp(t)) => root[t],
                _ => None,
            };
            for &o in &s.outputs {
                root[o] = src;
            }
        }
    }
    let mut last = vec![0usize; temps.len()];
    for (k, s) in steps.iter().enumerate() {
        for &o in &s.outputs {
            if let Some(r) = root[o] {
                last[r] = last[r].max(k);
            }
        }
        for sl in s.inputs.iter().flatten() {
            if let Slot::Temp(t) = sl {
                if let Some(r) = root[*t] {
                    last[r] = last[r].max(k);
                }
            }
        }
    }
    for sl in outputs {
        if let Slot::Temp(t) = sl {
            if let Some(r) = root[*t] {
                last[r] = usize::MAX;
            }
        }
    }
    let mut views_of: Vec<Vec<usize>> = vec![vec![]; temps.len()];
    for t in 0..temps.len() {
        if let Some(r) = root[t] {
            if r != t {
                views_of[r].push(t);
            }
        }
    }
    // Two greedy assignments; the smaller plan wins.
    let owners: Vec<usize> = (0..temps.len()).filter(|&t| root[t] == Some(t)).collect();
    let spans: Vec<(usize, usize, usize)> = owners.iter().map(|&t| (t, def[t], last[t])).collect();
    let by_size = assign_by_size(&spans, &words);
    let in_order = assign_in_order(&spans, &words);
    let total = |(_, w): &(Vec<(usize, usize)>, Vec<usize>)| w.iter().sum::<usize>();
    let (assignment, slot_words) = if total(&in_order) < total(&by_size) { in_order } else { by_size };
    let mut slot_of: Vec<Option<usize>> = vec![None; temps.len()];
    let mut frees: Vec<Vec<usize>> = vec![vec![]; steps.len()];
    for (t, s) in assignment {
        slot_of[t] = Some(s);
        if last[t] != usize::MAX {
            frees[last[t]].push(t);
        }
    }
    // Figures: the lower bound is the largest total alive at one step.
    let mut alive = vec![0u64; steps.len()];
    for &t in &owners {
        let end = last[t].min(steps.len().saturating_sub(1));
        for a in alive.iter_mut().take(end + 1).skip(def[t]) {
            *a += words(t) as u64 * 8;
        }
    }
    let memory = MemoryPlan {
        planned: slot_words.iter().map(|&w| w as u64 * 8).sum(),
        lower_bound: alive.iter().copied().max().unwrap_or(0),
        unshared: owners.iter().map(|&t| words(t) as u64 * 8).sum(),
    };
    (slot_of, slot_words, frees, views_of, memory)
}

/// Buffer assignment, largest intermediates first: each goes to the smallest buffer that
/// is big enough and whose tenants are never alive at the same time, else to a new one.
/// `spans` are (temp, first step, last step). Returns (temp, buffer) pairs and sizes.
fn assign_by_size(spans: &[(usize, usize, usize)], words: &dyn Fn(usize) -> usize) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut order = spans.to_vec();
    order.sort_by_key(|&(t, d, _)| (std::cmp::Reverse(words(t)), d, t));
    let mut slot_words: Vec<usize> = vec![];
    let mut tenants: Vec<Vec<(usize, usize)>> = vec![];
    let mut out = vec![];
    for (t, d, l) in order {
        let w = words(t);
        let overlaps = |s: usize| tenants[s].iter().any(|&(a, b)| a <= l && d <= b);
        let s = (0..slot_words.len()).filter(|&s| slot_words[s] >= w && !overlaps(s)).min_by_key(|&s| slot_words[s]).unwrap_or_else(|| {
            slot_words.push(w);
            tenants.push(vec![]);
            slot_words.len() - 1
        });
        tenants[s].push((d, l));
        out.push((t, s));
    }
    (out, slot_words)
}

/// Buffer assignment in step order: each intermediate takes the best-fitting buffer free
/// when it is written (growing the largest free one if none fits), else a new one.
fn assign_in_order(spans: &[(usize, usize, usize)], words: &dyn Fn(usize) -> usize) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut order = spans.to_vec();
    order.sort_by_key(|&(t, d, _)| (d, t));
    let mut slot_words: Vec<usize> = vec![];
    let mut busy_until: Vec<usize> = vec![];
    let mut out = vec![];
    for (t, d, l) in order {
        let w = words(t);
        let free: Vec<usize> = (0..slot_words.len()).filter(|&s| busy_until[s] < d).collect();
        let fit = free.iter().copied().filter(|&s| slot_words[s] >= w).min_by_key(|&s| slot_words[s]);
        let s = match fit.or_else(|| free.iter().copied().max_by_key(|&s| slot_words[s])) {
            Some(s) => {
                slot_words[s] = slot_words[s].max(w);
                s
            }
            None => {
                slot_words.push(w);
                busy_until.push(0);
                slot_words.len() - 1
            }
        };
        busy_until[s] = l;
        out.push((t, s));
    }
    (out, slot_words)
}
