//! CausalConvWithState (opset 27): a depthwise causal 1-D convolution that carries its
//! left context between calls (streaming decode). `input` `[B, C, L]`, `weight`
//! `[C, 1, K]`, optional `bias` `[C]` and `past_state` `[B, C, K - 1]` (zeros when
//! omitted). With `padded = concat(past_state, input)` along the time axis,
//! `output[b, c, t] = bias[c] + sum_k weight[c, 0, k] padded[b, c, t + k]`, followed by
//! SiLU when `activation` is `silu` (or its alias `swish`; default `none`), and
//! `present_state` is the last `K - 1` steps of `padded`.
//!
//! Both kernels compute each output element directly; the GPU program is two
//! dispatches (output, then the state, when `K > 1`).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct CausalConvWithState {
    silu: bool,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    c: usize,
    l: usize,
    k: usize,
}

impl CausalConvWithState {
    fn dims(inputs: &[Option<Arg>]) -> Result<Dims> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let (x, w) = (required(inputs, 0)?, required(inputs, 1)?);
        let (b, c, l) = match *x.dims() {
            [b, c, l] => (b, c, l),
            ref d => return Err(OpError::input(0, format!("expected [batch, channels, length], found shape {d:?}"))),
        };
        let k = match *w.dims() {
            [wc, 1, k] if wc == c && k >= 1 && w.dtype() == dtype => k,
            ref d => return Err(OpError::input(1, format!("expected a {dtype} weight of shape [{c}, 1, K >= 1], found {} {d:?}", w.dtype()))),
        };
        if let Some(bias) = inputs.get(2).copied().flatten() {
            if bias.dims() != [c] || bias.dtype() != dtype {
                return Err(OpError::input(2, format!("expected a {dtype} bias of shape [{c}], found {}", bias.ty)));
            }
        }
        if let Some(p) = inputs.get(3).copied().flatten() {
            if p.dims() != [b, c, k - 1] || p.dtype() != dtype {
                return Err(OpError::input(3, format!("expected a {dtype} past_state of shape [{b}, {c}, {}], found {}", k - 1, p.ty)));
            }
        }
        Ok(Dims { b, c, l, k })
    }
}

