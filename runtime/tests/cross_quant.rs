//! The quantization ops on every device against the CPU: per-tensor, per-axis and
//! blocked scales, zero points per row and per column, odd sizes; onnxruntime's
//! quantized contrib ops (com.microsoft) with constant and run-time parameters.
//! Integer outputs must agree exactly, and so must f32 outputs computed from exact
//! integer sums (MatMulNBits' f32 sums differ in order: 1e-6).
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
    // Every pairing of signedness (the GPU's packed dot products shift an unsigned
    // operand paired with a signed one), with per-row and per-column zero points; a
    // broadcast A against batched B; K of 1 and of 4.
    for (da, db) in [(DType::U8, DType::U8), (DType::I8, DType::I8), (DType::U8, DType::I8), (DType::I8, DType::U8)] {
        let c = Case::new("MatMulInteger").opset(10).input(ints(da, &[6, 37], 20)).input(ints(db, &[37, 5], 21));
        s.check(c.constant(ints(da, &[6], 22)).constant(ints(db, &[5], 23)), Tolerance::EXACT);
        let c = Case::new("MatMulInteger").opset(10).input(ints(da, &[3, 4], 24)).input(ints(db, &[2, 4, 3], 25));
        s.check(c.constant(ints(da, &[], 26)).constant(ints(db, &[], 27)), Tolerance::EXACT);
    }
    s.check(Case::new("MatMulInteger").opset(10).input(ints(DType::U8, &[3, 1], 28)).input(ints(DType::I8, &[1, 4], 29)), Tolerance::EXACT);
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
    // Depthwise with padding and x's zero point in it, signed x with unsigned w, and
    // the other way round with a 1x1 filter.
    let dw = Case::new("ConvInteger").opset(10).input(ints(DType::U8, &[1, 5, 7, 6], 16)).constant(ints(DType::I8, &[5, 1, 3, 3], 17));
    s.check(dw.constant(ints(DType::U8, &[], 18)).constant(ints(DType::I8, &[5], 19)).attrs(&[("group", Attr::Int(5)), ("pads", Attr::Ints(vec![1, 1, 1, 1]))]), Tolerance::EXACT);
    let mixed = Case::new("ConvInteger").opset(10).input(ints(DType::I8, &[2, 3, 5, 5], 20)).constant(ints(DType::U8, &[4, 3, 2, 2], 21));
    s.check(mixed.constant(ints(DType::I8, &[], 22)).constant(ints(DType::U8, &[], 23)).attr("pads", Attr::Ints(vec![1, 0, 0, 1])), Tolerance::EXACT);
    let one = Case::new("ConvInteger").opset(10).input(ints(DType::U8, &[1, 6, 4, 3], 24)).constant(ints(DType::I8, &[7, 6, 1, 1], 25));
    s.check(one.constant(ints(DType::U8, &[], 26)), Tolerance::EXACT);
    // QLinearConv with w's scale and zero point per output channel, and a bias.
    let scale = |dims: &[usize], seed| rand_f32_map(dims, seed, |v| v.abs() * 0.01 + 0.001);
    let q = Case::new("QLinearConv").opset(10).input(ints(DType::U8, &[2, 6, 9, 7], 9)).constant(scale(&[], 10)).constant(ints(DType::U8, &[], 11));
    let q = q.constant(ints(DType::I8, &[4, 3, 3, 2], 12)).constant(scale(&[4], 13)).constant(ints(DType::I8, &[4], 14));
    let bias = Tensor::from_f64(DType::I32, &[4], &[-3000., 0., 12345., 7.]).unwrap();
    s.check(q.constant(Tensor::scalar(0.9f32)).constant(ints(DType::U8, &[], 15)).constant(bias).attrs(&attrs), Tolerance::EXACT);
    s.finish();
}

/// A case of one of onnxruntime's contrib ops (domain `com.microsoft`, opset 1).
fn ms(op: &str) -> Case {
    Case::new(op).domain("com.microsoft").opset(1)
}

/// A positive scale tensor.
fn scale(dims: &[usize], seed: u64) -> Tensor {
    rand_f32_map(dims, seed, |v| v.abs() * 0.05 + 0.002)
}

/// `(X, scale, zero point)` for 8-bit data: as constants, or as run-time inputs.
fn triple(c: Case, x: Tensor, s: Tensor, z: Tensor, constant: bool) -> Case {
    let c = c.input(x);
    if constant { c.constant(s).constant(z) } else { c.input(s).input(z) }
}

