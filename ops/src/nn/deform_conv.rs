//! DeformConv (opset 19), 2-D: a grouped convolution whose every kernel tap samples
//! the input at a learned offset. For output `(n, o, i, j)`, tap `(a, b)` of input
//! channel `c` (offset group `g = c / (C / offset_group)`) reads `X[n, c]` bilinearly
//! at `(i s_h - p_top + a d_h + dy, j s_w - p_left + b d_w + dx)`, where `(dy, dx)` is
//! `offset[n, ((g kH + a) kW + b) 2 + {0, 1}, i, j]`, weighted by `W[o, c % C_g, a, b]`
//! and by `mask[n, (g kH + a) kW + b, i, j]` (default 1); plus `B[o]`. Samples outside
//! the image read zeros (GridSample's bilinear, zero padding, aligned corners). The
//! output's spatial dims are the offset's, and must equal the usual convolution's.
//!
//! Both kernels compute each output element directly (the GPU: one invocation each,
//! `C_g kH kW` taps).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct DeformConv {
    group: usize,
    offset_group: usize,
    kernel: Option<Vec<i64>>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    pads: Vec<i64>,
}

/// The geometry of one application.
#[derive(Clone, Copy, Debug)]
struct Geo {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    cg: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: i64,
    pl: i64,
    og: usize,
}

fn positive(v: &[i64], what: &str) -> Result<[usize; 2]> {
    match *v {
        [a, b] if a >= 1 && b >= 1 => Ok([a as usize, b as usize]),
        _ => Err(OpError::Attr { attr: what.into(), what: format!("expected 2 positive values, found {v:?}") }),
    }
}

impl DeformConv {
    fn geometry(&self, inputs: &[Option<Arg>]) -> Result<Geo> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let (x, wt, off) = (required(inputs, 0)?, required(inputs, 1)?, required(inputs, 2)?);
        let (n, c, h, w) = match *x.dims() {
            [n, c, h, w] => (n, c, h, w),
            ref d => return Err(OpError::Unsupported(format!("DeformConv of a {}-D input {d:?}: only 2-D (N, C, H, W) is implemented", d.len().saturating_sub(2)))),
        };
        let (o, cg, kh, kw) = match *wt.dims() {
            [o, cg, kh, kw] if wt.dtype() == dtype => (o, cg, kh, kw),
            ref d => return Err(OpError::input(1, format!("W must be {dtype}[M, C/group, kH, kW], found {} {d:?}", wt.dtype()))),
        };
        if let Some(k) = &self.kernel {
            if positive(k, "kernel_shape")? != [kh, kw] {
                return Err(OpError::Attr { attr: "kernel_shape".into(), what: format!("{k:?} differs from W's [{kh}, {kw}]") });
            }
        }
        let (g, og) = (self.group, self.offset_group);
        if cg * g != c || o % g != 0 || c % og != 0 {
            return Err(OpError::input(1, format!("W {:?} with group {g} and offset_group {og} does not fit {c} input channels", wt.dims())));
        }
        let [sh, sw] = positive(&self.strides, "strides")?;
        let [dh, dw] = positive(&self.dilations, "dilations")?;
        let (pt, pl, pb, pr) = match *self.pads {
            [a, b, c, d] if a >= 0 && b >= 0 && c >= 0 && d >= 0 => (a, b, c, d),
            ref p => return Err(OpError::Attr { attr: "pads".into(), what: format!("expected 4 non-negative values, found {p:?}") }),
        };
        let span = |k: usize, d: usize| ((k - 1) * d + 1) as i64;
        let oh = (h as i64 + pt + pb - span(kh, dh)).div_euclid(sh as i64) + 1;
        let ow = (w as i64 + pl + pr - span(kw, dw)).div_euclid(sw as i64) + 1;
        if off.dtype() != dtype || off.dims() != [n, og * kh * kw * 2, oh.max(0) as usize, ow.max(0) as usize] {
            return Err(OpError::input(2, format!("offset must be {dtype}[{n}, {}, {oh}, {ow}], found {}", og * kh * kw * 2, off.ty)));
        }
        let (oh, ow) = (oh as usize, ow as usize);
        if let Some(b) = inputs.get(3).copied().flatten() {
            if b.dims() != [o] || b.dtype() != dtype {
                return Err(OpError::input(3, format!("B must be {dtype}[{o}], found {}", b.ty)));
            }
        }
        if let Some(m) = inputs.get(4).copied().flatten() {
            if m.dims() != [n, og * kh * kw, oh, ow] || m.dtype() != dtype {
                return Err(OpError::input(4, format!("mask must be {dtype}[{n}, {}, {oh}, {ow}], found {}", og * kh * kw, m.ty)));
            }
        }
        Ok(Geo { n, c, h, w, o, cg, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, og })
    }
}

