//! LSTM (gates i, o, f, c stacked in W, R and B in that order):
//!
//! ```text
//! it = f(Xt Wi^T + Ht-1 Ri^T + Pi (.) Ct-1 + Wbi + Rbi)
//! ft = f(Xt Wf^T + Ht-1 Rf^T + Pf (.) Ct-1 + Wbf + Rbf)     (1 - it with input_forget)
//! ct = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
//! Ct = ft (.) Ct-1 + it (.) ct
//! ot = f(Xt Wo^T + Ht-1 Ro^T + Po (.) Ct + Wbo + Rbo)
//! Ht = ot (.) h(Ct)
//! ```
//!
//! `clip` bounds the inputs of f and g; `h(Ct)` is not clipped (as onnxruntime).
use super::common::{Cell, CellSpec, Recurrent};
use super::recurrence_cpu::{add_into, Real, Step};
use super::recurrence_wgsl::{Phase, Source, WgslCtx};
use crate::{Registry, Result};

#[derive(Clone, Debug)]
pub(crate) struct LstmCell {
    /// Couples the forget gate to the input gate: `ft = 1 - it`.
    pub input_forget: bool,
}

impl Cell for LstmCell {
    const SPEC: CellSpec = CellSpec { name: "LSTM", gates: "iofc", activations: &["Sigmoid", "Tanh", "Tanh"], max_outputs: 3, has_cell_state: true };

    fn step<T: Real>(&self, st: &mut Step<T>) -> Result<()> {
        let ctx = &st.ctx;
        let hs = ctx.dims.hidden;
        ctx.recurrent(st.h, 0, 4, st.gates)?;
        for (b, row) in ctx.rows.iter().enumerate() {
            let Some(row) = *row else { continue };
            let g = &mut st.gates[b * 4 * hs..(b + 1) * 4 * hs];
            for k in 0..4 {
                add_into(&mut g[k * hs..(k + 1) * hs], ctx.xw(row, k));
            }
            let (gi, rest) = g.split_at_mut(hs);
            let (go, rest) = rest.split_at_mut(hs);
            let (gf, gc) = rest.split_at_mut(hs);
            let c = &mut st.c[b * hs..(b + 1) * hs];
            if let Some(p) = ctx.p {
                for k in 0..hs {
                    gi[k] = gi[k] + p[k] * c[k];
                    gf[k] = gf[k] + p[2 * hs + k] * c[k];
                }
            }
            ctx.activate(0, gi);
            if self.input_forget {
                gf.iter_mut().zip(gi.iter()).for_each(|(f, &i)| *f = T::of(1.0) - i);
            } else {
                ctx.activate(0, gf);
            }
            ctx.activate(1, gc);
            for k in 0..hs {
                c[k] = gf[k] * c[k] + gi[k] * gc[k];
            }
            if let Some(p) = ctx.p {
                for k in 0..hs {
                    go[k] = go[k] + p[hs + k] * c[k];
                }
            }
            ctx.activate(0, go);
            gc.copy_from_slice(c);
            ctx.activate_unclipped(2, gc);
            let h = &mut st.h[b * hs..(b + 1) * hs];
            for k in 0..hs {
                h[k] = go[k] * gc[k];
            }
        }
        Ok(())
    }

    fn phases(&self, w: &WgslCtx) -> Vec<Phase> {
        let pre = |g: usize| format!("{} + acc{g}{}", w.xw(g), w.biases(g));
        let peep = |k: usize, c: &str| w.peephole(k).map_or(String::new(), |p| format!(" + {p} * {c}"));
        let forget = if self.input_forget { "1.0 - gi".to_string() } else { w.act(0, &format!("{}{}", pre(2), peep(2, "c_prev"))) };
        let body = format!(
            "let c_prev = {c};\n    let gi = {i};\n    let gf = {forget};\n    let gc = {g};\n    let c_new = gf * c_prev + gi * gc;\n    {c} = c_new;\n    let go = {o};\n    let h_new = go * {h};",
            c = w.c(),
            i = w.act(0, &format!("{}{}", pre(0), peep(0, "c_prev"))),
            g = w.act(1, &pre(3)),
            o = w.act(0, &format!("{}{}", pre(1), peep(1, "c_new"))),
            h = w.act_unclipped(2, "c_new"),
        );
        vec![Phase { label: "gates", gates: vec![0, 1, 2, 3], source: Source::Hidden, body }]
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "LSTM", |spec| {
        let cell = LstmCell { input_forget: spec.int("input_forget", 0)? != 0 };
        Ok(Box::new(Recurrent::parse(spec, cell)?))
    });
    r.register("com.microsoft", "DynamicQuantizeLSTM", |spec| {
        let cell = LstmCell { input_forget: spec.int("input_forget", 0)? != 0 };
        Ok(Box::new(Recurrent { quantized: true, ..Recurrent::parse(spec, cell)? }))
    });
}

#[cfg(test)]
mod tests {
    use super::super::reference::{self, Kind};
    use kiln_graph::Attr;

    #[test]
    fn every_direction_layout_and_optional_input() {
        for direction in ["forward", "reverse", "bidirectional"] {
            for layout in [0, 1] {
                for (opts, lens) in [(reference::Opts::NONE, None), (reference::Opts::ALL, Some(vec![3, 0, 5])), (reference::Opts::ALL, None)] {
                    reference::check(Kind::Lstm { input_forget: false }, direction, layout, (5, 3, 4, 7), opts, lens, &[]);
                }
            }
        }
    }

    #[test]
    fn peepholes_clip_input_forget_and_activations() {
        let kind = Kind::Lstm { input_forget: true };
        reference::check(kind, "bidirectional", 0, (4, 2, 3, 5), reference::Opts::ALL, Some(vec![4, 2]), &[("clip", Attr::Float(0.7))]);
        let acts = Attr::Strings(["HardSigmoid", "LeakyRelu", "ScaledTanh", "Affine", "Elu", "Softsign"].map(String::from).to_vec());
        let attrs = [("activations", acts), ("activation_alpha", Attr::Floats(vec![0.3, 0.2, 1.5, 0.8, 0.9])), ("activation_beta", Attr::Floats(vec![0.4, 0.6, -0.1]))];
        reference::check(Kind::Lstm { input_forget: false }, "bidirectional", 1, (3, 2, 4, 6), reference::Opts::ALL, None, &attrs);
        let acts = Attr::Strings(["Sigmoid", "ThresholdedRelu", "Softplus"].map(String::from).to_vec());
        reference::check(Kind::Lstm { input_forget: false }, "reverse", 0, (3, 2, 4, 6), reference::Opts::ALL, Some(vec![2, 3]), &[("activations", acts)]);
    }

    #[test]
    fn output_subsets_and_dtypes() {
        for outputs in 1..=3 {
            reference::check_outputs(Kind::Lstm { input_forget: false }, outputs);
        }
        reference::check_dtypes(Kind::Lstm { input_forget: false });
    }

    #[test]
    fn bad_inputs_are_errors() {
        reference::check_errors(Kind::Lstm { input_forget: false });
    }
}
