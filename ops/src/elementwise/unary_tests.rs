//! Unit tests of the unary ops: CPU against f64 references, WGSL validated by naga.
use super::*;
use kiln_graph::Node;

fn make(op: &str, attrs: &[(&str, kiln_graph::Attr)]) -> Box<dyn Op> {
    let node = Node {
        name: "n".into(),
        op_type: op.into(),
        domain: String::new(),
        attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        inputs: vec![Some(0)],
        outputs: vec![1],
    };
    Registry::builtin().create(&NodeSpec::new(&node, 17)).unwrap()
}

#[test]
fn cpu_matches_scalar_reference_and_wgsl_validates() {
    let xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.37).collect();
    let x = Tensor::from_slice(&[37], &xs).unwrap();
    for (_, op) in Registry::builtin().op_types().filter(|(_, o)| {
        ["Relu", "Sigmoid", "Tanh", "HardSwish", "Exp", "Neg", "Abs", "Softplus", "Sign", "Floor"].contains(o)
    }) {
        let o = make(op, &[]);
        let ty = TensorType::new(DType::F32, vec![37]);
        let args = [Some(Arg { ty: &ty, value: None })];
        let out_ty = o.infer(&args).unwrap();
        let mut out = vec![Tensor::zeros(DType::F32, &out_ty[0].dims)];
        o.cpu().unwrap().run(&[Some(&x)], &mut out).unwrap();
        let got = out[0].as_slice::<f32>().unwrap();
        for (i, &v) in xs.iter().enumerate() {
            let want = parse_kind(op).apply_f64(v as f64) as f32;
            assert!((got[i] - want).abs() <= 1e-6 * want.abs().max(1.0), "{op}({v}) = {} not {want}", got[i]);
        }
        let prog = o.wgsl().unwrap().generate(&args, &out_ty, &TuneValues::default()).unwrap();
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
    }
}

fn parse_kind(op: &str) -> UnaryKind {
    let node = Node {
        name: "n".into(),
        op_type: op.into(),
        domain: String::new(),
        attrs: Default::default(),
        inputs: vec![Some(0)],
        outputs: vec![1],
    };
    parse(&NodeSpec::new(&node, 17), match op {
        "Relu" => UnaryKind::Relu,
        "Sigmoid" => UnaryKind::Sigmoid,
        "Tanh" => UnaryKind::Tanh,
        "HardSwish" => UnaryKind::HardSwish,
        "Exp" => UnaryKind::Exp,
        "Neg" => UnaryKind::Neg,
        "Abs" => UnaryKind::Abs,
        "Softplus" => UnaryKind::Softplus,
        "Sign" => UnaryKind::Sign,
        "Floor" => UnaryKind::Floor,
        _ => unreachable!(),
    })
    .unwrap()
}

#[test]
fn clip_reads_bounds_from_inputs_and_ints_work() {
    let c = make("Clip", &[]);
    let x = Tensor::from_slice(&[4], &[-3i64, 0, 5, 9]).unwrap();
    let lo = Tensor::scalar(0i64);
    let hi = Tensor::scalar(6i64);
    let mut out = vec![Tensor::zeros(DType::I64, &[4])];
    c.cpu().unwrap().run(&[Some(&x), Some(&lo), Some(&hi)], &mut out).unwrap();
    assert_eq!(out[0].as_slice::<i64>().unwrap(), &[0, 0, 5, 6]);
    let bad = make("Sqrt", &[]);
    let ty = TensorType::new(DType::I64, vec![4]);
    assert!(bad.infer(&[Some(Arg { ty: &ty, value: None })]).is_err());
}

fn run_kind(kind: UnaryKind, x: &Tensor) -> Tensor {
    let op = Unary { kind };
    let ty = TensorType::new(x.dtype(), x.dims());
    let args = [Some(Arg { ty: &ty, value: None })];
    let out_ty = op.infer(&args).unwrap();
    let prog = op.generate(&args, &out_ty, &TuneValues::default()).unwrap();
    crate::wgsl::testing::validate(&prog.dispatches[0].source);
    let mut out = vec![Tensor::zeros(out_ty[0].dtype, &out_ty[0].dims)];
    op.run(&[Some(x)], &mut out).unwrap();
    out.remove(0)
}

/// Straightforward f64 formulas, written independently of `apply_f64`.
fn reference(kind: UnaryKind, x: f64) -> f64 {
    match kind {
        UnaryKind::Round => {
            let f = x.floor();
            let d = x - f;
            if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) { f + 1.0 } else if x.is_finite() { f.copysign(x) } else { x }
        }
        UnaryKind::Tan => x.sin() / x.cos(),
        UnaryKind::Asin => x.asin(),
        UnaryKind::Acos => x.acos(),
        UnaryKind::Atan => x.atan(),
        UnaryKind::Sinh => (x.exp() - (-x).exp()) / 2.0,
        UnaryKind::Cosh => (x.exp() + (-x).exp()) / 2.0,
        UnaryKind::Asinh => x.signum() * (x.abs() + (x * x + 1.0).sqrt()).ln(),
        UnaryKind::Acosh => (x + (x * x - 1.0).sqrt()).ln(),
        UnaryKind::Atanh => 0.5 * ((1.0 + x) / (1.0 - x)).ln(),
        UnaryKind::Mish => x * (1.0 + x.exp()).ln().tanh(),
        UnaryKind::Celu { alpha } => {
            let a = alpha as f64;
            x.max(0.0) + (a * ((x / a).exp() - 1.0)).min(0.0)
        }
        UnaryKind::ThresholdedRelu { alpha } => if x > alpha as f64 { x } else { 0.0 },
        UnaryKind::Shrink { bias, lambd } => {
            if x < -lambd as f64 { x + bias as f64 } else if x > lambd as f64 { x - bias as f64 } else { 0.0 }
        }
        UnaryKind::Swish { alpha } => x * (1.0 / (1.0 + (-(alpha as f64) * x).exp())),
        UnaryKind::Gelu { tanh: false } => 0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt())),
        UnaryKind::Gelu { tanh: true } => {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }
        UnaryKind::Sin => x.sin(),
        UnaryKind::Cos => x.cos(),
        k => panic!("no reference for {k:?}"),
    }
}

