//! Runs a model that contains `com.example.SwiGlu` (samples/custom-op-manifest/model.onnx)
//! with the op defined in Rust: on every device, against an f64 reference, then through
//! a compiled `.kiln` artifact. Exits non-zero when a device disagrees.
//!
//!     cargo run --release --manifest-path samples/custom-op-rust/Cargo.toml [MODEL]

mod swiglu;
mod swish;

use kiln_graph::Tensor;
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::error::Error;
use std::path::PathBuf;

/// y = SwiGlu(x @ w1, beta) @ w2 in f64.
fn reference(x: &Tensor, w1: &Tensor, w2: &Tensor, beta: f64) -> Vec<f64> {
    let (x, w1, w2) = (x.to_f64_vec(), w1.to_f64_vec(), w2.to_f64_vec());
    let (n, k, h, o) = (x.len() / 8, 8, 32, 4);
    let mut y = vec![0.0; n * o];
    for r in 0..n {
        let hid: Vec<f64> = (0..h).map(|j| (0..k).map(|i| x[r * k + i] * w1[i * h + j]).sum()).collect();
        let g: Vec<f64> = (0..h / 2).map(|j| hid[j] / (1.0 + (-beta * hid[j]).exp()) * hid[h / 2 + j]).collect();
        for c in 0..o {
            y[r * o + c] = (0..h / 2).map(|j| g[j] * w2[j * o + c]).sum();
        }
    }
    y
}

fn main() -> Result<(), Box<dyn Error>> {
    let model = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../custom-op-manifest/model.onnx"));
    // The built-in ops plus ours.
    let mut registry = kiln_ops::Registry::builtin().clone();
    swiglu::register(&mut registry);
    let mut graph = kiln_compiler::onnx::import_file_with(&model, &kiln_compiler::onnx::ImportOptions::with_registry(&registry))?;
    kiln_compiler::passes::optimize_with(&mut graph, kiln_compiler::passes::Target::Any, &mut kiln_compiler::passes::PassContext::new(&registry));
    let w = |name: &str| graph.initializers.iter().find(|(&v, _)| graph.values[v].name == name).map(|(_, t)| t.clone()).ok_or(format!("no weight {name}"));
    let (w1, w2) = (w("w1")?, w("w2")?);
    let x = Tensor::from_vec(&[3, 8], (0..24).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect())?;
    let want = reference(&x, &w1, &w2, 1.5);

    // Every device: the CPU, then each GPU adapter Kiln finds.
    let mut devices = vec![DeviceChoice::Cpu];
    devices.extend(kiln_runtime::list_devices().adapters.iter().map(|a| DeviceChoice::Adapter(format!("gpu:{}", a.index))));
    let artifact = std::env::temp_dir().join(format!("swiglu-example-{}.kiln", std::process::id()));
    kiln_runtime::artifact::save(&artifact, &graph, &kiln_runtime::artifact::ArtifactInfo { source: model.display().to_string(), device: "any".into(), ..Default::default() })?;
    let mut worst: f64 = 0.0;
    for device in devices {
        // Straight from the ONNX graph, and from the artifact (loaded without the compiler).
        let (from_artifact, _) = kiln_runtime::artifact::load(&artifact)?;
        for (how, g) in [("onnx", graph.clone()), ("artifact", from_artifact)] {
            let options = SessionOptions { device: device.clone(), registry: Some(registry.clone()), ..Default::default() };
            let session = match Session::new(g, options) {
                Ok(s) => s,
                Err(kiln_runtime::RuntimeError::GpuUnavailable(why)) => {
                    println!("{device}: skipped, the adapter's device does not open ({why})");
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            let t = std::time::Instant::now();
            let y = session.run(&[("x", &x)])?.remove(0);
            let err = y.to_f64_vec().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            worst = worst.max(err);
            println!("{:<60} {how:<8} max |error| vs f64: {err:.2e} ({:.1} ms)", session.device_name(), t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let _ = std::fs::remove_file(&artifact);
    // A custom elementwise op fuses with Kiln's own: x -> Swish -> Mul(2) -> Relu is one
    // kernel after the passes.
    swish::register(&mut registry);
    let mut b = kiln_graph::GraphBuilder::new("swish_chain");
    let xin = b.input("x", kiln_graph::DType::F32, [2, 5]);
    let s = b.node("Swish", &[xin], &[("beta", kiln_graph::Attr::Float(1.5))]);
    let two = b.constant("two", Tensor::from_vec(&[1], vec![2.0f32])?);
    let m = b.node("Mul", &[s, two], &[]);
    let r = b.node("Relu", &[m], &[]);
    b.output(r);
    let mut chain = b.finish()?;
    chain.nodes[0].domain = swiglu::DOMAIN.into();
    kiln_compiler::passes::optimize_with(&mut chain, kiln_compiler::passes::Target::Any, &mut kiln_compiler::passes::PassContext::new(&registry));
    let ops: Vec<&str> = chain.nodes.iter().map(|n| n.op_type.as_str()).collect();
    println!("Swish -> Mul -> Relu after the passes: {ops:?}");
    if ops != ["FusedElementwise"] {
        return Err(format!("the custom elementwise op did not fuse: {ops:?}").into());
    }
    if worst > 1e-4 {
        return Err(format!("a device disagrees with the f64 reference by {worst:.2e}").into());
    }
    println!("ok: com.example.SwiGlu (Rust) agrees with the f64 reference on every device");
    Ok(())
}
