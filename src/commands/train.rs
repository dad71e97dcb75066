//! `kiln train`: train an ONNX model on .npy data (x and y), report loss and
//! throughput per step, evaluate, checkpoint, and export the trained model as ONNX.
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use kiln::compiler::autodiff::{Loss, MixedPrecision, Optimizer, OptimizerKind};
use kiln::graph::rng::Rng;
use kiln::graph::Tensor;
use kiln::ops::TensorType;
use kiln::runtime::{npy, DeviceChoice, Session, SessionOptions};
use kiln::train::{Decay, Schedule, TrainError, TrainOptions, Trainer};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The model (.onnx), exported for training (PyTorch: TrainingMode.TRAINING).
    model: PathBuf,
    /// Training data: a folder with x.npy and y.npy (or train_x.npy and train_y.npy),
    /// one sample per row of each.
    #[arg(long)]
    data: PathBuf,
    /// The loss: cross_entropy (integer class labels) or mse (float targets).
    #[arg(long, default_value = "cross_entropy")]
    loss: String,
    /// Cross-entropy's label smoothing.
    #[arg(long, default_value_t = 0.0)]
    label_smoothing: f32,
    /// Cross-entropy: labels equal to this count for nothing.
    #[arg(long)]
    ignore_index: Option<i64>,
    /// sgd, lars, adam or adamw.
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// The learning rate (after warmup, before decay).
    #[arg(long)]
    lr: f64,
    /// SGD and LARS momentum (default 0 for SGD, 0.9 for LARS).
    #[arg(long)]
    momentum: Option<f32>,
    #[arg(long)]
    nesterov: bool,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// Adam's betas, B1,B2.
    #[arg(long, default_value = "0.9,0.999")]
    betas: String,
    /// Adam's epsilon.
    #[arg(long, default_value_t = 1e-8)]
    eps: f32,
    /// LARS's trust coefficient.
    #[arg(long, default_value_t = 0.001)]
    trust: f32,
    /// Learning-rate decay after warmup: constant, step:EVERY:GAMMA, cosine[:MIN_LR] or
    /// poly:POWER[:END_LR].
    #[arg(long, default_value = "constant")]
    schedule: String,
    /// Steps of linear warmup.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Clip the gradients' global L2 norm to this.
    #[arg(long)]
    clip_norm: Option<f32>,
    /// Samples per step (the last partial batch of an epoch is dropped).
    #[arg(long)]
    batch: usize,
    /// Optimizer steps to run (a resumed run counts those already done).
    #[arg(long, conflicts_with = "epochs")]
    steps: Option<u64>,
    /// Passes over the data (default 1 when --steps is not given).
    #[arg(long)]
    epochs: Option<u64>,
    /// Seed of the per-epoch shuffle and of dropout's masks.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// cpu, gpu, or an adapter name / gpu:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Matrix products in f16 with f32 master weights and dynamic loss scaling (GPUs
    /// with SHADER_F16 only).
    #[arg(long)]
    mixed_precision: bool,
    /// The first loss scale of --mixed-precision.
    #[arg(long, default_value_t = 65536.0, requires = "mixed_precision")]
    loss_scale: f32,
    /// Held-out data, evaluated at the end (x.npy and y.npy, or test_x.npy and test_y.npy).
    #[arg(long)]
    eval: Option<PathBuf>,
    /// Where to save the training state (.npz): at the end, every --checkpoint-every
    /// steps, and when a step fails (the last good state).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
    /// Go on from a checkpoint of this model and optimizer.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Write the trained model here (ONNX, BatchNormalization in inference mode).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// One JSON object per logged step, then one with the evaluation.
    #[arg(long)]
    json: bool,
    /// After training, trace one more step (not applied) and print its slowest kernels.
    #[arg(long)]
    profile: bool,
    /// Log every N steps.
    #[arg(long, default_value_t = 1)]
    log_every: u64,
    /// Data-parallel training: run under `mpirun -np N`; each rank trains on its share
    /// of every --batch (the global batch), gradients summed over MPI. Rank 0 logs,
    /// checkpoints, evaluates and exports. Needs a kiln built with `--features mpi`.
    #[arg(long)]
    distributed: bool,
    /// The gradients' all-reduce: ring (Baidu's, over MPI point-to-point messages), mpi
    /// (MPI_Allreduce) or hierarchical (within each machine, then a ring across
    /// machines).
    #[arg(long, default_value = "ring", requires = "distributed")]
    allreduce: String,
    /// Gradients are summed in buckets of this many MB, in reverse layer order.
    #[arg(long, default_value_t = 25.0, requires = "distributed")]
    bucket_mb: f64,
    /// Each rank's BatchNormalization uses its own rows' statistics (default: the global
    /// batch's, synchronized).
    #[arg(long, requires = "distributed")]
    no_sync_batch_norm: bool,
    /// Overlap each gradient bucket's reduction with the rest of the backward pass (on a
    /// reduction thread); default: reduce each bucket where backward produces it. Off by
    /// default because ranks sharing one machine's cores measured slower with it (see
    /// docs/distributed.md).
    #[arg(long, requires = "distributed")]
    overlap: bool,
    /// End the job when an all-reduce has waited this many seconds for the other ranks
    /// (a rank hangs, or died unnoticed), naming the rank that waits.
    #[arg(long, default_value_t = 300.0, requires = "distributed")]
    collective_timeout: f64,
    /// Share each global batch between the ranks in proportion to their devices'
    /// measured forward speed (ranks on a CPU and on a GPU, say), instead of equally.
    #[arg(long, requires = "distributed")]
    balance: bool,
    /// Gradient compression: f16 sends the ring's values as f16 (half the bytes, summed
    /// in f32; with --allreduce ring or hierarchical).
    #[arg(long, requires = "distributed")]
    compress: Option<String>,
    /// With --allreduce hierarchical: take each N consecutive ranks as one machine
    /// (default: the ranks that share memory).
    #[arg(long, requires = "distributed")]
    ranks_per_node: Option<usize>,
}