#[test]
fn qlinear_elementwise_agree() {
    let mut s = Suite::new("QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu");
    // Broadcasting (B per row, B one value, both sides), uint8 and int8, parameters
    // constant or run-time.
    for op in ["QLinearAdd", "QLinearMul"] {
        for (d, a, b, constant) in [
            (DType::U8, vec![3, 37, 5], vec![37, 1], true),
            (DType::I8, vec![2, 65], vec![1], false),
            (DType::U8, vec![4, 1, 3], vec![1, 7, 1], false),
            (DType::I8, vec![1], vec![129], true),
        ] {
            let c = triple(ms(op), ints(d, &a, 1), scale(&[], 2), ints(d, &[], 3), constant);
            let c = triple(c, ints(d, &b, 4), scale(&[], 5), ints(d, &[], 6), constant);
            let c = if constant { c.constant(scale(&[], 7)).constant(ints(d, &[], 8)) } else { c.input(scale(&[], 7)).input(ints(d, &[], 8)) };
            s.check(c, Tolerance::EXACT);
        }
    }
    for (op, attrs) in [("QLinearSigmoid", vec![]), ("QLinearLeakyRelu", vec![("alpha", Attr::Float(0.13))])] {
        for (d, constant) in [(DType::U8, true), (DType::I8, true), (DType::U8, false), (DType::I8, false)] {
            let c = triple(ms(op).attrs(&attrs), ints(d, &[7, 300], 9), scale(&[], 10), ints(d, &[], 11), constant);
            let c = if constant { c.constant(Tensor::scalar(1.0f32 / 256.0)).constant(ints(d, &[], 12)) } else { c.input(scale(&[], 12)).input(ints(d, &[], 13)) };
            s.check(c, Tolerance::EXACT);
        }
    }
    s.finish();
}

#[test]
fn qlinear_pooling_and_concat_agree() {
    let mut s = Suite::new("QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat");
    // Global average: NCHW, NHWC, and planes larger than a workgroup's lanes times the
    // loop limit would allow one invocation.
    for (d, dims, cl) in [(DType::U8, vec![2, 5, 9, 11], 0), (DType::I8, vec![1, 13, 7, 6], 1), (DType::U8, vec![1, 2, 300, 300], 0)] {
        let c = triple(ms("QLinearGlobalAveragePool").attr("channels_last", Attr::Int(cl)), ints(d, &dims, 1), scale(&[], 2), ints(d, &[], 3), true);
        s.check(c.constant(scale(&[], 4)).constant(ints(d, &[], 5)), Tolerance::EXACT);
    }
    let ks = |v: &[i64]| Attr::Ints(v.to_vec());
    for (d, dims, attrs, constant) in [
        (DType::U8, vec![2, 3, 11, 9], vec![("kernel_shape", ks(&[3, 3])), ("strides", ks(&[2, 2])), ("pads", ks(&[1, 1, 1, 1]))], true),
        (DType::I8, vec![1, 4, 10, 3], vec![("kernel_shape", ks(&[3, 2])), ("strides", ks(&[2, 1])), ("pads", ks(&[1, 0, 2, 1])), ("count_include_pad", Attr::Int(1)), ("ceil_mode", Attr::Int(1))], false),
        (DType::U8, vec![1, 7, 5, 3], vec![("kernel_shape", ks(&[2, 2])), ("auto_pad", Attr::String("SAME_LOWER".into())), ("channels_last", Attr::Int(1))], true),
        (DType::I8, vec![2, 3, 17], vec![("kernel_shape", ks(&[5])), ("strides", ks(&[3])), ("pads", ks(&[2, 2]))], true),
        (DType::U8, vec![1, 2, 4, 5, 6], vec![("kernel_shape", ks(&[2, 3, 2])), ("strides", ks(&[2, 1, 2])), ("pads", ks(&[1, 0, 1, 0, 1, 1]))], false),
        (DType::U8, vec![1, 3, 6, 7], vec![("kernel_shape", ks(&[6, 7]))], true),
    ] {
        let c = triple(ms("QLinearAveragePool").attrs(&attrs), ints(d, &dims, 6), scale(&[], 7), ints(d, &[], 8), constant);
        let c = if constant { c.constant(scale(&[], 9)).constant(ints(d, &[], 10)) } else { c.input(scale(&[], 9)).input(ints(d, &[], 10)) };
        s.check(c, Tolerance::EXACT);
    }
    for (d, axis, constant) in [(DType::U8, 1, true), (DType::I8, -1, false)] {
        let mut c = ms("QLinearConcat").attr("axis", Attr::Int(axis));
        c = if constant { c.constant(scale(&[], 11)).constant(ints(d, &[], 12)) } else { c.input(scale(&[], 11)).input(ints(d, &[], 12)) };
        for (j, dims) in [[2, 3, 5], [2, 1, 5], [2, 4, 5]].iter().enumerate() {
            let mut dims = dims.to_vec();
            if axis == -1 {
                dims.swap(1, 2);
            }
            c = triple(c, ints(d, &dims, 13 + j as u64), scale(&[], 20 + j as u64), ints(d, &[], 30 + j as u64), constant);
        }
        s.check(c, Tolerance::EXACT);
    }
    s.finish();
}

