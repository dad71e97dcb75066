//! NaN propagation on every device (the CPU and each GPU adapter), against values
//! computed by onnxruntime 1.32 (CPU provider) where it is consistent, and numpy's
//! semantics (NaN wins) for the max-based pooling and reductions, where onnxruntime's
//! result depends on the NaN's position in the window (ONNX's reference evaluator
//! and numpy propagate it): every max/min/clamp-based kernel, alone and fused.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};
use kiln_ops::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use kiln_ops::elementwise::{BinaryKind, UnaryKind};
use kiln_ops::fused::{FusedElementwise, Instr};

const NAN: f64 = f64::NAN;

/// Runs `case` on every device; each output must be NaN exactly where `want` is and
/// within `tol` (relative to max(1, |want|)) elsewhere. Failures are collected over
/// all devices and cases of a test, then reported together.
fn expect(failures: &mut Vec<String>, case: Case, want: &[f64], tol: f64) {
    for d in devices() {
        let (g, feeds) = case.graph();
        let got = match d.run(g, &feeds) {
            Ok(out) => out[0].to_f64_vec(),
            Err(e) => {
                failures.push(format!("{case} on {}: {e}", d.label));
                continue;
            }
        };
        if got.len() != want.len() {
            failures.push(format!("{case} on {}: {} values, expected {}", d.label, got.len(), want.len()));
            continue;
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let ok = if w.is_nan() { g.is_nan() } else { !g.is_nan() && (g - w).abs() <= tol * w.abs().max(1.0) };
            if !ok {
                failures.push(format!("{case} on {}: element {i} is {g}, expected {w}", d.label));
            }
        }
    }
}

fn finish(failures: Vec<String>) {
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}

fn x() -> Tensor {
    Tensor::from_slice(&[6], &[f32::NAN, -1.0, 0.0, 2.0, -3.5, 0.25]).unwrap()
}

#[test]
fn unary_ops_propagate_nan_as_onnxruntime() {
    // onnxruntime's outputs for x (ThresholdedRelu and Shrink map NaN to 0: their
    // formulas compare x, and a comparison with NaN is false).
    let table: &[(&str, [f64; 6])] = &[
        ("Relu", [NAN, 0.0, 0.0, 2.0, 0.0, 0.25]),
        ("LeakyRelu", [NAN, -0.009999999776482582, 0.0, 2.0, -0.03500000014901161, 0.25]),
        ("Elu", [NAN, -0.6321205496788025, 0.0, 2.0, -0.9698026180267334, 0.25]),
        ("Selu", [NAN, -1.1113307476043701, 0.0, 2.1014020442962646, -1.7050093412399292, 0.2626752555370331]),
        ("Celu", [NAN, -0.6321205496788025, 0.0, 2.0, -0.9698026180267334, 0.25]),
        ("ThresholdedRelu", [0.0, 0.0, 0.0, 2.0, 0.0, 0.0]),
        ("HardSigmoid", [NAN, 0.30000001192092896, 0.5, 0.8999999761581421, 0.0, 0.550000011920929]),
        ("HardSwish", [NAN, -0.3333333134651184, 0.0, 1.6666667461395264, -0.0, 0.1354166716337204]),
        ("Sigmoid", [NAN, 0.2689414322376251, 0.5, 0.8807970881462097, 0.029312193393707275, 0.5621764659881592]),
        ("Tanh", [NAN, -0.7615941762924194, 0.0, 0.9640275835990906, -0.9981779456138611, 0.24491865932941437]),
        ("Softplus", [NAN, 0.3132616877555847, 0.6931471824645996, 2.1269280910491943, 0.029750417917966843, 0.825939416885376]),
        ("Softsign", [NAN, -0.5, 0.0, 0.6666666865348816, -0.7777777910232544, 0.20000000298023224]),
        ("Shrink", [0.0, -1.0, 0.0, 2.0, -3.5, 0.0]),
        ("Gelu", [NAN, -0.15865525603294373, 0.0, 1.9544997215270996, -0.0008142292499542236, 0.14967657625675201]),
        ("Mish", [NAN, -0.3034014403820038, 0.0, 1.9439589977264404, -0.10409574210643768, 0.16957241296768188]),
        ("Sign", [NAN, -1.0, 0.0, 1.0, -1.0, 1.0]),
        ("Abs", [NAN, 1.0, 0.0, 2.0, 3.5, 0.25]),
        ("Neg", [NAN, 1.0, -0.0, -2.0, 3.5, -0.25]),
        ("Erf", [NAN, -0.8427007794380188, 0.0, 0.9953222870826721, -0.9999992847442627, 0.27632638812065125]),
        ("Exp", [NAN, 0.3678794503211975, 1.0, 7.389056205749512, 0.03019738383591175, 1.2840254306793213]),
        ("Floor", [NAN, -1.0, 0.0, 2.0, -4.0, 0.0]),
    ];
    let mut f = vec![];
    for (op, want) in table {
        expect(&mut f, Case::new(op).opset(22).input(x()), want, 2e-5);
    }
    let gelu_tanh = [NAN, -0.15880796313285828, 0.0, 1.9545977115631104, -0.0006161481142044067, 0.14967535436153412];
    expect(&mut f, Case::new("Gelu").opset(22).input(x()).attr("approximate", Attr::String("tanh".into())), &gelu_tanh, 2e-5);
    // Clip: constant bounds, run-time bounds, attribute bounds; a NaN bound is ignored.
    let clipped = [NAN, -0.5, 0.0, 1.0, -0.5, 0.25];
    let (lo, hi) = (Tensor::scalar(-0.5f32), Tensor::scalar(1.0f32));
    expect(&mut f, Case::new("Clip").opset(13).input(x()).constant(lo.clone()).constant(hi.clone()), &clipped, 0.0);
    expect(&mut f, Case::new("Clip").opset(13).input(x()).input(lo).input(hi), &clipped, 0.0);
    let attrs = [("min", Attr::Float(-0.5)), ("max", Attr::Float(1.0))];
    expect(&mut f, Case::new("Clip").opset(6).input(x()).attrs(&attrs), &clipped, 0.0);
    let y = Tensor::from_slice(&[3], &[0f32, 5.0, -5.0]).unwrap();
    expect(&mut f, Case::new("Clip").opset(13).input(y).constant(Tensor::scalar(f32::NAN)).constant(Tensor::scalar(1f32)), &[0.0, 1.0, -5.0], 0.0);
    finish(f);
}

