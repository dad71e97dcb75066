//! The packed integer convolution (`qconv_packed`) of QLinearConv and ConvInteger, every
//! CPU variant (the direct reference kernel, the packed kernel at each instruction set
//! this CPU offers) against an exact reference: the f64 convolution of the shifted
//! integers, requantized from the spec's formula in f32. Odd shapes (pixel counts and
//! channel counts off the 6-pixel x 16-channel tile), full-range bytes, zero points, per-channel
//! scales and filter zero points, strides, dilations, uneven padding, groups.
use super::conv::tests::reference;
use crate::linalg::int8_kernel::Int8Isa;
use crate::testing::{as_inputs, ints, make, run_cpu_variants};
use kiln_graph::{Attr, DType, Tensor};

/// Full-range 8-bit values of `dtype` from a fixed seed.
fn bytes(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let b: Vec<u8> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect();
    Tensor::from_bytes(dtype, dims, &b).unwrap()
}

fn shifted(t: &Tensor, zero: &[i64], per: usize) -> Tensor {
    let v: Vec<f32> = t.to_f64_vec().iter().enumerate().map(|(i, &x)| (x - zero[if zero.len() == 1 { 0 } else { i / per }] as f64) as f32).collect();
    Tensor::from_vec(t.dims(), v).unwrap()
}

struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    group: usize,
    stride: usize,
    dilation: usize,
    pads: [i64; 4],
    dx: DType,
    dw: DType,
    per_channel_zw: bool,
}

fn case(x: &[usize], w: &[usize], group: usize, stride: usize, dilation: usize, pads: [i64; 4], dx: DType, dw: DType, per_channel_zw: bool) -> Case {
    Case { x: x.to_vec(), w: w.to_vec(), group, stride, dilation, pads, dx, dw, per_channel_zw }
}

fn cases() -> Vec<Case> {
    use DType::{I8, U8};
    vec![
        case(&[1, 3, 23, 21], &[16, 3, 7, 7], 1, 2, 1, [3, 3, 3, 3], U8, I8, false), // ResNet stem, 7x7 stride 2
        case(&[1, 3, 12, 13], &[8, 3, 3, 3], 1, 1, 2, [2, 1, 0, 3], I8, I8, false),  // folded width: dilated, uneven pads, signed
        case(&[2, 4, 9, 10], &[8, 2, 1, 5], 2, 3, 1, [0, 1, 0, 2], U8, U8, true),    // folded width: groups, stride 3, 1x5
        case(&[2, 13, 9, 11], &[18, 13, 3, 3], 1, 1, 1, [1, 1, 1, 1], U8, I8, false), // M and pixels off the tile
        case(&[1, 33, 7, 9], &[37, 33, 1, 1], 1, 1, 1, [0; 4], U8, I8, false),       // 1x1: the plain GEMM
        case(&[1, 20, 15, 14], &[24, 20, 1, 1], 1, 2, 1, [0; 4], U8, I8, false),     // strided 1x1 (downsample)
        case(&[2, 12, 15, 14], &[16, 6, 3, 3], 2, 2, 1, [1, 0, 2, 1], U8, I8, false), // groups, uneven pads
        case(&[1, 9, 17, 16], &[8, 9, 3, 3], 1, 1, 2, [2, 2, 2, 2], U8, I8, false),  // dilated
        case(&[1, 7, 10, 12], &[12, 7, 3, 3], 1, 1, 1, [1, 1, 1, 1], I8, I8, false), // signed activations
        case(&[1, 18, 5, 7], &[8, 18, 3, 3], 1, 1, 1, [1, 1, 1, 1], I8, I8, false),  // signed activations, vector repack
        case(&[1, 6, 11, 9], &[9, 6, 3, 3], 1, 1, 1, [1, 1, 1, 1], U8, U8, true),    // unsigned filters, per-channel zero points
        case(&[1, 64, 7, 7], &[70, 64, 3, 3], 1, 1, 1, [1; 4], U8, I8, false),       // few pixels, long reduction
        case(&[1, 5, 8, 8], &[4, 5, 2, 2], 1, 1, 1, [0; 4], U8, I8, true),           // signed filters, per-channel zero points
        case(&[1, 24, 30, 29], &[40, 24, 3, 3], 1, 1, 1, [1; 4], U8, I8, false),    // many pixel chunks, three channel blocks
        case(&[2, 8, 13, 12], &[8, 1, 3, 3], 8, 1, 1, [1; 4], U8, I8, true),        // depthwise (its own kernel)
        case(&[1, 6, 15, 14], &[12, 1, 3, 3], 6, 2, 1, [1, 0, 2, 1], I8, I8, false), // depthwise, multiplier 2, stride 2, uneven pads
        case(&[1, 4, 11, 10], &[4, 1, 5, 5], 4, 1, 2, [4, 4, 4, 4], U8, U8, true),   // depthwise, dilated, unsigned filters
        case(&[1, 3, 5, 41], &[3, 1, 3, 3], 3, 2, 1, [1, 2, 1, 0], U8, I8, true),   // depthwise, rows wide enough for 16-value pads, stride 2
        case(&[1, 2, 4, 37], &[2, 1, 3, 3], 2, 1, 1, [1; 4], I8, I8, false),        // depthwise, wide rows, signed input, stride 1
    ]
}

