//! RoiAlign (opset 10/16/22): `X (N, C, H, W)` pooled over regions `rois (R, 4)` =
//! `[x1, y1, x2, y2]` of images `batch_indices (R)`, into `(R, C, output_height,
//! output_width)`. Each output bin averages (`mode` avg) or takes the largest of
//! (`mode` max) bilinear samples on a regular grid of `sampling_ratio` samples per bin
//! side (0: `ceil(roi side / bins)`, adaptive). Coordinates are scaled by
//! `spatial_scale`; `coordinate_transformation_mode` half_pixel (the default from
//! opset 16) shifts them by -0.5, output_half_pixel (opset 10's behaviour) does not and
//! makes every roi at least 1x1. As in onnxruntime: a sample outside `[-1, H] x [-1, W]`
//! counts as 0 (avg divides by the full grid), one inside is clamped into the image,
//! and max takes the largest of a sample's four weighted taps (`w * v`), not of the
//! interpolated values.
//!
//! Only the samples that can land inside the image are visited: per bin side, the
//! sample index range is solved from the grid's affine positions (with a margin of
//! one, each sample then checked), so a huge or far-away roi costs no more than the
//! image (at most `size + 4` samples per side with the adaptive grid) and cannot hang.
//!
//! WGSL: one invocation per output element; batch indices out of range are reported
//! through the node's status word. Kernels whose per-invocation sample loops could
//! exceed [`wgsl::MAX_LOOP_ITERATIONS`] are not generated (the CPU runs them).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const INTS: &[DType] = &[DType::I64, DType::I32, DType::I16, DType::I8, DType::U32, DType::U16, DType::U8];
/// The most samples per bin side Kiln accepts (its square is the work of one bin).
const MAX_SAMPLING_RATIO: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Avg,
    Max,
}

#[derive(Debug)]
pub struct RoiAlign {
    pool: Pool,
    out_h: usize,
    out_w: usize,
    /// Samples per bin side; 0: adaptive.
    sampling_ratio: usize,
    spatial_scale: f32,
    /// half_pixel (else output_half_pixel).
    half_pixel: bool,
}

/// The sample indices of one bin side worth visiting: `(first, count)`. Samples sit at
/// `origin + (i + 0.5) * bin / grid` for `i` in `0..grid`; those inside `[-1, size]`
/// all lie in the returned range, which is at most `cap` long.
fn sample_span(origin: f64, bin: f64, grid: f64, size: f64, cap: usize) -> (f64, usize) {
    if grid.is_nan() || grid < 1.0 {
        return (0.0, 0);
    }
    let step = bin / grid;
    let (lo, hi) = if step > 0.0 {
        (((-1.0 - origin) / step - 0.5).ceil() - 1.0, ((size - origin) / step - 0.5).floor() + 1.0)
    } else if step < 0.0 {
        (((size - origin) / step - 0.5).ceil() - 1.0, ((-1.0 - origin) / step - 0.5).floor() + 1.0)
    } else if origin >= -1.0 && origin <= size {
        (0.0, grid - 1.0)
    } else {
        return (0.0, 0);
    };
    let (lo, hi) = (lo.max(0.0), hi.min(grid - 1.0));
    if hi.is_nan() || lo.is_nan() || hi < lo {
        return (0.0, 0);
    }
    (lo, ((hi - lo + 1.0).min(cap as f64)) as usize)
}

/// The two taps of a sample at `v` (inside `[-1, size]`) along a dim of `size`:
/// (low index, high index, weight of the high one), clamped as onnxruntime does.
fn taps(v: f64, size: usize) -> (usize, usize, f64) {
    let v = if v <= 0.0 { 0.0 } else { v };
    let low = v as usize;
    if low >= size - 1 {
        (size - 1, size - 1, 0.0)
    } else {
        (low, low + 1, v - low as f64)
    }
}

/// One roi's sampling geometry.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    start_h: f64,
    start_w: f64,
    bin_h: f64,
    bin_w: f64,
    grid_h: f64,
    grid_w: f64,
}

