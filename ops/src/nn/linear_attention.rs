//! LinearAttention (opset 27): recurrent linear attention with an outer-product state
//! per key/value head, `S` (`[d_k, d_v]`). Per step `t`, with `update_rule`:
//! `gated`/`gated_delta` first decay `S *= exp(decay_t)` (per head, or per key dim);
//! `delta`/`gated_delta` replace `v_t` by `beta_t (v_t - S^T k_t)`; then `S += k_t v_t^T`
//! and the output of query head `h` (reading kv head `h / (q_num_heads / kv_num_heads)`)
//! is `scale * S^T q_t` (`scale` default `1/sqrt(d_k)`). Q/K/V are `[B, T, heads * d]`;
//! `past_state` (`[B, H_kv, d_k, d_v]`, default zeros) seeds `S` and `present_state`
//! is the final `S`. `chunk_size` is a tuning hint with no effect on the result.
//!
//! Every column `m` of a head's state evolves on its own, so the GPU runs one
//! invocation per (batch, kv head, column), keeping the column in the
//! `present_state` output as it steps through time (at most
//! [`wgsl::MAX_LOOP_ITERATIONS`] loop iterations in all). The CPU computes in f64.
use crate::cpu::CpuKernel;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct LinearAttention {
    q_heads: usize,
    kv_heads: usize,
    scale: f32,
    gated: bool,
    delta: bool,
}

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    t: usize,
    dk: usize,
    dv: usize,
    /// Decay values per head and step: 1 (per head) or `dk` (per key dim).
    decay_width: usize,
    /// Beta values per step: 1 (shared) or `kv_heads`.
    beta_width: usize,
}

impl LinearAttention {
    fn dims(&self, inputs: &[Option<Arg>]) -> Result<Dims> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let (q, k, v) = (required(inputs, 0)?, required(inputs, 1)?, required(inputs, 2)?);
        let (b, t, qw) = match *q.dims() {
            [b, t, w] => (b, t, w),
            ref d => return Err(OpError::input(0, format!("query must be [B, T, heads * d_k], found {d:?}"))),
        };
        let (hq, hk) = (self.q_heads, self.kv_heads);
        if qw % hq != 0 {
            return Err(OpError::input(0, format!("query width {qw} is not a multiple of q_num_heads {hq}")));
        }
        let dk = qw / hq;
        if k.dims() != [b, t, hk * dk] || k.dtype() != dtype {
            return Err(OpError::input(1, format!("key must be {dtype}[{b}, {t}, {}], found {}", hk * dk, k.ty)));
        }
        let dv = match *v.dims() {
            [vb, vt, w] if vb == b && vt == t && w % hk == 0 && v.dtype() == dtype => w / hk,
            _ => return Err(OpError::input(2, format!("value must be {dtype}[{b}, {t}, kv_num_heads * d_v], found {}", v.ty))),
        };
        if let Some(p) = inputs.get(3).copied().flatten() {
            if p.dims() != [b, hk, dk, dv] || !p.dtype().is_float() {
                return Err(OpError::input(3, format!("past_state must be a float [{b}, {hk}, {dk}, {dv}], found {}", p.ty)));
            }
        }
        let present = |i: usize| inputs.get(i).copied().flatten();
        let decay_width = match (self.gated, present(4)) {
            (true, Some(d)) if d.dims() == [b, t, hk] && d.dtype() == dtype => 1,
            (true, Some(d)) if d.dims() == [b, t, hk * dk] && d.dtype() == dtype => dk,
            (true, Some(d)) => return Err(OpError::input(4, format!("decay must be {dtype}[{b}, {t}, {hk}] or [{b}, {t}, {}], found {}", hk * dk, d.ty))),
            (true, None) => return Err(OpError::input(4, "a gated update rule needs decay")),
            (false, Some(_)) => return Err(OpError::input(4, "decay is only for the gated update rules")),
            (false, None) => 0,
        };
        let beta_width = match (self.delta, present(5)) {
            (true, Some(d)) if d.dims() == [b, t, hk] && d.dtype() == dtype => hk,
            (true, Some(d)) if d.dims() == [b, t, 1] && d.dtype() == dtype => 1,
            (true, Some(d)) => return Err(OpError::input(5, format!("beta must be {dtype}[{b}, {t}, {hk} or 1], found {}", d.ty))),
            (true, None) => return Err(OpError::input(5, "a delta update rule needs beta")),
            (false, Some(_)) => return Err(OpError::input(5, "beta is only for the delta update rules")),
            (false, None) => 0,
        };
        Ok(Dims { b, t, dk, dv, decay_width, beta_width })
    }

    fn scale(&self, dk: usize) -> f64 {
        if self.scale == 0.0 { 1.0 / (dk as f64).sqrt() } else { self.scale as f64 }
    }
}

