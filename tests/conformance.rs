//! The ONNX backend node tests (from the onnx Python package, materialised by
//! scripts/test.sh) on every backend. A test is in scope when every op of its model is
//! in Kiln's registry. Each backend has an explicit expected-failure list,
//! tests/conformance/xfail-<backend>.txt, printed with the results: the suite fails
//! when an unlisted test fails and when a listed test passes (so the list stays true).
//! `KILN_UPDATE_XFAIL=1` rewrites the lists from the current results.
//!
//! Random ops: the expected outputs of tests with RandomUniform(Like), RandomNormal(Like),
//! Bernoulli or Multinomial come from numpy's generator, which nothing else reproduces.
//! Their outputs are checked for the reference's dtype and shape, finite values within
//! the reference's range, integers where the reference holds integers; and when every
//! random node has a `seed`, a second run must return the same bytes.
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
    /// Whether the test's data holds sequences or optionals.
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
    // A dtype named by an attribute (Cast's `to`, EyeLike's `dtype`, ...) that Kiln lacks.
    for n in &graph.nodes {
        for key in ["to", "dtype", "output_dtype"] {
            if let Some(kiln::graph::Attr::Int(code)) = n.attrs.get(key) {
                if kiln::graph::DType::from_onnx_code(*code as i32).is_none() {
                    return Outcome::OutOfScope(format!("unsupported dtype: {} {key}={code}", n.op_type));
                }
            }
        }
    }
    let random: Vec<&kiln::graph::Node> = graph.nodes.iter().filter(|n| RANDOM_OPS.contains(&n.op_type.as_str())).collect();
    let all_seeded = random.iter().all(|n| n.attrs.contains_key("seed"));
    let random = !random.is_empty();
    // Backend tolerance: WGSL's f32 math is less precise than the CPU's.
    let (rtol, atol) = if backend == "gpu" { (m.rtol.max(1e-3), m.atol.max(1e-5)) } else { (m.rtol, m.atol.max(1e-7)) };
    let session = match Session::new(graph, SessionOptions::device(device.clone())) {
        Ok(s) => s,
        Err(e) => return Outcome::Fail(format!("session: {e}")),
    };
    let (names, in_types): (Vec<String>, Vec<kiln::graph::ValueType>) = session.inputs().into_iter().unzip();
    let out_types: Vec<Option<kiln::graph::ValueType>> = session.graph().outputs.iter().map(|&o| session.graph().values[o].ty.clone()).collect();
    // Tests with sequences or optionals (meta.json's non_tensor) have them in their files.
    let sets = if m.non_tensor { data_sets_of(dir, &in_types, &out_types) } else { data_sets(dir) };
    for set in sets {
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
            let checked = if random { like_random_reference(got, want) } else { allclose_value(got, want, rtol, atol) };
            if let Err(e) = checked {
                return Outcome::Fail(format!("output {k}: {e}"));
            }
        }
        if random && all_seeded {
            match session.run(&inputs) {
                Ok(again) if again.iter().zip(&outs).all(|(a, b)| a.bytes() == b.bytes()) => {}
                Ok(_) => return Outcome::Fail("a seeded random op gave different outputs on a second run".into()),
                Err(e) => return Outcome::Fail(format!("second run: {e}")),
            }
        }
    }
    Outcome::Pass
}

/// Ops whose node tests' reference outputs come from numpy's random generator, which
/// no other implementation reproduces (onnxruntime's outputs differ too). A model with
/// one of them is checked by [`like_random_reference`] instead of value by value, and
/// when every random node has a `seed`, a second run must give the same bytes.
const RANDOM_OPS: [&str; 6] = ["RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli", "Multinomial"];

/// The rule for outputs of random models: the reference's dtype and shape, every value
/// finite and inside the closed range of the reference's values, and an integer where
/// the reference holds only integers (Bernoulli's 0/1, Multinomial's classes).
fn like_random_reference(got: &kiln::graph::Tensor, want: &kiln::graph::Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.dims() != want.dims() {
        return Err(format!("got {}{:?}, expected {}{:?}", got.dtype(), got.dims(), want.dtype(), want.dims()));
    }
    let w = want.to_f64_vec();
    let (lo, hi) = w.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let integral = w.iter().all(|v| v.fract() == 0.0);
    for (i, v) in got.to_f64_vec().into_iter().enumerate() {
        if !v.is_finite() || v < lo || v > hi || (integral && v.fract() != 0.0) {
            return Err(format!("element {i} = {v} is outside the reference's values ([{lo}, {hi}]{})", if integral { ", integers" } else { "" }));
        }
    }
    Ok(())
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

/// The outcomes of every (filtered) node test on one backend, in name order.
fn run_backend(dirs: &[PathBuf], backend: &str, device: &DeviceChoice) -> Vec<(String, Outcome)> {
    dirs.iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| run_case(dir, backend, device))).unwrap_or_else(|p| {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                Outcome::Fail(format!("PANIC: {msg}"))
            });
            (name, outcome)
        })
        .collect()
}

