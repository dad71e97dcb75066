//! CPU vs GPU on the elementwise ops: odd sizes, broadcasting, size-1 dims, large dims.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn unary_ops_agree() {
    for op in ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "HardSwish", "Softplus", "Sin", "Floor"] {
        cross_check(op, &[In::Data(rand_f32(&[3, 67, 5], 3))], &[], 1, 17, 1e-5);
    }
    cross_check("LeakyRelu", &[In::Data(rand_f32(&[129], 1))], &[("alpha", Attr::Float(0.3))], 1, 17, 1e-6);
    cross_check("HardSigmoid", &[In::Data(rand_f32(&[1, 1, 131], 2))], &[("alpha", Attr::Float(0.3)), ("beta", Attr::Float(0.4))], 1, 17, 1e-6);
    cross_check("Clip", &[In::Data(rand_f32(&[70000], 4)), In::Const(Tensor::scalar(-0.5f32)), In::Const(Tensor::scalar(0.25f32))], &[], 1, 13, 0.0);
    cross_check("Clip", &[In::Data(rand_f32(&[33], 4)), In::Data(Tensor::scalar(-0.5f32)), In::None], &[], 1, 13, 0.0);
    let pos = Tensor::from_slice(&[7], &[0.5f32, 1.0, 2.0, 3.0, 0.1, 9.0, 4.0]).unwrap();
    for op in ["Sqrt", "Log", "Reciprocal"] {
        cross_check(op, &[In::Data(pos.clone())], &[], 1, 17, 1e-6);
    }
}

#[test]
fn binary_ops_agree_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 5] = [(&[3, 1, 5], &[4, 1]), (&[1], &[2, 3]), (&[7, 9], &[7, 9]), (&[2, 1, 1, 3], &[1, 5, 1]), (&[65537], &[1])];
    for (i, (a, b)) in shapes.iter().enumerate() {
        for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "Less", "Greater", "Equal"] {
            cross_check(op, &[In::Data(rand_f32(a, i as u64)), In::Data(rand_f32(b, 100 + i as u64))], &[], 1, 17, 1e-6);
        }
    }
    cross_check("Pow", &[In::Data(rand_f32(&[5, 3], 1)), In::Const(Tensor::scalar(2.0f32))], &[], 1, 17, 1e-6);
    cross_check("Pow", &[In::Data(rand_f32(&[5, 3], 1)), In::Data(Tensor::scalar(3i64))], &[], 1, 17, 1e-6);
    cross_check("Sum", &[In::Data(rand_f32(&[2, 3], 1)), In::Data(rand_f32(&[3], 2)), In::Data(rand_f32(&[2, 1], 3))], &[], 1, 17, 1e-6);
    cross_check("Mean", &[In::Data(rand_f32(&[2, 3], 1)), In::Data(rand_f32(&[3], 2))], &[], 1, 17, 1e-6);
    let ia = Tensor::from_slice(&[4], &[7i64, -9, 100, 3]).unwrap();
    let ib = Tensor::from_slice(&[4], &[2i64, 4, -7, 3]).unwrap();
    for op in ["Add", "Sub", "Mul", "Div", "Max", "Equal"] {
        cross_check(op, &[In::Data(ia.clone()), In::Data(ib.clone())], &[], 1, 17, 0.0);
    }
}

/// Like `cross_check`, for outputs with NaNs: element by element, NaN matching NaN,
/// within `tol` relative to max(1, |cpu|).
fn cross_check_nan(op: &str, inputs: &[In], attrs: &[(&str, Attr)], opset: i64, tol: f64) {
    gpu_env();
    let (g, feeds) = single_op(op, inputs, attrs, 1, opset);
    let cpu = run_on(kiln_runtime::DeviceChoice::Cpu, g.clone(), &feeds).unwrap_or_else(|e| panic!("{op} on the CPU: {e}"));
    let gpu = run_on(kiln_runtime::DeviceChoice::Gpu, g, &feeds).unwrap_or_else(|e| panic!("{op} on the GPU: {e}"));
    assert_eq!(cpu[0].dtype(), gpu[0].dtype(), "{op} dtype");
    assert_eq!(cpu[0].dims(), gpu[0].dims(), "{op} dims");
    for (i, (c, g)) in cpu[0].to_f64_vec().iter().zip(gpu[0].to_f64_vec()).enumerate() {
        let ok = (c.is_nan() && g.is_nan()) || *c == g || (c - g).abs() <= tol * c.abs().max(1.0);
        assert!(ok, "{op} {attrs:?} element {i}: GPU {g} vs CPU {c}");
    }
}