impl Case {
    fn out(&self) -> Vec<usize> {
        let span = |d: usize| (self.w[2 + d] - 1) * self.dilation + 1;
        (0..2).map(|d| (self.x[2 + d] + self.pads[d] as usize + self.pads[2 + d] as usize - span(d)) / self.stride + 1).collect()
    }

    fn attrs(&self) -> Vec<(&'static str, Attr)> {
        vec![
            ("group", Attr::Int(self.group as i64)),
            ("strides", ints(&[self.stride as i64; 2])),
            ("dilations", ints(&[self.dilation as i64; 2])),
            ("pads", ints(&self.pads)),
        ]
    }

    /// The exact int32 sums, x, w and the zero points.
    fn sums(&self, seed: u64) -> (Vec<f64>, Tensor, Tensor, Tensor, Tensor) {
        let m = self.w[0];
        let (x, w) = (bytes(self.dx, &self.x, seed), bytes(self.dw, &self.w, seed + 1));
        let zx: Vec<i64> = vec![if self.dx == DType::U8 { 131 } else { -3 }];
        let zw: Vec<i64> = if self.per_channel_zw { (0..m as i64).map(|i| if self.dw == DType::U8 { 120 + i } else { i - 4 }).collect() } else { vec![0] };
        let per = w.len() / m;
        let acc = reference(&shifted(&x, &zx, 1), &shifted(&w, &zw, per), None, self.group, &[self.stride; 2], &[self.dilation; 2], &self.pads[..2], &self.out());
        let zxt = Tensor::from_f64(self.dx, &[], &[zx[0] as f64]).unwrap();
        let zwt = Tensor::from_f64(self.dw, &[zw.len()], &zw.iter().map(|&v| v as f64).collect::<Vec<_>>()).unwrap();
        (acc, x, w, zxt, zwt)
    }
}

fn names(v: &[(String, Vec<Tensor>)]) -> Vec<String> {
    v.iter().map(|(n, _)| n.clone()).collect()
}

/// The instruction sets the packed kernel (or the depthwise one, without the quads
/// layout) must offer for these operands.
fn expected_isas(c: &Case) -> Vec<String> {
    let depthwise = c.w[1] == 1 && c.group > 1;
    let (dx, dw, per_channel_zw) = (c.dx, c.dw, c.per_channel_zw);
    let quads = !depthwise && dx == DType::U8 && dw == DType::I8 && !per_channel_zw;
    let mut isas: Vec<u32> = Int8Isa::available().into_iter().filter(|i| quads || *i != Int8Isa::Avx512Vnni).map(|i| i.code()).collect();
    if quads {
        isas.push(crate::linalg::int8_kernel::PORTABLE_QUADS);
    }
    isas.into_iter().map(|i| format!("isa={i}")).collect()
}

