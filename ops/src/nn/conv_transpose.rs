//! ConvTranspose (1-D to 3-D): strides, pads, output_padding, output_shape, dilations,
//! group, auto_pad, bias. Input position `i` and tap `k` contribute to output
//! `o = i*stride - pad_begin + k*dilation`. CPU: GEMM (W^T x X) into a column buffer,
//! then col2im scattered into the output planes. WGSL: gather, one output element per
//! invocation summing over the inputs that reach it.
use super::conv::FLOATS;
use super::window::{AutoPad, Geometry, WindowAttrs};
use super::conv_cpu::{images_per_block, planes_side_by_side};
use crate::cpu::{self, CpuKernel, SharedOut};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct ConvTranspose {
    window: WindowAttrs,
    group: usize,
    output_padding: Option<Vec<i64>>,
    output_shape: Option<Vec<i64>>,
}

/// Shapes of one transposed convolution; `geo.input` is X's spatial dims and
/// `geo.output` Y's.
struct Problem {
    batch: usize,
    in_channels: usize,
    out_channels: usize,
    group: usize,
    geo: Geometry,
}

impl ConvTranspose {
    fn parse(spec: &NodeSpec) -> Result<ConvTranspose> {
        let group = spec.int("group", 1)?;
        if group < 1 {
            return Err(spec.bad("group", format!("must be >= 1, found {group}")));
        }
        Ok(ConvTranspose {
            window: WindowAttrs::parse(spec)?,
            group: group as usize,
            output_padding: spec.ints_opt("output_padding")?,
            output_shape: spec.ints_opt("output_shape")?,
        })
    }

