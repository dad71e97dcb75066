//! DFT (opsets 17 and 20): the discrete Fourier transform of `input`
//! (`[batch, signal dims..., 1 or 2]`: real, or complex as (re, im) pairs) along one
//! signal axis. Opset 17 names the axis as an attribute (default 1), opset 20 as
//! optional input 2 (a scalar, default -2; the last dim is never the axis).
//! `dft_length` (input 1) pads the signal with zeros or truncates it; by default it is
//! the axis' length, or `2 (n - 1)` for a real inverse. `onesided` keeps the `L/2 + 1`
//! non-redundant frequencies of a forward transform; with `inverse` it reads such a
//! one-sided spectrum and writes the real signal (numpy's irfft, as onnx.reference
//! does). The inverse is scaled by `1/L`. The output has the input's dtype, with a last
//! dim of 2 (or 1 for the real inverse).
//!
//! The transform's length and axis are input values, so inference needs them known
//! (sessions bind such inputs by value). Kernels: [`super::spectrum`].
use super::spectrum::{Lines, Mode};
use crate::cpu::{self, CpuKernel};
use super::scalar_int;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Longest transform accepted (a length from a model never allocates more).
const MAX_LENGTH: i64 = 1 << 30;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

#[derive(Debug)]
pub struct Dft {
    /// The axis attribute (opset < 20); `None`: the axis is input 2.
    axis_attr: Option<i64>,
    inverse: bool,
    onesided: bool,
}

impl Dft {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(Lines, TensorType)> {
        let dtype = expect_dtype(inputs, 0, &FLOATS)?;
        let x = required(inputs, 0)?;
        let dims = x.dims();
        let r = dims.len();
        if r < 2 || !matches!(dims[r - 1], 1 | 2) {
            return Err(OpError::input(0, format!("expected [batch, signal dims..., 1 or 2], found shape {dims:?}")));
        }
        let axis = match self.axis_attr {
            Some(a) => a,
            None if inputs.get(2).copied().flatten().is_some() => scalar_int(inputs, 2, "the DFT axis")?,
            None => -2,
        };
        let ri = r as i64;
        let a = if axis < 0 { axis + ri } else { axis };
        if a < 0 || a > ri - 2 {
            return Err(OpError::invalid(format!("axis {axis} is outside [-{r}, -2] and [0, {}] for an input of rank {r}", r - 2)));
        }
        let a = a as usize;
        let n = dims[a];
        let len = match inputs.get(1).copied().flatten() {
            Some(_) => scalar_int(inputs, 1, "dft_length")?,
            None if self.inverse && self.onesided => 2 * (n as i64 - 1),
            None => n as i64,
        };
        if !(1..=MAX_LENGTH).contains(&len) {
            return Err(OpError::invalid(format!("the transform length {len} is outside [1, {MAX_LENGTH}]")));
        }
        let len = len as usize;
        let c_in = dims[r - 1];
        let inner: usize = dims[a + 1..r - 1].iter().product();
        let (mode, n_use, n_out) = match (self.inverse, self.onesided) {
            (false, false) => (Mode::Forward, n.min(len), len),
            (false, true) => (Mode::Forward, n.min(len), len / 2 + 1),
            (true, false) => (Mode::Inverse, n.min(len), len),
            (true, true) => (Mode::InverseReal, n.min(len / 2 + 1), len),
        };
        let lines = Lines {
            outer: dims[..a].iter().product(),
            frames: 1,
            inner,
            outer_stride: n * inner,
            frame_stride: 0,
            t_stride: inner,
            inner_stride: 1,
            c_in,
            n_use,
            len,
            n_out,
            mode,
            window: false,
        };
        let mut out = dims.to_vec();
        out[a] = n_out;
        out[r - 1] = lines.c_out();
        let out = TensorType::new(dtype, out);
        if out.checked_bytes().is_none() {
            return Err(OpError::invalid(format!("the DFT output {out} does not fit in memory")));
        }
        Ok((lines, out))
    }
}

impl Op for Dft {
    fn name(&self) -> &str {
        "DFT"
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

impl CpuKernel for Dft {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (lines, out) = crate::tensor::tensor_args(inputs, |a| self.plan(a))?;
        lines.run_cpu(cpu::input(inputs, 0)?, None, &out, outputs)
    }
}

impl WgslKernel for Dft {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (lines, out) = self.plan(inputs)?;
        lines.wgsl("DFT", &out, tune.get(&wgsl::workgroup_param()))
    }
}

