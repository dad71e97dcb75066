//! The auto-tuner on the CPU and on a GPU adapter (lavapipe in CI), with a test op whose
//! kernels offer variants: a slow default, a fast one, a much slower one, and one that
//! computes the wrong thing (which must never win). The database is written, read back
//! by later sessions, embedded in artifacts, and ignored when damaged or stale.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Tensor};
use kiln_ops::wgsl::{declare, grid_1d, Binding, Dispatch};
use kiln_ops::{Arg, CpuKernel, NodeSpec, Op, Registry, TensorType, TuneParam, TuneValues, WgslKernel, WgslProgram};
use kiln_runtime::tune::{db, KeyStatus, TuneOptions, Tuning};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Runs of each CPU variant, per test (the op's `slot` attribute).
static RUNS: [[AtomicUsize; 4]; 8] = [const { [const { AtomicUsize::new(0) }; 4] }; 8];

fn runs(slot: usize) -> [usize; 4] {
    std::array::from_fn(|v| RUNS[slot][v].load(Ordering::SeqCst))
}

/// `y = 2x` with variants (CPU param `variant`, WGSL params `workgroup` and `variant`):
/// 0 (default) recomputes 16 times, 1 once, 2 computes `y = x` (wrong), 3 recomputes 64
/// times.
#[derive(Debug)]
struct Twice {
    slot: usize,
}

#[derive(Debug)]
struct TwiceVariant {
    slot: usize,
    variant: u32,
}

fn twice_into(x: &[f32], y: &mut [f32], variant: u32) {
    let times = match variant {
        0 => 16,
        3 => 64,
        _ => 1,
    };
    let k = if variant == 2 { 1.0 } else { 2.0 };
    for _ in 0..times {
        for (o, v) in y.iter_mut().zip(x) {
            *o = std::hint::black_box(k * v);
        }
    }
}

impl Op for Twice {
    fn name(&self) -> &str {
        "Twice"
    }
    fn infer(&self, inputs: &[Option<Arg>]) -> kiln_ops::Result<Vec<TensorType>> {
        Ok(vec![inputs[0].unwrap().ty.clone()])
    }
    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }
    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
    fn overwrites_outputs(&self) -> bool {
        true
    }
}

fn variant_param() -> TuneParam {
    TuneParam { name: "variant", default: 0, candidates: vec![0, 1, 2, 3] }
}

impl CpuKernel for Twice {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> kiln_ops::Result<()> {
        TwiceVariant { slot: self.slot, variant: 0 }.run(inputs, outputs)
    }
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        vec![variant_param()]
    }
    fn prepare(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> kiln_ops::Result<Option<Box<dyn CpuKernel>>> {
        Ok(Some(Box::new(TwiceVariant { slot: self.slot, variant: tune.get(&variant_param()) })))
    }
}

impl CpuKernel for TwiceVariant {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> kiln_ops::Result<()> {
        RUNS[self.slot][self.variant as usize].fetch_add(1, Ordering::SeqCst);
        let x = inputs[0].unwrap().as_slice::<f32>()?;
        twice_into(x, outputs[0].as_mut_slice::<f32>()?, self.variant);
        Ok(())
    }
}

impl WgslKernel for Twice {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        vec![TuneParam { name: "workgroup", default: 64, candidates: vec![32, 64, 128] }, TuneParam { name: "variant", default: 0, candidates: vec![0, 2] }]
    }
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> kiln_ops::Result<WgslProgram> {
        let params = WgslKernel::params(self, inputs, _outputs);
        let (wg, variant) = (tune.get(&params[0]), tune.get(&params[1]));
        let n = inputs[0].unwrap().ty.len();
        let (grid, index) = grid_1d(n, wg);
        let k = if variant == 2 { "1.0" } else { "2.0" };
        let source = format!(
            "{}@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {index}    y[i] = {k} * x[i];\n}}\n",
            declare(&[("x", "f32", true), ("y", "f32", false)])
        );
        Ok(WgslProgram::single(Dispatch { label: "twice".into(), source, entry_point: "main".into(), workgroups: grid, bindings: vec![Binding::Input(0), Binding::Output(0)] }))
    }
}

