//! The quantization ops on every device against the CPU: per-tensor, per-axis and
//! blocked scales, zero points per row and per column, odd sizes. Integer outputs
//! must agree exactly.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Tensor};

/// `n` integers of `dtype` spread over its range (deterministic).
fn ints(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let (lo, hi) = match dtype {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        DType::I16 => (-32768.0, 32767.0),
        _ => (0.0, 65535.0),
    };
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|i| lo + ((i as u64 * 7919 + seed * 104729) % ((hi - lo) as u64 + 1)) as f64).collect();
    Tensor::from_f64(dtype, dims, &v).unwrap()
}

#[test]
fn quantize_and_dequantize_agree() {
    let mut s = Suite::new("QuantizeLinear and DequantizeLinear");
    let x = rand_f32(&[3, 37, 5], 1);
    // Per tensor (u8, i8, i16), per axis 1, blocked along axis 1 in blocks of 8.
    for (zp, scale, attrs) in [
        (ints(DType::U8, &[], 3), Tensor::scalar(0.013f32), vec![]),
        (ints(DType::I8, &[], 4), Tensor::scalar(0.0071f32), vec![]),
        (ints(DType::I16, &[], 5), Tensor::scalar(0.00021f32), vec![]),
        (ints(DType::I8, &[37], 6), rand_f32_map(&[37], 7, |v| v.abs() + 0.01), vec![("axis", Attr::Int(1))]),
        (ints(DType::U8, &[3, 5, 5], 8), rand_f32_map(&[3, 5, 5], 9, |v| v.abs() + 0.01), vec![("axis", Attr::Int(1)), ("block_size", Attr::Int(8))]),
    ] {
        let q = Case::new("QuantizeLinear").opset(21).input(x.clone()).constant(scale.clone()).constant(zp.clone()).attrs(&attrs);
        s.check(q, Tolerance::EXACT);
        let data = ints(zp.dtype(), &[3, 37, 5], 10);
        let dq = Case::new("DequantizeLinear").opset(21).input(data).constant(scale).constant(zp).attrs(&attrs);
        s.check(dq, Tolerance::EXACT);
    }
    s.check(Case::new("DynamicQuantizeLinear").opset(11).input(rand_f32(&[7, 300], 11)).outputs(3), Tolerance::EXACT);
    s.finish();
}

#[test]
fn matmul_integer_agrees() {
    let mut s = Suite::new("MatMulInteger");
    // Zero points: none, per tensor, per row of A and per column of B.
    let (a, b) = (ints(DType::U8, &[5, 33], 1), ints(DType::I8, &[33, 7], 2));
    let mm = || Case::new("MatMulInteger").opset(10).input(a.clone()).input(b.clone());
    s.check(mm(), Tolerance::EXACT);
    s.check(mm().constant(ints(DType::U8, &[], 3)).constant(ints(DType::I8, &[], 4)), Tolerance::EXACT);
    s.check(mm().constant(ints(DType::U8, &[5], 5)).constant(ints(DType::I8, &[7], 6)), Tolerance::EXACT);
    // Batched A against a shared B, and a 1-D B.
    s.check(Case::new("MatMulInteger").opset(10).input(ints(DType::I8, &[2, 3, 4, 9], 7)).input(ints(DType::U8, &[9, 6], 8)), Tolerance::EXACT);
    s.check(Case::new("MatMulInteger").opset(10).input(ints(DType::I8, &[4, 9], 9)).input(ints(DType::I8, &[9], 10)), Tolerance::EXACT);
    // QLinearMatMul: per-tensor, then A per row and B per column.
    let scale = |dims: &[usize], seed| rand_f32_map(dims, seed, |v| v.abs() * 0.01 + 0.001);
    for (sa, za, sb, zb) in [
        (scale(&[], 11), ints(DType::U8, &[], 12), scale(&[], 13), ints(DType::I8, &[], 14)),
        (scale(&[5], 15), ints(DType::U8, &[5], 16), scale(&[7], 17), ints(DType::I8, &[7], 18)),
    ] {
        let q = Case::new("QLinearMatMul").opset(10).input(a.clone()).constant(sa).constant(za).input(b.clone()).constant(sb).constant(zb);
        s.check(q.constant(Tensor::scalar(0.37f32)).constant(ints(DType::U8, &[], 19)), Tolerance::EXACT);
    }
    s.finish();
}

#[test]
fn conv_integer_agrees() {
    let mut s = Suite::new("ConvInteger");
    // 2-D, grouped, strided and padded, w's zero point per output channel.
    let attrs = [("group", Attr::Int(2)), ("strides", Attr::Ints(vec![2, 1])), ("pads", Attr::Ints(vec![1, 0, 2, 1]))];
    let c = Case::new("ConvInteger").opset(10).input(ints(DType::U8, &[2, 6, 9, 7], 1)).constant(ints(DType::I8, &[4, 3, 3, 2], 2));
    s.check(c.constant(ints(DType::U8, &[], 3)).constant(ints(DType::I8, &[4], 4)).attrs(&attrs), Tolerance::EXACT);
    // 1-D and 3-D, dilated, no zero points.
    let c1 = Case::new("ConvInteger").opset(10).input(ints(DType::I8, &[1, 3, 20], 5)).constant(ints(DType::I8, &[5, 3, 4], 6));
    s.check(c1.attr("dilations", Attr::Ints(vec![3])), Tolerance::EXACT);
    let c3 = Case::new("ConvInteger").opset(10).input(ints(DType::U8, &[1, 2, 4, 5, 6], 7)).constant(ints(DType::U8, &[3, 2, 2, 3, 2], 8));
    s.check(c3.attr("pads", Attr::Ints(vec![1, 1, 0, 0, 1, 1])), Tolerance::EXACT);
    // QLinearConv with w's scale and zero point per output channel, and a bias.
    let scale = |dims: &[usize], seed| rand_f32_map(dims, seed, |v| v.abs() * 0.01 + 0.001);
    let q = Case::new("QLinearConv").opset(10).input(ints(DType::U8, &[2, 6, 9, 7], 9)).constant(scale(&[], 10)).constant(ints(DType::U8, &[], 11));
    let q = q.constant(ints(DType::I8, &[4, 3, 3, 2], 12)).constant(scale(&[4], 13)).constant(ints(DType::I8, &[4], 14));
    let bias = Tensor::from_f64(DType::I32, &[4], &[-3000., 0., 12345., 7.]).unwrap();
    s.check(q.constant(Tensor::scalar(0.9f32)).constant(ints(DType::U8, &[], 15)).constant(bias).attrs(&attrs), Tolerance::EXACT);
    s.finish();
}
