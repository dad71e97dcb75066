//! The fast CPU integer convolution of QLinearConv and ConvInteger: constant 8-bit
//! filters packed once per plan for the micro-kernels of [`crate::linalg::int8_kernel`]
//! (per group, rows padded to the tile height), the input read through im2col one
//! 16-pixel panel at a time into per-thread scratch (no whole im2col buffer; a 1x1
//! convolution is the plain GEMM of the same path), int32 sums exact, and the epilogue
//! fused: ConvInteger stores the sums, QLinearConv adds the bias and requantizes
//! `(acc + B) * (sx * sw[m] / sy)` in f32, rounded half to even around y's zero point,
//! exactly as [`super::qlinear_conv`]'s reference does.
//!
//! Zero points: the pairs layout subtracts them while widening to i16; the quads layout
//! (VNNI) keeps the activations' and folds `zx * sum_k w[m][k]` out of each sum
//! (filters must be signed with a zero zero point there). Depthwise and narrow groups
//! (fewer than 4 outputs per group) keep the op's direct kernel.
use super::conv_cpu::ConvProblem;
use crate::cpu::{self, CpuKernel};
use crate::linalg::int8_kernel::{pack_row, Int8Isa, Layout, MR, NR};
use crate::quant::qlinear;
use crate::{OpError, Result, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};
use std::cell::RefCell;

/// Which op's epilogue runs, and where its inputs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Epilogue {
    /// ConvInteger: int32 sums; x's zero point is input 2.
    Int32,
    /// QLinearConv: inputs x, sx, zx, w, sw, zw, sy, zy, [bias].
    Requantize,
}

/// Filters packed for one instruction set.
pub(super) struct PackedIntConv {
    p: ConvProblem,
    isa: Int8Isa,
    epilogue: Epilogue,
    /// Output channels per group, padded to a multiple of [`MR`].
    mgp: usize,
    /// Words per packed row (k padded to the layout's word).
    kw: usize,
    /// `[group][mgp][kw]` words.
    a: Vec<u32>,
    /// Per output channel: the filter's sum (quads only: folds x's zero point out).
    row_sums: Vec<i32>,
    x_signed: bool,
}

/// The instruction-set parameter; VNNI only where its layout fits the operands.
pub(super) fn params(quads_ok: bool) -> Vec<TuneParam> {
    let isas: Vec<u32> = Int8Isa::available().into_iter().filter(|i| quads_ok || i.layout() != Layout::Quads).map(Int8Isa::code).collect();
    vec![TuneParam { name: "isa", default: isas[0], candidates: isas }]
}

/// Whether this problem takes the packed path.
pub(super) fn eligible(p: &ConvProblem) -> bool {
    p.out_per_group() >= MR && !p.is_depthwise() && p.reduction() > 0
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
        let isa = Int8Isa::from_code(tune.get(&params(quads)[0])).unwrap_or(Int8Isa::Portable);
        let layout = isa.layout();
        let (mg, k) = (p.out_per_group(), p.reduction());
        let mgp = mg.div_ceil(MR) * MR;
        let kw = k.div_ceil(layout.per_word());
        let wv = qlinear::ints(w)?;
        let mut a = vec![0u32; p.group * mgp * kw];
        let mut row_sums = vec![0i32; p.out_channels];
        for m in 0..p.out_channels {
            let (g, r) = (m / mg, m % mg);
            let row = &wv[m * k..(m + 1) * k];
            let z = zw[if zw.len() == 1 { 0 } else { m }];
            let at = (g * mgp + r) * kw;
            pack_row(layout, row, z, &mut a[at..at + kw]);
            row_sums[m] = row.iter().sum();
        }
        Ok(Some(PackedIntConv { p, isa, epilogue, mgp, kw, a, row_sums, x_signed: x == DType::I8 }))
    }
}

