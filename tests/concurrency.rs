//! Stress: 8 threads share one session of a real zoo model (bert_tiny, symbolic batch
//! and sequence) from cold caches, each running its own input shape at the same time,
//! on the CPU, on the GPU, across both (a heterogeneous placement), and from a loaded
//! `.kiln` artifact. Every output must equal, bit for bit, a single-threaded run of a
//! separate session.
mod common;
use common::*;
use kiln::graph::{DType, Tensor};
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::sync::{Arc, Barrier};

const THREADS: usize = 8;
const RUNS: usize = 2;

/// Thread `t`'s inputs: batch 1 or 2, sequence 5 to 32 (four shapes, so threads race
/// on the same specialisations and on different ones).
fn inputs(t: usize) -> Vec<(String, Tensor)> {
    let (batch, seq) = (1 + t % 2, [5, 12, 17, 32][t % 4]);
    let n = batch * seq;
    let ids: Vec<i64> = (0..n).map(|i| ((i * 7 + t * 13) % 97) as i64 + 1).collect();
    let mask: Vec<i64> = (0..n).map(|i| if i % seq < seq - t % 3 { 1 } else { 0 }).collect();
    vec![
        ("input_ids".to_string(), Tensor::from_vec(&[batch, seq], ids).unwrap()),
        ("attention_mask".to_string(), Tensor::from_vec(&[batch, seq], mask).unwrap()),
    ]
}

fn run(s: &Session, ins: &[(String, Tensor)]) -> Vec<Tensor> {
    let refs: Vec<(&str, &Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t)).collect();
    s.run(&refs).unwrap_or_else(|e| panic!("run failed: {e}"))
}

fn same_bits(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.dtype() == y.dtype() && x.dims() == y.dims() && x.bytes() == y.bytes())
}

/// Runs the stress on sessions made by `open` (a fresh one for the reference of each
/// thread, one shared by all threads).
fn stress(what: &str, open: &dyn Fn() -> Session) {
    let want: Vec<Vec<Tensor>> = (0..THREADS).map(|t| run(&open(), &inputs(t))).collect();
    assert!(want.iter().all(|o| o.iter().all(|t| t.dtype() == DType::F32 && t.to_f64_vec().iter().all(|v| v.is_finite()))), "{what}: outputs not finite");
    let shared = Arc::new(open());
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (s, b) = (shared.clone(), barrier.clone());
            std::thread::spawn(move || {
                let ins = inputs(t);
                b.wait();
                (0..RUNS).map(|_| run(&s, &ins)).collect::<Vec<_>>()
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        for (k, got) in h.join().unwrap_or_else(|_| panic!("{what}: thread {t} panicked")).iter().enumerate() {
            assert!(same_bits(got, &want[t]), "{what}: thread {t} run {k} differs from the single-threaded run");
        }
    }
    println!("concurrency {what}: {THREADS} threads x {RUNS} runs agree bit for bit");
}

#[test]
fn eight_threads_share_one_session_on_every_device() {
    gpu_env();
    let path = zoo().join("bert_tiny/model.onnx");
    let graph = kiln::compiler::onnx::import_file(&path).unwrap();
    let mut cpu_graph = graph.clone();
    kiln::compiler::passes::optimize_for(&mut cpu_graph, kiln::compiler::passes::Target::Cpu);
    let mut gpu_graph = graph.clone();
    kiln::compiler::passes::optimize_for(&mut gpu_graph, kiln::compiler::passes::Target::Gpu);

    stress("cpu", &|| Session::new(cpu_graph.clone(), SessionOptions::device(DeviceChoice::Cpu)).unwrap());
    stress("gpu", &|| Session::new(gpu_graph.clone(), SessionOptions::device(DeviceChoice::Gpu)).expect("a GPU adapter (lavapipe in CI)"));
    let hetero = || SessionOptions { device: DeviceChoice::Gpu, placement: vec!["Softmax=cpu".parse().unwrap(), "LayerNormalization=cpu".parse().unwrap()], ..Default::default() };
    stress("gpu+cpu", &|| Session::new(gpu_graph.clone(), hetero()).unwrap());

    let dir = std::env::temp_dir().join(format!("kiln-concurrency-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bert_tiny.kiln");
    let info = kiln::runtime::artifact::ArtifactInfo { device: "cpu".into(), source: path.display().to_string(), ..Default::default() };
    kiln::runtime::artifact::save(&file, &cpu_graph, &info).unwrap();
    stress("cpu from .kiln", &|| Session::new(kiln::runtime::artifact::load(&file).unwrap().0, SessionOptions::device(DeviceChoice::Cpu)).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
