//! Conv on the CPU for small output planes (ResNet's 7x7 and 14x14 layers): the GEMM
//! transposed, `Y^T [pixels x M] = im2col^T [pixels x K] * W^T [K x M]`, so that the
//! micro-kernel's vector lanes run along output channels (always a multiple of 8 or 16
//! in real networks) and its broadcast rows along pixels (49 pixels fill 7 tiles of 8;
//! along the vector lanes they would fill 2 of 32). The filters are packed once as
//! NR-channel panels; each reduction slice of im2col^T is packed into MR-pixel panels per
//! run. A block of output channels accumulates in a transposed scratch tile, which is
//! stored into the NCHW output with the epilogue at the end.
//!
//! The direct form ([`FlippedFilters::direct`], 2-D convolutions) packs nothing per
//! run: the input is copied once into zero-padded "phase" planes (phase `(a, b)` holds
//! the padded positions congruent to `(a, b)` modulo the strides; one phase at stride
//! 1), and the micro-kernel reads its MR pixels of each tap in place
//! ([`Isa::tile_gather`]): tap `(kh, kw)` of output `(oh, ow)` is element
//! `(oh + kh*dh / sh, ow + kw*dw / sw)` of phase `(kh*dh % sh, kw*dw % sw)`. Pixels are
//! numbered on the phase width (`q = oh * wph + ow`), so that MR consecutive pixels of a
//! tap are MR consecutive floats even across rows; the `wph - ow_n` extra columns of
//! each row are computed and dropped.
use super::conv_cpu::{im2col_row, ConvProblem, SharedOut};
use std::cell::RefCell;
use crate::cpu;
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::Isa;

/// Whether the flipped GEMM computes this problem (ungrouped, non-depthwise).
pub(crate) fn applies(p: &ConvProblem) -> bool {
    p.group == 1
}

/// Whether the direct form computes this problem: 2-D, a kernel wider than one tap or
/// strided (a 1x1 stride-1 convolution is a plain GEMM).
pub(crate) fn direct_applies(p: &ConvProblem) -> bool {
    let g = &p.geo;
    applies(p) && g.input[0] == 1 && g.kernel[0] == 1 && g.stride[0] == 1 && (g.kernel_size() > 1 || g.stride[1] * g.stride[2] > 1)
}

/// The zero-padded phase planes of the direct form and the offset of each tap.
struct Padded {
    /// Strides (rows, columns): `sh * sw` phases per channel.
    sh: usize,
    sw: usize,
    /// A phase plane: `hph` rows of `wph`.
    hph: usize,
    wph: usize,
    /// Per reduction step `k = (c, kh, kw)`: where its phase data starts (see the
    /// module docs).
    offs: Vec<usize>,
    /// Which row and column phases some tap reads (a strided 1x1 reads only phase
    /// (0, 0)): the others are never written.
    rows_read: Vec<bool>,
    cols_read: Vec<bool>,
}

impl Padded {
    /// Floats per channel (all its phases).
    fn channel_len(&self) -> usize {
        self.sh * self.sw * self.hph * self.wph
    }
}

