//! Conv on the CPU with its filters packed once per plan: the GEMM of
//! [`crate::linalg::packed`] with the filters as its packed operand and the input read
//! through im2col one reduction slice at a time (straight from the input for 1x1
//! convolutions), so no whole im2col buffer is built and no weight is repacked per run.
//!
//! Its choices (algorithm, instruction set, block sizes) are [`CpuKernel::params`] of
//! Conv, for the tuner; the defaults are what this file picks by shape.
use super::conv::Conv;
use super::conv_cpu::{im2col_row, ConvProblem, SharedOut};
use super::conv_flipped::{self, FlippedFilters};
use super::conv_winograd::{self, WinogradFilters};
use super::window::Geometry;
use crate::cpu::{self, CpuKernel};
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::Isa;
use crate::linalg::packed::{BRows, Blocking, MatrixRows, PackedA, PackedGemm};
use crate::{Result, TuneParam, TuneValues};
use kiln_graph::Tensor;

/// Conv's CPU algorithms (the `algo` parameter): the direct kernels of `conv_cpu`, the
/// packed GEMM here, Winograd (`conv_winograd`), the transposed GEMM (`conv_flipped`).
pub(crate) const ALGO_DIRECT: u32 = 0;
pub(crate) const ALGO_PACKED: u32 = 1;
pub(crate) const ALGO_WINOGRAD: u32 = 2;
pub(crate) const ALGO_FLIPPED: u32 = 3;
/// The flipped GEMM reading the padded input in place (2-D convolutions; the default
/// for some stride-1 ones, a tuner candidate for strided ones).
pub(crate) const ALGO_FLIPPED_DIRECT: u32 = 4;

/// Whether a problem can take the packed path: f32 with constant weights, not
/// depthwise (which has its own per-plane kernel).
pub(crate) fn eligible(p: &ConvProblem) -> bool {
    !p.is_depthwise() && p.out_per_group() >= 4
}

/// The tunable parameters of a packed-eligible convolution, defaults by shape.
pub(crate) fn params(p: &ConvProblem) -> Vec<TuneParam> {
    let isa = Isa::best();
    let threads = cpu::threads();
    let d = default_blocking(p, isa, threads);
    let mut algos = vec![ALGO_DIRECT, ALGO_PACKED];
    // Defaults from measurements on AVX-512 machines (the tuner measures the rest):
    // the packed GEMM where output rows are long (its im2col works row by row) and the
    // reduction too long for the direct small-reduction kernel, the direct kernels
    // elsewhere.
    let long_rows = p.geo.output[2] >= 128 && p.reduction() > super::conv_small_k::MAX_REDUCTION;
    let mut algo = if long_rows { ALGO_PACKED } else { ALGO_DIRECT };
    let mut out = vec![];
    if conv_flipped::applies(p) {
        algos.push(ALGO_FLIPPED);
        // Small planes (7x7) with long reductions: channels along the vector lanes.
        if p.geo.output_size() <= 64 && p.out_channels >= 64 && p.reduction() > super::conv_small_k::MAX_REDUCTION {
            algo = ALGO_FLIPPED;
        }
    }
    if conv_flipped::direct_applies(p) {
        algos.push(ALGO_FLIPPED_DIRECT);
        // Where the im2col + gemm-crate kernels would run: it reads the input in place
        // (squeezenet's 16->64 3x3 at 55x55: 0.60 against 0.72 ms on one thread).
        // Strided ones measured no better (their phase copy costs what im2col does).
        let unit_stride = p.geo.stride.iter().all(|&s| s == 1);
        if algo == ALGO_DIRECT && unit_stride && p.reduction() > super::conv_small_k::MAX_REDUCTION && p.geo.output_size() >= 256 {
            algo = ALGO_FLIPPED_DIRECT;
        }
    }
    if conv_winograd::applies(p) {
        algos.push(ALGO_WINOGRAD);
        // Winograd pays where enough channels amortise its transforms and the output
        // has no half-empty edge tiles.
        let [_, oh, ow] = p.geo.output;
        if p.in_channels >= 64 && p.out_channels >= 16 && oh * ow >= 144 && oh % 2 == 0 && ow % 2 == 0 {
            algo = ALGO_WINOGRAD;
        }
        let block = conv_winograd::default_block(p, isa, threads) as u32;
        out.push(TuneParam { name: "tiles", default: block, candidates: vec![16, 32, 64, 128, 256] });
    }
    out.splice(0..0, [
        TuneParam { name: "algo", default: algo, candidates: algos },
        TuneParam { name: "isa", default: isa.code(), candidates: Isa::available().into_iter().map(Isa::code).collect() },
        TuneParam { name: "kc", default: d.kc as u32, candidates: vec![64, 128, 256, 512] },
        TuneParam { name: "nc", default: d.nc as u32, candidates: vec![64, 128, 256, 512, 1024] },
        TuneParam { name: "mc", default: d.mc as u32, candidates: vec![48, 96, 192, 384, 768] },
    ]);
    out
}

