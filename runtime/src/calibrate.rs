//! Calibration of the cost model: each device measured once per process by planning and
//! running small graphs on it (the same plans sessions run, without a session).
use crate::placement::{Dev, DeviceProfile, Placement};
use crate::plan::Plan;
use crate::{gpu, DeviceChoice, Result, RuntimeError};
use kiln_graph::Tensor;
use kiln_ops::infer;
use std::collections::HashMap;

/// Measures a device by planning and running small graphs on it:
/// a matrix product (FLOP/s); chains of 1 and 9 tiny ops (the difference is 8 launches,
/// the rest the per-run cost); chains of 1 and 9 Relus over 4 MiB (the difference is 8
/// passes over memory: bytes/s; what the single pass leaves is moving 4 MiB to the
/// device and back: transfer bytes/s). Cached per device name.
pub fn calibrate(device: &DeviceChoice) -> Result<DeviceProfile> {
    use kiln_graph::{DType, GraphBuilder, Shape};
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, DeviceProfile>>> = OnceLock::new();
    let key = device.to_string();
    if let Some(p) = CACHE.get_or_init(Default::default).lock().ok().and_then(|c| c.get(&key).copied()) {
        return Ok(p);
    }
    let gpus = match gpu::select(device)? {
        Some(adapter) => vec![(gpu::context_for(adapter)?, gpu::WeightCache::default())],
        None => vec![],
    };
    let dev = if gpus.is_empty() { Dev::Cpu } else { Dev::Gpu(0) };
    let time = |g: kiln_graph::Graph, x: Tensor| -> Result<f64> {
        let order = g.validate()?;
        let ops = infer::create_ops(&g, kiln_ops::Registry::builtin())?;
        let types = [kiln_ops::TensorType::new(x.dtype(), x.dims())];
        let spec = infer::specialize(&g, &ops, &order, &types, &[None], infer::Limits::default()).map_err(|e| RuntimeError::from(e.into_error()))?;
        let placement = Placement { devices: vec![dev; spec.steps.len()], programs: vec![] };
        let plan = Plan::build(&g, &ops, &spec, placement, &gpus, infer::Limits::default(), &crate::tune::Choices::new(crate::tune::Tuning::off()))?;
        plan.run(&g, &ops, &[&x])?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            plan.run(&g, &ops, &[&x])?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let chain = |n: usize, dims: &[usize], op: &str| {
        let mut b = GraphBuilder::new("calibration");
        let mut v = b.input("x", DType::F32, Shape::fixed(dims));
        for _ in 0..n {
            v = b.node(op, &[v], &[]);
        }
        b.output(v);
        b.finish().expect("a valid chain")
    };
    let n = 256;
    let mut b = GraphBuilder::new("calibration");
    let x = b.input("x", DType::F32, Shape::fixed(&[n, n]));
    let y = b.node("MatMul", &[x, x], &[]);
    b.output(y);
    let mm = time(b.finish().expect("a valid graph"), Tensor::zeros(DType::F32, &[n, n]))?;
    let big = 1 << 20;
    let one_big = time(chain(1, &[big], "Relu"), Tensor::zeros(DType::F32, &[big]))?;
    let nine_big = time(chain(9, &[big], "Relu"), Tensor::zeros(DType::F32, &[big]))?;
    let one = time(chain(1, &[4], "Relu"), Tensor::zeros(DType::F32, &[4]))?;
    let nine = time(chain(9, &[4], "Relu"), Tensor::zeros(DType::F32, &[4]))?;
    let launch_s = ((nine - one) / 8.0).max(1e-7);
    let segment_s = (one - launch_s).max(0.0);
    // One pass reads and writes 4 bytes per element.
    let pass_s = ((nine_big - one_big) / 8.0 - launch_s).max(1e-7);
    let bytes_per_s = 8.0 * big as f64 / pass_s;
    let transfer_bytes_per_s = if *device == DeviceChoice::Cpu { bytes_per_s } else { 8.0 * big as f64 / (one_big - segment_s - launch_s - pass_s).max(1e-7) };
    let profile = DeviceProfile {
        flops_per_s: 2.0 * (n * n * n) as f64 / (mm - segment_s - launch_s).max(1e-7),
        bytes_per_s,
        launch_s,
        segment_s,
        transfer_bytes_per_s,
    };
    log::info!("calibrated {key}: {profile:?}");
    if let Ok(mut c) = CACHE.get_or_init(Default::default).lock() {
        c.insert(key, profile);
    }
    Ok(profile)
}

