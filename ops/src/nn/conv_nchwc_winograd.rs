//! Winograd F(4x4, 3x3) in the channel-blocked layout, for `kiln.ConvNchwc`'s 3x3
//! stride-1 undilated ungrouped convolutions over a blocked input: each 4x4 output
//! tile comes from a 6x6 input tile with 36 multiplies per (input, output) channel
//! pair instead of 144.
//!
//! The filters are transformed once per plan (`U = G g G^T`, in f64) into one
//! `[C x M]` matrix per element of the 6x6 transformed tile, packed in panels of NR
//! output channels for the blocked micro-kernel. A task takes a block of tiles of one
//! image: it transforms their inputs eight channels at a time (`V = B^T d B`, one
//! `[tiles x C]` matrix `V_e` per element), runs the 36 products `M_e = V_e U_e` on
//! the micro-kernel (rows: tiles, lanes: output channels, stored as channel blocks),
//! and transforms the outputs (`Y = A^T M A`), adding the bias and a residual,
//! clamping or activating, and storing each tile clipped at the output's edges.
//!
//! The points 0, +-1, +-2 keep the transforms' coefficients small (at most 8 in `A`,
//! 1/24 in `G`): the error against the f64 reference is a few times the direct sum's,
//! about 2e-6 relative over 256 input channels.
use super::conv_cpu::ConvProblem;
use crate::cpu::{self, SharedOut};
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::{BlockedStore, Isa};

/// Channels per block of the layout.
const BLOCK: usize = 8;
/// Elements of a transformed (6x6) tile.
const E: usize = 36;

/// Whether the blocked Winograd computes this problem.
pub(crate) fn applies(p: &ConvProblem, input_blocked: bool) -> bool {
    let g = &p.geo;
    input_blocked
        && g.rank == 2
        && p.group == 1
        && g.kernel == [1, 3, 3]
        && g.stride == [1; 3]
        && g.dilation == [1; 3]
        && p.in_channels.is_multiple_of(BLOCK)
        && p.out_channels.is_multiple_of(BLOCK)
}

/// Output tiles (4x4) per column and row.
fn tile_grid(p: &ConvProblem) -> (usize, usize) {
    (p.geo.output[1].div_ceil(4), p.geo.output[2].div_ceil(4))
}

/// Default tiles per task, by a cost model in units of one tile's products (measured
/// on 64 to 256 channels, 14x14 to 56x56): the busiest thread's rounds of blocks, each
/// its tiles padded to whole register tiles, plus one pass over the transformed
/// filters (cheap from L2, as much as 24 tiles from L3 where they pass 1 MiB), plus a
/// quarter more where a block's transformed inputs and products (`36 x tiles x
/// (C + M)` floats) pass 1 MiB and leave L2 between the stages.
pub(crate) fn default_tiles(p: &ConvProblem, isa: Isa, threads: usize) -> usize {
    const L2: usize = 1 << 20;
    let (th, tw) = tile_grid(p);
    let tiles = th * tw;
    let mr = isa.mr();
    let (c, m) = (p.in_channels, p.out_channels);
    let stream = if E * c * m * 4 <= L2 { 1.0 } else { 24.0 };
    let mut best = (f64::MAX, tiles);
    for nb in 1..=tiles.div_ceil(mr).max(1) {
        let block = tiles.div_ceil(nb);
        let blocks = p.batch * tiles.div_ceil(block);
        let rounds = blocks.div_ceil(threads.max(1)) as f64;
        let spill = if E * (c + m) * 4 * block > L2 { 0.25 * block as f64 } else { 0.0 };
        let cost = rounds * (block.next_multiple_of(mr) as f64 + stream + spill);
        if cost < best.0 {
            best = (cost, block);
        }
    }
    best.1.max(1)
}

/// The transformed filters of one convolution.
pub(crate) struct WinogradNchwc {
    isa: Isa,
    c: usize,
    m: usize,
    /// Per element, `M/NR` panels of `C` rows of NR lanes (the last panel `last_nr`
    /// wide, zero lanes past M), on cache lines.
    u: cpu::AlignedF32,
    last_nr: usize,
    /// `0..C`: the micro-kernel's reduction offsets (a row of `V_e` is contiguous).
    offs: Vec<usize>,
    /// Tiles per task.
    tiles: usize,
}

