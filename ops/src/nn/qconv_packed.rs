//! The fast CPU integer convolution of QLinearConv and ConvInteger, an indirect GEMM
//! on the micro-kernels of [`crate::linalg::int8_kernel`]:
//!
//! - the constant 8-bit filters are packed once per plan, per group, as blocks of
//!   [`CH`] output channels over (tap, input channel) with the channels innermost;
//! - each run first repacks the input from NCHW into pixel-major words (one pixel's
//!   input channels of a group side by side: pairs of `x - zx` as i16, or raw quads),
//!   so that a filter tap of a pixel reads one contiguous run of words, and one extra
//!   row stands for the padding;
//! - a tile of [`PX`] output pixels reads, per tap, the input pixel under it or the
//!   padding row, through pointers computed once per chunk of pixels (no im2col
//!   buffer; a 1x1 convolution is the plain GEMM of the same path);
//! - int32 sums are exact, and the epilogue is fused: ConvInteger stores the sums,
//!   QLinearConv adds the bias and requantizes `(acc + B) * (sx * sw[m] / sy)` in f32,
//!   rounded half to even around y's zero point, exactly as [`super::qlinear_conv`]'s
//!   reference does.
//!
//! Zero points: the pairs layout subtracts them while widening to i16; the quads layout
//! (VNNI) keeps the activations' and folds `zx * sum_k w[m][k]` out of each sum
//! (filters must be signed with a zero zero point there). Depthwise and narrow groups
//! (fewer than 4 outputs per group) keep the op's direct kernel.
use super::conv_cpu::ConvProblem;
use crate::cpu::{self, CpuKernel};
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
/// Pixel tiles per chunk: the pixels whose tap pointers are computed together.
const TILES_PER_CHUNK: usize = 8;

/// Filters packed for one instruction set.
pub(super) struct PackedIntConv {
    p: ConvProblem,
    isa: Int8Isa,
    layout: Layout,
    epilogue: Epilogue,
    /// Filter taps (kernel positions).
    taps: usize,
    /// Words per tap: a group's input channels, padded to the layout's word.
    tw: usize,
    /// Blocks of [`CH`] output channels per group.
    blocks: usize,
    /// `[group][blocks][taps * tw][CH]` words.
    w: Vec<u32>,
    /// Per output channel: the filter's sum (quads only: folds x's zero point out).
    row_sums: Vec<i32>,
    x_signed: bool,
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
    pub(super) fn new(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], tune: &TuneValues) -> Result<Option<PackedIntConv>> {
        if !eligible(&p) {
            return Ok(None);
        }
        let quads = quads_ok(x, w, zw);
        let (isa, layout) = int8_kernel::chosen(tune, quads);
        Self::with_isa(p, epilogue, x, w, zw, isa, layout).map(Some)
    }

    /// Packs for a given instruction set and layout (the portable kernel runs both).
    fn with_isa(p: ConvProblem, epilogue: Epilogue, x: DType, w: &Tensor, zw: &[i32], isa: Int8Isa, layout: Layout) -> Result<PackedIntConv> {
        let (mg, cg, taps) = (p.out_per_group(), p.in_per_group(), p.geo.kernel_size());
        let wv = qlinear::ints(w)?;
        if wv.len() != p.out_channels * cg * taps || (zw.len() != 1 && zw.len() != p.out_channels) {
            return Err(OpError::Invalid(format!("filters of {} values and {} zero points for {} output channels", wv.len(), zw.len(), p.out_channels)));
        }
        let zero = |m: usize| zw[if zw.len() == 1 { 0 } else { m }];
        let mut packed = Vec::new();
        for g in 0..p.group {
            let m0 = g * mg;
            packed.extend(pack_constant(layout, mg, taps, cg, |col, t, i| wv[((m0 + col) * cg + i) * taps + t], |col| zero(m0 + col)));
        }
        let row_sums = wv.chunks(cg * taps).map(|r| r.iter().sum()).collect();
        Ok(PackedIntConv {
            taps,
            tw: cg.div_ceil(layout.per_word()),
            blocks: mg.div_ceil(CH),
            w: packed,
            row_sums,
            x_signed: x == DType::I8,
            p,
            isa,
            layout,
            epilogue,
            scratch: Mutex::new(Vec::new()),
        })
    }
}