impl Op for LinearAttention {
    fn name(&self) -> &str {
        "LinearAttention"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = self.dims(inputs)?;
        let dtype = required(inputs, 0)?.dtype();
        let state_dtype = inputs.get(3).copied().flatten().map_or(dtype, |p| p.dtype());
        Ok(vec![
            TensorType::new(dtype, vec![d.b, d.t, self.q_heads * d.dv]),
            TensorType::new(state_dtype, vec![d.b, self.kv_heads, d.dk, d.dv]),
        ])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for LinearAttention {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let Dims { b, t, dk, dv, decay_width, beta_width } = crate::tensor::tensor_args(inputs, |a| self.dims(a))?;
        let (hq, hk) = (self.q_heads, self.kv_heads);
        let group = hq / hk;
        let get = |i: usize| inputs.get(i).copied().flatten().map(|x| x.to_f64_vec());
        let (q, k, v) = (get(0).unwrap_or_default(), get(1).unwrap_or_default(), get(2).unwrap_or_default());
        let (decay, beta) = (get(4), get(5));
        let mut s = get(3).unwrap_or_else(|| vec![0.0; b * hk * dk * dv]);
        let mut out = vec![0.0; b * t * hq * dv];
        let scale = self.scale(dk);
        for bi in 0..b {
            for h in 0..hk {
                let st = &mut s[(bi * hk + h) * dk * dv..][..dk * dv];
                for ti in 0..t {
                    let row = bi * t + ti;
                    let kt = &k[(row * hk + h) * dk..][..dk];
                    if let Some(dec) = &decay {
                        for d in 0..dk {
                            let g = dec[(row * hk + h) * decay_width + if decay_width == 1 { 0 } else { d }].exp();
                            st[d * dv..(d + 1) * dv].iter_mut().for_each(|x| *x *= g);
                        }
                    }
                    let mut vt: Vec<f64> = v[(row * hk + h) * dv..][..dv].to_vec();
                    if let Some(be) = &beta {
                        let bt = be[row * beta_width + if beta_width == 1 { 0 } else { h }];
                        for (m, x) in vt.iter_mut().enumerate() {
                            let retrieved: f64 = (0..dk).map(|d| st[d * dv + m] * kt[d]).sum();
                            *x = bt * (*x - retrieved);
                        }
                    }
                    for d in 0..dk {
                        for m in 0..dv {
                            st[d * dv + m] += kt[d] * vt[m];
                        }
                    }
                    for g in 0..group {
                        let hh = h * group + g;
                        let qt = &q[(row * hq + hh) * dk..][..dk];
                        for m in 0..dv {
                            out[(row * hq + hh) * dv + m] = scale * (0..dk).map(|d| qt[d] * st[d * dv + m]).sum::<f64>();
                        }
                    }
                }
            }
        }
        let (od, sd) = (outputs[0].dtype(), outputs[1].dtype());
        outputs[0] = Tensor::from_f64(od, &[b, t, hq * dv], &out)?;
        outputs[1] = Tensor::from_f64(sd, &[b, hk, dk, dv], &s)?;
        Ok(())
    }
}

impl WgslKernel for LinearAttention {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let Dims { b, t, dk, dv, decay_width, beta_width } = self.dims(inputs)?;
        let (hq, hk) = (self.q_heads, self.kv_heads);
        let group = hq / hk;
        let iterations = dk + t * dk * (4 + group);
        if iterations > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("LinearAttention over {t} steps of {dk}-dim keys: one GPU invocation per state column would loop {iterations} times")));
        }
        let has_past = inputs.get(3).copied().flatten().is_some();
        let mut buffers = vec![("q", "f32", true), ("k", "f32", true), ("v", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2)];
        for (i, name, on) in [(3, "past", has_past), (4, "decay", decay_width > 0), (5, "beta", beta_width > 0)] {
            if on {
                buffers.push((name, "f32", true));
                bindings.push(Binding::Input(i));
            }
        }
        buffers.extend([("y", "f32", false), ("s", "f32", false)]);
        bindings.extend([Binding::Output(0), Binding::Output(1)]);
        let init = if has_past { "past[base + d * DV]" } else { "0.0" };
        let decay = if decay_width > 0 {
            let idx = if decay_width == 1 { "(row * HK + h)".to_string() } else { "(row * HK + h) * DK + d".to_string() };
            format!("for (var d = 0u; d < DK; d = d + 1u) {{ s[base + d * DV] = s[base + d * DV] * exp(decay[{idx}]); }}")
        } else {
            String::new()
        };
        let delta = if beta_width > 0 {
            let idx = if beta_width == 1 { "row".to_string() } else { "row * HK + h".to_string() };
            format!("var r = 0.0;\n        for (var d = 0u; d < DK; d = d + 1u) {{ r = r + s[base + d * DV] * k[(row * HK + h) * DK + d]; }}\n        vt = beta[{idx}] * (vt - r);")
        } else {
            String::new()
        };
        let body = format!(
            "let m = i % DV;\n    let h = (i / DV) % HK;\n    let bi = i / (DV * HK);\n    let base = (bi * HK + h) * DK * DV + m;\n    \
             for (var d = 0u; d < DK; d = d + 1u) {{ s[base + d * DV] = {init}; }}\n    \
             for (var ti = 0u; ti < T; ti = ti + 1u) {{\n        let row = bi * T + ti;\n        {decay}\n        \
             var vt = v[(row * HK + h) * DV + m];\n        {delta}\n        \
             for (var d = 0u; d < DK; d = d + 1u) {{ s[base + d * DV] = s[base + d * DV] + k[(row * HK + h) * DK + d] * vt; }}\n        \
             for (var g = 0u; g < G; g = g + 1u) {{\n            let hh = h * G + g;\n            var o = 0.0;\n            \
             for (var d = 0u; d < DK; d = d + 1u) {{ o = o + q[(row * HQ + hh) * DK + d] * s[base + d * DV]; }}\n            \
             y[(row * HQ + hh) * DV + m] = scale() * o;\n        }}\n    }}"
        );
        let consts = format!(
            "const DK = {dk}u;\nconst DV = {dv}u;\nconst HK = {hk}u;\nconst HQ = {hq}u;\nconst G = {group}u;\nconst T = {t}u;\nfn scale() -> f32 {{ return {}; }}\n",
            wgsl::literal("f32", self.scale(dk))
        );
        Ok(WgslProgram::single(wgsl::simple_kernel("LinearAttention", b * hk * dv, tune.get(&wgsl::workgroup_param()), &buffers, bindings, &consts, &body)))
    }
}