/// Bilinear sample of the `h x w` plane at (y, x), zeros outside.
fn sample(plane: &[f64], h: usize, w: usize, y: f64, x: f64) -> f64 {
    let (y0, x0) = (y.floor(), x.floor());
    let (fy, fx) = (y - y0, x - x0);
    let at = |yy: f64, xx: f64| {
        if yy >= 0.0 && xx >= 0.0 && yy < h as f64 && xx < w as f64 { plane[yy as usize * w + xx as usize] } else { 0.0 }
    };
    at(y0, x0) * (1.0 - fy) * (1.0 - fx) + at(y0, x0 + 1.0) * (1.0 - fy) * fx + at(y0 + 1.0, x0) * fy * (1.0 - fx) + at(y0 + 1.0, x0 + 1.0) * fy * fx
}

impl Op for DeformConv {
    fn name(&self) -> &str {
        "DeformConv"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let g = self.geometry(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), vec![g.n, g.o, g.oh, g.ow])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.geometry(inputs).map(|g| (g.n * g.o * g.oh * g.ow * g.cg * g.kh * g.kw * 12) as u64).unwrap_or(0);
        Cost { flops, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for DeformConv {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let g = crate::tensor::tensor_args(inputs, |a| self.geometry(a))?;
        let x = cpu::input(inputs, 0)?.to_f64_vec();
        let wt = cpu::input(inputs, 1)?.to_f64_vec();
        let off = cpu::input(inputs, 2)?.to_f64_vec();
        let bias = inputs.get(3).copied().flatten().map(|t| t.to_f64_vec());
        let mask = inputs.get(4).copied().flatten().map(|t| t.to_f64_vec());
        let (plane, opix) = (g.h * g.w, g.oh * g.ow);
        let (og_c, o_per_g, taps) = (g.c / g.og, g.o / self.group, g.kh * g.kw);
        let mut y = vec![0.0; g.n * g.o * opix];
        cpu::par_chunks_mut(&mut y, opix, g.cg * taps * 12, |p0, part| {
            for (k, out) in part.chunks_mut(opix).enumerate() {
                let (n, o) = ((p0 + k) / g.o, (p0 + k) % g.o);
                let grp = o / o_per_g;
                for (pix, v) in out.iter_mut().enumerate() {
                    let (i, j) = (pix / g.ow, pix % g.ow);
                    let mut acc = bias.as_ref().map_or(0.0, |b| b[o]);
                    for ci in 0..g.cg {
                        let c = grp * g.cg + ci;
                        let og = c / og_c;
                        for a in 0..g.kh {
                            for b in 0..g.kw {
                                let tap = (og * g.kh + a) * g.kw + b;
                                let dy = off[((n * g.og * taps * 2) + tap * 2) * opix + pix];
                                let dx = off[((n * g.og * taps * 2) + tap * 2 + 1) * opix + pix];
                                let m = mask.as_ref().map_or(1.0, |m| m[(n * g.og * taps + tap) * opix + pix]);
                                let yy = (i * g.sh) as f64 - g.pt as f64 + (a * g.dh) as f64 + dy;
                                let xx = (j * g.sw) as f64 - g.pl as f64 + (b * g.dw) as f64 + dx;
                                let s = sample(&x[(n * g.c + c) * plane..][..plane], g.h, g.w, yy, xx);
                                acc += wt[((o * g.cg + ci) * g.kh + a) * g.kw + b] * m * s;
                            }
                        }
                    }
                    *v = acc;
                }
            }
        });
        let dtype = outputs[0].dtype();
        outputs[0] = Tensor::from_f64(dtype, &[g.n, g.o, g.oh, g.ow], &y)?;
        Ok(())
    }
}

impl WgslKernel for DeformConv {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let g = self.geometry(inputs)?;
        let taps = g.kh * g.kw;
        if g.cg * taps > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("DeformConv with {} taps per output: one GPU invocation each", g.cg * taps)));
        }
        let has_bias = inputs.get(3).copied().flatten().is_some();
        let has_mask = inputs.get(4).copied().flatten().is_some();
        let mut buffers = vec![("x", "f32", true), ("wt", "f32", true), ("off", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2)];
        if has_bias {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(3));
        }
        if has_mask {
            buffers.push(("mask", "f32", true));
            bindings.push(Binding::Input(4));
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        let helpers = format!(
            "fn px(base: u32, yy: f32, xx: f32) -> f32 {{\n    if (yy < 0.0 || xx < 0.0 || yy >= {h}.0 || xx >= {w}.0) {{ return 0.0; }}\n    \
             return x[base + u32(yy) * {w}u + u32(xx)];\n}}\n\
             fn sample(base: u32, yy: f32, xx: f32) -> f32 {{\n    let y0 = floor(yy);\n    let x0 = floor(xx);\n    let fy = yy - y0;\n    let fx = xx - x0;\n    \
             return px(base, y0, x0) * (1.0 - fy) * (1.0 - fx) + px(base, y0, x0 + 1.0) * (1.0 - fy) * fx\n        \
             + px(base, y0 + 1.0, x0) * fy * (1.0 - fx) + px(base, y0 + 1.0, x0 + 1.0) * fy * fx;\n}}\n",
            h = g.h,
            w = g.w
        );
        let opix = g.oh * g.ow;
        let body = format!(
            "let pix = i % {opix}u;\n    let o = (i / {opix}u) % {o}u;\n    let n = i / ({opix}u * {o}u);\n    let oi = pix / {ow}u;\n    let oj = pix % {ow}u;\n    \
             let grp = o / {opg}u;\n    var acc = {init};\n    \
             for (var ci = 0u; ci < {cg}u; ci = ci + 1u) {{\n        let c = grp * {cg}u + ci;\n        let og = c / {ogc}u;\n        \
             for (var a = 0u; a < {kh}u; a = a + 1u) {{\n            for (var b = 0u; b < {kw}u; b = b + 1u) {{\n                \
             let tap = (og * {kh}u + a) * {kw}u + b;\n                let dy = off[(n * {offc}u + tap * 2u) * {opix}u + pix];\n                \
             let dx = off[(n * {offc}u + tap * 2u + 1u) * {opix}u + pix];\n                let m = {m};\n                \
             let yy = f32(oi * {sh}u) - {pt}.0 + f32(a * {dh}u) + dy;\n                let xx = f32(oj * {sw}u) - {pl}.0 + f32(b * {dw}u) + dx;\n                \
             acc = acc + wt[((o * {cg}u + ci) * {kh}u + a) * {kw}u + b] * m * sample((n * {c}u + c) * {plane}u, yy, xx);\n            }}\n        }}\n    }}\n    y[i] = acc;",
            o = g.o,
            ow = g.ow,
            opg = g.o / self.group,
            init = if has_bias { "bias[o]" } else { "0.0" },
            cg = g.cg,
            ogc = g.c / g.og,
            kh = g.kh,
            kw = g.kw,
            offc = g.og * taps * 2,
            m = if has_mask { format!("mask[(n * {}u + tap) * {opix}u + pix]", g.og * taps) } else { "1.0".into() },
            sh = g.sh,
            sw = g.sw,
            dh = g.dh,
            dw = g.dw,
            pt = g.pt,
            pl = g.pl,
            c = g.c,
            plane = g.h * g.w,
        );
        Ok(WgslProgram::single(wgsl::simple_kernel("DeformConv", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, &helpers, &body)))
    }
}

