//! MatMul, Gemm, Softmax, reductions and ArgMax on every device against the f64
//! reference: odd sizes (not multiples of tiles or workgroups), size-1 dims, batch
//! broadcasting, large dims.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn matmul_agrees_on_odd_and_broadcast_shapes() {
    let mut s = Suite::new("MatMul");
    let cases: [(&[usize], &[usize]); 7] =
        [(&[1, 7], &[7, 1]), (&[33, 65], &[65, 17]), (&[2, 1, 5, 3], &[4, 3, 7]), (&[7], &[7, 9]), (&[3, 9, 7], &[7]), (&[1, 2, 128, 64], &[1, 2, 64, 129]), (&[1, 300, 5], &[5, 1000])];
    for (i, (a, b)) in cases.iter().enumerate() {
        let mm = || Case::new("MatMul").opset(17).input(rand_f32(a, i as u64));
        s.check(mm().constant(rand_f32(b, 50 + i as u64)), Tolerance::DEFAULT);
        s.check(mm().input(rand_f32(b, 50 + i as u64)), Tolerance::DEFAULT);
    }
    s.finish();
}

#[test]
fn gemm_agrees_with_every_attribute() {
    let mut s = Suite::new("Gemm");
    for (ta, tb) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let a = rand_f32(if ta == 1 { &[13, 5] } else { &[5, 13] }, 1);
        let b = rand_f32(if tb == 1 { &[11, 13] } else { &[13, 11] }, 2);
        for c in [rand_f32(&[11], 3), rand_f32(&[5, 1], 4), rand_f32(&[5, 11], 5), Tensor::scalar(0.5f32)] {
            let attrs = [("transA", Attr::Int(ta)), ("transB", Attr::Int(tb)), ("alpha", Attr::Float(0.7)), ("beta", Attr::Float(1.3))];
            s.check(Case::new("Gemm").opset(13).input(a.clone()).constant(b.clone()).constant(c).attrs(&attrs), Tolerance::DEFAULT);
        }
    }
    let big = Case::new("Gemm").opset(13).input(rand_f32(&[1, 784], 1)).constant(rand_f32(&[256, 784], 2));
    s.check(big.attr("transB", Attr::Int(1)), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn softmax_and_reductions_agree() {
    let mut s = Suite::new("Softmax and reductions");
    for axis in [-1i64, 0, 1, 2] {
        for opset in [11, 13] {
            for (op, seed) in [("Softmax", 7), ("LogSoftmax", 8)] {
                s.check(Case::new(op).opset(opset).input(rand_f32(&[3, 67, 5], seed)).attr("axis", Attr::Int(axis)), Tolerance::DEFAULT);
            }
        }
    }
    s.check(Case::new("Softmax").opset(13).input(rand_f32(&[2, 4099], 9)), Tolerance::DEFAULT);
    for op in ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"] {
        for (axes, keep) in [(vec![1i64], 1i64), (vec![0, 2], 0), (vec![-1], 1)] {
            let c = Case::new(op).opset(11).input(rand_f32(&[3, 33, 7], 10));
            s.check(c.attr("axes", Attr::Ints(axes)).attr("keepdims", Attr::Int(keep)), Tolerance::DEFAULT);
        }
        s.check(Case::new(op).opset(11).input(rand_f32(&[5, 1, 9], 11)), Tolerance::DEFAULT);
    }
    s.check(Case::new("ReduceSum").opset(13).input(rand_f32(&[4, 70000], 12)).constant(i64_vec(&[1])), Tolerance::DEFAULT);
    for op in ["ArgMax", "ArgMin"] {
        for axis in [0i64, 1, -1] {
            let c = Case::new(op).opset(13).input(rand_f32(&[7, 65, 3], 13));
            s.check(c.attr("axis", Attr::Int(axis)).attr("keepdims", Attr::Int(0)), Tolerance::EXACT);
        }
    }
    s.finish();
}

#[test]
fn det_agrees() {
    let mut s = Suite::new("Det");
    s.check(Case::new("Det").opset(11).input(rand_f32(&[3, 2, 2], 1)), Tolerance::f32(1e-5));
    s.check(Case::new("Det").opset(11).input(rand_f32(&[2, 3, 7, 7], 2)), Tolerance::f32(1e-4));
    s.check(Case::new("Det").opset(11).input(rand_f32(&[1, 1], 3)), Tolerance::f32(1e-6));
    // A singular matrix (two equal rows) and one that needs row swaps.
    let m = f32s(&[2, 3, 3], &[1., 2., 3., 1., 2., 3., 4., 5., 6., 0., 1., 0., 1., 0., 0., 0., 0., 2.]);
    s.check(Case::new("Det").opset(11).input(m), Tolerance::f32(1e-6));
    s.finish();
}