/// A data-parallel run's communicator, and what its reductions did so far.
type Comm = (std::sync::Arc<dyn kiln::ops::collective::Communicator>, Box<dyn Fn() -> kiln::distributed::CommStats>);

/// The MPI job's communicator, when --distributed.
#[cfg(feature = "mpi")]
fn communicator(a: &Args) -> Result<Option<Comm>> {
    use kiln::distributed::{mpi_transport::MpiTransport, Algorithm, Communicator};
    if !a.distributed {
        return Ok(None);
    }
    let algorithm: Algorithm = a.allreduce.parse().map_err(anyhow::Error::msg)?;
    if !(a.collective_timeout.is_finite() && a.collective_timeout > 0.0) {
        bail!("--collective-timeout must be a number of seconds above 0, found {}", a.collective_timeout);
    }
    let timeout = std::time::Duration::from_secs_f64(a.collective_timeout);
    let f16_wire = match a.compress.as_deref() {
        None | Some("none") => false,
        Some("f16") if algorithm == Algorithm::Native => bail!("--compress f16 sends the ring's values as f16; MPI's Allreduce (--allreduce mpi) sums f32 only: pick --allreduce ring or hierarchical"),
        Some("f16") => true,
        Some(c) => bail!("unknown --compress '{c}' (expected f16 or none)"),
    };
    let world = MpiTransport::init()?;
    let comm = match algorithm {
        Algorithm::Hierarchical => {
            let (local, cross) = world.two_levels(a.ranks_per_node)?;
            Communicator::hierarchical(world, local, cross)
        }
        _ => Communicator::new(world, algorithm),
    };
    let comm = if f16_wire { comm.with_f16_wire() } else { comm };
    let comm = std::sync::Arc::new(comm.with_watchdog(timeout, |m| {
        eprintln!("kiln: {m}; ending the job");
        kiln::distributed::mpi_transport::abort(WATCHDOG_EXIT_CODE)
    })?);
    let stats = comm.clone();
    Ok(Some((comm, Box::new(move || stats.stats()))))
}

#[cfg(not(feature = "mpi"))]
fn communicator(a: &Args) -> Result<Option<Comm>> {
    if a.distributed {
        bail!("--distributed needs a kiln built with MPI: `cargo build --release --features mpi` (Open MPI and libclang: apt-get install openmpi-bin libopenmpi-dev libclang-dev), then `mpirun -np N target/release/kiln train ... --distributed`");
    }
    Ok(None)
}

