//! `kiln.ConvNchwc` and the boundary reorders against the f64 reference: ungrouped
//! convolutions over blocked and NCHW inputs (padded, strided, read in place, a ResNet
//! stem), depthwise ones (strided, dilated), every CPU variant forced one at a time,
//! with bias, a fused residual and a Clip.
use super::super::conv::tests::reference;
use crate::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use crate::linalg::RESIDUAL_ATTR;
use crate::testing::{as_inputs, assert_close, cpu_params, ints, rand_f32, run, run_cpu_tuned, run_cpu_variants, tune, Case, Input};
use kiln_graph::{Attr, Tensor};

/// An op of domain `kiln` with `n_in` inputs.
fn op(name: &str, attrs: &[(&str, Attr)], n_in: usize) -> Box<dyn crate::Op> {
    let mut case = Case::new(name).domain("kiln").attrs(attrs);
    case.inputs = (0..n_in).map(|_| Input::Data(Tensor::scalar(0f32))).collect();
    case.op().unwrap()
}

/// `[N, C, H, W]` values in blocked order (`[N, C/8, H, W, 8]`).
fn blocked(v: &[f64], d: &[usize]) -> Vec<f64> {
    let (n, c, px) = (d[0], d[1], d[2] * d[3]);
    let mut out = vec![0.0; v.len()];
    for i in 0..n {
        for ch in 0..c {
            for p in 0..px {
                out[((i * (c / 8) + ch / 8) * px + p) * 8 + ch % 8] = v[(i * c + ch) * px + p];
            }
        }
    }
    out
}

fn blocked_tensor(t: &Tensor) -> Tensor {
    let d = t.dims();
    let v: Vec<f32> = blocked(&t.to_f64_vec(), d).into_iter().map(|x| x as f32).collect();
    Tensor::from_vec(&[d[0], d[1] / 8, d[2], d[3], 8], v).unwrap()
}

/// Winograd F(4x4, 3x3)'s tolerance, of the convolution's root mean square (at least 1;
/// before a clamp or residual):
/// its transforms scale the terms up (by up to 100 in `B^T d B`, 64 in `A^T m A`)
/// before they cancel, so an output's error follows the size of the terms summed, not
/// its own, and is 10-30 times the direct sum's (numpy, f32 at every stage, uniform
/// data in [-1, 1]: the largest error over 200 tiles 1.5e-5 of the mean output at 16
/// channels, 4.5e-5 at 256).
const WINOGRAD_TOL: f64 = 1e-4;

/// Compares a variant's output (by its name in `run_cpu_variants`) with `want`.
/// `conv` is the convolution's f64 reference; `winograd_default`: whether the defaults
/// (and so every prepared variant that does not choose the algorithm) run Winograd;
/// unprepared runs ("plain") are direct.
fn check_variant(variant: &str, winograd_default: bool, got: &Tensor, want: &[f64], conv: &[f64], what: &str) {
    if variant == "algo=1" || (winograd_default && variant != "algo=0" && variant != "plain") {
        assert_winograd_close(got, want, conv, what);
    } else {
        assert_close(got, want, 2e-5, what);
    }
}

/// Whether the op's defaults at these inputs run Winograd.
fn winograd_default(op: &dyn crate::Op, inputs: &[Input]) -> bool {
    cpu_params(op, inputs).unwrap().iter().any(|p| p.name == "algo" && p.default == 1)
}

fn assert_winograd_close(got: &Tensor, want: &[f64], conv: &[f64], what: &str) {
    let rms = (conv.iter().map(|w| w * w).sum::<f64>() / conv.len().max(1) as f64).sqrt();
    assert_close(got, want, WINOGRAD_TOL * rms.max(1.0), what);
}

