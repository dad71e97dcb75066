//! onnxruntime's Attention contrib op (domain `com.microsoft`), and what its attention
//! contrib ops share ([`Problem`]): they reduce to the ONNX Attention core
//! ([`Attention::core`]) on 3-D Q, K, V with an additive float mask `(B, 1 or N, S, T)`
//! built from `mask_index` (1-D end positions `(B)` or end and start positions `(2B)`,
//! 2-D `(B, T)` or 3-D `(B, S, T)` 1/0 masks: a masked key gets `mask_filter_value`,
//! added, as onnxruntime does) plus `attention_bias` `(B or 1, N or 1, S, T)`.
//! `unidirectional` is the core's causal rule.
//!
//! Attention: `input (B, S, In) x weights (In, Hq + Hk + Hv) + bias` gives Q, K and V
//! (sizes from `qkv_hidden_sizes`, default three equal parts); output `(B, S, Hv)`.
//! `past`/`present`, rotary and shared buffers are rejected with an error naming the
//! node. WGSL: a projection dispatch into scratch Q, K, V, a mask dispatch, then the
//! core's dispatches reading them ([`Slots`]).
use super::attention::{Attention, Geometry};
use super::attention_wgsl::Slots;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const INTS: &[DType] = &[DType::I32, DType::I64];

/// How a contrib op's integer mask input is read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum KeyMask {
    /// `(B)`: keys from position `m[b]` on are masked.
    Ends,
    /// `(2B)`: also keys before `m[B + b]`.
    EndsAndStarts,
    /// `(B)`: keys after position `m[b]` are masked (GroupQueryAttention's seqlens_k).
    Lasts,
    /// `(B, T)`: key `j` masked where `m[b, j] == 0`.
    Keys,
    /// `(B, S, T)`: per query row.
    Rows,
}

/// One application of an attention contrib op, as the ONNX core sees it.
#[derive(Clone, Debug)]
pub(super) struct Problem {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Hidden sizes of Q, K and V.
    pub hidden: [usize; 3],
    /// The integer mask: its input slot and form.
    pub mask: Option<(usize, KeyMask)>,
    /// `attention_bias`: its input slot and whether it has a batch / a head dim > 1.
    pub bias: Option<(usize, bool, bool)>,
    pub filter: f32,
}

impl Problem {
    /// Checks the mask input `i` of dims `d` and returns its form.
    pub fn key_mask(&mut self, i: usize, d: &[usize]) -> Result<()> {
        let (b, s, t) = (self.batch, self.q_len, self.kv_len);
        let kind = match d {
            [n] if *n == b => KeyMask::Ends,
            [n] if *n == 2 * b => KeyMask::EndsAndStarts,
            [x, y] if *x == b && *y == t => KeyMask::Keys,
            [x, y, z] if *x == b && *y == s && *z == t => KeyMask::Rows,
            _ => {
                return Err(OpError::input(i, format!("the mask must have shape ({b}), ({}), ({b}, {t}) or ({b}, {s}, {t}), found {d:?}", 2 * b)));
            }
        };
        self.mask = Some((i, kind));
        Ok(())
    }

    /// Checks `attention_bias` (input `i`, dims `d`).
    pub fn attention_bias(&mut self, i: usize, d: &[usize]) -> Result<()> {
        let (b, n, s, t) = (self.batch, self.heads, self.q_len, self.kv_len);
        match d {
            [x, y, z, w] if (*x == 1 || *x == b) && (*y == 1 || *y == n) && *z == s && *w == t => {
                self.bias = Some((i, *x == b && b > 1, *y == n && n > 1));
                Ok(())
            }
            _ => Err(OpError::input(i, format!("attention_bias must have shape ({b} or 1, {n} or 1, {s}, {t}), found {d:?}"))),
        }
    }

    /// Head dim of the float mask: `Some(N)` with attention_bias, `Some(1)` with a mask
    /// only, `None` without either.
    fn mask_heads(&self) -> Option<usize> {
        match (self.bias, self.mask) {
            (Some(_), _) => Some(self.heads),
            (None, Some(_)) => Some(1),
            (None, None) => None,
        }
    }

