//! Exact 8-bit GEMM micro-kernels, per instruction set, chosen at run time. A tile is
//! [`PX`] rows of the activation operand (pixels of a convolution, rows of a MatMul's A)
//! times [`CH`] columns of the constant operand (output channels), held as int32 sums
//! `c[j][l] = sum_k x[j][k] * w[k][l]` with every product and sum exact:
//!
//! - [`Int8Isa::Avx2`]: both operands widened to i16 with their zero points subtracted
//!   (so they fit: |v| <= 255), two k per 32-bit word ([`Layout::Pairs`]), multiplied by
//!   `vpmaddwd` with the 16 channels in the lanes of two registers and each pixel's word
//!   broadcast. (`vpmaddubsw` would take bytes directly but saturates its i16 pair
//!   sums, 255 * 127 * 2 > 32767, so it cannot be exact.)
//! - [`Int8Isa::Avx512Vnni`]: `vpdpbusd`, four k per word ([`Layout::Quads`]): the
//!   activations' bytes unsigned and as stored (keeping their zero point, which the
//!   caller folds out with the weights' sums), the weights' bytes signed.
//! - [`Int8Isa::Portable`]: plain Rust, for either layout.
//!
//! The activation rows are read through an indirection table: for each of `taps`
//! segments of `tw` words, one word offset per tile row from a common base (the input
//! pixel a convolution tap reads, or a padding row). The constant operand is packed once
//! ([`pack_constant`]) as `[block of CH columns][taps * tw][CH]` words.
use crate::cpu::CpuFeatures;
use crate::{TuneParam, TuneValues};

/// Columns of the constant operand (output channels) per tile: the vector lanes.
pub(crate) const CH: usize = 16;
/// Activation rows (pixels) per tile.
pub(crate) const PX: usize = 6;

/// How many k a 32-bit word of a packed operand holds and how they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Two k per word, each an i16 with the operand's zero point subtracted.
    Pairs,
    /// Four k per word, each a byte as stored (activations unsigned, weights signed).
    Quads,
}

impl Layout {
    pub(crate) fn per_word(self) -> usize {
        match self {
            Layout::Pairs => 2,
            Layout::Quads => 4,
        }
    }

    /// One word of `vals` (at most `per_word`, missing ones padded with `pad`):
    /// pairs subtract `zero` and keep i16, quads keep the low byte.
    #[inline]
    pub(crate) fn word(self, vals: impl Iterator<Item = i32>, zero: i32, pad: i32) -> u32 {
        let mut vals = vals.chain(std::iter::repeat(pad));
        match self {
            Layout::Pairs => (0..2).fold(0, |acc, i| acc | (((vals.next().unwrap_or(pad) - zero) as i16 as u16 as u32) << (16 * i))),
            Layout::Quads => (0..4).fold(0, |acc, i| acc | ((vals.next().unwrap_or(pad) as u8 as u32) << (8 * i))),
        }
    }
}

/// The integer GEMM instruction sets, best first in [`Int8Isa::available`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Isa {
    Avx512Vnni,
    Avx2,
    Portable,
}

impl Int8Isa {
    /// Those this CPU runs, best first.
    pub fn available() -> Vec<Int8Isa> {
        let f = CpuFeatures::get();
        let mut out = vec![];
        if f.avx512f && f.avx512bw && f.avx512vnni {
            out.push(Int8Isa::Avx512Vnni);
        }
        if f.avx2 {
            out.push(Int8Isa::Avx2);
        }
        out.push(Int8Isa::Portable);
        out
    }

    /// A stable number for tuning records.
    pub fn code(self) -> u32 {
        match self {
            Int8Isa::Portable => 0,
            Int8Isa::Avx2 => 1,
            Int8Isa::Avx512Vnni => 2,
        }
    }

    pub fn from_code(c: u32) -> Option<Int8Isa> {
        Int8Isa::available().into_iter().find(|i| i.code() == c)
    }

    pub(crate) fn layout(self) -> Layout {
        match self {
            Int8Isa::Avx512Vnni => Layout::Quads,
            _ => Layout::Pairs,
        }
    }

