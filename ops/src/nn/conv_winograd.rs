//! Winograd F(2x2, 3x3) for 2-D 3x3 stride-1 undilated ungrouped convolutions on the
//! CPU: each 2x2 output tile comes from a 4x4 input tile with 16 multiplies per
//! (input, output) channel pair instead of 36.
//!
//! Filters are transformed once per plan (`U = G g G^T`, in f64, one matrix
//! `[M x C]` per element of the 4x4 transformed tile, packed for the micro-kernel).
//! Per block of tiles and per thread: input tiles transformed (`V = B^T d B`, one
//! `[C x tiles]` matrix per element), 16 packed GEMMs `U_e * V_e`, and the output
//! transform (`Y = A^T m A`) with bias, residual and activation, stored clipped at the
//! output's edges. The error against the f64 reference is that of a few more
//! additions per output than the direct sum (F(2x2, 3x3) keeps the transform
//! coefficients at 0, +-1 and +-1/2).
use super::conv_cpu::{ConvProblem, SharedOut};
use crate::cpu::{self};
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::Isa;
use crate::linalg::packed::{Blocking, MatrixRows, PackedA, PackedGemm};

/// Elements of a transformed tile.
const E: usize = 16;

/// Whether Winograd F(2x2, 3x3) computes this problem.
pub(crate) fn applies(p: &ConvProblem) -> bool {
    let g = &p.geo;
    g.rank == 2 && p.group == 1 && g.kernel == [1, 3, 3] && g.stride == [1; 3] && g.dilation == [1; 3] && g.output[1] >= 2 && g.output[2] >= 2
}

/// Output tiles (2x2) per row and column.
fn tile_grid(p: &ConvProblem) -> (usize, usize) {
    (p.geo.output[1].div_ceil(2), p.geo.output[2].div_ceil(2))
}

/// Default tiles per block: the transformed input of a block (16 x C x tiles floats)
/// within about 1 MiB, blocks of whole register tiles where possible, cut so that the
/// busiest thread's share is smallest (ties to fewer blocks).
pub(crate) fn default_block(p: &ConvProblem, isa: Isa, threads: usize) -> usize {
    let (th, tw) = tile_grid(p);
    let tiles = th * tw;
    let nr = isa.nr();
    let cap = (16384 / p.in_channels.max(1)).max(nr);
    let mut best = (f64::MAX, tiles);
    for nb in 1..=tiles.div_ceil(nr).clamp(1, 256) {
        let block = tiles.div_ceil(nb).next_multiple_of(nr).min(tiles);
        if block > cap && nb < tiles.div_ceil(nr) {
            continue;
        }
        let blocks = p.batch * tiles.div_ceil(block);
        let rounds = blocks.div_ceil(threads.max(1)) as f64;
        let cost = rounds * block.next_multiple_of(nr) as f64 * (1.0 + 0.01 * blocks as f64);
        if cost < best.0 {
            best = (cost, block);
        }
    }
    best.1.max(1)
}

/// The transformed filters of one convolution.
pub(crate) struct WinogradFilters {
    /// One packed `[M x C]` matrix per tile element.
    u: Vec<PackedA>,
    /// Tiles per block.
    block: usize,
    kc: usize,
}

