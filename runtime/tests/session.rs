//! Session behaviour: input validation, specialisation per shape, CPU/GPU agreement.
mod common;
use common::*;
use kiln_graph::{Attr, DType, GraphBuilder, Tensor};
use kiln_runtime::{DeviceChoice, RuntimeError, Session, SessionOptions};

fn small_graph() -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("small");
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec!["batch".into(), 5usize.into()]));
    let w = b.constant("w", rand_f32(&[5], 1));
    let y = b.node("Mul", &[x, w], &[]);
    let z = b.node("Relu", &[y], &[]);
    let c = b.node("Clip", &[z], &[("min", Attr::Float(0.1)), ("max", Attr::Float(0.4))]);
    b.rename(c, "y");
    b.output(c);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 6);
    g
}

#[test]
fn cpu_and_gpu_agree_and_specialise_per_shape() {
    gpu_env();
    let cpu = Session::new(small_graph(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let gpu = Session::new(small_graph(), SessionOptions::device(DeviceChoice::Gpu)).expect("a GPU adapter (install mesa-vulkan-drivers)");
    for batch in [1usize, 3, 1] {
        let x = rand_f32(&[batch, 5], batch as u64);
        let (a, sa) = cpu.run_with_stats(&[("x", &x)]).unwrap();
        let (b, sb) = gpu.run_with_stats(&[("x", &x)]).unwrap();
        assert_eq!(a[0].dims(), &[batch, 5]);
        assert!(rel_l2(&b[0], &a[0]) < 1e-6);
        assert_eq!(sb.submits, 1);
        assert_eq!(sa.kernels, 3);
        assert_eq!(sa.specialized, sb.specialized);
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    let s = Session::new(small_graph(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let x = rand_f32(&[2, 5], 0);
    let e = s.run(&[("nope", &x)]).unwrap_err();
    assert!(matches!(e, RuntimeError::UnknownInput { .. }), "{e}");
    assert!(e.to_string().contains("'x'"), "{e}");
    let e = s.run(&[]).unwrap_err();
    assert!(e.to_string().contains("missing input 'x'"), "{e}");
    let e = s.run(&[("x", &Tensor::zeros(DType::I64, &[2, 5]))]).unwrap_err();
    assert!(e.to_string().contains("dtype i64"), "{e}");
    let e = s.run(&[("x", &rand_f32(&[2, 4], 0))]).unwrap_err();
    assert!(e.to_string().contains("dim 1 is 4, not 5"), "{e}");
    let e = s.run(&[("x", &rand_f32(&[10], 0))]).unwrap_err();
    assert!(e.to_string().contains("rank 1 instead of 2"), "{e}");
    let e = s.run(&[("x", &x), ("x", &x)]).unwrap_err();
    assert!(matches!(e, RuntimeError::DuplicateInput(_)), "{e}");
}

#[test]
fn symbol_bound_twice_must_agree() {
    let mut b = GraphBuilder::new("two");
    let x = b.input("a", DType::F32, kiln_graph::Shape(vec!["n".into()]));
    let y = b.input("b", DType::F32, kiln_graph::Shape(vec!["n".into()]));
    let z = b.node("Add", &[x, y], &[]);
    b.output(z);
    let s = Session::new(b.finish().unwrap(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let e = s.run(&[("a", &rand_f32(&[3], 0)), ("b", &rand_f32(&[4], 0))]).unwrap_err();
    assert!(e.to_string().contains("bound 'n' to 3"), "{e}");
}

#[test]
fn unsupported_ops_are_all_listed() {
    let mut b = GraphBuilder::new("bad");
    let x = b.input("x", DType::F32, [2usize]);
    let y = b.node("FooBar", &[x], &[]);
    let z = b.node("BazQux", &[y], &[]);
    b.output(z);
    let e = Session::new(b.finish().unwrap(), SessionOptions::device(DeviceChoice::Cpu)).err().unwrap().to_string();
    assert!(e.contains("FooBar") && e.contains("BazQux") && e.contains("2 nodes cannot run"), "{e}");
}

#[test]
fn session_is_send_sync_and_runs_concurrently() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Session>();
    gpu_env();
    for dev in [DeviceChoice::Cpu, DeviceChoice::Gpu] {
        let s = std::sync::Arc::new(Session::new(small_graph(), SessionOptions::device(dev)).unwrap());
        let x = rand_f32(&[4, 5], 9);
        let want = s.run(&[("x", &x)]).unwrap();
        std::thread::scope(|sc| {
            for _ in 0..4 {
                let (s, x, want) = (s.clone(), x.clone(), want.clone());
                sc.spawn(move || {
                    for _ in 0..5 {
                        let got = s.run(&[("x", &x)]).unwrap();
                        assert_eq!(got[0], want[0]);
                    }
                });
            }
        });
    }
}

#[test]
fn an_output_too_large_for_memory_is_an_error_not_an_abort() {
    let mut b = GraphBuilder::new("huge");
    let x = b.input("x", DType::F32, [1usize]);
    let shape = b.constant("shape", Tensor::from_slice(&[3], &[1i64 << 20, 1 << 20, 1 << 10]).unwrap());
    let y = b.node("Expand", &[x, shape], &[]);
    b.output(y);
    let s = Session::new(b.finish().unwrap(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let e = s.run(&[("x", &rand_f32(&[1], 0))]).unwrap_err().to_string();
    assert!(e.contains("Expand") && e.contains("bytes"), "{e}");
}

fn sym(names: &[&str], fixed: &[usize]) -> kiln_graph::Shape {
    kiln_graph::Shape(names.iter().map(|&n| n.into()).chain(fixed.iter().map(|&d| d.into())).collect())
}

fn cpu_session(g: kiln_graph::Graph) -> Result<Session, RuntimeError> {
    Session::new(g, SessionOptions::device(DeviceChoice::Cpu))
}

#[test]
fn symbolic_shapes_are_fitted_when_the_session_is_created() {
    // Concat of a past and a new sequence, then a flatten of batch and sequence.
    let mut b = GraphBuilder::new("sym");
    let past = b.input("past", DType::F32, sym(&["batch", "past"], &[4]));
    let x = b.input("x", DType::F32, sym(&["batch", "seq"], &[4]));
    let cat = b.node("Concat", &[past, x], &[("axis", Attr::Int(1))]);
    b.rename(cat, "cat");
    b.output(cat);
    let shape = b.constant("shape", Tensor::from_vec(&[2], vec![-1i64, 4]).unwrap());
    let flat = b.node("Reshape", &[x, shape], &[]);
    b.rename(flat, "flat");
    b.output(flat);
    let shape_of = b.node("Shape", &[x], &[]);
    b.rename(shape_of, "shape_of");
    b.output(shape_of);
    let s = cpu_session(b.finish().unwrap()).unwrap();
    let shapes: Vec<String> = s.output_shapes().iter().map(|(n, s)| format!("{n}: {}", s.as_ref().unwrap())).collect();
    assert_eq!(shapes, ["cat: [batch,past+seq,4]", "flat: [batch*seq,4]", "shape_of: [3]"]);
}

#[test]
fn a_node_that_fails_for_every_binding_of_the_symbols_fails_at_session_creation() {
    let mut b = GraphBuilder::new("bad_matmul");
    let x = b.input("x", DType::F32, sym(&["batch", "seq"], &[64]));
    let w = b.constant("w", rand_f32(&[32, 10], 0));
    let y = b.node("MatMul", &[x, w], &[]);
    b.rename(y, "y");
    b.output(y);
    let g = b.finish().unwrap();
    let mm = g.nodes[0].name.clone();
    let e = cpu_session(g).err().expect("an error").to_string();
    assert!(e.contains(&mm) && e.contains("MatMul") && e.contains("for every value of batch, seq"), "{e}");
    assert!(e.contains("[batch, seq, 64]") || e.contains("64"), "{e}");
}

#[test]
fn a_node_that_needs_particular_symbol_values_is_accepted_and_checked_at_run_time() {
    // Adding a fixed [1, 128, 8] table: only seq = 128 (or 1) works.
    let mut b = GraphBuilder::new("needs_128");
    let x = b.input("x", DType::F32, sym(&["batch", "seq"], &[8]));
    let pos = b.constant("pos", rand_f32(&[1, 128, 8], 1));
    let y = b.node("Add", &[x, pos], &[]);
    b.rename(y, "y");
    b.output(y);
    let s = cpu_session(b.finish().unwrap()).unwrap();
    assert!(s.run(&[("x", &rand_f32(&[2, 128, 8], 2))]).is_ok());
    let e = s.run(&[("x", &rand_f32(&[2, 5, 8], 2))]).unwrap_err().to_string();
    assert!(e.contains("Add") && e.contains("broadcast"), "{e}");
}

#[test]
fn a_fixed_shape_model_with_a_type_error_fails_at_session_creation() {
    let mut b = GraphBuilder::new("fixed_bad");
    let x = b.input("x", DType::F32, kiln_graph::Shape::fixed(&[2, 3]));
    let w = b.constant("w", rand_f32(&[4, 5], 0));
    let y = b.node("Gemm", &[x, w], &[]);
    b.output(y);
    let e = cpu_session(b.finish().unwrap()).err().expect("an error").to_string();
    assert!(e.contains("Gemm"), "{e}");
}

fn gather_graph() -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("lookup");
    let ids = b.input("ids", DType::I64, sym(&["n"], &[]));
    let table = b.constant("table", rand_f32(&[10, 4], 3));
    let y = b.node("Gather", &[table, ids], &[("axis", Attr::Int(0))]);
    b.rename(y, "y");
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].name = "embed".into();
    g
}

#[test]
fn gather_index_out_of_range_is_an_error_on_every_backend() {
    gpu_env();
    for (name, device) in [("cpu", DeviceChoice::Cpu), ("gpu", DeviceChoice::Gpu)] {
        let s = Session::new(gather_graph(), SessionOptions::device(device)).unwrap();
        let ok = s.run(&[("ids", &Tensor::from_vec(&[3], vec![0i64, 9, -10]).unwrap())]).unwrap();
        assert_eq!(ok[0].dims(), &[3, 4], "{name}");
        for bad in [10i64, -11, 1 << 20] {
            let e = s.run(&[("ids", &Tensor::from_vec(&[3], vec![1i64, bad, 2]).unwrap())]).unwrap_err().to_string();
            assert!(e.contains("'embed'") && e.contains(&format!("index {bad} is out of range")) && e.contains("size 10"), "{name}: {e}");
        }
        // The session keeps working after an error.
        assert!(s.run(&[("ids", &Tensor::from_vec(&[1], vec![5i64]).unwrap())]).is_ok(), "{name}");
    }
}

#[test]
fn an_i64_value_beyond_32_bits_is_an_error_on_the_gpu() {
    gpu_env();
    let mut b = GraphBuilder::new("wide");
    let x = b.input("x", DType::I64, sym(&["n"], &[]));
    let one = b.constant("one", Tensor::from_vec(&[1], vec![1i64]).unwrap());
    let y = b.node("Add", &[x, one], &[]);
    b.output(y);
    let s = Session::new(b.finish().unwrap(), SessionOptions::device(DeviceChoice::Gpu)).unwrap();
    let fits = s.run(&[("x", &Tensor::from_vec(&[2], vec![-5i64, i32::MAX as i64 - 1]).unwrap())]).unwrap();
    assert_eq!(fits[0].to_i64_vec().unwrap(), vec![-4, i32::MAX as i64]);
    let e = s.run(&[("x", &Tensor::from_vec(&[2], vec![3i64, 1 << 40]).unwrap())]).unwrap_err().to_string();
    assert!(e.contains("input 'x'") && e.contains(&(1i64 << 40).to_string()) && e.contains("32-bit"), "{e}");
    // A result beyond 32 bits is an error too, never a wrapped value.
    let e = s.run(&[("x", &Tensor::from_vec(&[2], vec![3i64, i32::MAX as i64]).unwrap())]).unwrap_err().to_string();
    assert!(e.contains("Add") && e.contains(&i32::MAX.to_string()) && e.contains("does not fit"), "{e}");
    // Sub and Mul as well, on both signs.
    for (op, a, b) in [("Sub", i32::MIN as i64 + 1, 2i64), ("Mul", 1 << 20, 1 << 12), ("Mul", -(1 << 16), 1 << 15 + 1)] {
        let mut gb = GraphBuilder::new("wide2");
        let x = gb.input("x", DType::I64, sym(&["n"], &[]));
        let c = gb.constant("c", Tensor::from_vec(&[1], vec![b]).unwrap());
        let y = gb.node(op, &[x, c], &[]);
        gb.output(y);
        let s = Session::new(gb.finish().unwrap(), SessionOptions::device(DeviceChoice::Gpu)).unwrap();
        let e = s.run(&[("x", &Tensor::from_vec(&[1], vec![a]).unwrap())]).unwrap_err().to_string();
        assert!(e.contains(op) && e.contains("does not fit"), "{op}: {e}");
        assert!(s.run(&[("x", &Tensor::from_vec(&[1], vec![3i64]).unwrap())]).is_ok(), "{op}");
    }
}

#[test]
fn negative_dims_in_shape_inputs_are_errors_naming_the_node_and_value() {
    // ConstantOfShape and Reshape read shapes given at run time (bound by value).
    let mut b = GraphBuilder::new("dims");
    let shape = b.input("shape", DType::I64, kiln_graph::Shape::fixed(&[2]));
    let y = b.node("ConstantOfShape", &[shape], &[]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].name = "fill".into();
    let s = cpu_session(g).unwrap();
    assert_eq!(s.run(&[("shape", &Tensor::from_vec(&[2], vec![2i64, 3]).unwrap())]).unwrap()[0].dims(), &[2, 3]);
    let e = s.run(&[("shape", &Tensor::from_vec(&[2], vec![2i64, -3]).unwrap())]).unwrap_err().to_string();
    assert!(e.contains("'fill'") && e.contains("-3"), "{e}");

    let mut b = GraphBuilder::new("reshape");
    let x = b.input("x", DType::F32, kiln_graph::Shape::fixed(&[2, 6]));
    let shape = b.input("shape", DType::I64, kiln_graph::Shape::fixed(&[2]));
    let y = b.node("Reshape", &[x, shape], &[]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].name = "view".into();
    let s = cpu_session(g).unwrap();
    let x = rand_f32(&[2, 6], 0);
    assert_eq!(s.run(&[("x", &x), ("shape", &Tensor::from_vec(&[2], vec![3i64, -1]).unwrap())]).unwrap()[0].dims(), &[3, 4]);
    for bad in [vec![-2i64, 6], vec![-1, -1], vec![5, 3]] {
        let e = s.run(&[("x", &x), ("shape", &Tensor::from_vec(&[2], bad.clone()).unwrap())]).unwrap_err().to_string();
        assert!(e.contains("'view'") && e.contains("Reshape"), "{bad:?}: {e}");
    }
}

/// f16 in and out: on adapters with SHADER_F16 the halves cross the bus as they are;
/// kernels that bind halves (Mul, Add) read and write them in place, and for one that
/// does not (Softmax) GPU kernels widen its input and narrow its output (two more
/// dispatches); elsewhere the host converts. Every adapter must agree with the CPU.
#[test]
fn f16_models_run_on_every_adapter_with_or_without_shader_f16() {
    use half::f16;
    gpu_env();
    let mut b = GraphBuilder::new("half");
    let x = b.input("x", DType::F16, sym(&["n"], &[]));
    let w = b.constant("w", Tensor::from_vec(&[1], vec![f16::from_f32(0.5)]).unwrap());
    let y = b.node("Mul", &[x, w], &[]);
    let z = b.node("Add", &[y, x], &[]);
    b.rename(z, "z");
    b.output(z);
    let u = b.input("u", DType::F16, sym(&["m"], &[]));
    let sm = b.node("Softmax", &[u], &[("axis", Attr::Int(0))]);
    b.rename(sm, "s");
    b.output(sm);
    let g = b.finish().unwrap();
    let u = Tensor::from_vec(&[37], (0..37).map(|i| f16::from_f32(i as f32 * 0.05 - 0.7)).collect()).unwrap();
    let vals: Vec<f16> = (0..1001).map(|i| f16::from_f32((i as f32 - 500.0) * 0.37)).collect::<Vec<_>>();
    let mut vals = vals;
    vals.extend([f16::INFINITY, f16::NAN, f16::from_f32(60000.0)]); // 1.5 * 60000 overflows to inf
    let x = Tensor::from_vec(&[vals.len()], vals).unwrap();
    let cpu = Session::new(g.clone(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let (want, base) = cpu.run_with_stats(&[("x", &x), ("u", &u)]).unwrap();
    let report = kiln_runtime::list_devices();
    assert!(!report.adapters.is_empty(), "no GPU adapter (install mesa-vulkan-drivers)");
    // The adapters the test devices include (KILN_TEST_DEVICES narrows them).
    let tested: Vec<&str> = devices().iter().map(|d| d.label.as_str()).collect();
    let adapters: Vec<_> = report.adapters.iter().filter(|a| tested.iter().any(|l| l.starts_with(&format!("gpu:{} ", a.index)))).collect();
    assert!(!adapters.is_empty(), "no GPU among the test devices {tested:?}");
    for a in adapters {
        let s = Session::new(g.clone(), SessionOptions::device(DeviceChoice::Adapter(format!("gpu:{}", a.index)))).unwrap();
        let (got, stats) = s.run_with_stats(&[("x", &x), ("u", &u)]).unwrap();
        for (got, want) in got.iter().zip(&want) {
            assert_eq!(got.dtype(), DType::F16);
            let (g, w): (Vec<f64>, Vec<f64>) = (got.to_f64_vec(), want.to_f64_vec());
            for (i, (a_, b_)) in g.iter().zip(&w).enumerate() {
                assert!((a_.is_nan() && b_.is_nan()) || a_ == b_ || (a_ - b_).abs() <= 1e-3 * b_.abs(), "{} element {i}: {a_} vs {b_}", a.name);
            }
        }
        let f16_path = a.features.iter().any(|f| f == "shader-f16");
        assert_eq!(stats.kernels, base.kernels + if f16_path { 2 } else { 0 }, "{} ({}): f16 path {f16_path}", a.name, a.backend);
        println!("{} ({}): f16 {}", a.name, a.backend, if f16_path { "as halves on the GPU (SHADER_F16)" } else { "converted on the host" });
    }
}

/// f16 values between kernels that bind halves (MatMul, Transpose, Cast) live on
/// SHADER_F16 adapters as halves: f16 inputs are uploaded and outputs read back as they
/// are (no widening or narrowing kernels), and the intermediates take half the bytes of
/// the same graph in f32. The results agree with the CPU's to f16 precision.
#[test]
fn f16_values_between_kernels_that_bind_halves_are_stored_as_halves() {
    gpu_env();
    let build = |dtype: DType| {
        let mut b = GraphBuilder::new("halves");
        let x = b.input("x", dtype, kiln_graph::Shape::fixed(&[6, 8]));
        let wv: Vec<f64> = (0..8 * 12).map(|i| ((i * 7) % 13) as f64 / 13.0 - 0.5).collect();
        let w = b.constant("w", Tensor::from_f64(dtype, &[8, 12], &wv).unwrap());
        let z = b.node("MatMul", &[x, w], &[]);
        let t = b.node("Transpose", &[z], &[("perm", Attr::Ints(vec![1, 0]))]);
        let y = b.node("Cast", &[t], &[("to", Attr::Int(DType::F32.onnx_code() as i64))]);
        b.rename(z, "z");
        b.rename(y, "y");
        b.output(z);
        b.output(y);
        b.finish().unwrap()
    };
    let xv: Vec<f64> = (0..48).map(|i| (i as f64 - 20.0) * 0.173).collect();
    let x16 = Tensor::from_f64(DType::F16, &[6, 8], &xv).unwrap();
    let x32 = Tensor::from_f64(DType::F32, &[6, 8], &xv).unwrap();
    let cpu = Session::new(build(DType::F16), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let want = cpu.run(&[("x", &x16)]).unwrap();
    let report = kiln_runtime::list_devices();
    let tested: Vec<&str> = devices().iter().map(|d| d.label.as_str()).collect();
    let adapters: Vec<_> = report.adapters.iter().filter(|a| tested.iter().any(|l| l.starts_with(&format!("gpu:{} ", a.index)))).collect();
    assert!(!adapters.is_empty(), "no GPU among the test devices {tested:?}");
    for a in adapters {
        let device = || SessionOptions::device(DeviceChoice::Adapter(format!("gpu:{}", a.index)));
        let s = Session::new(build(DType::F16), device()).unwrap();
        let (got, stats) = s.run_with_stats(&[("x", &x16)]).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.dtype(), w.dtype());
            for (i, (p, q)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                assert!((p - q).abs() <= 2e-3 * q.abs().max(1.0), "{} element {i}: {p} vs {q}", a.name);
            }
        }
        if !a.features.iter().any(|f| f == "shader-f16") {
            println!("{}: no SHADER_F16, f16 stored as f32", a.name);
            continue;
        }
        assert_eq!(stats.kernels, 3, "{}: MatMul, Transpose and Cast, nothing widened or narrowed", a.name);
        let f32_session = Session::new(build(DType::F32), device()).unwrap();
        let (_, f32_stats) = f32_session.run_with_stats(&[("x", &x32)]).unwrap();
        let (half, full) = (stats.memory.unwrap().unshared, f32_stats.memory.unwrap().unshared);
        // x, z and the transpose as halves; the f32 output y as it is.
        assert_eq!(full - half, (48 + 72 + 72) * 2, "{}: {half} bytes against {full} in f32", a.name);
        println!("{} ({}): f16 stored as halves, {half} bytes against {full} in f32", a.name, a.backend);
    }
}

#[test]
fn scatter_and_gather_nd_indices_out_of_range_are_errors_on_every_backend() {
    gpu_env();
    // (op, data dims, indices dims, updates dims, axis attr, bound)
    let cases: [(&str, &[usize], &[usize], Option<&[usize]>, usize); 3] = [
        ("GatherND", &[4, 3], &[2, 1], None, 4),
        ("ScatterND", &[4, 3], &[2, 1], Some(&[2, 3]), 4),
        ("ScatterElements", &[6], &[2], Some(&[2]), 6),
    ];
    for (op, data_dims, idx_dims, upd_dims, bound) in cases {
        let mut b = GraphBuilder::new(op);
        let data = b.constant("data", rand_f32(data_dims, 1));
        let idx = b.input("idx", DType::I64, kiln_graph::Shape::fixed(idx_dims));
        let mut ins = vec![data, idx];
        if let Some(u) = upd_dims {
            ins.push(b.constant("upd", rand_f32(u, 2)));
        }
        let y = b.node(op, &ins, &[]);
        b.output(y);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 18);
        g.nodes[0].name = format!("my_{op}");
        for (name, device) in [("cpu", DeviceChoice::Cpu), ("gpu", DeviceChoice::Gpu)] {
            let s = Session::new(g.clone(), SessionOptions::device(device)).unwrap();
            let n: usize = idx_dims.iter().product();
            let good: Vec<i64> = (0..n as i64).map(|i| -(i + 1)).collect();
            s.run(&[("idx", &Tensor::from_vec(idx_dims, good).unwrap())]).unwrap_or_else(|e| panic!("{op} on {name}: {e}"));
            let mut bad = vec![0i64; n];
            bad[n - 1] = bound as i64 + 1;
            let e = s.run(&[("idx", &Tensor::from_vec(idx_dims, bad).unwrap())]).unwrap_err().to_string();
            assert!(e.contains(&format!("my_{op}")) && e.contains(&(bound + 1).to_string()) && e.contains("out of range"), "{op} on {name}: {e}");
        }
    }
}

#[test]
fn a_u64_left_shift_beyond_32_bits_is_an_error_on_the_gpu() {
    gpu_env();
    let mut b = GraphBuilder::new("shift");
    let x = b.input("x", DType::U64, sym(&["n"], &[]));
    let s = b.constant("s", Tensor::from_vec(&[1], vec![4u64]).unwrap());
    let y = b.node("BitShift", &[x, s], &[("direction", Attr::String("LEFT".into()))]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 11);
    let gpu = Session::new(g.clone(), SessionOptions::device(DeviceChoice::Gpu)).unwrap();
    let ok = gpu.run(&[("x", &Tensor::from_vec(&[2], vec![1u64, 1 << 27]).unwrap())]).unwrap();
    assert_eq!(ok[0].to_i64_vec().unwrap(), vec![16, 1 << 31]);
    let e = gpu.run(&[("x", &Tensor::from_vec(&[2], vec![1u64, 1 << 28]).unwrap())]).unwrap_err().to_string();
    assert!(e.contains("BitShift") && e.contains("does not fit"), "{e}");
    // The CPU computes it in 64 bits.
    let cpu = Session::new(g, SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    assert_eq!(cpu.run(&[("x", &Tensor::from_vec(&[1], vec![1u64 << 28]).unwrap())]).unwrap()[0].to_i64_vec().unwrap(), vec![1 << 32]);
}

/// Sizes come from the model: a shape whose byte size overflows, or that exceeds the
/// session's memory limit, is an error naming the node, never a wrap or an abort.
#[test]
fn sizes_beyond_memory_are_named_errors() {
    let expand = |dims: Vec<i64>| {
        let mut b = GraphBuilder::new("huge");
        let x = b.input("x", DType::F32, kiln_graph::Shape::fixed(&[1]));
        let shape = b.constant("shape", Tensor::from_vec(&[dims.len()], dims).unwrap());
        let y = b.node("Expand", &[x, shape], &[]);
        b.rename(y, "y");
        b.output(y);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 13);
        g
    };
    let x = Tensor::from_vec(&[1], vec![1f32]).unwrap();
    // 2^62 elements of 4 bytes: the byte size overflows.
    let err = Session::new(expand(vec![1 << 31, 1 << 31]), SessionOptions::device(DeviceChoice::Cpu)).and_then(|s| s.run(&[("x", &x)]).map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("Expand") && err.to_string().contains("memory limit"), "{err}");
    // 4 MiB against a 1 MiB limit.
    let opts = SessionOptions { device: DeviceChoice::Cpu, memory_limit: Some(1 << 20), ..Default::default() };
    let err = Session::new(expand(vec![1024, 1024]), opts).and_then(|s| s.run(&[("x", &x)]).map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("4194304 bytes") && err.to_string().contains("memory limit of 1048576"), "{err}");
    // Within the limit it runs.
    let opts = SessionOptions { device: DeviceChoice::Cpu, memory_limit: Some(64 << 20), ..Default::default() };
    let y = Session::new(expand(vec![1024, 1024]), opts).unwrap().run(&[("x", &x)]).unwrap();
    assert_eq!(y[0].dims(), &[1024, 1024]);
}

/// y = Gather(x * 2, NonZero(Relu(x))[1]) + 1 for x: [1, n]: NonZero's output length
/// depends on values computed at run time, so the model runs in stages (NonZero on the
/// host between them); every stage is planned once per type and reused.
fn data_dependent_graph() -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("staged");
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec![1usize.into(), "n".into()]));
    let r = b.node("Relu", &[x], &[]);
    let nz = b.node("NonZero", &[r], &[]);
    let one = b.constant("one", Tensor::from_vec(&[1], vec![1i64]).unwrap());
    let two = b.constant("two", Tensor::from_vec(&[1], vec![2i64]).unwrap());
    let zero = b.constant("zero", Tensor::from_vec(&[1], vec![0i64]).unwrap());
    let cols = b.node("Slice", &[nz, one, two, zero], &[]);
    let cols = b.node("Squeeze", &[cols, zero], &[]);
    let k = b.constant("k", Tensor::scalar(2f32));
    let x2 = b.node("Mul", &[x, k], &[]);
    let g = b.node("Gather", &[x2, cols], &[("axis", Attr::Int(1))]);
    let c1 = b.constant("c1", Tensor::scalar(1f32));
    let y = b.node("Add", &[g, c1], &[]);
    b.rename(y, "y");
    b.output(y);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

#[test]
fn data_dependent_shapes_run_in_stages_on_every_device() {
    for dev in devices() {
        let s = Session::new(data_dependent_graph(), SessionOptions::device(dev.choice.clone())).unwrap();
        // 24 values: more than a float input bound by value may hold.
        for (k, seed) in [1u64, 2, 1, 3].into_iter().enumerate() {
            let x = rand_f32(&[1, 24], seed);
            let xs = x.as_slice::<f32>().unwrap().to_vec();
            let (out, stats) = s.run_with_stats(&[("x", &x)]).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
            let want: Vec<f32> = xs.iter().filter(|v| **v > 0.0).map(|v| v * 2.0 + 1.0).collect();
            assert_eq!(out[0].dims(), &[1, want.len()], "{} run {k}", dev.label);
            assert_eq!(out[0].as_slice::<f32>().unwrap(), want.as_slice(), "{} run {k}", dev.label);
            // The first stage is planned on the first run only.
            assert_eq!(stats.specialized, k == 0, "{} run {k}", dev.label);
        }
    }
}

/// float8 data runs through Cast and reshapes on every backend; arithmetic on it is an
/// error naming the node and the dtype, never a silent reinterpretation of its bytes.
#[test]
fn narrow_dtypes_cast_and_reshape_but_arithmetic_is_refused() {
    gpu_env();
    let mut b = GraphBuilder::new("f8");
    let x = b.input("x", DType::F32, kiln_graph::Shape::fixed(&[2, 3]));
    let q = b.node("Cast", &[x], &[("to", Attr::Int(DType::F8E4M3FN.onnx_code() as i64))]);
    let shape = b.constant("shape", Tensor::from_vec(&[1], vec![6i64]).unwrap());
    let r = b.node("Reshape", &[q, shape], &[]);
    let y = b.node("Cast", &[r], &[("to", Attr::Int(DType::F32.onnx_code() as i64))]);
    b.rename(y, "y");
    b.output(y);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 21);
    let x = Tensor::from_vec(&[2, 3], vec![0.478_925_47f32, 1e6, -3.3, 0.0, 465.0, -1e-9]).unwrap();
    for (name, device) in [("cpu", DeviceChoice::Cpu), ("gpu", DeviceChoice::Gpu)] {
        let s = Session::new(g.clone(), SessionOptions::device(device)).unwrap();
        let out = s.run(&[("x", &x)]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![0.46875, 448.0, -3.25, 0.0, 448.0, -0.0], "{name}");
    }
    let mut b = GraphBuilder::new("f8_add");
    let x = b.input("x", DType::F8E5M2, kiln_graph::Shape::fixed(&[3]));
    let y = b.node("Add", &[x, x], &[]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.nodes[0].name = "sum".into();
    g.opsets.insert(String::new(), 21);
    let e = cpu_session(g).err().expect("an error").to_string();
    assert!(e.contains("'sum'") && e.contains("f8e5m2") && e.contains("Cast"), "{e}");
}

/// `y = x * s`, `s:next = s + x`: after k runs from s0, s = s0 + k x. With `constant`,
/// `s:next` is a constant (ones doubled) that the session folds.
fn accumulator(constant: bool) -> kiln_graph::Graph {
    let mut b = GraphBuilder::new("accumulate");
    let x = b.input("x", DType::F32, [4usize]);
    let s = b.input("s", DType::F32, [4usize]);
    let y = b.node("Mul", &[x, s], &[]);
    let next = if constant {
        let k = b.constant("k", Tensor::from_vec(&[4], vec![1f32; 4]).unwrap());
        b.node("Add", &[k, k], &[])
    } else {
        b.node("Add", &[s, x], &[])
    };
    b.rename(y, "y");
    b.rename(next, "s:next");
    b.output(y);
    b.output(next);
    b.finish().unwrap()
}

/// Carried state on every device: the same values, read back on demand; on a GPU the
/// state stays in device memory between runs (and on the host where a plan cannot
/// keep it there: a next value that no kernel writes).
#[test]
fn carried_state_agrees_on_every_device_and_stays_on_gpus() {
    let x = Tensor::from_vec(&[4], vec![1f32, 2.0, -0.5, 0.25]).unwrap();
    let s0 = Tensor::from_vec(&[4], vec![0.5f32, 0.0, 1.0, -2.0]).unwrap();
    let at = |k: f32| -> Vec<f32> { s0.as_slice::<f32>().unwrap().iter().zip(x.as_slice::<f32>().unwrap()).map(|(s, x)| s + k * x).collect() };
    for d in devices() {
        let session = Session::new(accumulator(false), SessionOptions::device(d.choice.clone())).unwrap();
        let state = session.carry(&[("s", "s:next")], vec![s0.clone()]).unwrap();
        for k in 0..3 {
            let (outs, stats) = session.run_carried(&state, &[("x", &x)]).unwrap();
            assert_eq!(outs.len(), 1, "{}: only y comes back", d.label);
            let want: Vec<f32> = at(k as f32).iter().zip(x.as_slice::<f32>().unwrap()).map(|(s, x)| s * x).collect();
            assert_eq!(outs[0].as_slice::<f32>().unwrap(), want.as_slice(), "{}: y of run {k}", d.label);
            assert_eq!(state.on_device(), !d.is_cpu(), "{}: where the state lives", d.label);
            if !d.is_cpu() {
                assert_eq!(stats.submits, 1, "{}", d.label);
            }
        }
        assert_eq!(state.get("s").unwrap().as_slice::<f32>().unwrap(), at(3.0).as_slice(), "{}", d.label);
        // A value set on the host goes to the device with the next run.
        state.set("s", s0.clone()).unwrap();
        session.run_carried(&state, &[("x", &x)]).unwrap();
        assert_eq!(state.values().unwrap()[0].as_slice::<f32>().unwrap(), at(1.0).as_slice(), "{}", d.label);
        // A next value no kernel writes (folded to a constant): the state stays on the
        // host.
        let session = Session::new(accumulator(true), SessionOptions::device(d.choice.clone())).unwrap();
        let state = session.carry(&[("s", "s:next")], vec![s0.clone()]).unwrap();
        let (outs, _) = session.run_carried(&state, &[("x", &x)]).unwrap();
        assert_eq!(outs[0].as_slice::<f32>().unwrap(), at(0.0).iter().zip(x.as_slice::<f32>().unwrap()).map(|(s, x)| s * x).collect::<Vec<_>>().as_slice());
        assert!(!state.on_device(), "{}", d.label);
        assert_eq!(state.get("s").unwrap().as_slice::<f32>().unwrap(), &[2.0; 4], "{}", d.label);
    }
}

#[test]
fn carried_state_errors_name_what_is_wrong() {
    let s = Session::new(accumulator(false), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let s0 = Tensor::from_vec(&[4], vec![0f32; 4]).unwrap();
    let err = |r: Result<kiln_runtime::Carried, RuntimeError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(s.carry(&[("t", "s:next")], vec![s0.clone()]));
    assert!(e.contains("'t'") && e.contains("'s'"), "{e}");
    let e = err(s.carry(&[("s", "t:next")], vec![s0.clone()]));
    assert!(e.contains("no output 't:next'") && e.contains("'y'"), "{e}");
    let e = err(s.carry(&[("s", "s:next")], vec![Tensor::from_vec(&[3], vec![0f32; 3]).unwrap()]));
    assert!(e.contains("input 's'") && e.contains("[3]"), "{e}");
    let e = err(s.carry(&[("s", "s:next")], vec![]));
    assert!(e.contains("0 initial values for 1"), "{e}");
    let state = s.carry(&[("s", "s:next")], vec![s0.clone()]).unwrap();
    let e = state.set("s", Tensor::from_vec(&[2], vec![0f32; 2]).unwrap()).unwrap_err().to_string();
    assert!(e.contains("input 's'") && e.contains("[2]"), "{e}");
    // The state is bound by the session: giving it as an input too is an error.
    let e = s.run_carried(&state, &[("x", &s0), ("s", &s0)]).unwrap_err().to_string();
    assert!(e.contains("'s'") && e.contains("more than once"), "{e}");
}
