//! onnxruntime's SkipLayerNormalization and SkipSimplifiedLayerNormalization (domain
//! `com.microsoft`): each row (last dim, `H`) of `input + skip + bias` is normalised
//! (to zero mean and unit variance, or, simplified, by its root mean square), scaled
//! by `gamma` and shifted by `beta` (not in the simplified form). `skip` is
//! `(B, S, H)`, `(1, S, H)` or `(S, H)`; `bias` and `beta` are optional vectors of `H`.
//! Optional outputs, each `(.., 1)` per row: the mean (zeros in the simplified form, as
//! onnxruntime writes), the inverse standard deviation; and `input + skip + bias`.
//! WGSL: one invocation per row.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct SkipNorm {
    simplified: bool,
    epsilon: f32,
}

/// (rows, H, skip rows: the number of distinct skip rows, repeated over the batch).
type Layout = (usize, usize, usize);

impl SkipNorm {
    fn name_of(&self) -> &'static str {
        if self.simplified { "SkipSimplifiedLayerNormalization" } else { "SkipLayerNormalization" }
    }

    /// Input slots of gamma, beta and bias.
    fn slots(&self) -> (usize, Option<usize>, usize) {
        if self.simplified { (2, None, 3) } else { (2, Some(3), 4) }
    }

    fn layout(&self, shapes: &[Option<&[usize]>]) -> Result<Layout> {
        let get = |i: usize| shapes.get(i).copied().flatten();
        let x = get(0).ok_or_else(|| OpError::input(0, "the input is required"))?;
        if x.len() != 3 && x.len() != 2 {
            return Err(OpError::input(0, format!("expected a 3-D (batch, seq, hidden) or 2-D input, found shape {x:?}")));
        }
        let h = x[x.len() - 1];
        let rows: usize = x[..x.len() - 1].iter().product();
        let skip = get(1).ok_or_else(|| OpError::input(1, "skip is required"))?;
        let skip_rows = if skip == x {
            rows
        } else if x.len() == 3 && (skip == [1, x[1], h] || skip == [x[1], h]) {
            x[1]
        } else {
            return Err(OpError::input(1, format!("skip must have the input's shape {x:?}, or (1, seq, hidden) / (seq, hidden), found {skip:?}")));
        };
        let (g, b, bias) = self.slots();
        let g_dims = get(g).ok_or_else(|| OpError::input(g, "gamma is required"))?;
        for (i, d) in [(g, Some(g_dims)), (b.unwrap_or(usize::MAX), b.and_then(get)), (bias, get(bias))] {
            if let Some(d) = d {
                if d != [h] {
                    return Err(OpError::input(i, format!("expected a vector of the hidden size {h}, found shape {d:?}")));
                }
            }
        }
        Ok((rows, h, skip_rows))
    }
}

fn shapes<'a>(inputs: impl Iterator<Item = Option<&'a [usize]>>) -> Vec<Option<&'a [usize]>> {
    inputs.collect()
}

