//! kiln.MaxPoolGrad: the gradient of MaxPool with respect to its input. Inputs: `X`
//! (MaxPool's input) and `dY` (the gradient of its output); MaxPool's window
//! attributes. Each window's gradient goes to the window's maximum, found again from
//! `X` the way MaxPool takes it (the first largest element in scan order, a NaN first),
//! so no Indices output and no scatter are needed. Windows that overlap add their
//! gradients.
//!
//! GPU: one invocation per element of `dX`, for windows that do not overlap (each
//! element in at most one window, so no two invocations write one element); pooling
//! with overlapping windows runs on the CPU.
use super::pool::window_ranges;
use super::window::{Geometry, WindowAttrs};
use crate::cpu::{self, CpuKernel};
use crate::elementwise;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct MaxPoolGrad {
    window: WindowAttrs,
    ceil_mode: bool,
}

impl MaxPoolGrad {
    fn geometry(&self, x: &[usize]) -> Result<Geometry> {
        if x.len() < 3 || x.len() > 5 {
            return Err(OpError::input(0, format!("expected N x C x D1 [x D2 [x D3]] (rank 3 to 5), found shape {x:?}")));
        }
        let kernel = self.window.kernel(x.len() - 2, None)?;
        self.window.resolve(&x[2..], &kernel, self.ceil_mode)
    }

    /// Adds each window's gradient to its maximum, plane by plane.
    fn run_typed<T: Copy + PartialOrd + std::ops::AddAssign + Default + Send + Sync>(&self, g: &Geometry, x: &[T], dy: &[T], dx: &mut [T], neg_inf: T) {
        let (in_size, out_size) = (g.input_size(), g.output_size());
        if in_size == 0 {
            return;
        }
        let ranges = window_ranges(g);
        let [_, oh_n, ow_n] = g.output;
        let [_, ih_n, iw_n] = g.input;
        // Each window's first maximum, by MaxPool's rule: strictly larger wins, the
        // first NaN stays. Branch-free (`&`, `|` and selects): which tap wins is data,
        // and mispredicted branches cost more than the comparisons.
        #[allow(clippy::eq_op)]
        let better = |v: T, best: T| (v > best) | ((v != v) & (best == best));
        // 2x2 windows at stride 2 without padding: each input in at most one window.
        let pairs_2x2 = g.input[0] == 1
            && g.kernel == [1, 2, 2]
            && g.stride[1..] == [2, 2]
            && g.dilation[1..] == [1, 1]
            && g.pad_begin[1..] == [0, 0]
            && 2 * oh_n <= ih_n
            && 2 * ow_n <= iw_n;
        cpu::par_chunks_mut(dx, in_size, out_size * g.kernel_size() + in_size, |first, part| {
            for (i, plane) in part.chunks_mut(in_size).enumerate() {
                let p = first + i;
                plane.iter_mut().for_each(|v| *v = T::default());
                let (xc, gc) = (&x[p * in_size..][..in_size], &dy[p * out_size..][..out_size]);
                if pairs_2x2 {
                    pool_2x2_grad(xc, gc, [ih_n, iw_n], [oh_n, ow_n], plane, better);
                    continue;
                }
                let mut grads = gc.iter();
                for &(sd, d0, d1) in &ranges[0] {
                    for &(sh, h0, h1) in &ranges[1] {
                        for &(sw, w0, w1) in &ranges[2] {
                            let grad = *grads.next().expect("one gradient per window");
                            let mut best = neg_inf;
                            let mut arg = usize::MAX;
                            for kd in d0..d1 {
                                let id = (sd + (kd * g.dilation[0]) as i64) as usize;
                                for kh in h0..h1 {
                                    let row = (id * ih_n + (sh + (kh * g.dilation[1]) as i64) as usize) * iw_n;
                                    for kw in w0..w1 {
                                        let at = row + (sw + (kw * g.dilation[2]) as i64) as usize;
                                        let v = xc[at];
                                        let take = (arg == usize::MAX) | better(v, best);
                                        arg ^= (arg ^ at) & (take as usize).wrapping_neg();
                                        best = xc[arg];
                                    }
                                }
                            }
                            if arg != usize::MAX {
                                plane[arg] += grad;
                            }
                        }
                    }
                }
                debug_assert_eq!(ranges[1].len() * ranges[2].len(), oh_n * ow_n);
            }
        });
    }
}

