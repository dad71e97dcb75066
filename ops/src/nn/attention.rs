//! Attention (opset 23..25): scaled dot-product attention over (batch, head) rows.
//! Q, K, V are 4-D `(batch, heads, seq, head_size)` or 3-D `(batch, seq, heads *
//! head_size)` (split into `q_num_heads` / `kv_num_heads`); fewer KV heads than query
//! heads is grouped-query attention (query head `h` reads KV head `h / (Hq / Hkv)`).
//! `past_key`/`past_value` are prepended to K/V (outputs `present_key/value`).
//!
//! Per query row: `s_j = scale * q.k_j`, optional `softcap * tanh(s / softcap)`, plus a
//! bias from `attn_mask` (bool: false masks; float: added; a last dim shorter than the
//! total length is padded with masked keys), `is_causal` (key `j` allowed iff
//! `j <= i + offset`, offset = past length, or `nonpad_kv_seqlen[b] - q_len`), the
//! opset-25 window (`left_window_size`, `right_window_size`) and `nonpad_kv_seqlen`
//! (keys past it masked). A softmax follows; a row whose keys are all masked is all
//! zeros. Output 3 (`qk_matmul_output`) is the scores raw (mode 0), softcapped (1),
//! biased (2) or after the softmax (3). The WGSL side is in [`super::attention_wgsl`].
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::WgslKernel;
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};
use std::borrow::Cow;

pub(super) const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct Attention {
    pub(super) is_causal: bool,
    q_num_heads: Option<usize>,
    kv_num_heads: Option<usize>,
    pub(super) mode: u8,
    scale: Option<f32>,
    pub(super) softcap: f32,
    pub(super) left_window: i64,
    pub(super) right_window: i64,
}

/// How `attn_mask` is read for query row `(b, h, i)`: `b * strides[0] + h * strides[1] +
/// i * strides[2] + j` for keys `j < len`; keys from `len` on are masked.
#[derive(Clone, Copy, Debug)]
pub(super) struct MaskLayout {
    pub strides: [usize; 3],
    pub len: usize,
    pub is_bool: bool,
}

/// Dims of one application: sizes, and the element strides of Q, K and V for (batch,
/// head, position) (the head_size axis is contiguous).
#[derive(Clone, Debug)]
pub(super) struct Geometry {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub past: usize,
    /// past + kv_len: keys per query row.
    pub total: usize,
    pub head: usize,
    pub v_head: usize,
    pub three_d: bool,
    pub q_strides: [usize; 3],
    pub k_strides: [usize; 3],
    pub v_strides: [usize; 3],
    pub mask: Option<MaskLayout>,
    pub has_past: bool,
    pub has_nonpad: bool,
    pub scale: f32,
}

impl Geometry {
    /// Query heads that share one KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }
}

/// (dims, dtype) of input `i`, if present.
type Shape<'a> = Option<(&'a [usize], DType)>;

impl Attention {
    pub fn parse(spec: &NodeSpec) -> Result<Attention> {
        let heads = |name: &str| -> Result<Option<usize>> {
            match spec.int_opt(name)? {
                None => Ok(None),
                Some(v) if v > 0 => Ok(Some(v as usize)),
                Some(v) => Err(spec.bad(name, format!("expected a positive head count, found {v}"))),
            }
        };
        let mode = spec.int("qk_matmul_output_mode", 0)?;
        if !(0..=3).contains(&mode) {
            return Err(spec.bad("qk_matmul_output_mode", format!("expected 0, 1, 2 or 3, found {mode}")));
        }
        if let Some(p) = spec.int_opt("softmax_precision")? {
            // The softmax runs in f32 (or better) whatever is asked; only check the value.
            if ![1, 10, 11, 16].contains(&p) {
                return Err(spec.bad("softmax_precision", format!("expected a float type (1, 10, 11 or 16), found {p}")));
            }
        }
        let window = |name: &str| -> Result<i64> {
            let v = spec.int(name, -1)?;
            if v < -1 {
                return Err(spec.bad(name, format!("expected -1 (unbounded) or a size >= 0, found {v}")));
            }
            Ok(v)
        };
        Ok(Attention {
            is_causal: spec.int("is_causal", 0)? != 0,
            q_num_heads: heads("q_num_heads")?,
            kv_num_heads: heads("kv_num_heads")?,
            mode: mode as u8,
            scale: spec.float_opt("scale")?,
            softcap: spec.float("softcap", 0.0)?,
            left_window: window("left_window_size")?,
            right_window: window("right_window_size")?,
        })
    }