fn registry() -> Registry {
    let mut r = Registry::builtin().clone();
    r.register("tune.test", "Twice", |spec: &NodeSpec| Ok(Box::new(Twice { slot: spec.int("slot", 0)? as usize })));
    r
}

/// `y = Twice(x)` on f32 [rows, 1024], counting runs in `slot`.
fn graph(slot: usize, rows: usize) -> Graph {
    let mut b = GraphBuilder::new("twice");
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec![rows.into(), 1024usize.into()]));
    let y = b.node("Twice", &[x], &[("slot", Attr::Int(slot as i64))]);
    b.rename(y, "y");
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].domain = "tune.test".into();
    g.opsets.insert(String::new(), 17);
    g
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-tuning-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn session(g: Graph, device: DeviceChoice, tuning: Tuning) -> Session {
    Session::new(g, SessionOptions { device, registry: Some(registry()), tuning, ..Default::default() }).unwrap()
}

fn run_checked(s: &Session, x: &Tensor) {
    let y = s.run(&[("x", x)]).unwrap();
    let (xv, yv) = (x.as_slice::<f32>().unwrap(), y[0].as_slice::<f32>().unwrap());
    assert!(xv.iter().zip(yv).all(|(a, b)| 2.0 * a == *b), "wrong output");
}

fn opts(seconds: u64) -> TuneOptions {
    TuneOptions { budget: Duration::from_secs(seconds), retune: false }
}

#[test]
fn cpu_tuning_picks_the_fast_variant_never_the_wrong_one_and_later_sessions_use_it() {
    const SLOT: usize = 0;
    let db_path = tmp("cpu.db");
    let x = rand_f32(&[64, 1024], 1);
    let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    run_checked(&s, &x);
    assert_eq!(s.untuned().unwrap().len(), 1, "the Twice key is untuned before tuning");
    let mut calls = 0;
    let report = s.tune(&[("x", &x)], &opts(20), &mut |_| calls += 1).unwrap();
    assert!(calls >= 2, "progress is reported");
    assert_eq!(report.keys.len(), 1, "{:?}", report.keys);
    let k = &report.keys[0];
    assert_eq!(k.status, KeyStatus::Tuned);
    assert_eq!(k.values.get("variant"), Some(&1), "{k:?}");
    assert!(k.speedup() > 2.0, "{k:?}");
    assert!(k.rejected.iter().any(|(v, why)| v == "variant=2" && why.contains("differs")), "the wrong variant is rejected: {:?}", k.rejected);
    assert_eq!(report.databases, vec![db_path.clone()]);
    // The session itself now runs the chosen variant.
    let before = runs(SLOT);
    run_checked(&s, &x);
    assert_eq!(runs(SLOT)[1], before[1] + 1, "the tuned variant runs");
    // The database holds it; a later session reads it.
    let loaded = db::load(&db_path);
    assert!(loaded.problem.is_none());
    assert_eq!(loaded.body.entries.get(&k.key).map(|e| e.values.clone()), Some(k.values.clone()));
    let later = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    let before = runs(SLOT);
    run_checked(&later, &x);
    assert_eq!(runs(SLOT)[1], before[1] + 1, "a later session uses the database");
    assert!(later.untuned().unwrap().is_empty());
    // A second tuning run finds the key tuned and measures nothing.
    let t = std::time::Instant::now();
    let again = later.tune(&[("x", &x)], &opts(20), &mut |_| {}).unwrap();
    assert_eq!(again.keys[0].status, KeyStatus::AlreadyTuned);
    assert!(t.elapsed() < Duration::from_secs(2));
    // Another shape is another key: untuned.
    let other = session(graph(SLOT, 3), DeviceChoice::Cpu, Tuning::file(&db_path));
    let before = runs(SLOT);
    run_checked(&other, &rand_f32(&[3, 1024], 2));
    assert_eq!(runs(SLOT)[0], before[0] + 1, "defaults for an untuned shape");
    assert_eq!(other.untuned().unwrap().len(), 1);
    // Without a database: defaults.
    let off = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::off());
    let before = runs(SLOT);
    run_checked(&off, &x);
    assert_eq!(runs(SLOT)[0], before[0] + 1);
}

