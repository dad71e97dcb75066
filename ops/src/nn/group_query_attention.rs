//! onnxruntime's GroupQueryAttention (domain `com.microsoft`), the prompt case: query
//! `(B, S, N * H)`, key and value `(B, S, Nkv * H)` (`kv_num_heads` dividing
//! `num_heads`), no past keys (or empty ones). Query row `i` of batch `b` attends to keys
//! `j <= i` with `j <= seqlens_k[b]` (the last valid position), within
//! `local_window_size` (`i - j < w`) when set; optional `softcap`, `scale` and
//! `attention_bias`. Outputs: `(B, S, N * H)`, present_key/value `(B, Nkv, S, H)`.
//! `total_sequence_length` must equal S. Rotary (`do_rotary`), packed QKV,
//! `smooth_softmax`, head sinks and past keys are rejected with an error naming the
//! node or input. Runs the ONNX Attention core through [`Problem`].
use super::attention::Attention;
use super::attention_msft::{f32_vec, num_heads, reject_flag, shapes, tensor_shapes, KeyMask, Problem};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct GroupQueryAttention {
    heads: usize,
    kv_heads: usize,
    scale: Option<f32>,
    softcap: f32,
    /// `local_window_size - 1` (the core's left window), or -1.
    left_window: i64,
}

impl GroupQueryAttention {
    fn problem(&self, inputs: &[Option<(&[usize], DType)>]) -> Result<Problem> {
        let get = |i: usize| inputs.get(i).copied().flatten().map(|s| s.0);
        let q = get(0).ok_or_else(|| OpError::input(0, "query is required"))?;
        let (Some(k), Some(v)) = (get(1), get(2)) else {
            return Err(OpError::input(1, "packed QKV (no key and value) is not supported: give key and value"));
        };
        let (&[batch, seq, d], &[kb, kl, dk], &[vb, vl, dv]) = (q, k, v) else {
            return Err(OpError::input(1, format!("expected 3-D query, key and value, found {q:?}, {k:?}, {v:?}")));
        };
        if d % self.heads != 0 {
            return Err(OpError::input(0, format!("query hidden size {d} is not a multiple of num_heads = {}", self.heads)));
        }
        let head = d / self.heads;
        let want = [batch, seq, self.kv_heads * head];
        if [kb, kl, dk] != want || [vb, vl, dv] != want {
            return Err(OpError::input(1, format!("key and value must have shape (batch, seq, kv_num_heads * head_size) = {want:?}, found {k:?} and {v:?}")));
        }
        for i in [3, 4] {
            if let Some(pk) = get(i) {
                if pk.len() != 4 || pk[2] != 0 {
                    return Err(OpError::input(i, format!("past keys/values are not supported (only the prompt case): found shape {pk:?}")));
                }
            }
        }
        let seqlens = get(5).ok_or_else(|| OpError::input(5, "seqlens_k is required"))?;
        if seqlens != [batch] {
            return Err(OpError::input(5, format!("seqlens_k must be a vector of the batch size {batch}, found shape {seqlens:?}")));
        }
        if get(6).is_some_and(|t| t.iter().product::<usize>() != 1) {
            return Err(OpError::input(6, "total_sequence_length must be a scalar"));
        }
        for (i, what) in [(7, "cos_cache"), (8, "sin_cache"), (11, "head_sink")] {
            if get(i).is_some() {
                return Err(OpError::input(i, format!("{what} is not supported")));
            }
        }
        let mut p = Problem { batch, q_len: seq, kv_len: seq, heads: self.heads, kv_heads: self.kv_heads, hidden: [d, dk, dv], mask: Some((5, KeyMask::Lasts)), bias: None, filter: f32::NEG_INFINITY };
        if let Some(b) = get(10) {
            p.attention_bias(10, b)?;
        }
        Ok(p)
    }

    fn core(&self) -> Attention {
        Attention::core(self.heads, self.kv_heads, self.scale, true, self.softcap, self.left_window)
    }
}

/// total_sequence_length, when its value is known, must be the sequence length.
fn check_total(total: Option<&Tensor>, seq: usize) -> Result<()> {
    if let Some(t) = total {
        let v = t.to_i64_vec()?;
        if v.first().copied() != Some(seq as i64) {
            return Err(OpError::input(6, format!("total_sequence_length {v:?} differs from the sequence length {seq} (only the prompt case without past keys is supported)")));
        }
    }
    Ok(())
}

