//! Elementwise ops on every device against the f64 reference: odd sizes,
//! broadcasting, size-1 dims, large dims, NaN and infinities, every integer dtype.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Tensor};

const ALL_INTS: [DType; 8] = [DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64];

/// Values in (-3, 3) with halves, negative zero and domain edges mixed in.
fn wide_f32(dims: &[usize], seed: u64) -> Tensor {
    let mut v: Vec<f32> = rand_values(dims.iter().product(), seed).iter().map(|x| x * 3.0).collect();
    for (x, s) in v.iter_mut().zip([0.5f32, 1.5, 2.5, -2.5, -0.5, -0.0, 0.0, 1.0, -1.0]) {
        *x = s;
    }
    f32s(dims, &v)
}

/// Integers of `dtype` in [lo, hi).
fn ints_of(dtype: DType, dims: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
    let v: Vec<f64> = rand_values(dims.iter().product(), seed).iter().map(|&x| (lo + (x as f64 + 1.0) * 0.5 * (hi - lo)).floor()).collect();
    Tensor::from_f64(dtype, dims, &v).unwrap()
}

#[test]
fn unary_ops_agree() {
    let mut s = Suite::new("unary");
    for op in ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "HardSwish", "Softplus", "Sin", "Floor"] {
        s.check(Case::new(op).opset(17).input(rand_f32(&[3, 67, 5], 3)), Tolerance::DEFAULT);
    }
    s.check(Case::new("LeakyRelu").opset(17).input(rand_f32(&[129], 1)).attr("alpha", Attr::Float(0.3)), Tolerance::f32(1e-6));
    let hs = Case::new("HardSigmoid").opset(17).input(rand_f32(&[1, 1, 131], 2));
    s.check(hs.attr("alpha", Attr::Float(0.3)).attr("beta", Attr::Float(0.4)), Tolerance::f32(1e-6));
    let clip = Case::new("Clip").opset(13).input(rand_f32(&[70000], 4)).constant(Tensor::scalar(-0.5f32));
    s.check(clip.constant(Tensor::scalar(0.25f32)), Tolerance::EXACT);
    s.check(Case::new("Clip").opset(13).input(rand_f32(&[33], 4)).input(Tensor::scalar(-0.5f32)).omitted(), Tolerance::EXACT);
    let pos = f32s(&[7], &[0.5, 1.0, 2.0, 3.0, 0.1, 9.0, 4.0]);
    for op in ["Sqrt", "Log", "Reciprocal"] {
        s.check(Case::new(op).opset(17).input(pos.clone()), Tolerance::f32(1e-6));
    }
    s.finish();
}

#[test]
fn binary_ops_agree_with_broadcasting() {
    let mut s = Suite::new("binary");
    let shapes: [(&[usize], &[usize]); 5] = [(&[3, 1, 5], &[4, 1]), (&[1], &[2, 3]), (&[7, 9], &[7, 9]), (&[2, 1, 1, 3], &[1, 5, 1]), (&[65537], &[1])];
    for (i, (a, b)) in shapes.iter().enumerate() {
        for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "Less", "Greater", "Equal"] {
            s.check(Case::new(op).opset(17).input(rand_f32(a, i as u64)).input(rand_f32(b, 100 + i as u64)), Tolerance::f32(1e-6));
        }
    }
    s.check(Case::new("Pow").opset(17).input(rand_f32(&[5, 3], 1)).constant(Tensor::scalar(2.0f32)), Tolerance::f32(1e-6));
    s.check(Case::new("Pow").opset(17).input(rand_f32(&[5, 3], 1)).input(Tensor::scalar(3i64)), Tolerance::f32(1e-6));
    let sum = Case::new("Sum").opset(17).input(rand_f32(&[2, 3], 1)).input(rand_f32(&[3], 2));
    s.check(sum.input(rand_f32(&[2, 1], 3)), Tolerance::f32(1e-6));
    s.check(Case::new("Mean").opset(17).input(rand_f32(&[2, 3], 1)).input(rand_f32(&[3], 2)), Tolerance::f32(1e-6));
    let (ia, ib) = (i64s(&[4], &[7, -9, 100, 3]), i64s(&[4], &[2, 4, -7, 3]));
    for op in ["Add", "Sub", "Mul", "Div", "Max", "Equal"] {
        s.check(Case::new(op).opset(17).input(ia.clone()).input(ib.clone()), Tolerance::EXACT);
    }
    s.finish();
}