impl WinogradFilters {
    /// Transforms filters `w` (`[M, C, 3, 3]`).
    pub(crate) fn new(p: &ConvProblem, w: &[f32], isa: Isa, block: usize, kc: usize) -> WinogradFilters {
        let (m, c) = (p.out_channels, p.in_channels);
        const G: [[f64; 3]; 4] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]];
        let mut u = vec![vec![0f32; m * c]; E];
        for oc in 0..m {
            for ic in 0..c {
                let g = &w[(oc * c + ic) * 9..][..9];
                // t = G g (4x3), then u = t G^T (4x4).
                let mut t = [[0f64; 3]; 4];
                for (i, row) in t.iter_mut().enumerate() {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = (0..3).map(|k| G[i][k] * g[k * 3 + j] as f64).sum();
                    }
                }
                for i in 0..4 {
                    for j in 0..4 {
                        let v: f64 = (0..3).map(|k| t[i][k] * G[j][k]).sum();
                        u[i * 4 + j][oc * c + ic] = v as f32;
                    }
                }
            }
        }
        let u = u.iter().map(|ue| PackedA::pack(isa, ue, m, c)).collect();
        WinogradFilters { u, block: block.max(1), kc: kc.max(1) }
    }

    /// `y = act([y +] conv(x) + bias)`.
    pub(crate) fn run(&self, p: &ConvProblem, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let (th, tw) = tile_grid(p);
        let tiles = th * tw;
        let blocks = tiles.div_ceil(self.block);
        let tasks = p.batch * blocks;
        let out = SharedOut(y.as_mut_ptr());
        let run_task = |t: usize| {
            let (img, b) = (t / blocks, t % blocks);
            let t0 = b * self.block;
            let t1 = (t0 + self.block).min(tiles);
            let x_img = &x[img * p.in_channels * p.geo.input_size()..][..p.in_channels * p.geo.input_size()];
            // SAFETY: this task writes only the output pixels of its own tiles.
            unsafe { self.run_block(p, x_img, t0, t1, bias, act, residual, out.ptr().add(img * p.out_channels * p.geo.output_size())) };
        };
        let flops = 2 * p.macs() as usize;
        // Serial for one task or one thread (`par_ranges` decides).
        cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
    }

    /// Tiles `t0..t1` of one image (`x`: `[C, H, W]`, `y`: `[M, OH, OW]`). Both
    /// transforms run on whole runs of tiles of one tile row, as loops over the tiles
    /// (the compiler vectorises them): rows combined first, then columns after
    /// splitting even and odd columns.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_block(&self, p: &ConvProblem, x: &[f32], t0: usize, t1: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
        let (m, c) = (p.out_channels, p.in_channels);
        let nt = t1 - t0;
        let (_, tw) = tile_grid(p);
        // Runs of tiles within one tile row: (first tile, tile row, first column, count).
        let mut runs = vec![];
        let mut tile = t0;
        while tile < t1 {
            let (ty, tx0) = (tile / tw, tile % tw);
            let count = (tw - tx0).min(t1 - tile);
            runs.push((tile - t0, ty, tx0, count));
            tile += count;
        }
        let width = 2 * tw + 2;
        cpu::with_scratch(E * c * nt + E * m * nt + 8 * width, |scratch| {
            let block = Block { p, x, nt, width, runs: &runs, bias, act, residual, y };
            #[cfg(target_arch = "x86_64")]
            if cpu::has_avx2() {
                // SAFETY: the CPU has AVX2 and FMA.
                return unsafe { self.block_avx2(&block, scratch) };
            }
            // SAFETY: as for this function.
            unsafe { self.block(&block, scratch) }
        });
    }

    /// [`Self::block`] compiled for AVX2 + FMA: the transforms' loops 8 lanes wide.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_avx2(&self, b: &Block, scratch: &mut [f32]) {
        self.block(b, scratch)
    }

    /// The work of [`Self::run_block`] in its scratch memory.
    ///
    /// # Safety
    /// As [`Self::run_block`]: `b.y` is the image's output, whose pixels of these tiles
    /// no other thread touches meanwhile.
    #[inline(always)]
    unsafe fn block(&self, b: &Block, scratch: &mut [f32]) {
        let Block { p, x, nt, width, runs, bias, act, residual, y } = *b;
        let (m, c) = (p.out_channels, p.in_channels);
        let [_, ih, iw] = p.geo.input;
        let [_, oh, ow] = p.geo.output;
        let (pt, pl) = (p.geo.pad_begin[1], p.geo.pad_begin[2]);
        let (v, rest) = scratch.split_at_mut(E * c * nt);
        let (mm, work) = rest.split_at_mut(E * m * nt);
        // Input transform: v[e][ic][tile].
        for &(s0, ty, tx0, count) in runs {
            let span = 2 * count + 2;
            let x0 = (2 * tx0) as i64 - pl;
            for ic in 0..c {
                let plane = &x[ic * ih * iw..][..ih * iw];
                let (rows, eo) = work.split_at_mut(4 * width);
                for r in 0..4 {
                    let row = &mut rows[r * width..][..span];
                    let yy = (2 * ty + r) as i64 - pt;
                    if yy < 0 || yy >= ih as i64 {
                        row.fill(0.0);
                        continue;
                    }
                    let src = &plane[yy as usize * iw..][..iw];
                    let lo = (-x0).clamp(0, span as i64) as usize;
                    let hi = (iw as i64 - x0).clamp(lo as i64, span as i64) as usize;
                    row[..lo].fill(0.0);
                    row[hi..].fill(0.0);
                    row[lo..hi].copy_from_slice(&src[(x0 + lo as i64) as usize..][..hi - lo]);
                }
                let (b0, rest) = rows.split_at_mut(width);
                let (b1, rest) = rest.split_at_mut(width);
                let (b2, b3) = rest.split_at_mut(width);
                // B^T d over rows, in place: (b0 - b2, b1 + b2, b2 - b1, b1 - b3).
                for j in 0..span {
                    let (d0, d1, d2, d3) = (b0[j], b1[j], b2[j], b3[j]);
                    b0[j] = d0 - d2;
                    b1[j] = d1 + d2;
                    b2[j] = d2 - d1;
                    b3[j] = d1 - d3;
                }
                // (.) B over columns, from the even and odd columns of each row.
                let half = count + 1;
                let (ev, od) = eo.split_at_mut(width);
                let (ev, od) = (&mut ev[..half], &mut od[..half]);
                for (r, row) in [&*b0, &*b1, &*b2, &*b3].into_iter().enumerate() {
                    for ((e, o), pair) in ev.iter_mut().zip(od.iter_mut()).zip(row[..2 * half].chunks_exact(2)) {
                        *e = pair[0];
                        *o = pair[1];
                    }
                    let (e0, e1, o0, o1) = (&ev[..count], &ev[1..], &od[..count], &od[1..]);
                    let at = |q: usize| ((r * 4 + q) * c + ic) * nt + s0;
                    for (d, (a, b)) in v[at(0)..][..count].iter_mut().zip(e0.iter().zip(e1)) {
                        *d = a - b;
                    }
                    for (d, (a, b)) in v[at(1)..][..count].iter_mut().zip(o0.iter().zip(e1)) {
                        *d = a + b;
                    }
                    for (d, (a, b)) in v[at(2)..][..count].iter_mut().zip(e1.iter().zip(o0)) {
                        *d = a - b;
                    }
                    for (d, (a, b)) in v[at(3)..][..count].iter_mut().zip(o0.iter().zip(o1)) {
                        *d = a - b;
                    }
                }
            }
        }
        // The 16 products m_e = U_e v_e.
        for e in 0..E {
            let g = PackedGemm::new(&self.u[e], nt, Blocking { kc: self.kc, mc: m, nc: nt });
            g.run_block(0, 0, &MatrixRows { data: &v[e * c * nt..][..c * nt], ld: nt }, mm.as_mut_ptr().add(e * m * nt), nt, false, &|_, _| {});
        }
        // Output transform (A^T m A), bias, residual, clipped store, activation.
        for oc in 0..m {
            let b = bias.map_or(0.0, |b| b[oc]);
            let dst = y.add(oc * oh * ow);
            for &(s0, ty, tx0, count) in runs {
                let me = |e: usize| &mm[(e * m + oc) * nt + s0..][..count];
                let (even, rest) = work.split_at_mut(width);
                let (odd, temps) = rest.split_at_mut(width);
                let (even, odd) = (&mut even[..count], &mut odd[..count]);
                for i in 0..2 {
                    let yy = 2 * ty + i;
                    if yy >= oh {
                        continue;
                    }
                    // Row i of A^T m: r_q = m_a+q + s (m_a+4+q + m_a+8+q) with a = 4i and
                    // s = 1 (i = 0) or -1 (i = 1); then (r0 + r1 + r2, r1 - r2 - r3).
                    let (a, s) = (4 * i, if i == 0 { 1.0f32 } else { -1.0 });
                    let mut r = temps.chunks_exact_mut(width).take(4);
                    let mut rq: [&mut [f32]; 4] = std::array::from_fn(|_| &mut r.next().expect("four temps")[..count]);
                    for (q, dst) in rq.iter_mut().enumerate() {
                        let (x, y, z) = (me(a + q), me(a + 4 + q), me(a + 8 + q));
                        dst.iter_mut().zip(x.iter().zip(y.iter().zip(z))).for_each(|(d, (x, (y, z)))| *d = x + s * (y + z));
                    }
                    let [r0, r1, r2, r3] = rq;
                    for ((e, o), (((r0, r1), r2), r3)) in even.iter_mut().zip(odd.iter_mut()).zip(r0.iter().zip(&*r1).zip(&*r2).zip(&*r3)) {
                        *e = r0 + r1 + r2 + b;
                        *o = r1 - r2 - r3 + b;
                    }
                    let x0 = 2 * tx0;
                    let n = (2 * count).min(ow - x0);
                    let out = std::slice::from_raw_parts_mut(dst.add(yy * ow + x0), n);
                    let (pairs, tail) = out.split_at_mut(n & !1);
                    for (pair, (e, o)) in pairs.chunks_exact_mut(2).zip(even.iter().zip(odd.iter())) {
                        if residual {
                            pair[0] += e;
                            pair[1] += o;
                        } else {
                            pair[0] = *e;
                            pair[1] = *o;
                        }
                    }
                    if let Some(t) = tail.first_mut() {
                        let e = even[n / 2];
                        *t = if residual { *t + e } else { e };
                    }
                    if let Some(k) = act {
                        k.apply_slice_f32_fast(out);
                    }
                }
            }
        }
    }
}

/// What one block of tiles works on.
#[derive(Clone, Copy)]
struct Block<'a> {
    p: &'a ConvProblem,
    x: &'a [f32],
    nt: usize,
    width: usize,
    runs: &'a [(usize, usize, usize, usize)],
    bias: Option<&'a [f32]>,
    act: Option<UnaryKind>,
    residual: bool,
    y: *mut f32,
}
