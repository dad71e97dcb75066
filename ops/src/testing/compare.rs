//! Comparing results with a reference: per-dtype tolerances on the relative L2 error,
//! non-finite values matched exactly, integers and bools exact.
use kiln_graph::{DType, Tensor};

/// The largest accepted relative L2 error of an output, by its dtype. Integer and bool
/// outputs are always compared exactly, and so are float outputs with tolerance 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub f16: f64,
    pub bf16: f64,
    pub f32: f64,
    pub f64: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::DEFAULT
    }
}

impl Tolerance {
    /// f16 2e-3, bf16 1e-2, f32 1e-5, f64 1e-12.
    pub const DEFAULT: Tolerance = Tolerance { f16: 2e-3, bf16: 1e-2, f32: 1e-5, f64: 1e-12 };
    /// Bit-for-bit (NaN matches NaN): data movement, selection, max/min.
    pub const EXACT: Tolerance = Tolerance { f16: 0.0, bf16: 0.0, f32: 0.0, f64: 0.0 };

    /// The tolerance of outputs of `dtype` (0 for integers and bools).
    pub fn of(&self, dtype: DType) -> f64 {
        match dtype {
            DType::F16 => self.f16,
            DType::BF16 => self.bf16,
            DType::F32 => self.f32,
            DType::F64 => self.f64,
            _ => 0.0,
        }
    }

    /// The same with `dtype`'s tolerance set to `tol`.
    pub fn with(mut self, dtype: DType, tol: f64) -> Tolerance {
        match dtype {
            DType::F16 => self.f16 = tol,
            DType::BF16 => self.bf16 = tol,
            DType::F32 => self.f32 = tol,
            DType::F64 => self.f64 = tol,
            _ => {}
        }
        self
    }

    /// The default with the f32 tolerance set to `tol` (the dtype most tests use).
    pub fn f32(tol: f64) -> Tolerance {
        Tolerance::DEFAULT.with(DType::F32, tol)
    }

    /// For a device that computes every float dtype in f32 (WGSL): no dtype is held
    /// tighter than f32.
    pub fn computed_in_f32(self) -> Tolerance {
        Tolerance { f64: self.f64.max(self.f32), ..self }
    }
}

/// Checks `got` against `want` (dims equal; values within `tol` relative L2 error over
/// the finite elements; every non-finite reference element matched exactly, by NaN or
/// the same infinity). `want` may be wider (an f64 reference for an f32 result).
pub fn compare(got: &Tensor, want: &Tensor, tol: f64) -> Result<(), String> {
    if got.dims() != want.dims() {
        return Err(format!("dims {:?}, want {:?}", got.dims(), want.dims()));
    }
    compare_values(&got.to_f64_vec(), &want.to_f64_vec(), if got.dtype().is_float() { tol } else { 0.0 })
}

/// [`compare`] on values.
pub fn compare_values(got: &[f64], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, want {}", got.len(), want.len()));
    }
    let same = |g: f64, w: f64| g == w || (g.is_nan() && w.is_nan());
    let (mut num, mut den, mut worst, mut wrong) = (0.0f64, 0.0f64, None::<(usize, f64)>, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if tol == 0.0 || !w.is_finite() || !g.is_finite() {
            if !same(g, w) {
                wrong += 1;
                worst.get_or_insert((i, f64::INFINITY));
            }
            continue;
        }
        let d = (g - w).abs();
        num += d * d;
        den += w * w;
        if worst.is_none_or(|(_, e)| d > e) {
            worst = Some((i, d));
        }
    }
    let rel = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
    let (i, _) = worst.unwrap_or((0, 0.0));
    if wrong > 0 {
        return Err(format!("{wrong} of {} elements differ (exact or non-finite), first at {i}: got {}, want {}", got.len(), got[i], want[i]));
    }
    if rel > tol {
        return Err(format!("relative L2 error {rel:e} > {tol:e}; largest difference at {i}: got {}, want {}", got[i], want[i]));
    }
    Ok(())
}

/// Asserts that `got` holds `want` element by element within `tol` relative to
/// max(1, |want|) (NaN matches NaN); `what` names the check.
pub fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerances_and_non_finite_values() {
        let nan = f64::NAN;
        assert!(compare_values(&[1.0, nan, f64::INFINITY], &[1.0, nan, f64::INFINITY], 0.0).is_ok());
        assert!(compare_values(&[1.0, 2.0], &[1.0, nan], 1e-3).is_err(), "NaN must match NaN");
        assert!(compare_values(&[f64::INFINITY], &[f64::NEG_INFINITY], 1.0).is_err());
        assert!(compare_values(&[1.0, 2.0 + 1e-7], &[1.0, 2.0], 1e-5).is_ok());
        assert!(compare_values(&[1.0, 2.1], &[1.0, 2.0], 1e-5).is_err());
        assert!(compare_values(&[1.0, 2.0 + 1e-7], &[1.0, 2.0], 0.0).is_err(), "0 is exact");
        let i = Tensor::from_slice(&[2], &[1i32, 2]).unwrap();
        let near = Tensor::from_slice(&[2], &[1.0f64, 2.0000001]).unwrap();
        assert!(compare(&i, &near, 1e-3).is_err(), "integers are exact whatever the tolerance");
        assert!(compare(&i, &Tensor::from_slice(&[1, 2], &[1i32, 2]).unwrap(), 0.0).is_err(), "dims");
        assert_eq!(Tolerance::DEFAULT.computed_in_f32().of(DType::F64), 1e-5);
        assert_eq!(Tolerance::EXACT.of(DType::F32), 0.0);
    }
}