thread_local! {
    /// The padded input of the direct form (one buffer per calling thread, reused).
    static PADDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The filters as `W^T` (`K x M`), packed into panels of NR output channels (zero
/// channels pad the last panel): panel `j` holds `K` rows of NR values.
pub(crate) struct FlippedFilters {
    isa: Isa,
    k: usize,
    m: usize,
    data: Vec<f32>,
    /// Reduction slice.
    kc: usize,
    /// Output channels per task (a multiple of NR).
    nc: usize,
    /// The direct form's geometry (None: im2col panels).
    padded: Option<Padded>,
}

impl FlippedFilters {
    pub(crate) fn new(p: &ConvProblem, w: &[f32], isa: Isa, kc: usize, threads: usize) -> FlippedFilters {
        let (m, k, nr) = (p.out_channels, p.reduction(), isa.nr());
        let panels = m.div_ceil(nr);
        let mut data = vec![0f32; panels * k * nr];
        for oc in 0..m {
            let (j, lane) = (oc / nr, oc % nr);
            for (kk, &v) in w[oc * k..][..k].iter().enumerate() {
                data[(j * k + kk) * nr + lane] = v;
            }
        }
        // Channel blocks: about two per thread per image, whole panels.
        let per_task = panels.div_ceil(threads.max(1).div_ceil(p.batch.max(1)).max(1)).max(1);
        FlippedFilters { isa, k, m, data, kc: kc.clamp(1, k.max(1)), nc: per_task * nr, padded: None }
    }

    /// The direct form (see the module docs); `p` must satisfy [`direct_applies`].
    pub(crate) fn direct(p: &ConvProblem, w: &[f32], isa: Isa, kc: usize, threads: usize) -> FlippedFilters {
        let g = &p.geo;
        let [_, oh_n, ow_n] = g.output;
        let [_, kh_n, kw_n] = g.kernel;
        let (dh, dw, sh, sw) = (g.dilation[1], g.dilation[2], g.stride[1], g.stride[2]);
        // Padded extent read, then per phase.
        let (hp, wp) = ((oh_n - 1) * sh + (kh_n - 1) * dh + 1, (ow_n - 1) * sw + (kw_n - 1) * dw + 1);
        let (hph, wph) = (hp.div_ceil(sh), wp.div_ceil(sw));
        let plane = hph * wph;
        let offs = (0..p.in_channels)
            .flat_map(|c| {
                (0..kh_n).flat_map(move |kh| {
                    (0..kw_n).map(move |kw| {
                        let (rh, rw) = (kh * dh, kw * dw);
                        c * sh * sw * plane + ((rh % sh) * sw + rw % sw) * plane + (rh / sh) * wph + rw / sw
                    })
                })
            })
            .collect();
        let rows_read = (0..sh).map(|a| (0..kh_n).any(|kh| kh * dh % sh == a)).collect();
        let cols_read = (0..sw).map(|b| (0..kw_n).any(|kw| kw * dw % sw == b)).collect();
        let padded = Padded { sh, sw, hph, wph, offs, rows_read, cols_read };
        FlippedFilters { padded: Some(padded), ..FlippedFilters::new(p, w, isa, kc, threads) }
    }

    /// `y = act([y +] conv(x) + bias)`.
    pub(crate) fn run(&self, p: &ConvProblem, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let blocks = self.m.div_ceil(self.nc);
        let tasks = p.batch * blocks;
        let (in_len, out_len) = (p.in_channels * p.geo.input_size(), p.out_channels * p.geo.output_size());
        let out = SharedOut(y.as_mut_ptr());
        let flops = 2 * p.macs() as usize;
        let Some(pd) = &self.padded else {
            let run_task = |t: usize| {
                let (img, b) = (t / blocks, t % blocks);
                let n0 = b * self.nc;
                let n1 = (n0 + self.nc).min(self.m);
                // SAFETY: this task writes output channels n0..n1 of image img only.
                unsafe { self.run_block(p, &x[img * in_len..][..in_len], n0, n1, bias, act, residual, out.ptr().add(img * out_len)) };
            };
            // Serial for one task or one thread (`par_ranges` decides).
            cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
            return;
        };
        // Slack past the last plane: the extra columns of the last tiles read on.
        let padded_len = p.in_channels * pd.channel_len() + pd.wph + self.isa.mr();
        // Tasks: strips of grid pixels of every output channel, each strip's transposed
        // tile about 64 KiB (it stays in cache until its epilogue).
        let [_, oh_n, ow_n] = p.geo.output;
        let grid = (oh_n - 1) * pd.wph + ow_n;
        let cols = self.m.next_multiple_of(self.isa.nr());
        let strip = (16384 / cols).next_multiple_of(self.isa.mr()).min(grid.next_multiple_of(self.isa.mr()));
        let strips = grid.div_ceil(strip);
        PADDED.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(p.batch * padded_len, 0.0);
            for img in 0..p.batch {
                self.pad(p, pd, &x[img * in_len..][..in_len], &mut buf[img * padded_len..][..padded_len]);
            }
            let buf = &buf[..];
            let run_task = |t: usize| {
                let (img, st) = (t / strips, t % strips);
                let q0 = st * strip;
                // SAFETY: this task writes the pixels of grid q0..q0 + strip of image img only.
                unsafe { self.run_direct(p, pd, &buf[img * padded_len..][..padded_len], q0, (q0 + strip).min(grid), bias, act, residual, out.ptr().add(img * out_len)) };
            };
            let tasks = p.batch * strips;
            cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
        });
    }

    /// Copies one image's planes into `dst` as zero-padded phase planes (see the module
    /// docs), then zero slack.
    fn pad(&self, p: &ConvProblem, pd: &Padded, x: &[f32], dst: &mut [f32]) {
        let g = &p.geo;
        let [_, ih_n, iw_n] = g.input;
        let (top, left) = (g.pad_begin[1], g.pad_begin[2]);
        let (sh, sw, hph, wph) = (pd.sh, pd.sw, pd.hph, pd.wph);
        let plane = hph * wph;
        let in_plane = ih_n * iw_n;
        // Padded columns lo..hi come from the input (the rest, of every row, is zero).
        let lo = left.max(0) as usize;
        let hi = ((iw_n as i64 + left).max(0) as usize).min(sw * wph).max(lo.min(sw * wph));
        let lo = lo.min(hi);
        dst.fill(0.0);
        for c in 0..p.in_channels {
            let xc = &x[c * in_plane..][..in_plane];
            let base = c * pd.channel_len();
            for r in 0..sh * hph {
                let ih = r as i64 - top;
                if ih < 0 || ih >= ih_n as i64 || hi == lo || !pd.rows_read[r % sh] {
                    continue;
                }
                let src = &xc[ih as usize * iw_n + (lo as i64 - left) as usize..][..hi - lo];
                let row = |qw: usize| base + ((r % sh) * sw + qw) * plane + (r / sh) * wph;
                if sw == 1 {
                    let at = row(0);
                    dst[at + lo..at + hi].copy_from_slice(src);
                } else {
                    // Column lo + i is element j of phase qw (counters, not divisions).
                    let (mut qw, mut j) = (lo % sw, lo / sw);
                    for &v in src {
                        if pd.cols_read[qw] {
                            dst[row(qw) + j] = v;
                        }
                        qw += 1;
                        if qw == sw {
                            (qw, j) = (0, j + 1);
                        }
                    }
                }
            }
        }
    }

    /// Grid pixels `q0..q1` (`q = oh * wph + ow`) of every output channel of one image,
    /// from its padded planes `xp`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_direct(&self, p: &ConvProblem, pd: &Padded, xp: &[f32], q0: usize, q1: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
        let (isa, k, m) = (self.isa, self.k, self.m);
        let (mr, nr) = (isa.mr(), isa.nr());
        let [_, oh_n, ow_n] = p.geo.output;
        let px = oh_n * ow_n;
        let tiles = (q1 - q0).div_ceil(mr);
        let cols = m.next_multiple_of(nr);
        cpu::with_scratch(tiles * mr * cols, |ct| {
            let mut kb = 0;
            while kb < k {
                let kcur = self.kc.min(k - kb);
                for j in 0..cols / nr {
                    let bpanel = self.data.as_ptr().add((j * k + kb) * nr);
                    for i in 0..tiles {
                        let c_tile = ct.as_mut_ptr().add(i * mr * cols + j * nr);
                        isa.tile_gather(kcur, xp.as_ptr().add(q0 + i * mr), pd.offs.as_ptr().add(kb), bpanel, c_tile, cols, kb > 0);
                    }
                }
                kb += kcur;
            }
            if k == 0 {
                ct.fill(0.0);
            }
            // Y[ch][oh][ow] = C^T[q - q0][ch] + bias (+ residual), then the activation,
            // one output row segment at a time.
            let mut q = q0;
            while q < q1 {
                let (oh, ow) = (q / pd.wph, q % pd.wph);
                let seg_end = (oh * pd.wph + pd.wph).min(q1);
                if ow >= ow_n {
                    q = seg_end;
                    continue;
                }
                let len = (seg_end - q).min(ow_n - ow);
                let (tile, at) = (&ct[(q - q0) * cols..], y.add(oh * ow_n + ow));
                store_transposed(tile, cols, len, m, bias, residual, at, px);
                if let Some(a) = act {
                    for ch in 0..m {
                        a.apply_slice_f32_fast(std::slice::from_raw_parts_mut(at.add(ch * px), len));
                    }
                }
                q = seg_end;
            }
        });
    }

    /// Output channels `n0..n1` of one image (`x`: `[C, ...]`, `y`: `[M, pixels]`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_block(&self, p: &ConvProblem, x: &[f32], n0: usize, n1: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
        let (isa, k) = (self.isa, self.k);
        let (mr, nr) = (isa.mr(), isa.nr());
        let px = p.geo.output_size();
        let px_pad = px.next_multiple_of(mr);
        let (j0, j1) = (n0 / nr, n1.div_ceil(nr));
        let cols = (j1 - j0) * nr;
        let kc_max = self.kc;
        let plane = p.geo.input_size();
        let taps = p.geo.kernel_size();
        let [_, kh_n, kw_n] = p.geo.kernel;
        cpu::with_scratch(px_pad * cols + px_pad * kc_max + px, |scratch| {
            let (ct, rest) = scratch.split_at_mut(px_pad * cols);
            let (ap, row) = rest.split_at_mut(px_pad * kc_max);
            let mut kb = 0;
            while kb < k {
                let kcur = kc_max.min(k - kb);
                // Pack im2col^T rows kb..kb+kcur into MR-pixel panels: panel i, step kk.
                for kk in 0..kcur {
                    let kg = kb + kk;
                    let (c, t) = (kg / taps, kg % taps);
                    let tap = [t / (kh_n * kw_n), (t / kw_n) % kh_n, t % kw_n];
                    im2col_row(&p.geo, &x[c * plane..][..plane], tap, 0, &mut row[..px]);
                    for (i, chunk) in row[..px].chunks(mr).enumerate() {
                        let dst = &mut ap[(i * kcur + kk) * mr..][..mr];
                        dst[..chunk.len()].copy_from_slice(chunk);
                        dst[chunk.len()..].fill(0.0);
                    }
                }
                for j in j0..j1 {
                    let bpanel = self.data.as_ptr().add((j * k + kb) * nr);
                    for i in 0..px_pad / mr {
                        let apanel = ap.as_ptr().add(i * kcur * mr);
                        let c_tile = ct.as_mut_ptr().add(i * mr * cols + (j - j0) * nr);
                        isa.tile(kcur, apanel, bpanel, c_tile, cols, kb > 0);
                    }
                }
                kb += kcur;
            }
            if k == 0 {
                ct.fill(0.0);
            }
            // Y[ch][pixel] = C^T[pixel][ch] + bias (+ residual), then the activation.
            let y0 = y.add(n0 * px);
            store_transposed(&ct[n0 - j0 * nr..], cols, px, n1 - n0, bias.map(|b| &b[n0..]), residual, y0, px);
            if let Some(a) = act {
                a.apply_slice_f32_fast(std::slice::from_raw_parts_mut(y0, (n1 - n0) * px));
            }
        });
    }
}

