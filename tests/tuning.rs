//! The tuner on zoo models on the CPU and the GPU adapter (lavapipe in CI): every
//! candidate it measures computes what the default kernel computes (a mismatch is a
//! kernel bug in that variant), and the tuned session matches onnxruntime's outputs.
mod common;
use common::*;
use kiln::runtime::tune::{KeyStatus, TuneOptions};
use kiln::runtime::{DeviceChoice, Session, SessionOptions, Tuning};
use std::time::Duration;

/// Tunes `model` on the GPU (every key measured again); returns the report.
fn tune_model(model: &str, budget: u64) -> kiln::runtime::TuneReport {
    tune_model_on(model, budget, DeviceChoice::Gpu)
}

fn tune_model_on(model: &str, budget: u64, device: DeviceChoice) -> kiln::runtime::TuneReport {
    gpu_env();
    let dir = zoo().join(model);
    let mut graph = kiln::compiler::onnx::import_file(&dir.join("model.onnx")).unwrap();
    let target = if device == DeviceChoice::Cpu { kiln::compiler::passes::Target::Cpu } else { kiln::compiler::passes::Target::Gpu };
    kiln::compiler::passes::optimize_for(&mut graph, target);
    let db = std::env::temp_dir().join(format!("kiln-zoo-tuning-{}-{model}-{device}.json", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let s = Session::new(graph, SessionOptions { device, tuning: Tuning::file(&db), ..Default::default() }).unwrap();
    let set = &data_sets(&dir)[0];
    let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let report = s.tune(&inputs, &TuneOptions { budget: Duration::from_secs(budget), retune: true }, &mut |_| {}).unwrap();
    for k in &report.keys {
        assert!(!matches!(k.status, KeyStatus::Failed(_)), "{model}: {} {:?}", k.summary, k.status);
        for (variant, why) in &k.rejected {
            assert!(!why.contains("differs"), "{model}: {} variant {variant} computes something else than the default: {why}", k.summary);
        }
        println!("{model} {:60} {:>9.4} -> {:>9.4} ms {}", k.summary, k.default_ms, k.best_ms, k.config());
    }
    for set in data_sets(&dir) {
        let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let outs = s.run(&inputs).unwrap();
        for (got, want) in outs.iter().zip(&set.outputs) {
            assert!(rel_l2(got, want) < 1e-3, "{model} tuned: rel L2 {}", rel_l2(got, want));
        }
    }
    let _ = std::fs::remove_file(&db);
    report
}

#[test]
fn every_measured_gpu_variant_of_lenet_and_mlp_matches_the_default() {
    for model in ["lenet", "mlp"] {
        let report = tune_model(model, 30);
        assert!(report.keys.iter().all(|k| k.status == KeyStatus::Tuned), "{model}: every key fits the budget: {:?}", report.keys);
    }
}

#[test]
fn squeezenet_tunes_its_most_expensive_gpu_kernels_first_within_a_short_budget() {
    let report = tune_model("squeezenet1_1", 8);
    // The classifier's Conv (512 -> 1000 channels at 13x13) costs the most.
    assert!(report.keys[0].summary.starts_with("Conv(f32[1, 512, 13, 13],const f32[1000, 512, 1, 1]"), "{}", report.keys[0].summary);
    assert!(report.keys.len() > 20);
}

/// On the CPU, squeezenet's convolutions offer the direct kernels, the packed GEMM at
/// each instruction set and block size, and Winograd (its 3x3 expands): every variant the
/// tuner measures must match the default, and the tuned model onnxruntime.
#[test]
fn every_measured_cpu_variant_of_squeezenet_matches_the_default() {
    let report = tune_model_on("squeezenet1_1", 20, DeviceChoice::Cpu);
    assert!(report.keys.len() >= 10, "{:?}", report.keys);
    assert!(report.keys.iter().any(|k| k.status == KeyStatus::Tuned));
}
