//! QLinearLeakyRelu (com.microsoft, attribute `alpha`, default 0.01): `Y =
//! quantize(leaky_relu(dequantize(X)))` through onnxruntime's lookup table
//! ([`super::qlinear_lookup`]): `x >= 0 ? x : alpha * x` in f32.
use super::qlinear::MS_DOMAIN;
use super::qlinear_lookup::{QLinearLookup, Transform};
use crate::wgsl;
use crate::Registry;

#[derive(Debug)]
pub(super) struct LeakyRelu {
    alpha: f32,
}

impl Transform for LeakyRelu {
    const NAME: &'static str = "QLinearLeakyRelu";

    fn apply(&self, x: f32) -> f32 {
        if x >= 0.0 { x } else { self.alpha * x }
    }

    fn wgsl(&self) -> String {
        format!("let v = select({} * d, d, d >= 0.0);", wgsl::literal("f32", self.alpha as f64))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearLeakyRelu", |spec| Ok(Box::new(QLinearLookup(LeakyRelu { alpha: spec.float("alpha", 0.01)? }))));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::Attr;

    /// onnxruntime 1.32's QLinearLeakyRelu of every byte.
    const U8: [i64; 256] = [
        18, 18, 18, 18, 18, 18, 18, 18, 18, 19, 19, 19, 19, 19, 19, 19, 19, 20, 20, 20, 20, 20, 20, 20, 20,
        21, 21, 21, 21, 21, 21, 21, 22, 22, 22, 22, 22, 22, 22, 22, 22, 23, 23, 23, 23, 23, 23, 23, 23, 24,
        24, 24, 24, 24, 24, 24, 24, 25, 25, 25, 25, 25, 25, 25, 25, 26, 26, 26, 26, 26, 26, 26, 26, 27, 27,
        27, 27, 27, 27, 27, 28, 28, 28, 28, 28, 28, 28, 28, 28, 29, 29, 29, 29, 29, 29, 29, 29, 30, 30, 30,
        30, 31, 32, 34, 35, 36, 38, 39, 40, 41, 42, 44, 45, 46, 48, 49, 50, 51, 53, 54, 55, 56, 58, 59, 60,
        61, 63, 64, 65, 66, 68, 69, 70, 71, 73, 74, 75, 76, 78, 79, 80, 81, 83, 84, 85, 86, 88, 89, 90, 91,
        92, 94, 95, 96, 98, 99, 100, 101, 103, 104, 105, 106, 108, 109, 110, 111, 112, 114, 115, 116, 118,
        119, 120, 121, 122, 124, 125, 126, 128, 129, 130, 131, 132, 134, 135, 136, 138, 139, 140, 141, 142,
        144, 145, 146, 148, 149, 150, 151, 153, 154, 155, 156, 158, 159, 160, 161, 163, 164, 165, 166, 168,
        169, 170, 171, 173, 174, 175, 176, 178, 179, 180, 181, 182, 184, 185, 186, 188, 189, 190, 191, 192,
        194, 195, 196, 198, 199, 200, 201, 202, 204, 205, 206, 208, 209, 210, 211, 213, 214, 215, 216, 218,
        219, 220, 221, 223, 224,
    ];
    const I8: [i64; 256] = [
        -22, -21, -21, -21, -20, -20, -19, -18, -16, -15, -14, -13, -12, -10, -9, -8, -7, -6, -4, -3, -2, -1,
        0, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 26, 27, 28, 29, 30, 32,
        33, 34, 35, 36, 38, 39, 40, 41, 42, 44, 45, 46, 47, 48, 50, 51, 52, 53, 54, 56, 57, 58, 59, 60, 62,
        63, 64, 65, 66, 68, 69, 70, 71, 72, 74, 75, 76, 77, 78, 80, 81, 82, 83, 84, 86, 87, 88, 89, 90, 92,
        93, 94, 95, 96, 98, 99, 100, 101, 102, 104, 105, 106, 107, 108, 110, 111, 112, 113, 114, 116, 117,
        118, 119, 120, 122, 123, 124, 125, 126, -68, -68, -67, -67, -66, -66, -66, -65, -65, -65, -64, -64,
        -64, -63, -63, -62, -62, -62, -61, -61, -61, -60, -60, -60, -59, -59, -59, -58, -58, -57, -57, -57,
        -56, -56, -56, -55, -55, -55, -54, -54, -53, -53, -53, -52, -52, -52, -51, -51, -51, -50, -50, -50,
        -49, -49, -48, -48, -48, -47, -47, -47, -46, -46, -46, -45, -45, -44, -44, -44, -43, -43, -43, -42,
        -42, -42, -41, -41, -41, -40, -40, -39, -39, -39, -38, -38, -38, -37, -37, -37, -36, -36, -35, -35,
        -35, -34, -34, -34, -33, -33, -33, -32, -32, -32, -31, -31, -30, -30, -30, -29, -29, -29, -28, -28,
        -28, -27, -27, -26, -26, -26, -25, -25, -25, -24, -24, -24, -23, -23, -23, -22,
    ];

    #[test]
    fn matches_onnxruntime_on_every_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let signed: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
        let c = ms("QLinearLeakyRelu").attr("alpha", Attr::Float(0.1)).input(u8s(&[256], &bytes));
        let c = c.constant(f(0.05)).constant(u8s(&[], &[100])).constant(f(0.04)).constant(u8s(&[], &[30]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), U8);
        let c = ms("QLinearLeakyRelu").attr("alpha", Attr::Float(0.3)).input(i8s(&[256], &signed));
        let c = c.input(f(0.03)).input(i8s(&[], &[5])).input(f(0.025)).input(i8s(&[], &[-20]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), I8);
    }

    #[test]
    fn bad_inputs_are_errors() {
        // The zero point must have X's dtype; X must be 8-bit.
        let c = ms("QLinearLeakyRelu").input(u8s(&[2], &[1, 2])).constant(f(0.1)).constant(i8s(&[], &[0])).constant(f(0.1));
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 2"), "{e}");
        let c = ms("QLinearLeakyRelu").input(kiln_graph::Tensor::scalar(1.0f32)).constant(f(0.1)).omitted().constant(f(0.1));
        assert!(c.run_cpu().unwrap_err().to_string().contains("input 0"));
    }
}
