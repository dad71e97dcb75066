//! Every CPU variant of Conv (the direct kernels, the packed GEMM at each instruction
//! set and block size, Winograd at each block size, the transposed GEMM, packed and
//! direct), one forced at
//! a time, against the f64 reference on odd shapes, with bias, a fused residual and an
//! activation.
use super::tests::reference;
use crate::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use crate::linalg::RESIDUAL_ATTR;
use crate::testing::{as_inputs, assert_close, ints, make, rand_f32, run_cpu_variants};
use kiln_graph::{Attr, Tensor};

/// A Conv with a bias, a fused residual and a Relu over random data of these dims:
/// the op, its inputs (x, w, b, residual) and the f64 reference of its output.
fn residual_relu_case(xd: &[usize], wd: &[usize], group: usize, stride: usize, pads: [i64; 4], seed: u64) -> (Box<dyn crate::Op>, Vec<Tensor>, Vec<f64>) {
    let (x, w, b) = (rand_f32(xd, seed), rand_f32(wd, seed + 1), rand_f32(&[wd[0]], seed + 2));
    let out: Vec<usize> = (0..2).map(|d| ((xd[2 + d] as i64 + pads[d] + pads[2 + d] - wd[2 + d] as i64) / stride as i64 + 1) as usize).collect();
    let r = rand_f32(&[xd[0], wd[0], out[0], out[1]], seed + 3);
    let conv = reference(&x, &w, Some(&b), group, &[stride, stride], &[1, 1], &pads[..2], &out);
    let want: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(c, r)| (c + r).max(0.0)).collect();
    let attrs = [
        ("group", Attr::Int(group as i64)),
        ("strides", ints(&[stride as i64; 2])),
        ("pads", ints(&pads)),
        (RESIDUAL_ATTR, Attr::Int(1)),
        (ACTIVATION_ATTR, Attr::String("Relu".into())),
        (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![])),
    ];
    (make("Conv", 19, &attrs, 4, 1).unwrap(), vec![x, w, b, r], want)
}

#[test]
fn every_variant_matches_the_f64_reference() {
    // x dims, w dims, group, stride, pads.
    let cases: Vec<(Vec<usize>, Vec<usize>, usize, usize, [i64; 4])> = vec![
        (vec![2, 7, 13, 11], vec![13, 7, 3, 3], 1, 1, [1, 1, 1, 1]),  // Winograd: odd output edges, M not a tile multiple
        (vec![1, 16, 10, 9], vec![20, 16, 3, 3], 1, 1, [0, 2, 1, 0]),  // Winograd, asymmetric pads
        (vec![1, 33, 9, 35], vec![37, 33, 1, 1], 1, 1, [0; 4]),        // pointwise, packed from the input
        (vec![2, 12, 15, 14], vec![18, 6, 3, 3], 2, 2, [1, 1, 1, 1]), // grouped, strided im2col
        (vec![1, 64, 7, 7], vec![70, 64, 3, 3], 1, 1, [1; 4]),         // few pixels, long reduction
        (vec![1, 24, 40, 1], vec![32, 24, 5, 1], 1, 1, [0; 4]),        // 1-D as [N, C, L, 1] (rows swapped)
        (vec![2, 8, 31, 1], vec![16, 8, 3, 1], 1, 2, [1, 0, 1, 0]),    // the same, strided and padded
        (vec![1, 3, 23, 21], vec![16, 3, 7, 7], 1, 2, [3, 3, 3, 3]),   // a ResNet stem: 7x7, stride 2
        (vec![1, 20, 15, 14], vec![24, 20, 1, 1], 1, 2, [0; 4]),       // a strided 1x1 (downsample)
        (vec![2, 9, 17, 16], vec![19, 9, 3, 3], 1, 3, [1, 0, 2, 1]),   // stride 3, asymmetric pads
    ];
    for (xd, wd, group, stride, pads) in cases {
        let (op, t, want) = residual_relu_case(&xd, &wd, group, stride, pads, 51);
        let inputs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
        let variants = run_cpu_variants(op.as_ref(), &as_inputs(&inputs, &[1, 2])).unwrap();
        // The packed variants are offered for these shapes.
        assert!(variants.iter().any(|(n, _)| n == "algo=1"), "x{xd:?} w{wd:?}: {:?}", variants.iter().map(|v| &v.0).collect::<Vec<_>>());
        // The direct flipped form is offered for ungrouped kernels of 2+ taps or strides.
        assert_eq!(variants.iter().any(|(n, _)| n == "algo=4"), group == 1 && (stride > 1 || wd[2] * wd[3] > 1), "x{xd:?} w{wd:?}");
        for (name, outs) in &variants {
            assert_close(&outs[0], &want, 2e-5, &format!("x{xd:?} w{wd:?} g{group} s{stride} {name}"));
        }
    }
}