/// One plane's gradient for 2x2 windows at stride 2 (no padding, `plane` zeroed): each
/// window's winner found by selects, independent of the other windows'.
fn pool_2x2_grad<T: Copy + Default>(xc: &[T], dy: &[T], [ih_n, iw_n]: [usize; 2], [oh_n, ow_n]: [usize; 2], dx: &mut [T], better: impl Fn(T, T) -> bool) {
    for oh in 0..oh_n {
        let (r0, r1) = (&xc[2 * oh * iw_n..][..iw_n], &xc[(2 * oh + 1) * iw_n..][..iw_n]);
        let (top, bottom) = dx[2 * oh * iw_n..][..2 * iw_n].split_at_mut(iw_n);
        debug_assert!(2 * oh + 1 < ih_n);
        for (ow, &g) in dy[oh * ow_n..][..ow_n].iter().enumerate() {
            let (a, b, c, d) = (r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]);
            let t1 = better(b, a);
            let m1 = if t1 { b } else { a };
            let t2 = better(c, m1);
            let m2 = if t2 { c } else { m1 };
            let t3 = better(d, m2);
            let arg = if t3 { 3 } else if t2 { 2 } else { t1 as usize };
            let z = T::default();
            top[2 * ow] = if arg == 0 { g } else { z };
            top[2 * ow + 1] = if arg == 1 { g } else { z };
            bottom[2 * ow] = if arg == 2 { g } else { z };
            bottom[2 * ow + 1] = if arg == 3 { g } else { z };
        }
    }
}

