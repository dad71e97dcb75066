//! WGSL functions that elementwise expressions call where WGSL has no builtin (erf) or
//! the drivers' builtins are coarse, undefined outside their domains, or not
//! NaN-propagating (max/min, also used by pooling and reductions).

/// erf for WGSL, which has none: Abramowitz & Stegun 7.1.26 (absolute error below
/// 1.5e-7, under f32 rounding of the result for |erf| near 1).
pub(super) const ERF_WGSL: &str = "
fn kiln_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - p * exp(-a * a));
}
";

/// softplus for WGSL that neither overflows (large x) nor loses `log(1 + e)` for tiny `e`.
pub(super) const SOFTPLUS_WGSL: &str = "
fn kiln_softplus(x: f32) -> f32 {
    let e = exp(-abs(x));
    let l = select(log(1.0 + e), e * (1.0 - e * (0.5 - e / 3.0)), e < 1e-3);
    return max(x, 0.0) + l;
}
";

/// asin/acos for WGSL through atan2, NaN outside [-1, 1].
pub(super) const INVERSE_TRIG_WGSL: &str = "
fn kiln_asin(x: f32) -> f32 {
    if (!(abs(x) <= 1.0)) { return bitcast<f32>(0x7fc00000u); }
    return atan2(x, sqrt((1.0 - x) * (1.0 + x)));
}
fn kiln_acos(x: f32) -> f32 {
    if (!(abs(x) <= 1.0)) { return bitcast<f32>(0x7fc00000u); }
    return atan2(sqrt((1.0 - x) * (1.0 + x)), x);
}
";

/// asinh/acosh/atanh for WGSL through logarithms, with NaN outside their domains and
/// no overflow of `x * x` for large |x| (the builtins are undefined outside the domain).
pub(super) const INVERSE_HYPERBOLIC_WGSL: &str = "
fn kiln_asinh(x: f32) -> f32 {
    let a = abs(x);
    var r: f32;
    if (a > 1e4) {
        r = log(a) + 0.69314718;
    } else if (a < 1e-3) {
        r = a * (1.0 - a * a / 6.0);
    } else {
        r = log(a + sqrt(a * a + 1.0));
    }
    return select(r, -r, x < 0.0);
}
fn kiln_acosh(x: f32) -> f32 {
    if (!(x >= 1.0)) { return bitcast<f32>(0x7fc00000u); }
    if (x > 1e4) { return log(x) + 0.69314718; }
    return log(x + sqrt((x - 1.0) * (x + 1.0)));
}
fn kiln_atanh(x: f32) -> f32 {
    let a = abs(x);
    if (!(a <= 1.0)) { return bitcast<f32>(0x7fc00000u); }
    var r: f32;
    if (a < 1e-3) {
        r = a * (1.0 + a * a / 3.0);
    } else {
        r = 0.5 * log((1.0 + a) / (1.0 - a));
    }
    return select(r, -r, x < 0.0);
}
";

/// WGSL test for NaN on the bits of `x` (an f32 expression), so no driver fast-math
/// folds it away.
pub(crate) fn wgsl_isnan(x: &str) -> String {
    format!("((bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u)")
}

/// NaN-propagating max of two f32 WGSL expressions (WGSL's `max` may return either
/// operand when one is NaN): NaN if either is, as ONNX's Max, MaxPool and ReduceMax.
pub(crate) fn wgsl_max(a: &str, b: &str) -> String {
    format!("select(max({a}, {b}), {a} + {b}, {} || {})", wgsl_isnan(a), wgsl_isnan(b))
}

/// NaN-propagating min of two f32 WGSL expressions (see [`wgsl_max`]).
pub(crate) fn wgsl_min(a: &str, b: &str) -> String {
    format!("select(min({a}, {b}), {a} + {b}, {} || {})", wgsl_isnan(a), wgsl_isnan(b))
}
