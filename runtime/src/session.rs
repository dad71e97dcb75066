//! Sessions: a graph bound to a device, run from many threads, specialised per input
//! shape signature.
use crate::bodies::{Compile, CompiledBody, GpuBodies, RunBodies};
use crate::calibrate::calibrate;
use crate::carried::{self, Carried};
use crate::error::poisoned;
use crate::gpu::{self, GpuContext};
use crate::placement::{self, Dev, DeviceProfile, Devices};
use crate::plan::Plan;
use crate::threads::{self, ThreadConfig};
use crate::tune::{self, Choices, StepDevice, TuneOptions, TuneProgress, TuneReport, Tuning};
use crate::{DeviceChoice, DeviceKind, Result, RuntimeError};
use kiln_graph::{Dim, Graph, NodeId, Tensor, Value, ValueId};
use kiln_ops::infer::{self, specialize, Limits, SpecializeError, Specialized};
use kiln_ops::{Op, Registry, TensorType};
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
    /// CPU worker threads of the session's kernels; `None`: one per core.
    pub threads: Option<usize>,
    /// Whether the CPU worker threads flush subnormal floats to zero (see
    /// [`crate::threads`]; on by default).
    pub denormals_are_zero: bool,
    /// CPU worker threads of the session's own, shared with no other session (by
    /// default sessions of the same thread count share one pool and their runs take
    /// turns on it). For sessions in one process that wait on each other while they
    /// run: data-parallel workers, whose collectives pair up.
    pub private_threads: bool,
    /// Where tuned kernel choices come from: choices embedded in an artifact, then a
    /// tuning database; default: none (every kernel with its defaults). The CLI uses the
    /// user's database ([`Tuning::user_cache`]).
    pub tuning: Tuning,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            device: DeviceChoice::Auto,
            registry: None,
            placement: vec![],
            auto_place: false,
            memory_limit: None,
            threads: None,
            denormals_are_zero: true,
            private_threads: false,
            tuning: Tuning::off(),
        }
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
    pub memory: Option<crate::MemoryPlan>,
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
    rule_devs: Vec<Dev>,
    plans: Mutex<HashMap<PlanKey, Planned>>,
    /// Graph inputs whose values (not only types) specialise the model: small integer
    /// inputs that feed shapes, axes or pads. Found on the first run that needs them.
    by_value: Mutex<Vec<usize>>,
    /// The phases of the last plan built (for traces): name, start, end.
    plan_phases: Mutex<Vec<(&'static str, Instant, Instant)>>,
    symbolic: infer::SymbolicShapes,
    limits: Limits,
    placement: Vec<crate::PlacementRule>,
    /// The device profiles (CPU, main GPU) of cost-model placement, when asked for.
    auto_place: Option<(DeviceProfile, DeviceProfile)>,
    /// The CPU worker threads every run executes on.
    workers: threads::Workers,
    /// Tuned kernel choices: lookups of the plans, and what `tune` measured.
    choices: Choices,
    /// With a GPU, what runs control-flow bodies there.
    bodies: Option<Arc<GpuBodies>>,
    /// The most plans kept (`None`: every signature's).
    plan_limit: Option<usize>,
}

/// The plan of one input signature.
#[derive(Clone)]
enum Planned {
    /// Every output type follows from the input types: one plan.
    Whole(Arc<Plan>),
    /// Some node's output types depend on values computed at run time: stages.
    Staged(Arc<Staged>),
}

/// A stage of a model with data-dependent output types (NonMaxSuppression, NonZero,
/// Loop's scan outputs, ...): the steps up to the first node whose output types need
/// values computed at run time (the barrier). Each run executes the stage, runs the
/// barrier on the host with the values it needs, then the stage that follows, planned
/// for the types the barrier produced (and cached by them).
struct Staged {
    /// The session graph with this stage's inputs (values computed before it or the
    /// graph's inputs) and outputs (what the rest and the graph outputs need).
    view: Graph,
    plan: Plan,
    /// Known values (weights, folded values) the rest or the graph outputs read.
    constants: Arc<HashMap<ValueId, Tensor>>,
    next: Option<Next>,
}

impl Planned {
    /// The one plan; staged models are refused with what they need (`what` says what
    /// was asked for).
    fn whole(&self, graph: &Graph, what: &str) -> Result<&Arc<Plan>> {
        match self {
            Planned::Whole(p) => Ok(p),
            Planned::Staged(s) => {
                let barrier = s.next.as_ref().map_or_else(String::new, |n| format!(": node {} has output types that depend on values computed at run time", graph.nodes[n.barrier].label()));
                Err(RuntimeError::Unsupported { node: graph.name.clone(), what: format!("{what} of a model that runs in stages is not supported yet{barrier}") })
            }
        }
    }

    fn kernel_records(&self) -> Vec<gpu::KernelRecord> {
        match self {
            Planned::Whole(p) => p.kernel_records(),
            Planned::Staged(s) => s.kernel_records(),
        }
    }
}

impl Staged {
    fn kernel_records(&self) -> Vec<gpu::KernelRecord> {
        let mut out = self.plan.kernel_records();
        if let Some(next) = &self.next {
            if let Ok(stages) = next.stages.lock() {
                for s in stages.values() {
                    out.extend(s.kernel_records());
                }
            }
        }
        out
    }
}

