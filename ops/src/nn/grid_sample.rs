//! GridSample (opset 16/20/22): samples `X (N, C, D1..Dr)` at the normalised
//! coordinates of `grid (N, O1..Or, r)` (last entry first: `grid[.., 0]` indexes the
//! innermost dim). `mode`: nearest (round half to even), linear/bilinear (2^r taps) or
//! cubic/bicubic (4^r taps, Keys' kernel with a = -0.75); `padding_mode` zeros, border
//! or reflection applies to the coordinates and to every tap index; `align_corners`
//! maps -1/1 to the corner pixel centres rather than the image edges. The taps of a
//! sample are a product of per-dim taps, so the kernel is separable in r dims. WGSL:
//! one invocation per output element, the taps unrolled.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const CUBIC_A: f64 = -0.75;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

#[derive(Debug)]
pub struct GridSample {
    mode: Mode,
    padding: Padding,
    align_corners: bool,
}

/// Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fraction `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    let a = CUBIC_A;
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// Reflects `x` into `[lo, hi]` by its nearer border, repeatedly.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    let fold = |dx: f64, near: f64, far: f64, sign: f64| {
        let n = (dx / range).floor();
        let r = dx - n * range;
        if n as i64 % 2 == 0 { near + sign * r } else { far - sign * r }
    };
    if x < lo {
        fold(lo - x, lo, hi, 1.0)
    } else if x > hi {
        fold(x - hi, hi, lo, -1.0)
    } else {
        x
    }
}

impl GridSample {
    /// Output dims, after checking X and grid.
    fn out_dims(x: &[usize], grid: &[usize]) -> Result<Vec<usize>> {
        let r = x.len().saturating_sub(2);
        if x.len() < 3 {
            return Err(OpError::input(0, format!("expected (N, C, D1..Dr), found shape {x:?}")));
        }
        if grid.len() != r + 2 || grid[0] != x[0] || grid[r + 1] != r {
            return Err(OpError::input(1, format!("grid must have shape (N = {}, O1..O{r}, {r}) for a {r}-D input, found {grid:?}", x[0])));
        }
        Ok([x[0], x[1]].into_iter().chain(grid[1..=r].iter().copied()).collect())
    }

    /// (lo, hi) of the valid coordinate range of a dim of `size`.
    fn bounds(&self, size: usize) -> (f64, f64) {
        if self.align_corners { (0.0, size as f64 - 1.0) } else { (-0.5, size as f64 - 0.5) }
    }

    /// The pixel coordinate of normalised `g` along a dim of `size`, after rounding
    /// (nearest) and the coordinate padding.
    fn coordinate(&self, g: f64, size: usize) -> f64 {
        let s = size as f64;
        let mut x = if self.align_corners { (g + 1.0) / 2.0 * (s - 1.0) } else { ((g + 1.0) * s - 1.0) / 2.0 };
        if self.mode == Mode::Nearest {
            let r = x.round();
            x = if (x - x.trunc()).abs() == 0.5 { 2.0 * (x / 2.0).round() } else { r };
        }
        let (lo, hi) = self.bounds(size);
        if x < lo || x > hi {
            x = match self.padding {
                Padding::Border => x.clamp(0.0, s - 1.0),
                Padding::Reflection => reflect(x, lo, hi),
                Padding::Zeros => x,
            };
        }
        x
    }

    /// Taps (index in range or None for a zero tap, weight) along one dim.
    fn taps(&self, x: f64, size: usize) -> Vec<(Option<usize>, f64)> {
        let fetch = |i: i64| -> Option<usize> {
            let (lo, hi) = self.bounds(size);
            let i = match self.padding {
                Padding::Zeros => i,
                Padding::Border => i.clamp(0, size as i64 - 1),
                Padding::Reflection => reflect(i as f64, lo, hi) as i64,
            };
            (0..size as i64).contains(&i).then_some(i as usize)
        };
        let x0 = x.floor();
        let t = x - x0;
        match self.mode {
            Mode::Nearest => vec![(fetch(x as i64), 1.0)],
            // Saturating: a coordinate far outside (x0 = 9.2e18) must not overflow.
            Mode::Linear => vec![(fetch(x0 as i64), 1.0 - t), (fetch((x0 as i64).saturating_add(1)), t)],
            Mode::Cubic => cubic_weights(t).iter().enumerate().map(|(k, &w)| (fetch((x0 as i64).saturating_add(k as i64 - 1)), w)).collect(),
        }
    }
}

