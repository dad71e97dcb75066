//! Tests of Conv with a fused residual (`kiln_residual`, input 3): every CPU path
//! (pointwise and im2col small-reduction kernels, serial and GEMM-parallel im2col +
//! GEMM, depthwise 2-D and 3-D, f64 and f16) against an f64 reference of
//! `act(conv + bias + residual)`, running in place of the residual, WGSL validation,
//! and the errors for a missing or misshapen residual.
use crate::testing::{assert_close, as_inputs, ints, make, rand_f32, run, tune};
use super::tests::{activate, activations, reference};
use crate::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use crate::linalg::RESIDUAL_ATTR;
use crate::{Arg, TensorType};
use kiln_graph::{Attr, DType, Tensor};

/// x dims, w dims, group, strides, pads.
type Case = (Vec<usize>, Vec<usize>, usize, Vec<usize>, Vec<i64>);

/// Cases covering every f32 path of `conv_cpu::conv_f32`.
fn cases() -> Vec<Case> {
    vec![
        (vec![2, 16, 37, 41], vec![24, 16, 1, 1], 1, vec![1, 1], vec![0; 4]), // pointwise, small k
        (vec![1, 3, 13, 11], vec![5, 3, 3, 3], 1, vec![1, 1], vec![1; 4]),    // im2col, small k
        (vec![2, 8, 33, 35], vec![16, 8, 3, 3], 1, vec![1, 1], vec![1; 4]),   // im2col + GEMM tiles
        (vec![1, 64, 9, 9], vec![128, 64, 3, 3], 1, vec![1, 1], vec![1; 4]),  // one tile, parallel GEMM
        (vec![1, 64, 15, 15], vec![96, 64, 1, 1], 1, vec![2, 2], vec![0; 4]), // strided 1x1 (resnet downsample)
        (vec![2, 48, 31, 29], vec![40, 48, 1, 1], 1, vec![1, 1], vec![0; 4]), // pointwise GEMM
        (vec![1, 32, 9, 9], vec![64, 16, 3, 3], 2, vec![1, 1], vec![1; 4]),   // grouped
        (vec![2, 3, 9, 11], vec![3, 1, 3, 3], 3, vec![2, 2], vec![1; 4]),     // depthwise 3x3, phases
        (vec![1, 5, 7, 7], vec![10, 1, 5, 5], 5, vec![1, 1], vec![2; 4]),     // depthwise 5x5, multiplier 2
        (vec![1, 3, 4, 5, 6], vec![3, 1, 3, 3, 3], 3, vec![1, 1, 2], vec![1; 6]), // depthwise 3-D
        (vec![1, 3, 17], vec![4, 3, 3], 1, vec![2], vec![1, 2]),               // 1-D
    ]
}

fn attrs_of(group: usize, strides: &[usize], pads: &[i64]) -> Vec<(&'static str, Attr)> {
    let strides: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    vec![("group", Attr::Int(group as i64)), ("strides", ints(&strides)), ("pads", ints(pads)), (RESIDUAL_ATTR, Attr::Int(1))]
}

#[test]
fn residual_and_activation_match_the_f64_reference_on_every_path() {
    let acts: Vec<_> = activations().into_iter().filter(|(n, _, _)| ["Relu", "Clip", "HardSwish", "Sigmoid"].contains(n)).collect();
    for (xd, wd, group, strides, pads) in cases() {
        let nsp = xd.len() - 2;
        let (x, w, b) = (rand_f32(&xd, 31), rand_f32(&wd, 32), rand_f32(&[wd[0]], 33));
        for with_bias in [true, false] {
            let bias = with_bias.then_some(&b);
            let out_sp: Vec<usize> = (0..nsp)
                .map(|d| ((xd[2 + d] as i64 + pads[d] + pads[nsp + d] - wd[2 + d] as i64) / strides[d] as i64 + 1) as usize)
                .collect();
            let mut ydims = vec![xd[0], wd[0]];
            ydims.extend(&out_sp);
            let r = rand_f32(&ydims, 34);
            let conv = reference(&x, &w, bias, group, &strides, &vec![1; nsp], &pads[..nsp], &out_sp);
            let sum: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(c, r)| c + r).collect();
            let what = format!("x{xd:?} w{wd:?} g{group} bias {with_bias}");
            let b_in = if with_bias { Some(&b) } else { None };
            let inputs = [Some(&x), Some(&w), b_in, Some(&r)];
            let tunes = [tune(&[("oc_block", 3), ("px_block", 2)]), tune(&[("oc_block", 1), ("px_block", 8), ("workgroup", 32)])];
            let op = make("Conv", 19, &attrs_of(group, &strides, &pads), 4, 1).unwrap();
            let got = run(op.as_ref(), &as_inputs(&inputs, &[]), &tunes).unwrap().remove(0);
            assert_close(&got, &sum, 1e-5, &what);
            let sum_f32 = Tensor::from_vec(&ydims, sum.iter().map(|&v| v as f32).collect()).unwrap();
            for (name, act_attrs, params) in &acts {
                let want = activate(name, act_attrs, &sum_f32).to_f64_vec();
                let mut attrs = attrs_of(group, &strides, &pads);
                attrs.push((ACTIVATION_ATTR, Attr::String(name.to_string())));
                attrs.push((ACTIVATION_PARAMS_ATTR, Attr::Floats(params.clone())));
                let op = make("Conv", 19, &attrs, 4, 1).unwrap();
                let got = run(op.as_ref(), &as_inputs(&inputs, &[]), &tunes).unwrap().remove(0);
                assert_close(&got, &want, 1e-5, &format!("{name} {what}"));
                // In place: the output starts as the residual, input 3 is gone.
                let kernel = op.cpu().unwrap();
                let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
                let refs: Vec<Option<&TensorType>> = types.iter().map(|t| t.as_ref()).collect();
                assert_eq!(kernel.in_place_inputs(&refs, &TensorType::new(DType::F32, ydims.clone())), vec![3]);
                let mut outs = vec![r.clone()];
                kernel.run_in_place(&[Some(&x), Some(&w), b_in, None], 3, &mut outs).unwrap();
                assert_close(&outs[0], &want, 1e-5, &format!("in place {name} {what}"));
            }
        }
    }
}