impl WinogradNchwc {
    /// `p` must satisfy [`applies`]; `w` is `[M, C, 3, 3]`.
    pub(crate) fn new(p: &ConvProblem, w: &[f32], isa: Isa, tiles: usize) -> WinogradNchwc {
        let (c, m, nr) = (p.in_channels, p.out_channels, isa.nr());
        let panels = m.div_ceil(nr);
        let narrow = isa.narrow_nr();
        let last_nr = if narrow < nr && m - (panels - 1) * nr <= narrow { narrow } else { nr };
        let per_e = c * ((panels - 1) * nr + last_nr);
        let mut u = vec![0f32; E * per_e];
        for oc in 0..m {
            let (j, lane) = (oc / nr, oc % nr);
            let width = if j + 1 == panels { last_nr } else { nr };
            for ic in 0..c {
                let t = filter_transform(&w[(oc * c + ic) * 9..][..9]);
                for (e, v) in t.iter().enumerate() {
                    u[e * per_e + (j * nr * c) + ic * width + lane] = *v as f32;
                }
            }
        }
        WinogradNchwc { isa, c, m, u: cpu::AlignedF32::from_vec(u), last_nr, offs: (0..c).collect(), tiles: tiles.max(1) }
    }

    /// `y = act([y +] conv(x) + bias)`, X and Y blocked.
    pub(crate) fn run(&self, p: &ConvProblem, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let (th, tw) = tile_grid(p);
        let tiles = th * tw;
        let per_image = tiles.div_ceil(self.tiles);
        let (c, m) = (self.c, self.m);
        let (in_len, out_len) = (c * p.geo.input_size(), m * p.geo.output_size());
        let bias: Vec<f32> = bias.map_or_else(|| vec![0.0; m], |b| b[..m].to_vec());
        let clamp = super::conv_small_k::as_clamp(act);
        let act = if clamp.is_some() { None } else { act };
        let out = SharedOut(y.as_mut_ptr());
        cpu::par_ranges(p.batch * per_image, 2 * E * self.tiles * c * m, |a, b| {
            for unit in a..b {
                let (img, blk) = (unit / per_image, unit % per_image);
                let (t0, t1) = (blk * self.tiles, ((blk + 1) * self.tiles).min(tiles));
                let n = t1 - t0;
                cpu::with_scratch(E * n * (c + m), |s| {
                    let (v, prod) = s.split_at_mut(E * n * c);
                    let step = Step { p, t0, t1, tw };
                    // SAFETY: tiles t0..t1 of image img are this task's alone; the
                    // instruction set is one this CPU has (`Isa::available`).
                    unsafe {
                        input_transform(self.isa, &step, &x[img * in_len..][..in_len], c, v);
                        self.products(n, v, prod);
                        output_transform(self.isa, &step, prod, m, &bias, clamp, act, residual, out.ptr().add(img * out_len));
                    }
                });
            }
        });
    }

    /// `M_e = V_e U_e` for every element: `v` holds `[36][n][C]`, `prod` receives
    /// `[36][M/8][n][8]`.
    ///
    /// # Safety
    /// `self.isa` is available on this CPU.
    unsafe fn products(&self, n: usize, v: &[f32], prod: &mut [f32]) {
        let (isa, c, m) = (self.isa, self.c, self.m);
        let (mr, nr) = (isa.mr(), isa.nr());
        let panels = m.div_ceil(nr);
        let per_e = c * ((panels - 1) * nr + self.last_nr);
        let zeros = [0f32; 32];
        for e in 0..E {
            let ve = v.as_ptr().add(e * n * c);
            let pe = prod.as_mut_ptr().add(e * n * m);
            for j in 0..panels {
                let width = if j + 1 == panels { self.last_nr } else { nr };
                let blocks = ((m - j * nr) / BLOCK).min(width / BLOCK);
                let panel = self.u.as_ptr().add(e * per_e + j * nr * c);
                let dst = pe.add(j * (nr / BLOCK) * n * BLOCK);
                for g0 in (0..n).step_by(mr) {
                    let rows_n = mr.min(n - g0);
                    // Rows past the block's last tile repeat it and are not stored.
                    let (mut xs, mut rows) = ([ve; 8], [BlockedStore::SKIP; 8]);
                    for i in 0..mr {
                        xs[i] = ve.add((g0 + i.min(rows_n - 1)) * c);
                        if i < rows_n {
                            rows[i] = (g0 + i) * BLOCK;
                        }
                    }
                    let store = BlockedStore { block_stride: n * BLOCK, rows, blocks, bias: zeros.as_ptr(), residual: false, clamp: None };
                    isa.tile_rows_blocked(c, width, &xs, self.offs.as_ptr(), panel, dst, &store);
                }
            }
        }
    }
}

/// `G g G^T` of one 3x3 filter `g` (row-major), in f64.
fn filter_transform(g: &[f32]) -> [f64; E] {
    const G: [[f64; 3]; 6] = [
        [0.25, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ];
    let mut gg = [[0f64; 3]; 6];
    for (i, row) in gg.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = (0..3).map(|k| G[i][k] * g[k * 3 + j] as f64).sum();
        }
    }
    let mut u = [0f64; E];
    for i in 0..6 {
        for j in 0..6 {
            u[i * 6 + j] = (0..3).map(|k| gg[i][k] * G[j][k]).sum();
        }
    }
    u
}

