//! Conv (1-D, 2-D, 3-D; groups incl. depthwise, strides, dilations, explicit pads and
//! auto_pad, optional bias). CPU kernels are in [`super::conv_cpu`]; the WGSL kernel is
//! a barrier-free direct convolution where each invocation accumulates a register block
//! of output channels x consecutive output pixels of one row.
//! An activation fused by the graph compiler (`kiln_activation`) is applied to each
//! value before it is stored, on the CPU and the GPU. A residual fused by the compiler
//! (`kiln_residual` = 1, input 3: a tensor of the output's shape, e.g. the skip
//! connection of a ResNet block) is added after the bias, before the activation; on
//! the CPU the output may take over the residual's memory and accumulate into it.
use super::conv_cpu::{self, ConvProblem, Epilogue};
use super::conv_packed::{self, PackedConv};
use super::window::WindowAttrs;
use crate::cpu::{self, CpuKernel};
use crate::elementwise::{self, UnaryKind};
use crate::linalg::RESIDUAL_ATTR;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, TuneParam, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

pub(crate) const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

#[derive(Clone, Debug)]
pub struct Conv {
    window: WindowAttrs,
    pub(super) group: usize,
    /// Activation fused by the graph compiler (see `elementwise::fused_activation`).
    pub(super) activation: Option<UnaryKind>,
    /// A residual fused by the graph compiler (attribute [`RESIDUAL_ATTR`]): input 3 has
    /// the output's shape and is added after the bias, before the activation.
    pub(super) residual: bool,
}

impl Conv {
    pub(super) fn parse(spec: &NodeSpec) -> Result<Conv> {
        let group = spec.int("group", 1)?;
        if group < 1 {
            return Err(spec.bad("group", format!("must be >= 1, found {group}")));
        }
        let residual = spec.int(RESIDUAL_ATTR, 0)? != 0;
        let has_input3 = spec.node.inputs.get(3).copied().flatten().is_some();
        if residual != has_input3 || spec.node.inputs.len() > 4 {
            return Err(spec.bad(
                RESIDUAL_ATTR,
                format!("a Conv takes a fused residual as input 3 exactly when {RESIDUAL_ATTR} is set (set: {residual}, input 3 given: {has_input3})"),
            ));
        }
        Ok(Conv { window: WindowAttrs::parse(spec)?, group: group as usize, activation: elementwise::fused_activation(spec)?, residual })
    }

    /// The window and group attributes alone (for the other ops with Conv's
    /// geometry, whose inputs differ).
    pub(super) fn geometry_only(spec: &NodeSpec) -> Result<Conv> {
        let group = spec.int("group", 1)?;
        if group < 1 {
            return Err(spec.bad("group", format!("must be >= 1, found {group}")));
        }
        Ok(Conv { window: WindowAttrs::parse(spec)?, group: group as usize, activation: None, residual: false })
    }

    /// Computes the output into `y`; with a fused residual, `y` holds it already when
    /// `residual_in_y` (the output took over its memory), else it is copied in first.
    fn compute(&self, inputs: &[Option<&Tensor>], residual_in_y: bool, y: &mut Tensor) -> Result<()> {
        self.compute_with(inputs, residual_in_y, y, None)
    }

    /// [`Conv::compute`] through the filters of `packed` (f32 only).
    pub(crate) fn compute_packed(&self, inputs: &[Option<&Tensor>], residual_in_y: bool, y: &mut Tensor, packed: &PackedConv) -> Result<()> {
        self.compute_with(inputs, residual_in_y, y, Some(packed))
    }