thread_local! {
    static PANEL: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The requantization of one output channel: `acc` (bias and folds added) times `mult`,
/// clamped to `[lo - zy, hi - zy]`, rounded half to even, plus `zy`.
#[derive(Clone, Copy)]
struct Requant {
    mult: f32,
    lo: f32,
    hi: f32,
    zy: f32,
}

/// 1.5 * 2^23: adding and subtracting it rounds an f32 below 2^22 half to even.
const ROUND: f32 = 12582912.0;

impl Requant {
    #[inline(always)]
    fn apply(self, acc: i32) -> i32 {
        // Clamping before rounding gives the same result as after: the bounds are integers.
        let v = (acc as f32 * self.mult).clamp(self.lo, self.hi);
        ((v + ROUND) - ROUND + self.zy) as i32
    }
}

/// A raw output pointer shared by the tasks, each writing disjoint elements.
#[derive(Clone, Copy)]
struct Out(*mut u8);
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl CpuKernel for PackedIntConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let zx = match inputs.get(2).copied().flatten() {
            Some(z) => qlinear::ints(z)?.first().copied().ok_or_else(|| OpError::input(2, "zero point has no element"))?,
            None => 0,
        };
        let p = &self.p;
        let y = &mut outputs[0];
        let requant: Vec<Requant> = match self.epilogue {
            Epilogue::Int32 => vec![],
            Epilogue::Requantize => {
                let f = |i: usize| -> Result<Vec<f32>> { Ok(cpu::input(inputs, i)?.to_f64_vec().into_iter().map(|v| v as f32).collect()) };
                let (sx, sw, sy) = (f(1)?[0], f(4)?, f(6)?[0]);
                let zy = f(7)?[0];
                let (lo, hi) = crate::quant::range(y.dtype());
                (0..p.out_channels).map(|m| Requant { mult: sx * sw[if sw.len() == 1 { 0 } else { m }] / sy, lo: lo - zy, hi: hi - zy, zy }).collect()
            }
        };
        let bias: Vec<i32> = match (self.epilogue, inputs.get(8).copied().flatten()) {
            (Epilogue::Requantize, Some(b)) => b.as_slice::<i32>()?.to_vec(),
            _ => vec![0; p.out_channels],
        };
        let xv: &[u8] = x.bytes();
        let plane = p.geo.output_size();
        let blocks = plane.div_ceil(NR);
        let tasks = p.batch * p.group * blocks;
        let elem = if self.epilogue == Epilogue::Int32 { 4 } else { 1 };
        let out = Out(y.bytes_mut().as_mut_ptr());
        let work = self.mgp * self.kw * NR;
        cpu::par_ranges(tasks, work, |start, end| {
            PANEL.with(|panel| {
                let mut panel = panel.borrow_mut();
                if panel.len() < self.kw * NR {
                    panel.resize(self.kw * NR, 0);
                }
                for t in start..end {
                    let (b, g, blk) = (t / (p.group * blocks), (t / blocks) % p.group, t % blocks);
                    let p0 = blk * NR;
                    let count = NR.min(plane - p0);
                    self.pack_panel(xv, b, g, p0, count, zx, &mut panel);
                    self.gemm_panel(&panel, b, g, p0, count, zx, &bias, &requant, out, elem);
                }
            })
        });
        Ok(())
    }
}