impl Op for CausalConvWithState {
    fn name(&self) -> &str {
        "CausalConvWithState"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = Self::dims(inputs)?;
        let dtype = required(inputs, 0)?.dtype();
        Ok(vec![TensorType::new(dtype, vec![d.b, d.c, d.l]), TensorType::new(dtype, vec![d.b, d.c, d.k - 1])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = Self::dims(inputs).map(|d| (2 * d.b * d.c * d.l * d.k) as u64).unwrap_or(0);
        Cost { flops, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for CausalConvWithState {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let Dims { b, c, l, k } = crate::tensor::tensor_args(inputs, Self::dims)?;
        let x = cpu::input(inputs, 0)?.to_f64_vec();
        let w = cpu::input(inputs, 1)?.to_f64_vec();
        let bias = inputs.get(2).copied().flatten().map(|t| t.to_f64_vec());
        let past = inputs.get(3).copied().flatten().map(|t| t.to_f64_vec());
        let s = k - 1;
        let mut y = vec![0.0; b * c * l];
        let mut state = vec![0.0; b * c * s];
        for row in 0..b * c {
            let ch = row % c;
            let padded: Vec<f64> = (0..s).map(|t| past.as_ref().map_or(0.0, |p| p[row * s + t])).chain(x[row * l..(row + 1) * l].iter().copied()).collect();
            for t in 0..l {
                let mut v = bias.as_ref().map_or(0.0, |bv| bv[ch]);
                for j in 0..k {
                    v += w[ch * k + j] * padded[t + j];
                }
                y[row * l + t] = if self.silu { v / (1.0 + (-v).exp()) } else { v };
            }
            state[row * s..(row + 1) * s].copy_from_slice(&padded[l..]);
        }
        let dtype = outputs[0].dtype();
        outputs[0] = Tensor::from_f64(dtype, &[b, c, l], &y)?;
        outputs[1] = Tensor::from_f64(dtype, &[b, c, s], &state)?;
        Ok(())
    }
}

impl WgslKernel for CausalConvWithState {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let Dims { c, l, k, .. } = Self::dims(inputs)?;
        let s = k - 1;
        let has_bias = inputs.get(2).copied().flatten().is_some();
        let has_past = inputs.get(3).copied().flatten().is_some();
        let wg = tune.get(&wgsl::workgroup_param());
        let mut buffers = vec![("x", "f32", true), ("w", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_bias {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(2));
        }
        if has_past {
            buffers.push(("past", "f32", true));
            bindings.push(Binding::Input(3));
        }
        // padded(row, p): past (or 0) for p < s, else x.
        let past_at = if has_past { format!("past[row * {s}u + p]") } else { "0.0".into() };
        let helpers = format!("fn padded(row: u32, p: u32) -> f32 {{\n    if (p < {s}u) {{ return {past_at}; }}\n    return x[row * {l}u + p - {s}u];\n}}\n");
        let init = if has_bias { format!("bias[row % {c}u]") } else { "0.0".into() };
        let act = if self.silu { "v = v / (1.0 + exp(-v));" } else { "" };
        let out_body = format!(
            "let row = i / {l}u;\n    let t = i % {l}u;\n    let ch = row % {c}u;\n    var v = {init};\n    \
             for (var j = 0u; j < {k}u; j = j + 1u) {{ v = v + w[ch * {k}u + j] * padded(row, t + j); }}\n    {act}\n    y[i] = v;"
        );
        let mut out_buffers = buffers.clone();
        out_buffers.push(("y", "f32", false));
        let mut out_bindings = bindings.clone();
        out_bindings.push(Binding::Output(0));
        let mut dispatches = vec![wgsl::simple_kernel("CausalConvWithState output", outputs[0].len(), wg, &out_buffers, out_bindings, &helpers, &out_body)];
        if s > 0 {
            buffers.push(("state", "f32", false));
            bindings.push(Binding::Output(1));
            let body = format!("let row = i / {s}u;\n    state[i] = padded(row, {l}u + i % {s}u);");
            dispatches.push(wgsl::simple_kernel("CausalConvWithState state", outputs[1].len(), wg, &buffers, bindings, &helpers, &body));
        }
        Ok(WgslProgram { dispatches, scratch_bytes: vec![] })
    }
}

fn parse(spec: &NodeSpec) -> Result<CausalConvWithState> {
    let silu = match spec.string("activation", "none")?.as_str() {
        "none" => false,
        "silu" | "swish" => true,
        a => return Err(spec.bad("activation", format!("expected none, silu or swish, found {a:?}"))),
    };
    Ok(CausalConvWithState { silu })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "CausalConvWithState", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    /// The definition: a depthwise convolution of the state-padded input.
    fn reference(x: &[f64], w: &[f64], bias: &[f64], past: &[f64], (b, c, l, k): (usize, usize, usize, usize), silu: bool) -> (Vec<f64>, Vec<f64>) {
        let s = k - 1;
        let (mut y, mut st) = (vec![], vec![]);
        for bi in 0..b {
            for ch in 0..c {
                let row = bi * c + ch;
                let mut p: Vec<f64> = past[row * s..(row + 1) * s].to_vec();
                p.extend_from_slice(&x[row * l..(row + 1) * l]);
                for t in 0..l {
                    let v = bias[ch] + (0..k).map(|j| w[ch * k + j] * p[t + j]).sum::<f64>();
                    y.push(if silu { v * (1.0 / (1.0 + (-v).exp())) } else { v });
                }
                st.extend_from_slice(&p[p.len() - s..]);
            }
        }
        (y, st)
    }

    #[test]
    fn streams_with_and_without_state() {
        let (b, c, l, k) = (2, 3, 5, 4);
        let (x, w, bias, past) = (rand_f32(&[b, c, l], 1), rand_f32(&[c, 1, k], 2), rand_f32(&[c], 3), rand_f32(&[b, c, k - 1], 4));
        let full = Case::new("CausalConvWithState").opset(27).outputs(2).input(x.clone()).input(w.clone()).input(bias.clone()).input(past.clone());
        let (y, st) = reference(&x.to_f64_vec(), &w.to_f64_vec(), &bias.to_f64_vec(), &past.to_f64_vec(), (b, c, l, k), true);
        let got = full.attr("activation", string("silu")).run_cpu().unwrap();
        assert_close(&got[0], &y, 1e-6, "output");
        assert_close(&got[1], &st, 0.0, "state");
        // No bias, no past (zeros), an input shorter than the kernel.
        let short = rand_f32(&[b, c, 2], 5);
        let got = Case::new("CausalConvWithState").opset(27).outputs(2).input(short.clone()).input(w.clone()).run_cpu().unwrap();
        let (y, st) = reference(&short.to_f64_vec(), &w.to_f64_vec(), &[0.0; 3], &[0.0; 18], (b, c, 2, k), false);
        assert_close(&got[0], &y, 1e-6, "short output");
        assert_close(&got[1], &st, 0.0, "short state");
        assert!(Case::new("CausalConvWithState").opset(27).outputs(2).input(x).input(rand_f32(&[c, 2, k], 6)).run_cpu().is_err());
    }
}
