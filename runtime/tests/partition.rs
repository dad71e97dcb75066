//! Heterogeneous execution: a GPU session runs ops without a GPU kernel on the CPU,
//! splits the graph into segments with copies at the boundaries, honours placement
//! overrides by op type and node name, and rejects placements it cannot satisfy.
mod common;
use common::*;
use kiln_graph::{DType, GraphBuilder, Tensor};
use kiln_ops::{Arg, CpuKernel, Op, Registry, TensorType, WgslKernel};
use kiln_runtime::{DeviceChoice, DeviceKind, PlacementRule, Session, SessionOptions};

/// A custom op with only a CPU kernel: y = 2x + 1.
#[derive(Debug)]
struct CpuOnly;

impl Op for CpuOnly {
    fn name(&self) -> &str {
        "CpuOnly"
    }
    fn infer(&self, inputs: &[Option<Arg>]) -> kiln_ops::Result<Vec<TensorType>> {
        Ok(vec![inputs[0].unwrap().ty.clone()])
    }
    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }
    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for CpuOnly {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> kiln_ops::Result<()> {
        let x = inputs[0].unwrap().as_slice::<f32>()?;
        for (o, v) in outputs[0].as_mut_slice::<f32>()?.iter_mut().zip(x) {
            *o = 2.0 * v + 1.0;
        }
        Ok(())
    }
}

fn registry() -> Registry {
    let mut r = Registry::builtin().clone();
    r.register("my.ops", "CpuOnly", |_| Ok(Box::new(CpuOnly)));
    r
}

fn graph() -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("split");
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec!["n".into(), 16usize.into()]));
    let w = b.constant("w", rand_f32(&[16, 16], 1));
    let h = b.node("MatMul", &[x, w], &[]);
    let r = b.node("Relu", &[h], &[]);
    let c = b.node("CpuOnly", &[r], &[]);
    let s = b.node("Sigmoid", &[c], &[]);
    let t = b.node("Tanh", &[r], &[]); // read by both sides of the boundary
    let y = b.node("Add", &[s, t], &[]);
    b.rename(y, "y");
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[2].domain = "my.ops".into();
    g.opsets.insert(String::new(), 17);
    g
}

fn opts(device: DeviceChoice, rules: &[&str]) -> SessionOptions {
    SessionOptions { device, registry: Some(registry()), placement: rules.iter().map(|r| r.parse().unwrap()).collect() }
}

#[test]
fn an_op_without_a_gpu_kernel_runs_on_the_cpu_between_gpu_segments() {
    gpu_env();
    let x = rand_f32(&[5, 16], 2);
    let cpu = Session::new(graph(), opts(DeviceChoice::Cpu, &[])).unwrap();
    let want = cpu.run(&[("x", &x)]).unwrap();
    let gpu = Session::new(graph(), opts(DeviceChoice::Gpu, &[])).unwrap();
    let (got, stats) = gpu.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-5, "{}", rel_l2(&got[0], &want[0]));
    // MatMul, Relu | CpuOnly | Sigmoid, Tanh, Add: two GPU segments, one submit each.
    assert_eq!(stats.submits, 2);
    assert_eq!(stats.kernels, 6);
    let report = gpu.report(&[("x", &x)]).unwrap();
    let placed: Vec<(String, Option<DeviceKind>)> = report.iter().map(|r| (r.op.clone(), r.device)).collect();
    assert!(placed.contains(&("CpuOnly".to_string(), Some(DeviceKind::Cpu))), "{placed:?}");
    assert!(placed.contains(&("MatMul".to_string(), Some(DeviceKind::Gpu))), "{placed:?}");
}

#[test]
fn overrides_by_op_type_and_node_name_are_honoured() {
    gpu_env();
    let x = rand_f32(&[3, 16], 3);
    let want = Session::new(graph(), opts(DeviceChoice::Cpu, &[])).unwrap().run(&[("x", &x)]).unwrap();
    let g = graph();
    let tanh = g.nodes[4].name.clone();
    let s = Session::new(g, opts(DeviceChoice::Gpu, &["Sigmoid=cpu", &format!("{tanh}=cpu")])).unwrap();
    let (got, stats) = s.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-5);
    // MatMul, Relu on the GPU | CpuOnly, Sigmoid, Tanh on the CPU | Add on the GPU.
    assert_eq!(stats.submits, 2);
    // Everything on the CPU: no submits at all.
    let s = Session::new(graph(), opts(DeviceChoice::Gpu, &["MatMul=cpu", "Relu=cpu", "Sigmoid=cpu", "Tanh=cpu", "Add=cpu"])).unwrap();
    let (got, stats) = s.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-6);
    assert_eq!(stats.submits, 0);
}

#[test]
fn unsatisfiable_placements_are_clear_errors() {
    gpu_env();
    let err = |device: DeviceChoice, rules: &[&str]| Session::new(graph(), opts(device, rules)).err().expect("an error").to_string();
    let e = err(DeviceChoice::Gpu, &["Conv=cpu"]);
    assert!(e.contains("'Conv'") && e.contains("no node and no op type"), "{e}");
    let e = err(DeviceChoice::Cpu, &["Relu=gpu"]);
    assert!(e.contains("no GPU"), "{e}");
    let s = Session::new(graph(), opts(DeviceChoice::Gpu, &["CpuOnly=gpu"])).unwrap();
    let e = s.run(&[("x", &rand_f32(&[1, 16], 0))]).unwrap_err().to_string();
    assert!(e.contains("CpuOnly") && e.contains("no GPU kernel"), "{e}");
    assert!("Relu=tpu".parse::<PlacementRule>().unwrap_err().contains("tpu"));
}