    fn problem(&self, x: &[usize], w: &[usize]) -> Result<Problem> {
        if x.len() < 3 || x.len() > 5 {
            return Err(OpError::input(0, format!("expected N x C x D1 [x D2 [x D3]] (rank 3 to 5), found shape {x:?}")));
        }
        if w.len() != x.len() || w.contains(&0) {
            return Err(OpError::input(1, format!("weights of shape {w:?} do not fit input {x:?}")));
        }
        if w[0] != x[1] || !x[1].is_multiple_of(self.group) {
            return Err(OpError::input(
                1,
                format!("weights have {} input channels; input has {} (group {})", w[0], x[1], self.group),
            ));
        }
        let n = x.len() - 2;
        let kernel = self.window.kernel(n, Some(&w[2..]))?;
        let strides = self.window.strides(n)?;
        let dilations = self.window.dilations(n)?;
        let out_pad = match &self.output_padding {
            None => vec![0; n],
            Some(p) if p.len() == n => p.clone(),
            Some(p) if p.len() == 2 * n => p[..n].to_vec(),
            Some(p) => return Err(OpError::Attr { attr: "output_padding".into(), what: format!("expected {n} values, found {}", p.len()) }),
        };
        let out_shape = match &self.output_shape {
            None => None,
            Some(s) if s.len() >= n => Some(s[s.len() - n..].to_vec()),
            Some(s) => return Err(OpError::Attr { attr: "output_shape".into(), what: format!("expected {n} values, found {}", s.len()) }),
        };
        let (mut begin, mut end) = self.window.explicit_pads(n)?;
        let mut output = vec![0usize; n];
        for d in 0..n {
            let span = ((kernel[d] - 1) * dilations[d] + 1) as i64;
            let full = strides[d] as i64 * (x[2 + d] as i64 - 1) + out_pad[d] + span;
            let same = matches!(self.window.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
            let target = match &out_shape {
                Some(s) => Some(s[d]),
                None if same => Some((x[2 + d] * strides[d]) as i64),
                None => None,
            };
            match target {
                Some(out) => {
                    let total = (full - out).max(0);
                    let half = total / 2;
                    (begin[d], end[d]) =
                        if self.window.auto_pad == AutoPad::SameUpper { (half, total - half) } else { (total - half, half) };
                    output[d] = out.max(0) as usize;
                }
                None => {
                    if self.window.auto_pad == AutoPad::Valid {
                        (begin[d], end[d]) = (0, 0);
                    }
                    let out = full - begin[d] - end[d];
                    if out < 1 {
                        return Err(OpError::invalid(format!("spatial dim {d}: output size {out} is not positive")));
                    }
                    output[d] = out as usize;
                }
            }
        }
        let geo = Geometry::new(&x[2..], &output, &kernel, &strides, &dilations, &begin, &end);
        Ok(Problem { batch: x[0], in_channels: x[1], out_channels: w[1] * self.group, group: self.group, geo })
    }
}

impl Op for ConvTranspose {
    fn name(&self) -> &str {
        "ConvTranspose"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let (x, w) = (required(inputs, 0)?, required(inputs, 1)?);
        if w.dtype() != dtype {
            return Err(OpError::input(1, format!("dtype {} differs from the input's {dtype}", w.dtype())));
        }
        let p = self.problem(x.dims(), w.dims())?;
        if let Some(b) = inputs.get(2).copied().flatten() {
            if b.dims() != [p.out_channels] {
                return Err(OpError::input(2, format!("bias must have shape [{}], found {}", p.out_channels, b.ty)));
            }
        }
        let mut dims = vec![p.batch, p.out_channels];
        dims.extend(p.geo.output_dims());
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let flops = match (inputs.first().copied().flatten(), inputs.get(1).copied().flatten()) {
            (Some(x), Some(w)) => self.problem(x.dims(), w.dims()).map_or(0, |p| {
                2 * (p.batch * p.in_channels * p.geo.input_size()) as u64
                    * (p.out_channels / p.group * p.geo.kernel_size()) as u64
            }),
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

/// Adds column buffer rows of output channel plane `out` (one row per kernel tap,
/// `tap_stride` apart, one column per input pixel) at their output positions.
fn col2im_plane(g: &Geometry, col: &[f32], tap_stride: usize, out: &mut [f32]) {
    let [_, ih_n, iw_n] = g.input;
    let [_, oh_n, ow_n] = g.output;
    let mut tap = 0;
    for kd in 0..g.kernel[0] {
        for kh in 0..g.kernel[1] {
            for kw in 0..g.kernel[2] {
                let row = &col[tap * tap_stride..][..g.input_size()];
                tap += 1;
                let offs: [i64; 3] = std::array::from_fn(|d| ([kd, kh, kw][d] * g.dilation[d]) as i64 - g.pad_begin[d]);
                for id in 0..g.input[0] {
                    let od = (id * g.stride[0]) as i64 + offs[0];
                    if od < 0 || od >= g.output[0] as i64 {
                        continue;
                    }
                    for ih in 0..ih_n {
                        let oh = (ih * g.stride[1]) as i64 + offs[1];
                        if oh < 0 || oh >= oh_n as i64 {
                            continue;
                        }
                        let src = &row[(id * ih_n + ih) * iw_n..][..iw_n];
                        let dst = &mut out[(od as usize * oh_n + oh as usize) * ow_n..][..ow_n];
                        for (iw, &v) in src.iter().enumerate() {
                            let ow = (iw * g.stride[2]) as i64 + offs[2];
                            if ow >= 0 && ow < ow_n as i64 {
                                dst[ow as usize] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

impl ConvTranspose {
    /// Per block of images (several when their planes are small, see
    /// [`images_per_block`]) and group: X's planes side by side, one GEMM (W^T x X)
    /// into a column buffer, then col2im per image and output channel. Parallel over
    /// blocks when there are enough of them, else inside the GEMM and col2im.
    fn run_f32(&self, p: &Problem, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        let g = &p.geo;
        let (cg, mg) = (p.in_channels / p.group, p.out_channels / p.group);
        let (p_in, p_out, ks) = (g.input_size(), g.output_size(), g.kernel_size());
        let rows = mg * ks;
        let ipb = images_per_block(p.batch, p_in);
        let tasks = p.batch.div_ceil(ipb) * p.group;
        let threads = cpu::threads().max(1);
        let outer = threads > 1 && tasks >= threads;
        let out = SharedOut(y.as_mut_ptr());
        let run_task = |t: usize| {
            let (block, grp) = (t / p.group, t % p.group);
            let images = block * ipb..((block + 1) * ipb).min(p.batch);
            let cols = images.len() * p_in;
            let wg = &w[grp * cg * rows..][..cg * rows];
            cpu::with_scratch(rows * cols + cg * cols, |scratch| {
                let (col, xb) = scratch.split_at_mut(rows * cols);
                let (rhs, rhs_stride) = planes_side_by_side(x, images.clone(), (grp * cg, cg, p.in_channels), p_in, xb);
                let big = 2 * rows * cols * cg > 1 << 20;
                let par = if !outer && big && threads > 1 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
                // SAFETY: col is rows x cols; wg is cg x rows (read transposed); rhs is
                // cg x cols with row stride rhs_stride.
                unsafe {
                    gemm::gemm(
                        rows, cols, cg, col.as_mut_ptr(), 1, cols as isize, false, wg.as_ptr(), rows as isize, 1, rhs, 1,
                        rhs_stride as isize, 0.0, 1.0, false, false, false, par,
                    );
                }
                let col = &*col;
                for (i, img) in images.clone().enumerate() {
                    let base = (img * p.out_channels + grp * mg) * p_out;
                    let plane = |m: usize, dst: &mut [f32]| {
                        dst.fill(bias.map_or(0.0, |b| b[grp * mg + m]));
                        col2im_plane(g, &col[m * ks * cols + i * p_in..], cols, dst);
                    };
                    // SAFETY: this task alone writes the planes of group grp of image img.
                    let yg = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(base), mg * p_out) };
                    if outer {
                        yg.chunks_mut(p_out).enumerate().for_each(|(m, dst)| plane(m, dst));
                    } else {
                        cpu::par_chunks_mut(yg, p_out, ks * p_in / p_out.max(1) + 1, |first, planes| {
                            planes.chunks_mut(p_out).enumerate().for_each(|(i, dst)| plane(first + i, dst))
                        });
                    }
                }
            });
        };
        if outer {
            cpu::par_ranges(tasks, 2 * rows * cg * p_in * ipb, |a, b| (a..b).for_each(&run_task));
        } else {
            (0..tasks).for_each(run_task);
        }
    }

    fn run_f64(&self, p: &Problem, x: &[f64], w: &[f64], bias: Option<&[f64]>, y: &mut [f64]) {
        let g = &p.geo;
        let (cg, mg) = (p.in_channels / p.group, p.out_channels / p.group);
        let (p_in, p_out, ks) = (g.input_size(), g.output_size(), g.kernel_size());
        for (plane, out) in y.chunks_mut(p_out).enumerate() {
            let m = plane % p.out_channels;
            out.fill(bias.map_or(0.0, |b| b[m]));
        }
        for img in 0..p.batch {
            for c in 0..p.in_channels {
                let grp = c / cg;
                for pix in 0..p_in {
                    let i = [pix / (g.input[1] * g.input[2]), pix / g.input[2] % g.input[1], pix % g.input[2]];
                    let v = x[(img * p.in_channels + c) * p_in + pix];
                    for mm in 0..mg {
                        let m = grp * mg + mm;
                        for k in 0..ks {
                            let kk = [k / (g.kernel[1] * g.kernel[2]), k / g.kernel[2] % g.kernel[1], k % g.kernel[2]];
                            let o: [i64; 3] = std::array::from_fn(|d| {
                                (i[d] * g.stride[d]) as i64 - g.pad_begin[d] + (kk[d] * g.dilation[d]) as i64
                            });
                            if (0..3).all(|d| o[d] >= 0 && o[d] < g.output[d] as i64) {
                                let oi = (o[0] as usize * g.output[1] + o[1] as usize) * g.output[2] + o[2] as usize;
                                y[(img * p.out_channels + m) * p_out + oi] += v * w[(c * mg + mm) * ks + k];
                            }
                        }
                    }
                }
            }
        }
    }
}

impl CpuKernel for ConvTranspose {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        if outputs.iter().all(|o| o.is_empty()) {
            return Ok(());
        }
        let (x, w) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let bias = inputs.get(2).copied().flatten();
        let p = self.problem(x.dims(), w.dims())?;
        super::conv::check_bias(bias, p.out_channels)?;
        let y = &mut outputs[0];
        if x.dtype() == DType::F32 && bias.is_none_or(|b| b.dtype() == DType::F32) {
            let b = bias.map(|b| b.as_slice::<f32>()).transpose()?;
            self.run_f32(&p, x.as_slice()?, w.as_slice()?, b, y.as_mut_slice()?);
        } else {
            let b = bias.map(|b| b.to_f64_vec());
            let mut out = vec![0.0; y.len()];
            self.run_f64(&p, &x.to_f64_vec(), &w.to_f64_vec(), b.as_deref(), &mut out);
            *y = Tensor::from_f64(y.dtype(), y.dims(), &out)?;
        }
        Ok(())
    }
}

impl WgslKernel for ConvTranspose {
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
        let has_bias = inputs.get(2).copied().flatten().is_some();
        let wg = tune.get(&wgsl::workgroup_param());
        let (cg, mg) = (p.in_channels / p.group, p.out_channels / p.group);
        let ty = |half: bool| if half { "f16" } else { "f32" };
        let (hx, hw, hb, hy) = (halves.input(0), halves.input(1), halves.input(2), halves.output(0));
        let mut buffers = vec![("x", ty(hx), true), ("w", ty(hw), true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_bias {
            buffers.push(("b", ty(hb), true));
            bindings.push(Binding::Input(2));
        }
        buffers.push(("y", ty(hy), false));
        bindings.push(Binding::Output(0));
        let helpers = format!(
            "{}const C: u32 = {}u;\nconst M: u32 = {}u;\nconst CG: u32 = {cg}u;\nconst MG: u32 = {mg}u;\n",
            p.geo.wgsl_consts(),
            p.in_channels,
            p.out_channels
        );
        // For each dim: t = o + pad - k*dil must be a non-negative multiple of the stride
        // with t / stride inside the input.
        let body = format!(
            "let ow = i % OW;
    let oh = (i / OW) % OH;
    let od = (i / (OW * OH)) % OD;
    let m = (i / (OW * OH * OD)) % M;
    let n = i / (OW * OH * OD * M);
    let g = m / MG;
    let mm = m % MG;
    var acc = {bias};
    for (var c = 0u; c < CG; c++) {{
        let xplane = (n * C + g * CG + c) * ID * IH * IW;
        let wbase = ((g * CG + c) * MG + mm) * KD * KH * KW;
        for (var kd = 0u; kd < KD; kd++) {{
            let td = i32(od) + PD - i32(kd * DD);
            if (td < 0 || td % i32(SD) != 0 || td / i32(SD) >= i32(ID)) {{ continue; }}
            for (var kh = 0u; kh < KH; kh++) {{
                let th = i32(oh) + PH - i32(kh * DH);
                if (th < 0 || th % i32(SH) != 0 || th / i32(SH) >= i32(IH)) {{ continue; }}
                for (var kw = 0u; kw < KW; kw++) {{
                    let tw = i32(ow) + PW - i32(kw * DW);
                    if (tw < 0 || tw % i32(SW) != 0 || tw / i32(SW) >= i32(IW)) {{ continue; }}
                    let xi = xplane + ((u32(td) / SD) * IH + u32(th) / SH) * IW + u32(tw) / SW;
                    acc += {xv} * {wv};
                }}
            }}
        }}
    }}
    y[i] = {result};",
            bias = if has_bias { wgsl::load("b[m]", "f32", hb) } else { "0.0".into() },
            xv = wgsl::load("x[xi]", "f32", hx),
            wv = wgsl::load("w[wbase + (kd * KH + kh) * KW + kw]", "f32", hw),
            result = wgsl::store("acc", "f32", hy),
        );
        let mut d = wgsl::simple_kernel("ConvTranspose", outputs[0].len(), wg, &buffers, bindings, &helpers, &body);
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ConvTranspose", |spec| Ok(Box::new(ConvTranspose::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, ints, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    /// Naive 2-D scatter reference; returns the output for given output dims and pads.
    #[allow(clippy::too_many_arguments)]
    fn reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>, group: usize, s: [usize; 2], d: [usize; 2], pb: [i64; 2], out: [usize; 2]) -> Vec<f64> {
        let (xd, wd) = (x.dims(), w.dims());
        let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
        let (n, c, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
        let (mg, kh_n, kw_n) = (wd[1], wd[2], wd[3]);
        let m_all = mg * group;
        let cg = c / group;
        let mut y = vec![0.0; n * m_all * out[0] * out[1]];
        for img in 0..n {
            for m in 0..m_all {
                let base = (img * m_all + m) * out[0] * out[1];
                if let Some(b) = b {
                    y[base..base + out[0] * out[1]].iter_mut().for_each(|v| *v = b.to_f64_vec()[m]);
                }
                let (grp, mm) = (m / mg, m % mg);
                for ci in 0..cg {
                    let cc = grp * cg + ci;
                    for ih in 0..h {
                        for iw in 0..wi {
                            for kh in 0..kh_n {
                                for kw in 0..kw_n {
                                    let oh = (ih * s[0] + kh * d[0]) as i64 - pb[0];
                                    let ow = (iw * s[1] + kw * d[1]) as i64 - pb[1];
                                    if oh >= 0 && ow >= 0 && (oh as usize) < out[0] && (ow as usize) < out[1] {
                                        y[base + oh as usize * out[1] + ow as usize] += xv[((img * c + cc) * h + ih) * wi + iw]
                                            * wv[((cc * mg + mm) * kh_n + kh) * kw_n + kw];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        y
    }

    #[test]
    fn conv_transpose_matches_reference() {
        for (xd, wd, group, s, d, pads, opad, bias) in [
            ([1usize, 1, 3, 3], [1usize, 2, 3, 3], 1usize, [1usize, 1], [1usize, 1], [0i64, 0, 0, 0], [0i64, 0], false),
            ([2, 3, 5, 4], [3, 2, 3, 2], 1, [3, 2], [1, 1], [1, 0, 0, 1], [1, 1], true),
            ([1, 4, 4, 5], [4, 3, 2, 3], 2, [2, 2], [2, 1], [0, 1, 1, 0], [0, 1], true),
            ([1, 3, 6, 7], [3, 1, 3, 3], 3, [2, 1], [1, 2], [1, 1, 1, 1], [1, 0], false),
        ] {
            let (x, w, b) = (rand_f32(&xd, 1), rand_f32(&wd, 2), rand_f32(&[wd[1] * group], 3));
            let attrs = [
                ("group", Attr::Int(group as i64)),
                ("strides", ints(&s.map(|v| v as i64))),
                ("dilations", ints(&d.map(|v| v as i64))),
                ("pads", ints(&pads)),
                ("output_padding", ints(&opad)),
            ];
            let op = make("ConvTranspose", 19, &attrs, 3, 1).unwrap();
            let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w), bias.then_some(&b)], &[]), &[]).unwrap().remove(0);
            let out: [usize; 2] = std::array::from_fn(|k| {
                (s[k] * (xd[2 + k] - 1) + opad[k] as usize + (wd[2 + k] - 1) * d[k] + 1) - (pads[k] + pads[2 + k]) as usize
            });
            assert_eq!(&y.dims()[2..], &out);
            let want = reference(&x, &w, bias.then_some(&b), group, s, d, [pads[0], pads[1]], out);
            assert_close(&y, &want, 1e-4, &format!("x{xd:?} w{wd:?}"));
        }
    }

    #[test]
    fn output_shape_and_auto_pad() {
        // test_convtranspose_output_shape / _autopad_same shapes.
        let (x, w) = (rand_f32(&[1, 1, 3, 3], 1), rand_f32(&[1, 2, 3, 3], 2));
        let op = make("ConvTranspose", 19, &[("strides", ints(&[3, 2])), ("output_shape", ints(&[10, 8]))], 2, 1).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 2, 10, 8]);
        let want = reference(&x, &w, None, 1, [3, 2], [1, 1], [0, 0], [10, 8]);
        assert_close(&y, &want, 1e-5, "output_shape");
        let op = make("ConvTranspose", 19, &[("strides", ints(&[2, 2])), ("auto_pad", Attr::String("SAME_UPPER".into()))], 2, 1).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 2, 6, 6]);
        // total pad = 2*2 + 3 - 6 = 1: SAME_UPPER puts it at the end.
        let want = reference(&x, &w, None, 1, [2, 2], [1, 1], [0, 0], [6, 6]);
        assert_close(&y, &want, 1e-5, "SAME_UPPER");
        // 1-D and f64.
        let x = Tensor::from_vec(&[1, 1, 3], vec![0.0f64, 1.0, 2.0]).unwrap();
        let w = Tensor::from_vec(&[1, 2, 3], vec![1.0f64; 6]).unwrap();
        let y = run(make("ConvTranspose", 19, &[], 2, 1).unwrap().as_ref(), &as_inputs(&[Some(&x), Some(&w)], &[]), &[]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![0.0, 1.0, 3.0, 3.0, 2.0, 0.0, 1.0, 3.0, 3.0, 2.0]);
    }
}
