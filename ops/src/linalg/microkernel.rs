//! f32 GEMM micro-kernels: one register tile `C[MR x NR] (+)= A[MR x kc] * B[kc x NR]`
//! from packed panels, one per instruction set, chosen at run time ([`Isa`]).
//!
//! Panel layouts (shared by every kernel, with its own MR and NR): an A panel is `kc`
//! groups of MR values (column `k` of MR consecutive rows), a B panel `kc` groups of NR
//! values (row `k` of NR consecutive columns). C is row-major with row stride `ldc`.
//! The kernels broadcast A and hold NR-wide vectors of B and C, so a tile's output
//! rows are stored as contiguous vectors.
use crate::cpu::CpuFeatures;

/// An instruction set with a micro-kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512F: an 8 x 32 tile (16 zmm accumulators; 8 rows divide the usual channel
    /// counts).
    Avx512,
    /// AVX2 + FMA: a 6 x 16 tile (12 ymm accumulators).
    Avx2,
    /// Plain Rust: a 4 x 8 tile, vectorised by the compiler for the baseline ISA.
    Portable,
}

impl Isa {
    /// Every instruction set this CPU can run, best first.
    pub fn available() -> Vec<Isa> {
        let f = CpuFeatures::get();
        let mut out = vec![];
        if f.avx512f {
            out.push(Isa::Avx512);
        }
        if f.avx2_fma() {
            out.push(Isa::Avx2);
        }
        out.push(Isa::Portable);
        out
    }

    /// The best instruction set of this CPU.
    pub fn best() -> Isa {
        Isa::available()[0]
    }

    /// A stable number for tuning records (0 is the best available).
    pub fn code(self) -> u32 {
        match self {
            Isa::Avx512 => 512,
            Isa::Avx2 => 256,
            Isa::Portable => 1,
        }
    }

    pub fn from_code(code: u32) -> Option<Isa> {
        Isa::available().into_iter().find(|i| i.code() == code)
    }

    /// Rows of a register tile.
    pub fn mr(self) -> usize {
        match self {
            Isa::Avx512 => 8,
            Isa::Avx2 => 6,
            Isa::Portable => 4,
        }
    }

    /// Columns of a register tile.
    pub fn nr(self) -> usize {
        match self {
            Isa::Avx512 => 32,
            Isa::Avx2 => 16,
            Isa::Portable => 8,
        }
    }

    /// `C[MR x NR] = (accumulate ? C : 0) + A * B` over `kc` steps.
    ///
    /// # Safety
    /// `a` holds `kc * MR` floats, `b` `kc * NR`, `c` a full MR x NR tile with row
    /// stride `ldc`; the CPU has this instruction set ([`Isa::available`]).
    #[inline]
    pub unsafe fn tile(self, kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::tile_avx512(kc, a, b, c, ldc, accumulate),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::tile_avx2(kc, a, b, c, ldc, accumulate),
            _ => tile_portable(kc, a, b, c, ldc, accumulate),
        }
    }
}

impl Isa {
    /// [`Isa::tile`] with A read in place instead of packed: row `i` of step `k` is
    /// `x[offs[k] + i]` (a convolution's input under tap `k`, MR consecutive pixels).
    ///
    /// # Safety
    /// As [`Isa::tile`], with `offs` holding `kc` offsets and `x[offs[k] + i]` readable
    /// for every `k < kc`, `i < MR`.
    #[inline]
    pub unsafe fn tile_gather(self, kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::gather_avx512(kc, x, offs, b, c, ldc, accumulate),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::gather_avx2(kc, x, offs, b, c, ldc, accumulate),
            _ => gather_portable::<1>(kc, x, offs, b, c, ldc, accumulate),
        }
    }

    /// [`Isa::tile_gather`] over pixels eight floats apart: row `i` of step `k` is
    /// `x[offs[k] + 8 * i]` (a channel-blocked input, `[.., pixel, 8 channels]`).
    ///
    /// # Safety
    /// As [`Isa::tile_gather`], with `x[offs[k] + 8 * i]` readable.
    #[inline]
    pub unsafe fn tile_gather8(self, kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::gather8_avx512(kc, x, offs, b, c, ldc, accumulate),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::gather8_avx2(kc, x, offs, b, c, ldc, accumulate),
            _ => gather_portable::<8>(kc, x, offs, b, c, ldc, accumulate),
        }
    }
}

