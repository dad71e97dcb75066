//! onnxruntime's EmbedLayerNormalization (domain `com.microsoft`): BERT's embedding
//! layer. For each token `(b, s)`: `word[input_ids] + position[position_ids or s] +
//! segment[segment_ids]` (the segment term when `segment_embedding` is given), then a
//! LayerNormalization over the hidden size with `gamma` and `beta`. Inputs: 0
//! input_ids `(B, S)`, 1 segment_ids, 2 word, 3 position, 4 segment embeddings `(rows,
//! H)`, 5 gamma, 6 beta, 7 mask `(B, S)`, 8 position_ids `(B, S)` or `(1, S)`. Outputs:
//! the normalised embeddings `(B, S, H)`, mask_index `(B)` (int32: the number of mask
//! entries equal to 1 per batch, zeros without a mask, as onnxruntime computes it) and,
//! optionally, the embedding sum before normalisation. An id outside its table is an
//! error (on the GPU through the run's status word). WGSL: one invocation per token,
//! then one per batch row for mask_index.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const IDS: &[DType] = &[DType::I32, DType::I64];

#[derive(Debug)]
pub struct EmbedLayerNorm {
    epsilon: f32,
}

/// Sizes: batch, sequence, hidden, rows of the word/position/segment tables, whether
/// position_ids are one row shared by the batch.
struct Dims {
    batch: usize,
    seq: usize,
    hidden: usize,
    words: usize,
    positions: usize,
    segments: usize,
    shared_positions: bool,
}

impl EmbedLayerNorm {
    fn dims(&self, s: &[Option<&[usize]>]) -> Result<Dims> {
        let get = |i: usize| s.get(i).copied().flatten();
        let need = |i: usize, what: &str| get(i).ok_or_else(|| OpError::input(i, format!("{what} is required")));
        let ids = need(0, "input_ids")?;
        let [batch, seq] = ids[..] else {
            return Err(OpError::input(0, format!("input_ids must be 2-D (batch, sequence), found shape {ids:?}")));
        };
        let table = |i: usize, what: &str| -> Result<(usize, usize)> {
            match need(i, what)? {
                &[rows, h] => Ok((rows, h)),
                d => Err(OpError::input(i, format!("{what} must be 2-D (rows, hidden), found shape {d:?}"))),
            }
        };
        let (words, hidden) = table(2, "word_embedding")?;
        let (positions, ph) = table(3, "position_embedding")?;
        let (segments, sh) = if get(4).is_some() { table(4, "segment_embedding")? } else { (0, hidden) };
        if ph != hidden || sh != hidden {
            return Err(OpError::invalid(format!("the embedding tables' hidden sizes differ: word {hidden}, position {ph}, segment {sh}")));
        }
        if get(4).is_some() != get(1).is_some() {
            return Err(OpError::input(1, "segment_ids and segment_embedding must be given together"));
        }
        for (i, what) in [(1, "segment_ids"), (7, "mask")] {
            if let Some(d) = get(i) {
                if d != ids {
                    return Err(OpError::input(i, format!("{what} must have input_ids' shape {ids:?}, found {d:?}")));
                }
            }
        }
        for (i, what) in [(5, "gamma"), (6, "beta")] {
            if let Some(d) = get(i) {
                if d != [hidden] {
                    return Err(OpError::input(i, format!("{what} must be a vector of the hidden size {hidden}, found shape {d:?}")));
                }
            } else if i == 5 {
                return Err(OpError::input(5, "gamma is required"));
            }
        }
        let shared_positions = match get(8) {
            None => false,
            Some(d) if d == ids => false,
            Some(d) if d == [1, seq] => true,
            Some(d) => return Err(OpError::input(8, format!("position_ids must have shape {ids:?} or [1, {seq}], found {d:?}"))),
        };
        Ok(Dims { batch, seq, hidden, words, positions, segments, shared_positions })
    }
}

