//! Adam (ai.onnx.preview.training 1): with `g' = norm_coefficient x + g`,
//! `v' = alpha v + (1 - alpha) g'`, `h' = beta h + (1 - beta) g'^2`, the rate
//! `r' = r sqrt(1 - beta^t) / (1 - alpha^t)` when `t > 0` (else `r`),
//! `x' = (1 - norm_coefficient_post) (x - r' v' / (sqrt(h') + epsilon))`. An
//! [`Optimizer`] with two states (V, H). Defaults: alpha 0.9, beta 0.999, epsilon 1e-6.
use super::optimizer::{Optimizer, Rule};
use crate::wgsl::literal;
use crate::{NodeSpec, Registry, Result};

#[derive(Debug)]
pub(crate) struct Adam {
    alpha: f32,
    beta: f32,
    epsilon: f32,
    norm: f32,
    norm_post: f32,
}

impl Rule for Adam {
    const NAME: &'static str = "Adam";
    const STATES: usize = 2;

    fn step(&self, r: f64, t: i64, x: f64, g: f64, s: &[f64]) -> (f64, [f64; 2]) {
        let (a, b) = (self.alpha as f64, self.beta as f64);
        let g = self.norm as f64 * x + g;
        let v = a * s[0] + (1.0 - a) * g;
        let h = b * s[1] + (1.0 - b) * g * g;
        let r = if t > 0 { r * (1.0 - b.powf(t as f64)).sqrt() / (1.0 - a.powf(t as f64)) } else { r };
        let x = x - r * (v / (h.sqrt() + self.epsilon as f64));
        ((1.0 - self.norm_post as f64) * x, [v, h])
    }

    fn wgsl(&self) -> String {
        let (a, b) = (literal("f32", self.alpha as f64), literal("f32", self.beta as f64));
        format!(
            "let gr = {n} * x + g;\n    let s0n = {a} * s0 + (1.0 - {a}) * gr;\n    let s1n = {b} * s1 + (1.0 - {b}) * gr * gr;\n    \
             var rr = r;\n    if (t > 0) {{ rr = r * sqrt(1.0 - pow({b}, f32(t))) / (1.0 - pow({a}, f32(t))); }}\n    \
             let xn = (1.0 - {p}) * (x - rr * (s0n / (sqrt(s1n) + {e})));",
            n = literal("f32", self.norm as f64),
            p = literal("f32", self.norm_post as f64),
            e = literal("f32", self.epsilon as f64)
        )
    }
}

fn parse(spec: &NodeSpec) -> Result<Adam> {
    Ok(Adam {
        alpha: spec.float("alpha", 0.9)?,
        beta: spec.float("beta", 0.999)?,
        epsilon: spec.float("epsilon", 1e-6)?,
        norm: spec.float("norm_coefficient", 0.0)?,
        norm_post: spec.float("norm_coefficient_post", 0.0)?,
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.preview.training", "Adam", |spec| Ok(Box::new(Optimizer { rule: parse(spec)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn case(t: i64) -> Case {
        Case::new("Adam")
            .domain("ai.onnx.preview.training")
            .opset(1)
            .outputs(3)
            .attrs(&[("alpha", Attr::Float(0.95)), ("beta", Attr::Float(0.1)), ("epsilon", Attr::Float(1e-7)), ("norm_coefficient", Attr::Float(0.001))])
            .input(Tensor::scalar(0.1f32))
            .input(Tensor::scalar(t))
            .input(f32s(&[2], &[1.2, 2.8]))
            .input(f32s(&[2], &[-0.94, -2.5]))
            .input(f32s(&[2], &[1.7, 3.6]))
            .input(f32s(&[2], &[0.1, 0.1]))
    }

    #[test]
    fn matches_the_update_rule() {
        // onnx's test_adam (expected outputs from onnx.reference), t = 0.
        let got = case(0).run_cpu().unwrap();
        assert_close(&got[0], &[1.025036334991455, 2.6610326766967773], 1e-6, "x");
        assert_close(&got[1], &[1.568060040473938, 3.295139789581299], 1e-6, "v");
        assert_close(&got[2], &[0.8032107949256897, 5.622406959533691], 1e-6, "h");
        // t = 3: the bias-corrected rate r sqrt(1 - 0.1^3) / (1 - 0.95^3), same v and h.
        let got = case(3).run_cpu().unwrap();
        let r = 0.1 * (1.0f64 - 0.001).sqrt() / (1.0 - 0.95f64.powi(3));
        let want: Vec<f64> = [(1.2f64, 1.568060040473938f64, 0.8032107949256897f64), (2.8, 3.295139789581299, 5.622406959533691)]
            .iter()
            .map(|&(x, v, h)| x - r * v / (h.sqrt() + 1e-7))
            .collect();
        assert_close(&got[0], &want, 1e-5, "x at t = 3");
    }
}
