//! QLinearAdd (com.microsoft): `C = quantize(A_scale * (A - A_zero_point) + B_scale *
//! (B - B_zero_point))` with C's scale and zero point, broadcasting
//! ([`super::qlinear_binary`]). As onnxruntime 1.32 computes it on x86 (MLAS's SSE2
//! kernel): the ratios `ra = A_scale / C_scale`, `rb = B_scale / C_scale` and the fixed
//! part `C_zp - (ra * A_zp + rb * B_zp)` in f32, then `fixed + a * ra + b * rb` on the
//! raw values, added in that order (B's term first when the broadcasting loop hands B
//! over as a scalar), rounded half to even and saturated. Exact ties of the textbook
//! formula come out of this order slightly off .5, so they do not all round to even.
use super::qlinear::{round_i32, MS_DOMAIN};
use super::qlinear_binary::{Arith, Params, QLinearBinary};
use crate::Registry;

#[derive(Debug)]
pub(super) struct Add;

impl Arith for Add {
    const NAME: &'static str = "QLinearAdd";

    /// `(ra, rb, fixed)`.
    type Consts = (f32, f32, f32);

    fn consts(&self, p: &Params) -> (f32, f32, f32) {
        let (ra, rb) = (p.a.scale / p.c.scale, p.b.scale / p.c.scale);
        (ra, rb, p.c.zp as f32 - (ra * p.a.zp as f32 + rb * p.b.zp as f32))
    }

    #[inline(always)]
    fn eval(&self, a: i32, b: i32, p: &Params, &(ra, rb, fixed): &(f32, f32, f32)) -> i32 {
        let v = if p.b_scalar { (fixed + b as f32 * rb) + a as f32 * ra } else { (fixed + a as f32 * ra) + b as f32 * rb };
        round_i32(v).clamp(p.bounds.0, p.bounds.1)
    }

    #[inline(always)]
    fn unrounded<const B_SCALAR: bool>(&self, a: i32, b: i32, _: &Params, &(ra, rb, fixed): &(f32, f32, f32)) -> f32 {
        if B_SCALAR { (fixed + b as f32 * rb) + a as f32 * ra } else { (fixed + a as f32 * ra) + b as f32 * rb }
    }

    fn wgsl(&self, b_scalar: bool) -> String {
        let sum = if b_scalar { "(fixed + q_mul(f32(b), rb, i)) + q_mul(f32(a), ra, i)" } else { "(fixed + q_mul(f32(a), ra, i)) + q_mul(f32(b), rb, i)" };
        format!("clamp(q_round({sum}), lo, hi)")
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearAdd", |_| Ok(Box::new(QLinearBinary(Add))));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::Tensor;

    /// onnxruntime 1.32's outputs for the same inputs.
    #[test]
    fn matches_onnxruntime() {
        // uint8, B broadcast along rows; saturation at both ends.
        let a = u8s(&[2, 3], &[0, 17, 128, 200, 255, 99]);
        let c = ms("QLinearAdd").input(a).constant(f(0.05)).constant(u8s(&[], &[128])).input(u8s(&[3], &[3, 250, 128]));
        let c = c.constant(f(0.02)).constant(u8s(&[], &[100])).constant(f(0.07)).constant(u8s(&[], &[120]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), [1, 84, 128, 144, 254, 107]);
        // int8 with a one-element B.
        let c = ms("QLinearAdd").input(i8s(&[5], &[-128, -3, 0, 5, 127])).input(f(0.1)).input(i8s(&[], &[-2])).input(i8s(&[1], &[-7]));
        let c = c.input(f(0.3)).input(i8s(&[], &[1])).input(f(0.2)).input(i8s(&[], &[-5]));
        assert_eq!(ints(&c.run_cpu().unwrap()[0]), [-80, -18, -16, -14, 48]);
        // No zero points: [2, 1] + [1, 3] broadcast to [2, 3].
        let c = ms("QLinearAdd").input(u8s(&[2, 1], &[10, 200])).constant(f(0.5)).omitted().input(u8s(&[1, 3], &[1, 50, 255])).constant(f(0.25));
        let y = c.omitted().constant(f(1.5)).run_cpu().unwrap().remove(0);
        assert_eq!((y.dims(), ints(&y)), (&[2usize, 3][..], vec![4, 12, 46, 67, 75, 109]));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let c = ms("QLinearAdd").input(u8s(&[2], &[1, 2])).constant(f(0.1)).omitted().input(i8s(&[2], &[1, 2])).constant(f(0.1)).omitted().constant(f(0.1));
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 3") && e.contains("differs"), "{e}");
        let scales = Tensor::from_vec(&[2], vec![0.1f32, 0.2]).unwrap();
        let c = ms("QLinearAdd").input(u8s(&[2], &[1, 2])).constant(scales).omitted().input(u8s(&[2], &[1, 2])).constant(f(0.1)).omitted().constant(f(0.1));
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 1") && e.contains("per-tensor"), "{e}");
        let c = ms("QLinearAdd").input(u8s(&[2], &[1, 2])).constant(f(0.1)).omitted().input(u8s(&[3], &[1, 2, 3])).constant(f(0.1)).omitted().constant(f(0.1));
        assert!(c.run_cpu().unwrap_err().to_string().contains("broadcast"));
    }
}
