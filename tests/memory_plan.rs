//! The CPU memory plan on real models: recycled buffers are filled with NaN before every
//! kernel (`KILN_POISON_BUFFERS`), so an op that claims to overwrite its outputs but
//! leaves elements alone fails here; outputs must still match onnxruntime, over several
//! runs of one session; and the plan must stay close to its lower bound.
mod common;
use common::*;
use kiln::runtime::{DeviceChoice, Session, SessionOptions};

#[test]
fn poisoned_recycled_buffers_do_not_change_results_and_the_plan_is_tight() {
    // Before any session exists in this process (the runtime reads it once).
    std::env::set_var("KILN_POISON_BUFFERS", "1");
    for model in ["resnet18", "mobilenet_v2", "squeezenet1_1", "bert_tiny", "gpt2_tiny", "ppocr_det", "mobilenet_v2_int8_qop", "resnet18_int8_qdq"] {
        let dir = zoo().join(model);
        let mut g = kiln::compiler::onnx::import_file(&dir.join("model.onnx")).unwrap();
        kiln::compiler::passes::optimize_for(&mut g, kiln::compiler::passes::Target::Cpu);
        let s = Session::new(g, SessionOptions::device(DeviceChoice::Cpu)).unwrap();
        for round in 0..2 {
            for set in data_sets(&dir) {
                let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
                let (outs, stats) = s.run_with_stats(&inputs).unwrap();
                for (got, want) in outs.iter().zip(&set.outputs) {
                    let ok = match model {
                        "ppocr_det" => got.to_f64_vec().iter().zip(want.to_f64_vec()).all(|(a, b)| (a - b).abs() <= 1e-6),
                        // As in the zoo test (tests/zoo.rs says why).
                        "resnet18_int8_qdq" => rel_l2(got, want) < 2e-2,
                        _ => rel_l2(got, want) < 1e-4,
                    };
                    assert!(ok, "{model} round {round} {}: rel L2 {}", set.dir.display(), rel_l2(got, want));
                }
                let m = stats.memory.expect("CPU runs report their memory plan");
                assert!(m.lower_bound <= m.planned && m.planned <= m.unshared, "{model}: {m:?}");
                assert!((m.planned as f64) <= 1.15 * m.lower_bound as f64, "{model}: planned {} vs lower bound {}", m.planned, m.lower_bound);
                if model == "bert_tiny" || model == "squeezenet1_1" {
                    // bert_tiny's fused elementwise chains run in place (poisoning does not
                    // touch those); squeezenet's fire modules write their Concats in place.
                    assert!(m.in_place > 0, "{model}: {m:?}");
                }
            }
        }
    }
}

/// The GPU plan shares device buffers between intermediates too: results still match
/// on two runs, and the buffers shrink well below one per value.
#[test]
fn gpu_buffers_are_shared_by_lifetime() {
    gpu_env();
    for model in ["squeezenet1_1", "bert_tiny"] {
        let dir = zoo().join(model);
        let mut g = kiln::compiler::onnx::import_file(&dir.join("model.onnx")).unwrap();
        kiln::compiler::passes::optimize(&mut g);
        let s = Session::new(g, SessionOptions::device(DeviceChoice::Gpu)).unwrap();
        let set = &data_sets(&dir)[0];
        let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for _ in 0..2 {
            let (outs, stats) = s.run_with_stats(&inputs).unwrap();
            assert!(rel_l2(&outs[0], &set.outputs[0]) < 1e-3, "{model}");
            let m = stats.memory.expect("a one-device GPU run reports its memory plan");
            assert!(m.lower_bound <= m.planned && (m.planned as f64) <= 1.15 * m.lower_bound as f64, "{model}: {m:?}");
        }
    }
}