    /// The scaled dot-product core that onnxruntime's attention contrib ops run on 3-D
    /// Q, K, V (`heads` query heads over `kv_heads` KV heads) with a float mask.
    pub(super) fn core(heads: usize, kv_heads: usize, scale: Option<f32>, is_causal: bool, softcap: f32, left_window: i64) -> Attention {
        Attention { is_causal, q_num_heads: Some(heads), kv_num_heads: Some(kv_heads), mode: 0, scale, softcap, left_window, right_window: -1 }
    }

    /// Checks the input shapes and derives the geometry. `s[i]` is input `i`.
    pub(super) fn geometry(&self, s: &[Shape]) -> Result<Geometry> {
        let get = |i: usize| s.get(i).copied().flatten();
        let (q, k, v) = match (get(0), get(1), get(2)) {
            (Some(q), Some(k), Some(v)) => (q.0, k.0, v.0),
            _ => return Err(OpError::invalid("Attention needs Q, K and V")),
        };
        let rank = q.len();
        if !(rank == 3 || rank == 4) || k.len() != rank || v.len() != rank {
            return Err(OpError::invalid(format!("Q, K and V must all be 3-D or all 4-D, found shapes {q:?}, {k:?}, {v:?}")));
        }
        let batch = q[0];
        if k[0] != batch || v[0] != batch {
            return Err(OpError::invalid(format!("Q, K and V must have the same batch size, found shapes {q:?}, {k:?}, {v:?}")));
        }
        let (q_heads, kv_heads, q_len, kv_len, head, k_head, v_head, v_len);
        let three_d = rank == 3;
        if three_d {
            let (Some(hq), Some(hkv)) = (self.q_num_heads, self.kv_num_heads) else {
                return Err(OpError::invalid("3-D Q, K and V need the q_num_heads and kv_num_heads attributes"));
            };
            for (i, x, h, what) in [(0, q, hq, "q_num_heads"), (1, k, hkv, "kv_num_heads"), (2, v, hkv, "kv_num_heads")] {
                if x[2] % h != 0 {
                    return Err(OpError::input(i, format!("hidden size {} of shape {x:?} is not a multiple of {what} = {h}", x[2])));
                }
            }
            (q_heads, kv_heads, q_len, kv_len, v_len) = (hq, hkv, q[1], k[1], v[1]);
            (head, k_head, v_head) = (q[2] / hq, k[2] / hkv, v[2] / hkv);
        } else {
            if v[1] != k[1] {
                return Err(OpError::input(2, format!("V must have as many heads as K ({}), found shape {v:?}", k[1])));
            }
            (q_heads, kv_heads, q_len, kv_len, v_len) = (q[1], k[1], q[2], k[2], v[2]);
            (head, k_head, v_head) = (q[3], k[3], v[3]);
        }
        if k_head != head {
            return Err(OpError::input(1, format!("K's head size {k_head} differs from Q's {head}")));
        }
        if v_len != kv_len {
            return Err(OpError::input(2, format!("V's sequence length {v_len} differs from K's {kv_len}")));
        }
        if kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(OpError::invalid(format!("the {q_heads} query heads cannot be grouped over {kv_heads} KV heads (expected a multiple)")));
        }
        let strides = |x: &[usize], hs: usize| -> [usize; 3] {
            if three_d {
                [x[1] * x[2], hs, x[2]]
            } else {
                [x[1] * x[2] * x[3], x[2] * x[3], x[3]]
            }
        };
        let dtype = get(0).map(|t| t.1).unwrap_or(DType::F32);
        // past_key / past_value.
        let (has_past, past) = match (get(4), get(5)) {
            (None, None) => (false, 0),
            (Some(pk), Some(pv)) => {
                let want_k = [batch, kv_heads, pk.0.get(2).copied().unwrap_or(0), head];
                if pk.0 != want_k {
                    return Err(OpError::input(4, format!("past_key must have shape (batch, kv_heads, past_len, head_size) = {want_k:?}, found {:?}", pk.0)));
                }
                let want_v = [batch, kv_heads, want_k[2], v_head];
                if pv.0 != want_v {
                    return Err(OpError::input(5, format!("past_value must have shape {want_v:?}, found {:?}", pv.0)));
                }
                (true, want_k[2])
            }
            _ => return Err(OpError::invalid("past_key and past_value must be given together")),
        };
        let total = past + kv_len;
        let has_nonpad = match get(6) {
            None => false,
            Some((d, t)) => {
                if has_past {
                    return Err(OpError::input(6, "nonpad_kv_seqlen cannot be combined with past_key/past_value"));
                }
                if d != [batch] || !matches!(t, DType::I64 | DType::I32) {
                    return Err(OpError::input(6, format!("nonpad_kv_seqlen must be an int64 vector of {batch} (the batch), found {t}{d:?}")));
                }
                true
            }
        };
        let mask = match get(3) {
            None => None,
            Some((m, t)) => {
                if t != DType::Bool && t != dtype {
                    return Err(OpError::input(3, format!("attn_mask must be bool or {dtype} (Q's dtype), found {t}")));
                }
                if m.is_empty() || m.len() > 4 {
                    return Err(OpError::input(3, format!("attn_mask must have rank 1 to 4, found shape {m:?}")));
                }
                let len = m[m.len() - 1];
                if len > total {
                    return Err(OpError::input(3, format!("attn_mask's last dim {len} exceeds the total sequence length {total}")));
                }
                let mut full = [1usize; 4];
                full[4 - m.len()..].copy_from_slice(m);
                let target = [batch, q_heads, q_len];
                let mut strides = [0usize; 3];
                let mut step = len;
                for d in (0..3).rev() {
                    if full[d] != 1 && full[d] != target[d] {
                        return Err(OpError::input(3, format!("attn_mask shape {m:?} does not broadcast to (batch, q_heads, q_len, total_len) = {:?}", [batch, q_heads, q_len, total])));
                    }
                    strides[d] = if full[d] == 1 { 0 } else { step };
                    step *= full[d];
                }
                Some(MaskLayout { strides, len, is_bool: t == DType::Bool })
            }
        };
        let scale = self.scale.unwrap_or(1.0 / (head.max(1) as f32).sqrt());
        Ok(Geometry {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            past,
            total,
            head,
            v_head,
            three_d,
            q_strides: strides(q, head),
            k_strides: strides(k, head),
            v_strides: strides(v, v_head),
            mask,
            has_past,
            has_nonpad,
            scale,
        })
    }

    /// Output types: Y, present_key, present_value, qk_matmul_output.
    pub(super) fn output_types(g: &Geometry, q: DType, k: DType, v: DType) -> Vec<TensorType> {
        let y = if g.three_d { vec![g.batch, g.q_len, g.q_heads * g.v_head] } else { vec![g.batch, g.q_heads, g.q_len, g.v_head] };
        vec![
            TensorType::new(q, y),
            TensorType::new(k, vec![g.batch, g.kv_heads, g.total, g.head]),
            TensorType::new(v, vec![g.batch, g.kv_heads, g.total, g.v_head]),
            TensorType::new(q, vec![g.batch, g.q_heads, g.q_len, g.total]),
        ]
    }
}