#[test]
fn new_unary_ops_agree() {
    let mut s = Suite::new("unary (opset 18-24)");
    let x = wide_f32(&[3, 67, 5], 7);
    let un = |op: &str, x: &Tensor| Case::new(op).opset(22).input(x.clone());
    for op in ["Atan", "Sinh", "Cosh", "Asinh", "Mish", "Round", "Sin", "Cos"] {
        s.check(un(op, &x), Tolerance::DEFAULT);
    }
    let unit = rand_f32_map(&[131], 9, |v| v * 0.999);
    for op in ["Asin", "Acos", "Atanh", "Tan"] {
        s.check(un(op, &unit), Tolerance::DEFAULT);
    }
    s.check(un("Acosh", &f32s(&[6], &[1.0, 1.5, 2.0, 10.0, 1e5, 3.25])), Tolerance::DEFAULT);
    // Outside the domains: NaN on every device.
    let outside = f32s(&[5], &[1.5, -2.0, 0.5, f32::NAN, f32::INFINITY]);
    for op in ["Asin", "Acos", "Atanh", "Acosh", "Round", "Mish", "Gelu", "Swish", "Celu", "Shrink", "Asinh", "Sinh"] {
        s.check(un(op, &outside), Tolerance::DEFAULT);
    }
    s.check(un("Celu", &x).attr("alpha", Attr::Float(2.0)), Tolerance::DEFAULT);
    s.check(un("ThresholdedRelu", &x).attr("alpha", Attr::Float(0.4)), Tolerance::EXACT);
    s.check(un("Shrink", &x).opset(18).attr("bias", Attr::Float(0.5)).attr("lambd", Attr::Float(1.0)), Tolerance::f32(1e-6));
    let ints = Tensor::from_slice(&[7], &[-5i32, -2, -1, 0, 1, 2, 9]).unwrap();
    s.check(un("Shrink", &ints).opset(18).attr("bias", Attr::Float(1.0)).attr("lambd", Attr::Float(1.5)), Tolerance::EXACT);
    s.check(un("Swish", &x).opset(24).attr("alpha", Attr::Float(1.5)), Tolerance::DEFAULT);
    s.check(un("Gelu", &x).opset(20), Tolerance::DEFAULT);
    s.check(un("Gelu", &x).opset(20).attr("approximate", string("tanh")), Tolerance::DEFAULT);
    // f16 and f64 inputs (converted at upload / download on the GPU).
    for dtype in [DType::F16, DType::F64] {
        for op in ["Sin", "Cos", "Round", "Mish"] {
            s.check(un(op, &cast(&x, dtype)), Tolerance::DEFAULT);
        }
    }
    s.finish();
}

#[test]
fn classification_and_logic_agree() {
    let mut s = Suite::new("classification and logic");
    let inf = f32::INFINITY;
    let x = f32s(&[2, 5], &[-1.7, f32::NAN, inf, -0.0, -inf, 3e38, 1.0, -f32::NAN, 0.0, inf]);
    s.check(Case::new("IsNaN").opset(20).input(x.clone()), Tolerance::EXACT);
    for (p, n) in [(1, 1), (1, 0), (0, 1)] {
        let c = Case::new("IsInf").opset(20).input(x.clone());
        s.check(c.attr("detect_positive", Attr::Int(p)).attr("detect_negative", Attr::Int(n)), Tolerance::EXACT);
    }
    let b = bools(&[3, 1, 67], &(0..201).map(|i| i % 3 == 0).collect::<Vec<_>>());
    s.check(Case::new("Not").opset(1).input(b), Tolerance::EXACT);
    s.finish();
}