impl Op for EmbedLayerNorm {
    fn name(&self) -> &str {
        "EmbedLayerNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, IDS)?;
        for i in [1, 7, 8] {
            if inputs.get(i).copied().flatten().is_some() {
                expect_dtype(inputs, i, IDS)?;
            }
        }
        let dtype = expect_dtype(inputs, 2, FLOATS)?;
        for i in [3, 4, 5, 6] {
            if let Some(a) = inputs.get(i).copied().flatten() {
                if a.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from word_embedding's {dtype}", a.dtype())));
                }
            }
        }
        let d = self.dims(&inputs.iter().map(|a| a.map(|a| a.dims())).collect::<Vec<_>>())?;
        required(inputs, 0)?;
        let y = vec![d.batch, d.seq, d.hidden];
        Ok(vec![TensorType::new(dtype, y.clone()), TensorType::new(DType::I32, vec![d.batch]), TensorType::new(dtype, y)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 10 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Row `id` of a table of `rows`, or an error naming the input.
fn row(id: i64, rows: usize, input: usize, what: &str) -> Result<usize> {
    usize::try_from(id).ok().filter(|&r| r < rows).ok_or_else(|| OpError::input(input, format!("{what} {id} is outside the table's {rows} rows")))
}

impl CpuKernel for EmbedLayerNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let d = self.dims(&inputs.iter().map(|t| t.map(|t| t.dims())).collect::<Vec<_>>())?;
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let ids = cpu::input(inputs, 0)?.to_i64_vec()?;
        let seg_ids = opt(1).map(|t| t.to_i64_vec()).transpose()?;
        let pos_ids = opt(8).map(|t| t.to_i64_vec()).transpose()?;
        let (word, pos) = (cpu::input(inputs, 2)?.to_f64_vec(), cpu::input(inputs, 3)?.to_f64_vec());
        let seg = opt(4).map(|t| t.to_f64_vec());
        let gamma = cpu::input(inputs, 5)?.to_f64_vec();
        let beta = opt(6).map(|t| t.to_f64_vec());
        let h = d.hidden;
        let (mut y, mut sum) = (vec![0f64; ids.len() * h], vec![0f64; ids.len() * h]);
        for (t, &id) in ids.iter().enumerate() {
            let w = row(id, d.words, 0, "input id")?;
            let p = match &pos_ids {
                Some(p) => row(p[if d.shared_positions { t % d.seq } else { t }], d.positions, 8, "position id")?,
                None => row((t % d.seq) as i64, d.positions, 3, "position")?,
            };
            let e = &mut sum[t * h..][..h];
            for k in 0..h {
                e[k] = word[w * h + k] + pos[p * h + k];
            }
            if let (Some(ids), Some(seg)) = (&seg_ids, &seg) {
                let g = row(ids[t], d.segments, 1, "segment id")?;
                e.iter_mut().zip(&seg[g * h..][..h]).for_each(|(v, s)| *v += s);
            }
            let mean = e.iter().sum::<f64>() / h.max(1) as f64;
            let var = e.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h.max(1) as f64;
            let inv = 1.0 / (var + self.epsilon as f64).sqrt();
            for k in 0..h {
                y[t * h + k] = (e[k] - mean) * inv * gamma[k] + beta.as_ref().map_or(0.0, |b| b[k]);
            }
        }
        let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
        outputs[0] = Tensor::from_f64(dtype, &dims, &y)?;
        let mut counts = vec![0i32; d.batch];
        if let Some(m) = opt(7) {
            for (t, v) in m.to_i64_vec()?.into_iter().enumerate() {
                counts[t / d.seq.max(1)] += (v == 1) as i32;
            }
        }
        if let Some(o) = outputs.get_mut(1) {
            o.as_mut_slice::<i32>()?.copy_from_slice(&counts);
        }
        if let Some(o) = outputs.get_mut(2) {
            *o = Tensor::from_f64(dtype, &dims, &sum)?;
        }
        Ok(())
    }
}

impl WgslKernel for EmbedLayerNorm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let d = self.dims(&inputs.iter().map(|a| a.map(|a| a.dims())).collect::<Vec<_>>())?;
        let h = d.hidden;
        if wgsl::lanes_for(3 * h) != Some(1) || wgsl::lanes_for(d.seq) != Some(1) {
            return Err(OpError::Unsupported(format!("EmbedLayerNormalization with hidden size {h} or sequence {} exceeds the GPU loop budget", d.seq)));
        }
        let has = |i: usize| inputs.get(i).copied().flatten().is_some();
        let want = |k: usize| outputs.get(k).is_some_and(|t| !t.is_empty());
        let wg = tune.get(&wgsl::workgroup_param());
        let mut prog = WgslProgram::default();
        let tokens = d.batch * d.seq;
        if tokens * h > 0 {
            let mut buffers = vec![("ids", "i32", true), ("word", "f32", true), ("pos", "f32", true), ("gamma", "f32", true)];
            let mut bindings = vec![Binding::Input(0), Binding::Input(2), Binding::Input(3), Binding::Input(5)];
            for (i, name) in [(1, "seg_ids"), (4, "seg"), (6, "beta"), (8, "pos_ids")] {
                if has(i) {
                    buffers.push((name, if i == 1 || i == 8 { "i32" } else { "f32" }, true));
                    bindings.push(Binding::Input(i));
                }
            }
            buffers.push(("y", "f32", false));
            bindings.push(Binding::Output(0));
            if want(2) {
                buffers.push(("sum_out", "f32", false));
                bindings.push(Binding::Output(2));
            }
            let status = bindings.len();
            bindings.push(Binding::Status);
            let check = |v: &str, rows: usize| format!("if ({v} < 0i || {v} >= {rows}i) {{ {} return; }}\n    ", wgsl::report_index_error(v, &format!("{rows}i")));
            let mut body = String::from("let w = ids[i];\n    ");
            body += &check("w", d.words);
            let p = if !has(8) { format!("i32(i % {}u)", d.seq) } else if d.shared_positions { format!("pos_ids[i % {}u]", d.seq) } else { "pos_ids[i]".into() };
            let _ = write!(body, "let p = {p};\n    ");
            body += &check("p", d.positions);
            let mut value = format!("let v = word[u32(w) * {h}u + k] + pos[u32(p) * {h}u + k]");
            if has(4) {
                body += "let g = seg_ids[i];\n    ";
                body += &check("g", d.segments);
                let _ = write!(value, " + seg[u32(g) * {h}u + k]");
            }
            value += ";";
            let hu = format!("{h}u");
            let hl = wgsl::literal("f32", h as f64);
            body += &format!("let base = i * {h}u;\n    var mean = 0.0;\n    ");
            body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\nmean = mean + v;"));
            let _ = write!(body, "    mean = mean / {hl};\n    var vs = 0.0;\n    ");
            body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\nlet dv = v - mean;\nvs = vs + dv * dv;"));
            let _ = write!(body, "    let inv = 1.0 / sqrt(vs / {hl} + {});\n    ", wgsl::literal("f32", self.epsilon as f64));
            let beta = if has(6) { " + beta[k]" } else { "" };
            let store_sum = if want(2) { "\nsum_out[base + k] = v;" } else { "" };
            body += &wgsl::for_loop("k", "0u", &hu, "1u", &format!("{value}\ny[base + k] = (v - mean) * inv * gamma[k]{beta};{store_sum}"));
            prog.dispatches.push(wgsl::simple_kernel("EmbedLayerNormalization", tokens, wg, &buffers, bindings, &wgsl::status_decl(status), &body));
        }
        if want(1) {
            let (buffers, bindings, body) = if has(7) {
                let count = wgsl::for_loop("s", "0u", &format!("{}u", d.seq), "1u", &format!("if (mask[i * {}u + s] == 1i) {{ c = c + 1i; }}", d.seq));
                (vec![("mask", "i32", true), ("mask_index", "i32", false)], vec![Binding::Input(7), Binding::Output(1)], format!("var c = 0i;\n    {count}    mask_index[i] = c;"))
            } else {
                (vec![("mask_index", "i32", false)], vec![Binding::Output(1)], "mask_index[i] = 0i;".to_string())
            };
            prog.dispatches.push(wgsl::simple_kernel("EmbedLayerNormalization mask_index", d.batch, wg, &buffers, bindings, "", &body));
        }
        Ok(prog)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "EmbedLayerNormalization", |spec: &NodeSpec| {
        let t = spec.int("mask_index_type", 1)?;
        if t != 1 && t != 0 {
            return Err(spec.bad("mask_index_type", format!("expected 0 or 1, found {t}")));
        }
        Ok(Box::new(EmbedLayerNorm { epsilon: spec.float("epsilon", 1e-12)? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, creation_error, rand_f32, Case};
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn embed_layer_norm_matches_onnxruntime() {
        check_ort_cases("EmbedLayerNormalization", 1e-5);
    }

    #[test]
    fn ids_outside_the_tables_are_errors() {
        let case = |ids: &[i32], pos: Option<&[i32]>| {
            let mut c = Case::new("EmbedLayerNormalization").domain("com.microsoft").input(Tensor::from_slice(&[1, 3], ids).unwrap()).omitted();
            c = c.input(rand_f32(&[4, 6], 1)).input(rand_f32(&[3, 6], 2)).omitted().input(rand_f32(&[6], 3)).input(rand_f32(&[6], 4));
            if let Some(p) = pos {
                c = c.omitted().input(Tensor::from_slice(&[1, 3], p).unwrap());
            }
            c.outputs(2).run_cpu()
        };
        assert!(case(&[0, 3, 1], None).is_ok());
        let err = case(&[0, 4, 1], None).unwrap_err();
        assert!(err.to_string().contains("input 0") && err.to_string().contains("input id 4"), "{err}");
        let err = case(&[0, 1, 1], Some(&[0, -1, 2])).unwrap_err();
        assert!(err.to_string().contains("input 8") && err.to_string().contains("-1"), "{err}");
        let bad = Case::new("EmbedLayerNormalization").domain("com.microsoft").attr("mask_index_type", Attr::Int(2));
        let err = creation_error(&bad);
        assert!(err.contains("mask_index_type"), "{err}");
    }
}
