//! `.kiln` artifacts end to end: `kiln compile` output runs like the ONNX model on both
//! backends, `--fix` folds shape computations and pins the shapes, damaged or foreign
//! files are clear errors, and the runtime loads artifacts without the compiler.
mod common;
use common::*;
use kiln::runtime::{artifact, Session, SessionOptions};
use std::path::PathBuf;
use std::process::Command;

fn compile(model: &str, extra: &[&str]) -> PathBuf {
    compile_for(model, "cpu", extra)
}

fn compile_for(model: &str, device: &str, extra: &[&str]) -> PathBuf {
    gpu_env();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("kiln-artifact-{}-{model}-{k}.kiln", std::process::id()));
    let src = zoo().join(model).join("model.onnx");
    let mut args = vec!["compile", src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--device", device];
    args.extend_from_slice(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_kiln")).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn compiled_models_match_onnxruntime_on_both_backends() {
    // control_flow: subgraph attributes (If, Loop, Scan) with outer values and their own
    // weights survive the round trip.
    for model in ["bert_tiny", "gpt2_tiny", "control_flow"] {
        let path = compile(model, &[]);
        let dir = zoo().join(model);
        for (name, device) in backends() {
            let (graph, info) = artifact::load(&path).unwrap();
            assert_eq!(info.device, "cpu");
            let s = Session::new(graph, SessionOptions::device(device)).unwrap();
            for set in data_sets(&dir) {
                let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
                let outs = s.run(&inputs).unwrap();
                for (got, want) in outs.iter().zip(&set.outputs) {
                    let tol = if name == "cpu" { 1e-4 } else { 1e-3 };
                    assert!(rel_l2(got, want) < tol, "{model} on {name}, {}: rel L2 {}", set.dir.display(), rel_l2(got, want));
                }
            }
        }
        std::fs::remove_file(path).ok();
    }
}

#[test]
fn fixed_dims_fold_shape_subgraphs_and_pin_the_shapes() {
    let free = compile("bert_tiny", &[]);
    let fixed = compile("bert_tiny", &["--fix", "batch=1", "--fix", "sequence=128"]);
    let (g_free, _) = artifact::load(&free).unwrap();
    let (g_fixed, info) = artifact::load(&fixed).unwrap();
    assert_eq!(info.fixed, vec![("batch".to_string(), 1), ("sequence".to_string(), 128)]);
    assert!(g_fixed.nodes.len() * 2 < g_free.nodes.len(), "fixed {} vs free {} nodes", g_fixed.nodes.len(), g_free.nodes.len());
    let s = Session::new(g_fixed, SessionOptions::device(kiln::runtime::DeviceChoice::Cpu)).unwrap();
    let set = &data_sets(&zoo().join("bert_tiny"))[0];
    let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let outs = s.run(&inputs).unwrap();
    assert!(rel_l2(&outs[0], &set.outputs[0]) < 1e-4);
    // Another sequence length is a clear input error now.
    let other = &data_sets(&zoo().join("bert_tiny"))[1];
    let inputs: Vec<(&str, &kiln::graph::Tensor)> = other.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let e = s.run(&inputs).unwrap_err().to_string();
    assert!(e.contains("input_ids") && e.contains("128"), "{e}");
    std::fs::remove_file(free).ok();
    std::fs::remove_file(fixed).ok();
}

#[test]
fn damaged_artifacts_are_clear_cli_errors() {
    let path = compile("mlp", &[]);
    let bytes = std::fs::read(&path).unwrap();
    for (damage, want) in [(bytes[..bytes.len() / 2].to_vec(), "truncated"), ({ let mut b = bytes.clone(); let n = b.len(); b[n - 5] ^= 0x40; b }, "checksum"), ({ let mut b = bytes.clone(); b[8] = 7; b }, "format 7")] {
        std::fs::write(&path, &damage).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["run", path.to_str().unwrap(), "--device", "cpu"]).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want) && !e.contains("panicked"), "{want}: {e}");
    }
    std::fs::remove_file(path).ok();
}

