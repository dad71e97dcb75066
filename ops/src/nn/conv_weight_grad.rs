//! kiln.ConvWeightGrad: the gradient of Conv with respect to its filter. Inputs: `X`
//! (the convolution's input) and `dY` (the gradient of its output); attributes
//! `kernel_shape` (required), `strides`, `pads`, `dilations`, `group`. Output
//! `dW[m, c, k...] = sum over images n and output pixels p of dY[n, m, p] *
//! X[n, group(m) * C/group + c, p * stride + k * dilation - pad]`.
//!
//! CPU (f32): per image, the im2col block of the image ([C/group x K, P]) times dY's
//! rows as one GEMM each, summed over images in a fixed order (the same bits for any
//! scheduling); images are split over the threads in fixed chunks whose partial sums
//! are added in chunk order. f64: the sum as written. GPU: one invocation per element
//! of dW, summing its `N x P` products (at most [`wgsl::MAX_LOOP_ITERATIONS`]).
use super::conv_cpu::{im2col_strided, images_per_block, planes_side_by_side};
use super::window::{Geometry, WindowAttrs};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::sync::Mutex;

#[derive(Debug)]
pub struct ConvWeightGrad {
    window: WindowAttrs,
    group: usize,
}

struct Shape {
    g: Geometry,
    n: usize,
    c: usize,
    m: usize,
}

impl ConvWeightGrad {
    fn shape(&self, x: &[usize], dy: &[usize]) -> Result<Shape> {
        if x.len() < 3 || x.len() > 5 {
            return Err(OpError::input(0, format!("expected N x C x D1 [x D2 [x D3]] (rank 3 to 5), found shape {x:?}")));
        }
        let kernel = self.window.kernel(x.len() - 2, None)?;
        let g = self.window.resolve(&x[2..], &kernel, false)?;
        let (n, c, m) = (x[0], x[1], dy.get(1).copied().unwrap_or(0));
        let mut want = vec![n, m];
        want.extend(g.output_dims());
        if dy != want.as_slice() {
            return Err(OpError::input(1, format!("dY must be {want:?} (the convolution's output for X {x:?}), found {dy:?}")));
        }
        if self.group == 0 || c % self.group != 0 || m % self.group != 0 {
            return Err(OpError::Unsupported(format!("group {} must divide the {c} input and {m} output channels", self.group)));
        }
        Ok(Shape { g, n, c, m })
    }

    fn f32_sum(&self, s: &Shape, x: &[f32], dy: &[f32], dw: &mut [f32]) {
        let (g, groups) = (&s.g, self.group);
        let (cg, mg) = (s.c / groups, s.m / groups);
        let (plane_in, p) = (g.input_size(), g.output_size());
        let kc = cg * g.kernel_size();
        if p == 0 || kc == 0 || s.n == 0 {
            dw.iter_mut().for_each(|v| *v = 0.0);
            return;
        }
        // Fixed chunks of images; each chunk's partial dW, added in chunk order.
        let chunks = s.n.min(cpu::threads().max(1) * 2).max(1);
        let per = s.n.div_ceil(chunks);
        let partials: Vec<Mutex<Vec<f32>>> = (0..chunks).map(|_| Mutex::new(vec![])).collect();
        cpu::par_ranges(chunks, per * s.m * kc * p, |lo, hi| {
            for chunk in lo..hi {
                let mut acc = vec![0f32; dw.len()];
                let images = chunk * per..((chunk + 1) * per).min(s.n);
                // Blocks of images side by side (small planes): dW += dY_block x col_block^T
                // with the reduction over every pixel of the block at once.
                let ipb = images_per_block(images.len(), p);
                let mut first = true;
                for b0 in images.clone().step_by(ipb) {
                    let block = b0..(b0 + ipb).min(images.end);
                    let cols = block.len() * p;
                    cpu::with_scratch(kc * cols + mg * cols, |scratch| {
                        let (col, dyb) = scratch.split_at_mut(kc * cols);
                        for grp in 0..groups {
                            for (i, img) in block.clone().enumerate() {
                                let xg = &x[(img * s.c + grp * cg) * plane_in..][..cg * plane_in];
                                im2col_strided(g, xg, cg, 0, p, &mut col[i * p..], cols);
                            }
                            let (lhs, lhs_stride) = planes_side_by_side(dy, block.clone(), (grp * mg, mg, s.m), p, dyb);
                            let dst = &mut acc[grp * mg * kc..][..mg * kc];
                            // SAFETY: dst is mg x kc (row stride kc), lhs mg x cols (row
                            // stride lhs_stride), col^T cols x kc (col is kc x cols).
                            unsafe {
                                gemm::gemm(
                                    mg, kc, cols, dst.as_mut_ptr(), 1, kc as isize, !first, lhs, 1, lhs_stride as isize, col.as_ptr(),
                                    cols as isize, 1, 1.0, 1.0, false, false, false, gemm::Parallelism::None,
                                )
                            };
                        }
                    });
                    first = false;
                }
                *partials[chunk].lock().expect("a partial sum") = acc;
            }
        });
        dw.iter_mut().for_each(|v| *v = 0.0);
        for part in partials {
            let part = part.into_inner().expect("a partial sum");
            for (o, v) in dw.iter_mut().zip(part) {
                *o += v;
            }
        }
    }

