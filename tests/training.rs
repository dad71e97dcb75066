//! Training, step for step against PyTorch: each run of ../shared/training replays
//! the same batches from the same initial weights, on the CPU and on the GPU (lavapipe
//! in CI). Losses of the first ten steps within 1e-4 (relative), parameters at each
//! checkpoint within 1e-4 after step 1 and 1e-3 after step 10 on the CPU (1e-3 and
//! 1e-2 on the GPU), the final loss within 2%.
mod common;

use common::runs::*;
use common::*;
use kiln::compiler::autodiff::{Loss, Optimizer, OptimizerKind};
use kiln::graph::{DType, Tensor};
use kiln::ops::TensorType;
use kiln::runtime::{npz, DeviceChoice};
use kiln::train::{Schedule, TrainError, TrainOptions, Trainer};
use std::path::PathBuf;

fn training() -> PathBuf {
    training_dir()
}

fn trainer(r: &Run, device: DeviceChoice) -> Trainer {
    let model = kiln::train::import_model(&training().join(r.name).join("model.onnx")).unwrap();
    let mut opts = TrainOptions::new(Loss::cross_entropy(), optimizer(&r.reference), Schedule::constant(f(&r.reference, "lr")));
    opts.device = device;
    Trainer::new(&model, &[(r.input.clone(), r.input_type.clone())], opts).unwrap_or_else(|e| panic!("{}: {e}", r.name))
}

/// Parameters whose gradient is zero in exact arithmetic, so that each trainer's is
/// rounding noise: a convolution's bias followed by BatchNormalization in training
/// mode (the batch mean removes it). SGD moves them by lr x noise (nothing); Adam
/// normalises the noise into steps of up to lr whose signs are the noise's. They are
/// checked to have moved at most lr per step, element by element.
const GRADIENT_IS_ZERO: &[(&str, &str)] = &[("lenet_digits_adam", "features.3.bias")];

/// Where a device departs from PyTorch's trajectory for a reason that is not an error,
/// with the check that replaces the one it cannot meet (see each entry).
///
/// lenet on the GPU: the per-step losses agree for about 30 steps, then the runs part:
/// max pooling's argmax flips between window values a rounding apart (the GPU sums in
/// another order than the CPU and PyTorch), and SGD then follows another path of equal
/// quality. Its final loss (0.003 for SGD) is not comparable at 2%; instead
/// `gpu_steps_agree_with_the_cpu_from_the_same_state` checks every step of the run on
/// the GPU against the CPU from the same state.
const FINAL_LOSS_DEPARTS: &[(&str, &str)] = &[("lenet_digits_sgd", "gpu"), ("lenet_digits_adam", "gpu")];