/// QLinearConv's nine inputs for case `n` (its bias, per-channel scales, and an output
/// dtype and zero point that vary with `n`) and the exact requantized result.
fn qlinear_case(c: &Case, n: usize) -> ([Tensor; 9], Vec<f64>) {
    let m = c.w[0];
    let (acc, x, w, zx, zw) = c.sums(10 + n as u64);
    let bias: Vec<i32> = (0..m as i32).map(|i| (i * 7919) % 2001 - 1000).collect();
    let sw: Vec<f32> = (0..m).map(|i| 0.0021 + 0.0003 * i as f32).collect();
    // Unsigned outputs, and every third case signed.
    let dy = if n % 3 == 2 { DType::I8 } else { DType::U8 };
    let zy: i32 = match (dy, n % 2) {
        (DType::U8, 0) | (_, 0) => 0,
        (DType::U8, _) => 128,
        _ => -5,
    };
    let (lo, hi) = if dy == DType::I8 { (-128.0, 127.0) } else { (0.0, 255.0) };
    let (sx, sy) = (0.0371f32, 0.0213f32);
    let plane: usize = c.out().iter().product();
    let want: Vec<f64> = acc
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            let ch = (i / plane) % m;
            let v = ((a as i32 + bias[ch]) as f32 * (sx * sw[ch] / sy)).round_ties_even() + zy as f32;
            v.clamp(lo, hi) as f64
        })
        .collect();
    let t = [
        x,
        Tensor::scalar(sx),
        zx,
        w,
        Tensor::from_vec(&[m], sw).unwrap(),
        zw,
        Tensor::scalar(sy),
        Tensor::from_f64(dy, &[], &[zy as f64]).unwrap(),
        Tensor::from_vec(&[m], bias).unwrap(),
    ];
    (t, want)
}

