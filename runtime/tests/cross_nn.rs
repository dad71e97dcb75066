//! CPU vs GPU on Conv, ConvTranspose, pooling and normalisation: odd spatial sizes,
//! groups, depthwise, dilations, strides, asymmetric pads, auto_pad.
mod common;
use common::*;
use kiln_graph::Attr;

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

#[test]
fn conv_agrees_across_attributes() {
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
    for (i, &(n, c, h, w, m, k, g, s, d, p)) in cases.iter().enumerate() {
        let x = rand_f32(&[n, c, h, w], i as u64);
        let wt = rand_f32(&[m, c / g, k, k], 100 + i as u64);
        let b = rand_f32(&[m], 200 + i as u64);
        let attrs = [("group", Attr::Int(g as i64)), ("strides", ints(&[s, s])), ("dilations", ints(&[d, d])), ("pads", ints(&p))];
        cross_check("Conv", &[In::Data(x.clone()), In::Const(wt.clone()), In::Const(b)], &attrs, 1, 11, 1e-5);
        cross_check("Conv", &[In::Data(x), In::Const(wt)], &attrs, 1, 11, 1e-5);
    }
    for pad in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
        cross_check(
            "Conv",
            &[In::Data(rand_f32(&[1, 2, 10, 9], 1)), In::Const(rand_f32(&[3, 2, 4, 3], 2))],
            &[("auto_pad", Attr::String(pad.into())), ("strides", ints(&[2, 2]))],
            1,
            11,
            1e-5,
        );
    }
    cross_check("Conv", &[In::Data(rand_f32(&[2, 3, 31], 1)), In::Const(rand_f32(&[4, 3, 5], 2))], &[("pads", ints(&[2, 1]))], 1, 11, 1e-5);
}

#[test]
fn conv_transpose_agrees() {
    let x = rand_f32(&[1, 4, 7, 6], 1);
    cross_check("ConvTranspose", &[In::Data(x.clone()), In::Const(rand_f32(&[4, 3, 3, 3], 2)), In::Const(rand_f32(&[3], 3))], &[("strides", ints(&[2, 2])), ("pads", ints(&[1, 0, 1, 1]))], 1, 11, 1e-5);
    cross_check("ConvTranspose", &[In::Data(x.clone()), In::Const(rand_f32(&[4, 2, 2, 2], 2))], &[("strides", ints(&[2, 2])), ("group", Attr::Int(2)), ("output_padding", ints(&[1, 1]))], 1, 11, 1e-5);
    cross_check("ConvTranspose", &[In::Data(x), In::Const(rand_f32(&[4, 5, 3, 3], 2))], &[("dilations", ints(&[2, 2]))], 1, 11, 1e-5);
}

