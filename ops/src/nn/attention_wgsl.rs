//! WGSL for [`Attention`]: (1) one invocation per score `(b, h, i, j)` computes the
//! scaled, softcapped, biased score into a scratch matrix (masked keys get a sentinel)
//! and the mode 0..2 `qk_matmul_output`; (2) a softmax per query row in place (one
//! invocation per row, or a workgroup of lanes for long rows, see
//! [`super::plane_lanes`]), writing the mode-3 output; (3) one invocation per element
//! of Y sums probabilities times values; (4) present_key/value copies. Masks are
//! decided with flags and bit patterns, never by comparing against infinities.
use super::attention::{Attention, Geometry};
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::op::required;
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{Arg, OpError, Result, TensorType, TuneValues};
use std::fmt::Write;

/// Where the dispatches find their buffers: ONNX Attention binds its inputs and
/// outputs ([`Slots::ONNX`]); onnxruntime's attention contrib ops bind Q, K, V and the
/// mask to scratch buffers they fill first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slots {
    pub q: Binding,
    pub k: Binding,
    pub v: Binding,
    pub mask: Binding,
    pub past_k: Binding,
    pub past_v: Binding,
    pub nonpad: Binding,
    pub y: Binding,
    pub present_k: Binding,
    pub present_v: Binding,
    pub qk: Binding,
    /// The scores matrix (`batch * q_heads * q_len * total` f32).
    pub scores: Binding,
}

impl Slots {
    pub const ONNX: Slots = Slots {
        q: Binding::Input(0),
        k: Binding::Input(1),
        v: Binding::Input(2),
        mask: Binding::Input(3),
        past_k: Binding::Input(4),
        past_v: Binding::Input(5),
        nonpad: Binding::Input(6),
        y: Binding::Output(0),
        present_k: Binding::Output(1),
        present_v: Binding::Output(2),
        qk: Binding::Output(3),
        scores: Binding::Scratch(0),
    };
}

/// The scratch value of a masked score (the lowest finite f32): softmax skips it.
const MASKED: &str = "bitcast<f32>(0xff7fffffu)";
const NEG_INF: &str = "bitcast<f32>(0xff800000u)";

impl Attention {
    /// WGSL statements that set `masked` and `bias` for key `j` of query row
    /// `(b, h, qi)`; `mask` and `nonpad` are bound when the node has them.
    fn bias_wgsl(&self, g: &Geometry) -> String {
        let mut s = String::from("var masked = false;\n    var bias = 0.0;\n");
        if let Some(m) = &g.mask {
            let [sb, sh, si] = m.strides;
            let test = if m.is_bool { "masked = mv == 0u;" } else { "masked = bitcast<u32>(mv) == 0xff800000u;\n            bias = mv;" };
            let _ = write!(
                s,
                "    if (j >= {len}u) {{ masked = true; }} else {{\n        let mv = mask[b * {sb}u + h * {sh}u + qi * {si}u + j];\n        {test}\n    }}\n",
                len = m.len
            );
        }
        if g.has_nonpad {
            let _ = writeln!(s, "    let np = nonpad[b];\n    let off = np - {}i;", g.q_len);
        } else {
            let _ = writeln!(s, "    let off = {}i;", g.past);
        }
        s += "    let pos = i32(qi) + off;\n    let jj = i32(j);\n";
        if self.is_causal {
            s += "    if (jj > pos) { masked = true; }\n";
        }
        // Windows past i32 (the positions' type) mask nothing more than i32::MAX does.
        if self.left_window >= 0 {
            let _ = writeln!(s, "    if (pos - jj > {}i) {{ masked = true; }}", self.left_window.min(i32::MAX as i64));
        }
        if self.right_window >= 0 {
            let _ = writeln!(s, "    if (jj - pos > {}i) {{ masked = true; }}", self.right_window.min(i32::MAX as i64));
        }
        if g.has_nonpad {
            s += "    if (jj >= np) { masked = true; }\n";
        }
        s
    }

