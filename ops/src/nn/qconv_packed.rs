//! The fast CPU integer convolution of QLinearConv and ConvInteger, an indirect GEMM
//! on the micro-kernels of [`crate::linalg::int8_kernel`]:
//!
//! - the constant 8-bit filters are packed once per plan, per group, as blocks of
//!   [`CH`] output channels over (tap, input channel) with the channels innermost;
//! - each run first repacks the input from NCHW into pixel-major words (one pixel's
//!   input channels of a group side by side: pairs of `x - zx` as i16, or raw quads),
//!   so that a filter tap of a pixel reads one contiguous run of words; one extra row
//!   per image and group stands for the padding;
//! - a tile of [`PX`] output pixels reads, per tap, the input pixel under it or the
//!   padding row, through word offsets computed once per plan (or per chunk of pixels
//!   for very large images): no im2col buffer, and a 1x1 convolution is the plain GEMM
//!   of the same path;
//! - int32 sums are exact, and the epilogue is fused: ConvInteger stores the sums,
//!   QLinearConv adds the bias and requantizes `(acc + B) * (sx * sw[m] / sy)` in f32,
//!   rounded half to even around y's zero point, exactly as [`super::qlinear_conv`]'s
//!   reference does.
//!
//! Zero points: the pairs layout subtracts them while widening to i16; the quads layout
//! (VNNI) keeps the activations' and folds `zx * sum_k w[m][k]` out of each sum
//! (filters must be signed with a zero zero point there). Depthwise convolutions have
//! their own kernel ([`super::qconv_depthwise`]); narrow groups (fewer than 4 outputs
//! per group) keep the op's direct kernel.
use super::conv_cpu::ConvProblem;
use super::qconv_depthwise::DepthwiseIntConv;
use super::qconv_depthwise_nhwc::DepthwiseNhwc;
use super::qlinear_conv::ChannelsLast;
use super::window::Geometry;
use crate::cpu::{self, CpuKernel, SharedPtr};
use crate::linalg::int8_kernel::{self, pack_constant, Int8Isa, Layout, Requantize, CH, PX};
use crate::quant::qlinear;
use crate::{OpError, Result, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};
use std::cell::RefCell;
use std::sync::Mutex;

/// Which op's epilogue runs, and where its inputs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Epilogue {
    /// ConvInteger: int32 sums; x's zero point is input 2.
    Int32,
    /// QLinearConv: inputs x, sx, zx, w, sw, zw, sy, zy, [bias].
    Requantize,
}

/// The fewest output channels per group the packed path takes.
const MIN_OUT_PER_GROUP: usize = 4;
/// Pixel tiles per chunk: a unit of parallel work (with one block of channels).
const TILES_PER_CHUNK: usize = 8;
/// The most tap offsets a plan keeps (16 MiB); larger images compute them per chunk.
/// (Unit tests take both paths: their larger cases exceed the test value.)
const MAX_PLAN_OFFSETS: usize = if cfg!(test) { 4096 } else { 1 << 22 };

/// Input channels per group below which the kernel's width is folded into the
/// channels (see [`PackedIntConv::fold`]).
const FOLD_BELOW_CHANNELS: usize = 8;

/// Filters packed for one instruction set.
pub(super) struct PackedIntConv {
    p: ConvProblem,
    /// The geometry the kernel runs: `p.geo`, or with the kernel's width folded into the
    /// channels, a `kd x kh x 1` window over an input `ow` pixels wide.
    geo: Geometry,
    /// Filter columns folded into the channels (1: none). A convolution with few input
    /// channels (an RGB stem) would otherwise run one or two words per tap, so each
    /// repacked pixel holds `[cg][kw]` values, the input row under every filter column
    /// of one output column.
    fold: usize,
    isa: Int8Isa,
    layout: Layout,
    epilogue: Epilogue,
    /// Filter taps (kernel positions).
    taps: usize,
    /// Words per tap: a group's input channels, padded to the layout's word.
    tw: usize,
    /// Blocks of [`CH`] output channels per group.
    blocks: usize,
    /// `[group][blocks][taps * tw][CH]` words, on cache lines.
    w: crate::cpu::Aligned<u32>,
    /// `[tile][tap][PX]` word offsets of every output pixel's taps into one image and
    /// group of the repacked input, when they fit [`MAX_PLAN_OFFSETS`].
    offsets: Option<Vec<u32>>,
    /// Per output channel: the filter's sum (quads only: folds x's zero point out).
    row_sums: Vec<i32>,
    x_signed: bool,
    /// Whether x and y are channels-last (`[N, H, W, C]`: `kiln_channels_last`).
    channels_last: ChannelsLast,
    /// The repacked input, kept between runs.
    scratch: Mutex<Vec<u32>>,
}

/// The instruction-set parameter ([`int8_kernel::isa_param`]).
pub(super) fn params(quads_ok: bool) -> Vec<TuneParam> {
    vec![int8_kernel::isa_param(quads_ok)]
}