struct Next {
    /// The node run on the host between this stage and the next.
    barrier: NodeId,
    /// Where the next stage starts in the session's order.
    rest: usize,
    /// The next stage per type of the values it reads (and the sequences and
    /// optionals among them, which it reads by value).
    stages: Mutex<HashMap<StageKey, Arc<Staged>>>,
}

/// What a stage depends on: the types of the tensors it reads, and the sequences and
/// optionals it reads (host values, which its nodes fold).
type StageKey = (Vec<TensorType>, Vec<(ValueId, Tensor)>);

/// What a specialisation depends on: input types, and the values of inputs bound by value.
#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    types: Vec<TensorType>,
    values: Vec<(usize, Tensor)>,
}

/// Plans a control-flow body's session keeps ([`Session::make_room`]).
const BODY_PLANS: usize = 32;

/// Largest integer graph input (elements) that is bound by value: a plan keeps such
/// inputs in its key.
pub const MAX_VALUE_INPUT: usize = 4096;
/// Largest float graph input bound by value (scalars such as Range's start and delta).
pub const MAX_FLOAT_VALUE_INPUT: usize = 16;

impl Session {
    /// Validates the graph, creates its ops and opens the device.
    pub fn new(graph: Graph, options: SessionOptions) -> Result<Session> {
        let main = match gpu::select(&options.device)? {
            None => None,
            Some(adapter) => Some(gpu::context_for(adapter)?),
        };
        Session::build(graph, options, main, false)
    }

    /// A session of a control-flow body on an open GPU context (its CPU steps on one
    /// thread: the enclosing session's kernel is already on one of its workers). Its
    /// inputs' dims are placeholders for whatever shapes the loop feeds, so the
    /// symbolic check, which would read them as free sizes, is skipped: the body was
    /// checked with the enclosing model, and each signature is specialised when run.
    pub(crate) fn on_context(graph: Graph, ctx: Arc<GpuContext>, registry: Option<Registry>) -> Result<Session> {
        Session::build(graph, SessionOptions { registry, threads: Some(1), ..Default::default() }, Some(ctx), true)
    }

