//! The GPU execution plan of one specialisation: every kernel generated, validated and
//! compiled once; weights uploaded once per session; per-run buffers and bind groups
//! allocated once per concurrent runner and reused. A run is one command encoder, one
//! compute pass and one submit, with no readback before the outputs.
use super::resident::Resident;
use super::convert::{from_gpu, to_gpu};
use super::{half, GpuContext, Pipeline};
use crate::error::poisoned;
use crate::arena::MemoryPlan;
use kiln_ops::infer::Specialized;
use crate::{Result, RuntimeError};
use kiln_graph::{DType, Graph, Tensor, ValueId};
use kiln_ops::infer::Step;
use kiln_ops::wgsl::{Binding, HalfStorage, Halves};
use kiln_ops::{Op, OpError, TensorType, TuneValues, WgslProgram};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where a kernel binding's buffer comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Buf {
    /// A constant uploaded with the plan (index into `GpuPlan::consts`).
    Const(usize),
    /// A per-run buffer (index into `GpuPlan::runs`, which says where it lives).
    Run(usize),
}

struct PlannedDispatch {
    label: String,
    pipeline: Arc<Pipeline>,
    bindings: Vec<Buf>,
    workgroups: [u32; 3],
}

/// A dispatch before its pipeline exists (the memory plan may change its access modes).
struct PendingDispatch {
    label: String,
    source: String,
    entry: String,
    read_only: Vec<bool>,
    bindings: Vec<Buf>,
    workgroups: [u32; 3],
}

/// Where a per-run buffer lives: a range of one device buffer of `ExecState::buffers`.
#[derive(Clone, Copy, Debug)]
struct Loc {
    buffer: usize,
    offset: u64,
    size: u64,
}

enum OutputSource {
    Buffer(usize, TensorType),
    /// A buffer of halves (f16 storage, or written by a narrowing kernel).
    Halves(usize, TensorType),
    Const(Tensor),
    Input(usize),
}

/// Weights uploaded to one device, shared by every specialisation of a session.
pub(crate) type WeightCache = Mutex<HashMap<ValueId, Arc<wgpu::Buffer>>>;

pub(crate) struct GpuPlan {
    ctx: Arc<GpuContext>,
    consts: Vec<Arc<wgpu::Buffer>>,
    /// Sizes in bytes of the device buffers of a runner.
    buffer_sizes: Vec<u64>,
    /// Where each per-run buffer lives.
    runs: Vec<Loc>,
    /// (graph input index, run buffer, name) of every input the kernels read; f16
    /// inputs go to a buffer of halves that a widening kernel reads (see `half.rs`).
    inputs: Vec<(usize, usize, String)>,
    dispatches: Vec<PlannedDispatch>,
    outputs: Vec<OutputSource>,
    /// (run buffer, node name, op type) of every node whose kernels report bad data.
    statuses: Vec<(usize, String, String)>,
    /// Device memory of the per-run buffers (bytes): planned, lower bound, unshared.
    pub memory: MemoryPlan,
    pool: Mutex<Vec<ExecState>>,
}

/// Bytes of one node's status word: [flag, value, bound, unused].
const STATUS_BYTES: u64 = 16;

struct ExecState {
    buffers: Vec<wgpu::Buffer>,
    bind_groups: Vec<wgpu::BindGroup>,
    staging: Vec<Option<wgpu::Buffer>>,
    /// Every status word, copied after the pass (one readback with the outputs).
    status_staging: Option<wgpu::Buffer>,
}

/// Run buffers that live beyond the dispatches that bind them: graph inputs are written
/// before the first dispatch, graph outputs (and status words) read after the last.
#[derive(Default)]
struct Pinned {
    from_start: Vec<usize>,
    to_end: Vec<usize>,
}

/// The first and last dispatch during which each of `n` run buffers holds data (None:
/// never used); `dispatches.len()` stands for the readback after the pass.
fn spans(dispatches: &[PendingDispatch], n: usize, pinned: &Pinned) -> Vec<Option<(usize, usize)>> {
    let mut span: Vec<Option<(usize, usize)>> = vec![None; n];
    for (k, d) in dispatches.iter().enumerate() {
        for b in &d.bindings {
            if let Buf::Run(r) = b {
                span[*r] = Some(span[*r].map_or((k, k), |(a, _)| (a, k)));
            }
        }
    }
    for &r in &pinned.from_start {
        span[r] = Some((0, span[r].map_or(0, |(_, b)| b)));
    }
    for &r in &pinned.to_end {
        span[r] = Some((span[r].map_or(0, |(a, _)| a), dispatches.len()));
    }
    span
}

