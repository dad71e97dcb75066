//! Sessions: a graph bound to a device, run from many threads, specialised per input
//! shape signature.
use crate::cpu::CpuPlan;
use crate::gpu::{self, poisoned, GpuContext, GpuPlan};
use crate::partition::HeteroPlan;
use crate::specialize::{specialize, SpecializeError, Specialized};
use crate::{DeviceChoice, DeviceKind, Result, RuntimeError};
use kiln_graph::{Dim, Graph, NodeId, Tensor};
use kiln_ops::{NodeSpec, Op, Registry, TensorType};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How to build a session.
#[derive(Clone)]
pub struct SessionOptions {
    pub device: DeviceChoice,
    /// Operators to use (defaults to [`Registry::builtin`]); add custom ops here.
    pub registry: Option<Registry>,
    /// Placement overrides by node name or op type (a GPU session runs the rest on the
    /// GPU where a kernel exists, on the CPU otherwise).
    pub placement: Vec<crate::PlacementRule>,
    /// Place the other nodes of a GPU session by the cost model (each device measured
    /// once per process, `partition::calibrate`) instead of "GPU where possible".
    pub auto_place: bool,
    /// The most bytes a session may use for one specialisation (values folded on the
    /// host, planned intermediates); `None`: three quarters of the machine's RAM.
    pub memory_limit: Option<u64>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { device: DeviceChoice::Auto, registry: None, placement: vec![], auto_place: false, memory_limit: None }
    }
}

impl SessionOptions {
    pub fn device(device: DeviceChoice) -> Self {
        SessionOptions { device, ..Default::default() }
    }
}

/// The session's main device (with a GPU, its context is `gpus[0]`).
enum Backend {
    Cpu,
    Gpu,
}

enum Exec {
    Cpu(CpuPlan),
    Gpu(GpuPlan),
    /// Steps on both devices, in segments; the constants are those graph outputs that
    /// were folded.
    Hetero(HeteroPlan, HashMap<kiln_graph::ValueId, Tensor>),
}

struct Plan {
    exec: Exec,
    folded: usize,
}

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Kernels launched (GPU dispatches or CPU kernel calls).
    pub kernels: usize,
    /// Queue submissions (GPU; 0 on the CPU).
    pub submits: usize,
    /// Nodes evaluated once on the host when this shape was specialised.
    pub folded_nodes: usize,
    /// Whether this run built a new specialisation.
    pub specialized: bool,
    /// The memory plan of this specialisation's intermediates, on its one device (None
    /// when it runs across devices).
    pub memory: Option<crate::cpu::MemoryPlan>,
}

/// A model ready to run on one device. `Send + Sync`: share it between threads
/// (e.g. in an `Arc`) and call [`Session::run`] concurrently.
pub struct Session {
    graph: Graph,
    ops: Vec<Box<dyn Op>>,
    order: Vec<NodeId>,
    backend: Backend,
    /// Every GPU the session uses with its uploaded weights: the main GPU first, then
    /// adapters that placement rules name.
    gpus: Vec<(Arc<GpuContext>, gpu::WeightCache)>,
    /// The device of each placement rule.
    rule_devs: Vec<crate::partition::Dev>,
    plans: Mutex<HashMap<PlanKey, Arc<Plan>>>,
    /// Graph inputs whose values (not only types) specialise the model: small integer
    /// inputs that feed shapes, axes or pads. Found on the first run that needs them.
    by_value: Mutex<Vec<usize>>,
    symbolic: crate::symbolic::SymbolicShapes,
    placement: Vec<crate::PlacementRule>,
    /// The device profiles (CPU, main GPU) of cost-model placement, when asked for.
    auto_place: Option<(crate::partition::DeviceProfile, crate::partition::DeviceProfile)>,
}

/// What a specialisation depends on: input types, and the values of inputs bound by value.
#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    types: Vec<TensorType>,
    values: Vec<(usize, Tensor)>,
}