thread_local! {
    /// A chunk's tap pointers (as addresses).
    static TAPS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A raw pointer shared by the tasks, each writing disjoint elements.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The pointer (a method, so that closures capture the whole `Shared`).
    fn get(self) -> *mut T {
        self.0
    }
}

/// What a run's tasks share.
struct Run<'a> {
    /// The repacked input: `[batch][group][input pixels][tw]` words, then the padding row.
    xs: *const u32,
    pad: *const u32,
    /// Per output channel: added to each sum (bias, minus the zero-point fold).
    shift: &'a [i32],
    /// Per output channel: the requantization multiplier (QLinearConv only).
    mult: &'a [f32],
    /// The output range less y's zero point, and y's zero point.
    bounds: (f32, f32, i32),
    out: Shared<u8>,
}
unsafe impl Send for Run<'_> {}
unsafe impl Sync for Run<'_> {}

impl CpuKernel for PackedIntConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let zx = match inputs.get(2).copied().flatten() {
            Some(z) => qlinear::ints(z)?.first().copied().ok_or_else(|| OpError::input(2, "zero point has no element"))?,
            None => 0,
        };
        let p = &self.p;
        let y = &mut outputs[0];
        let (mult, bounds) = match self.epilogue {
            Epilogue::Int32 => (vec![], (0.0, 0.0, 0)),
            Epilogue::Requantize => {
                let f = |i: usize| -> Result<Vec<f32>> { Ok(cpu::input(inputs, i)?.to_f64_vec().into_iter().map(|v| v as f32).collect()) };
                let one = |i: usize| -> Result<f32> { f(i)?.first().copied().ok_or_else(|| OpError::input(i, "scale or zero point has no element")) };
                let (sx, sw, sy, zy) = (one(1)?, f(4)?, one(6)?, one(7)?);
                if sw.len() != 1 && sw.len() != p.out_channels {
                    return Err(OpError::input(4, format!("{} scales for {} output channels", sw.len(), p.out_channels)));
                }
                let (lo, hi) = crate::quant::range(y.dtype());
                let mult = (0..p.out_channels).map(|m| sx * sw[if sw.len() == 1 { 0 } else { m }] / sy).collect();
                (mult, (lo - zy, hi - zy, zy as i32))
            }
        };
        let bias: Vec<i32> = match (self.epilogue, inputs.get(8).copied().flatten()) {
            (Epilogue::Requantize, Some(b)) => b.as_slice::<i32>()?.to_vec(),
            _ => vec![0; p.out_channels],
        };
        let fold = self.layout == Layout::Quads;
        let shift: Vec<i32> = (0..p.out_channels).map(|m| bias[m].wrapping_sub(if fold { zx.wrapping_mul(self.row_sums[m]) } else { 0 })).collect();

        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.pack_input(x.bytes(), zx, &mut scratch);
        let xs = scratch.as_ptr();
        // SAFETY: the padding row is the last tw words of the scratch.
        let run = Run { xs, pad: unsafe { xs.add(scratch.len() - self.tw) }, shift: &shift, mult: &mult, bounds, out: Shared(y.bytes_mut().as_mut_ptr()) };

        let tiles = p.geo.output_size().div_ceil(PX);
        let chunks = tiles.div_ceil(TILES_PER_CHUNK);
        let per_chunk = tiles.div_ceil(chunks.max(1));
        let units = p.batch * p.group * chunks * self.blocks;
        let work = per_chunk * PX * self.taps * self.tw * CH;
        cpu::par_ranges(units, work, |start, end| {
            TAPS.with(|cell| {
                let ptrs = &mut *cell.borrow_mut();
                // Consecutive units of one chunk share its pointers.
                let mut key = None;
                for u in start..end {
                    let (bgc, blk) = (u / self.blocks, u % self.blocks);
                    let (bg, chunk) = (bgc / chunks, bgc % chunks);
                    let t0 = chunk * per_chunk;
                    let t1 = (t0 + per_chunk).min(tiles);
                    if key != Some((bg, t0)) {
                        self.tap_pointers(&run, bg, t0, t1, ptrs);
                        key = Some((bg, t0));
                    }
                    self.compute(&run, bg, blk, t0, t1, ptrs);
                }
            })
        });
        Ok(())
    }
}