#[test]
fn embedded_choices_come_before_the_database_and_survive_an_artifact() {
    const SLOT: usize = 1;
    let db_path = tmp("embedded.db");
    let x = rand_f32(&[64, 1024], 3);
    let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    let report = s.tune(&[("x", &x)], &opts(20), &mut |_| {}).unwrap();
    let mut entries = report.entries();
    assert_eq!(entries.len(), 1);
    // Embed a different (valid) choice than the database's: it wins.
    for e in entries.values_mut() {
        e.values.insert("variant".into(), 3);
    }
    let path = tmp("twice.kiln");
    let info = kiln_runtime::artifact::ArtifactInfo { device: "cpu".into(), tuning: entries.clone(), ..Default::default() };
    kiln_runtime::artifact::save(&path, &graph(SLOT, 64), &info).unwrap();
    let (g, info) = kiln_runtime::artifact::load(&path).unwrap();
    assert_eq!(info.tuning, entries);
    let tuning = Tuning { embedded: info.tuning, ..Tuning::file(&db_path) };
    let loaded = session(g, DeviceChoice::Cpu, tuning);
    let before = runs(SLOT);
    run_checked(&loaded, &x);
    assert_eq!(runs(SLOT)[3], before[3] + 1, "the artifact's choice is used first");
}

#[test]
fn damaged_stale_and_foreign_databases_are_ignored_with_a_warning() {
    const SLOT: usize = 2;
    let db_path = tmp("damaged.db");
    let x = rand_f32(&[64, 1024], 4);
    let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    s.tune(&[("x", &x)], &opts(20), &mut |_| {}).unwrap();
    let good = std::fs::read(&db_path).unwrap();
    let uses_default = |what: &str| {
        let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
        let before = runs(SLOT);
        run_checked(&s, &x);
        assert_eq!(runs(SLOT)[0], before[0] + 1, "{what}: defaults expected");
        assert_eq!(s.untuned().unwrap().len(), 1, "{what}");
    };
    // A flipped byte in the body.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 20] ^= 0x01;
    std::fs::write(&db_path, &bad).unwrap();
    assert!(db::load(&db_path).problem.unwrap().contains("checksum"));
    uses_default("damaged");
    // Truncated.
    std::fs::write(&db_path, &good[..good.len() / 2]).unwrap();
    assert!(db::load(&db_path).problem.is_some());
    uses_default("truncated");
    // Another format version (stale).
    let text = String::from_utf8(good.clone()).unwrap();
    std::fs::write(&db_path, text.replacen("KILNTUNE 1 ", "KILNTUNE 99 ", 1)).unwrap();
    assert!(db::load(&db_path).problem.unwrap().contains("stale"));
    uses_default("stale format");
    // A valid file whose entry names a value the kernel does not offer (stale entry).
    let mut body = kiln_runtime::tune::db::decode(&good).unwrap();
    for e in body.entries.values_mut() {
        e.values.insert("variant".into(), 9);
    }
    db::save(&db_path, &body).unwrap();
    assert!(db::load(&db_path).problem.is_none());
    uses_default("stale entry");
    // Not a database at all.
    std::fs::write(&db_path, b"hello").unwrap();
    uses_default("garbage");
    // Tuning again replaces the bad file with a good one.
    let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    let r = s.tune(&[("x", &x)], &opts(20), &mut |_| {}).unwrap();
    assert_eq!(r.keys[0].status, KeyStatus::Tuned);
    assert!(db::load(&db_path).problem.is_none());
}