/// Largest integer graph input (elements) that is bound by value.
const MAX_VALUE_INPUT: usize = 4096;
/// Largest float graph input bound by value (scalars such as Range's start and delta).
const MAX_FLOAT_VALUE_INPUT: usize = 16;

impl Session {
    /// Validates the graph, creates its ops and opens the device.
    pub fn new(graph: Graph, options: SessionOptions) -> Result<Session> {
        let order = graph.validate()?;
        let registry = options.registry.as_ref().unwrap_or_else(|| Registry::builtin());
        let ops = create_ops(&graph, registry)?;
        for &v in &graph.inputs {
            if graph.values[v].ty.is_none() {
                return Err(RuntimeError::InputMismatch {
                    name: graph.values[v].name.clone(),
                    expected: "a declared dtype and shape".into(),
                    got: "none in the model".into(),
                });
            }
        }
        let start = Instant::now();
        let symbolic = crate::symbolic::check(&graph, &ops, &order)?;
        log::info!("checked the shapes of '{}' symbolically in {:.1} ms", graph.name, start.elapsed().as_secs_f64() * 1e3);
        let (backend, main) = match gpu::select(&options.device)? {
            None => (Backend::Cpu, None),
            Some(adapter) => (Backend::Gpu, Some(gpu::context_for(adapter)?)),
        };
        let (contexts, rule_devs) = crate::partition::resolve_rules(&graph, &options.placement, main)?;
        let gpus = contexts.into_iter().map(|c| (c, gpu::WeightCache::default())).collect();
        let auto_place = match (options.auto_place, &backend) {
            (true, Backend::Gpu) => Some((crate::partition::calibrate(&DeviceChoice::Cpu)?, crate::partition::calibrate(&options.device)?)),
            (true, Backend::Cpu) => {
                return Err(RuntimeError::Placement("cost-model placement chooses between the CPU and a GPU; this session has no GPU".into()))
            }
            _ => None,
        };
        Ok(Session { graph, ops, order, backend, gpus, rule_devs, plans: Mutex::default(), by_value: Mutex::default(), symbolic, placement: options.placement, auto_place })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn device_kind(&self) -> DeviceKind {
        match self.backend {
            Backend::Cpu => DeviceKind::Cpu,
            Backend::Gpu => DeviceKind::Gpu,
        }
    }

    /// A human-readable name of the device, e.g. `cpu (2 threads)` or
    /// `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
            Backend::Gpu => format!("{} ({:?})", self.gpus[0].0.info.name, self.gpus[0].0.info.backend),
        }
    }

    /// Input names and declared types (dims may be symbols).
    pub fn inputs(&self) -> Vec<(String, kiln_graph::ValueType)> {
        self.graph
            .inputs
            .iter()
            .map(|&v| (self.graph.values[v].name.clone(), self.graph.values[v].ty.clone().expect("checked in new")))
            .collect()
    }

    /// Output names and their shapes in terms of the input symbols (`[batch, seq, 768]`,
    /// `[batch*seq, 64]`), as far as the symbolic checks could fit them: a dim that
    /// depends on the symbols in another way is `?`; `None` when not even the rank is known.
    pub fn output_shapes(&self) -> Vec<(String, Option<kiln_graph::Shape>)> {
        self.graph.outputs.iter().enumerate().map(|(i, &v)| (self.graph.values[v].name.clone(), self.symbolic.outputs.get(i).cloned().flatten())).collect()
    }

    pub fn output_names(&self) -> Vec<String> {
        self.graph.outputs.iter().map(|&v| self.graph.values[v].name.clone()).collect()
    }

    /// Checks names, dtypes and shapes of the inputs against the model; returns them
    /// in graph input order with their concrete types.
    fn bind<'a>(&self, inputs: &[(&str, &'a Tensor)]) -> Result<(Vec<&'a Tensor>, Vec<TensorType>)> {
        let names: Vec<&str> = self.graph.inputs.iter().map(|&v| self.graph.values[v].name.as_str()).collect();
        let mut bound: Vec<Option<&Tensor>> = vec![None; names.len()];
        for (name, t) in inputs {
            let i = names.iter().position(|n| n == name).ok_or_else(|| RuntimeError::UnknownInput {
                name: name.to_string(),
                expected: names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", "),
            })?;
            if bound[i].replace(t).is_some() {
                return Err(RuntimeError::DuplicateInput(name.to_string()));
            }
        }
        let mut symbols: HashMap<&str, (usize, &str)> = HashMap::new();
        let mut out = vec![];
        let mut types = vec![];
        for (i, &v) in self.graph.inputs.iter().enumerate() {
            let ty = self.graph.values[v].ty.as_ref().expect("checked in new");
            let t = bound[i].ok_or_else(|| RuntimeError::MissingInput { name: names[i].to_string(), ty: ty.to_string() })?;
            let mismatch = |what: String| RuntimeError::InputMismatch { name: names[i].to_string(), expected: ty.to_string(), got: what };
            if t.dtype() != ty.dtype {
                return Err(mismatch(format!("dtype {}", t.dtype())));
            }
            if t.rank() != ty.shape.rank() {
                return Err(mismatch(format!("shape {:?} (rank {} instead of {})", t.dims(), t.rank(), ty.shape.rank())));
            }
            for (k, (d, &n)) in ty.shape.0.iter().zip(t.dims()).enumerate() {
                match d {
                    Dim::Fixed(f) if *f != n => {
                        return Err(mismatch(format!("shape {:?} (dim {k} is {n}, not {f})", t.dims())));
                    }
                    Dim::Sym(s) => {
                        if let Some((prev, who)) = symbols.insert(s, (n, names[i])) {
                            if prev != n {
                                return Err(mismatch(format!(
                                    "shape {:?}: dim {k} ('{s}') is {n}, but input '{who}' bound '{s}' to {prev}",
                                    t.dims()
                                )));
                            }
                        }
                    }
                    _ => {}
                }
            }
            out.push(t);
            types.push(TensorType::new(t.dtype(), t.dims()));
        }
        Ok((out, types))
    }

    fn plan(&self, tensors: &[&Tensor], types: Vec<TensorType>) -> Result<(Arc<Plan>, bool)> {
        loop {
            let bound = self.by_value.lock().map_err(|_| poisoned())?.clone();
            let key = PlanKey { types: types.clone(), values: bound.iter().map(|&i| (i, tensors[i].clone())).collect() };
            if let Some(p) = self.plans.lock().map_err(|_| poisoned())?.get(&key) {
                return Ok((p.clone(), false));
            }
            let start = Instant::now();
            let mut values: Vec<Option<&Tensor>> = vec![None; tensors.len()];
            for &i in &bound {
                values[i] = Some(tensors[i]);
            }
            let spec: Specialized = match specialize(&self.graph, &self.ops, &self.order, &types, &values) {
                Ok(s) => s,
                Err(SpecializeError::Other(e)) => return Err(e),
                Err(SpecializeError::NeedsValue { inputs: found, error }) => {
                    // Bind the small graph inputs this value comes from, and retry.
                    let small = |i: usize| {
                        let max = if types[i].dtype.is_float() { MAX_FLOAT_VALUE_INPUT } else { MAX_VALUE_INPUT };
                        types[i].len() <= max
                    };
                    let bindable = !found.is_empty() && found.iter().all(|&i| !bound.contains(&i) && small(i));
                    if !bindable {
                        return Err(error);
                    }
                    let mut by_value = self.by_value.lock().map_err(|_| poisoned())?;
                    for i in found {
                        log::info!("input '{}' feeds a shape argument: sessions specialise on its value", self.graph.values[self.graph.inputs[i]].name);
                        if !by_value.contains(&i) {
                            by_value.push(i);
                        }
                    }
                    continue;
                }
            };
            let exec = self.exec(&spec)?;
            let plan = Arc::new(Plan { exec, folded: spec.folded });
            let shapes: Vec<String> = types.iter().map(|t| t.to_string()).collect();
            log::info!(
                "specialised '{}' for inputs [{}] on {} in {:.1} ms ({} steps, {} nodes folded)",
                self.graph.name,
                shapes.join(", "),
                self.device_name(),
                start.elapsed().as_secs_f64() * 1e3,
                spec.steps.len(),
                spec.folded
            );
            let mut plans = self.plans.lock().map_err(|_| poisoned())?;
            let p = plans.entry(key).or_insert(plan).clone();
            return Ok((p, true));
        }
    }

    /// Runs the model. Inputs by name; outputs in the model's output order.
    pub fn run(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Tensor>> {
        Ok(self.run_with_stats(inputs)?.0)
    }

    /// Like [`Session::run`], also reporting what the run did.
    pub fn run_with_stats(&self, inputs: &[(&str, &Tensor)]) -> Result<(Vec<Tensor>, RunStats)> {
        let (tensors, types) = self.bind(inputs)?;
        let (plan, specialized) = self.plan(&tensors, types)?;
        let (outs, kernels, submits) = match &plan.exec {
            Exec::Cpu(p) => (p.run(&self.graph, &self.ops, &tensors, None)?, p.kernel_count(), 0),
            Exec::Gpu(p) => {
                let (o, submits) = p.run(&tensors)?;
                (o, p.dispatch_count(), submits)
            }
            Exec::Hetero(p, consts) => p.run(&self.graph, &self.ops, &tensors, consts)?,
        };
        let memory = match &plan.exec {
            Exec::Cpu(p) => Some(p.memory),
            Exec::Gpu(p) => Some(p.memory),
            Exec::Hetero(..) => None,
        };
        Ok((outs, RunStats { kernels, submits, folded_nodes: plan.folded, specialized, memory }))
    }
}