impl PackedIntConv {
    /// Repacks x (NCHW) into `[batch][group][pixel][tw]` words plus the padding row:
    /// pairs of `x - zx` (the padding row 0), or quads of raw bytes (padding `zx`).
    fn pack_input(&self, x: &[u8], zx: i32, buf: &mut Vec<u32>) {
        let p = &self.p;
        let (img, tw, cg) = (p.geo.input_size(), self.tw, p.in_per_group());
        let rows = p.batch * p.group * img;
        buf.resize(rows * tw + tw, 0);
        let (layout, per, signed) = (self.layout, self.layout.per_word(), self.x_signed);
        let pad = layout.word(std::iter::empty(), zx, zx);
        buf[rows * tw..].fill(pad);
        const BLOCK: usize = 256;
        let blocks = img.div_ceil(BLOCK);
        let out = Shared(buf.as_mut_ptr());
        cpu::par_ranges(p.batch * p.group * blocks, BLOCK * tw, |start, end| {
            for u in start..end {
                let (bg, blk) = (u / blocks, u % blocks);
                let (b, g) = (bg / p.group, bg % p.group);
                let (p0, p1) = (blk * BLOCK, ((blk + 1) * BLOCK).min(img));
                // SAFETY: rows bg * img + p0..p1 belong to this task alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((bg * img + p0) * tw), (p1 - p0) * tw) };
                let plane = |c: usize| -> Option<&[u8]> { (c < cg).then(|| &x[((b * p.in_channels + g * cg + c) * img + p0)..][..p1 - p0]) };
                for k in 0..tw {
                    let chans: Vec<Option<&[u8]>> = (0..per).map(|i| plane(k * per + i)).collect();
                    match layout {
                        Layout::Pairs => {
                            let v = |r: Option<&[u8]>, i: usize| r.map_or(0, |r| if signed { r[i] as i8 as i32 } else { r[i] as i32 } - zx);
                            for (i, d) in dst.chunks_exact_mut(tw).enumerate() {
                                d[k] = (v(chans[0], i) as u16 as u32) | ((v(chans[1], i) as u16 as u32) << 16);
                            }
                        }
                        Layout::Quads => {
                            for (i, d) in dst.chunks_exact_mut(tw).enumerate() {
                                d[k] = (0..4).fold(0, |acc, q| acc | (chans[q].map_or(0, |r| r[i] as u32) << (8 * q)));
                            }
                        }
                    }
                }
            }
        });
    }

    /// The tap pointers of pixel tiles `t0..t1` of image-and-group `bg`:
    /// `[tile][tap][PX]` addresses into the repacked input (or the padding row).
    fn tap_pointers(&self, run: &Run, bg: usize, t0: usize, t1: usize, ptrs: &mut Vec<usize>) {
        let geo = &self.p.geo;
        let [id, ih, iw] = geo.input;
        let [_, oh, ow] = geo.output;
        let [kd, kh, kw] = geo.kernel;
        let plane = geo.output_size();
        let tw = self.tw;
        let base = run.xs as usize + bg * geo.input_size() * tw * 4;
        let pad = run.pad as usize;
        ptrs.clear();
        ptrs.resize((t1 - t0) * self.taps * PX, pad);
        for (tile, slots) in ptrs.chunks_exact_mut(self.taps * PX).enumerate() {
            let q0 = (t0 + tile) * PX;
            for j in 0..PX {
                // Pixels past the plane repeat the last one (their sums are dropped).
                let q = (q0 + j).min(plane - 1);
                let org = [
                    ((q / (oh * ow)) * geo.stride[0]) as i64 - geo.pad_begin[0],
                    (((q / ow) % oh) * geo.stride[1]) as i64 - geo.pad_begin[1],
                    ((q % ow) * geo.stride[2]) as i64 - geo.pad_begin[2],
                ];
                let mut t = 0;
                for a in 0..kd {
                    let z = org[0] + (a * geo.dilation[0]) as i64;
                    for bb in 0..kh {
                        let yy = org[1] + (bb * geo.dilation[1]) as i64;
                        for e in 0..kw {
                            let xx = org[2] + (e * geo.dilation[2]) as i64;
                            if z >= 0 && yy >= 0 && xx >= 0 && (z as usize) < id && (yy as usize) < ih && (xx as usize) < iw {
                                slots[t * PX + j] = base + (((z as usize * ih + yy as usize) * iw + xx as usize) * tw) * 4;
                            }
                            t += 1;
                        }
                    }
                }
            }
        }
    }