#[test]
fn bitwise_and_shift_ops_agree() {
    let mut s = Suite::new("bitwise and shifts");
    for dtype in ALL_INTS {
        let (lo, hi) = if dtype.is_signed() { (-128.0, 127.0) } else { (0.0, 255.0) };
        let a = ints_of(dtype, &[3, 4, 5], 1, lo, hi);
        let b = ints_of(dtype, &[5], 2, lo, hi);
        for op in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"] {
            s.check(Case::new(op).opset(18).input(a.clone()).input(b.clone()), Tolerance::EXACT);
        }
        if dtype != DType::U64 {
            s.check(Case::new("BitwiseNot").opset(18).input(a.clone()), Tolerance::EXACT);
        }
        // Shifts of 0..width+2 (and negative ones for signed dtypes): results wrap to the
        // dtype's width; 64-bit dtypes stay within 32 bits here.
        let width = (dtype.size() * 8).min(32) as f64;
        let sh = ints_of(dtype, &[3, 1, 5], 3, if dtype.is_signed() { -3.0 } else { 0.0 }, width + 3.0);
        let small = ints_of(dtype, &[3, 4, 1], 4, if dtype.is_signed() { -100.0 } else { 0.0 }, 100.0);
        for dir in ["LEFT", "RIGHT"] {
            let (x, sh) = if matches!(dtype, DType::I64 | DType::U64) && dir == "LEFT" {
                (ints_of(dtype, &[3, 4, 1], 5, 0.0, 7.0), ints_of(dtype, &[3, 1, 5], 6, 0.0, 28.0))
            } else {
                (small.clone(), sh.clone())
            };
            s.check(Case::new("BitShift").opset(28).input(x).input(sh).attr("direction", string(dir)), Tolerance::EXACT);
        }
    }
    s.finish();
}

#[test]
fn mod_and_prelu_agree() {
    let mut s = Suite::new("Mod and PRelu");
    let (a, b) = (wide_f32(&[3, 1, 5], 11), rand_f32(&[4, 1], 12));
    let inf = f32::INFINITY;
    let sa = f32s(&[8], &[0.0, -0.0, -3.0, 3.0, inf, 1.0, f32::NAN, 7.5]);
    let sb = f32s(&[8], &[-2.0, 2.0, inf, -inf, 2.0, 0.0, 1.0, -2.0]);
    for fmod in [0, 1] {
        let m = || Case::new("Mod").opset(28).attr("fmod", Attr::Int(fmod));
        s.check(m().input(a.clone()).input(b.clone()), Tolerance::DEFAULT);
        s.check(m().input(sa.clone()).input(sb.clone()), Tolerance::f32(1e-6));
        for dtype in ALL_INTS {
            let (lo, hi) = if dtype.is_signed() { (-100.0, 100.0) } else { (0.0, 200.0) };
            let y: Vec<f64> = ints_of(dtype, &[7], 14, lo, hi).to_f64_vec().iter().map(|&v| if v == 0.0 { 3.0 } else { v }).collect();
            let y = Tensor::from_f64(dtype, &[7], &y).unwrap();
            s.check(m().input(ints_of(dtype, &[2, 3, 7], 13, lo, hi)).input(y), Tolerance::EXACT);
        }
    }
    let x = rand_f32(&[2, 3, 67], 15);
    let p = || Case::new("PRelu").opset(16).input(x.clone());
    s.check(p().input(rand_f32(&[67], 16)), Tolerance::f32(1e-6));
    s.check(p().constant(rand_f32(&[3, 1], 17)), Tolerance::f32(1e-6));
    s.check(p().input(Tensor::scalar(0.25f32)), Tolerance::f32(1e-6));
    let xi = Tensor::from_slice(&[5], &[-4i32, -1, 0, 3, 8]).unwrap();
    s.check(Case::new("PRelu").opset(16).input(xi).input(Tensor::from_slice(&[1], &[3i32]).unwrap()), Tolerance::EXACT);
    s.finish();
}

#[test]
fn swiglu_agrees() {
    let mut s = Suite::new("SwiGLU");
    let (a, b) = (rand_f32(&[3, 67], 1), rand_f32(&[3, 67], 2));
    s.check(Case::new("SwiGLU").opset(28).input(a.clone()).input(b.clone()), Tolerance::f32(1e-6));
    s.check(Case::new("SwiGLU").opset(28).input(a.clone()).input(b.clone()).attr("alpha", Attr::Float(1.702)), Tolerance::f32(1e-6));
    s.check(Case::new("SwiGLU").opset(28).input(cast(&a, DType::F16)).input(cast(&b, DType::F16)), Tolerance::DEFAULT);
    s.finish();
}