/// Whether this problem takes the packed path.
pub(super) fn eligible(p: &ConvProblem) -> bool {
    p.out_per_group() >= MIN_OUT_PER_GROUP && !p.is_depthwise() && p.reduction() > 0
}

/// Whether the quads layout fits: unsigned x, signed filters with zero zero points.
pub(super) fn quads_ok(x: DType, w: &Tensor, zw: &[i32]) -> bool {
    x == DType::U8 && w.dtype() == DType::I8 && zw.iter().all(|&z| z == 0)
}

impl PackedIntConv {
    /// Packs constant filters `w` (zero points `zw`: one or one per output channel).
    pub(super) fn new(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], tune: &TuneValues, channels_last: ChannelsLast) -> Result<Option<PackedIntConv>> {
        if !eligible(&p) {
            return Ok(None);
        }
        let quads = quads_ok(x, w, zw);
        let (isa, layout) = int8_kernel::chosen(tune, quads);
        Self::with_isa(p, epilogue, x, w, zw, isa, layout, channels_last).map(Some)
    }

    /// Packs for a given instruction set and layout (the portable kernel runs both).
    #[allow(clippy::too_many_arguments)]
    fn with_isa(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], isa: Int8Isa, layout: Layout, channels_last: ChannelsLast) -> Result<PackedIntConv> {
        let (mg, cg, all_taps) = (p.out_per_group(), p.in_per_group(), p.geo.kernel_size());
        let wv = qlinear::ints(w)?;
        if wv.len() != p.out_channels * cg * all_taps || (zw.len() != 1 && zw.len() != p.out_channels) {
            return Err(OpError::Invalid(format!("filters of {} values and {} zero points for {} output channels", wv.len(), zw.len(), p.out_channels)));
        }
        // (Folding repacks NCHW rows: a channels-last input keeps its pixels.)
        let fold = if cg < FOLD_BELOW_CHANNELS && !channels_last.x { p.geo.kernel[2] } else { 1 };
        let geo = folded(&p.geo, fold);
        // Per tap of the folded window, the values (channel, filter column).
        let (taps, tap_len) = (all_taps / fold, fold * cg);
        let zero = |m: usize| zw[if zw.len() == 1 { 0 } else { m }];
        let mut packed = Vec::new();
        for g in 0..p.group {
            let m0 = g * mg;
            packed.extend(pack_constant(layout, mg, taps, tap_len, |col, t, i| wv[((m0 + col) * cg + i / fold) * all_taps + t * fold + i % fold], |col| zero(m0 + col)));
        }
        let row_sums = wv.chunks(cg * all_taps).map(|r| r.iter().sum()).collect();
        let tw = tap_len.div_ceil(layout.per_word());
        if (geo.input_size() + 1) * tw > u32::MAX as usize {
            return Err(OpError::Unsupported(format!("an 8-bit convolution over {} input pixels of {cg} channels (at most 2^32 words per image)", p.geo.input_size())));
        }
        let tiles = geo.output_size().div_ceil(PX);
        let offsets = (tiles * taps * PX <= MAX_PLAN_OFFSETS).then(|| {
            let mut o = vec![0; tiles * taps * PX];
            tap_offsets(&geo, taps, tw, 0, tiles, &mut o);
            o
        });
        Ok(PackedIntConv {
            geo,
            fold,
            taps,
            tw,
            blocks: mg.div_ceil(CH),
            w: crate::cpu::Aligned::from_vec(packed),
            offsets,
            row_sums,
            x_signed: x == DType::I8,
            p,
            isa,
            layout,
            epilogue,
            channels_last,
            scratch: Mutex::new(Vec::new()),
        })
    }
}

thread_local! {
    /// A chunk's tap offsets, where the plan has none.
    static TAPS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// What a run's tasks share.
struct Run<'a> {
    /// The repacked input: `[batch][group][input pixels + the padding row][tw]` words,
    /// or x itself where its bytes are those words ([`PackedIntConv::reads_x`]).
    xs: *const u32,
    /// Words from one image and group of `xs` to the next.
    image_words: usize,
    /// Per group and block of [`CH`] output channels (padded with zeros): the shift
    /// added to each sum (bias, minus the zero-point fold), and for QLinearConv the
    /// requantization multipliers, output range less y's zero point and that zero point.
    blocks: &'a [Requantize],
    out: SharedPtr<u8>,
    /// Whether the 8-bit output is signed.
    y_signed: bool,
}
unsafe impl Send for Run<'_> {}
unsafe impl Sync for Run<'_> {}

