//! Unit tests of the binary ops: every kind of the table on every element class against
//! its f64 reference (`apply_f64`), WGSL validated by naga, and the semantics the table
//! must keep (NaN, integer division by zero, dtypes, variadic folding, broadcasting).
use super::*;
use crate::testing::{assert_close, bools, f32s, first, i64s, run_data};

fn run(kind: BinaryKind, inputs: &[&Tensor]) -> Result<Tensor> {
    run_data(&Binary { kind }, inputs, &[]).map(first)
}

/// `kind` over `a` and `b` (dims `[2, 3]` and `[3]`: a broadcast) against `apply_f64`.
fn check_reference(kind: BinaryKind, dtype: DType, a: &[f64], b: &[f64]) {
    let (ta, tb) = (Tensor::from_f64(dtype, &[2, 3], a).unwrap(), Tensor::from_f64(dtype, &[3], b).unwrap());
    let got = run(kind, &[&ta, &tb]).unwrap_or_else(|e| panic!("{kind:?} {dtype}: {e}"));
    assert_eq!(got.dtype(), kind.out_dtype(dtype), "{kind:?} {dtype}");
    let (av, bv) = (ta.to_f64_vec(), tb.to_f64_vec());
    let want: Vec<f64> = (0..6)
        .map(|i| {
            let v = kind.apply_f64(av[i], bv[i % 3]);
            let v = if kind.averages() { v / 2.0 } else { v };
            if dtype.is_int() && kind.nonzero_divisor() { v.trunc() } else { v }
        })
        .collect();
    let want = Tensor::from_f64(got.dtype(), &[2, 3], &want).unwrap().to_f64_vec();
    assert_close(&got, &want, if dtype == DType::F32 { 1e-6 } else { 1e-12 }, &format!("{kind:?} {dtype}"));
}

#[test]
fn every_kind_matches_its_reference_on_every_class() {
    let a = [-7.0, -2.0, 0.0, 1.0, 3.0, 8.0];
    let b = [2.0, 3.0, 1.0];
    for kind in BinaryKind::ALL {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool] {
            if !kind.dtypes().contains(&dtype) {
                continue;
            }
            let (a, b) = if dtype == DType::U8 || dtype == DType::Bool { (a.map(f64::abs), b) } else { (a, b) };
            check_reference(kind, dtype, &a, &b);
        }
    }
}

#[test]
fn table_is_consistent() {
    let reg = crate::Registry::builtin();
    for (i, kind) in BinaryKind::ALL.into_iter().enumerate() {
        assert_eq!(BinaryKind::from_name(kind.op_name()), Some(kind));
        assert!(BinaryKind::ALL[..i].iter().all(|k| k.op_name() != kind.op_name()));
        assert!(reg.op_types().any(|(d, o)| d.is_empty() && o == kind.op_name()), "{kind:?} not registered");
        // The fused program is f32 in, f32 out.
        assert!(!kind.fusible() || (!kind.bool_output() && kind.dtypes().contains(&DType::F32)));
    }
    assert_eq!(BinaryKind::from_name("Mod"), None);
}

#[test]
fn broadcast_add_and_compare() {
    let a = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32s(&[3], &[10., 20., 30.]);
    assert_eq!(run(BinaryKind::Add, &[&a, &b]).unwrap().as_slice::<f32>().unwrap(), &[11., 22., 33., 14., 25., 36.]);
    let lt = run(BinaryKind::Less, &[&a, &f32s(&[2, 1], &[2., 5.])]).unwrap();
    assert_eq!(lt.dtype(), DType::Bool);
    assert_eq!(lt.as_slice::<u8>().unwrap(), &[1, 0, 0, 1, 0, 0]);
    // Pow's exponent may have another dtype; small constant exponents take a shortcut.
    let p = run(BinaryKind::Pow, &[&f32s(&[2], &[-2., 3.]), &Tensor::scalar(3i64)]).unwrap();
    assert_eq!(p.as_slice::<f32>().unwrap(), &[-8., 27.]);
    let p = run(BinaryKind::Pow, &[&f32s(&[2], &[-2., 3.]), &f32s(&[2], &[2., 0.5])]).unwrap();
    assert_eq!(p.as_slice::<f32>().unwrap(), &[4., 3f32.sqrt()]);
}