#[test]
fn a_zero_budget_stores_nothing() {
    const SLOT: usize = 3;
    let db_path = tmp("budget.db");
    let x = rand_f32(&[64, 1024], 5);
    let s = session(graph(SLOT, 64), DeviceChoice::Cpu, Tuning::file(&db_path));
    let r = s.tune(&[("x", &x)], &opts(0), &mut |_| {}).unwrap();
    assert_eq!(r.keys[0].status, KeyStatus::OutOfBudget);
    assert!(r.entries().is_empty() && r.databases.is_empty());
    assert!(!db_path.exists());
}

#[test]
fn gpu_tuning_runs_on_the_adapter_and_rejects_the_wrong_variant() {
    gpu_env();
    assert!(!kiln_runtime::list_devices().adapters.is_empty(), "no GPU adapter: GPU tests fail rather than skip (install lavapipe)");
    const SLOT: usize = 4;
    let db_path = tmp("gpu.db");
    let x = rand_f32(&[64, 1024], 6);
    let s = session(graph(SLOT, 64), DeviceChoice::Gpu, Tuning::file(&db_path));
    run_checked(&s, &x);
    let report = s.tune(&[("x", &x)], &opts(10), &mut |_| {}).unwrap();
    assert_eq!(report.keys.len(), 1, "{:?}", report.keys);
    let k = &report.keys[0];
    assert_eq!(k.status, KeyStatus::Tuned, "{k:?}");
    assert!(k.key.contains("wgsl-"), "a WGSL kernel version: {}", k.key);
    assert_ne!(k.values.get("variant"), Some(&2), "the wrong variant never wins");
    assert!(k.rejected.iter().any(|(v, _)| v.contains("variant=2")), "{:?}", k.rejected);
    assert!(k.default_ms > 0.0 && k.best_ms > 0.0);
    run_checked(&s, &x);
    // The database holds a GPU device; a later session uses a stored choice: written by
    // hand here (workgroup 32) so that the kernel it compiles shows it.
    let mut body = db::load(&db_path).body;
    assert!(body.devices.values().any(|d| d.starts_with("gpu;")), "{:?}", body.devices);
    body.entries.get_mut(&k.key).unwrap().values = [("workgroup".to_string(), 32u32)].into_iter().collect();
    db::save(&db_path, &body).unwrap();
    let later = session(graph(SLOT, 64), DeviceChoice::Gpu, Tuning::file(&db_path));
    run_checked(&later, &x);
    let sources: Vec<String> = later.kernel_records().unwrap().into_iter().map(|r| r.source).collect();
    assert!(sources.iter().any(|s| s.contains("@workgroup_size(32)")), "{sources:?}");
    assert!(later.untuned().unwrap().is_empty());
    // Without the database: the default workgroup.
    let off = session(graph(SLOT, 64), DeviceChoice::Gpu, Tuning::off());
    run_checked(&off, &x);
    let sources: Vec<String> = off.kernel_records().unwrap().into_iter().map(|r| r.source).collect();
    assert!(sources.iter().all(|s| s.contains("@workgroup_size(64)")), "{sources:?}");
}

#[test]
fn gpu_tuning_without_timestamps_times_by_the_wall_clock() {
    gpu_env();
    const SLOT: usize = 5;
    // Only the tuner reads this variable; other tests of this binary may time by the
    // wall clock meanwhile, which is harmless.
    std::env::set_var("KILN_TUNE_WALL_CLOCK", "1");
    let db_path = tmp("gpu-wall.db");
    let x = rand_f32(&[16, 1024], 7);
    let s = session(graph(SLOT, 16), DeviceChoice::Gpu, Tuning::file(&db_path));
    let report = s.tune(&[("x", &x)], &opts(10), &mut |_| {}).unwrap();
    std::env::remove_var("KILN_TUNE_WALL_CLOCK");
    let k = &report.keys[0];
    assert_eq!(k.status, KeyStatus::Tuned, "{k:?}");
    assert!(k.default_ms > 0.0 && k.best_ms > 0.0 && k.best_ms <= k.default_ms, "{k:?}");
    assert_ne!(k.values.get("variant"), Some(&2));
    run_checked(&s, &x);
}