    fn scores_dispatch(&self, g: &Geometry, sl: &Slots, qk_out: bool, wg: u32) -> Dispatch {
        let (hq, sq, t, p, d) = (g.q_heads, g.q_len, g.total, g.past, g.head);
        let (mut buffers, mut bindings) = score_bindings(g, sl);
        if qk_out {
            buffers.push(("qk", "f32", false));
            bindings.push(sl.qk);
        }
        let [q0, q1, q2] = g.q_strides;
        let [k0, k1, k2] = g.k_strides;
        let mut body = format!(
            "let j = i % {t}u;\n    let r = i / {t}u;\n    let qi = r % {sq}u;\n    let h = (r / {sq}u) % {hq}u;\n    let b = r / {};\n    \
             let hk = h / {}u;\n    let qb = b * {q0}u + h * {q1}u + qi * {q2}u;\n    var acc = 0.0;\n    ",
            format_args!("{}u", sq * hq),
            g.group()
        );
        // The mask first: a masked score needs no dot product (unless output 3 wants
        // the raw or softcapped scores).
        body += &self.bias_wgsl(g);
        if !(qk_out && self.mode < 2) {
            let qk_masked = if qk_out { format!("qk[i] = {NEG_INF}; ") } else { String::new() };
            let _ = writeln!(body, "    if (masked) {{ s[i] = {MASKED}; {qk_masked}return; }}");
        }
        let new_keys = format!(
            "let kb = b * {k0}u + hk * {k1}u + (j - {p}u) * {k2}u;\n{}",
            wgsl::for_loop("d", "0u", &format!("{d}u"), "1u", "acc = acc + q[qb + d] * k[kb + d];")
        );
        if g.has_past {
            let past = format!(
                "let kb = ((b * {}u + hk) * {p}u + j) * {d}u;\n{}",
                g.kv_heads,
                wgsl::for_loop("d", "0u", &format!("{d}u"), "1u", "acc = acc + q[qb + d] * pk[kb + d];")
            );
            let _ = writeln!(body, "    if (j < {p}u) {{\n{past}    }} else {{\n{new_keys}    }}");
        } else {
            body += &new_keys;
        }
        let _ = writeln!(body, "    var sc = acc * {};", wgsl::literal("f32", g.scale as f64));
        if qk_out && self.mode == 0 {
            body += "    qk[i] = sc;\n";
        }
        if self.softcap > 0.0 {
            let cap = wgsl::literal("f32", self.softcap as f64);
            let _ = writeln!(body, "    sc = {cap} * tanh(clamp(sc / {cap}, -20.0, 20.0));");
        }
        if qk_out && self.mode == 1 {
            body += "    qk[i] = sc;\n";
        }
        if qk_out && self.mode == 2 {
            let _ = writeln!(body, "    qk[i] = select(sc + bias, {NEG_INF}, masked);");
        }
        let _ = writeln!(body, "    s[i] = select(sc + bias, {MASKED}, masked);");
        wgsl::simple_kernel("Attention scores", g.batch * hq * sq * t, wg, &buffers, bindings, "", &body)
    }