impl CpuKernel for PackedIntConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let p = &self.p;
        let y = &mut outputs[0];
        let (zx, mult, bounds, bias) = run_params(p, self.epilogue, inputs, x, y)?;
        let fold = self.layout == Layout::Quads;
        let (mg, (lo, hi, zy)) = (p.out_per_group(), bounds);
        // Per block: the shift (bias, minus the zero-point fold) and the multipliers.
        let blocks: Vec<Requantize> = (0..p.group * self.blocks)
            .map(|gb| {
                let m0 = gb / self.blocks * mg + gb % self.blocks * CH;
                let mcount = CH.min(mg - gb % self.blocks * CH);
                let (mut shift, mut mu) = ([0i32; CH], [0f32; CH]);
                for (l, s) in shift.iter_mut().enumerate().take(mcount) {
                    let m = m0 + l;
                    *s = bias[m].wrapping_sub(if fold { zx.wrapping_mul(self.row_sums[m]) } else { 0 });
                }
                if !mult.is_empty() {
                    mu[..mcount].copy_from_slice(&mult[m0..m0 + mcount]);
                }
                Requantize { shift, mult: mu, lo, hi, zy }
            })
            .collect();

        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let img = self.geo.input_size();
        let (xs, image_words) = if self.reads_x(x.bytes()) {
            (x.bytes().as_ptr() as *const u32, img * self.tw)
        } else {
            self.pack_input(x.bytes(), zx, &mut scratch);
            (scratch.as_ptr(), (img + 1) * self.tw)
        };
        let y_signed = y.dtype() == DType::I8;
        let run = Run { xs, image_words, blocks: &blocks, out: SharedPtr(y.bytes_mut().as_mut_ptr()), y_signed };

        let tiles = p.geo.output_size().div_ceil(PX);
        let chunks = tiles.div_ceil(TILES_PER_CHUNK);
        let per_chunk = tiles.div_ceil(chunks.max(1));
        let units = p.batch * p.group * chunks * self.blocks;
        let work = per_chunk * PX * self.taps * self.tw * CH;
        cpu::par_ranges(units, work, |start, end| {
            TAPS.with(|cell| {
                let local = &mut *cell.borrow_mut();
                // Consecutive units of one chunk share its offsets.
                let mut key = None;
                for u in start..end {
                    let (bgc, blk) = (u / self.blocks, u % self.blocks);
                    let (bg, chunk) = (bgc / chunks, bgc % chunks);
                    let t0 = chunk * per_chunk;
                    let t1 = (t0 + per_chunk).min(tiles);
                    let span = self.taps * PX;
                    let offs = match &self.offsets {
                        Some(o) => &o[t0 * span..t1 * span],
                        None => {
                            if key != Some(t0) {
                                local.resize((t1 - t0) * span, 0);
                                tap_offsets(&self.geo, self.taps, self.tw, t0, t1, local);
                                key = Some(t0);
                            }
                            &local[..]
                        }
                    };
                    self.compute(&run, bg, blk, t0, t1, offs);
                }
            })
        });
        Ok(())
    }
}

impl PackedIntConv {
    /// Whether the kernel reads x in place: a channels-last x whose pixels are already
    /// the quads layout's words (one group, a multiple of 4 channels, 4-byte aligned),
    /// under a window that never reaches the padding (a 1x1 convolution without pads).
    fn reads_x(&self, x: &[u8]) -> bool {
        let g = &self.geo;
        self.channels_last.x
            && self.layout == Layout::Quads
            && self.p.group == 1
            && self.p.in_channels % 4 == 0
            && self.fold == 1
            && g.kernel_size() == 1
            && g.pad_begin.iter().chain(&g.pad_end).all(|&p| p == 0)
            && x.as_ptr().align_offset(4) == 0
    }

    /// Repacks x (NCHW) into `[batch][group][pixel + 1][tw]` words, the last row of each
    /// image and group the padding: pairs of `x - zx` (padding 0), or quads of raw bytes
    /// (padding `zx`).
    fn pack_input(&self, x: &[u8], zx: i32, buf: &mut Vec<u32>) {
        if self.channels_last.x {
            return self.pack_input_nhwc(x, zx, buf);
        }
        if self.fold > 1 {
            return self.pack_input_folded(x, zx, buf);
        }
        let p = &self.p;
        let (img, tw, cg) = (p.geo.input_size(), self.tw, p.in_per_group());
        self.reset_scratch(img, zx, buf);
        let (layout, per, signed) = (self.layout, self.layout.per_word(), self.x_signed);
        const BLOCK: usize = 256;
        let blocks = img.div_ceil(BLOCK);
        let out = SharedPtr(buf.as_mut_ptr());
        cpu::par_ranges(p.batch * p.group * blocks, BLOCK * tw, |start, end| {
            for u in start..end {
                let (bg, blk) = (u / blocks, u % blocks);
                let (b, g) = (bg / p.group, bg % p.group);
                let (p0, p1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(img));
                // SAFETY: rows p0..p1 of image-and-group bg belong to this task alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((bg * (img + 1) + p0) * tw), (p1 - p0) * tw) };
                let n = p1 - p0;
                let planes: Vec<&[u8]> = (0..cg).map(|c| &x[((b * p.in_channels + g * cg + c) * img + p0)..][..n]).collect();
                // Whole blocks of 8 pixels x 8 words by vector transposes, the rest below.
                let (nv, kv) = match self.isa {
                    // SAFETY: the isa is available; dst holds n pixels of tw words.
                    #[cfg(target_arch = "x86_64")]
                    Int8Isa::Avx2 => unsafe { int8_kernel::pack_pairs_avx2(&planes, signed, zx, tw, dst) },
                    _ => (0, 0),
                };
                let mut word = [0u32; BLOCK];
                for k in 0..tw {
                    let from = if k < kv { nv } else { 0 };
                    let acc = &mut word[from..n];
                    acc.fill(0);
                    for q in 0..per {
                        let Some(r) = planes.get(k * per + q).map(|r| &r[from..]) else { continue };
                        match (layout, signed) {
                            (Layout::Pairs, false) => acc.iter_mut().zip(r).for_each(|(a, &v)| *a |= ((v as i32 - zx) as u16 as u32) << (16 * q)),
                            (Layout::Pairs, true) => acc.iter_mut().zip(r).for_each(|(a, &v)| *a |= ((v as i8 as i32 - zx) as u16 as u32) << (16 * q)),
                            (Layout::Quads, _) => acc.iter_mut().zip(r).for_each(|(a, &v)| *a |= (v as u32) << (8 * q)),
                        }
                    }
                    for (d, &w) in dst.chunks_exact_mut(tw).zip(&word[..n]).skip(from) {
                        d[k] = w;
                    }
                }
            }
        });
    }