impl RoiAlign {
    /// Output dims after checking the inputs' shapes.
    fn out_dims(&self, x: &[usize], rois: &[usize], bi: &[usize]) -> Result<[usize; 4]> {
        if x.len() != 4 {
            return Err(OpError::input(0, format!("RoiAlign's X must have shape (N, C, H, W), found {x:?}")));
        }
        if rois.len() != 2 || rois[1] != 4 {
            return Err(OpError::input(1, format!("RoiAlign's rois must have shape (num_rois, 4), found {rois:?}")));
        }
        if bi != [rois[0]] {
            return Err(OpError::input(2, format!("RoiAlign's batch_indices must have shape ({},) (one per roi), found {bi:?}", rois[0])));
        }
        if (x[2] == 0 || x[3] == 0) && rois[0] * x[1] > 0 {
            return Err(OpError::input(0, format!("RoiAlign needs a non-empty feature map to sample, found X of shape {x:?}")));
        }
        Ok([rois[0], x[1], self.out_h, self.out_w])
    }

    fn geometry(&self, roi: &[f64]) -> Geometry {
        let (scale, offset) = (self.spatial_scale as f64, if self.half_pixel { 0.5 } else { 0.0 });
        let (start_w, start_h) = (roi[0] * scale - offset, roi[1] * scale - offset);
        let (end_w, end_h) = (roi[2] * scale - offset, roi[3] * scale - offset);
        let (mut w, mut h) = (end_w - start_w, end_h - start_h);
        if !self.half_pixel {
            w = w.max(1.0);
            h = h.max(1.0);
        }
        let (oh, ow) = (self.out_h as f64, self.out_w as f64);
        let grid = |side: f64, bins: f64| if self.sampling_ratio > 0 { self.sampling_ratio as f64 } else { (side / bins).ceil() };
        Geometry { start_h, start_w, bin_h: h / oh, bin_w: w / ow, grid_h: grid(h, oh), grid_w: grid(w, ow) }
    }

    /// Most samples visited per bin side along a dim of `size`.
    fn cap(&self, size: usize) -> usize {
        if self.sampling_ratio > 0 { self.sampling_ratio } else { size + 4 }
    }

    /// The samples of one bin side inside the image: their taps.
    fn side(&self, origin: f64, bin: f64, grid: f64, size: usize) -> Vec<(usize, usize, f64)> {
        let (first, count) = sample_span(origin, bin, grid, size as f64, self.cap(size));
        (0..count)
            .map(|k| origin + (first + k as f64 + 0.5) * bin / grid)
            .filter(|&v| v >= -1.0 && v <= size as f64)
            .map(|v| taps(v, size))
            .collect()
    }
}