/// The tiles of one task.
struct Step<'a> {
    p: &'a ConvProblem,
    t0: usize,
    t1: usize,
    /// Tiles per output row.
    tw: usize,
}

/// A channel block's eight values at one pixel, as the transforms compute them: one
/// body for every instruction set ([`Scalar`], and [`Avx`] inlined into functions that
/// enable AVX2).
trait Lanes: Copy {
    /// # Safety
    /// `p` points to eight readable floats.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` points to eight writable floats.
    unsafe fn store(self, p: *mut f32);
    fn splat(v: f32) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn scale(self, s: f32) -> Self;
    /// At least `lo`, then at most `hi`; a NaN stays NaN.
    fn clamp(self, lo: Self, hi: Self) -> Self;
}

#[derive(Clone, Copy)]
struct Scalar([f32; BLOCK]);

impl Lanes for Scalar {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Scalar(std::ptr::read_unaligned(p as *const [f32; BLOCK]))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p as *mut [f32; BLOCK], self.0)
    }
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Scalar([v; BLOCK])
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Scalar(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Scalar(std::array::from_fn(|l| self.0[l] - o.0[l]))
    }
    #[inline(always)]
    fn scale(self, s: f32) -> Self {
        Scalar(self.0.map(|v| v * s))
    }
    #[inline(always)]
    fn clamp(self, lo: Self, hi: Self) -> Self {
        // Comparisons are false for NaN: it stays NaN.
        Scalar(std::array::from_fn(|l| {
            let v = if self.0[l] < lo.0[l] { lo.0[l] } else { self.0[l] };
            if v > hi.0[l] {
                hi.0[l]
            } else {
                v
            }
        }))
    }
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx(std::arch::x86_64::__m256);