#[test]
fn every_variant_matches_the_f64_reference() {
    // x dims, w dims, group, stride, dilation, pads, whether X is blocked.
    let cases: Vec<(Vec<usize>, Vec<usize>, usize, usize, usize, [i64; 4], bool)> = vec![
        (vec![1, 16, 13, 11], vec![24, 16, 3, 3], 1, 1, 1, [1; 4], true),      // 3x3, padded copy
        (vec![2, 8, 9, 10], vec![16, 8, 1, 1], 1, 1, 1, [0; 4], true),         // 1x1 read in place, two images
        (vec![2, 16, 17, 6], vec![40, 16, 3, 3], 1, 1, 1, [1; 4], true),       // padded rows per thread, two images
        (vec![1, 16, 15, 14], vec![32, 16, 3, 3], 1, 2, 1, [1, 0, 1, 1], true), // strided phases, uneven pads
        (vec![1, 64, 7, 7], vec![72, 64, 3, 3], 1, 1, 1, [1; 4], true),        // few pixels, long reduction
        (vec![1, 128, 6, 9], vec![72, 128, 3, 3], 1, 1, 1, [1; 4], true),      // a long reduction, more pixels
        (vec![1, 3, 23, 21], vec![16, 3, 7, 7], 1, 2, 1, [3; 4], false),       // a ResNet stem from NCHW
        (vec![1, 5, 9, 9], vec![8, 5, 3, 3], 1, 1, 1, [0; 4], false),          // NCHW read in place
        (vec![1, 8, 2, 2], vec![8, 8, 1, 1], 1, 1, 1, [0; 4], false),          // in place, shorter than one tile's reach
        (vec![1, 8, 1, 3], vec![16, 8, 1, 1], 1, 1, 1, [0; 4], true),          // the same, blocked
        (vec![1, 16, 11, 12], vec![8, 16, 3, 3], 1, 1, 2, [2; 4], true),       // dilated
        (vec![1, 3, 24, 25], vec![16, 3, 3, 3], 1, 2, 1, [0; 4], false),       // strided NCHW stem read in place
        (vec![2, 16, 9, 8], vec![24, 16, 1, 1], 1, 2, 1, [0; 4], true),        // strided 1x1 read in place
        (vec![1, 24, 7, 7], vec![24, 1, 3, 3], 24, 2, 1, [1; 4], true),        // depthwise, strided
        (vec![2, 16, 12, 9], vec![16, 1, 5, 5], 16, 1, 2, [4, 3, 4, 2], true), // depthwise, dilated
        (vec![1, 8, 40, 200], vec![8, 1, 3, 3], 8, 2, 1, [1; 4], true),       // depthwise in bands of rows
        (vec![1, 8, 61, 150], vec![8, 1, 3, 3], 8, 1, 1, [1, 0, 1, 2], true),  // the same, stride 1
        (vec![1, 16, 9, 40], vec![16, 1, 5, 5], 16, 1, 2, [4, 3, 1, 5], true), // depthwise, dilated, uneven pads
        (vec![1, 16, 7, 7], vec![16, 1, 3, 3], 16, 1, 1, [1; 4], true),        // depthwise, odd rows in pairs
        (vec![2, 8, 5, 1], vec![8, 1, 3, 3], 8, 1, 1, [1; 4], true),           // one pixel wide
        (vec![1, 8, 3, 35], vec![8, 1, 3, 3], 8, 1, 1, [1; 4], true),          // 18 registers a row: 8, 8, 2
        (vec![1, 8, 4, 16], vec![8, 1, 3, 3], 8, 1, 1, [1; 4], true),          // 8 registers a row, even
        (vec![1, 8, 3, 2], vec![8, 1, 3, 3], 8, 1, 1, [2, 3, 2, 3], true),     // whole rows and columns in the pad
        (vec![1, 8, 6, 20], vec![8, 1, 3, 3], 8, 2, 1, [0, 1, 1, 0], true),    // strided: a padded copy
        (vec![1, 16, 9, 37], vec![16, 1, 4, 4], 16, 3, 1, [2, 1, 1, 2], true), // stride 3, an even tap row
        (vec![1, 8, 14, 14], vec![8, 1, 3, 3], 8, 2, 1, [0, 0, 1, 1], true),   // MobileNet's strided pads
        (vec![2, 16, 30, 21], vec![40, 16, 3, 3], 1, 1, 1, [1; 4], true),      // many strips at the smallest strip size
    ];
    for (xd, wd, group, stride, dil, pads, in_blocked) in cases {
        let (x, w, b) = (rand_f32(&xd, 71), rand_f32(&wd, 72), rand_f32(&[wd[0]], 73));
        let span = |d: usize| (wd[2 + d] - 1) * dil + 1;
        let out: Vec<usize> = (0..2).map(|d| (xd[2 + d] + pads[d] as usize + pads[2 + d] as usize - span(d)) / stride + 1).collect();
        let yd = vec![xd[0], wd[0], out[0], out[1]];
        let conv = reference(&x, &w, Some(&b), group, &[stride, stride], &[dil, dil], &pads[..2], &out);
        // With a fused residual, and without one (the clamp then runs in registers).
        for residual in [true, false] {
            let r = if residual { rand_f32(&yd, 74) } else { Tensor::from_vec(&yd, vec![0f32; yd.iter().product()]).unwrap() };
            let want: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(v, r)| (v + r).clamp(-0.5, 0.75)).collect();
            let want = blocked(&want, &yd);
            let attrs = [
                ("group", Attr::Int(group as i64)),
                ("strides", ints(&[stride as i64; 2])),
                ("dilations", ints(&[dil as i64; 2])),
                ("pads", ints(&pads)),
                (RESIDUAL_ATTR, Attr::Int(residual as i64)),
                (ACTIVATION_ATTR, Attr::String("Clip".into())),
                (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![-0.5, 0.75])),
                (super::INPUT_BLOCKED_ATTR, Attr::Int(in_blocked as i64)),
            ];
            let xin = if in_blocked { blocked_tensor(&x) } else { x.clone() };
            let rb = blocked_tensor(&r);
            let op = op("ConvNchwc", &attrs, if residual { 4 } else { 3 });
            let inputs: Vec<Option<&Tensor>> = if residual { vec![Some(&xin), Some(&w), Some(&b), Some(&rb)] } else { vec![Some(&xin), Some(&w), Some(&b)] };
            let variants = run_cpu_variants(op.as_ref(), &as_inputs(&inputs, &[1, 2])).unwrap();
            assert!(variants.len() >= 3, "x{xd:?}: {:?}", variants.iter().map(|v| &v.0).collect::<Vec<_>>());
            let winograd = winograd_default(op.as_ref(), &as_inputs(&inputs, &[1, 2]));
            for (name, outs) in &variants {
                check_variant(name, winograd, &outs[0], &want, &conv, &format!("x{xd:?} w{wd:?} g{group} s{stride} d{dil} {name}, residual {residual}"));
            }
            // Unprepared (weights not constant): packed per run.
            let y = run(op.as_ref(), &as_inputs(&inputs, &[]), &[]).unwrap().remove(0);
            check_variant("plain", winograd, &y, &want, &conv, &format!("x{xd:?} w{wd:?} unprepared, residual {residual}"));
        }
    }
}

