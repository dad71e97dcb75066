//! The unary elementwise ops, one table entry each: the ONNX name and attributes, the
//! dtypes (an `int` function makes the op accept integers), whether the graph compiler
//! may fuse it as an epilogue activation, the scalar function (compiled for f32 and
//! f64), and the WGSL expression. Adding a unary op is one entry here plus its test;
//! `unary_table.rs` has the entry syntax, `unary_op.rs` the kernels that run any kind.
//!
//! NaN propagates as onnxruntime does: every max/min/clamp below is written with
//! comparisons that keep a NaN input (WGSL's `max`, `min` and `clamp` do not promise
//! to), except where the ONNX formula itself maps NaN to a number (ThresholdedRelu,
//! Shrink: `x > alpha` is false).
use super::unary_table::{lit, unary_ops, BindAs, Param, Real};
use super::unary_wgsl::{wgsl_isnan, ERF_WGSL, INVERSE_HYPERBOLIC_WGSL, INVERSE_TRIG_WGSL, SOFTPLUS_WGSL};
use crate::{NodeSpec, Result};
use kiln_graph::DType;

pub(super) const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
pub(super) const NUMBERS: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64,
];

/// `sqrt(2 / pi)`, the scale inside Gelu's tanh approximation.
const GELU_TANH_SCALE: f64 = 0.797_884_560_802_865_4;

/// `expr` of the f32 WGSL expression `x`, or `x` itself when it is NaN. The test reads
/// the bits: GL drivers rewrite compare-and-select into max/min, which lose the NaN.
fn keep_nan(x: &str, expr: &str) -> String {
    format!("select({expr}, {x}, {})", wgsl_isnan(x))
}

/// WGSL of `max(x, lo)` then `min(., hi)` that keeps a NaN `x` (see [`Real::clip`]).
fn clip_wgsl(x: &str, lo: &str, hi: &str) -> String {
    let v = format!("select({x}, {lo}, {x} < {lo})");
    keep_nan(x, &format!("select({v}, {hi}, {v} > {hi})"))
}

/// Clip's WGSL for element type `ty` between the WGSL values `lo` and `hi`.
pub(super) fn clip_expr(x: &str, lo: &str, hi: &str, ty: &str) -> String {
    if ty == "f32" { clip_wgsl(x, lo, hi) } else { format!("min(max({x}, {lo}), {hi})") }
}

/// Shrink on integers: compared in f64; an integral bias is applied exactly.
fn shrink_i64(x: i64, bias: f32, lambd: f32) -> i64 {
    let (xf, b) = (x as f64, bias as f64);
    if xf < -(lambd as f64) {
        if b.fract() == 0.0 { x.wrapping_add(b as i64) } else { (xf + b) as i64 }
    } else if xf > lambd as f64 {
        if b.fract() == 0.0 { x.wrapping_sub(b as i64) } else { (xf - b) as i64 }
    } else {
        0
    }
}

/// Shrink's WGSL. On integers: compared in f32; an integral bias is added exactly in
/// the integer type.
fn shrink_wgsl(x: &str, ty: &str, bias: f32, lambd: f32) -> String {
    let l = |v: f32| lit(ty, v);
    if ty == "f32" {
        return format!("select(select(0.0, {x} - {b}, {x} > {hi}), {x} + {b}, {x} < {lo})", b = l(bias), hi = l(lambd), lo = l(-lambd));
    }
    let (lo, hi) = (lit("f32", -lambd), lit("f32", lambd));
    let (below, above) = if bias.fract() == 0.0 {
        (format!("({x} + {})", l(bias)), format!("({x} - {})", l(bias)))
    } else {
        let b = lit("f32", bias);
        (format!("{ty}(f32({x}) + {b})"), format!("{ty}(f32({x}) - {b})"))
    };
    format!("select(select({}, {above}, f32({x}) > {hi}), {below}, f32({x}) < {lo})", l(0.0))
}

