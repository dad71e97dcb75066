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
//!
//! The channel-blocked output ([`Layout::out_blocked`]) needs neither: each row of a
//! register tile reads from its own output pixel's window ([`Isa::tile_rows_blocked`]),
//! so tiles hold MR real output pixels across row ends, strides step in the pointers,
//! and the input is itself when nothing is padded, else plain zero-padded planes of
//! which each thread copies only the rows its own tiles read, right before it runs
//! them ([`PadRows`]: no pass over the whole input first, and the rows are in the
//! cache of the core that reads them).
use super::conv_cpu::{im2col_row, ConvProblem, SharedOut};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use crate::cpu;
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::{BlockedStore, Isa};

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

/// How the direct form's tensors are laid out: plain NCHW planes, or channel-blocked
/// (`[N, C/8, H, W, 8]`, eight channels per pixel; see `conv_nchwc.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Layout {
    pub in_blocked: bool,
    pub out_blocked: bool,
}

/// The zero-padded phase planes of the direct form and the offset of each tap.
struct Padded {
    /// Strides (rows, columns): `sh * sw` phases per channel unit.
    sh: usize,
    sw: usize,
    /// How far a blocked tile's reads move per output row and column: the strides
    /// where the input is not split into phases (then `sh == sw == 1`), else 1.
    step_h: usize,
    step_w: usize,
    /// A phase plane: `hph` rows of `wph` pixels.
    hph: usize,
    wph: usize,
    /// Floats per pixel of the input: 1 (NCHW planes) or 8 (channel blocks); a
    /// "unit" is one plane or one block of eight.
    e: usize,
    /// Per reduction step `k = (c, kh, kw)`: where its phase data starts (see the
    /// module docs).
    offs: Vec<usize>,
    /// The largest of `offs` per reduction slice (`kc` steps): bounds of the reads.
    max_offs: Vec<usize>,
    /// Which row and column phases some tap reads (a strided 1x1 reads only phase
    /// (0, 0)): the others are never written.
    rows_read: Vec<bool>,
    cols_read: Vec<bool>,
    /// Whether the padded form is the input itself (no pads, stride 1): read in place.
    in_place: bool,
}

impl Padded {
    /// Floats per channel unit (all its phases).
    fn unit_len(&self) -> usize {
        self.sh * self.sw * self.hph * self.wph * self.e
    }
}

thread_local! {
    /// The padded input of the direct form (one buffer per calling thread, reused).
    static PADDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PAD_ROWS: RefCell<PadRows> = RefCell::new(PadRows::default());
}

/// The filters as `W^T` (`K x M`), packed into panels of NR output channels (zero
/// channels pad the last panel): panel `j` holds `K` rows of NR values.
pub(crate) struct FlippedFilters {
    isa: Isa,
    k: usize,
    m: usize,
    /// On cache lines (panels of 8 or 32 lanes: whole lines).
    data: cpu::AlignedF32,
    /// Reduction slice.
    kc: usize,
    /// Output channels per task (a multiple of NR).
    nc: usize,
    /// The direct form's geometry (None: im2col panels).
    padded: Option<Padded>,
    layout: Layout,
    /// The last panel's width: NR, or [`Isa::narrow_nr`] on the blocked path when its
    /// channels fit (it is then packed that wide).
    last_nr: usize,
    /// The blocked path's strip: about this many input floats (tile pixels times input
    /// channels) are read by every panel of a strip before the next strip starts.
    strip: usize,
    /// The blocked path's reduction slice in steps (0: the whole reduction per tile).
    /// Sliced, every tile of a run takes one slice of a panel's filters (kept in L1)
    /// before the next slice starts, adding to the sums it stored for the slice before;
    /// the next slice's filters are prefetched into L2 meanwhile.
    kslice: usize,
}