#[test]
fn max_and_min_propagate_nan() {
    let a = Tensor::from_slice(&[4], &[f32::NAN, 1.0, f32::NAN, -1.0]).unwrap();
    let b = Tensor::from_slice(&[4], &[1f32, f32::NAN, f32::NAN, 2.0]).unwrap();
    let mut f = vec![];
    expect(&mut f, Case::new("Max").opset(13).input(a.clone()).input(b.clone()), &[NAN, NAN, NAN, 2.0], 0.0);
    expect(&mut f, Case::new("Min").opset(13).input(a.clone()).input(b.clone()), &[NAN, NAN, NAN, -1.0], 0.0);
    expect(&mut f, Case::new("Max").opset(13).input(a.clone()).input(b.clone()).input(b.clone()), &[NAN, NAN, NAN, 2.0], 0.0);
    // Fused: relu(max(a, b)) and min(a, b) as one kiln.FusedElementwise kernel.
    let instrs = [Instr::Binary(BinaryKind::Max, 0, 1), Instr::Unary(UnaryKind::Relu, 2), Instr::Binary(BinaryKind::Min, 3, 1)];
    let mut fused = Case::new("FusedElementwise").domain("kiln").input(a).input(b);
    for (name, value) in FusedElementwise::attrs(&instrs) {
        fused = fused.attr(&name, value);
    }
    expect(&mut f, fused, &[NAN, NAN, NAN, 2.0], 0.0);
    finish(f);
}

/// A 1x1x4x4 ramp 0..16 with NaN at the given positions.
fn ramp_with_nan(at: &[usize]) -> Tensor {
    let mut v: Vec<f32> = (0..16).map(|i| i as f32).collect();
    for &i in at {
        v[i] = f32::NAN;
    }
    Tensor::from_slice(&[1, 1, 4, 4], &v).unwrap()
}

