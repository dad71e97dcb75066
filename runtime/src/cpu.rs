//! The CPU execution plan of one specialisation: native kernels in step order.
//!
//! Memory plan: every intermediate's lifetime (the step that writes it to the last step
//! that reads it, views included: a Reshape's output keeps its source alive) is known
//! when the plan is built. Each intermediate gets a word range of one arena, so that
//! ranges of intermediates alive at the same time never overlap (greedy placement,
//! largest first, into the tightest gap; a second placement in step order is tried and
//! the smaller arena kept). At run time the step that writes an intermediate gets the
//! tensor that owns its range (`Tensor::in_arena`), views read the same words, and
//! every tensor of a range is dropped after the range's last reader, before any later
//! tenant is placed there. Arenas persist per concurrent runner, so a steady-state run
//! allocates only the tensors it returns (copies of the graph outputs).
//! Recycled ranges hold stale data: ops that do not overwrite every output element
//! (`Op::overwrites_outputs` false) get zeroed outputs. `KILN_POISON_BUFFERS=1` fills
//! recycled ranges with NaN instead of stale data, to catch ops that claim otherwise.
//! String temps (`DType::String`) have no bytes: they get no arena range, never run in
//! place or inside a Concat, and each run hands their step fresh heap tensors.
use crate::arena::{place, Arena, MemoryPlan, Span};
use kiln_ops::infer::Specialized;
use crate::error::poisoned;
use crate::{Result, RuntimeError};
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
    /// Inputs whose memory the kernel could write its output over (`CpuKernel::in_place_inputs`).
    in_place_candidates: Vec<usize>,
    /// The input whose memory the output takes over, and the temps (that input and its
    /// views) that give it up, when the memory plan chose to run this step in place.
    in_place: Option<(usize, Vec<usize>)>,
    /// The kernel `CpuKernel::prepare` specialised for this step (packed weights, the
    /// chosen variant); `None`: the op's own kernel runs.
    prepared: Option<Box<dyn kiln_ops::CpuKernel>>,
    /// A Concat whose output is its inputs back to back (nothing outside the axis but
    /// ones): each input's byte offset in the output.
    concat_parts: Option<Vec<usize>>,
    /// Whether the memory plan placed this Concat's inputs inside its output, so that
    /// their producers already wrote it: the step runs nothing.
    concat_in_place: bool,
}

/// The plan of one specialisation (internal; its [`MemoryPlan`] is reported in `RunStats`).
pub(crate) struct CpuPlan {
    consts: Vec<Tensor>,
    temps: Vec<(kiln_graph::DType, Vec<usize>)>,
    steps: Vec<CpuStep>,
    outputs: Vec<Slot>,
    /// The arena range (first word) of each non-view temp.
    offset_of: Vec<Option<usize>>,
    /// Size of the arena, in 8-byte words.
    arena_words: usize,
    /// Temps dropped after each step (ranges whose last reader it was, with their views).
    frees: Vec<Vec<usize>>,
    pub memory: MemoryPlan,
    pool: Mutex<Vec<Arc<Arena>>>,
    /// What temps hold when they have no buffer (shared, so resetting does not allocate).
    placeholder: Tensor,
}