#[test]
fn pooling_and_norms_agree() {
    let x = rand_f32(&[2, 3, 15, 14], 5);
    for ceil in [0i64, 1] {
        let a = [("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("pads", ints(&[1, 0, 1, 1])), ("ceil_mode", Attr::Int(ceil))];
        cross_check("MaxPool", &[In::Data(x.clone())], &a, 1, 12, 0.0);
        cross_check("AveragePool", &[In::Data(x.clone())], &a, 1, 19, 1e-6);
        let mut b = a.to_vec();
        b.push(("count_include_pad", Attr::Int(1)));
        cross_check("AveragePool", &[In::Data(x.clone())], &b, 1, 19, 1e-6);
    }
    cross_check("MaxPool", &[In::Data(x.clone())], &[("kernel_shape", ints(&[2, 2])), ("dilations", ints(&[2, 2])), ("auto_pad", Attr::String("SAME_UPPER".into()))], 1, 12, 0.0);
    cross_check("AveragePool", &[In::Data(x.clone())], &[("kernel_shape", ints(&[3, 2])), ("auto_pad", Attr::String("SAME_LOWER".into()))], 1, 19, 1e-6);
    cross_check("GlobalAveragePool", &[In::Data(x.clone())], &[], 1, 13, 1e-6);
    cross_check("GlobalMaxPool", &[In::Data(x.clone())], &[], 1, 13, 0.0);
    let c = 3;
    cross_check(
        "BatchNormalization",
        &[In::Data(x.clone()), In::Const(rand_f32(&[c], 1)), In::Const(rand_f32(&[c], 2)), In::Const(rand_f32(&[c], 3)), In::Const(kiln_graph::Tensor::from_slice(&[c], &[0.5f32, 1.0, 2.0]).unwrap())],
        &[("epsilon", Attr::Float(1e-3))],
        1,
        15,
        1e-6,
    );
    cross_check("InstanceNormalization", &[In::Data(x), In::Const(rand_f32(&[c], 1)), In::Const(rand_f32(&[c], 2))], &[], 1, 6, 1e-5);
}

/// A tensor around +0.25 so that means are far from 0.
fn shifted(dims: &[usize], seed: u64) -> kiln_graph::Tensor {
    let t = rand_f32(dims, seed);
    let v: Vec<f32> = t.as_slice::<f32>().unwrap().iter().map(|x| x * 0.5 + 0.25).collect();
    kiln_graph::Tensor::from_slice(dims, &v).unwrap()
}

#[test]
fn big_planes_stay_within_the_gpu_loop_budget() {
    // Planes above lavapipe's 65535-iteration budget use a workgroup per channel.
    for dims in [[1usize, 4, 300, 300], [2, 3, 70, 1000], [1, 3, 45, 47]] {
        let x = shifted(&dims, 3);
        cross_check("GlobalAveragePool", &[In::Data(x.clone())], &[], 1, 13, 1e-5);
        cross_check("GlobalMaxPool", &[In::Data(x.clone())], &[], 1, 13, 0.0);
        let c = dims[1];
        cross_check("InstanceNormalization", &[In::Data(x), In::Const(rand_f32(&[c], 1)), In::Const(rand_f32(&[c], 2))], &[], 1, 6, 1e-4);
    }
}

#[test]
fn fused_conv_activations_agree() {
    use kiln_ops::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
    let acts: [(&str, Vec<f32>); 6] = [
        ("Relu", vec![]),
        ("Clip", vec![0.0, 6.0]),
        ("LeakyRelu", vec![0.1]),
        ("HardSigmoid", vec![0.2, 0.5]),
        ("HardSwish", vec![]),
        ("Sigmoid", vec![]),
    ];
    let x = rand_f32(&[1, 8, 19, 23], 4);
    let weights = [(rand_f32(&[12, 8, 3, 3], 5), 1i64, 1i64), (rand_f32(&[8, 1, 3, 3], 6), 8, 1), (rand_f32(&[12, 8, 1, 1], 7), 1, 0)];
    for (name, params) in &acts {
        for (w, group, pad) in &weights {
            let attrs = [
                ("group", Attr::Int(*group)),
                ("pads", ints(&[*pad, *pad, *pad, *pad])),
                (ACTIVATION_ATTR, Attr::String(name.to_string())),
                (ACTIVATION_PARAMS_ATTR, Attr::Floats(params.clone())),
            ];
            cross_check("Conv", &[In::Data(x.clone()), In::Const(w.clone()), In::Const(rand_f32(&[w.dims()[0]], 8))], &attrs, 1, 13, 1e-5);
        }
    }
}

#[test]
fn fused_conv_residual_agrees() {
    use kiln_ops::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
    use kiln_ops::MATMUL_RESIDUAL_ATTR;
    let x = rand_f32(&[2, 8, 13, 11], 21);
    // (weights, group, pad, stride, bias, activation): a ResNet block conv, depthwise,
    // a strided 1x1 downsample without bias or activation.
    let cases = [
        (rand_f32(&[12, 8, 3, 3], 22), 1i64, 1i64, 1i64, true, Some(("Relu", vec![]))),
        (rand_f32(&[8, 1, 3, 3], 23), 8, 1, 1, true, Some(("Clip", vec![0.0f32, 6.0]))),
        (rand_f32(&[16, 8, 1, 1], 24), 1, 0, 2, false, None),
        (rand_f32(&[5, 8, 5, 3], 25), 1, 2, 2, true, Some(("Sigmoid", vec![]))),
    ];
    for (i, (w, group, pad, stride, bias, act)) in cases.into_iter().enumerate() {
        let (m, kh, kw) = (w.dims()[0], w.dims()[2], w.dims()[3]);
        let out = |n: usize, k: usize| (n + 2 * pad as usize - k) / stride as usize + 1;
        let residual = rand_f32(&[2, m, out(13, kh), out(11, kw)], 30 + i as u64);
        let mut attrs = vec![
            ("group", Attr::Int(group)),
            ("pads", ints(&[pad; 4])),
            ("strides", ints(&[stride, stride])),
            (MATMUL_RESIDUAL_ATTR, Attr::Int(1)),
        ];
        if let Some((name, params)) = act {
            attrs.push((ACTIVATION_ATTR, Attr::String(name.into())));
            attrs.push((ACTIVATION_PARAMS_ATTR, Attr::Floats(params)));
        }
        let b = if bias { In::Const(rand_f32(&[m], 40)) } else { In::None };
        cross_check("Conv", &[In::Data(x.clone()), In::Const(w), b, In::Data(residual)], &attrs, 1, 13, 1e-5);
    }
}

#[test]
fn layer_normalization_agrees() {
    for (dims, axis) in [(vec![3usize, 17, 128], -1i64), (vec![2, 5, 7], 1), (vec![4, 65], -1)] {
        let row: Vec<usize> = dims[(if axis < 0 { dims.len() as i64 + axis } else { axis }) as usize..].to_vec();
        cross_check(
            "LayerNormalization",
            &[In::Data(rand_f32(&dims, 1)), In::Const(rand_f32(&row, 2)), In::Const(rand_f32(&row[row.len() - 1..], 3))],
            &[("axis", Attr::Int(axis)), ("epsilon", Attr::Float(1e-5))],
            3,
            17,
            1e-5,
        );
    }
}

#[test]
fn attention_agrees() {
    use kiln_graph::Tensor;
    let heads = |q: i64, kv: i64| vec![("q_num_heads", Attr::Int(q)), ("kv_num_heads", Attr::Int(kv))];
    // 4-D, grouped heads, causal, a float mask shorter than the keys, all four outputs.
    let (q, k, v) = (rand_f32(&[2, 6, 5, 8], 1), rand_f32(&[2, 2, 7, 8], 2), rand_f32(&[2, 2, 7, 5], 3));
    let mask = rand_f32(&[2, 1, 5, 6], 4);
    for mode in [0i64, 1, 3] {
        let attrs = [("is_causal", Attr::Int(1)), ("qk_matmul_output_mode", Attr::Int(mode)), ("softcap", Attr::Float(1.5))];
        cross_check("Attention", &[In::Data(q.clone()), In::Data(k.clone()), In::Data(v.clone()), In::Data(mask.clone())], &attrs, 4, 23, 1e-5);
    }
    // Mode 2 (scores plus bias) without masked keys: the relative error of -inf is NaN.
    let attrs = [("qk_matmul_output_mode", Attr::Int(2)), ("scale", Attr::Float(0.2))];
    cross_check("Attention", &[In::Data(q.clone()), In::Data(k.clone()), In::Data(v.clone()), In::Data(rand_f32(&[5, 7], 5))], &attrs, 4, 23, 1e-5);
    // 3-D with past keys and values and a bool mask.
    let bools: Vec<bool> = (0..4 * 9).map(|i| i % 7 != 3).collect();
    let bmask = Tensor::from_bools(&[4, 9], &bools).unwrap();
    let inputs = [
        In::Data(rand_f32(&[2, 4, 36], 5)),
        In::Data(rand_f32(&[2, 6, 12], 6)),
        In::Data(rand_f32(&[2, 6, 15], 7)),
        In::Data(bmask),
        In::Data(rand_f32(&[2, 3, 3, 4], 8)),
        In::Data(rand_f32(&[2, 3, 3, 5], 9)),
    ];
    cross_check("Attention", &inputs, &heads(9, 3), 3, 23, 1e-5);
    // nonpad_kv_seqlen (one row with a negative causal offset) and a window (opset 25).
    let nonpad = Tensor::from_slice(&[2], &[6i64, 2]).unwrap();
    let attrs = [("is_causal", Attr::Int(1)), ("left_window_size", Attr::Int(2))];
    let inputs = [In::Data(rand_f32(&[2, 3, 4, 8], 1)), In::Data(rand_f32(&[2, 3, 8, 8], 2)), In::Data(rand_f32(&[2, 3, 8, 8], 3)), In::None, In::None, In::None, In::Data(nonpad)];
    cross_check("Attention", &inputs, &attrs, 1, 25, 1e-5);
    // Value heads of 8 and 6 (the weighted sum writes 4 or 2 elements per invocation),
    // with past keys and values.
    for dv in [8usize, 6] {
        let inputs = [
            In::Data(rand_f32(&[2, 4, 3, 4], 1)),
            In::Data(rand_f32(&[2, 2, 5, 4], 2)),
            In::Data(rand_f32(&[2, 2, 5, dv], 3)),
            In::None,
            In::Data(rand_f32(&[2, 2, 4, 4], 4)),
            In::Data(rand_f32(&[2, 2, 4, dv], 5)),
        ];
        cross_check("Attention", &inputs, &[("is_causal", Attr::Int(1))], 3, 23, 1e-5);
    }
    // Y only, no past: scores of 4 (12 keys) or 2 (6 keys) keys per invocation, with a
    // float mask over (batch, 1, q, keys), grouped heads, and a bool mask with causal.
    let inputs = [In::Data(rand_f32(&[2, 4, 5, 8], 1)), In::Data(rand_f32(&[2, 2, 12, 8], 2)), In::Data(rand_f32(&[2, 2, 12, 3], 3)), In::Data(rand_f32(&[2, 1, 5, 12], 4))];
    cross_check("Attention", &inputs, &[("scale", Attr::Float(0.125))], 1, 23, 1e-5);
    let bools: Vec<bool> = (0..5 * 6).map(|i| i % 4 != 1).collect();
    let inputs = [In::Data(rand_f32(&[1, 2, 5, 4], 1)), In::Data(rand_f32(&[1, 2, 6, 4], 2)), In::Data(rand_f32(&[1, 2, 6, 4], 3)), In::Data(Tensor::from_bools(&[5, 6], &bools).unwrap())];
    cross_check("Attention", &inputs, &[("is_causal", Attr::Int(1))], 1, 23, 1e-5);
    // Long rows: the softmax uses a workgroup of lanes per row.
    cross_check("Attention", &[In::Data(rand_f32(&[1, 2, 3, 4], 1)), In::Data(rand_f32(&[1, 1, 25000, 4], 2)), In::Data(rand_f32(&[1, 1, 25000, 3], 3))], &[], 1, 23, 1e-5);
}

#[test]
fn losses_agree() {
    use kiln_graph::Tensor;
    // Small and large (a workgroup of lanes folds > 2048 positions) inputs.
    for (dims, seed) in [(vec![3usize, 5, 7], 1u64), (vec![4, 6, 40, 30], 2)] {
        let (n, c) = (dims[0], dims[1]);
        let inner: usize = dims[2..].iter().product();
        let mut tdims = vec![n];
        tdims.extend_from_slice(&dims[2..]);
        let labels: Vec<i64> = (0..n * inner).map(|i| ((i * 7 + seed as usize) % c) as i64).collect();
        let target = Tensor::from_slice(&tdims, &labels).unwrap();
        let weight = rand_f32(&[c], 9);
        let weight = Tensor::from_slice(&[c], &weight.as_slice::<f32>().unwrap().iter().map(|w| w.abs() + 0.1).collect::<Vec<_>>()).unwrap();
        for reduction in ["none", "sum", "mean"] {
            let attrs = [("reduction", Attr::String(reduction.into())), ("ignore_index", Attr::Int(2))];
            let x = rand_f32(&dims, seed);
            cross_check("NegativeLogLikelihoodLoss", &[In::Data(x.clone()), In::Data(target.clone()), In::Const(weight.clone())], &attrs, 1, 13, 1e-5);
            cross_check("SoftmaxCrossEntropyLoss", &[In::Data(x.clone()), In::Data(target.clone())], &attrs, 2, 13, 1e-5);
            cross_check("SoftmaxCrossEntropyLoss", &[In::Data(x), In::Data(target.clone()), In::Const(weight.clone())], &attrs[..1], 1, 13, 1e-5);
        }
    }
}

#[test]
fn more_normalizations_agree() {
    // Small blocks (one invocation each) and big ones (a workgroup of lanes each).
    for dims in [vec![3usize, 4, 5, 3], vec![1, 6, 70, 71]] {
        let c = dims[1];
        let x = shifted(&dims, 1);
        cross_check("GroupNormalization", &[In::Data(x.clone()), In::Const(rand_f32(&[c], 2)), In::Const(rand_f32(&[c], 3))], &[("num_groups", Attr::Int(2))], 1, 21, 1e-5);
        cross_check("GroupNormalization", &[In::Data(x.clone()), In::Const(rand_f32(&[2], 2)), In::Const(rand_f32(&[2], 3))], &[("num_groups", Attr::Int(2))], 1, 18, 1e-5);
        cross_check("RMSNormalization", &[In::Data(x.clone()), In::Const(rand_f32(&dims[2..], 4))], &[("axis", Attr::Int(2))], 1, 23, 1e-5);
        cross_check("MeanVarianceNormalization", &[In::Data(x.clone())], &[], 1, 13, 1e-5);
        cross_check("MeanVarianceNormalization", &[In::Data(x.clone())], &[("axes", ints(&[1, 3]))], 1, 13, 1e-5);
        for p in [1i64, 2] {
            cross_check("LpNormalization", &[In::Data(x.clone())], &[("axis", Attr::Int(2)), ("p", Attr::Int(p))], 1, 22, 1e-5);
        }
        cross_check("LRN", &[In::Data(x.clone())], &[("size", Attr::Int(3)), ("alpha", Attr::Float(0.2)), ("beta", Attr::Float(0.7))], 1, 13, 1e-5);
    }
    cross_check("LpNormalization", &[In::Data(rand_f32(&[3, 9000], 2))], &[], 1, 22, 1e-5);
    cross_check("RMSNormalization", &[In::Data(rand_f32(&[5, 9000], 2)), In::Const(rand_f32(&[9000], 3))], &[], 1, 23, 1e-5);
}

#[test]
fn rotary_embedding_agrees() {
    use kiln_graph::Tensor;
    let pos = Tensor::from_slice(&[2, 5], &[0i64, 3, 7, 1, 2, 8, 4, 4, 0, 6]).unwrap();
    for (interleaved, rdim) in [(0i64, 0i64), (1, 0), (0, 6), (1, 4)] {
        let half = if rdim == 0 { 5 } else { rdim as usize / 2 };
        let attrs = [("interleaved", Attr::Int(interleaved)), ("rotary_embedding_dim", Attr::Int(rdim)), ("num_heads", Attr::Int(3))];
        let caches = || [In::Const(rand_f32(&[9, half], 1)), In::Const(rand_f32(&[9, half], 2))];
        let [c, s] = caches();
        cross_check("RotaryEmbedding", &[In::Data(rand_f32(&[2, 3, 5, 10], 3)), c, s, In::Data(pos.clone())], &attrs[..2], 1, 23, 1e-6);
        cross_check("RotaryEmbedding", &[In::Data(rand_f32(&[2, 5, 30], 4)), In::Data(rand_f32(&[2, 5, half], 5)), In::Data(rand_f32(&[2, 5, half], 6))], &attrs, 1, 23, 1e-6);
    }
}

#[test]
fn grid_sample_agrees() {
    let scaled = |dims: &[usize], seed: u64| {
        let t = rand_f32(dims, seed);
        let v: Vec<f32> = t.as_slice::<f32>().unwrap().iter().map(|g| g * 1.4).collect();
        kiln_graph::Tensor::from_slice(dims, &v).unwrap()
    };
    let (x2, g2) = (rand_f32(&[2, 3, 9, 7], 1), scaled(&[2, 5, 6, 2], 2));
    let (x3, g3) = (rand_f32(&[1, 2, 5, 4, 6], 3), scaled(&[1, 3, 2, 4, 3], 4));
    for mode in ["nearest", "linear", "cubic"] {
        for pad in ["zeros", "border", "reflection"] {
            for align in [0i64, 1] {
                let attrs = [("mode", Attr::String(mode.into())), ("padding_mode", Attr::String(pad.into())), ("align_corners", Attr::Int(align))];
                cross_check("GridSample", &[In::Data(x2.clone()), In::Data(g2.clone())], &attrs, 1, 22, 1e-5);
                cross_check("GridSample", &[In::Data(x3.clone()), In::Data(g3.clone())], &attrs, 1, 22, 1e-5);
            }
        }
    }
}
