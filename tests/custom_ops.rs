//! Custom ops, both kinds, in a model that uses one in its own domain
//! (samples/custom-op-manifest/model.onnx: MatMul, com.example.SwiGlu, MatMul):
//! - from a manifest (JSON + WGSL + a C kernel built here with the system compiler),
//!   through the API and the CLI, on the CPU and the GPU, and compiled into an artifact
//!   that runs after the files are gone;
//! - written in Rust (the op of samples/custom-op-rust, compiled into this test), on the
//!   CPU and the GPU.
//!
//! Each result is compared with an f64 reference.
mod common;
use common::*;
use kiln::graph::Tensor;
use kiln::runtime::{Session, SessionOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../samples/custom-op-rust/src/swiglu.rs"]
#[allow(dead_code)]
mod swiglu;

fn sample_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/custom-op-manifest")
}

fn model() -> PathBuf {
    sample_dir().join("model.onnx")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-custom-ops-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The manifest op's files in a fresh folder `name`, with the C kernel built by the
/// system compiler (`cc`) unless `with_cpu` is false (then the manifest has no "cpu").
fn manifest_files(name: &str, with_cpu: bool) -> PathBuf {
    let dir = tmp(name);
    let src = sample_dir();
    std::fs::copy(src.join("swiglu.wgsl"), dir.join("swiglu.wgsl")).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(src.join("swiglu.json")).unwrap()).unwrap();
    if with_cpu {
        let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        let out = Command::new("cc")
            .args(["-O2", "-shared", "-fPIC", "-I"])
            .arg(&include)
            .arg(src.join("swiglu.c"))
            .arg("-o")
            .arg(dir.join("libswiglu.so"))
            .arg("-lm")
            .output()
            .expect("the system C compiler (cc) runs; scripts/test.sh installs it");
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    } else {
        manifest.as_object_mut().unwrap().remove("cpu");
    }
    std::fs::write(dir.join("swiglu.json"), serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
    dir
}

fn input() -> Tensor {
    Tensor::from_vec(&[5, 8], (0..40).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect()).unwrap()
}

/// y = SwiGlu(x @ w1, beta 1.5) @ w2, in f64, with the model's weights.
fn reference(x: &Tensor) -> Vec<f64> {
    let g = kiln::compiler::onnx::import_file_unchecked(model()).unwrap();
    let w = |name: &str| g.initializers.iter().find(|(&v, _)| g.values[v].name == name).map(|(_, t)| t.to_f64_vec()).unwrap();
    let (w1, w2, x) = (w("w1"), w("w2"), x.to_f64_vec());
    let n = x.len() / 8;
    let mut y = vec![0.0; n * 4];
    for r in 0..n {
        let h: Vec<f64> = (0..32).map(|j| (0..8).map(|i| x[r * 8 + i] * w1[i * 32 + j]).sum()).collect();
        let gate: Vec<f64> = (0..16).map(|j| h[j] / (1.0 + (-1.5 * h[j]).exp()) * h[16 + j]).collect();
        for c in 0..4 {
            y[r * 4 + c] = (0..16).map(|j| gate[j] * w2[j * 4 + c]).sum();
        }
    }
    y
}

fn assert_matches_reference(y: &Tensor, x: &Tensor, what: &str) {
    let want = reference(x);
    assert_eq!(y.dims(), &[x.dims()[0], 4], "{what}");
    let err = y.to_f64_vec().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(err < 1e-5, "{what}: max |error| {err:.3e} against the f64 reference");
}

/// Imports the model with `registry`, optimises it, and runs it on `device`.
fn run_with(registry: &kiln::ops::Registry, device: kiln::runtime::DeviceChoice, x: &Tensor) -> Tensor {
    let mut g = kiln::compiler::onnx::import_file_with(model(), &kiln::compiler::onnx::ImportOptions::with_registry(registry)).unwrap();
    kiln::compiler::passes::optimize_with(&mut g, kiln::compiler::passes::Target::Any, &mut kiln::compiler::passes::PassContext::new(registry));
    let s = Session::new(g, SessionOptions { device, registry: Some(registry.clone()), ..Default::default() }).unwrap();
    s.run(&[("x", x)]).unwrap().remove(0)
}

#[test]
fn a_manifest_op_runs_on_every_device_against_f64() {
    gpu_env();
    let dir = manifest_files("api", true);
    let op = kiln::ops::custom::CustomOp::load(dir.join("swiglu.json")).unwrap();
    assert!(op.has_cpu_kernel() && op.has_gpu_kernel());
    let mut registry = kiln::ops::Registry::builtin().clone();
    op.register(&mut registry);
    let x = input();
    for (name, device) in backends() {
        assert_matches_reference(&run_with(&registry, device, &x), &x, &format!("manifest op on {name}"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_rust_op_runs_on_every_device_against_f64() {
    gpu_env();
    let mut registry = kiln::ops::Registry::builtin().clone();
    swiglu::register(&mut registry);
    let x = input();
    for (name, device) in backends() {
        assert_matches_reference(&run_with(&registry, device, &x), &x, &format!("Rust op on {name}"));
    }
}

fn kiln(args: &[&str]) -> std::process::Output {
    gpu_env();
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs")
}

fn ok(o: &std::process::Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what} failed: {err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_cli_runs_a_manifest_op_and_its_artifact_runs_without_the_files() {
    let dir = manifest_files("cli", true);
    let out = tmp("cli-out");
    let x = input();
    let x_file = out.join("x.npy");
    kiln::runtime::npy::write_file(&x_file, &x).unwrap();
    let x_arg = format!("x={}", x_file.display());
    let manifest = dir.join("swiglu.json");
    let (m, model_path) = (manifest.to_str().unwrap(), model());
    let model_arg = model_path.to_str().unwrap();
    for device in ["cpu", "gpu"] {
        let y_dir = out.join(device);
        ok(&kiln(&["run", model_arg, "--custom-op", m, "--device", device, "-i", &x_arg, "--output-dir", y_dir.to_str().unwrap()]), "kiln run");
        let y = kiln::runtime::npy::read_file(y_dir.join("y.npy")).unwrap();
        assert_matches_reference(&y, &x, &format!("kiln run --custom-op on {device}"));
    }
    ok(&kiln(&["bench", model_arg, "--custom-op", m, "--device", "gpu", "--iters", "2", "--warmup", "1"]), "kiln bench");
    let shown = ok(&kiln(&["inspect", model_arg, "--custom-op", m]), "kiln inspect");
    assert!(shown.contains("SwiGlu"), "{shown}");
    // Without the manifest, the op is unsupported and the error says how to give it.
    let o = kiln(&["run", model_arg, "--device", "cpu"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("com.example") && e.contains("--custom-op"), "{e}");

    // The artifact embeds manifest, WGSL and library: it runs after they are deleted.
    let artifact = out.join("swiglu.kiln");
    ok(&kiln(&["compile", model_arg, "--custom-op", m, "--device", "cpu", "-o", artifact.to_str().unwrap()]), "kiln compile");
    std::fs::remove_dir_all(&dir).unwrap();
    for device in ["cpu", "gpu"] {
        let y_dir = out.join(format!("artifact-{device}"));
        ok(&kiln(&["run", artifact.to_str().unwrap(), "--device", device, "-i", &x_arg, "--output-dir", y_dir.to_str().unwrap()]), "kiln run artifact");
        let y = kiln::runtime::npy::read_file(y_dir.join("y.npy")).unwrap();
        assert_matches_reference(&y, &x, &format!("the artifact on {device}"));
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_manifest_op_without_a_cpu_kernel_runs_on_the_gpu_and_a_cpu_session_says_why_not() {
    let dir = manifest_files("gpu-only", false);
    let manifest = dir.join("swiglu.json");
    let model_path = model();
    let o = kiln(&["run", model_path.to_str().unwrap(), "--custom-op", manifest.to_str().unwrap(), "--device", "cpu"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !e.contains("panicked"), "{e}");
    assert!(e.contains("'gate'") && e.contains("no CPU kernel"), "{e}");
    // A GPU session places it on the GPU.
    let op = kiln::ops::custom::CustomOp::load(&manifest).unwrap();
    assert!(!op.has_cpu_kernel());
    let mut registry = kiln::ops::Registry::builtin().clone();
    op.register(&mut registry);
    let x = input();
    assert_matches_reference(&run_with(&registry, kiln::runtime::DeviceChoice::Gpu, &x), &x, "GPU-only manifest op");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_c_kernel_error_names_the_node_and_carries_the_message() {
    // The example C kernel refuses inputs that are not 2-D: feed it a 3-D one through a
    // model whose SwiGlu reads the graph input directly.
    let dir = manifest_files("c-error", true);
    let op = kiln::ops::custom::CustomOp::load(dir.join("swiglu.json")).unwrap();
    let mut registry = kiln::ops::Registry::builtin().clone();
    op.register(&mut registry);
    let mut b = kiln::graph::GraphBuilder::new("swiglu3d");
    let x = b.input("x", kiln::graph::DType::F32, [2, 3, 4]);
    let y = b.node("SwiGlu", &[x], &[]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].domain = "com.example".into();
    let s = Session::new(g, SessionOptions { device: kiln::runtime::DeviceChoice::Cpu, registry: Some(registry), ..Default::default() }).unwrap();
    let t = Tensor::from_vec(&[2, 3, 4], vec![0.5f32; 24]).unwrap();
    let e = s.run(&[("x", &t)]).unwrap_err().to_string();
    assert!(e.contains("SwiGlu") && e.contains("expected one 2-D float input"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[path = "../samples/custom-op-rust/src/swish.rs"]
mod swish;

/// A custom op that declares itself elementwise fuses with Kiln's own ops into one
/// kernel, and the fused kernel computes what the unfused nodes do, on every device
/// (and after an artifact round trip, the fused node finding the op in the registry).
#[test]
fn a_custom_elementwise_op_fuses_with_kilns_own() {
    gpu_env();
    let mut registry = kiln::ops::Registry::builtin().clone();
    swiglu::register(&mut registry);
    swish::register(&mut registry);
    let mut b = kiln::graph::GraphBuilder::new("swish_chain");
    let x = b.input("x", kiln::graph::DType::F32, [3, 7]);
    let s = b.node("Swish", &[x], &[("beta", kiln::graph::Attr::Float(1.5))]);
    let t = b.node("Tanh", &[s], &[]);
    let two = b.constant("two", Tensor::from_vec(&[1], vec![2.0f32]).unwrap());
    let m = b.node("Mul", &[t, two], &[]);
    let s2 = b.node("Swish", &[m], &[]);
    b.output(s2);
    let mut g = b.finish().unwrap();
    for n in g.nodes.iter_mut().filter(|n| n.op_type == "Swish") {
        n.domain = "com.example".into();
    }
    let raw = g.clone();
    kiln::compiler::passes::optimize_with(&mut g, kiln::compiler::passes::Target::Any, &mut kiln::compiler::passes::PassContext::new(&registry));
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["FusedElementwise"], "four nodes, two of them custom, become one kernel");
    let path = std::env::temp_dir().join(format!("kiln-swish-{}.kiln", std::process::id()));
    kiln::runtime::artifact::save(&path, &g, &Default::default()).unwrap();
    let (loaded, _) = kiln::runtime::artifact::load(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let xv = Tensor::from_vec(&[3, 7], (0..21).map(|i| (i as f32 - 10.0) / 4.0).collect()).unwrap();
    let want: Vec<f64> = xv.to_f64_vec().iter().map(|&v| {
        let swish = |v: f64, beta: f64| v / (1.0 + (-beta * v).exp());
        swish(2.0 * swish(v, 1.5).tanh(), 1.0)
    }).collect();
    for (name, device) in backends() {
        for (what, graph) in [("unfused", raw.clone()), ("fused", g.clone()), ("fused, from an artifact", loaded.clone())] {
            let s = Session::new(graph, SessionOptions { device: device.clone(), registry: Some(registry.clone()), ..Default::default() }).unwrap();
            let y = s.run(&[("x", &xv)]).unwrap().remove(0);
            let err = y.to_f64_vec().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(err < 1e-5, "{what} on {name}: max |error| {err:.3e}");
        }
    }
}