/// Prints one backend's results and checks them against its expected-failure list;
/// returns the problems (unexpected failures, stale expectations).
fn report(backend: &str, results: &[(String, Outcome)], seconds: f64, update: bool) -> Vec<String> {
    let xfail = read_xfail(backend);
    let in_scope = results.iter().filter(|(_, o)| !matches!(o, Outcome::OutOfScope(_))).count();
    let passed = results.iter().filter(|(_, o)| matches!(o, Outcome::Pass)).count();
    let mut unexpected = vec![];
    let mut stale = vec![];
    for (name, o) in results {
        match (o, xfail.contains_key(name)) {
            (Outcome::Fail(why), false) => unexpected.push(format!("{name}: {why}")),
            (Outcome::Pass, true) => stale.push(format!("{name} (passes now)")),
            (Outcome::OutOfScope(why), true) => stale.push(format!("{name} (out of scope: {why})")),
            _ => {}
        }
    }
    if update {
        let mut text = format!(
            "# ONNX node tests expected to fail on the {backend} backend, with the reason seen.\n\
             # The conformance test fails when a listed test passes or an unlisted one fails.\n\
             # Regenerate with KILN_UPDATE_XFAIL=1 cargo test --release -p kiln --test conformance.\n"
        );
        for (name, o) in results {
            if let Outcome::Fail(why) = o {
                let why: String = why.replace('\n', " ").chars().take(160).collect();
                text += &format!("{name}  # {why}\n");
            }
        }
        std::fs::write(xfail_path(backend), text).unwrap();
        println!("rewrote {}", xfail_path(backend).display());
        return vec![];
    }
    let mut out = format!(
        "\n=== ONNX node tests on {backend}: {passed} pass of {} ({in_scope} in scope, {} out of scope) in {seconds:.0} s\n",
        results.len(),
        results.len() - in_scope
    );
    out += &format!("=== expected failures on {backend} ({}):\n", xfail.len());
    for (name, why) in &xfail {
        out += &format!("    {name}  # {why}\n");
    }
    if !unexpected.is_empty() {
        out += &format!("=== UNEXPECTED FAILURES on {backend} ({}):\n", unexpected.len());
        for u in &unexpected {
            out += &format!("    {u}\n");
        }
    }
    if !stale.is_empty() {
        out += &format!("=== STALE expected failures on {backend} ({}): remove them from {}\n", stale.len(), xfail_path(backend).display());
        for s in &stale {
            out += &format!("    {s}\n");
        }
    }
    print!("{out}");
    let mut problems = vec![];
    if !unexpected.is_empty() || !stale.is_empty() {
        problems.push(format!("{backend}: {} unexpected failures, {} stale expected failures", unexpected.len(), stale.len()));
    }
    problems
}

