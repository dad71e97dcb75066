//! Training: a [`Trainer`] compiles a model's training step (the compiler's
//! [`kiln_compiler::autodiff`]) into a session and runs it batch after batch, keeping
//! the parameters, running statistics and optimizer state between steps.
//!
//! It sits in the facade because it needs both the compiler (to build the step) and
//! the runtime (to run it); neither of those depends on it.
//!
//! The state is the session's carried state ([`kiln_runtime::Carried`]): bound to the
//! step as inputs, replaced by the step's outputs. On the CPU that is a hand-over of
//! buffers; on a GPU that runs the whole step in one submit it stays in device memory
//! and is read back only when asked for (checkpoints, export, [`Trainer::state`]).
//!
//! Data parallelism ([`Distributed`]): each worker's trainer compiles the step for its
//! rows of the global batch with the compiler's collectives in it (loss, gradients,
//! synchronized BatchNormalization), bound to the worker's communicator; the workers
//! start from rank 0's state and stay equal step after step.
use kiln_compiler::autodiff::{self, AutodiffError, DataParallel, Loss, MixedPrecision, Optimizer, StateKind, StateVar, TrainConfig, Trainable};
use kiln_compiler::passes::{self, Target};
use kiln_graph::{Graph, Tensor};
use kiln_ops::TensorType;
use kiln_runtime::{Carried, DeviceChoice, DeviceKind, RuntimeError, Session, SessionOptions};
use kiln_ops::collective::Communicator;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

mod checkpoint;
mod export;
pub mod schedule;

