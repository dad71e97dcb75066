//! Shared helpers for runtime integration tests: single-op graphs run on the CPU and
//! on the GPU (the GPU must exist: tests fail, never skip, without an adapter).
#![allow(dead_code)]
use kiln_graph::{Attr, DType, GraphBuilder, Tensor};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::sync::OnceLock;

/// One input of a single-op test graph.
pub enum In {
    /// A graph input fed at run time.
    Data(Tensor),
    /// A constant (weights, shape arguments).
    Const(Tensor),
    /// An omitted optional input.
    None,
}

/// Builds a graph with one node of `op`.
pub fn single_op(op: &str, inputs: &[In], attrs: &[(&str, Attr)], n_outputs: usize, opset: i64) -> (kiln_graph::Graph, Vec<(String, Tensor)>) {
    let mut b = GraphBuilder::new(op);
    let mut ids = vec![];
    let mut feeds = vec![];
    for (i, input) in inputs.iter().enumerate() {
        ids.push(match input {
            In::Data(t) => {
                let name = format!("x{i}");
                feeds.push((name.clone(), t.clone()));
                Some(b.input(&name, t.dtype(), t.dims()))
            }
            In::Const(t) => Some(b.constant(&format!("c{i}"), t.clone())),
            In::None => None,
        });
    }
    let outs = b.node_multi(op, &ids, attrs, n_outputs);
    for o in outs {
        b.output(o);
    }
    let mut g = b.finish().expect("valid single-op graph");
    g.opsets.insert(String::new(), opset);
    (g, feeds)
}

pub fn run_on(device: DeviceChoice, graph: kiln_graph::Graph, feeds: &[(String, Tensor)]) -> kiln_runtime::Result<Vec<Tensor>> {
    let s = Session::new(graph, SessionOptions::device(device))?;
    let refs: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
    s.run(&refs)
}

/// Quiets Mesa's warning about XDG_RUNTIME_DIR once per process.
pub fn gpu_env() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            let d = std::env::temp_dir().join("kiln-xdg");
            let _ = std::fs::create_dir_all(&d);
            std::env::set_var("XDG_RUNTIME_DIR", d);
        }
    });
}

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    got.rel_l2_error(want)
}

/// Runs a single-op graph on the CPU and the GPU and checks they agree (same dtype and
/// dims, relative L2 error at most `tol`; integers and bools exactly).
pub fn cross_check(op: &str, inputs: &[In], attrs: &[(&str, Attr)], n_outputs: usize, opset: i64, tol: f64) {
    gpu_env();
    let (g, feeds) = single_op(op, inputs, attrs, n_outputs, opset);
    let cpu = run_on(DeviceChoice::Cpu, g.clone(), &feeds).unwrap_or_else(|e| panic!("{op} on the CPU: {e}"));
    let gpu = run_on(DeviceChoice::Gpu, g, &feeds).unwrap_or_else(|e| panic!("{op} on the GPU: {e}"));
    let shapes: Vec<String> = inputs
        .iter()
        .map(|i| match i {
            In::Data(t) => format!("data {}{:?}", t.dtype(), t.dims()),
            In::Const(t) => format!("const {}{:?}", t.dtype(), t.dims()),
            In::None => "none".into(),
        })
        .collect();
    let op = format!("{op} [{}] {:?} opset {opset}", shapes.join(", "), attrs);
    let op = op.as_str();
    for (k, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        assert_eq!(c.dtype(), g.dtype(), "{op} output {k} dtype");
        assert_eq!(c.dims(), g.dims(), "{op} output {k} dims");
        if c.dtype().is_float() {
            let e = rel_l2(g, c);
            assert!(e <= tol, "{op} output {k}: GPU vs CPU relative L2 error {e:e} > {tol:e}");
        } else {
            assert_eq!(c.to_f64_vec(), g.to_f64_vec(), "{op} output {k} differs");
        }
    }
}

/// Deterministic pseudo-random f32 tensor in [-1, 1).
pub fn rand_f32(dims: &[usize], seed: u64) -> Tensor {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_slice(dims, &v).unwrap()
}

pub fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

pub fn dtype_of(t: &Tensor) -> DType {
    t.dtype()
}
