//! ConvInteger: Conv of `(x - x_zero_point)` with `(w - w_zero_point)` into int32,
//! exactly (Conv's attributes). x's zero point is per tensor, w's per tensor or per
//! output channel. With constant filters the CPU runs the packed integer GEMM of
//! [`super::qconv_packed`]; otherwise (and as the reference) the f64 direct convolution
//! on the shifted values (every partial sum is an integer below 2^53, so it is exact);
//! WGSL sums in i32.
use super::conv::Conv;
use super::conv_cpu;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::linalg::qproduct_wgsl::{Buffer, IntOperand, IntProduct};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use super::qconv_packed::{self, Epilogue};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

const DTYPES: [DType; 2] = [DType::I8, DType::U8];

#[derive(Debug)]
pub struct ConvInteger {
    conv: Conv,
}

impl ConvInteger {
    /// Whether input `i` (a zero point) fits: x's one element; w's one or one per
    /// output channel.
    fn check_zero_point(&self, inputs: &[Option<Arg>], i: usize, operand: DType, channels: usize) -> Result<()> {
        let Some(z) = inputs.get(i).copied().flatten() else { return Ok(()) };
        if z.dtype() != operand {
            return Err(OpError::input(i, format!("zero point dtype {} differs from its operand's {operand}", z.dtype())));
        }
        let n = z.ty.len();
        if n != 1 && !(i == 3 && n == channels) {
            let want = if i == 2 { "one element".to_string() } else { format!("one element or {channels} (one per output channel)") };
            return Err(OpError::input(i, format!("zero point of shape {:?}: expected {want}", z.dims())));
        }
        Ok(())
    }
}

