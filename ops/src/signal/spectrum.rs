//! The discrete Fourier transform of lines of a tensor, shared by DFT and STFT: a
//! [`Lines`] says where each line's samples are (lines are `(o, i)` pairs: `o` over
//! `outer` lines split into `frames` frames each, `i` over `inner`), how many of them
//! take part, the transform length `L`, the direction and where the output points go
//! (`((o * n_out + k) * inner + i) * c_out + c`).
//!
//! Forward: `X[k] = sum_t w[t] x[t] e^{-2 pi i k t / L}`; inverse:
//! `x[t] = 1/L sum_k X[k] e^{+2 pi i k t / L}`; real inverse (numpy's irfft): the
//! one-sided input is extended Hermitian-symmetrically (`X[L-k] = conj(X[k])`, the
//! imaginary parts of the DC and Nyquist points ignored) and only the real part is
//! written. Missing samples (a line shorter than `L`) are zeros.
//!
//! The CPU computes in f64 with a table of the `L` twiddle factors; the GPU runs one
//! invocation per output point, summing in f32 with the angle of `(k t) mod L`
//! (exact in u32), so a line may be at most [`wgsl::MAX_LOOP_ITERATIONS`] long.
use crate::cpu;
use crate::wgsl::{self, Binding, WgslProgram};
use crate::{OpError, Result, TensorType};
use kiln_graph::Tensor;
use std::f64::consts::PI;

/// WGSL: `(cos, sin)` of `2 pi j / L`, reduced by symmetry to an angle in
/// `[0, pi/4]` from the integers, so that quarter turns are exact (the f32 `sin` of
/// `pi` is not 0, and on sums of large samples that error outgrows the tolerance of
/// outputs that should vanish).
const TWIDDLE: &str = "fn twiddle(j: u32, L: u32) -> vec2<f32> {
    var a = 2u * j;
    var sgn_s = 1.0;
    var sgn_c = 1.0;
    if (a > L) { a = 2u * L - a; sgn_s = -1.0; }
    if (2u * a > L) { a = L - a; sgn_c = -1.0; }
    var num = 2u * a;
    let swap = 4u * a > L;
    if (swap) { num = L - 2u * a; }
    let t = 3.141592653589793 * f32(num) / f32(2u * L);
    var c = cos(t);
    var s = sin(t);
    if (swap) { let tmp = c; c = s; s = tmp; }
    return vec2<f32>(sgn_c * c, sgn_s * s);
}
";

/// Direction of a transform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Forward,
    Inverse,
    /// Inverse of a one-sided spectrum to a real signal.
    InverseReal,
}

/// Where a transform reads and writes (strides in complex points of the input).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lines {
    pub outer: usize,
    pub frames: usize,
    pub inner: usize,
    pub outer_stride: usize,
    pub frame_stride: usize,
    pub t_stride: usize,
    pub inner_stride: usize,
    /// Components per input point (1: real, 2: complex).
    pub c_in: usize,
    /// Input points of a line that take part (at most `len`, or the one-sided count).
    pub n_use: usize,
    pub len: usize,
    pub n_out: usize,
    pub mode: Mode,
    /// Whether input 2 is a window of `n_use` weights multiplying the samples.
    pub window: bool,
}

impl Lines {
    pub fn c_out(&self) -> usize {
        if self.mode == Mode::InverseReal { 1 } else { 2 }
    }

    fn base(&self, o: usize, i: usize) -> usize {
        (o / self.frames) * self.outer_stride + (o % self.frames) * self.frame_stride + i * self.inner_stride
    }

    /// Multiply-adds of the transform (for the cost model).
    pub fn flops(&self) -> u64 {
        (self.outer * self.inner * self.n_out) as u64 * self.n_use as u64 * 8
    }

