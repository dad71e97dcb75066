//! Heterogeneous execution: a GPU session runs ops without a GPU kernel on the CPU,
//! splits the graph into segments with copies at the boundaries, honours placement
//! overrides by op type and node name, and rejects placements it cannot satisfy.
mod common;
use common::*;
use kiln_graph::{DType, GraphBuilder, Tensor};
use kiln_ops::{Arg, CpuKernel, Op, Registry, TensorType, WgslKernel};
use kiln_runtime::{DeviceChoice, PlacementRule, Session, SessionOptions};

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
    SessionOptions { device, registry: Some(registry()), placement: rules.iter().map(|r| r.parse().unwrap()).collect(), ..Default::default() }
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
    let placed: Vec<(String, String)> = report.iter().map(|r| (r.op.clone(), r.device.clone().unwrap_or_default())).collect();
    assert!(placed.iter().any(|(op, d)| op == "CpuOnly" && d.starts_with("cpu")), "{placed:?}");
    assert!(placed.iter().any(|(op, d)| op == "MatMul" && d.contains("Vulkan")), "{placed:?}");
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
    let e = err(DeviceChoice::Gpu, &["Relu=gpu:99"]);
    assert!(e.contains("gpu:99") && e.contains("no adapter"), "{e}");
    let s = Session::new(graph(), opts(DeviceChoice::Gpu, &["CpuOnly=gpu"])).unwrap();
    let e = s.run(&[("x", &rand_f32(&[1, 16], 0))]).unwrap_err().to_string();
    assert!(e.contains("CpuOnly") && e.contains("no GPU kernel"), "{e}");
    let e = err(DeviceChoice::Gpu, &["Relu=tpu"]);
    assert!(e.contains("Relu=tpu") && e.contains("tpu"), "{e}");
    for bad in ["Relu=auto", "=cpu", "Relu"] {
        assert!(bad.parse::<PlacementRule>().is_err(), "{bad}");
    }
}

/// Two adapters of one machine are distinct devices: the GL adapter runs the Tanh and
/// Sigmoid nodes of a session whose main GPU is the Vulkan adapter; a CPU session can
/// send work to a GPU too.
#[test]
fn several_adapters_and_a_cpu_session_share_one_graph() {
    gpu_env();
    let adapters = kiln_runtime::list_devices().adapters;
    assert!(adapters.len() >= 2, "this test needs two adapters (lavapipe offers Vulkan and GL): {adapters:?}");
    let gl = adapters.iter().find(|a| a.backend.to_lowercase().contains("gl")).map(|a| format!("gpu:{}", a.index)).expect("a GL adapter");
    let vk = adapters.iter().find(|a| a.backend.to_lowercase().contains("vulkan")).map(|a| format!("gpu:{}", a.index)).expect("a Vulkan adapter");
    let x = rand_f32(&[4, 16], 9);
    let want = Session::new(graph(), opts(DeviceChoice::Cpu, &[])).unwrap().run(&[("x", &x)]).unwrap();
    let s = Session::new(graph(), opts(DeviceChoice::Adapter(vk.clone()), &[&format!("Tanh={gl}"), &format!("Sigmoid={gl}")])).unwrap();
    let (got, stats) = s.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-5);
    let devices: Vec<String> = s.report(&[("x", &x)]).unwrap().into_iter().filter_map(|r| r.device).collect();
    assert!(devices.iter().any(|d| d.contains("Gl")) && devices.iter().any(|d| d.contains("Vulkan")) && devices.iter().any(|d| d.starts_with("cpu")), "{devices:?}");
    assert!(stats.submits >= 2, "{stats:?}");
    // A CPU session with the MatMul on a GPU.
    let s = Session::new(graph(), opts(DeviceChoice::Cpu, &[&format!("MatMul={vk}")])).unwrap();
    let (got, stats) = s.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-5);
    assert_eq!(stats.submits, 1);
}