    fn compute_with(&self, inputs: &[Option<&Tensor>], residual_in_y: bool, y: &mut Tensor, packed: Option<&PackedConv>) -> Result<()> {
        let (x, w) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let bias = inputs.get(2).copied().flatten();
        let p = self.problem(x.dims(), w.dims())?.for_cpu();
        check_bias(bias, p.out_channels)?;
        if self.residual && !residual_in_y {
            let r = cpu::input(inputs, 3)?;
            if r.dtype() != y.dtype() || r.dims() != y.dims() {
                return Err(OpError::input(3, format!("a fused residual must be {} {:?}, got {} {:?}", y.dtype(), y.dims(), r.dtype(), r.dims())));
            }
            y.bytes_mut().copy_from_slice(r.bytes());
        }
        let residual = self.residual;
        if x.dtype() == DType::F32 {
            let b = bias.map(|b| b.as_slice::<f32>()).transpose()?;
            match packed {
                Some(k) if *k.problem() == p => k.run_f32(x.as_slice()?, b, self.activation, residual, y.as_mut_slice()?),
                Some(k) => {
                    return Err(OpError::input(0, format!("the filters were packed for {:?}, not for input {:?}", k.problem(), x.dims())));
                }
                None => {
                    let epi = Epilogue { bias: b, act: self.activation, residual };
                    conv_cpu::conv_f32(&p, x.as_slice()?, w.as_slice()?, epi, y.as_mut_slice()?);
                }
            }
        } else if matches!(x.dtype(), DType::F16 | DType::BF16) {
            // Half precision: exact widening to f32, the fast kernel, one rounding back.
            let f32s = |t: &Tensor| t.to_f64_vec().into_iter().map(|v| v as f32).collect::<Vec<f32>>();
            let b = bias.map(f32s);
            let mut out = if residual { f32s(y) } else { vec![0f32; y.len()] };
            let epi = Epilogue { bias: b.as_deref(), act: None, residual };
            conv_cpu::conv_f32(&p, &f32s(x), &f32s(w), epi, &mut out);
            let wide: Vec<f64> = out.into_iter().map(f64::from).collect();
            *y = Tensor::from_f64(y.dtype(), y.dims(), &wide)?;
        } else {
            let b = bias.map(|b| b.to_f64_vec());
            let mut out = vec![0.0; y.len()];
            conv_cpu::conv_f64(&p, &x.to_f64_vec(), &w.to_f64_vec(), b.as_deref(), &mut out);
            if residual {
                out.iter_mut().zip(y.to_f64_vec()).for_each(|(o, r)| *o += r);
            }
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        if x.dtype() != DType::F32 {
            // Like an activation node after the Conv: on the rounded results.
            elementwise::apply_activation(self.activation, y)?;
        }
        Ok(())
    }

    /// Checks input/weight shapes and resolves the geometry.
    pub(super) fn problem(&self, x: &[usize], w: &[usize]) -> Result<ConvProblem> {
        if x.len() < 3 || x.len() > 5 {
            return Err(OpError::input(0, format!("expected N x C x D1 [x D2 [x D3]] (rank 3 to 5), found shape {x:?}")));
        }
        if w.len() != x.len() {
            return Err(OpError::input(1, format!("weights of shape {w:?} do not match the rank of input {x:?}")));
        }
        if w.contains(&0) {
            return Err(OpError::input(1, format!("weights of shape {w:?} have a zero dim")));
        }
        let (c, m) = (x[1], w[0]);
        if w[1] * self.group != c {
            return Err(OpError::input(
                1,
                format!("weights have {} input channels per group; input has {c} channels for group {}", w[1], self.group),
            ));
        }
        if m % self.group != 0 {
            return Err(OpError::input(1, format!("{m} output channels are not divisible by group {}", self.group)));
        }
        let n = x.len() - 2;
        let kernel = self.window.kernel(n, Some(&w[2..]))?;
        let geo = self.window.resolve(&x[2..], &kernel, false)?;
        Ok(ConvProblem { batch: x[0], in_channels: c, out_channels: m, group: self.group, geo })
    }
}

impl Op for Conv {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Conv"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let (x, w) = (required(inputs, 0)?, required(inputs, 1)?);
        if w.dtype() != dtype {
            return Err(OpError::input(1, format!("dtype {} differs from the input's {dtype}", w.dtype())));
        }
        let p = self.problem(x.dims(), w.dims())?;
        if let Some(b) = inputs.get(2).copied().flatten() {
            if b.dims() != [p.out_channels] || b.dtype() != dtype {
                return Err(OpError::input(2, format!("bias must be {dtype}[{}], found {}", p.out_channels, b.ty)));
            }
        }
        let mut dims = vec![p.batch, p.out_channels];
        dims.extend(p.geo.output_dims());
        if self.residual {
            let r = required(inputs, 3)?;
            if r.dtype() != dtype || r.dims() != dims.as_slice() {
                return Err(OpError::input(3, format!("a fused residual must have the output's type {dtype} {dims:?}, found {}", r.ty)));
            }
        }
        Ok(vec![TensorType::new(dtype, dims)])
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
        Some(self)
    }
}

impl CpuKernel for Conv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        self.compute(inputs, false, &mut outputs[0])
    }

    /// The output may take over a fused residual's memory: each element is read (as the
    /// accumulator's start) before that element is written.
    fn in_place_inputs(&self, inputs: &[Option<&TensorType>], output: &TensorType) -> Vec<usize> {
        match inputs.get(3).copied().flatten() {
            Some(r) if self.residual && r == output => vec![3],
            _ => vec![],
        }
    }

    fn run_in_place(&self, inputs: &[Option<&Tensor>], i: usize, outputs: &mut [Tensor]) -> Result<()> {
        self.check_in_place(i)?;
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        self.compute(inputs, true, &mut outputs[0])
    }

    /// Algorithm, instruction set and block sizes of an f32 convolution with constant
    /// filters (see [`super::conv_packed`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        match self.packable(inputs) {
            Some((p, _)) => conv_packed::params(&p),
            None => vec![],
        }
    }

    /// Packs constant f32 filters once, unless `tune` picks the direct algorithm.
    fn prepare(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        if outputs.iter().any(|o| o.dims.contains(&0)) {
            return Ok(None);
        }
        let Some((p, w)) = self.packable(inputs) else { return Ok(None) };
        Ok(PackedConv::new(self, p, w.as_slice()?, tune).map(|k| Box::new(k) as Box<dyn CpuKernel>))
    }
}