    /// The scores, `width` consecutive keys per invocation (each Q element read once for
    /// all of them): for nodes without past keys, softcap or `qk_matmul_output`, when
    /// `width` (4 or 2) divides the key count. Same results as [`Self::scores_dispatch`].
    fn blocked_scores_dispatch(&self, g: &Geometry, sl: &Slots, width: usize, wg: u32) -> Dispatch {
        let (hq, sq, t, d) = (g.q_heads, g.q_len, g.total, g.head);
        let (buffers, bindings) = score_bindings(g, sl);
        let [q0, q1, q2] = g.q_strides;
        let [k0, k1, k2] = g.k_strides;
        let mut body = format!(
            "let j0 = (i % {groups}u) * {width}u;\n    let r = i / {groups}u;\n    let qi = r % {sq}u;\n    let h = (r / {sq}u) % {hq}u;\n    \
             let b = r / {bh}u;\n    let hk = h / {group}u;\n    let qb = b * {q0}u + h * {q1}u + qi * {q2}u;\n    let kb = b * {k0}u + hk * {k1}u + j0 * {k2}u;\n",
            groups = t / width,
            bh = sq * hq,
            group = g.group(),
        );
        let mut step = String::from("let qv = q[qb + d];\n");
        for w in 0..width {
            let _ = writeln!(body, "    var acc{w} = 0.0;");
            let _ = writeln!(step, "acc{w} = acc{w} + qv * k[kb + {}u + d];", w * k2);
        }
        body += &wgsl::for_loop("d", "0u", &format!("{d}u"), "1u", &step);
        let scale = wgsl::literal("f32", g.scale as f64);
        for w in 0..width {
            let _ = writeln!(
                body,
                "    {{\n    let j = j0 + {w}u;\n    {}    s[r * {t}u + j] = select(acc{w} * {scale} + bias, {MASKED}, masked);\n    }}",
                self.bias_wgsl(g)
            );
        }
        wgsl::simple_kernel("Attention scores", g.batch * hq * sq * t / width, wg, &buffers, bindings, "", &body)
    }

    /// In-place softmax of each scratch row; masked scores become 0, and a row of
    /// masked scores a zero row.
    fn softmax_dispatch(&self, g: &Geometry, sl: &Slots, qk_out: bool, wg: u32) -> Result<Dispatch> {
        let (rows, t) = (g.batch * g.q_heads * g.q_len, g.total);
        let mut buffers = vec![("s", "f32", false)];
        let mut bindings = vec![sl.scores];
        if qk_out {
            buffers.push(("qk", "f32", false));
            bindings.push(sl.qk);
        }
        let store = format!(
            "let v = s[base + j];\nlet pr = select(exp(v - m) * inv, 0.0, v == {MASKED});\ns[base + j] = pr;{}",
            if qk_out { "\nqk[base + j] = pr;" } else { "" }
        );
        let finish = "let inv = select(1.0 / sum, 0.0, sum == 0.0);\n    ";
        let lanes = plane_lanes("Attention softmax", t, 3, 2)?;
        if lanes == 1 {
            let tl = format!("{t}u");
            let body = format!(
                "let base = i * {t}u;\n    var m = {MASKED};\n    {}    var sum = 0.0;\n    {}    {finish}{}",
                wgsl::for_loop("j", "0u", &tl, "1u", "m = max(m, s[base + j]);"),
                wgsl::for_loop("j", "0u", &tl, "1u", &format!("let v = s[base + j];\nif (v != {MASKED}) {{ sum = sum + exp(v - m); }}")),
                wgsl::for_loop("j", "0u", &tl, "1u", &store),
            );
            return Ok(wgsl::simple_kernel("Attention softmax", rows, wg, &buffers, bindings, "", &body));
        }
        let body = format!(
            "let base = i * {t}u;\n    var t = {MASKED};\n    {}    {}    let m = red[0];\n    workgroupBarrier();\n    t = 0.0;\n    {}    {}    let sum = red[0];\n    {finish}{}",
            lane_loop(t, lanes, "t = max(t, s[base + j]);"),
            tree(lanes, "max(red[lid.x], red[lid.x + w])"),
            lane_loop(t, lanes, &format!("let v = s[base + j];\nif (v != {MASKED}) {{ t = t + exp(v - m); }}")),
            tree(lanes, "red[lid.x] + red[lid.x + w]"),
            lane_loop(t, lanes, &store),
        );
        Ok(lanes_dispatch("Attention softmax", rows, lanes, &buffers, bindings, &body))
    }