    /// One tile: `c[j * CH + l] = sum_{t < taps, k < tw} dot(x[offs[t * PX + j] + k],
    /// w[(t * tw + k) * CH + l])`, `dot` of the words' pairs or quads (`layout`, which
    /// must be this ISA's unless it is [`Int8Isa::Portable`]).
    ///
    /// # Safety
    /// `offs` holds `taps * PX` offsets, each of `tw` readable words from `x`; `w`
    /// holds `taps * tw * CH` words; `self` is in [`Int8Isa::available`].
    pub(crate) unsafe fn tile(self, layout: Layout, taps: usize, tw: usize, x: *const u32, offs: *const u32, w: *const u32, c: &mut [i32; PX * CH]) {
        debug_assert!(self == Int8Isa::Portable || layout == self.layout());
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => x86::tile_vnni(taps, tw, x, offs, w, c),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => x86::tile_pairs_avx2(taps, tw, x, offs, w, c),
            _ => tile_portable(layout, taps, tw, x, offs, w, c),
        }
    }

    /// Two tiles, `a` (rows through `offs_a`) into `c[..PX * CH]` and `b` into the rest:
    /// [`Self::tile`] twice, in one pass where the ISA has registers for both.
    ///
    /// # Safety
    /// As [`Self::tile`], for both offset lists.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn tile_pair(self, layout: Layout, taps: usize, tw: usize, x: *const u32, offs_a: *const u32, offs_b: *const u32, w: *const u32, c: &mut [i32; 2 * PX * CH]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => x86::tile_vnni_pair(taps, tw, x, offs_a, offs_b, w, c),
            _ => {
                let (a, b) = c.split_at_mut(PX * CH);
                self.tile(layout, taps, tw, x, offs_a, w, a.try_into().expect("a tile"));
                self.tile(layout, taps, tw, x, offs_b, w, b.try_into().expect("a tile"));
            }
        }
    }

    /// Whether [`Self::tile_pair`] is one pass (worth pairing tiles for).
    pub(crate) fn pairs_tiles(self) -> bool {
        self == Int8Isa::Avx512Vnni
    }

    /// One row of a tile (a matrix-vector product: `c[l] = sum_{k < tw} dot(x[k], w[k *
    /// CH + l])` for the CH columns), without computing five dropped rows.
    ///
    /// # Safety
    /// `x` holds `tw` words, `w` holds `tw * CH`; `self` is in [`Int8Isa::available`].
    pub(crate) unsafe fn row(self, layout: Layout, tw: usize, x: *const u32, w: *const u32, c: &mut [i32; CH]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => x86::row_pairs_avx2(tw, x, w, c),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => {
                // (The six-row tile, each row reading x: VNNI's is fast enough.)
                let (offs, mut t) = ([0u32; PX], [0i32; PX * CH]);
                x86::tile_vnni(1, tw, x, offs.as_ptr(), w, &mut t);
                c.copy_from_slice(&t[..CH]);
            }
            _ => {
                c.fill(0);
                for k in 0..tw {
                    let ws = std::slice::from_raw_parts(w.add(k * CH), CH);
                    for (o, &ww) in c.iter_mut().zip(ws) {
                        *o += dot(layout, *x.add(k), ww);
                    }
                }
            }
        }
    }
}

/// The tuning parameter `isa` of a packed integer kernel: the available instruction
/// sets, VNNI only where its quads layout fits the operands. Unit tests also get
/// [`PORTABLE_QUADS`], so that the quads layout and its zero-point fold are checked on
/// every CPU, not only on those with VNNI.
pub(crate) fn isa_param(quads_ok: bool) -> TuneParam {
    #[allow(unused_mut)]
    let mut isas: Vec<u32> = Int8Isa::available().into_iter().filter(|i| quads_ok || i.layout() != Layout::Quads).map(Int8Isa::code).collect();
    #[cfg(test)]
    if quads_ok {
        isas.push(PORTABLE_QUADS);
    }
    TuneParam { name: "isa", default: isas[0], candidates: isas }
}

/// The first tile of a [`Int8Isa::tile_pair`] buffer, for [`Int8Isa::tile`].
pub(crate) fn first_tile(c: &mut [i32; 2 * PX * CH]) -> &mut [i32; PX * CH] {
    (&mut c[..PX * CH]).try_into().expect("a tile")
}

/// The tuning parameter `isa` of a kernel that has no packed layout to agree on (the
/// channels-last depthwise kernel): every available instruction set.
pub(crate) fn isa_param_any() -> TuneParam {
    let isas: Vec<u32> = Int8Isa::available().into_iter().map(Int8Isa::code).collect();
    TuneParam { name: "isa", default: isas[0], candidates: isas }
}

/// The instruction set the tuning values choose for [`isa_param_any`].
pub(crate) fn chosen_any(tune: &TuneValues) -> Int8Isa {
    Int8Isa::from_code(tune.get(&isa_param_any())).unwrap_or(Int8Isa::Portable)
}

/// The `isa` value of the portable kernel in the quads layout (unit tests only).
pub(crate) const PORTABLE_QUADS: u32 = 100;

