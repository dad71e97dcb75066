//! QLinearMul (com.microsoft): `C = quantize((A - A_zero_point) * (B - B_zero_point) *
//! A_scale * B_scale)` with C's scale and zero point, broadcasting
//! ([`super::qlinear_binary`]). As MLAS computes it on x86: the product of the shifted
//! integers exact, times the ratio `A_scale * B_scale / C_scale` (in f32, in that
//! order), plus C's zero point in f32, then rounded half to even and saturated.
use super::qlinear::{requantize, MS_DOMAIN};
use super::qlinear_binary::{Arith, Params, QLinearBinary};
use crate::Registry;

#[derive(Debug)]
pub(super) struct Mul;

impl Arith for Mul {
    const NAME: &'static str = "QLinearMul";

    /// `A_scale * B_scale / C_scale`.
    type Consts = f32;

    fn consts(&self, p: &Params) -> f32 {
        p.a.scale * p.b.scale / p.c.scale
    }

    #[inline(always)]
    fn eval(&self, a: i32, b: i32, p: &Params, &ratio: &f32) -> i32 {
        let product = (a - p.a.zp) * (b - p.b.zp);
        requantize(product as f32 * ratio + p.c.zp as f32, 0, p.bounds)
    }

    #[inline(always)]
    fn unrounded<const B_SCALAR: bool>(&self, a: i32, b: i32, p: &Params, &ratio: &f32) -> f32 {
        ((a - p.a.zp) * (b - p.b.zp)) as f32 * ratio + p.c.zp as f32
    }

    fn wgsl(&self, _: bool) -> String {
        "q_requantize(q_mul(f32((a - za) * (b - zb)), q_div(sa * sb, sc), i) + f32(zc), 0i, lo, hi)".into()
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearMul", |_| Ok(Box::new(QLinearBinary(Mul))));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;

    /// onnxruntime 1.32's outputs for the same inputs (those of QLinearAdd's test).
    #[test]
    fn matches_onnxruntime() {
        let a = u8s(&[2, 3], &[0, 17, 128, 200, 255, 99]);
        let c = ms("QLinearMul").input(a).constant(f(0.05)).constant(u8s(&[], &[128])).input(u8s(&[3], &[3, 250, 128]));
        let c = c.constant(f(0.02)).constant(u8s(&[], &[100])).constant(f(0.07)).constant(u8s(&[], &[120]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), [255, 0, 120, 20, 255, 108]);
        let c = ms("QLinearMul").input(i8s(&[5], &[-128, -3, 0, 5, 127])).input(f(0.1)).input(i8s(&[], &[-2])).input(i8s(&[1], &[-7]));
        let c = c.input(f(0.3)).input(i8s(&[], &[1])).input(f(0.2)).input(i8s(&[], &[-5]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), [127, -4, -7, -13, -128]);
        let c = ms("QLinearMul").input(u8s(&[2, 1], &[10, 200])).constant(f(0.5)).omitted().input(u8s(&[1, 3], &[1, 50, 255])).constant(f(0.25));
        assert_eq!(ints(&c.omitted().constant(f(1.5)).run_cpu().unwrap()[0]), [1, 42, 212, 17, 255, 255]);
    }
}