/// Block sizes by shape: a B slice of `kc x NR` floats fills about half of L1, and
/// the blocks (over all images and groups) are cut so that the busiest thread's share,
/// padding to whole register tiles included, is smallest; ties go to fewer blocks, and
/// blocks of more than 512 pixels cost a little extra (their B slices leave L2).
fn default_blocking(p: &ConvProblem, isa: Isa, threads: usize) -> Blocking {
    let (mr, nr) = (isa.mr(), isa.nr());
    let (m, n, k) = (p.out_per_group(), p.geo.output_size(), p.reduction());
    let planes = (p.batch * p.group).max(1);
    let kc = (8192 / nr).min(k.max(1));
    let threads = threads.max(1);
    let mut best = (f64::MAX, m.next_multiple_of(mr), n.max(1));
    for nb in 1..=n.div_ceil(nr).clamp(1, 64) {
        let nc = n.div_ceil(nb).next_multiple_of(nr);
        for mb in 1..=m.div_ceil(mr).clamp(1, 8) {
            let mc = m.div_ceil(mb).next_multiple_of(mr);
            let blocks = planes * n.div_ceil(nc) * m.div_ceil(mc);
            let rounds = blocks.div_ceil(threads) as f64;
            let penalty = if nc > 512 { 1.1 } else { 1.0 };
            let cost = rounds * (mc * nc) as f64 * penalty * (1.0 + 0.002 * blocks as f64);
            if cost < best.0 {
                best = (cost, mc, nc.min(n.max(1)));
            }
        }
    }
    Blocking { kc, mc: best.1, nc: best.2 }
}

/// The Conv kernel a plan runs when a packed algorithm is chosen.
pub(crate) struct PackedConv {
    conv: Conv,
    problem: ConvProblem,
    algo: Packed,
}

enum Packed {
    /// One packed filter matrix (out channels x reduction) per group.
    Gemm { filters: Vec<PackedA>, blocking: Blocking },
    Winograd(WinogradFilters),
    Flipped(FlippedFilters),
}

impl PackedConv {
    /// Packs the filters `w` (`[M, C/group, k..]`, f32) for `tune`'s choices; `None`
    /// when the choices say the direct algorithm.
    pub(crate) fn new(conv: &Conv, p: ConvProblem, w: &[f32], tune: &TuneValues) -> Option<PackedConv> {
        let ps = params(&p);
        let get = |name: &str| ps.iter().find(|t| t.name == name).map(|t| tune.get(t)).unwrap_or(0);
        let isa = Isa::from_code(get("isa")).unwrap_or_else(Isa::best);
        let algo = match get("algo") {
            ALGO_PACKED => {
                let blocking = Blocking { kc: get("kc") as usize, mc: get("mc") as usize, nc: get("nc") as usize };
                let (mg, kc) = (p.out_per_group(), p.reduction());
                let filters = (0..p.group).map(|g| PackedA::pack(isa, &w[g * mg * kc..][..mg * kc], mg, kc)).collect();
                Packed::Gemm { filters, blocking }
            }
            ALGO_FLIPPED if conv_flipped::applies(&p) => Packed::Flipped(FlippedFilters::new(&p, w, isa, get("kc") as usize, cpu::threads())),
            ALGO_FLIPPED_DIRECT if conv_flipped::direct_applies(&p) => Packed::Flipped(FlippedFilters::direct(&p, w, isa, get("kc") as usize, cpu::threads())),
            ALGO_WINOGRAD if conv_winograd::applies(&p) => Packed::Winograd(WinogradFilters::new(&p, w, isa, get("tiles") as usize, get("kc") as usize)),
            _ => return None,
        };
        Some(PackedConv { conv: conv.clone(), problem: p, algo })
    }