impl Op for GridSample {
    fn name(&self) -> &str {
        "GridSample"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        expect_dtype(inputs, 1, FLOATS)?;
        let dims = Self::out_dims(required(inputs, 0)?.dims(), required(inputs, 1)?.dims())?;
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let r = outputs[0].rank().saturating_sub(2) as u32;
        let taps = match self.mode {
            Mode::Nearest => 1,
            Mode::Linear => 2u64.pow(r),
            Mode::Cubic => 4u64.pow(r),
        };
        Cost { flops: 2 * taps * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GridSample {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (x, grid) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let out = Self::out_dims(x.dims(), grid.dims())?;
        let (c, r) = (x.dims()[1], x.rank() - 2);
        let sizes = &x.dims()[2..];
        let in_plane: usize = sizes.iter().product();
        let out_plane: usize = out[2..].iter().product();
        let (xv, gv) = (x.to_f64_vec(), grid.to_f64_vec());
        let mut y = vec![0f64; out.iter().product()];
        for n in 0..out[0] {
            for o in 0..out_plane {
                let g = &gv[(n * out_plane + o) * r..][..r];
                // Per-dim taps, dim 0 outermost (grid entries are innermost-first).
                let taps: Vec<Vec<(Option<usize>, f64)>> = (0..r).map(|k| self.taps(self.coordinate(g[r - 1 - k], sizes[k]), sizes[k])).collect();
                // Walk the product of the per-dim taps: (offset within the plane, weight).
                let mut combos = vec![(Some(0usize), 1.0f64)];
                for (k, dim_taps) in taps.iter().enumerate() {
                    let stride: usize = sizes[k + 1..].iter().product();
                    combos = combos.iter().flat_map(|&(off, w)| dim_taps.iter().map(move |&(i, tw)| (off.zip(i).map(|(o, i)| o + i * stride), w * tw))).collect();
                }
                for ch in 0..c {
                    let plane = &xv[(n * c + ch) * in_plane..][..in_plane];
                    y[(n * c + ch) * out_plane + o] = combos.iter().map(|&(off, w)| off.map_or(0.0, |off| w * plane[off])).sum();
                }
            }
        }
        outputs[0] = Tensor::from_f64(x.dtype(), &out, &y)?;
        Ok(())
    }
}

impl WgslKernel for GridSample {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let xd = required(inputs, 0)?.dims();
        let out = Self::out_dims(xd, required(inputs, 1)?.dims())?;
        let n_out = outputs[0].len();
        if n_out == 0 {
            return Ok(WgslProgram::default());
        }
        let (c, r) = (xd[1], xd.len() - 2);
        let sizes = &xd[2..];
        let in_plane: usize = sizes.iter().product();
        let out_plane: usize = out[2..].iter().product();
        let f = |v: f64| wgsl::literal("f32", v);
        let mut body = format!("let o = i % {out_plane}u;\n    let nc = i / {out_plane}u;\n    let n = nc / {c}u;\n    let base = nc * {in_plane}u;\n    let g = (n * {out_plane}u + o) * {r}u;\n");
        let taps: usize = match self.mode {
            Mode::Nearest => 1,
            Mode::Linear => 2,
            Mode::Cubic => 4,
        };
        for (k, &size) in sizes.iter().enumerate() {
            let s = size as f64;
            let (lo, hi) = self.bounds(size);
            let gk = format!("grid[g + {}u]", r - 1 - k);
            let denorm = if self.align_corners { format!("({gk} + 1.0) * {}", f((s - 1.0) / 2.0)) } else { format!("(({gk} + 1.0) * {} - 1.0) * 0.5", f(s)) };
            let _ = writeln!(body, "    var x{k} = {denorm};");
            if self.mode == Mode::Nearest {
                let _ = writeln!(body, "    x{k} = round(x{k});");
            }
            let fix = match self.padding {
                Padding::Zeros => None,
                Padding::Border => Some(format!("clamp(x{k}, 0.0, {})", f(s - 1.0))),
                Padding::Reflection => Some(format!("reflect_into(x{k}, {}, {})", f(lo), f(hi))),
            };
            if let Some(fix) = fix {
                let _ = writeln!(body, "    if (x{k} < {} || x{k} > {}) {{ x{k} = {fix}; }}", f(lo), f(hi));
            }
            let _ = writeln!(body, "    let f{k} = floor(x{k});\n    let t{k} = x{k} - f{k};");
            for j in 0..taps {
                let (index, weight) = match self.mode {
                    Mode::Nearest => (format!("i32(x{k})"), "1.0".to_string()),
                    Mode::Linear => (format!("i32(f{k}) + {j}"), if j == 0 { format!("1.0 - t{k}") } else { format!("t{k}") }),
                    Mode::Cubic => (format!("i32(f{k}) - 1 + {j}"), format!("cubic{j}(t{k})")),
                };
                let mapped = match self.padding {
                    Padding::Zeros => "raw".to_string(),
                    Padding::Border => format!("clamp(raw, 0, {})", size as i64 - 1),
                    Padding::Reflection => format!("i32(reflect_into(f32(raw), {}, {}))", f(lo), f(hi)),
                };
                let _ = writeln!(
                    body,
                    "    let w{k}_{j} = {weight};\n    let m{k}_{j} = {};\n    let ok{k}_{j} = m{k}_{j} >= 0 && m{k}_{j} < {size};\n    let i{k}_{j} = u32(clamp(m{k}_{j}, 0, {}));",
                    mapped.replace("raw", &format!("({index})")),
                    size - 1
                );
            }
        }
        body += "    var acc = 0.0;\n";
        for combo in 0..taps.pow(r as u32) {
            let js: Vec<usize> = (0..r).map(|k| combo / taps.pow((r - 1 - k) as u32) % taps).collect();
            let weight: Vec<String> = js.iter().enumerate().map(|(k, j)| format!("w{k}_{j}")).collect();
            let ok: Vec<String> = js.iter().enumerate().map(|(k, j)| format!("ok{k}_{j}")).collect();
            let off: Vec<String> = js.iter().enumerate().map(|(k, j)| format!("i{k}_{j} * {}u", sizes[k + 1..].iter().product::<usize>())).collect();
            let _ = writeln!(body, "    if ({}) {{ acc = acc + {} * x[base + {}]; }}", ok.join(" && "), weight.join(" * "), off.join(" + "));
        }
        body += "    y[i] = acc;";
        let a = CUBIC_A;
        let helpers = format!(
            "fn reflect_into(x: f32, lo: f32, hi: f32) -> f32 {{
    let range = hi - lo;
    if (range <= 0.0) {{ return lo; }}
    if (x < lo) {{
        let dx = lo - x;
        let n = floor(dx / range);
        let r = dx - n * range;
        return select(hi - r, lo + r, i32(n) % 2 == 0);
    }}
    if (x > hi) {{
        let dx = x - hi;
        let n = floor(dx / range);
        let r = dx - n * range;
        return select(lo + r, hi - r, i32(n) % 2 == 0);
    }}
    return x;
}}
fn cubic_far(x: f32) -> f32 {{ return (({a} * x - 5.0 * {a}) * x + 8.0 * {a}) * x - 4.0 * {a}; }}
fn cubic_near(x: f32) -> f32 {{ return (({a} + 2.0) * x - ({a} + 3.0)) * x * x + 1.0; }}
fn cubic0(t: f32) -> f32 {{ return cubic_far(t + 1.0); }}
fn cubic1(t: f32) -> f32 {{ return cubic_near(t); }}
fn cubic2(t: f32) -> f32 {{ return cubic_near(1.0 - t); }}
fn cubic3(t: f32) -> f32 {{ return cubic_far(2.0 - t); }}
"
        );
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("x", "f32", true), ("grid", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)];
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), n_out, wg, &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GridSample", |spec: &NodeSpec| {
        let mode = match spec.string("mode", if spec.opset >= 20 { "linear" } else { "bilinear" })?.as_str() {
            "nearest" => Mode::Nearest,
            "linear" | "bilinear" => Mode::Linear,
            "cubic" | "bicubic" => Mode::Cubic,
            other => return Err(spec.bad("mode", format!("expected nearest, linear (bilinear) or cubic (bicubic), found '{other}'"))),
        };
        let padding = match spec.string("padding_mode", "zeros")?.as_str() {
            "zeros" => Padding::Zeros,
            "border" => Padding::Border,
            "reflection" => Padding::Reflection,
            other => return Err(spec.bad("padding_mode", format!("expected zeros, border or reflection, found '{other}'"))),
        };
        Ok(Box::new(GridSample { mode, padding, align_corners: spec.int("align_corners", 0)? != 0 }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use super::{cubic_weights, reflect};
    use kiln_graph::{Attr, Tensor};

    /// A direct 2-D reference (bilinear and nearest only) for cross-checking the
    /// separable tap walk.
    /// `flags`: (align_corners, zeros padding (else border), nearest (else linear)).
    fn bilinear_2d(x: &[f64], (h, w): (usize, usize), (gx, gy): (f64, f64), (align, zeros, nearest): (bool, bool, bool)) -> f64 {
        let den = |g: f64, s: usize| if align { (g + 1.0) / 2.0 * (s as f64 - 1.0) } else { ((g + 1.0) * s as f64 - 1.0) / 2.0 };
        let (px, py) = (den(gx, w), den(gy, h));
        let at = |yy: i64, xx: i64| {
            if zeros && (yy < 0 || xx < 0 || yy >= h as i64 || xx >= w as i64) {
                0.0
            } else {
                x[yy.clamp(0, h as i64 - 1) as usize * w + xx.clamp(0, w as i64 - 1) as usize]
            }
        };
        if nearest {
            let r = |v: f64| if (v - v.trunc()).abs() == 0.5 { 2.0 * (v / 2.0).round() } else { v.round() };
            return at(r(py) as i64, r(px) as i64);
        }
        let (x0, y0) = (px.floor(), py.floor());
        let (tx, ty) = (px - x0, py - y0);
        let (x0, y0) = (x0 as i64, y0 as i64);
        at(y0, x0) * (1.0 - tx) * (1.0 - ty) + at(y0, x0 + 1) * tx * (1.0 - ty) + at(y0 + 1, x0) * (1.0 - tx) * ty + at(y0 + 1, x0 + 1) * tx * ty
    }

    #[test]
    fn two_d_linear_and_nearest_match_a_direct_reference() {
        let (n, c, h, w) = (2usize, 3usize, 5usize, 4usize);
        let x = rand_f32(&[n, c, h, w], 1);
        // Grid values in [-1.3, 1.3): some samples fall outside the image.
        let g: Vec<f32> = rand_f32(&[n, 3, 7, 2], 2).as_slice::<f32>().unwrap().iter().map(|v| v * 1.3).collect();
        let grid = Tensor::from_slice(&[n, 3, 7, 2], &g).unwrap();
        for mode in ["linear", "nearest"] {
            for align in [0i64, 1] {
                for pad in ["zeros", "border"] {
                    let attrs = [("mode", Attr::String(mode.into())), ("align_corners", Attr::Int(align)), ("padding_mode", Attr::String(pad.into()))];
                    let y = run(make("GridSample", 19, &attrs, 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&x), Some(&grid)], &[]), &[]).unwrap().remove(0);
                    let xv = x.to_f64_vec();
                    let mut want = vec![];
                    for b in 0..n {
                        for ch in 0..c {
                            for o in 0..21 {
                                let (gx, gy) = (g[(b * 21 + o) * 2] as f64, g[(b * 21 + o) * 2 + 1] as f64);
                                let plane = &xv[(b * c + ch) * h * w..][..h * w];
                                want.push(bilinear_2d(plane, (h, w), (gx, gy), (align == 1, pad == "zeros", mode == "nearest")));
                            }
                        }
                    }
                    assert_close(&y, &want, 1e-5, &format!("GridSample {mode} align {align} {pad}"));
                }
            }
        }
    }

    #[test]
    fn helpers_and_other_modes() {
        // Cubic weights sum to 1 and interpolate (t = 0 gives the centre tap).
        for t in [0.0, 0.25, 0.5, 0.9] {
            assert!((cubic_weights(t).iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        assert_eq!(cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
        assert_eq!(reflect(-1.0, -0.5, 3.5), 0.0);
        assert_eq!(reflect(4.25, -0.5, 3.5), 2.75);
        assert_eq!(reflect(9.0, 0.0, 4.0), 1.0);
        // Cubic and reflection on 2-D and 3-D inputs run and validate; a constant image
        // stays constant under cubic interpolation inside the image.
        let ones = Tensor::from_slice(&[1, 1, 4, 5], &[2.0f32; 20]).unwrap();
        let grid = Tensor::from_slice(&[1, 1, 2, 2], &[0.1f32, -0.2, 0.3, 0.25]).unwrap();
        let y = run(make("GridSample", 19, &[("mode", Attr::String("cubic".into())), ("padding_mode", Attr::String("border".into()))], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&ones), Some(&grid)], &[]), &[]).unwrap();
        assert_close(&y[0], &[2.0, 2.0], 1e-6, "constant image");
        let x3 = rand_f32(&[1, 2, 3, 4, 5], 3);
        let g3 = rand_f32(&[1, 2, 2, 3, 3], 4);
        for mode in ["linear", "nearest", "cubic"] {
            let attrs = [("mode", Attr::String(mode.into())), ("padding_mode", Attr::String("reflection".into()))];
            let y = run(make("GridSample", 19, &attrs, 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&x3), Some(&g3)], &[]), &[]).unwrap();
            assert_eq!(y[0].dims(), &[1, 2, 2, 2, 3]);
        }
        let err = run(make("GridSample", 19, &[], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&rand_f32(&[1, 1, 4, 4], 1)), Some(&rand_f32(&[1, 2, 2, 3], 2))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("grid must have shape"), "{err}");
        assert!(make("GridSample", 19, &[("mode", Attr::String("area".into()))], 2, 1).is_err());
    }
}