fn arg_shapes<'a>(inputs: &[Option<Arg<'a>>]) -> Vec<Shape<'a>> {
    inputs.iter().map(|a| a.map(|a| (a.dims(), a.dtype()))).collect()
}

impl Op for Attention {
    fn name(&self) -> &str {
        "Attention"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let q = expect_dtype(inputs, 0, FLOATS)?;
        let k = expect_dtype(inputs, 1, FLOATS)?;
        let v = expect_dtype(inputs, 2, FLOATS)?;
        for (i, want) in [(4, k), (5, v)] {
            if let Some(a) = inputs.get(i).copied().flatten() {
                if a.dtype() != want {
                    return Err(OpError::input(i, format!("dtype {} differs from the dtype {want} of the keys/values it extends", a.dtype())));
                }
            }
        }
        required(inputs, 0)?;
        let g = self.geometry(&arg_shapes(inputs))?;
        Ok(Self::output_types(&g, q, k, v))
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.geometry(&arg_shapes(inputs)).map_or(0, |g| 2 * g.batch * g.q_heads * g.q_len * g.total * (g.head + g.v_head) + 5 * g.batch * g.q_heads * g.q_len * g.total);
        Cost { flops: flops as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

fn as_f32(t: &Tensor) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Ok(s) if t.dtype() == DType::F32 => Cow::Borrowed(s),
        _ => Cow::Owned(t.to_f64_vec().into_iter().map(|v| v as f32).collect()),
    }
}

/// The inputs as f32, the mask as an additive bias (bool: 0 or -inf).
pub(super) struct Data<'a> {
    pub q: Cow<'a, [f32]>,
    pub k: Cow<'a, [f32]>,
    pub v: Cow<'a, [f32]>,
    past_k: Cow<'a, [f32]>,
    past_v: Cow<'a, [f32]>,
    pub mask: Cow<'a, [f32]>,
    nonpad: Vec<i64>,
}

