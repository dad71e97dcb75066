//! Benchmark: the CPU kernels of binary elementwise ops on 2^20 elements (best of 30
//! runs each). Prints one line per case.
//!   cargo run --release -p kiln-ops --example binary_hot_loops
use kiln_graph::{DType, Node, Tensor};
use kiln_ops::{Arg, NodeSpec, Registry, TensorType};

fn data(d: DType, dims: &[usize], s: f64) -> Tensor {
    let v: Vec<f64> = (0..dims.iter().product::<usize>()).map(|i| ((i * 7919 % 1000) as f64 - 500.0) * s + 1.0).collect();
    Tensor::from_f64(d, dims, &v).expect("values fit the dtype")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = 1 << 20;
    let cases: Vec<(&str, &str, Tensor, Tensor)> = vec![
        ("Add f32", "Add", data(DType::F32, &[n], 0.01), data(DType::F32, &[n], 0.02)),
        ("Add f32 bias", "Add", data(DType::F32, &[1024, 1024], 0.01), data(DType::F32, &[1024], 0.02)),
        ("Mul f32 scalar", "Mul", data(DType::F32, &[n], 0.01), data(DType::F32, &[], 0.02)),
        ("Max f32", "Max", data(DType::F32, &[n], 0.01), data(DType::F32, &[n], 0.02)),
        ("Pow f32 ^2", "Pow", data(DType::F32, &[n], 0.01), Tensor::scalar(2f32)),
        ("Less f32", "Less", data(DType::F32, &[n], 0.01), data(DType::F32, &[n], 0.02)),
        ("Div f64", "Div", data(DType::F64, &[n], 0.01), data(DType::F64, &[n], 0.02)),
        ("Mul i64", "Mul", data(DType::I64, &[n], 1.0), data(DType::I64, &[n], 1.0)),
        ("Add i32", "Add", data(DType::I32, &[n], 1.0), data(DType::I32, &[n], 1.0)),
        ("Equal i64", "Equal", data(DType::I64, &[n], 1.0), data(DType::I64, &[n], 1.0)),
        ("And bool", "And", data(DType::Bool, &[n], 1.0), data(DType::Bool, &[n], 0.5)),
    ];
    for (name, op_type, a, b) in cases {
        let node = Node { name: name.into(), op_type: op_type.into(), domain: String::new(), attrs: Default::default(), inputs: vec![Some(0), Some(1)], outputs: vec![2] };
        let op = Registry::builtin().create(&NodeSpec::new(&node, 17))?;
        let (ta, tb) = (TensorType::new(a.dtype(), a.dims()), TensorType::new(b.dtype(), b.dims()));
        let ty = op.infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })])?;
        let mut out = vec![Tensor::try_zeros(ty[0].dtype, &ty[0].dims)?];
        let kernel = op.cpu().ok_or("no CPU kernel")?;
        let mut best = f64::MAX;
        for _ in 0..30 {
            let t = std::time::Instant::now();
            kernel.run(&[Some(&a), Some(&b)], &mut out)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{name:16} {:8.1} us", best * 1e6);
    }
    Ok(())
}
