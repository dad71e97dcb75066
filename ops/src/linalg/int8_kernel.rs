//! Exact 8-bit GEMM micro-kernels: a 4 x 16 tile of int32 sums `C[r][j] = sum_k
//! A[r][k] * B[k][j]` of 8-bit operands, per instruction set, chosen at run time:
//!
//! - [`Int8Isa::Avx512Vnni`]: `vpdpbusd`, unsigned bytes (the activations, B) times
//!   signed bytes (the weights, A), four products per 32-bit lane. B and A are packed in
//!   quads of k ([`Layout::Quads`]); the activations keep their zero point, which the
//!   caller folds out with the weights' row sums.
//! - [`Int8Isa::Avx2`]: both operands widened to i16 with their zero points subtracted
//!   (so they fit: |v| <= 255) and multiplied by `vpmaddwd`, pairs of k per 32-bit lane
//!   ([`Layout::Pairs`]); every product and pair sum is exact in i32. (`vpmaddubsw`
//!   would take bytes directly but saturates its i16 pair sums, 255 * 127 * 2 > 32767.)
//! - [`Int8Isa::Portable`]: the pairs layout in plain Rust.
//!
//! A is packed once per plan (`[rows][k-words]`, rows a multiple of 4); a B panel is 16
//! columns, word `kw * 16 + j` holding column j's pair or quad of k-word `kw`.
use crate::cpu::CpuFeatures;

/// Columns of a tile (one panel of B).
pub(crate) const NR: usize = 16;
/// Rows of a tile.
pub(crate) const MR: usize = 4;

/// How many k a 32-bit word of a packed operand holds and how they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Two k per word, each an i16 with the operand's zero point subtracted.
    Pairs,
    /// Four k per word, each a byte as stored (B unsigned, A signed).
    Quads,
}

