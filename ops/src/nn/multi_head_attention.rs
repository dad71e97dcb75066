//! onnxruntime's MultiHeadAttention (domain `com.microsoft`): attention over separate
//! query `(B, S, D)`, key `(B, L, D)` and value `(B, L, Dv)`, with an optional bias
//! `(D + D + Dv)` added to the three, `key_padding_mask` (the forms of
//! [`super::attention_msft::KeyMask`]), `attention_bias`, `unidirectional`,
//! `mask_filter_value` and `scale`; output `(B, S, Dv)`. It runs the ONNX Attention
//! core through [`Problem`]. Packed QKV / KV, 4-D keys and past keys are rejected with
//! an error naming the input. WGSL: with a bias, three dispatches add it into scratch.
use super::attention::Attention;
use super::attention_msft::{bias_add_dispatch, f32_vec, num_heads, shapes, tensor_shapes, Problem};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct MultiHeadAttention {
    heads: usize,
    unidirectional: bool,
    filter: f32,
    scale: Option<f32>,
}

impl MultiHeadAttention {
    fn problem(&self, inputs: &[Option<(&[usize], DType)>]) -> Result<Problem> {
        let get = |i: usize| inputs.get(i).copied().flatten().map(|s| s.0);
        let q = get(0).ok_or_else(|| OpError::input(0, "query is required"))?;
        let (Some(k), Some(v)) = (get(1), get(2)) else {
            return Err(OpError::input(1, "packed QKV (no key and value) is not supported: give key and value"));
        };
        let (&[batch, seq, d], &[kb, kv_len, dk], &[vb, vl, dv]) = (q, k, v) else {
            return Err(OpError::input(1, format!("expected 3-D query, key and value (B, S, hidden), found {q:?}, {k:?}, {v:?} (packed and 4-D forms are not supported)")));
        };
        if kb != batch || vb != batch || vl != kv_len || dk != d {
            return Err(OpError::input(1, format!("key {k:?} and value {v:?} do not match query {q:?} (same batch, key hidden = query hidden, same key/value length)")));
        }
        if d % self.heads != 0 || dv % self.heads != 0 {
            return Err(OpError::invalid(format!("hidden sizes {d} and {dv} are not multiples of num_heads = {}", self.heads)));
        }
        if let Some(b) = get(3) {
            if b != [2 * d + dv] {
                return Err(OpError::input(3, format!("bias must be a vector of {}, found shape {b:?}", 2 * d + dv)));
            }
        }
        for (i, what) in [(6, "past_key"), (7, "past_value"), (8, "past_sequence_length"), (9, "cache_indirection")] {
            if get(i).is_some() {
                return Err(OpError::input(i, format!("{what} (decoding with a KV cache) is not supported")));
            }
        }
        let mut p = Problem { batch, q_len: seq, kv_len, heads: self.heads, kv_heads: self.heads, hidden: [d, d, dv], mask: None, bias: None, filter: self.filter };
        if let Some(m) = get(4) {
            p.key_mask(4, m)?;
        }
        if let Some(b) = get(5) {
            p.attention_bias(5, b)?;
        }
        Ok(p)
    }

    fn core(&self) -> Attention {
        Attention::core(self.heads, self.heads, self.scale, self.unidirectional, 0.0, -1)
    }
}

impl Op for MultiHeadAttention {
    fn name(&self) -> &str {
        "MultiHeadAttention"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        for i in [1, 2, 3, 5] {
            if inputs.get(i).copied().flatten().is_some() && expect_dtype(inputs, i, FLOATS)? != dtype {
                return Err(OpError::input(i, format!("dtype differs from the query's {dtype}")));
            }
        }
        if inputs.get(4).copied().flatten().is_some() {
            expect_dtype(inputs, 4, &[DType::I32, DType::I64])?;
        }
        let p = self.problem(&shapes(inputs))?;
        p.geometry(&self.core())?;
        required(inputs, 0)?;
        Ok(vec![TensorType::new(dtype, vec![p.batch, p.q_len, p.hidden[2]])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.problem(&shapes(inputs)).map_or(0, |p| 2 * p.batch * p.q_len * p.kv_len * (p.hidden[0] + p.hidden[2]));
        Cost { flops: flops as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MultiHeadAttention {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = self.problem(&tensor_shapes(inputs))?;
        let bias = inputs.get(3).copied().flatten().map(f32_vec);
        let mut offset = 0;
        let mut qkv = [vec![], vec![], vec![]];
        for (n, slot) in qkv.iter_mut().enumerate() {
            let mut x = f32_vec(cpu::input(inputs, n)?);
            let w = p.hidden[n];
            if let Some(b) = &bias {
                x.chunks_mut(w.max(1)).for_each(|r| r.iter_mut().zip(&b[offset..offset + w]).for_each(|(o, b)| *o += b));
            }
            offset += w;
            *slot = x;
        }
        p.run_cpu(&self.core(), inputs, qkv, &mut outputs[..1])
    }
}

impl WgslKernel for MultiHeadAttention {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.problem(&shapes(inputs))?;
        let wg = tune.get(&wgsl::workgroup_param());
        if inputs.get(3).copied().flatten().is_none() {
            return p.program(&self.core(), [Binding::Input(0), Binding::Input(1), Binding::Input(2)], vec![], vec![], outputs, wg);
        }
        let mut pre = vec![];
        let mut scratch = vec![0];
        let mut offset = 0;
        for n in 0..3 {
            let len = if n == 0 { p.q_len } else { p.kv_len };
            let count = p.batch * len * p.hidden[n];
            if count > 0 {
                pre.push(bias_add_dispatch("MultiHeadAttention bias", Binding::Input(n), Some((Binding::Input(3), offset)), Binding::Scratch(n + 1), count, p.hidden[n], wg));
            }
            scratch.push(count.max(1) as u64 * 4);
            offset += p.hidden[n];
        }
        p.program(&self.core(), [Binding::Scratch(1), Binding::Scratch(2), Binding::Scratch(3)], pre, scratch, outputs, wg)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "MultiHeadAttention", |spec: &NodeSpec| {
        if spec.n_outputs() > 1 {
            return Err(OpError::Unsupported("outputs 1..3, present_key/present_value/qk (decoding with a KV cache)".into()));
        }
        Ok(Box::new(MultiHeadAttention {
            heads: num_heads(spec, "num_heads")?,
            unidirectional: spec.int("unidirectional", 0)? != 0,
            filter: spec.float("mask_filter_value", -10000.0)?,
            scale: spec.float_opt("scale")?.filter(|&s| s != 0.0),
        }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, creation_error, rand_f32, Case};
    use kiln_graph::Attr;

    #[test]
    fn multi_head_attention_matches_onnxruntime() {
        check_ort_cases("MultiHeadAttention", 1e-5);
    }

    #[test]
    fn packed_and_cached_forms_are_rejected() {
        let mha = || Case::new("MultiHeadAttention").domain("com.microsoft").attr("num_heads", Attr::Int(2));
        assert!(creation_error(&mha().outputs(3)).contains("present_key"));
        let err = mha().input(rand_f32(&[2, 3, 2, 3, 4], 1)).run_cpu().unwrap_err().to_string();
        assert!(err.contains("packed QKV"), "{err}");
        let err = mha().input(rand_f32(&[2, 3, 8], 1)).input(rand_f32(&[2, 2, 5, 4], 2)).input(rand_f32(&[2, 2, 5, 4], 3)).run_cpu().unwrap_err().to_string();
        assert!(err.contains("4-D forms are not supported"), "{err}");
    }
}