impl CpuPlan {
    /// The plan of `spec`'s steps; refused when its intermediates would need more than
    /// `limit` bytes.
    /// `tune(node)` gives the chosen values of the node's tunable parameters.
    pub fn build(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized, limit: u64, tune: &dyn Fn(usize) -> kiln_ops::TuneValues) -> Result<CpuPlan> {
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
                return Err(RuntimeError::Unsupported { node: format!("node '{}' ({})", node.name, node.op_type), what: "this op has no CPU kernel".into() });
            }
            let inputs = s.inputs.iter().map(|v| v.map(|v| slot(v, &mut slot_of, &mut consts))).collect();
            let mut outputs = vec![];
            for &o in &s.outputs {
                let ty = spec.ty(o);
                let bytes =
                    (ty.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64))).and_then(|n| n.checked_mul(ty.dtype.size() as u64)).unwrap_or(u64::MAX);
                planned = planned.saturating_add(bytes);
                if planned > limit {
                    return Err(RuntimeError::OutOfRange(format!(
                        "node '{}' ({}): its output {} needs {bytes} bytes, which brings the plan to {planned} bytes, \
                         more than the session's memory limit of {limit} bytes",
                        node.name, node.op_type, ty
                    )));
                }
                temps.push((ty.dtype, ty.dims.clone()));
                outputs.push(temps.len() - 1);
                slot_of.insert(o, Slot::Temp(temps.len() - 1));
            }
            let prepared = match op.cpu() {
                Some(k) if !op.is_view() => {
                    let out_types: Vec<kiln_ops::TensorType> = s.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
                    k.prepare(&spec.args(&s.inputs), &out_types, &tune(s.node)).map_err(|e| RuntimeError::node(node, e))?
                }
                _ => None,
            };
            let kernel = prepared.as_deref().or(op.cpu());
            let touches_strings = s.inputs.iter().flatten().chain(&s.outputs).any(|&v| spec.ty(v).dtype.is_string());
            let in_place_candidates = match kernel {
                Some(k) if s.outputs.len() == 1 && op.overwrites_outputs() && !touches_strings => {
                    let types: Vec<Option<&kiln_ops::TensorType>> = s.inputs.iter().map(|v| v.map(|v| spec.ty(v))).collect();
                    k.in_place_inputs(&types, spec.ty(s.outputs[0]))
                }
                _ => vec![],
            };
            let concat_parts = if node.op_type == "Concat" && node.domain.is_empty() && s.outputs.len() == 1 && !touches_strings { back_to_back(spec, &s.inputs, s.outputs[0]) } else { None };
            steps.push(CpuStep { node: s.node, inputs, outputs, view: op.is_view(), in_place_candidates, in_place: None, prepared, concat_parts, concat_in_place: false });
        }
        let outputs: Vec<Slot> = graph.outputs.iter().map(|&o| slot(o, &mut slot_of, &mut consts)).collect();
        let (offset_of, arena_words, frees, memory) = plan_memory(&temps, &mut steps, &outputs);
        log::debug!("CPU memory plan: an arena of {} bytes; lower bound {}, unshared {}", memory.planned, memory.lower_bound, memory.unshared);
        Ok(CpuPlan {
            consts,
            temps,
            steps,
            outputs,
            offset_of,
            arena_words,
            frees,
            memory,
            pool: Mutex::default(),
            placeholder: Tensor::zeros(kiln_graph::DType::U8, &[0]),
        })
    }

    pub fn kernel_count(&self) -> usize {
        self.steps.iter().filter(|s| !s.view).count()
    }

    /// Runs once; with `profile`, records each step's wall time (node index, seconds).
    pub fn run(&self, graph: &Graph, ops: &[Box<dyn Op>], inputs: &[&Tensor], profile: Option<&mut Vec<(usize, std::time::Instant, f64)>>) -> Result<Vec<Tensor>> {
        let arena = self.pool.lock().map_err(|_| poisoned())?.pop();
        let arena = arena.unwrap_or_else(|| Arc::new(Arena::new(self.arena_words)));
        let mut temps: Vec<Tensor> = vec![self.placeholder.clone(); self.temps.len()];
        let result = self.run_with(graph, ops, inputs, &mut temps, &arena, profile);
        // Every tensor on the arena is gone before another run may use it.
        drop(temps);
        self.pool.lock().map_err(|_| poisoned())?.push(arena);
        result
    }

    /// The tensor owning temp `t`'s arena range (a fresh heap tensor for strings).
    fn owner(&self, t: usize, arena: &Arc<Arena>) -> std::result::Result<Tensor, kiln_graph::GraphError> {
        let (dtype, dims) = &self.temps[t];
        if dtype.is_string() {
            return Tensor::try_zeros(*dtype, dims);
        }
        let offset = self.offset_of[t].expect("non-view temps have a range");
        // SAFETY: the plan gives temps alive at the same step disjoint ranges, and
        // `run_with` drops every tensor of a range after its last reader.
        unsafe { Tensor::in_arena(*dtype, dims, arena, offset) }
    }

    fn run_with(
        &self,
        graph: &Graph,
        ops: &[Box<dyn Op>],
        inputs: &[&Tensor],
        temps: &mut [Tensor],
        arena: &Arc<Arena>,
        mut profile: Option<&mut Vec<(usize, std::time::Instant, f64)>>,
    ) -> Result<Vec<Tensor>> {
        for (k, s) in self.steps.iter().enumerate() {
            let started = profile.as_ref().map(|_| std::time::Instant::now());
            let node = &graph.nodes[s.node];
            // Give the step's outputs their ranges.
            if s.concat_in_place {
                // The producers of the inputs wrote the output already.
                let o = s.outputs[0];
                temps[o] = self.owner(o, arena).map_err(|e| RuntimeError::node(node, e.into()))?;
                for &t in &self.frees[k] {
                    temps[t] = self.placeholder.clone();
                }
                if let (Some(p), Some(t)) = (profile.as_deref_mut(), started) {
                    p.push((s.node, t, t.elapsed().as_secs_f64()));
                }
                continue;
            }
            if let Some((_, giving_up)) = &s.in_place {
                // The output takes over its input's range (values included).
                for &t in giving_up {
                    temps[t] = self.placeholder.clone();
                }
                let o = s.outputs[0];
                temps[o] = self.owner(o, arena).map_err(|e| RuntimeError::node(node, e.into()))?;
            } else if !s.view {
                let zero = !ops[s.node].overwrites_outputs();
                for &o in &s.outputs {
                    let mut t = self.owner(o, arena).map_err(|e| RuntimeError::node(node, e.into()))?;
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
            let taken = s.in_place.as_ref().map(|(i, _)| *i);
            let ins: Vec<Option<&Tensor>> = s
                .inputs
                .iter()
                .enumerate()
                .map(|(i, sl)| {
                    sl.filter(|_| Some(i) != taken).map(|sl| match sl {
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
                let kernel = match &s.prepared {
                    Some(k) => Some(&**k),
                    None => ops[s.node].cpu(),
                };
                match (kernel, taken) {
                    (Some(k), Some(i)) => k.run_in_place(&ins, i, outs),
                    (Some(k), None) => k.run(&ins, outs),
                    (None, _) => Err(kiln_ops::OpError::Unsupported("no CPU kernel".into())),
                }
            };
            drop(ins);
            r.map_err(|e| RuntimeError::node(node, e))?;
            // A kernel may have replaced an output (with a new tensor or a view of an
            // input): its bytes move into the output's own range, so that nothing
            // outlives the range it reads.
            if !s.view {
                for &o in s.outputs.iter().filter(|&&o| !self.temps[o].0.is_string()) {
                    let offset = self.offset_of[o].expect("non-view temps have a range");
                    if !temps[o].owns_arena_range(arena, offset) {
                        let mut t = self.owner(o, arena).map_err(|e| RuntimeError::node(node, e.into()))?;
                        if t.dtype() == temps[o].dtype() && t.dims() == temps[o].dims() {
                            t.bytes_mut().copy_from_slice(temps[o].bytes());
                            temps[o] = t;
                        } else {
                            temps[o] = temps[o].clone();
                        }
                    }
                }
            }
            // Ranges whose last reader this was: drop their tensors and views.
            for &t in &self.frees[k] {
                temps[t] = self.placeholder.clone();
            }
            if let (Some(p), Some(t)) = (profile.as_deref_mut(), started) {
                p.push((s.node, t, t.elapsed().as_secs_f64()));
            }
        }
        // Graph outputs are copied out of the arena (clones of arena tensors copy).
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

/// The memory plan: each non-view temp's arena range (first word), the arena's size in
/// words, the temps dropped after each step, and the plan's figures.
fn plan_memory(temps: &[(kiln_graph::DType, Vec<usize>)], steps: &mut [CpuStep], outputs: &[Slot]) -> (Vec<Option<usize>>, usize, Vec<Vec<usize>>, MemoryPlan) {
    let words = |t: usize| -> usize {
        let (d, dims) = &temps[t];
        // String temps live on the heap; their word of the arena is never read.
        if d.is_string() {
            return 1;
        }
        (dims.iter().product::<usize>() * d.size()).div_ceil(8).max(1)
    };
    // Views alias the range of their source (a temp, or a constant/input: no range).
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
    let owners: Vec<usize> = (0..temps.len()).filter(|&t| root[t] == Some(t)).collect();
    // In place: a step writes its output over an input (an owner of the same size that
    // nothing reads after this step, and that no other input of the step shares). The
    // output then continues the input's region: one range for the whole chain.
    let mut region: Vec<usize> = (0..temps.len()).collect();
    let mut region_last = last.clone();
    for (k, s) in steps.iter_mut().enumerate() {
        s.in_place = None;
        for &i in &s.in_place_candidates {
            let (Some(Some(Slot::Temp(x))), &[o]) = (s.inputs.get(i).copied(), s.outputs.as_slice()) else { continue };
            let shared = s.inputs.iter().enumerate().any(|(j, sl)| j != i && matches!(sl, Some(Slot::Temp(y)) if root[*y] == Some(x)));
            if s.view || root[x] != Some(x) || last[x] != k || words(x) != words(o) || shared {
                continue;
            }
            region[o] = region[x];
            region_last[region[x]] = last[o];
            s.in_place = Some((i, (0..temps.len()).filter(|&m| root[m] == Some(x)).collect()));
            break;
        }
    }
    // Concats in place: inputs written by their producers straight into the output's
    // range (each an owner read by nothing after the Concat, not part of an in-place
    // chain, at a word-aligned offset); the output's range then starts at the first
    // producer.
    let mut inside: Vec<Option<(usize, usize)>> = vec![None; temps.len()];
    let mut first = def.clone();
    for (k, s) in steps.iter_mut().enumerate() {
        s.concat_in_place = false;
        let (Some(parts), &[o]) = (&s.concat_parts, s.outputs.as_slice()) else { continue };
        let xs: Vec<usize> = s.inputs.iter().filter_map(|sl| match sl {
            Some(Slot::Temp(t)) => Some(*t),
            _ => None,
        }).collect();
        let distinct = xs.iter().enumerate().all(|(i, x)| !xs[..i].contains(x));
        let ok = xs.len() == s.inputs.len()
            && distinct
            && xs.iter().zip(parts).all(|(&x, &at)| root[x] == Some(x) && last[x] == k && region[x] == x && inside[x].is_none() && at % 8 == 0 && !region.iter().enumerate().any(|(t, &r)| r == x && t != x));
        if !ok || region[o] != o {
            continue;
        }
        for (&x, &at) in xs.iter().zip(parts) {
            inside[x] = Some((o, at / 8));
            first[o] = first[o].min(def[x]);
        }
        s.concat_in_place = true;
    }
    let heads: Vec<usize> = owners.iter().copied().filter(|&t| region[t] == t && inside[t].is_none()).collect();
    let spans: Vec<Span> = heads.iter().map(|&t| Span { first: first[t], last: region_last[t], size: words(t) }).collect();
    let (offsets, arena_words) = place(&spans, &line_alignment);
    let mut offset_of: Vec<Option<usize>> = vec![None; temps.len()];
    for (&t, offset) in heads.iter().zip(offsets) {
        offset_of[t] = Some(offset);
    }
    for &t in &owners {
        offset_of[t] = offset_of[region[t]];
    }
    for &t in &owners {
        if let Some((o, at)) = inside[t] {
            offset_of[t] = offset_of[o].map(|base| base + at);
        }
    }
    // Every tensor of a range goes after the range's last reader.
    let mut frees: Vec<Vec<usize>> = vec![vec![]; steps.len()];
    for t in 0..temps.len() {
        if let Some(r) = root[t] {
            if last[r] != usize::MAX {
                frees[last[r]].push(t);
            }
        }
    }
    // Figures: the lower bound is the largest total alive at one step.
    let mut alive = vec![0u64; steps.len()];
    for &t in &heads {
        let end = region_last[t].min(steps.len().saturating_sub(1));
        for a in alive.iter_mut().take(end + 1).skip(first[t]) {
            *a += words(t) as u64 * 8;
        }
    }
    let memory = MemoryPlan {
        planned: arena_words as u64 * 8,
        lower_bound: alive.iter().copied().max().unwrap_or(0),
        unshared: owners.iter().map(|&t| words(t) as u64 * 8).sum(),
        in_place: steps.iter().filter(|s| s.in_place.is_some() || s.concat_in_place).count(),
    };
    (offset_of, arena_words, frees, memory)
}

/// Where each input of a Concat starts in its output (bytes), when the output is the
/// inputs back to back: every dim before the axis is 1 (the axis is where the first
/// input's dims differ from the output's). `None` otherwise, or for a single input.
fn back_to_back(spec: &Specialized, inputs: &[Option<ValueId>], output: ValueId) -> Option<Vec<usize>> {
    let out = spec.ty(output);
    let tys: Vec<&kiln_ops::TensorType> = inputs.iter().map(|v| v.map(|v| spec.ty(v))).collect::<Option<_>>()?;
    let axis = out.dims.iter().zip(&tys.first()?.dims).position(|(a, b)| a != b)?;
    if tys.len() < 2 || out.dims[..axis].iter().product::<usize>() != 1 || tys.iter().any(|t| t.dtype != out.dtype || t.dims.iter().product::<usize>() == 0) {
        return None;
    }
    let mut at = 0;
    Some(tys.iter().map(|t| {
        let start = at;
        at += t.dims.iter().product::<usize>() * t.dtype.size();
        start
    }).collect())
}

/// Ranges of 512 bytes or more start on a 64-byte line (sizes in 8-byte words).
fn line_alignment(words: usize) -> usize {
    if words >= 64 {
        8
    } else {
        1
    }
}
