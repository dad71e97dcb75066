//! QLinearAveragePool (com.microsoft; attributes `kernel_shape`, `strides`, `pads`,
//! `auto_pad`, `ceil_mode`, `count_include_pad`, `channels_last`; 1 to 3 spatial dims):
//! average pooling of 8-bit data, requantized. As onnxruntime computes it: every element
//! dequantized in f32 (`x_scale * (x - x_zero_point)`), each window clipped to the input
//! and summed in f32 in row-major order, divided by its tap count (the full kernel size
//! with `count_include_pad`, else the clipped count), then `round(sum / y_scale +
//! y_zero_point)` saturated. A window that covers the whole unpadded image takes the
//! integer path of QLinearGlobalAveragePool instead, as onnxruntime does.
use super::qlinear::{self, bounds, check_scalar, check_zero_point, QParams, MS_DOMAIN, Q8, SCALE};
use super::qlinear_global_average_pool::{global_average, global_average_wgsl, Planes};
use crate::cpu::{self, CpuKernel};
use crate::nn::window::{Geometry, WindowAttrs};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub(super) struct QLinearAveragePool {
    window: WindowAttrs,
    ceil_mode: bool,
    count_include_pad: bool,
    channels_last: bool,
}

/// A resolved pooling: the window over the spatial dims and how the planes lie.
struct Pooling {
    g: Geometry,
    planes: Planes,
    /// The output dims (in the input's layout).
    out_dims: Vec<usize>,
    /// The window covers the unpadded image: the global average's integer path.
    global: bool,
}

impl QLinearAveragePool {
    fn parse(spec: &NodeSpec) -> Result<QLinearAveragePool> {
        let window = WindowAttrs::parse(spec)?;
        if window.kernel.is_none() {
            return Err(spec.bad("kernel_shape", "is required"));
        }
        if window.dilations.as_ref().is_some_and(|d| d.iter().any(|&v| v != 1)) {
            return Err(spec.bad("dilations", "QLinearAveragePool has no dilations (all must be 1)"));
        }
        Ok(QLinearAveragePool {
            window,
            ceil_mode: spec.int("ceil_mode", 0)? != 0,
            count_include_pad: spec.int("count_include_pad", 0)? != 0,
            channels_last: spec.int("channels_last", 0)? != 0,
        })
    }

    fn pooling(&self, x: &[usize]) -> Result<Pooling> {
        if x.len() < 3 || x.len() > 5 {
            let layout = if self.channels_last { "N x D1 [x D2 [x D3]] x C" } else { "N x C x D1 [x D2 [x D3]]" };
            return Err(OpError::input(0, format!("expected {layout} (rank 3 to 5), got shape {x:?}")));
        }
        let (channels, spatial) = if self.channels_last { (x[x.len() - 1], &x[1..x.len() - 1]) } else { (x[1], &x[2..]) };
        let kernel = self.window.kernel(spatial.len(), None)?;
        let g = self.window.resolve(spatial, &kernel, self.ceil_mode)?;
        let global = spatial == kernel.as_slice() && g.pad_begin.iter().chain(&g.pad_end).all(|&p| p == 0);
        let mut out_dims = vec![x[0]];
        if !self.channels_last {
            out_dims.push(channels);
        }
        out_dims.extend(g.output_dims());
        if self.channels_last {
            out_dims.push(channels);
        }
        let planes = Planes { batch: x[0], channels, image: spatial.iter().product(), channels_last: self.channels_last };
        Ok(Pooling { g, planes, out_dims, global })
    }
}