    /// Sizes the repacked input for `img` pixels per image and group, and fills each
    /// one's padding row (pairs: 0, quads: `zx`).
    fn reset_scratch(&self, img: usize, zx: i32, buf: &mut Vec<u32>) {
        let tw = self.tw;
        buf.resize(self.p.batch * self.p.group * (img + 1) * tw, 0);
        let pad = self.layout.word(std::iter::empty(), zx, zx);
        for image in buf.chunks_exact_mut((img + 1) * tw) {
            image[img * tw..].fill(pad);
        }
    }

    /// Repacks a channels-last x (`[N, pixels, C]`) into the same words as
    /// [`Self::pack_input`]: a pixel's channels of a group are already side by side, so
    /// each pixel's words are its bytes widened (pairs of `x - zx`) or copied (quads).
    fn pack_input_nhwc(&self, x: &[u8], zx: i32, buf: &mut Vec<u32>) {
        let p = &self.p;
        let (img, tw, cg, c) = (p.geo.input_size(), self.tw, p.in_per_group(), p.in_channels);
        self.reset_scratch(img, zx, buf);
        let (layout, signed) = (self.layout, self.x_signed);
        const BLOCK: usize = 256;
        let blocks = img.div_ceil(BLOCK);
        let out = SharedPtr(buf.as_mut_ptr());
        cpu::par_ranges(p.batch * p.group * blocks, BLOCK * tw, |start, end| {
            let mut row = vec![0u8; tw * 4];
            for u in start..end {
                let (bg, blk) = (u / blocks, u % blocks);
                let (b, g) = (bg / p.group, bg % p.group);
                let (p0, p1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(img));
                // SAFETY: rows p0..p1 of image-and-group bg belong to this task alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((bg * (img + 1) + p0) * tw), (p1 - p0) * tw) };
                #[cfg(target_endian = "little")]
                if layout == Layout::Pairs && cg % 2 == 0 && cg == c {
                    // Ungrouped, even channels: the block's pixels are one run of bytes, and
                    // each word holds two consecutive values as little-endian i16.
                    let src = &x[(b * img + p0) * c..(b * img + p1) * c];
                    let halves: &mut [u16] = bytemuck::cast_slice_mut(dst);
                    if signed {
                        halves.iter_mut().zip(src).for_each(|(h, &v)| *h = (v as i8 as i16).wrapping_sub(zx as i16) as u16);
                    } else {
                        halves.iter_mut().zip(src).for_each(|(h, &v)| *h = (v as i16).wrapping_sub(zx as i16) as u16);
                    }
                    continue;
                }
                if layout == Layout::Quads && cg % 4 == 0 && cg == c {
                    // Ungrouped, whole words: the block's pixels are its words' bytes.
                    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
                    bytes.copy_from_slice(&x[(b * img + p0) * c..(b * img + p1) * c]);
                    continue;
                }
                for (i, words) in dst.chunks_exact_mut(tw).enumerate() {
                    let src = &x[(b * img + p0 + i) * c + g * cg..][..cg];
                    match layout {
                        Layout::Pairs => {
                            // Values past the group's channels are 0 (their weights are too).
                            let src = if cg % 2 == 0 {
                                src
                            } else {
                                row[..cg].copy_from_slice(src);
                                row[cg] = if signed { zx as i8 as u8 } else { zx as u8 };
                                &row[..cg + 1]
                            };
                            let v = |v: u8| (if signed { v as i8 as i32 } else { v as i32 } - zx) as u16 as u32;
                            for (w, two) in words.iter_mut().zip(src.chunks_exact(2)) {
                                *w = v(two[0]) | v(two[1]) << 16;
                            }
                        }
                        Layout::Quads => {
                            row.fill(0);
                            row[..cg].copy_from_slice(src);
                            for (w, four) in words.iter_mut().zip(row.chunks_exact(4)) {
                                *w = u32::from_le_bytes([four[0], four[1], four[2], four[3]]);
                            }
                        }
                    }
                }
            }
        });
    }