impl Session {
    /// The plan of a specialisation: one device, or segments across devices.
    fn exec(&self, spec: &Specialized) -> Result<Exec> {
        use crate::partition::Dev;
        let main_gpu = matches!(self.backend, Backend::Gpu);
        if !main_gpu && self.placement.is_empty() {
            return Ok(Exec::Cpu(CpuPlan::build(&self.graph, &self.ops, spec)?));
        }
        let devices = crate::partition::place(&self.graph, &self.ops, spec, &self.placement, &self.rule_devs, main_gpu, self.auto_place)?;
        if main_gpu && devices.iter().all(|d| *d == Dev::Gpu(0)) {
            let (ctx, weights) = &self.gpus[0];
            return Ok(Exec::Gpu(GpuPlan::build(ctx.clone(), &self.graph, &self.ops, spec, weights)?));
        }
        if devices.iter().all(|d| *d == Dev::Cpu) {
            return Ok(Exec::Cpu(CpuPlan::build(&self.graph, &self.ops, spec)?));
        }
        let hetero = HeteroPlan::build(&self.graph, &self.ops, spec, &devices, &self.gpus)?;
        log::info!(
            "'{}' runs in {} segments: {} steps on the CPU, {} on GPUs",
            self.graph.name,
            hetero.segment_count(),
            devices.iter().filter(|d| **d == Dev::Cpu).count(),
            devices.iter().filter(|d| **d != Dev::Cpu).count()
        );
        let consts = self.graph.outputs.iter().filter_map(|o| spec.constants.get(o).map(|t| (*o, t.clone()))).collect();
        Ok(Exec::Hetero(hetero, consts))
    }

