//! QLinearConv: the int8/uint8 convolution requantized,
//! `y = saturate(round_half_to_even((conv(x - zx, w - zw) + B) * (sx * sw / sy)) + zy)`:
//! the convolution exact in int32 ([`int_conv`]), the multiplier and the rounding in
//! f32 as onnxruntime computes them. w's scale and zero point per tensor or per output
//! channel; the others per tensor; the bias B int32 per output channel.
//!
//! Kiln's attribute `kiln_channels_last` (set by the compiler's `layout-nhwc-int8` pass,
//! CPU only) makes x and y channels-last, `[N, H, W, C]` (1), or y only (2: a stem that
//! reads the model's NCHW input and starts a channels-last chain), 2-D only; the filters
//! stay `[M, C/group, kH, kW]`. The packed and channels-last depthwise kernels read and
//! write that layout directly; the reference transposes around the NCHW computation.
use super::conv::Conv;
use super::conv_integer::{int_conv, int_conv_wgsl};
use super::qconv_packed::{self, Epilogue};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::range;
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

const DTYPES: [DType; 2] = [DType::I8, DType::U8];
const SCALES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[derive(Debug)]
pub struct QLinearConv {
    conv: Conv,
    channels_last: ChannelsLast,
}

/// Which of x and y are channels-last (`[N, H, W, C]`; `kiln_channels_last` 0: neither,
/// 1: both, 2: y only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ChannelsLast {
    pub x: bool,
    pub y: bool,
}

impl ChannelsLast {
    /// Both x and y channels-last (`kiln_channels_last = 1`).
    pub fn both(self) -> bool {
        self.x && self.y
    }

    /// Neither: the plain NCHW convolution.
    pub fn neither(self) -> bool {
        !self.x && !self.y
    }
}

/// `[N, H, W, C]` as `[N, C, H, W]` (the dims a channels-last x stands for).
pub(super) fn channels_first(dims: &[usize]) -> Result<Vec<usize>> {
    match *dims {
        [n, h, w, c] => Ok(vec![n, c, h, w]),
        _ => Err(OpError::input(0, format!("a channels-last (kiln_channels_last) QLinearConv takes a rank-4 [N, H, W, C] x, got shape {dims:?}"))),
    }
}

/// Moves the channels of `[N, ..., C]` bytes ahead of the pixels (`to_first`), or back.
fn permute_channels(src: &[u8], n: usize, c: usize, to_first: bool) -> Vec<u8> {
    let pixels = src.len() / (n * c).max(1);
    let mut out = vec![0u8; src.len()];
    for b in 0..n {
        for q in 0..pixels {
            for ch in 0..c {
                let (last, first) = ((b * pixels + q) * c + ch, (b * c + ch) * pixels + q);
                if to_first {
                    out[first] = src[last];
                } else {
                    out[last] = src[first];
                }
            }
        }
    }
    out
}

