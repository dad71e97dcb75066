//! STFT (opset 17): the short-time Fourier transform of `signal` (`[batch, length, 1 or
//! 2]`, real or complex). Frames of `frame_length` samples start every `frame_step`
//! samples (`frames = 1 + (length - frame_length) / frame_step`), are weighted by the
//! optional `window` (input 2, of `frame_length` points) and transformed; `onesided`
//! (default 1) keeps the `frame_length/2 + 1` non-redundant frequencies. Output
//! `[batch, frames, bins, 2]`. The frame length is input 3's value, else the window's
//! length, else the signal's. The step and length are input values, so inference needs
//! them known. Kernels: [`super::spectrum`].
use super::spectrum::{Lines, Mode};
use crate::cpu::{self, CpuKernel};
use super::scalar_int;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Stft {
    onesided: bool,
}

impl Stft {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(Lines, TensorType)> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let x = required(inputs, 0)?;
        let (b, s, c) = match *x.dims() {
            [b, s, c] if c == 1 || c == 2 => (b, s, c),
            ref d => return Err(OpError::input(0, format!("expected [batch, length, 1 or 2], found shape {d:?}"))),
        };
        let step = scalar_int(inputs, 1, "frame_step")?;
        if step < 1 {
            return Err(OpError::input(1, format!("frame_step must be positive, found {step}")));
        }
        let window = inputs.get(2).copied().flatten();
        if let Some(w) = window {
            if w.dtype() != dtype || w.rank() != 1 {
                return Err(OpError::input(2, format!("the window must be a 1-D {dtype} tensor, found {}", w.ty)));
            }
        }
        let len = match inputs.get(3).copied().flatten() {
            Some(_) => scalar_int(inputs, 3, "frame_length")?,
            None => window.map_or(s, |w| w.dims()[0]) as i64,
        };
        if len < 1 || len > s as i64 {
            return Err(OpError::input(3, format!("frame_length {len} is outside [1, {s}] (the signal's length)")));
        }
        let len = len as usize;
        if let Some(w) = window {
            if w.dims()[0] != len {
                return Err(OpError::input(2, format!("the window has {} points, the frames {len}", w.dims()[0])));
            }
        }
        // A step past the signal gives one frame, as a step of the signal's length does
        // (which keeps the strides of the kernels small).
        let step = step.min(s as i64) as usize;
        let frames = 1 + (s - len) / step;
        let n_out = if self.onesided { len / 2 + 1 } else { len };
        let lines = Lines {
            outer: b * frames,
            frames,
            inner: 1,
            outer_stride: s,
            frame_stride: step,
            t_stride: 1,
            inner_stride: 0,
            c_in: c,
            n_use: len,
            len,
            n_out,
            mode: Mode::Forward,
            window: window.is_some(),
        };
        let out = TensorType::new(dtype, vec![b, frames, n_out, 2]);
        if out.checked_bytes().is_none() {
            return Err(OpError::invalid(format!("the STFT output {out} does not fit in memory")));
        }
        Ok((lines, out))
    }
}

impl Op for Stft {
    fn name(&self) -> &str {
        "STFT"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![self.plan(inputs)?.1])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.plan(inputs).map(|(l, _)| l.flops()).unwrap_or(0);
        Cost { flops, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Stft {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (lines, out) = crate::tensor::tensor_args(inputs, |a| self.plan(a))?;
        lines.run_cpu(cpu::input(inputs, 0)?, inputs.get(2).copied().flatten(), &out, outputs)
    }
}

impl WgslKernel for Stft {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (lines, out) = self.plan(inputs)?;
        lines.wgsl("STFT", &out, tune.get(&wgsl::workgroup_param()))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "STFT", |spec| {
        let onesided = match spec.int("onesided", 1)? {
            0 => false,
            1 => true,
            v => return Err(spec.bad("onesided", format!("expected 0 or 1, found {v}"))),
        };
        Ok(Box::new(Stft { onesided }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};
    use std::f64::consts::PI;

    /// The spectrogram from the definition: frame f, bin k of a real signal.
    fn stft(x: &[f64], w: &[f64], step: usize, bins: usize) -> Vec<f64> {
        let l = w.len();
        let frames = 1 + (x.len() - l) / step;
        let mut out = vec![];
        for f in 0..frames {
            for k in 0..bins {
                let (mut re, mut im) = (0.0, 0.0);
                for t in 0..l {
                    let th = -2.0 * PI * (k * t) as f64 / l as f64;
                    re += x[f * step + t] * w[t] * th.cos();
                    im += x[f * step + t] * w[t] * th.sin();
                }
                out.extend([re, im]);
            }
        }
        out
    }

    #[test]
    fn frames_windows_and_sides() {
        let x = rand_f32(&[1, 29, 1], 8);
        let xv = x.to_f64_vec();
        let w: Vec<f32> = (0..8).map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / 8.0).cos()).collect();
        let wv: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let got = Case::new("STFT").opset(17).input(x.clone()).constant(Tensor::scalar(3i64)).input(f32s(&[8], &w)).run_cpu().unwrap();
        assert_eq!(got[0].dims(), &[1, 8, 5, 2]);
        assert_close(&got[0], &stft(&xv, &wv, 3, 5), 1e-5, "windowed onesided");
        let got = Case::new("STFT")
            .opset(17)
            .input(x.clone())
            .constant(Tensor::scalar(4i64))
            .omitted()
            .constant(Tensor::scalar(6i64))
            .attr("onesided", Attr::Int(0))
            .run_cpu()
            .unwrap();
        assert_eq!(got[0].dims(), &[1, 6, 6, 2]);
        assert_close(&got[0], &stft(&xv, &[1.0; 6], 4, 6), 1e-5, "rectangular two-sided");
        // A frame longer than the signal, a zero step and a window of the wrong length.
        assert!(Case::new("STFT").opset(17).input(x.clone()).constant(Tensor::scalar(1i64)).omitted().constant(Tensor::scalar(30i64)).run_cpu().is_err());
        assert!(Case::new("STFT").opset(17).input(x.clone()).constant(Tensor::scalar(0i64)).input(f32s(&[8], &w)).run_cpu().is_err());
        let short = Case::new("STFT").opset(17).input(x).constant(Tensor::scalar(2i64)).input(f32s(&[8], &w)).constant(Tensor::scalar(6i64));
        assert!(short.run_cpu().is_err());
    }
}
