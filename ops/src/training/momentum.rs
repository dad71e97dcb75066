//! Momentum (ai.onnx.preview.training 1): with `g' = norm_coefficient x + g` and
//! `beta' = beta` when `t > 0` (1 at the first step), `v' = alpha v + beta' g'`;
//! `mode` `standard`: `x' = x - r v'`, `nesterov`: `x' = x - r (g' + alpha v')`. An
//! [`Optimizer`] with one state (V).
use super::optimizer::{Optimizer, Rule};
use crate::wgsl::literal;
use crate::{NodeSpec, Registry, Result};

#[derive(Debug)]
pub(crate) struct Momentum {
    alpha: f32,
    beta: f32,
    norm: f32,
    nesterov: bool,
}

impl Rule for Momentum {
    const NAME: &'static str = "Momentum";
    const STATES: usize = 1;

    fn step(&self, r: f64, t: i64, x: f64, g: f64, s: &[f64]) -> (f64, [f64; 2]) {
        let (a, b) = (self.alpha as f64, if t > 0 { self.beta as f64 } else { 1.0 });
        let g = self.norm as f64 * x + g;
        let v = a * s[0] + b * g;
        let x = if self.nesterov { x - r * (g + a * v) } else { x - r * v };
        (x, [v, 0.0])
    }

    fn wgsl(&self) -> String {
        let a = literal("f32", self.alpha as f64);
        let update = if self.nesterov { format!("x - r * (gr + {a} * s0n)") } else { "x - r * s0n".into() };
        format!(
            "let gr = {n} * x + g;\n    let bb = select(1.0, {b}, t > 0);\n    let s0n = {a} * s0 + bb * gr;\n    let xn = {update};",
            n = literal("f32", self.norm as f64),
            b = literal("f32", self.beta as f64)
        )
    }
}

fn parse(spec: &NodeSpec) -> Result<Momentum> {
    let nesterov = match spec.string("mode", "standard")?.as_str() {
        "standard" => false,
        "nesterov" => true,
        m => return Err(spec.bad("mode", format!("expected standard or nesterov, found {m:?}"))),
    };
    let req = |name: &str| spec.float_opt(name)?.ok_or_else(|| spec.bad(name, "the attribute is required"));
    Ok(Momentum { alpha: req("alpha")?, beta: req("beta")?, norm: req("norm_coefficient")?, nesterov })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.preview.training", "Momentum", |spec| Ok(Box::new(Optimizer { rule: parse(spec)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn case(mode: &str, beta: f32, norm: f32, t: i64) -> Case {
        Case::new("Momentum")
            .domain("ai.onnx.preview.training")
            .opset(1)
            .outputs(2)
            .attrs(&[("alpha", Attr::Float(0.95)), ("beta", Attr::Float(beta)), ("norm_coefficient", Attr::Float(norm)), ("mode", string(mode))])
            .input(Tensor::scalar(0.1f32))
            .input(Tensor::scalar(t))
            .input(f32s(&[2], &[1.2, 2.8]))
            .input(f32s(&[2], &[-0.94, -2.5]))
            .input(f32s(&[2], &[1.7, 3.6]))
    }

    #[test]
    fn standard_and_nesterov_match_onnx() {
        // onnx's test_momentum and test_nesterov_momentum (onnx.reference outputs), t = 0.
        let got = case("standard", 0.1, 0.001, 0).run_cpu().unwrap();
        assert_close(&got[0], &[1.1323800086975098, 2.7077200412750244], 1e-6, "x");
        assert_close(&got[1], &[0.6762000322341919, 0.922799825668335], 1e-6, "v");
        let got = case("nesterov", 1.0, 0.01, 0).run_cpu().unwrap();
        assert_close(&got[0], &[1.2275350093841553, 2.9571399688720703], 1e-6, "nesterov x");
        assert_close(&got[1], &[0.687000036239624, 0.9479999542236328], 1e-6, "nesterov v");
        // t > 0 scales the gradient by beta: v' = 0.95 v + 0.1 g'.
        let got = case("standard", 0.1, 0.0, 2).run_cpu().unwrap();
        assert_close(&got[1], &[0.95 * 1.7 - 0.094, 0.95 * 3.6 - 0.25], 1e-6, "v at t = 2");
        assert!(case("sideways", 0.1, 0.0, 0).run_cpu().is_err());
    }
}