impl Conv {
    /// The problem and constant filters of an f32 convolution the packed kernel takes.
    fn packable<'a>(&self, inputs: &[Option<Arg<'a>>]) -> Option<(ConvProblem, &'a Tensor)> {
        let (x, w) = (inputs.first().copied().flatten()?, inputs.get(1).copied().flatten()?);
        let value = w.value?;
        if x.dtype() != DType::F32 || w.dtype() != DType::F32 {
            return None;
        }
        let p = self.problem(x.dims(), w.dims()).ok()?.for_cpu();
        conv_packed::eligible(&p).then_some((p, value))
    }

    pub(crate) fn check_in_place(&self, i: usize) -> Result<()> {
        if i != 3 || !self.residual {
            return Err(OpError::Unsupported(format!("Conv runs in place of a fused residual (input 3) only, not of input {i}")));
        }
        Ok(())
    }
}

/// Checks at run time that an optional bias has one value per output channel.
pub(crate) fn check_bias(bias: Option<&Tensor>, channels: usize) -> Result<()> {
    match bias {
        Some(b) if b.len() != channels => {
            Err(OpError::input(2, format!("bias has {} values; expected {channels} (the output channels)", b.len())))
        }
        _ => Ok(()),
    }
}

/// Output channels per invocation: each input load feeds this many accumulators.
/// Default 8 (best on lavapipe for resnet/mobilenet layers), fewer for narrow groups.
fn oc_block_param(p: &ConvProblem) -> TuneParam {
    let mg = p.out_channels / p.group;
    let default = if mg >= 8 { 8 } else if mg >= 4 { 4 } else { mg as u32 };
    TuneParam { name: "oc_block", default, candidates: vec![1, 2, 4, 8] }
}

/// Consecutive output pixels of a row per invocation: each weight load feeds this many
/// accumulators. Default 8.
fn px_block_param(_p: &ConvProblem) -> TuneParam {
    TuneParam { name: "px_block", default: 8, candidates: vec![2, 4, 8] }
}

