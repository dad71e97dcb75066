//! Adagrad (ai.onnx.preview.training 1): with `g' = norm_coefficient x + g`,
//! `h' = h + g'^2` and the decayed rate `r' = r / (1 + t decay_factor)`,
//! `x' = x - r' g' / (sqrt(h') + epsilon)`. An [`Optimizer`] with one state (H).
use super::optimizer::{Optimizer, Rule};
use crate::{NodeSpec, Registry, Result};

#[derive(Debug)]
pub(crate) struct Adagrad {
    decay: f32,
    epsilon: f32,
    norm: f32,
}

impl Rule for Adagrad {
    const NAME: &'static str = "Adagrad";
    const STATES: usize = 1;

    fn step(&self, r: f64, t: i64, x: f64, g: f64, s: &[f64]) -> (f64, [f64; 2]) {
        let r = r / (1.0 + t as f64 * self.decay as f64);
        let g = self.norm as f64 * x + g;
        let h = s[0] + g * g;
        (x - r * g / (h.sqrt() + self.epsilon as f64), [h, 0.0])
    }

    fn wgsl(&self) -> String {
        format!(
            "let rr = r / (1.0 + f32(t) * {d});\n    let gr = {n} * x + g;\n    let s0n = s0 + gr * gr;\n    let xn = x - rr * gr / (sqrt(s0n) + {e});",
            d = crate::wgsl::literal("f32", self.decay as f64),
            n = crate::wgsl::literal("f32", self.norm as f64),
            e = crate::wgsl::literal("f32", self.epsilon as f64)
        )
    }
}

fn parse(spec: &NodeSpec) -> Result<Adagrad> {
    Ok(Adagrad { decay: spec.float("decay_factor", 0.0)?, epsilon: spec.float("epsilon", 0.0)?, norm: spec.float("norm_coefficient", 0.0)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.preview.training", "Adagrad", |spec| Ok(Box::new(Optimizer { rule: parse(spec)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn matches_the_update_rule() {
        // onnx's test_adagrad (its expected outputs from onnx.reference): r = 0.1, t = 0,
        // x = 1, g = -1, h = 2 -> x' = 1.0576962, h' = 2.998001.
        let case = Case::new("Adagrad")
            .domain("ai.onnx.preview.training")
            .opset(1)
            .outputs(2)
            .attrs(&[("decay_factor", Attr::Float(0.1)), ("epsilon", Attr::Float(1e-5)), ("norm_coefficient", Attr::Float(0.001))])
            .input(Tensor::scalar(0.1f32))
            .input(Tensor::scalar(0i64))
            .input(f32s(&[1], &[1.0]))
            .input(f32s(&[1], &[-1.0]))
            .input(f32s(&[1], &[2.0]));
        let got = case.run_cpu().unwrap();
        assert_close(&got[0], &[1.0576962232589722], 1e-6, "x");
        assert_close(&got[1], &[2.9980010986328125], 1e-6, "h");
    }
}