#[test]
fn qgemm_and_quantized_matmuls_agree() {
    let mut s = Suite::new("QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul, MatMulNBits");
    // QGemm: quantized and f32 outputs, transposes, b per column, C broadcast.
    for (da, db, trans_a, trans_b, per_column, c_dims, quantized) in [
        (DType::U8, DType::I8, 0, 1, true, Some(vec![9]), true),
        (DType::I8, DType::I8, 1, 0, false, Some(vec![5, 1]), true),
        (DType::U8, DType::U8, 0, 0, true, None, false),
        (DType::U8, DType::I8, 1, 1, false, Some(vec![5, 9]), false),
    ] {
        let (m, k, n) = (5, 33, 9);
        let a = ints(da, &if trans_a == 1 { vec![k, m] } else { vec![m, k] }, 1);
        let b = ints(db, &if trans_b == 1 { vec![n, k] } else { vec![k, n] }, 2);
        let bq: &[usize] = if per_column { &[9] } else { &[] };
        let c = ms("QGemm").attrs(&[("transA", Attr::Int(trans_a)), ("transB", Attr::Int(trans_b)), ("alpha", Attr::Float(0.75))]);
        let c = triple(c, a, scale(&[], 3), ints(da, &[], 4), true);
        let c = triple(c, b, scale(bq, 5), ints(db, bq, 6), true);
        let c = match c_dims {
            Some(d) => c.constant(Tensor::from_f64(DType::I32, &d, &(0..d.iter().product::<usize>()).map(|i| (i as f64 * 7919.0) % 40000.0 - 20000.0).collect::<Vec<_>>()).unwrap()),
            None => c.omitted(),
        };
        let c = if quantized { c.constant(Tensor::scalar(0.8f32)).constant(ints(da, &[], 7)) } else { c };
        s.check(c, Tolerance::EXACT);
    }
    // MatMulIntegerToFloat: batched, b per column, a bias; uint8 B without zero points.
    let bias = rand_f32(&[7], 8);
    let c = ms("MatMulIntegerToFloat").input(ints(DType::U8, &[2, 5, 33], 1)).constant(ints(DType::I8, &[33, 7], 2)).constant(scale(&[], 3)).constant(scale(&[7], 4));
    s.check(c.constant(ints(DType::U8, &[], 5)).constant(ints(DType::I8, &[7], 6)).constant(bias.clone()), Tolerance::EXACT);
    let c = ms("MatMulIntegerToFloat").input(ints(DType::I8, &[4, 33], 1)).input(ints(DType::U8, &[33, 7], 2)).input(scale(&[], 3)).input(scale(&[], 4));
    s.check(c, Tolerance::EXACT);
    // DynamicQuantizeMatMul: A quantized on the device.
    let c = ms("DynamicQuantizeMatMul").input(rand_f32_map(&[3, 4, 33], 9, |v| v * 3.0 - 0.5)).constant(ints(DType::I8, &[33, 7], 2)).constant(scale(&[7], 4));
    s.check(c.constant(ints(DType::I8, &[7], 6)).constant(bias), Tolerance::EXACT);
    let c = ms("DynamicQuantizeMatMul").input(rand_f32_map(&[5, 33], 10, |v| v.abs())).input(ints(DType::U8, &[33, 2], 3)).input(scale(&[], 4));
    s.check(c, Tolerance::EXACT);
    // MatMulNBits: 4-bit f32 compute (packed, f32 and default zero points, g_idx), int8
    // compute, 2- and 8-bit.
    for (bits, bs, k, acc, zp, g_idx) in [(4, 16, 70, 0, "packed", false), (4, 32, 64, 0, "f32", true), (4, 16, 70, 4, "packed", false), (2, 32, 96, 4, "none", false), (8, 16, 48, 0, "packed", false)] {
        let n = 11;
        let nb = (k + bs - 1) / bs;
        let attrs = [("K", Attr::Int(k as i64)), ("N", Attr::Int(n as i64)), ("bits", Attr::Int(bits)), ("block_size", Attr::Int(bs as i64)), ("accuracy_level", Attr::Int(acc))];
        let c = ms("MatMulNBits").attrs(&attrs).input(rand_f32(&[2, 3, k], 11)).constant(ints(DType::U8, &[n, nb, bs * bits as usize / 8], 12)).constant(scale(&[n, nb], 13));
        let c = match zp {
            "packed" => c.constant(ints(DType::U8, &[n, (nb * bits as usize).div_ceil(8)], 14)),
            "f32" => c.constant(rand_f32_map(&[n, nb], 15, |v| (v + 1.0) * 7.5)),
            _ => c.omitted(),
        };
        let c = if g_idx { c.constant(Tensor::from_vec(&[k], (0..k).map(|i| ((i * 5) % nb) as i32).collect()).unwrap()) } else { c.omitted() };
        s.check(c.constant(rand_f32(&[n], 16)), Tolerance::f32(1e-6));
    }
    s.finish();
}