/// GPU memory plan: run buffers in `shareable` (outputs of kernels that write every
/// element) and graph inputs, when bound once per dispatch, get ranges of one arena buffer, placed by lifetime
/// like the CPU's intermediates (`crate::arena`), at the adapter's storage offset
/// alignment; every other run buffer gets its own. A dispatch of one pass may then read
/// and write one device buffer (different ranges); wgpu orders dispatches that write a
/// buffer after earlier uses of it, so reuse is safe. When the arena would exceed
/// `max_arena` bytes, buffers are shared whole instead ([`share_buffers`]).
/// Returns where each run buffer lives and the device buffers' sizes.
fn plan_runs(dispatches: &[PendingDispatch], sizes: &[u64], shareable: &std::collections::HashSet<usize>, pinned: &Pinned, align: u64, max_arena: u64) -> (Vec<Loc>, Vec<u64>) {
    let span = spans(dispatches, sizes.len(), pinned);
    let mut twice = std::collections::HashSet::new();
    for d in dispatches {
        for (i, b) in d.bindings.iter().enumerate() {
            if let Buf::Run(r) = b {
                if d.bindings[..i].contains(b) {
                    twice.insert(*r);
                }
            }
        }
    }
    let eligible = |r: usize| shareable.contains(&r) || pinned.from_start.contains(&r);
    let arena: Vec<usize> = (0..sizes.len()).filter(|&r| eligible(r) && span[r].is_some() && !twice.contains(&r)).collect();
    if log::log_enabled!(log::Level::Debug) {
        for r in (0..sizes.len()).filter(|r| !arena.contains(r)) {
            log::debug!("GPU run buffer {r} ({} bytes) has its own buffer: eligible {}, bound twice by a dispatch {}", sizes[r], eligible(r), twice.contains(&r));
        }
    }
    let placed: Vec<crate::arena::Span> = arena
        .iter()
        .map(|&r| {
            let (first, last) = span[r].expect("arena buffers are bound");
            crate::arena::Span { first, last, size: sizes[r] as usize }
        })
        .collect();
    let (offsets, total) = crate::arena::place(&placed, &|_| align.max(4) as usize);
    if arena.is_empty() || total as u64 > max_arena {
        let (physical, phys_sizes) = share_buffers(&span, sizes, shareable);
        let runs = (0..sizes.len()).map(|r| Loc { buffer: physical[r], offset: 0, size: sizes[r] }).collect();
        return (runs, phys_sizes);
    }
    let mut runs: Vec<Option<Loc>> = vec![None; sizes.len()];
    for (&r, &offset) in arena.iter().zip(&offsets) {
        runs[r] = Some(Loc { buffer: 0, offset: offset as u64, size: sizes[r] });
    }
    let mut buffer_sizes = vec![total as u64];
    let runs = runs
        .into_iter()
        .enumerate()
        .map(|(r, loc)| {
            loc.unwrap_or_else(|| {
                buffer_sizes.push(sizes[r]);
                Loc { buffer: buffer_sizes.len() - 1, offset: 0, size: sizes[r] }
            })
        })
        .collect();
    (runs, buffer_sizes)
}

/// Gives read-only bindings `read_write` access where the same dispatch writes another
/// range of their device buffer (wgpu allows no read-only and writable use of one
/// buffer in a dispatch); rewrites the kernel's declaration to match.
fn widen_access(d: &mut PendingDispatch, runs: &[Loc]) -> Result<()> {
    let buffer = |b: &Buf| match b {
        Buf::Run(r) => Some(runs[*r].buffer),
        Buf::Const(_) => None,
    };
    let written: Vec<usize> = d.bindings.iter().zip(&d.read_only).filter(|(_, ro)| !**ro).filter_map(|(b, _)| buffer(b)).collect();
    for i in 0..d.bindings.len() {
        if d.read_only[i] && buffer(&d.bindings[i]).is_some_and(|p| written.contains(&p)) {
            let from = format!("@binding({i}) var<storage, read>");
            if !d.source.contains(&from) {
                return Err(RuntimeError::Gpu(format!("kernel '{}': binding {i} is not declared as `{from}`", d.label)));
            }
            d.source = d.source.replacen(&from, &format!("@binding({i}) var<storage, read_write>"), 1);
            d.read_only[i] = false;
        }
    }
    Ok(())
}

/// GPU memory plan (fallback): run buffers in `shareable` whose uses (first to last dispatch that
/// binds them) do not overlap share one device buffer, largest first, best fit; the
/// others keep their own. Returns each run buffer's physical buffer and their sizes.
/// Dispatches of one pass are ordered, and wgpu orders a write after earlier reads of the
/// same buffer, so reuse is safe.
fn share_buffers(span: &[Option<(usize, usize)>], sizes: &[u64], shareable: &std::collections::HashSet<usize>) -> (Vec<usize>, Vec<u64>) {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&r| (std::cmp::Reverse(sizes[r]), r));
    let mut physical = vec![0usize; sizes.len()];
    let mut phys_sizes: Vec<u64> = vec![];
    let mut tenants: Vec<Option<Vec<(usize, usize)>>> = vec![];
    for r in order {
        let fit = match (shareable.contains(&r), span[r]) {
            (true, Some((a, b))) => (0..phys_sizes.len())
                .filter(|&p| phys_sizes[p] >= sizes[r])
                .filter(|&p| tenants[p].as_ref().is_some_and(|t| t.iter().all(|&(x, y)| y < a || b < x)))
                .min_by_key(|&p| phys_sizes[p]),
            _ => None,
        };
        let p = fit.unwrap_or_else(|| {
            phys_sizes.push(sizes[r]);
            tenants.push(if shareable.contains(&r) && span[r].is_some() { Some(vec![]) } else { None });
            phys_sizes.len() - 1
        });
        if let (Some(t), Some(s)) = (tenants[p].as_mut(), span[r]) {
            t.push(s);
        }
        physical[r] = p;
    }
    (physical, phys_sizes)
}

/// The largest total of run buffers alive (bound by an earlier and by a later or the
/// current dispatch) at one dispatch: the lower bound of any plan, from the logical
/// buffers before sharing.
fn live_peak(dispatches: &[PendingDispatch], sizes: &[u64], pinned: &Pinned) -> u64 {
    let span = spans(dispatches, sizes.len(), pinned);
    (0..=dispatches.len()).map(|k| sizes.iter().zip(&span).filter(|(_, s)| s.is_some_and(|(a, b)| a <= k && k <= b)).map(|(z, _)| *z).sum::<u64>()).max().unwrap_or(0)
}

fn gpu_bytes(t: &TensorType) -> u64 {
    (t.len() as u64 * 4).max(4)
}

/// Bytes read back for an output that lives in a buffer.
fn output_bytes(o: &OutputSource) -> Option<u64> {
    match o {
        OutputSource::Buffer(_, ty) => Some(gpu_bytes(ty)),
        OutputSource::Halves(_, ty) => Some(half::packed_bytes(ty.len())),
        _ => None,
    }
}

/// The GPU's kernel for one step, generated for its concrete types: `Ok(None)` when the
/// op has no WGSL kernel, an error when the kernel cannot be generated for these inputs.
pub(crate) fn generate(op: &dyn Op, spec: &Specialized, step: &Step) -> std::result::Result<Option<WgslProgram>, OpError> {
    let Some(kernel) = op.wgsl() else { return Ok(None) };
    if step.inputs.iter().flatten().chain(&step.outputs).any(|&v| spec.ty(v).dtype.is_string()) {
        return Err(OpError::Unsupported("string tensors stay on the host".into()));
    }
    let out_types: Vec<TensorType> = step.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
    kernel.generate(&spec.args(&step.inputs), &out_types, &TuneValues::default()).map(Some)
}

