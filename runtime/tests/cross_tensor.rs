//! Data movement and selection on every device against the reference: Transpose,
//! Concat, Split, Slice, Pad, Gather*, Expand, Tile, Where, Cast, Resize, Trilu, scans,
//! scatters, TopK, Hardmax, OneHot, depth/space, EyeLike, ReverseSequence, Compress,
//! NonZero, Einsum, CenterCropPad, Unique; odd sizes, size-1 dims, negative axes and indices.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn movement_ops_agree() {
    let mut s = Suite::new("data movement");
    let x = rand_f32(&[2, 3, 5, 7], 1);
    let op = |name: &str| Case::new(name).opset(13).input(x.clone());
    s.check(op("Transpose").attr("perm", ints(&[0, 2, 3, 1])), Tolerance::EXACT);
    s.check(op("Transpose"), Tolerance::EXACT);
    s.check(op("Concat").input(rand_f32(&[2, 1, 5, 7], 2)).constant(rand_f32(&[2, 4, 5, 7], 3)).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    s.check(op("Concat").input(rand_f32(&[2, 3, 5, 2], 2)).attr("axis", Attr::Int(-1)), Tolerance::EXACT);
    s.check(op("Split").constant(i64_vec(&[2, 4, 1])).attr("axis", Attr::Int(3)).outputs(3), Tolerance::EXACT);
    s.check(op("Split").attr("axis", Attr::Int(1)).outputs(3), Tolerance::EXACT);
    let slice = op("Slice").constant(i64_vec(&[1, -1])).constant(i64_vec(&[4, -8]));
    s.check(slice.constant(i64_vec(&[2, 3])).constant(i64_vec(&[2, -3])), Tolerance::EXACT);
    s.check(op("Slice").constant(i64_vec(&[0])).constant(i64_vec(&[i64::MAX])).constant(i64_vec(&[1])), Tolerance::EXACT);
    for mode in ["constant", "reflect", "edge"] {
        s.check(op("Pad").constant(i64_vec(&[0, 1, 2, 1, 0, 0, 1, 3])).attr("mode", string(mode)), Tolerance::EXACT);
    }
    let idx = i64s(&[2, 3], &[0, -1, 2, 1, 1, 0]);
    s.check(op("Gather").constant(idx.clone()).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    s.check(op("Gather").input(idx).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    s.check(Case::new("Expand").opset(13).input(rand_f32(&[3, 1], 4)).constant(i64_vec(&[2, 1, 6])), Tolerance::EXACT);
    s.check(Case::new("Tile").opset(13).input(rand_f32(&[3, 2], 4)).constant(i64_vec(&[2, 3])), Tolerance::EXACT);
    let cond = bools(&[5, 1], &[true, false, true, true, false]);
    s.check(Case::new("Where").opset(13).input(cond).input(rand_f32(&[5, 7], 5)).input(rand_f32(&[7], 6)), Tolerance::EXACT);
    s.check(Case::new("Cast").opset(13).input(rand_f32(&[70], 7)).attr("to", Attr::Int(7)), Tolerance::EXACT);
    for to in [1, 9] {
        s.check(Case::new("Cast").opset(13).input(i64_vec(&[3, -2, 0, 7])).attr("to", Attr::Int(to)), Tolerance::EXACT);
    }
    s.finish();
}

#[test]
fn resize_agrees() {
    let mut s = Suite::new("Resize");
    let x = rand_f32(&[1, 2, 5, 7], 8);
    let scales = f32s(&[4], &[1.0, 1.0, 2.0, 1.5]);
    for (mode, ctm) in [("nearest", "asymmetric"), ("nearest", "half_pixel"), ("linear", "half_pixel"), ("linear", "align_corners"), ("linear", "pytorch_half_pixel")] {
        let c = Case::new("Resize").opset(13).input(x.clone()).constant(f32s(&[0], &[])).constant(scales.clone());
        s.check(c.attr("mode", string(mode)).attr("coordinate_transformation_mode", string(ctm)), Tolerance::f32(1e-6));
    }
    let sizes = Case::new("Resize").opset(13).input(x).omitted().omitted().constant(i64_vec(&[1, 2, 9, 4]));
    s.check(sizes.attr("mode", string("linear")), Tolerance::f32(1e-6));
    s.finish();
}

#[test]
fn gather_elements_and_erf_agree() {
    let mut s = Suite::new("GatherElements and Erf");
    let x = rand_f32(&[3, 5, 7], 9);
    let idx = i64s(&[3, 4, 7], &(0..3 * 4 * 7).map(|i| (i * 7 % 9) as i64 - 4).collect::<Vec<_>>());
    s.check(Case::new("GatherElements").opset(13).input(x.clone()).input(idx).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    let wide = f32s(&[9], &[-4.0, -2.0, -1.0, -0.3, 0.0, 0.2, 0.9, 1.7, 3.5]);
    s.check(Case::new("Erf").opset(13).input(wide), Tolerance::f32(1e-6));
    s.check(Case::new("Erf").opset(13).input(x), Tolerance::f32(1e-6));
    s.finish();
}

#[test]
fn trilu_and_scans_agree() {
    let mut s = Suite::new("Trilu and scans");
    let x = rand_f32(&[2, 3, 7, 5], 11);
    for upper in [0i64, 1] {
        for k in [-2i64, 0, 3] {
            s.check(Case::new("Trilu").opset(14).input(x.clone()).constant(Tensor::scalar(k)).attr("upper", Attr::Int(upper)), Tolerance::EXACT);
        }
    }
    s.check(Case::new("Trilu").opset(14).input(i64s(&[3, 2], &[1, 2, 3, 4, 5, 6])), Tolerance::EXACT);
    let ints = Tensor::from_slice(&[3, 70], &(0..210).map(|v| (v % 7) as i32 - 3).collect::<Vec<_>>()).unwrap();
    for op in ["CumSum", "CumProd"] {
        for (excl, rev) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let scan = |x: &Tensor, axis: Tensor| Case::new(op).opset(14).input(x.clone()).constant(axis).attr("exclusive", Attr::Int(excl)).attr("reverse", Attr::Int(rev));
            for axis in [0i64, 2, -1] {
                s.check(scan(&x, Tensor::scalar(axis)), Tolerance::DEFAULT);
            }
            s.check(scan(&ints, Tensor::scalar(1i32)), Tolerance::EXACT);
        }
    }
    // Long lines: one workgroup of lanes per line (over the 65535-iteration limit).
    let long = rand_f32(&[2, 70_001], 12);
    for (excl, rev) in [(0, 0), (1, 1)] {
        let c = Case::new("CumSum").opset(14).input(long.clone()).constant(Tensor::scalar(1i64));
        s.check(c.attr("exclusive", Attr::Int(excl)).attr("reverse", Attr::Int(rev)), Tolerance::DEFAULT);
    }
    s.check(Case::new("CumSum").opset(14).input(i64s(&[1, 3000], &[1; 3000])).constant(Tensor::scalar(1i64)), Tolerance::EXACT);
    s.finish();
}

#[test]
fn scatters_agree() {
    let mut s = Suite::new("scatters");
    let data = rand_f32(&[4, 5, 3], 21);
    let upd = rand_f32(&[3, 2, 3], 22);
    let reductions = ["none", "add", "mul", "max", "min"];
    for axis in [0i64, 1, -1] {
        let n = [4i64, 5, 3][axis.rem_euclid(3) as usize];
        let idx = i64s(&[3, 2, 3], &(0..18).map(|v| (v * 7 % (2 * n)) - n).collect::<Vec<_>>());
        for red in reductions {
            let c = Case::new("ScatterElements").opset(18).input(data.clone()).input(idx.clone()).input(upd.clone());
            s.check(c.attr("axis", Attr::Int(axis)).attr("reduction", string(red)), Tolerance::f32(1e-6));
        }
    }
    let ints = i64s(&[2, 5], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let (idx, upd_i) = (i64s(&[2, 2], &[4, -5, 0, 0]), i64s(&[2, 2], &[-1, -2, -3, -4]));
    s.check(Case::new("Scatter").opset(10).input(ints.clone()).constant(idx.clone()).input(upd_i.clone()).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    let se = Case::new("ScatterElements").opset(18).input(ints).input(idx).input(upd_i);
    s.check(se.attr("axis", Attr::Int(1)).attr("reduction", string("mul")), Tolerance::EXACT);
    for (idx_dims, idx) in [(vec![3usize, 1], vec![1i64, -1, 1]), (vec![2, 2, 2], vec![0, 2, -4, -1, 3, 0, 0, 2]), (vec![2, 3], vec![3, 2, 1, -4, 0, -2])] {
        let q = idx_dims[idx_dims.len() - 1];
        let ud: Vec<usize> = idx_dims[..idx_dims.len() - 1].iter().chain(&[4usize, 5, 3][q..]).copied().collect();
        let upd = rand_f32(&ud, 23);
        for red in reductions {
            let c = Case::new("ScatterND").opset(18).input(data.clone()).input(i64s(&idx_dims, &idx)).input(upd.clone());
            s.check(c.attr("reduction", string(red)), Tolerance::f32(1e-6));
        }
    }
    s.finish();
}

#[test]
fn selection_and_layout_ops_agree() {
    let mut s = Suite::new("selection and layout");
    let ties = f32s(&[3, 7, 2], &(0..42).map(|v| ((v * 5) % 7) as f32 - 3.0).collect::<Vec<_>>());
    for axis in [0i64, 1, -1] {
        for largest in [0i64, 1] {
            let k = if axis == 1 { 4 } else { 2 };
            let c = Case::new("TopK").opset(11).input(ties.clone()).constant(i64_vec(&[k])).outputs(2);
            s.check(c.attr("axis", Attr::Int(axis)).attr("largest", Attr::Int(largest)), Tolerance::EXACT);
        }
    }
    let ints = i64s(&[2, 9], &(0..18).map(|v| (v * 7 % 5) as i64).collect::<Vec<_>>());
    s.check(Case::new("TopK").opset(11).input(ints).constant(i64_vec(&[9])).outputs(2), Tolerance::EXACT);
    for (axis, opset) in [(0i64, 13), (1, 13), (-1, 13), (1, 11), (0, 11)] {
        s.check(Case::new("Hardmax").opset(opset).input(ties.clone()).attr("axis", Attr::Int(axis)), Tolerance::EXACT);
    }
    let idx = i64s(&[2, 3], &[0, 4, -1, 5, -6, 2]);
    for axis in [-1i64, 0, 1] {
        let c = Case::new("OneHot").opset(11).input(idx.clone()).constant(Tensor::scalar(5.0f32)).input(f32s(&[2], &[0.5, 2.0]));
        s.check(c.attr("axis", Attr::Int(axis)), Tolerance::EXACT);
    }
    let x = rand_f32(&[2, 8, 3, 5], 31);
    for mode in ["DCR", "CRD"] {
        let attrs = [("blocksize", Attr::Int(2)), ("mode", string(mode))];
        s.check(Case::new("DepthToSpace").opset(13).input(x.clone()).attrs(&attrs), Tolerance::EXACT);
        s.check(Case::new("SpaceToDepth").opset(13).input(rand_f32(&[2, 3, 4, 6], 32)).attrs(&attrs), Tolerance::EXACT);
    }
    s.check(Case::new("EyeLike").opset(9).input(rand_f32(&[4, 6], 33)).attr("k", Attr::Int(-1)).attr("dtype", Attr::Int(7)), Tolerance::EXACT);
    let data = rand_f32(&[2, 3, 4, 5], 34);
    let nd = i64s(&[2, 2, 2], &[0, 1, -1, 2, 1, 0, 1, -3]);
    s.check(Case::new("GatherND").opset(13).input(data.clone()).input(nd), Tolerance::EXACT);
    let bnd = i64s(&[2, 3, 2], &[0, 1, 2, 3, -1, 0, 1, 1, 2, 2, 0, -4]);
    s.check(Case::new("GatherND").opset(13).input(data).constant(bnd).attr("batch_dims", Attr::Int(1)), Tolerance::EXACT);
    let seq = rand_f32(&[5, 3, 2], 35);
    s.check(Case::new("ReverseSequence").opset(10).input(seq.clone()).input(i64_vec(&[5, 0, 2])), Tolerance::EXACT);
    let rs = Case::new("ReverseSequence").opset(10).input(seq).input(i64_vec(&[3, 3, 1, 2, 0]));
    s.check(rs.attr("batch_axis", Attr::Int(0)).attr("time_axis", Attr::Int(1)), Tolerance::EXACT);
    s.finish();
}

#[test]
fn value_dependent_ops_and_einsum_agree() {
    let mut s = Suite::new("value-dependent ops and Einsum");
    let x = rand_f32(&[3, 4, 5], 41);
    let cond = bools(&[4], &[true, false, true, true]);
    let compress = || Case::new("Compress").opset(11).input(x.clone());
    s.check(compress().constant(cond.clone()).attr("axis", Attr::Int(1)), Tolerance::EXACT);
    s.check(compress().input(cond).attr("axis", Attr::Int(-2)), Tolerance::EXACT);
    s.check(compress().input(bools(&[7], &[false, true, true, false, false, true, true])), Tolerance::EXACT);
    // NonZero is a host op: its input must be known when the model is specialised
    // (a constant, or a small graph input bound by value), then it folds.
    let nz = i64s(&[2, 3], &[0, 3, 0, -1, 0, 2]);
    s.check(Case::new("NonZero").opset(13).input(nz.clone()), Tolerance::EXACT);
    s.check(Case::new("NonZero").opset(13).constant(nz), Tolerance::EXACT);
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
        s.check(Case::new("Einsum").opset(12).inputs(ins.into_iter().map(Input::Data)).attr("equation", string(eq)), Tolerance::DEFAULT);
    }
    let ints = Tensor::from_slice(&[3, 4], &(0..12).map(|v| v - 5).collect::<Vec<i32>>()).unwrap();
    s.check(Case::new("Einsum").opset(12).input(ints.clone()).input(ints).attr("equation", string("ij,kj->ik")), Tolerance::EXACT);
    s.finish();
}

#[test]
fn center_crop_pad_and_unique_agree() {
    let mut s = Suite::new("CenterCropPad, Unique");
    let x = rand_f32(&[4, 7, 5], 1);
    let ccp = |x: Tensor, shape: &[i64]| Case::new("CenterCropPad").opset(18).input(x).constant(i64_vec(shape));
    for shape in [[4i64, 7, 5], [3, 10, 2], [8, 1, 6], [5, 4, 9]] {
        s.check(ccp(x.clone(), &shape), Tolerance::EXACT);
    }
    s.check(ccp(x.clone(), &[3, 9]).attr("axes", ints(&[-1, 0])), Tolerance::EXACT);
    s.check(ccp(i64s(&[3, 4], &(0..12).map(|v| v - 5).collect::<Vec<_>>()), &[5, 1]), Tolerance::EXACT);
    // Unique is a host op: its input must be known when the model is specialised.
    let u = i64s(&[3, 4], &[3, 1, 3, 2, 0, 0, 0, 0, 3, 1, 3, 2]);
    s.check(Case::new("Unique").opset(11).input(u.clone()).outputs(4), Tolerance::EXACT);
    s.check(Case::new("Unique").opset(11).constant(u.clone()).attr("axis", Attr::Int(0)).attr("sorted", Attr::Int(0)).outputs(4), Tolerance::EXACT);
    s.finish();
}

#[test]
fn bitcast_and_tensor_scatter_agree() {
    let mut s = Suite::new("BitCast and TensorScatter");
    use kiln_graph::DType;
    let bitcast = |x: Tensor, to: DType| Case::new("BitCast").opset(26).input(x).attr("to", Attr::Int(to.onnx_code() as i64));
    let f = f32s(&[5], &[1.0, -2.5, 0.0, 3.25e-3, -1e20]);
    s.check(bitcast(f.clone(), DType::I32), Tolerance::EXACT);
    s.check(bitcast(f, DType::U32), Tolerance::EXACT);
    s.check(bitcast(Tensor::from_slice(&[4], &[1i32, -7, 1 << 30, 0x3f80_0000]).unwrap(), DType::F32), Tolerance::EXACT);
    s.check(bitcast(Tensor::from_slice(&[3], &[-1i8, 5, -128]).unwrap(), DType::U8), Tolerance::EXACT);
    s.check(bitcast(Tensor::from_slice(&[3], &[65535u16, 1, 32768]).unwrap(), DType::I16), Tolerance::EXACT);
    s.check(bitcast(bools(&[3], &[true, false, true]), DType::U8), Tolerance::EXACT);
    s.check(bitcast(Tensor::from_slice(&[2], &[-3i64, 7]).unwrap(), DType::F64), Tolerance::EXACT);
    let (cache, upd) = (rand_f32(&[3, 2, 7, 5], 1), rand_f32(&[3, 2, 3, 5], 2));
    for (mode, w) in [("linear", [4i64, 0, 2]), ("circular", [5, 6, 13])] {
        let case = Case::new("TensorScatter").opset(24).input(cache.clone()).input(upd.clone()).input(i64_vec(&w)).attr("mode", string(mode));
        s.check(case, Tolerance::EXACT);
    }
    s.check(Case::new("TensorScatter").opset(24).input(rand_f32(&[2, 6, 3], 3)).input(rand_f32(&[2, 1, 3], 4)), Tolerance::EXACT);
    s.check(Case::new("TensorScatter").opset(24).input(rand_f32(&[2, 4, 3], 5)).input(rand_f32(&[2, 4, 2], 6)).attr("axis", Attr::Int(-1)), Tolerance::EXACT);
    s.finish();
}
