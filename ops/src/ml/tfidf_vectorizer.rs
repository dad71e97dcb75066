//! TfIdfVectorizer (opset 9), for integer tokens (int32/int64 `X`, `[C]` or
//! `[B, C]`) or string tokens (string `X` with `pool_strings`, on the CPU: each pool
//! string becomes an integer id, tokens outside the pool match nothing): counts, per
//! row, the n-grams of the `pool_int64s` pool (the grams of size `s` are `pool[ngram_counts[s-1]..
//! ngram_counts[s]]` in runs of `s` tokens; gram `g` counts into output column
//! `ngram_indexes[g]`) whose size lies in `[min_gram_length, max_gram_length]`.
//! A gram of size `s` matches at start `t` with skip distance `d` (1 to
//! `max_skip_count + 1`) when tokens `t, t+d, ..., t+(s-1)d` equal it; unigrams are
//! counted at distance 1 only. `mode` TF writes the counts, IDF `weights[j]` (or 1)
//! where a count is positive, TFIDF `weights[j] * count` (or the count). Output f32
//! `[max(ngram_indexes) + 1]` or `[B, that]`.
//!
//! Both kernels count per output element (row, column) over the grams of that
//! column; the GPU bakes the pool into the shader (its tokens must fit in i32).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Tf,
    Idf,
    TfIdf,
}

/// One pool n-gram: its tokens and output column.
#[derive(Clone, Debug)]
struct Gram {
    tokens: Vec<i64>,
    column: usize,
}

#[derive(Debug)]
pub struct TfIdfVectorizer {
    grams: Vec<Gram>,
    columns: usize,
    skips: usize,
    mode: Mode,
    weights: Vec<f32>,
    /// For `pool_strings`: each pool string's id (the tokens of `grams`).
    vocabulary: Option<HashMap<String, i64>>,
}

impl TfIdfVectorizer {
    /// (rows, row length, output dims).
    fn dims(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize, Vec<usize>)> {
        expect_dtype(inputs, 0, if self.vocabulary.is_some() { &[DType::String] } else { &[DType::I32, DType::I64] })?;
        match *required(inputs, 0)?.dims() {
            [] => Ok((1, 1, vec![self.columns])),
            [c] => Ok((1, c, vec![self.columns])),
            [b, c] if b > 0 => Ok((b, c, vec![b, self.columns])),
            ref d => Err(OpError::input(0, format!("expected [C] or [B, C] with B > 0, found {d:?}"))),
        }
    }

    /// Matches of gram `g` in `row`.
    fn count(&self, g: &Gram, row: &[i64]) -> usize {
        let s = g.tokens.len();
        // A gram spans `(s - 1) * d + 1` tokens: farther distances never fit in the row
        // (and would overflow the positions), so a huge max_skip_count costs nothing.
        let distances = if s == 1 { 1 } else { self.skips.saturating_add(1).min(row.len().saturating_sub(1) / (s - 1)) };
        (1..=distances)
            .map(|d| (0..row.len()).filter(|&t| t + d * (s - 1) < row.len() && g.tokens.iter().enumerate().all(|(k, &v)| row[t + k * d] == v)).count())
            .sum()
    }

    /// The output value of a column's total count.
    fn weigh(&self, column: usize, count: usize) -> f64 {
        let w = self.weights.get(column).map(|&w| w as f64);
        match self.mode {
            Mode::Tf => count as f64,
            Mode::Idf => if count > 0 { w.unwrap_or(1.0) } else { 0.0 },
            Mode::TfIdf => w.unwrap_or(1.0) * count as f64,
        }
    }
}