/// The f16 values of a plan stored as halves (`array<f16>`, 2 bytes each) rather than
/// as f32: on adapters with SHADER_F16, each f16 value that is not a constant and whose
/// producer and every consumer can bind halves ([`HalfStorage`]). A view and a
/// `Together` kernel tie their input 0 and output 0: both are halves or neither is.
fn half_values(graph: &Graph, ops: &[Box<dyn Op>], spec: &Specialized) -> HashSet<ValueId> {
    let n = graph.values.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut v: usize) -> usize {
        while parent[v] != v {
            parent[v] = parent[parent[v]];
            v = parent[v];
        }
        v
    }
    let mut ok = vec![false; n];
    for &v in &graph.inputs {
        ok[v] = spec.ty(v).dtype == DType::F16;
    }
    for step in &spec.steps {
        for &o in &step.outputs {
            ok[o] = spec.ty(o).dtype == DType::F16 && !spec.constants.contains_key(&o);
        }
    }
    for step in &spec.steps {
        let op = &ops[step.node];
        let how = if op.is_view() { HalfStorage::Together } else { op.wgsl().map_or(HalfStorage::No, |k| k.half_storage()) };
        match how {
            HalfStorage::Each => {}
            HalfStorage::No => {
                if step.inputs.iter().flatten().chain(&step.outputs).any(|&v| spec.ty(v).dtype == DType::F16) {
                    let n = &graph.nodes[step.node];
                    log::debug!("node '{}' ({}) binds f16 values as f32 only", n.name, n.op_type);
                }
                step.inputs.iter().flatten().chain(&step.outputs).for_each(|&v| ok[v] = false)
            }
            HalfStorage::Together => {
                let (x, y) = (step.inputs.first().copied().flatten(), step.outputs.first().copied());
                if let (Some(x), Some(y)) = (x, y) {
                    let (rx, ry) = (root(&mut parent, x), root(&mut parent, y));
                    parent[rx] = ry;
                }
                for &v in step.inputs.iter().skip(1).flatten().chain(step.outputs.iter().skip(1)) {
                    ok[v] = false;
                }
            }
        }
    }
    // A group is halves only if every member may be.
    let mut group_ok: HashMap<usize, bool> = HashMap::new();
    let touched: HashSet<ValueId> = graph.inputs.iter().copied().chain(spec.steps.iter().flat_map(|s| s.inputs.iter().flatten().copied().chain(s.outputs.iter().copied()))).collect();
    for &v in &touched {
        let r = root(&mut parent, v);
        let e = group_ok.entry(r).or_insert(true);
        *e &= ok[v];
    }
    touched.into_iter().filter(|&v| ok[v] && group_ok[&root(&mut parent, v)]).collect()
}

/// The kernel of a step some of whose f16 values are stored as halves.
fn generate_halves(op: &dyn Op, spec: &Specialized, step: &Step, halves: &HashSet<ValueId>) -> std::result::Result<WgslProgram, OpError> {
    let kernel = op.wgsl().ok_or_else(|| OpError::Unsupported("no WGSL kernel".into()))?;
    let out_types: Vec<TensorType> = step.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
    let which = Halves {
        inputs: step.inputs.iter().map(|v| v.is_some_and(|v| halves.contains(&v))).collect(),
        outputs: step.outputs.iter().map(|v| halves.contains(v)).collect(),
    };
    kernel.generate_halves(&spec.args(&step.inputs), &out_types, &TuneValues::default(), &which)
}