    /// Repacks x (NCHW) for a kernel with its width folded ([`Self::fold`]): pixel
    /// `(row, ox)` of image and group `bg` holds, for every channel `c` and folded filter
    /// column `e` (in that order), `x[c][row][ox * stride + e * dilation - pad]`, or the
    /// padding value where that column falls outside the input.
    fn pack_input_folded(&self, x: &[u8], zx: i32, buf: &mut Vec<u32>) {
        let p = &self.p;
        let (img, tw, cg, fold) = (self.geo.input_size(), self.tw, p.in_per_group(), self.fold);
        let (rows, ow, iw) = (self.geo.input[0] * self.geo.input[1], self.geo.input[2], p.geo.input[2]);
        let (stride, pad_begin) = (p.geo.stride[2], p.geo.pad_begin[2]);
        self.reset_scratch(img, zx, buf);
        let (layout, per, signed) = (self.layout, self.layout.per_word(), self.x_signed);
        // A row of the input, with its padding, covers every window of the row.
        let dilation = p.geo.dilation[2];
        let span = (ow - 1) * stride + (fold - 1) * dilation + 1;
        let encode = move |v: u8| -> u32 {
            let v = if signed { v as i8 as i32 } else { v as i32 };
            match layout {
                Layout::Pairs => (v - zx) as u16 as u32,
                Layout::Quads => v as u8 as u32,
            }
        };
        let pad_bits = match layout {
            Layout::Pairs => 0,
            Layout::Quads => zx as u8 as u32,
        };
        // Per value of a pixel (channel c, column e), then up to whole words: where it
        // sits in the encoded rows; an extra row of padding stands for the values past
        // the channels.
        let cf = cg * fold;
        let slots: Vec<usize> = (0..tw * per).map(|i| if i < cf { i / fold * span + i % fold * dilation } else { cg * span }).collect();
        // The pairs layout's two slots per word, and how far past a window's first value
        // they reach (so the hot loop indexes a slice of known length).
        let pairs: Vec<(usize, usize)> = slots.chunks_exact(2).map(|s| (s[0], s[1])).collect();
        let window = slots.iter().max().map_or(0, |&m| m + 1);
        let out = SharedPtr(buf.as_mut_ptr());
        cpu::par_ranges(p.batch * p.group * rows, ow * tw * per, |start, end| {
            let mut enc = vec![pad_bits; (cg + 1) * span];
            for u in start..end {
                let (bg, r) = (u / rows, u % rows);
                let (b, g) = (bg / p.group, bg % p.group);
                // Columns t0..t1 of the padded row hold input columns t - pad_begin.
                let t0 = (pad_begin.max(0) as usize).min(span);
                let t1 = ((pad_begin + iw as i64).max(0) as usize).clamp(t0, span);
                let s0 = (t0 as i64 - pad_begin) as usize;
                for (c, e) in enc.chunks_exact_mut(span).take(cg).enumerate() {
                    let src = &x[((b * p.in_channels + g * cg + c) * rows + r) * iw..][..iw];
                    e[..t0].fill(pad_bits);
                    e[t1..].fill(pad_bits);
                    for (e, &v) in e[t0..t1].iter_mut().zip(&src[s0..]) {
                        *e = encode(v);
                    }
                }
                // SAFETY: row r of image-and-group bg belongs to this task alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((bg * (img + 1) + r * ow) * tw), ow * tw) };
                if layout == Layout::Pairs {
                    for (ox, words) in dst.chunks_exact_mut(tw).enumerate() {
                        let at = &enc[ox * stride..ox * stride + window];
                        for (w, &(a, b)) in words.iter_mut().zip(&pairs) {
                            *w = at[a] | at[b] << 16;
                        }
                    }
                    continue;
                }
                // Quads are the bytes as stored: byte i of a pixel's words is the value at
                // slot i (an encoded quad value is its byte).
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
                for (ox, px) in bytes.chunks_exact_mut(tw * per).enumerate() {
                    let at = &enc[ox * stride..ox * stride + window];
                    for (b, &o) in px.iter_mut().zip(&slots) {
                        *b = at[o] as u8;
                    }
                }
            }
        });
    }