#[test]
fn residual_in_wgsl_is_added_before_the_activation() {
    let (x, w) = (TensorType::new(DType::F32, [1usize, 2, 5, 5]), TensorType::new(DType::F32, [3usize, 2, 3, 3]));
    let r = TensorType::new(DType::F32, [1usize, 3, 5, 5]);
    let attrs = [
        ("pads", ints(&[1, 1, 1, 1])),
        (RESIDUAL_ATTR, Attr::Int(1)),
        (ACTIVATION_ATTR, Attr::String("Relu".into())),
        (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![])),
    ];
    let op = make("Conv", 19, &attrs, 4, 1).unwrap();
    let args = [Some(Arg { ty: &x, value: None }), Some(Arg { ty: &w, value: None }), None, Some(Arg { ty: &r, value: None })];
    let outs = op.infer(&args).unwrap();
    assert_eq!(outs[0], r);
    let prog = op.wgsl().unwrap().generate(&args, &outs, &Default::default()).unwrap();
    let d = &prog.dispatches[0];
    assert!(d.source.contains("= kiln_act(acc0_0 + bias + res[ybase + 0u])"), "{}", d.source);
    assert_eq!(d.bindings, [crate::wgsl::Binding::Input(0), crate::wgsl::Binding::Input(1), crate::wgsl::Binding::Input(3), crate::wgsl::Binding::Output(0)]);
    crate::wgsl::testing::validate(&d.source);
}

#[test]
fn f64_and_f16_add_the_residual_before_the_activation() {
    let (xd, wd, yd) = ([2usize, 3, 6, 6], [4usize, 3, 3, 3], [2usize, 4, 6, 6]);
    let (x, w, r) = (rand_f32(&xd, 41), rand_f32(&wd, 42), rand_f32(&yd, 43));
    let conv = reference(&x, &w, None, 1, &[1, 1], &[1, 1], &[1, 1], &[6, 6]);
    let want: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(c, r)| (c + r).max(0.0)).collect();
    assert!(want.contains(&0.0) && want.iter().any(|&v| v > 0.5));
    let attrs = [
        ("pads", ints(&[1, 1, 1, 1])),
        (RESIDUAL_ATTR, Attr::Int(1)),
        (ACTIVATION_ATTR, Attr::String("Relu".into())),
        (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![])),
    ];
    let op = make("Conv", 19, &attrs, 4, 1).unwrap();
    let as64 = |t: &Tensor| Tensor::from_vec(t.dims(), t.to_f64_vec()).unwrap();
    let y = run(op.as_ref(), &as_inputs(&[Some(&as64(&x)), Some(&as64(&w)), None, Some(&as64(&r))], &[]), &[]).unwrap().remove(0);
    for (g, w) in y.to_f64_vec().iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "f64: {g} vs {w}");
    }
    let as16 = |t: &Tensor| Tensor::from_vec(t.dims(), t.to_f64_vec().iter().map(|&v| half::f16::from_f64(v)).collect()).unwrap();
    let (x16, w16, r16) = (as16(&x), as16(&w), as16(&r));
    let conv = reference(&x16, &w16, None, 1, &[1, 1], &[1, 1], &[1, 1], &[6, 6]);
    let want: Vec<f64> = conv.iter().zip(r16.to_f64_vec()).map(|(c, r)| (c + r).max(0.0)).collect();
    let y = run(op.as_ref(), &as_inputs(&[Some(&x16), Some(&w16), None, Some(&r16)], &[]), &[]).unwrap().remove(0);
    assert_eq!(y.dtype(), DType::F16);
    for (g, w) in y.to_f64_vec().iter().zip(&want) {
        assert!((g - w).abs() < 4e-3 * w.abs().max(1.0), "f16: {g} vs {w}");
    }
}

#[test]
fn a_missing_or_misshapen_residual_is_refused() {
    let (x, w) = (rand_f32(&[1, 2, 5, 5], 1), rand_f32(&[3, 2, 3, 3], 2));
    let on = [(RESIDUAL_ATTR, Attr::Int(1))];
    // The attribute without input 3, input 3 without the attribute.
    let err = make("Conv", 19, &on, 2, 1).unwrap_err().to_string();
    assert!(err.contains(RESIDUAL_ATTR), "{err}");
    let err = make("Conv", 19, &[], 4, 1).unwrap_err().to_string();
    assert!(err.contains("input 3"), "{err}");
    let op = make("Conv", 19, &on, 4, 1).unwrap();
    for bad in [rand_f32(&[1, 3, 5, 5], 3), rand_f32(&[1, 3, 9], 3), rand_f32(&[3, 3, 3], 3)] {
        let err = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w), None, Some(&bad)], &[]), &[]).unwrap_err().to_string();
        assert!(err.contains("residual") && err.contains("[1, 3, 3, 3]"), "{err}");
    }
    let r64 = Tensor::from_vec(&[1, 3, 3, 3], vec![0f64; 27]).unwrap();
    let err = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w), None, Some(&r64)], &[]), &[]).unwrap_err().to_string();
    assert!(err.contains("residual") && err.contains("f64"), "{err}");
}