/// The exit code of a job the collectives' watchdog ended.
#[cfg(feature = "mpi")]
const WATCHDOG_EXIT_CODE: i32 = 75;

/// Ends the whole MPI job after this rank's error (the other ranks would wait for it
/// in their next collective forever).
#[cfg(feature = "mpi")]
fn abort_job(rank: usize, e: &anyhow::Error) -> ! {
    eprintln!("kiln: rank {rank}: {e:#}");
    kiln::distributed::mpi_transport::abort(1)
}

#[cfg(not(feature = "mpi"))]
fn abort_job(rank: usize, e: &anyhow::Error) -> ! {
    unreachable!("rank {rank} without MPI: {e:#}")
}

/// x and y of a data folder: `x.npy`/`y.npy`, else `{prefix}_x.npy`/`{prefix}_y.npy`.
fn read_xy(dir: &Path, prefix: &str) -> Result<(Tensor, Tensor)> {
    let pick = |name: &str| -> Result<PathBuf> {
        let plain = dir.join(format!("{name}.npy"));
        let prefixed = dir.join(format!("{prefix}_{name}.npy"));
        if plain.is_file() {
            Ok(plain)
        } else if prefixed.is_file() {
            Ok(prefixed)
        } else {
            bail!("'{}' holds neither {name}.npy nor {prefix}_{name}.npy", dir.display())
        }
    };
    let (xp, yp) = (pick("x")?, pick("y")?);
    let x = npy::read_file(&xp)?;
    let y = npy::read_file(&yp)?;
    if x.dims().first() != y.dims().first() || x.dims().is_empty() {
        bail!("'{}' has {} samples but '{}' has {}: x and y must hold one sample per row each", xp.display(), x.dims().first().unwrap_or(&0), yp.display(), y.dims().first().unwrap_or(&0));
    }
    Ok((x, y))
}

/// Rows `rows` of `t`.
fn rows(t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let row: usize = t.dims()[1..].iter().product::<usize>() * t.dtype().size();
    let mut bytes = Vec::with_capacity(rows.len() * row);
    for &r in rows {
        bytes.extend_from_slice(&t.bytes()[r * row..(r + 1) * row]);
    }
    let mut dims = t.dims().to_vec();
    dims[0] = rows.len();
    Tensor::from_bytes(t.dtype(), &dims, &bytes).with_context(|| format!("cannot take rows of a {} array", t.dtype()))
}

/// The sample indices of step `k` (0-based): epoch `k / per_epoch`, shuffled by a
/// generator seeded with the seed and the epoch, so a resumed run sees the same batches.
fn batch_indices(k: u64, per_epoch: u64, batch: usize, samples: usize, seed: u64) -> Vec<usize> {
    let epoch = k / per_epoch;
    let mut perm: Vec<usize> = (0..samples).collect();
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(epoch));
    for i in (1..samples).rev() {
        let u = (rng.next_f32() as f64 + 1.0) / 2.0;
        let j = ((u * (i + 1) as f64) as usize).min(i);
        perm.swap(i, j);
    }
    let at = (k % per_epoch) as usize * batch;
    perm[at..at + batch].to_vec()
}

/// Labels as the loss takes them: class indices as i64, checked against the class
/// count; float targets as they are.
fn labels(y: Tensor, loss: &Loss, classes: usize, ignore: Option<i64>) -> Result<Tensor> {
    match loss {
        Loss::CrossEntropy { .. } => {
            if !y.dtype().is_int() {
                bail!("cross-entropy needs integer class labels in y, found {}", y.dtype());
            }
            let v = y.to_i64_vec()?;
            if let Some((i, l)) = v.iter().enumerate().find(|(_, &l)| Some(l) != ignore && (l < 0 || l as usize >= classes)) {
                bail!("label {l} of sample {i} is not a class of the model's {classes} (0 to {})", classes.saturating_sub(1));
            }
            Ok(Tensor::from_vec(y.dims(), v)?)
        }
        Loss::MeanSquaredError => {
            if !y.dtype().is_float() {
                bail!("mse needs float targets in y, found {}", y.dtype());
            }
            Ok(y)
        }
        Loss::ModelOutput { .. } => Ok(y),
    }
}