#[test]
fn integer_division_by_zero_is_an_error() {
    for dtype in [DType::I64, DType::I32, DType::I16, DType::U8] {
        let a = Tensor::from_f64(dtype, &[2], &[4., 2.]).unwrap();
        let b = Tensor::from_f64(dtype, &[2], &[2., 0.]).unwrap();
        assert!(run(BinaryKind::Div, &[&a, &b]).unwrap_err().to_string().contains("division by zero"), "{dtype}");
    }
    // Floats divide by zero to inf; a shape mismatch is an inference error.
    let q = run(BinaryKind::Div, &[&f32s(&[2], &[1., -1.]), &f32s(&[2], &[0., 0.])]).unwrap();
    assert_eq!(q.as_slice::<f32>().unwrap(), &[f32::INFINITY, f32::NEG_INFINITY]);
    assert!(run(BinaryKind::Add, &[&f32s(&[2, 3], &[0.; 6]), &f32s(&[4], &[0.; 4])]).is_err());
}

#[test]
fn integers_wrap_and_truncate() {
    let a = i64s(&[4], &[i64::MAX, -7, 7, i64::MIN]);
    let b = i64s(&[4], &[1, 2, -2, -1]);
    assert_eq!(run(BinaryKind::Add, &[&a, &b]).unwrap().as_slice::<i64>().unwrap(), &[i64::MIN, -5, 5, i64::MAX]);
    assert_eq!(run(BinaryKind::Div, &[&a, &b]).unwrap().as_slice::<i64>().unwrap(), &[i64::MAX, -3, -3, i64::MIN]);
    let a32 = Tensor::from_slice(&[3], &[i32::MAX, 3, 2]).unwrap();
    let b32 = Tensor::from_slice(&[3], &[1i32, -1, 40]).unwrap();
    assert_eq!(run(BinaryKind::Add, &[&a32, &b32]).unwrap().as_slice::<i32>().unwrap(), &[i32::MIN, 2, 42]);
    assert_eq!(run(BinaryKind::Pow, &[&a32, &b32]).unwrap().as_slice::<i32>().unwrap(), &[i32::MAX, 0, 0]);
    // Comparisons of i64 are exact beyond 2^53.
    let big = i64s(&[1], &[(1 << 53) + 1]);
    let eq = run(BinaryKind::Equal, &[&big, &i64s(&[1], &[1 << 53])]).unwrap();
    assert_eq!(eq.as_slice::<u8>().unwrap(), &[0]);
}

#[test]
fn max_min_propagate_nan_as_the_canonical_nan() {
    let neg_nan = f32::from_bits(0xffc0_0001);
    let a = f32s(&[4], &[neg_nan, 1., f32::NAN, 2.]);
    let b = f32s(&[4], &[1., neg_nan, f32::NAN, -1.]);
    for (kind, last) in [(BinaryKind::Max, 2f32), (BinaryKind::Min, -1.)] {
        let got = run(kind, &[&a, &b]).unwrap();
        let bits: Vec<u32> = got.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, [0x7fc0_0000, 0x7fc0_0000, 0x7fc0_0000, last.to_bits()], "{kind:?}");
        let mut out = [0f32; 4];
        kind.zip_f32(a.as_slice().unwrap(), b.as_slice().unwrap(), &mut out);
        assert_eq!(out.map(f32::to_bits), [0x7fc0_0000, 0x7fc0_0000, 0x7fc0_0000, last.to_bits()], "{kind:?} fused");
        let got = run(kind, &[&cast_f64(&a), &cast_f64(&b)]).unwrap();
        assert!(got.as_slice::<f64>().unwrap()[..3].iter().all(|v| v.is_nan()));
    }
}

fn cast_f64(t: &Tensor) -> Tensor {
    Tensor::from_f64(DType::F64, t.dims(), &t.to_f64_vec()).unwrap()
}

