//! CPU vs GPU on data movement: Transpose, Concat, Split, Slice, Pad, Gather, Expand,
//! Tile, Where, Cast, Resize; odd sizes, size-1 dims, negative axes and indices.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_slice(&[v.len()], v).unwrap()
}

#[test]
fn movement_ops_agree() {
    let x = rand_f32(&[2, 3, 5, 7], 1);
    cross_check("Transpose", &[In::Data(x.clone())], &[("perm", Attr::Ints(vec![0, 2, 3, 1]))], 1, 13, 0.0);
    cross_check("Transpose", &[In::Data(x.clone())], &[], 1, 13, 0.0);
    cross_check("Concat", &[In::Data(x.clone()), In::Data(rand_f32(&[2, 1, 5, 7], 2)), In::Const(rand_f32(&[2, 4, 5, 7], 3))], &[("axis", Attr::Int(1))], 1, 13, 0.0);
    cross_check("Concat", &[In::Data(x.clone()), In::Data(rand_f32(&[2, 3, 5, 2], 2))], &[("axis", Attr::Int(-1))], 1, 13, 0.0);
    cross_check("Split", &[In::Data(x.clone()), In::Const(i64s(&[2, 4, 1]))], &[("axis", Attr::Int(3))], 3, 13, 0.0);
    cross_check("Split", &[In::Data(x.clone())], &[("axis", Attr::Int(1))], 3, 13, 0.0);
    cross_check("Slice", &[In::Data(x.clone()), In::Const(i64s(&[1, -1])), In::Const(i64s(&[4, -8])), In::Const(i64s(&[2, 3])), In::Const(i64s(&[2, -3]))], &[], 1, 13, 0.0);
    cross_check("Slice", &[In::Data(x.clone()), In::Const(i64s(&[0])), In::Const(i64s(&[i64::MAX])), In::Const(i64s(&[1]))], &[], 1, 13, 0.0);
    for mode in ["constant", "reflect", "edge"] {
        cross_check("Pad", &[In::Data(x.clone()), In::Const(i64s(&[0, 1, 2, 1, 0, 0, 1, 3]))], &[("mode", Attr::String(mode.into()))], 1, 13, 0.0);
    }
    let idx = Tensor::from_slice(&[2, 3], &[0i64, -1, 2, 1, 1, 0]).unwrap();
    cross_check("Gather", &[In::Data(x.clone()), In::Const(idx.clone())], &[("axis", Attr::Int(1))], 1, 13, 0.0);
    cross_check("Gather", &[In::Data(x.clone()), In::Data(idx)], &[("axis", Attr::Int(1))], 1, 13, 0.0);
    cross_check("Expand", &[In::Data(rand_f32(&[3, 1], 4)), In::Const(i64s(&[2, 1, 6]))], &[], 1, 13, 0.0);
    cross_check("Tile", &[In::Data(rand_f32(&[3, 2], 4)), In::Const(i64s(&[2, 3]))], &[], 1, 13, 0.0);
    let cond = Tensor::from_bools(&[5, 1], &[true, false, true, true, false]).unwrap();
    cross_check("Where", &[In::Data(cond), In::Data(rand_f32(&[5, 7], 5)), In::Data(rand_f32(&[7], 6))], &[], 1, 13, 0.0);
    cross_check("Cast", &[In::Data(rand_f32(&[70], 7))], &[("to", Attr::Int(7))], 1, 13, 0.0);
    cross_check("Cast", &[In::Data(Tensor::from_slice(&[4], &[3i64, -2, 0, 7]).unwrap())], &[("to", Attr::Int(1))], 1, 13, 0.0);
    cross_check("Cast", &[In::Data(Tensor::from_slice(&[4], &[3i64, -2, 0, 7]).unwrap())], &[("to", Attr::Int(9))], 1, 13, 0.0);
}