impl Op for GroupQueryAttention {
    fn name(&self) -> &str {
        "GroupQueryAttention"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        for i in [1, 2, 10] {
            if inputs.get(i).copied().flatten().is_some() && expect_dtype(inputs, i, FLOATS)? != dtype {
                return Err(OpError::input(i, format!("dtype differs from the query's {dtype}")));
            }
        }
        expect_dtype(inputs, 5, &[DType::I32, DType::I64])?;
        let p = self.problem(&shapes(inputs))?;
        check_total(inputs.get(6).copied().flatten().and_then(|a| a.value), p.q_len)?;
        let g = p.geometry(&self.core())?;
        required(inputs, 0)?;
        let present = TensorType::new(dtype, vec![p.batch, p.kv_heads, p.kv_len, g.head]);
        Ok(vec![TensorType::new(dtype, vec![p.batch, p.q_len, p.hidden[0]]), present.clone(), present])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.problem(&shapes(inputs)).map_or(0, |p| 2 * p.batch * p.q_len * p.kv_len * 2 * p.hidden[0]);
        Cost { flops: flops as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GroupQueryAttention {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = self.problem(&tensor_shapes(inputs))?;
        check_total(inputs.get(6).copied().flatten(), p.q_len)?;
        for (b, len) in cpu::input(inputs, 5)?.to_i64_vec()?.into_iter().enumerate() {
            if len < 0 || len >= p.q_len as i64 {
                return Err(OpError::input(5, format!("seqlens_k[{b}] = {len} is outside [0, {}) (the prompt's positions)", p.q_len)));
            }
        }
        let qkv = [f32_vec(cpu::input(inputs, 0)?), f32_vec(cpu::input(inputs, 1)?), f32_vec(cpu::input(inputs, 2)?)];
        p.run_cpu(&self.core(), inputs, qkv, outputs)
    }
}

impl WgslKernel for GroupQueryAttention {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.problem(&shapes(inputs))?;
        let wg = tune.get(&wgsl::workgroup_param());
        p.program(&self.core(), [Binding::Input(0), Binding::Input(1), Binding::Input(2)], vec![], vec![], outputs, wg)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "GroupQueryAttention", |spec: &NodeSpec| {
        reject_flag(spec, "do_rotary", "rotary embedding inside GroupQueryAttention")?;
        reject_flag(spec, "smooth_softmax", "smooth softmax")?;
        let (heads, kv_heads) = (num_heads(spec, "num_heads")?, num_heads(spec, "kv_num_heads")?);
        if heads % kv_heads != 0 {
            return Err(spec.bad("kv_num_heads", format!("{kv_heads} does not divide num_heads = {heads}")));
        }
        let window = spec.int("local_window_size", -1)?;
        if window == 0 || window < -1 {
            return Err(spec.bad("local_window_size", format!("expected -1 (none) or a positive size, found {window}")));
        }
        let softcap = spec.float("softcap", 0.0)?;
        if softcap < 0.0 {
            return Err(spec.bad("softcap", format!("expected 0 (none) or a positive cap, found {softcap}")));
        }
        Ok(Box::new(GroupQueryAttention { heads, kv_heads, scale: spec.float_opt("scale")?.filter(|&s| s != 0.0), softcap, left_window: if window > 0 { window - 1 } else { -1 } }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, creation_error, rand_f32, Case};
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn group_query_attention_matches_onnxruntime() {
        check_ort_cases("GroupQueryAttention", 1e-5);
    }

    #[test]
    fn what_is_not_supported_is_named() {
        let gqa = || Case::new("GroupQueryAttention").domain("com.microsoft").attr("num_heads", Attr::Int(4)).attr("kv_num_heads", Attr::Int(2)).outputs(3);
        assert!(creation_error(&gqa().attr("do_rotary", Attr::Int(1))).contains("do_rotary"));
        assert!(creation_error(&gqa().attr("kv_num_heads", Attr::Int(3))).contains("kv_num_heads"));
        assert!(creation_error(&gqa().attr("local_window_size", Attr::Int(0))).contains("local_window_size"));
        let (q, kv) = (rand_f32(&[1, 3, 16], 1), rand_f32(&[1, 3, 8], 2));
        let run = |past: Option<usize>, seqlen: i32, total: i32| {
            let mut c = gqa().input(q.clone()).input(kv.clone()).input(kv.clone());
            c = match past {
                Some(p) => c.input(rand_f32(&[1, 2, p, 4], 3)).input(rand_f32(&[1, 2, p, 4], 4)),
                None => c.omitted().omitted(),
            };
            c.input(Tensor::from_slice(&[1], &[seqlen]).unwrap()).input(Tensor::from_slice(&[], &[total]).unwrap()).run_cpu().map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(run(None, 2, 3).is_ok());
        assert!(run(Some(0), 1, 3).is_ok());
        let err = run(Some(2), 2, 3).unwrap_err();
        assert!(err.contains("input 3") && err.contains("past"), "{err}");
        let err = run(None, 2, 5).unwrap_err();
        assert!(err.contains("input 6") && err.contains("total_sequence_length"), "{err}");
        let err = run(None, 3, 3).unwrap_err();
        assert!(err.contains("input 5") && err.contains("seqlens_k"), "{err}");
    }
}