impl GpuPlan {
    /// The plan of `spec`'s steps; `programs[i]` is step `i`'s kernel when placement
    /// already generated it (generated here otherwise).
    pub fn build(
        ctx: Arc<GpuContext>,
        graph: &Graph,
        ops: &[Box<dyn Op>],
        spec: &Specialized,
        weights: &WeightCache,
        mut programs: Vec<Option<WgslProgram>>,
    ) -> Result<GpuPlan> {
        let max_binding = ctx.limits.max_storage_buffer_binding_size as u64;
        let mut consts: Vec<Arc<wgpu::Buffer>> = vec![];
        let mut run_sizes: Vec<u64> = vec![];
        // Run buffers that may share memory with others (outputs of kernels that write
        // every element); graph outputs are taken out again below.
        let mut shareable: std::collections::HashSet<usize> = Default::default();
        let mut where_is: HashMap<ValueId, Buf> = HashMap::new();
        let check_size = |bytes: u64, what: &str| -> Result<()> {
            if bytes > max_binding {
                return Err(RuntimeError::Gpu(format!(
                    "{what} needs a {bytes}-byte buffer; this adapter binds at most {max_binding} bytes \
                     (max_storage_buffer_binding_size); run it on the CPU"
                )));
            }
            Ok(())
        };
        // String tensors have no bytes: placement keeps every step that touches one on
        // the host, so a GPU plan never sees one (a value here would be a placement bug).
        if let Some(&v) = graph.inputs.iter().chain(&graph.outputs).chain(spec.steps.iter().flat_map(|s| s.inputs.iter().flatten().chain(&s.outputs))).find(|&&v| spec.ty(v).dtype.is_string()) {
            return Err(RuntimeError::Gpu(format!("value '{}' is a string tensor, which a GPU buffer cannot hold; string tensors stay on the host", graph.values[v].name)));
        }
        let halves = if ctx.f16 { half_values(graph, ops, spec) } else { HashSet::new() };
        if !halves.is_empty() {
            let f16s = spec.steps.iter().flat_map(|s| &s.outputs).filter(|&&o| spec.ty(o).dtype == DType::F16).count();
            log::info!("GPU plan: {} f16 values stored as halves ({} f16 step outputs in all)", halves.len(), f16s);
        }
        // Bytes of a value's run buffer.
        let bytes_of = |v: ValueId| if halves.contains(&v) { half::packed_bytes(spec.ty(v).len()) } else { gpu_bytes(spec.ty(v)) };
        let mut inputs = vec![];
        let mut dispatches = vec![];
        for (i, &v) in graph.inputs.iter().enumerate() {
            let ty = spec.ty(v);
            let name = &graph.values[v].name;
            check_size(gpu_bytes(ty), &format!("input '{name}'"))?;
            if halves.contains(&v) {
                // Uploaded as halves and kept so.
                where_is.insert(v, Buf::Run(run_sizes.len()));
                run_sizes.push(bytes_of(v));
                inputs.push((i, run_sizes.len() - 1, name.clone()));
                continue;
            }
            where_is.insert(v, Buf::Run(run_sizes.len()));
            run_sizes.push(gpu_bytes(ty));
            if ty.dtype == DType::F16 && ctx.f16 {
                let (source, workgroups) = half::widen(ty.len());
                let label = format!("input '{name}': f16 to f32");
                let bindings = vec![Buf::Run(run_sizes.len()), Buf::Run(run_sizes.len() - 1)];
                dispatches.push(PendingDispatch { label, source, entry: "main".into(), read_only: vec![true, false], bindings, workgroups });
                run_sizes.push(half::packed_bytes(ty.len()));
            }
            inputs.push((i, run_sizes.len() - 1, name.clone()));
        }
        let const_buf = |v: ValueId, consts: &mut Vec<Arc<wgpu::Buffer>>| -> Result<Buf> {
            let t = &spec.constants[&v];
            let name = &graph.values[v].name;
            check_size(gpu_bytes(&TensorType::new(t.dtype(), t.dims())), &format!("constant '{name}'"))?;
            let is_weight = graph.initializers.contains_key(&v);
            let cached = if is_weight { weights.lock().map_err(|_| poisoned())?.get(&v).cloned() } else { None };
            let buf = match cached {
                Some(b) => b,
                None => {
                    let mut bytes = to_gpu(t, &format!("constant '{name}'"))?;
                    if bytes.is_empty() {
                        bytes = vec![0; 4];
                    }
                    let b = Arc::new(wgpu::util::DeviceExt::create_buffer_init(
                        &ctx.device,
                        &wgpu::util::BufferInitDescriptor {
                            label: Some(name),
                            contents: &bytes,
                            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                        },
                    ));
                    if is_weight {
                        weights.lock().map_err(|_| poisoned())?.insert(v, b.clone());
                    }
                    b
                }
            };
            consts.push(buf);
            Ok(Buf::Const(consts.len() - 1))
        };
        let mut statuses: Vec<(usize, String, String)> = vec![];
        programs.resize_with(spec.steps.len(), || None);
        for (step, program) in spec.steps.iter().zip(programs) {
            let node = &graph.nodes[step.node];
            let op = &ops[step.node];
            if op.is_view() {
                let src = step.inputs.first().copied().flatten().ok_or_else(|| {
                    RuntimeError::node(node, kiln_ops::OpError::input(0, "a view op needs its data input"))
                })?;
                let b = match where_is.get(&src) {
                    Some(b) => *b,
                    None => const_buf(src, &mut consts)?,
                };
                where_is.insert(step.outputs[0], b);
                // Extra outputs of views (Dropout's mask) are not supported on the GPU.
                continue;
            }
            let touches_halves = step.inputs.iter().flatten().chain(&step.outputs).any(|v| halves.contains(v));
            let program = match program {
                _ if touches_halves => generate_halves(op.as_ref(), spec, step, &halves).map_err(|e| RuntimeError::node(node, e))?,
                Some(p) => p,
                None => generate(op.as_ref(), spec, step)
                    .map_err(|e| RuntimeError::node(node, e))?
                    .ok_or_else(|| RuntimeError::Unsupported {
                        node: format!("node '{}' ({})", node.name, node.op_type),
                        what: "this op has no GPU kernel yet; run the model on the CPU (--device cpu)".into(),
                    })?,
            };
            for (k, &o) in step.outputs.iter().enumerate() {
                check_size(bytes_of(o), &format!("output {k} of node '{}' ({})", node.name, node.op_type))?;
                where_is.insert(o, Buf::Run(run_sizes.len()));
                if op.overwrites_outputs() {
                    shareable.insert(run_sizes.len());
                }
                run_sizes.push(bytes_of(o));
            }
            let scratch: Vec<Buf> = program
                .scratch_bytes
                .iter()
                .map(|&b| {
                    run_sizes.push(b.max(4));
                    Buf::Run(run_sizes.len() - 1)
                })
                .collect();
            let mut status: Option<Buf> = None;
            for d in &program.dispatches {
                let mut bindings = vec![];
                let mut read_only = vec![];
                for b in &d.bindings {
                    let (buf, ro) = match *b {
                        Binding::Input(i) => {
                            let v = step.inputs.get(i).copied().flatten().ok_or_else(|| {
                                RuntimeError::node(node, kiln_ops::OpError::input(i, "the kernel binds an omitted input"))
                            })?;
                            let buf = match where_is.get(&v) {
                                Some(b) => *b,
                                None => {
                                    let b = const_buf(v, &mut consts)?;
                                    where_is.insert(v, b);
                                    b
                                }
                            };
                            (buf, true)
                        }
                        Binding::Output(i) => (where_is[&step.outputs[i]], false),
                        Binding::Scratch(i) => (
                            *scratch.get(i).ok_or_else(|| {
                                RuntimeError::node(node, kiln_ops::OpError::invalid(format!("kernel binds missing scratch {i}")))
                            })?,
                            false,
                        ),
                        Binding::Status => {
                            let buf = *status.get_or_insert_with(|| {
                                run_sizes.push(STATUS_BYTES);
                                statuses.push((run_sizes.len() - 1, node.name.clone(), node.op_type.clone()));
                                Buf::Run(run_sizes.len() - 1)
                            });
                            (buf, false)
                        }
                    };
                    bindings.push(buf);
                    read_only.push(ro);
                }
                let label = format!("{} ({}): {}", node.name, node.op_type, d.label);
                if d.workgroups.iter().any(|&w| w > ctx.limits.max_compute_workgroups_per_dimension) {
                    return Err(RuntimeError::Gpu(format!(
                        "kernel '{label}' launches {:?} workgroups; this adapter allows {} per dimension",
                        d.workgroups, ctx.limits.max_compute_workgroups_per_dimension
                    )));
                }
                let (source, entry) = (d.source.clone(), d.entry_point.clone());
                dispatches.push(PendingDispatch { label, source, entry, read_only, bindings, workgroups: d.workgroups });
            }
        }
        let mut outputs = vec![];
        for &o in &graph.outputs {
            if let Some(t) = spec.constants.get(&o) {
                outputs.push(OutputSource::Const(t.clone()));
            } else if let Some(i) = graph.inputs.iter().position(|&v| v == o) {
                outputs.push(OutputSource::Input(i));
            } else {
                match where_is.get(&o) {
                    Some(Buf::Run(b)) if halves.contains(&o) => outputs.push(OutputSource::Halves(*b, spec.ty(o).clone())),
                    Some(Buf::Run(b)) if spec.ty(o).dtype == DType::F16 && ctx.f16 => {
                        let ty = spec.ty(o).clone();
                        let (source, workgroups) = half::narrow(ty.len());
                        let label = format!("output '{}': f32 to f16", graph.values[o].name);
                        let bindings = vec![Buf::Run(*b), Buf::Run(run_sizes.len())];
                        dispatches.push(PendingDispatch { label, source, entry: "main".into(), read_only: vec![true, false], bindings, workgroups });
                        run_sizes.push(half::packed_bytes(ty.len()));
                        outputs.push(OutputSource::Halves(run_sizes.len() - 1, ty));
                    }
                    Some(Buf::Run(b)) => outputs.push(OutputSource::Buffer(*b, spec.ty(o).clone())),
                    Some(Buf::Const(_)) | None => {
                        let t = spec.constants.get(&o).cloned().unwrap_or_else(|| Tensor::zeros(spec.ty(o).dtype, &spec.ty(o).dims));
                        outputs.push(OutputSource::Const(t))
                    }
                }
            }
        }
        let mut pinned = Pinned { from_start: inputs.iter().map(|(_, r, _)| *r).collect(), to_end: statuses.iter().map(|(r, _, _)| *r).collect() };
        for o in &outputs {
            if let OutputSource::Buffer(b, _) | OutputSource::Halves(b, _) = o {
                pinned.to_end.push(*b);
            }
        }
        let lower_bound = live_peak(&dispatches, &run_sizes, &pinned);
        let align = ctx.limits.min_storage_buffer_offset_alignment as u64;
        let (runs, buffer_sizes) = plan_runs(&dispatches, &run_sizes, &shareable, &pinned, align, ctx.limits.max_buffer_size);
        let memory = MemoryPlan { planned: buffer_sizes.iter().sum(), lower_bound, unshared: run_sizes.iter().sum(), in_place: 0 };
        log::debug!("GPU memory plan: {} run buffers in {} device buffers: {memory:?}", run_sizes.len(), buffer_sizes.len());
        // Pipelines compile on the rayon pool's threads at once (a driver compiles each on
        // the calling thread; the context's error scopes are per thread).
        use rayon::prelude::*;
        let dispatches = dispatches
            .into_par_iter()
            .map(|mut d| {
                widen_access(&mut d, &runs)?;
                let pipeline = ctx.pipeline(&d.label, &d.source, &d.entry, &d.read_only)?;
                Ok(PlannedDispatch { label: d.label, pipeline, bindings: d.bindings, workgroups: d.workgroups })
            })
            .collect::<Result<Vec<_>>>()?;
        ctx.take_error()?;
        Ok(GpuPlan { ctx, consts, buffer_sizes, runs, inputs, dispatches, outputs, statuses, memory, pool: Mutex::default() })
    }