/// [`FlippedFilters::strip`]'s default: 128 KiB of input, read from L2 by every panel (a
/// tuner candidate: the best size follows the machine's L2).
pub(crate) const STRIP_FLOATS: usize = 32768;

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
        FlippedFilters { isa, k, m, data: cpu::AlignedF32::from_vec(data), kc: kc.clamp(1, k.max(1)), nc: per_task * nr, padded: None, layout: Layout::default(), last_nr: nr, strip: STRIP_FLOATS, kslice: 0 }
    }

    /// The direct form (see the module docs); `p` must satisfy [`direct_applies`].
    pub(crate) fn direct(p: &ConvProblem, w: &[f32], isa: Isa, kc: usize, threads: usize) -> FlippedFilters {
        Self::direct_in(p, w, isa, kc, threads, Layout::default())
    }

    /// The direct form over tensors in `layout` (blocked ones need channel counts that
    /// are multiples of 8).
    pub(crate) fn direct_in(p: &ConvProblem, w: &[f32], isa: Isa, kc: usize, threads: usize, layout: Layout) -> FlippedFilters {
        let g = &p.geo;
        let [_, ih_n, iw_n] = g.input;
        let [_, oh_n, ow_n] = g.output;
        let [_, kh_n, kw_n] = g.kernel;
        let (dh, dw, sh, sw) = (g.dilation[1], g.dilation[2], g.stride[1], g.stride[2]);
        // Padded extent read.
        let (hp, wp) = ((oh_n - 1) * sh + (kh_n - 1) * dh + 1, (ow_n - 1) * sw + (kw_n - 1) * dw + 1);
        let no_pads = g.pad_begin[1..].iter().all(|&v| v == 0);
        // The blocked path's tiles find each row's pixel themselves, so its input is
        // one plain padded plane per unit (read in place when nothing is padded);
        // the NCHW path reads MR consecutive grid pixels: strided inputs are split into
        // phase planes.
        let (step_h, step_w) = if layout.out_blocked { (sh, sw) } else { (1, 1) };
        let (sh, sw) = if layout.out_blocked { (1, 1) } else { (sh, sw) };
        let (in_place, hph, wph) = if layout.out_blocked && no_pads && hp <= ih_n && wp <= iw_n {
            (true, ih_n, iw_n)
        } else {
            (sh == 1 && sw == 1 && no_pads && (hp, wp) == (ih_n, iw_n), hp.div_ceil(sh), wp.div_ceil(sw))
        };
        let plane = hph * wph;
        let e = if layout.in_blocked { 8 } else { 1 };
        let unit_len = sh * sw * plane * e;
        let offs: Vec<usize> = (0..p.in_channels)
            .flat_map(|c| {
                (0..kh_n).flat_map(move |kh| {
                    (0..kw_n).map(move |kw| {
                        let (rh, rw) = (kh * dh, kw * dw);
                        (c / e) * unit_len + c % e + (((rh % sh) * sw + rw % sw) * plane + (rh / sh) * wph + rw / sw) * e
                    })
                })
            })
            .collect();
        let kc = kc.clamp(1, offs.len().max(1));
        let max_offs = offs.chunks(kc).map(|c| c.iter().copied().max().unwrap_or(0)).collect();
        let rows_read = (0..sh).map(|a| (0..kh_n).any(|kh| kh * dh % sh == a)).collect();
        let cols_read = (0..sw).map(|b| (0..kw_n).any(|kw| kw * dw % sw == b)).collect();
        let padded = Padded { sh, sw, step_h, step_w, hph, wph, e, offs, max_offs, rows_read, cols_read, in_place };
        let mut f = FlippedFilters { padded: Some(padded), layout, ..FlippedFilters::new(p, w, isa, kc, threads) };
        let (nr, narrow) = (isa.nr(), isa.narrow_nr());
        let rest = f.m - (f.m.div_ceil(nr) - 1) * nr;
        if layout.out_blocked && narrow < nr && rest <= narrow {
            // The last panel's lanes past `narrow` would be zeros: pack it narrow.
            let at = (f.m.div_ceil(nr) - 1) * f.k * nr;
            let mut data = f.data[..at].to_vec();
            data.extend(f.data[at..].chunks_exact(nr).flat_map(|row| row[..narrow].to_vec()));
            f.data = cpu::AlignedF32::from_vec(data);
            f.last_nr = narrow;
        }
        f
    }

    /// The blocked path's strip size in input floats (see [`STRIP_FLOATS`]).
    pub(crate) fn with_strip(self, floats: usize) -> FlippedFilters {
        FlippedFilters { strip: floats.max(1), ..self }
    }

    /// The blocked path's reduction slice in steps (see [`FlippedFilters::kslice`]; 0 or
    /// at least the reduction: unsliced).
    pub(crate) fn with_kslice(self, steps: usize) -> FlippedFilters {
        FlippedFilters { kslice: if steps >= self.k { 0 } else { steps }, ..self }
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
        let (mr, nr) = (self.isa.mr(), self.isa.nr());
        // Slack past the last unit: the extra columns of the last tiles read on.
        let padded_len = (p.in_channels / pd.e) * pd.unit_len() + (pd.wph + mr) * pd.e;
        if self.layout.out_blocked {
            let in_len = p.in_channels * p.geo.input_size();
            let source = if pd.in_place { Source::InPlace { x, stride: in_len } } else { Source::PadRows { x, padded_len, run: NEXT_RUN.fetch_add(1, Ordering::Relaxed) } };
            return self.run_blocked(p, pd, &source, bias, act, residual, y);
        }
        // Tasks: strips of grid pixels of a group of output channel panels, each
        // strip's transposed tile about 64 KiB (it stays in cache until its epilogue);
        // the panels are split where strips alone leave a thread idle.
        let [_, oh_n, ow_n] = p.geo.output;
        let grid = (oh_n - 1) * pd.wph + ow_n;
        let panels = self.m.div_ceil(nr);
        let strip_for = |cols: usize| (16384 / cols).next_multiple_of(mr).min(grid.next_multiple_of(mr));
        let want = 2 * cpu::threads();
        let strips0 = grid.div_ceil(strip_for(panels * nr));
        let per_group = if p.batch * strips0 >= want || cpu::threads() == 1 { panels } else { panels.div_ceil(want.div_ceil(p.batch * strips0)).max(1) };
        let groups = panels.div_ceil(per_group);
        let strip = strip_for(per_group * nr);
        let strips = grid.div_ceil(strip);
        let tasks = p.batch * strips * groups;
        let go = |buf: &[f32], stride: usize| {
            let run_task = |t: usize| {
                let (img, st, gr) = (t / (strips * groups), (t / groups) % strips, t % groups);
                let q0 = st * strip;
                let (j0, j1) = (gr * per_group, ((gr + 1) * per_group).min(panels));
                // SAFETY: this task writes the pixels of grid q0..q0 + strip of output
                // channel panels j0..j1 of image img only.
                unsafe { self.run_direct(p, pd, &buf[img * stride..][..stride], q0, (q0 + strip).min(grid), j0, j1, bias, act, residual, out.ptr().add(img * out_len)) };
            };
            cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
        };
        self.with_padded(p, pd, x, padded_len, go);
    }

    /// Calls `f(images, floats per image)` with the padded input: `x` itself where it is
    /// read in place, else the thread's padded buffer.
    fn with_padded(&self, p: &ConvProblem, pd: &Padded, x: &[f32], padded_len: usize, f: impl FnOnce(&[f32], usize)) {
        let in_len = p.in_channels * p.geo.input_size();
        if pd.in_place {
            return f(x, in_len);
        }
        PADDED.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(p.batch * padded_len, 0.0);
            let images = SharedOut(buf.as_mut_ptr());
            // Images and channel units in parallel (a stem's three planes too).
            let units = p.in_channels / pd.e;
            cpu::par_ranges(p.batch * units, pd.unit_len(), |a, b| {
                for t in a..b {
                    let (img, u) = (t / units, t % units);
                    // SAFETY: unit u of image img is written by this iteration only.
                    let dst = unsafe { std::slice::from_raw_parts_mut(images.ptr().add(img * padded_len + u * pd.unit_len()), pd.unit_len()) };
                    self.pad_unit(p, pd, &x[img * in_len + u * p.geo.input_size() * pd.e..][..p.geo.input_size() * pd.e], dst);
                }
            });
            for img in 0..p.batch {
                buf[img * padded_len + units * pd.unit_len()..(img + 1) * padded_len].fill(0.0);
            }
            f(&buf[..], padded_len);
        });
    }

    /// The blocked output: each (tile, output panel) pair is one unit of equal cost (the
    /// tile runs the whole reduction and stores its blocks with the epilogue in
    /// registers). Units are ordered image, strip of tiles, panel, tile, and each thread
    /// takes one equal run of them, so no thread waits on a larger share.
    #[allow(clippy::too_many_arguments)]
    fn run_blocked(&self, p: &ConvProblem, pd: &Padded, source: &Source, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let (mr, nr) = (self.isa.mr(), self.isa.nr());
        let tiles = p.geo.output_size().div_ceil(mr);
        let panels = self.m.div_ceil(nr);
        // A strip's input (about its pixels times the input channels) stays near
        // `strip` floats, so that it is read from L2 by every panel.
        let per_strip = (self.strip / (p.in_channels * mr).max(1)).clamp(1, tiles);
        // Bias per panel, zero-padded to NR lanes.
        let mut bias_nr = vec![0f32; panels * nr];
        if let Some(b) = bias {
            bias_nr[..self.m].copy_from_slice(&b[..self.m]);
        }
        let clamp = super::conv_small_k::as_clamp(act);
        let generic_act = if clamp.is_some() { None } else { act };
        let out_len = p.out_channels * p.geo.output_size();
        let out = SharedOut(y.as_mut_ptr());
        let per_image = tiles * panels;
        let tiles_px = p.geo.output_size();
        // One run of units per thread: a thread then streams its own panels' filters
        // only (finer chunks, claimed in turn, had both threads read most panels).
        cpu::par_split(p.batch * per_image, 2 * self.k * mr * nr, |u0, u1| {
            let mut u = u0;
            while u < u1 {
                // The run of units in one strip and one panel that starts at u.
                let (img, r) = (u / per_image, u % per_image);
                let st = r / (per_strip * panels);
                let len = per_strip.min(tiles - st * per_strip);
                let r = r - st * per_strip * panels;
                let (j, i0) = (r / len, st * per_strip + r % len);
                let i1 = (st * per_strip + len).min(i0 + (u1 - u));
                // SAFETY: units are disjoint between calls: this writes tiles i0..i1 of
                // panel j of image img only.
                let run_tiles = |xp: &[f32]| unsafe {
                    let tile = BlockedTiles { p, pd, xp, bias: &bias_nr, clamp, act: generic_act, residual, y: out.ptr().add(img * out_len) };
                    self.blocked_tiles(&tile, i0, i1, j, j + 1);
                };
                match *source {
                    Source::InPlace { x, stride } => run_tiles(&x[img * stride..][..stride]),
                    Source::PadRows { x, padded_len, run } => {
                        // The padded rows these tiles read: from their first pixel's
                        // window to their last one's.
                        let [_, _, ow_n] = p.geo.output;
                        let (first, last) = (i0 * mr / ow_n, ((i1 * mr).min(tiles_px) - 1) / ow_n);
                        let (kh_n, dh) = (p.geo.kernel[1], p.geo.dilation[1]);
                        let rows = first * pd.step_h..(last * pd.step_h + (kh_n - 1) * dh + 1).min(pd.hph);
                        let in_len = p.in_channels * p.geo.input_size();
                        PAD_ROWS.with(|cell| match cell.try_borrow_mut() {
                            Ok(mut pr) => {
                                pr.fill(p, pd, &x[img * in_len..][..in_len], (run, img), padded_len, rows);
                                run_tiles(&pr.buf[..padded_len]);
                            }
                            Err(_) => {
                                let mut pr = PadRows::default();
                                pr.fill(p, pd, &x[img * in_len..][..in_len], (run, img), padded_len, rows);
                                run_tiles(&pr.buf[..padded_len]);
                            }
                        });
                    }
                }
                u += i1 - i0;
            }
        });
    }

    /// Tiles `i0..i1` (MR output pixels each, in raster order) of output panels
    /// `j0..j1` of one image.
    unsafe fn blocked_tiles(&self, t: &BlockedTiles, i0: usize, i1: usize, j0: usize, j1: usize) {
        let (isa, k, e) = (self.isa, self.k, t.pd.e);
        let (mr, nr) = (isa.mr(), isa.nr());
        let [_, oh_n, ow_n] = t.p.geo.output;
        let (px, wph) = (oh_n * ow_n, t.pd.wph);
        // Each tile's rows: where they read (the first tap of output (oh, ow) in the
        // padded plane) and store; rows past the last pixel repeat it and are not stored.
        let tile_of = |i: usize| {
            let (mut xs, mut rows) = ([t.xp.as_ptr(); 8], [BlockedStore::SKIP; 8]);
            let p0 = i * mr;
            let (mut oh, mut ow) = (p0 / ow_n, p0 % ow_n);
            for r in 0..mr.min(px - p0) {
                xs[r] = t.xp.as_ptr().add((oh * t.pd.step_h * wph + ow * t.pd.step_w) * e);
                rows[r] = (p0 + r) * 8;
                ow += 1;
                if ow == ow_n {
                    (oh, ow) = (oh + 1, 0);
                }
            }
            for r in mr.min(px - p0)..mr {
                xs[r] = xs[r - 1];
            }
            (xs, rows)
        };
        let tiles: Vec<_> = (i0..i1).map(tile_of).collect();
        let panels = self.m.div_ceil(nr);
        let slice = if self.kslice == 0 { k } else { self.kslice };
        // Later slices add to the sums the earlier ones stored (no bias, as a residual).
        let zeros = [0f32; 32];
        for j in j0..j1 {
            let bpanel = self.data.as_ptr().add(j * k * nr);
            let width = if j + 1 == panels { self.last_nr } else { nr };
            let blocks = ((self.m - j * nr) / 8).min(width / 8);
            let ybase = t.y.add(j * (nr / 8) * px * 8);
            for k0 in (0..k).step_by(slice) {
                let kl = slice.min(k - k0);
                let last = k0 + kl == k;
                if self.kslice != 0 {
                    // The next slice of this panel, or the next panel's first.
                    let next = if !last { Some(bpanel.add((k0 + kl) * width)) } else if j + 1 < panels { Some(bpanel.add(k * width)) } else { None };
                    if let Some(next) = next {
                        prefetch_l2(next, slice.min(k) * nr);
                    }
                }
                for (xs, rows) in &tiles {
                    let bias = if k0 == 0 { t.bias.as_ptr().add(j * nr) } else { zeros.as_ptr() };
                    let store = BlockedStore { block_stride: px * 8, rows: *rows, blocks, bias, residual: t.residual || k0 > 0, clamp: if last { t.clamp } else { None } };
                    isa.tile_rows_blocked(kl, width, xs, t.pd.offs.as_ptr().add(k0), bpanel.add(k0 * width), ybase, &store);
                    if let (true, Some(a)) = (last, t.act) {
                        for &r in rows.iter().take(mr).filter(|&&r| r != BlockedStore::SKIP) {
                            for blk in 0..blocks {
                                a.apply_slice_f32_fast(std::slice::from_raw_parts_mut(ybase.add(blk * px * 8 + r), 8));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Copies one channel unit of an image (`x`: its plane or block) into `dst` (its
    /// `unit_len` floats) as zero-padded phase planes (see the module docs).
    fn pad_unit(&self, p: &ConvProblem, pd: &Padded, xc: &[f32], dst: &mut [f32]) {
        let g = &p.geo;
        let [_, ih_n, iw_n] = g.input;
        let (top, left) = (g.pad_begin[1], g.pad_begin[2]);
        let (sh, sw, hph, wph, e) = (pd.sh, pd.sw, pd.hph, pd.wph, pd.e);
        let plane = hph * wph;
        // Padded columns lo..hi come from the input (the rest, of every row, is zero).
        let lo = left.max(0) as usize;
        let hi = ((iw_n as i64 + left).max(0) as usize).min(sw * wph).max(lo.min(sw * wph));
        let lo = lo.min(hi);
        if sh == 1 && sw == 1 {
            for (r, row) in dst.chunks_exact_mut(wph * e).enumerate() {
                pad_row(p, pd, xc, r, row);
            }
            return;
        }
        dst.fill(0.0);
        for r in 0..sh * hph {
            let ih = r as i64 - top;
            if ih < 0 || ih >= ih_n as i64 || hi == lo || !pd.rows_read[r % sh] {
                continue;
            }
            let src = &xc[(ih as usize * iw_n + (lo as i64 - left) as usize) * e..][..(hi - lo) * e];
            let row = |qw: usize| (((r % sh) * sw + qw) * plane + (r / sh) * wph) * e;
            if sw == 1 {
                let at = row(0);
                dst[at + lo * e..at + hi * e].copy_from_slice(src);
            } else {
                // Column lo + i is element j of phase qw (counters, not divisions).
                let (mut qw, mut j) = (lo % sw, lo / sw);
                for px in src.chunks_exact(e) {
                    if pd.cols_read[qw] {
                        // Fixed-length copies (a slice copy of length e is a call).
                        let at = row(qw) + j * e;
                        if e == 8 {
                            let v: [f32; 8] = px.try_into().expect("eight floats");
                            dst[at..at + 8].copy_from_slice(&v);
                        } else {
                            dst[at] = px[0];
                        }
                    }
                    qw += 1;
                    if qw == sw {
                        (qw, j) = (0, j + 1);
                    }
                }
            }
        }
    }

    /// Grid pixels `q0..q1` (`q = oh * wph + ow`) of output channel panels `j0..j1` of
    /// one image, from its padded planes `xp`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_direct(&self, p: &ConvProblem, pd: &Padded, xp: &[f32], q0: usize, q1: usize, j0: usize, j1: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
        let (isa, k, m, e) = (self.isa, self.k, self.m, pd.e);
        let (mr, nr) = (isa.mr(), isa.nr());
        let [_, oh_n, ow_n] = p.geo.output;
        let px = oh_n * ow_n;
        let tiles = (q1 - q0).div_ceil(mr);
        let cols = (j1 - j0) * nr;
        let (n0, n1) = (j0 * nr, (j1 * nr).min(m));
        cpu::with_scratch(tiles * mr * cols + self.kc * mr, |scratch| {
            let (ct, apack) = scratch.split_at_mut(tiles * mr * cols);
            let mut kb = 0;
            while kb < k {
                let kcur = self.kc.min(k - kb);
                let offs = &pd.offs[kb..kb + kcur];
                // Tiles whose reads stay inside `xp` (all of them unless read in place).
                // (None: `xp` is shorter than one tile's reach, every tile is packed.)
                let safe = xp.len().checked_sub(pd.max_offs[kb / self.kc] + (mr - 1) * e + 1);
                for i in 0..tiles {
                    let q = q0 + i * mr;
                    let packed = safe.is_none_or(|s| q * e > s);
                    if packed {
                        // The input's last pixels: pack the tile's A, zeros past the end.
                        for (kk, &o) in offs.iter().enumerate() {
                            for r in 0..mr {
                                apack[kk * mr + r] = xp.get(o + (q + r) * e).copied().unwrap_or(0.0);
                            }
                        }
                    }
                    for j in j0..j1 {
                        let bpanel = self.data.as_ptr().add((j * k + kb) * nr);
                        let c_tile = ct.as_mut_ptr().add(i * mr * cols + (j - j0) * nr);
                        if packed {
                            isa.tile(kcur, apack.as_ptr(), bpanel, c_tile, cols, kb > 0);
                        } else if e == 8 {
                            isa.tile_gather8(kcur, xp.as_ptr().add(q * 8), offs.as_ptr(), bpanel, c_tile, cols, kb > 0);
                        } else {
                            isa.tile_gather(kcur, xp.as_ptr().add(q), offs.as_ptr(), bpanel, c_tile, cols, kb > 0);
                        }
                    }
                }
                kb += kcur;
            }
            if k == 0 {
                ct.fill(0.0);
            }
            // The epilogue, one output row segment at a time.
            let mut q = q0;
            while q < q1 {
                let (oh, ow) = (q / pd.wph, q % pd.wph);
                let seg_end = (oh * pd.wph + pd.wph).min(q1);
                if ow >= ow_n {
                    q = seg_end;
                    continue;
                }
                let len = (seg_end - q).min(ow_n - ow);
                let tile = &ct[(q - q0) * cols..];
                let pix = oh * ow_n + ow;
                let at = y.add(n0 * px + pix);
                store_transposed(tile, cols, len, n1 - n0, bias.map(|b| &b[n0..]), residual, at, px);
                if let Some(a) = act {
                    for ch in 0..n1 - n0 {
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

/// Where the blocked path's tiles read their input.
enum Source<'a> {
    /// The input itself (no pads): `stride` floats per image.
    InPlace { x: &'a [f32], stride: usize },
    /// A zero-padded copy that each thread makes of the rows its own tiles read, just
    /// before it runs them (so the rows are in its cache, and no thread waits for a
    /// whole padded copy first); `run` tells one call's copies from another's.
    PadRows { x: &'a [f32], padded_len: usize, run: u64 },
}

/// Numbers the blocked path's calls (see [`Source::PadRows`]).
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// A thread's padded copy of an image (one plane per channel unit, at `Padded`'s
/// geometry), of which only the rows in `done` are current.
#[derive(Default)]
struct PadRows {
    /// The call and image the rows in `done` belong to.
    of: (u64, usize),
    done: Vec<bool>,
    buf: Vec<f32>,
}

impl PadRows {
    /// Makes rows `rows` of every unit of image `x` (of call and image `of`) current.
    fn fill(&mut self, p: &ConvProblem, pd: &Padded, x: &[f32], of: (u64, usize), padded_len: usize, rows: std::ops::Range<usize>) {
        if self.of != of || self.done.len() != pd.hph || self.buf.len() < padded_len {
            self.of = of;
            self.done.clear();
            self.done.resize(pd.hph, false);
            if self.buf.len() < padded_len {
                self.buf.resize(padded_len, 0.0);
            }
            // The slack past the last unit reads as zeros.
            let units_len = (p.in_channels / pd.e) * pd.unit_len();
            self.buf[units_len..padded_len].fill(0.0);
        }
        let (row_len, unit_len, in_unit) = (pd.wph * pd.e, pd.unit_len(), p.geo.input_size() * pd.e);
        for r in rows {
            if std::mem::replace(&mut self.done[r], true) {
                continue;
            }
            for u in 0..p.in_channels / pd.e {
                pad_row(p, pd, &x[u * in_unit..][..in_unit], r, &mut self.buf[u * unit_len + r * row_len..][..row_len]);
            }
        }
    }
}

/// Row `r` of a one-phase padded plane (`sh == sw == 1`) of channel unit `xc`: zeros,
/// the input's row, zeros (nothing written twice).
fn pad_row(p: &ConvProblem, pd: &Padded, xc: &[f32], r: usize, row: &mut [f32]) {
    let g = &p.geo;
    let [_, ih_n, iw_n] = g.input;
    let (top, left, e) = (g.pad_begin[1], g.pad_begin[2], pd.e);
    // Padded columns lo..hi come from the input.
    let lo = (left.max(0) as usize).min(pd.wph);
    let hi = ((iw_n as i64 + left).max(0) as usize).min(pd.wph).max(lo);
    let ih = r as i64 - top;
    if ih < 0 || ih >= ih_n as i64 || hi == lo {
        row.fill(0.0);
        return;
    }
    row[..lo * e].fill(0.0);
    row[lo * e..hi * e].copy_from_slice(&xc[(ih as usize * iw_n + (lo as i64 - left) as usize) * e..][..(hi - lo) * e]);
    row[hi * e..].fill(0.0);
}

/// Asks for `floats` floats from `p` on into L2 (one request per cache line), where the
/// CPU has such a hint; a hint, never a fault, whatever the address.
fn prefetch_l2(p: *const f32, floats: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..floats).step_by(16) {
        // SAFETY: prefetches do not fault; the pointer is only formed, never read.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.wrapping_add(i) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, floats);
}

/// What every task of [`FlippedFilters::run_blocked`] shares.
struct BlockedTiles<'a> {
    p: &'a ConvProblem,
    pd: &'a Padded,
    /// One image's padded input.
    xp: &'a [f32],
    /// NR biases per panel.
    bias: &'a [f32],
    clamp: Option<(f32, f32)>,
    /// An activation that is not a clamp, applied after the store.
    act: Option<UnaryKind>,
    residual: bool,
    /// The image's blocked output.
    y: *mut f32,
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