    /// Y = probabilities x values: each invocation sums `width` consecutive elements of
    /// a row of Y (the widest of 4, 2, 1 dividing v_head), reading each probability once.
    fn weighted_sum_dispatch(&self, g: &Geometry, sl: &Slots, wg: u32) -> Dispatch {
        let (hq, sq, t, p, dv) = (g.q_heads, g.q_len, g.total, g.past, g.v_head);
        let width = [4usize, 2, 1].into_iter().find(|w| dv % w == 0).unwrap_or(1);
        let mut buffers = vec![("s", "f32", false), ("v", "f32", true)];
        let mut bindings = vec![sl.scores, sl.v];
        if g.has_past {
            buffers.push(("pv", "f32", true));
            bindings.push(sl.past_v);
        }
        buffers.push(("y", "f32", false));
        bindings.push(sl.y);
        // `first` is the first element of Y this invocation writes.
        let mut body = format!("let first = i * {width}u;\n    let e = first % {dv}u;\n");
        if g.three_d {
            let _ = writeln!(body, "    let h = (first / {dv}u) % {hq}u;\n    let qi = (first / {}u) % {sq}u;\n    let b = first / {}u;", dv * hq, dv * hq * sq);
        } else {
            let _ = writeln!(body, "    let r = first / {dv}u;\n    let qi = r % {sq}u;\n    let h = (r / {sq}u) % {hq}u;\n    let b = r / {}u;", sq * hq);
        }
        let _ = writeln!(body, "    let hk = h / {}u;\n    let pb = ((b * {hq}u + h) * {sq}u + qi) * {t}u;", g.group());
        for w in 0..width {
            let _ = writeln!(body, "    var acc{w} = 0.0;");
        }
        let accumulate = |src: &str, at: &str| -> String {
            (0..width).map(|w| format!("acc{w} = acc{w} + pj * {src}[{at} + {w}u];")).collect::<Vec<_>>().join(" ")
        };
        if g.has_past {
            let _ = writeln!(body, "    let pvb = (b * {}u + hk) * {p}u * {dv}u + e;", g.kv_heads);
            let add = accumulate("pv", &format!("pvb + j * {dv}u"));
            body += &wgsl::for_loop("j", "0u", &format!("{p}u"), "1u", &format!("let pj = s[pb + j];\nif (pj != 0.0) {{ {add} }}"));
        }
        let [v0, v1, v2] = g.v_strides;
        let _ = writeln!(body, "    let vb = b * {v0}u + hk * {v1}u + e;");
        let add = accumulate("v", &format!("vb + j * {v2}u"));
        body += &wgsl::for_loop("j", "0u", &format!("{}u", g.kv_len), "1u", &format!("let pj = s[pb + {p}u + j];\nif (pj != 0.0) {{ {add} }}"));
        for w in 0..width {
            let _ = writeln!(body, "    y[first + {w}u] = acc{w};");
        }
        wgsl::simple_kernel("Attention weighted sum", g.batch * hq * sq * dv / width, wg, &buffers, bindings, "", &body)
    }

    /// present_key (`value` false) or present_value: the past then the new rows.
    fn present_dispatch(&self, g: &Geometry, sl: &Slots, value: bool, wg: u32) -> Dispatch {
        let (width, strides, input, past_input, out) =
            if value { (g.v_head, g.v_strides, sl.v, sl.past_v, sl.present_v) } else { (g.head, g.k_strides, sl.k, sl.past_k, sl.present_k) };
        let (t, p, hkv) = (g.total, g.past, g.kv_heads);
        let mut buffers = vec![("x", "f32", true)];
        let mut bindings = vec![input];
        if g.has_past {
            buffers.push(("px", "f32", true));
            bindings.push(past_input);
        }
        buffers.push(("o", "f32", false));
        bindings.push(out);
        let [s0, s1, s2] = strides;
        let mut body = format!(
            "let d = i % {width}u;\n    let r = i / {width}u;\n    let j = r % {t}u;\n    let hk = (r / {t}u) % {hkv}u;\n    let b = r / {}u;\n",
            t * hkv
        );
        let fresh = format!("o[i] = x[b * {s0}u + hk * {s1}u + (j - {p}u) * {s2}u + d];");
        if g.has_past {
            let _ = write!(body, "    if (j < {p}u) {{ o[i] = px[((b * {hkv}u + hk) * {p}u + j) * {width}u + d]; }} else {{ {fresh} }}");
        } else {
            body += "    ";
            body += &fresh;
        }
        wgsl::simple_kernel(if value { "Attention present_value" } else { "Attention present_key" }, g.batch * hkv * t * width, wg, &buffers, bindings, "", &body)
    }
}