    fn mask_dims(&self) -> Option<[usize; 4]> {
        self.mask_heads().map(|h| [self.batch, h, self.q_len, self.kv_len])
    }

    /// The core's geometry for 3-D Q, K, V and the float mask.
    pub fn geometry(&self, core: &Attention) -> Result<Geometry> {
        let [hq, hk, hv] = self.hidden;
        let dims = [vec![self.batch, self.q_len, hq], vec![self.batch, self.kv_len, hk], vec![self.batch, self.kv_len, hv]];
        let mask = self.mask_dims();
        let mut shapes: Vec<Option<(&[usize], DType)>> = dims.iter().map(|d| Some((d.as_slice(), DType::F32))).collect();
        shapes.push(mask.as_ref().map(|m| (m.as_slice(), DType::F32)));
        core.geometry(&shapes)
    }

    /// The float mask `(B, Mh, S, T)` on the CPU, from the node's inputs.
    fn cpu_mask(&self, inputs: &[Option<&Tensor>]) -> Result<Option<Vec<f32>>> {
        let Some([b_n, mh, s_n, t_n]) = self.mask_dims() else { return Ok(None) };
        let m = self.mask.map(|(i, _)| -> Result<Vec<i64>> { Ok(cpu::input(inputs, i)?.to_i64_vec()?) }).transpose()?;
        let bias = self.bias.map(|(i, _, _)| cpu::input(inputs, i).map(|t| t.to_f64_vec())).transpose()?;
        let mut out = vec![0f32; b_n * mh * s_n * t_n];
        for (e, o) in out.iter_mut().enumerate() {
            let (j, i, h, b) = (e % t_n, (e / t_n) % s_n, (e / (t_n * s_n)) % mh, e / (t_n * s_n * mh));
            if let (Some(m), Some((_, kind))) = (&m, self.mask) {
                let masked = match kind {
                    KeyMask::Ends => j as i64 >= m[b],
                    KeyMask::Lasts => j as i64 > m[b],
                    KeyMask::EndsAndStarts => j as i64 >= m[b] || (j as i64) < m[b_n + b].min(t_n as i64),
                    KeyMask::Keys => m[b * t_n + j] <= 0,
                    KeyMask::Rows => m[(b * s_n + i) * t_n + j] <= 0,
                };
                if masked {
                    *o = self.filter;
                }
            }
            if let (Some(v), Some((_, has_b, has_h))) = (&bias, self.bias) {
                *o += v[((if has_b { b } else { 0 } * if has_h { mh } else { 1 } + if has_h { h } else { 0 }) * s_n + i) * t_n + j] as f32;
            }
        }
        Ok(Some(out))
    }

    /// The WGSL dispatch writing the float mask into `at`.
    fn mask_dispatch(&self, at: Binding, wg: u32) -> Option<Dispatch> {
        let [b_n, mh, s_n, t_n] = self.mask_dims()?;
        let mut buffers = vec![];
        let mut bindings = vec![];
        let mut body = format!("let j = i % {t_n}u;\n    let qi = (i / {t_n}u) % {s_n}u;\n    let h = (i / {}u) % {mh}u;\n    let b = i / {}u;\n    var v = 0.0;\n", t_n * s_n, t_n * s_n * mh);
        let filter = wgsl::literal("f32", self.filter as f64);
        if let Some((slot, kind)) = self.mask {
            buffers.push(("m", "i32", true));
            bindings.push(Binding::Input(slot));
            let masked = match kind {
                KeyMask::Ends => "i32(j) >= m[b]".to_string(),
                KeyMask::Lasts => "i32(j) > m[b]".to_string(),
                KeyMask::EndsAndStarts => format!("i32(j) >= m[b] || i32(j) < min(m[{b_n}u + b], {t_n}i)"),
                KeyMask::Keys => format!("m[b * {t_n}u + j] <= 0i"),
                KeyMask::Rows => format!("m[(b * {s_n}u + qi) * {t_n}u + j] <= 0i"),
            };
            body += &format!("    if ({masked}) {{ v = {filter}; }}\n");
        }
        if let Some((slot, has_b, has_h)) = self.bias {
            buffers.push(("ab", "f32", true));
            bindings.push(Binding::Input(slot));
            let bi = if has_b { format!("b * {}u", if has_h { mh } else { 1 }) } else { "0u".into() };
            let hi = if has_h { "h" } else { "0u" };
            body += &format!("    v = v + ab[(({bi} + {hi}) * {s_n}u + qi) * {t_n}u + j];\n");
        }
        buffers.push(("mask", "f32", false));
        bindings.push(at);
        body += "    mask[i] = v;";
        Some(wgsl::simple_kernel("attention mask", b_n * mh * s_n * t_n, wg, &buffers, bindings, "", &body))
    }