/// Runs every node test on the CPU and on the GPU (concurrently), checks each backend
/// against its expected-failure list, and (on a full, unfiltered run) writes
/// docs/ops.md. `KILN_CONFORMANCE_FILTER=substr` narrows the tests,
/// `KILN_CONFORMANCE_BACKEND=cpu|gpu` the backends.
#[test]
fn onnx_node_tests() {
    gpu_env();
    let root = onnx_tests();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("model.onnx").is_file()).collect();
    dirs.sort();
    let filter = std::env::var("KILN_CONFORMANCE_FILTER").unwrap_or_default();
    dirs.retain(|d| d.file_name().unwrap().to_string_lossy().contains(&filter));
    let only = std::env::var("KILN_CONFORMANCE_BACKEND").unwrap_or_default();
    let backends: Vec<(&str, DeviceChoice)> = [("cpu", DeviceChoice::Cpu), ("gpu", DeviceChoice::Gpu)].into_iter().filter(|(b, _)| only.is_empty() || only == *b).collect();
    let full = filter.is_empty() && only.is_empty();
    let update = std::env::var_os("KILN_UPDATE_XFAIL").is_some() && filter.is_empty();
    let results: Vec<(&str, Vec<(String, Outcome)>, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = backends
            .iter()
            .map(|(b, device)| {
                let dirs = &dirs;
                scope.spawn(move || {
                    let start = std::time::Instant::now();
                    let r = run_backend(dirs, b, device);
                    (*b, r, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("conformance thread panicked")).collect()
    });
    let mut problems = vec![];
    for (b, r, secs) in &results {
        problems.extend(report(b, r, *secs, update));
    }
    if full {
        let doc = ops_doc(&root, &dirs, &results);
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/ops.md");
        std::fs::write(&path, doc).unwrap();
        println!("wrote {}", path.display());
    }
    assert!(problems.is_empty(), "{} (see above)", problems.join("; "));
}

/// The op a node test is about (meta.json "op", written by the materialiser).
fn test_op(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("meta.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["op"].as_str().unwrap_or("(unknown)").to_string()
}

#[derive(Default)]
struct OpRow {
    implemented: bool,
    deprecated: bool,
    total: usize,
    passed: BTreeMap<String, usize>,
    why_not: BTreeMap<String, usize>,
}

/// Why a test does not pass, shortened to a category for the table's notes.
fn category(o: &Outcome) -> Option<String> {
    match o {
        Outcome::Pass => None,
        Outcome::Fail(_) => Some("expected failure".into()),
        Outcome::OutOfScope(why) => Some(if why.starts_with("unsupported op") {
            why.clone()
        } else {
            "unsupported dtype".into()
        }),
    }
}

/// docs/ops.md: every ONNX operator with its passing/total node tests per backend.
fn ops_doc(root: &Path, dirs: &[PathBuf], results: &[(&str, Vec<(String, Outcome)>, f64)]) -> String {
    let registry = kiln::ops::Registry::builtin();
    let mut rows: BTreeMap<String, OpRow> = BTreeMap::new();
    let catalog: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("onnx_ops.json")).unwrap_or_default()).unwrap_or_default();
    for e in catalog.as_array().into_iter().flatten() {
        let (domain, op) = (e["domain"].as_str().unwrap_or(""), e["op"].as_str().unwrap_or(""));
        let key = if domain == "ai.onnx" { op.to_string() } else { format!("{domain}.{op}") };
        let row = rows.entry(key).or_default();
        row.deprecated = e["deprecated"].as_bool().unwrap_or(false);
        row.implemented = registry.supports(if domain == "ai.onnx" { "" } else { domain }, op);
    }
    let ops: Vec<String> = dirs.iter().map(|d| test_op(d)).collect();
    for op in &ops {
        rows.entry(op.clone()).or_default().total += 1;
    }
    for (backend, res, _) in results {
        for ((_, o), op) in res.iter().zip(&ops) {
            let row = rows.get_mut(op).unwrap();
            if matches!(o, Outcome::Pass) {
                *row.passed.entry(backend.to_string()).or_default() += 1;
            } else if let Some(c) = category(o) {
                *row.why_not.entry(format!("{backend}: {c}")).or_default() += 1;
            }
        }
    }
    let version = std::fs::read_to_string(root.join(".complete")).unwrap_or_default();
    let backends: Vec<&str> = results.iter().map(|(b, _, _)| *b).collect();
    let mut doc = String::from("# ONNX operator conformance\n\n");
    doc += &format!(
        "Generated by `tests/conformance.rs` (a full run of `cargo test --release -p kiln --test conformance`) from the \
         ONNX backend node tests of the onnx Python package ({}): {} tests. Each test is attributed to the op it is \
         about (an `_expanded` test runs that op's function body). A cell is *passing / total*. \
         Every test of an implemented op either passes or is on the backend's expected-failure list \
         (`tests/conformance/xfail-<backend>.txt`); the others need an op or a dtype Kiln does not have.\n\n",
        version.trim(),
        dirs.len()
    );
    doc += "| | ";
    doc += &backends.iter().map(|b| b.to_uppercase()).collect::<Vec<_>>().join(" | ");
    doc += " |\n|---|";
    doc += &"---|".repeat(backends.len());
    doc += "\n";
    doc += "| node tests passing | ";
    doc += &results.iter().map(|(_, r, _)| format!("{} of {}", r.iter().filter(|(_, o)| matches!(o, Outcome::Pass)).count(), r.len())).collect::<Vec<_>>().join(" | ");
    doc += " |\n| op types with a passing test | ";
    doc += &backends.iter().map(|b| rows.values().filter(|r| r.passed.get(*b).copied().unwrap_or(0) > 0).count().to_string()).collect::<Vec<_>>().join(" | ");
    doc += " |\n";
    let implemented = rows.values().filter(|r| r.implemented).count();
    doc += &format!("| ops Kiln implements |{}\n\n", format!(" {implemented} |").repeat(backends.len()));
    doc += "| Op | Kiln | ";
    doc += &backends.iter().map(|b| b.to_uppercase()).collect::<Vec<_>>().join(" | ");
    doc += " | Not passing because |\n|---|---|";
    doc += &"---|".repeat(backends.len());
    doc += "---|\n";
    for (op, row) in &rows {
        let name = if row.deprecated { format!("{op} (deprecated)") } else { op.clone() };
        let cells: Vec<String> = backends.iter().map(|b| format!("{} / {}", row.passed.get(*b).copied().unwrap_or(0), row.total)).collect();
        let notes = notes(row, &backends);
        doc += &format!("| {name} | {} | {} | {notes} |\n", if row.implemented { "yes" } else { "" }, cells.join(" | "));
    }
    doc
}

/// The reasons an op's tests do not pass; said once when every backend agrees.
fn notes(row: &OpRow, backends: &[&str]) -> String {
    let per: Vec<Vec<String>> = backends
        .iter()
        .map(|b| row.why_not.iter().filter_map(|(w, n)| w.strip_prefix(&format!("{b}: ")).map(|w| format!("{w} ({n})"))).collect())
        .collect();
    if per.windows(2).all(|w| w[0] == w[1]) {
        return per.first().map(|p| p.join("; ")).unwrap_or_default();
    }
    backends.iter().zip(&per).filter(|(_, p)| !p.is_empty()).map(|(b, p)| format!("{b}: {}", p.join("; "))).collect::<Vec<_>>().join("; ")
}