    /// Output channel block `blk` of image-and-group `bg` for pixel tiles `t0..t1`,
    /// with the epilogue.
    fn compute(&self, run: &Run, bg: usize, blk: usize, t0: usize, t1: usize, offs: &[u32]) {
        let p = &self.p;
        let (b, g) = (bg / p.group, bg % p.group);
        let mg = p.out_per_group();
        let (taps, tw) = (self.taps, self.tw);
        let wblock = self.w[((g * self.blocks + blk) * taps * tw) * CH..].as_ptr();
        // SAFETY: xs holds batch * group images of image_words words.
        let image = unsafe { run.xs.add(bg * run.image_words) };
        let m0 = g * mg + blk * CH;
        let mcount = CH.min(mg - blk * CH);
        let block = &run.blocks[g * self.blocks + blk];
        let shift = &block.shift;
        let requant = (self.epilogue == Epilogue::Requantize).then_some(block);
        let mut vals = [[0i32; CH]; PX];
        #[cfg(target_arch = "x86_64")]
        if let (Some(r), true, Int8Isa::Avx512Vnni) = (requant, self.channels_last.y, self.isa) {
            // Sums, requantization and store in one kernel, two tiles at a time (a last
            // lone tile is summed twice and stored once).
            let plane = p.geo.output_size();
            for tile in (t0..t1).step_by(2) {
                let to = offs[(tile - t0) * taps * PX..].as_ptr();
                let second = if tile + 1 < t1 { offs[(tile + 1 - t0) * taps * PX..].as_ptr() } else { to };
                let q0 = tile * PX;
                let count = (2 * PX).min(plane - q0).min((t1 - tile) * PX);
                // SAFETY: as below; the outputs are pixels q0..q0 + count, channels m0..m0 +
                // mcount, of image b: this task's.
                unsafe { int8_kernel::tile_vnni_pair_requantize(taps, tw, image, to, second, wblock, r, run.out.get().add((b * plane + q0) * p.out_channels + m0), p.out_channels, count, mcount) };
            }
            return;
        }
        let mut c = [0i32; 2 * PX * CH];
        let mut tile = t0;
        while tile < t1 {
            let to = offs[(tile - t0) * taps * PX..].as_ptr();
            let n = if self.isa.pairs_tiles() && tile + 1 < t1 { 2 } else { 1 };
            // SAFETY: to holds n * taps * PX offsets of tw words within image-and-group
            // bg's rows (input pixels or the padding row), the block holds taps * tw * CH
            // words, and the isa is available.
            unsafe {
                match n {
                    2 => self.isa.tile_pair(self.layout, taps, tw, image, to, to.add(taps * PX), wblock, &mut c),
                    _ => self.isa.tile(self.layout, taps, tw, image, to, wblock, int8_kernel::first_tile(&mut c)),
                }
            }
            for (i, sums) in c.chunks_exact(PX * CH).take(n).enumerate() {
                let sums: &[i32; PX * CH] = sums.try_into().expect("a tile");
                // SAFETY: the tile's pixels of channels m0..m0 + mcount of image b are this
                // task's own part of the output.
                unsafe { self.finish_tile(run, requant, sums, shift, &mut vals, b, m0, mcount, tile + i) };
            }
            tile += n;
        }
    }

    /// Adds the shift to (ConvInteger) or requantizes (QLinearConv) the sums `c` of pixel
    /// tile `tile` and stores them: channels `m0..m0 + mcount` of image `b`.
    ///
    /// # Safety
    /// Those outputs are the caller's alone.
    #[allow(clippy::too_many_arguments)]
    unsafe fn finish_tile(&self, run: &Run, requant: Option<&Requantize>, c: &[i32; PX * CH], shift: &[i32; CH], vals: &mut [[i32; CH]; PX], b: usize, m0: usize, mcount: usize, tile: usize) {
        let p = &self.p;
        let plane = p.geo.output_size();
        let q0 = tile * PX;
        let count = PX.min(plane - q0);
        if self.channels_last.y {
            return self.store_nhwc(run, requant, c, shift, vals, (b * plane + q0) * p.out_channels + m0, count, mcount);
        }
        let at = (b * p.out_channels + m0) * plane + q0;
        match requant {
            None => {
                let dst = run.out.get() as *mut i32;
                for l in 0..mcount {
                    for j in 0..count {
                        *dst.add(at + l * plane + j) = c[j * CH + l].wrapping_add(shift[l]);
                    }
                }
            }
            Some(r) => {
                r.tile(self.isa, c, vals);
                let dst = run.out.get();
                #[cfg(target_arch = "x86_64")]
                if count == PX && self.isa != Int8Isa::Portable {
                    int8_kernel::store_tile_avx2(vals, run.y_signed, dst.add(at), plane, mcount);
                    return;
                }
                for l in 0..mcount {
                    for (j, row) in vals.iter().enumerate().take(count) {
                        *dst.add(at + l * plane + j) = row[l] as u8;
                    }
                }
            }
        }
    }
}

