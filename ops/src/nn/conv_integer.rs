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
        qconv_packed::tune_params(&self.conv, inputs, [0, 1, 3])
    }

    /// Packs constant filters once for the fast integer kernels.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        qconv_packed::prepare(&self.conv, inputs, [0, 1, 3], Epilogue::Int32, tune)
    }
}

/// The WGSL integer convolution: one invocation per output element sums `s` (i32) over
/// its window, then `epilogue` stores it (`m` is the output channel). Inputs: x and w
/// at `xi`, `wi`, their zero points at `zi` (`None` or absent: 0); `extra` buffers
/// (name, input index) are bound after them.
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
    {
        let (x, w) = (required(inputs, xi)?, required(inputs, wi)?);
        let p = conv.problem(x.dims(), w.dims())?;
        let g = &p.geo;
        let (cg, mg) = (p.in_channels / p.group, p.out_channels / p.group);
        let taps = cg * g.kernel.iter().product::<usize>();
        if taps > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("{label} with {taps} taps per output on the GPU (at most {})", wgsl::MAX_LOOP_ITERATIONS)));
        }
        let mut buffers = vec![("x", wgsl::elem(x.dtype()), true), ("w", wgsl::elem(w.dtype()), true)];
        let mut bindings = vec![Binding::Input(xi), Binding::Input(wi)];
        let mut zero = |i: Option<usize>, name: &'static str, index: &str| -> Result<String> {
            let Some((i, z)) = i.and_then(|i| inputs.get(i).copied().flatten().map(|z| (i, z))) else { return Ok("0".into()) };
            buffers.push((name, wgsl::elem(z.dtype()), true));
            bindings.push(Binding::Input(i));
            Ok(if z.ty.len() == 1 { format!("i32({name}[0])") } else { format!("i32({name}[{index}])") })
        };
        let zx = zero(zxi, "zx", "0u")?;
        let zw = zero(zwi, "zw", "m")?;
        for &(name, i) in extra {
            buffers.push((name, wgsl::elem(required(inputs, i)?.dtype()), true));
            bindings.push(Binding::Input(i));
        }
        buffers.push(("y", wgsl::elem(out.dtype), false));
        bindings.push(Binding::Output(0));
        let [id, ih, iw] = g.input;
        let [od, oh, ow] = g.output;
        let [kd, kh, kw] = g.kernel;
        let u = |v: usize| format!("{v}u");
        let i = |v: i64| format!("{v}i");
        let body = format!(
            "let o3 = i % {opx}u;\n    let m = (i / {opx}u) % {m}u;\n    let b = i / ({opx}u * {m}u);\n\
             \x20   let ox = i32(o3 % {ow}); let oy = i32((o3 / {ow}) % {oh}); let oz = i32(o3 / ({ow} * {oh}));\n\
             \x20   let c0 = (m / {mg}u) * {cg}u;\n    let zx = {zx};\n    let zw = {zw};\n    var s = 0i;\n\
             \x20   for (var c = 0u; c < {cg}u; c++) {{\n\
             \x20     for (var a = 0u; a < {kd}u; a++) {{ let z = oz * {sd} - {pd} + i32(a) * {dd};\n\
             \x20       if (z < 0i || z >= {idi}) {{ continue; }}\n\
             \x20       for (var bb = 0u; bb < {kh}u; bb++) {{ let y = oy * {sh} - {ph} + i32(bb) * {dh};\n\
             \x20         if (y < 0i || y >= {ihi}) {{ continue; }}\n\
             \x20         for (var e = 0u; e < {kw}u; e++) {{ let xx = ox * {sw} - {pw} + i32(e) * {dw};\n\
             \x20           if (xx < 0i || xx >= {iwi}) {{ continue; }}\n\
             \x20           let xi = ((b * {cin}u + c0 + c) * {idu} + u32(z)) * {ihu} * {iwu} + u32(y) * {iwu} + u32(xx);\n\
             \x20           let wi = (((m * {cg}u + c) * {kd}u + a) * {kh}u + bb) * {kw}u + e;\n\
             \x20           s += (i32(x[xi]) - zx) * (i32(w[wi]) - zw);\n\
             \x20         }}\n       }}\n     }}\n    }}\n    {epilogue}",
            opx = od * oh * ow,
            m = p.out_channels,
            ow = u(ow),
            oh = u(oh),
            mg = mg,
            cg = cg,
            kd = kd,
            kh = kh,
            kw = kw,
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
            idu = u(id),
            ihu = u(ih),
            iwu = u(iw),
            cin = p.in_channels,
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(label, out.len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, "", &body)))
    }
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