/// Cost-model placement measures the devices and, with lavapipe (a GPU emulated on the
/// CPU, far slower than native kernels), keeps the work on the CPU; results still match.
#[test]
fn the_cost_model_measures_devices_and_keeps_work_off_a_software_gpu() {
    gpu_env();
    let cpu = kiln_runtime::calibrate(&DeviceChoice::Cpu).unwrap();
    let gpu = kiln_runtime::calibrate(&DeviceChoice::Gpu).unwrap();
    for p in [cpu, gpu] {
        assert!(p.flops_per_s > 1e6 && p.bytes_per_s > 1e6 && p.transfer_bytes_per_s > 1e6 && p.launch_s > 0.0 && p.segment_s >= 0.0, "{p:?}");
    }
    assert!(cpu.flops_per_s > gpu.flops_per_s, "lavapipe should be slower than native kernels: {cpu:?} vs {gpu:?}");
    let x = rand_f32(&[8, 16], 4);
    let want = Session::new(graph(), opts(DeviceChoice::Cpu, &[])).unwrap().run(&[("x", &x)]).unwrap();
    let mut o = opts(DeviceChoice::Gpu, &[]);
    o.auto_place = true;
    let s = Session::new(graph(), o).unwrap();
    let (got, stats) = s.run_with_stats(&[("x", &x)]).unwrap();
    assert!(rel_l2(&got[0], &want[0]) < 1e-6);
    assert_eq!(stats.submits, 0, "every step is cheaper on the CPU here");
    // A CPU session cannot choose a GPU by cost.
    let mut o = opts(DeviceChoice::Cpu, &[]);
    o.auto_place = true;
    assert!(Session::new(graph(), o).err().expect("an error").to_string().contains("no GPU"));
}

/// String tensors stay on the host: in a GPU session, the steps that read or write one
/// (here RegexFullMatch, a Reshape of strings and Equal) run on the CPU and the bool
/// result continues on the GPU; a rule that puts a string step on a GPU is an error.
#[test]
fn string_steps_run_on_the_host_in_gpu_sessions() {
    gpu_env();
    let graph = || {
        let mut b = GraphBuilder::new("strings");
        let s = b.input("s", DType::String, [4usize]);
        let m = b.node("RegexFullMatch", &[s], &[("pattern", kiln_graph::Attr::String("[a-z]+".into()))]);
        let shape = b.constant("shape", Tensor::from_slice(&[2], &[2i64, 2]).unwrap());
        let r = b.node("Reshape", &[s, shape], &[]);
        let k = b.constant("k", Tensor::from_strings(&[2], vec!["ab".into(), "Cd".into()]).unwrap());
        let e = b.node("Equal", &[r, k], &[]);
        let me = b.node("Cast", &[m], &[("to", kiln_graph::Attr::Int(1))]);
        let ee = b.node("Cast", &[e], &[("to", kiln_graph::Attr::Int(1))]);
        let four = b.constant("four", Tensor::from_slice(&[1], &[4i64]).unwrap());
        let flat = b.node("Reshape", &[ee, four], &[]);
        let y = b.node("Add", &[me, flat], &[]);
        b.rename(y, "y");
        b.output(y);
        b.rename(r, "r");
        b.output(r);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 20);
        g
    };
    let s = Tensor::from_strings(&[4], ["ab", "Cd", "x1", "Cd"].map(String::from).to_vec()).unwrap();
    let want = [1.0 + 1.0, 0.0 + 1.0, 0.0, 0.0 + 1.0];
    for device in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        let session = Session::new(graph(), SessionOptions { device: device.clone(), ..Default::default() }).unwrap();
        let got = session.run(&[("s", &s)]).unwrap();
        assert_eq!(got[0].to_f64_vec(), want, "{device:?}");
        assert_eq!(got[1].as_strings().unwrap(), s.as_strings().unwrap(), "{device:?}");
        assert_eq!(got[1].dims(), &[2, 2]);
        let placed: Vec<(String, String)> = session.report(&[("s", &s)]).unwrap().iter().map(|r| (r.op.clone(), r.device.clone().unwrap_or_default())).collect();
        for op in ["RegexFullMatch", "Equal"] {
            assert!(placed.iter().any(|(o, d)| o == op && d.starts_with("cpu")), "{op} not on the CPU: {placed:?}");
        }
    }
    let session = Session::new(graph(), SessionOptions { device: DeviceChoice::Gpu, placement: vec!["Equal=gpu".parse().unwrap()], ..Default::default() }).unwrap();
    let e = session.run(&[("s", &s)]).unwrap_err().to_string();
    assert!(e.contains("Equal") && e.contains("string tensors stay on the host"), "{e}");
}