/// `y[ch * ystride + i] = [y[..] +] tile[i * cols + ch] + bias[ch]` for `ch < m`,
/// `i < len`: a transposed tile stored into NCHW rows, 8x8 blocks transposed in
/// registers where the CPU has AVX2.
///
/// # Safety
/// `y` addresses `m` rows of `len` floats at stride `ystride` that no other thread
/// touches meanwhile; `tile` holds `len` rows of `cols >= m` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn store_transposed(tile: &[f32], cols: usize, len: usize, m: usize, bias: Option<&[f32]>, residual: bool, y: *mut f32, ystride: usize) {
    assert!(tile.len() >= (len.max(1) - 1) * cols + m && cols >= m);
    let (mut ch_done, mut px_done) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        (ch_done, px_done) = (m - m % 8, len - len % 8);
        store_blocks_avx2(tile, cols, ch_done, px_done, bias, residual, y, ystride);
    }
    // The rest: channels past the 8-blocks (all pixels), pixels past them (all channels).
    for ch in 0..m {
        let first = if ch < ch_done { px_done } else { 0 };
        let b = bias.map_or(0.0, |b| b[ch]);
        for i in first..len {
            let o = y.add(ch * ystride + i);
            let v = tile[i * cols + ch] + b;
            *o = if residual { *o + v } else { v };
        }
    }
}

/// The 8x8 blocks of [`store_transposed`]: channels `0..m8`, pixels `0..len8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn store_blocks_avx2(tile: &[f32], cols: usize, m8: usize, len8: usize, bias: Option<&[f32]>, residual: bool, y: *mut f32, ystride: usize) {
    use std::arch::x86_64::*;
    let t = tile.as_ptr();
    for ch in (0..m8).step_by(8) {
        for i in (0..len8).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(t.add((i + k) * cols + ch)));
            let c = crate::linalg::microkernel::transpose8x8(r);
            for (j, &col) in c.iter().enumerate() {
                let o = y.add((ch + j) * ystride + i);
                let mut v = _mm256_add_ps(col, _mm256_set1_ps(bias.map_or(0.0, |b| b[ch + j])));
                if residual {
                    v = _mm256_add_ps(v, _mm256_loadu_ps(o));
                }
                _mm256_storeu_ps(o, v);
            }
        }
    }
}
