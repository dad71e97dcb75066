//! Test helpers for the nn ops: building ops from attributes, deterministic data,
//! running CPU kernels and validating generated WGSL.
use crate::{Arg, NodeSpec, Op, Registry, TensorType, TuneValues};
use kiln_graph::{Attr, DType, Node, Tensor};

pub(crate) fn make(op: &str, n_inputs: usize, n_outputs: usize, attrs: &[(&str, Attr)]) -> crate::Result<Box<dyn Op>> {
    let node = Node {
        name: "n".into(),
        op_type: op.into(),
        domain: String::new(),
        attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        inputs: (0..n_inputs).map(Some).collect(),
        outputs: (n_inputs..n_inputs + n_outputs).collect(),
    };
    Registry::builtin().create(&NodeSpec::new(&node, 19))
}

pub(crate) fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// Deterministic pseudo-random values in [-1, 1).
pub(crate) fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub(crate) fn tensor(dims: &[usize], seed: u64) -> Tensor {
    Tensor::from_vec(dims, data(dims.iter().product(), seed)).unwrap()
}

/// Infers, runs the CPU kernel, and validates every generated WGSL dispatch (with the
/// default tuning and `extra_tunes`). Inputs in `constant` are passed as constants.
pub(crate) fn run(op: &dyn Op, inputs: &[Option<&Tensor>], extra_tunes: &[TuneValues]) -> crate::Result<Vec<Tensor>> {
    let types: Vec<Option<TensorType>> =
        inputs.iter().map(|t| t.map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
    let args: Vec<Option<Arg>> =
        types.iter().zip(inputs).map(|(ty, t)| ty.as_ref().map(|ty| Arg { ty, value: *t })).collect();
    let outs = op.infer(&args)?;
    let mut tensors: Vec<Tensor> = outs.iter().map(|o| Tensor::zeros(o.dtype, &o.dims)).collect();
    op.cpu().expect("cpu kernel").run(inputs, &mut tensors)?;
    if let Some(k) = op.wgsl() {
        let wargs: Vec<Option<Arg>> = types.iter().map(|ty| ty.as_ref().map(|ty| Arg { ty, value: None })).collect();
        let mut tunes = vec![TuneValues::default()];
        tunes.extend_from_slice(extra_tunes);
        for tune in &tunes {
            match k.generate(&wargs, &outs, tune) {
                Ok(prog) => {
                    for d in &prog.dispatches {
                        crate::wgsl::testing::validate(&d.source);
                    }
                }
                Err(crate::OpError::Unsupported(_)) => {}
                Err(e) => panic!("WGSL generation failed: {e}"),
            }
        }
    }
    Ok(tensors)
}

pub(crate) fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert_eq!(got.dtype(), DType::F32);
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// Tunings that set the named parameters.
pub(crate) fn tune(pairs: &[(&str, u32)]) -> TuneValues {
    TuneValues(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
}