// SAFETY (every method): only called, inlined, from functions that enable AVX2.
#[cfg(target_arch = "x86_64")]
impl Lanes for Avx {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Avx(std::arch::x86_64::_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::arch::x86_64::_mm256_storeu_ps(p, self.0)
    }
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Avx(unsafe { std::arch::x86_64::_mm256_set1_ps(v) })
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Avx(unsafe { std::arch::x86_64::_mm256_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Avx(unsafe { std::arch::x86_64::_mm256_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn scale(self, s: f32) -> Self {
        Avx(unsafe { std::arch::x86_64::_mm256_mul_ps(self.0, std::arch::x86_64::_mm256_set1_ps(s)) })
    }
    #[inline(always)]
    fn clamp(self, lo: Self, hi: Self) -> Self {
        use std::arch::x86_64::{_mm256_max_ps, _mm256_min_ps};
        // max/min return their second operand when either is NaN: NaN stays NaN.
        Avx(unsafe { _mm256_min_ps(hi.0, _mm256_max_ps(lo.0, self.0)) })
    }
}

/// `B^T d` over six pixels.
#[inline(always)]
fn bt<L: Lanes>([d0, d1, d2, d3, d4, d5]: [L; 6]) -> [L; 6] {
    let (a, b) = (d4.sub(d2.scale(4.0)), d3.sub(d1.scale(4.0)));
    let (c, e) = (d4.sub(d2), d3.sub(d1).scale(2.0));
    [d0.scale(4.0).sub(d2.scale(5.0)).add(d4), a.add(b), a.sub(b), c.add(e), c.sub(e), d1.scale(4.0).sub(d3.scale(5.0)).add(d5)]
}

/// `A^T m` over six products.
#[inline(always)]
fn at<L: Lanes>([m0, m1, m2, m3, m4, m5]: [L; 6]) -> [L; 4] {
    let (s12, d12) = (m1.add(m2), m1.sub(m2));
    let (s34, d34) = (m3.add(m4), m3.sub(m4));
    [m0.add(s12).add(s34), d12.add(d34.scale(2.0)), s12.add(s34.scale(4.0)), d12.add(d34.scale(8.0)).add(m5)]
}

/// Transforms the input tiles of a task, eight channels at a time, into `v`
/// (`[36][tiles][C]`).
///
/// # Safety
/// `isa` is available on this CPU; `x` is the image's blocked input.
unsafe fn input_transform(isa: Isa, s: &Step, x: &[f32], c: usize, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        return input_avx2(s, x, c, v);
    }
    let _ = isa;
    input_tiles::<Scalar>(s, x, c, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn input_avx2(s: &Step, x: &[f32], c: usize, v: &mut [f32]) {
    input_tiles::<Avx>(s, x, c, v)
}

#[inline(always)]
unsafe fn input_tiles<L: Lanes>(s: &Step, x: &[f32], c: usize, v: &mut [f32]) {
    let g = &s.p.geo;
    let (ih, iw) = (g.input[1] as i64, g.input[2] as i64);
    let n = s.t1 - s.t0;
    assert!(x.len() >= c * (ih * iw) as usize && v.len() >= E * n * c);
    let zero = L::splat(0.0);
    for cb in 0..c / BLOCK {
        let xb = x.as_ptr().add(cb * (ih * iw) as usize * BLOCK);
        for t in s.t0..s.t1 {
            let (r0, c0) = (((t / s.tw) * 4) as i64 - g.pad_begin[1], ((t % s.tw) * 4) as i64 - g.pad_begin[2]);
            let inside = r0 >= 0 && c0 >= 0 && r0 + 6 <= ih && c0 + 6 <= iw;
            // The 6x6 window, zero outside the input.
            let px = |a: i64, b: i64| {
                let (r, col) = (r0 + a, c0 + b);
                if inside || ((0..ih).contains(&r) && (0..iw).contains(&col)) {
                    L::load(xb.add((r * iw + col) as usize * BLOCK))
                } else {
                    zero
                }
            };
            // Columns, then rows.
            let mut cols = [[zero; 6]; 6];
            for b in 0..6 {
                let col = bt(std::array::from_fn(|a| px(a as i64, b as i64)));
                for (a, row) in cols.iter_mut().enumerate() {
                    row[b] = col[a];
                }
            }
            let dst = v.as_mut_ptr().add((t - s.t0) * c + cb * BLOCK);
            // (Indexed loops: an array's `into_iter` copies it through memory.)
            for (a, row) in cols.iter().enumerate() {
                let r = bt(*row);
                for (b, lanes) in r.iter().enumerate() {
                    lanes.store(dst.add((a * 6 + b) * n * c));
                }
            }
        }
    }
}

/// Transforms a task's products (`[36][M/8][tiles][8]`) into its output tiles at `y`
/// (the image's blocked output), with the epilogue.
///
/// # Safety
/// `isa` is available on this CPU; `y` holds the image's output, whose pixels of
/// these tiles no other thread touches.
#[allow(clippy::too_many_arguments)]
unsafe fn output_transform(isa: Isa, s: &Step, prod: &[f32], m: usize, bias: &[f32], clamp: Option<(f32, f32)>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        return output_avx2(s, prod, m, bias, clamp, act, residual, y);
    }
    let _ = isa;
    output_tiles::<Scalar>(s, prod, m, bias, clamp, act, residual, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn output_avx2(s: &Step, prod: &[f32], m: usize, bias: &[f32], clamp: Option<(f32, f32)>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
    output_tiles::<Avx>(s, prod, m, bias, clamp, act, residual, y)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn output_tiles<L: Lanes>(s: &Step, prod: &[f32], m: usize, bias: &[f32], clamp: Option<(f32, f32)>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
    let [_, oh_n, ow_n] = s.p.geo.output;
    let (n, mbs) = (s.t1 - s.t0, m / BLOCK);
    assert!(prod.len() >= E * n * m && bias.len() >= m);
    let (lo, hi) = clamp.map_or((L::splat(0.0), L::splat(0.0)), |(l, h)| (L::splat(l), L::splat(h)));
    for mb in 0..mbs {
        let b = L::load(bias.as_ptr().add(mb * BLOCK));
        let yb = y.add(mb * oh_n * ow_n * BLOCK);
        for t in s.t0..s.t1 {
            let src = prod.as_ptr().add((mb * n + t - s.t0) * BLOCK);
            let elem = |e: usize| L::load(src.add(e * n * m));
            // Columns, then rows.
            let mut rows = [[b; 6]; 4];
            for col in 0..6 {
                let c = at(std::array::from_fn(|r| elem(r * 6 + col)));
                for (a, row) in rows.iter_mut().enumerate() {
                    row[col] = c[a];
                }
            }
            let (oh0, ow0) = ((t / s.tw) * 4, (t % s.tw) * 4);
            let cols_n = 4.min(ow_n - ow0);
            for (a, row) in rows.iter().enumerate().take(4.min(oh_n - oh0)) {
                let dst = yb.add(((oh0 + a) * ow_n + ow0) * BLOCK);
                let r = at(*row);
                for (bc, lanes) in r.iter().enumerate().take(cols_n) {
                    let o = dst.add(bc * BLOCK);
                    let mut v = lanes.add(b);
                    if residual {
                        v = v.add(L::load(o));
                    }
                    if clamp.is_some() {
                        v = v.clamp(lo, hi);
                    }
                    v.store(o);
                }
                if let Some(f) = act {
                    f.apply_slice_f32_fast(std::slice::from_raw_parts_mut(dst, cols_n * BLOCK));
                }
            }
        }
    }
}
