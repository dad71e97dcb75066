//! Resize (opsets 10-19) and Upsample (7-9): nearest (every nearest_mode) and linear
//! (bi-/tri-linear, separable over any number of axes) with the coordinate modes
//! half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric and
//! tf_crop_and_resize; output size from scales or sizes (with keep_aspect_ratio_policy
//! and axes). Cubic mode and antialiased linear downsampling are reported unsupported.
//!
//! Source coordinates follow the ONNX reference implementation exactly (in f64). Nearest
//! becomes an index map (a regular table turns into closed-form GPU code); linear runs
//! its own kernel, with each axis' coordinate affine in the output index.
use super::common::tensor_args;
use super::index_map::{DimMap, IndexMap};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Nearest,
    Linear,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 / Upsample: floor when upsampling, ceil when downsampling.
    Simple,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Stretch,
    NotLarger,
    NotSmaller,
}

/// Where the scales/sizes/roi come from.
#[derive(Clone, Debug, PartialEq)]
enum Source {
    /// Upsample-7: scales attribute.
    ScalesAttr(Vec<f32>),
    /// Resize-10 / Upsample-9: scales input 1.
    ScalesInput,
    /// Resize-11+: roi input 1, scales input 2, sizes input 3.
    Full,
}

#[derive(Debug)]
pub struct Resize {
    name: &'static str,
    mode: Mode,
    coord: Coord,
    nearest: Nearest,
    extrapolation: f32,
    antialias: bool,
    axes: Option<Vec<i64>>,
    policy: Policy,
    source: Source,
}

/// One axis: input size, output size, scale, roi, and whether it is left unchanged.
#[derive(Clone, Copy, Debug)]
struct Axis {
    n: usize,
    m: usize,
    scale: f64,
    roi: (f64, f64),
    identity: bool,
}

impl Axis {
    /// Source coordinate of output index `o` (the ONNX reference formulas, in f64).
    fn coord(&self, mode: Coord, o: usize) -> f64 {
        let (y, n, s) = (o as f64, self.n as f64, self.scale);
        let width = s * n;
        match mode {
            Coord::AlignCorners => if width == 1.0 { 0.0 } else { y * (n - 1.0) / (width - 1.0) },
            Coord::Asymmetric => y / s,
            Coord::TfCropAndResize => {
                let (a, b) = self.roi;
                let x = if width == 1.0 { (b - a) * (n - 1.0) / 2.0 } else { y * (b - a) * (n - 1.0) / (width - 1.0) };
                x + a * (n - 1.0)
            }
            Coord::PytorchHalfPixel => if width == 1.0 { -0.5 } else { (y + 0.5) / s - 0.5 },
            Coord::HalfPixel => (y + 0.5) / s - 0.5,
            Coord::HalfPixelSymmetric => {
                let offset = n / 2.0 * (1.0 - self.m as f64 / width);
                offset + (y + 0.5) / s - 0.5
            }
        }
    }

    fn outside(&self, mode: Coord, x: f64) -> bool {
        mode == Coord::TfCropAndResize && (x < 0.0 || x > self.n as f64 - 1.0)
    }
}