/// The instruction set and layout the tuning values choose for a packed kernel.
pub(crate) fn chosen(tune: &TuneValues, quads_ok: bool) -> (Int8Isa, Layout) {
    let code = tune.get(&isa_param(quads_ok));
    match Int8Isa::from_code(code) {
        Some(isa) => (isa, isa.layout()),
        None if code == PORTABLE_QUADS && quads_ok => (Int8Isa::Portable, Layout::Quads),
        None => (Int8Isa::Portable, Layout::Pairs),
    }
}

/// The product of two words: i16 pairs, or unsigned times signed byte quads.
#[inline(always)]
fn dot(layout: Layout, x: u32, w: u32) -> i32 {
    match layout {
        Layout::Pairs => (x as u16 as i16 as i32) * (w as u16 as i16 as i32) + ((x >> 16) as u16 as i16 as i32) * ((w >> 16) as u16 as i16 as i32),
        Layout::Quads => (0..4).map(|i| ((x >> (8 * i)) as u8 as i32) * ((w >> (8 * i)) as u8 as i8 as i32)).sum(),
    }
}

/// The tile in plain Rust.
unsafe fn tile_portable(layout: Layout, taps: usize, tw: usize, x: *const u32, offs: *const u32, w: *const u32, c: &mut [i32; PX * CH]) {
    c.fill(0);
    for t in 0..taps {
        for j in 0..PX {
            let x = std::slice::from_raw_parts(x.add(*offs.add(t * PX + j) as usize), tw);
            let row = &mut c[j * CH..(j + 1) * CH];
            for (k, &xw) in x.iter().enumerate() {
                let ws = std::slice::from_raw_parts(w.add((t * tw + k) * CH), CH);
                for (o, &ww) in row.iter_mut().zip(ws) {
                    *o += dot(layout, xw, ww);
                }
            }
        }
    }
}

/// Packs the constant operand: `n` columns (output channels) of `taps` segments of
/// `len` k each, `value(col, tap, i)` the raw integer and `zero(col)` its zero point,
/// into `[n / CH blocks][taps * tw][CH]` words (`tw = len` in words). Columns past `n`
/// and k past `len` are zero.
pub(crate) fn pack_constant(layout: Layout, n: usize, taps: usize, len: usize, value: impl Fn(usize, usize, usize) -> i32, zero: impl Fn(usize) -> i32) -> Vec<u32> {
    let per = layout.per_word();
    let tw = len.div_ceil(per);
    let blocks = n.div_ceil(CH);
    let mut out = vec![0u32; blocks * taps * tw * CH];
    for col in 0..n {
        let (blk, lane) = (col / CH, col % CH);
        let z = zero(col);
        for t in 0..taps {
            for k in 0..tw {
                let vals = (k * per..((k + 1) * per).min(len)).map(|i| value(col, t, i));
                out[((blk * taps + t) * tw + k) * CH + lane] = layout.word(vals, z, z);
            }
        }
    }
    out
}

/// How a tile's sums become 8-bit outputs: per output channel (lane) the `shift` added
/// to the sum (bias and zero-point folds) and the f32 multiplier; the product clamped to
/// `[lo, hi]` (the output range less its zero point, so integers), rounded half to even,
/// plus the zero point `zy`. The f32 product is the same one a scalar reference makes.
pub(crate) struct Requantize {
    pub shift: [i32; CH],
    pub mult: [f32; CH],
    pub lo: f32,
    pub hi: f32,
    pub zy: i32,
}

/// 1.5 * 2^23: the f32 sum `v + ROUND` of an f32 `|v| <= 2^22` has unit spacing, so it
/// is `v` rounded half to even (and its low mantissa bits hold that integer).
const ROUND: f32 = 12582912.0;