impl Op for MaxPoolGrad {
    fn name(&self) -> &str {
        "MaxPoolGrad"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16])?;
        let (x, dy) = (required(inputs, 0)?, required(inputs, 1)?);
        let g = self.geometry(x.dims())?;
        let mut want = x.dims()[..2].to_vec();
        want.extend(g.output_dims());
        if dy.dtype() != dtype || dy.dims() != want.as_slice() {
            return Err(OpError::input(1, format!("dY must be {dtype}{want:?} (MaxPool's output for X {:?}), found {}", x.dims(), dy.ty)));
        }
        Ok(vec![x.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MaxPoolGrad {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (x, dy) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let g = self.geometry(x.dims())?;
        match x.dtype() {
            DType::F16 => {
                // Exact through f32: the maximum is found and dY's values are moved.
                let wide = |t: &Tensor| Tensor::from_f64(DType::F32, t.dims(), &t.to_f64_vec());
                let (xw, dyw) = (wide(x)?, wide(dy)?);
                let mut dx = Tensor::zeros(DType::F32, x.dims());
                self.run_typed(&g, xw.as_slice::<f32>()?, dyw.as_slice::<f32>()?, dx.as_mut_slice::<f32>()?, f32::NEG_INFINITY);
                outputs[0] = Tensor::from_f64(DType::F16, x.dims(), &dx.to_f64_vec())?;
            }
            DType::F32 => self.run_typed(&g, x.as_slice::<f32>()?, dy.as_slice::<f32>()?, outputs[0].as_mut_slice::<f32>()?, f32::NEG_INFINITY),
            _ => self.run_typed(&g, x.as_slice::<f64>()?, dy.as_slice::<f64>()?, outputs[0].as_mut_slice::<f64>()?, f64::NEG_INFINITY),
        }
        Ok(())
    }
}

impl WgslKernel for MaxPoolGrad {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// f16 operands stored as halves are compared and moved as f32.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (hx, hdy, hdx) = (halves.input(0), halves.input(1), halves.output(0));
        let ty = |half: bool| if half { "f16" } else { "f32" };
        if !matches!(x.dtype(), DType::F32 | DType::F16) {
            return Err(OpError::Unsupported(format!("MaxPoolGrad of {} on the GPU", x.dtype())));
        }
        let g = self.geometry(x.dims())?;
        if outputs[0].is_empty() {
            return Ok(WgslProgram::default());
        }
        if (0..3).any(|d| g.stride[d] < (g.kernel[d] - 1) * g.dilation[d] + 1) {
            return Err(OpError::Unsupported("MaxPoolGrad with overlapping windows runs on the CPU".into()));
        }
        // Each element's window (if any) per dim; then the window's maximum, found as
        // MaxPool finds it; the element takes the window's gradient if it is that one.
        let body = "let plane = i / (ID * IH * IW);\n    let r = i % (ID * IH * IW);\n    \
             let c = vec3<i32>(i32(r / (IH * IW)), i32((r / IW) % IH), i32(r % IW));\n    \
             let pad = vec3<i32>(PD, PH, PW);\n    let s = vec3<i32>(i32(SD), i32(SH), i32(SW));\n    \
             let dl = vec3<i32>(i32(DD), i32(DH), i32(DW));\n    let k = vec3<i32>(i32(KD), i32(KH), i32(KW));\n    \
             let on = vec3<i32>(i32(OD), i32(OH), i32(OW));\n    let off = c + pad;\n    let o = off / s;\n    let t = off - o * s;\n    \
             dx[i] = ZERO;\n    \
             if (any(t % dl != vec3<i32>(0)) || any(t / dl >= k) || any(o >= on)) { return; }\n    \
             let base = plane * ID * IH * IW;\n    var best = 0.0;\n    var arg = -1;\n    \
             for (var kd = 0; kd < k.x; kd = kd + 1) {\n        let id = o.x * s.x - pad.x + kd * dl.x;\n        \
             if (id < 0 || id >= i32(ID)) { continue; }\n        \
             for (var kh = 0; kh < k.y; kh = kh + 1) {\n            let ih = o.y * s.y - pad.y + kh * dl.y;\n            \
             if (ih < 0 || ih >= i32(IH)) { continue; }\n            \
             for (var kw = 0; kw < k.z; kw = kw + 1) {\n                let iw = o.z * s.z - pad.z + kw * dl.z;\n                \
             if (iw < 0 || iw >= i32(IW)) { continue; }\n                \
             let at = (id * i32(IH) + ih) * i32(IW) + iw;\n                let v = LOAD_X;\n                \
             if (arg < 0 || v > best || (ISNAN_V && !ISNAN_B)) { best = v; arg = at; }\n            }\n        }\n    }\n    \
             if (arg == i32(r)) { dx[i] = STORE_DY; }"
            .replace("ISNAN_V", &elementwise::wgsl_isnan("v"))
            .replace("ISNAN_B", &elementwise::wgsl_isnan("best"))
            .replace("ZERO", &wgsl::store("0.0", "f32", hdx))
            .replace("LOAD_X", &wgsl::load("x[base + u32(at)]", "f32", hx))
            .replace("STORE_DY", &wgsl::store(&wgsl::load("dy[plane * OD * OH * OW + (u32(o.x) * OH + u32(o.y)) * OW + u32(o.z)]", "f32", hdy), "f32", hdx));
        let mut d = wgsl::simple_kernel(
            "MaxPoolGrad",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", ty(hx), true), ("dy", ty(hdy), true), ("dx", ty(hdx), false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)],
            &g.wgsl_consts(),
            &body,
        );
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "MaxPoolGrad", |spec: &NodeSpec| {
        let window = WindowAttrs::parse(spec)?;
        if window.kernel.is_none() {
            return Err(spec.bad("kernel_shape", "is required"));
        }
        Ok(Box::new(MaxPoolGrad { window, ceil_mode: spec.int("ceil_mode", 0)? != 0 }))
    });
}
