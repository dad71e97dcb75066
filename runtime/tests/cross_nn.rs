//! Conv, ConvTranspose, pooling, normalisation, Attention, losses, RotaryEmbedding,
//! GridSample, RoiAlign, MaxUnpool, Col2Im and AffineGrid (and the host op
//! NonMaxSuppression) on every device against the f64 reference: odd spatial sizes, groups,
//! depthwise, dilations, strides, asymmetric pads, auto_pad, fused epilogues, planes
//! and rows beyond the GPU's per-invocation loop budget.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Tensor};
use kiln_ops::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use kiln_ops::MATMUL_RESIDUAL_ATTR;

/// A tensor around +0.25 so that means are far from 0.
fn shifted(dims: &[usize], seed: u64) -> Tensor {
    rand_f32_map(dims, seed, |x| x * 0.5 + 0.25)
}

fn conv(opset: i64, x: Tensor, w: Tensor) -> Case {
    Case::new("Conv").opset(opset).input(x).constant(w)
}

#[test]
fn conv_agrees_across_attributes() {
    let mut s = Suite::new("Conv");
    // (N, C, H, W, M, K, group, stride, dilation, pads)
    let cases: [(usize, usize, usize, usize, usize, usize, usize, i64, i64, [i64; 4]); 8] = [
        (1, 3, 13, 11, 5, 3, 1, 1, 1, [1, 1, 1, 1]),
        (2, 4, 9, 9, 6, 3, 2, 2, 1, [0, 1, 2, 0]),
        (1, 8, 15, 15, 8, 3, 8, 1, 1, [1, 1, 1, 1]),
        (1, 8, 15, 15, 8, 3, 8, 2, 1, [1, 1, 1, 1]),
        (1, 5, 17, 7, 7, 1, 1, 1, 1, [0, 0, 0, 0]),
        (1, 3, 20, 20, 4, 3, 1, 1, 2, [2, 2, 2, 2]),
        (1, 3, 29, 29, 16, 7, 1, 2, 1, [3, 3, 3, 3]),
        (1, 16, 7, 7, 33, 1, 1, 1, 1, [0, 0, 0, 0]),
    ];
    for (i, &(n, c, h, w, m, k, g, st, d, p)) in cases.iter().enumerate() {
        let attrs = [("group", Attr::Int(g as i64)), ("strides", ints(&[st, st])), ("dilations", ints(&[d, d])), ("pads", ints(&p))];
        let base = || conv(11, rand_f32(&[n, c, h, w], i as u64), rand_f32(&[m, c / g, k, k], 100 + i as u64)).attrs(&attrs);
        s.check(base().constant(rand_f32(&[m], 200 + i as u64)), Tolerance::DEFAULT);
        s.check(base(), Tolerance::DEFAULT);
    }
    for pad in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
        let c = conv(11, rand_f32(&[1, 2, 10, 9], 1), rand_f32(&[3, 2, 4, 3], 2));
        s.check(c.attr("auto_pad", string(pad)).attr("strides", ints(&[2, 2])), Tolerance::DEFAULT);
    }
    s.check(conv(11, rand_f32(&[2, 3, 31], 1), rand_f32(&[4, 3, 5], 2)).attr("pads", ints(&[2, 1])), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn conv_transpose_agrees() {
    let mut s = Suite::new("ConvTranspose");
    let ct = |w: &[usize]| Case::new("ConvTranspose").opset(11).input(rand_f32(&[1, 4, 7, 6], 1)).constant(rand_f32(w, 2));
    s.check(ct(&[4, 3, 3, 3]).constant(rand_f32(&[3], 3)).attr("strides", ints(&[2, 2])).attr("pads", ints(&[1, 0, 1, 1])), Tolerance::DEFAULT);
    let grouped = ct(&[4, 2, 2, 2]).attr("strides", ints(&[2, 2])).attr("group", Attr::Int(2));
    s.check(grouped.attr("output_padding", ints(&[1, 1])), Tolerance::DEFAULT);
    s.check(ct(&[4, 5, 3, 3]).attr("dilations", ints(&[2, 2])), Tolerance::DEFAULT);
    // Many images of small planes (the CPU takes them side by side in one GEMM), as
    // training's data gradients: filters as a graph input, groups, a bias.
    let batched = Case::new("ConvTranspose").opset(11).input(rand_f32(&[37, 4, 4, 3], 4)).input(rand_f32(&[4, 3, 3, 3], 5));
    s.check(batched.constant(rand_f32(&[6], 6)).attr("group", Attr::Int(2)).attr("pads", ints(&[1, 1, 1, 1])), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn pooling_and_norms_agree() {
    let mut s = Suite::new("pooling and norms");
    let x = rand_f32(&[2, 3, 15, 14], 5);
    let pool = |op: &str, opset: i64| Case::new(op).opset(opset).input(x.clone());
    for ceil in [0i64, 1] {
        let a = [("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("pads", ints(&[1, 0, 1, 1])), ("ceil_mode", Attr::Int(ceil))];
        s.check(pool("MaxPool", 12).attrs(&a), Tolerance::EXACT);
        s.check(pool("AveragePool", 19).attrs(&a), Tolerance::f32(1e-6));
        s.check(pool("AveragePool", 19).attrs(&a).attr("count_include_pad", Attr::Int(1)), Tolerance::f32(1e-6));
    }
    // Conv's filter gradient: strides, pads, dilations, groups, 1-D.
    let cwg = |x: &[usize], dy: &[usize], a: &[(&str, Attr)]| Case::new("ConvWeightGrad").domain("kiln").input(rand_f32(x, 11)).input(rand_f32(dy, 12)).attrs(a);
    s.check(cwg(&[2, 3, 9, 8], &[2, 4, 5, 8], &[("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 1])), ("pads", ints(&[1, 1, 1, 1]))]), Tolerance::f32(1e-5));
    s.check(cwg(&[3, 4, 7, 7], &[3, 6, 3, 5], &[("kernel_shape", ints(&[2, 3])), ("dilations", ints(&[2, 1])), ("strides", ints(&[2, 1])), ("group", Attr::Int(2))]), Tolerance::f32(1e-5));
    s.check(cwg(&[2, 2, 11], &[2, 3, 3], &[("kernel_shape", ints(&[3])), ("strides", ints(&[3]))]), Tolerance::f32(1e-5));
    s.check(cwg(&[37, 3, 5, 4], &[37, 4, 5, 4], &[("kernel_shape", ints(&[3, 3])), ("pads", ints(&[1, 1, 1, 1]))]), Tolerance::f32(1e-5));
    // MaxPool's gradient: the window maxima found again from X; ties (repeated values)
    // go to the first, as MaxPool's Indices. Overlapping windows add up (CPU).
    let ties = Tensor::from_vec(&[2, 3, 15, 14], (0..2 * 3 * 15 * 14).map(|i| ((i * 7) % 5) as f32).collect()).unwrap();
    for xin in [x.clone(), ties] {
        let grad = |k: usize, st: usize, pads: &[i64]| {
            let a = [("kernel_shape", ints(&[k as i64, k as i64])), ("strides", ints(&[st as i64, st as i64])), ("pads", Attr::Ints(pads.to_vec()))];
            let dims = [2, 3, (15 + pads[0] as usize + pads[2] as usize - k) / st + 1, (14 + pads[1] as usize + pads[3] as usize - k) / st + 1];
            Case::new("MaxPoolGrad").domain("kiln").input(xin.clone()).input(rand_f32(&dims, 9)).attrs(&a)
        };
        s.check(grad(2, 2, &[0, 0, 0, 0]), Tolerance::EXACT);
        s.check(grad(3, 3, &[1, 1, 1, 0]), Tolerance::EXACT);
        s.check(grad(3, 2, &[1, 1, 1, 1]), Tolerance::f32(1e-6));
    }
    // f16 (mixed-precision training): on SHADER_F16 adapters a one-node graph's f16
    // inputs and outputs are stored as halves by these kernels.
    let h = |dims: &[usize], seed: u64| Tensor::from_f64(DType::F16, dims, &rand_f32(dims, seed).to_f64_vec()).unwrap();
    let k22 = [("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
    s.check(Case::new("MaxPoolGrad").domain("kiln").input(h(&[2, 3, 6, 6], 1)).input(h(&[2, 3, 3, 3], 2)).attrs(&k22), Tolerance::EXACT);
    s.check(Case::new("MaxPool").input(h(&[2, 3, 6, 6], 1)).attrs(&k22), Tolerance::EXACT);
    s.check(Case::new("Conv").input(h(&[2, 3, 7, 6], 3)).input(h(&[4, 3, 3, 3], 4)).input(h(&[4], 5)).attrs(&[("pads", ints(&[1, 1, 1, 1]))]), Tolerance::DEFAULT);
    s.check(Case::new("ConvTranspose").input(h(&[2, 3, 4, 4], 6)).input(h(&[3, 2, 3, 3], 7)).attrs(&[("strides", ints(&[2, 2]))]), Tolerance::DEFAULT);
    s.check(cwg(&[2, 3, 9, 8], &[2, 4, 5, 8], &[("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 1])), ("pads", ints(&[1, 1, 1, 1]))]).with_floats_as(DType::F16), Tolerance::DEFAULT);
    let same = pool("MaxPool", 12).attr("kernel_shape", ints(&[2, 2])).attr("dilations", ints(&[2, 2]));
    s.check(same.attr("auto_pad", string("SAME_UPPER")), Tolerance::EXACT);
    s.check(pool("AveragePool", 19).attr("kernel_shape", ints(&[3, 2])).attr("auto_pad", string("SAME_LOWER")), Tolerance::f32(1e-6));
    s.check(pool("GlobalAveragePool", 13), Tolerance::f32(1e-6));
    s.check(pool("GlobalMaxPool", 13), Tolerance::EXACT);
    let bn = pool("BatchNormalization", 15).constant(rand_f32(&[3], 1)).constant(rand_f32(&[3], 2)).constant(rand_f32(&[3], 3));
    s.check(bn.constant(f32s(&[3], &[0.5, 1.0, 2.0])).attr("epsilon", Attr::Float(1e-3)), Tolerance::f32(1e-6));
    s.check(pool("InstanceNormalization", 6).constant(rand_f32(&[3], 1)).constant(rand_f32(&[3], 2)), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn big_planes_stay_within_the_gpu_loop_budget() {
    // Planes above lavapipe's 65535-iteration budget use a workgroup per channel.
    let mut s = Suite::new("big planes");
    for dims in [[1usize, 4, 300, 300], [2, 3, 70, 1000], [1, 3, 45, 47]] {
        let x = shifted(&dims, 3);
        s.check(Case::new("GlobalAveragePool").opset(13).input(x.clone()), Tolerance::DEFAULT);
        s.check(Case::new("GlobalMaxPool").opset(13).input(x.clone()), Tolerance::EXACT);
        let c = dims[1];
        let inorm = Case::new("InstanceNormalization").opset(6).input(x).constant(rand_f32(&[c], 1));
        s.check(inorm.constant(rand_f32(&[c], 2)), Tolerance::f32(1e-4));
    }
    s.finish();
}

/// The activation attributes of a fused epilogue.
fn activation(name: &str, params: &[f32]) -> [(&'static str, Attr); 2] {
    [(ACTIVATION_ATTR, string(name)), (ACTIVATION_PARAMS_ATTR, Attr::Floats(params.to_vec()))]
}

#[test]
fn fused_conv_activations_agree() {
    let mut s = Suite::new("Conv with fused activations");
    let acts: [(&str, &[f32]); 6] = [("Relu", &[]), ("Clip", &[0.0, 6.0]), ("LeakyRelu", &[0.1]), ("HardSigmoid", &[0.2, 0.5]), ("HardSwish", &[]), ("Sigmoid", &[])];
    let x = rand_f32(&[1, 8, 19, 23], 4);
    let weights = [(rand_f32(&[12, 8, 3, 3], 5), 1i64, 1i64), (rand_f32(&[8, 1, 3, 3], 6), 8, 1), (rand_f32(&[12, 8, 1, 1], 7), 1, 0)];
    for (name, params) in acts {
        for (w, group, pad) in &weights {
            let c = conv(13, x.clone(), w.clone()).constant(rand_f32(&[w.dims()[0]], 8));
            s.check(c.attr("group", Attr::Int(*group)).attr("pads", ints(&[*pad; 4])).attrs(&activation(name, params)), Tolerance::DEFAULT);
        }
    }
    s.finish();
}

#[test]
fn fused_conv_residual_agrees() {
    let mut s = Suite::new("Conv with a fused residual");
    // (weights, group, pad, stride, bias, activation): a ResNet block conv, depthwise,
    // a strided 1x1 downsample without bias or activation.
    let cases = [
        (rand_f32(&[12, 8, 3, 3], 22), 1i64, 1i64, 1i64, true, Some(("Relu", &[][..]))),
        (rand_f32(&[8, 1, 3, 3], 23), 8, 1, 1, true, Some(("Clip", &[0.0f32, 6.0][..]))),
        (rand_f32(&[16, 8, 1, 1], 24), 1, 0, 2, false, None),
        (rand_f32(&[5, 8, 5, 3], 25), 1, 2, 2, true, Some(("Sigmoid", &[][..]))),
    ];
    for (i, (w, group, pad, stride, bias, act)) in cases.into_iter().enumerate() {
        let (m, kh, kw) = (w.dims()[0], w.dims()[2], w.dims()[3]);
        let out = |n: usize, k: usize| (n + 2 * pad as usize - k) / stride as usize + 1;
        let residual = rand_f32(&[2, m, out(13, kh), out(11, kw)], 30 + i as u64);
        let mut c = conv(13, rand_f32(&[2, 8, 13, 11], 21), w);
        c = if bias { c.constant(rand_f32(&[m], 40)) } else { c.omitted() };
        c = c.input(residual).attr("group", Attr::Int(group)).attr("pads", ints(&[pad; 4])).attr("strides", ints(&[stride, stride]));
        c = c.attr(MATMUL_RESIDUAL_ATTR, Attr::Int(1));
        if let Some((name, params)) = act {
            c = c.attrs(&activation(name, params));
        }
        s.check(c, Tolerance::DEFAULT);
    }
    s.finish();
}

#[test]
fn layer_normalization_agrees() {
    let mut s = Suite::new("LayerNormalization");
    for (dims, axis) in [(vec![3usize, 17, 128], -1i64), (vec![2, 5, 7], 1), (vec![4, 65], -1)] {
        let row: Vec<usize> = dims[(if axis < 0 { dims.len() as i64 + axis } else { axis }) as usize..].to_vec();
        let c = Case::new("LayerNormalization").opset(17).input(rand_f32(&dims, 1)).constant(rand_f32(&row, 2));
        let c = c.constant(rand_f32(&row[row.len() - 1..], 3)).attr("axis", Attr::Int(axis)).attr("epsilon", Attr::Float(1e-5));
        s.check(c.outputs(3), Tolerance::DEFAULT);
    }
    s.finish();
}

#[test]
fn attention_agrees() {
    let mut s = Suite::new("Attention");
    let att = |opset: i64, inputs: Vec<Input>, outputs: usize| Case::new("Attention").opset(opset).inputs(inputs).outputs(outputs);
    let data = |dims: &[usize], seed: u64| Input::Data(rand_f32(dims, seed));
    // 4-D, grouped heads, causal, a float mask shorter than the keys, all four outputs.
    let qkv = || vec![data(&[2, 6, 5, 8], 1), data(&[2, 2, 7, 8], 2), data(&[2, 2, 7, 5], 3)];
    for mode in [0i64, 1, 3] {
        let mut ins = qkv();
        ins.push(data(&[2, 1, 5, 6], 4));
        let attrs = [("is_causal", Attr::Int(1)), ("qk_matmul_output_mode", Attr::Int(mode)), ("softcap", Attr::Float(1.5))];
        s.check(att(23, ins, 4).attrs(&attrs), Tolerance::DEFAULT);
    }
    // Mode 2 (scores plus bias) without masked keys.
    let mut ins = qkv();
    ins.push(data(&[5, 7], 5));
    s.check(att(23, ins, 4).attr("qk_matmul_output_mode", Attr::Int(2)).attr("scale", Attr::Float(0.2)), Tolerance::DEFAULT);
    // 3-D with past keys and values and a bool mask.
    let bmask = bools(&[4, 9], &(0..4 * 9).map(|i| i % 7 != 3).collect::<Vec<_>>());
    let ins = vec![data(&[2, 4, 36], 5), data(&[2, 6, 12], 6), data(&[2, 6, 15], 7), Input::Data(bmask), data(&[2, 3, 3, 4], 8), data(&[2, 3, 3, 5], 9)];
    s.check(att(23, ins, 3).attr("q_num_heads", Attr::Int(9)).attr("kv_num_heads", Attr::Int(3)), Tolerance::DEFAULT);
    // nonpad_kv_seqlen (one row with a negative causal offset) and a window (opset 25).
    let nonpad = Input::Data(i64_vec(&[6, 2]));
    let ins = vec![data(&[2, 3, 4, 8], 1), data(&[2, 3, 8, 8], 2), data(&[2, 3, 8, 8], 3), Input::Omitted, Input::Omitted, Input::Omitted, nonpad];
    s.check(att(25, ins, 1).attr("is_causal", Attr::Int(1)).attr("left_window_size", Attr::Int(2)), Tolerance::DEFAULT);
    // Value heads of 8 and 6 (the weighted sum writes 4 or 2 elements per invocation),
    // with past keys and values.
    for dv in [8usize, 6] {
        let ins = vec![data(&[2, 4, 3, 4], 1), data(&[2, 2, 5, 4], 2), data(&[2, 2, 5, dv], 3), Input::Omitted, data(&[2, 2, 4, 4], 4), data(&[2, 2, 4, dv], 5)];
        s.check(att(23, ins, 3).attr("is_causal", Attr::Int(1)), Tolerance::DEFAULT);
    }
    // Y only, no past: scores of 4 (12 keys) or 2 (6 keys) keys per invocation, with a
    // float mask over (batch, 1, q, keys), grouped heads, and a bool mask with causal.
    let ins = vec![data(&[2, 4, 5, 8], 1), data(&[2, 2, 12, 8], 2), data(&[2, 2, 12, 3], 3), data(&[2, 1, 5, 12], 4)];
    s.check(att(23, ins, 1).attr("scale", Attr::Float(0.125)), Tolerance::DEFAULT);
    let mask = bools(&[5, 6], &(0..5 * 6).map(|i| i % 4 != 1).collect::<Vec<_>>());
    let ins = vec![data(&[1, 2, 5, 4], 1), data(&[1, 2, 6, 4], 2), data(&[1, 2, 6, 4], 3), Input::Data(mask)];
    s.check(att(23, ins, 1).attr("is_causal", Attr::Int(1)), Tolerance::DEFAULT);
    // Long rows: the softmax uses a workgroup of lanes per row.
    let ins = vec![data(&[1, 2, 3, 4], 1), data(&[1, 1, 25000, 4], 2), data(&[1, 1, 25000, 3], 3)];
    s.check(att(23, ins, 1), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn losses_agree() {
    let mut s = Suite::new("losses");
    // Small and large (a workgroup of lanes folds > 2048 positions) inputs.
    for (dims, seed) in [(vec![3usize, 5, 7], 1u64), (vec![4, 6, 40, 30], 2)] {
        let (n, c) = (dims[0], dims[1]);
        let inner: usize = dims[2..].iter().product();
        let tdims: Vec<usize> = [n].into_iter().chain(dims[2..].iter().copied()).collect();
        let target = i64s(&tdims, &(0..n * inner).map(|i| ((i * 7 + seed as usize) % c) as i64).collect::<Vec<_>>());
        let weight = rand_f32_map(&[c], 9, |w| w.abs() + 0.1);
        for reduction in ["none", "sum", "mean"] {
            let loss = |op: &str| Case::new(op).opset(13).input(rand_f32(&dims, seed)).input(target.clone()).attr("reduction", string(reduction));
            let ignore = Attr::Int(2);
            s.check(loss("NegativeLogLikelihoodLoss").constant(weight.clone()).attr("ignore_index", ignore.clone()), Tolerance::DEFAULT);
            s.check(loss("SoftmaxCrossEntropyLoss").attr("ignore_index", ignore).outputs(2), Tolerance::DEFAULT);
            s.check(loss("SoftmaxCrossEntropyLoss").constant(weight.clone()), Tolerance::DEFAULT);
        }
    }
    s.finish();
}

#[test]
fn more_normalizations_agree() {
    let mut s = Suite::new("normalizations");
    // Small blocks (one invocation each) and big ones (a workgroup of lanes each).
    for dims in [vec![3usize, 4, 5, 3], vec![1, 6, 70, 71]] {
        let c = dims[1];
        let x = shifted(&dims, 1);
        let norm = |op: &str, opset: i64| Case::new(op).opset(opset).input(x.clone());
        let groups = Attr::Int(2);
        s.check(norm("GroupNormalization", 21).constant(rand_f32(&[c], 2)).constant(rand_f32(&[c], 3)).attr("num_groups", groups.clone()), Tolerance::DEFAULT);
        s.check(norm("GroupNormalization", 18).constant(rand_f32(&[2], 2)).constant(rand_f32(&[2], 3)).attr("num_groups", groups), Tolerance::DEFAULT);
        s.check(norm("RMSNormalization", 23).constant(rand_f32(&dims[2..], 4)).attr("axis", Attr::Int(2)), Tolerance::DEFAULT);
        s.check(norm("MeanVarianceNormalization", 13), Tolerance::DEFAULT);
        s.check(norm("MeanVarianceNormalization", 13).attr("axes", ints(&[1, 3])), Tolerance::DEFAULT);
        for p in [1i64, 2] {
            s.check(norm("LpNormalization", 22).attr("axis", Attr::Int(2)).attr("p", Attr::Int(p)), Tolerance::DEFAULT);
        }
        let lrn = norm("LRN", 13).attr("size", Attr::Int(3)).attr("alpha", Attr::Float(0.2));
        s.check(lrn.attr("beta", Attr::Float(0.7)), Tolerance::DEFAULT);
    }
    s.check(Case::new("LpNormalization").opset(22).input(rand_f32(&[3, 9000], 2)), Tolerance::DEFAULT);
    s.check(Case::new("RMSNormalization").opset(23).input(rand_f32(&[5, 9000], 2)).constant(rand_f32(&[9000], 3)), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn rotary_embedding_agrees() {
    let mut s = Suite::new("RotaryEmbedding");
    let pos = i64s(&[2, 5], &[0, 3, 7, 1, 2, 8, 4, 4, 0, 6]);
    for (interleaved, rdim) in [(0i64, 0i64), (1, 0), (0, 6), (1, 4)] {
        let half = if rdim == 0 { 5 } else { rdim as usize / 2 };
        let rope = |x: Tensor| Case::new("RotaryEmbedding").opset(23).input(x).attr("interleaved", Attr::Int(interleaved)).attr("rotary_embedding_dim", Attr::Int(rdim));
        let four_d = rope(rand_f32(&[2, 3, 5, 10], 3)).constant(rand_f32(&[9, half], 1)).constant(rand_f32(&[9, half], 2)).input(pos.clone());
        s.check(four_d, Tolerance::f32(1e-6));
        let three_d = rope(rand_f32(&[2, 5, 30], 4)).input(rand_f32(&[2, 5, half], 5)).input(rand_f32(&[2, 5, half], 6));
        s.check(three_d.attr("num_heads", Attr::Int(3)), Tolerance::f32(1e-6));
    }
    s.finish();
}

#[test]
fn grid_sample_agrees() {
    let mut s = Suite::new("GridSample");
    let (x2, g2) = (rand_f32(&[2, 3, 9, 7], 1), rand_f32_map(&[2, 5, 6, 2], 2, |g| g * 1.4));
    let (x3, g3) = (rand_f32(&[1, 2, 5, 4, 6], 3), rand_f32_map(&[1, 3, 2, 4, 3], 4, |g| g * 1.4));
    for mode in ["nearest", "linear", "cubic"] {
        for pad in ["zeros", "border", "reflection"] {
            for align in [0i64, 1] {
                let attrs = [("mode", string(mode)), ("padding_mode", string(pad)), ("align_corners", Attr::Int(align))];
                for (x, g) in [(&x2, &g2), (&x3, &g3)] {
                    s.check(Case::new("GridSample").opset(22).input(x.clone()).input(g.clone()).attrs(&attrs), Tolerance::DEFAULT);
                }
            }
        }
    }
    s.finish();
}

/// Conv in f16 and f64 (converted at upload and download on the GPU).
#[test]
fn conv_agrees_in_f16_and_f64() {
    let mut s = Suite::new("Conv f16/f64");
    for dtype in [DType::F16, DType::F64] {
        let c = conv(11, cast(&rand_f32(&[1, 3, 9, 7], 1), dtype), cast(&rand_f32(&[4, 3, 3, 3], 2), dtype));
        s.check(c.attr("pads", ints(&[1, 1, 1, 1])), Tolerance::DEFAULT);
    }
    s.finish();
}

#[test]
fn roi_align_agrees() {
    let mut s = Suite::new("RoiAlign");
    let x = rand_f32(&[2, 3, 11, 9], 1);
    // Inside, around the image, tiny, reversed, far outside, and wider than the image.
    let rois = f32s(&[6, 4], &[0.3, 0.2, 6.7, 8.1, -2.0, -3.0, 12.0, 9.0, 1.0, 1.0, 1.2, 1.1, 7.5, 6.5, 0.5, 1.0, -30.0, -30.0, -20.0, -25.0, -40.0, 2.5, 50.0, 7.25]);
    let bi = i64s(&[6], &[0, 1, 1, 0, 1, 0]);
    for mode in ["avg", "max"] {
        for ctm in ["half_pixel", "output_half_pixel"] {
            for (sr, scale) in [(0i64, 1.0f32), (2, 0.5), (3, 1.25)] {
                let c = Case::new("RoiAlign").opset(16).input(x.clone()).input(rois.clone()).input(bi.clone());
                let attrs = [("mode", string(mode)), ("coordinate_transformation_mode", string(ctm)), ("sampling_ratio", Attr::Int(sr)), ("spatial_scale", Attr::Float(scale))];
                s.check(c.attrs(&attrs).attr("output_height", Attr::Int(3)).attr("output_width", Attr::Int(4)), Tolerance::DEFAULT);
            }
        }
    }
    s.check(Case::new("RoiAlign").opset(10).input(x).input(rois).input(bi).attr("output_height", Attr::Int(2)), Tolerance::DEFAULT);
    s.finish();
}

#[test]
fn unpool_col2im_and_affine_grid_agree() {
    let mut s = Suite::new("MaxUnpool, Col2Im, AffineGrid");
    // MaxUnpool: indices over the whole output, repeats (the last element wins), a
    // larger output_shape, 1-D and 3-D kernels.
    let x = rand_f32(&[2, 3, 5, 4], 1);
    let idx: Vec<i64> = (0..120).map(|k| (k * 7 + (k % 5) * 3) % 130 * 3 % 390).collect();
    let unpool = |x: Tensor, idx: Vec<i64>, k: &[i64], st: &[i64]| {
        let i = i64s(x.dims(), &idx);
        Case::new("MaxUnpool").opset(22).input(x).input(i).attr("kernel_shape", ints(k)).attr("strides", ints(st))
    };
    s.check(unpool(x.clone(), idx.clone(), &[3, 2], &[2, 2]), Tolerance::EXACT);
    s.check(unpool(x.clone(), idx.iter().map(|v| v % 17).collect(), &[2, 2], &[2, 2]), Tolerance::EXACT);
    s.check(unpool(x.clone(), idx.clone(), &[2, 2], &[2, 2]).constant(i64s(&[4], &[2, 3, 11, 9])), Tolerance::EXACT);
    s.check(unpool(rand_f32(&[1, 2, 7], 2), (0..14).map(|k| (k * 5) % 28).collect(), &[2], &[2]), Tolerance::EXACT);
    let x3 = rand_f32(&[1, 2, 2, 3, 2], 3);
    s.check(unpool(x3, (0..24).map(|k| (k * 11) % 160).collect(), &[2, 2, 2], &[2, 2, 2]), Tolerance::EXACT);
    let xi = Tensor::from_slice(&[1, 1, 2, 2], &[5i32, -7, 9, 11]).unwrap();
    s.check(unpool(xi, vec![3, 0, 15, 6], &[2, 2], &[2, 2]), Tolerance::EXACT);
    // Col2Im: strides, dilations, asymmetric pads, 1-D and 3-D images.
    let col2im = |dims: &[usize], image: &[i64], block: &[i64], seed: u64| {
        Case::new("Col2Im").opset(18).input(rand_f32(dims, seed)).constant(i64_vec(image)).constant(i64_vec(block))
    };
    s.check(col2im(&[2, 12, 24], &[7, 6], &[2, 2], 4).attr("pads", ints(&[1, 0, 0, 2])).attr("strides", ints(&[2, 1])).attr("dilations", ints(&[1, 2])), Tolerance::DEFAULT);
    s.check(col2im(&[1, 18, 56], &[9, 10], &[3, 3], 5), Tolerance::DEFAULT);
    s.check(col2im(&[3, 4, 9], &[11], &[2], 6).attr("strides", ints(&[1])).attr("dilations", ints(&[2])).attr("pads", ints(&[0, 0])), Tolerance::DEFAULT);
    s.check(col2im(&[1, 16, 24], &[3, 4, 5], &[2, 2, 2], 7), Tolerance::DEFAULT);
    // AffineGrid, 2-D and 3-D, both corner conventions, dims of size 1.
    for align in [0i64, 1] {
        let grid = |theta: Tensor, size: &[i64]| Case::new("AffineGrid").opset(20).input(theta).constant(i64_vec(size)).attr("align_corners", Attr::Int(align));
        s.check(grid(rand_f32(&[2, 2, 3], 8), &[2, 3, 7, 5]), Tolerance::DEFAULT);
        s.check(grid(rand_f32(&[1, 2, 3], 9), &[1, 1, 1, 6]), Tolerance::DEFAULT);
        s.check(grid(rand_f32(&[2, 3, 4], 10), &[2, 1, 3, 4, 5]), Tolerance::DEFAULT);
    }
    s.finish();
}

#[test]
fn non_max_suppression_agrees() {
    // A host op, like NonZero: small inputs are bound by value and the node folds.
    let mut s = Suite::new("NonMaxSuppression");
    let boxes = f32s(&[1, 3, 4], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 2.0, 1.0, 3.0]);
    let scores = f32s(&[1, 1, 3], &[0.9, 0.8, 0.7]);
    let nms = || Case::new("NonMaxSuppression").opset(11).input(boxes.clone()).input(scores.clone()).input(i64s(&[1], &[3])).input(f32s(&[1], &[0.5]));
    s.check(nms(), Tolerance::EXACT);
    s.check(nms().input(f32s(&[1], &[0.75])), Tolerance::EXACT);
    s.finish();
}

#[test]
fn deform_conv_causal_conv_and_linear_attention_agree() {
    let mut s = Suite::new("DeformConv, CausalConvWithState, LinearAttention");
    let tol = Tolerance::f32(2e-5);
    // DeformConv: offsets up to 3 px (samples leave the image), groups, mask, bias.
    let x = rand_f32(&[2, 4, 7, 6], 1);
    let w = rand_f32(&[6, 2, 3, 2], 2);
    let off = rand_f32_map(&[2, 2 * 3 * 2 * 2, 4, 3], 3, |v| v * 3.0);
    let case = Case::new("DeformConv")
        .opset(19)
        .attrs(&[("group", Attr::Int(2)), ("offset_group", Attr::Int(2)), ("strides", ints(&[2, 2])), ("pads", ints(&[1, 0, 1, 1])), ("dilations", ints(&[1, 2]))])
        .input(x.clone())
        .input(w.clone())
        .input(off.clone());
    s.check(case.clone(), tol);
    s.check(case.input(rand_f32(&[6], 4)).input(rand_f32_map(&[2, 12, 4, 3], 5, |v| v.abs())), tol);
    // CausalConvWithState: with and without past state and bias, SiLU, K = 1.
    let (xi, wk) = (rand_f32(&[2, 5, 9], 6), rand_f32(&[5, 1, 4], 7));
    let conv = |x: &Tensor, w: &Tensor| Case::new("CausalConvWithState").opset(27).outputs(2).input(x.clone()).input(w.clone());
    s.check(conv(&xi, &wk), tol);
    s.check(conv(&xi, &wk).input(rand_f32(&[5], 8)).input(rand_f32(&[2, 5, 3], 9)).attr("activation", string("silu")), tol);
    s.check(conv(&rand_f32(&[1, 3, 2], 10), &rand_f32(&[3, 1, 5], 11)), tol);
    s.check(conv(&xi, &rand_f32(&[5, 1, 1], 12)).attr("activation", string("swish")), tol);
    // LinearAttention: every update rule, grouped queries, per-head and per-key decay.
    let (b, t, hq, hk, dk, dv) = (2, 5, 4, 2, 3, 5);
    let qkv = |c: Case| c.input(rand_f32(&[b, t, hq * dk], 13)).input(rand_f32(&[b, t, hk * dk], 14)).input(rand_f32(&[b, t, hk * dv], 15));
    let la = |rule: &str| qkv(Case::new("LinearAttention").opset(27).outputs(2).attrs(&[("q_num_heads", Attr::Int(hq as i64)), ("kv_num_heads", Attr::Int(hk as i64)), ("update_rule", string(rule))]));
    let decay = rand_f32_map(&[b, t, hk * dk], 16, |v| -v.abs());
    let beta = rand_f32_map(&[b, t, hk], 17, |v| v.abs());
    s.check(la("linear"), tol);
    s.check(la("linear").input(rand_f32(&[b, hk, dk, dv], 18)).attr("scale", Attr::Float(0.7)), tol);
    s.check(la("gated").omitted().input(rand_f32_map(&[b, t, hk], 19, |v| -v.abs())), tol);
    s.check(la("delta").omitted().omitted().input(beta.clone()), tol);
    s.check(la("gated_delta").input(rand_f32(&[b, hk, dk, dv], 20)).input(decay).input(beta), tol);
    s.finish();
}