impl Requantize {
    /// `out[j][l]` for every pixel j and lane l of `c` (lanes past the real channels
    /// are computed and ignored by the caller), in the output's range.
    pub(crate) fn tile(&self, isa: Int8Isa, c: &[i32; PX * CH], out: &mut [[i32; CH]; PX]) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the isa is available, so the CPU has AVX2.
            Int8Isa::Avx2 | Int8Isa::Avx512Vnni => unsafe { x86::requantize_avx2(self, c, out) },
            _ => {
                for (j, o) in out.iter_mut().enumerate() {
                    for l in 0..CH {
                        let v = c[j * CH + l].wrapping_add(self.shift[l]) as f32 * self.mult[l];
                        let v = v.clamp(self.lo, self.hi);
                        o[l] = ((v + ROUND) - ROUND) as i32 + self.zy;
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{pack_pairs_avx2, requantize_rows_avx2, store_tile_avx2, tile_vnni_pair_requantize};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CH, PX};
    use std::arch::x86_64::*;

    /// Six pixels' rows of one tap.
    #[inline(always)]
    unsafe fn rows(x: *const u32, offs: *const u32, t: usize) -> [*const u32; PX] {
        let o = offs.add(t * PX);
        let at = |j: usize| x.add(*o.add(j) as usize);
        [at(0), at(1), at(2), at(3), at(4), at(5)]
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn tile_pairs_avx2(taps: usize, tw: usize, x: *const u32, offs: *const u32, w: *const u32, c: &mut [i32; PX * CH]) {
        let z = _mm256_setzero_si256();
        let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21) = (z, z, z, z, z, z);
        let (mut c30, mut c31, mut c40, mut c41, mut c50, mut c51) = (z, z, z, z, z, z);
        let mut wp = w;
        for t in 0..taps {
            let [p0, p1, p2, p3, p4, p5] = rows(x, offs, t);
            for k in 0..tw {
                let b0 = _mm256_loadu_si256(wp as *const __m256i);
                let b1 = _mm256_loadu_si256(wp.add(8) as *const __m256i);
                wp = wp.add(CH);
                macro_rules! row {
                    ($p:ident, $lo:ident, $hi:ident) => {
                        let a = _mm256_set1_epi32(*$p.add(k) as i32);
                        $lo = _mm256_add_epi32($lo, _mm256_madd_epi16(a, b0));
                        $hi = _mm256_add_epi32($hi, _mm256_madd_epi16(a, b1));
                    };
                }
                row!(p0, c00, c01);
                row!(p1, c10, c11);
                row!(p2, c20, c21);
                row!(p3, c30, c31);
                row!(p4, c40, c41);
                row!(p5, c50, c51);
            }
        }
        let p = c.as_mut_ptr() as *mut __m256i;
        for (i, v) in [c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51].into_iter().enumerate() {
            _mm256_storeu_si256(p.add(i), v);
        }
    }

    /// [`super::Int8Isa::row`]: two words at a time into four independent sums.
    #[target_feature(enable = "avx2")]
    pub unsafe fn row_pairs_avx2(tw: usize, x: *const u32, w: *const u32, c: &mut [i32; CH]) {
        let z = _mm256_setzero_si256();
        let (mut a0, mut a1, mut b0, mut b1) = (z, z, z, z);
        let ld = |k: usize, h: usize| _mm256_loadu_si256(w.add(k * CH + 8 * h) as *const __m256i);
        let mut k = 0;
        while k + 2 <= tw {
            let (p, q) = (_mm256_set1_epi32(*x.add(k) as i32), _mm256_set1_epi32(*x.add(k + 1) as i32));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p, ld(k, 0)));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(p, ld(k, 1)));
            b0 = _mm256_add_epi32(b0, _mm256_madd_epi16(q, ld(k + 1, 0)));
            b1 = _mm256_add_epi32(b1, _mm256_madd_epi16(q, ld(k + 1, 1)));
            k += 2;
        }
        if k < tw {
            let p = _mm256_set1_epi32(*x.add(k) as i32);
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p, ld(k, 0)));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(p, ld(k, 1)));
        }
        _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, _mm256_add_epi32(a0, b0));
        _mm256_storeu_si256(c.as_mut_ptr().add(8) as *mut __m256i, _mm256_add_epi32(a1, b1));
    }

    /// The pairs layout's repack of `planes` (one per input channel, each `n` pixels):
    /// `dst[j * tw + k] = (planes[2k][j] - zx) | (planes[2k + 1][j] - zx) << 16` as i16
    /// halves, 8 pixels x 8 words at a time through an 8 x 8 transpose. Covers the
    /// pixels and words of whole blocks and returns how many of each, `(n / 8 * 8,
    /// pairs / 8 * 8)`; the caller packs the rest.
    #[target_feature(enable = "avx2")]
    pub unsafe fn pack_pairs_avx2(planes: &[&[u8]], signed: bool, zx: i32, tw: usize, dst: &mut [u32]) -> (usize, usize) {
        let n = planes.first().map_or(0, |p| p.len());
        let (nv, kv) = (n / 8 * 8, (planes.len() / 2).min(tw) / 8 * 8);
        assert!(dst.len() >= n * tw && planes.iter().all(|p| p.len() == n));
        let z = _mm_set1_epi16(zx as i16);
        macro_rules! widen {
            ($p:expr, $j:expr) => {{
                let v = _mm_loadl_epi64($p.as_ptr().add($j) as *const __m128i);
                _mm_sub_epi16(if signed { _mm_cvtepi8_epi16(v) } else { _mm_cvtepu8_epi16(v) }, z)
            }};
        }
        let out = dst.as_mut_ptr();
        for j in (0..nv).step_by(8) {
            for k0 in (0..kv).step_by(8) {
                // r[i]: word k0 + i of pixels j..j + 8.
                let mut r = [_mm256_setzero_si256(); 8];
                for (i, ri) in r.iter_mut().enumerate() {
                    let (a, b) = (widen!(planes[2 * (k0 + i)], j), widen!(planes[2 * (k0 + i) + 1], j));
                    *ri = _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
                }
                let mut t = [_mm256_setzero_si256(); 8];
                for h in 0..4 {
                    t[2 * h] = _mm256_unpacklo_epi32(r[2 * h], r[2 * h + 1]);
                    t[2 * h + 1] = _mm256_unpackhi_epi32(r[2 * h], r[2 * h + 1]);
                }
                // Columns q (low lane) and q + 4 (high lane) of rows 0..4 (lo) and 4..8 (hi).
                for q in 0..4 {
                    let (a, b, c, d) = (t[q / 2], t[q / 2 + 2], t[4 + q / 2], t[4 + q / 2 + 2]);
                    let (lo, hi) = if q % 2 == 0 {
                        (_mm256_unpacklo_epi64(a, b), _mm256_unpacklo_epi64(c, d))
                    } else {
                        (_mm256_unpackhi_epi64(a, b), _mm256_unpackhi_epi64(c, d))
                    };
                    _mm256_storeu_si256(out.add((j + q) * tw + k0) as *mut __m256i, _mm256_permute2x128_si256(lo, hi, 0x20));
                    _mm256_storeu_si256(out.add((j + q + 4) * tw + k0) as *mut __m256i, _mm256_permute2x128_si256(lo, hi, 0x31));
                }
            }
        }
        (nv, kv)
    }

    /// Stores a requantized full tile (`vals[j][l]`: pixel j, channel l, each within
    /// the 8-bit output's range) into an NCHW output: 6 bytes at `dst + l * plane` for
    /// each channel `l < channels`, through byte packs and an 8 x 16 byte transpose.
    #[target_feature(enable = "avx2")]
    pub unsafe fn store_tile_avx2(vals: &[[i32; CH]; PX], signed: bool, dst: *mut u8, plane: usize, channels: usize) {
        let mut rows = [_mm_setzero_si128(); 8];
        for (j, row) in rows.iter_mut().enumerate().take(PX) {
            let p = vals[j].as_ptr() as *const __m256i;
            // i16 of channels 0-3, 8-11 | 4-7, 12-15, put in order.
            let w = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))), 0b11_01_10_00);
            let (lo, hi) = (_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            *row = if signed { _mm_packs_epi16(lo, hi) } else { _mm_packus_epi16(lo, hi) };
        }
        // t: channel-interleaved pixel pairs; u: 4 pixels per channel; w: 8 per channel.
        let t: [__m128i; 8] = [
            _mm_unpacklo_epi8(rows[0], rows[1]),
            _mm_unpackhi_epi8(rows[0], rows[1]),
            _mm_unpacklo_epi8(rows[2], rows[3]),
            _mm_unpackhi_epi8(rows[2], rows[3]),
            _mm_unpacklo_epi8(rows[4], rows[5]),
            _mm_unpackhi_epi8(rows[4], rows[5]),
            _mm_unpacklo_epi8(rows[6], rows[7]),
            _mm_unpackhi_epi8(rows[6], rows[7]),
        ];
        // u[h][q]: pixels 4h..4h + 4 of channels 4q..4q + 4.
        let u = |h: usize| {
            let (a, b, c, d) = (t[4 * h], t[4 * h + 2], t[4 * h + 1], t[4 * h + 3]);
            [_mm_unpacklo_epi16(a, b), _mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(c, d), _mm_unpackhi_epi16(c, d)]
        };
        let (u0, u1) = (u(0), u(1));
        for q in 0..4 {
            for (half, w) in [_mm_unpacklo_epi32(u0[q], u1[q]), _mm_unpackhi_epi32(u0[q], u1[q])].into_iter().enumerate() {
                for k in 0..2 {
                    let l = 4 * q + 2 * half + k;
                    if l < channels {
                        let bytes = (if k == 0 { _mm_cvtsi128_si64(w) } else { _mm_extract_epi64(w, 1) } as u64).to_le_bytes();
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(l * plane), PX);
                    }
                }
            }
        }
    }

    /// [`super::Requantize::tile`] eight lanes at a time.
    #[target_feature(enable = "avx2")]
    pub unsafe fn requantize_avx2(r: &super::Requantize, c: &[i32; PX * CH], out: &mut [[i32; CH]; PX]) {
        let (lo, hi) = (_mm256_set1_ps(r.lo), _mm256_set1_ps(r.hi));
        let round = _mm256_set1_ps(super::ROUND);
        let bias = _mm256_set1_epi32(r.zy.wrapping_sub(super::ROUND.to_bits() as i32));
        for h in 0..CH / 8 {
            let shift = _mm256_loadu_si256(r.shift.as_ptr().add(8 * h) as *const __m256i);
            let mult = _mm256_loadu_ps(r.mult.as_ptr().add(8 * h));
            for (j, o) in out.iter_mut().enumerate() {
                let acc = _mm256_add_epi32(_mm256_loadu_si256(c.as_ptr().add(j * CH + 8 * h) as *const __m256i), shift);
                let v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), mult), lo), hi);
                // The low mantissa bits of v + 1.5 * 2^23 are v rounded half to even.
                let q = _mm256_add_epi32(_mm256_castps_si256(_mm256_add_ps(v, round)), bias);
                _mm256_storeu_si256(o.as_mut_ptr().add(8 * h) as *mut __m256i, q);
            }
        }
    }

    /// [`super::Requantize::tile`] and the store of a channels-last output in one pass:
    /// pixel `j < count`'s first `channels` requantized sums go, as bytes, to `dst + j *
    /// stride`.
    #[target_feature(enable = "avx2")]
    ///
    /// The saturating packs do the lower clamp: the product, capped at `hi`, rounds half
    /// to even (`vcvtps2dq`; a product below -2^31 gives -2^31), saturates to i16, adds
    /// the zero point with i16 saturation and saturates to the output's 8 bits, which is
    /// `clamp(round(v) + zy)` for every finite `v`.
    pub unsafe fn requantize_rows_avx2(r: &super::Requantize, c: &[i32; PX * CH], signed: bool, dst: *mut u8, stride: usize, count: usize, channels: usize) {
        const _: () = assert!(CH == 16);
        let hi = _mm256_set1_ps(r.hi);
        let zy = _mm256_set1_epi16(r.zy as i16);
        let shift = [_mm256_loadu_si256(r.shift.as_ptr() as *const __m256i), _mm256_loadu_si256(r.shift.as_ptr().add(8) as *const __m256i)];
        let mult = [_mm256_loadu_ps(r.mult.as_ptr()), _mm256_loadu_ps(r.mult.as_ptr().add(8))];
        for j in 0..count {
            let q = |h: usize| {
                let acc = _mm256_add_epi32(_mm256_loadu_si256(c.as_ptr().add(j * CH + 8 * h) as *const __m256i), shift[h]);
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), mult[h]), hi))
            };
            // packs_epi32 interleaves the halves per 128-bit lane; the permutes restore the order.
            let words = _mm256_permute4x64_epi64(_mm256_adds_epi16(_mm256_packs_epi32(q(0), q(1)), zy), 0b1101_1000);
            let bytes = if signed { _mm256_packs_epi16(words, words) } else { _mm256_packus_epi16(words, words) };
            let v = _mm256_castsi256_si128(_mm256_permute4x64_epi64(bytes, 0b1000));
            let d = dst.add(j * stride);
            if channels == CH {
                _mm_storeu_si128(d as *mut __m128i, v);
            } else {
                let mut tmp = [0u8; CH];
                _mm_storeu_si128(tmp.as_mut_ptr() as *mut __m128i, v);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), d, channels);
            }
        }
    }

    /// The sums of two tiles at once (`a` and `b`: each [`PX`] rows through its own
    /// offsets), each starting from `init`: twelve independent sums per weight vector,
    /// enough to cover `vpdpbusd`'s latency, where one tile's six leave it waiting.
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI; inline into a function compiled for it.
    #[inline(always)]
    unsafe fn sums_vnni_pair(init: __m512i, taps: usize, tw: usize, x: *const u32, offs_a: *const u32, offs_b: *const u32, w: *const u32) -> [__m512i; 2 * PX] {
        let mut acc = [init; 2 * PX];
        let mut wp = w;
        for t in 0..taps {
            let (ra, rb) = (rows(x, offs_a, t), rows(x, offs_b, t));
            let r = [ra[0], ra[1], ra[2], ra[3], ra[4], ra[5], rb[0], rb[1], rb[2], rb[3], rb[4], rb[5]];
            for k in 0..tw {
                // 16 channels' 4 signed weight bytes; each pixel's 4 unsigned bytes broadcast.
                let b = _mm512_loadu_si512(wp as *const _);
                wp = wp.add(CH);
                for (a, p) in acc.iter_mut().zip(r) {
                    *a = _mm512_dpbusd_epi32(*a, _mm512_set1_epi32(*p.add(k) as i32), b);
                }
            }
        }
        acc
    }

    /// [`super::Int8Isa::tile_pair`] with VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile_vnni_pair(taps: usize, tw: usize, x: *const u32, offs_a: *const u32, offs_b: *const u32, w: *const u32, c: &mut [i32; 2 * PX * CH]) {
        let acc = sums_vnni_pair(_mm512_setzero_si512(), taps, tw, x, offs_a, offs_b, w);
        let p = c.as_mut_ptr();
        for (i, v) in acc.into_iter().enumerate() {
            _mm512_storeu_si512(p.add(i * CH) as *mut _, v);
        }
    }

    /// [`tile_vnni_pair`] with the channels-last requantization fused: the sums start
    /// from the shift and stay in registers; pixel `j < count` of the two tiles (`a`'s
    /// six, then `b`'s) goes, as `channels` bytes, to `dst + j * stride`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile_vnni_pair_requantize(taps: usize, tw: usize, x: *const u32, offs_a: *const u32, offs_b: *const u32, w: *const u32, r: &super::Requantize, dst: *mut u8, stride: usize, count: usize, channels: usize) {
        const _: () = assert!(CH == 16);
        let acc = sums_vnni_pair(_mm512_loadu_si512(r.shift.as_ptr() as *const _), taps, tw, x, offs_a, offs_b, w);
        let hi = _mm512_set1_ps(r.hi);
        let (lo, zy) = (_mm512_set1_epi32(r.lo as i32), _mm512_set1_epi32(r.zy));
        let mult = _mm512_loadu_ps(r.mult.as_ptr());
        let mask: __mmask16 = if channels >= CH { !0 } else { (1u16 << channels) - 1 };
        for (j, a) in acc.into_iter().enumerate().take(count) {
            // Rounded half to even (the default rounding mode), at most hi, at least lo
            // (the same as clamping the product: lo and hi are integers).
            let q = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), mult), hi)), lo);
            _mm512_mask_cvtepi32_storeu_epi8(dst.add(j * stride) as *mut _, mask, _mm512_add_epi32(q, zy));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile_vnni(taps: usize, tw: usize, x: *const u32, offs: *const u32, w: *const u32, c: &mut [i32; PX * CH]) {
        let z = _mm512_setzero_si512();
        let (mut c0, mut c1, mut c2, mut c3, mut c4, mut c5) = (z, z, z, z, z, z);
        let mut wp = w;
        for t in 0..taps {
            let [p0, p1, p2, p3, p4, p5] = rows(x, offs, t);
            for k in 0..tw {
                // 16 channels' 4 signed weight bytes; each pixel's 4 unsigned bytes broadcast.
                let b = _mm512_loadu_si512(wp as *const _);
                wp = wp.add(CH);
                c0 = _mm512_dpbusd_epi32(c0, _mm512_set1_epi32(*p0.add(k) as i32), b);
                c1 = _mm512_dpbusd_epi32(c1, _mm512_set1_epi32(*p1.add(k) as i32), b);
                c2 = _mm512_dpbusd_epi32(c2, _mm512_set1_epi32(*p2.add(k) as i32), b);
                c3 = _mm512_dpbusd_epi32(c3, _mm512_set1_epi32(*p3.add(k) as i32), b);
                c4 = _mm512_dpbusd_epi32(c4, _mm512_set1_epi32(*p4.add(k) as i32), b);
                c5 = _mm512_dpbusd_epi32(c5, _mm512_set1_epi32(*p5.add(k) as i32), b);
            }
        }
        let p = c.as_mut_ptr();
        for (i, v) in [c0, c1, c2, c3, c4, c5].into_iter().enumerate() {
            _mm512_storeu_si512(p.add(i * CH) as *mut _, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every available ISA's tile (and the portable tile in both layouts) equals the
    /// i64 product, at the extremes of the ranges (255 x -128 and 255 x 127 pairs,
    /// where `vpmaddubsw` would saturate) and on random values, with a k that is not a
    /// multiple of the word, several taps and a padding row.
    #[test]
    fn tiles_are_exact_on_every_isa() {
        let (taps, len, n) = (3, 37, CH);
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as i32
        };
        for extreme in [true, false] {
            // x[j][t][i] (unsigned), w[col][t][i] (signed).
            let x: Vec<i32> = (0..PX * taps * len).map(|i| if extreme { 255 - (i % 2) as i32 } else { rnd() & 255 }).collect();
            let w: Vec<i32> = (0..n * taps * len).map(|i| if extreme { if i % 3 == 0 { -128 } else { 127 } } else { (rnd() & 255) - 128 }).collect();
            let zx = if extreme { 0 } else { 3 };
            // Row 4 reads the padding row at tap 1: x's zero point everywhere.
            let xv = |j: usize, t: usize, i: usize| if j == 4 && t == 1 { zx } else { x[(j * taps + t) * len + i] };
            let want: Vec<i64> = (0..PX * CH)
                .map(|e| {
                    let (j, l) = (e / CH, e % CH);
                    (0..taps).flat_map(|t| (0..len).map(move |i| (t, i))).map(|(t, i)| w[(l * taps + t) * len + i] as i64 * (xv(j, t, i) - zx) as i64).sum()
                })
                .collect();
            let mut runs: Vec<(Int8Isa, Layout)> = Int8Isa::available().into_iter().map(|i| (i, i.layout())).collect();
            runs.push((Int8Isa::Portable, Layout::Quads));
            for (isa, layout) in runs {
                let tw = len.div_ceil(layout.per_word());
                let packed = pack_constant(layout, n, taps, len, |c, t, i| w[(c * taps + t) * len + i], |_| 0);
                // Row r = (t, j) at offset r * tw, stored in reverse order of r.
                let rows: Vec<u32> = (0..PX * taps)
                    .rev()
                    .flat_map(|r| {
                        let (t, j) = (r / PX, r % PX);
                        (0..tw).map(move |k| (t, j, k))
                    })
                    .map(|(t, j, k)| layout.word((k * layout.per_word()..((k + 1) * layout.per_word()).min(len)).map(|i| xv(j, t, i)), zx, zx))
                    .collect();
                let offs: Vec<u32> = (0..PX * taps).map(|r| ((PX * taps - 1 - r) * tw) as u32).collect();
                let mut c = [0i32; PX * CH];
                // SAFETY: offs has taps * PX rows of tw words in rows, packed taps * tw * CH
                // words, the isa is available.
                unsafe { isa.tile(layout, taps, tw, rows.as_ptr(), offs.as_ptr(), packed.as_ptr(), &mut c) };
                let got: Vec<i64> = (0..PX * CH)
                    .map(|e| {
                        // Quads keep x's zero point: fold it out with the column sum.
                        let l = e % CH;
                        let fold = if layout == Layout::Quads { zx as i64 * w[l * taps * len..(l + 1) * taps * len].iter().map(|&v| v as i64).sum::<i64>() } else { 0 };
                        c[e] as i64 - fold
                    })
                    .collect();
                assert_eq!(got, want, "{isa:?} {layout:?}, extreme {extreme}");
                // Two tiles at once: a as above, b its pixels in reverse order.
                let offs_b: Vec<u32> = (0..PX * taps).map(|r| offs[r / PX * PX + PX - 1 - r % PX]).collect();
                let mut pair = [0i32; 2 * PX * CH];
                // SAFETY: as above, for both offset lists.
                unsafe { isa.tile_pair(layout, taps, tw, rows.as_ptr(), offs.as_ptr(), offs_b.as_ptr(), packed.as_ptr(), &mut pair) };
                let reversed: Vec<i32> = (0..PX * CH).map(|e| c[(PX - 1 - e / CH) * CH + e % CH]).collect();
                assert_eq!((&pair[..PX * CH], &pair[PX * CH..]), (&c[..], &reversed[..]), "pair: {isa:?} {layout:?}, extreme {extreme}");
                // One row alone (pixel 0's tap 0, an odd number of pairs): `row`.
                let mut r = [0i32; CH];
                // SAFETY: row 0 of tap 0 has tw words, the first tw * CH packed words are
                // tap 0's, the isa is available.
                unsafe { isa.row(layout, tw, rows.as_ptr().add(offs[0] as usize), packed.as_ptr(), &mut r) };
                let tap0 = |l: usize| &w[l * taps * len..l * taps * len + len];
                let fold = |l: usize| if layout == Layout::Quads { zx as i64 * tap0(l).iter().map(|&v| v as i64).sum::<i64>() } else { 0 };
                let got: Vec<i64> = (0..CH).map(|l| r[l] as i64 - fold(l)).collect();
                let want: Vec<i64> = (0..CH).map(|l| tap0(l).iter().enumerate().map(|(i, &v)| v as i64 * (xv(0, 0, i) - zx) as i64).sum()).collect();
                assert_eq!(got, want, "row: {isa:?} {layout:?}, extreme {extreme}");
            }
        }
    }
}
