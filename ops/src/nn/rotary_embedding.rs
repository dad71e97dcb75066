//! RotaryEmbedding (opset 23): rotates pairs of the first `rotary_embedding_dim`
//! features of each head (default: all) by the angle whose cosine and sine are read
//! from `cos_cache`/`sin_cache` — at row `position_ids[b, s]` of a `(max_pos, R/2)`
//! cache, or at `[b, s]` of a `(B, S, R/2)` cache without position ids. Pairs are
//! `(k, k + R/2)` or, with `interleaved`, `(2k, 2k + 1)`. Input `(B, H, S, D)`, or
//! `(B, S, H * D)` with `num_heads`. WGSL: one invocation per output element.
//!
//! onnxruntime's RotaryEmbedding (domain `com.microsoft`) is the same rotation with
//! inputs `(input, position_ids, cos_cache, sin_cache)`: position ids are required,
//! `(B, S)` or `(1)` (an offset: token `s` is at `position_ids[0] + s`), and without
//! `num_heads` a 3-D input's head size is twice the cache's row length. Its `scale`
//! (other than 1) and packed batching are rejected.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct Rotary {
    interleaved: bool,
    rotary_dim: usize,
    num_heads: usize,
    /// The com.microsoft input order and position forms.
    ms: bool,
}

/// Sizes of one application.
struct Dims {
    batch: usize,
    seq: usize,
    head: usize,
    /// Elements between consecutive positions of one head.
    seq_stride: usize,
    /// Rotated features per head (R) and cache row length (R / 2).
    rotary: usize,
    half: usize,
    /// Rows of a position-indexed cache (0 without position ids).
    cache_rows: usize,
    /// Position ids are one offset `(1)` (com.microsoft).
    offset: bool,
}

impl Rotary {
    /// Input slots of X, cos_cache, sin_cache and position_ids.
    fn slots(&self) -> [usize; 4] {
        if self.ms { [0, 2, 3, 1] } else { [0, 1, 2, 3] }
    }

    fn dims(&self, x: &[usize], cos: &[usize], sin: &[usize], positions: Option<&[usize]>) -> Result<Dims> {
        let [_, cos_i, sin_i, pos_i] = self.slots();
        let (batch, seq, head, seq_stride) = match x.len() {
            4 => (x[0], x[2], x[3], x[3]),
            3 if self.ms && self.num_heads == 0 && self.rotary_dim == 0 && cos.len() == 2 && cos[1] > 0 && x[2] % (2 * cos[1]) == 0 => (x[0], x[1], 2 * cos[1], x[2]),
            3 => {
                if self.num_heads == 0 || !x[2].is_multiple_of(self.num_heads) {
                    return Err(OpError::input(0, format!("a 3-D input needs num_heads dividing its hidden size {}, found num_heads = {}", x[2], self.num_heads)));
                }
                (x[0], x[1], x[2] / self.num_heads, x[2])
            }
            _ => return Err(OpError::input(0, format!("expected (B, H, S, D) or (B, S, hidden), found shape {x:?}"))),
        };
        let rotary = if self.rotary_dim == 0 { head } else { self.rotary_dim };
        if rotary > head || rotary % 2 != 0 {
            return Err(OpError::invalid(format!("rotary_embedding_dim {rotary} must be even and at most the head size {head}")));
        }
        let half = rotary / 2;
        let mut offset = false;
        let want: Vec<usize> = match positions {
            None if self.ms => return Err(OpError::input(pos_i, "position_ids is required")),
            Some(p) => {
                if self.ms && p == [1] {
                    offset = true;
                } else if p != [batch, seq] {
                    return Err(OpError::input(pos_i, format!("position_ids must have shape (batch, seq) = {:?}{}, found {p:?}", [batch, seq], if self.ms { " or (1)" } else { "" })));
                }
                vec![cos.first().copied().unwrap_or(0), half]
            }
            None => vec![batch, seq, half],
        };
        for (i, c, what) in [(cos_i, cos, "cos_cache"), (sin_i, sin, "sin_cache")] {
            if c != want.as_slice() {
                let form = if positions.is_some() { "(max_position, rotary_dim / 2)" } else { "(batch, seq, rotary_dim / 2)" };
                return Err(OpError::input(i, format!("{what} must have shape {form} = {want:?}, found {c:?}")));
            }
        }
        Ok(Dims { batch, seq, head, seq_stride, rotary, half, cache_rows: if positions.is_some() { want[0] } else { 0 }, offset })
    }
}