    /// Runs the core on the CPU: `q`, `k`, `v` are the 3-D activations (f32), the mask
    /// comes from `inputs`; `outputs` are Y and, when given, present_key/value.
    pub fn run_cpu(&self, core: &Attention, inputs: &[Option<&Tensor>], [q, k, v]: [Vec<f32>; 3], outputs: &mut [Tensor]) -> Result<()> {
        let [hq, hk, hv] = self.hidden;
        let q = Tensor::from_slice(&[self.batch, self.q_len, hq], &q)?;
        let k = Tensor::from_slice(&[self.batch, self.kv_len, hk], &k)?;
        let v = Tensor::from_slice(&[self.batch, self.kv_len, hv], &v)?;
        let mask = match (self.cpu_mask(inputs)?, self.mask_dims()) {
            (Some(m), Some(d)) => Some(Tensor::from_slice(&d, &m)?),
            _ => None,
        };
        core.run(&[Some(&q), Some(&k), Some(&v), mask.as_ref()], outputs)
    }

    /// The WGSL program: `pre` (dispatches filling Q, K, V at `qkv`, using scratch
    /// buffers 1.. of `scratch`), the mask dispatch, then the core's dispatches.
    pub fn program(&self, core: &Attention, qkv: [Binding; 3], mut pre: Vec<Dispatch>, mut scratch: Vec<u64>, outputs: &[TensorType], wg: u32) -> Result<WgslProgram> {
        let g = self.geometry(core)?;
        let mask_at = Binding::Scratch(scratch.len().max(1));
        let mut slots = Slots::ONNX;
        (slots.q, slots.k, slots.v, slots.mask) = (qkv[0], qkv[1], qkv[2], mask_at);
        if let Some(d) = self.mask_dispatch(mask_at, wg) {
            let mask_len = self.mask_dims().map_or(0, |d| d.iter().product::<usize>());
            scratch.resize(scratch.len().max(1), 0);
            scratch.push(mask_len.max(1) as u64 * 4);
            // No queries or no keys: an empty mask, nothing to write (and its index
            // arithmetic would divide by zero).
            if mask_len > 0 {
                pre.push(d);
            }
        }
        let (core_dispatches, scores) = core.dispatches(&g, &slots, outputs, wg)?;
        if scratch.is_empty() {
            scratch.push(0);
        }
        scratch[0] = scores;
        pre.extend(core_dispatches);
        for d in &mut pre {
            writable_scratch(d);
        }
        Ok(WgslProgram { dispatches: pre, scratch_bytes: scratch })
    }
}

/// A dispatch copying `n` elements of `src` to `dst`, adding `bias[offset + i % width]`
/// when `bias` is given.
pub(super) fn bias_add_dispatch(label: &str, src: Binding, bias: Option<(Binding, usize)>, dst: Binding, n: usize, width: usize, wg: u32) -> Dispatch {
    let mut buffers = vec![("x", "f32", true)];
    let mut bindings = vec![src];
    let mut add = String::new();
    if let Some((b, offset)) = bias {
        buffers.push(("bias", "f32", true));
        bindings.push(b);
        add = format!(" + bias[{offset}u + i % {width}u]");
    }
    buffers.push(("y", "f32", false));
    bindings.push(dst);
    wgsl::simple_kernel(label, n, wg, &buffers, bindings, "", &format!("y[i] = x[i]{add};"))
}