    /// Runs the transform on the CPU; the output (of `out`'s type) replaces `outputs[0]`.
    pub fn run_cpu(&self, x: &Tensor, window: Option<&Tensor>, out: &TensorType, outputs: &mut [Tensor]) -> Result<()> {
        let xs = x.to_f64_vec();
        let w: Option<Vec<f64>> = window.map(|w| w.to_f64_vec());
        if let Some(w) = &w {
            if w.len() < self.n_use {
                return Err(OpError::input(2, format!("the window has {} points, the frames {}", w.len(), self.n_use)));
            }
        }
        let l = self.len;
        let table: Vec<(f64, f64)> = (0..l).map(|j| (2.0 * PI * j as f64 / l as f64).sin_cos()).map(|(s, c)| (c, s)).collect();
        let c_out = self.c_out();
        let mut y = vec![0.0f64; out.len()];
        let per_line = self.n_out * self.inner * c_out;
        cpu::par_chunks_mut(&mut y, per_line, self.n_out * self.n_use * self.inner, |o0, part| {
            for (oo, line) in part.chunks_mut(per_line).enumerate() {
                let o = o0 + oo;
                for i in 0..self.inner {
                    let base = self.base(o, i);
                    let sample = |t: usize| {
                        let p = (base + t * self.t_stride) * self.c_in;
                        let (re, im) = (xs[p], if self.c_in == 2 { xs[p + 1] } else { 0.0 });
                        match &w {
                            Some(w) => (re * w[t], im * w[t]),
                            None => (re, im),
                        }
                    };
                    for k in 0..self.n_out {
                        let (mut re, mut im) = (0.0, 0.0);
                        for t in 0..self.n_use {
                            let (c, s) = table[(k * t) % l];
                            let (xr, xi) = sample(t);
                            match self.mode {
                                Mode::Forward => {
                                    re += xr * c + xi * s;
                                    im += xi * c - xr * s;
                                }
                                Mode::Inverse => {
                                    re += xr * c - xi * s;
                                    im += xr * s + xi * c;
                                }
                                Mode::InverseReal => {
                                    let weight = if t == 0 || 2 * t == l { 1.0 } else { 2.0 };
                                    re += weight * (xr * c - xi * s);
                                }
                            }
                        }
                        if self.mode != Mode::Forward {
                            re /= l as f64;
                            im /= l as f64;
                        }
                        let at = (k * self.inner + i) * c_out;
                        line[at] = re;
                        if c_out == 2 {
                            line[at + 1] = im;
                        }
                    }
                }
            }
        });
        outputs[0] = Tensor::from_f64(out.dtype, &out.dims, &y)?;
        Ok(())
    }

    /// The WGSL program: input 0 the signal, input 2 the window (when present).
    pub fn wgsl(&self, label: &str, out: &TensorType, wg: u32) -> Result<WgslProgram> {
        if self.n_use > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "{label} over lines of {} points: the GPU kernel sums a line in one invocation, at most {}; run this model on the CPU",
                self.n_use,
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let c_out = self.c_out();
        let points = out.len() / c_out;
        let (inner, n_out, l) = (self.inner, self.n_out, self.len);
        let imag = if self.c_in == 2 { "x[p + 1u]" } else { "0.0" };
        let weigh = if self.window { "let w = win[t];\n        xr = xr * w;\n        xi = xi * w;" } else { "" };
        let accumulate = match self.mode {
            Mode::Forward => "re = re + xr * c + xi * s;\n        im = im + xi * c - xr * s;",
            Mode::Inverse => "re = re + xr * c - xi * s;\n        im = im + xr * s + xi * c;",
            Mode::InverseReal => "let weight = select(2.0, 1.0, t == 0u || 2u * t == L);\n        re = re + weight * (xr * c - xi * s);",
        };
        let scale = if self.mode == Mode::Forward { String::new() } else { "re = re / f32(L);\n    im = im / f32(L);".into() };
        let store = if c_out == 2 { "y[2u * i] = re;\n    y[2u * i + 1u] = im;" } else { "y[i] = re;" };
        let body = format!(
            "let L = {l}u;\n    let ii = i % {inner}u;\n    let k = (i / {inner}u) % {n_out}u;\n    let o = i / ({inner}u * {n_out}u);\n    \
             let base = (o / {frames}u) * {os}u + (o % {frames}u) * {fs}u + ii * {is}u;\n    \
             var re = 0.0;\n    var im = 0.0;\n    var j = 0u;\n    \
             for (var t = 0u; t < {n_use}u; t = t + 1u) {{\n        let p = (base + t * {ts}u) * {c_in}u;\n        \
             var xr = x[p];\n        var xi = {imag};\n        {weigh}\n        \
             let cs = twiddle(j, L);\n        let c = cs.x;\n        let s = cs.y;\n        \
             {accumulate}\n        j = j + k;\n        if (j >= L) {{ j = j - L; }}\n    }}\n    {scale}\n    {store}",
            frames = self.frames,
            os = self.outer_stride,
            fs = self.frame_stride,
            is = self.inner_stride,
            ts = self.t_stride,
            n_use = self.n_use,
            c_in = self.c_in,
        );
        let mut buffers = vec![("x", "f32", true)];
        let mut bindings = vec![Binding::Input(0)];
        if self.window {
            buffers.push(("win", "f32", true));
            bindings.push(Binding::Input(2));
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        Ok(WgslProgram::single(wgsl::simple_kernel(label, points, wg, &buffers, bindings, TWIDDLE, &body)))
    }
}
