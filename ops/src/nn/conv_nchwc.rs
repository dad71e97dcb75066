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
//! its tiles as blocks, without a transpose; a depthwise one (blocked input) slides
//! eight lanes of taps over a zero-padded copy of each block (`blocked8`).
use super::blocked8::{self, MAX_TAPS};
use super::conv::{check_bias, Conv};
use super::conv_cpu::{ConvProblem, SharedOut};
use super::conv_flipped::{FlippedFilters, Layout};
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
                built = Kernel::new(&p, w.as_slice()?, self.input_blocked, &TuneValues::default());
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

    /// The instruction set.
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        let Some(p) = self.constant_problem(inputs) else { return vec![] };
        if p.group == 1 {
            let isa = Isa::best();
            vec![TuneParam { name: "isa", default: isa.code(), candidates: Isa::available().into_iter().map(Isa::code).collect() }]
        } else {
            let isas: Vec<u32> = Isa::available().into_iter().filter(|&i| i != Isa::Avx512).map(Isa::code).collect();
            vec![TuneParam { name: "isa", default: isas[0], candidates: isas }]
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

/// The prepared filters of one problem.
struct Kernel {
    problem: ConvProblem,
    form: Form,
}

enum Form {
    Dense(FlippedFilters),
    /// Depthwise: per block, per tap, eight weights; whether to use AVX2.
    Depthwise { w: Vec<f32>, avx2: bool },
}

impl Kernel {
    fn new(p: &ConvProblem, w: &[f32], input_blocked: bool, tune: &TuneValues) -> Kernel {
        let get = |name: &str, default: u32| tune.0.get(name).copied().unwrap_or(default);
        let best = Isa::best();
        let form = if p.group == 1 {
            let isa = Isa::from_code(get("isa", best.code())).unwrap_or(best);
            // Each tile runs the whole reduction (no slices).
            Form::Dense(FlippedFilters::direct_in(p, w, isa, p.reduction(), cpu::threads(), Layout { in_blocked: input_blocked, out_blocked: true }))
        } else {
            let taps = p.geo.kernel_size();
            let mut packed = vec![0f32; p.out_channels * taps];
            for c in 0..p.out_channels {
                for t in 0..taps {
                    packed[((c / BLOCK) * taps + t) * BLOCK + c % BLOCK] = w[c * taps + t];
                }
            }
            let avx2 = cpu::has_avx2() && taps <= MAX_TAPS && get("isa", Isa::Avx2.code()) != Isa::Portable.code();
            Form::Depthwise { w: packed, avx2 }
        };
        Kernel { problem: p.clone(), form }
    }

    /// `y = act([y +] conv(x) + bias)`, Y blocked.
    fn run(&self, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let p = &self.problem;
        match &self.form {
            Form::Dense(f) => f.run(p, x, bias, act, residual, y),
            Form::Depthwise { w, avx2 } => depthwise(p, x, w, *avx2, bias, act, residual, y),
        }
    }
}

/// Padded input floats per band of a depthwise block (192 KiB: the band stays in L2;
/// whole 240x320 blocks ran 1.7x slower than the NCHW kernel).
const BAND_FLOATS: usize = 48 * 1024;

/// The depthwise form: one task per image, channel block and band of output rows.
#[allow(clippy::too_many_arguments)]
fn depthwise(p: &ConvProblem, x: &[f32], w: &[f32], avx2: bool, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
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
            let len = (r1 - r0) * ow_n * BLOCK;
            cpu::with_scratch(BLOCK * hp * wp + len, |s| {
                let (xs, os) = s.split_at_mut(BLOCK * hp * wp);
                blocked8::load_blocked(&gb, &x[u * ipx * BLOCK..][..ipx * BLOCK], xs, 0.0);
                // SAFETY: rows r0..r1 of unit u's output block are written by this task only.
                let yb = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(u * opx * BLOCK + r0 * ow_n * BLOCK), len) };
                let wb = &w[cb * taps * BLOCK..][..taps * BLOCK];
                let bb: [f32; BLOCK] = std::array::from_fn(|l| bias.map_or(0.0, |b| b[cb * BLOCK + l]));
                if residual {
                    slide(&gb, xs, wb, &bb, avx2, None, os);
                    yb.iter_mut().zip(os.iter()).for_each(|(o, v)| *o += v);
                    if let Some(a) = act {
                        a.apply_slice_f32_fast(yb);
                    }
                } else {
                    // A Relu/Clip is applied in registers, other activations after.
                    slide(&gb, xs, wb, &bb, avx2, clamp, yb);
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
fn slide(g: &super::window::Geometry, xs: &[f32], w: &[f32], bias: &[f32; BLOCK], avx2: bool, clamp: Option<(f32, f32)>, os: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only set where the CPU has AVX2 + FMA and taps <= MAX_TAPS.
        unsafe { slide_avx2(g, xs, w, bias, clamp, os) };
        return;
    }
    let _ = avx2;
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