    /// The sum as written, in f64 (the reference, and the other float types).
    fn f64_sum(&self, s: &Shape, x: &[f64], dy: &[f64]) -> Vec<f64> {
        let g = &s.g;
        let (cg, mg) = (s.c / self.group, s.m / self.group);
        let (plane_in, p, k) = (g.input_size(), g.output_size(), g.kernel_size());
        let mut dw = vec![0f64; s.m * cg * k];
        for m in 0..s.m {
            let c0 = m / mg * cg;
            for c in 0..cg {
                for tap in 0..k {
                    let t = [tap / (g.kernel[1] * g.kernel[2]), tap / g.kernel[2] % g.kernel[1], tap % g.kernel[2]];
                    let mut sum = 0.0;
                    for img in 0..s.n {
                        for o in 0..p {
                            let oc = [o / (g.output[1] * g.output[2]), o / g.output[2] % g.output[1], o % g.output[2]];
                            let at: Option<Vec<usize>> = (0..3)
                                .map(|d| {
                                    let v = (oc[d] * g.stride[d]) as i64 - g.pad_begin[d] + (t[d] * g.dilation[d]) as i64;
                                    (0..g.input[d] as i64).contains(&v).then_some(v as usize)
                                })
                                .collect();
                            if let Some(a) = at {
                                let xi = (img * s.c + c0 + c) * plane_in + (a[0] * g.input[1] + a[1]) * g.input[2] + a[2];
                                sum += dy[(img * s.m + m) * p + o] * x[xi];
                            }
                        }
                    }
                    dw[(m * cg + c) * k + tap] = sum;
                }
            }
        }
        dw
    }
}