/// An activation that is not a clamp runs once, after a tile's last reduction slice
/// (the earlier slices store plain partial sums): LeakyRelu over a fused residual, on
/// every variant (the slices of 72 and 144 steps cut this 288-step reduction).
#[test]
fn a_generic_activation_follows_the_last_slice() {
    let (xd, wd) = ([1usize, 32, 9, 10], [24usize, 32, 3, 3]);
    let (x, w, b, r) = (rand_f32(&xd, 81), rand_f32(&wd, 82), rand_f32(&[24], 83), rand_f32(&[1, 24, 9, 10], 84));
    let conv = reference(&x, &w, Some(&b), 1, &[1, 1], &[1, 1], &[1, 1], &[9, 10]);
    let want: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(v, r)| v + r).map(|v| if v < 0.0 { 0.1 * v } else { v }).collect();
    let want = blocked(&want, &[1, 24, 9, 10]);
    let attrs = [
        ("pads", ints(&[1; 4])),
        (RESIDUAL_ATTR, Attr::Int(1)),
        (ACTIVATION_ATTR, Attr::String("LeakyRelu".into())),
        (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![0.1])),
        (super::INPUT_BLOCKED_ATTR, Attr::Int(1)),
    ];
    let op = op("ConvNchwc", &attrs, 4);
    let (xin, rb) = (blocked_tensor(&x), blocked_tensor(&r));
    let inputs = [Some(&xin), Some(&w), Some(&b), Some(&rb)];
    let variants = run_cpu_variants(op.as_ref(), &as_inputs(&inputs, &[1, 2])).unwrap();
    assert!(variants.iter().any(|(name, _)| name.contains("kslice")), "{:?}", variants.iter().map(|v| &v.0).collect::<Vec<_>>());
    let winograd = winograd_default(op.as_ref(), &as_inputs(&inputs, &[1, 2]));
    for (name, outs) in &variants {
        check_variant(name, winograd, &outs[0], &want, &conv, &format!("LeakyRelu {name}"));
    }
}