/// The runtime crate (which loads artifacts) must not depend on the compiler or protobuf.
#[test]
fn the_runtime_does_not_link_the_compiler_or_protobuf() {
    let manifest = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("runtime/Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    for banned in ["kiln-compiler", "prost", "protobuf"] {
        assert!(!deps.contains(banned), "runtime/Cargo.toml depends on {banned}");
    }
    // And transitively, as cargo resolves it.
    let o = Command::new(env!("CARGO")).args(["tree", "-p", "kiln-runtime", "-e", "normal", "--prefix", "none", "--offline"]).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    assert!(o.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&o.stderr));
    let tree = String::from_utf8_lossy(&o.stdout);
    for banned in ["kiln-compiler ", "prost ", "protobuf "] {
        assert!(!tree.contains(banned), "kiln-runtime depends on {banned}");
    }
}

/// For a GPU with every dim fixed, a loaded artifact's session plans the fixed shapes at
/// load (`warm_up`): the first run finds its plan and builds nothing. No kernel source
/// is stored: the runtime generates the kernels it runs.
#[test]
fn gpu_artifacts_warm_up_at_load() {
    gpu_env();
    let out = std::env::temp_dir().join(format!("kiln-artifact-{}-lenet-gpu.kiln", std::process::id()));
    let src = zoo().join("lenet").join("model.onnx");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["compile", src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--device", "gpu"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (graph, _) = artifact::load(&out).unwrap();
    let s = Session::new(graph, SessionOptions::device(kiln::runtime::DeviceChoice::Gpu)).unwrap();
    assert!(s.warm_up().unwrap(), "lenet's inputs are fixed");
    assert!(!s.kernel_records().unwrap().is_empty());
    let set = &data_sets(&zoo().join("lenet"))[0];
    let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let (outs, stats) = s.run_with_stats(&inputs).unwrap();
    assert!(!stats.specialized, "the first run should find the plan built at load");
    assert!(rel_l2(&outs[0], &set.outputs[0]) < 1e-3);
    std::fs::remove_file(out).ok();
}

fn run_cli(path: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(["run", path.to_str().unwrap(), "--device", "gpu"]).env("RUST_LOG", "kiln=info,kiln_runtime=debug").output().unwrap()
}

/// A GPU artifact carries the driver's pipeline cache (on adapters with wgpu's
/// PIPELINE_CACHE: Vulkan, so lavapipe in CI); loading takes it on the same adapter and
/// gives the same outputs; a cache for another adapter or driver is ignored, and
/// damaged cache bytes fail their checksum.
#[test]
fn gpu_artifacts_carry_a_pipeline_cache() {
    gpu_env();
    let out = std::env::temp_dir().join(format!("kiln-artifact-{}-lenet-cache.kiln", std::process::id()));
    let src = zoo().join("lenet").join("model.onnx");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["compile", src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--device", "gpu"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let adapter = kiln::runtime::list_devices().adapters.into_iter().next().expect("a GPU adapter (lavapipe in CI)");
    let (graph, info) = artifact::load(&out).unwrap();
    let Some(cache) = info.pipeline_cache.clone() else {
        // Only adapters without pipeline caching (not Vulkan) may store none.
        assert!(!adapter.features.iter().any(|f| f == "pipeline-cache") || adapter.backend != "Vulkan", "{} ({}) has pipeline caching but the artifact stores no cache", adapter.name, adapter.backend);
        std::fs::remove_file(out).ok();
        return;
    };
    assert!(cache.key.contains(&adapter.name) && cache.key.contains(&adapter.driver), "key '{}' for {}", cache.key, adapter.name);
    let set = &data_sets(&zoo().join("lenet"))[0];
    let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let s = Session::new(graph.clone(), SessionOptions::device(kiln::runtime::DeviceChoice::Gpu)).unwrap();
    assert!(s.use_pipeline_cache(&cache).unwrap(), "the cache was written on this adapter");
    assert!(s.warm_up().unwrap());
    assert!(rel_l2(&s.run(&inputs).unwrap()[0], &set.outputs[0]) < 1e-3);
    // The CLI takes it too.
    let o = run_cli(&out);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && log.contains("from the stored pipeline cache"), "{log}");

    // A cache of another adapter or driver: ignored, by the session and by the CLI.
    let foreign = kiln::runtime::PipelineCacheData { key: format!("{}; another driver", cache.key), data: cache.data.clone() };
    assert!(!s.use_pipeline_cache(&foreign).unwrap());
    let mut info_foreign = info.clone();
    info_foreign.pipeline_cache = Some(foreign);
    artifact::save(&out, &graph, &info_foreign).unwrap();
    let o = run_cli(&out);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && log.contains("pipeline cache ignored") && !log.contains("from the stored pipeline cache"), "{log}");
    let (graph2, info2) = artifact::load(&out).unwrap();
    let s2 = Session::new(graph2, SessionOptions::device(kiln::runtime::DeviceChoice::Gpu)).unwrap();
    assert!(!s2.use_pipeline_cache(info2.pipeline_cache.as_ref().unwrap()).unwrap());
    s2.warm_up().unwrap();
    assert!(rel_l2(&s2.run(&inputs).unwrap()[0], &set.outputs[0]) < 1e-3);

    // Damaged cache bytes (the file's last section): a checksum error naming it.
    artifact::save(&out, &graph, &info).unwrap();
    let mut bytes = std::fs::read(&out).unwrap();
    let n = bytes.len();
    bytes[n - cache.data.len() / 2 - 1] ^= 0x10;
    std::fs::write(&out, &bytes).unwrap();
    let o = run_cli(&out);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("pipeline cache's checksum") && !e.contains("panicked"), "{e}");
    std::fs::remove_file(out).ok();
}