    /// The kernels this plan dispatches (for artifacts).
    pub fn kernel_records(&self) -> Vec<super::KernelRecord> {
        self.dispatches.iter().map(|d| d.pipeline.record.clone()).collect()
    }

    pub fn dispatch_count(&self) -> usize {
        self.dispatches.iter().filter(|d| d.workgroups.iter().all(|&w| w > 0)).count()
    }

    fn new_state(&self) -> ExecState {
        let dev = &self.ctx.device;
        let buffers: Vec<wgpu::Buffer> = self
            .buffer_sizes
            .iter()
            .map(|&size| {
                dev.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let bind_groups = self
            .dispatches
            .iter()
            .map(|d| {
                let entries: Vec<wgpu::BindGroupEntry> = d
                    .bindings
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: match b {
                            Buf::Const(c) => self.consts[*c].as_entire_binding(),
                            Buf::Run(r) => {
                                let loc = self.runs[*r];
                                wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &buffers[loc.buffer], offset: loc.offset, size: std::num::NonZeroU64::new(loc.size) })
                            }
                        },
                    })
                    .collect();
                dev.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&d.label), layout: &d.pipeline.layout, entries: &entries })
            })
            .collect();
        let staging = self
            .outputs
            .iter()
            .map(|o| match o {
                OutputSource::Buffer(_, ty) | OutputSource::Halves(_, ty) => Some(dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("staging"),
                    size: output_bytes(o).unwrap_or(gpu_bytes(ty)),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })),
                _ => None,
            })
            .collect();
        let status_staging = (!self.statuses.is_empty()).then(|| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("status staging"),
                size: STATUS_BYTES * self.statuses.len() as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        ExecState { buffers, bind_groups, staging, status_staging }
    }

    /// Runs once: uploads inputs, one pass, one submit, reads outputs back.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<(Vec<Tensor>, usize)> {
        self.run_timed(inputs, None)
    }

    /// [`GpuPlan::run`], filling `timing` when given (host phases, and every kernel's
    /// GPU time where the adapter has timestamp queries).
    pub fn run_timed(&self, inputs: &[&Tensor], timing: Option<&mut GpuTiming>) -> Result<(Vec<Tensor>, usize)> {
        self.run_pooled(inputs, None, timing)
    }

    /// Whether these (graph input, graph output) pairs can stay on the device between
    /// runs ([`GpuPlan::run_carried`]): each output is f32 and written by a kernel, and
    /// no output passes a carried input through.
    pub fn can_carry(&self, pairs: &[(usize, usize)]) -> bool {
        let passed_through = self.outputs.iter().any(|o| matches!(o, OutputSource::Input(i) if pairs.iter().any(|&(pi, _)| pi == *i)));
        !passed_through && pairs.iter().all(|&(_, o)| matches!(self.outputs.get(o), Some(OutputSource::Buffer(_, ty)) if ty.dtype == DType::F32))
    }

    /// [`GpuPlan::run`] with carried state: pair `k`'s input is copied from
    /// `resident.buffers[k]` before the first dispatch (its host tensor in `inputs` is
    /// not read), and its output copied back there after the last, in the same submit;
    /// neither is read back. Those outputs come back as empty placeholders.
    pub fn run_carried(&self, inputs: &[&Tensor], pairs: &[(usize, usize)], resident: &Resident) -> Result<(Vec<Tensor>, usize)> {
        if !self.same_context(resident) {
            return Err(RuntimeError::Gpu("carried state lives on another device than this plan's".into()));
        }
        self.run_pooled(inputs, Some((pairs, resident)), None)
    }

    /// Device buffers for carried state of these dims, on this plan's device.
    pub fn resident(&self, dims: Vec<Vec<usize>>) -> Resident {
        Resident::new(self.ctx.clone(), dims)
    }

    /// Whether `resident` lives on this plan's device.
    pub fn same_context(&self, resident: &Resident) -> bool {
        Arc::ptr_eq(&self.ctx, &resident.ctx)
    }

    fn run_pooled(&self, inputs: &[&Tensor], carry: Option<(&[(usize, usize)], &Resident)>, timing: Option<&mut GpuTiming>) -> Result<(Vec<Tensor>, usize)> {
        let state = self.pool.lock().map_err(|_| poisoned())?.pop();
        let state = match state {
            Some(s) => s,
            None => self.new_state(),
        };
        let result = self.run_with(&state, inputs, carry, timing);
        self.pool.lock().map_err(|_| poisoned())?.push(state);
        result
    }

    fn run_with(&self, st: &ExecState, inputs: &[&Tensor], carry: Option<(&[(usize, usize)], &Resident)>, mut timing: Option<&mut GpuTiming>) -> Result<(Vec<Tensor>, usize)> {
        let ctx = &self.ctx;
        let pairs = carry.map_or(&[][..], |(p, _)| p);
        let carried_output = |o: usize| pairs.iter().position(|&(_, po)| po == o);
        let upload_start = Instant::now();
        for (i, buf, name) in &self.inputs {
            if pairs.iter().any(|&(pi, _)| pi == *i) {
                continue;
            }
            let t = inputs[*i];
            if t.dtype() == DType::F16 && ctx.f16 {
                // Halves as they are; the buffer is padded to whole words.
                let mut bytes = t.bytes().to_vec();
                bytes.resize(half::packed_bytes(t.len()) as usize, 0);
                ctx.queue.write_buffer(&st.buffers[self.runs[*buf].buffer], self.runs[*buf].offset, &bytes);
                continue;
            }
            let bytes = to_gpu(t, &format!("input '{name}'"))?;
            if !bytes.is_empty() {
                ctx.queue.write_buffer(&st.buffers[self.runs[*buf].buffer], self.runs[*buf].offset, &bytes);
            }
        }
        let upload_end = Instant::now();
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln run") });
        if let Some((pairs, res)) = carry {
            for (k, &(i, _)) in pairs.iter().enumerate() {
                let bytes = res.copy_bytes(k);
                if let (Some((_, b, _)), true) = (self.inputs.iter().find(|(ii, _, _)| *ii == i), bytes > 0) {
                    let loc = self.runs[*b];
                    enc.copy_buffer_to_buffer(&res.buffers[k], 0, &st.buffers[loc.buffer], loc.offset, bytes);
                }
            }
        }
        for (b, _, _) in &self.statuses {
            let loc = self.runs[*b];
            enc.clear_buffer(&st.buffers[loc.buffer], loc.offset, Some(loc.size));
        }
        // Dispatches with work, counted (and listed) only when the run is timed: the
        // untimed path allocates nothing per run.
        let live: Vec<usize> = if timing.is_some() { (0..self.dispatches.len()).filter(|&k| !self.dispatches[k].workgroups.contains(&0)).collect() } else { vec![] };
        let stamps = (ctx.timestamps && !live.is_empty()).then(|| Stamps::new(&ctx.device, 2 * live.len()));
        let work = self.dispatches.iter().zip(&st.bind_groups).filter(|(d, _)| !d.workgroups.contains(&0));
        match &stamps {
            // A profile without timestamps inside passes: a pass per dispatch, stamped
            // at its start and end.
            Some(q) if !ctx.timestamps_inside_passes => {
                for (j, (d, bg)) in work.enumerate() {
                    let (set, at) = q.slot(2 * j);
                    let writes = wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(at), end_of_pass_write_index: Some(at + 1) };
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(&d.label), timestamp_writes: Some(writes) });
                    pass.set_pipeline(&d.pipeline.pipeline);
                    pass.set_bind_group(0, bg, &[]);
                    pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
                }
            }
            _ => {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("kiln"), timestamp_writes: None });
                for (j, (d, bg)) in work.enumerate() {
                    if let Some(q) = &stamps {
                        let (set, at) = q.slot(2 * j);
                        pass.write_timestamp(set, at);
                    }
                    pass.set_pipeline(&d.pipeline.pipeline);
                    pass.set_bind_group(0, bg, &[]);
                    pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
                    if let Some(q) = &stamps {
                        let (set, at) = q.slot(2 * j + 1);
                        pass.write_timestamp(set, at);
                    }
                }
            }
        }
        if let Some(q) = &stamps {
            q.resolve(&mut enc);
        }
        for (j, (o, staging)) in self.outputs.iter().zip(&st.staging).enumerate() {
            if let (Some(k), Some((_, res)), OutputSource::Buffer(b, _)) = (carried_output(j), carry, o) {
                let bytes = res.copy_bytes(k);
                if bytes > 0 {
                    enc.copy_buffer_to_buffer(&st.buffers[self.runs[*b].buffer], self.runs[*b].offset, &res.buffers[k], 0, bytes);
                }
                continue;
            }
            if let (OutputSource::Buffer(b, _) | OutputSource::Halves(b, _), Some(s), Some(bytes)) = (o, staging, output_bytes(o)) {
                enc.copy_buffer_to_buffer(&st.buffers[self.runs[*b].buffer], self.runs[*b].offset, s, 0, bytes);
            }
        }
        if let Some(s) = &st.status_staging {
            for (k, (b, _, _)) in self.statuses.iter().enumerate() {
                enc.copy_buffer_to_buffer(&st.buffers[self.runs[*b].buffer], self.runs[*b].offset, s, STATUS_BYTES * k as u64, STATUS_BYTES);
            }
        }
        let submitted = Instant::now();
        let idx = ctx.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(q) = &stamps {
            let tx = tx.clone();
            q.read.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((usize::MAX - 1, r));
            });
        }
        if let Some(s) = &st.status_staging {
            let tx = tx.clone();
            s.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((usize::MAX, r));
            });
        }
        for (k, s) in st.staging.iter().enumerate() {
            if let (Some(s), None) = (s, carried_output(k)) {
                let tx = tx.clone();
                s.map_async(wgpu::MapMode::Read, .., move |r| {
                    let _ = tx.send((k, r));
                });
            }
        }
        drop(tx);
        ctx.device
            .poll(wgpu::PollType::Wait { submission_index: Some(idx), timeout: None })
            .map_err(|e| RuntimeError::Gpu(format!("waiting for the GPU failed: {e}")))?;
        let done = Instant::now();
        for (k, r) in rx.iter() {
            r.map_err(|e| RuntimeError::Gpu(format!("reading output {k} back failed: {e}")))?;
        }
        ctx.take_error()?;
        if let Some(t) = timing.as_deref_mut() {
            t.kernels = match &stamps {
                Some(q) => {
                    let ticks: Vec<u64> = {
                        let view = q.read.get_mapped_range(..).map_err(|e| RuntimeError::Gpu(format!("mapping the timestamps failed: {e}")))?;
                        bytemuck::cast_slice::<u8, u64>(&view[..16 * live.len()]).to_vec()
                    };
                    q.read.unmap();
                    let period = ctx.queue.get_timestamp_period() as f64;
                    let first = ticks.iter().copied().min().unwrap_or(0);
                    let ns = |t: u64| (t.saturating_sub(first) as f64 * period) as u64;
                    live.iter().enumerate().map(|(j, &k)| (self.dispatches[k].label.clone(), ns(ticks[2 * j]), ns(ticks[2 * j + 1]).max(ns(ticks[2 * j])))).collect()
                }
                None => vec![],
            };
            t.gpu_timed = stamps.is_some();
            t.kernel_count = live.len();
            (t.upload, t.submit, t.done) = ((upload_start, upload_end), submitted, done);
        }
        let status_error = self.status_error(st)?;
        let mut outs = vec![];
        for (j, (o, s)) in self.outputs.iter().zip(&st.staging).enumerate() {
            if carried_output(j).is_some() {
                outs.push(Tensor::zeros(DType::F32, &[0]));
                continue;
            }
            outs.push(match (o, s) {
                (OutputSource::Buffer(_, ty), Some(s)) => {
                    let t = {
                        let view = s.get_mapped_range(..).map_err(|e| RuntimeError::Gpu(format!("mapping output failed: {e}")))?;
                        from_gpu(&view, ty.dtype, &ty.dims)?
                    };
                    s.unmap();
                    t
                }
                (OutputSource::Halves(_, ty), Some(s)) => {
                    let t = {
                        let view = s.get_mapped_range(..).map_err(|e| RuntimeError::Gpu(format!("mapping output failed: {e}")))?;
                        Tensor::from_bytes(DType::F16, &ty.dims, &view[..ty.len() * 2])
                            .map_err(|e| RuntimeError::Gpu(format!("reading an f16 output: {e}")))?
                    };
                    s.unmap();
                    t
                }
                (OutputSource::Const(t), _) => t.clone(),
                (OutputSource::Input(i), _) => inputs[*i].clone(),
                _ => unreachable!("staging buffers exist exactly for buffer outputs"),
            });
        }
        if let Some(t) = timing {
            t.readback_end = Instant::now();
        }
        match status_error {
            Some(e) => Err(e),
            None => Ok((outs, 1)),
        }
    }

    /// The first node whose kernels reported bad data in this run, as an error.
    fn status_error(&self, st: &ExecState) -> Result<Option<RuntimeError>> {
        let Some(s) = &st.status_staging else { return Ok(None) };
        let words: Vec<u32> = {
            let view = s.get_mapped_range(..).map_err(|e| RuntimeError::Gpu(format!("mapping the status words failed: {e}")))?;
            bytemuck::cast_slice(&view).to_vec()
        };
        s.unmap();
        for (k, (_, node, op)) in self.statuses.iter().enumerate() {
            let w = &words[4 * k..4 * k + 4];
            let what = match w[0] {
                0 => continue,
                kiln_ops::wgsl::STATUS_OVERFLOW => format!(
                    "a 64-bit integer result of {} and {} does not fit the 32 bits the GPU computes in (found by the GPU kernel); run this model on the CPU",
                    w[1] as i32, w[2] as i32
                ),
                _ => {
                    let (value, bound) = (w[1] as i32, w[2] as i32);
                    format!("index {value} is out of range for an axis of size {bound} (valid: -{bound} to {}; found by the GPU kernel)", bound - 1)
                }
            };
            return Ok(Some(RuntimeError::Node { node: node.clone(), op: op.clone(), error: kiln_ops::OpError::invalid(what) }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatch(bindings: &[usize], read_only: &[bool]) -> PendingDispatch {
        let source = (0..bindings.len())
            .map(|i| format!("@group(0) @binding({i}) var<storage, {}> b{i}: array<f32>;\n", if read_only[i] { "read" } else { "read_write" }))
            .collect();
        PendingDispatch {
            label: "k".into(),
            source,
            entry: "main".into(),
            read_only: read_only.to_vec(),
            bindings: bindings.iter().map(|&r| Buf::Run(r)).collect(),
            workgroups: [1, 1, 1],
        }
    }

    /// input 0 -> 1 -> 2 -> 3 (output), plus 4 = 1 + 1 (bound twice).
    fn chain() -> (Vec<PendingDispatch>, Vec<u64>, std::collections::HashSet<usize>, Pinned) {
        let ds = vec![dispatch(&[0, 1], &[true, false]), dispatch(&[1, 2], &[true, false]), dispatch(&[2, 3], &[true, false]), dispatch(&[1, 1, 4], &[true, true, false])];
        let shareable = [1, 2, 3, 4].into_iter().collect();
        (ds, vec![256, 512, 256, 256, 256], shareable, Pinned { from_start: vec![0], to_end: vec![3] })
    }

    #[test]
    fn arena_ranges_are_disjoint_while_alive_and_reads_widen_where_a_dispatch_writes() {
        let (mut ds, sizes, shareable, pinned) = chain();
        let (runs, buffers) = plan_runs(&ds, &sizes, &shareable, &pinned, 256, u64::MAX);
        // Buffer 4's input (1) is bound twice in one dispatch: 1 stays out of the arena.
        assert_ne!(runs[1].buffer, 0);
        assert!([0, 2, 3, 4].iter().all(|&r| runs[r].buffer == 0 && runs[r].offset % 256 == 0));
        let span = spans(&ds, sizes.len(), &pinned);
        for a in 0..sizes.len() {
            for b in a + 1..sizes.len() {
                let (sa, sb) = (span[a].unwrap(), span[b].unwrap());
                let together = sa.0 <= sb.1 && sb.0 <= sa.1;
                let (la, lb) = (runs[a], runs[b]);
                let apart = la.buffer != lb.buffer || la.offset + la.size <= lb.offset || lb.offset + lb.size <= la.offset;
                assert!(!together || apart, "{a} and {b} overlap: {la:?} {lb:?}");
            }
        }
        assert_eq!(buffers.iter().sum::<u64>(), live_peak(&ds, &sizes, &pinned), "this chain packs to its lower bound");
        // Dispatch 2 reads 2 and writes 3, both in the arena: its read becomes read_write.
        widen_access(&mut ds[2], &runs).unwrap();
        assert_eq!(ds[2].read_only, vec![false, false]);
        assert!(ds[2].source.contains("@binding(0) var<storage, read_write>"));
        // Dispatch 3 reads buffer 1 (not in the arena): unchanged.
        widen_access(&mut ds[3], &runs).unwrap();
        assert_eq!(ds[3].read_only, vec![true, true, false]);
    }

    #[test]
    fn an_arena_too_large_falls_back_to_whole_shared_buffers() {
        let (ds, sizes, shareable, pinned) = chain();
        let (runs, buffers) = plan_runs(&ds, &sizes, &shareable, &pinned, 256, 100);
        assert!(runs.iter().all(|l| l.offset == 0));
        assert!(buffers.iter().sum::<u64>() < sizes.iter().sum::<u64>(), "whole buffers are still shared: {buffers:?}");
        // A mislabelled kernel declaration is an error, not a silent mismatch.
        let mut d = dispatch(&[0, 1], &[true, false]);
        d.source = d.source.replace("var<storage, read> b0", "var<storage,read> b0");
        let runs = vec![Loc { buffer: 0, offset: 0, size: 4 }, Loc { buffer: 0, offset: 256, size: 4 }];
        assert!(widen_access(&mut d, &runs).is_err());
    }
}

/// What a timed run measured: host instants of its phases and each kernel's GPU time.
#[derive(Clone, Debug)]
pub struct GpuTiming {
    /// Writing the inputs to the device.
    pub upload: (Instant, Instant),
    /// The submit, and the moment the wait for it returned.
    pub submit: Instant,
    pub done: Instant,
    /// When the outputs were read back and converted.
    pub readback_end: Instant,
    /// Per kernel: its label (`node (op): kernel`) and GPU start and end, nanoseconds
    /// after the first kernel's start (empty without timestamp queries).
    pub kernels: Vec<(String, u64, u64)>,
    /// Whether `kernels` holds GPU timestamps.
    pub gpu_timed: bool,
    /// Kernels the run dispatched.
    pub kernel_count: usize,
}

impl Default for GpuTiming {
    fn default() -> Self {
        let now = Instant::now();
        GpuTiming { upload: (now, now), submit: now, done: now, readback_end: now, kernels: vec![], gpu_timed: false, kernel_count: 0 }
    }
}

/// Timestamp query sets (wgpu allows 4096 queries per set), their resolve buffers and
/// one readback buffer.
struct Stamps {
    sets: Vec<(wgpu::QuerySet, wgpu::Buffer, u32)>,
    read: wgpu::Buffer,
}

const QUERIES_PER_SET: usize = 4096;

impl Stamps {
    fn new(dev: &wgpu::Device, count: usize) -> Stamps {
        let sets = (0..count.div_ceil(QUERIES_PER_SET))
            .map(|i| {
                let n = (count - i * QUERIES_PER_SET).min(QUERIES_PER_SET) as u32;
                let set = dev.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile timestamps"), ty: wgpu::QueryType::Timestamp, count: n });
                let resolve = dev.create_buffer(&wgpu::BufferDescriptor { label: Some("profile timestamps"), size: 8 * n as u64, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
                (set, resolve, n)
            })
            .collect();
        let read = dev.create_buffer(&wgpu::BufferDescriptor { label: Some("profile timestamps"), size: 8 * count as u64, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
        Stamps { sets, read }
    }

    /// The set and index of query `q`.
    fn slot(&self, q: usize) -> (&wgpu::QuerySet, u32) {
        (&self.sets[q / QUERIES_PER_SET].0, (q % QUERIES_PER_SET) as u32)
    }

    fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        for (i, (set, resolve, n)) in self.sets.iter().enumerate() {
            enc.resolve_query_set(set, 0..*n, resolve, 0);
            enc.copy_buffer_to_buffer(resolve, 0, &self.read, (i * QUERIES_PER_SET * 8) as u64, 8 * *n as u64);
        }
    }
}
