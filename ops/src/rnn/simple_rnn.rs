//! RNN, the simple recurrent op: `Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi)`.
use super::common::{Cell, CellSpec, Recurrent};
use super::recurrence_cpu::{add_into, Real, Step};
use super::recurrence_wgsl::{Phase, Source, WgslCtx};
use crate::{Registry, Result};

#[derive(Clone, Debug)]
pub(crate) struct SimpleCell;

impl Cell for SimpleCell {
    const SPEC: CellSpec = CellSpec { name: "RNN", gates: "i", activations: &["Tanh"], max_outputs: 2, has_cell_state: false };

    fn step<T: Real>(&self, st: &mut Step<T>) -> Result<()> {
        let ctx = &st.ctx;
        let hs = ctx.dims.hidden;
        ctx.recurrent(st.h, 0, 1, st.gates)?;
        for (b, row) in ctx.rows.iter().enumerate() {
            let Some(row) = *row else { continue };
            let g = &mut st.gates[b * hs..(b + 1) * hs];
            add_into(g, ctx.xw(row, 0));
            ctx.activate(0, g);
            st.h[b * hs..(b + 1) * hs].copy_from_slice(g);
        }
        Ok(())
    }

    fn phases(&self, w: &WgslCtx) -> Vec<Phase> {
        let body = format!("let h_new = {};", w.act(0, &format!("{} + acc0{}", w.xw(0), w.biases(0))));
        vec![Phase { label: "gates", gates: vec![0], source: Source::Hidden, body }]
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RNN", |spec| Ok(Box::new(Recurrent::parse(spec, SimpleCell)?)));
}

#[cfg(test)]
mod tests {
    use super::super::reference::{self, Kind, Opts};
    use kiln_graph::Attr;

    #[test]
    fn every_direction_layout_and_optional_input() {
        for direction in ["forward", "reverse", "bidirectional"] {
            for layout in [0, 1] {
                for (opts, lens) in [(Opts::NONE, None), (Opts::ALL, Some(vec![3, 0, 5])), (Opts::ALL, None)] {
                    reference::check(Kind::Rnn, direction, layout, (5, 3, 4, 7), opts, lens, &[]);
                }
            }
        }
    }

    #[test]
    fn activations_and_clip() {
        for (act, alpha, beta) in [("Relu", vec![], vec![]), ("Affine", vec![0.7], vec![-0.2]), ("Elu", vec![0.6], vec![]), ("Softplus", vec![], vec![]), ("ThresholdedRelu", vec![0.1], vec![])] {
            let attrs = [
                ("activations", Attr::Strings(vec![act.to_string()])),
                ("activation_alpha", Attr::Floats(alpha)),
                ("activation_beta", Attr::Floats(beta)),
                ("clip", Attr::Float(1.5)),
            ];
            reference::check(Kind::Rnn, "bidirectional", 0, (4, 3, 2, 5), Opts::ALL, Some(vec![4, 1, 3]), &attrs);
        }
    }

    #[test]
    fn output_subsets_and_dtypes() {
        for outputs in 1..=2 {
            reference::check_outputs(Kind::Rnn, outputs);
        }
        reference::check_dtypes(Kind::Rnn);
    }

    #[test]
    fn bad_inputs_are_errors() {
        reference::check_errors(Kind::Rnn);
    }

    /// A case small enough to check by hand: one unit, two steps, tanh.
    #[test]
    fn hand_computed() {
        use crate::testing::{f32s, Case};
        let case = Case::new("RNN").opset(14).attr("hidden_size", Attr::Int(1)).input(f32s(&[2, 1, 1], &[1.0, 2.0]));
        let case = case.constant(f32s(&[1, 1, 1], &[0.5])).constant(f32s(&[1, 1, 1], &[-1.0])).constant(f32s(&[1, 2], &[0.25, -0.25]));
        let out = case.outputs(2).run_cpu().unwrap();
        // h1 = tanh(0.5 * 1 + 0) = tanh(0.5); h2 = tanh(0.5 * 2 - h1).
        let h1 = 0.5f64.tanh();
        let h2 = (1.0 - h1).tanh();
        let y = out[0].to_f64_vec();
        assert!((y[0] - h1).abs() < 1e-6 && (y[1] - h2).abs() < 1e-6, "{y:?} vs [{h1}, {h2}]");
        assert!((out[1].to_f64_vec()[0] - h2).abs() < 1e-6);
    }
}
