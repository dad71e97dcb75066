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
