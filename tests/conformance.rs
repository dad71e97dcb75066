//! The ONNX backend node tests (from the onnx Python package, materialised by
//! scripts/test.sh) on every backend. A test is in scope when every op of its model is
//! in Kiln's registry. Each backend has an explicit expected-failure list,
//! tests/conformance/xfail-<backend>.txt, printed with the results: the suite fails
//! when an unlisted test fails and when a listed test passes (so the list stays true).
//! `KILN_UPDATE_XFAIL=1` rewrites the lists from the current results.
mod common;
use common::*;
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

#[derive(Debug)]
enum Outcome {
    Pass,
    Fail(String),
    OutOfScope(String),
}

struct Meta {
    rtol: f64,
    atol: f64,
    non_tensor: bool,
}

fn meta(dir: &Path) -> Meta {
    let text = std::fs::read_to_string(dir.join("meta.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    Meta {
        rtol: v["rtol"].as_f64().unwrap_or(1e-3),
        atol: v["atol"].as_f64().unwrap_or(1e-7),
        non_tensor: v["non_tensor"].as_bool().unwrap_or(false),
    }
}

fn run_case(dir: &Path, backend: &str, device: &DeviceChoice) -> Outcome {
    let m = meta(dir);
    if m.non_tensor {
        return Outcome::OutOfScope("sequence/optional data".into());
    }
    let graph = match kiln::compiler::onnx::import_file_unchecked(&dir.join("model.onnx")) {
        Ok(g) => g,
        Err(kiln::compiler::onnx::ImportError::UnsupportedDtype(what)) => return Outcome::OutOfScope(what),
        Err(e) => return Outcome::Fail(format!("import: {e}")),
    };
    let registry = kiln::ops::Registry::builtin();
    let mut missing: Vec<String> = graph.nodes.iter().filter(|n| !registry.supports(&n.domain, &n.op_type)).map(|n| n.op_type.clone()).collect();
    missing.dedup();
    if !missing.is_empty() {
        return Outcome::OutOfScope(format!("unsupported op {}", missing.join(", ")));
    }
    // Backend tolerance: WGSL's f32 math is less precise than the CPU's.
    let (rtol, atol) = if backend == "gpu" { (m.rtol.max(1e-3), m.atol.max(1e-5)) } else { (m.rtol, m.atol.max(1e-7)) };
    let session = match Session::new(graph, SessionOptions::device(device.clone())) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(format!("session: {e}")),
    };
    let names: Vec<String> = session.inputs().into_iter().map(|(n, _)| n).collect();
    for set in data_sets(dir) {
        let inputs: Vec<(&str, &kiln::graph::Tensor)> = set
            .inputs
            .iter()
            .enumerate()
            .map(|(i, (n, t))| (if n.is_empty() { names.get(i).map(|s| s.as_str()).unwrap_or("") } else { n.as_str() }, t))
            .collect();
        let outs = match session.run(&inputs) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("run: {e}")),
        };
        for (k, (got, want)) in outs.iter().zip(&set.outputs).enumerate() {
            if let Err(e) = allclose(got, want, rtol, atol) {
                return Outcome::Fail(format!("output {k}: {e}"));
            }
        }
    }
    Outcome::Pass
}

fn xfail_path(backend: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/conformance/xfail-{backend}.txt"))
}

fn read_xfail(backend: &str) -> BTreeMap<String, String> {
    std::fs::read_to_string(xfail_path(backend))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once('#') {
            Some((n, why)) => (n.trim().to_string(), why.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

fn suite(backend: &str, device: DeviceChoice) {
    gpu_env();
    let root = onnx_tests();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("model.onnx").is_file()).collect();
    dirs.sort();
    let filter = std::env::var("KILN_CONFORMANCE_FILTER").unwrap_or_default();
    let xfail = read_xfail(backend);
    let start = std::time::Instant::now();
    let mut results: Vec<(String, Outcome)> = vec![];
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        if !name.contains(&filter) {
            continue;
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| run_case(dir, backend, &device)))
            .unwrap_or_else(|p| {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                Outcome::Fail(format!("PANIC: {msg}"))
            });
        results.push((name, outcome));
    }
    let in_scope: Vec<&(String, Outcome)> = results.iter().filter(|(_, o)| !matches!(o, Outcome::OutOfScope(_))).collect();
    let passed = in_scope.iter().filter(|(_, o)| matches!(o, Outcome::Pass)).count();
    let mut unexpected = vec![];
    let mut stale = vec![];
    for (name, o) in &results {
        match (o, xfail.contains_key(name)) {
            (Outcome::Fail(why), false) => unexpected.push(format!("{name}: {why}")),
            (Outcome::Pass, true) => stale.push(format!("{name} (passes now)")),
            (Outcome::OutOfScope(why), true) => stale.push(format!("{name} (out of scope: {why})")),
            _ => {}
        }
    }
    if std::env::var_os("KILN_UPDATE_XFAIL").is_some() && filter.is_empty() {
        let mut text = format!(
            "# ONNX node tests expected to fail on the {backend} backend, with the reason seen.\n\
             # The conformance test fails when a listed test passes or an unlisted one fails.\n\
             # Regenerate with KILN_UPDATE_XFAIL=1 cargo test --release --test conformance.\n"
        );
        for (name, o) in &results {
            if let Outcome::Fail(why) = o {
                let why: String = why.replace('\n', " ").chars().take(160).collect();
                text += &format!("{name}  # {why}\n");
            }
        }
        std::fs::write(xfail_path(backend), text).unwrap();
        println!("rewrote {}", xfail_path(backend).display());
        return;
    }
    println!("\n=== ONNX node tests on {backend}: {passed} of {} in-scope tests pass ({} out of scope, {} total) in {:.0} s", in_scope.len(), results.len() - in_scope.len(), results.len(), start.elapsed().as_secs_f64());
    println!("=== expected failures on {backend} ({}):", xfail.len());
    for (name, why) in &xfail {
        println!("    {name}  # {why}");
    }
    if !unexpected.is_empty() {
        println!("=== UNEXPECTED FAILURES on {backend} ({}):", unexpected.len());
        for u in &unexpected {
            println!("    {u}");
        }
    }
    if !stale.is_empty() {
        println!("=== STALE expected failures on {backend} ({}): remove them from {}", stale.len(), xfail_path(backend).display());
        for s in &stale {
            println!("    {s}");
        }
    }
    assert!(unexpected.is_empty() && stale.is_empty(), "{backend}: {} unexpected failures, {} stale expected failures (see above)", unexpected.len(), stale.len());
}

#[test]
fn onnx_node_tests_cpu() {
    suite("cpu", DeviceChoice::Cpu);
}

#[test]
fn onnx_node_tests_gpu() {
    suite("gpu", DeviceChoice::Gpu);
}