fn parse(spec: &NodeSpec) -> Result<DeformConv> {
    let count = |name: &str| -> Result<usize> {
        let v = spec.int(name, 1)?;
        usize::try_from(v).ok().filter(|&g| g >= 1).ok_or_else(|| spec.bad(name, format!("expected >= 1, found {v}")))
    };
    Ok(DeformConv {
        group: count("group")?,
        offset_group: count("offset_group")?,
        kernel: spec.ints_opt("kernel_shape")?,
        strides: spec.ints("strides", &[1, 1])?,
        dilations: spec.ints("dilations", &[1, 1])?,
        pads: spec.ints("pads", &[0, 0, 0, 0])?,
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "DeformConv", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    /// `(((i * 7 + s) % 11) / 10 - 0.5) * scale + shift`, the inputs the reference ran on.
    fn vals(dims: &[usize], s: usize, scale: f32, shift: f32) -> kiln_graph::Tensor {
        let n: usize = dims.iter().product();
        f32s(dims, &(0..n).map(|i| (((i * 7 + s) % 11) as f32 / 10.0 - 0.5) * scale + shift).collect::<Vec<_>>())
    }

    #[test]
    fn matches_onnx_reference_with_offset_groups_mask_and_bias() {
        // onnx.reference's DeformConv: X [1, 2, 4, 5], W [3, 2, 2, 2], offsets up to
        // +-1.25 px (some samples leave the image), 2 offset groups, asymmetric pads.
        let case = Case::new("DeformConv")
            .opset(19)
            .attrs(&[("pads", ints(&[1, 0, 0, 1])), ("strides", ints(&[1, 2])), ("offset_group", Attr::Int(2)), ("kernel_shape", ints(&[2, 2]))])
            .input(vals(&[1, 2, 4, 5], 1, 1.0, 0.0))
            .input(vals(&[3, 2, 2, 2], 2, 1.0, 0.0))
            .input(vals(&[1, 16, 4, 3], 3, 2.5, 0.0))
            .input(vals(&[3], 4, 1.0, 0.0))
            .input(vals(&[1, 8, 4, 3], 5, 1.0, 0.5));
        let want = [
            -0.08800000697374344, -0.010499998927116394, -0.08524999767541885, -0.16562500596046448, -0.21175000071525574, 0.039750002324581146,
            -0.14862501621246338, -0.33812499046325684, -0.052000001072883606, -0.05349999666213989, -0.2200000286102295, -0.1274999976158142,
            -0.5158124566078186, -0.375, -0.4909375011920929, -0.5923750400543213, -0.5958124995231628, -0.3798750042915344, -0.5866249799728394,
            -0.7012500166893005, -0.4716874957084656, -0.4491249918937683, -0.580750048160553, -0.5168750286102295, 0.1625625044107437,
            0.3605000078678131, 0.20337501168251038, 0.08087500184774399, 0.12012499570846558, 0.27162498235702515, 0.28162500262260437,
            0.10987500101327896, 0.21412499248981476, 0.1562500149011612, 0.15850000083446503, 0.23087500035762787,
        ];
        let got = case.run_cpu().unwrap();
        assert_eq!(got[0].dims(), &[1, 3, 4, 3]);
        assert_close(&got[0], &want, 1e-5, "DeformConv");
        // An offset tensor of the wrong spatial size is an error.
        let bad = Case::new("DeformConv").opset(19).input(vals(&[1, 2, 4, 5], 1, 1.0, 0.0)).input(vals(&[3, 2, 2, 2], 2, 1.0, 0.0)).input(vals(&[1, 8, 4, 3], 3, 1.0, 0.0));
        assert!(bad.run_cpu().is_err());
    }
}