fn parse(spec: &NodeSpec) -> Result<LinearAttention> {
    let heads = |name: &str| -> Result<usize> {
        let v = spec.int_opt(name)?.ok_or_else(|| spec.bad(name, "the attribute is required"))?;
        usize::try_from(v).ok().filter(|&h| h > 0).ok_or_else(|| spec.bad(name, format!("expected a positive count, found {v}")))
    };
    let (q_heads, kv_heads) = (heads("q_num_heads")?, heads("kv_num_heads")?);
    if q_heads % kv_heads != 0 {
        return Err(spec.bad("q_num_heads", format!("{q_heads} is not a multiple of kv_num_heads {kv_heads}")));
    }
    let (gated, delta) = match spec.string("update_rule", "gated_delta")?.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        r => return Err(spec.bad("update_rule", format!("expected linear, gated, delta or gated_delta, found {r:?}"))),
    };
    Ok(LinearAttention { q_heads, kv_heads, scale: spec.float("scale", 0.0)?, gated, delta })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "LinearAttention", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    /// `((i * 7 + s) % 11) / 10 - 0.5` for i in 0..n, the inputs the reference ran on.
    fn vals(dims: &[usize], s: usize, shift: f32) -> kiln_graph::Tensor {
        let n: usize = dims.iter().product();
        f32s(dims, &(0..n).map(|i| ((i * 7 + s) % 11) as f32 / 10.0 - 0.5 + shift).collect::<Vec<_>>())
    }

    #[test]
    fn gated_delta_with_gqa_matches_onnx_reference() {
        // onnx.reference's LinearAttention (opset 27) on B=1, T=3, 2 query heads over 1
        // kv head, d_k=2, d_v=3, per-key decay, past state, per-head beta.
        let case = Case::new("LinearAttention")
            .opset(27)
            .outputs(2)
            .attrs(&[("q_num_heads", Attr::Int(2)), ("kv_num_heads", Attr::Int(1))])
            .input(vals(&[1, 3, 4], 1, 0.0))
            .input(vals(&[1, 3, 2], 2, 0.0))
            .input(vals(&[1, 3, 3], 3, 0.0))
            .input(vals(&[1, 1, 2, 3], 4, 0.0))
            .input(vals(&[1, 3, 2], 5, 0.0))
            .input(vals(&[1, 3, 1], 6, 0.5));
        let y = [
            -0.018114037811756134, 0.23450687527656555, -0.028787335380911827, 0.06719084084033966, -0.09871598333120346, -0.04744764044880867,
            0.005426186602562666, -0.14627911150455475, 0.021340616047382355, -0.041801128536462784, -0.23546858131885529, 0.09013935178518295,
            -0.00020486529683694243, 0.16076047718524933, 0.010356971994042397, 0.034921932965517044, -0.09408115595579147, -0.0333317369222641,
        ];
        let s = [-0.16365781426429749, -0.3143293261528015, 0.10830407589673996, -0.12346767634153366, 0.3326270878314972, 0.11784548312425613];
        let got = case.run_cpu().unwrap();
        assert_close(&got[0], &y, 1e-5, "output");
        assert_close(&got[1], &s, 1e-5, "present_state");
        // Rules and their inputs must agree: a linear rule forbids decay.
        let linear = case.clone().attr("update_rule", string("linear"));
        assert!(linear.run_cpu().is_err());
    }
}
