//! GRU (gates z, r, h stacked in W, R and B in that order):
//!
//! ```text
//! zt = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz)
//! rt = f(Xt Wr^T + Ht-1 Rr^T + Wbr + Rbr)
//! ht = g(Xt Wh^T + (rt (.) Ht-1) Rh^T + Rbh + Wbh)      linear_before_reset = 0
//! ht = g(Xt Wh^T + rt (.) (Ht-1 Rh^T + Rbh) + Wbh)      linear_before_reset = 1
//! Ht = (1 - zt) (.) ht + zt (.) Ht-1
//! ```
//!
//! Without linear_before_reset the product with Rh needs every unit's reset gate
//! first: two products per step on the CPU, two dispatches per step in WGSL.
use super::common::{Cell, CellSpec, Recurrent};
use super::recurrence_cpu::{add_into, Real, Step};
use super::recurrence_wgsl::{Phase, Source, WgslCtx};
use crate::{Registry, Result};

#[derive(Clone, Debug)]
pub(crate) struct GruCell {
    pub linear_before_reset: bool,
}

impl Cell for GruCell {
    const SPEC: CellSpec = CellSpec { name: "GRU", gates: "zrh", activations: &["Sigmoid", "Tanh"], max_outputs: 2, has_cell_state: false };

    fn rb_inside(&self, g: usize) -> bool {
        self.linear_before_reset && g == 2
    }

    fn extra_regions(&self) -> usize {
        if self.linear_before_reset { 0 } else { 2 }
    }

    fn step<T: Real>(&self, st: &mut Step<T>) -> Result<()> {
        let ctx = &st.ctx;
        let (hs, batch) = (ctx.dims.hidden, ctx.dims.batch);
        let one = T::of(1.0);
        // z and r in gates[..batch * 2 * hs] (and h's product after them with
        // linear_before_reset), rows of 2 * hs (3 * hs).
        let width = if self.linear_before_reset { 3 } else { 2 };
        ctx.recurrent(st.h, 0, width, st.gates)?;
        let (zr, hh) = st.gates.split_at_mut(batch * width * hs);
        for (b, row) in ctx.rows.iter().enumerate() {
            let reset = &mut st.extra[b * hs..(b + 1) * hs];
            let Some(row) = *row else {
                reset.fill(T::default());
                continue;
            };
            let g = &mut zr[b * width * hs..(b + 1) * width * hs];
            add_into(&mut g[..hs], ctx.xw(row, 0));
            add_into(&mut g[hs..2 * hs], ctx.xw(row, 1));
            ctx.activate(0, &mut g[..2 * hs]);
            let h = &st.h[b * hs..(b + 1) * hs];
            if self.linear_before_reset {
                // ht's input: xw + r (.) (H Rh^T + Rbh), in g[2 * hs..].
                let (zr_b, hb) = g.split_at_mut(2 * hs);
                let (xh, rbh) = (ctx.xw(row, 2), &ctx.rb[2 * hs..]);
                for k in 0..hs {
                    hb[k] = xh[k] + zr_b[hs + k] * (hb[k] + rbh[k]);
                }
            } else {
                for k in 0..hs {
                    reset[k] = g[hs + k] * h[k];
                }
            }
        }
        if !self.linear_before_reset {
            ctx.recurrent(st.extra, 2, 3, hh)?;
        }
        for (b, row) in ctx.rows.iter().enumerate() {
            let Some(row) = *row else { continue };
            let (z, rest) = zr[b * width * hs..(b + 1) * width * hs].split_at_mut(hs);
            let cand = if self.linear_before_reset {
                &mut rest[hs..]
            } else {
                let c = &mut hh[b * hs..(b + 1) * hs];
                add_into(c, ctx.xw(row, 2));
                c
            };
            ctx.activate(1, cand);
            let h = &mut st.h[b * hs..(b + 1) * hs];
            for k in 0..hs {
                h[k] = (one - z[k]) * cand[k] + z[k] * h[k];
            }
        }
        Ok(())
    }

    fn phases(&self, w: &WgslCtx) -> Vec<Phase> {
        let pre = |g: usize| format!("{} + acc{g}{}", w.xw(g), w.biases(g));
        let gates = format!("let z = {};\n    let rg = {};\n    ", w.act(0, &pre(0)), w.act(0, &pre(1)));
        let update = format!("let h_new = (1.0 - z) * hh + z * {};", w.h_prev());
        if self.linear_before_reset {
            let hh = w.act(1, &format!("{} + rg * (acc2 + {}) + {}", w.xw(2), w.rb(2), w.wb(2)));
            let body = format!("{gates}let hh = {hh};\n    {update}");
            return vec![Phase { label: "gates", gates: vec![0, 1, 2], source: Source::Hidden, body }];
        }
        let first = format!("{gates}{} = z;\n    {} = rg * {};", w.extra(0), w.extra(1), w.h_prev());
        let second = format!("let z = {};\n    let hh = {};\n    {update}", w.extra(0), w.act(1, &pre(2)));
        vec![
            Phase { label: "update and reset gates", gates: vec![0, 1], source: Source::Hidden, body: first },
            Phase { label: "hidden gate", gates: vec![2], source: Source::Extra(1), body: second },
        ]
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GRU", |spec| {
        let cell = GruCell { linear_before_reset: spec.int("linear_before_reset", 0)? != 0 };
        Ok(Box::new(Recurrent::parse(spec, cell)?))
    });
}

#[cfg(test)]
mod tests {
    use super::super::reference::{self, Kind, Opts};
    use kiln_graph::Attr;

    #[test]
    fn every_direction_layout_and_reset_mode() {
        for lbr in [false, true] {
            for direction in ["forward", "reverse", "bidirectional"] {
                for layout in [0, 1] {
                    for (opts, lens) in [(Opts::NONE, None), (Opts::ALL, Some(vec![3, 0, 5])), (Opts::ALL, None)] {
                        reference::check(Kind::Gru { linear_before_reset: lbr }, direction, layout, (5, 3, 4, 7), opts, lens, &[]);
                    }
                }
            }
        }
    }

    #[test]
    fn clip_and_activations() {
        let acts = Attr::Strings(["Relu", "Softsign", "HardSigmoid", "Tanh"].map(String::from).to_vec());
        for lbr in [false, true] {
            let attrs = [("clip", Attr::Float(0.5)), ("activations", acts.clone()), ("activation_alpha", Attr::Floats(vec![0.25])), ("activation_beta", Attr::Floats(vec![0.45]))];
            reference::check(Kind::Gru { linear_before_reset: lbr }, "bidirectional", 1, (4, 2, 3, 5), Opts::ALL, Some(vec![1, 4]), &attrs);
        }
    }

    #[test]
    fn output_subsets_and_dtypes() {
        for outputs in 1..=2 {
            reference::check_outputs(Kind::Gru { linear_before_reset: false }, outputs);
        }
        reference::check_dtypes(Kind::Gru { linear_before_reset: true });
    }

    #[test]
    fn bad_inputs_are_errors() {
        reference::check_errors(Kind::Gru { linear_before_reset: false });
    }
}