impl Op for Rotary {
    fn name(&self) -> &str {
        "RotaryEmbedding"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let [_, cos_i, sin_i, pos_i] = self.slots();
        for i in [cos_i, sin_i] {
            if required(inputs, i)?.dtype() != dtype {
                return Err(OpError::input(i, format!("dtype {} differs from the input's {dtype}", required(inputs, i)?.dtype())));
            }
        }
        let positions = inputs.get(pos_i).copied().flatten();
        if positions.is_some() {
            expect_dtype(inputs, pos_i, &[DType::I64, DType::I32])?;
        }
        let x = required(inputs, 0)?;
        self.dims(x.dims(), required(inputs, cos_i)?.dims(), required(inputs, sin_i)?.dims(), positions.map(|p| p.dims()))?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Rotary {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let [_, cos_i, sin_i, pos_i] = self.slots();
        let (cos_t, sin_t) = (cpu::input(inputs, cos_i)?, cpu::input(inputs, sin_i)?);
        let positions = inputs.get(pos_i).copied().flatten();
        let d = self.dims(x.dims(), cos_t.dims(), sin_t.dims(), positions.map(|p| p.dims()))?;
        let pos = positions.map(|p| p.to_i64_vec()).transpose()?;
        let (xv, cos, sin) = (x.to_f64_vec(), cos_t.to_f64_vec(), sin_t.to_f64_vec());
        let mut y = xv.clone();
        let per_batch = xv.len() / d.batch.max(1);
        for (i, out) in y.iter_mut().enumerate() {
            let f = i % d.head;
            if f >= d.rotary {
                continue;
            }
            let (b, s) = (i / per_batch.max(1), (i / d.seq_stride) % d.seq);
            let row = match &pos {
                Some(p) => {
                    let r = if d.offset { p[0] + s as i64 } else { p[b * d.seq + s] };
                    if r < 0 || r as usize >= d.cache_rows {
                        return Err(OpError::input(pos_i, format!("position {r} is outside the cache's {} rows", d.cache_rows)));
                    }
                    r as usize
                }
                None => b * d.seq + s,
            };
            let (k, first, partner) = if self.interleaved {
                (f / 2, f % 2 == 0, if f % 2 == 0 { i + 1 } else { i - 1 })
            } else if f < d.half {
                (f, true, i + d.half)
            } else {
                (f - d.half, false, i - d.half)
            };
            let (c, sn) = (cos[row * d.half + k], sin[row * d.half + k]);
            *out = if first { c * xv[i] - sn * xv[partner] } else { sn * xv[partner] + c * xv[i] };
        }
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for Rotary {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let [_, cos_i, sin_i, pos_i] = self.slots();
        let positions = inputs.get(pos_i).copied().flatten();
        let d = self.dims(x.dims(), required(inputs, cos_i)?.dims(), required(inputs, sin_i)?.dims(), positions.map(|p| p.dims()))?;
        let n = outputs[0].len();
        if n == 0 {
            return Ok(WgslProgram::default());
        }
        let per_batch = n / d.batch.max(1);
        let mut buffers = vec![("x", "f32", true), ("cos_c", "f32", true), ("sin_c", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(cos_i), Binding::Input(sin_i)];
        let (seq, half) = (d.seq, d.half);
        let row = if positions.is_some() {
            buffers.push(("pos", "i32", true));
            bindings.push(Binding::Input(pos_i));
            let p = if d.offset { "pos[0] + i32(s)".to_string() } else { format!("pos[b * {seq}u + s]") };
            format!("u32(clamp({p}, 0i, {}i))", d.cache_rows.saturating_sub(1))
        } else {
            format!("b * {seq}u + s")
        };
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        let pair = if self.interleaved {
            "let k = f / 2u;\n    let first = f % 2u == 0u;\n    let partner = select(i - 1u, i + 1u, first);".to_string()
        } else {
            format!("let first = f < {half}u;\n    let k = select(f - {half}u, f, first);\n    let partner = select(i - {half}u, i + {half}u, first);")
        };
        let body = format!(
            "let f = i % {}u;\n    if (f >= {}u) {{ y[i] = x[i]; return; }}\n    let b = i / {per_batch}u;\n    let s = (i / {}u) % {seq}u;\n    \
             {pair}\n    let at = ({row}) * {half}u + k;\n    let c = cos_c[at];\n    let sn = sin_c[at];\n    \
             y[i] = select(sn * x[partner] + c * x[i], c * x[i] - sn * x[partner], first);",
            d.head, d.rotary, d.seq_stride
        );
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), n, wg, &buffers, bindings, "", &body)))
    }
}