impl Op for TfIdfVectorizer {
    fn name(&self) -> &str {
        "TfIdfVectorizer"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(DType::F32, self.dims(inputs)?.2)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn handles_strings(&self) -> bool {
        self.vocabulary.is_some()
    }
}

impl CpuKernel for TfIdfVectorizer {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (rows, len, dims) = crate::tensor::tensor_args(inputs, |a| self.dims(a))?;
        let x = match &self.vocabulary {
            Some(ids) => cpu::input(inputs, 0)?.as_strings()?.iter().map(|s| ids.get(s).copied().unwrap_or(-1)).collect(),
            None => cpu::input(inputs, 0)?.to_i64_vec()?,
        };
        let mut y = vec![0.0; rows * self.columns];
        for r in 0..rows {
            let row = &x[r * len..(r + 1) * len];
            let mut counts = vec![0usize; self.columns];
            for g in &self.grams {
                counts[g.column] += self.count(g, row);
            }
            for (j, &c) in counts.iter().enumerate() {
                y[r * self.columns + j] = self.weigh(j, c);
            }
        }
        outputs[0] = Tensor::from_f64(DType::F32, &dims, &y)?;
        Ok(())
    }
}

impl WgslKernel for TfIdfVectorizer {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (_, len, _) = self.dims(inputs)?;
        if self.vocabulary.is_some() {
            return Err(OpError::Unsupported("TfIdfVectorizer over strings runs on the host".into()));
        }
        let dists = |g: &Gram| if g.tokens.len() == 1 { 1 } else { self.skips.saturating_add(1).min(len.saturating_sub(1) / (g.tokens.len() - 1)) };
        let work = self.grams.iter().map(|g| dists(g).saturating_mul(len).saturating_mul(g.tokens.len())).fold(self.grams.len(), usize::saturating_add);
        if work > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("TfIdfVectorizer: {work} loop iterations per output element exceed one GPU invocation's budget")));
        }
        let mut pool = vec![];
        let (mut starts, mut sizes, mut cols) = (vec![], vec![], vec![]);
        for g in &self.grams {
            starts.push(pool.len().to_string() + "u");
            sizes.push(g.tokens.len().to_string() + "u");
            cols.push(g.column.to_string() + "u");
            for &t in &g.tokens {
                let t = i32::try_from(t).map_err(|_| OpError::Unsupported(format!("pool token {t} does not fit the GPU's 32-bit integers")))?;
                pool.push(format!("i32({t})"));
            }
        }
        if self.grams.is_empty() {
            pool.push("i32(0)".into());
            starts.push("0u".into());
            sizes.push("1u".into());
            cols.push(format!("{}u", self.columns));
        }
        let n = starts.len();
        let helpers = format!(
            "var<private> POOL = array<i32, {}>({});\nvar<private> STARTS = array<u32, {n}>({});\nvar<private> SIZES = array<u32, {n}>({});\nvar<private> COLS = array<u32, {n}>({});\n",
            pool.len(),
            pool.join(", "),
            starts.join(", "),
            sizes.join(", "),
            cols.join(", ")
        );
        let weights: Vec<String> = (0..self.columns).map(|j| wgsl::literal("f32", self.weights.get(j).map_or(1.0, |&w| w as f64))).collect();
        let value = match self.mode {
            Mode::Tf => "f32(count)".to_string(),
            Mode::Idf => "select(0.0, W[j], count > 0u)".to_string(),
            Mode::TfIdf => "W[j] * f32(count)".to_string(),
        };
        let body = format!(
            "var W = array<f32, {cols}>({w});\n    let j = i % {cols}u;\n    let base = (i / {cols}u) * {len}u;\n    var count = 0u;\n    \
             for (var g = 0u; g < {n}u; g = g + 1u) {{\n        if (COLS[g] != j) {{ continue; }}\n        let s = SIZES[g];\n        \
             let dists = select({skips}u, 1u, s == 1u);\n        for (var d = 1u; d <= dists; d = d + 1u) {{\n            \
             for (var t = 0u; t + d * (s - 1u) < {len}u; t = t + 1u) {{\n                var hit = true;\n                \
             for (var k = 0u; k < s; k = k + 1u) {{ if (x[base + t + k * d] != POOL[STARTS[g] + k]) {{ hit = false; break; }} }}\n                \
             if (hit) {{ count = count + 1u; }}\n            }}\n        }}\n    }}\n    y[i] = {value};",
            cols = self.columns,
            w = weights.join(", "),
            // Distances of `len` or more fit no gram of two tokens or more in a row.
            skips = self.skips.saturating_add(1).min(len.max(1)),
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "TfIdfVectorizer",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", "i32", true), ("y", "f32", false)],
            vec![Binding::Input(0), Binding::Output(0)],
            &helpers,
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec) -> Result<TfIdfVectorizer> {
    let int = |name: &str| -> Result<usize> {
        let v = spec.int_opt(name)?.ok_or_else(|| spec.bad(name, "the attribute is required"))?;
        usize::try_from(v).map_err(|_| spec.bad(name, format!("expected >= 0, found {v}")))
    };
    let (min, max, skips) = (int("min_gram_length")?, int("max_gram_length")?, int("max_skip_count")?);
    if min < 1 || max < min {
        return Err(spec.bad("max_gram_length", format!("expected 1 <= min_gram_length <= max_gram_length, found {min} and {max}")));
    }
    let mode = match spec.string("mode", "")?.as_str() {
        "TF" => Mode::Tf,
        "IDF" => Mode::Idf,
        "TFIDF" => Mode::TfIdf,
        m => return Err(spec.bad("mode", format!("expected TF, IDF or TFIDF, found {m:?}"))),
    };
    let (pool, vocabulary) = match spec.strings_opt("pool_strings")? {
        Some(words) => {
            let mut ids: HashMap<String, i64> = HashMap::new();
            let pool = words.into_iter().map(|w| {
                let next = ids.len() as i64;
                *ids.entry(w).or_insert(next)
            }).collect();
            (pool, Some(ids))
        }
        None => (spec.ints("pool_int64s", &[])?, None),
    };
    let counts = spec.ints("ngram_counts", &[])?;
    let indexes = spec.ints("ngram_indexes", &[])?;
    let columns = indexes.iter().map(|&i| i.saturating_add(1)).max().unwrap_or(0);
    if indexes.iter().any(|&i| i < 0) || columns > 1 << 24 {
        return Err(spec.bad("ngram_indexes", "indexes must be in [0, 2^24)"));
    }
    let mut grams = vec![];
    let mut id = 0usize;
    for (k, &start) in counts.iter().enumerate() {
        let size = k + 1;
        let end = counts.get(k + 1).copied().unwrap_or(pool.len() as i64);
        if start < 0 || end < start || end as usize > pool.len() || (end - start) as usize % size != 0 {
            return Err(spec.bad("ngram_counts", format!("{counts:?} does not split a pool of {} tokens into n-grams", pool.len())));
        }
        for chunk in pool[start as usize..end as usize].chunks(size) {
            let column = *indexes.get(id).ok_or_else(|| spec.bad("ngram_indexes", format!("{} indexes for more n-grams", indexes.len())))? as usize;
            if (min..=max).contains(&size) {
                grams.push(Gram { tokens: chunk.to_vec(), column });
            }
            id += 1;
        }
    }
    let weights = spec.floats_opt("weights")?.unwrap_or_default();
    Ok(TfIdfVectorizer { grams, columns: columns as usize, skips, mode, weights, vocabulary })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "TfIdfVectorizer", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn case(min: i64, max: i64, skips: i64, mode: &str, x: Tensor) -> Case {
        Case::new("TfIdfVectorizer").opset(9).input(x).attrs(&[
            ("min_gram_length", Attr::Int(min)),
            ("max_gram_length", Attr::Int(max)),
            ("max_skip_count", Attr::Int(skips)),
            ("mode", string(mode)),
            ("ngram_counts", ints(&[0, 4])),
            ("ngram_indexes", ints(&[0, 1, 2, 3, 4, 5, 6])),
            ("pool_int64s", ints(&[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])),
        ])
    }

    #[test]
    fn string_tokens_count_like_integers() {
        let words = |v: &[i64]| Attr::Strings(v.iter().map(|t| format!("w{t}")).collect());
        let x: Vec<String> = [1i64, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8].iter().map(|t| format!("w{t}")).collect();
        let x = Tensor::from_strings(&[2, 6], x).unwrap();
        let got = Case::new("TfIdfVectorizer").opset(9).input(x).attrs(&[
            ("min_gram_length", Attr::Int(1)),
            ("max_gram_length", Attr::Int(2)),
            ("max_skip_count", Attr::Int(5)),
            ("mode", string("TF")),
            ("ngram_counts", ints(&[0, 4])),
            ("ngram_indexes", ints(&[0, 1, 2, 3, 4, 5, 6])),
            ("pool_strings", words(&[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])),
        ]).run_cpu().unwrap();
        assert_close(&got[0], &[0., 3., 0., 0., 0., 0., 0., 0., 0., 1., 0., 1., 1., 1.], 0.0, "uni and bigrams, skip 5");
        let ints_x = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
        assert!(Case::new("TfIdfVectorizer").opset(9).input(ints_x).attrs(&[
            ("min_gram_length", Attr::Int(1)), ("max_gram_length", Attr::Int(1)), ("max_skip_count", Attr::Int(0)), ("mode", string("TF")),
            ("ngram_counts", ints(&[0])), ("ngram_indexes", ints(&[0])), ("pool_strings", words(&[2])),
        ]).run_cpu().is_err(), "integer tokens need an integer pool");
    }

    #[test]
    fn counts_match_onnx_reference() {
        // onnx's test_tfidfvectorizer_tf_batch_uniandbigrams_skip5 and its relatives
        // (expected outputs from onnx.reference).
        let x = Tensor::from_slice(&[2, 6], &[1i32, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]).unwrap();
        let got = case(1, 2, 5, "TF", x.clone()).run_cpu().unwrap();
        assert_close(&got[0], &[0., 3., 0., 0., 0., 0., 0., 0., 0., 1., 0., 1., 1., 1.], 0.0, "uni and bigrams, skip 5");
        let got = case(2, 2, 0, "TF", x.clone()).run_cpu().unwrap();
        assert_close(&got[0], &[0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 1., 0., 1.], 0.0, "bigrams, skip 0");
        let flat = Tensor::from_slice(&[12], &[1i64, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]).unwrap();
        let got = case(2, 2, 5, "TF", flat.clone()).run_cpu().unwrap();
        assert_close(&got[0], &[0., 0., 0., 0., 1., 3., 1.], 0.0, "1-D, bigrams, skip 5");
        let weights = Attr::Floats(vec![0.5, 1.5, 2.0, 0.25, 3.0, 0.75, 1.25]);
        let got = case(2, 2, 5, "IDF", flat.clone()).attr("weights", weights.clone()).run_cpu().unwrap();
        assert_close(&got[0], &[0., 0., 0., 0., 3.0, 0.75, 1.25], 0.0, "IDF");
        let got = case(1, 2, 3, "TFIDF", flat).attr("weights", weights).run_cpu().unwrap();
        assert_close(&got[0], &[0., 4.5, 2.0, 0., 3.0, 1.5, 1.25], 0.0, "TFIDF");
        assert!(case(3, 2, 0, "TF", x.clone()).run_cpu().is_err());
    }

    /// A max_skip_count far past the row length counts as the longest useful skip
    /// (it used to loop over every distance up to it, or overflow the positions).
    #[test]
    fn a_huge_skip_count_counts_every_distance_that_fits() {
        let x = Tensor::from_slice(&[2, 6], &[1i32, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]).unwrap();
        let want = case(1, 2, 5, "TF", x.clone()).run_cpu().unwrap();
        let got = case(1, 2, i64::MAX, "TF", x).run_cpu().unwrap();
        assert_eq!(got[0].to_f64_vec(), want[0].to_f64_vec());
        let e = case(1, 2, 0, "TF", Tensor::from_slice(&[2], &[1i64, 2]).unwrap()).attr("ngram_indexes", ints(&[0, 1, 2, 3, 4, 5, i64::MAX])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("ngram_indexes") && e.contains("2^24"), "{e}");
    }
}