impl Op for RoiAlign {
    fn name(&self) -> &str {
        "RoiAlign"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        expect_dtype(inputs, 1, FLOATS)?;
        expect_dtype(inputs, 2, INTS)?;
        let dims = self.out_dims(required(inputs, 0)?.dims(), required(inputs, 1)?.dims(), required(inputs, 2)?.dims())?;
        Ok(vec![TensorType::new(dtype, dims.to_vec())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let x = inputs.first().copied().flatten().map_or(&[][..], |a| a.dims());
        let (h, w) = (x.get(2).copied().unwrap_or(1), x.get(3).copied().unwrap_or(1));
        let samples = (self.cap(h).min(h + 4) * self.cap(w).min(w + 4)) as u64;
        Cost { flops: 12 * samples * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for RoiAlign {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (x, rois, bi) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, cpu::input(inputs, 2)?);
        let [r_n, c_n, oh, ow] = self.out_dims(x.dims(), rois.dims(), bi.dims())?;
        let (n, h, w) = (x.dims()[0], x.dims()[2], x.dims()[3]);
        let batches = bi.to_i64_vec()?;
        if let Some((k, &b)) = batches.iter().enumerate().find(|(_, &b)| b < 0 || b as usize >= n) {
            return Err(OpError::input(2, format!("RoiAlign's batch_indices[{k}] = {b} is out of range for X of {n} images")));
        }
        let (xv, rv) = (x.to_f64_vec(), rois.to_f64_vec());
        let mut y = vec![0f64; r_n * c_n * oh * ow];
        if y.is_empty() {
            outputs[0] = Tensor::from_f64(x.dtype(), &[r_n, c_n, oh, ow], &y)?;
            return Ok(());
        }
        let plane = h * w;
        cpu::par_chunks_mut(&mut y, c_n * oh * ow, 4 * plane.min(64), |r0, part| {
            for (dr, out) in part.chunks_mut(c_n * oh * ow).enumerate() {
                let r = r0 + dr;
                let g = self.geometry(&rv[4 * r..4 * r + 4]);
                let total = g.grid_h * g.grid_w;
                let image = &xv[batches[r] as usize * c_n * plane..][..c_n * plane];
                for ph in 0..oh {
                    let ys = self.side(g.start_h + ph as f64 * g.bin_h, g.bin_h, g.grid_h, h);
                    for pw in 0..ow {
                        let xs = self.side(g.start_w + pw as f64 * g.bin_w, g.bin_w, g.grid_w, w);
                        let inside = (ys.len() * xs.len()) as f64;
                        for c in 0..c_n {
                            let p = &image[c * plane..][..plane];
                            let (mut acc, mut best): (f64, Option<f64>) = (0.0, None);
                            for &(y0, y1, ly) in &ys {
                                for &(x0, x1, lx) in &xs {
                                    let (hy, hx) = (1.0 - ly, 1.0 - lx);
                                    let t = [hy * hx * p[y0 * w + x0], hy * lx * p[y0 * w + x1], ly * hx * p[y1 * w + x0], ly * lx * p[y1 * w + x1]];
                                    match self.pool {
                                        Pool::Avg => acc += t[0] + t[1] + t[2] + t[3],
                                        Pool::Max => {
                                            let m = t[0].max(t[1]).max(t[2]).max(t[3]);
                                            best = Some(best.map_or(m, |b| b.max(m)));
                                        }
                                    }
                                }
                            }
                            out[(c * oh + ph) * ow + pw] = match self.pool {
                                _ if total.is_nan() || total < 1.0 => 0.0,
                                Pool::Avg => acc / total,
                                // Samples outside the image count as 0.
                                Pool::Max if inside < total => best.map_or(0.0, |b| b.max(0.0)),
                                Pool::Max => best.unwrap_or(0.0),
                            };
                        }
                    }
                }
            }
        });
        outputs[0] = Tensor::from_f64(x.dtype(), &[r_n, c_n, oh, ow], &y)?;
        Ok(())
    }
}

impl WgslKernel for RoiAlign {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let xd = required(inputs, 0)?.dims();
        let [_, c, oh, ow] = self.out_dims(xd, required(inputs, 1)?.dims(), required(inputs, 2)?.dims())?;
        let len = outputs[0].len();
        if len == 0 {
            return Ok(WgslProgram::default());
        }
        let (n, h, w) = (xd[0], xd[2], xd[3]);
        let (cap_h, cap_w) = (self.cap(h), self.cap(w));
        if cap_h.saturating_mul(cap_w + 1) > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "RoiAlign over a {h}x{w} feature map with sampling_ratio {}: up to {cap_h}x{cap_w} samples per output element exceed \
                 the GPU kernel's loop budget of {}; the CPU runs it",
                self.sampling_ratio,
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let f = |v: f64| wgsl::literal("f32", v);
        let grid = |side: &str, bins: usize| {
            if self.sampling_ratio > 0 { f(self.sampling_ratio as f64) } else { format!("ceil({side} / {})", f(bins as f64)) }
        };
        let clamp_size = if self.half_pixel { String::new() } else { "    rw = max(rw, 1.0);\n    rh = max(rh, 1.0);\n".to_string() };
        let (scale, offset) = (f(self.spatial_scale as f64), f(if self.half_pixel { 0.5 } else { 0.0 }));
        let visit = match self.pool {
            Pool::Avg => "acc = acc + t0 + t1 + t2 + t3;".to_string(),
            Pool::Max => "let m = max(max(max(t0, t1), t2), t3);\n            if (inside == 0.0) { acc = m; } else { acc = max(acc, m); }".to_string(),
        };
        let finish = match self.pool {
            Pool::Avg => "y[i] = acc / total;",
            Pool::Max => "if (inside < total) { acc = max(acc, 0.0); }\n    y[i] = acc;",
        };
        let body = format!(
            "let pw = i % {ow}u;
    let ph = (i / {ow}u) % {oh}u;
    let ch = (i / {plane_out}u) % {c}u;
    let r = i / ({plane_out}u * {c}u);
    let b = bi[r];
    if (b < 0 || b >= {n}) {{ {report} y[i] = 0.0; return; }}
    let sw = rois[4u * r] * {scale} - {offset};
    let sh = rois[4u * r + 1u] * {scale} - {offset};
    var rw = rois[4u * r + 2u] * {scale} - {offset} - sw;
    var rh = rois[4u * r + 3u] * {scale} - {offset} - sh;
{clamp_size}    let bh = rh / {ohf};
    let bw = rw / {owf};
    let gh = {gh};
    let gw = {gw};
    let total = gh * gw;
    if (!(gh >= 1.0) || !(gw >= 1.0)) {{ y[i] = 0.0; return; }}
    let oy = sh + f32(ph) * bh;
    let ox = sw + f32(pw) * bw;
    let sy = span(oy, bh, gh, {hf}, {cap_hf});
    let sx = span(ox, bw, gw, {wf}, {cap_wf});
    let base = (u32(b) * {c}u + ch) * {plane_in}u;
    var acc = 0.0;
    var inside = 0.0;
    for (var ky = 0u; ky < u32(sy.y); ky = ky + 1u) {{
        let yy = oy + (sy.x + f32(ky) + 0.5) * bh / gh;
        if (yy < -1.0 || yy > {hf}) {{ continue; }}
        let ty = tap(yy, {h}u);
        for (var kx = 0u; kx < u32(sx.y); kx = kx + 1u) {{
            let xx = ox + (sx.x + f32(kx) + 0.5) * bw / gw;
            if (xx < -1.0 || xx > {wf}) {{ continue; }}
            let tx = tap(xx, {w}u);
            let t0 = (1.0 - ty.l) * (1.0 - tx.l) * x[base + ty.lo * {w}u + tx.lo];
            let t1 = (1.0 - ty.l) * tx.l * x[base + ty.lo * {w}u + tx.hi];
            let t2 = ty.l * (1.0 - tx.l) * x[base + ty.hi * {w}u + tx.lo];
            let t3 = ty.l * tx.l * x[base + ty.hi * {w}u + tx.hi];
            {visit}
            inside = inside + 1.0;
        }}
    }}
    {finish}",
            plane_out = oh * ow,
            plane_in = h * w,
            report = wgsl::report_index_error("b", &format!("{n}i")),
            ohf = f(oh as f64),
            owf = f(ow as f64),
            gh = grid("rh", oh),
            gw = grid("rw", ow),
            hf = f(h as f64),
            wf = f(w as f64),
            cap_hf = f(cap_h as f64),
            cap_wf = f(cap_w as f64),
        );
        let helpers = format!(
            "{}
struct Tap {{ lo: u32, hi: u32, l: f32 }}
fn tap(v0: f32, size: u32) -> Tap {{
    var v = v0;
    if (v <= 0.0) {{ v = 0.0; }}
    let lo = u32(v);
    if (lo >= size - 1u) {{ return Tap(size - 1u, size - 1u, 0.0); }}
    return Tap(lo, lo + 1u, v - f32(lo));
}}
// (first, count) of the sample indices of a bin side that can land inside [-1, size].
fn span(origin: f32, bin: f32, grid: f32, size: f32, cap: f32) -> vec2<f32> {{
    let step = bin / grid;
    var lo = 0.0;
    var hi = grid - 1.0;
    if (step > 0.0) {{
        lo = ceil((-1.0 - origin) / step - 0.5) - 1.0;
        hi = floor((size - origin) / step - 0.5) + 1.0;
    }} else if (step < 0.0) {{
        lo = ceil((size - origin) / step - 0.5) - 1.0;
        hi = floor((-1.0 - origin) / step - 0.5) + 1.0;
    }} else if (!(origin >= -1.0 && origin <= size)) {{
        return vec2<f32>(0.0, 0.0);
    }}
    lo = max(lo, 0.0);
    hi = min(hi, grid - 1.0);
    if (!(hi >= lo)) {{ return vec2<f32>(0.0, 0.0); }}
    return vec2<f32>(lo, min(hi - lo + 1.0, cap));
}}
",
            wgsl::status_decl(4)
        );
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("x", "f32", true), ("rois", "f32", true), ("bi", "i32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0), Binding::Status];
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), len, wg, &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RoiAlign", |spec: &NodeSpec| {
        let pool = match spec.string("mode", "avg")?.as_str() {
            "avg" => Pool::Avg,
            "max" => Pool::Max,
            other => return Err(spec.bad("mode", format!("expected avg or max, found '{other}'"))),
        };
        let positive = |name: &str| -> Result<usize> {
            let v = spec.int(name, 1)?;
            if v < 1 {
                return Err(spec.bad(name, format!("must be at least 1, found {v}")));
            }
            usize::try_from(v).map_err(|_| spec.bad(name, format!("{v} is too large")))
        };
        let (out_h, out_w) = (positive("output_height")?, positive("output_width")?);
        let sr = spec.int("sampling_ratio", 0)?;
        if !(0..=MAX_SAMPLING_RATIO as i64).contains(&sr) {
            return Err(spec.bad("sampling_ratio", format!("must be 0 (adaptive) or a positive count up to {MAX_SAMPLING_RATIO}, found {sr}")));
        }
        let sampling_ratio = sr as usize;
        let half_pixel = if spec.opset < 16 {
            false
        } else {
            match spec.string("coordinate_transformation_mode", "half_pixel")?.as_str() {
                "half_pixel" => true,
                "output_half_pixel" => false,
                other => return Err(spec.bad("coordinate_transformation_mode", format!("expected half_pixel or output_half_pixel, found '{other}'"))),
            }
        };
        let spatial_scale = spec.float("spatial_scale", 1.0)?;
        if !spatial_scale.is_finite() {
            return Err(spec.bad("spatial_scale", format!("must be finite, found {spatial_scale}")));
        }
        Ok(Box::new(RoiAlign { pool, out_h, out_w, sampling_ratio, spatial_scale, half_pixel }))
    });
}

#[cfg(test)]
mod tests {
    use super::sample_span;
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn inputs() -> (Tensor, Tensor, Tensor) {
        let x: Vec<f32> = (0..80).map(|i| ((i * 37) % 23) as f32 / 8.0 - 1.0).collect();
        let rois = f32s(&[4, 4], &[0.3, 0.2, 3.7, 4.1, -2.0, -3.0, 6.0, 9.0, 1.0, 1.0, 1.2, 1.1, 3.5, 4.5, 0.5, 1.0]);
        (f32s(&[2, 2, 5, 4], &x), rois, i64s(&[4], &[0, 1, 1, 0]))
    }