/// The op of a node: ONNX's input order, or (`ms`) com.microsoft's.
fn parse(spec: &NodeSpec, ms: bool) -> Result<Rotary> {
    let nonneg = |name: &str| -> Result<usize> {
        let v = spec.int(name, 0)?;
        usize::try_from(v).map_err(|_| spec.bad(name, format!("expected a count >= 0, found {v}")))
    };
    if ms && spec.float("scale", 1.0)? != 1.0 {
        return Err(spec.bad("scale", "only scale = 1 is supported"));
    }
    if ms && spec.int("is_packed_batching", 0)? != 0 {
        return Err(spec.bad("is_packed_batching", "packed batching is not supported"));
    }
    Ok(Rotary { interleaved: spec.int("interleaved", 0)? != 0, rotary_dim: nonneg("rotary_embedding_dim")?, num_heads: nonneg("num_heads")?, ms })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RotaryEmbedding", |spec: &NodeSpec| Ok(Box::new(parse(spec, false)?)));
    r.register(MS_DOMAIN, "RotaryEmbedding", |spec: &NodeSpec| Ok(Box::new(parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    /// Reference on a (B, S, H, D) view: rotate each head's first `r` features.
    fn reference(x: &[f64], dims4: [usize; 4], heads_first: bool, cos: &dyn Fn(usize, usize, usize) -> (f64, f64), r: usize, interleaved: bool) -> Vec<f64> {
        let [b_n, h_n, s_n, d_n] = dims4;
        let idx = |b: usize, h: usize, s: usize, f: usize| if heads_first { ((b * h_n + h) * s_n + s) * d_n + f } else { ((b * s_n + s) * h_n + h) * d_n + f };
        let mut y = x.to_vec();
        for b in 0..b_n {
            for h in 0..h_n {
                for s in 0..s_n {
                    for k in 0..r / 2 {
                        let (i1, i2) = if interleaved { (2 * k, 2 * k + 1) } else { (k, k + r / 2) };
                        let (c, sn) = cos(b, s, k);
                        let (x1, x2) = (x[idx(b, h, s, i1)], x[idx(b, h, s, i2)]);
                        y[idx(b, h, s, i1)] = c * x1 - sn * x2;
                        y[idx(b, h, s, i2)] = sn * x1 + c * x2;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn com_microsoft_rotary_embedding_matches_onnxruntime() {
        crate::testing::check_ort_cases("RotaryEmbedding", 1e-6);
        let ms = crate::testing::Case::new("RotaryEmbedding").domain("com.microsoft");
        assert!(crate::testing::creation_error(&ms.clone().attr("scale", Attr::Float(2.0))).contains("scale"));
        assert!(crate::testing::creation_error(&ms.attr("is_packed_batching", Attr::Int(1))).contains("is_packed_batching"));
    }

    #[test]
    fn rotary_embedding_matches_a_reference() {
        let (b, h, s, d) = (2usize, 3usize, 5usize, 10usize);
        for interleaved in [false, true] {
            for r in [0usize, 6] {
                let rot = if r == 0 { d } else { r };
                let mut attrs = vec![("interleaved", Attr::Int(interleaved as i64)), ("rotary_embedding_dim", Attr::Int(r as i64))];
                // Position ids into a (9, R/2) cache, 4-D input.
                let (cos, sin) = (rand_f32(&[9, rot / 2], 1), rand_f32(&[9, rot / 2], 2));
                let pos: Vec<i64> = (0..b * s).map(|i| (i * 4 % 9) as i64).collect();
                let pt = Tensor::from_slice(&[b, s], &pos).unwrap();
                let x = rand_f32(&[b, h, s, d], 3);
                let op = make("RotaryEmbedding", 19, &attrs, 4, 1).unwrap();
                let y = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&cos), Some(&sin), Some(&pt)], &[]), &[]).unwrap().remove(0);
                let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
                let at = |bb: usize, ss: usize, k: usize| {
                    let row = pos[bb * s + ss] as usize;
                    (cv[row * rot / 2 + k], sv[row * rot / 2 + k])
                };
                assert_close(&y, &reference(&x.to_f64_vec(), [b, h, s, d], true, &at, rot, interleaved), 1e-6, "4-D with positions");
                // A (B, S, R/2) cache, 3-D input.
                attrs.push(("num_heads", Attr::Int(h as i64)));
                let (cos, sin) = (rand_f32(&[b, s, rot / 2], 4), rand_f32(&[b, s, rot / 2], 5));
                let x = rand_f32(&[b, s, h * d], 6);
                let y = run(make("RotaryEmbedding", 19, &attrs, 3, 1).unwrap().as_ref(), &as_inputs(&[Some(&x), Some(&cos), Some(&sin)], &[]), &[]).unwrap().remove(0);
                let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
                let at = |bb: usize, ss: usize, k: usize| (cv[(bb * s + ss) * rot / 2 + k], sv[(bb * s + ss) * rot / 2 + k]);
                assert_close(&y, &reference(&x.to_f64_vec(), [b, h, s, d], false, &at, rot, interleaved), 1e-6, "3-D without positions");
            }
        }
        let op = make("RotaryEmbedding", 19, &[], 3, 1).unwrap();
        let err = run(op.as_ref(), &as_inputs(&[Some(&rand_f32(&[1, 2, 3, 4], 1)), Some(&rand_f32(&[1, 3, 3], 2)), Some(&rand_f32(&[1, 3, 2], 3))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("cos_cache"), "{err}");
        let err = run(op.as_ref(), &as_inputs(&[Some(&rand_f32(&[1, 3, 8], 1)), Some(&rand_f32(&[1, 3, 2], 2)), Some(&rand_f32(&[1, 3, 2], 3))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("num_heads"), "{err}");
    }
}