impl WgslKernel for Attention {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        required(inputs, 0)?;
        let shapes: Vec<_> = inputs.iter().map(|a| a.map(|a| (a.dims(), a.dtype()))).collect();
        let g = self.geometry(&shapes)?;
        let wg = tune.get(&wgsl::workgroup_param());
        let (dispatches, scores) = self.dispatches(&g, &Slots::ONNX, outputs, wg)?;
        Ok(WgslProgram { dispatches, scratch_bytes: vec![scores] })
    }
}

impl Attention {
    /// The dispatches of one application with buffers at `sl`, for the `outputs` that
    /// are wanted (Y, present_key, present_value, qk_matmul_output; absent or empty
    /// ones are skipped), and the bytes of the scores buffer (`sl.scores`).
    pub(super) fn dispatches(&self, g: &Geometry, sl: &Slots, outputs: &[TensorType], wg: u32) -> Result<(Vec<Dispatch>, u64)> {
        // Per-invocation loops: head_size per score, total keys per element of Y.
        for (n, what) in [(g.head, "head size"), (g.total, "total sequence length")] {
            if n > wgsl::MAX_LOOP_ITERATIONS {
                return Err(OpError::Unsupported(format!("Attention with a {what} of {n} exceeds the GPU loop budget ({})", wgsl::MAX_LOOP_ITERATIONS)));
            }
        }
        let qk_out = outputs.len() > 3 && !outputs[3].is_empty();
        let rows = g.batch * g.q_heads * g.q_len;
        let mut dispatches = vec![];
        if rows * g.total > 0 {
            let width = [4usize, 2].into_iter().find(|w| g.total % w == 0);
            match width {
                Some(w) if !qk_out && !g.has_past && self.softcap <= 0.0 => dispatches.push(self.blocked_scores_dispatch(g, sl, w, wg)),
                _ => dispatches.push(self.scores_dispatch(g, sl, qk_out && self.mode < 3, wg)),
            }
            dispatches.push(self.softmax_dispatch(g, sl, qk_out && self.mode == 3, wg)?);
        }
        if outputs.first().is_some_and(|t| !t.is_empty()) {
            dispatches.push(self.weighted_sum_dispatch(g, sl, wg));
        }
        for (o, value) in [(1usize, false), (2, true)] {
            if outputs.get(o).is_some_and(|t| !t.is_empty()) {
                dispatches.push(self.present_dispatch(g, sl, value, wg));
            }
        }
        Ok((dispatches, (rows * g.total).max(1) as u64 * 4))
    }
}

/// The buffers a scores dispatch binds, in order: q, k, the past keys, the mask, the
/// non-pad lengths (each when present), and the scores scratch.
fn score_bindings(g: &Geometry, sl: &Slots) -> (Vec<(&'static str, &'static str, bool)>, Vec<Binding>) {
    let mut buffers = vec![("q", "f32", true), ("k", "f32", true)];
    let mut bindings = vec![sl.q, sl.k];
    if g.has_past {
        buffers.push(("pk", "f32", true));
        bindings.push(sl.past_k);
    }
    if let Some(m) = &g.mask {
        buffers.push(("mask", if m.is_bool { "u32" } else { "f32" }, true));
        bindings.push(sl.mask);
    }
    if g.has_nonpad {
        buffers.push(("nonpad", "i32", true));
        bindings.push(sl.nonpad);
    }
    buffers.push(("s", "f32", false));
    bindings.push(sl.scores);
    (buffers, bindings)
}