/// Values in (-3, 3) with halves, negative zero and domain edges mixed in.
fn wide_f32(dims: &[usize], seed: u64) -> Tensor {
    let t = rand_f32(dims, seed);
    let mut v: Vec<f32> = t.as_slice::<f32>().unwrap().iter().map(|x| x * 3.0).collect();
    for (i, s) in [0.5f32, 1.5, 2.5, -2.5, -0.5, -0.0, 0.0, 1.0, -1.0].iter().enumerate() {
        if i < v.len() {
            v[i] = *s;
        }
    }
    Tensor::from_slice(dims, &v).unwrap()
}

#[test]
fn new_unary_ops_agree() {
    let x = wide_f32(&[3, 67, 5], 7);
    for op in ["Atan", "Sinh", "Cosh", "Asinh", "Mish", "Round", "Sin", "Cos"] {
        cross_check(op, &[In::Data(x.clone())], &[], 1, 22, 1e-5);
    }
    let unit = rand_f32(&[131], 9).as_slice::<f32>().unwrap().iter().map(|v| v * 0.999).collect::<Vec<_>>();
    let unit = Tensor::from_slice(&[131], &unit).unwrap();
    for op in ["Asin", "Acos", "Atanh", "Tan"] {
        cross_check(op, &[In::Data(unit.clone())], &[], 1, 22, 1e-5);
    }
    let above_one = Tensor::from_slice(&[6], &[1.0f32, 1.5, 2.0, 10.0, 1e5, 3.25]).unwrap();
    cross_check("Acosh", &[In::Data(above_one)], &[], 1, 22, 1e-5);
    // Outside the domains: NaN on both.
    let outside = Tensor::from_slice(&[5], &[1.5f32, -2.0, 0.5, f32::NAN, f32::INFINITY]).unwrap();
    for op in ["Asin", "Acos", "Atanh", "Acosh"] {
        cross_check_nan(op, &[In::Data(outside.clone())], &[], 22, 1e-5);
    }
    for op in ["Round", "Mish", "Gelu", "Swish", "Celu", "Shrink", "Asinh", "Sinh"] {
        cross_check_nan(op, &[In::Data(outside.clone())], &[], 22, 1e-5);
    }
    cross_check("Celu", &[In::Data(x.clone())], &[("alpha", Attr::Float(2.0))], 1, 22, 1e-5);
    cross_check("ThresholdedRelu", &[In::Data(x.clone())], &[("alpha", Attr::Float(0.4))], 1, 22, 0.0);
    cross_check("Shrink", &[In::Data(x.clone())], &[("bias", Attr::Float(0.5)), ("lambd", Attr::Float(1.0))], 1, 18, 1e-6);
    let ints = Tensor::from_slice(&[7], &[-5i32, -2, -1, 0, 1, 2, 9]).unwrap();
    cross_check("Shrink", &[In::Data(ints)], &[("bias", Attr::Float(1.0)), ("lambd", Attr::Float(1.5))], 1, 18, 0.0);
    cross_check("Swish", &[In::Data(x.clone())], &[("alpha", Attr::Float(1.5))], 1, 24, 1e-5);
    cross_check("Gelu", &[In::Data(x.clone())], &[], 1, 20, 1e-5);
    cross_check("Gelu", &[In::Data(x.clone())], &[("approximate", Attr::String("tanh".into()))], 1, 20, 1e-5);
    // f16 and f64 inputs (converted at upload / download on the GPU).
    for dtype in [kiln_graph::DType::F16, kiln_graph::DType::F64] {
        let xd = Tensor::from_f64(dtype, x.dims(), &x.to_f64_vec()).unwrap();
        for op in ["Sin", "Cos", "Round", "Mish"] {
            cross_check(op, &[In::Data(xd.clone())], &[], 1, 22, 2e-3);
        }
    }
}

#[test]
fn classification_and_logic_agree() {
    let inf = f32::INFINITY;
    let x = Tensor::from_slice(&[2, 5], &[-1.7f32, f32::NAN, inf, -0.0, -inf, 3e38, 1.0, -f32::NAN, 0.0, inf]).unwrap();
    cross_check("IsNaN", &[In::Data(x.clone())], &[], 1, 20, 0.0);
    for (p, n) in [(1, 1), (1, 0), (0, 1)] {
        cross_check("IsInf", &[In::Data(x.clone())], &[("detect_positive", Attr::Int(p)), ("detect_negative", Attr::Int(n))], 1, 20, 0.0);
    }
    let b = Tensor::from_bools(&[3, 1, 67], &(0..201).map(|i| i % 3 == 0).collect::<Vec<_>>()).unwrap();
    cross_check("Not", &[In::Data(b)], &[], 1, 1, 0.0);
}