#[test]
fn max_pooling_and_reductions_propagate_nan() {
    let mut f = vec![];
    let k2 = [("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))];
    // NaN first in its window, in the middle, and last: the window is NaN every time.
    for (at, want) in [(0, [NAN, 7.0, 13.0, 15.0]), (1, [NAN, 7.0, 13.0, 15.0]), (15, [5.0, 7.0, 13.0, NAN])] {
        expect(&mut f, Case::new("MaxPool").opset(12).input(ramp_with_nan(&[at])).attrs(&k2), &want, 0.0);
        // With the Indices output (the non-separable CPU path).
        expect(&mut f, Case::new("MaxPool").opset(12).input(ramp_with_nan(&[at])).attrs(&k2).outputs(2), &want, 0.0);
    }
    // 3-wide windows, stride 1 (the unrolled separable row path).
    let k3 = [("kernel_shape", Attr::Ints(vec![1, 3])), ("strides", Attr::Ints(vec![1, 1]))];
    let want = [NAN, NAN, 6.0, 7.0, 10.0, 11.0, 14.0, 15.0];
    expect(&mut f, Case::new("MaxPool").opset(12).input(ramp_with_nan(&[1])).attrs(&k3), &want, 0.0);
    let two_planes = Tensor::from_slice(&[1, 2, 2, 2], &[1f32, f32::NAN, 3.0, 2.0, 1.0, 4.0, 3.0, 2.0]).unwrap();
    expect(&mut f, Case::new("GlobalMaxPool").input(two_planes), &[NAN, 4.0], 0.0);
    // A plane large enough for the GPU's multi-lane kernel.
    let mut big: Vec<f32> = (0..5000).map(|i| (i % 97) as f32).collect();
    big[4321] = f32::NAN;
    let big = Tensor::from_slice(&[1, 1, 5000], &big).unwrap();
    expect(&mut f, Case::new("GlobalMaxPool").input(big.clone()), &[NAN], 0.0);
    let rows = Tensor::from_slice(&[4, 4], ramp_with_nan(&[1]).as_slice::<f32>().unwrap()).unwrap();
    let axis1 = Tensor::from_slice(&[1], &[1i64]).unwrap();
    for (op, want) in [("ReduceMax", [NAN, 7.0, 11.0, 15.0]), ("ReduceMin", [NAN, 4.0, 8.0, 12.0])] {
        expect(&mut f, Case::new(op).opset(18).input(rows.clone()).constant(axis1.clone()).attr("keepdims", Attr::Int(0)), &want, 0.0);
        expect(&mut f, Case::new(op).opset(18).input(big.clone()).attr("keepdims", Attr::Int(0)), &[NAN], 0.0);
    }
    finish(f);
}

#[test]
fn fused_epilogue_activations_propagate_nan() {
    let mut f = vec![];
    // MatMul [2, 3] x [3, 4]: row 0 reads a NaN, row 1 is finite (and negative).
    let a = Tensor::from_slice(&[2, 3], &[f32::NAN, 1.0, 2.0, -1.0, -2.0, -3.0]).unwrap();
    let b = Tensor::from_slice(&[3, 4], &[1f32, 2.0, 3.0, 4.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]).unwrap();
    let row1 = [-4.5, -5.5, -6.5, -7.5];
    for (act, params, lo) in [("Relu", vec![], 0.0), ("Clip", vec![-6.0f32, 6.0], -6.0), ("HardSigmoid", vec![0.2, 0.5], 0.0)] {
        let case = Case::new("MatMul")
            .opset(13)
            .input(a.clone())
            .constant(b.clone())
            .attr(ACTIVATION_ATTR, Attr::String(act.into()))
            .attr(ACTIVATION_PARAMS_ATTR, Attr::Floats(params.clone()));
        let mut want = vec![NAN; 4];
        want.extend(row1.iter().map(|&v: &f64| if act == "HardSigmoid" { (0.2 * v + 0.5f64).clamp(0.0, 1.0) } else { v.max(lo) }));
        expect(&mut f, case, &want, 1e-6);
    }
    // Conv 1x1 over 24 pixels (the register-blocked small-reduction kernel, 16 + 8 wide)
    // and a depthwise 3x3 (nine-tap kernel), each with Relu then Clip fused.
    let mut xs: Vec<f32> = (0..48).map(|i| (i as f32 - 24.0) * 0.5).collect();
    for p in [0, 17, 23] {
        xs[p] = f32::NAN;
    }
    let x = Tensor::from_slice(&[1, 2, 4, 6], &xs).unwrap();
    let w1 = Tensor::from_slice(&[3, 2, 1, 1], &[1f32, 0.0, 0.5, 0.5, -1.0, 0.0]).unwrap();
    let w3 = Tensor::from_slice(&[2, 1, 3, 3], &[1f32 / 9.0; 18]).unwrap();
    let dw = [("group", Attr::Int(2)), ("pads", Attr::Ints(vec![1, 1, 1, 1]))];
    for (act, params) in [("Relu", vec![]), ("Clip", vec![-1.0f32, 2.0])] {
        for (w, attrs) in [(&w1, &[][..]), (&w3, &dw[..])] {
            let plain = Case::new("Conv").opset(11).input(x.clone()).constant(w.clone()).attrs(attrs);
            let want: Vec<f64> = plain.run_cpu().unwrap()[0]
                .to_f64_vec()
                .iter()
                .map(|&v| if act == "Relu" { if v < 0.0 { 0.0 } else { v } } else if v.is_nan() { v } else { v.clamp(-1.0, 2.0) })
                .collect();
            assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| !v.is_nan()));
            let case = plain.attr(ACTIVATION_ATTR, Attr::String(act.into())).attr(ACTIVATION_PARAMS_ATTR, Attr::Floats(params.clone()));
            expect(&mut f, case, &want, 1e-5);
        }
    }
    finish(f);
}