/// Winograd F(4x4, 3x3) at every block size and instruction set a tuner tries, forced
/// with the algorithm:
/// outputs that are not whole tiles, asymmetric pads, two images, a last panel of
/// output channels narrower than NR, over a fused residual with a Clip and with a
/// LeakyRelu after the output transform.
#[test]
fn winograd_at_every_block_size_matches_the_f64_reference() {
    // x dims, w dims, pads.
    let cases: Vec<(Vec<usize>, Vec<usize>, [i64; 4])> = vec![
        (vec![2, 16, 13, 11], vec![40, 16, 3, 3], [1; 4]),      // edge tiles both ways, a narrow last panel
        (vec![1, 64, 7, 7], vec![72, 64, 3, 3], [1, 0, 2, 1]),  // asymmetric pads, few tiles
        (vec![1, 24, 9, 18], vec![32, 24, 3, 3], [0; 4]),       // no pads: 7x16
        (vec![1, 128, 20, 21], vec![24, 128, 3, 3], [1; 4]),    // a long reduction, many tiles
    ];
    for (xd, wd, pads) in cases {
        let (x, w, b) = (rand_f32(&xd, 91), rand_f32(&wd, 92), rand_f32(&[wd[0]], 93));
        let out: Vec<usize> = (0..2).map(|d| xd[2 + d] + pads[d] as usize + pads[2 + d] as usize - 2).collect();
        let yd = vec![xd[0], wd[0], out[0], out[1]];
        let r = rand_f32(&yd, 94);
        let conv = reference(&x, &w, Some(&b), 1, &[1, 1], &[1, 1], &pads[..2], &out);
        let clip: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(v, r)| (v + r).clamp(-0.5, 0.75)).collect();
        let leaky: Vec<f64> = conv.iter().zip(r.to_f64_vec()).map(|(v, r)| v + r).map(|v| if v < 0.0 { 0.1 * v } else { v }).collect();
        for (act, params, want) in [("Clip", vec![-0.5, 0.75], clip), ("LeakyRelu", vec![0.1], leaky)] {
            let want = blocked(&want, &yd);
            let attrs = [
                ("pads", ints(&pads)),
                (RESIDUAL_ATTR, Attr::Int(1)),
                (ACTIVATION_ATTR, Attr::String(act.into())),
                (ACTIVATION_PARAMS_ATTR, Attr::Floats(params)),
                (super::INPUT_BLOCKED_ATTR, Attr::Int(1)),
            ];
            let op = op("ConvNchwc", &attrs, 4);
            let (xin, rb) = (blocked_tensor(&x), blocked_tensor(&r));
            let inputs = as_inputs(&[Some(&xin), Some(&w), Some(&b), Some(&rb)], &[1, 2]);
            let params = cpu_params(op.as_ref(), &inputs).unwrap();
            let blocks = &super::TILES_CANDIDATES;
            assert!(params.iter().any(|p| p.name == "algo" && p.candidates.contains(&1)), "x{xd:?}: Winograd offered");
            let isas = &params.iter().find(|p| p.name == "isa").expect("an isa parameter").candidates;
            let forced = blocks.iter().map(|&t| ("tiles", t)).chain(isas.iter().map(|&i| ("isa", i)));
            for (name, value) in forced {
                let y = run_cpu_tuned(op.as_ref(), &inputs, Some(&tune(&[("algo", 1), (name, value)]))).unwrap().remove(0);
                assert_winograd_close(&y, &want, &conv, &format!("x{xd:?} w{wd:?} pads {pads:?} {act} Winograd, {name} {value}"));
            }
        }
    }
}

/// An infinity in the input reaches only the outputs whose windows cover it, on every
/// depthwise variant of a strided window (0 * inf is NaN: a kernel that reads a column
/// past a window's end, even weighed zero, spreads it).
#[test]
fn depthwise_infinities_stay_in_their_windows() {
    let (xd, wd) = ([1usize, 8, 5, 9], [8usize, 1, 3, 3]);
    let mut xv = rand_f32(&xd, 77).to_f64_vec();
    // Column 3 of every row of channel 2: stride 2 without pads covers it from output
    // column 1 only (input columns 2..5); output column 0 reads 0..3.
    for r in 0..5 {
        xv[(2 * 5 + r) * 9 + 3] = f64::INFINITY;
    }
    let x = Tensor::from_vec(&xd, xv.iter().map(|&v| v as f32).collect()).unwrap();
    let (w, b) = (rand_f32(&wd, 78), rand_f32(&[8], 79));
    let want = reference(&x, &w, Some(&b), 8, &[2, 2], &[1, 1], &[0, 0], &[2, 4]);
    // Channel 2's outputs: [2][4] from index 16; column 0 of each row is finite.
    assert!(!want[17].is_finite() && want[16].is_finite() && want[20].is_finite());
    let want = blocked(&want, &[1, 8, 2, 4]);
    let attrs = [("group", Attr::Int(8)), ("strides", ints(&[2, 2])), (super::INPUT_BLOCKED_ATTR, Attr::Int(1))];
    let xb = blocked_tensor(&x);
    let op = op("ConvNchwc", &attrs, 3);
    let inputs = [Some(&xb), Some(&w), Some(&b)];
    for (name, outs) in run_cpu_variants(op.as_ref(), &as_inputs(&inputs, &[1, 2])).unwrap() {
        let got = outs[0].to_f64_vec();
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            let same = if e.is_finite() { (g - e).abs() <= 1e-4 * (1.0 + e.abs()) } else { g.is_nan() == e.is_nan() && (e.is_nan() || g == e) };
            assert!(same, "{name}: output {i} is {g}, want {e}");
        }
    }
}

