//! Mod, broadcasting, on floats and every integer dtype. `fmod = 0` (the default) is
//! the floored modulo (the result has the sign of the divisor, like Python's `%`);
//! `fmod = 1` is C's `fmod` (truncated: the sign of the dividend). Float special cases
//! follow the opset 28 spec: NaN for an infinite dividend or a zero divisor, and an
//! infinite divisor returns the dividend (floored: the divisor when the signs differ).
//! Integer division by zero is an error on the CPU (like Div) and gives 0 on the GPU.
use super::zip;
use super::binary::map2;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Mod {
    /// C fmod (truncated) instead of the floored modulo.
    pub fmod: bool,
}

impl Mod {
    fn parse(spec: &NodeSpec) -> Result<Mod> {
        match spec.int("fmod", 0)? {
            0 => Ok(Mod { fmod: false }),
            1 => Ok(Mod { fmod: true }),
            v => Err(spec.bad("fmod", format!("expected 0 or 1, found {v}"))),
        }
    }
}

/// Floored modulo of floats (the reference; f32 goes through it too).
pub fn floored_mod_f64(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r == 0.0 {
        0.0f64.copysign(b)
    } else if (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

fn floored_mod_f32(a: f32, b: f32) -> f32 {
    let r = a % b;
    if r == 0.0 {
        0.0f32.copysign(b)
    } else if (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

/// Integer modulo on i64 values (`unsigned64`: the values are u64 bit patterns);
/// `b != 0`.
fn int_mod(a: i64, b: i64, fmod: bool, unsigned64: bool) -> i64 {
    if unsigned64 {
        return ((a as u64) % (b as u64)) as i64;
    }
    let r = a.wrapping_rem(b);
    if !fmod && r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

const DTYPES: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64,
];

impl Op for Mod {
    fn name(&self) -> &str {
        "Mod"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        zip::infer_same_dtype_pair("Mod", inputs, DTYPES)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Mod {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let out = &mut outputs[0];
        let fmod = self.fmod;
        match a.dtype() {
            DType::F32 if fmod => map2(a, b, out, |x: f32, y: f32| x % y),
            DType::F32 => map2(a, b, out, floored_mod_f32),
            DType::F64 if fmod => map2(a, b, out, |x: f64, y: f64| x % y),
            DType::F64 => map2(a, b, out, floored_mod_f64),
            d if d.is_float() => {
                let dims = out.dims().to_vec();
                let fa = Tensor::from_f64(DType::F64, a.dims(), &a.to_f64_vec())?;
                let fb = Tensor::from_f64(DType::F64, b.dims(), &b.to_f64_vec())?;
                let mut tmp = Tensor::zeros(DType::F64, &dims);
                let f = if fmod { |x: f64, y: f64| x % y } else { floored_mod_f64 };
                map2(&fa, &fb, &mut tmp, f)?;
                *out = Tensor::from_f64(d, &dims, tmp.as_slice::<f64>()?)?;
                Ok(())
            }
            d => {
                if b.to_i64_vec()?.contains(&0) {
                    return Err(OpError::input(1, "integer Mod by zero"));
                }
                let unsigned64 = d == DType::U64;
                zip::zip_ints(a, b, out, move |x, y| int_mod(x, y, fmod, unsigned64))
            }
        }
    }
}

/// C fmod for WGSL with the special cases spelled out on the bits (so that no driver
/// shortcut on NaN/inf can change them).
const FMOD_WGSL: &str = "
fn kiln_fmod(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a) & 0x7fffffffu;
    let bb = bitcast<u32>(b) & 0x7fffffffu;
    if (ab >= 0x7f800000u || bb > 0x7f800000u || bb == 0u) { return bitcast<f32>(0x7fc00000u); }
    if (bb == 0x7f800000u) { return a; }
    var r = a % b;
    // Keep the result within (-|b|, |b|) with the dividend's sign even if the driver's
    // remainder is computed through a rounded quotient.
    if (r != 0.0 && ((r < 0.0) != (a < 0.0))) { r = r + select(-abs(b), abs(b), a > 0.0); }
    if (abs(r) >= abs(b)) { r = r - select(-abs(b), abs(b), a > 0.0); }
    return r;
}
fn kiln_floored_mod(a: f32, b: f32) -> f32 {
    let r = kiln_fmod(a, b);
    if (r == 0.0) { return select(0.0, bitcast<f32>(0x80000000u), b < 0.0); }
    if ((r < 0.0) != (b < 0.0)) { return r + b; }
    return r;
}
";

impl WgslKernel for Mod {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let wg = tune.get(&wgsl::workgroup_param());
        let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
        let (helpers, expr) = match wgsl::elem(a.dtype()) {
            "f32" if self.fmod => (FMOD_WGSL, "kiln_fmod(a, b)".to_string()),
            "f32" => (FMOD_WGSL, "kiln_floored_mod(a, b)".to_string()),
            // WGSL's integer % truncates and gives 0 for a zero divisor.
            "i32" if !self.fmod => ("", "select(a % b, a % b + b, a % b != 0 && ((a % b < 0) != (b < 0)))".to_string()),
            _ => ("", "(a % b)".to_string()),
        };
        Ok(WgslProgram::single(zip::binary_kernel("Mod", a, b, &outputs[0], wg, helpers, &expr)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Mod", |spec| Ok(Box::new(Mod::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(fmod: bool, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = Mod { fmod };
        let (ta, tb) = (TensorType::new(a.dtype(), a.dims()), TensorType::new(b.dtype(), b.dims()));
        let args = [Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })];
        let ty = op.infer(&args)?;
        let prog = op.generate(&args, &ty, &TuneValues::default())?;
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(ty[0].dtype, &ty[0].dims)];
        op.run(&[Some(a), Some(b)], &mut out)?;
        Ok(out.remove(0))
    }

    #[test]
    fn integer_signs_follow_the_mode() {
        let a = Tensor::from_slice(&[6], &[-4i32, 7, 5, 4, -7, 8]).unwrap();
        let b = Tensor::from_slice(&[6], &[2i32, -3, 8, -2, 3, 5]).unwrap();
        assert_eq!(run(false, &a, &b).unwrap().as_slice::<i32>().unwrap(), &[0, -2, 5, 0, 2, 3]);
        assert_eq!(run(true, &a, &b).unwrap().as_slice::<i32>().unwrap(), &[0, 1, 5, 0, -1, 3]);
        let a8 = Tensor::from_slice(&[2], &[-128i8, 127]).unwrap();
        let b8 = Tensor::from_slice(&[2], &[-1i8, -128]).unwrap();
        assert_eq!(run(false, &a8, &b8).unwrap().as_slice::<i8>().unwrap(), &[0, -1]);
        let u = Tensor::from_slice(&[2], &[u64::MAX, 10]).unwrap();
        let v = Tensor::from_slice(&[1], &[7u64]).unwrap();
        assert_eq!(run(false, &u, &v).unwrap().as_slice::<u64>().unwrap(), &[u64::MAX % 7, 3]);
    }

    #[test]
    fn floats_match_the_reference_with_special_values() {
        let inf = f32::INFINITY;
        let a = [0.0f32, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, inf, -inf, 1.0, 1.0, f32::NAN, 5.5, -4.3, 7.2];
        let b = [-2.0f32, 2.0, 2.0, -2.0, inf, inf, -inf, -inf, 2.0, 2.0, 0.0, -0.0, 1.0, f32::NAN, 2.1, -3.4];
        let (ta, tb) = (Tensor::from_slice(&[16], &a).unwrap(), Tensor::from_slice(&[16], &b).unwrap());
        let floored = run(false, &ta, &tb).unwrap();
        let want = [-0.0f64, 0.0, 0.0, -0.0, inf as f64, 3.0, -1.0, -inf as f64, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN];
        for (i, (&g, &w)) in floored.as_slice::<f32>().unwrap().iter().zip(&want).enumerate() {
            assert!((w.is_nan() && g.is_nan()) || (g as f64 == w && g.is_sign_negative() == w.is_sign_negative()), "{i}: {g} vs {w}");
        }
        for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
            let g = floored.as_slice::<f32>().unwrap()[i] as f64;
            let w = floored_mod_f64(x as f64, y as f64);
            assert!((w.is_nan() && g.is_nan()) || g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0), "{x} mod {y}: {g} vs {w}");
        }
        let t = run(true, &ta, &tb).unwrap();
        let got = t.as_slice::<f32>().unwrap();
        assert!((got[14] - (-0.1)).abs() < 1e-5 && (got[15] - 0.4).abs() < 1e-5 && got[4] == -3.0 && got[8].is_nan());
        let h = Tensor::from_f64(DType::F16, &[2], &[-4.5, 7.0]).unwrap();
        let h2 = Tensor::from_f64(DType::F16, &[1], &[2.0]).unwrap();
        assert_eq!(run(false, &h, &h2).unwrap().to_f64_vec(), vec![1.5, 1.0]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let a = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
        let z = Tensor::from_slice(&[1], &[0i64]).unwrap();
        assert!(run(false, &a, &z).is_err(), "division by zero");
        let f = Tensor::from_slice(&[2], &[1f32, 2.]).unwrap();
        assert!(run(false, &a, &f).is_err(), "mixed dtypes");
        let b = Tensor::from_bools(&[1], &[true]).unwrap();
        assert!(run(false, &b, &b).is_err(), "bool");
        assert!(run(false, &Tensor::from_slice(&[3], &[1i64, 2, 3]).unwrap(), &a).is_err(), "shapes");
    }
}