impl Op for ConvWeightGrad {
    fn name(&self) -> &str {
        "ConvWeightGrad"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let (x, dy) = (required(inputs, 0)?, required(inputs, 1)?);
        if dy.dtype() != dtype {
            return Err(OpError::input(1, format!("dY is {}, X is {dtype}", dy.dtype())));
        }
        let s = self.shape(x.dims(), dy.dims())?;
        let mut dims = vec![s.m, s.c / self.group];
        dims.extend(&s.g.kernel[3 - s.g.rank..]);
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let dy = inputs.get(1).copied().flatten().map(|a| a.ty.len()).unwrap_or(0);
        let per_out = outputs.first().map(|o| o.dims.get(1).copied().unwrap_or(1) * o.dims[2..].iter().product::<usize>()).unwrap_or(0);
        Cost { flops: 2 * (dy * per_out) as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ConvWeightGrad {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (x, dy) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let s = self.shape(x.dims(), dy.dims())?;
        if x.dtype() == DType::F32 {
            self.f32_sum(&s, x.as_slice::<f32>()?, dy.as_slice::<f32>()?, outputs[0].as_mut_slice::<f32>()?);
        } else {
            let dw = self.f64_sum(&s, &x.to_f64_vec(), &dy.to_f64_vec());
            let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
            outputs[0] = Tensor::from_f64(dtype, &dims, &dw)?;
        }
        Ok(())
    }
}

impl WgslKernel for ConvWeightGrad {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// f16 operands stored as halves are read into the f32 the kernel sums in.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let (x, dy) = (required(inputs, 0)?, required(inputs, 1)?);
        let ty = |half: bool| if half { "f16" } else { "f32" };
        let (hx, hdy, hdw) = (halves.input(0), halves.input(1), halves.output(0));
        if !matches!(x.dtype(), DType::F32 | DType::F16) {
            return Err(OpError::Unsupported(format!("ConvWeightGrad of {} on the GPU", x.dtype())));
        }
        let s = self.shape(x.dims(), dy.dims())?;
        let p = s.g.output_size();
        let n_out = outputs[0].len();
        if n_out == 0 {
            return Ok(WgslProgram::default());
        }
        if s.n * p * s.g.input_size() == 0 {
            // Nothing to sum: the gradient is zero.
            let buffers = [("dw", ty(hdw), false)];
            let mut d = wgsl::simple_kernel("ConvWeightGrad", n_out, tune.get(&wgsl::workgroup_param()), &buffers, vec![Binding::Output(0)], "", &format!("dw[i] = {};", wgsl::store("0.0", "f32", hdw)));
            d.source = wgsl::with_halves(d.source, hdw);
            return Ok(WgslProgram::single(d));
        }
        if s.n * p > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "ConvWeightGrad sums {} products per filter element, beyond the GPU loop budget of {}; it runs on the CPU",
                s.n * p,
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let (cg, mg) = (s.c / self.group, s.m / self.group);
        let consts = format!(
            "{}const N: u32 = {}u;\nconst C: u32 = {}u;\nconst M: u32 = {}u;\nconst CG: u32 = {cg}u;\nconst MG: u32 = {mg}u;\n",
            s.g.wgsl_consts(),
            s.n,
            s.c,
            s.m
        );
        let body = format!("let tap = i % (KD * KH * KW);\n    let c = (i / (KD * KH * KW)) % CG;\n    let m = i / (KD * KH * KW * CG);\n    \
             let kd = i32(tap / (KH * KW));\n    let kh = i32((tap / KW) % KH);\n    let kw = i32(tap % KW);\n    \
             let plane = ID * IH * IW;\n    let ch = (m / MG) * CG + c;\n    var sum = 0.0;\n    \
             for (var q = 0u; q < N * OD * OH * OW; q = q + 1u) {{\n        let img = q / (OD * OH * OW);\n        let o = q % (OD * OH * OW);\n        \
             let id = i32(o / (OH * OW)) * i32(SD) - PD + kd * i32(DD);\n        let ih = i32((o / OW) % OH) * i32(SH) - PH + kh * i32(DH);\n        \
             let iw = i32(o % OW) * i32(SW) - PW + kw * i32(DW);\n        \
             if (id < 0 || id >= i32(ID) || ih < 0 || ih >= i32(IH) || iw < 0 || iw >= i32(IW)) {{ continue; }}\n        \
             sum = sum + {} * {};\n    }}\n    \
             dw[i] = {};",
            wgsl::load("dy[(img * M + m) * OD * OH * OW + o]", "f32", hdy),
            wgsl::load("x[(img * C + ch) * plane + (u32(id) * IH + u32(ih)) * IW + u32(iw)]", "f32", hx),
            wgsl::store("sum", "f32", hdw)
        );
        let mut d = wgsl::simple_kernel(
            "ConvWeightGrad",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", ty(hx), true), ("dy", ty(hdy), true), ("dw", ty(hdw), false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)],
            &consts,
            &body,
        );
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "ConvWeightGrad", |spec: &NodeSpec| {
        let window = WindowAttrs::parse(spec)?;
        if window.kernel.is_none() {
            return Err(spec.bad("kernel_shape", "is required"));
        }
        let group = usize::try_from(spec.int("group", 1)?).map_err(|_| spec.bad("group", "must be positive"))?;
        Ok(Box::new(ConvWeightGrad { window, group }))
    });
}
