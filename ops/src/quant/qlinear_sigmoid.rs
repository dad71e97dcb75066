//! QLinearSigmoid (com.microsoft): `Y = quantize(sigmoid(dequantize(X)))` through
//! onnxruntime's lookup table ([`super::qlinear_lookup`]). The sigmoid is MLAS's
//! (`MlasComputeLogistic`, its FMA3 kernel on x86): the input clamped to [-18, 18], an
//! odd rational polynomial `p(x) / q(x) + 0.5` in Horner form with fused multiply-adds,
//! clamped below at 0 — not `1 / (1 + exp(-x))`, which differs in the last bits.
use super::qlinear::MS_DOMAIN;
use super::qlinear_lookup::{QLinearLookup, Transform};
use crate::wgsl;
use crate::Registry;

/// MLAS's logistic constants: the clamp range, then p's and q's coefficients (as MLAS
/// writes them: parsed to the same f32 values).
const RANGE: f32 = 18.0;
#[allow(clippy::excessive_precision)]
const P: [f32; 5] = [4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03, 2.48287947061529e-01];
#[allow(clippy::excessive_precision)]
const Q: [f32; 6] = [6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01];

/// MLAS's logistic function.
pub(super) fn logistic(x: f32) -> f32 {
    let x = x.clamp(-RANGE, RANGE);
    let x2 = x * x;
    let p = P[2..].iter().fold(x2.mul_add(P[0], P[1]), |p, &c| x2.mul_add(p, c)) * x;
    let q = Q[2..].iter().fold(x2.mul_add(Q[0], Q[1]), |q, &c| x2.mul_add(q, c));
    (p / q + 0.5).max(0.0)
}

#[derive(Debug)]
pub(super) struct Sigmoid;

impl Transform for Sigmoid {
    const NAME: &'static str = "QLinearSigmoid";

    fn apply(&self, x: f32) -> f32 {
        logistic(x)
    }

    fn wgsl(&self) -> String {
        let l = |v: f32| wgsl::literal("f32", v as f64);
        let mut s = format!("let c = clamp(d, {}, {});\n    let x2 = c * c;\n    var p = fma(x2, {}, {});\n", l(-RANGE), l(RANGE), l(P[0]), l(P[1]));
        for &c in &P[2..] {
            s += &format!("    p = fma(x2, p, {});\n", l(c));
        }
        s += &format!("    var q = fma(x2, {}, {});\n", l(Q[0]), l(Q[1]));
        for &c in &Q[2..] {
            s += &format!("    q = fma(x2, q, {});\n", l(c));
        }
        s + "    let v = max(0.0, q_div(c * p, q) + 0.5);"
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearSigmoid", |_| Ok(Box::new(QLinearLookup(Sigmoid))));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use crate::testing::Input;

    /// onnxruntime 1.32's QLinearSigmoid of every byte (scale 1/256 and zero point 0 is
    /// what its quantization tools give a sigmoid's output).
    const U8: [i64; 256] = [
        0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
        2, 2, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 8, 8, 8, 9, 9, 10, 10, 11,
        11, 12, 12, 13, 13, 14, 15, 15, 16, 17, 18, 19, 19, 20, 21, 22, 23, 24, 26, 27, 28, 29, 31, 32, 33,
        35, 36, 38, 40, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 62, 64, 66, 69, 71, 74, 77, 79, 82, 85, 88,
        91, 94, 97, 100, 103, 106, 109, 112, 115, 118, 122, 125, 128, 131, 134, 138, 141, 144, 147, 150, 153,
        156, 159, 162, 165, 168, 171, 174, 177, 179, 182, 185, 187, 190, 192, 194, 197, 199, 201, 203, 205,
        207, 209, 211, 213, 215, 216, 218, 220, 221, 223, 224, 225, 227, 228, 229, 230, 232, 233, 234, 235,
        236, 237, 237, 238, 239, 240, 241, 241, 242, 243, 243, 244, 244, 245, 245, 246, 246, 247, 247, 248,
        248, 248, 249, 249, 250, 250, 250, 250, 251, 251, 251, 251, 252, 252, 252, 252, 252, 253, 253, 253,
        253, 253, 253, 253, 254, 254, 254, 254, 254, 254, 254, 254, 254, 254, 255, 255, 255, 255, 255, 255,
        255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    ];
    /// int8, bytes 0..=255 read as int8 (0..127, then -128..-1).
    const I8: [i64; 256] = [
        50, 55, 59, 64, 68, 71, 75, 78, 81, 84, 87, 89, 92, 94, 96, 97, 99, 101, 102, 103, 104, 105, 106,
        107, 108, 109, 109, 110, 111, 111, 112, 112, 112, 113, 113, 113, 113, 114, 114, 114, 114, 114, 115,
        115, 115, 115, 115, 115, 115, 115, 115, 115, 115, 115, 115, 116, 116, 116, 116, 116, 116, 116, 116,
        116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116,
        116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116,
        116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116, 116,
        116, 116, 116, 116, 116, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
        -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
        -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
        -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -127, -127, -127, -127, -127, -127,
        -127, -127, -127, -127, -127, -126, -126, -126, -126, -126, -125, -125, -125, -124, -124, -124, -123,
        -123, -122, -122, -121, -120, -119, -118, -117, -116, -115, -114, -113, -111, -109, -108, -106, -104,
        -101, -99, -96, -93, -90, -87, -84, -80, -76, -72, -67, -62, -57, -52, -47, -42, -36, -30, -24, -18,
        -12, -6, 0, 6, 12, 18, 24, 29, 35, 40, 45,
    ];

    #[test]
    fn matches_onnxruntime_on_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let signed: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
        // Constant parameters (the table is baked into the WGSL) and run-time ones.
        for constant in [true, false] {
            let p = |t: kiln_graph::Tensor| if constant { Input::Const(t) } else { Input::Data(t) };
            let c = ms("QLinearSigmoid").input(u8s(&[256], &bytes)).inputs([p(f(0.05)), p(u8s(&[], &[128])), p(f(1.0 / 256.0)), p(u8s(&[], &[0]))]);
            assert_eq!(ints(&c.run_cpu().unwrap()[0]), U8);
            let c = ms("QLinearSigmoid").input(i8s(&[16, 16], &signed)).inputs([p(f(0.1)), p(i8s(&[], &[-10])), p(f(0.0041)), p(i8s(&[], &[-128]))]);
            assert_eq!(ints(&c.run_cpu().unwrap()[0]), I8);
        }
    }

    #[test]
    fn the_logistic_is_mlas_s() {
        // The polynomial, not 1 / (1 + exp(-x)): close, but not the same bits.
        for x in [-20.0f32, -3.3, -0.5, 0.0, 0.7, 2.0, 9.0] {
            let exact = 1.0 / (1.0 + (-x as f64).exp());
            assert!((super::logistic(x) as f64 - exact).abs() < 2e-7, "{x}");
        }
        assert_eq!(super::logistic(0.0), 0.5);
    }
}