fn flag(spec: &NodeSpec, name: &str) -> Result<bool> {
    match spec.int(name, 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(spec.bad(name, format!("expected 0 or 1, found {v}"))),
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "DFT", |spec| {
        let axis_attr = if spec.opset < 20 { Some(spec.int("axis", 1)?) } else { None };
        Ok(Box::new(Dft { axis_attr, inverse: flag(spec, "inverse")?, onesided: flag(spec, "onesided")? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};
    use std::f64::consts::PI;

    /// The transform of one complex line of length `l` from its definition.
    fn dft(x: &[(f64, f64)], l: usize, sign: f64) -> Vec<(f64, f64)> {
        (0..l)
            .map(|k| {
                x.iter().take(l).enumerate().fold((0.0, 0.0), |(re, im), (t, &(a, b))| {
                    let th = sign * 2.0 * PI * (k * t) as f64 / l as f64;
                    (re + a * th.cos() - b * th.sin(), im + a * th.sin() + b * th.cos())
                })
            })
            .collect()
    }

    fn complex(t: &Tensor) -> Vec<(f64, f64)> {
        t.to_f64_vec().chunks(2).map(|c| (c[0], c[1])).collect()
    }

    #[test]
    fn forward_inverse_and_onesided_follow_the_definition() {
        // One line along axis 1 of [1, 7, 2]: forward (opset 20, default axis -2).
        let x = rand_f32(&[1, 7, 2], 3);
        let xs = complex(&x);
        let got = Case::new("DFT").opset(20).input(x.clone()).run_cpu().unwrap();
        assert_close(&got[0], &dft(&xs, 7, -1.0).iter().flat_map(|&(a, b)| [a, b]).collect::<Vec<_>>(), 1e-5, "forward");
        // Zero-padded to 10, onesided: 6 points.
        let got = Case::new("DFT").opset(20).input(x.clone()).constant(Tensor::scalar(10i64)).attr("onesided", Attr::Int(1)).run_cpu().unwrap();
        let want: Vec<f64> = dft(&xs, 10, -1.0).iter().take(6).flat_map(|&(a, b)| [a, b]).collect();
        assert_close(&got[0], &want, 1e-5, "padded onesided");
        // Inverse (scaled by 1/L), opset 17 with the axis attribute.
        let got = Case::new("DFT").opset(17).input(x.clone()).attr("inverse", Attr::Int(1)).run_cpu().unwrap();
        let want: Vec<f64> = dft(&xs, 7, 1.0).iter().flat_map(|&(a, b)| [a / 7.0, b / 7.0]).collect();
        assert_close(&got[0], &want, 1e-5, "inverse");
        // The real inverse of a one-sided spectrum returns the real signal it came from.
        let signal = rand_f32(&[2, 8, 1], 4);
        let spec = Case::new("DFT").opset(20).input(signal.clone()).attr("onesided", Attr::Int(1)).run_cpu().unwrap();
        assert_eq!(spec[0].dims(), &[2, 5, 2]);
        let back = Case::new("DFT").opset(20).input(spec[0].clone()).attrs(&[("inverse", Attr::Int(1)), ("onesided", Attr::Int(1))]).run_cpu().unwrap();
        assert_eq!(back[0].dims(), &[2, 8, 1]);
        assert_close(&back[0], &signal.to_f64_vec(), 1e-5, "irfft(rfft(x))");
    }

    #[test]
    fn axes_and_dtypes() {
        // Axis 2 of [2, 3, 4, 1] (real input), as input 2 and as the opset-17 attribute.
        let x = rand_f32(&[2, 3, 4, 1], 5);
        let v = x.to_f64_vec();
        let mut want = vec![0.0; 2 * 3 * 4 * 2];
        for b in 0..6 {
            let line: Vec<(f64, f64)> = (0..4).map(|t| (v[b * 4 + t], 0.0)).collect();
            for (k, (re, im)) in dft(&line, 4, -1.0).into_iter().enumerate() {
                want[(b * 4 + k) * 2] = re;
                want[(b * 4 + k) * 2 + 1] = im;
            }
        }
        let by_input = Case::new("DFT").opset(20).input(x.clone()).omitted().constant(Tensor::scalar(-2i64)).run_cpu().unwrap();
        assert_close(&by_input[0], &want, 1e-5, "axis input");
        let by_attr = Case::new("DFT").opset(17).input(x.clone()).attr("axis", Attr::Int(2)).run_cpu().unwrap();
        assert_close(&by_attr[0], &want, 1e-5, "axis attribute");
        let f64s = Case::new("DFT").opset(17).input(cast(&x, DType::F64)).attr("axis", Attr::Int(2)).run_cpu().unwrap();
        assert_eq!(f64s[0].dtype(), DType::F64);
        assert_close(&f64s[0], &want, 1e-12, "f64");
    }

    #[test]
    fn bad_axes_and_lengths_are_errors() {
        let x = rand_f32(&[2, 3, 1], 6);
        for axis in [2i64, -1, 3, -4] {
            assert!(Case::new("DFT").opset(20).input(x.clone()).omitted().constant(Tensor::scalar(axis)).run_cpu().is_err(), "axis {axis}");
        }
        for len in [0i64, -3, 1 << 40] {
            assert!(Case::new("DFT").opset(20).input(x.clone()).constant(Tensor::scalar(len)).run_cpu().is_err(), "length {len}");
        }
        assert!(Case::new("DFT").opset(20).input(rand_f32(&[2, 3, 3], 7)).run_cpu().is_err(), "3 components");
        assert!(Case::new("DFT").opset(20).input(Tensor::from_slice(&[2, 1], &[1i32, 2]).unwrap()).run_cpu().is_err(), "int input");
    }
}