    /// Output channel block `blk` of image-and-group `bg` for pixel tiles `t0..t1`,
    /// with the epilogue.
    fn compute(&self, run: &Run, bg: usize, blk: usize, t0: usize, t1: usize, ptrs: &[usize]) {
        let p = &self.p;
        let (b, g) = (bg / p.group, bg % p.group);
        let (mg, plane) = (p.out_per_group(), p.geo.output_size());
        let (taps, tw) = (self.taps, self.tw);
        let wblock = self.w[((g * self.blocks + blk) * taps * tw) * CH..].as_ptr();
        let m0 = g * mg + blk * CH;
        let mcount = CH.min(mg - blk * CH);
        let mut c = [0i32; PX * CH];
        let mut shift = [0i32; CH];
        shift[..mcount].copy_from_slice(&run.shift[m0..m0 + mcount]);
        let requant = (self.epilogue == Epilogue::Requantize).then(|| {
            let mut mult = [0f32; CH];
            mult[..mcount].copy_from_slice(&run.mult[m0..m0 + mcount]);
            let (lo, hi, zy) = run.bounds;
            Requantize { shift, mult, lo, hi, zy }
        });
        let mut vals = [[0i32; CH]; PX];
        for tile in t0..t1 {
            let tp = ptrs[(tile - t0) * taps * PX..].as_ptr() as *const *const u32;
            // SAFETY: tp holds taps * PX pointers to tw readable words (input rows or the
            // padding row), the block holds taps * tw * CH words, and the isa is available.
            unsafe { self.isa.tile(self.layout, taps, tw, tp, wblock, &mut c) };
            let q0 = tile * PX;
            let count = PX.min(plane - q0);
            let at = (b * p.out_channels + m0) * plane + q0;
            // SAFETY: channels m0..m0 + mcount at pixels q0..q0 + count of image b are this
            // task's own part of the output.
            unsafe {
                match &requant {
                    None => {
                        let dst = run.out.get() as *mut i32;
                        for l in 0..mcount {
                            for j in 0..count {
                                *dst.add(at + l * plane + j) = c[j * CH + l].wrapping_add(shift[l]);
                            }
                        }
                    }
                    Some(r) => {
                        r.tile(self.isa, &c, &mut vals);
                        let dst = run.out.get();
                        for l in 0..mcount {
                            for (j, row) in vals.iter().enumerate().take(count) {
                                *dst.add(at + l * plane + j) = row[l] as u8;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The problem and packed-path inputs of an integer convolution: x (input `xi`), its
/// constant filters (`wi`) and their constant zero points (`zwi`, absent: 0).
pub(super) fn packable<'a>(conv: &super::conv::Conv, inputs: &[Option<crate::Arg<'a>>], xi: usize, wi: usize, zwi: usize) -> Option<(ConvProblem, DType, &'a Tensor, Vec<i32>)> {
    let (x, w) = (inputs.get(xi).copied().flatten()?, inputs.get(wi).copied().flatten()?);
    let wv = w.value?;
    let zw = match inputs.get(zwi).copied().flatten() {
        Some(z) => qlinear::ints(z.value?).ok()?,
        None => vec![0],
    };
    let p = conv.problem(x.dims(), w.dims()).ok()?;
    if p.batch * p.geo.output_size() == 0 || !eligible(&p) || (zw.len() != 1 && zw.len() != p.out_channels) {
        return None;
    }
    Some((p, x.dtype(), wv, zw))
}