impl Data<'_> {
    /// Key `j` of KV head `hk` of batch `b` (past keys first).
    fn key(&self, g: &Geometry, b: usize, hk: usize, j: usize) -> &[f32] {
        if j < g.past {
            &self.past_k[((b * g.kv_heads + hk) * g.past + j) * g.head..][..g.head]
        } else {
            &self.k[b * g.k_strides[0] + hk * g.k_strides[1] + (j - g.past) * g.k_strides[2]..][..g.head]
        }
    }

    fn value(&self, g: &Geometry, b: usize, hk: usize, j: usize) -> &[f32] {
        if j < g.past {
            &self.past_v[((b * g.kv_heads + hk) * g.past + j) * g.v_head..][..g.v_head]
        } else {
            &self.v[b * g.v_strides[0] + hk * g.v_strides[1] + (j - g.past) * g.v_strides[2]..][..g.v_head]
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + rest
}

impl Attention {
    /// The additive bias of key `j` for query row `(b, h, i)`: `None` when masked.
    pub(super) fn bias(&self, g: &Geometry, x: &Data, b: usize, h: usize, i: usize, j: usize) -> Option<f32> {
        let mut bias = 0.0;
        if let Some(m) = &g.mask {
            if j >= m.len {
                return None;
            }
            bias = x.mask[b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j];
            if bias == f32::NEG_INFINITY {
                return None;
            }
        }
        let offset = if g.has_nonpad { x.nonpad[b] - g.q_len as i64 } else { g.past as i64 };
        let (pos, j) = (i as i64 + offset, j as i64);
        if (self.is_causal && j > pos) || (self.left_window >= 0 && pos - j > self.left_window) || (self.right_window >= 0 && j - pos > self.right_window) {
            return None;
        }
        if g.has_nonpad && j >= x.nonpad[b] {
            return None;
        }
        Some(bias)
    }

    /// Row `(b, h, i)` of the scores at `stage` (0 raw, 1 softcapped, 2 biased, 3 the
    /// softmax) into `out` (`g.total` values). Masked keys are -inf at stage 2 and 0 at
    /// stage 3.
    fn scores(&self, g: &Geometry, x: &Data, (b, h, i): (usize, usize, usize), stage: u8, out: &mut [f32]) {
        let hk = h / g.group();
        let q = &x.q[b * g.q_strides[0] + h * g.q_strides[1] + i * g.q_strides[2]..][..g.head];
        let cap = self.softcap;
        for (j, o) in out.iter_mut().enumerate() {
            // From stage 2 on a masked key is -inf whatever its score: skip the dot.
            let bias = if stage >= 2 {
                match self.bias(g, x, b, h, i, j) {
                    Some(bias) => bias,
                    None => {
                        *o = f32::NEG_INFINITY;
                        continue;
                    }
                }
            } else {
                0.0
            };
            let mut s = dot(q, x.key(g, b, hk, j)) * g.scale;
            if stage >= 1 && cap > 0.0 {
                s = cap * (s / cap).tanh();
            }
            *o = s + bias;
        }
        if stage < 3 {
            return;
        }
        let m = out.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        if m == f32::NEG_INFINITY {
            // Every key masked: a zero row (not NaN).
            out.fill(0.0);
            return;
        }
        let mut sum = 0.0;
        for o in out.iter_mut() {
            *o = if *o == f32::NEG_INFINITY { 0.0 } else { cpu::fast_exp(*o - m) };
            sum += *o;
        }
        let r = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= r);
    }
}

/// Runs `f` on an f32 view of `out`, converting when its dtype is not f32.
fn with_f32_out(out: &mut Tensor, f: impl FnOnce(&mut [f32])) -> Result<()> {
    if out.dtype() == DType::F32 {
        f(out.as_mut_slice::<f32>()?);
        return Ok(());
    }
    let mut buf = vec![0f32; out.len()];
    f(&mut buf);
    let wide: Vec<f64> = buf.into_iter().map(|v| v as f64).collect();
    let dims = out.dims().to_vec();
    *out = Tensor::from_f64(out.dtype(), &dims, &wide)?;
    Ok(())
}