fn optimizer(a: &Args) -> Result<Optimizer> {
    let betas: Vec<f32> = a.betas.split(',').map(|b| b.trim().parse::<f32>()).collect::<Result<_, _>>().with_context(|| format!("--betas '{}' must be two numbers, B1,B2", a.betas))?;
    let [beta1, beta2] = betas[..] else { bail!("--betas '{}' must be two numbers, B1,B2", a.betas) };
    let kind = match a.optimizer.as_str() {
        "sgd" => OptimizerKind::Sgd { momentum: a.momentum.unwrap_or(0.0), nesterov: a.nesterov },
        "lars" => OptimizerKind::Lars { momentum: a.momentum.unwrap_or(0.9), trust: a.trust },
        "adam" => OptimizerKind::Adam { beta1, beta2, eps: a.eps },
        "adamw" => OptimizerKind::AdamW { beta1, beta2, eps: a.eps },
        o => bail!("unknown optimizer '{o}' (expected sgd, lars, adam or adamw)"),
    };
    if a.nesterov && !matches!(kind, OptimizerKind::Sgd { momentum, .. } if momentum > 0.0) {
        bail!("--nesterov needs --optimizer sgd with a --momentum above 0");
    }
    Ok(Optimizer { kind, weight_decay: a.weight_decay, clip_norm: a.clip_norm })
}

pub fn main(a: Args) -> Result<()> {
    let comm = communicator(&a)?;
    let rank = comm.as_ref().map(|c| c.0.rank());
    match train(a, comm) {
        Err(e) if rank.is_some() => abort_job(rank.unwrap_or(0), &e),
        other => other,
    }
}