#[test]
fn a_tuned_artifact_runs_with_its_embedded_choices_on_lavapipe() {
    let db = std::env::temp_dir().join(format!("kiln-artifact-tune-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let path = compile_for("lenet", "gpu", &["--tune", "--budget", "8", "--tuning-db", db.to_str().unwrap()]);
    let (graph, info) = artifact::load(&path).unwrap();
    assert!(!info.tuning.is_empty(), "compile --tune embeds choices");
    assert!(info.tuning.keys().all(|k| k.contains("wgsl-")), "GPU kernels' keys");
    // No database: the embedded choices alone.
    let tuning = kiln::runtime::Tuning { embedded: info.tuning.clone(), ..kiln::runtime::Tuning::off() };
    let s = Session::new(graph.clone(), SessionOptions { device: kiln::runtime::DeviceChoice::Gpu, tuning, ..Default::default() }).unwrap();
    let off = Session::new(graph, SessionOptions::device(kiln::runtime::DeviceChoice::Gpu)).unwrap();
    for set in data_sets(&zoo().join("lenet")) {
        let inputs: Vec<(&str, &kiln::graph::Tensor)> = set.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (tuned, untuned) = (s.run(&inputs).unwrap(), off.run(&inputs).unwrap());
        for ((got, plain), want) in tuned.iter().zip(&untuned).zip(&set.outputs) {
            assert!(rel_l2(got, want) < 1e-3 && rel_l2(plain, want) < 1e-3, "rel L2 {} / {}", rel_l2(got, want), rel_l2(plain, want));
        }
    }
    // Every key the tuned session looked up was found (only keys the budget did not
    // reach may be missing); the plain session found none.
    assert!(s.untuned().unwrap().len() < off.untuned().unwrap().len(), "{:?}", s.untuned().unwrap());
    let _ = std::fs::remove_file(&db);
}