impl PackedIntConv {
    /// im2col of output pixels `p0..p0 + count` of image `b`, group `g` into `panel`
    /// (`[kw][NR]` words); out-of-image taps and pixels past `count` read x's zero point
    /// (0 once subtracted in the pairs layout).
    #[allow(clippy::too_many_arguments)]
    fn pack_panel(&self, x: &[u8], b: usize, g: usize, p0: usize, count: usize, zx: i32, panel: &mut [u32]) {
        let p = &self.p;
        let geo = &p.geo;
        let [id, ih, iw] = geo.input;
        let [_, oh, ow] = geo.output;
        let [kd, kh, kwid] = geo.kernel;
        let cg = p.in_per_group();
        let img = id * ih * iw;
        let base = (b * p.in_channels + g * cg) * img;
        // Each pixel's window origin.
        let mut org = [[0i64; 3]; NR];
        for (j, o) in org.iter_mut().enumerate().take(count) {
            let q = p0 + j;
            let (oz, oy, ox) = (q / (oh * ow), (q / ow) % oh, q % ow);
            *o = [
                (oz * geo.stride[0]) as i64 - geo.pad_begin[0],
                (oy * geo.stride[1]) as i64 - geo.pad_begin[1],
                (ox * geo.stride[2]) as i64 - geo.pad_begin[2],
            ];
        }
        let span = |d: usize| ((geo.kernel[d] - 1) * geo.dilation[d]) as i64;
        let interior = count == NR
            && org.iter().all(|o| o[0] >= 0 && o[1] >= 0 && o[2] >= 0 && o[0] + span(0) < id as i64 && o[1] + span(1) < ih as i64 && o[2] + span(2) < iw as i64);
        let start: Vec<usize> = if interior { org.iter().map(|o| (o[0] as usize * ih + o[1] as usize) * iw + o[2] as usize).collect() } else { vec![] };
        let (layout, per) = (self.isa.layout(), self.isa.layout().per_word());
        let pad = zx;
        let signed = self.x_signed;
        let value = |byte: u8| if signed { byte as i8 as i32 } else { byte as i32 };
        let k = p.reduction();
        let mut col = [0i32; NR];
        panel[..self.kw * NR].fill(0);
        for kk in 0..k {
            let (c, r) = (kk / (kd * kh * kwid), kk % (kd * kh * kwid));
            let (a, bb, e) = (r / (kh * kwid), (r / kwid) % kh, r % kwid);
            let off = [(a * geo.dilation[0]) as i64, (bb * geo.dilation[1]) as i64, (e * geo.dilation[2]) as i64];
            let cbase = base + c * img;
            if interior {
                let o = ((off[0] as usize) * ih + off[1] as usize) * iw + off[2] as usize;
                for j in 0..NR {
                    col[j] = value(x[cbase + start[j] + o]);
                }
            } else {
                for j in 0..NR {
                    col[j] = pad;
                    if j >= count {
                        continue;
                    }
                    let (z, yy, xx) = (org[j][0] + off[0], org[j][1] + off[1], org[j][2] + off[2]);
                    if z >= 0 && yy >= 0 && xx >= 0 && z < id as i64 && yy < ih as i64 && xx < iw as i64 {
                        col[j] = value(x[cbase + (z as usize * ih + yy as usize) * iw + xx as usize]);
                    }
                }
            }
            let (w, slot) = (kk / per, kk % per);
            let row = &mut panel[w * NR..(w + 1) * NR];
            match layout {
                Layout::Pairs => {
                    for (o, &v) in row.iter_mut().zip(&col) {
                        *o |= ((v - zx) as i16 as u16 as u32) << (16 * slot);
                    }
                }
                Layout::Quads => {
                    for (o, &v) in row.iter_mut().zip(&col) {
                        *o |= (v as u8 as u32) << (8 * slot);
                    }
                }
            }
        }
    }

    /// Every output channel of group `g` for one packed panel, with the epilogue.
    #[allow(clippy::too_many_arguments)]
    fn gemm_panel(&self, panel: &[u32], b: usize, g: usize, p0: usize, count: usize, zx: i32, bias: &[i32], requant: &[Requant], out: Out, elem: usize) {
        let p = &self.p;
        let (mg, plane) = (p.out_per_group(), p.geo.output_size());
        let fold = self.isa.layout() == Layout::Quads;
        let mut c = [0i32; MR * NR];
        for mt in (0..mg).step_by(MR) {
            let a = self.a[(g * self.mgp + mt) * self.kw..].as_ptr();
            // SAFETY: rows mt..mt + MR of group g exist (mgp is a multiple of MR), the
            // panel holds kw * NR words, and the isa was taken from `available`.
            unsafe { self.isa.tile(self.kw, a, self.kw, panel.as_ptr(), &mut c) };
            for r in 0..MR.min(mg - mt) {
                let m = g * mg + mt + r;
                let shift = bias[m] - if fold { zx.wrapping_mul(self.row_sums[m]) } else { 0 };
                let row = &c[r * NR..r * NR + count];
                let at = (b * p.out_channels + m) * plane + p0;
                // SAFETY: (b, m, p0..p0 + count) is this task's own part of the output.
                unsafe {
                    if elem == 4 {
                        let dst = std::slice::from_raw_parts_mut((out.0 as *mut i32).add(at), count);
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d = v.wrapping_add(shift);
                        }
                    } else {
                        let q = requant[m];
                        let dst = std::slice::from_raw_parts_mut(out.0.add(at), count);
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d = q.apply(v.wrapping_add(shift)) as u8;
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