impl Layout {
    pub(crate) fn per_word(self) -> usize {
        match self {
            Layout::Pairs => 2,
            Layout::Quads => 4,
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

    /// The 4 x 16 tile over `kw` k-words: A rows at `a + r * lda`, B panel at `b`,
    /// written to `c` (row-major, 16 per row).
    ///
    /// # Safety
    /// `a` holds 4 rows of `kw` words at stride `lda`, `b` holds `kw * 16` words, and
    /// `self` is in [`Int8Isa::available`].
    pub(crate) unsafe fn tile(self, kw: usize, a: *const u32, lda: usize, b: *const u32, c: &mut [i32; MR * NR]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => x86::tile_vnni(kw, a, lda, b, c),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => x86::tile_pairs_avx2(kw, a, lda, b, c),
            _ => tile_pairs(kw, a, lda, b, c),
        }
    }
}

/// The pairs tile in plain Rust.
unsafe fn tile_pairs(kw: usize, a: *const u32, lda: usize, b: *const u32, c: &mut [i32; MR * NR]) {
    c.fill(0);
    for k in 0..kw {
        let bw = std::slice::from_raw_parts(b.add(k * NR), NR);
        for r in 0..MR {
            let w = *a.add(r * lda + k);
            let (w0, w1) = (w as u16 as i16 as i32, (w >> 16) as u16 as i16 as i32);
            let row = &mut c[r * NR..(r + 1) * NR];
            for (o, &x) in row.iter_mut().zip(bw) {
                *o += w0 * (x as u16 as i16 as i32) + w1 * ((x >> 16) as u16 as i16 as i32);
            }
        }
    }
}

/// Packs one 8-bit operand row (`vals`, k values already as i32) into words:
/// pairs of i16 `v - zero` or quads of the raw bytes. Tail k are zero.
pub(crate) fn pack_row(layout: Layout, vals: &[i32], zero: i32, out: &mut [u32]) {
    let per = layout.per_word();
    for (w, o) in out.iter_mut().enumerate() {
        let at = |i: usize| vals.get(w * per + i).copied();
        *o = match layout {
            Layout::Pairs => {
                let h = |i: usize| at(i).map_or(0, |v| (v - zero) as i16 as u16 as u32);
                h(0) | h(1) << 16
            }
            Layout::Quads => (0..4).fold(0, |acc, i| acc | (at(i).map_or(0, |v| v as u8 as u32) << (8 * i))),
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    pub unsafe fn tile_pairs_avx2(kw: usize, a: *const u32, lda: usize, b: *const u32, c: &mut [i32; MR * NR]) {
        let z = _mm256_setzero_si256();
        let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21, mut c30, mut c31) = (z, z, z, z, z, z, z, z);
        let (a0, a1, a2, a3) = (a, a.add(lda), a.add(2 * lda), a.add(3 * lda));
        for k in 0..kw {
            let b0 = _mm256_loadu_si256(b.add(k * NR) as *const __m256i);
            let b1 = _mm256_loadu_si256(b.add(k * NR + 8) as *const __m256i);
            let w = _mm256_set1_epi32(*a0.add(k) as i32);
            c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(w, b0));
            c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(w, b1));
            let w = _mm256_set1_epi32(*a1.add(k) as i32);
            c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(w, b0));
            c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(w, b1));
            let w = _mm256_set1_epi32(*a2.add(k) as i32);
            c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(w, b0));
            c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(w, b1));
            let w = _mm256_set1_epi32(*a3.add(k) as i32);
            c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(w, b0));
            c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(w, b1));
        }
        let p = c.as_mut_ptr() as *mut __m256i;
        for (i, v) in [c00, c01, c10, c11, c20, c21, c30, c31].into_iter().enumerate() {
            _mm256_storeu_si256(p.add(i), v);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn tile_vnni(kw: usize, a: *const u32, lda: usize, b: *const u32, c: &mut [i32; MR * NR]) {
        let z = _mm512_setzero_si512();
        let (mut c0, mut c1, mut c2, mut c3) = (z, z, z, z);
        let (a0, a1, a2, a3) = (a, a.add(lda), a.add(2 * lda), a.add(3 * lda));
        for k in 0..kw {
            // 16 columns x 4 unsigned bytes; each row's 4 signed weight bytes broadcast.
            let bv = _mm512_loadu_si512(b.add(k * NR) as *const _);
            c0 = _mm512_dpbusd_epi32(c0, bv, _mm512_set1_epi32(*a0.add(k) as i32));
            c1 = _mm512_dpbusd_epi32(c1, bv, _mm512_set1_epi32(*a1.add(k) as i32));
            c2 = _mm512_dpbusd_epi32(c2, bv, _mm512_set1_epi32(*a2.add(k) as i32));
            c3 = _mm512_dpbusd_epi32(c3, bv, _mm512_set1_epi32(*a3.add(k) as i32));
        }
        let p = c.as_mut_ptr();
        _mm512_storeu_si512(p as *mut _, c0);
        _mm512_storeu_si512(p.add(NR) as *mut _, c1);
        _mm512_storeu_si512(p.add(2 * NR) as *mut _, c2);
        _mm512_storeu_si512(p.add(3 * NR) as *mut _, c3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every available ISA's tile equals the i64 product, at the extremes of the ranges
    /// (255 x -128 and 255 x 127 pairs, where `vpmaddubsw` would saturate) and on
    /// random values, with a k that is not a multiple of the word.
    #[test]
    fn tiles_are_exact_on_every_isa() {
        let k = 37;
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as i32
        };
        for extreme in [true, false] {
            let x: Vec<i32> = (0..k * NR).map(|i| if extreme { 255 - (i % 2) as i32 } else { rnd() & 255 }).collect();
            let w: Vec<i32> = (0..MR * k).map(|i| if extreme { if i % 3 == 0 { -128 } else { 127 } } else { (rnd() & 255) - 128 }).collect();
            let zx = if extreme { 0 } else { 3 };
            let want: Vec<i64> = (0..MR * NR).map(|e| (0..k).map(|kk| (w[(e / NR) * k + kk] as i64) * (x[kk * NR + e % NR] - zx) as i64).sum()).collect();
            for isa in Int8Isa::available() {
                let layout = isa.layout();
                let kw = k.div_ceil(layout.per_word());
                let mut a = vec![0u32; MR * kw];
                for r in 0..MR {
                    pack_row(layout, &w[r * k..(r + 1) * k], 0, &mut a[r * kw..(r + 1) * kw]);
                }
                let mut b = vec![0u32; kw * NR];
                let mut col = vec![0u32; kw];
                for j in 0..NR {
                    let xs: Vec<i32> = (0..k).map(|kk| x[kk * NR + j]).collect();
                    pack_row(layout, &xs, zx, &mut col);
                    for (kk, &v) in col.iter().enumerate() {
                        b[kk * NR + j] = v;
                    }
                }
                let mut c = [0i32; MR * NR];
                // SAFETY: a has MR rows of kw words, b kw * NR words, the isa is available.
                unsafe { isa.tile(kw, a.as_ptr(), kw, b.as_ptr(), &mut c) };
                let got: Vec<i64> = (0..MR * NR)
                    .map(|e| {
                        // Quads keep x's zero point: fold it out with the row sum.
                        let fold = if layout == Layout::Quads { zx as i64 * w[(e / NR) * k..(e / NR + 1) * k].iter().map(|&v| v as i64).sum::<i64>() } else { 0 };
                        c[e] as i64 - fold
                    })
                    .collect();
                assert_eq!(got, want, "{isa:?}, extreme {extreme}");
            }
        }
    }
}