impl PackedIntConv {
    /// Stores a tile's `count` pixels of `mcount` channels into a channels-last output
    /// from element `at` (the tile's first pixel, the block's first channel).
    ///
    /// # Safety
    /// Those elements of `run.out` are the caller's alone.
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_nhwc(&self, run: &Run, requant: Option<&Requantize>, c: &[i32; PX * CH], shift: &[i32; CH], vals: &mut [[i32; CH]; PX], at: usize, count: usize, mcount: usize) {
        let stride = self.p.out_channels;
        match requant {
            None => {
                let dst = run.out.get() as *mut i32;
                for j in 0..count {
                    for l in 0..mcount {
                        *dst.add(at + j * stride + l) = c[j * CH + l].wrapping_add(shift[l]);
                    }
                }
            }
            Some(r) => {
                #[cfg(target_arch = "x86_64")]
                if self.isa != Int8Isa::Portable {
                    int8_kernel::requantize_rows_avx2(r, c, run.y_signed, run.out.get().add(at), stride, count, mcount);
                    return;
                }
                r.tile(self.isa, c, vals);
                let dst = run.out.get();
                for (j, row) in vals.iter().enumerate().take(count) {
                    for (l, &v) in row.iter().enumerate().take(mcount) {
                        *dst.add(at + j * stride + l) = v as u8;
                    }
                }
            }
        }
    }
}

/// What a run of a prepared integer convolution (packed or depthwise) reads besides
/// x, after checking that x and y have the sizes the kernel was planned for (it
/// indexes them by the plan's geometry): x's zero point, then per output channel the
/// requantization multiplier `sx * sw[m] / sy` (f32, as the reference computes it;
/// none for ConvInteger), the output range less y's zero point with that zero point,
/// and the int32 bias.
#[allow(clippy::type_complexity)]
pub(super) fn run_params(p: &ConvProblem, epilogue: Epilogue, inputs: &[Option<&Tensor>], x: &Tensor, y: &Tensor) -> Result<(i32, Vec<f32>, (f32, f32, i32), Vec<i32>)> {
    let (xn, yn) = (p.batch * p.in_channels * p.geo.input_size(), p.batch * p.out_channels * p.geo.output_size());
    if x.len() != xn || y.len() != yn {
        return Err(OpError::input(0, format!("x of shape {:?} (output {:?}) differs from the planned convolution's {xn} input and {yn} output elements", x.dims(), y.dims())));
    }
    let zx = match inputs.get(2).copied().flatten() {
        Some(z) => qlinear::ints(z)?.first().copied().ok_or_else(|| OpError::input(2, "zero point has no element"))?,
        None => 0,
    };
    let channels = p.out_channels;
    let (mult, bounds) = match epilogue {
        Epilogue::Int32 => (vec![], (0.0, 0.0, 0)),
        Epilogue::Requantize => {
            let f = |i: usize| -> Result<Vec<f32>> { Ok(cpu::input(inputs, i)?.to_f64_vec().into_iter().map(|v| v as f32).collect()) };
            let one = |i: usize| -> Result<f32> { f(i)?.first().copied().ok_or_else(|| OpError::input(i, "scale or zero point has no element")) };
            let (sx, sw, sy, zy) = (one(1)?, f(4)?, one(6)?, one(7)?);
            if sw.len() != 1 && sw.len() != channels {
                return Err(OpError::input(4, format!("{} scales for {channels} output channels", sw.len())));
            }
            let (lo, hi) = crate::quant::range(y.dtype());
            let mult = (0..channels).map(|m| sx * sw[if sw.len() == 1 { 0 } else { m }] / sy).collect();
            (mult, (lo - zy, hi - zy, zy as i32))
        }
    };
    let bias = match (epilogue, inputs.get(8).copied().flatten()) {
        (Epilogue::Requantize, Some(b)) => {
            let b = b.as_slice::<i32>()?;
            if b.len() != channels {
                return Err(OpError::input(8, format!("bias of {} values for {channels} output channels", b.len())));
            }
            b.to_vec()
        }
        _ => vec![0; channels],
    };
    Ok((zx, mult, bounds, bias))
}

/// `geo` with its `fold` innermost filter columns folded into the channels: a window
/// one column wide, stride 1 and no padding along the width, over an input as wide as the
/// output (each of its pixels holds the input under every folded column).
fn folded(geo: &Geometry, fold: usize) -> Geometry {
    if fold == 1 {
        return geo.clone();
    }
    let mut g = geo.clone();
    g.input[2] = geo.output[2];
    g.kernel[2] = 1;
    g.stride[2] = 1;
    g.dilation[2] = 1;
    g.pad_begin[2] = 0;
    g.pad_end[2] = 0;
    g
}