/// Parameters (and running statistics) against PyTorch's after `step` steps.
fn check_params(r: &Run, t: &Trainer, step: u64, tol: f64, device: &str) {
    let want = npz::read_file(training().join(r.name).join(format!("step_{step}.npz"))).unwrap();
    let lr = f(&r.reference, "lr");
    for (name, w) in &want {
        let got = t.parameter(name).unwrap().unwrap_or_else(|| panic!("{}: no parameter '{name}'", r.name));
        let got = &got;
        if GRADIENT_IS_ZERO.contains(&(r.name, name.as_str())) {
            let moved = got.to_f64_vec().iter().zip(w.to_f64_vec()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(moved <= 2.0 * lr * step as f64 * 1.001, "{} on {device}: '{name}' (zero gradient) is {moved} from PyTorch's after step {step}", r.name);
            continue;
        }
        let e = rel_l2(got, w);
        assert!(e <= tol, "{} on {device}: '{name}' after step {step}: relative L2 {e:.2e} > {tol:.0e}", r.name);
    }
}

fn replay(name: &'static str) {
    gpu_env();
    let r = run(name);
    let losses: Vec<f64> = r.reference["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let checkpoints: Vec<u64> = r.reference["checkpoints"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    for (device, choice) in backends() {
        let (tol1, tol10) = if device == "cpu" { (1e-4, 1e-3) } else { (1e-3, 1e-2) };
        let mut t = trainer(&r, choice);
        check_params(&r, &t, 0, 0.0, device);
        let mut last = 0.0;
        for (k, want) in losses.iter().enumerate() {
            let (x, y) = (r.batch)(k);
            let rep = t.step(&[(r.input.as_str(), &x)], &y).unwrap_or_else(|e| panic!("{name} on {device}, step {}: {e}", k + 1));
            last = rep.loss as f64;
            if std::env::var_os("KILN_TRAIN_TRACE").is_some() {
                eprintln!("{device} step {} loss {last:.6} torch {want:.6} ({:.1} ms)", k + 1, rep.seconds * 1e3);
            }
            if k < 10 {
                let e = (last - want).abs() / want.abs();
                assert!(e <= 1e-4, "{name} on {device}: loss at step {} is {last}, PyTorch's {want} (relative error {e:.2e})", k + 1);
            }
            let step = k as u64 + 1;
            if checkpoints.contains(&step) && step <= 10 {
                check_params(&r, &t, step, if step == 1 { tol1 } else { tol10 }, device);
            }
        }
        let want = *losses.last().unwrap();
        let close = (last - want).abs() <= 0.02 * want.abs();
        if FINAL_LOSS_DEPARTS.contains(&(name, device)) {
            assert!(last.is_finite() && last < 0.2 * losses[0], "{name} on {device}: the loss went from {} to {last}", losses[0]);
        } else {
            assert!(close, "{name} on {device}: final loss {last}, PyTorch's {want}");
        }
        eprintln!("{name} on {device} ({}): {} steps, final loss {last:.5} (PyTorch {want:.5})", t.device_name(), losses.len());
    }
}

#[test]
fn lenet_digits_sgd_follows_pytorch() {
    replay("lenet_digits_sgd");
}

#[test]
fn lenet_digits_adam_follows_pytorch() {
    replay("lenet_digits_adam");
}

#[test]
fn tiny_gpt_adamw_follows_pytorch() {
    replay("tiny_gpt_adamw");
}

/// A checkpoint restores the state and the step: the resumed run equals the
/// uninterrupted one bit for bit on the CPU; a checkpoint of another model is refused.
#[test]
fn checkpoints_resume_bit_for_bit() {
    let r = run("lenet_digits_adam");
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.npz");
    let mut a = trainer(&r, DeviceChoice::Cpu);
    for k in 0..3 {
        let (x, y) = (r.batch)(k);
        a.step(&[("x", &x)], &y).unwrap();
    }
    a.save_checkpoint(&path).unwrap();
    let mut b = trainer(&r, DeviceChoice::Cpu);
    b.load_checkpoint(&path).unwrap();
    assert_eq!(b.steps_done(), 3);
    for k in 3..5 {
        let (x, y) = (r.batch)(k);
        let la = a.step(&[("x", &x)], &y).unwrap().loss;
        let lb = b.step(&[("x", &x)], &y).unwrap().loss;
        assert_eq!(la.to_bits(), lb.to_bits(), "step {}", k + 1);
    }
    for ((sa, ta), (_, tb)) in a.state().unwrap().into_iter().zip(b.state().unwrap()) {
        assert_eq!(ta.bytes(), tb.bytes(), "'{}' differs after resuming", sa.name);
    }
    // Another optimizer's state does not fit.
    let sgd = run("lenet_digits_sgd");
    let mut c = trainer(&sgd, DeviceChoice::Cpu);
    let err = c.load_checkpoint(&path).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    // A damaged file is an error that names it.
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let err = b.load_checkpoint(&path).unwrap_err().to_string();
    assert!(err.contains("ckpt.npz") && err.contains("CRC-32"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A NaN loss stops at its step and keeps the last good state, on every device (on
/// the GPU the state stays in device memory between steps: the step's graph keeps it).
#[test]
fn a_nan_loss_stops_and_keeps_the_state() {
    gpu_env();
    let r = run("lenet_digits_sgd");
    for device in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        let gpu = device == DeviceChoice::Gpu;
        let mut t = trainer(&r, device);
        let (x, y) = (r.batch)(0);
        t.step(&[("x", &x)], &y).unwrap();
        assert_eq!(t.state_on_device(), gpu, "the state lives on the device exactly on the GPU");
        let before: Vec<Vec<u8>> = t.state().unwrap().iter().map(|(_, v)| v.bytes().to_vec()).collect();
        let mut bad = x.to_f64_vec();
        bad[3] = f64::NAN;
        let bad = Tensor::from_f64(DType::F32, x.dims(), &bad).unwrap();
        match t.step(&[("x", &bad)], &y) {
            Err(e @ TrainError::NonFinite { step: 2, .. }) => assert!(e.to_string().contains("after step 1"), "{e}"),
            other => panic!("expected a non-finite loss at step 2, got {:?}", other.map(|r| r.loss)),
        }
        assert_eq!(t.steps_done(), 1);
        let after: Vec<Vec<u8>> = t.state().unwrap().iter().map(|(_, v)| v.bytes().to_vec()).collect();
        assert!(before == after, "the state changed after a NaN step (gpu: {gpu})");
        // Training goes on from there.
        let l = t.step(&[("x", &x)], &y).unwrap().loss;
        assert!(l.is_finite() && t.steps_done() == 2, "{l}");
    }
    let mut t = trainer(&r, DeviceChoice::Cpu);
    let (x, y) = (r.batch)(0);
    // A label of the wrong dtype is refused before anything runs.
    let yf = Tensor::from_f64(DType::F32, y.dims(), &y.to_f64_vec()).unwrap();
    let err = t.step(&[("x", &x)], &yf).unwrap_err().to_string();
    assert!(err.contains("label must be i64"), "{err}");
}


/// Each step on the GPU, from the state the CPU reached, gives the CPU's loss and
/// state (within f32 rounding), over the whole lenet_digits_sgd run: what replaces the
/// final-loss comparison where the trajectories part (`FINAL_LOSS_DEPARTS`).
#[test]
fn gpu_steps_agree_with_the_cpu_from_the_same_state() {
    gpu_env();
    let r = run("lenet_digits_sgd");
    let steps = r.reference["losses"].as_array().unwrap().len();
    let mut c = trainer(&r, DeviceChoice::Cpu);
    let mut g = trainer(&r, DeviceChoice::Gpu);
    let dir = std::env::temp_dir().join(format!("kiln-lockstep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.npz");
    let mut flips = vec![];
    for k in 0..steps {
        c.save_checkpoint(&path).unwrap();
        g.load_checkpoint(&path).unwrap();
        let (x, y) = (r.batch)(k);
        let lc = c.step(&[("x", &x)], &y).unwrap().loss as f64;
        let lg = g.step(&[("x", &x)], &y).unwrap().loss as f64;
        assert!((lg - lc).abs() <= 1e-5 * lc.abs().max(1e-3), "step {}: GPU loss {lg}, CPU loss {lc}", k + 1);
        let worst = c
            .state()
            .unwrap()
            .into_iter()
            .zip(g.state().unwrap())
            .filter(|((s, _), _)| !s.name.starts_with("features.3.bias")) // zero gradient: noise (GRADIENT_IS_ZERO)
            .map(|((s, a), (_, b))| (rel_l2(&b, &a), s.name.clone()))
            .fold((0.0, String::new()), |m, v| if v.0 > m.0 { v } else { m });
        if worst.0 > 1e-4 {
            flips.push((k + 1, worst));
        }
    }
    // A step whose max-pool argmax flips on a near tie routes a few gradients to
    // the other element of the window: rare, and the state still stays close.
    eprintln!("steps whose state differs by more than 1e-4 (argmax flips): {flips:?}");
    assert!(flips.len() <= steps / 20 && flips.iter().all(|f| f.1 .0 <= 1e-2), "{flips:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Training-mode dropout: a new mask every step, the same masks on the CPU and the GPU
/// for the same seed (so the same losses), other masks for another seed.
#[test]
fn dropout_masks_follow_the_seed_on_every_device() {
    use kiln::graph::{rng::Rng, Attr, GraphBuilder};
    gpu_env();
    let mut b = GraphBuilder::new("dropout-mlp");
    let x = b.input("x", DType::F32, [8usize, 16]);
    let mut rng = Rng::new(3);
    let w1 = b.constant("w1", rng.tensor(&[32, 16], 0.5).unwrap());
    let w2 = b.constant("w2", rng.tensor(&[4, 32], 0.5).unwrap());
    let ratio = b.constant("ratio", Tensor::scalar(0.5f32));
    let training = b.constant("training", Tensor::from_bools(&[], &[true]).unwrap());
    let h = b.node("Gemm", &[x, w1], &[("transB", Attr::Int(1))]);
    let h = b.node("Relu", &[h], &[]);
    let d = b.node_multi("Dropout", &[Some(h), Some(ratio), Some(training)], &[], 1)[0];
    let y = b.node("Gemm", &[d, w2], &[("transB", Attr::Int(1))]);
    b.output(y);
    let model = kiln::train::Model { graph: b.finish().unwrap(), initializers: vec!["w1".into(), "w2".into()] };
    let xs = Rng::new(4).tensor(&[8, 16], 1.0).unwrap();
    let ys = Tensor::from_vec(&[8], vec![0i64, 1, 2, 3, 0, 1, 2, 3]).unwrap();
    let losses = |device: DeviceChoice, seed: u64| -> Vec<f32> {
        let sgd = Optimizer { kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false }, weight_decay: 0.0, clip_norm: None };
        let mut opts = TrainOptions::new(Loss::cross_entropy(), sgd, Schedule::constant(0.0));
        (opts.device, opts.seed) = (device, seed);
        let mut t = Trainer::new(&model, &[("x".into(), TensorType::new(DType::F32, vec![8, 16]))], opts).unwrap();
        (0..4).map(|_| t.step(&[("x", &xs)], &ys).unwrap().loss).collect()
    };
    // lr 0: the weights never change, so the losses differ only by their masks.
    let cpu = losses(DeviceChoice::Cpu, 1);
    assert!(cpu.windows(2).all(|w| w[0] != w[1]), "a new mask every step: {cpu:?}");
    assert_ne!(cpu, losses(DeviceChoice::Cpu, 2), "another seed, other masks");
    let gpu = losses(DeviceChoice::Gpu, 1);
    // Inference: Dropout is the identity (the trained model's output has no mask).
    let mut t = Trainer::new(&model, &[("x".into(), TensorType::new(DType::F32, vec![8, 16]))], TrainOptions::new(Loss::cross_entropy(), Optimizer::new(OptimizerKind::Sgd { momentum: 0.0, nesterov: false }), Schedule::constant(0.0))).unwrap();
    t.step(&[("x", &xs)], &ys).unwrap();
    let s = kiln::runtime::Session::new(t.inference_graph().unwrap(), kiln::runtime::SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let (a, b) = (s.run(&[("x", &xs)]).unwrap(), s.run(&[("x", &xs)]).unwrap());
    assert_eq!(a[0].bytes(), b[0].bytes(), "inference is deterministic");
    for (c, g) in cpu.iter().zip(&gpu) {
        assert!((c - g).abs() <= 1e-5 * c.abs(), "CPU {cpu:?} vs GPU {gpu:?}");
    }
}

/// A model that computes its own loss (SoftmaxCrossEntropyLoss as its output, the
/// label a model input) trains step for step as the same network with Kiln's
/// cross-entropy appended, on every device; class weights and ignored labels too.
#[test]
fn a_model_with_its_own_onnx_loss_trains_like_the_built_in_loss() {
    use kiln::graph::{rng::Rng, Attr, GraphBuilder};
    gpu_env();
    let mlp = |own_loss: bool| {
        let mut b = GraphBuilder::new("mlp");
        let x = b.input("x", DType::F32, [6usize, 5]);
        let mut rng = Rng::new(11);
        let w1 = b.constant("w1", rng.tensor(&[8, 5], 0.5).unwrap());
        let w2 = b.constant("w2", rng.tensor(&[3, 8], 0.5).unwrap());
        let h = b.node("Gemm", &[x, w1], &[("transB", Attr::Int(1))]);
        let h = b.node("Tanh", &[h], &[]);
        let logits = b.node("Gemm", &[h, w2], &[("transB", Attr::Int(1))]);
        if own_loss {
            let y = b.input("labels", DType::I64, [6usize]);
            let loss = b.node("SoftmaxCrossEntropyLoss", &[logits, y], &[("ignore_index", Attr::Int(-1))]);
            b.output(loss);
        } else {
            b.output(logits);
        }
        kiln::train::Model { graph: b.finish().unwrap(), initializers: vec!["w1".into(), "w2".into()] }
    };
    let xs = Rng::new(4).tensor(&[6, 5], 1.0).unwrap();
    let ys = Tensor::from_vec(&[6], vec![0i64, 2, -1, 1, 2, 0]).unwrap();
    let x_type = ("x".to_string(), TensorType::new(DType::F32, vec![6, 5]));
    let run = |device: DeviceChoice, own: bool| -> Vec<f32> {
        let adam = Optimizer::new(OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 });
        let (loss, types) = if own {
            (Loss::ModelOutput { label: "labels".into() }, vec![x_type.clone(), ("labels".to_string(), TensorType::new(DType::I64, vec![6]))])
        } else {
            (Loss::CrossEntropy { ignore_index: Some(-1), label_smoothing: 0.0 }, vec![x_type.clone()])
        };
        let mut opts = TrainOptions::new(loss, adam, Schedule::constant(0.05));
        opts.device = device;
        let mut t = Trainer::new(&mlp(own), &types, opts).unwrap();
        assert_eq!(t.batch_types().1, &TensorType::new(DType::I64, vec![6]), "the label's type");
        (0..8).map(|_| t.step(&[("x", &xs)], &ys).unwrap().loss).collect()
    };
    let builtin = run(DeviceChoice::Cpu, false);
    assert!(builtin[7] < builtin[0] * 0.7, "it learns: {builtin:?}");
    for device in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        let own = run(device.clone(), true);
        for (k, (a, b)) in own.iter().zip(&builtin).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{device:?} step {}: {own:?} vs {builtin:?}", k + 1);
        }
    }
    // A model output that is not a scalar is not a loss; an unknown label input is named.
    let sgd = || Optimizer::new(OptimizerKind::Sgd { momentum: 0.0, nesterov: false });
    let opts = |label: &str| TrainOptions::new(Loss::ModelOutput { label: label.into() }, sgd(), Schedule::constant(0.1));
    let err = Trainer::new(&mlp(false), &[x_type.clone()], opts("x")).err().unwrap().to_string();
    assert!(err.contains("must be a scalar") && err.contains("[6, 3]"), "{err}");
    let err = Trainer::new(&mlp(true), &[x_type.clone(), ("labels".into(), TensorType::new(DType::I64, vec![6]))], opts("y")).err().unwrap().to_string();
    assert!(err.contains("no input 'y'") && err.contains("labels"), "{err}");
}

/// LARS against its rule in f64, three steps, on every device: the loss
/// `sum(w * x) + sum(b * v)` has the gradients `x` and `v` exactly, so each step is
/// `buf = momentum buf + r (g + wd w)`, `p -= lr buf`, with the trust ratio
/// `r = trust |w| / (|g| + wd |w|)` for the matrix `w` and `r = 1` for the vector `b`
/// (one-dimensional parameters take plain momentum SGD).
#[test]
fn lars_steps_follow_the_rule() {
    use kiln::graph::{rng::Rng, Attr, GraphBuilder};
    gpu_env();
    let (lr, momentum, trust, wd) = (0.5f64, 0.9f64, 0.5f64, 0.1f64);
    let (w0, b0) = (Rng::new(21).tensor(&[3, 5], 1.0).unwrap(), Rng::new(22).tensor(&[5], 1.0).unwrap());
    let model = {
        let mut g = GraphBuilder::new("lars");
        let x = g.input("x", DType::F32, [3usize, 5]);
        let v = g.input("v", DType::F32, [5usize]);
        let (w, b) = (g.constant("w", w0.clone()), g.constant("b", b0.clone()));
        let wx = g.node("Mul", &[w, x], &[]);
        let bv = g.node("Mul", &[b, v], &[]);
        let s1 = g.node("ReduceSum", &[wx], &[("keepdims", Attr::Int(0))]);
        let s2 = g.node("ReduceSum", &[bv], &[("keepdims", Attr::Int(0))]);
        let loss = g.node("Add", &[s1, s2], &[]);
        g.output(loss);
        kiln::train::Model { graph: g.finish().unwrap(), initializers: vec!["w".into(), "b".into()] }
    };
    let xs: Vec<Tensor> = (0..3).map(|k| Rng::new(30 + k).tensor(&[3, 5], 1.0).unwrap()).collect();
    let vs: Vec<Tensor> = (0..3).map(|k| Rng::new(40 + k).tensor(&[5], 1.0).unwrap()).collect();
    // The reference.
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let step = |p: &mut Vec<f64>, buf: &mut Vec<f64>, g: &[f64], scaled: bool| {
        let r = if scaled { trust * norm(p) / (norm(g) + wd * norm(p)) } else { 1.0 };
        for i in 0..p.len() {
            buf[i] = momentum * buf[i] + r * (g[i] + wd * p[i]);
        }
        for i in 0..p.len() {
            p[i] -= lr * buf[i];
        }
    };
    let (mut w, mut b) = (w0.to_f64_vec(), b0.to_f64_vec());
    let (mut wbuf, mut bbuf) = (vec![0.0; 15], vec![0.0; 5]);
    for k in 0..3 {
        step(&mut w, &mut wbuf, &xs[k].to_f64_vec(), true);
        step(&mut b, &mut bbuf, &vs[k].to_f64_vec(), false);
    }
    let types = [("x".to_string(), TensorType::new(DType::F32, vec![3, 5])), ("v".to_string(), TensorType::new(DType::F32, vec![5]))];
    for device in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        let mut opt = Optimizer::new(OptimizerKind::Lars { momentum: momentum as f32, trust: trust as f32 });
        opt.weight_decay = wd as f32;
        let mut opts = TrainOptions::new(Loss::ModelOutput { label: "v".into() }, opt, Schedule::constant(lr));
        opts.device = device.clone();
        let mut t = Trainer::new(&model, &types, opts).unwrap();
        for k in 0..3 {
            t.step(&[("x", &xs[k])], &vs[k]).unwrap();
        }
        for (name, want, start) in [("w", &w, &w0), ("b", &b, &b0)] {
            let got = t.parameter(name).unwrap().unwrap().to_f64_vec();
            // The moves, compared: each is a sizeable part of the value.
            for (i, ((g, w), s)) in got.iter().zip(want.iter()).zip(start.to_f64_vec()).enumerate() {
                let (moved, want_moved) = (g - s, w - s);
                assert!((moved - want_moved).abs() <= 1e-5 * want_moved.abs().max(0.1), "{device:?} {name}[{i}]: moved {moved}, want {want_moved}");
            }
        }
    }
}

/// A mixed-precision trainer of run `r` on the GPU after `steps` applied steps, each
/// step's loss checked against PyTorch's f32 one (relative 1e-2); with the worst
/// relative loss error and the count of skipped steps.
fn mixed_precision_run(r: &Run, steps: u64) -> (Trainer, f64, usize) {
    use kiln::compiler::autodiff::MixedPrecision;
    let losses: Vec<f64> = r.reference["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let model = kiln::train::import_model(&training().join(r.name).join("model.onnx")).unwrap();
    let options = |device: DeviceChoice| {
        let mut opts = TrainOptions::new(Loss::cross_entropy(), optimizer(&r.reference), Schedule::constant(f(&r.reference, "lr")));
        opts.device = device;
        opts.mixed_precision = Some(MixedPrecision::default());
        opts
    };
    let types = [(r.input.clone(), r.input_type.clone())];
    let err = Trainer::new(&model, &types, options(DeviceChoice::Cpu)).err().expect("mixed precision is refused on the CPU").to_string();
    assert!(err.contains("mixed precision") && err.contains("CPU"), "{err}");
    let mut t = Trainer::new(&model, &types, options(DeviceChoice::Gpu)).unwrap();
    let mut skipped = 0;
    let mut k = 0;
    let mut worst: f64 = 0.0;
    while t.steps_done() < steps {
        let (x, y) = (r.batch)(t.steps_done() as usize);
        let rep = t.step(&[(r.input.as_str(), &x)], &y).unwrap();
        k += 1;
        assert!(k <= steps + 10, "{}: more than 10 steps skipped", r.name);
        let scale = rep.loss_scale.expect("mixed precision reports its scale");
        if rep.skipped {
            skipped += 1;
            continue;
        }
        let want = losses[rep.step as usize - 1];
        let e = (rep.loss as f64 - want).abs() / want;
        worst = worst.max(e);
        assert!(e <= 1e-2, "{}, step {}: loss {} against PyTorch's f32 {want} (relative {e:.1e}, scale {scale})", r.name, rep.step, rep.loss);
        if rep.step == 1 {
            check_params(r, &t, 1, 5e-2, "gpu, mixed precision");
        }
    }
    (t, worst, skipped)
}

/// Mixed precision on a GPU with SHADER_F16 (lavapipe has it): tiny_gpt with its
/// products, GELUs and reshapes in f16 (stored as halves) follows PyTorch's f32
/// trajectory to f16 precision, and the exported model is f32; mixed precision is
/// refused on the CPU.
#[test]
fn mixed_precision_follows_the_f32_trajectory_on_the_gpu() {
    gpu_env();
    let r = run("tiny_gpt_adamw");
    let losses: Vec<f64> = r.reference["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let (t, worst, skipped) = mixed_precision_run(&r, losses.len() as u64);
    // Every parameter within 5e-3 of PyTorch's after the last step (f32 on the GPU:
    // 1e-3 to 1e-2), but the key thirds of the attention biases: their gradient is zero
    // in exact arithmetic (a query's scores move together), so Adam turns rounding noise
    // into steps of at most lr; those are checked element by element.
    let steps = losses.len() as u64;
    let want = npz::read_file(training().join(r.name).join(format!("step_{steps}.npz"))).unwrap();
    let lr = f(&r.reference, "lr");
    for (name, w) in &want {
        let got = t.parameter(name).unwrap().unwrap();
        if name.ends_with("qkv.bias") {
            let (g, w) = (got.to_f64_vec(), w.to_f64_vec());
            let d = g.len() / 3;
            for (part, range) in [("query", 0..d), ("value", 2 * d..3 * d)] {
                let (gp, wp) = (Tensor::from_f64(DType::F32, &[d], &g[range.clone()]).unwrap(), Tensor::from_f64(DType::F32, &[d], &w[range]).unwrap());
                let e = rel_l2(&gp, &wp);
                assert!(e <= 5e-3, "'{name}' ({part} part) after step {steps}: relative L2 {e:.2e}");
            }
            let moved = g[d..2 * d].iter().zip(&w[d..2 * d]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(moved <= 2.0 * lr * steps as f64, "'{name}' (key part, zero gradient) is {moved} from PyTorch's");
            continue;
        }
        let e = rel_l2(&got, w);
        assert!(e <= 5e-3, "'{name}' after step {steps}: relative L2 {e:.2e} > 5e-3");
    }
    let exported = t.inference_graph().unwrap();
    assert!(exported.initializers.values().all(|w| w.dtype() != DType::F16), "f32 master weights");
    eprintln!("tiny_gpt mixed precision ({}): {} steps, {skipped} skipped, losses within {worst:.1e} of PyTorch's f32", t.device_name(), losses.len());
}

/// LeNet under mixed precision (convolutions, their data and filter gradients, ReLU and
/// max pooling in f16): ten steps of PyTorch's f32 run, every loss within 1e-2 and
/// every parameter within 2e-2 (relative L2; f32 on the GPU: 1e-2) after step 10, or
/// within 2e-3 (L2) for parameters near zero: BatchNormalization's shift starts at zero
/// and its gradient is a sum of f16-rounded terms that mostly cancel.
#[test]
fn mixed_precision_trains_lenet_like_pytorch() {
    gpu_env();
    let r = run("lenet_digits_sgd");
    let (t, worst, skipped) = mixed_precision_run(&r, 10);
    let want = npz::read_file(training().join(r.name).join("step_10.npz")).unwrap();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    for (name, w) in &want {
        let (got, w) = (t.parameter(name).unwrap().unwrap().to_f64_vec(), w.to_f64_vec());
        let diff: Vec<f64> = got.iter().zip(&w).map(|(a, b)| a - b).collect();
        let (e, size) = (norm(&diff), norm(&w));
        assert!(e <= 2e-2 * size || e <= 2e-3, "lenet, mixed precision: '{name}' after step 10 is {e:.2e} (L2) from PyTorch's, whose norm is {size:.2e}");
    }
    eprintln!("lenet mixed precision ({}): 10 steps, {skipped} skipped, losses within {worst:.1e} of PyTorch's f32", t.device_name());
}

/// Dynamic loss scaling: at a scale where the f16 gradients overflow, each step is
/// skipped (the state stays bit for bit, the step count too) and the scale halves,
/// until a step applies; a scale that never works is an error, not a silent loop.
#[test]
fn loss_scaling_skips_overflowing_steps_and_halves_the_scale() {
    use kiln::compiler::autodiff::MixedPrecision;
    use kiln::graph::{rng::Rng, Attr, GraphBuilder};
    gpu_env();
    let mut b = GraphBuilder::new("mlp");
    let x = b.input("x", DType::F32, [8usize, 16]);
    let mut rng = Rng::new(5);
    let w1 = b.constant("w1", rng.tensor(&[32, 16], 0.5).unwrap());
    let w2 = b.constant("w2", rng.tensor(&[4, 32], 0.5).unwrap());
    let h = b.node("Gemm", &[x, w1], &[("transB", Attr::Int(1))]);
    let h = b.node("Relu", &[h], &[]);
    let y = b.node("Gemm", &[h, w2], &[("transB", Attr::Int(1))]);
    b.output(y);
    let model = kiln::train::Model { graph: b.finish().unwrap(), initializers: vec!["w1".into(), "w2".into()] };
    let xs = Rng::new(6).tensor(&[8, 16], 1.0).unwrap();
    let ys = Tensor::from_vec(&[8], vec![0i64, 1, 2, 3, 0, 1, 2, 3]).unwrap();
    let trainer = |init_scale: f32| {
        let mut opts = TrainOptions::new(Loss::cross_entropy(), Optimizer::new(OptimizerKind::Sgd { momentum: 0.9, nesterov: false }), Schedule::constant(0.1));
        opts.device = DeviceChoice::Gpu;
        opts.mixed_precision = Some(MixedPrecision { init_scale, ..MixedPrecision::default() });
        Trainer::new(&model, &[("x".into(), TensorType::new(DType::F32, vec![8, 16]))], opts).unwrap()
    };
    let mut t = trainer(2f32.powi(40));
    let w0 = t.parameter("w1").unwrap().unwrap();
    let mut scales = vec![];
    loop {
        let rep = t.step(&[("x", &xs)], &ys).unwrap();
        scales.push(rep.loss_scale.unwrap());
        if !rep.skipped {
            break;
        }
        assert_eq!(t.steps_done(), 0);
        assert_eq!(t.parameter("w1").unwrap().unwrap().bytes(), w0.bytes(), "a skipped step changes nothing");
    }
    assert!(scales.len() >= 2, "2^40 overflows f16: {scales:?}");
    assert!(scales.windows(2).all(|w| w[1] == w[0] / 2.0), "halved at each skip: {scales:?}");
    assert_eq!(t.steps_done(), 1);
    // The applied step matches one from a trainer that started at that scale.
    let mut u = trainer(*scales.last().unwrap());
    let rep = u.step(&[("x", &xs)], &ys).unwrap();
    assert!(!rep.skipped);
    assert_eq!(t.parameter("w1").unwrap().unwrap().bytes(), u.parameter("w1").unwrap().unwrap().bytes());
    // NaN in the data: every scale fails; training stops with an error.
    let mut bad = xs.clone();
    bad.as_mut_slice::<f32>().unwrap()[0] = f32::INFINITY;
    let err = (0..100).find_map(|_| t.step(&[("x", &bad)], &ys).err());
    match err {
        Some(TrainError::NonFinite { .. }) | Some(TrainError::NonFiniteGradients { .. }) => {}
        other => panic!("expected a non-finite error, got {other:?}"),
    }
    assert_eq!(t.steps_done(), 1);
}

/// The step cut at the gradients (where data parallelism sums them across workers)
/// computes what the whole step does, bit for bit, when the gradients go from one half
/// to the other unchanged: LeNet (BatchNormalization's running statistics updated in
/// the backward half; momentum, weight decay, clipping, the finite-loss guard crossing
/// the cut) and tiny_gpt (AdamW), on the CPU.
#[test]
fn the_step_split_at_the_gradients_equals_the_whole_step() {
    use kiln::compiler::autodiff::{build, TrainConfig, Trainable};
    use kiln::runtime::{Session, SessionOptions};
    for name in ["lenet_digits_sgd", "tiny_gpt_adamw"] {
        let r = run(name);
        let model = kiln::train::import_model(&training().join(name).join("model.onnx")).unwrap();
        let mut optimizer = optimizer(&r.reference);
        optimizer.clip_norm = Some(1.0);
        let config = TrainConfig {
            inputs: vec![(r.input.clone(), r.input_type.clone())],
            output: None,
            loss: Loss::cross_entropy(),
            optimizer: optimizer.clone(),
            trainable: Trainable::Among(model.initializers.clone()),
            keep_state_unless_finite: true,
            mixed_precision: None,
            data_parallel: None,
        };
        let tg = build(&model.graph, &config, kiln::ops::Registry::builtin()).unwrap();
        let split = tg.split_at_gradients().unwrap();
        assert_eq!(split.gradients.len(), tg.gradients.len());
        // The finite-loss guard is computed before the cut and read after it.
        assert!(!split.passed.is_empty(), "{name}: nothing crosses the cut but the gradients");
        let (x, y) = (r.batch)(0);
        let hyper: Vec<(String, Tensor)> = optimizer.hyper_inputs(1, f(&r.reference, "lr")).into_iter().map(|(n, v)| (n.to_string(), Tensor::scalar(v))).collect();
        let mut feeds: Vec<(String, Tensor)> = vec![(r.input.clone(), x), (tg.label.clone(), y)];
        feeds.extend(hyper);
        feeds.extend(tg.state.iter().map(|s| (s.name.clone(), s.initial.clone())));
        let run_graph = |g: &kiln::graph::Graph, feeds: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
            let s = Session::new(g.clone(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
            let names: Vec<String> = s.inputs().into_iter().map(|(n, _)| n).collect();
            let f: Vec<(&str, &Tensor)> = feeds.iter().filter(|(n, _)| names.contains(n)).map(|(n, t)| (n.as_str(), t)).collect();
            assert_eq!(f.len(), names.len(), "{name}: feeds for {names:?}");
            s.output_names().into_iter().zip(s.run(&f).unwrap()).collect()
        };
        let whole = run_graph(&tg.graph, &feeds);
        let first = run_graph(&split.backward, &feeds);
        let mut feeds2 = feeds.clone();
        feeds2.extend(first.iter().cloned());
        let second = run_graph(&split.update, &feeds2);
        let halves: Vec<(String, Tensor)> = first.into_iter().chain(second).collect();
        for (n, t) in &whole {
            let (_, h) = halves.iter().find(|(m, _)| m == n).unwrap_or_else(|| panic!("{name}: the split step lost output '{n}'"));
            assert_eq!(t.bytes(), h.bytes(), "{name}: output '{n}'");
        }
        eprintln!("{name}: {} gradients cut, {} values passed, {} + {} nodes", split.gradients.len(), split.passed.len(), split.backward.nodes.len(), split.update.nodes.len());
    }
}