#[test]
fn resize_agrees() {
    let x = rand_f32(&[1, 2, 5, 7], 8);
    let scales = Tensor::from_slice(&[4], &[1.0f32, 1.0, 2.0, 1.5]).unwrap();
    let empty = Tensor::from_slice::<f32>(&[0], &[]).unwrap();
    for (mode, ctm) in [("nearest", "asymmetric"), ("nearest", "half_pixel"), ("linear", "half_pixel"), ("linear", "align_corners"), ("linear", "pytorch_half_pixel")] {
        cross_check(
            "Resize",
            &[In::Data(x.clone()), In::Const(empty.clone()), In::Const(scales.clone())],
            &[("mode", Attr::String(mode.into())), ("coordinate_transformation_mode", Attr::String(ctm.into()))],
            1,
            13,
            1e-6,
        );
    }
    let sizes = Tensor::from_slice(&[4], &[1i64, 2, 9, 4]).unwrap();
    cross_check("Resize", &[In::Data(x), In::None, In::None, In::Const(sizes)], &[("mode", Attr::String("linear".into()))], 1, 13, 1e-6);
}

#[test]
fn gather_elements_and_erf_agree() {
    let x = rand_f32(&[3, 5, 7], 9);
    let idx: Vec<i64> = (0..3 * 4 * 7).map(|i| (i * 7 % 9) as i64 - 4).collect();
    let idx = Tensor::from_slice(&[3, 4, 7], &idx).unwrap();
    cross_check("GatherElements", &[In::Data(x.clone()), In::Data(idx)], &[("axis", Attr::Int(1))], 1, 13, 0.0);
    let wide = Tensor::from_slice(&[9], &[-4f32, -2.0, -1.0, -0.3, 0.0, 0.2, 0.9, 1.7, 3.5]).unwrap();
    cross_check("Erf", &[In::Data(wide)], &[], 1, 13, 1e-6);
    cross_check("Erf", &[In::Data(x)], &[], 1, 13, 1e-6);
}

#[test]
fn trilu_and_scans_agree() {
    let x = rand_f32(&[2, 3, 7, 5], 11);
    for upper in [0i64, 1] {
        for k in [-2i64, 0, 3] {
            cross_check("Trilu", &[In::Data(x.clone()), In::Const(Tensor::scalar(k))], &[("upper", Attr::Int(upper))], 1, 14, 0.0);
        }
    }
    cross_check("Trilu", &[In::Data(Tensor::from_slice(&[3, 2], &[1i64, 2, 3, 4, 5, 6]).unwrap())], &[], 1, 14, 0.0);
    let ints = Tensor::from_slice(&[3, 70], &(0..210).map(|v| (v % 7) as i32 - 3).collect::<Vec<_>>()).unwrap();
    for op in ["CumSum", "CumProd"] {
        for (excl, rev) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let attrs = [("exclusive", Attr::Int(excl)), ("reverse", Attr::Int(rev))];
            for axis in [0i64, 2, -1] {
                cross_check(op, &[In::Data(x.clone()), In::Const(Tensor::scalar(axis))], &attrs, 1, 14, 1e-5);
            }
            cross_check(op, &[In::Data(ints.clone()), In::Const(Tensor::scalar(1i32))], &attrs, 1, 14, 0.0);
        }
    }
    // long lines: one workgroup of lanes per line (over the 65535-iteration limit)
    let long = rand_f32(&[2, 70_001], 12);
    for (excl, rev) in [(0, 0), (1, 1)] {
        let attrs = [("exclusive", Attr::Int(excl)), ("reverse", Attr::Int(rev))];
        cross_check("CumSum", &[In::Data(long.clone()), In::Const(Tensor::scalar(1i64))], &attrs, 1, 14, 1e-5);
    }
    let ones = Tensor::from_slice(&[1, 3000], &vec![1i64; 3000]).unwrap();
    cross_check("CumSum", &[In::Data(ones), In::Const(Tensor::scalar(1i64))], &[], 1, 14, 0.0);
}