impl WgslKernel for Conv {
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        let shapes = (inputs.first().copied().flatten(), inputs.get(1).copied().flatten());
        match shapes {
            (Some(x), Some(w)) => match self.problem(x.dims(), w.dims()) {
                Ok(p) => vec![wgsl::workgroup_param(), oc_block_param(&p), px_block_param(&p)],
                Err(_) => vec![wgsl::workgroup_param()],
            },
            _ => vec![wgsl::workgroup_param()],
        }
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// f16 operands stored as halves are read into the f32 the kernel accumulates in.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(WgslProgram::default());
        }
        let (x, w) = (required(inputs, 0)?, required(inputs, 1)?);
        let p = self.problem(x.dims(), w.dims())?;
        let (hx, hw, hb, hres, hy) = (halves.input(0), halves.input(1), halves.input(2), halves.input(3), halves.output(0));
        let ld = |e: String, half: bool| wgsl::load(&e, "f32", half);
        let has_bias = inputs.get(2).copied().flatten().is_some();
        if self.residual {
            // Checked by infer; the kernel indexes the residual like the output.
            required(inputs, 3)?;
        }
        let wg = tune.get(&wgsl::workgroup_param()).max(1);
        let (mg, cg) = (p.out_channels / p.group, p.in_channels / p.group);
        let ocb = (tune.get(&oc_block_param(&p)).max(1) as usize).min(mg);
        let pxb = (tune.get(&px_block_param(&p)).max(1) as usize).min(p.geo.output[2]);
        let g = &p.geo;
        let (m_blocks, w_blocks) = (mg.div_ceil(ocb), g.output[2].div_ceil(pxb));
        let invocations = p.batch * p.group * m_blocks * g.output[0] * g.output[1] * w_blocks;
        let (grid, index) = wgsl::grid_1d(invocations, wg);

        let ty = |half: bool| if half { "f16" } else { "f32" };
        let mut buffers = vec![("x", ty(hx), true), ("w", ty(hw), true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_bias {
            buffers.push(("b", ty(hb), true));
            bindings.push(Binding::Input(2));
        }
        if self.residual {
            buffers.push(("res", ty(hres), true));
            bindings.push(Binding::Input(3));
        }
        buffers.push(("y", ty(hy), false));
        bindings.push(Binding::Output(0));

        let mut s = String::new();
        let _ = writeln!(s, "{}", wgsl::declare(&buffers));
        if self.activation.is_some() {
            s += &elementwise::activation_wgsl(self.activation);
        }
        let consts = [
            ("C", p.in_channels),
            ("M", p.out_channels),
            ("CG", cg),
            ("MG", mg),
            ("GROUPS", p.group),
            ("MB", m_blocks),
            ("WB", w_blocks),
            ("ID", g.input[0]),
            ("IH", g.input[1]),
            ("IW", g.input[2]),
            ("OD", g.output[0]),
            ("OH", g.output[1]),
            ("OW", g.output[2]),
            ("KD", g.kernel[0]),
            ("KH", g.kernel[1]),
            ("KW", g.kernel[2]),
            ("KSIZE", g.kernel_size()),
            ("SD", g.stride[0]),
            ("SH", g.stride[1]),
            ("SW", g.stride[2]),
            ("DD", g.dilation[0]),
            ("DH", g.dilation[1]),
            ("DW", g.dilation[2]),
        ];
        for (name, v) in consts {
            let _ = writeln!(s, "const {name}: u32 = {v}u;");
        }
        for (name, v) in [("PD", g.pad_begin[0]), ("PH", g.pad_begin[1]), ("PW", g.pad_begin[2])] {
            let _ = writeln!(s, "const {name}: i32 = {v};");
        }
        let _ = writeln!(s, "\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{");
        let _ = write!(s, "    {index}");
        s += "    let wb = i % WB;\n    var r = i / WB;\n    let oh = r % OH;\n    r = r / OH;\n    let od = r % OD;\n";
        s += "    r = r / OD;\n    let mb = r % MB;\n    r = r / MB;\n    let g = r % GROUPS;\n    let n = r / GROUPS;\n";
        let _ = writeln!(s, "    let ow0 = wb * {pxb}u;\n    let mo0 = mb * {ocb}u;");
        for o in 0..ocb {
            let _ = writeln!(s, "    let wrow{o} = (g * MG + min(mo0 + {o}u, MG - 1u)) * CG * KSIZE;");
            for q in 0..pxb {
                let _ = writeln!(s, "    var acc{o}_{q} = 0.0;");
            }
        }
        // Whether all taps of this invocation's pixels fall inside the input row.
        let _ = writeln!(
            s,
            "    let inside = i32(ow0 * SW) >= PW && i32((ow0 + {}u) * SW + (KW - 1u) * DW) - PW < i32(IW);",
            pxb - 1
        );
        s += "    for (var c = 0u; c < CG; c++) {\n";
        s += "        let xplane = (n * C + g * CG + c) * ID * IH * IW;\n        let wc = c * KSIZE;\n";
        s += "        for (var kd = 0u; kd < KD; kd++) {\n";
        s += "            let id = i32(od * SD + kd * DD) - PD;\n            if (id < 0 || id >= i32(ID)) { continue; }\n";
        s += "            for (var kh = 0u; kh < KH; kh++) {\n";
        s += "                let ih = i32(oh * SH + kh * DH) - PH;\n                if (ih < 0 || ih >= i32(IH)) { continue; }\n";
        s += "                let xrow = xplane + (u32(id) * IH + u32(ih)) * IW;\n";
        // Two copies of the kw loop: without bounds checks when every tap of every pixel
        // of this invocation is inside the row (most invocations), with them otherwise.
        for checked in [false, true] {
            s += if checked { "                } else {\n" } else { "                if (inside) {\n" };
            s += "                for (var kw = 0u; kw < KW; kw++) {\n";
            s += "                    let k = wc + (kd * KH + kh) * KW + kw;\n";
            s += "                    let iwb = i32(ow0 * SW + kw * DW) - PW;\n";
            for q in 0..pxb {
                if checked {
                    let _ = writeln!(s, "                    let iw{q} = iwb + {};", q * g.stride[2]);
                    let _ = writeln!(
                        s,
                        "                    let x{q} = select(0.0, {}, iw{q} >= 0 && iw{q} < i32(IW));",
                        ld(format!("x[xrow + u32(clamp(iw{q}, 0, i32(IW) - 1))]"), hx)
                    );
                } else {
                    let _ = writeln!(s, "                    let x{q} = {};", ld(format!("x[xrow + u32(iwb) + {}u]", q * g.stride[2]), hx));
                }
            }
            for o in 0..ocb {
                let _ = writeln!(s, "                    let w{o} = {};", ld(format!("w[wrow{o} + k]"), hw));
                for q in 0..pxb {
                    let _ = writeln!(s, "                    acc{o}_{q} = fma(w{o}, x{q}, acc{o}_{q});");
                }
            }
            s += "                }\n";
        }
        // The first brace below closes the `else`.
        s += "                }\n            }\n        }\n    }\n";
        s += "    let orow = (od * OH + oh) * OW;\n";
        for o in 0..ocb {
            let _ = writeln!(s, "    if (mo0 + {o}u < MG) {{");
            let _ = writeln!(s, "        let m = g * MG + mo0 + {o}u;");
            let _ = writeln!(s, "        let ybase = (n * M + m) * OD * OH * OW + orow + ow0;");
            let bias = if has_bias { ld("b[m]".into(), hb) } else { "0.0".into() };
            let _ = writeln!(s, "        let bias = {bias};");
            for q in 0..pxb {
                let sum = if self.residual { format!("acc{o}_{q} + bias + {}", ld(format!("res[ybase + {q}u]"), hres)) } else { format!("acc{o}_{q} + bias") };
                let value = if self.activation.is_some() { format!("kiln_act({sum})") } else { sum };
                let _ = writeln!(s, "        if (ow0 + {q}u < OW) {{ y[ybase + {q}u] = {}; }}", wgsl::store(&value, "f32", hy));
            }
            s += "    }\n";
        }
        s += "}\n";
        Ok(WgslProgram::single(wgsl::Dispatch {
            label: format!("Conv[{ocb}oc x {pxb}px]"),
            source: wgsl::with_halves(s, halves.any()),
            entry_point: "main".into(),
            workgroups: grid,
            bindings,
        }))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Conv", |spec| Ok(Box::new(Conv::parse(spec)?)));
}

#[cfg(test)]
#[path = "conv_residual_tests.rs"]
mod residual_tests;

#[cfg(test)]
#[path = "conv_variant_tests.rs"]
mod variant_tests;

#[cfg(test)]
pub(super) mod tests {
    use crate::testing::{assert_close, as_inputs, ints, make, rand_f32, rand_values, run, tune};
    use crate::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
    use crate::{Arg, TensorType};
    use kiln_graph::{Attr, DType, Tensor};

    /// Naive f64 convolution over 1..3 spatial dims with explicit pads.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reference(
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        group: usize,
        strides: &[usize],
        dil: &[usize],
        pb: &[i64],
        out_sp: &[usize],
    ) -> Vec<f64> {
        let (xd, wd) = (x.dims(), w.dims());
        let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
        let bv = b.map(|b| b.to_f64_vec());
        let nsp = xd.len() - 2;
        let (n, c, m) = (xd[0], xd[1], wd[0]);
        let (cg, mg) = (c / group, m / group);
        let osize: usize = out_sp.iter().product();
        let ksize: usize = wd[2..].iter().product();
        let isize: usize = xd[2..].iter().product();
        let mut y = vec![0.0; n * m * osize];
        let unravel = |mut i: usize, dims: &[usize]| {
            let mut idx = vec![0; dims.len()];
            for d in (0..dims.len()).rev() {
                idx[d] = i % dims[d];
                i /= dims[d];
            }
            idx
        };
        for img in 0..n {
            for mm in 0..m {
                let grp = mm / mg;
                for op in 0..osize {
                    let o = unravel(op, out_sp);
                    let mut acc = bv.as_ref().map_or(0.0, |b| b[mm]);
                    for ci in 0..cg {
                        for kp in 0..ksize {
                            let k = unravel(kp, &wd[2..]);
                            let mut flat = 0usize;
                            let mut inside = true;
                            for d in 0..nsp {
                                let i = (o[d] * strides[d]) as i64 - pb[d] + (k[d] * dil[d]) as i64;
                                inside &= i >= 0 && i < xd[2 + d] as i64;
                                flat = flat * xd[2 + d] + i.max(0) as usize;
                            }
                            if inside {
                                acc += xv[(img * c + grp * cg + ci) * isize + flat] * wv[(mm * cg + ci) * ksize + kp];
                            }
                        }
                    }
                    y[(img * m + mm) * osize + op] = acc;
                }
            }
        }
        y
    }

    struct Case {
        x: Vec<usize>,
        w: Vec<usize>,
        group: usize,
        strides: Vec<usize>,
        dil: Vec<usize>,
        pads: Vec<i64>,
        bias: bool,
    }

    fn check(case: &Case) {
        let nsp = case.x.len() - 2;
        let x = rand_f32(&case.x, 1);
        let w = rand_f32(&case.w, 2);
        let b = rand_f32(&[case.w[0]], 3);
        let attrs = vec![
            ("group", Attr::Int(case.group as i64)),
            ("strides", ints(&case.strides.iter().map(|&v| v as i64).collect::<Vec<_>>())),
            ("dilations", ints(&case.dil.iter().map(|&v| v as i64).collect::<Vec<_>>())),
            ("pads", ints(&case.pads)),
        ];
        let op = make("Conv", 19, &attrs, 3, 1).unwrap();
        let inputs = [Some(&x), Some(&w), case.bias.then_some(&b)];
        let tunes = [tune(&[("oc_block", 1), ("px_block", 1)]), tune(&[("oc_block", 8), ("px_block", 3), ("workgroup", 32)])];
        let y = run(op.as_ref(), &as_inputs(&inputs, &[]), &tunes).unwrap().remove(0);
        let out_sp = &y.dims()[2..];
        for d in 0..nsp {
            let span = (case.w[2 + d] - 1) * case.dil[d] + 1;
            let padded = case.x[2 + d] as i64 + case.pads[d] + case.pads[nsp + d];
            assert_eq!(out_sp[d] as i64, (padded - span as i64) / case.strides[d] as i64 + 1);
        }
        let want = reference(&x, &w, case.bias.then_some(&b), case.group, &case.strides, &case.dil, &case.pads[..nsp], out_sp);
        assert_close(&y, &want, 1e-4, &format!("x{:?} w{:?} g{} s{:?} d{:?} p{:?}", case.x, case.w, case.group, case.strides, case.dil, case.pads));
    }

    #[test]
    fn conv2d_matches_reference_on_odd_shapes() {
        let mut n = 0;
        for k in 1..=5usize {
            for (hw, stride, dil, pads, group, cin, cout) in [
                (7usize, 1usize, 1usize, [0i64, 0, 0, 0], 1usize, 3usize, 5usize),
                (9, 2, 1, [1, 2, 0, 1], 1, 3, 4),
                (11, 1, 2, [2, 2, 2, 2], 3, 3, 6),
                (13, 3, 2, [0, 1, 2, 0], 1, 4, 3),
                (8, 1, 1, [1, 1, 1, 1], 4, 4, 4),   // depthwise
                (10, 2, 2, [2, 1, 1, 2], 3, 3, 6),  // depthwise, multiplier 2
                (12, 1, 1, [0, 0, 0, 0], 2, 6, 4),
            ] {
                if (k - 1) * dil + 1 > hw + (pads[0] + pads[2]) as usize {
                    continue;
                }
                check(&Case {
                    x: vec![2, cin, hw, hw - 1],
                    w: vec![cout, cin / group, k, if k > 1 { k - 1 } else { 1 }],
                    group,
                    strides: vec![stride, if stride > 1 { stride - 1 } else { 1 }],
                    dil: vec![dil, 1],
                    pads: pads.to_vec(),
                    bias: (k + hw) % 2 == 0,
                });
                n += 1;
            }
        }
        assert!(n > 25);
    }

    #[test]
    fn depthwise_strides_dilations_and_pads_match_reference() {
        for (hw, k, strides, dil, pads, mult) in [
            ([9usize, 11usize], [3usize, 3usize], [2usize, 2usize], [1usize, 1usize], [1i64, 1, 1, 1], 1usize),
            ([14, 14], [3, 3], [2, 2], [1, 1], [0, 0, 1, 1], 1),
            ([13, 12], [3, 3], [3, 3], [1, 2], [2, 0, 1, 2], 1),
            ([7, 7], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 2),
            ([10, 9], [5, 4], [1, 2], [2, 1], [2, 1, 0, 3], 1),
            ([8, 13], [2, 5], [2, 3], [1, 1], [0, 2, 1, 0], 1),
            ([5, 6], [3, 3], [1, 1], [1, 1], [0, 0, 0, 0], 1),
            ([3, 4], [2, 2], [2, 3], [1, 1], [5, 4, 6, 3], 1),
            ([3, 4], [2, 3], [1, 1], [2, 1], [6, 7, 5, 8], 1),
        ] {
            let c = 3;
            check(&Case {
                x: vec![2, c, hw[0], hw[1]],
                w: vec![c * mult, 1, k[0], k[1]],
                group: c,
                strides: strides.to_vec(),
                dil: dil.to_vec(),
                pads: pads.to_vec(),
                bias: mult == 1,
            });
        }
    }

    #[test]
    fn pads_larger_than_the_input() {
        for (group, w_in) in [(1, 3), (3, 1)] {
            check(&Case { x: vec![1, 3, 3, 4], w: vec![3, w_in, 2, 2], group, strides: vec![2, 3], dil: vec![1, 1], pads: vec![5, 4, 6, 3], bias: true });
            check(&Case { x: vec![1, 3, 2, 9], w: vec![3, w_in, 3, 1], group, strides: vec![1, 1], dil: vec![3, 1], pads: vec![7, 0, 7, 0], bias: false });
        }
    }

    #[test]
    fn conv1d_and_conv3d_match_reference() {
        check(&Case { x: vec![1, 3, 17], w: vec![4, 3, 3], group: 1, strides: vec![2], dil: vec![2], pads: vec![1, 2], bias: true });
        check(&Case { x: vec![2, 4, 9], w: vec![4, 1, 5], group: 4, strides: vec![1], dil: vec![1], pads: vec![2, 2], bias: false });
        check(&Case {
            x: vec![1, 2, 5, 6, 7],
            w: vec![3, 2, 2, 3, 3],
            group: 1,
            strides: vec![1, 2, 1],
            dil: vec![2, 1, 1],
            pads: vec![1, 0, 1, 0, 1, 1],
            bias: true,
        });
        check(&Case {
            x: vec![1, 3, 4, 5, 6],
            w: vec![3, 1, 3, 3, 3],
            group: 3,
            strides: vec![1, 1, 2],
            dil: vec![1, 1, 1],
            pads: vec![1, 1, 1, 1, 1, 1],
            bias: false,
        });
    }

    #[test]
    fn large_pointwise_and_im2col_paths_match_reference() {
        // Big enough to take the tiled / parallel paths.
        check(&Case { x: vec![2, 16, 37, 41], w: vec![24, 16, 1, 1], group: 1, strides: vec![1, 1], dil: vec![1, 1], pads: vec![0; 4], bias: true });
        check(&Case { x: vec![2, 8, 33, 35], w: vec![16, 8, 3, 3], group: 1, strides: vec![1, 1], dil: vec![1, 1], pads: vec![1; 4], bias: false });
        check(&Case { x: vec![1, 8, 70, 9], w: vec![16, 8, 1, 1], group: 1, strides: vec![2, 1], dil: vec![1, 1], pads: vec![0; 4], bias: true });
        check(&Case { x: vec![1, 32, 9, 9], w: vec![64, 16, 3, 3], group: 2, strides: vec![1, 1], dil: vec![1, 1], pads: vec![1; 4], bias: true });
    }

    #[test]
    fn auto_pad_and_kernel_shape() {
        let x = rand_f32(&[1, 1, 6, 5], 4);
        let w = rand_f32(&[1, 1, 3, 3], 5);
        for (mode, begin) in [("SAME_UPPER", [0i64, 1]), ("SAME_LOWER", [1, 1]), ("VALID", [0, 0])] {
            let op = make("Conv", 19, &[("auto_pad", Attr::String(mode.into())), ("strides", ints(&[2, 1])), ("kernel_shape", ints(&[3, 3]))], 2, 1).unwrap();
            let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap().remove(0);
            let out: Vec<usize> = y.dims()[2..].to_vec();
            let want = reference(&x, &w, None, 1, &[2, 1], &[1, 1], &begin, &out);
            assert_close(&y, &want, 1e-5, mode);
            let expect = if mode == "VALID" { vec![2, 3] } else { vec![3, 5] };
            assert_eq!(out, expect, "{mode}");
        }
    }

    /// Fused activations (op name, the standalone op's attributes, the fused params).
    pub(super) fn activations() -> Vec<(&'static str, Vec<(&'static str, Attr)>, Vec<f32>)> {
        let f = |v: f32| Attr::Float(v);
        vec![
            ("Relu", vec![], vec![]),
            ("Clip", vec![], vec![0.0, 6.0]),
            ("LeakyRelu", vec![("alpha", f(0.13))], vec![0.13]),
            ("HardSigmoid", vec![("alpha", f(0.3)), ("beta", f(0.45))], vec![0.3, 0.45]),
            ("HardSwish", vec![], vec![]),
            ("Sigmoid", vec![], vec![]),
            ("Tanh", vec![], vec![]),
            ("Elu", vec![("alpha", f(0.7))], vec![0.7]),
            ("Selu", vec![("alpha", f(1.5)), ("gamma", f(1.2))], vec![1.5, 1.2]),
            ("Softplus", vec![], vec![]),
        ]
    }

    /// Runs the standalone activation op on `y` (Clip with constant bounds 0 and 6).
    pub(super) fn activate(name: &str, attrs: &[(&str, Attr)], y: &Tensor) -> Tensor {
        if name == "Clip" {
            let (lo, hi) = (Tensor::scalar(0f32), Tensor::scalar(6f32));
            let op = make("Clip", 19, &[], 3, 1).unwrap();
            return run(op.as_ref(), &as_inputs(&[Some(y), Some(&lo), Some(&hi)], &[]), &[]).unwrap().remove(0);
        }
        run(make(name, 19, attrs, 1, 1).unwrap().as_ref(), &as_inputs(&[Some(y)], &[]), &[]).unwrap().remove(0)
    }

    #[test]
    fn fused_activations_equal_conv_then_activation() {
        // (x, w, group, strides, pads): pointwise GEMM, im2col tiles, one big tile with a
        // parallel GEMM, grouped, depthwise 2-D (phase planes) and 3-D (row loop), 1-D.
        let cases: Vec<(Vec<usize>, Vec<usize>, usize, Vec<i64>, Vec<i64>)> = vec![
            (vec![2, 16, 37, 41], vec![24, 16, 1, 1], 1, vec![1, 1], vec![0; 4]),
            (vec![2, 8, 33, 35], vec![16, 8, 3, 3], 1, vec![1, 1], vec![1; 4]),
            (vec![1, 3, 7, 6], vec![5, 3, 3, 2], 1, vec![2, 1], vec![1, 0, 0, 1]),
            (vec![1, 64, 9, 9], vec![128, 64, 3, 3], 1, vec![1, 1], vec![1; 4]),
            (vec![1, 32, 9, 9], vec![64, 16, 3, 3], 2, vec![1, 1], vec![1; 4]),
            (vec![2, 3, 9, 11], vec![3, 1, 3, 3], 3, vec![2, 2], vec![1; 4]),
            (vec![1, 5, 7, 7], vec![10, 1, 5, 5], 5, vec![1, 1], vec![2; 4]),
            (vec![1, 3, 4, 5, 6], vec![3, 1, 3, 3, 3], 3, vec![1, 1, 2], vec![1; 6]),
            (vec![1, 3, 17], vec![4, 3, 3], 1, vec![2], vec![1, 2]),
        ];
        for (xd, wd, group, strides, pads) in cases {
            let (x, w, b) = (rand_f32(&xd, 21), rand_f32(&wd, 22), rand_f32(&[wd[0]], 23));
            let mut attrs = vec![("group", Attr::Int(group as i64)), ("strides", ints(&strides)), ("pads", ints(&pads))];
            let plain = run(make("Conv", 19, &attrs, 3, 1).unwrap().as_ref(), &as_inputs(&[Some(&x), Some(&w), Some(&b)], &[]), &[]).unwrap().remove(0);
            attrs.push((ACTIVATION_ATTR, Attr::String(String::new())));
            attrs.push((ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![])));
            for (name, act_attrs, params) in activations() {
                let want = activate(name, &act_attrs, &plain).to_f64_vec();
                let n = attrs.len();
                attrs[n - 2].1 = Attr::String(name.into());
                attrs[n - 1].1 = Attr::Floats(params);
                let op = make("Conv", 19, &attrs, 3, 1).unwrap();
                let tunes = [tune(&[("oc_block", 3), ("px_block", 2)])];
                let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w), Some(&b)], &[]), &tunes).unwrap().remove(0);
                assert_close(&got, &want, 1e-6, &format!("{name} x{xd:?} w{wd:?} g{group}"));
            }
        }
    }

    #[test]
    fn fused_activation_in_wgsl_f64_and_bad_attrs() {
        let (x, w) = (rand_f32(&[1, 2, 5, 5], 1), rand_f32(&[3, 2, 3, 3], 2));
        let attrs = [(ACTIVATION_ATTR, Attr::String("Clip".into())), (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![0.0, 6.0]))];
        let op = make("Conv", 19, &attrs, 2, 1).unwrap();
        let types = [TensorType::new(DType::F32, x.dims()), TensorType::new(DType::F32, w.dims())];
        let args: Vec<Option<Arg>> = types.iter().map(|ty| Some(Arg { ty, value: None })).collect();
        let outs = op.infer(&args).unwrap();
        let prog = op.wgsl().unwrap().generate(&args, &outs, &Default::default()).unwrap();
        assert!(prog.dispatches[0].source.contains("= kiln_act(acc0_0 + bias)"));
        // f64 (and f16) apply the activation to the finished output.
        let x64 = Tensor::from_vec(x.dims(), x.to_f64_vec()).unwrap();
        let w64 = Tensor::from_vec(w.dims(), w.to_f64_vec().iter().map(|v| v * 8.0).collect()).unwrap();
        let plain = run(make("Conv", 19, &[], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&x64), Some(&w64)], &[]), &[]).unwrap().remove(0);
        let got = run(op.as_ref(), &as_inputs(&[Some(&x64), Some(&w64)], &[]), &[]).unwrap().remove(0);
        let want: Vec<f64> = plain.to_f64_vec().iter().map(|v| v.clamp(0.0, 6.0)).collect();
        assert!(want.iter().any(|&v| v == 6.0) && want.iter().any(|&v| v == 0.0));
        assert_eq!(got.to_f64_vec(), want);
        for (name, params) in [("Exp", vec![]), ("Clip", vec![0.0]), ("Nope", vec![])] {
            let bad = [(ACTIVATION_ATTR, Attr::String(name.into())), (ACTIVATION_PARAMS_ATTR, Attr::Floats(params))];
            assert!(make("Conv", 19, &bad, 2, 1).is_err(), "{name}");
        }
    }

    #[test]
    fn f64_and_bad_inputs() {
        let xs = rand_values(2 * 3 * 6 * 6, 9);
        let x = Tensor::from_vec(&[2, 3, 6, 6], xs.iter().map(|&v| v as f64).collect()).unwrap();
        let w = Tensor::from_vec(&[2, 3, 3, 3], rand_values(54, 8).iter().map(|&v| v as f64).collect()).unwrap();
        let op = make("Conv", 19, &[("pads", ints(&[1, 1, 1, 1]))], 2, 1).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap().remove(0);
        let want = reference(&x, &w, None, 1, &[1, 1], &[1, 1], &[1, 1], &[6, 6]);
        for (g, w) in y.to_f64_vec().iter().zip(&want) {
            assert!((g - w).abs() < 1e-12);
        }
        let xh = Tensor::from_vec(&[2, 3, 6, 6], xs.iter().map(|&v| half::f16::from_f32(v)).collect()).unwrap();
        let wh = Tensor::from_vec(&[2, 3, 3, 3], rand_values(54, 8).iter().map(|&v| half::f16::from_f32(v)).collect()).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&xh), Some(&wh)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.dtype(), kiln_graph::DType::F16);
        let want = reference(&xh, &wh, None, 1, &[1, 1], &[1, 1], &[1, 1], &[6, 6]);
        for (g, w) in y.to_f64_vec().iter().zip(&want) {
            assert!((g - w).abs() < 4e-3 * w.abs().max(1.0), "{g} vs {w}");
        }
        let xf = rand_f32(&[1, 4, 5, 5], 1);
        let wf = rand_f32(&[2, 3, 3, 3], 1);
        assert!(run(make("Conv", 19, &[], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&xf), Some(&wf)], &[]), &[]).is_err());
        let wf = rand_f32(&[2, 4, 7, 7], 1);
        assert!(run(make("Conv", 19, &[], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&xf), Some(&wf)], &[]), &[]).is_err());
        assert!(make("Conv", 19, &[("auto_pad", Attr::String("BOGUS".into()))], 2, 1).is_err());
        assert!(make("Conv", 19, &[("strides", ints(&[0, 1]))], 2, 1).is_err());
    }
}