#[test]
fn qlinear_conv_variants_equal_the_exact_reference() {
    for (n, c) in cases().iter().enumerate() {
        let (t, want) = qlinear_case(c, n);
        let op = make("QLinearConv", 10, &c.attrs(), 9, 1).unwrap();
        let refs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
        let variants = run_cpu_variants(op.as_ref(), &as_inputs(&refs, &[1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
        let offered: Vec<String> = names(&variants).into_iter().filter(|v| v.starts_with("isa=")).collect();
        assert_eq!(offered, expected_isas(c), "case {n}");
        for (name, outs) in &variants {
            assert_eq!(outs[0].to_f64_vec(), want, "case {n} x{:?} w{:?}: variant {name}", c.x, c.w);
        }
    }
}

/// `[N, C, H, W]` values as `[N, H, W, C]` (`to_last`), or back.
fn move_channels(t: &Tensor, nchw: &[usize], to_last: bool) -> Tensor {
    let (n, c, pixels) = (nchw[0], nchw[1], nchw[2] * nchw[3]);
    let v = t.to_f64_vec();
    let mut out = vec![0.0; v.len()];
    for b in 0..n {
        for ch in 0..c {
            for q in 0..pixels {
                let (first, last) = ((b * c + ch) * pixels + q, (b * pixels + q) * c + ch);
                if to_last {
                    out[last] = v[first];
                } else {
                    out[first] = v[last];
                }
            }
        }
    }
    let dims = if to_last { vec![n, nchw[2], nchw[3], c] } else { nchw.to_vec() };
    Tensor::from_f64(t.dtype(), &dims, &out).unwrap()
}

/// `kiln_channels_last` QLinearConv (x and y `[N, H, W, C]`, or y only): every variant
/// (the packed kernel reading and writing pixels of channels, or reading planes and
/// writing pixels, the channels-last depthwise kernel with and without AVX2, the
/// transposing reference) gives the exact result.
#[test]
fn channels_last_qlinear_conv_variants_equal_the_exact_reference() {
    use DType::{I8, U8};
    let mut all = cases();
    all.extend([
        case(&[2, 16, 5, 7], &[24, 16, 1, 1], 1, 1, 1, [0; 4], U8, I8, false),        // 1x1 reading x in place (quads), two images
        case(&[1, 32, 9, 10], &[32, 1, 3, 3], 32, 1, 1, [1; 4], U8, I8, true),        // depthwise, two AVX2 blocks
        case(&[1, 32, 9, 8], &[32, 1, 5, 5], 32, 1, 1, [2; 4], U8, I8, false),        // depthwise 5x5: more weights than AVX-512 holds in registers
        case(&[2, 48, 11, 12], &[48, 1, 3, 3], 48, 2, 1, [1, 0, 1, 1], U8, I8, false), // depthwise, stride 2, uneven pads
        case(&[1, 16, 6, 5], &[16, 1, 5, 5], 16, 1, 2, [4; 4], I8, U8, true),         // depthwise, odd tap count, dilated
        case(&[1, 16, 5, 9], &[16, 1, 2, 3], 16, 1, 1, [0, 1, 1, 0], U8, I8, false),  // depthwise, even height
        case(&[1, 16, 6, 7], &[16, 1, 3, 3], 16, 1, 1, [1; 4], I8, I8, false),        // depthwise 3x3, signed input
        case(&[2, 32, 4, 11], &[32, 1, 1, 3], 32, 2, 1, [0, 1, 0, 1], U8, I8, true),  // depthwise, one row, stride 2
        case(&[1, 16, 7, 8], &[16, 1, 3, 4], 16, 1, 2, [2, 3, 2, 3], U8, I8, false),  // depthwise, even width, dilated
        case(&[1, 24, 7, 9], &[40, 24, 1, 1], 1, 1, 1, [0; 4], U8, I8, false),        // pointwise
    ]);
    for (n, c) in all.iter().enumerate() {
        // kiln_channels_last 1: x and y channels-last; 2: y only (a stem).
        for mode in [1, 2] {
            let (mut t, want) = qlinear_case(c, n);
            let out: Vec<usize> = [c.x[0], c.w[0]].into_iter().chain(c.out()).collect();
            if mode == 1 {
                t[0] = move_channels(&t[0], &c.x, true);
            }
            let mut attrs = c.attrs();
            attrs.push(("kiln_channels_last", Attr::Int(mode)));
            let op = make("QLinearConv", 10, &attrs, 9, 1).unwrap();
            let refs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
            let variants = run_cpu_variants(op.as_ref(), &as_inputs(&refs, &[1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
            for (name, outs) in &variants {
                assert_eq!(outs[0].dims(), [out[0], out[2], out[3], out[1]], "case {n} mode {mode}: variant {name}");
                assert_eq!(move_channels(&outs[0], &out, false).to_f64_vec(), want, "case {n} x{:?} w{:?}: channels-last mode {mode} variant {name}", c.x, c.w);
            }
        }
    }
}

#[test]
fn conv_integer_variants_equal_the_exact_reference() {
    for (n, c) in cases().iter().enumerate() {
        let (acc, x, w, zx, zw) = c.sums(40 + n as u64);
        let op = make("ConvInteger", 10, &c.attrs(), 4, 1).unwrap();
        let t = [x, w, zx, zw];
        let refs: Vec<Option<&Tensor>> = t.iter().map(Some).collect();
        let variants = run_cpu_variants(op.as_ref(), &as_inputs(&refs, &[1, 2, 3])).unwrap();
        let offered: Vec<String> = names(&variants).into_iter().filter(|v| v.starts_with("isa=")).collect();
        assert_eq!(offered, expected_isas(c), "case {n}");
        for (name, outs) in &variants {
            assert_eq!(outs[0].to_f64_vec(), acc, "case {n} x{:?} w{:?}: variant {name}", c.x, c.w);
        }
    }
}