#[test]
fn scatters_agree() {
    let data = rand_f32(&[4, 5, 3], 21);
    let upd = rand_f32(&[3, 2, 3], 22);
    for axis in [0i64, 1, -1] {
        let n = [4i64, 5, 3][axis.rem_euclid(3) as usize];
        let idx: Vec<i64> = (0..18).map(|v| (v * 7 % (2 * n)) - n).collect();
        let idx = Tensor::from_slice(&[3, 2, 3], &idx).unwrap();
        for red in ["none", "add", "mul", "max", "min"] {
            let attrs = [("axis", Attr::Int(axis)), ("reduction", Attr::String(red.into()))];
            cross_check("ScatterElements", &[In::Data(data.clone()), In::Data(idx.clone()), In::Data(upd.clone())], &attrs, 1, 18, 1e-6);
        }
    }
    let ints = Tensor::from_slice(&[2, 5], &[1i64, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
    let idx = Tensor::from_slice(&[2, 2], &[4i64, -5, 0, 0]).unwrap();
    let upd = Tensor::from_slice(&[2, 2], &[-1i64, -2, -3, -4]).unwrap();
    cross_check("Scatter", &[In::Data(ints.clone()), In::Const(idx.clone()), In::Data(upd.clone())], &[("axis", Attr::Int(1))], 1, 10, 0.0);
    cross_check("ScatterElements", &[In::Data(ints), In::Data(idx), In::Data(upd)], &[("axis", Attr::Int(1)), ("reduction", Attr::String("mul".into()))], 1, 18, 0.0);
    for (idx_dims, idx) in [(vec![3usize, 1], vec![1i64, -1, 1]), (vec![2, 2, 2], vec![0, 2, -4, -1, 3, 0, 0, 2]), (vec![2, 3], vec![3, 2, 1, -4, 0, -2])] {
        let q = idx_dims[idx_dims.len() - 1];
        let mut ud = idx_dims[..idx_dims.len() - 1].to_vec();
        ud.extend_from_slice(&[4usize, 5, 3][q..]);
        let upd = rand_f32(&ud, 23);
        let idx = Tensor::from_slice(&idx_dims, &idx).unwrap();
        for red in ["none", "add", "mul", "max", "min"] {
            cross_check("ScatterND", &[In::Data(data.clone()), In::Data(idx.clone()), In::Data(upd.clone())], &[("reduction", Attr::String(red.into()))], 1, 18, 1e-6);
        }
    }
}

#[test]
fn selection_and_layout_ops_agree() {
    let ties = Tensor::from_slice(&[3, 7, 2], &(0..42).map(|v| ((v * 5) % 7) as f32 - 3.0).collect::<Vec<_>>()).unwrap();
    for axis in [0i64, 1, -1] {
        for largest in [0i64, 1] {
            let k = if axis == 1 { 4 } else { 2 };
            let attrs = [("axis", Attr::Int(axis)), ("largest", Attr::Int(largest))];
            cross_check("TopK", &[In::Data(ties.clone()), In::Const(i64s(&[k]))], &attrs, 2, 11, 0.0);
        }
    }
    let ints = Tensor::from_slice(&[2, 9], &(0..18).map(|v| (v * 7 % 5) as i64).collect::<Vec<_>>()).unwrap();
    cross_check("TopK", &[In::Data(ints), In::Const(i64s(&[9]))], &[], 2, 11, 0.0);
    for (axis, opset) in [(0i64, 13), (1, 13), (-1, 13), (1, 11), (0, 11)] {
        cross_check("Hardmax", &[In::Data(ties.clone())], &[("axis", Attr::Int(axis))], 1, opset, 0.0);
    }
    let idx = Tensor::from_slice(&[2, 3], &[0i64, 4, -1, 5, -6, 2]).unwrap();
    for axis in [-1i64, 0, 1] {
        cross_check("OneHot", &[In::Data(idx.clone()), In::Const(Tensor::scalar(5.0f32)), In::Data(f32s(&[2], &[0.5, 2.0]))], &[("axis", Attr::Int(axis))], 1, 11, 0.0);
    }
    let x = rand_f32(&[2, 8, 3, 5], 31);
    for mode in ["DCR", "CRD"] {
        let attrs = [("blocksize", Attr::Int(2)), ("mode", Attr::String(mode.into()))];
        cross_check("DepthToSpace", &[In::Data(x.clone())], &attrs, 1, 13, 0.0);
        cross_check("SpaceToDepth", &[In::Data(rand_f32(&[2, 3, 4, 6], 32))], &attrs, 1, 13, 0.0);
    }
    cross_check("EyeLike", &[In::Data(rand_f32(&[4, 6], 33))], &[("k", Attr::Int(-1)), ("dtype", Attr::Int(7))], 1, 9, 0.0);
    let data = rand_f32(&[2, 3, 4, 5], 34);
    let nd = Tensor::from_slice(&[2, 2, 2], &[0i64, 1, -1, 2, 1, 0, 1, -3]).unwrap();
    cross_check("GatherND", &[In::Data(data.clone()), In::Data(nd.clone())], &[], 1, 13, 0.0);
    let bnd = Tensor::from_slice(&[2, 3, 2], &[0i64, 1, 2, 3, -1, 0, 1, 1, 2, 2, 0, -4]).unwrap();
    cross_check("GatherND", &[In::Data(data), In::Const(bnd)], &[("batch_dims", Attr::Int(1))], 1, 13, 0.0);
    let seq = rand_f32(&[5, 3, 2], 35);
    cross_check("ReverseSequence", &[In::Data(seq.clone()), In::Data(i64s(&[5, 0, 2]))], &[], 1, 10, 0.0);
    cross_check("ReverseSequence", &[In::Data(seq), In::Data(i64s(&[3, 3, 1, 2, 0]))], &[("batch_axis", Attr::Int(0)), ("time_axis", Attr::Int(1))], 1, 10, 0.0);
}

#[test]
fn value_dependent_ops_and_einsum_agree() {
    let x = rand_f32(&[3, 4, 5], 41);
    let cond = Tensor::from_bools(&[4], &[true, false, true, true]).unwrap();
    cross_check("Compress", &[In::Data(x.clone()), In::Const(cond.clone())], &[("axis", Attr::Int(1))], 1, 11, 0.0);
    cross_check("Compress", &[In::Data(x.clone()), In::Data(cond)], &[("axis", Attr::Int(-2))], 1, 11, 0.0);
    let c7 = Tensor::from_bools(&[7], &[false, true, true, false, false, true, true]).unwrap();
    cross_check("Compress", &[In::Data(x.clone()), In::Data(c7)], &[], 1, 11, 0.0);
    // NonZero is a host op: its input must be known when the model is specialised
    // (a constant, or a small graph input bound by value), then it folds.
    let nz = Tensor::from_slice(&[2, 3], &[0i64, 3, 0, -1, 0, 2]).unwrap();
    cross_check("NonZero", &[In::Data(nz.clone())], &[], 1, 13, 0.0);
    cross_check("NonZero", &[In::Const(nz)], &[], 1, 13, 0.0);
    let (a, b) = (rand_f32(&[2, 3, 4], 42), rand_f32(&[2, 4, 5], 43));
    for (eq, ins) in [
        ("bij,bjk->bik", vec![a.clone(), b.clone()]),
        ("...ij,...jk", vec![a.clone(), b.clone()]),
        ("bij->bji", vec![a.clone()]),
        ("bij->j", vec![a.clone()]),
        ("bii->bi", vec![rand_f32(&[3, 5, 5], 44)]),
        ("bhid,bhjd->bhij", vec![rand_f32(&[1, 2, 3, 7], 45), rand_f32(&[1, 2, 5, 7], 46)]),
        ("i,j,ij->", vec![rand_f32(&[3], 47), rand_f32(&[4], 48), rand_f32(&[3, 4], 49)]),
    ] {
        let inputs: Vec<In> = ins.into_iter().map(In::Data).collect();
        cross_check("Einsum", &inputs, &[("equation", Attr::String(eq.into()))], 1, 12, 1e-5);
    }
    let ints = Tensor::from_slice(&[3, 4], &(0..12).map(|v| v as i32 - 5).collect::<Vec<_>>()).unwrap();
    cross_check("Einsum", &[In::Data(ints.clone()), In::Data(ints)], &[("equation", Attr::String("ij,kj->ik".into()))], 1, 12, 0.0);
}