fn train(mut a: Args, comm: Option<Comm>) -> Result<()> {
    let (rank, ranks) = comm.as_ref().map_or((0, 1), |c| (c.0.rank(), c.0.size()));
    // Only rank 0 speaks, and writes files; the others train.
    let root = rank == 0;
    if !root {
        a.json = false;
    }
    let quiet = a.json || !root;
    let loss = match a.loss.as_str() {
        "cross_entropy" => Loss::CrossEntropy { ignore_index: a.ignore_index, label_smoothing: a.label_smoothing },
        "mse" => Loss::MeanSquaredError,
        l => bail!("unknown loss '{l}' (expected cross_entropy or mse)"),
    };
    let opt = optimizer(&a)?;
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if !(a.lr.is_finite() && a.lr >= 0.0) {
        bail!("--lr must be a finite number of at least 0, found {}", a.lr);
    }
    let decay: Decay = a.schedule.parse().map_err(anyhow::Error::msg)?;
    let (x, y) = read_xy(&a.data, "train")?;
    let samples = x.dims()[0];
    if samples < a.batch {
        bail!("--batch {} is more than the {} samples of '{}'", a.batch, samples, a.data.display());
    }
    if a.batch < ranks {
        bail!("--batch {} gives no rows to some of the {ranks} ranks: the global batch needs at least one row per rank", a.batch);
    }
    // This rank's rows of each global batch.
    let mut mine = kiln::train::shard(a.batch, rank, ranks);
    let per_epoch = (samples / a.batch) as u64;
    let total = match (a.steps, a.epochs) {
        (Some(s), _) => s,
        (None, e) => e.unwrap_or(1) * per_epoch,
    };
    let model = kiln::train::import_model(&a.model)?;
    let graph = &model.graph;
    let data_inputs: Vec<_> = graph.inputs.iter().filter(|v| !graph.initializers.contains_key(v)).copied().collect();
    let [input] = data_inputs[..] else {
        bail!("kiln train feeds one model input from x.npy; '{}' has {}", a.model.display(), data_inputs.len());
    };
    let input_name = graph.values[input].name.clone();
    let declared = graph.values[input].ty.clone();
    if let Some(t) = &declared {
        if t.dtype != x.dtype() {
            bail!("the model's input '{input_name}' is {}, x.npy holds {}", t.dtype, x.dtype());
        }
        if t.shape.rank() != x.dims().len() {
            bail!("the model's input '{input_name}' has rank {}, x.npy's samples {:?} give rank {}", t.shape.rank(), &x.dims()[1..], x.dims().len());
        }
    }
    if comm.is_some() && !(a.bucket_mb.is_finite() && a.bucket_mb >= 0.0) {
        bail!("--bucket-mb must be a number of at least 0, found {}", a.bucket_mb);
    }
    // The training step compiled for `rows` rows of each batch.
    let build = |rows: usize| -> Result<Trainer> {
        let mut dims = x.dims().to_vec();
        dims[0] = rows;
        let input_ty = TensorType::new(x.dtype(), dims);
        let schedule = Schedule { base: a.lr, warmup: a.warmup, decay: decay.clone(), total };
        let mut options = TrainOptions::new(loss.clone(), opt.clone(), schedule);
        options.device = a.device.clone();
        options.threads = a.threads;
        options.seed = a.seed;
        if a.mixed_precision {
            options.mixed_precision = Some(MixedPrecision { init_scale: a.loss_scale, ..MixedPrecision::default() });
        }
        if let Some((comm, _)) = &comm {
            options.distributed = Some(kiln::train::Distributed {
                bucket_bytes: (a.bucket_mb * 1024.0 * 1024.0) as usize,
                sync_batch_norm: !a.no_sync_batch_norm,
                overlap: a.overlap,
                ..kiln::train::Distributed::new(comm.clone(), a.batch)
            });
        }
        Ok(Trainer::new(&model, &[(input_name.clone(), input_ty)], options)?)
    };
    let compiling = Progress::spinner("compiling the training step", quiet);
    let mut trainer = build(mine.len())?;
    // Ranks on devices of different speeds: the global batch shared by each rank's
    // measured forward speed, and the step compiled again for the new shares.
    let mut rows_per_rank: Vec<usize> = (0..ranks).map(|r| kiln::train::shard(a.batch, r, ranks).len()).collect();
    if let (Some((comm, _)), true) = (&comm, a.balance) {
        let idx = batch_indices(0, per_epoch, a.batch, samples, a.seed);
        let seconds = trainer.forward_seconds(&[(input_name.as_str(), &rows(&x, &idx[mine.clone()])?)])?;
        let mut speeds = vec![0f32; ranks];
        speeds[rank] = (mine.len() as f64 / seconds.max(1e-9)) as f32;
        comm.all_reduce_sum(&mut speeds).map_err(anyhow::Error::msg)?;
        let weights: Vec<f64> = speeds.iter().map(|&v| v as f64).collect();
        mine = kiln::train::weighted_shard(a.batch, &weights, rank);
        rows_per_rank = (0..ranks).map(|r| kiln::train::weighted_shard(a.batch, &weights, r).len()).collect();
        if !quiet {
            eprintln!("balanced by measured forward speed ({}): rows per rank {rows_per_rank:?}", speeds.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ") + " rows/s");
        }
        drop(trainer);
        trainer = build(mine.len())?;
    }
    compiling.finish();
    let classes = trainer.prediction_type().dims.last().copied().unwrap_or(0);
    let y = labels(y, &loss, classes, a.ignore_index)?;
    if y.dims() != &[&[samples][..], &trainer.batch_types().1.dims[1..]].concat()[..] {
        bail!("y.npy is {:?}; this model and loss need one label of {:?} per sample", y.dims(), &trainer.batch_types().1.dims[1..]);
    }
    if let Some(r) = &a.resume {
        trainer.load_checkpoint(r)?;
        if !quiet {
            eprintln!("resumed from '{}' after step {}", r.display(), trainer.steps_done());
        }
    }
    if !quiet {
        let on = if ranks > 1 { format!("{ranks} ranks (rank 0 on {})", trainer.device_name()) } else { trainer.device_name() };
        println!("training '{}' on {on}: {} samples, batch {}, {} steps ({} per epoch)", a.model.display(), samples, a.batch, total, per_epoch);
    }
    let bar = Progress::bar(total, "steps", quiet);
    let started = Instant::now();
    let first = trainer.steps_done();
    let mut last_loss = f32::NAN;
    while trainer.steps_done() < total {
        let k = trainer.steps_done();
        let idx = batch_indices(k, per_epoch, a.batch, samples, a.seed);
        let idx = &idx[mine.clone()];
        let (xb, yb) = (rows(&x, idx)?, rows(&y, idx)?);
        let rep = match trainer.step(&[(input_name.as_str(), &xb)], &yb) {
            Ok(r) => r,
            Err(e) => {
                if let (Some(c), true) = (&a.checkpoint, root) {
                    trainer.save_checkpoint(c)?;
                    eprintln!("the state after step {} is saved in '{}'", trainer.steps_done(), c.display());
                }
                return Err(e.into());
            }
        };
        last_loss = rep.loss;
        let sps = a.batch as f64 / rep.seconds;
        bar.set(rep.step, &format!("loss {:.4}  {:.0} samples/s", rep.loss, sps));
        if !root {
            continue;
        }
        if rep.step % a.log_every.max(1) == 0 || rep.step == total {
            if a.json {
                let mut line = json!({"step": rep.step, "loss": rep.loss, "lr": rep.lr, "samples_per_s": sps});
                if let Some(scale) = rep.loss_scale {
                    line["loss_scale"] = json!(scale);
                    line["skipped"] = json!(rep.skipped);
                }
                println!("{line}");
            } else if !bar.is_shown() {
                let scale = rep.loss_scale.map(|s| format!("  loss scale {s}{}", if rep.skipped { " (gradients not finite: skipped)" } else { "" })).unwrap_or_default();
                println!("step {:>6}  loss {:.6}  lr {:.3e}  {:.0} samples/s{scale}", rep.step, rep.loss, rep.lr, sps);
            }
        }
        if let Some(c) = &a.checkpoint {
            if a.checkpoint_every > 0 && rep.step % a.checkpoint_every == 0 {
                trainer.save_checkpoint(c)?;
            }
        }
    }
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    let done = trainer.steps_done() - first;
    // What the reductions did on this rank during the steps.
    let comm_stats = comm.as_ref().map(|c| c.1());
    if let (Some(c), true) = (&a.checkpoint, root) {
        trainer.save_checkpoint(c)?;
    }
    if a.profile {
        // Every rank traces (the step's collectives pair up); rank 0 prints.
        let idx = batch_indices(trainer.steps_done(), per_epoch, a.batch, samples, a.seed);
        let idx = &idx[mine.clone()];
        let trace = trainer.trace_step(&[(input_name.as_str(), &rows(&x, idx)?)], &rows(&y, idx)?)?;
        if !root {
            return Ok(());
        }
        let mut slices: Vec<_> = trace.slices.iter().filter(|s| s.category != "host").collect();
        slices.sort_by(|p, q| q.duration.cmp(&p.duration));
        let total: f64 = slices.iter().map(|s| s.duration.as_secs_f64()).sum();
        eprintln!("one step: {} kernels, {:.3} ms of kernel time; the slowest:", trace.kernels, total * 1e3);
        let shown = if log::log_enabled!(log::Level::Info) { slices.len() } else { 15 };
        for s in slices.iter().take(shown) {
            eprintln!("  {:>9.3} ms  {}", s.duration.as_secs_f64() * 1e3, s.name);
        }
    }
    if !root {
        return Ok(());
    }
    let memory = {
        let idx = batch_indices(0, per_epoch, a.batch, samples, a.seed);
        trainer.memory_report(&[(input_name.as_str(), &rows(&x, &idx[mine.clone()])?)])?
    };
    let eval = match &a.eval {
        Some(dir) => Some(evaluate(&trainer, dir, &loss, classes, &a)?),
        None => None,
    };
    if let Some(o) = &a.output {
        kiln::train::export_onnx(&trainer, &a.model, o)?;
    }
    let samples_per_s = (done as f64 * a.batch as f64) / seconds.max(1e-9);
    if a.json {
        let memory = memory.as_ref().map(|m| json!({"step_bytes": m.step.planned, "forward_bytes": m.forward.planned, "step_lower_bound_bytes": m.step.lower_bound, "state_bytes": m.state_bytes}));
        let allreduce = comm_stats.map(|s| json!({"calls": s.calls, "bytes": s.bytes, "sent_bytes": s.traffic.sent, "received_bytes": s.traffic.received, "seconds": s.seconds, "blocked_seconds": s.blocked}));
        println!("{}", json!({"final": true, "steps": trainer.steps_done(), "loss": last_loss, "seconds": seconds, "samples_per_s": samples_per_s, "eval": eval, "memory": memory, "state_on_device": trainer.state_on_device(), "ranks": ranks, "rows_per_rank": rows_per_rank, "allreduce": allreduce, "output": a.output.as_ref().map(|p| p.display().to_string()), "checkpoint": a.checkpoint.as_ref().map(|p| p.display().to_string())}));
    } else {
        println!("{done} steps in {seconds:.2} s ({samples_per_s:.0} samples/s), last loss {last_loss:.6}");
        if let Some(m) = &memory {
            println!(
                "memory: the step plans {} KiB of intermediates ({:.1}x the forward pass's {} KiB), plus {} KiB of parameters and optimizer state{}",
                m.step.planned / 1024,
                m.step.planned as f64 / m.forward.planned.max(1) as f64,
                m.forward.planned / 1024,
                m.state_bytes / 1024,
                if trainer.state_on_device() { " (kept in device memory between steps)" } else { "" }
            );
        }
        if let Some(e) = &eval {
            println!("evaluation on '{}': {}", a.eval.as_ref().unwrap().display(), e);
        }
        if let Some(o) = &a.output {
            println!("trained model written to '{}'", o.display());
        }
    }
    Ok(())
}

/// Loss (and accuracy, for classes) of the current weights on held-out data, by an
/// inference session over the trained model.
fn evaluate(t: &Trainer, dir: &Path, loss: &Loss, classes: usize, a: &Args) -> Result<serde_json::Value> {
    let (x, y) = read_xy(dir, "test")?;
    let y = labels(y, loss, classes, a.ignore_index)?;
    let g = t.inference_graph()?;
    let input = g.inputs.iter().find(|v| !g.initializers.contains_key(v)).map(|&v| g.values[v].name.clone()).context("the model has no input")?;
    let session = Session::new(g, SessionOptions { threads: a.threads, ..SessionOptions::device(a.device.clone()) })?;
    let n = x.dims()[0];
    let (mut total, mut correct, mut counted) = (0.0f64, 0usize, 0usize);
    let chunk = 256;
    for start in (0..n).step_by(chunk) {
        let idx: Vec<usize> = (start..(start + chunk).min(n)).collect();
        let (xb, yb) = (rows(&x, &idx)?, rows(&y, &idx)?);
        let out = session.run(&[(input.as_str(), &xb)]).map_err(TrainError::from)?;
        let pred = out[0].to_f64_vec();
        match loss {
            Loss::CrossEntropy { ignore_index, .. } => {
                let labels = yb.to_i64_vec()?;
                for (r, &l) in labels.iter().enumerate() {
                    if Some(l) == *ignore_index {
                        continue;
                    }
                    let row = &pred[r * classes..(r + 1) * classes];
                    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                    total += lse - row[l as usize];
                    let arg = row.iter().enumerate().fold(0, |b, (i, v)| if *v > row[b] { i } else { b });
                    correct += (arg == l as usize) as usize;
                    counted += 1;
                }
            }
            Loss::ModelOutput { .. } => bail!("evaluation computes cross-entropy or mse; the model's own loss has no evaluation here"),
            Loss::MeanSquaredError => {
                let want = yb.to_f64_vec();
                total += pred.iter().zip(&want).map(|(p, w)| (p - w) * (p - w)).sum::<f64>();
                counted += want.len();
            }
        }
    }
    let mean = total / counted.max(1) as f64;
    Ok(match loss {
        Loss::CrossEntropy { .. } => json!({"samples": n, "loss": mean, "accuracy": correct as f64 / counted.max(1) as f64}),
        Loss::MeanSquaredError | Loss::ModelOutput { .. } => json!({"samples": n, "mse": mean}),
    })
}