/// Declares the scratch buffers a dispatch binds `read_write` (the runtime binds
/// scratch writable; the core declares its Q, K, V and mask read-only).
fn writable_scratch(d: &mut Dispatch) {
    for (i, b) in d.bindings.iter().enumerate() {
        if matches!(b, Binding::Scratch(_)) {
            d.source = d.source.replacen(&format!("@binding({i}) var<storage, read>"), &format!("@binding({i}) var<storage, read_write>"), 1);
        }
    }
}

/// The f32 values of a tensor.
pub(super) fn f32_vec(t: &Tensor) -> Vec<f32> {
    match t.as_slice::<f32>() {
        Ok(s) if t.dtype() == DType::F32 => s.to_vec(),
        _ => t.to_f64_vec().into_iter().map(|v| v as f32).collect(),
    }
}

/// The attention contrib op's attributes.
#[derive(Debug)]
pub struct MsAttention {
    heads: usize,
    unidirectional: bool,
    qkv_sizes: Option<[usize; 3]>,
    filter: f32,
    scale: Option<f32>,
}

impl MsAttention {
    fn problem(&self, inputs: &[Option<(&[usize], DType)>]) -> Result<Problem> {
        let get = |i: usize| inputs.get(i).copied().flatten();
        let x = get(0).ok_or_else(|| OpError::input(0, "input is required"))?.0;
        let w = get(1).ok_or_else(|| OpError::input(1, "weights is required"))?.0;
        let &[batch, seq, width] = x else {
            return Err(OpError::input(0, format!("expected (batch, sequence, input_hidden), found shape {x:?}")));
        };
        if w.len() != 2 || w[0] != width {
            return Err(OpError::input(1, format!("weights must have shape ({width}, Q + K + V hidden), found {w:?}")));
        }
        let hidden = match self.qkv_sizes {
            Some(s) => s,
            None if w[1] % 3 == 0 => [w[1] / 3; 3],
            None => return Err(OpError::input(1, format!("weights' {} columns do not split into three equal parts", w[1]))),
        };
        if hidden.iter().sum::<usize>() != w[1] || hidden[0] != hidden[1] {
            return Err(OpError::input(1, format!("qkv_hidden_sizes {hidden:?} must have Q = K and sum to the weights' {} columns", w[1])));
        }
        if hidden.iter().any(|h| h % self.heads != 0) {
            return Err(OpError::invalid(format!("hidden sizes {hidden:?} are not multiples of num_heads = {}", self.heads)));
        }
        if let Some((b, _)) = get(2) {
            if b != [w[1]] {
                return Err(OpError::input(2, format!("bias must be a vector of {}, found shape {b:?}", w[1])));
            }
        }
        for (i, what) in [(4, "past"), (6, "past_sequence_length")] {
            if get(i).is_some() {
                return Err(OpError::input(i, format!("{what} (decoding with a KV cache) is not supported")));
            }
        }
        let mut p = Problem { batch, q_len: seq, kv_len: seq, heads: self.heads, kv_heads: self.heads, hidden, mask: None, bias: None, filter: self.filter };
        if let Some((d, _)) = get(3) {
            p.key_mask(3, d)?;
        }
        if let Some((d, _)) = get(5) {
            p.attention_bias(5, d)?;
        }
        Ok(p)
    }

    fn core(&self) -> Attention {
        Attention::core(self.heads, self.heads, self.scale, self.unidirectional, 0.0, -1)
    }
}

pub(super) fn shapes<'a>(inputs: &[Option<Arg<'a>>]) -> Vec<Option<(&'a [usize], DType)>> {
    inputs.iter().map(|a| a.map(|a| (a.dims(), a.dtype()))).collect()
}

pub(super) fn tensor_shapes<'a>(inputs: &[Option<&'a Tensor>]) -> Vec<Option<(&'a [usize], DType)>> {
    inputs.iter().map(|t| t.map(|t| (t.dims(), t.dtype()))).collect()
}