unary_ops! {
    Relu act: true, int: |x| x.max(0),
        f: |x| if x < 0.0 { 0.0 } else { x },
        wgsl: |x, ty| if ty == "f32" { keep_nan(x, &format!("max({x}, 0.0)")) } else { format!("max({x}, {})", lit(ty, 0.0)) };
    LeakyRelu { alpha: f32 = 0.01 } act: true,
        f: |x| if x >= 0.0 { x } else { alpha * x },
        wgsl: |x, ty| format!("select({} * {x}, {x}, {x} >= 0.0)", lit(ty, alpha));
    /// min/max come from attributes (opset < 11) or inputs 1 and 2.
    Clip { min: f32 = f32::NEG_INFINITY, max: f32 = f32::INFINITY } act: true,
        int: |x| {
            let lo = if min.is_finite() { min as i64 } else { i64::MIN };
            let hi = if max.is_finite() { max as i64 } else { i64::MAX };
            x.max(lo).min(hi)
        },
        f: |x| x.clip(min, max),
        wgsl: |x, ty| clip_expr(x, &lit(ty, min), &lit(ty, max), ty);
    Sigmoid act: true,
        f: |x| x.sigmoid(),
        wgsl: |x, ty| format!("(1.0 / (1.0 + exp(-{x})))");
    HardSigmoid { alpha: f32 = 0.2, beta: f32 = 0.5 } act: true,
        f: |x| (alpha * x + beta).clamp(0.0, 1.0),
        wgsl: |x, ty| clip_wgsl(&format!("({} * {x} + {})", lit(ty, alpha), lit(ty, beta)), "0.0", "1.0");
    HardSwish act: true,
        f: |x| x * ((x / 6.0 + 0.5).max(0.0).min(1.0)),
        wgsl: |x, ty| format!("({x} * {})", clip_wgsl(&format!("({x} / 6.0 + 0.5)"), "0.0", "1.0"));
    // tanh of a clamped argument: WGSL's tanh may return NaN for large |x| (and GL's
    // returns -1 for NaN).
    Tanh act: true,
        f: |x| x.tanh_fast(),
        wgsl: |x, ty| keep_nan(x, &format!("tanh({})", clip_wgsl(x, "-15.0", "15.0")));
    Exp act: false, f: |x| x.exp(), wgsl: |x, ty| format!("exp({x})");
    Log act: false, f: |x| x.ln(), wgsl: |x, ty| format!("log({x})");
    Sqrt act: false, f: |x| x.sqrt(), wgsl: |x, ty| format!("sqrt({x})");
    Neg act: false, int: |x| x.wrapping_neg(), f: |x| -x, wgsl: |x, ty| format!("(-{x})");
    Abs act: false, int: |x| x.wrapping_abs(), f: |x| x.abs(), wgsl: |x, ty| format!("abs({x})");
    Reciprocal act: false, f: |x| 1.0 / x, wgsl: |x, ty| format!("(1.0 / {x})");
    Floor act: false, f: |x| x.floor(), wgsl: |x, ty| format!("floor({x})");
    Ceil act: false, f: |x| x.ceil(), wgsl: |x, ty| format!("ceil({x})");
    Sin act: false, f: |x| x.sin(), wgsl: |x, ty| format!("sin({x})");
    Cos act: false, f: |x| x.cos(), wgsl: |x, ty| format!("cos({x})");
    Softplus act: true,
        f: |x| if x > 20.0 { x } else { x.exp().ln_1p() },
        wgsl: |x, ty| format!("select(log(1.0 + exp({x})), {x}, {x} > 20.0)");
    Softsign act: false, f: |x| x / (1.0 + x.abs()), wgsl: |x, ty| format!("({x} / (1.0 + abs({x})))");
    Elu { alpha: f32 = 1.0 } act: true,
        f: |x| if x >= 0.0 { x } else { alpha * (x.exp() - 1.0) },
        wgsl: |x, ty| format!("select({} * (exp({x}) - 1.0), {x}, {x} >= 0.0)", lit(ty, alpha));
    Selu { alpha: f32 = 1.673_263_2, gamma: f32 = 1.050_701 } act: true,
        f: |x| gamma * if x > 0.0 { x } else { alpha * (x.exp() - 1.0) },
        wgsl: |x, ty| format!("({} * select({} * (exp({x}) - 1.0), {x}, {x} > 0.0))", lit(ty, gamma), lit(ty, alpha));
    // WGSL's sign may map NaN to 0: selects keep it.
    Sign act: false, int: |x| x.signum(),
        f: |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x },
        wgsl: |x, ty| if ty == "f32" {
            format!("select(select({x}, -1.0, {x} < 0.0), 1.0, {x} > 0.0)")
        } else {
            format!("sign({x})")
        };
    Erf act: false, helpers: ERF_WGSL, f: |x| x.erf_fast(), wgsl: |x, ty| format!("kiln_erf({x})");
    Round act: false, f: |x| x.round_ties_even(), wgsl: |x, ty| format!("round({x})");
    Tan act: false, f: |x| x.tan(), wgsl: |x, ty| format!("tan({x})");
    // Through atan2: the drivers' asin/acos approximations are coarse (~1e-4).
    Asin act: false, helpers: INVERSE_TRIG_WGSL, f: |x| x.asin(), wgsl: |x, ty| format!("kiln_asin({x})");
    Acos act: false, helpers: INVERSE_TRIG_WGSL, f: |x| x.acos(), wgsl: |x, ty| format!("kiln_acos({x})");
    Atan act: false, f: |x| x.atan(), wgsl: |x, ty| format!("atan({x})");
    Sinh act: false, f: |x| x.sinh(), wgsl: |x, ty| format!("sinh({x})");
    Cosh act: false, f: |x| x.cosh(), wgsl: |x, ty| format!("cosh({x})");
    Asinh act: false, helpers: INVERSE_HYPERBOLIC_WGSL, f: |x| x.asinh(), wgsl: |x, ty| format!("kiln_asinh({x})");
    Acosh act: false, helpers: INVERSE_HYPERBOLIC_WGSL, f: |x| x.acosh(), wgsl: |x, ty| format!("kiln_acosh({x})");
    // On |x| so that ln_1p does not cancel near x = -1 (std's atanh does).
    Atanh act: false, helpers: INVERSE_HYPERBOLIC_WGSL,
        f: |x| (0.5 * ((2.0 * x.abs()) / (1.0 - x.abs())).ln_1p()).copysign(x),
        wgsl: |x, ty| format!("kiln_atanh({x})");
    // x * tanh(softplus(x)), softplus written to neither overflow nor cancel.
    Mish act: false, helpers: SOFTPLUS_WGSL,
        f: |x| x * (x.max(0.0) + (-x.abs()).exp().ln_1p()).tanh(),
        wgsl: |x, ty| format!("({x} * tanh({}))", clip_wgsl(&format!("kiln_softplus({x})"), "-15.0", "15.0"));
    // max(x, 0) + min(alpha * (exp(x / alpha) - 1), 0), which is one branch or the
    // other for either sign of alpha, written so that NaN stays NaN.
    Celu { alpha: f32 = 1.0 } act: false,
        parse: |spec: &NodeSpec| {
            let alpha = spec.float("alpha", 1.0)?;
            if alpha == 0.0 {
                return Err(spec.bad("alpha", "Celu's alpha must not be 0"));
            }
            Ok(UnaryKind::Celu { alpha })
        },
        f: |x| if x > 0.0 { x } else { alpha * ((x / alpha).exp() - 1.0) },
        wgsl: |x, ty| format!("select({a} * (exp({x} / {a}) - 1.0), {x}, {x} > 0.0)", a = lit(ty, alpha));
    ThresholdedRelu { alpha: f32 = 1.0 } act: false,
        f: |x| if x > alpha { x } else { 0.0 },
        wgsl: |x, ty| format!("select(0.0, {x}, {x} > {})", lit(ty, alpha));
    /// `x + bias` below `-lambd`, `x - bias` above `lambd`, 0 between.
    Shrink { bias: f32 = 0.0, lambd: f32 = 0.5 } act: false,
        int: |x| shrink_i64(x, bias, lambd),
        f: |x| if x < -lambd { x + bias } else if x > lambd { x - bias } else { 0.0 },
        wgsl: |x, ty| shrink_wgsl(x, ty, bias, lambd);
    /// `x * sigmoid(alpha * x)`.
    Swish { alpha: f32 = 1.0 } act: false,
        f: |x| x / (1.0 + (-alpha * x).exp()),
        wgsl: |x, ty| format!("({x} / (1.0 + exp({} * {x})))", lit(ty, -alpha));
    /// Exact (erf) or, with `tanh`, the tanh approximation.
    Gelu { tanh: bool = false } act: true,
        parse: |spec: &NodeSpec| match spec.string("approximate", "none")?.as_str() {
            "none" => Ok(UnaryKind::Gelu { tanh: false }),
            "tanh" => Ok(UnaryKind::Gelu { tanh: true }),
            other => Err(spec.bad("approximate", format!("expected \"none\" or \"tanh\", found \"{other}\""))),
        },
        helpers: ERF_WGSL,
        f: |x| if tanh {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh_fast())
        } else {
            0.5 * x * (1.0 + (x * 0.707_106_781_186_547_524_400_844_362_104_849_039).erf_fast())
        },
        wgsl: |x, ty| if tanh {
            let arg = format!("{} * ({x} + 0.044715 * {x} * {x} * {x})", lit(ty, GELU_TANH_SCALE as f32));
            format!("(0.5 * {x} * (1.0 + tanh({})))", clip_wgsl(&format!("({arg})"), "-15.0", "15.0"))
        } else {
            format!("(0.5 * {x} * (1.0 + kiln_erf({x} * 0.70710678118654752)))")
        };
}