    /// `y = act([y +] conv(x) + bias)` (`y` holds the residual when the conv has one).
    pub(crate) fn run_f32(&self, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        match &self.algo {
            Packed::Gemm { filters, blocking } => self.run_gemm(filters, *blocking, x, bias, act, residual, y),
            Packed::Winograd(u) => u.run(&self.problem, x, bias, act, residual, y),
            Packed::Flipped(f) => f.run(&self.problem, x, bias, act, residual, y),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_gemm(&self, filters: &[PackedA], blocking: Blocking, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let p = &self.problem;
        let (cg, mg) = (p.in_per_group(), p.out_per_group());
        let (in_size, out_size) = (p.geo.input_size(), p.geo.output_size());
        let pointwise = p.is_pointwise();
        // Every group's filters have the same shape: one block grid.
        let (mb, nb) = PackedGemm::new(&filters[0], out_size, blocking).blocks();
        let per_plane = mb * nb;
        let tasks = p.batch * p.group * per_plane;
        let out = SharedOut(y.as_mut_ptr());
        let run_task = |t: usize| {
            let (plane, rest) = (t / per_plane, t % per_plane);
            let (img, g) = (plane / p.group, plane % p.group);
            let (ni, mi) = (rest / mb, rest % mb);
            let xg = &x[(img * p.in_channels + g * cg) * in_size..][..cg * in_size];
            let epilogue = |row: usize, vals: &mut [f32]| {
                if let Some(b) = bias {
                    let v = b[g * mg + row];
                    vals.iter_mut().for_each(|o| *o += v);
                }
                if let Some(k) = act {
                    k.apply_slice_f32_fast(vals);
                }
            };
            let gemm = PackedGemm::new(&filters[g], out_size, blocking);
            // SAFETY: task (img, g, mi, ni) owns block (mi, ni) of output rows
            // [g*mg, (g+1)*mg) of image img, which lies within y.
            unsafe {
                let c = out.ptr().add((img * p.out_channels + g * mg) * out_size);
                if pointwise {
                    gemm.run_block(mi, ni, &MatrixRows { data: xg, ld: in_size }, c, out_size, residual, &epilogue);
                } else {
                    let rows = Im2colRows { geo: &p.geo, x: xg, plane: in_size };
                    gemm.run_block(mi, ni, &rows, c, out_size, residual, &epilogue);
                }
            }
        };
        let flops = 2 * p.macs() as usize;
        // Serial for one task or one thread (`par_ranges` decides).
        cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
    }
}

impl CpuKernel for PackedConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        self.conv.compute_packed(inputs, false, &mut outputs[0], self)
    }

    fn in_place_inputs(&self, inputs: &[Option<&crate::TensorType>], output: &crate::TensorType) -> Vec<usize> {
        self.conv.in_place_inputs(inputs, output)
    }

    fn run_in_place(&self, inputs: &[Option<&Tensor>], i: usize, outputs: &mut [Tensor]) -> Result<()> {
        self.conv.check_in_place(i)?;
        self.conv.compute_packed(inputs, true, &mut outputs[0], self)
    }
}

impl PackedConv {
    /// The input shape the filters were packed for.
    pub(crate) fn problem(&self) -> &ConvProblem {
        &self.problem
    }
}

/// The rows of one group's im2col matrix: row `(c, kd, kh, kw)`.
struct Im2colRows<'a> {
    geo: &'a Geometry,
    x: &'a [f32],
    plane: usize,
}

impl BRows for Im2colRows<'_> {
    fn row(&self, k: usize, n0: usize, dst: &mut [f32]) {
        let [_, kh_n, kw_n] = self.geo.kernel;
        let taps = self.geo.kernel_size();
        let (c, t) = (k / taps, k % taps);
        let tap = [t / (kh_n * kw_n), (t / kw_n) % kh_n, t % kw_n];
        im2col_row(self.geo, &self.x[c * self.plane..][..self.plane], tap, n0, dst);
    }
}