impl Op for SkipNorm {
    fn name(&self) -> &str {
        self.name_of()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        for (i, a) in inputs.iter().enumerate().skip(1) {
            if let Some(a) = a {
                if a.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from the input's {dtype}", a.dtype())));
                }
            }
        }
        self.layout(&shapes(inputs.iter().map(|a| a.map(|a| a.dims()))))?;
        let x = required(inputs, 0)?.dims();
        let mut stat = x.to_vec();
        *stat.last_mut().unwrap_or(&mut 0) = 1;
        Ok(vec![TensorType::new(dtype, x), TensorType::new(DType::F32, stat.clone()), TensorType::new(DType::F32, stat), TensorType::new(dtype, x)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 8 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for SkipNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (rows, h, skip_rows) = self.layout(&shapes(inputs.iter().map(|t| t.map(|t| t.dims()))))?;
        let (g, b, bias) = self.slots();
        let vec_of = |i: Option<usize>| i.and_then(|i| inputs.get(i).copied().flatten()).map(|t| t.to_f64_vec());
        let x = cpu::input(inputs, 0)?.to_f64_vec();
        let skip = cpu::input(inputs, 1)?.to_f64_vec();
        let gamma = cpu::input(inputs, g)?.to_f64_vec();
        let (beta, bias) = (vec_of(b), vec_of(Some(bias)));
        let eps = self.epsilon as f64;
        let (mut y, mut sum) = (vec![0f64; rows * h], vec![0f64; rows * h]);
        let (mut means, mut invs) = (vec![0f32; rows], vec![0f32; rows]);
        for r in 0..rows {
            let s = &mut sum[r * h..][..h];
            let sr = &skip[(r % skip_rows.max(1)) * h..][..h];
            for k in 0..h {
                s[k] = x[r * h + k] + sr[k] + bias.as_ref().map_or(0.0, |b| b[k]);
            }
            let mean = if self.simplified { 0.0 } else { s.iter().sum::<f64>() / h.max(1) as f64 };
            let var = s.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h.max(1) as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for k in 0..h {
                y[r * h + k] = (s[k] - mean) * inv * gamma[k] + beta.as_ref().map_or(0.0, |b| b[k]);
            }
            (means[r], invs[r]) = (mean as f32, inv as f32);
        }
        let dtype = outputs[0].dtype();
        let dims = outputs[0].dims().to_vec();
        outputs[0] = Tensor::from_f64(dtype, &dims, &y)?;
        if let Some(o) = outputs.get_mut(1) {
            o.as_mut_slice::<f32>()?.copy_from_slice(&means);
        }
        if let Some(o) = outputs.get_mut(2) {
            o.as_mut_slice::<f32>()?.copy_from_slice(&invs);
        }
        if let Some(o) = outputs.get_mut(3) {
            *o = Tensor::from_f64(dtype, &dims, &sum)?;
        }
        Ok(())
    }
}

impl WgslKernel for SkipNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (rows, h, skip_rows) = self.layout(&shapes(inputs.iter().map(|a| a.map(|a| a.dims()))))?;
        if wgsl::lanes_for(4 * h) != Some(1) {
            return Err(OpError::Unsupported(format!("{} rows of {h} elements exceed the GPU loop budget", self.name_of())));
        }
        if rows * h == 0 {
            return Ok(WgslProgram::default());
        }
        let (g, b, bias) = self.slots();
        let mut buffers = vec![("x", "f32", true), ("skip", "f32", true), ("gamma", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(g)];
        let has = |i: Option<usize>| i.is_some_and(|i| inputs.get(i).copied().flatten().is_some());
        if has(b) {
            buffers.push(("beta", "f32", true));
            bindings.push(Binding::Input(b.unwrap_or(0)));
        }
        if has(Some(bias)) {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(bias));
        }
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        let want = |k: usize| outputs.get(k).is_some_and(|t| !t.is_empty());
        for (k, name) in [(1, "mean_out"), (2, "inv_out"), (3, "sum_out")] {
            if want(k) {
                buffers.push((name, "f32", false));
                bindings.push(Binding::Output(k));
            }
        }
        let bias_term = if has(Some(bias)) { " + bias[k]" } else { "" };
        let value = format!("let v = x[base + k] + skip[sbase + k]{bias_term};");
        let hu = format!("{h}u");
        let mut body = format!("let base = i * {h}u;\n    let sbase = (i % {skip_rows}u) * {h}u;\n    var mean = 0.0;\n");
        if !self.simplified {
            body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\nmean = mean + v;"));
            let _ = writeln!(body, "    mean = mean / {};", wgsl::literal("f32", h as f64));
        }
        body += "    var var_sum = 0.0;\n";
        body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\nlet d = v - mean;\nvar_sum = var_sum + d * d;"));
        let _ = writeln!(body, "    let inv = 1.0 / sqrt(var_sum / {} + {});", wgsl::literal("f32", h as f64), wgsl::literal("f32", self.epsilon as f64));
        let beta_term = if has(b) { " + beta[k]" } else { "" };
        let sum_store = if want(3) { "\nsum_out[base + k] = v;" } else { "" };
        body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\ny[base + k] = (v - mean) * inv * gamma[k]{beta_term};{sum_store}"));
        if want(1) {
            body += "    mean_out[i] = mean;\n";
        }
        if want(2) {
            body += "    inv_out[i] = inv;\n";
        }
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name_of(), rows, wg, &buffers, bindings, "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for (name, simplified) in [("SkipLayerNormalization", false), ("SkipSimplifiedLayerNormalization", true)] {
        r.register(MS_DOMAIN, name, move |spec: &NodeSpec| Ok(Box::new(SkipNorm { simplified, epsilon: spec.float("epsilon", 1e-12)? })));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, rand_f32, Case};

    #[test]
    fn skip_layer_norms_match_onnxruntime() {
        check_ort_cases("SkipLayerNormalization", 1e-5);
        check_ort_cases("SkipSimplifiedLayerNormalization", 1e-5);
    }

    #[test]
    fn mismatched_skip_and_gamma_are_errors() {
        let case = |skip: &[usize], gamma: &[usize]| {
            Case::new("SkipLayerNormalization").domain("com.microsoft").input(rand_f32(&[2, 3, 5], 1)).input(rand_f32(skip, 2)).input(rand_f32(gamma, 3)).run_cpu()
        };
        let err = case(&[2, 5], &[5]).unwrap_err();
        assert!(err.to_string().contains("input 1") && err.to_string().contains("skip"), "{err}");
        let err = case(&[3, 5], &[4]).unwrap_err();
        assert!(err.to_string().contains("input 2") && err.to_string().contains("hidden size 5"), "{err}");
    }
}
