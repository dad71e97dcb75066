//! MaxPool of 8-bit integers: the separable passes (taken without the Indices output)
//! against the per-tap loop (taken with it) on random shapes, 1-D to 3-D, with pads,
//! strides, dilations and ceil_mode, and against a naive 2-D reference on the shape of
//! ResNet's stem.
use crate::testing::{as_inputs, ints, make, run};
use kiln_graph::{Attr, DType, Tensor};

/// A small xorshift generator.
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Random bytes as a u8 or i8 tensor, the extremes of the type frequent.
fn bytes(g: &mut Gen, dtype: DType, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<u8> = (0..n).map(|i| if i % 5 == 0 { [0u8, 127, 128, 255][g.below(4)] } else { g.below(256) as u8 }).collect();
    match dtype {
        DType::I8 => Tensor::from_slice(dims, &v.iter().map(|&b| b as i8).collect::<Vec<i8>>()).unwrap(),
        _ => Tensor::from_slice(dims, &v).unwrap(),
    }
}

#[test]
fn maxpool_int_fast_equals_per_tap_loop() {
    let mut g = Gen(0x2545_F491_4F6C_DD1D);
    let mut checked = 0;
    for case in 0..400 {
        let n = 1 + g.below(3);
        let dtype = if case % 2 == 0 { DType::U8 } else { DType::I8 };
        let k: Vec<i64> = (0..n).map(|_| 1 + g.below(4) as i64).collect();
        let s: Vec<i64> = (0..n).map(|_| 1 + g.below(3) as i64).collect();
        let d: Vec<i64> = (0..n).map(|_| 1 + g.below(2) as i64).collect();
        let pads: Vec<i64> = (0..2 * n).map(|i| g.below(k[i % n] as usize) as i64).collect();
        let ceil = g.below(2) as i64;
        let mut dims = vec![1 + g.below(2), 1 + g.below(11)];
        dims.extend((0..n).map(|_| 1 + g.below(if n == 3 { 9 } else { 40 })));
        let x = bytes(&mut g, dtype, &dims);
        let attrs = vec![("kernel_shape", ints(&k)), ("strides", ints(&s)), ("dilations", ints(&d)), ("pads", ints(&pads)), ("ceil_mode", Attr::Int(ceil))];
        let what = format!("{dtype} x{dims:?} k{k:?} s{s:?} d{d:?} p{pads:?} ceil{ceil}");
        let fast = make("MaxPool", 12, &attrs, 1, 1).unwrap();
        let Ok(y) = run(fast.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]) else { continue };
        let general = make("MaxPool", 12, &attrs, 1, 2).unwrap();
        let want = run(general.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_eq!(y[0].dims(), want[0].dims(), "{what}");
        assert_eq!(y[0].bytes(), want[0].bytes(), "{what}");
        checked += 1;
    }
    assert!(checked > 300, "only {checked} geometries were valid");
}

/// ResNet's stem pool (3x3, stride 2, pad 1) on u8 and i8, against a naive loop.
#[test]
fn maxpool_int_stem_matches_naive() {
    let mut g = Gen(77);
    for dtype in [DType::U8, DType::I8] {
        let (c, h, w) = (9, 23, 30);
        let x = bytes(&mut g, dtype, &[1, c, h, w]);
        let attrs = vec![("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2])), ("pads", ints(&[1, 1, 1, 1]))];
        let op = make("MaxPool", 12, &attrs, 1, 1).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
        let (oh, ow) = (12, 15);
        assert_eq!(y.dims(), &[1, c, oh, ow]);
        let (xv, yv) = (x.to_i64_vec().unwrap(), y.to_i64_vec().unwrap());
        for p in 0..c {
            for i in 0..oh {
                for j in 0..ow {
                    let mut m = i64::MIN;
                    for di in 0..3 {
                        for dj in 0..3 {
                            let (r, q) = ((2 * i + di) as i64 - 1, (2 * j + dj) as i64 - 1);
                            if (0..h as i64).contains(&r) && (0..w as i64).contains(&q) {
                                m = m.max(xv[p * h * w + r as usize * w + q as usize]);
                            }
                        }
                    }
                    assert_eq!(yv[(p * oh + i) * ow + j], m, "{dtype} plane {p} at ({i}, {j})");
                }
            }
        }
    }
}
