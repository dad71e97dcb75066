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

mod pass_choices {
    use super::common::*;
    use kiln::compiler::passes::{PassChoices, Target};
    use kiln::graph::{DType, Graph, GraphBuilder, Tensor};
    use kiln::graph_tuning::{self, Error};
    use kiln::runtime::tune::KeyStatus;
    use kiln::runtime::{DeviceChoice, Session, SessionOptions, Tuning};
    use std::time::{Duration, Instant};

    /// `y = Relu(x) + extra`, where `extra` is `0 * (x W W W W)` (`slow`: the same
    /// result after four 256^3 products), 1 (`wrong`), or nothing.
    fn graph(slow: bool, wrong: bool) -> Graph {
        let mut b = GraphBuilder::new("choices");
        let x = b.input("x", DType::F32, vec![256usize, 256]);
        let mut y = b.node("Relu", &[x], &[]);
        if slow {
            let w = b.constant("w", rand_f32(&[256, 256], 7));
            let zero = b.constant("zero", Tensor::from_slice(&[1], &[0f32]).unwrap());
            let mut p = x;
            for _ in 0..4 {
                p = b.node("MatMul", &[p, w], &[]);
            }
            let z = b.node("Mul", &[p, zero], &[]);
            y = b.node("Add", &[y, z], &[]);
        }
        if wrong {
            let one = b.constant("one", Tensor::from_slice(&[1], &[1f32]).unwrap());
            y = b.node("Add", &[y, one], &[]);
        }
        b.rename(y, "y");
        b.output(y);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 17);
        g
    }

    /// Values in [-1, 1], different for each seed.
    fn rand_f32(dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.618 + seed as f64 * 1.7).sin()) as f32).collect();
        Tensor::from_slice(dims, &v).unwrap()
    }

    fn session(g: Graph, tuning: Tuning) -> Session {
        Session::new(g, SessionOptions { device: DeviceChoice::Cpu, tuning, ..Default::default() }).unwrap()
    }

    /// Variants: the slow graph unless the choices turn layout-nchwc off; then the fast
    /// one, or a wrong one.
    fn builder(wrong: bool) -> impl Fn(&PassChoices) -> Result<(Graph, Session), Error> {
        move |c: &PassChoices| {
            let off = c.get("layout-nchwc") == Some(&false);
            let g = graph(!off, off && wrong);
            Ok((g.clone(), session(g, Tuning::off())))
        }
    }

    fn db(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("kiln-pass-choices-{}-{name}.json", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn inputs() -> Vec<(String, Tensor)> {
        vec![("x".into(), rand_f32(&[256, 256], 3))]
    }

    /// The descent toggles one pass at a time from the leader, skips variants that make
    /// a graph already measured, keeps the faster one, stores it, and finds it next time.
    #[test]
    fn a_faster_pass_choice_wins_is_stored_and_found_again() {
        let path = db("wins");
        let s = session(graph(true, false), Tuning::file(&path));
        let far = Instant::now() + Duration::from_secs(60);
        let (r, written) = graph_tuning::tune_passes(&s, "0123", Target::Cpu, &builder(false), &inputs(), false, far).unwrap();
        assert_eq!(r.status, KeyStatus::Tuned, "{r:?}");
        assert_eq!(r.values, [("layout-nchwc".to_string(), 0)].into_iter().collect(), "{r:?}");
        assert!(r.best_ms * 2.0 < r.default_ms, "{r:?}");
        // The defaults and one variant: fuse-attention and layout-nhwc-int8 toggled make
        // graphs measured already.
        assert_eq!(r.tried, 2, "{r:?}");
        assert_eq!(written.as_deref(), Some(path.as_path()));
        let later = session(graph(true, false), Tuning::file(&path));
        let chosen = graph_tuning::stored(&later, "0123", Target::Cpu).unwrap();
        assert_eq!(chosen, Some([("layout-nchwc".to_string(), false)].into_iter().collect()));
        // Another model, another device kind, or no database: nothing stored.
        assert_eq!(graph_tuning::stored(&later, "4567", Target::Cpu).unwrap(), None);
        assert_eq!(graph_tuning::stored(&later, "0123", Target::Gpu).unwrap(), None);
        assert_eq!(graph_tuning::stored(&session(graph(true, false), Tuning::off()), "0123", Target::Cpu).unwrap(), None);
        let (again, written) = graph_tuning::tune_passes(&later, "0123", Target::Cpu, &builder(false), &inputs(), false, far).unwrap();
        assert_eq!((again.status, again.values, written), (KeyStatus::AlreadyTuned, r.values, None));
        let _ = std::fs::remove_file(&path);
    }

    /// A variant whose outputs differ from the defaults' never wins, however fast.
    #[test]
    fn a_pass_choice_that_changes_the_outputs_is_rejected() {
        let path = db("wrong");
        let s = session(graph(true, false), Tuning::file(&path));
        let far = Instant::now() + Duration::from_secs(60);
        let (r, _) = graph_tuning::tune_passes(&s, "0123", Target::Cpu, &builder(true), &inputs(), false, far).unwrap();
        assert_eq!(r.status, KeyStatus::Tuned, "{r:?}");
        assert!(r.values.is_empty(), "{r:?}");
        assert_eq!(r.rejected.len(), 1, "{r:?}");
        assert!(r.rejected[0].0 == "layout-nchwc=0" && r.rejected[0].1.contains("differs"), "{r:?}");
        assert_eq!(graph_tuning::stored(&s, "0123", Target::Cpu).unwrap(), None);
        // A deadline already past measures nothing and stores nothing.
        let path2 = db("late");
        let s2 = session(graph(true, false), Tuning::file(&path2));
        let (late, written) = graph_tuning::tune_passes(&s2, "0123", Target::Cpu, &builder(false), &inputs(), false, Instant::now()).unwrap();
        assert_eq!((late.status, written), (KeyStatus::OutOfBudget, None));
        assert!(!path2.exists());
        // A deadline that passes mid-descent, after the faster variant led (its build
        // outlasts the deadline): neither stored nor settled on.
        let slow_build = |c: &PassChoices| {
            if c.get("layout-nchwc") == Some(&false) {
                std::thread::sleep(Duration::from_millis(400));
            }
            builder(false)(c)
        };
        let (cut, written) = graph_tuning::tune_passes(&s2, "0123", Target::Cpu, &slow_build, &inputs(), false, Instant::now() + Duration::from_millis(150)).unwrap();
        assert_eq!(cut.values, [("layout-nchwc".to_string(), 0)].into_iter().collect(), "the faster variant led: {cut:?}");
        assert_eq!((&cut.status, written, graph_tuning::settled(&cut)), (&KeyStatus::OutOfBudget, None, None), "{cut:?}");
        assert!(!path2.exists());
        let _ = std::fs::remove_file(&path);
    }

    /// `kiln tune` measures the pass choice of a zoo model and `kiln bench` builds the
    /// graph a stored choice names (here layout-nchwc off, stored through the library:
    /// lenet's convolutions then run as plain Conv, not ConvNchwc).
    #[test]
    fn the_cli_tunes_pass_choices_and_bench_uses_a_stored_one() {
        let model = zoo().join("lenet/model.onnx");
        let path = db("cli");
        let kiln = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap();
        let (m, d) = (model.to_str().unwrap(), path.to_str().unwrap());
        let o = kiln(&["tune", m, "--device", "cpu", "--budget", "20", "--json", "--tuning-db", d]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["passes"]["status"], "tuned", "{v}");
        assert!(v["passes"]["tried"].as_u64().unwrap() >= 2, "lenet's convolutions change with layout-nchwc: {v}");
        let o = kiln(&["tune", m, "--device", "cpu", "--budget", "20", "--json", "--tuning-db", d]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["passes"]["status"], "already tuned", "{v}");
        // Store "layout-nchwc off" for lenet on this CPU, as a tuner would.
        let loaded = kiln::load::load(kiln::load::Source::File(&model), Target::Cpu, true, &[]).unwrap();
        let s = session(loaded.graph, Tuning::file(&path));
        let hash = loaded.model_hash.unwrap();
        let entry = kiln::runtime::tune::TuneEntry { values: [("layout-nchwc".to_string(), 0)].into_iter().collect(), default_ms: 1.0, best_ms: 0.5, summary: "test".into() };
        s.store_choice(&graph_tuning::key(&s, &hash, Target::Cpu), entry).unwrap();
        let ops = |extra: &[&str]| {
            let mut args = vec!["bench", m, "--device", "cpu", "--iters", "2", "--profile", "--json"];
            args.extend_from_slice(extra);
            let o = kiln(&args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            v["profile"].as_array().unwrap().iter().map(|p| p["op"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        let tuned = ops(&["--tuning-db", d]);
        assert!(tuned.iter().any(|o| o == "Conv") && !tuned.iter().any(|o| o.contains("Nchwc")), "{tuned:?}");
        let untuned = ops(&["--no-tuning"]);
        assert!(untuned.iter().any(|o| o.contains("ConvNchwc")), "{untuned:?}");
        // `compile --tune` compiles with the stored choice: the artifact's graph has it.
        let art = std::env::temp_dir().join(format!("kiln-pass-choices-{}.kiln", std::process::id()));
        let o = kiln(&["compile", m, "-o", art.to_str().unwrap(), "--device", "cpu", "--tune", "--budget", "5", "--tuning-db", d]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (graph, _) = kiln::runtime::artifact::load(&art).unwrap();
        let types: Vec<&str> = graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert!(types.contains(&"Conv") && !types.iter().any(|t| t.contains("Nchwc")), "{types:?}");
        let _ = std::fs::remove_file(&art);
        let _ = std::fs::remove_file(&path);
    }
}
