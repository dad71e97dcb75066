//! Test helpers for the reduction ops: build an op from the registry at an opset, run
//! inference, the CPU kernel and WGSL generation (validated with naga) in one call.
use crate::{Arg, NodeSpec, Op, Registry, TensorType, TuneValues};
use kiln_graph::{Attr, Node, Tensor};

pub fn make(op: &str, attrs: &[(&str, Attr)], opset: i64, n_inputs: usize) -> Box<dyn Op> {
    let node = Node {
        name: "n".into(),
        op_type: op.into(),
        domain: String::new(),
        attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        inputs: (0..n_inputs).map(Some).collect(),
        outputs: vec![n_inputs],
    };
    Registry::builtin().create(&NodeSpec::new(&node, opset)).unwrap()
}

/// Infers, runs on the CPU and validates the WGSL (with each `tunes` variant); input 0
/// is a runtime value, the others are constants.
pub fn run(op: &dyn Op, inputs: &[Tensor], tunes: &[TuneValues]) -> crate::Result<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| TensorType::new(t.dtype(), t.dims())).collect();
    let args: Vec<Option<Arg>> =
        types.iter().zip(inputs).enumerate().map(|(i, (ty, t))| Some(Arg { ty, value: if i == 0 { None } else { Some(t) } })).collect();
    let out_ty = op.infer(&args)?;
    let mut out = vec![Tensor::zeros(out_ty[0].dtype, &out_ty[0].dims)];
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
    op.cpu().unwrap().run(&refs, &mut out)?;
    let default = [TuneValues::default()];
    for tune in if tunes.is_empty() { &default[..] } else { tunes } {
        let prog = op.wgsl().unwrap().generate(&args, &out_ty, tune)?;
        for d in &prog.dispatches {
            crate::wgsl::testing::validate(&d.source);
        }
    }
    Ok(out.remove(0))
}

pub fn tune(name: &str, v: u32) -> TuneValues {
    let mut t = TuneValues::default();
    t.0.insert(name.into(), v);
    t
}