/// Convolutions of many small planes with filters that are not constants (training's
/// forward pass): the CPU runs blocks of images side by side through one GEMM. With a
/// bias, a fused residual and a Relu, against the f64 reference.
#[test]
fn batches_of_small_planes_match_the_f64_reference() {
    // x dims, w dims, group, stride, pads.
    let cases: Vec<(Vec<usize>, Vec<usize>, usize, usize, [i64; 4])> = vec![
        (vec![37, 16, 4, 4], vec![32, 16, 3, 3], 1, 1, [1, 1, 1, 1]), // LeNet's second convolution
        (vec![9, 12, 7, 5], vec![10, 6, 3, 3], 2, 2, [1, 0, 1, 2]),   // grouped, strided, uneven pads
        (vec![20, 40, 3, 3], vec![8, 40, 1, 1], 1, 1, [0; 4]),         // pointwise
    ];
    for (xd, wd, group, stride, pads) in cases {
        let (op, t, want) = residual_relu_case(&xd, &wd, group, stride, pads, 71);
        let out = &t[3].dims()[2..];
        assert!(super::conv_cpu::images_per_block(xd[0], out[0] * out[1]) > 1, "x{xd:?}: small planes");
        let inputs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
        let y = crate::testing::run(op.as_ref(), &as_inputs(&inputs, &[]), &[]).unwrap().remove(0);
        assert_close(&y, &want, 2e-5, &format!("x{xd:?} w{wd:?} g{group} s{stride}"));
    }
}

/// Depthwise convolutions through the blocks of eight channels (with odd channels left
/// to the per-plane kernel), strided, dilated and padded unevenly, with bias, a fused
/// residual and a Clip, against the f64 reference.
#[test]
fn depthwise_blocks_match_the_f64_reference() {
    // x dims, kernel, stride, dilation, pads.
    let cases: Vec<(Vec<usize>, usize, usize, usize, [i64; 4])> = vec![
        (vec![2, 19, 13, 11], 3, 1, 1, [1, 1, 1, 1]), // two blocks and three odd channels
        (vec![1, 16, 14, 15], 3, 2, 1, [0, 1, 1, 0]), // strided, uneven pads
        (vec![1, 8, 12, 9], 5, 1, 2, [4, 4, 4, 4]),   // dilated 5x5
        (vec![1, 24, 7, 7], 3, 2, 1, [1, 1, 1, 1]),   // MobileNet's smallest planes
    ];
    for (xd, k, stride, dil, pads) in cases {
        let c = xd[1];
        let (x, w, b) = (rand_f32(&xd, 61), rand_f32(&[c, 1, k, k], 62), rand_f32(&[c], 63));
        let span = (k - 1) * dil + 1;
        let out: Vec<usize> = (0..2).map(|d| (xd[2 + d] + pads[d] as usize + pads[2 + d] as usize - span) / stride + 1).collect();
        let yd = vec![xd[0], c, out[0], out[1]];
        let r = rand_f32(&yd, 64);
        let conv = reference(&x, &w, Some(&b), c, &[stride, stride], &[dil, dil], &pads[..2], &out);
        let want: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(v, r)| (v + r).clamp(-0.5, 0.75)).collect();
        let attrs = [
            ("group", Attr::Int(c as i64)),
            ("strides", ints(&[stride as i64; 2])),
            ("dilations", ints(&[dil as i64; 2])),
            ("pads", ints(&pads)),
            (RESIDUAL_ATTR, Attr::Int(1)),
            (ACTIVATION_ATTR, Attr::String("Clip".into())),
            (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![-0.5, 0.75])),
        ];
        let op = make("Conv", 19, &attrs, 4, 1).unwrap();
        let inputs: [Option<&Tensor>; 4] = [Some(&x), Some(&w), Some(&b), Some(&r)];
        let y = crate::testing::run(op.as_ref(), &as_inputs(&inputs, &[1, 2]), &[]).unwrap().remove(0);
        assert_close(&y, &want, 2e-5, &format!("x{xd:?} k{k} s{stride} d{dil} p{pads:?}"));
    }
}
