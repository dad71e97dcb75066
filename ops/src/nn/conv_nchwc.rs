//! Conv in the channel-blocked layout (`[N, C/8, H, W, 8]`: eight channels per pixel,
//! "NCHW8c"), which the compiler's `layout-nchwc` pass keeps between consecutive CPU
//! convolutions so that no layer transposes its results into planes and back.
//!
//! `kiln.ConvNchwc` takes Conv's attributes (its fused bias, residual and activation
//! included) plus `kiln_input_blocked`: 1 when X is blocked, 0 when X is plain NCHW (the
//! first convolution of a chain reads its input as it is). Y, and a fused residual, are
//! blocked, with output channels a multiple of 8. 2-D only, f32 only, CPU only.
//!
//! Kernels: an ungrouped convolution is the flipped direct GEMM of `conv_flipped` (the
//! micro-kernel's vector lanes along output channels, its broadcast rows along pixels
//! read in place from the padded input, eight floats apart when it is blocked) storing
//! its tiles as blocks, without a transpose, or, for a 3x3 stride-1 one over a blocked
//! input with enough tiles per thread, Winograd F(4x4, 3x3) (`conv_nchwc_winograd`); a
//! depthwise one (blocked input) slides eight lanes of taps over a zero-padded copy of
//! each block (`blocked8`).
use super::blocked8::{self, MAX_TAPS};
use super::conv::{check_bias, Conv};
use super::conv_cpu::{ConvProblem, SharedOut};
use super::conv_flipped::{FlippedFilters, Layout, STRIP_FLOATS};
use super::conv_nchwc_winograd::{self as winograd, WinogradNchwc};
use super::nchwc_reorder::BLOCK;
use crate::cpu::{self, CpuKernel};
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::Isa;
use crate::op::{expect_dtype, required};
use crate::wgsl::{TuneParam, WgslKernel};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// The attribute that says X is blocked.
pub const INPUT_BLOCKED_ATTR: &str = "kiln_input_blocked";

#[derive(Clone, Debug)]
pub struct ConvNchwc {
    conv: Conv,
    input_blocked: bool,
}

impl ConvNchwc {
    fn parse(spec: &NodeSpec) -> Result<ConvNchwc> {
        Ok(ConvNchwc { conv: Conv::parse(spec)?, input_blocked: spec.int(INPUT_BLOCKED_ATTR, 0)? != 0 })
    }

    /// Checks the shapes and resolves the problem over X's logical NCHW dims.
    fn problem(&self, x: &[usize], w: &[usize]) -> Result<ConvProblem> {
        let logical = if self.input_blocked {
            if x.len() != 5 || x[4] != BLOCK {
                return Err(OpError::input(0, format!("expected a blocked input [N, C/{BLOCK}, H, W, {BLOCK}], found {x:?}")));
            }
            vec![x[0], x[1] * BLOCK, x[2], x[3]]
        } else {
            if x.len() != 4 {
                return Err(OpError::input(0, format!("expected an NCHW input [N, C, H, W], found {x:?}")));
            }
            x.to_vec()
        };
        let p = self.conv.problem(&logical, w)?;
        if p.out_channels % BLOCK != 0 {
            return Err(OpError::input(1, format!("{} output channels are not a multiple of {BLOCK}", p.out_channels)));
        }
        let depthwise = p.is_depthwise() && p.out_channels == p.in_channels && self.input_blocked;
        if p.group != 1 && !depthwise {
            return Err(OpError::Unsupported(format!("a blocked Conv is ungrouped or depthwise over a blocked input, not group {}", p.group)));
        }
        Ok(p)
    }

    /// Computes Y through `kernel` (built from W for this run when None); with a fused
    /// residual, `y` holds it already when `residual_in_y`.
    fn compute(&self, inputs: &[Option<&Tensor>], residual_in_y: bool, y: &mut Tensor, kernel: Option<&Kernel>) -> Result<()> {
        let (x, w) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let bias = inputs.get(2).copied().flatten();
        let p = self.problem(x.dims(), w.dims())?;
        check_bias(bias, p.out_channels)?;
        if y.is_empty() {
            return Ok(());
        }
        if self.conv.residual && !residual_in_y {
            let r = cpu::input(inputs, 3)?;
            if r.dtype() != y.dtype() || r.dims() != y.dims() {
                return Err(OpError::input(3, format!("a fused residual must be {} {:?}, got {} {:?}", y.dtype(), y.dims(), r.dtype(), r.dims())));
            }
            y.bytes_mut().copy_from_slice(r.bytes());
        }
        let built;
        let kernel = match kernel {
            Some(k) if k.problem == p => k,
            Some(k) => return Err(OpError::input(0, format!("the filters were prepared for {:?}, not for input {:?}", k.problem, x.dims()))),
            None => {
                // Filters that change between runs: the direct form (Winograd's filter
                // transform would be paid on every run).
                let direct = TuneValues([("algo".to_string(), ALGO_DIRECT)].into_iter().collect());
                built = Kernel::new(&p, w.as_slice()?, self.input_blocked, &direct);
                &built
            }
        };
        let b = bias.map(|b| b.as_slice::<f32>()).transpose()?;
        kernel.run(x.as_slice()?, b, self.conv.activation, self.conv.residual, y.as_mut_slice()?);
        Ok(())
    }