impl Op for QLinearAveragePool {
    fn name(&self) -> &str {
        "QLinearAveragePool"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = expect_dtype(inputs, 0, &Q8)?;
        check_scalar(inputs, 1, &SCALE, false)?;
        check_zero_point(inputs, 2, d)?;
        check_scalar(inputs, 3, &SCALE, false)?;
        check_zero_point(inputs, 4, d)?;
        Ok(vec![TensorType::new(d, self.pooling(required(inputs, 0)?.dims())?.out_dims)])
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// The clipped tap range `[start, end)` of output position `o` along dim `d`.
fn taps(g: &Geometry, d: usize, o: usize) -> (usize, usize) {
    let start = (o * g.stride[d]) as i64 - g.pad_begin[d];
    let end = (start + g.kernel[d] as i64).min(g.input[d] as i64);
    let start = start.max(0) as usize;
    (start, (end.max(0) as usize).max(start))
}

impl CpuKernel for QLinearAveragePool {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let p = self.pooling(x.dims())?;
        let (xq, yq) = (QParams::of(inputs, 1, 2)?, QParams::of(inputs, 3, 4)?);
        if p.global {
            return global_average(x, p.planes, xq, yq, &mut outputs[0]);
        }
        let v = qlinear::ints(x)?;
        let range = bounds(outputs[0].dtype());
        let (g, planes) = (&p.g, p.planes);
        let (c, out_image) = (planes.channels, g.output_size());
        let [_, ih, iw] = g.input;
        let [_, oh, ow] = g.output;
        let kernel_size = g.kernel_size();
        let cip = self.count_include_pad;
        let mut y = vec![0i32; outputs[0].len()];
        cpu::par_chunks_mut(&mut y, 1, kernel_size, |first, part| {
            for (k, out) in part.iter_mut().enumerate() {
                let idx = first + k;
                // The plane and the output pixel of element `idx`.
                let (plane, pix) = if planes.channels_last {
                    let (n, rest) = (idx / (out_image * c), idx % (out_image * c));
                    (n * c + rest % c, rest / c)
                } else {
                    (idx / out_image, idx % out_image)
                };
                let (base, step) = if planes.channels_last {
                    ((plane / c) * planes.image * c + plane % c, c)
                } else {
                    (plane * planes.image, 1)
                };
                let o = [pix / (oh * ow), pix / ow % oh, pix % ow];
                let r: [(usize, usize); 3] = std::array::from_fn(|d| taps(g, d, o[d]));
                let mut acc = 0f32;
                for a in r[0].0..r[0].1 {
                    for b in r[1].0..r[1].1 {
                        for e in r[2].0..r[2].1 {
                            acc += xq.dequantize(v[base + ((a * ih + b) * iw + e) * step]);
                        }
                    }
                }
                let count = if cip { kernel_size } else { (0..3).map(|d| r[d].1 - r[d].0).product() };
                let mean = acc / count as f32;
                *out = qlinear::requantize(mean / yq.scale + yq.zp as f32, 0, range);
            }
        });
        qlinear::write_ints(&mut outputs[0], &y)
    }
}

impl WgslKernel for QLinearAveragePool {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.pooling(required(inputs, 0)?.dims())?;
        if p.global {
            return global_average_wgsl("QLinearAveragePool", inputs, p.planes, &outputs[0]);
        }
        let (g, planes, out) = (&p.g, p.planes, &outputs[0]);
        if g.kernel_size() > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("QLinearAveragePool with {} taps per window on the GPU (at most {})", g.kernel_size(), wgsl::MAX_LOOP_ITERATIONS)));
        }
        let d = out.dtype;
        let mut q = qlinear::WgslParams::new();
        let (sx, zx) = (q.scale(inputs, 1, "sx")?, q.zero_point(inputs, 2, "zx")?);
        let (sy, zy) = (q.scale(inputs, 3, "sy")?, q.zero_point(inputs, 4, "zy")?);
        let mut decl = vec![("x".to_string(), wgsl::elem(d), true)];
        let mut bindings = vec![Binding::Input(0)];
        for (name, i, ty) in q.buffers {
            decl.push((name, ty, true));
            bindings.push(Binding::Input(i));
        }
        decl.push(("y".into(), wgsl::elem(d), false));
        bindings.push(Binding::Output(0));
        let decl: Vec<(&str, &str, bool)> = decl.iter().map(|(n, t, r)| (n.as_str(), *t, *r)).collect();
        let (c, out_image, image) = (planes.channels, g.output_size(), planes.image);
        let locate = if planes.channels_last {
            format!(
                "let n = i / {oc}u; let rest = i % {oc}u; let pix = rest / {c}u;\n    let base = n * {ic}u + rest % {c}u; let step = {c}u;",
                oc = out_image * c,
                ic = image * c
            )
        } else {
            format!("let pix = i % {out_image}u; let base = (i / {out_image}u) * {image}u; let step = 1u;")
        };
        let (lo, hi) = bounds(d);
        let count = if self.count_include_pad { format!("{}u", g.kernel_size()) } else { "(e0 - s0) * (e1 - s1) * (e2 - s2)".into() };
        let body = format!(
            "{locate}\n    let o0 = i32(pix / (OH * OW)); let o1 = i32((pix / OW) % OH); let o2 = i32(pix % OW);\n\
             \x20   let t0 = o0 * i32(SD) - PD; let t1 = o1 * i32(SH) - PH; let t2 = o2 * i32(SW) - PW;\n\
             \x20   let s0 = u32(max(t0, 0)); let e0 = max(s0, u32(max(min(t0 + i32(KD), i32(ID)), 0)));\n\
             \x20   let s1 = u32(max(t1, 0)); let e1 = max(s1, u32(max(min(t1 + i32(KH), i32(IH)), 0)));\n\
             \x20   let s2 = u32(max(t2, 0)); let e2 = max(s2, u32(max(min(t2 + i32(KW), i32(IW)), 0)));\n\
             \x20   let sx = {sx}; let zx = {zx};\n    var acc = 0.0;\n\
             \x20   for (var a = s0; a < e0; a++) {{ for (var b = s1; b < e1; b++) {{ for (var e = s2; e < e2; e++) {{\n\
             \x20       acc = acc + q_mul(sx, f32(i32(x[base + ((a * IH + b) * IW + e) * step]) - zx), i);\n    }} }} }}\n\
             \x20   let mean = q_div(acc, f32({count}));\n\
             \x20   y[i] = {}(q_requantize(q_div(mean, {sy}) + f32({zy}), 0i, {lo}i, {hi}i));",
            wgsl::elem(d)
        );
        let helpers = format!("{}{}", g.wgsl_consts(), qlinear::WGSL_REQUANTIZE);
        Ok(WgslProgram::single(wgsl::simple_kernel("QLinearAveragePool", out.len(), tune.get(&wgsl::workgroup_param()), &decl, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearAveragePool", |spec| Ok(Box::new(QLinearAveragePool::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::{Attr, Tensor};

    fn pool(x: Tensor, attrs: &[(&str, Attr)], (sx, zx): (f32, Tensor), (sy, zy): (f32, Tensor)) -> crate::Result<Tensor> {
        let c = ms("QLinearAveragePool").attrs(attrs).input(x).constant(f(sx)).constant(zx).constant(f(sy)).constant(zy);
        Ok(c.run_cpu()?.remove(0))
    }

    /// onnxruntime 1.32's outputs for the same inputs.
    #[test]
    fn matches_onnxruntime() {
        let ks = |v: &[i64]| Attr::Ints(v.to_vec());
        let xa = || u8s(&[1, 2, 5, 6], &[45, 36, 169, 113, 123, 201, 175, 229, 42, 194, 138, 9, 18, 92, 163, 41, 139, 255, 36, 36, 247, 62, 223, 91, 193, 15, 161, 222, 86, 162, 55, 40, 0, 127, 133, 20, 58, 156, 93, 59, 1, 9, 163, 29, 216, 142, 64, 163, 41, 83, 127, 164, 35, 90, 23, 33, 57, 80, 232, 101]);
        let y = pool(xa(), &[("kernel_shape", ks(&[3, 3])), ("strides", ks(&[2, 2])), ("pads", ks(&[1, 1, 1, 1]))], (0.05, u8s(&[], &[128])), (0.03, u8s(&[], &[110]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[1, 2, 3, 3][..], Vec::from([99, 114, 113, 59, 101, 110, 13, 103, 132, 25, 29, 0, 44, 95, 31, 0, 48, 92])));
        let attrs = [("kernel_shape", ks(&[3, 3])), ("strides", ks(&[2, 2])), ("pads", ks(&[1, 1, 1, 1])), ("count_include_pad", Attr::Int(1)), ("ceil_mode", Attr::Int(1))];
        let y = pool(xa(), &attrs, (0.05, u8s(&[], &[128])), (0.03, u8s(&[], &[110]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[1, 2, 3, 4][..], Vec::from([105, 113, 112, 101, 76, 101, 110, 105, 67, 105, 124, 109, 72, 56, 32, 68, 66, 95, 31, 87, 49, 69, 98, 98])));
        // The window covers the image: the global average's integer path.
        let y = pool(xa(), &[("kernel_shape", ks(&[5, 6]))], (0.05, u8s(&[], &[128])), (0.03, u8s(&[], &[110]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[1, 2, 1, 1][..], Vec::from([103, 41])));
        // Channels last, int8, SAME_UPPER.
        let xb = i8s(&[1, 4, 7, 2], &[-101, 105, 17, -99, -107, -106, 105, 15, 46, 118, -26, 104, -25, 51, 83, -111, 59, 78, 120, 46, -4, -92, 68, -9, 78, -116, -40, 77, 28, 55, 23, 77, 84, 66, 41, -60, -109, 74, -39, -65, -128, -93, -119, -29, -53, -1, 18, -55, 8, 27, 44, 26, -120, -67, 75, 31]);
        let attrs = [("kernel_shape", ks(&[2, 3])), ("strides", ks(&[1, 2])), ("auto_pad", Attr::String("SAME_UPPER".into())), ("channels_last", Attr::Int(1))];
        let y = pool(xb, &attrs, (0.1, i8s(&[], &[-5])), (0.07, i8s(&[], &[3]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[1, 4, 4, 2][..], Vec::from([31, 0, 55, -27, 74, 15, 5, 52, 79, 46, 87, 38, 18, -54, -36, -60, -33, 47, 39, 23, -32, -5, -66, -59, -113, -11, -3, -4, -22, 3, -22, -16])));
        // 1-D with uneven pads; 3-D.
        let xc = u8s(&[2, 3, 9], &[75, 91, 237, 188, 95, 74, 33, 204, 161, 106, 177, 141, 136, 172, 195, 132, 105, 65, 77, 250, 47, 24, 157, 83, 24, 140, 191, 7, 124, 39, 147, 204, 205, 200, 75, 163, 166, 230, 177, 193, 25, 76, 94, 165, 222, 87, 127, 191, 49, 98, 49, 39, 177, 224]);
        let y = pool(xc, &[("kernel_shape", ks(&[4])), ("strides", ks(&[3])), ("pads", ks(&[2, 1]))], (0.02, u8s(&[], &[7])), (0.011, u8s(&[], &[0]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[2, 3, 3][..], Vec::from([138, 255, 172, 245, 255, 255, 255, 205, 171, 106, 221, 255, 255, 255, 151, 182, 199, 152])));
        let xd = i8s(&[1, 1, 3, 4, 5], &[-90, 48, 49, 62, 51, 15, -99, 72, -79, -14, 115, 16, -54, -112, -63, 14, 89, 80, -74, 52, 38, 77, -1, -1, -21, 97, 6, -101, 1, 96, 86, -33, 97, -105, 63, 30, -126, -12, -31, -19, -62, 90, 83, -93, 67, 29, -81, -23, -57, 7, -95, -1, -99, -94, 89, 3, -55, 92, -43, -85]);
        let attrs = [("kernel_shape", ks(&[2, 2, 3])), ("strides", ks(&[1, 2, 2])), ("pads", ks(&[0, 1, 1, 1, 0, 1]))];
        let y = pool(xd, &attrs, (0.04, i8s(&[], &[2])), (0.05, i8s(&[], &[-1]))).unwrap();
        assert_eq!((y.dims(), ints(&y)), (&[1, 1, 3, 2, 3][..], Vec::from([12, 29, 16, 18, -29, -24, 26, 18, -12, -2, -35, -3, 9, 19, -13, -32, -50, -14])));
    }

    #[test]
    fn bad_attributes_are_errors() {
        let x = || u8s(&[1, 1, 4, 4], &[0; 16]);
        let q = || ((0.1, u8s(&[], &[0])), (0.1, u8s(&[], &[0])));
        let (a, b) = q();
        let e = pool(x(), &[], a, b).unwrap_err().to_string();
        assert!(e.contains("kernel_shape"), "{e}");
        let (a, b) = q();
        let e = pool(x(), &[("kernel_shape", Attr::Ints(vec![2, 2])), ("dilations", Attr::Ints(vec![2, 2]))], a, b).unwrap_err().to_string();
        assert!(e.contains("dilations"), "{e}");
        let (a, b) = q();
        let e = pool(x(), &[("kernel_shape", Attr::Ints(vec![2, 2, 2]))], a, b).unwrap_err().to_string();
        assert!(e.contains("kernel_shape"), "{e}");
    }
}