impl Resize {
    /// Per-axis sizes and scales for these inputs.
    fn axes_plan(&self, inputs: &[Option<Arg>]) -> Result<Vec<Axis>> {
        let x = required(inputs, 0)?;
        let rank = x.rank();
        let present = |i: usize| -> Result<Option<&Tensor>> {
            match inputs.get(i).copied().flatten() {
                None => Ok(None),
                Some(a) if a.ty.is_empty() => Ok(None),
                Some(_) => Ok(Some(crate::constant(inputs, i, "Resize's scales/sizes/roi")?)),
            }
        };
        let (roi, scales, sizes) = match &self.source {
            Source::ScalesAttr(s) => (None, Some(s.iter().map(|&v| v as f64).collect::<Vec<_>>()), None),
            Source::ScalesInput => (None, present(1)?.map(|t| t.to_f64_vec()), None),
            Source::Full => (
                if self.coord == Coord::TfCropAndResize { present(1)?.map(|t| t.to_f64_vec()) } else { None },
                present(2)?.map(|t| t.to_f64_vec()),
                present(3)?.map(|t| t.to_i64_vec()).transpose()?,
            ),
        };
        let axes = match &self.axes {
            Some(a) => super::common::norm_axes(a, rank)?,
            None => (0..rank).collect(),
        };
        let k = axes.len();
        let mut plan: Vec<Axis> =
            x.dims().iter().map(|&n| Axis { n, m: n, scale: 1.0, roi: (0.0, 1.0), identity: true }).collect();
        if let Some(r) = &roi {
            if r.len() != 2 * k {
                return Err(OpError::input(1, format!("roi has {} values, expected {}", r.len(), 2 * k)));
            }
            for (i, &a) in axes.iter().enumerate() {
                plan[a].roi = (r[i], r[k + i]);
            }
        }
        match (scales, sizes) {
            (_, Some(sizes)) => {
                if sizes.len() != k || sizes.iter().any(|&s| s < 0) {
                    return Err(OpError::input(3, format!("sizes {sizes:?} must give {k} non-negative sizes")));
                }
                let ratios: Vec<f64> = axes.iter().zip(&sizes).map(|(&a, &s)| s as f64 / plan[a].n as f64).collect();
                let common = match self.policy {
                    Policy::Stretch => None,
                    Policy::NotLarger => Some(ratios.iter().copied().fold(f64::INFINITY, f64::min)),
                    Policy::NotSmaller => Some(ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
                };
                for (i, &a) in axes.iter().enumerate() {
                    match common {
                        None => {
                            plan[a].scale = ratios[i];
                            plan[a].m = sizes[i] as usize;
                        }
                        Some(s) => {
                            plan[a].scale = s;
                            plan[a].m = (s * plan[a].n as f64 + 0.5) as usize;
                        }
                    }
                }
            }
            (Some(scales), None) => {
                if scales.len() != k || scales.iter().any(|&s| s.is_nan() || s <= 0.0 || !s.is_finite()) {
                    return Err(OpError::input(
                        if self.source == Source::Full { 2 } else { 1 },
                        format!("scales {scales:?} must give {k} positive scales (input shape {:?})", x.dims()),
                    ));
                }
                for (i, &a) in axes.iter().enumerate() {
                    plan[a].scale = scales[i];
                    plan[a].m = (scales[i] * plan[a].n as f64) as usize;
                }
            }
            (None, None) => return Err(OpError::invalid("Resize needs scales or sizes")),
        }
        for p in &mut plan {
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
            p.identity = close(p.scale, 1.0) && p.m == p.n && close(p.roi.0, 0.0) && close(p.roi.1, 1.0);
            if p.n == 0 && p.m > 0 {
                return Err(OpError::invalid("Resize of an empty axis to a non-empty one"));
            }
        }
        if self.antialias && self.mode == Mode::Linear && plan.iter().any(|p| p.scale < 1.0) {
            return Err(OpError::Unsupported("Resize with antialias=1 when downsampling".into()));
        }
        Ok(plan)
    }

    /// Nearest: the source index of output `o` on axis `p` (None = extrapolate).
    fn nearest_index(&self, p: &Axis, o: usize) -> Option<i64> {
        let x = p.coord(self.coord, o);
        if p.outside(self.coord, x) {
            return None;
        }
        let f = x.floor();
        let r = x - f;
        let i = if r == 0.0 {
            f
        } else {
            match self.nearest {
                Nearest::RoundPreferFloor => if r <= 0.5 { f } else { f + 1.0 },
                Nearest::RoundPreferCeil => if r < 0.5 { f } else { f + 1.0 },
                Nearest::Floor => f,
                Nearest::Ceil => f + 1.0,
                Nearest::Simple => if p.scale < 1.0 { f + 1.0 } else { f },
            }
        };
        Some((i as i64).clamp(0, p.n as i64 - 1))
    }

    fn nearest_map(&self, plan: &[Axis]) -> IndexMap {
        let dims: Vec<usize> = plan.iter().map(|p| p.n).collect();
        // An empty output reads nothing: no per-axis tables, whose length is the output
        // dim (scales such as [1e12, 0] would otherwise allocate terabytes).
        let empty = plan.iter().any(|p| p.m == 0);
        IndexMap {
            out_dims: plan.iter().map(|p| p.m).collect(),
            maps: plan
                .iter()
                .map(|p| {
                    if p.identity || empty {
                        DimMap::id()
                    } else {
                        DimMap::Table((0..p.m).map(|o| self.nearest_index(p, o).unwrap_or(-1)).collect()).simplified()
                    }
                })
                .collect(),
            strides: crate::broadcast::strides(&dims),
            base: 0,
        }
    }

    /// Linear: per output index of axis `p`, (i0, i1, weight of i1), or None to extrapolate.
    fn linear_taps(&self, p: &Axis) -> Vec<Option<(usize, usize, f64)>> {
        let last = p.n as i64 - 1;
        (0..p.m)
            .map(|o| {
                if p.identity {
                    return Some((o, o, 0.0));
                }
                let x = p.coord(self.coord, o);
                if p.outside(self.coord, x) {
                    return None;
                }
                let f = x.floor();
                let i = f as i64;
                Some((i.clamp(0, last) as usize, (i + 1).clamp(0, last) as usize, x - f))
            })
            .collect()
    }
}

impl Op for Resize {
    fn name(&self) -> &str {
        self.name
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        if self.mode == Mode::Linear && !x.dtype().is_float() {
            return Err(OpError::Unsupported(format!("linear {} of {} data", self.name, x.dtype())));
        }
        let plan = self.axes_plan(inputs)?;
        Ok(vec![TensorType::new(x.dtype(), plan.iter().map(|p| p.m).collect::<Vec<_>>())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Resize {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let plan = tensor_args(inputs, |a| self.axes_plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let out = &mut outputs[0];
        if plan.iter().any(|p| p.m == 0) {
            return Ok(()); // an empty output: nothing to compute, no tables to build
        }
        if self.mode == Mode::Nearest {
            let fill = Tensor::from_f64(x.dtype(), &[], &[self.extrapolation as f64])?;
            return self.nearest_map(&plan).run(x, out, fill.bytes());
        }
        let taps: Vec<Vec<Option<(usize, usize, f64)>>> = plan.iter().map(|p| self.linear_taps(p)).collect();
        let in_strides = crate::broadcast::strides(&plan.iter().map(|p| p.n).collect::<Vec<_>>());
        let out_dims: Vec<usize> = plan.iter().map(|p| p.m).collect();
        let active: Vec<usize> = (0..plan.len()).filter(|&d| !plan[d].identity).collect();
        let src = x.to_f64_vec();
        let ext = self.extrapolation as f64;
        let value = |mut idx: usize| -> f64 {
            // decompose the output index; identity axes contribute directly
            let mut base = 0usize;
            let mut sel = [(0usize, 0usize, 0f64); 8];
            for d in (0..out_dims.len()).rev() {
                let o = idx % out_dims[d];
                idx /= out_dims[d];
                match taps[d][o] {
                    None => return ext,
                    Some((i0, i1, w)) => {
                        if plan[d].identity {
                            base += i0 * in_strides[d];
                        } else if let Some(k) = active.iter().position(|&a| a == d) {
                            sel[k] = (i0 * in_strides[d], i1 * in_strides[d], w);
                        }
                    }
                }
            }
            let mut acc = 0.0;
            for combo in 0..1usize << active.len() {
                let (mut off, mut wt) = (base, 1.0);
                for (k, &(a, b, w)) in sel.iter().enumerate().take(active.len()) {
                    if combo >> k & 1 == 1 {
                        off += b;
                        wt *= w;
                    } else {
                        off += a;
                        wt *= 1.0 - w;
                    }
                }
                if wt != 0.0 {
                    acc += wt * src[off];
                }
            }
            acc
        };
        if active.len() > 8 {
            return Err(OpError::Unsupported("linear Resize over more than 8 axes".into()));
        }
        if out.dtype() == DType::F32 {
            let dst = out.as_mut_slice::<f32>()?;
            cpu::par_chunks_mut(dst, 1, 1 << active.len(), |s, part| {
                for (k, o) in part.iter_mut().enumerate() {
                    *o = value(s + k) as f32;
                }
            });
        } else {
            let v: Vec<f64> = (0..out.len()).map(value).collect();
            *out = Tensor::from_f64(out.dtype(), &out_dims, &v)?;
        }
        Ok(())
    }
}

impl WgslKernel for Resize {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let plan = self.axes_plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let ext = wgsl::literal(ty, self.extrapolation as f64);
        if self.mode == Mode::Nearest {
            let map = self.nearest_map(&plan);
            return Ok(WgslProgram::single(map.dispatch(self.name, ty, wg, Binding::Input(0), Binding::Output(0), &ext, &[])));
        }
        let in_strides = crate::broadcast::strides(&plan.iter().map(|p| p.n).collect::<Vec<_>>());
        let mut code = "var r = i;\n    var base = 0i;\n    var ok = true;\n".to_string();
        let helpers = String::new();
        let mut active = vec![];
        for d in (0..plan.len()).rev() {
            let p = &plan[d];
            let _ = writeln!(code, "    let c{d} = i32(r % {}u);\n    r = r / {}u;", p.m.max(1), p.m.max(1));
            if p.identity {
                let _ = writeln!(code, "    base += c{d} * {}i;", in_strides[d]);
                continue;
            }
            active.push(d);
            // the coordinate is affine in the output index for every mode
            let b = p.coord(self.coord, 0);
            let a = if p.m > 1 { p.coord(self.coord, 1) - b } else { 0.0 };
            let (a, b) = (wgsl::literal("f32", a), wgsl::literal("f32", b));
            let last = p.n as i64 - 1;
            let _ = writeln!(
                code,
                "    let x{d} = {a} * f32(c{d}) + {b};\n    let f{d} = floor(x{d});\n    let w{d} = x{d} - f{d};\n    \
                 let i{d}a = clamp(i32(f{d}), 0i, {last}i) * {s}i;\n    let i{d}b = clamp(i32(f{d}) + 1i, 0i, {last}i) * {s}i;",
                s = in_strides[d]
            );
            if self.coord == Coord::TfCropAndResize {
                let _ = writeln!(code, "    ok = ok && x{d} >= 0.0 && x{d} <= {};", wgsl::literal("f32", last as f64));
            }
        }
        code += "    var acc = 0.0;\n";
        for combo in 0..1usize << active.len() {
            let mut off = "base".to_string();
            let mut wt = "1.0".to_string();
            for (k, &d) in active.iter().enumerate() {
                if combo >> k & 1 == 1 {
                    off += &format!(" + i{d}b");
                    wt += &format!(" * w{d}");
                } else {
                    off += &format!(" + i{d}a");
                    wt += &format!(" * (1.0 - w{d})");
                }
            }
            let _ = writeln!(code, "    acc += {wt} * src[u32({off})];");
        }
        code += &format!("    if (ok) {{ dst[i] = acc; }} else {{ dst[i] = {ext}; }}");
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name,
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            &helpers,
            &code,
        )))
    }
}

fn parse(spec: &NodeSpec, upsample: bool) -> Result<Resize> {
    let name = if upsample { "Upsample" } else { "Resize" };
    let mode = match spec.string("mode", "nearest")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        "cubic" => return Err(OpError::Unsupported(format!("{name} mode 'cubic'"))),
        m => return Err(spec.bad("mode", format!("expected nearest or linear, found '{m}'"))),
    };
    let legacy = upsample || spec.opset <= 10;
    let coord = if legacy {
        Coord::Asymmetric
    } else {
        match spec.string("coordinate_transformation_mode", "half_pixel")?.as_str() {
            "half_pixel" => Coord::HalfPixel,
            "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
            "pytorch_half_pixel" => Coord::PytorchHalfPixel,
            "align_corners" => Coord::AlignCorners,
            "asymmetric" => Coord::Asymmetric,
            "tf_crop_and_resize" => Coord::TfCropAndResize,
            m => return Err(spec.bad("coordinate_transformation_mode", format!("'{m}' is not supported"))),
        }
    };
    let nearest = if legacy {
        Nearest::Simple
    } else {
        match spec.string("nearest_mode", "round_prefer_floor")?.as_str() {
            "round_prefer_floor" => Nearest::RoundPreferFloor,
            "round_prefer_ceil" => Nearest::RoundPreferCeil,
            "floor" => Nearest::Floor,
            "ceil" => Nearest::Ceil,
            m => return Err(spec.bad("nearest_mode", format!("'{m}' is not a nearest mode"))),
        }
    };
    let policy = match spec.string("keep_aspect_ratio_policy", "stretch")?.as_str() {
        "stretch" => Policy::Stretch,
        "not_larger" => Policy::NotLarger,
        "not_smaller" => Policy::NotSmaller,
        m => return Err(spec.bad("keep_aspect_ratio_policy", format!("'{m}' is not a policy"))),
    };
    let source = if upsample && spec.opset < 9 {
        Source::ScalesAttr(spec.floats_opt("scales")?.ok_or_else(|| spec.bad("scales", "required before opset 9"))?)
    } else if legacy {
        Source::ScalesInput
    } else {
        Source::Full
    };
    Ok(Resize {
        name,
        mode,
        coord,
        nearest,
        extrapolation: spec.float("extrapolation_value", 0.0)?,
        antialias: spec.int("antialias", 0)? != 0,
        axes: spec.ints_opt("axes")?,
        policy,
        source,
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Resize", |spec| Ok(Box::new(parse(spec, false)?)));
    r.register("", "Upsample", |spec| Ok(Box::new(parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    //! Expected values come from the ONNX reference implementation (onnx.reference).
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn s(v: &str) -> Attr {
        Attr::String(v.into())
    }

    fn assert_close(got: &Tensor, want: &[f64]) {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len(), "{got:?}");
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "got {g:?}\nwant {want:?}");
        }
    }

    #[test]
    fn linear_half_pixel_up_and_down() {
        let x = iota_f32(&[1, 3, 5]);
        let op = make("Resize", 19, &[("mode", s("linear"))], 3, 1).unwrap();
        let sc = f32s(&[3], &[1.0, 1.5, 0.6]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), None, Some(&sc)], &[2]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[1, 4, 3]);
        let want = [0.3333333, 2.0, 3.6666665, 2.8333333, 4.5, 6.1666665, 6.1666665, 7.833333, 9.5, 9.5, 11.166667, 12.833333];
        assert_close(&out[0], &want);
        let op = make("Resize", 13, &[("mode", s("linear")), ("coordinate_transformation_mode", s("pytorch_half_pixel"))], 4, 1).unwrap();
        let sizes = i64s(&[3], &[1, 1, 4]);
        let empty = f32s(&[0], &[]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&empty), Some(&empty), Some(&sizes)], &[1, 2, 3]), &[]).unwrap();
        assert_close(&out[0], &[0.125, 1.375, 2.625, 3.875]);
    }

    /// Integer upsampling by 2 and by 3 along the last axis, and rows repeated along the
    /// one before (the copy paths of the gather), against the formula.
    #[test]
    fn nearest_integer_upsampling() {
        let x = iota_f32(&[2, 3, 4]);
        for (sh, sw) in [(2usize, 2usize), (3, 3), (1, 2), (2, 1)] {
            let op = make("Resize", 13, &[], 3, 1).unwrap();
            let sc = f32s(&[3], &[1.0, sh as f32, sw as f32]);
            let out = run(op.as_ref(), &as_inputs(&[Some(&x), None, Some(&sc)], &[2]), &[]).unwrap();
            assert_eq!(out[0].dims(), &[2, 3 * sh, 4 * sw]);
            let want: Vec<f64> = (0..2 * 3 * sh * 4 * sw).map(|i| {
                let (b, r, c) = (i / (3 * sh * 4 * sw), i / (4 * sw) % (3 * sh), i % (4 * sw));
                ((b * 3 + r / sh) * 4 + c / sw) as f64
            }).collect();
            assert_close(&out[0], &want);
        }
    }

    #[test]
    fn nearest_align_corners_and_tf_crop() {
        let x = iota_f32(&[1, 3, 5]);
        let attrs = [("coordinate_transformation_mode", s("align_corners")), ("nearest_mode", s("round_prefer_ceil"))];
        let op = make("Resize", 13, &attrs, 4, 1).unwrap();
        let sizes = i64s(&[3], &[1, 5, 7]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), None, None, Some(&sizes)], &[3]), &[]).unwrap();
        let want = [
            0., 1., 1., 2., 3., 3., 4., 5., 6., 6., 7., 8., 8., 9., 5., 6., 6., 7., 8., 8., 9., 10., 11., 11., 12., 13.,
            13., 14., 10., 11., 11., 12., 13., 13., 14.,
        ];
        assert_close(&out[0], &want);
        // the same on i64 data (nearest is dtype-generic)
        let xi = iota_i64(&[1, 3, 5]);
        assert_close(&run(op.as_ref(), &as_inputs(&[Some(&xi), None, None, Some(&sizes)], &[3]), &[]).unwrap()[0], &want);
        let attrs = [("mode", s("linear")), ("coordinate_transformation_mode", s("tf_crop_and_resize")), ("extrapolation_value", Attr::Float(-1.0))];
        let op = make("Resize", 13, &attrs, 4, 1).unwrap();
        let roi = f32s(&[6], &[0., 0.2, -0.5, 1., 0.9, 1.2]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&roi), None, Some(&i64s(&[3], &[1, 4, 3]))], &[1, 3]), &[]).unwrap();
        assert_close(&out[0], &[-1., 3.4, -1., -1., 5.7333336, -1., -1., 8.066667, -1., -1., 10.4, -1.]);
    }

    #[test]
    fn legacy_opsets_axes_policy_and_errors() {
        let x = iota_f32(&[1, 1, 2, 2]);
        let sc = f32s(&[4], &[1., 1., 2., 3.]);
        // Resize-10 and Upsample-9: asymmetric, floor when upsampling
        for (op, opset) in [("Resize", 10), ("Upsample", 9)] {
            let o = make(op, opset, &[], 2, 1).unwrap();
            let out = run(o.as_ref(), &as_inputs(&[Some(&x), Some(&sc)], &[1]), &[]).unwrap();
            assert_eq!(out[0].dims(), &[1, 1, 4, 6]);
            assert_close(&out[0], &[0., 0., 0., 1., 1., 1., 0., 0., 0., 1., 1., 1., 2., 2., 2., 3., 3., 3., 2., 2., 2., 3., 3., 3.]);
        }
        let up7 = make("Upsample", 7, &[("scales", Attr::Floats(vec![1., 1., 2., 2.])), ("mode", s("linear"))], 1, 1).unwrap();
        let out = run(up7.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_close(&out[0], &[0., 0.5, 1., 1., 1., 1.5, 2., 2., 2., 2.5, 3., 3., 2., 2.5, 3., 3.]);
        // opset 18 axes + not_larger: sizes (3, 5) for a 2x2 -> scale 1.5 -> 3x3
        let op = make("Resize", 18, &[("axes", ints(&[2, 3])), ("keep_aspect_ratio_policy", s("not_larger"))], 4, 1).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), None, None, Some(&i64s(&[2], &[3, 5]))], &[3]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[1, 1, 3, 3]);
        assert!(make("Resize", 13, &[("mode", s("cubic"))], 3, 1).unwrap_err().to_string().contains("cubic"));
        let op = make("Resize", 13, &[], 3, 1).unwrap();
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), None, Some(&f32s(&[2], &[1., 2.]))], &[2]), &[]).unwrap_err().to_string();
        assert!(e.contains("4 positive scales"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), None, Some(&sc)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("constant"), "{e}");
    }
}