    fn roi_align(opset: i64, mode: &str, half: bool, sr: i64, scale: f32) -> Case {
        let (x, rois, bi) = inputs();
        let mut c = Case::new("RoiAlign").opset(opset).input(x).input(rois).input(bi);
        c = c.attr("mode", string(mode)).attr("sampling_ratio", Attr::Int(sr)).attr("spatial_scale", Attr::Float(scale));
        c = c.attr("output_height", Attr::Int(2)).attr("output_width", Attr::Int(3));
        if opset >= 16 {
            c = c.attr("coordinate_transformation_mode", string(if half { "half_pixel" } else { "output_half_pixel" }));
        }
        c
    }

    /// Outputs of onnxruntime 1.32 (rois inside, around, tiny and reversed).
    #[test]
    fn matches_onnxruntime() {
        #[rustfmt::skip]
        let cases: [(&str, bool, i64, f32, &[f64]); 4] = [
            ("avg", true, 0, 1.0, &[-0.1404949, 0.06093751, 0.4103124, 0.7738543, 0.5128906, 0.1039842, 0.2115625, 0.5609375, 0.1705991, -0.05164082, 0.1953125, 0.5446875, 0.04861111, 0.3341049, -0.0625, -0.03472222, 0.2500001, 0.2013889, 0.1597222, 0.1350309, 0.04861111, 0.04861111, 0.1983024, -0.03472222, 0.7845834, 0.800625, 0.8166667, 0.7704167, 0.776875, 0.7833333, 0.5562499, 0.4812499, 0.4062499, 0.61875, 0.54375, 0.46875, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
            ("max", true, 2, 0.5, &[0.0828125, 0.48125, 0.69375, 0.4593748, 0.2947655, 0.1492512, 0.2484375, 0.8020833, 1.15625, 0.6140624, 0.3940234, 0.247871, 0.3125, 1.09375, 0.6562498, 0.65625, 0.859375, 0.9374999, 0.4375, 0.3645833, 0.7031249, 1.03125, 0.8593749, 0.4687499, 0.04347657, 0.1014453, 0.1594141, 0.05423179, 0.09889325, 0.1554037, 0.4927344, 0.4761719, 0.4596093, 0.4803385, 0.4641927, 0.4480469, 0.1743164, 0.4980469, 0.796875, 0.5126953, 0.3662109, 0.1640625, 0.4067383, 0.4248047, 0.6796875, 0.8544922, 0.6103516, 0.4921875]),
            ("avg", false, 0, 0.5, &[-0.2392188, -0.2046874, 0.1149479, 0.4656249, -0.1718752, -0.09661454, 0.2607812, 0.2953125, 0.6149479, 0.04921879, 0.3281248, 0.4033855, 0.4166667, 0.8888889, 0.02777776, -0.08333334, 0.5486111, 0.4861111, 0.9166667, 0.1111111, 0.5277778, 0.4166667, 0.25, 0.02777776, 0.6666666, 0.53125, 0.15625, 0.5729166, 0.4375, 0.06249996, 0.6875, 0.3125, 0.1770833, 0.59375, 0.21875, 0.08333331, -0.03124997, -0.046875, 0.05729172, 0.5937501, 0.21875, -0.1562502, 0.3489583, 0.453125, 0.5572917, 0.8541666, 0.71875, 0.3437498]),
            ("max", false, 3, 1.0, &[0.6325, 0.7218751, 0.825, 1.232292, 1.35625, 0.5250001, 0.625625, 1.134375, 1.2375, 0.6436804, 0.8750002, 0.8718748, 0.3888891, 1.555555, 0.0, 0.2222223, 1.444445, 1.625, 0.5, 1.125, 0.0, 0.3333335, 1.333333, 0.0, 0.5410879, 0.3501157, 0.1591434, 1.190393, 0.7702545, 0.3501156, 0.5410879, 0.3501157, 0.2951389, 0.245949, 0.4201389, 0.6493056, 0.625, 0.625, 0.0, 0.0, 0.0, 0.0, 1.125, 1.125, 0.0, 0.0, 0.0, 0.0]),
        ];
        for (mode, half, sr, scale, want) in cases {
            let y = roi_align(16, mode, half, sr, scale).run_cpu().unwrap().remove(0);
            assert_eq!(y.dims(), &[4, 2, 2, 3]);
            assert_close(&y, want, 2e-6, &format!("RoiAlign {mode} half_pixel {half} sampling_ratio {sr} scale {scale}"));
            // f64 and f16 inputs run too.
            let y64 = roi_align(16, mode, half, sr, scale).with_floats_as(DType::F64).run_cpu().unwrap().remove(0);
            assert_close(&y64, want, 2e-6, "f64");
        }
        // Opset 10 has no coordinate_transformation_mode: output_half_pixel.
        let old = roi_align(10, "avg", false, 0, 0.5).run_cpu().unwrap().remove(0);
        assert_eq!(old, roi_align(16, "avg", false, 0, 0.5).run_cpu().unwrap().remove(0));
    }

    #[test]
    fn far_and_huge_rois_visit_only_the_image() {
        // The visited range always contains every sample inside [-1, size].
        for (origin, bin, grid, size) in [(-3.7, 9.1, 10.0, 5.0), (2.0, -4.0, 3.0, 5.0), (-1e9, 2e9, 2e9, 7.0), (0.5, 0.0, 4.0, 3.0), (40.0, 1.0, 2.0, 5.0)] {
            let (first, count) = sample_span(origin, bin, grid, size, 1 << 20);
            let inside: Vec<f64> = (0..(grid as usize).min(100)).map(|i| i as f64).filter(|&i| (-1.0..=size).contains(&(origin + (i + 0.5) * bin / grid))).collect();
            for i in inside {
                assert!(i >= first && i < first + count as f64, "sample {i} outside [{first}, +{count}) for {origin} {bin} {grid} {size}");
            }
            assert!(count <= size as usize + 4 || bin == 0.0, "{count}");
        }
        // A roi of 1e30 pixels returns at once (onnxruntime would loop over 1e60 samples).
        let x = rand_f32(&[1, 1, 6, 5], 1);
        let rois = f32s(&[1, 4], &[-1e30, -1e30, 1e30, 1e30]);
        for mode in ["avg", "max"] {
            let c = Case::new("RoiAlign").opset(16).input(x.clone()).input(rois.clone()).input(i64s(&[1], &[0])).attr("mode", string(mode));
            let y = c.run_cpu().unwrap().remove(0).to_f64_vec()[0];
            assert!(if mode == "avg" { y.abs() < 1e-6 } else { y.is_finite() }, "{mode}: {y}");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (x, rois, _) = inputs();
        let e = Case::new("RoiAlign").opset(16).input(x.clone()).input(rois.clone()).input(i64s(&[4], &[0, 2, 1, 0])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("batch_indices[1] = 2 is out of range for X of 2 images"), "{e}");
        let e = Case::new("RoiAlign").opset(16).input(x.clone()).input(rois.clone()).input(i64s(&[3], &[0, 1, 1])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("batch_indices must have shape (4,)"), "{e}");
        let e = Case::new("RoiAlign").opset(16).input(x.clone()).input(f32s(&[2, 3], &[0.0; 6])).input(i64s(&[2], &[0, 1])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("rois must have shape (num_rois, 4)"), "{e}");
        let e = Case::new("RoiAlign").opset(16).input(rand_f32(&[2, 5, 4], 1)).input(rois).input(i64s(&[4], &[0; 4])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("X must have shape (N, C, H, W)"), "{e}");
        assert!(make("RoiAlign", 16, &[("mode", string("sum"))], 3, 1).is_err());
        assert!(make("RoiAlign", 16, &[("output_height", Attr::Int(0))], 3, 1).is_err());
        assert!(make("RoiAlign", 16, &[("sampling_ratio", Attr::Int(-1))], 3, 1).is_err());
        assert!(make("RoiAlign", 16, &[("sampling_ratio", Attr::Int(1 << 40))], 3, 1).is_err());
        // No channels or no rois: an empty output.
        let e = Case::new("RoiAlign").opset(16).input(rand_f32(&[1, 0, 4, 4], 1)).input(f32s(&[1, 4], &[0.0, 0.0, 2.0, 2.0])).input(i64s(&[1], &[0]));
        assert_eq!(e.run_cpu().unwrap()[0].dims(), &[1, 0, 1, 1]);
        assert!(make("RoiAlign", 16, &[("coordinate_transformation_mode", string("align_corners"))], 3, 1).is_err());
    }
}