/// The tap offsets of output pixel tiles `t0..t1` into one image and group of the
/// repacked input (`tw` words per pixel, the padding row after the last pixel):
/// `out[((tile - t0) * taps + tap) * PX + j]`. Pixels past the plane repeat the last one
/// (their sums are dropped).
fn tap_offsets(geo: &Geometry, taps: usize, tw: usize, t0: usize, t1: usize, out: &mut [u32]) {
    let [id, ih, iw] = geo.input;
    let [_, oh, ow] = geo.output;
    let [kd, kh, kw] = geo.kernel;
    let plane = geo.output_size();
    let pad = (geo.input_size() * tw) as u32;
    for (tile, slots) in out.chunks_exact_mut(taps * PX).take(t1 - t0).enumerate() {
        for j in 0..PX {
            let q = ((t0 + tile) * PX + j).min(plane - 1);
            let org = [
                ((q / (oh * ow)) * geo.stride[0]) as i64 - geo.pad_begin[0],
                (((q / ow) % oh) * geo.stride[1]) as i64 - geo.pad_begin[1],
                ((q % ow) * geo.stride[2]) as i64 - geo.pad_begin[2],
            ];
            let inside = |v: i64, n: usize| v >= 0 && (v as usize) < n;
            let mut t = 0;
            for a in 0..kd {
                let z = org[0] + (a * geo.dilation[0]) as i64;
                for bb in 0..kh {
                    let yy = org[1] + (bb * geo.dilation[1]) as i64;
                    for e in 0..kw {
                        let xx = org[2] + (e * geo.dilation[2]) as i64;
                        slots[t * PX + j] = if inside(z, id) && inside(yy, ih) && inside(xx, iw) { (((z as usize * ih + yy as usize) * iw + xx as usize) * tw) as u32 } else { pad };
                        t += 1;
                    }
                }
            }
        }
    }
}

/// The problem and fast-path inputs of an integer convolution: x (input `xi`), its
/// constant filters (`wi`) and their constant zero points (`zwi`, absent: 0).
fn constant_filters<'a>(conv: &super::conv::Conv, inputs: &[Option<crate::Arg<'a>>], [xi, wi, zwi]: [usize; 3], channels_last: ChannelsLast) -> Option<(ConvProblem, DType, &'a Tensor, Vec<i32>)> {
    let (x, w) = (inputs.get(xi).copied().flatten()?, inputs.get(wi).copied().flatten()?);
    let wv = w.value?;
    let zw = match inputs.get(zwi).copied().flatten() {
        Some(z) => qlinear::ints(z.value?).ok()?,
        None => vec![0],
    };
    let dims = if channels_last.x { super::qlinear_conv::channels_first(x.dims()).ok()? } else { x.dims().to_vec() };
    let p = conv.problem(&dims, w.dims()).ok()?;
    if p.batch * p.geo.output_size() == 0 || (zw.len() != 1 && zw.len() != p.out_channels) {
        return None;
    }
    Some((p, x.dtype(), wv, zw))
}

/// The tuning parameters of an integer convolution's fast kernel (inputs x, w, zw at
/// `idx`): the packed or the depthwise kernel's instruction set.
pub(super) fn tune_params(conv: &super::conv::Conv, inputs: &[Option<crate::Arg>], idx: [usize; 3], channels_last: ChannelsLast) -> Vec<TuneParam> {
    match constant_filters(conv, inputs, idx, channels_last) {
        Some((p, ..)) if channels_last.both() && DepthwiseNhwc::eligible(&p) => DepthwiseNhwc::params(),
        Some((p, ..)) if channels_last.neither() && DepthwiseIntConv::eligible(&p) => DepthwiseIntConv::params(),
        Some((p, ..)) if p.is_depthwise() => vec![],
        Some((p, dx, w, zw)) if eligible(&p) => params(quads_ok(dx, w, &zw)),
        _ => vec![],
    }
}

/// The fast kernel of an integer convolution with constant filters: the depthwise
/// kernel ([`super::qconv_depthwise`], channels-last [`super::qconv_depthwise_nhwc`]) or
/// the packed indirect GEMM (either layout); `None` leaves the op's direct kernel.
pub(super) fn prepare(conv: &super::conv::Conv, inputs: &[Option<crate::Arg>], idx: [usize; 3], epilogue: Epilogue, tune: &TuneValues, channels_last: ChannelsLast) -> Result<Option<Box<dyn CpuKernel>>> {
    let Some((p, dx, w, zw)) = constant_filters(conv, inputs, idx, channels_last) else { return Ok(None) };
    if channels_last.both() && DepthwiseNhwc::eligible(&p) {
        return Ok(Some(Box::new(DepthwiseNhwc::new(p, epilogue, dx, w, &zw, tune)?)));
    }
    if channels_last.neither() && DepthwiseIntConv::eligible(&p) {
        return Ok(Some(Box::new(DepthwiseIntConv::new(p, epilogue, dx, w, &zw, tune)?)));
    }
    // (A depthwise convolution changing layout keeps the reference.)
    if p.is_depthwise() {
        return Ok(None);
    }
    Ok(PackedIntConv::new(p, epilogue, dx, w, &zw, tune, channels_last)?.map(|k| Box::new(k) as Box<dyn CpuKernel>))
}
