//! The fast CPU loop of the quantized binary ops (QLinearAdd, QLinearMul): the output
//! is walked as contiguous runs along which A and B are each either contiguous or one
//! repeated value (same shapes: one run; a one-element B; B broadcast along whole rows
//! or planes), reading the 8-bit inputs and writing the output bytes directly, a
//! block of lanes at a time that the compiler vectorises (compiled for AVX2 where the
//! CPU has it), in parallel for large tensors.
//!
//! Bit-exact with [`Arith::eval`], the definition: each op's [`Arith::unrounded`] is
//! the same f32 operations in the same order, and [`requantize_lanes`] equals
//! `round_i32(v).clamp(lo, hi)` for every f32 `v` (see its doc); the tests compare
//! the two element by element.
use super::qlinear_binary::{Arith, Params};
use crate::cpu;

/// Shortest run this loop takes; shorter runs (broadcasting along the last dim of a
/// small tensor, transposed-looking strides) go through the general walker.
const MIN_RUN: usize = 16;

/// `1.5 * 2^23`: adding it to an f32 of magnitude below `2^22` rounds it to an integer
/// (half to even, the default rounding mode), which the low mantissa bits then hold.
const MAGIC: f32 = 12_582_912.0;

/// `round_i32(v).clamp(lo, hi)` (MLAS's `cvtps2dq` then saturation) in operations
/// that vectorise: NaN and `v >= 2^31` (which `cvtps2dq` turns into `i32::MIN`) give
/// `lo`; otherwise clamping into `[lo, hi]` before rounding gives the same integer as
/// after, since the bounds are integers and rounding is monotone; the clamped value
/// is below `2^22` in magnitude, so the magic-number add rounds it half to even
/// exactly.
#[inline(always)]
pub(super) fn requantize_lanes(v: f32, lo: f32, hi: f32) -> i32 {
    let v = if v < 2_147_483_648.0 { v } else { lo };
    let v = if v > lo { v } else { lo };
    let v = if v < hi { v } else { hi };
    (v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// An 8-bit quantized element.
pub(super) trait Byte: Copy + Send + Sync + bytemuck::Pod {
    fn int(self) -> i32;
    /// The low byte of `v` (in range after requantization).
    fn from_int(v: i32) -> Self;
}

impl Byte for u8 {
    #[inline(always)]
    fn int(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn from_int(v: i32) -> u8 {
        v as u8
    }
}

impl Byte for i8 {
    #[inline(always)]
    fn int(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn from_int(v: i32) -> i8 {
        v as i8
    }
}

/// How one input reads along a run: contiguous elements, or one value repeated.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    Slice,
    Repeat,
}

/// The output as `outer` runs of `len` elements: for each input, how it reads along a
/// run and its strides over the outer dims (`outer_dims`, row-major).
#[derive(Debug, PartialEq)]
pub(super) struct Runs {
    len: usize,
    a: Side,
    b: Side,
    outer_dims: Vec<usize>,
    a_strides: Vec<usize>,
    b_strides: Vec<usize>,
}

impl Runs {
    /// The runs of an output of `dims` read with broadcast strides `sa`, `sb` (as
    /// `broadcast_strides` gives them), `None` when runs would be shorter than
    /// [`MIN_RUN`] (unless the whole output is shorter).
    pub fn of(dims: &[usize], sa: &[usize], sb: &[usize]) -> Option<Runs> {
        // Dims of size 1 do not move any offset.
        let kept: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        let side = |s: usize| if s == 0 { Side::Repeat } else { Side::Slice };
        let (a, b) = match kept.last() {
            Some(&d) if sa[d] <= 1 && sb[d] <= 1 => (side(sa[d]), side(sb[d])),
            Some(_) => return None,
            None => (Side::Slice, Side::Slice),
        };
        let fits = |side: Side, s: usize, len: usize| match side {
            Side::Repeat => s == 0,
            Side::Slice => s == len,
        };
        let mut len = 1usize;
        let mut inner = kept.len();
        while inner > 0 {
            let d = kept[inner - 1];
            if !(fits(a, sa[d], len) && fits(b, sb[d], len)) {
                break;
            }
            len *= dims[d];
            inner -= 1;
        }
        let total: usize = dims.iter().product();
        if total == 0 || (len < MIN_RUN && len < total) {
            return None;
        }
        let outer = &kept[..inner];
        Some(Runs {
            len,
            a,
            b,
            outer_dims: outer.iter().map(|&d| dims[d]).collect(),
            a_strides: outer.iter().map(|&d| sa[d]).collect(),
            b_strides: outer.iter().map(|&d| sb[d]).collect(),
        })
    }

    /// The offsets into A and B of the first element of run `r`.
    fn offsets(&self, mut r: usize) -> (usize, usize) {
        let (mut oa, mut ob) = (0, 0);
        for d in (0..self.outer_dims.len()).rev() {
            let i = r % self.outer_dims[d];
            r /= self.outer_dims[d];
            oa += i * self.a_strides[d];
            ob += i * self.b_strides[d];
        }
        (oa, ob)
    }
}

/// Runs the op over `runs` into `out` (the output's elements, in order).
pub(super) fn run<A: Arith, T: Byte>(arith: &A, p: &Params, runs: &Runs, a: &[T], b: &[T], out: &mut [T]) {
    let k = arith.consts(p);
    cpu::par_chunks_mut(out, 1, 1, |first, part| {
        #[cfg(target_arch = "x86_64")]
        if cpu::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe {
                if p.b_scalar {
                    chunk_avx2::<A, T, true>(arith, p, &k, runs, a, b, first, part)
                } else {
                    chunk_avx2::<A, T, false>(arith, p, &k, runs, a, b, first, part)
                }
            };
        }
        if p.b_scalar {
            chunk::<A, T, true>(arith, p, &k, runs, a, b, first, part)
        } else {
            chunk::<A, T, false>(arith, p, &k, runs, a, b, first, part)
        }
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_avx2<A: Arith, T: Byte, const BS: bool>(arith: &A, p: &Params, k: &A::Consts, runs: &Runs, a: &[T], b: &[T], first: usize, part: &mut [T]) {
    chunk::<A, T, BS>(arith, p, k, runs, a, b, first, part)
}

/// Output elements `first..first + part.len()`, run piece by run piece.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk<A: Arith, T: Byte, const BS: bool>(arith: &A, p: &Params, k: &A::Consts, runs: &Runs, a: &[T], b: &[T], first: usize, part: &mut [T]) {
    let (lo, hi) = (p.bounds.0 as f32, p.bounds.1 as f32);
    let f = |x: T, y: T| T::from_int(requantize_lanes(arith.unrounded::<BS>(x.int(), y.int(), p, k), lo, hi));
    let mut done = 0;
    while done < part.len() {
        let pos = first + done;
        let (r, at) = (pos / runs.len, pos % runs.len);
        let n = (runs.len - at).min(part.len() - done);
        let (oa, ob) = runs.offsets(r);
        let dst = &mut part[done..done + n];
        match (runs.a, runs.b) {
            (Side::Slice, Side::Slice) => {
                for ((o, &x), &y) in dst.iter_mut().zip(&a[oa + at..oa + at + n]).zip(&b[ob + at..ob + at + n]) {
                    *o = f(x, y);
                }
            }
            (Side::Slice, Side::Repeat) => {
                let y = b[ob];
                for (o, &x) in dst.iter_mut().zip(&a[oa + at..oa + at + n]) {
                    *o = f(x, y);
                }
            }
            (Side::Repeat, Side::Slice) => {
                let x = a[oa];
                for (o, &y) in dst.iter_mut().zip(&b[ob + at..ob + at + n]) {
                    *o = f(x, y);
                }
            }
            // A run of repeated A and B is one element long (some input has every
            // output dim larger than 1); computed the same way.
            (Side::Repeat, Side::Repeat) => dst.iter_mut().for_each(|o| *o = f(a[oa], b[ob])),
        }
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::qlinear::round_i32;

    #[test]
    fn requantize_lanes_equals_round_then_clamp() {
        let mut special = vec![
            0.0f32, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 127.5, 128.5, -128.5, -127.5, 254.5, 255.5, 255.49998, 0.49999997, 1e-40, -1e-40,
            2_147_483_520.0, 2_147_483_648.0, -2_147_483_648.0, -2_147_483_904.0, 4194304.5, 8388607.5, 1e30, -1e30,
            f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN,
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..20000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            special.push(f32::from_bits(x));
            special.push((x % 2000) as f32 * 0.25 - 300.0);
        }
        for (lo, hi) in [(0, 255), (-128, 127)] {
            for &v in &special {
                assert_eq!(requantize_lanes(v, lo as f32, hi as f32), round_i32(v).clamp(lo, hi), "v = {v:e} ({:#x}), bounds {lo}..{hi}", v.to_bits());
            }
        }
    }

    #[test]
    fn runs_of_shapes() {
        use crate::broadcast::broadcast_strides;
        let runs = |a: &[usize], b: &[usize], out: &[usize]| Runs::of(out, &broadcast_strides(a, out), &broadcast_strides(b, out));
        // Same shapes: one run.
        let r = runs(&[1, 4, 5, 6], &[1, 4, 5, 6], &[1, 4, 5, 6]).unwrap();
        assert_eq!((r.len, r.a, r.b, r.outer_dims.len()), (120, Side::Slice, Side::Slice, 0));
        // One channel value per plane: runs of a plane, B repeated.
        let r = runs(&[2, 4, 5, 6], &[1, 4, 1, 1], &[2, 4, 5, 6]).unwrap();
        assert_eq!((r.len, r.a, r.b, &r.outer_dims[..], &r.b_strides[..]), (30, Side::Slice, Side::Repeat, &[2, 4][..], &[0, 1][..]));
        assert_eq!(r.offsets(5), (150, 1));
        // A row broadcast over rows: runs of a row.
        let r = runs(&[3, 20], &[20], &[3, 20]).unwrap();
        assert_eq!((r.len, r.a, r.b, &r.a_strides[..], &r.b_strides[..]), (20, Side::Slice, Side::Slice, &[20][..], &[0][..]));
        // A column against a row: runs of a row, A repeated.
        let r = runs(&[3, 1], &[1, 20], &[3, 20]).unwrap();
        assert_eq!((r.len, r.a, r.b), (20, Side::Repeat, Side::Slice));
        // Short runs in a large output are left to the general walker; a small output is one run.
        assert!(runs(&[40, 3], &[40, 1], &[40, 3]).is_none());
        assert_eq!(runs(&[2, 3], &[2, 1], &[2, 3]).map(|r| r.len), None);
        assert_eq!(runs(&[3], &[1], &[3]).map(|r| (r.len, r.b)), Some((3, Side::Repeat)));
        assert_eq!(runs(&[], &[], &[]).map(|r| r.len), Some(1));
        assert!(runs(&[0, 20], &[20], &[0, 20]).is_none());
    }

    /// A small xorshift generator for the property tests.
    struct Gen(u64);

    impl Gen {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// The fast loop against the general walker (every element through `eval`) on
    /// random shapes, broadcasts, dtypes, scales and zero points: powers of two that
    /// make exact .5 ties, ratios that saturate at both ends or overflow i32, zero and
    /// infinite scales (NaN values).
    fn fast_equals_eval<A: Arith>(arith: A) {
        use super::super::qlinear::QParams;
        use super::super::qlinear_binary::{b_is_span_scalar, QLinearBinary};
        use crate::broadcast::{broadcast_shapes, broadcast_strides};
        use kiln_graph::Tensor;
        let op = QLinearBinary(arith);
        let mut g = Gen(0x9E37_79B9_7F4A_7C15);
        let scales = [0.5f32, 1.0, 0.25, 2.0, 0.02, 0.07, 0.0131, 3.0, 1e-30, 1e30, 0.0, f32::INFINITY];
        let mut fast_runs = 0;
        for case in 0..600 {
            let rank = 1 + g.below(4);
            let dims: Vec<usize> = (0..rank).map(|_| [1, 2, 3, 5, 7, 16, 19, 33][g.below(8)]).collect();
            let mut other = dims.clone();
            match g.below(4) {
                0 => {}
                1 => other = vec![1],
                2 => other.iter_mut().for_each(|d| if g.below(2) == 0 { *d = 1 }),
                _ => other = other[g.below(rank)..].to_vec(),
            }
            let (ad, bd) = if g.below(3) == 0 { (other, dims) } else { (dims, other) };
            let out_dims = broadcast_shapes(&[&ad, &bd]).unwrap();
            let (sa, sb) = (broadcast_strides(&ad, &out_dims), broadcast_strides(&bd, &out_dims));
            let Some(runs) = Runs::of(&out_dims, &sa, &sb) else { continue };
            fast_runs += 1;
            let signed = case % 2 == 1;
            let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
            let mut q = || QParams { scale: scales[g.below(scales.len())], zp: lo + g.below(256) as i32 };
            let p = Params { a: q(), b: q(), c: q(), bounds: (lo, hi), b_scalar: b_is_span_scalar(&ad, &bd, &out_dims) };
            let n = |d: &[usize]| d.iter().product::<usize>();
            let bytes = |len: usize, g: &mut Gen| -> Vec<u8> { (0..len).map(|i| if i % 7 == 0 { [0u8, 127, 128, 255][g.below(4)] } else { g.below(256) as u8 }).collect() };
            let (av, bv) = (bytes(n(&ad), &mut g), bytes(n(&bd), &mut g));
            let mut fast = vec![0u8; n(&out_dims)];
            let general = if signed {
                let cast = |v: &[u8]| v.iter().map(|&x| x as i8).collect::<Vec<i8>>();
                let (at, bt) = (Tensor::from_slice(&ad, &cast(&av)).unwrap(), Tensor::from_slice(&bd, &cast(&bv)).unwrap());
                let mut out = Tensor::from_slice(&out_dims, &vec![0i8; fast.len()]).unwrap();
                op.run_general(&p, &at, &bt, &[sa, sb], &mut out).unwrap();
                let mut y = vec![0i8; fast.len()];
                run(&op.0, &p, &runs, at.as_slice::<i8>().unwrap(), bt.as_slice::<i8>().unwrap(), &mut y);
                fast = y.iter().map(|&v| v as u8).collect();
                out.bytes().to_vec()
            } else {
                let (at, bt) = (Tensor::from_slice(&ad, &av).unwrap(), Tensor::from_slice(&bd, &bv).unwrap());
                let mut out = Tensor::from_slice(&out_dims, &vec![0u8; fast.len()]).unwrap();
                op.run_general(&p, &at, &bt, &[sa, sb], &mut out).unwrap();
                run(&op.0, &p, &runs, &av, &bv, &mut fast);
                out.bytes().to_vec()
            };
            for (i, (f, e)) in fast.iter().zip(&general).enumerate() {
                assert_eq!(f, e, "{} case {case}: A {ad:?} B {bd:?} {p:?}, element {i}", A::NAME);
            }
        }
        assert!(fast_runs > 300, "only {fast_runs} cases took the fast loop");
    }

    #[test]
    fn qlinear_add_fast_equals_eval() {
        fast_equals_eval(super::super::qlinear_add::Add);
    }

    #[test]
    fn qlinear_mul_fast_equals_eval() {
        fast_equals_eval(super::super::qlinear_mul::Mul);
    }
}