    /// Where each step of a specialisation runs, by device name.
    fn step_devices(&self, spec: &Specialized) -> Result<HashMap<NodeId, String>> {
        use crate::partition::Dev;
        let main_gpu = matches!(self.backend, Backend::Gpu);
        let devices = if !main_gpu && self.placement.is_empty() {
            vec![Dev::Cpu; spec.steps.len()]
        } else {
            crate::partition::place(&self.graph, &self.ops, spec, &self.placement, &self.rule_devs, main_gpu, self.auto_place)?
        };
        let name = |d: Dev| match d {
            Dev::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
            Dev::Gpu(k) => format!("{} ({:?})", self.gpus[k].0.info.name, self.gpus[k].0.info.backend),
        };
        Ok(spec.steps.iter().map(|s| s.node).zip(devices.into_iter().map(name)).collect())
    }
}

impl Session {
    /// Every WGSL kernel of the specialisations built so far, each once (for `.kiln`
    /// artifacts: `kiln compile` stores them for fixed shapes).
    pub fn kernel_records(&self) -> Result<Vec<gpu::KernelRecord>> {
        let plans = self.plans.lock().map_err(|_| poisoned())?;
        let mut out: Vec<gpu::KernelRecord> = vec![];
        for p in plans.values() {
            let records = match &p.exec {
                Exec::Gpu(g) => g.kernel_records(),
                Exec::Hetero(h, _) => h.kernel_records(),
                Exec::Cpu(_) => vec![],
            };
            for r in records {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Builds the pipelines of stored kernels on the session's GPU ahead of the first run
    /// (whose plan then finds them cached); returns how many. Nothing on a CPU session.
    /// The pipelines are built on the rayon pool's threads at once: a driver compiles
    /// each on the calling thread (wgpu's error scopes are per thread).
    pub fn prebuild_kernels(&self, kernels: &[gpu::KernelRecord]) -> Result<usize> {
        use rayon::prelude::*;
        let Some((ctx, _)) = self.gpus.first().filter(|_| matches!(self.backend, Backend::Gpu)) else { return Ok(0) };
        kernels.par_iter().try_for_each(|k| ctx.pipeline(&k.label, &k.source, &k.entry, &k.read_only).map(|_| ()))?;
        Ok(kernels.len())
    }

    /// The driver's pipeline cache of the session's GPU, for `.kiln` artifacts: it holds
    /// the pipelines built on that device in this process (`kiln compile` opens the
    /// device, runs the model once, and stores exactly its kernels' pipelines). None on
    /// a CPU session or when the device has no pipeline caching (wgpu's PIPELINE_CACHE:
    /// Vulkan only).
    pub fn pipeline_cache(&self) -> Result<Option<gpu::PipelineCacheData>> {
        match self.gpus.first().filter(|_| matches!(self.backend, Backend::Gpu)) {
            Some((ctx, _)) => ctx.cache_data(),
            None => Ok(None),
        }
    }

    /// Lets pipelines built from now on (e.g. by [`Session::prebuild_kernels`]) start
    /// from a stored driver cache, when it was written for this session's adapter and
    /// driver; returns whether it was taken. A foreign cache is ignored, never an error.
    pub fn use_pipeline_cache(&self, cache: &gpu::PipelineCacheData) -> Result<bool> {
        match self.gpus.first().filter(|_| matches!(self.backend, Backend::Gpu)) {
            Some((ctx, _)) => ctx.use_cache(cache),
            None => Ok(false),
        }
    }
}

/// Creates every node's op; all failures are reported together.
pub(crate) fn create_ops(graph: &Graph, registry: &Registry) -> Result<Vec<Box<dyn Op>>> {
    let opset = graph.opset();
    let mut ops = Vec::with_capacity(graph.nodes.len());
    let mut errors: Vec<(String, String)> = vec![];
    for node in &graph.nodes {
        let opset = graph.opsets.get(&node.domain).copied().unwrap_or(opset);
        match registry.create(&NodeSpec::new(node, opset)) {
            Ok(op) => ops.push(op),
            Err(e) => errors.push((format!("node '{}' ({})", node.name, node.op_type), e.to_string())),
        }
    }
    match errors.len() {
        0 => Ok(ops),
        1 => {
            let (node, what) = errors.remove(0);
            Err(RuntimeError::Unsupported { node, what })
        }
        n => {
            let shown: Vec<String> = errors.iter().take(20).map(|(n, w)| format!("{n}: {w}")).collect();
            Err(RuntimeError::Unsupported {
                node: format!("{n} nodes cannot run"),
                what: format!("\n  {}{}", shown.join("\n  "), if n > 20 { "\n  ..." } else { "" }),
            })
        }
    }
}

/// One node of a specialisation, as `kiln inspect` shows it.
#[derive(Clone, Debug)]
pub struct NodeReport {
    pub node: String,
    pub op: String,
    /// Folded on the host when the shapes were specialised (not run per inference).
    pub folded: bool,
    pub outputs: Vec<TensorType>,
    /// Work estimate (0 for folded nodes).
    pub cost: kiln_ops::Cost,
    /// Where it runs, by device name (None when folded).
    pub device: Option<String>,
}

impl Session {
    /// Every node of the specialisation for these inputs: output types, whether it was
    /// folded, and its cost estimate.
    pub fn report(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<NodeReport>> {
        let (tensors, types) = self.bind(inputs)?;
        self.plan(&tensors, types.clone())?;
        let bound = self.by_value.lock().map_err(|_| poisoned())?.clone();
        let mut values: Vec<Option<&Tensor>> = vec![None; tensors.len()];
        for &i in &bound {
            values[i] = Some(tensors[i]);
        }
        let spec = match specialize(&self.graph, &self.ops, &self.order, &types, &values) {
            Ok(s) => s,
            Err(SpecializeError::Other(e)) | Err(SpecializeError::NeedsValue { error: e, .. }) => return Err(e),
        };
        let devices = self.step_devices(&spec)?;
        let live: std::collections::HashSet<NodeId> = spec.steps.iter().map(|s| s.node).collect();
        Ok(self
            .order
            .iter()
            .map(|&n| {
                let node = &self.graph.nodes[n];
                let outputs: Vec<TensorType> = node.outputs.iter().filter_map(|&o| spec.types[o].clone()).collect();
                let cost = if live.contains(&n) {
                    let args = spec.args(&node.inputs);
                    self.ops[n].cost(&args, &outputs)
                } else {
                    kiln_ops::Cost::default()
                };
                NodeReport { node: node.name.clone(), op: node.op_type.clone(), folded: !live.contains(&n), outputs, cost, device: devices.get(&n).cloned() }
            })
            .collect())
    }
}

/// Time spent per node over profiled runs.
#[derive(Clone, Debug)]
pub struct NodeProfile {
    pub node: String,
    pub op: String,
    /// Mean seconds per run.
    pub seconds: f64,
}

impl Session {
    /// Runs `runs` times timing every step (CPU backend; on a GPU, where a run is one
    /// submit, per-node times need timestamp queries and are not measured yet).
    pub fn profile(&self, inputs: &[(&str, &Tensor)], runs: usize) -> Result<Vec<NodeProfile>> {
        let (tensors, types) = self.bind(inputs)?;
        let (plan, _) = self.plan(&tensors, types)?;
        let Exec::Cpu(p) = &plan.exec else {
            return Err(RuntimeError::Unsupported { node: "profile".into(), what: "per-node profiles are measured on the CPU backend only".into() });
        };
        let mut times: HashMap<usize, f64> = HashMap::new();
        let mut samples = vec![];
        for _ in 0..runs.max(1) {
            samples.clear();
            p.run(&self.graph, &self.ops, &tensors, Some(&mut samples))?;
            for &(n, t) in &samples {
                *times.entry(n).or_default() += t;
            }
        }
        let mut out: Vec<NodeProfile> = times
            .into_iter()
            .map(|(n, t)| NodeProfile { node: self.graph.nodes[n].name.clone(), op: self.graph.nodes[n].op_type.clone(), seconds: t / runs.max(1) as f64 })
            .collect();
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Ok(out)
    }
}