pub use export::export_onnx;
pub use schedule::{Decay, Schedule};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("building the training step: {0}")]
    Build(#[from] AutodiffError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The loss is NaN or infinite: the step's update was not applied.
    #[error("step {step}: the loss is {loss}; training stopped, the state is that after step {}", step - 1)]
    NonFinite { step: u64, loss: f32 },
    /// Mixed precision: the gradients stayed non-finite as the loss scale halved.
    #[error("step {step}: the gradients are not finite at any loss scale (the last tried: {scale:e}); training stopped, the state is that after step {}", step - 1)]
    NonFiniteGradients { step: u64, scale: f32 },
    #[error("{0}")]
    Data(String),
    #[error("checkpoint '{path}': {what}")]
    Checkpoint { path: String, what: String },
    #[error("exporting: {0}")]
    Export(String),
    /// A collective outside the step failed (the broadcast of the state).
    #[error("data parallelism: {0}")]
    Distributed(String),
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// A model to train: its graph, and the initializers its file declares (the
/// parameters and buffers; Constant nodes, which the importer also makes initializers,
/// never train).
pub struct Model {
    pub graph: Graph,
    pub initializers: Vec<String>,
}

/// Imports an ONNX model exported for training. Its ops are checked when the training
/// step is built (BatchNormalization's training mode, which has no inference kernel, is
/// lowered there), so the import itself checks only the structure.
pub fn import_model(path: &Path) -> Result<Model> {
    use prost::Message;
    let graph = kiln_compiler::onnx::import_file_unchecked(path).map_err(|e| TrainError::Data(e.to_string()))?;
    let bytes = std::fs::read(path).map_err(|e| TrainError::Data(format!("cannot read '{}': {e}", path.display())))?;
    let proto = kiln_compiler::onnx::proto::ModelProto::decode(bytes.as_slice()).map_err(|e| TrainError::Data(format!("'{}': {e}", path.display())))?;
    let initializers = proto.graph.map(|g| g.initializer.into_iter().map(|i| i.name).collect()).unwrap_or_default();
    Ok(Model { graph, initializers })
}

/// How to train.
pub struct TrainOptions {
    pub device: DeviceChoice,
    pub threads: Option<usize>,
    pub loss: Loss,
    pub optimizer: Optimizer,
    pub schedule: Schedule,
    /// The model output the loss reads (default: the first).
    pub output: Option<String>,
    /// Run the compiler's passes over the training step (fusion of the updates,
    /// layouts); on by default.
    pub optimize: bool,
    /// Seeds training-mode dropout: step `k` draws its masks from `seed` and `k`.
    pub seed: u64,
    /// Mixed precision, on GPUs with SHADER_F16 only (an error elsewhere).
    pub mixed_precision: Option<MixedPrecision>,
    /// This trainer is one worker of a data-parallel run.
    pub distributed: Option<Distributed>,
}

impl TrainOptions {
    pub fn new(loss: Loss, optimizer: Optimizer, schedule: Schedule) -> TrainOptions {
        TrainOptions { device: DeviceChoice::Cpu, threads: None, loss, optimizer, schedule, output: None, optimize: true, seed: 0, mixed_precision: None, distributed: None }
    }
}

/// One worker of data-parallel training. The batch the trainer is compiled for (the
/// model inputs' first dim) is this worker's rows of each global batch ([`shard`]).
#[derive(Clone)]
pub struct Distributed {
    /// The workers' engine (kiln-distributed's `Communicator` over MPI, say).
    pub comm: Arc<dyn Communicator>,
    /// The rows of every worker together.
    pub global_batch: usize,
    /// Gradients are summed in messages of about this many bytes, in reverse layer
    /// order (default 25 MB, as PyTorch's DistributedDataParallel).
    pub bucket_bytes: usize,
    /// BatchNormalization normalises with the global batch's statistics (default on:
    /// the run then equals one worker's on the whole batch).
    pub sync_batch_norm: bool,
    /// Each gradient bucket's all-reduce overlaps the rest of the backward pass, on the
    /// communicator's reduction thread; else (the default) it runs where the bucket is
    /// produced, backward waiting. Ranks sharing one machine's cores measured slower
    /// with overlap (docs/distributed.md).
    pub overlap: bool,
}

impl Distributed {
    pub fn new(comm: Arc<dyn Communicator>, global_batch: usize) -> Distributed {
        Distributed { comm, global_batch, bucket_bytes: autodiff::parallel::DEFAULT_BUCKET_BYTES, sync_batch_norm: true, overlap: false }
    }
}

/// The rows of a global batch of `global_batch` that worker `rank` of `size` takes:
/// consecutive, sizes differing by at most one.
pub fn shard(global_batch: usize, rank: usize, size: usize) -> std::ops::Range<usize> {
    let (base, extra) = (global_batch / size, global_batch % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// The rows worker `rank` takes when the workers share a global batch in proportion to
/// `weights` (their measured speeds, say): consecutive, each worker's share rounded
/// down but at least one row, the rows left over going by largest remainder (ties to
/// the lower rank). Weights that are not all positive and finite share equally
/// ([`shard`]).
pub fn weighted_shard(global_batch: usize, weights: &[f64], rank: usize) -> std::ops::Range<usize> {
    let n = weights.len();
    if n == 0 || global_batch < n || !weights.iter().all(|w| w.is_finite() && *w > 0.0) {
        return shard(global_batch, rank, n.max(1));
    }
    let total: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| w / total * global_batch as f64).collect();
    let mut rows: Vec<usize> = exact.iter().map(|e| (e.floor() as usize).max(1)).collect();
    // The minimum of one row may have given out too many: take them from the largest.
    while rows.iter().sum::<usize>() > global_batch {
        let k = (0..n).max_by_key(|&k| (rows[k], std::cmp::Reverse(k))).expect("workers");
        rows[k] -= 1;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    let mut left = global_batch - rows.iter().sum::<usize>();
    for &k in order.iter().cycle() {
        if left == 0 {
            break;
        }
        rows[k] += 1;
        left -= 1;
    }
    let start: usize = rows[..rank].iter().sum();
    start..start + rows[rank]
}

/// Mixed precision gives up after this many skipped steps in a row (the scale has then
/// halved as often: 2^16 down to 2^-48).
const MAX_SKIPPED_IN_ROW: u32 = 64;

/// What one step did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// 1 for the first step.
    pub step: u64,
    pub loss: f32,
    pub lr: f64,
    pub seconds: f64,
    /// With mixed precision: the loss scale this step ran at, and whether its update
    /// was skipped (a gradient was not finite at that scale; the step count stays, and
    /// the next batch runs at half the scale).
    pub loss_scale: Option<f32>,
    pub skipped: bool,
}

pub struct Trainer {
    session: Session,
    forward: Graph,
    data_inputs: Vec<(String, TensorType)>,
    label: (String, TensorType),
    prediction: TensorType,
    state_vars: Vec<StateVar>,
    /// The state's values, carried by the session from step to step.
    carried: Carried,
    step: u64,
    optimizer: Optimizer,
    schedule: Schedule,
    /// Positions of the loss and the prediction among the step's outputs other than
    /// the carried state.
    outputs: (usize, usize),
    /// The memory plan of the step's intermediates (after the first step).
    memory: Option<kiln_runtime::MemoryPlan>,
    options_threads: Option<usize>,
    device: DeviceChoice,
    /// The dropout seed input and the run's seed.
    dropout: Option<(String, u64)>,
    /// The step keeps the state itself when the loss is not finite
    /// (`TrainConfig::keep_state_unless_finite`).
    guarded: bool,
    /// With mixed precision: positions of the "applied" flag and the loss scale among
    /// the step's outputs other than the carried state.
    scaler: Option<(usize, usize)>,
    /// Steps skipped in a row (mixed precision).
    skipped_in_row: u32,
    /// The communicator of a data-parallel worker.
    comm: Option<Arc<dyn Communicator>>,
}

/// Memory of training against inference, in bytes.
#[derive(Clone, Debug)]
pub struct MemoryReport {
    /// The training step's intermediates (activations kept for the backward pass,
    /// gradients, update temporaries), as planned.
    pub step: kiln_runtime::MemoryPlan,
    /// The forward pass's intermediates alone, for the same batch.
    pub forward: kiln_runtime::MemoryPlan,
    /// Parameters, running statistics and optimizer slots.
    pub state_bytes: u64,
}

impl Trainer {
    /// Compiles the training step of `model` for inputs of these concrete types (the
    /// batch fixed).
    pub fn new(model: &Model, inputs: &[(String, TensorType)], options: TrainOptions) -> Result<Trainer> {
        let forward = &model.graph;
        let kind = kiln_runtime::device_kind(&options.device)?;
        if options.mixed_precision.is_some() && kind != DeviceKind::Gpu {
            return Err(TrainError::Data("mixed precision runs on GPUs with SHADER_F16; the CPU trains in f32 (leave out --mixed-precision or pick --device gpu)".into()));
        }
        let config = TrainConfig {
            inputs: inputs.to_vec(),
            output: options.output.clone(),
            loss: options.loss.clone(),
            optimizer: options.optimizer.clone(),
            trainable: Trainable::Among(model.initializers.clone()),
            // On a GPU the state stays in device memory, so the step itself keeps it
            // after a non-finite loss; on the CPU `step` puts the old values back.
            keep_state_unless_finite: kind == DeviceKind::Gpu,
            mixed_precision: options.mixed_precision.clone(),
            data_parallel: match &options.distributed {
                Some(d) => {
                    let rows = inputs.first().and_then(|(_, t)| t.dims.first().copied()).ok_or_else(|| TrainError::Data("data parallelism needs a model input with a batch dimension".into()))?;
                    Some(DataParallel { rows, global_batch: d.global_batch, bucket_bytes: d.bucket_bytes, sync_batch_norm: d.sync_batch_norm, overlap: d.overlap })
                }
                None => None,
            },
        };
        // A worker's collectives reduce through its communicator.
        let registry = options.distributed.as_ref().map(|d| {
            let mut r = kiln_ops::Registry::builtin().clone();
            kiln_ops::collective::bind(&mut r, d.comm.clone());
            r
        });
        let tg = autodiff::build(forward, &config, registry.as_ref().unwrap_or(kiln_ops::Registry::builtin()))?;
        let mut graph = tg.graph;
        if options.optimize {
            let target = match kind {
                DeviceKind::Cpu => Target::Cpu,
                DeviceKind::Gpu => Target::Gpu,
            };
            passes::optimize_for(&mut graph, target);
        }
        // A worker's runs wait on the other workers': in one process (threads as
        // workers) a shared thread pool would run them in turn, and deadlock.
        let private_threads = options.distributed.is_some();
        let session = Session::new(graph, SessionOptions { threads: options.threads, registry, private_threads, ..SessionOptions::device(options.device.clone()) })?;
        if options.mixed_precision.is_some() && !session.stores_halves() {
            return Err(TrainError::Data(format!("mixed precision needs a GPU with SHADER_F16; {} has none", session.device_name())));
        }
        let nexts: Vec<&str> = tg.state.iter().map(|s| s.next.as_str()).collect();
        let names: Vec<String> = session.output_names().into_iter().filter(|n| !nexts.contains(&n.as_str())).collect();
        let pos = |n: &str| names.iter().position(|o| o == n).ok_or_else(|| AutodiffError::Model(format!("the compiled training step lost its output '{n}'")));
        let outputs = (pos(&tg.loss)?, pos(&tg.prediction)?);
        let scaler = match &tg.mixed_precision {
            Some((applied, scale)) => Some((pos(applied)?, pos(scale)?)),
            None => None,
        };
        let pairs: Vec<(&str, &str)> = tg.state.iter().map(|s| (s.name.as_str(), s.next.as_str())).collect();
        let carried = session.carry(&pairs, tg.state.iter().map(|s| s.initial.clone()).collect())?;
        // `build` checked that every data input has a type in `inputs`.
        let data_inputs = inputs.iter().filter(|(n, _)| tg.data_inputs.contains(n)).cloned().collect();
        let comm = options.distributed.map(|d| d.comm);
        // Workers draw different dropout masks for their different rows.
        let seed = options.seed.wrapping_add(comm.as_ref().map_or(0, |c| c.rank() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut trainer = Trainer {
            session,
            forward: forward.clone(),
            data_inputs,
            label: (tg.label, tg.label_type),
            prediction: tg.prediction_type,
            carried,
            state_vars: tg.state,
            step: 0,
            optimizer: options.optimizer,
            schedule: options.schedule,
            outputs,
            memory: None,
            options_threads: options.threads,
            device: options.device,
            dropout: tg.dropout_seed.map(|n| (n, seed)),
            guarded: config.keep_state_unless_finite || scaler.is_some(),
            scaler,
            skipped_in_row: 0,
            comm,
        };
        trainer.broadcast_state()?;
        Ok(trainer)
    }

    /// With data parallelism: this worker's rank and the worker count.
    pub fn rank(&self) -> Option<(usize, usize)> {
        self.comm.as_ref().map(|c| (c.rank(), c.size()))
    }

    /// With data parallelism: every worker takes rank 0's state (its f32 values, in one
    /// message: rank 0's values plus zeros from the others, exact). Every worker must
    /// call it at the same point; `new` and `load_checkpoint` do.
    pub fn broadcast_state(&mut self) -> Result<()> {
        let Some(comm) = self.comm.clone() else { return Ok(()) };
        let values = self.carried.values()?;
        let f32s: Vec<usize> = (0..values.len()).filter(|&i| values[i].dtype() == kiln_graph::DType::F32).collect();
        let mut buf: Vec<f32> = Vec::with_capacity(f32s.iter().map(|&i| values[i].len()).sum());
        for &i in &f32s {
            let v = values[i].as_slice::<f32>().map_err(|e| TrainError::Distributed(e.to_string()))?;
            if comm.rank() == 0 {
                buf.extend_from_slice(v);
            } else {
                buf.resize(buf.len() + v.len(), 0.0);
            }
        }
        comm.all_reduce_sum(&mut buf).map_err(|e| TrainError::Distributed(format!("broadcasting rank 0's state: {e}")))?;
        let mut at = 0;
        for &i in &f32s {
            let n = values[i].len();
            let t = Tensor::from_vec(values[i].dims(), buf[at..at + n].to_vec()).map_err(|e| TrainError::Distributed(e.to_string()))?;
            at += n;
            self.carried.set(&self.state_vars[i].name, t)?;
        }
        Ok(())
    }

    /// Steps done so far.
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    pub fn device_name(&self) -> String {
        self.session.device_name()
    }

    /// The inputs one batch must give (the model's, batch fixed) and the label's type.
    pub fn batch_types(&self) -> (&[(String, TensorType)], &TensorType) {
        (&self.data_inputs, &self.label.1)
    }

    /// The type of the model output the loss reads, for one batch.
    pub fn prediction_type(&self) -> &TensorType {
        &self.prediction
    }

    /// The feeds of step `step` but the state (inputs, label, the optimizer's scalars).
    fn feeds<'a>(&'a self, inputs: &[(&'a str, &'a Tensor)], label: &'a Tensor, hyper: &'a [(&'a str, Tensor)]) -> Vec<(&'a str, &'a Tensor)> {
        let mut feeds: Vec<(&str, &Tensor)> = inputs.to_vec();
        feeds.push((self.label.0.as_str(), label));
        feeds.extend(hyper.iter().map(|(n, t)| (*n, t)));
        feeds
    }

    /// The per-step scalar inputs of step `step`: the optimizer's, and the dropout seed.
    fn hyper(&self, step: u64) -> (f64, Vec<(&str, Tensor)>) {
        let lr = self.schedule.lr(step);
        let mut v: Vec<(&str, Tensor)> = self.optimizer.hyper_inputs(step, lr).into_iter().map(|(n, v)| (n, Tensor::scalar(v))).collect();
        if let Some((name, seed)) = &self.dropout {
            let s = seed.wrapping_mul(1_000_003).wrapping_add(step) & 0x7fff_ffff;
            v.push((name.as_str(), Tensor::scalar(s as i64)));
        }
        (lr, v)
    }

    /// Traces the next step on this batch (host phases and one slice per kernel)
    /// without applying it: the state stays as it is.
    pub fn trace_step(&self, inputs: &[(&str, &Tensor)], label: &Tensor) -> Result<kiln_runtime::RunTrace> {
        let (_, hyper) = self.hyper(self.step + 1);
        let state = self.carried.values()?;
        let mut feeds = self.feeds(inputs, label, &hyper);
        feeds.extend(self.state_vars.iter().zip(&state).map(|(s, t)| (s.name.as_str(), t)));
        Ok(self.session.trace(&feeds)?)
    }

    /// One optimizer step on a batch: `inputs` by the model's input names, `label` as
    /// the loss takes it. A non-finite loss leaves the state as it was, on every device.
    pub fn step(&mut self, inputs: &[(&str, &Tensor)], label: &Tensor) -> Result<StepReport> {
        let lty = &self.label.1;
        if label.dtype() != lty.dtype || label.dims() != lty.dims.as_slice() {
            return Err(TrainError::Data(format!("the label must be {}{:?} for this model, loss and batch; got {}{:?}", lty.dtype, lty.dims, label.dtype(), label.dims())));
        }
        let started = Instant::now();
        let step = self.step + 1;
        let (lr, hyper) = self.hyper(step);
        // Without the step's own guard: the state to put back after a non-finite loss
        // (tensors are shared, not copied).
        let before = if self.guarded { None } else { Some(self.carried.values()?) };
        let (out, stats) = self.session.run_carried(&self.carried, &self.feeds(inputs, label, &hyper))?;
        if stats.memory.is_some() {
            self.memory = stats.memory;
        }
        let loss = out[self.outputs.0].to_f64_vec().first().copied().unwrap_or(f64::NAN) as f32;
        if !loss.is_finite() {
            for (s, v) in self.state_vars.iter().zip(before.into_iter().flatten()) {
                self.carried.set(&s.name, v)?;
            }
            return Err(TrainError::NonFinite { step, loss });
        }
        let (mut loss_scale, mut skipped) = (None, false);
        if let Some((applied, scale)) = self.scaler {
            skipped = out[applied].to_f64_vec().first() != Some(&1.0);
            loss_scale = out[scale].to_f64_vec().first().map(|&s| s as f32);
        }
        if skipped {
            self.skipped_in_row += 1;
            if self.skipped_in_row >= MAX_SKIPPED_IN_ROW {
                return Err(TrainError::NonFiniteGradients { step, scale: loss_scale.unwrap_or(f32::NAN) });
            }
        } else {
            self.skipped_in_row = 0;
            self.step = step;
        }
        Ok(StepReport { step, loss, lr, seconds: started.elapsed().as_secs_f64(), loss_scale, skipped })
    }

    /// The current value of every state variable (parameters, running statistics,
    /// optimizer slots), by name; read back from the device where it lives there.
    pub fn state(&self) -> Result<Vec<(&StateVar, Tensor)>> {
        Ok(self.state_vars.iter().zip(self.carried.values()?).collect())
    }

    /// The current value of a parameter or running statistic, by initializer name.
    pub fn parameter(&self, name: &str) -> Result<Option<Tensor>> {
        match self.state_vars.iter().find(|s| s.name == name && !matches!(s.kind, StateKind::Slot { .. } | StateKind::LossScale)) {
            Some(s) => Ok(Some(self.carried.get(&s.name)?)),
            None => Ok(None),
        }
    }

    /// Whether the state is in device memory between steps now (a GPU session whose
    /// step runs in one submit).
    pub fn state_on_device(&self) -> bool {
        self.carried.on_device()
    }

    /// The model for inference with the current weights: initializers replaced,
    /// BatchNormalization in inference mode (running statistics), Dropout the identity.
    pub fn inference_graph(&self) -> Result<Graph> {
        let mut g = self.forward.clone();
        for (s, t) in self.state()? {
            if matches!(s.kind, StateKind::Slot { .. } | StateKind::LossScale) {
                continue;
            }
            if let Some(v) = g.find_value(&s.name) {
                g.initializers.insert(v, t.clone());
            }
        }
        for n in &mut g.nodes {
            if n.op_type == "Dropout" && n.domain.is_empty() {
                n.inputs.truncate(2);
            }
            if n.op_type == "BatchNormalization" && n.domain.is_empty() && autodiff::lower::is_training_bn(n) {
                n.attrs.remove("training_mode");
                let stats = n.outputs.split_off(1);
                g.outputs.retain(|o| !stats.contains(o));
            }
        }
        Ok(g)
    }

    /// Seconds of one forward pass (the inference graph, on the trainer's device) over
    /// a batch: the median of three runs after a warm-up. Data-parallel workers on
    /// different devices share the global batch by it (`weighted_shard`); it runs no
    /// collective.
    pub fn forward_seconds(&self, inputs: &[(&str, &Tensor)]) -> Result<f64> {
        let session = Session::new(self.inference_graph()?, SessionOptions { threads: self.options_threads, ..SessionOptions::device(self.device.clone()) })?;
        session.run(inputs)?;
        let mut times: Vec<f64> = (0..3)
            .map(|_| {
                let t = Instant::now();
                session.run(inputs).map(|_| t.elapsed().as_secs_f64())
            })
            .collect::<Result<_, _>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times[1])
    }

    /// The step's planned memory against the forward pass alone on the same batch
    /// (`inputs`: one batch), once a step has run (else `None`).
    pub fn memory_report(&self, inputs: &[(&str, &Tensor)]) -> Result<Option<MemoryReport>> {
        let Some(step) = self.memory.clone() else { return Ok(None) };
        let session = Session::new(self.inference_graph()?, SessionOptions { threads: self.options_threads, ..SessionOptions::device(self.device.clone()) })?;
        let (_, stats) = session.run_with_stats(inputs)?;
        let Some(forward) = stats.memory else { return Ok(None) };
        let state_bytes = self.state_vars.iter().map(|s| s.initial.bytes().len() as u64).sum();
        Ok(Some(MemoryReport { step, forward, state_bytes }))
    }

    /// Saves the state and the step count (a .npz file numpy opens).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        checkpoint::save(self, path)
    }

    /// Restores a checkpoint of this model and optimizer: training goes on from its
    /// step, bit for bit as if it had not stopped (on the CPU).
    /// With data parallelism every worker reads the file, then takes rank 0's values.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        checkpoint::load(self, path)?;
        self.broadcast_state()
    }
}

#[cfg(test)]
mod tests {
    use super::{shard, weighted_shard};

    /// Shares cover the batch in order, every worker gets a row, and rows follow the
    /// weights (largest remainder).
    #[test]
    fn weighted_shards_cover_the_batch_in_proportion() {
        for (batch, weights, want) in [
            (64usize, vec![1.0, 1.0], vec![32usize, 32]),
            (64, vec![99.0, 1.0], vec![63, 1]),
            (64, vec![1e6, 1.0], vec![63, 1]),
            (10, vec![1.0, 2.0, 2.0], vec![2, 4, 4]),
            (7, vec![3.0, 1.0], vec![5, 2]),
            (5, vec![f64::NAN, 1.0], vec![3, 2]),
        ] {
            let got: Vec<usize> = (0..weights.len()).map(|r| weighted_shard(batch, &weights, r).len()).collect();
            assert_eq!(got, want, "batch {batch}, weights {weights:?}");
            let mut next = 0;
            for r in 0..weights.len() {
                let s = weighted_shard(batch, &weights, r);
                assert_eq!(s.start, next);
                next = s.end;
            }
            assert_eq!(next, batch);
        }
        assert_eq!(shard(10, 2, 3), 7..10);
    }
}
