//! What the tuner needs of one step: its key on a device, and inputs to run it on.
use super::key::{cpu_version, wgsl_version, DeviceFingerprint, TuneKey};
use kiln_graph::rng::Rng;
use kiln_graph::{Graph, Tensor};
use kiln_ops::infer::{Specialized, Step};
use kiln_ops::{Arg, Op, WgslProgram};

/// The key of a step's CPU kernel.
pub(crate) fn cpu_key(graph: &Graph, op: &dyn Op, spec: &Specialized, step: &Step, device: &DeviceFingerprint) -> TuneKey {
    TuneKey::new(&graph.nodes[step.node], &spec.args(&step.inputs), device, cpu_version(op.name()))
}

/// The key of a step's WGSL kernel, whose program at the default values is `default`.
pub(crate) fn gpu_key(graph: &Graph, spec: &Specialized, step: &Step, device: &DeviceFingerprint, default: &WgslProgram) -> TuneKey {
    TuneKey::new(&graph.nodes[step.node], &spec.args(&step.inputs), device, wgsl_version(default))
}

/// Inputs to time a step on: constants with their values, other float inputs uniform in
/// [-1, 1) from a fixed seed (the same on every run), other dtypes zero (valid indices
/// and counts for ops that take them).
pub(crate) fn step_inputs(args: &[Option<Arg>]) -> Result<Vec<Option<Tensor>>, String> {
    let mut rng = Rng::new(0x5EED);
    args.iter()
        .map(|a| match a {
            None => Ok(None),
            Some(a) => match a.value {
                Some(t) => Ok(Some(t.clone())),
                None if a.dtype().is_float() => {
                    let n = kiln_graph::size::elements(a.dims()).map_err(|e| e.to_string())?;
                    let v: Vec<f64> = (0..n).map(|_| rng.next_f32() as f64).collect();
                    Tensor::from_f64(a.dtype(), a.dims(), &v).map(Some).map_err(|e| e.to_string())
                }
                None => Tensor::try_zeros(a.dtype(), a.dims()).map(Some).map_err(|e| e.to_string()),
            },
        })
        .collect()
}