    fn check_in_place(&self, i: usize) -> Result<()> {
        if i != 3 || !self.conv.residual {
            return Err(OpError::Unsupported(format!("ConvNchwc runs in place of a fused residual (input 3) only, not of input {i}")));
        }
        Ok(())
    }
}

impl Op for ConvNchwc {
    fn name(&self) -> &str {
        "ConvNchwc"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let (x, w) = (required(inputs, 0)?, required(inputs, 1)?);
        if w.dtype() != DType::F32 {
            return Err(OpError::input(1, format!("dtype {} differs from the input's f32", w.dtype())));
        }
        if w.dims().len() != 4 {
            return Err(OpError::input(1, format!("a blocked Conv is 2-D: expected [M, C/group, kH, kW] weights, found {:?}", w.dims())));
        }
        let p = self.problem(x.dims(), w.dims())?;
        if let Some(b) = inputs.get(2).copied().flatten() {
            if b.dims() != [p.out_channels] || b.dtype() != DType::F32 {
                return Err(OpError::input(2, format!("bias must be f32[{}], found {}", p.out_channels, b.ty)));
            }
        }
        let [_, oh, ow] = p.geo.output;
        let dims = vec![p.batch, p.out_channels / BLOCK, oh, ow, BLOCK];
        if self.conv.residual {
            let r = required(inputs, 3)?;
            if r.dtype() != DType::F32 || r.dims() != dims.as_slice() {
                return Err(OpError::input(3, format!("a fused residual must have the output's type f32 {dims:?}, found {}", r.ty)));
            }
        }
        Ok(vec![TensorType::new(DType::F32, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let flops = match (inputs.first().copied().flatten(), inputs.get(1).copied().flatten()) {
            (Some(x), Some(w)) => self.problem(x.dims(), w.dims()).map_or(0, |p| 2 * p.macs()),
            _ => 0,
        };
        Cost { flops, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for ConvNchwc {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        self.compute(inputs, false, &mut outputs[0], None)
    }

    fn in_place_inputs(&self, inputs: &[Option<&TensorType>], output: &TensorType) -> Vec<usize> {
        match inputs.get(3).copied().flatten() {
            Some(r) if self.conv.residual && r == output => vec![3],
            _ => vec![],
        }
    }

    fn run_in_place(&self, inputs: &[Option<&Tensor>], i: usize, outputs: &mut [Tensor]) -> Result<()> {
        self.check_in_place(i)?;
        self.compute(inputs, true, &mut outputs[0], None)
    }

    /// The instruction set; for a dense convolution also the algorithm where Winograd
    /// applies, and the block sizes of the default algorithm only (the tuner tries the
    /// other algorithm at its default sizes: a size the running algorithm ignores would
    /// be measured as noise, and a noise winner stored).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        let Some(p) = self.constant_problem(inputs) else { return vec![] };
        if p.group == 1 {
            let isa = Isa::best();
            let algo = default_algo(&p, self.input_blocked);
            let mut params = vec![TuneParam { name: "isa", default: isa.code(), candidates: Isa::available().into_iter().map(Isa::code).collect() }];
            if winograd::applies(&p, self.input_blocked) {
                params.push(TuneParam { name: "algo", default: algo, candidates: vec![ALGO_DIRECT, ALGO_WINOGRAD] });
            }
            if algo == ALGO_WINOGRAD {
                params.push(TuneParam { name: "tiles", default: winograd::default_tiles(&p, isa, cpu::threads()) as u32, candidates: TILES_CANDIDATES.to_vec() });
            } else {
                params.push(strip_param(&p, isa));
                params.push(kslice_param(&p));
            }
            params
        } else {
            let isas = depthwise_isas(&p).into_iter().map(Isa::code).collect();
            vec![TuneParam { name: "isa", default: depthwise_isa(&p).code(), candidates: isas }]
        }
    }

    /// Packs the constant filters once per plan.
    fn prepare(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        if outputs.iter().any(|o| o.dims.contains(&0)) {
            return Ok(None);
        }
        let Some(p) = self.constant_problem(inputs) else { return Ok(None) };
        let w = inputs[1].and_then(|a| a.value).expect("constant_problem checked the weights");
        let kernel = Kernel::new(&p, w.as_slice()?, self.input_blocked, tune);
        Ok(Some(Box::new(Prepared { op: self.clone(), kernel })))
    }
}

impl ConvNchwc {
    /// The problem, when the weights are constant.
    fn constant_problem(&self, inputs: &[Option<Arg>]) -> Option<ConvProblem> {
        let (x, w) = (inputs.first().copied().flatten()?, inputs.get(1).copied().flatten()?);
        w.value?;
        self.problem(x.dims(), w.dims()).ok()
    }
}

/// The Winograd form's blocks of tiles a tuner tries (see `winograd::default_tiles`).
pub(super) const TILES_CANDIDATES: [u32; 5] = [8, 16, 32, 64, 128];

/// The dense form's strip sizes a tuner tries (input floats; see [`STRIP_FLOATS`]):
/// 16 KiB to 1 MiB, then a whole image per strip.
const STRIP_CANDIDATES: [u32; 8] = [4096, 8192, 16384, 32768, 65536, 131072, 262144, WHOLE_IMAGE_STRIP as u32];

/// A strip size larger than any image: one strip per image.
const WHOLE_IMAGE_STRIP: usize = 1 << 30;

/// The dense form's reduction slices a tuner tries (steps; 0: the whole reduction per
/// tile; see `FlippedFilters::kslice`), those shorter than the reduction.
const KSLICE_CANDIDATES: [u32; 5] = [0, 72, 144, 288, 576];

/// The reduction slice where the tuner has not chosen one, on Intel cores: equal slices
/// of at most 144 steps (144: 16 input channels of a 3x3 filter, 18 KiB of a 32-channel
/// panel, which stays in L1), since their tiles measured 20% faster with the filters in
/// L1 than streamed from L2; a reduction shorter than two slices runs whole (a slice
/// costs a pass over the tile's sums: a ResNet stem's 147 steps cut 144 + 3 ran 20%
/// slower). Elsewhere the whole reduction (AMD Zen 4 and 5 measured it as fast or
/// faster).
fn default_kslice(p: &ConvProblem) -> u32 {
    const MAX: usize = 144;
    let k = p.reduction();
    if !crate::cpu::CpuFeatures::get().intel || k < 2 * MAX {
        return 0;
    }
    k.div_ceil(k.div_ceil(MAX)) as u32
}

/// The dense form's strip where the tuner has not chosen one: the whole image where its
/// input is at most [`WHOLE_IMAGE_FLOATS`], so that every panel's filters stream once
/// per image (MobileNetV2's 7x7 layers, 1.2 MB of filters over 180 KiB of input:
/// 1.15-1.3x faster alone, about 8% inside the model; magika's 5x1 layer, 2.6 MB over
/// 512 KiB: 1.08x inside the model), else
/// [`STRIP_FLOATS`], whose strips stay in L2 while every panel reads them.
fn default_strip(p: &ConvProblem) -> usize {
    let image = p.in_channels * p.geo.input_size();
    if image <= WHOLE_IMAGE_FLOATS { WHOLE_IMAGE_STRIP } else { STRIP_FLOATS }
}

/// The largest input image (floats) [`default_strip`] takes whole: 512 KiB, half the
/// smallest L2 of the x86 cores measured (1 MiB on AMD Zen 4 and 5).
const WHOLE_IMAGE_FLOATS: usize = 131072;

/// The strip sizes that make different strips (tiles per strip) for `isa`'s tiles,
/// the default first among those of its size.
fn strip_param(p: &ConvProblem, isa: Isa) -> TuneParam {
    let default = default_strip(p) as u32;
    let mr = isa.mr();
    let tiles = p.geo.output_size().div_ceil(mr).max(1);
    let per_strip = |s: u32| (s as usize / (p.in_channels * mr).max(1)).clamp(1, tiles);
    let mut seen = vec![per_strip(default)];
    let mut candidates = vec![default];
    for s in STRIP_CANDIDATES {
        if !seen.contains(&per_strip(s)) {
            seen.push(per_strip(s));
            candidates.push(s);
        }
    }
    TuneParam { name: "strip", default, candidates }
}

fn kslice_param(p: &ConvProblem) -> TuneParam {
    let default = default_kslice(p);
    let mut candidates: Vec<u32> = KSLICE_CANDIDATES.into_iter().filter(|&s| (s as usize) < p.reduction()).collect();
    if !candidates.contains(&default) {
        candidates.push(default);
    }
    TuneParam { name: "kslice", default, candidates }
}

/// The dense form's algorithms: the direct flipped GEMM, or Winograd F(4x4, 3x3).
const ALGO_DIRECT: u32 = 0;
const ALGO_WINOGRAD: u32 = 1;

/// The dense form's algorithm where the tuner has not chosen one: Winograd where it
/// applies, at least half of its tiles' outputs are inside the image, each thread gets
/// at least eight tiles, and the transformed filters (four times the plain ones; each
/// thread passes over them once per block, from memory inside a model) come to at most
/// 128 KiB per tile of a thread. Measured on an Intel Xeon with AVX-512, two threads
/// (`scripts/bench_conv_algos.py`, and per node inside ResNet-18 and SqueezeNet):
/// 56x56 and 28x28 at 32-128 channels 1.8-2.2x faster (at most 100 KiB per tile);
/// 48 -> 192 at 13x13 (160 KiB) 1.4x faster alone, no faster inside SqueezeNet; 64 -> 256 at
/// 13x13 (300 KiB) and 256 channels at 14x14 (1.2 MiB) faster alone but slower inside
/// the models; 512 at 7x7 1.9x slower even alone.
fn default_algo(p: &ConvProblem, input_blocked: bool) -> u32 {
    if !winograd::applies(p, input_blocked) || p.in_channels < 16 {
        return ALGO_DIRECT;
    }
    let [_, oh, ow] = p.geo.output;
    let tiles = oh.div_ceil(4) * ow.div_ceil(4);
    let whole = (oh * ow) as f64 / (16 * tiles) as f64;
    let per_thread = p.batch * tiles / cpu::threads().max(1);
    let filters = 36 * p.in_channels * p.out_channels * 4;
    if whole >= 0.5 && per_thread >= 8 && filters <= per_thread * (128 << 10) {
        ALGO_WINOGRAD
    } else {
        ALGO_DIRECT
    }
}

/// The prepared filters of one problem.
struct Kernel {
    problem: ConvProblem,
    form: Form,
}

enum Form {
    Dense(FlippedFilters),
    Winograd(WinogradNchwc),
    /// Depthwise: per block, per tap, eight weights; the instruction set.
    Depthwise { w: cpu::AlignedF32, isa: Isa },
}

impl Kernel {
    fn new(p: &ConvProblem, w: &[f32], input_blocked: bool, tune: &TuneValues) -> Kernel {
        let get = |name: &str, default: u32| tune.0.get(name).copied().unwrap_or(default);
        let best = Isa::best();
        let winograd = winograd::applies(p, input_blocked) && get("algo", default_algo(p, input_blocked)) == ALGO_WINOGRAD;
        let form = if winograd {
            let isa = Isa::from_code(get("isa", best.code())).unwrap_or(best);
            let tiles = get("tiles", winograd::default_tiles(p, isa, cpu::threads()) as u32) as usize;
            Form::Winograd(WinogradNchwc::new(p, w, isa, tiles))
        } else if p.group == 1 {
            let isa = Isa::from_code(get("isa", best.code())).unwrap_or(best);
            let strip = get("strip", default_strip(p) as u32) as usize;
            let kslice = get("kslice", default_kslice(p)) as usize;
            let filters = FlippedFilters::direct_in(p, w, isa, p.reduction(), cpu::threads(), Layout { in_blocked: input_blocked, out_blocked: true });
            Form::Dense(filters.with_strip(strip).with_kslice(kslice))
        } else {
            let taps = p.geo.kernel_size();
            let mut packed = vec![0f32; p.out_channels * taps];
            for c in 0..p.out_channels {
                for t in 0..taps {
                    packed[((c / BLOCK) * taps + t) * BLOCK + c % BLOCK] = w[c * taps + t];
                }
            }
            // A choice this CPU or shape cannot take (an artifact tuned elsewhere) falls
            // back to the default.
            let isa = Isa::from_code(get("isa", depthwise_isa(p).code())).filter(|i| depthwise_isas(p).contains(i)).unwrap_or(depthwise_isa(p));
            Form::Depthwise { w: cpu::AlignedF32::from_vec(packed), isa }
        };
        Kernel { problem: p.clone(), form }
    }

    /// `y = act([y +] conv(x) + bias)`, Y blocked.
    fn run(&self, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let p = &self.problem;
        match &self.form {
            Form::Dense(f) => f.run(p, x, bias, act, residual, y),
            Form::Winograd(f) => f.run(p, x, bias, act, residual, y),
            Form::Depthwise { w, isa } => depthwise(p, x, w, *isa, bias, act, residual, y),
        }
    }
}

/// The instruction sets the depthwise form can use for `p`, best first: AVX-512 pairs
/// two neighbouring pixels per register, so only where the window moves one pixel.
fn depthwise_isas(p: &ConvProblem) -> Vec<Isa> {
    let taps_fit = p.geo.kernel_size() <= MAX_TAPS;
    Isa::available()
        .into_iter()
        .filter(|&i| match i {
            Isa::Avx512 => taps_fit && p.geo.stride[2] == 1,
            Isa::Avx2 => taps_fit,
            Isa::Portable => true,
        })
        .collect()
}

/// The default depthwise instruction set.
fn depthwise_isa(p: &ConvProblem) -> Isa {
    depthwise_isas(p)[0]
}

/// Padded input floats per band of a depthwise block (192 KiB: the band stays in L2;
/// whole 240x320 blocks ran 1.7x slower than the NCHW kernel).
const BAND_FLOATS: usize = 48 * 1024;

/// The depthwise form: one task per image, channel block and band of output rows.
#[allow(clippy::too_many_arguments)]
fn depthwise(p: &ConvProblem, x: &[f32], w: &[f32], isa: Isa, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
    let g = &p.geo;
    let (ipx, opx, taps) = (g.input_size(), g.output_size(), g.kernel_size());
    let [_, oh_n, ow_n] = g.output;
    // Output rows per band: as many as keep the band's padded rows within BAND_FLOATS.
    let wp = blocked8::padded(g).1;
    let span = (g.kernel[1] - 1) * g.dilation[1] + 1;
    let rows_in = BAND_FLOATS / (BLOCK * wp);
    let band = if rows_in > span { ((rows_in - span) / g.stride[1] + 1).min(oh_n) } else { 1 };
    let bands = oh_n.div_ceil(band);
    let blocks = p.out_channels / BLOCK;
    let out = SharedOut(y.as_mut_ptr());
    let clamp = super::conv_small_k::as_clamp(act);
    // AVX-512 reads the block in place: no padded copy.
    let in_place = isa == Isa::Avx512;
    #[cfg(target_arch = "x86_64")]
    let masks = if in_place { pair_masks(g) } else { PairMasks::default() };
    cpu::par_ranges(p.batch * blocks * bands, 2 * band * ow_n * taps * BLOCK, |a, b| {
        for t in a..b {
            let (u, bd) = (t / bands, t % bands);
            let cb = u % blocks;
            let (r0, r1) = (bd * band, ((bd + 1) * band).min(oh_n));
            // The band as a window of its own: its output rows, the pad above it shifted.
            let mut gb = g.clone();
            gb.output[1] = r1 - r0;
            gb.pad_begin[1] -= (r0 * g.stride[1]) as i64;
            let (hp, wp) = blocked8::padded(&gb);
            let copy = if in_place { 0 } else { BLOCK * hp * wp };
            let len = (r1 - r0) * ow_n * BLOCK;
            let xb = &x[u * ipx * BLOCK..][..ipx * BLOCK];
            let wb = &w[cb * taps * BLOCK..][..taps * BLOCK];
            let bb: [f32; BLOCK] = std::array::from_fn(|l| bias.map_or(0.0, |b| b[cb * BLOCK + l]));
            // SAFETY: rows r0..r1 of unit u's output block are written by this task only.
            let yb = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(u * opx * BLOCK + r0 * ow_n * BLOCK), len) };
            cpu::with_scratch(copy + if residual { len } else { 0 }, |s| {
                let (xs, os) = s.split_at_mut(copy);
                let mut window = |clamp: Option<(f32, f32)>, os: &mut [f32]| {
                    #[cfg(target_arch = "x86_64")]
                    if in_place {
                        // SAFETY: `depthwise_isas` offers AVX-512 only where the CPU has
                        // it, the window has at most MAX_TAPS taps and moves one pixel.
                        return unsafe { in_place_avx512(&gb, xb, wb, &bb, clamp, &masks, os) };
                    }
                    blocked8::load_blocked(&gb, xb, xs, 0.0);
                    slide(&gb, xs, wb, &bb, isa, clamp, os);
                };
                if residual {
                    window(None, os);
                    yb.iter_mut().zip(os.iter()).for_each(|(o, v)| *o += v);
                    if let Some(a) = act {
                        a.apply_slice_f32_fast(yb);
                    }
                } else {
                    // A Relu/Clip is applied in registers, other activations after.
                    window(clamp, yb);
                    if let (Some(a), None) = (act, clamp) {
                        a.apply_slice_f32_fast(yb);
                    }
                }
            });
        }
    });
}

/// One block's depthwise window: `os[pixel][l] = bias[l] + sum over taps of w * x`,
/// clamped to `clamp` (`max` then `min`: a NaN stays NaN).
fn slide(g: &super::window::Geometry, xs: &[f32], w: &[f32], bias: &[f32; BLOCK], isa: Isa, clamp: Option<(f32, f32)>, os: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: `depthwise_isas` offers these only where the CPU has them (AVX-512
        // implies AVX2 + FMA) and the window has at most MAX_TAPS taps.
        Isa::Avx2 | Isa::Avx512 => return unsafe { slide_avx2(g, xs, w, bias, clamp, os) },
        Isa::Portable => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    let [_, oh_n, ow_n] = g.output;
    let [_, _, kw_n] = g.kernel;
    let wp = blocked8::padded(g).1;
    for oh in 0..oh_n {
        for ow in 0..ow_n {
            let mut acc = *bias;
            for (t, wt) in w.chunks_exact(BLOCK).enumerate() {
                let (r, c) = (oh * g.stride[1] + (t / kw_n) * g.dilation[1], ow * g.stride[2] + (t % kw_n) * g.dilation[2]);
                let xv = &xs[(r * wp + c) * BLOCK..][..BLOCK];
                for l in 0..BLOCK {
                    acc[l] += wt[l] * xv[l];
                }
            }
            if let Some((lo, hi)) = clamp {
                for v in &mut acc {
                    *v = if v.is_nan() { *v } else { v.max(lo).min(hi) };
                }
            }
            os[(oh * ow_n + ow) * BLOCK..][..BLOCK].copy_from_slice(&acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn slide_avx2(g: &super::window::Geometry, xs: &[f32], w: &[f32], bias: &[f32; BLOCK], clamp: Option<(f32, f32)>, os: &mut [f32]) {
    use std::arch::x86_64::*;
    let taps = g.kernel_size();
    let mut wv = [_mm256_setzero_ps(); MAX_TAPS];
    for (t, v) in wv.iter_mut().enumerate().take(taps) {
        *v = _mm256_loadu_ps(w.as_ptr().add(t * BLOCK));
    }
    let (lo, hi) = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
    let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    // max/min return their second operand when either is NaN: NaN stays NaN.
    let finish = |v| if clamp.is_some() { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) } else { v };
    blocked8::slide(g, xs, blocked8::padded(g).1, os, _mm256_loadu_ps(bias.as_ptr()), |acc, t, v| _mm256_fmadd_ps(wv[t], v, acc), finish);
}

/// Lane masks for reading pixel pairs in place: for tap column `kw` and pair `c`
/// (output pixels `2c`, `2c + 1`), `m[kw * cols + c]` has the low eight lanes set when
/// the first pixel's input lies inside the row and the high eight for the second;
/// pairs `interior.0..interior.1` read inside the row at every tap.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct PairMasks {
    m: Vec<u16>,
    interior: (usize, usize),
}

#[cfg(target_arch = "x86_64")]
fn pair_masks(g: &super::window::Geometry) -> PairMasks {
    let (iw, kw_n) = (g.input[2] as i64, g.kernel[2]);
    let cols = g.output[2].div_ceil(2);
    let inside = |j: i64| (0..iw).contains(&j);
    let mut m = vec![0u16; kw_n * cols];
    for kw in 0..kw_n {
        for c in 0..cols {
            let j = (2 * c + kw * g.dilation[2]) as i64 - g.pad_begin[2];
            m[kw * cols + c] = if inside(j) { 0x00ff } else { 0 } | if inside(j + 1) { 0xff00 } else { 0 };
        }
    }
    let full = |c: usize| (0..kw_n).all(|kw| m[kw * cols + c] == 0xffff);
    let lo = (0..cols).find(|&c| full(c)).unwrap_or(cols);
    let hi = (lo..cols).find(|&c| !full(c)).unwrap_or(cols);
    PairMasks { m, interior: (lo, hi) }
}

/// The taps of one output row whose input row exists: weights (the block's eight twice,
/// one copy per pixel of a pair), offsets in floats from the block's start to the
/// input of pair 0 (negative left of the row), and tap columns. Only the first `n`
/// entries are written: a task on a 7x7 plane computes less than zeroing the whole
/// arrays would cost.
#[cfg(target_arch = "x86_64")]
struct RowTaps {
    taps: [std::mem::MaybeUninit<(std::arch::x86_64::__m512, isize, usize)>; MAX_TAPS],
    n: usize,
}

#[cfg(target_arch = "x86_64")]
impl RowTaps {
    fn new() -> RowTaps {
        RowTaps { taps: [const { std::mem::MaybeUninit::uninit() }; MAX_TAPS], n: 0 }
    }

    fn push(&mut self, w: std::arch::x86_64::__m512, off: isize, kw: usize) {
        self.taps[self.n].write((w, off, kw));
        self.n += 1;
    }

    /// Tap `j < n`: its weights, offset and column.
    #[inline(always)]
    fn get(&self, j: usize) -> (std::arch::x86_64::__m512, isize, usize) {
        assert!(j < self.n);
        // SAFETY: entries below `n` were written by `push`.
        unsafe { self.taps[j].assume_init() }
    }
}

/// What the tiles of one block share: the bias, the bounds, the masks.
#[cfg(target_arch = "x86_64")]
struct Pairs<'a> {
    bias: std::arch::x86_64::__m512,
    bounds: Option<(std::arch::x86_64::__m512, std::arch::x86_64::__m512)>,
    masks: &'a [u16],
    cols: usize,
}

/// A stride-1 depthwise window with AVX-512, read in place from the unpadded block `x`
/// (`[row][col][8]` of `g.input`) into `os` (`[oh][ow][8]`): two neighbouring output
/// pixels per register (their inputs are neighbours too), up to eight registers of
/// sums at a time so that the FMAs' latency hides, rows four registers wide or less
/// two at a time. Taps whose input row lies in the pad are left out of a row; the
/// pairs near the row's ends load under lane masks, which read nothing in the pad.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA; `g.stride[2] == 1`, `g.kernel_size() <= MAX_TAPS`,
/// `masks` is [`pair_masks`] of `g`, `x` holds the block, `os` the output rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn in_place_avx512(g: &super::window::Geometry, x: &[f32], w: &[f32], bias: &[f32; BLOCK], clamp: Option<(f32, f32)>, masks: &PairMasks, os: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(g.stride[2], 1);
    let [_, ih_n, iw_n] = g.input;
    let [_, oh_n, ow_n] = g.output;
    let [_, kh_n, kw_n] = g.kernel;
    let (sh, dh, dw) = (g.stride[1], g.dilation[1], g.dilation[2]);
    let (top, left) = (g.pad_begin[1], g.pad_begin[2] as isize);
    // Eight floats loaded twice into one register.
    let pair = |p: *const f32| _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
    let k = Pairs { bias: pair(bias.as_ptr()), bounds: clamp.map(|(lo, hi)| (_mm512_set1_ps(lo), _mm512_set1_ps(hi))), masks: &masks.m, cols: ow_n.div_ceil(2) };
    let cols = k.cols;
    let tail: __mmask16 = if ow_n % 2 == 1 { 0x00ff } else { 0xffff };
    // Chunks of pairs per row: as even as eight registers a row allow (four with two rows).
    let wide = |r: usize| if r == 2 { 4 } else { 8 };
    let ih = |oh: usize, kh: usize| (oh * sh + kh * dh) as i64 - top;
    let full_row = |oh: usize| (0..kh_n).all(|kh| (0..ih_n as i64).contains(&ih(oh, kh)));
    let row_floats = (iw_n * BLOCK) as isize;
    // A row's taps, offsets relative to the input row of its tap row 0: every tap (one
    // list for all the rows whose tap rows all lie inside the input), or with `clip`
    // only those whose input row exists.
    let taps_of = |rt: &mut RowTaps, oh: usize, clip: bool| {
        rt.n = 0;
        for kh in 0..kh_n {
            let r = ih(oh, kh);
            if clip && !(0..ih_n as i64).contains(&r) {
                continue;
            }
            for kw in 0..kw_n {
                rt.push(pair(w.as_ptr().add((kh * kw_n + kw) * BLOCK)), (kh * dh) as isize * row_floats + ((kw * dw) as isize - left) * BLOCK as isize, kw);
            }
        }
    };
    let (mut full, mut clipped) = (RowTaps::new(), RowTaps::new());
    taps_of(&mut full, 0, false);
    let (lo, hi) = masks.interior;
    let mut oh = 0;
    while oh < oh_n {
        let rows = if cols <= 4 && oh + 1 < oh_n && full_row(oh) && full_row(oh + 1) { 2 } else { 1 };
        let rt = if full_row(oh) {
            &full
        } else {
            taps_of(&mut clipped, oh, true);
            &clipped
        };
        let top_row = (oh * sh) as isize - top as isize;
        let src = x.as_ptr().wrapping_offset(top_row * row_floats);
        let src = [src, src.wrapping_add(sh * iw_n * BLOCK)];
        let dst = os.as_mut_ptr().add(oh * ow_n * BLOCK);
        let dst = [dst, dst.wrapping_add(ow_n * BLOCK)];
        let chunks = cols.div_ceil(wide(rows));
        let size = cols.div_ceil(chunks);
        let mut c = 0;
        while c < cols {
            let n = size.min(cols - c);
            // Loads under masks: none inside the row; only the first and last registers
            // where only they reach the pad; else every one.
            let edge = |i: usize| c + i < lo || c + i >= hi;
            let masked = if !(0..n).any(edge) {
                Masked::None
            } else if !(1..n.saturating_sub(1)).any(edge) {
                Masked::Ends
            } else {
                Masked::All
            };
            let last = if c + n == cols { tail } else { 0xffff };
            let at = |p: *const f32| p.wrapping_add(c * 2 * BLOCK);
            pairs_group(&k, rt, rows, n, masked, c, [at(src[0]), at(src[1])], [dst[0].add(c * 2 * BLOCK), dst[1].wrapping_add(c * 2 * BLOCK)], last);
            c += n;
        }
        oh += rows;
    }
}

/// Which loads of a group of [`pairs_tile`] go under the pair masks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Masked {
    None,
    /// The first and the last register's.
    Ends,
    All,
}

/// One group of [`in_place_avx512`]: `rows` rows (1 or 2) of `n` registers (1..=8, at
/// most 4 with two rows) from pair `c0` on, loads under the pair masks as `masked`
/// says, the last register's store under `last`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn pairs_group(k: &Pairs, rt: &RowTaps, rows: usize, n: usize, masked: Masked, c0: usize, src: [*const f32; 2], dst: [*mut f32; 2], last: std::arch::x86_64::__mmask16) {
    macro_rules! go {
        ($(($r:literal, $n:literal)),*) => {
            match (rows, n, masked) {
                $(($r, $n, Masked::None) => pairs_tile::<$r, $n, 0>(k, rt, c0, src, dst, last),
                  ($r, $n, Masked::Ends) => pairs_tile::<$r, $n, 1>(k, rt, c0, src, dst, last),
                  ($r, $n, Masked::All) => pairs_tile::<$r, $n, 2>(k, rt, c0, src, dst, last),)*
                _ => unreachable!("a depthwise group of {rows} rows of {n} registers"),
            }
        };
    }
    go!((1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (2, 1), (2, 2), (2, 3), (2, 4))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
/// `MASKED`: 0, 1 or 2 for [`Masked`]'s None, Ends and All.
unsafe fn pairs_tile<const R: usize, const N: usize, const MASKED: u8>(k: &Pairs, rt: &RowTaps, c0: usize, src: [*const f32; 2], dst: [*mut f32; 2], last: std::arch::x86_64::__mmask16) {
    use std::arch::x86_64::*;
    let mut acc = [[k.bias; N]; R];
    for j in 0..rt.n {
        let (wt, o, kw) = rt.get(j);
        let m = k.masks.as_ptr().add(kw * k.cols + c0);
        for r in 0..R {
            for (i, a) in acc[r].iter_mut().enumerate() {
                let p = src[r].wrapping_offset(o).wrapping_add(i * 2 * BLOCK);
                // Masked-off lanes read nothing (no fault): the pad is never touched.
                let v = if MASKED == 2 || (MASKED == 1 && (i == 0 || i + 1 == N)) { _mm512_maskz_loadu_ps(*m.add(i), p) } else { _mm512_loadu_ps(p) };
                *a = _mm512_fmadd_ps(wt, v, *a);
            }
        }
    }
    for r in 0..R {
        for (i, &a) in acc[r].iter().enumerate() {
            // max/min return their second operand when either is NaN: NaN stays NaN.
            let v = match k.bounds {
                Some((lo, hi)) => _mm512_min_ps(hi, _mm512_max_ps(lo, a)),
                None => a,
            };
            let store = if i + 1 == N { last } else { 0xffff };
            _mm512_mask_storeu_ps(dst[r].add(i * 2 * BLOCK), store, v);
        }
    }
}

/// The kernel a plan runs: the op with its prepared filters.
struct Prepared {
    op: ConvNchwc,
    kernel: Kernel,
}

impl CpuKernel for Prepared {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        self.op.compute(inputs, false, &mut outputs[0], Some(&self.kernel))
    }

    fn in_place_inputs(&self, inputs: &[Option<&TensorType>], output: &TensorType) -> Vec<usize> {
        self.op.in_place_inputs(inputs, output)
    }

    fn run_in_place(&self, inputs: &[Option<&Tensor>], i: usize, outputs: &mut [Tensor]) -> Result<()> {
        self.op.check_in_place(i)?;
        self.op.compute(inputs, true, &mut outputs[0], Some(&self.kernel))
    }
}

#[cfg(test)]
#[path = "conv_nchwc_tests.rs"]
mod tests;

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "ConvNchwc", |spec| Ok(Box::new(ConvNchwc::parse(spec)?)));
}