    /// `body`: a control-flow body's session ([`Session::on_context`]).
    fn build(graph: Graph, options: SessionOptions, main: Option<Arc<GpuContext>>, body: bool) -> Result<Session> {
        let order = graph.validate()?;
        let registry = options.registry.as_ref().unwrap_or_else(|| Registry::builtin());
        let ops = infer::create_ops(&graph, registry)?;
        let order = crate::schedule::order(&graph, &ops, order);
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
        let symbolic = if body { infer::SymbolicShapes::default() } else { infer::check_symbolic(&graph, &ops, &order)? };
        let limits = options.memory_limit.map_or_else(Limits::default, |memory| Limits { memory });
        log::info!("checked the shapes of '{}' symbolically in {:.1} ms", graph.name, start.elapsed().as_secs_f64() * 1e3);
        let backend = if main.is_some() { Backend::Gpu } else { Backend::Cpu };
        let bodies = main.as_ref().map(|ctx| {
            let on = ctx.clone();
            let compile: Compile = Box::new(move |g, registry| Ok(Box::new(Session::on_context(g, on.clone(), registry)?) as Box<dyn CompiledBody>));
            Arc::new(GpuBodies::new(ctx.info.name.clone(), compile, options.registry.clone()))
        });
        let (contexts, rule_devs) = placement::resolve_rules(&graph, &options.placement, main)?;
        let gpus = contexts.into_iter().map(|c| (c, gpu::WeightCache::default())).collect();
        let auto_place = match (options.auto_place, &backend) {
            (true, Backend::Gpu) => Some((calibrate(&DeviceChoice::Cpu)?, calibrate(&options.device)?)),
            (true, Backend::Cpu) => {
                return Err(RuntimeError::Placement("cost-model placement chooses between the CPU and a GPU; this session has no GPU".into()))
            }
            _ => None,
        };
        let config = ThreadConfig::new(options.threads, options.denormals_are_zero)?;
        let workers = if options.private_threads { threads::Workers::private(config)? } else { threads::Workers::new(config)? };
        let choices = Choices::new(options.tuning);
        Ok(Session {
            graph,
            ops,
            order,
            backend,
            gpus,
            rule_devs,
            plans: Mutex::default(),
            by_value: Mutex::default(),
            plan_phases: Mutex::default(),
            symbolic,
            limits,
            placement: options.placement,
            auto_place,
            workers,
            choices,
            bodies,
            plan_limit: body.then_some(BODY_PLANS),
        })
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

    /// Whether the session's GPU has SHADER_F16, so that f16 values between kernels
    /// that bind halves are stored as halves (false on the CPU, which computes f16 ops
    /// from f32 and rounds).
    pub fn stores_halves(&self) -> bool {
        matches!(self.backend, Backend::Gpu) && self.gpus.iter().all(|g| g.0.f16)
    }

    /// A human-readable name of the device, e.g. `cpu (2 threads)` or
    /// `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cpu => cpu_name(self.threads()),
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
            if t.kind() != ty.kind {
                let got = t.composite().map_or_else(|| format!("a tensor {}{:?}", t.dtype(), t.dims()), |v| format!("a {}", v.describe()));
                return Err(mismatch(got));
            }
            if !ty.kind.is_tensor() {
                // A sequence or an optional: its tensors' dtype (their shapes may differ).
                if t.dtype() != ty.dtype {
                    return Err(mismatch(format!("a {}", t.to_value().describe())));
                }
                out.push(t);
                types.push(TensorType::of(t));
                continue;
            }
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
            types.push(TensorType::of(t));
        }
        Ok((out, types))
    }

    fn plan(&self, tensors: &[&Tensor], types: Vec<TensorType>) -> Result<(Planned, bool)> {
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
            let spec: Specialized = match specialize(&self.graph, &self.ops, &self.order, &types, &values, self.limits) {
                Ok(s) => s,
                Err(SpecializeError::Other(e)) => return Err(e.into()),
                Err(SpecializeError::NeedsValue { inputs: found, error }) => {
                    // Bind the small graph inputs this value comes from, and retry.
                    let small = |i: usize| {
                        let max = if types[i].dtype.is_float() { MAX_FLOAT_VALUE_INPUT } else { MAX_VALUE_INPUT };
                        types[i].len() <= max
                    };
                    let bindable = !found.is_empty() && found.iter().all(|&i| !bound.contains(&i) && small(i));
                    if !bindable {
                        // Computed at run time: the model runs in stages.
                        log::info!("'{}' runs in stages: {error}", self.graph.name);
                        let known: Vec<(ValueId, TensorType)> = self.graph.inputs.iter().copied().zip(types.iter().cloned()).collect();
                        let consts: HashMap<ValueId, Tensor> = bound.iter().map(|&i| (self.graph.inputs[i], tensors[i].clone())).collect();
                        let staged = Planned::Staged(Arc::new(self.workers.run(|| self.build_stage(0, &known, &consts))?));
                        let mut plans = self.plans.lock().map_err(|_| poisoned())?;
                        self.make_room(&mut plans);
                        let p = plans.entry(key).or_insert(staged).clone();
                        return Ok((p, true));
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
            let specialised = Instant::now();
            // On the workers: kernels are prepared for their thread count.
            let plan = Arc::new(self.workers.run(|| self.build_plan(&spec))?);
            *self.plan_phases.lock().map_err(|_| poisoned())? = vec![("specialise (types, folding)", start, specialised), ("place and build the plan (kernels generated and compiled)", specialised, Instant::now())];
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
            self.make_room(&mut plans);
            let p = plans.entry(key).or_insert(Planned::Whole(plan)).clone();
            return Ok((p, true));
        }
    }

    /// The stage from position `start` of the session's order, for values of these
    /// types (and these known values).
    fn build_stage(&self, start: usize, known: &[(ValueId, TensorType)], values: &HashMap<ValueId, Tensor>) -> Result<Staged> {
        let stage = infer::specialize_stage(&self.graph, &self.ops, &self.order[start..], known, values, self.limits)?;
        let spec = stage.spec;
        // The stage's view: it reads what it was given, and hands on what the rest needs.
        let mut later: std::collections::HashSet<ValueId> = self.graph.outputs.iter().copied().collect();
        if let Some((pos, _)) = &stage.barrier {
            for &n in &self.order[start + pos..] {
                later.extend(self.graph.nodes[n].inputs.iter().flatten().copied());
            }
        }
        let mut view = self.graph.clone();
        view.inputs = known.iter().map(|(v, _)| *v).filter(|v| !spec.constants.contains_key(v)).collect();
        let mut outputs: Vec<ValueId> = spec.steps.iter().flat_map(|s| s.outputs.iter().copied()).filter(|v| later.contains(v)).collect();
        outputs.sort_unstable();
        outputs.dedup();
        view.outputs = outputs;
        let constants: HashMap<ValueId, Tensor> = spec.constants.iter().filter(|(v, _)| later.contains(v)).map(|(v, t)| (*v, t.clone())).collect();
        let plan = self.build_plan_on(&view, &spec)?;
        let next = stage.barrier.map(|(pos, _)| Next { barrier: self.order[start + pos], rest: start + pos + 1, stages: Mutex::default() });
        Ok(Staged { view, plan, constants: Arc::new(constants), next })
    }

    /// Runs a staged model: each stage, the barrier after it on the host, and so on.
    fn run_staged(&self, first: &Arc<Staged>, tensors: &[&Tensor]) -> Result<(Vec<Tensor>, usize, usize)> {
        let mut env: HashMap<ValueId, Tensor> = self.graph.inputs.iter().zip(tensors).map(|(&v, &t)| (v, t.clone())).collect();
        let (mut kernels, mut submits) = (0, 0);
        let mut stage = first.clone();
        loop {
            let ins: Vec<&Tensor> = stage.view.inputs.iter().map(|v| env.get(v).ok_or_else(|| self.missing(*v))).collect::<Result<_>>()?;
            let run = || stage.plan.run(&stage.view, &self.ops, &ins);
            let (outs, k, s) = if stage.plan.serial { self.workers.run_here(run)? } else { self.workers.run(run)? };
            kernels += k;
            submits += s;
            let outs: Vec<(ValueId, Tensor)> = stage.view.outputs.iter().copied().zip(outs).collect();
            env.extend(outs);
            for (v, t) in stage.constants.iter() {
                env.entry(*v).or_insert_with(|| t.clone());
            }
            let Some(next) = &stage.next else { break };
            // The barrier, on the host, with every input known.
            let node = &self.graph.nodes[next.barrier];
            let known: HashMap<ValueId, Tensor> = node.inputs.iter().flatten().map(|v| env.get(v).cloned().map(|t| (*v, t)).ok_or_else(|| self.missing(*v))).collect::<Result<_>>()?;
            let evaluate = || infer::evaluate(&self.graph, &self.ops, next.barrier, &known, self.limits);
            let outs = match &self.bodies {
                Some(b) => {
                    let (outs, k, s) = RunBodies::new(b).scope(evaluate);
                    kernels += k;
                    submits += s;
                    outs
                }
                None => evaluate(),
            }?;
            env.extend(node.outputs.iter().copied().zip(outs));
            // The next stage, for the types of the values it reads.
            let mut reads: Vec<ValueId> = vec![];
            for &n in &self.order[next.rest..] {
                reads.extend(self.graph.nodes[n].inputs.iter().flatten().copied().filter(|v| env.contains_key(v) && !self.graph.initializers.contains_key(v)));
            }
            reads.extend(self.graph.outputs.iter().copied().filter(|v| env.contains_key(v)));
            reads.sort_unstable();
            reads.dedup();
            // Sequences and optionals are read by value (their nodes fold on the host).
            let (hosted, tensors): (Vec<ValueId>, Vec<ValueId>) = reads.iter().partition(|v| env[*v].composite().is_some());
            let known: Vec<(ValueId, TensorType)> = tensors.iter().map(|v| (*v, TensorType::of(&env[v]))).collect();
            let values: Vec<(ValueId, Tensor)> = hosted.iter().map(|v| (*v, env[v].clone())).collect();
            let key: StageKey = (known.iter().map(|(_, t)| t.clone()).collect(), values.clone());
            let cached = next.stages.lock().map_err(|_| poisoned())?.get(&key).cloned();
            let following = match cached {
                Some(s) => s,
                None => {
                    let values: HashMap<ValueId, Tensor> = values.into_iter().collect();
                    let built = Arc::new(self.workers.run(|| self.build_stage(next.rest, &known, &values))?);
                    next.stages.lock().map_err(|_| poisoned())?.entry(key).or_insert(built).clone()
                }
            };
            stage = following;
        }
        let outs = self.graph.outputs.iter().map(|v| env.get(v).cloned().ok_or_else(|| self.missing(*v))).collect::<Result<_>>()?;
        Ok((outs, kernels, submits))
    }

    fn missing(&self, v: ValueId) -> RuntimeError {
        RuntimeError::Unsupported { node: self.graph.values[v].name.clone(), what: "the value is needed before it is computed (staged run)".into() }
    }

    /// Runs the model. Inputs by name; outputs in the model's output order. A sequence or
    /// optional, in or out, is a composite tensor (`Tensor::from_value`; see [`Session::run_values`]).
    pub fn run(&self, inputs: &[(&str, &Tensor)]) -> Result<Vec<Tensor>> {
        Ok(self.run_with_stats(inputs)?.0)
    }

    /// Runs a model whose inputs or outputs may be sequences or optionals
    /// (`kiln_graph::Value`). Inputs by name; outputs in the model's output order.
    /// Tensor values run as in [`Session::run`]; sequences and optionals live on the
    /// host, and the nodes that read them run there, in GPU sessions too.
    pub fn run_values(&self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>> {
        let tensors: Vec<(&str, Tensor)> = inputs.iter().map(|(n, v)| (*n, Tensor::from_value((*v).clone()))).collect();
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
        Ok(self.run(&refs)?.into_iter().map(Value::from).collect())
    }

    /// Like [`Session::run`], also reporting what the run did.
    pub fn run_with_stats(&self, inputs: &[(&str, &Tensor)]) -> Result<(Vec<Tensor>, RunStats)> {
        let (tensors, types) = self.bind(inputs)?;
        let (plan, specialized) = self.plan(&tensors, types)?;
        let plan = match plan {
            Planned::Whole(p) => p,
            Planned::Staged(first) => {
                let (outs, kernels, submits) = self.run_staged(&first, &tensors)?;
                return Ok((outs, RunStats { kernels, submits, folded_nodes: first.plan.folded, specialized, memory: None }));
            }
        };
        let run = || plan.run(&self.graph, &self.ops, &tensors);
        let (outs, kernels, submits) = if plan.serial { self.workers.run_here(run)? } else { self.workers.run(run)? };
        Ok((outs, RunStats { kernels, submits, folded_nodes: plan.folded, specialized, memory: plan.memory() }))
    }

    /// The number of CPU worker threads the session's kernels run on.
    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// State to carry from run to run: each `(input, output)` pair names a graph input
    /// and the graph output that becomes its value after every run, starting from
    /// `initial` (one tensor each, of the input's type). See [`Session::run_carried`].
    pub fn carry(&self, pairs: &[(&str, &str)], initial: Vec<Tensor>) -> Result<Carried> {
        let inputs: Vec<&str> = self.graph.inputs.iter().map(|&v| self.graph.values[v].name.as_str()).collect();
        let outputs = self.output_names();
        if initial.len() != pairs.len() {
            return Err(RuntimeError::Unsupported { node: "carried state".into(), what: format!("{} initial values for {} variables", initial.len(), pairs.len()) });
        }
        let mut idx = vec![];
        for (&(i, o), t) in pairs.iter().zip(&initial) {
            let ii = inputs.iter().position(|n| *n == i).ok_or_else(|| RuntimeError::UnknownInput { name: i.to_string(), expected: inputs.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ") })?;
            let oi = outputs.iter().position(|n| n == o).ok_or_else(|| RuntimeError::Unsupported {
                node: format!("carried state '{i}'"),
                what: format!("the model has no output '{o}' (its outputs are {})", outputs.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")),
            })?;
            if idx.iter().any(|&(a, b)| a == ii || b == oi) {
                return Err(RuntimeError::DuplicateInput(format!("{i} (or output '{o}') in the carried state")));
            }
            let ty = self.graph.values[self.graph.inputs[ii]].ty.as_ref().expect("checked in new");
            let fits = ty.kind.is_tensor() && t.dtype() == ty.dtype && ty.shape.rank() == t.rank() && ty.shape.0.iter().zip(t.dims()).all(|(d, &n)| !matches!(d, Dim::Fixed(f) if *f != n));
            if !fits {
                return Err(RuntimeError::InputMismatch { name: i.to_string(), expected: ty.to_string(), got: format!("{}{:?}", t.dtype(), t.dims()) });
            }
            idx.push((ii, oi));
        }
        Ok(Carried::new(pairs.iter().map(|(i, o)| (i.to_string(), o.to_string())).collect(), idx, initial))
    }

    /// Runs the model with `state` bound to its inputs and updated from its outputs.
    /// Returns the other outputs, in model order. When the whole run is one GPU
    /// submit, the state is copied in and out on the device and never read back here.
    pub fn run_carried(&self, state: &Carried, inputs: &[(&str, &Tensor)]) -> Result<(Vec<Tensor>, RunStats)> {
        let mut slots = state.lock()?;
        let names: Vec<&str> = state.names().collect();
        let hosts = slots.host.clone();
        let mut feeds: Vec<(&str, &Tensor)> = inputs.to_vec();
        feeds.extend(names.iter().copied().zip(hosts.iter()));
        let (tensors, types) = self.bind(&feeds)?;
        let (plan, specialized) = self.plan(&tensors, types)?;
        let carried_out: Vec<usize> = state.pairs.iter().map(|&(_, o)| o).collect();
        let keep = |outs: Vec<Tensor>| outs.into_iter().enumerate().filter(|(j, _)| !carried_out.contains(j)).map(|(_, t)| t).collect::<Vec<_>>();
        let f32_state = hosts.iter().all(|t| t.dtype() == kiln_graph::DType::F32);
        if let (Planned::Whole(p), true) = (&plan, f32_state) {
            if let Some(gp) = p.gpu_only().filter(|g| g.can_carry(&state.pairs)) {
                if slots.device.as_ref().is_none_or(|r| !gp.same_context(r)) {
                    slots.to_host()?;
                    slots.device = Some(gp.resident(hosts.iter().map(|t| t.dims().to_vec()).collect()));
                }
                let slots = &mut *slots;
                let res = slots.device.as_ref().expect("made above");
                for (k, f) in slots.fresh.iter().enumerate() {
                    if *f == carried::Fresh::Host {
                        res.upload(k, &slots.host[k])?;
                    }
                }
                let result = self.workers.run(|| gp.run_carried(&tensors, &state.pairs, res));
                // The device copies were written in the submit, even if the run then
                // reports an error.
                slots.fresh.iter_mut().for_each(|f| *f = carried::Fresh::Device);
                let (outs, submits) = result?;
                let stats = RunStats { kernels: gp.dispatch_count(), submits, folded_nodes: p.folded, specialized, memory: p.memory() };
                return Ok((keep(outs), stats));
            }
        }
        // On the host: the state's current values bound as inputs.
        drop(tensors);
        slots.to_host()?;
        let current = slots.host.clone();
        let feeds: Vec<(&str, &Tensor)> = inputs.iter().copied().chain(names.iter().copied().zip(current.iter())).collect();
        let (mut outs, stats) = self.run_with_stats(&feeds)?;
        for (k, &(_, o)) in state.pairs.iter().enumerate() {
            slots.host[k] = std::mem::replace(&mut outs[o], Tensor::zeros(kiln_graph::DType::F32, &[0]));
        }
        Ok((keep(outs), stats))
    }
}

/// A session is what a control-flow body compiles to in a GPU session.
impl CompiledBody for Session {
    fn run(&self, feeds: &[(&str, &Tensor)]) -> Result<(Vec<Tensor>, usize, usize)> {
        let (outs, stats) = self.run_with_stats(feeds)?;
        Ok((outs, stats.kernels, stats.submits))
    }
}

impl Session {
    /// The plan of a specialisation: its steps placed (once), then planned per segment.
    fn build_plan(&self, spec: &Specialized) -> Result<Plan> {
        self.build_plan_on(&self.graph, spec)
    }

    /// [`Session::build_plan`] over a view of the graph (a stage's inputs and outputs).
    fn build_plan_on(&self, graph: &Graph, spec: &Specialized) -> Result<Plan> {
        let on = Devices { rules: &self.placement, rule_devs: &self.rule_devs, has_main_gpu: matches!(self.backend, Backend::Gpu), auto: self.auto_place };
        let placed = placement::place(graph, &self.ops, spec, &on)?;
        let on_cpu = placed.devices.iter().filter(|d| **d == Dev::Cpu).count();
        let mut plan = Plan::build(graph, &self.ops, spec, placed, &self.gpus, self.limits, &self.choices)?;
        plan.bodies = self.bodies.clone();
        if plan.segment_count() > 1 {
            log::info!(
                "'{}' runs in {} segments: {} steps on the CPU, {} on GPUs",
                graph.name,
                plan.segment_count(),
                on_cpu,
                spec.steps.len() - on_cpu
            );
        }
        Ok(plan)
    }

    /// Drops the cached plans of a session that keeps a bounded number
    /// ([`Session::on_context`]: a body whose iterations may each bring a signature of
    /// their own, an iteration number bound by value say) when it holds that many.
    fn make_room(&self, plans: &mut HashMap<PlanKey, Planned>) {
        if self.plan_limit.is_some_and(|l| plans.len() >= l) {
            plans.clear();
        }
    }

    /// A device's name as reports show it.
    fn dev_name(&self, d: Dev) -> String {
        match d {
            Dev::Cpu => cpu_name(self.threads()),
            Dev::Gpu(k) => format!("{} ({:?})", self.gpus[k].0.info.name, self.gpus[k].0.info.backend),
        }
    }
}

impl Session {
    /// Every WGSL kernel of the specialisations built so far, each once (`kiln compile`
    /// reports how many a fixed-shape GPU artifact's pipeline cache holds).
    pub fn kernel_records(&self) -> Result<Vec<gpu::KernelRecord>> {
        let plans = self.plans.lock().map_err(|_| poisoned())?;
        let mut out: Vec<gpu::KernelRecord> = vec![];
        for p in plans.values() {
            for r in p.kernel_records() {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Builds the plan of the model's fixed input shapes now (kernels generated and their
    /// pipelines compiled, from the device's pipeline cache when one was taken), so the
    /// first run only executes; returns whether there was such a plan to build (every
    /// input dim fixed). Inputs that specialise by value are warmed with zeros.
    pub fn warm_up(&self) -> Result<bool> {
        let mut inputs = vec![];
        for (name, ty) in self.inputs() {
            let Some(dims) = ty.shape.as_fixed() else { return Ok(false) };
            let t = Tensor::try_zeros(ty.dtype, &dims).map_err(|e| RuntimeError::InputMismatch { name: name.clone(), expected: ty.to_string(), got: e.to_string() })?;
            inputs.push((name, t));
        }
        let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (tensors, types) = self.bind(&refs)?;
        self.plan(&tensors, types)?;
        Ok(true)
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

    /// Lets pipelines built from now on (e.g. by [`Session::warm_up`]) start
    /// from a stored driver cache, when it was written for this session's adapter and
    /// driver; returns whether it was taken. A foreign cache is ignored, never an error.
    pub fn use_pipeline_cache(&self, cache: &gpu::PipelineCacheData) -> Result<bool> {
        match self.gpus.first().filter(|_| matches!(self.backend, Backend::Gpu)) {
            Some((ctx, _)) => ctx.use_cache(cache),
            None => Ok(false),
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
        let (plan, _) = self.plan(&tensors, types.clone())?;
        let plan = plan.whole(&self.graph, "a per-node report")?;
        let devices: HashMap<NodeId, String> = plan.devices.iter().map(|&(n, d)| (n, self.dev_name(d))).collect();
        let bound = self.by_value.lock().map_err(|_| poisoned())?.clone();
        let mut values: Vec<Option<&Tensor>> = vec![None; tensors.len()];
        for &i in &bound {
            values[i] = Some(tensors[i]);
        }
        let spec = specialize(&self.graph, &self.ops, &self.order, &types, &values, self.limits).map_err(|e| e.into_error())?;
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
        self.workers.run(|| self.profile_on_pool(inputs, runs))
    }

    fn profile_on_pool(&self, inputs: &[(&str, &Tensor)], runs: usize) -> Result<Vec<NodeProfile>> {
        let (tensors, types) = self.bind(inputs)?;
        let (plan, _) = self.plan(&tensors, types)?;
        let Some(p) = plan.whole(&self.graph, "a per-node profile")?.cpu_only() else {
            return Err(RuntimeError::Unsupported { node: "profile".into(), what: "per-node profiles are measured on the CPU backend only".into() });
        };
        let mut times: HashMap<usize, f64> = HashMap::new();
        let mut samples = vec![];
        for _ in 0..runs.max(1) {
            samples.clear();
            p.run(&self.graph, &self.ops, &tensors, Some(&mut samples))?;
            for &(n, _, t) in &samples {
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

/// One slice of a run's trace: a span of time on a track (the host, the CPU's kernels,
/// a GPU's kernels).
#[derive(Clone, Debug)]
pub struct TraceSlice {
    pub track: String,
    pub name: String,
    /// `host`, `kernel` (CPU) or `gpu` (GPU kernel).
    pub category: &'static str,
    pub start: std::time::Instant,
    pub duration: std::time::Duration,
}

/// A run's trace ([`Session::trace`]).
#[derive(Clone, Debug, Default)]
pub struct RunTrace {
    pub slices: Vec<TraceSlice>,
    /// Whether GPU kernels were timed by the GPU's timestamp queries (else the trace has
    /// no per-kernel GPU slices, only the submit).
    pub gpu_timestamps: bool,
    /// Kernels the run launched (GPU dispatches or CPU steps).
    pub kernels: usize,
}

impl Session {
    /// The phases of the last plan this session built (specialisation, then placement
    /// and kernel generation and compiles), as (name, start, end).
    pub fn last_plan_phases(&self) -> Vec<(&'static str, std::time::Instant, std::time::Instant)> {
        self.plan_phases.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Runs once (planning first when these input types are new) and traces the run:
    /// on the CPU, every step on the `cpu` track; on a GPU, the upload, the submit and
    /// the readback on the `host` track and every kernel, timed by the GPU's timestamp
    /// queries where the adapter has them, on the adapter's track, inside its submit's
    /// span. Plans split across devices and staged models are refused.
    pub fn trace(&self, inputs: &[(&str, &Tensor)]) -> Result<RunTrace> {
        self.workers.run(|| self.trace_on_pool(inputs))
    }

    fn trace_on_pool(&self, inputs: &[(&str, &Tensor)]) -> Result<RunTrace> {
        use std::time::{Duration, Instant};
        let (tensors, types) = self.bind(inputs)?;
        let (plan, _) = self.plan(&tensors, types)?;
        let plan = plan.whole(&self.graph, "a trace")?;
        let label = |n: usize| format!("{} ({})", self.graph.nodes[n].name, self.graph.nodes[n].op_type);
        let slice = |track: &str, name: String, category, start: Instant, end: Instant| TraceSlice { track: track.into(), name, category, start, duration: end.saturating_duration_since(start) };
        if let Some(p) = plan.cpu_only() {
            let mut samples = vec![];
            let t0 = Instant::now();
            p.run(&self.graph, &self.ops, &tensors, Some(&mut samples))?;
            let t1 = Instant::now();
            let track = self.device_name();
            let mut slices = vec![slice("host", "run".into(), "host", t0, t1)];
            slices.extend(samples.iter().map(|&(n, start, secs)| TraceSlice { track: track.clone(), name: label(n), category: "kernel", start, duration: Duration::from_secs_f64(secs) }));
            return Ok(RunTrace { kernels: samples.len(), slices, gpu_timestamps: false });
        }
        let Some(p) = plan.gpu_only() else {
            return Err(RuntimeError::Unsupported { node: self.graph.name.clone(), what: "a trace of a plan split across devices is not supported yet (trace on one device)".into() });
        };
        let mut t = gpu::GpuTiming::default();
        p.run_timed(&tensors, Some(&mut t))?;
        let mut slices = vec![
            slice("host", "upload inputs".into(), "host", t.upload.0, t.upload.1),
            slice("host", "submit and wait".into(), "host", t.submit, t.done),
            slice("host", "read outputs back".into(), "host", t.done, t.readback_end),
        ];
        // GPU times start at the first kernel; they end where the wait ended (the
        // submit's span holds them; a GPU busier than the span is scaled into it).
        let span = t.done.saturating_duration_since(t.submit).as_nanos() as f64;
        let total = t.kernels.iter().map(|k| k.2).max().unwrap_or(0) as f64;
        let scale = if total > span && total > 0.0 { span / total } else { 1.0 };
        let origin = t.done - Duration::from_nanos((total * scale) as u64);
        let track = self.device_name();
        for (name, start, end) in &t.kernels {
            let s0 = origin + Duration::from_nanos((*start as f64 * scale) as u64);
            let s1 = origin + Duration::from_nanos((*end as f64 * scale) as u64);
            slices.push(slice(&track, name.clone(), "gpu", s0, s1.min(t.done)));
        }
        Ok(RunTrace { slices, gpu_timestamps: t.gpu_timed, kernels: t.kernel_count })
    }
}

/// The CPU device's name in reports: `cpu (2 threads)`.
fn cpu_name(threads: usize) -> String {
    format!("cpu ({threads} thread{})", if threads == 1 { "" } else { "s" })
}

impl Session {
    /// Tunes the kernels of the specialisation for these inputs (see [`crate::tune`]):
    /// each distinct key whose kernel has choices, on the device its step runs on,
    /// within `opts.budget`; keys with a stored choice are skipped unless `opts.retune`.
    /// What it measures is stored in the session's database (when it has one) and used
    /// by this session's plans from the next run on. `progress` is called before each key
    /// and at the end.
    pub fn tune(&self, inputs: &[(&str, &Tensor)], opts: &TuneOptions, progress: &mut (dyn FnMut(&TuneProgress) + Send)) -> Result<TuneReport> {
        // On the session's worker threads: CPU variants are measured as they will run.
        self.workers.run(|| self.tune_on_pool(inputs, opts, progress))
    }

    fn tune_on_pool(&self, inputs: &[(&str, &Tensor)], opts: &TuneOptions, progress: &mut (dyn FnMut(&TuneProgress) + Send)) -> Result<TuneReport> {
        let (tensors, types) = self.bind(inputs)?;
        // Builds (or finds) the plan first: inputs that specialise by value are known then.
        self.plan(&tensors, types.clone())?;
        let bound = self.by_value.lock().map_err(|_| poisoned())?.clone();
        let mut values: Vec<Option<&Tensor>> = vec![None; tensors.len()];
        for &i in &bound {
            values[i] = Some(tensors[i]);
        }
        let spec = specialize(&self.graph, &self.ops, &self.order, &types, &values, self.limits).map_err(|e| e.into_error())?;
        let on = Devices { rules: &self.placement, rule_devs: &self.rule_devs, has_main_gpu: matches!(self.backend, Backend::Gpu), auto: self.auto_place };
        let placed = placement::place(&self.graph, &self.ops, &spec, &on)?;
        let devices: Vec<StepDevice> = placed
            .devices
            .iter()
            .map(|d| match *d {
                Dev::Cpu => StepDevice::Cpu,
                Dev::Gpu(k) => StepDevice::Gpu(self.gpus[k].0.clone()),
            })
            .collect();
        let mut report = tune::tune_steps(&self.graph, &self.ops, &spec, &devices, &self.choices, opts, progress)?;
        // Plans built before are rebuilt with the new choices on their next run.
        self.plans.lock().map_err(|_| poisoned())?.clear();
        if matches!(self.backend, Backend::Cpu) {
            self.check_in_model(inputs, &mut report)?;
        }
        Ok(report)
    }

    /// Keeps the CPU choices tuned now that also pay inside the model (see
    /// `tune::in_model`): the model is profiled with them and with the defaults, twice
    /// each in turn, and a choice whose node is not faster with it returns to the
    /// defaults, in the report, the session and its database.
    fn check_in_model(&self, inputs: &[(&str, &Tensor)], report: &mut TuneReport) -> Result<()> {
        let changed: Vec<usize> = (0..report.keys.len()).filter(|&i| report.keys[i].status == tune::KeyStatus::Tuned && !report.keys[i].values.is_empty()).collect();
        if changed.is_empty() {
            return Ok(());
        }
        let entry = |k: &tune::KeyReport, tuned: bool| tune::TuneEntry {
            values: if tuned { k.values.clone() } else { Default::default() },
            default_ms: k.default_ms,
            best_ms: if tuned { k.best_ms } else { k.default_ms },
            summary: k.summary.clone(),
        };
        let set = |tuned: bool| -> Result<()> {
            let entries = changed.iter().map(|&i| (report.keys[i].key.clone(), entry(&report.keys[i], tuned))).collect();
            self.choices.add_measured(&entries)?;
            self.plans.lock().map_err(|_| poisoned())?.clear();
            Ok(())
        };
        let measure = || -> Result<(HashMap<String, f64>, HashMap<String, f64>)> {
            // About a quarter of a second of runs per profile.
            let t = Instant::now();
            self.profile_on_pool(inputs, 1)?;
            let runs = (0.25 / t.elapsed().as_secs_f64().max(1e-6)).clamp(3.0, 50.0) as usize;
            let (mut with, mut without) = (HashMap::new(), HashMap::new());
            for _ in 0..2 {
                // Ends with the choices in place.
                for tuned in [false, true] {
                    set(tuned)?;
                    self.profile_on_pool(inputs, 1)?;
                    let into = if tuned { &mut with } else { &mut without };
                    for p in self.profile_on_pool(inputs, runs)? {
                        *into.entry(p.node).or_insert(0.0) += p.seconds;
                    }
                }
            }
            Ok((with, without))
        };
        let (with, without) = match measure() {
            Ok(m) => m,
            Err(e) => {
                // A model whose nodes a profile cannot time (one that runs in stages):
                // the choices stay as measured alone.
                log::info!("tuned choices not checked inside the model: {e}");
                set(true)?;
                return Ok(());
            }
        };
        // Milliseconds per run from the seconds summed over the two rounds.
        let ms = |summed: f64| summed / 2.0 * 1e3;
        let mut reverted = std::collections::BTreeMap::new();
        for l in tune::losing_choices(&report.keys, &changed, &with, &without) {
            let k = &mut report.keys[l.index];
            let why = format!("slower inside the model: {:.4} ms with it, {:.4} ms without", ms(l.with), ms(l.without));
            log::info!("{}: {} not kept: {why}", k.summary, tune::values_text(&k.values));
            k.rejected.push((tune::values_text(&k.values), why));
            k.values.clear();
            k.best_ms = k.default_ms;
            reverted.insert(k.key.clone(), entry(k, false));
        }
        if !reverted.is_empty() {
            self.choices.store(self.choices.cpu_device(), &reverted)?;
            self.plans.lock().map_err(|_| poisoned())?.clear();
        }
        Ok(())
    }

    /// The fingerprint of the session's device (its GPU, else the CPU at the session's
    /// thread count): what graph-level tuned choices are keyed by.
    pub fn device_fingerprint(&self) -> tune::DeviceFingerprint {
        match self.backend {
            Backend::Gpu => tune::DeviceFingerprint::gpu(&self.gpus[0].0.info),
            Backend::Cpu => self.workers.run(|| self.choices.cpu_device().clone()),
        }
    }

    /// A stored choice for a key made outside the session's plans (a graph-level choice:
    /// `kiln::graph_tuning`), looked up as kernels' choices are (embedded, measured,
    /// database); a choice whose values `params` do not offer is stale: None, with a
    /// warning.
    pub fn stored_choice(&self, key: &tune::TuneKey, params: &[kiln_ops::TuneParam]) -> Result<Option<(tune::TuneEntry, tune::ChoiceSource)>> {
        self.choices.find(key, &self.device_fingerprint(), params)
    }

    /// Stores a choice measured outside the session's tuner: used by this session's
    /// [`Session::stored_choice`] from now on, and written to its database (the file,
    /// when it has one and it could be written).
    pub fn store_choice(&self, key: &tune::TuneKey, entry: tune::TuneEntry) -> Result<Option<std::path::PathBuf>> {
        self.choices.store(&self.device_fingerprint(), &[(key.text(), entry)].into_iter().collect())
    }

    /// The tuning keys this session's plans looked up and found no choice for (summaries:
    /// op and input types), in key order.
    pub fn untuned(&self) -> Result<Vec<String>> {
        Ok(self.choices.untuned()?.into_iter().map(|(_, s)| s).collect())
    }
}