/// Where [`Isa::tile_rows_blocked`] stores a tile, and its epilogue: row `i`, lanes
/// `8q..8q + 8` go to `c + q * block_stride + rows[i]` (a channel-blocked output: the
/// pixel of row `i` in channel block `q`), for `q < blocks`, unless `rows[i]` is
/// [`BlockedStore::SKIP`]; each value is `acc + bias[lane]`, plus what `c` held when
/// `residual`, then clamped to `clamp` (`max` then `min`: a NaN stays NaN).
#[derive(Clone, Copy, Debug)]
pub struct BlockedStore {
    pub block_stride: usize,
    /// Per tile row, the offset of its pixel's first lane (MR entries are read).
    pub rows: [usize; 8],
    pub blocks: usize,
    /// NR values.
    pub bias: *const f32,
    pub residual: bool,
    pub clamp: Option<(f32, f32)>,
}

impl BlockedStore {
    /// A row [`Isa::tile_rows_blocked`] computes but does not store.
    pub const SKIP: usize = usize::MAX;

    /// Rows stored at consecutive pixels: row `i` at `8 * i`.
    pub const CONSECUTIVE: [usize; 8] = [0, 8, 16, 24, 32, 40, 48, 56];

    #[inline(always)]
    pub fn finish(&self, v: f32, prev: f32) -> f32 {
        let v = if self.residual { v + prev } else { v };
        match self.clamp {
            Some((lo, hi)) => {
                let v = if v.is_nan() || v >= lo { v } else { lo };
                if v.is_nan() || v <= hi {
                    v
                } else {
                    hi
                }
            }
            None => v,
        }
    }
}

impl Isa {
    /// A tile over the whole reduction whose rows read their own pixels: row `i` of
    /// step `k` is `x[i][offs[k]]` (so a tile may span output rows and skip the
    /// padding columns between them), stored through `out` (see [`BlockedStore`]).
    /// `b` holds `kc` groups of `width` values: NR, or a narrower panel
    /// ([`Isa::narrow_nr`]) whose tile computes only its own lanes.
    ///
    /// # Safety
    /// As [`Isa::tile_gather`], with `x[i][offs[k]]` readable for `i < MR`, `k < kc`;
    /// `out.bias` holds `width` floats and every addressed output vector is writable
    /// and touched by no other thread.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile_rows_blocked(self, kc: usize, width: usize, x: &[*const f32; 8], offs: *const usize, b: *const f32, c: *mut f32, out: &BlockedStore) {
        // Rows up to the last one stored are computed (a tile short of MR rows, the last
        // of an image, computes only its own).
        let rows = out.rows[..self.mr()].iter().rposition(|&r| r != BlockedStore::SKIP).map_or(0, |i| i + 1);
        match (self, width == self.nr()) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, true) => blocked_rows::<2, true>(rows, kc, x, offs, b, c, out),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, false) => blocked_rows::<1, true>(rows, kc, x, offs, b, c, out),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, true) => blocked_rows::<2, false>(rows, kc, x, offs, b, c, out),
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, false) => blocked_rows::<1, false>(rows, kc, x, offs, b, c, out),
            _ => blocked_portable(kc, x, offs, b, c, out),
        }
    }

    /// The width of the narrow tile [`Isa::tile_rows_blocked`] has for a last panel of
    /// at most half of NR channels.
    pub fn narrow_nr(self) -> usize {
        (self.nr() / 2).max(8)
    }
}

/// The AVX-512 (`WIDE`) or AVX2 blocked tile of `V` vectors computing its first `rows`
/// rows only.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn blocked_rows<const V: usize, const WIDE: bool>(rows: usize, kc: usize, x: &[*const f32; 8], offs: *const usize, b: *const f32, c: *mut f32, out: &BlockedStore) {
    macro_rules! by_rows {
        ($($n:literal)*) => {
            match (rows, WIDE) {
                $(($n, true) => x86::blocked_avx512::<V, $n>(kc, x, offs, b, c, out),
                ($n, false) => x86::blocked_avx2::<V, $n>(kc, x, offs, b, c, out),)*
                (6, true) => x86::blocked_avx512::<V, 6>(kc, x, offs, b, c, out),
                (7, true) => x86::blocked_avx512::<V, 7>(kc, x, offs, b, c, out),
                (_, true) => x86::blocked_avx512::<V, 8>(kc, x, offs, b, c, out),
                (_, false) => x86::blocked_avx2::<V, 6>(kc, x, offs, b, c, out),
            }
        };
    }
    by_rows!(1 2 3 4 5)
}