#[test]
fn new_kinds_match_the_reference_in_f32_f64_and_f16() {
    let kinds = [
        UnaryKind::Round,
        UnaryKind::Tan,
        UnaryKind::Asin,
        UnaryKind::Acos,
        UnaryKind::Atan,
        UnaryKind::Sinh,
        UnaryKind::Cosh,
        UnaryKind::Asinh,
        UnaryKind::Acosh,
        UnaryKind::Atanh,
        UnaryKind::Mish,
        UnaryKind::Celu { alpha: 2.0 },
        UnaryKind::ThresholdedRelu { alpha: 0.7 },
        UnaryKind::Shrink { bias: 1.5, lambd: 1.0 },
        UnaryKind::Swish { alpha: 1.3 },
        UnaryKind::Gelu { tanh: false },
        UnaryKind::Gelu { tanh: true },
        UnaryKind::Sin,
        UnaryKind::Cos,
    ];
    // Halves (round to even), negative zero, domain edges and values outside them.
    let mut xs: Vec<f64> = (0..41).map(|i| (i as f64 - 20.0) * 0.25).collect();
    xs.extend([-0.0, 0.5, 1.5, 2.5, -2.5, -0.5, 0.999, -0.999, 1.0, -1.0, 30.0, -30.0, 1e-5, -1e-5]);
    for kind in kinds {
        for dtype in [DType::F32, DType::F64, DType::F16] {
            let x = Tensor::from_f64(dtype, &[xs.len()], &xs).unwrap();
            let xq = x.to_f64_vec();
            let got = run_kind(kind, &x).to_f64_vec();
            let tol = match dtype {
                DType::F32 => 2e-6,
                DType::F64 => 1e-12,
                _ => 1e-3,
            };
            for (i, (&g, &v)) in got.iter().zip(&xq).enumerate() {
                // The reference rounded to the tensor's dtype (f16 overflows to inf).
                let w = Tensor::from_f64(dtype, &[1], &[reference(kind, v)]).unwrap().to_f64_vec()[0];
                let ok = (w.is_nan() && g.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1.0);
                assert!(ok, "{kind:?} {dtype} x[{i}] = {v}: got {g}, expected {w}");
            }
        }
    }
    // Special values.
    let sp = Tensor::from_slice(&[4], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0]).unwrap();
    let r = run_kind(UnaryKind::Round, &sp);
    let r = r.as_slice::<f32>().unwrap();
    assert!(r[0].is_nan() && r[1] == f32::INFINITY && r[2] == f32::NEG_INFINITY && r[3] == 0.0 && r[3].is_sign_negative());
    let g = run_kind(UnaryKind::Gelu { tanh: false }, &sp);
    let g = g.as_slice::<f32>().unwrap();
    assert!(g[0].is_nan() && g[1] == f32::INFINITY);
    let m = run_kind(UnaryKind::Mish, &Tensor::from_slice(&[2], &[100f32, -100.]).unwrap());
    assert_eq!(m.as_slice::<f32>().unwrap()[0], 100.0);
    assert!(m.as_slice::<f32>().unwrap()[1].abs() < 1e-30);
}

#[test]
fn shrink_on_integers_and_attribute_errors() {
    let x = Tensor::from_slice(&[5], &[-3i32, -1, 0, 1, 3]).unwrap();
    let y = run_kind(UnaryKind::Shrink { bias: 1.0, lambd: 1.5 }, &x);
    assert_eq!(y.as_slice::<i32>().unwrap(), &[-2, 0, 0, 0, 2]);
    let u = Tensor::from_slice(&[3], &[0u8, 2, 200]).unwrap();
    let y = run_kind(UnaryKind::Shrink { bias: 2.0, lambd: 1.0 }, &u);
    assert_eq!(y.as_slice::<u8>().unwrap(), &[0, 0, 198]);
    let make_spec = |op: &str, attrs: &[(&str, kiln_graph::Attr)]| {
        let node = Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            inputs: vec![Some(0)],
            outputs: vec![1],
        };
        Registry::builtin().create(&NodeSpec::new(&node, 20)).map(|_| ())
    };
    assert!(make_spec("Gelu", &[("approximate", kiln_graph::Attr::String("erf".into()))]).is_err());
    assert!(make_spec("Gelu", &[("approximate", kiln_graph::Attr::String("tanh".into()))]).is_ok());
    assert!(make_spec("Celu", &[("alpha", kiln_graph::Attr::Float(0.0))]).is_err());
    let gelu = make("Gelu", &[]);
    let ty = TensorType::new(DType::I32, vec![2]);
    assert!(gelu.infer(&[Some(Arg { ty: &ty, value: None })]).is_err(), "Gelu on int32");
    assert!(make("Round", &[]).infer(&[Some(Arg { ty: &ty, value: None })]).is_err(), "Round on int32");
    let f = TensorType::new(DType::F32, vec![2]);
    let two = [Some(Arg { ty: &f, value: None }), Some(Arg { ty: &f, value: None })];
    assert!(make("Acos", &[]).infer(&two).is_err(), "Acos with two inputs");
    assert!(make("Clip", &[]).infer(&two).is_ok());
}