fn ints_of(dtype: kiln_graph::DType, dims: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
    let r = rand_f32(dims, seed);
    let v: Vec<f64> = r.to_f64_vec().iter().map(|x| (lo + (x + 1.0) * 0.5 * (hi - lo)).floor()).collect();
    Tensor::from_f64(dtype, dims, &v).unwrap()
}

#[test]
fn bitwise_and_shift_ops_agree() {
    use kiln_graph::DType::*;
    for dtype in [I8, I16, I32, I64, U8, U16, U32, U64] {
        let (lo, hi) = if dtype.is_signed() { (-128.0, 127.0) } else { (0.0, 255.0) };
        let a = ints_of(dtype, &[3, 4, 5], 1, lo, hi);
        let b = ints_of(dtype, &[5], 2, lo, hi);
        for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"] {
            cross_check(op, &[In::Data(a.clone()), In::Data(b.clone())], &[], 1, 18, 0.0);
        }
        if dtype != U64 {
            cross_check("BitwiseNot", &[In::Data(a.clone())], &[], 1, 18, 0.0);
        }
        // Shifts of 0..width+2 (and negative ones for signed dtypes): results wrap to the
        // dtype's width; 64-bit dtypes stay within 32 bits here.
        let width = (dtype.size() * 8).min(32) as f64;
        let s = ints_of(dtype, &[3, 1, 5], 3, if dtype.is_signed() { -3.0 } else { 0.0 }, width + 3.0);
        let small = ints_of(dtype, &[3, 4, 1], 4, if dtype.is_signed() { -100.0 } else { 0.0 }, 100.0);
        for dir in ["LEFT", "RIGHT"] {
            let (x, sh) = if matches!(dtype, I64 | U64) && dir == "LEFT" {
                (ints_of(dtype, &[3, 4, 1], 5, 0.0, 7.0), ints_of(dtype, &[3, 1, 5], 6, 0.0, 28.0))
            } else {
                (small.clone(), s.clone())
            };
            cross_check("BitShift", &[In::Data(x), In::Data(sh)], &[("direction", Attr::String(dir.into()))], 1, 28, 0.0);
        }
    }
}

#[test]
fn mod_and_prelu_agree() {
    use kiln_graph::DType::*;
    let a = wide_f32(&[3, 1, 5], 11);
    let b = rand_f32(&[4, 1], 12);
    for fmod in [0, 1] {
        cross_check("Mod", &[In::Data(a.clone()), In::Data(b.clone())], &[("fmod", Attr::Int(fmod))], 1, 28, 1e-5);
        let inf = f32::INFINITY;
        let sa = Tensor::from_slice(&[8], &[0.0f32, -0.0, -3.0, 3.0, inf, 1.0, f32::NAN, 7.5]).unwrap();
        let sb = Tensor::from_slice(&[8], &[-2.0f32, 2.0, inf, -inf, 2.0, 0.0, 1.0, -2.0]).unwrap();
        cross_check_nan("Mod", &[In::Data(sa), In::Data(sb)], &[("fmod", Attr::Int(fmod))], 28, 1e-6);
        for dtype in [I8, I16, I32, I64, U8, U16, U32, U64] {
            let (lo, hi) = if dtype.is_signed() { (-100.0, 100.0) } else { (0.0, 200.0) };
            let x = ints_of(dtype, &[2, 3, 7], 13, lo, hi);
            let mut y = ints_of(dtype, &[7], 14, lo, hi).to_f64_vec();
            y.iter_mut().for_each(|v| if *v == 0.0 { *v = 3.0 });
            let y = Tensor::from_f64(dtype, &[7], &y).unwrap();
            cross_check("Mod", &[In::Data(x), In::Data(y)], &[("fmod", Attr::Int(fmod))], 1, 28, 0.0);
        }
    }
    let x = rand_f32(&[2, 3, 67], 15);
    cross_check("PRelu", &[In::Data(x.clone()), In::Data(rand_f32(&[67], 16))], &[], 1, 16, 1e-6);
    cross_check("PRelu", &[In::Data(x.clone()), In::Const(rand_f32(&[3, 1], 17))], &[], 1, 16, 1e-6);
    cross_check("PRelu", &[In::Data(x), In::Data(Tensor::scalar(0.25f32))], &[], 1, 16, 1e-6);
    let xi = Tensor::from_slice(&[5], &[-4i32, -1, 0, 3, 8]).unwrap();
    cross_check("PRelu", &[In::Data(xi), In::Data(Tensor::from_slice(&[1], &[3i32]).unwrap())], &[], 1, 16, 0.0);
}