unsafe fn blocked_portable(kc: usize, x: &[*const f32; 8], offs: *const usize, b: *const f32, c: *mut f32, out: &BlockedStore) {
    const MR: usize = 4;
    const NR: usize = 8;
    let mut acc = [[0f32; NR]; MR];
    let b = std::slice::from_raw_parts(b, kc * NR);
    for (k, bk) in b.chunks_exact(NR).enumerate() {
        let o = *offs.add(k);
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = *x[i].add(o);
            for (v, &w) in row.iter_mut().zip(bk) {
                // Not mul_add: without FMA in the baseline ISA that is a libm call.
                *v += ai * w;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        if out.rows[i] == BlockedStore::SKIP || out.blocks == 0 {
            continue;
        }
        for (l, &v) in row.iter().enumerate() {
            let o = c.add(out.rows[i] + l);
            *o = out.finish(v + *out.bias.add(l), *o);
        }
    }
}

/// The portable 4x8 tile: `a_row(k)` points at step k's MR values of A, `S` floats
/// apart.
#[inline(always)]
unsafe fn portable_body<const S: usize>(kc: usize, a_row: impl Fn(usize) -> *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
    const MR: usize = 4;
    const NR: usize = 8;
    let mut acc = [[0f32; NR]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(std::slice::from_raw_parts(c.add(i * ldc), NR));
        }
    }
    let b = std::slice::from_raw_parts(b, kc * NR);
    for (k, bk) in b.chunks_exact(NR).enumerate() {
        let a = a_row(k);
        for i in 0..MR {
            let ai = *a.add(i * S);
            for j in 0..NR {
                // Not mul_add: without FMA in the baseline ISA that is a libm call.
                acc[i][j] += ai * bk[j];
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        std::slice::from_raw_parts_mut(c.add(i * ldc), NR).copy_from_slice(row);
    }
}

unsafe fn gather_portable<const S: usize>(kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
    portable_body::<S>(kc, |k| x.add(*offs.add(k)), b, c, ldc, accumulate)
}

unsafe fn tile_portable(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
    portable_body::<1>(kc, |k| a.add(k * 4), b, c, ldc, accumulate)
}

/// The transpose of an 8x8 block of f32 held as eight AVX rows (row `i` of the
/// result holds lane `i` of every input row).
///
/// # Safety
/// The CPU has AVX; inline it into a function compiled with AVX enabled.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose8x8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let a0 = _mm256_unpacklo_ps(r[0], r[1]);
    let a1 = _mm256_unpackhi_ps(r[0], r[1]);
    let a2 = _mm256_unpacklo_ps(r[2], r[3]);
    let a3 = _mm256_unpackhi_ps(r[2], r[3]);
    let a4 = _mm256_unpacklo_ps(r[4], r[5]);
    let a5 = _mm256_unpackhi_ps(r[4], r[5]);
    let a6 = _mm256_unpacklo_ps(r[6], r[7]);
    let a7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(a0, a2);
    let s1 = _mm256_shuffle_ps::<0xEE>(a0, a2);
    let s2 = _mm256_shuffle_ps::<0x44>(a1, a3);
    let s3 = _mm256_shuffle_ps::<0xEE>(a1, a3);
    let s4 = _mm256_shuffle_ps::<0x44>(a4, a6);
    let s5 = _mm256_shuffle_ps::<0xEE>(a4, a6);
    let s6 = _mm256_shuffle_ps::<0x44>(a5, a7);
    let s7 = _mm256_shuffle_ps::<0xEE>(a5, a7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The AVX-512 8x32 tile: `a_row(k)` points at step k's MR values of A, `S`
    /// floats apart.
    #[inline(always)]
    unsafe fn avx512_body<const S: usize>(kc: usize, a_row: impl Fn(usize) -> *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        const MR: usize = 8;
        let mut acc0 = [_mm512_setzero_ps(); MR];
        let mut acc1 = [_mm512_setzero_ps(); MR];
        if accumulate {
            for i in 0..MR {
                acc0[i] = _mm512_loadu_ps(c.add(i * ldc));
                acc1[i] = _mm512_loadu_ps(c.add(i * ldc + 16));
            }
        }
        let mut b = b;
        for k in 0..kc {
            let a = a_row(k);
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            for i in 0..MR {
                let ai = _mm512_set1_ps(*a.add(i * S));
                acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
                acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
            }
            b = b.add(32);
        }
        for i in 0..MR {
            _mm512_storeu_ps(c.add(i * ldc), acc0[i]);
            _mm512_storeu_ps(c.add(i * ldc + 16), acc1[i]);
        }
    }

    /// The AVX2 + FMA 6x16 tile: `a_row(k)` points at step k's MR values of A, `S`
    /// floats apart.
    #[inline(always)]
    unsafe fn avx2_body<const S: usize>(kc: usize, a_row: impl Fn(usize) -> *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        const MR: usize = 6;
        let mut acc0 = [_mm256_setzero_ps(); MR];
        let mut acc1 = [_mm256_setzero_ps(); MR];
        if accumulate {
            for i in 0..MR {
                acc0[i] = _mm256_loadu_ps(c.add(i * ldc));
                acc1[i] = _mm256_loadu_ps(c.add(i * ldc + 8));
            }
        }
        let mut b = b;
        for k in 0..kc {
            let a = a_row(k);
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for i in 0..MR {
                let ai = _mm256_broadcast_ss(&*a.add(i * S));
                acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
                acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
            }
            b = b.add(16);
        }
        for i in 0..MR {
            _mm256_storeu_ps(c.add(i * ldc), acc0[i]);
            _mm256_storeu_ps(c.add(i * ldc + 8), acc1[i]);
        }
    }

    /// The blocked epilogue of one 8-lane vector (see `BlockedStore`).
    #[inline(always)]
    unsafe fn finish8(v: __m256, o: *mut f32, out: &super::BlockedStore, lo: __m256, hi: __m256) {
        let mut v = v;
        if out.residual {
            v = _mm256_add_ps(v, _mm256_loadu_ps(o));
        }
        if out.clamp.is_some() {
            // max/min return their second operand when either is NaN: NaN stays NaN.
            v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
        }
        _mm256_storeu_ps(o, v);
    }

    /// The AVX-512 blocked tile: `MR` (at most 8) rows of `V` vectors (32 or 16
    /// channels).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn blocked_avx512<const V: usize, const MR: usize>(kc: usize, x: &[*const f32; 8], offs: *const usize, b: *const f32, c: *mut f32, out: &super::BlockedStore) {
        let x = *x;
        let bias: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(out.bias.add(16 * v)));
        let mut acc = [bias; MR];
        let mut b = b;
        for k in 0..kc {
            let o = *offs.add(k);
            let w: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
            for i in 0..MR {
                let ai = _mm512_set1_ps(*x[i].add(o));
                for v in 0..V {
                    acc[i][v] = _mm512_fmadd_ps(ai, w[v], acc[i][v]);
                }
            }
            b = b.add(16 * V);
        }
        if out.blocks == 2 * V && out.rows[..MR].iter().all(|&r| r != super::BlockedStore::SKIP) {
            // Every row and lane stored: straight from the registers (loops of fixed
            // length, fully unrolled).
            let (lo, hi) = out.clamp.map_or((_mm256_setzero_ps(), _mm256_setzero_ps()), |(l, h)| (_mm256_set1_ps(l), _mm256_set1_ps(h)));
            for i in 0..MR {
                let row = c.add(out.rows[i]);
                for v in 0..V {
                    let a = acc[i][v];
                    let (a0, a1) = (_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))));
                    finish8(a0, row.add(2 * v * out.block_stride), out, lo, hi);
                    finish8(a1, row.add((2 * v + 1) * out.block_stride), out, lo, hi);
                }
            }
            return;
        }
        // Else through memory: an epilogue indexing the accumulators directly makes LLVM
        // keep one of them on the stack inside the loop above.
        let mut tile = [0f32; 8 * 32];
        for i in 0..MR {
            for v in 0..V {
                _mm512_storeu_ps(tile.as_mut_ptr().add(i * 16 * V + 16 * v), acc[i][v]);
            }
        }
        store_rows(&tile, 16 * V, MR, c, out);
    }

    /// The blocked epilogue of a tile held row-major in `tile` (`nr` lanes a row).
    #[inline(always)]
    unsafe fn store_rows(tile: &[f32], nr: usize, mr: usize, c: *mut f32, out: &super::BlockedStore) {
        let (lo, hi) = out.clamp.map_or((_mm256_setzero_ps(), _mm256_setzero_ps()), |(l, h)| (_mm256_set1_ps(l), _mm256_set1_ps(h)));
        for i in 0..mr {
            if out.rows[i] == super::BlockedStore::SKIP {
                continue;
            }
            for q in 0..out.blocks {
                finish8(_mm256_loadu_ps(tile.as_ptr().add(i * nr + 8 * q)), c.add(q * out.block_stride + out.rows[i]), out, lo, hi);
            }
        }
    }

    /// The AVX2 blocked tile: `MR` (at most 6) rows of `V` vectors (16 or 8 channels).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn blocked_avx2<const V: usize, const MR: usize>(kc: usize, x: &[*const f32; 8], offs: *const usize, b: *const f32, c: *mut f32, out: &super::BlockedStore) {
        let x = *x;
        let bias: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(out.bias.add(8 * v)));
        let mut acc = [bias; MR];
        let mut b = b;
        for k in 0..kc {
            let o = *offs.add(k);
            let w: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(b.add(8 * v)));
            for i in 0..MR {
                let ai = _mm256_broadcast_ss(&*x[i].add(o));
                for v in 0..V {
                    acc[i][v] = _mm256_fmadd_ps(ai, w[v], acc[i][v]);
                }
            }
            b = b.add(8 * V);
        }
        let mut tile = [0f32; 6 * 16];
        for i in 0..MR {
            for v in 0..V {
                _mm256_storeu_ps(tile.as_mut_ptr().add(i * 8 * V + 8 * v), acc[i][v]);
            }
        }
        store_rows(&tile, 8 * V, MR, c, out);
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_avx512(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx512_body::<1>(kc, |k| a.add(k * 8), b, c, ldc, accumulate)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn gather_avx512(kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx512_body::<1>(kc, |k| x.add(*offs.add(k)), b, c, ldc, accumulate)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn gather8_avx512(kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx512_body::<8>(kc, |k| x.add(*offs.add(k)), b, c, ldc, accumulate)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_avx2(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx2_body::<1>(kc, |k| a.add(k * 6), b, c, ldc, accumulate)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gather_avx2(kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx2_body::<1>(kc, |k| x.add(*offs.add(k)), b, c, ldc, accumulate)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gather8_avx2(kc: usize, x: *const f32, offs: *const usize, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
        avx2_body::<8>(kc, |k| x.add(*offs.add(k)), b, c, ldc, accumulate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gathering kernels against the packed ones on the same operands (A read at
    /// scattered offsets, as a convolution's taps).
    #[test]
    fn gathered_tiles_match_packed_tiles() {
        for isa in Isa::available() {
            let (mr, nr, kc, ldc) = (isa.mr(), isa.nr(), 29, isa.nr() + 3);
            let x: Vec<f32> = (0..500).map(|i| ((i * 11) % 17) as f32 * 0.25 - 2.0).collect();
            let offs: Vec<usize> = (0..kc).map(|k| (k * 37) % 480).collect();
            let a: Vec<f32> = (0..kc * mr).map(|i| x[offs[i / mr] + i % mr]).collect();
            let b: Vec<f32> = (0..kc * nr).map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0).collect();
            for accumulate in [false, true] {
                let init: Vec<f32> = (0..mr * ldc).map(|i| i as f32 * 0.5).collect();
                let before = init.clone();
                let (mut want, mut got) = (init.clone(), init);
                unsafe {
                    isa.tile(kc, a.as_ptr(), b.as_ptr(), want.as_mut_ptr(), ldc, accumulate);
                    isa.tile_gather(kc, x.as_ptr(), offs.as_ptr(), b.as_ptr(), got.as_mut_ptr(), ldc, accumulate);
                }
                assert_eq!(got, want, "{isa:?}, accumulate {accumulate}");
                // The same rows eight floats apart.
                let x8: Vec<f32> = (0..500 * 8).map(|i| if i % 8 == 3 { x[i / 8] } else { f32::NAN }).collect();
                let offs8: Vec<usize> = offs.iter().map(|o| o * 8 + 3).collect();
                let mut got8 = before.clone();
                unsafe { isa.tile_gather8(kc, x8.as_ptr(), offs8.as_ptr(), b.as_ptr(), got8.as_mut_ptr(), ldc, accumulate) };
                assert_eq!(got8, want, "{isa:?} (stride 8), accumulate {accumulate}");
            }
        }
    }

    /// Every available kernel against a plain f64 product, accumulating and not.
    #[test]
    fn tiles_match_the_reference() {
        for isa in Isa::available() {
            let (mr, nr, kc, ldc) = (isa.mr(), isa.nr(), 37, isa.nr() + 5);
            let a: Vec<f32> = (0..kc * mr).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..kc * nr).map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0).collect();
            for accumulate in [false, true] {
                let mut c: Vec<f32> = (0..mr * ldc).map(|i| i as f32 * 0.25).collect();
                let before = c.clone();
                unsafe { isa.tile(kc, a.as_ptr(), b.as_ptr(), c.as_mut_ptr(), ldc, accumulate) };
                for i in 0..mr {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= nr {
                            assert_eq!(got, before[i * ldc + j], "{isa:?} wrote outside its tile");
                            continue;
                        }
                        let mut want: f64 = if accumulate { before[i * ldc + j] as f64 } else { 0.0 };
                        for k in 0..kc {
                            want += a[k * mr + i] as f64 * b[k * nr + j] as f64;
                        }
                        assert_eq!(got as f64, want, "{isa:?} ({i}, {j}), accumulate {accumulate}");
                    }
                }
            }
        }
    }
}