#[test]
fn fused_blocks_match_the_op() {
    let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.37 - 3.0).collect();
    let b: Vec<f32> = (0..19).map(|i| 1.5 - i as f32 * 0.21).collect();
    for kind in BinaryKind::ALL.into_iter().filter(|k| k.fusible()) {
        let mut out = [0f32; 19];
        kind.zip_f32(&a, &b, &mut out);
        let want = run(kind, &[&f32s(&[19], &a), &f32s(&[19], &b)]).unwrap();
        let want = want.as_slice::<f32>().unwrap();
        assert!(out.iter().zip(want).all(|(x, y)| x.to_bits() == y.to_bits()), "{kind:?}: {out:?} vs {want:?}");
    }
}

#[test]
fn dtypes_and_input_counts_are_checked() {
    let (f, t) = (f32s(&[2], &[1., 0.]), bools(&[2], &[true, false]));
    assert!(run(BinaryKind::And, &[&f, &f]).is_err());
    assert!(run(BinaryKind::Add, &[&t, &t]).is_err());
    assert!(run(BinaryKind::Add, &[&f, &i64s(&[2], &[1, 2])]).is_err());
    assert!(run(BinaryKind::Add, &[&f, &f, &f]).is_err());
    assert!(run(BinaryKind::Sub, &[&f]).is_err());
    assert_eq!(run(BinaryKind::Equal, &[&t, &bools(&[2], &[true, true])]).unwrap().as_slice::<u8>().unwrap(), &[1, 0]);
    assert_eq!(run(BinaryKind::Xor, &[&t, &bools(&[2], &[true, true])]).unwrap().as_slice::<u8>().unwrap(), &[0, 1]);
}

#[test]
fn variadic_ops_fold_with_broadcasting() {
    let (a, b, c) = (f32s(&[2, 1], &[1., 2.]), f32s(&[3], &[10., 20., 30.]), f32s(&[], &[100.]));
    assert_eq!(run(BinaryKind::Sum, &[&a, &b, &c]).unwrap().as_slice::<f32>().unwrap(), &[111., 121., 131., 112., 122., 132.]);
    assert_eq!(run(BinaryKind::Mean, &[&a, &b, &c]).unwrap().as_slice::<f32>().unwrap(), &[37., 121. / 3., 131. / 3., 112. / 3., 122. / 3., 44.]);
    assert_eq!(run(BinaryKind::Max, &[&a, &b, &c]).unwrap().as_slice::<f32>().unwrap(), &[100.; 6]);
    assert_eq!(run(BinaryKind::Min, &[&a]).unwrap().as_slice::<f32>().unwrap(), &[1., 2.]);
    let wide = i64s(&[2], &[5, 7]);
    assert_eq!(run(BinaryKind::Sum, &[&wide, &wide, &wide]).unwrap().as_slice::<i64>().unwrap(), &[15, 21]);
}

#[test]
fn wgsl_validates_for_every_kind_and_class() {
    // `run` validates the generated WGSL (incl. the i64 overflow-reporting kernels).
    let inputs = [
        (DType::F32, f32s(&[2, 3], &[1.; 6]), f32s(&[3], &[2.; 3])),
        (DType::I64, i64s(&[2, 3], &[1; 6]), i64s(&[3], &[2; 3])),
        (DType::I32, Tensor::from_slice(&[2], &[1i32, 2]).unwrap(), Tensor::from_slice(&[1], &[3i32]).unwrap()),
        (DType::U64, Tensor::from_slice(&[2], &[1u64, 2]).unwrap(), Tensor::from_slice(&[2], &[3u64, 1]).unwrap()),
        (DType::Bool, bools(&[2], &[true, false]), bools(&[1], &[true])),
    ];
    for kind in BinaryKind::ALL {
        for (dtype, a, b) in &inputs {
            if kind.dtypes().contains(dtype) {
                run(kind, &[a, b]).unwrap_or_else(|e| panic!("{kind:?} {dtype}: {e}"));
            }
        }
    }
}