impl Op for MsAttention {
    fn name(&self) -> &str {
        "Attention"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        for i in [1, 2, 5] {
            if inputs.get(i).copied().flatten().is_some() && expect_dtype(inputs, i, FLOATS)? != dtype {
                return Err(OpError::input(i, format!("dtype differs from the input's {dtype}")));
            }
        }
        if inputs.get(3).copied().flatten().is_some() {
            expect_dtype(inputs, 3, INTS)?;
        }
        let p = self.problem(&shapes(inputs))?;
        p.geometry(&self.core())?;
        required(inputs, 0)?;
        Ok(vec![TensorType::new(dtype, vec![p.batch, p.q_len, p.hidden[2]])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = self.problem(&shapes(inputs)).map_or(0, |p| {
            let width = inputs[0].map_or(0, |a| a.dims()[2]);
            2 * p.batch * p.q_len * width * p.hidden.iter().sum::<usize>() + 2 * p.batch * p.q_len * p.kv_len * (p.hidden[0] + p.hidden[2])
        });
        Cost { flops: flops as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MsAttention {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = self.problem(&tensor_shapes(inputs))?;
        let (x, w) = (f32_vec(cpu::input(inputs, 0)?), f32_vec(cpu::input(inputs, 1)?));
        let (rows, width, cols) = (p.batch * p.q_len, x.len() / (p.batch * p.q_len).max(1), p.hidden.iter().sum::<usize>());
        let mut proj = vec![0f32; rows * cols];
        if rows * cols * width > 0 {
            // SAFETY: proj is rows x cols, x rows x width, w width x cols, all row-major
            // and sized so by the checks of `problem`.
            unsafe {
                gemm::gemm(
                    rows, cols, width,
                    proj.as_mut_ptr(), 1, cols as isize, false,
                    x.as_ptr(), 1, width as isize,
                    w.as_ptr(), 1, cols as isize,
                    0.0, 1.0, false, false, false, gemm::Parallelism::Rayon(0),
                );
            }
        }
        if let Some(b) = inputs.get(2).copied().flatten() {
            let b = f32_vec(b);
            proj.chunks_mut(cols.max(1)).for_each(|r| r.iter_mut().zip(&b).for_each(|(o, b)| *o += b));
        }
        let [hq, hk, _] = p.hidden;
        let split = |from: usize, to: usize| proj.chunks(cols.max(1)).flat_map(|r| r[from..to].iter().copied()).collect::<Vec<f32>>();
        let qkv = [split(0, hq), split(hq, hq + hk), split(hq + hk, cols)];
        p.run_cpu(&self.core(), inputs, qkv, &mut outputs[..1])
    }
}

impl WgslKernel for MsAttention {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.problem(&shapes(inputs))?;
        let width = required(inputs, 0)?.dims()[2];
        if width > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("Attention with an input hidden size of {width} exceeds the GPU loop budget")));
        }
        let wg = tune.get(&wgsl::workgroup_param());
        let [hq, hk, hv] = p.hidden;
        let (rows, cols) = (p.batch * p.q_len, hq + hk + hv);
        let has_bias = inputs.get(2).copied().flatten().is_some();
        let mut buffers = vec![("x", "f32", true), ("w", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_bias {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(2));
        }
        buffers.extend([("qs", "f32", false), ("ks", "f32", false), ("vs", "f32", false)]);
        bindings.extend([Binding::Scratch(1), Binding::Scratch(2), Binding::Scratch(3)]);
        let dot = wgsl::for_loop("k", "0u", &format!("{width}u"), "1u", &format!("acc = acc + x[r * {width}u + k] * w[k * {cols}u + c];"));
        let body = format!(
            "let c = i % {cols}u;\n    let r = i / {cols}u;\n    var acc = {};\n    {dot}    \
             if (c < {hq}u) {{ qs[r * {hq}u + c] = acc; }} else if (c < {}u) {{ ks[r * {hk}u + c - {hq}u] = acc; }} else {{ vs[r * {hv}u + c - {}u] = acc; }}",
            if has_bias { "bias[c]" } else { "0.0" },
            hq + hk,
            hq + hk
        );
        let mut pre = vec![];
        if rows * cols > 0 {
            pre.push(wgsl::simple_kernel("Attention QKV projection", rows * cols, wg, &buffers, bindings, "", &body));
        }
        let scratch = vec![0, (rows * hq).max(1) as u64 * 4, (rows * hk).max(1) as u64 * 4, (rows * hv).max(1) as u64 * 4];
        p.program(&self.core(), [Binding::Scratch(1), Binding::Scratch(2), Binding::Scratch(3)], pre, scratch, outputs, wg)
    }
}

/// `num_heads` (required, positive) of an attention contrib node.
pub(super) fn num_heads(spec: &NodeSpec, name: &str) -> Result<usize> {
    match spec.int_opt(name)? {
        Some(n) if n > 0 => Ok(n as usize),
        Some(n) => Err(spec.bad(name, format!("expected a positive head count, found {n}"))),
        None => Err(spec.bad(name, "the attribute is required")),
    }
}

/// Rejects a nonzero integer attribute this implementation does not support.
pub(super) fn reject_flag(spec: &NodeSpec, name: &str, what: &str) -> Result<()> {
    match spec.int(name, 0)? {
        0 => Ok(()),
        v => Err(spec.bad(name, format!("{what} is not supported (found {v})"))),
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "Attention", |spec: &NodeSpec| {
        reject_flag(spec, "do_rotary", "rotary embedding inside Attention")?;
        reject_flag(spec, "past_present_share_buffer", "a past/present buffer shared between steps")?;
        if spec.n_outputs() > 1 {
            return Err(OpError::Unsupported("output 1, present (decoding with a KV cache)".into()));
        }
        let qkv_sizes = match spec.ints_opt("qkv_hidden_sizes")? {
            None => None,
            Some(v) if v.len() == 3 && v.iter().all(|&x| x > 0) => Some([v[0] as usize, v[1] as usize, v[2] as usize]),
            Some(v) => return Err(spec.bad("qkv_hidden_sizes", format!("expected three positive sizes, found {v:?}"))),
        };
        Ok(Box::new(MsAttention {
            heads: num_heads(spec, "num_heads")?,
            unidirectional: spec.int("unidirectional", 0)? != 0,
            qkv_sizes,
            filter: spec.float("mask_filter_value", -10000.0)?,
            scale: spec.float_opt("scale")?.filter(|&s| s != 0.0),
        }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{check_ort_cases, creation_error, rand_f32, Case};
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn attention_matches_onnxruntime() {
        check_ort_cases("Attention", 1e-5);
    }

    #[test]
    fn unsupported_attributes_and_inputs_are_named() {
        let att = || Case::new("Attention").domain("com.microsoft").attr("num_heads", Attr::Int(2));
        assert!(creation_error(&att().attr("do_rotary", Attr::Int(1))).contains("do_rotary"));
        assert!(creation_error(&att().attr("past_present_share_buffer", Attr::Int(1))).contains("past_present_share_buffer"));
        assert!(creation_error(&att().attr("qkv_hidden_sizes", Attr::Ints(vec![4, 4]))).contains("qkv_hidden_sizes"));
        assert!(creation_error(&att().outputs(2)).contains("present"));
        assert!(creation_error(&Case::new("Attention").domain("com.microsoft")).contains("num_heads"));
        let run = |mask: Tensor| att().input(rand_f32(&[2, 3, 4], 1)).input(rand_f32(&[4, 12], 2)).omitted().input(mask).run_cpu().unwrap_err().to_string();
        let err = run(Tensor::from_slice(&[3], &[1i32, 2, 3]).unwrap());
        assert!(err.contains("input 3") && err.contains("mask"), "{err}");
        let err = att().input(rand_f32(&[2, 3, 4], 1)).input(rand_f32(&[4, 12], 2)).omitted().omitted().input(rand_f32(&[2, 3, 2, 6], 3)).run_cpu().unwrap_err().to_string();
        assert!(err.contains("input 4") && err.contains("past"), "{err}");
    }
}
