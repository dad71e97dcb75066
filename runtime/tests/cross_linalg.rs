//! CPU vs GPU on MatMul, Gemm, Softmax, reductions and ArgMax: odd sizes (not multiples
//! of tiles or workgroups), size-1 dims, batch broadcasting, large dims.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn matmul_agrees_on_odd_and_broadcast_shapes() {
    let cases: [(&[usize], &[usize]); 7] = [
        (&[1, 7], &[7, 1]),
        (&[33, 65], &[65, 17]),
        (&[2, 1, 5, 3], &[4, 3, 7]),
        (&[7], &[7, 9]),
        (&[3, 9, 7], &[7]),
        (&[1, 2, 128, 64], &[1, 2, 64, 129]),
        (&[1, 300, 5], &[5, 1000]),
    ];
    for (i, (a, b)) in cases.iter().enumerate() {
        cross_check("MatMul", &[In::Data(rand_f32(a, i as u64)), In::Const(rand_f32(b, 50 + i as u64))], &[], 1, 17, 1e-5);
        cross_check("MatMul", &[In::Data(rand_f32(a, i as u64)), In::Data(rand_f32(b, 50 + i as u64))], &[], 1, 17, 1e-5);
    }
}

#[test]
fn gemm_agrees_with_every_attribute() {
    for (ta, tb) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let a = if ta == 1 { rand_f32(&[13, 5], 1) } else { rand_f32(&[5, 13], 1) };
        let b = if tb == 1 { rand_f32(&[11, 13], 2) } else { rand_f32(&[13, 11], 2) };
        for c in [rand_f32(&[11], 3), rand_f32(&[5, 1], 4), rand_f32(&[5, 11], 5), Tensor::scalar(0.5f32)] {
            cross_check(
                "Gemm",
                &[In::Data(a.clone()), In::Const(b.clone()), In::Const(c)],
                &[("transA", Attr::Int(ta)), ("transB", Attr::Int(tb)), ("alpha", Attr::Float(0.7)), ("beta", Attr::Float(1.3))],
                1,
                13,
                1e-5,
            );
        }
    }
    cross_check("Gemm", &[In::Data(rand_f32(&[1, 784], 1)), In::Const(rand_f32(&[256, 784], 2))], &[("transB", Attr::Int(1))], 1, 13, 1e-5);
}

#[test]
fn softmax_and_reductions_agree() {
    for axis in [-1i64, 0, 1, 2] {
        for opset in [11, 13] {
            cross_check("Softmax", &[In::Data(rand_f32(&[3, 67, 5], 7))], &[("axis", Attr::Int(axis))], 1, opset, 1e-5);
            cross_check("LogSoftmax", &[In::Data(rand_f32(&[3, 67, 5], 8))], &[("axis", Attr::Int(axis))], 1, opset, 1e-5);
        }
    }
    cross_check("Softmax", &[In::Data(rand_f32(&[2, 4099], 9))], &[], 1, 13, 1e-5);
    for op in ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"] {
        for (axes, keep) in [(vec![1i64], 1i64), (vec![0, 2], 0), (vec![-1], 1)] {
            cross_check(op, &[In::Data(rand_f32(&[3, 33, 7], 10))], &[("axes", Attr::Ints(axes.clone())), ("keepdims", Attr::Int(keep))], 1, 11, 1e-5);
        }
        cross_check(op, &[In::Data(rand_f32(&[5, 1, 9], 11))], &[], 1, 11, 1e-5);
    }
    cross_check("ReduceSum", &[In::Data(rand_f32(&[4, 70000], 12)), In::Const(Tensor::from_slice(&[1], &[1i64]).unwrap())], &[], 1, 13, 1e-5);
    for op in ["ArgMax", "ArgMin"] {
        for axis in [0i64, 1, -1] {
            cross_check(op, &[In::Data(rand_f32(&[7, 65, 3], 13))], &[("axis", Attr::Int(axis)), ("keepdims", Attr::Int(0))], 1, 13, 0.0);
        }
    }
}