impl Op for ConvInteger {
    fn name(&self) -> &str {
        "ConvInteger"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dx = expect_dtype(inputs, 0, &DTYPES)?;
        let dw = expect_dtype(inputs, 1, &DTYPES)?;
        let p = self.conv.problem(required(inputs, 0)?.dims(), required(inputs, 1)?.dims())?;
        self.check_zero_point(inputs, 2, dx, p.out_channels)?;
        self.check_zero_point(inputs, 3, dw, p.out_channels)?;
        let mut dims = vec![p.batch, p.out_channels];
        dims.extend(p.geo.output_dims());
        Ok(vec![TensorType::new(DType::I32, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// The exact int32 convolution of `(x - zx)` with `(w - zw)` (`zw` one value or one
/// per output channel).
pub(super) fn int_conv(conv: &Conv, x: &Tensor, w: &Tensor, zx: Option<&Tensor>, zw: Option<&Tensor>, y: &mut [i32]) -> Result<()> {
    let p = conv.problem(x.dims(), w.dims())?;
    let zx = zx.map(|z| z.to_f64_vec()[0]).unwrap_or(0.0);
    let zw = zw.map(|z| z.to_f64_vec()).unwrap_or_else(|| vec![0.0]);
    let xs: Vec<f64> = x.to_f64_vec().into_iter().map(|v| v - zx).collect();
    let per_channel = w.len() / p.out_channels.max(1);
    let ws: Vec<f64> = w.to_f64_vec().into_iter().enumerate().map(|(i, v)| v - zw[if zw.len() == 1 { 0 } else { i / per_channel }]).collect();
    let mut out = vec![0f64; y.len()];
    conv_cpu::conv_f64(&p, &xs, &ws, None, &mut out);
    for (o, v) in y.iter_mut().zip(out) {
        *o = v.round() as i32;
    }
    Ok(())
}

impl CpuKernel for ConvInteger {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        int_conv(&self.conv, cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, opt(2), opt(3), outputs[0].as_mut_slice::<i32>()?)
    }

    /// The instruction set of the packed integer kernel ([`qconv_packed`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        qconv_packed::tune_params(&self.conv, inputs, [0, 1, 3], Default::default())
    }

    /// Packs constant filters once for the fast integer kernels.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        qconv_packed::prepare(&self.conv, inputs, [0, 1, 3], Epilogue::Int32, tune, Default::default())
    }
}

/// The WGSL integer convolution: a [`IntProduct`] of the filters (A, one matrix per
/// group) with the input's windows (B, im2col, the padding holding x's zero point, so
/// that it adds nothing), whose exact sum `s` of output `i` (channel `ch`) `epilogue`
/// stores. Inputs: x and w at `xi`, `wi`, their zero points at `zi` (`None` or absent:
/// 0); `extra` buffers (name, input index) are bound after them.
#[allow(clippy::too_many_arguments)]
pub(super) fn int_conv_wgsl(
    label: &str,
    conv: &Conv,
    inputs: &[Option<Arg>],
    [xi, wi]: [usize; 2],
    [zxi, zwi]: [Option<usize>; 2],
    extra: &[(&'static str, usize)],
    out: &TensorType,
    epilogue: &str,
    tune: &TuneValues,
) -> Result<WgslProgram> {
    let (x, w) = (required(inputs, xi)?, required(inputs, wi)?);
    let p = conv.problem(x.dims(), w.dims())?;
    let g = &p.geo;
    let (groups, cg, mg) = (p.group, p.in_channels / p.group, p.out_channels / p.group);
    let window: usize = g.kernel.iter().product();
    let taps = cg * window;
    let present = |i: Option<usize>| i.and_then(|i| inputs.get(i).copied().flatten().map(|z| (i, z)));
    let mut buffers: Vec<Buffer> = vec![];
    // x's zero point is one value; w's one or one per output channel.
    let zx = present(zxi).map(|(i, z)| (("zx".to_string(), wgsl::elem(z.dtype()), Binding::Input(i)), "i32(zx[0])"));
    let zw = match present(zwi) {
        None => "0i",
        Some((i, z)) => {
            buffers.push(("zw".into(), wgsl::elem(z.dtype()), Binding::Input(i)));
            if z.ty.len() == 1 { "i32(zw[0])" } else { "i32(zw[ch])" }
        }
    };
    if let Some((buffer, _)) = &zx {
        buffers.push(buffer.clone());
    }
    let zx_value = zx.as_ref().map_or("0i", |z| z.1);
    for &(name, i) in extra {
        buffers.push((name.into(), wgsl::elem(required(inputs, i)?.dtype()), Binding::Input(i)));
    }
    buffers.push(("y".into(), wgsl::elem(out.dtype), Binding::Output(0)));
    let filters = IntOperand {
        rows: mg,
        batches: groups,
        batch_of: format!("bi % {groups}u"),
        buffers: vec![("w".into(), wgsl::elem(w.dtype()), Binding::Input(wi))],
        helpers: format!("fn raw(pb: u32, r: u32, k: u32) -> i32 {{ return i32(w[(pb * {mg}u + r) * {taps}u + k]); }}\n"),
        signed: w.dtype() == DType::I8,
        zero: zw.into(),
    };
    let [id, ih, iw] = g.input;
    let [od, oh, ow] = g.output;
    let [kd, kh, kw] = g.kernel;
    let i = |v: i64| format!("{v}i");
    let raw = format!(
        "fn raw(pb: u32, r: u32, k: u32) -> i32 {{\n\
         \x20   let e = k % {kw}u; let bb = (k / {kw}u) % {kh}u; let a = (k / {khw}u) % {kd}u; let c = k / {window}u;\n\
         \x20   let ox = i32(r % {ow}u); let oy = i32((r / {ow}u) % {oh}u); let oz = i32(r / {ohw}u);\n\
         \x20   let z = oz * {sd} - {pd} + i32(a) * {dd}; let y = oy * {sh} - {ph} + i32(bb) * {dh}; let xx = ox * {sw} - {pw} + i32(e) * {dw};\n\
         \x20   if (z < 0i || z >= {idi} || y < 0i || y >= {ihi} || xx < 0i || xx >= {iwi}) {{ return {zx_value}; }}\n\
         \x20   let plane = (pb / {groups}u) * {cin}u + (pb % {groups}u) * {cg}u + c;\n\
         \x20   return i32(x[((plane * {id}u + u32(z)) * {ih}u + u32(y)) * {iw}u + u32(xx)]);\n}}\n",
        khw = kh * kw,
        ohw = oh * ow,
        sd = i(g.stride[0] as i64),
        sh = i(g.stride[1] as i64),
        sw = i(g.stride[2] as i64),
        pd = i(g.pad_begin[0]),
        ph = i(g.pad_begin[1]),
        pw = i(g.pad_begin[2]),
        dd = i(g.dilation[0] as i64),
        dh = i(g.dilation[1] as i64),
        dw = i(g.dilation[2] as i64),
        idi = i(id as i64),
        ihi = i(ih as i64),
        iwi = i(iw as i64),
        cin = p.in_channels,
    );
    let mut window_buffers = vec![("x".to_string(), wgsl::elem(x.dtype()), Binding::Input(xi))];
    window_buffers.extend(zx.map(|z| z.0));
    let batch = x.dims()[0] * groups;
    let windows = IntOperand {
        rows: od * oh * ow,
        batches: batch,
        batch_of: "bi".into(),
        buffers: window_buffers,
        helpers: raw,
        signed: x.dtype() == DType::I8,
        zero: zx_value.into(),
    };
    let product = IntProduct {
        label,
        batch,
        m: mg,
        n: od * oh * ow,
        k: taps,
        a: filters,
        b: windows,
        buffers,
        helpers: crate::quant::qlinear::WGSL_REQUANTIZE.to_string(),
        prelude: format!("let ch = (bi % {groups}u) * {mg}u + m;"),
        epilogue: epilogue.to_string(),
        scratch: 0,
    };
    let (dispatches, scratch_bytes) = product.program(tune.get(&wgsl::workgroup_param()))?;
    Ok(WgslProgram { dispatches, scratch_bytes })
}

impl WgslKernel for ConvInteger {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        int_conv_wgsl("ConvInteger", &self.conv, inputs, [0, 1], [Some(2), Some(3)], &[], &outputs[0], "y[i] = s;", tune)
    }
}

fn parse(spec: &NodeSpec) -> Result<ConvInteger> {
    Ok(ConvInteger { conv: Conv::geometry_only(spec)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ConvInteger", |spec| Ok(Box::new(parse(spec)?)));
}