impl Op for QLinearConv {
    /// Every kernel (the reference, the packed and the depthwise ones) writes each
    /// output element.
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "QLinearConv"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dx = expect_dtype(inputs, 0, &DTYPES)?;
        let dw = expect_dtype(inputs, 3, &DTYPES)?;
        let dy = expect_dtype(inputs, 7, &DTYPES)?;
        let x_dims = required(inputs, 0)?.dims();
        let p = self.conv.problem(&if self.channels_last.x { channels_first(x_dims)? } else { x_dims.to_vec() }, required(inputs, 3)?.dims())?;
        for i in [1, 4, 6] {
            expect_dtype(inputs, i, &SCALES)?;
        }
        // (input, its operand's dtype, whether one per output channel is allowed)
        for (i, d, per_channel) in [(1, None, false), (2, Some(dx), false), (4, None, true), (5, Some(dw), true), (6, None, false), (7, Some(dy), false)] {
            let t = required(inputs, i)?;
            if d.is_some_and(|d| d != t.dtype()) {
                return Err(OpError::input(i, format!("zero point dtype {} differs from its operand's", t.dtype())));
            }
            let n = t.ty.len();
            if n != 1 && !(per_channel && n == p.out_channels) {
                return Err(OpError::input(i, format!("shape {:?}: expected one element{}", t.dims(), if per_channel { format!(" or {} (one per output channel)", p.out_channels) } else { String::new() })));
            }
        }
        if let Some(b) = inputs.get(8).copied().flatten() {
            if b.dtype() != DType::I32 || b.dims() != [p.out_channels] {
                return Err(OpError::input(8, format!("bias must be i32[{}], found {}", p.out_channels, b.ty)));
            }
        }
        let mut dims = vec![p.batch, p.out_channels];
        dims.extend(p.geo.output_dims());
        if self.channels_last.y {
            let m = dims.remove(1);
            dims.push(m);
        }
        Ok(vec![TensorType::new(dy, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for QLinearConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if !self.channels_last.neither() {
            // The reference: NCHW in between.
            let x = cpu::input(inputs, 0)?;
            let xt;
            let mut args = inputs.to_vec();
            if self.channels_last.x {
                let dims = channels_first(x.dims())?;
                xt = Tensor::from_bytes(x.dtype(), &dims, &permute_channels(x.bytes(), dims[0], dims[1], true))?;
                args[0] = Some(&xt);
            }
            let y = &outputs[0];
            let yd = channels_first(y.dims())?;
            let mut yt = [Tensor::zeros(y.dtype(), &yd)];
            QLinearConv { conv: self.conv.clone(), channels_last: ChannelsLast::default() }.run(&args, &mut yt)?;
            let back = permute_channels(yt[0].bytes(), yd[0], yd[1], false);
            outputs[0].bytes_mut().copy_from_slice(&back);
            return Ok(());
        }
        let t = |i: usize| cpu::input(inputs, i);
        let (x, w) = (t(0)?, t(3)?);
        let mut acc = vec![0i32; outputs[0].len()];
        int_conv(&self.conv, x, w, Some(t(2)?), Some(t(5)?), &mut acc)?;
        let m = w.dims()[0];
        let plane = acc.len() / (x.dims()[0] * m).max(1);
        let f = |i: usize| -> Result<Vec<f32>> { Ok(t(i)?.to_f64_vec().into_iter().map(|v| v as f32).collect()) };
        let (sx, sw, sy, zy) = (f(1)?[0], f(4)?, f(6)?[0], f(7)?[0]);
        let bias = match inputs.get(8).copied().flatten() {
            Some(b) => b.as_slice::<i32>()?.to_vec(),
            None => vec![0; m],
        };
        let bounds = range(outputs[0].dtype());
        let q: Vec<i64> = acc
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let c = (i / plane) % m;
                let mult = sx * sw[if sw.len() == 1 { 0 } else { c }] / sy;
                ((a.wrapping_add(bias[c]) as f32 * mult).round_ties_even() + zy).clamp(bounds.0, bounds.1) as i64
            })
            .collect();
        crate::tensor::write_i64(&mut outputs[0], &q)
    }

    /// The instruction set of the packed integer kernel ([`qconv_packed`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        qconv_packed::tune_params(&self.conv, inputs, [0, 3, 5], self.channels_last)
    }

    /// Packs constant filters once for the fast integer kernels.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        qconv_packed::prepare(&self.conv, inputs, [0, 3, 5], Epilogue::Requantize, tune, self.channels_last)
    }
}

impl WgslKernel for QLinearConv {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        if !self.channels_last.neither() {
            return Err(OpError::Unsupported("a channels-last (kiln_channels_last) QLinearConv on the GPU: the layout pass is for the CPU".into()));
        }
        let (lo, hi) = range(outputs[0].dtype);
        let ye = wgsl::elem(outputs[0].dtype);
        let sw = if required(inputs, 4)?.ty.len() == 1 { "sw[0]" } else { "sw[ch]" };
        let mut extra = vec![("sx", 1), ("sw", 4), ("sy", 6), ("zy", 7)];
        let bias = if inputs.get(8).copied().flatten().is_some() {
            extra.push(("bias", 8));
            "bias[ch]"
        } else {
            "0i"
        };
        let epilogue = format!(
            "let mult = q_div(sx[0] * {sw}, sy[0]);\n    y[i] = {ye}(clamp(round(f32(s + {bias}) * mult) + f32(zy[0]), {}, {}));",
            wgsl::literal("f32", lo as f64),
            wgsl::literal("f32", hi as f64)
        );
        int_conv_wgsl("QLinearConv", &self.conv, inputs, [0, 3], [Some(2), Some(5)], &extra, &outputs[0], &epilogue, tune)
    }
}

fn parse(spec: &NodeSpec) -> Result<QLinearConv> {
    let channels_last = match spec.int("kiln_channels_last", 0)? {
        0 => ChannelsLast::default(),
        1 => ChannelsLast { x: true, y: true },
        2 => ChannelsLast { x: false, y: true },
        v => return Err(OpError::Invalid(format!("kiln_channels_last must be 0, 1 or 2, got {v}"))),
    };
    Ok(QLinearConv { conv: Conv::geometry_only(spec)?, channels_last })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "QLinearConv", |spec| Ok(Box::new(parse(spec)?)));
}