impl CpuKernel for Attention {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let shapes: Vec<Shape> = inputs.iter().map(|t| t.map(|t| (t.dims(), t.dtype()))).collect();
        let g = self.geometry(&shapes)?;
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let empty: Cow<[f32]> = Cow::Owned(vec![]);
        let mask = match opt(3) {
            None => Cow::Owned(vec![]),
            Some(m) if m.dtype() == DType::Bool => Cow::Owned(m.bytes().iter().map(|&v| if v != 0 { 0.0 } else { f32::NEG_INFINITY }).collect()),
            Some(m) => as_f32(m),
        };
        let nonpad = match opt(6) {
            Some(t) => t.to_i64_vec()?,
            None => vec![],
        };
        let x = Data {
            q: as_f32(cpu::input(inputs, 0)?),
            k: as_f32(cpu::input(inputs, 1)?),
            v: as_f32(cpu::input(inputs, 2)?),
            past_k: opt(4).map(as_f32).unwrap_or_else(|| empty.clone()),
            past_v: opt(5).map(as_f32).unwrap_or(empty),
            mask,
            nonpad,
        };
        if self.blocked_applies(&g, inputs, &outputs[0]) {
            self.run_blocked(&g, &x, outputs[0].as_mut_slice::<f32>()?);
        } else {
            self.run_rows(&g, &x, &mut outputs[0])?;
        }
        self.run_extra_outputs(&g, &x, outputs)
    }
}

impl Attention {
    /// Y row by row (any dtype, past keys, softcap): the scores of one query row, then
    /// its weighted sum of values. Rows are in (b, i, h) order for 3-D, (b, h, i) for 4-D.
    fn run_rows(&self, g: &Geometry, x: &Data, y: &mut Tensor) -> Result<()> {
        let (hq, sq, dv, t) = (g.q_heads, g.q_len, g.v_head, g.total);
        let work = t * (g.head + dv) + 8;
        let row_of = |u: usize| if g.three_d { (u / (sq * hq), u % hq, (u / hq) % sq) } else { (u / (hq * sq), (u / sq) % hq, u % sq) };
        with_f32_out(y, |y| {
            cpu::par_chunks_mut(y, dv, work, |first, part| {
                cpu::with_scratch(t, |p| {
                    for (n, yr) in part.chunks_mut(dv.max(1)).enumerate() {
                        let (b, h, i) = row_of(first + n);
                        self.scores(g, x, (b, h, i), 3, p);
                        yr.fill(0.0);
                        for (j, &pj) in p.iter().enumerate() {
                            if pj != 0.0 {
                                for (o, &vv) in yr.iter_mut().zip(x.value(g, b, h / g.group(), j)) {
                                    *o += pj * vv;
                                }
                            }
                        }
                    }
                })
            });
        })
    }

    /// Outputs 1..3 when the node has them: present_key/value and qk_matmul_output.
    fn run_extra_outputs(&self, g: &Geometry, x: &Data, outputs: &mut [Tensor]) -> Result<()> {
        let (hq, sq, dv, t) = (g.q_heads, g.q_len, g.v_head, g.total);
        // present_key / present_value: the past followed by the new keys/values.
        for (o, width, value) in [(1usize, g.head, false), (2, dv, true)] {
            if let Some(out) = outputs.get_mut(o) {
                with_f32_out(out, |dst| {
                    for (r, chunk) in dst.chunks_mut(width.max(1)).enumerate() {
                        let (b, hk, j) = (r / (g.kv_heads * t), (r / t) % g.kv_heads, r % t);
                        chunk.copy_from_slice(if value { x.value(g, b, hk, j) } else { x.key(g, b, hk, j) });
                    }
                })?;
            }
        }
        if let Some(out) = outputs.get_mut(3) {
            with_f32_out(out, |dst| {
                cpu::par_chunks_mut(dst, t, g.head * 2 + 8, |first, part| {
                    for (n, row) in part.chunks_mut(t.max(1)).enumerate() {
                        let r = first + n;
                        self.scores(g, x, (r / (hq * sq), (r / sq) % hq, r % sq), self.mode, row);
                    }
                })
            })?;
        }
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Attention", |spec| Ok(Box::new(Attention::parse(spec)?)));
}