#[test]
fn reorders_round_trip_and_refuse_bad_shapes() {
    for dims in [vec![2, 16, 5, 7], vec![1, 8, 1, 1], vec![1, 24, 3, 19]] {
        let x = rand_f32(&dims, 75);
        let to = op("ToNchwc", &[], 1);
        let b = run(to.as_ref(), &[Input::Data(x.clone())], &[]).unwrap().remove(0);
        assert_close(&b, &blocked(&x.to_f64_vec(), &dims), 0.0, &format!("{dims:?} to"));
        let from = op("FromNchwc", &[], 1);
        let back = run(from.as_ref(), &[Input::Data(b)], &[]).unwrap().remove(0);
        assert_eq!(back, x, "{dims:?} round trip");
    }
    let to = op("ToNchwc", &[], 1);
    let err = run(to.as_ref(), &[Input::Data(rand_f32(&[1, 12, 3, 3], 1))], &[]).unwrap_err().to_string();
    assert!(err.contains("multiple of 8"), "{err}");
}

/// Blocked MaxPool (strided, padded, ceil_mode, dilated; a NaN in one block) and
/// GlobalAveragePool against the plain ops on the same values.
#[test]
fn blocked_pools_match_the_plain_ones() {
    let cases: Vec<(Vec<(&str, Attr)>, Vec<usize>)> = vec![
        // Windows inside the input (read in place), then past its end (a padded copy).
        (vec![("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("ceil_mode", Attr::Int(1))], vec![1, 16, 13, 13]),
        (vec![("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("ceil_mode", Attr::Int(1))], vec![1, 16, 14, 14]),
        (vec![("kernel_shape", ints(&[3, 2])), ("pads", ints(&[1, 0, 1, 1])), ("dilations", ints(&[1, 2]))], vec![2, 8, 9, 11]),
        // ResNet's: the top row and left column of windows reach into the pads.
        (vec![("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("pads", ints(&[1, 1, 1, 1]))], vec![1, 16, 16, 16]),
        // Windows wider than the input: none lies inside it.
        (vec![("kernel_shape", ints(&[3, 5])), ("pads", ints(&[2, 2, 2, 2]))], vec![1, 16, 2, 3]),
    ];
    for (attrs, dims) in cases {
        for nan in [false, true] {
            let mut v = rand_f32(&dims, 76).to_f64_vec();
            if nan {
                v[8 * dims[2] * dims[3] + 5] = f64::NAN;
            }
            let x = Tensor::from_vec(&dims, v.iter().map(|&f| f as f32).collect()).unwrap();
            let plain = crate::testing::make("MaxPool", 19, &attrs, 1, 1).unwrap();
            let want = run(plain.as_ref(), &[Input::Data(x.clone())], &[]).unwrap().remove(0);
            let got = run(op("MaxPoolNchwc", &attrs, 1).as_ref(), &[Input::Data(blocked_tensor(&x))], &[]).unwrap().remove(0);
            let wd = want.dims().to_vec();
            assert_close(&got, &blocked(&want.to_f64_vec(), &wd), 0.0, &format!("{dims:?} nan {nan}"));
        }
        let x = rand_f32(&dims, 77);
        let plain = crate::testing::make("GlobalAveragePool", 19, &[], 1, 1).unwrap();
        let want = run(plain.as_ref(), &[Input::Data(x.clone())], &[]).unwrap().remove(0);
        let got = run(op("GlobalAveragePoolNchwc", &[], 1).as_ref(), &[Input::Data(blocked_tensor(&x))], &[]).unwrap().remove(0);
        assert_close(&got, &blocked(&want.to_f64_vec(), want.dims()), 1e-6, &format!("{dims:?} global"));
    }
}
