//! Unary elementwise ops: Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, HardSwish, Tanh,
//! Exp, Log, Sqrt, Neg, Abs, Reciprocal, Floor, Ceil, Round, Sin, Cos, Tan, Asin, Acos,
//! Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Softplus, Softsign, Elu, Selu, Celu,
//! ThresholdedRelu, Shrink, Swish, Gelu, Mish, Sign, Erf. One variant per op: its CPU
//! function (for f32 and f64, and for integers where the op is defined on them) and its
//! WGSL expression of `x`.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use super::unary_wgsl::{ERF_WGSL, INVERSE_HYPERBOLIC_WGSL, INVERSE_TRIG_WGSL, SOFTPLUS_WGSL};
use kiln_graph::{DType, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryKind {
    Relu,
    LeakyRelu { alpha: f32 },
    /// min/max come from attributes (opset < 11) or inputs 1 and 2.
    Clip { min: f32, max: f32 },
    Sigmoid,
    HardSigmoid { alpha: f32, beta: f32 },
    HardSwish,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Neg,
    Abs,
    Reciprocal,
    Floor,
    Ceil,
    Sin,
    Cos,
    Softplus,
    Softsign,
    Elu { alpha: f32 },
    Selu { alpha: f32, gamma: f32 },
    Sign,
    Erf,
    Round,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Mish,
    Celu { alpha: f32 },
    ThresholdedRelu { alpha: f32 },
    /// `x + bias` below `-lambd`, `x - bias` above `lambd`, 0 between.
    Shrink { bias: f32, lambd: f32 },
    /// `x * sigmoid(alpha * x)`.
    Swish { alpha: f32 },
    /// Exact (erf) or, with `tanh`, the tanh approximation.
    Gelu { tanh: bool },
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];
const NUMBERS: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64,
];

/// Expands `$use` once per parameterless kind with `$f` bound to that kind's scalar
/// function (a concrete closure, so loops over it vectorise).
macro_rules! with_float_fn {
    ($kind:expr, $x:ident, $t:ty, $f:ident => $use:expr) => {{
        match $kind {
            UnaryKind::Relu => {
                let $f = |$x: $t| if $x > 0.0 { $x } else { 0.0 };
                $use
            }
            UnaryKind::Sigmoid => {
                let $f = |$x: $t| 1.0 / (1.0 + (-$x).exp());
                $use
            }
            UnaryKind::HardSwish => {
                let $f = |$x: $t| $x * (($x / 6.0 + 0.5).max(0.0).min(1.0));
                $use
            }
            UnaryKind::Tanh => {
                let $f = |$x: $t| $x.tanh();
                $use
            }
            UnaryKind::Exp => {
                let $f = |$x: $t| $x.exp();
                $use
            }
            UnaryKind::Log => {
                let $f = |$x: $t| $x.ln();
                $use
            }
            UnaryKind::Sqrt => {
                let $f = |$x: $t| $x.sqrt();
                $use
            }
            UnaryKind::Neg => {
                let $f = |$x: $t| -$x;
                $use
            }
            UnaryKind::Abs => {
                let $f = |$x: $t| $x.abs();
                $use
            }
            UnaryKind::Reciprocal => {
                let $f = |$x: $t| 1.0 / $x;
                $use
            }
            UnaryKind::Floor => {
                let $f = |$x: $t| $x.floor();
                $use
            }
            UnaryKind::Ceil => {
                let $f = |$x: $t| $x.ceil();
                $use
            }
            UnaryKind::Sin => {
                let $f = |$x: $t| $x.sin();
                $use
            }
            UnaryKind::Cos => {
                let $f = |$x: $t| $x.cos();
                $use
            }
            UnaryKind::Softplus => {
                let $f = |$x: $t| if $x > 20.0 { $x } else { $x.exp().ln_1p() };
                $use
            }
            UnaryKind::Softsign => {
                let $f = |$x: $t| $x / (1.0 + $x.abs());
                $use
            }
            UnaryKind::Sign => {
                let $f = |$x: $t| if $x > 0.0 { 1.0 } else if $x < 0.0 { -1.0 } else { $x };
                $use
            }
            UnaryKind::Round => {
                let $f = |$x: $t| $x.round_ties_even();
                $use
            }
            UnaryKind::Tan => {
                let $f = |$x: $t| $x.tan();
                $use
            }
            UnaryKind::Asin => {
                let $f = |$x: $t| $x.asin();
                $use
            }
            UnaryKind::Acos => {
                let $f = |$x: $t| $x.acos();
                $use
            }
            UnaryKind::Atan => {
                let $f = |$x: $t| $x.atan();
                $use
            }
            UnaryKind::Sinh => {
                let $f = |$x: $t| $x.sinh();
                $use
            }
            UnaryKind::Cosh => {
                let $f = |$x: $t| $x.cosh();
                $use
            }
            UnaryKind::Asinh => {
                let $f = |$x: $t| $x.asinh();
                $use
            }
            UnaryKind::Acosh => {
                let $f = |$x: $t| $x.acosh();
                $use
            }
            UnaryKind::Atanh => {
                // On |x| so that ln_1p does not cancel near x = -1 (std's atanh does).
                let $f = |$x: $t| (0.5 * ((2.0 * $x.abs()) / (1.0 - $x.abs())).ln_1p()).copysign($x);
                $use
            }
            UnaryKind::Mish => {
                // x * tanh(softplus(x)), softplus written to neither overflow nor cancel.
                let $f = |$x: $t| $x * ($x.max(0.0) + (-$x.abs()).exp().ln_1p()).tanh();
                $use
            }
            _ => unreachable!("parameterised kinds are handled by the caller"),
        }
    }};
}

impl UnaryKind {
    /// The ONNX op type of this kind.
    pub fn op_name(&self) -> &'static str {
        match self {
            UnaryKind::Relu => "Relu",
            UnaryKind::LeakyRelu { .. } => "LeakyRelu",
            UnaryKind::Clip { .. } => "Clip",
            UnaryKind::Sigmoid => "Sigmoid",
            UnaryKind::HardSigmoid { .. } => "HardSigmoid",
            UnaryKind::HardSwish => "HardSwish",
            UnaryKind::Tanh => "Tanh",
            UnaryKind::Exp => "Exp",
            UnaryKind::Log => "Log",
            UnaryKind::Sqrt => "Sqrt",
            UnaryKind::Neg => "Neg",
            UnaryKind::Abs => "Abs",
            UnaryKind::Reciprocal => "Reciprocal",
            UnaryKind::Floor => "Floor",
            UnaryKind::Ceil => "Ceil",
            UnaryKind::Sin => "Sin",
            UnaryKind::Cos => "Cos",
            UnaryKind::Softplus => "Softplus",
            UnaryKind::Erf => "Erf",
            UnaryKind::Softsign => "Softsign",
            UnaryKind::Elu { .. } => "Elu",
            UnaryKind::Selu { .. } => "Selu",
            UnaryKind::Sign => "Sign",
            UnaryKind::Round => "Round",
            UnaryKind::Tan => "Tan",
            UnaryKind::Asin => "Asin",
            UnaryKind::Acos => "Acos",
            UnaryKind::Atan => "Atan",
            UnaryKind::Sinh => "Sinh",
            UnaryKind::Cosh => "Cosh",
            UnaryKind::Asinh => "Asinh",
            UnaryKind::Acosh => "Acosh",
            UnaryKind::Atanh => "Atanh",
            UnaryKind::Mish => "Mish",
            UnaryKind::Celu { .. } => "Celu",
            UnaryKind::ThresholdedRelu { .. } => "ThresholdedRelu",
            UnaryKind::Shrink { .. } => "Shrink",
            UnaryKind::Swish { .. } => "Swish",
            UnaryKind::Gelu { .. } => "Gelu",
        }
    }

    /// The kind's parameters, in a fixed order (see [`UnaryKind::from_name_params`]).
    pub fn params(&self) -> Vec<f32> {
        match *self {
            UnaryKind::LeakyRelu { alpha }
            | UnaryKind::Elu { alpha }
            | UnaryKind::Celu { alpha }
            | UnaryKind::ThresholdedRelu { alpha }
            | UnaryKind::Swish { alpha } => vec![alpha],
            UnaryKind::Shrink { bias, lambd } => vec![bias, lambd],
            UnaryKind::Gelu { tanh } => vec![tanh as u8 as f32],
            UnaryKind::Clip { min, max } => vec![min, max],
            UnaryKind::HardSigmoid { alpha, beta } => vec![alpha, beta],
            UnaryKind::Selu { alpha, gamma } => vec![alpha, gamma],
            _ => vec![],
        }
    }

    /// The kind of op type `name` with `params` (as [`UnaryKind::params`] gives them).
    pub fn from_name_params(name: &str, params: &[f32]) -> Option<UnaryKind> {
        let p = |i: usize| params.get(i).copied();
        Some(match name {
            "Relu" => UnaryKind::Relu,
            "LeakyRelu" => UnaryKind::LeakyRelu { alpha: p(0)? },
            "Clip" => UnaryKind::Clip { min: p(0)?, max: p(1)? },
            "Sigmoid" => UnaryKind::Sigmoid,
            "HardSigmoid" => UnaryKind::HardSigmoid { alpha: p(0)?, beta: p(1)? },
            "HardSwish" => UnaryKind::HardSwish,
            "Tanh" => UnaryKind::Tanh,
            "Elu" => UnaryKind::Elu { alpha: p(0)? },
            "Selu" => UnaryKind::Selu { alpha: p(0)?, gamma: p(1)? },
            "Softplus" => UnaryKind::Softplus,
            "Erf" => UnaryKind::Erf,
            "Celu" => UnaryKind::Celu { alpha: p(0)? },
            "ThresholdedRelu" => UnaryKind::ThresholdedRelu { alpha: p(0)? },
            "Swish" => UnaryKind::Swish { alpha: p(0)? },
            "Shrink" => UnaryKind::Shrink { bias: p(0)?, lambd: p(1)? },
            "Gelu" => UnaryKind::Gelu { tanh: p(0)? != 0.0 },
            // Every other kind has no parameters.
            _ => return KINDS.iter().copied().find(|k| k.op_name() == name && k.params().is_empty()),
        })
    }

    /// Whether the kind can be fused as an epilogue activation (f32, no extra inputs).
    pub fn is_activation(&self) -> bool {
        matches!(
            self,
            UnaryKind::Relu
                | UnaryKind::LeakyRelu { .. }
                | UnaryKind::Clip { .. }
                | UnaryKind::Sigmoid
                | UnaryKind::HardSigmoid { .. }
                | UnaryKind::HardSwish
                | UnaryKind::Tanh
                | UnaryKind::Elu { .. }
                | UnaryKind::Selu { .. }
                | UnaryKind::Softplus
                | UnaryKind::Gelu { .. }
        )
    }

    /// Dtypes the op accepts.
    fn dtypes(&self) -> &'static [DType] {
        match self {
            UnaryKind::Relu
            | UnaryKind::Neg
            | UnaryKind::Abs
            | UnaryKind::Clip { .. }
            | UnaryKind::Sign
            | UnaryKind::Shrink { .. } => NUMBERS,
            _ => FLOATS,
        }
    }

    /// The f32 function (f64 too, through [`UnaryKind::apply_f64`]).
    pub fn apply_f32(self, x: f32) -> f32 {
        self.apply_f64(x as f64) as f32
    }

    /// Scalar semantics in f64 (the reference; also used for f64, f16 and bf16 tensors).
    pub fn apply_f64(&self, x: f64) -> f64 {
        match *self {
            UnaryKind::Erf => libm::erf(x),
            UnaryKind::LeakyRelu { alpha } => if x >= 0.0 { x } else { alpha as f64 * x },
            UnaryKind::Clip { min, max } => x.max(min as f64).min(max as f64),
            UnaryKind::HardSigmoid { alpha, beta } => (alpha as f64 * x + beta as f64).clamp(0.0, 1.0),
            UnaryKind::Elu { alpha } => if x >= 0.0 { x } else { alpha as f64 * (x.exp() - 1.0) },
            UnaryKind::Selu { alpha, gamma } => {
                gamma as f64 * if x > 0.0 { x } else { alpha as f64 * (x.exp() - 1.0) }
            }
            UnaryKind::Celu { alpha } => {
                let a = alpha as f64;
                x.max(0.0) + (a * ((x / a).exp() - 1.0)).min(0.0)
            }
            UnaryKind::ThresholdedRelu { alpha } => if x > alpha as f64 { x } else { 0.0 },
            UnaryKind::Shrink { bias, lambd } => shrink(x, bias as f64, lambd as f64),
            UnaryKind::Swish { alpha } => x / (1.0 + (-(alpha as f64) * x).exp()),
            UnaryKind::Gelu { tanh: false } => 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
            UnaryKind::Gelu { tanh: true } => 0.5 * x * (1.0 + (GELU_TANH_SCALE * (x + 0.044715 * x * x * x)).tanh()),
            k => with_float_fn!(k, v, f64, f => f(x)),
        }
    }

    /// [`Self::apply_slice_f32`] compiled for AVX2 + FMA when the CPU has them (8 lanes
    /// instead of SSE's 4): what kernels call on their outputs.
    pub fn apply_slice_f32_fast(&self, xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { self.apply_slice_avx2(xs) };
            return;
        }
        self.apply_slice_f32(xs)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn apply_slice_avx2(&self, xs: &mut [f32]) {
        self.apply_slice_f32(xs)
    }

    /// Applies the op to an f32 slice in place: the hot path, monomorphised per kind.
    /// Inlined, so that callers compiled for wider vectors (AVX2) vectorise it too.
    #[inline(always)]
    pub fn apply_slice_f32(&self, xs: &mut [f32]) {
        #[inline(always)]
        fn each(xs: &mut [f32], f: impl Fn(f32) -> f32) {
            xs.iter_mut().for_each(|v| *v = f(*v));
        }
        match *self {
            UnaryKind::Erf => each(xs, crate::cpu::fast_erf),
            UnaryKind::Tanh => each(xs, crate::cpu::fast_tanh),
            UnaryKind::Sigmoid => each(xs, crate::cpu::fast_sigmoid),
            UnaryKind::LeakyRelu { alpha } => each(xs, |x| if x >= 0.0 { x } else { alpha * x }),
            UnaryKind::Clip { min, max } => each(xs, |x| x.max(min).min(max)),
            UnaryKind::HardSigmoid { alpha, beta } => each(xs, |x| (alpha * x + beta).clamp(0.0, 1.0)),
            UnaryKind::Elu { alpha } => each(xs, |x| if x >= 0.0 { x } else { alpha * (x.exp() - 1.0) }),
            UnaryKind::Selu { alpha, gamma } => {
                each(xs, |x| gamma * if x > 0.0 { x } else { alpha * (x.exp() - 1.0) })
            }
            UnaryKind::Celu { alpha } => each(xs, |x| x.max(0.0) + (alpha * ((x / alpha).exp() - 1.0)).min(0.0)),
            UnaryKind::ThresholdedRelu { alpha } => each(xs, |x| if x > alpha { x } else { 0.0 }),
            UnaryKind::Shrink { bias, lambd } => each(xs, |x| {
                if x < -lambd {
                    x + bias
                } else if x > lambd {
                    x - bias
                } else {
                    0.0
                }
            }),
            UnaryKind::Swish { alpha } => each(xs, |x| x / (1.0 + (-alpha * x).exp())),
            UnaryKind::Gelu { tanh: false } => {
                each(xs, |x| 0.5 * x * (1.0 + crate::cpu::fast_erf(x * std::f32::consts::FRAC_1_SQRT_2)))
            }
            UnaryKind::Gelu { tanh: true } => each(xs, |x| {
                0.5 * x * (1.0 + crate::cpu::fast_tanh(GELU_TANH_SCALE as f32 * (x + 0.044715 * x * x * x)))
            }),
            k => with_float_fn!(k, v, f32, f => each(xs, f)),
        }
    }

    /// Integer semantics (for the kinds defined on integers).
    fn apply_i64(&self, x: i64) -> i64 {
        match *self {
            UnaryKind::Relu => x.max(0),
            UnaryKind::Neg => x.wrapping_neg(),
            UnaryKind::Abs => x.wrapping_abs(),
            UnaryKind::Sign => x.signum(),
            UnaryKind::Shrink { bias, lambd } => {
                let (xf, b) = (x as f64, bias as f64);
                if xf < -(lambd as f64) {
                    if b.fract() == 0.0 { x.wrapping_add(b as i64) } else { (xf + b) as i64 }
                } else if xf > lambd as f64 {
                    if b.fract() == 0.0 { x.wrapping_sub(b as i64) } else { (xf - b) as i64 }
                } else {
                    0
                }
            }
            UnaryKind::Clip { min, max } => {
                let lo = if min.is_finite() { min as i64 } else { i64::MIN };
                let hi = if max.is_finite() { max as i64 } else { i64::MAX };
                x.max(lo).min(hi)
            }
            _ => x,
        }
    }

    /// The WGSL expression computing the op of `x`, of element type `ty`.
    pub fn wgsl_expr(&self, x: &str, ty: &str) -> String {
        let l = |v: f32| wgsl::literal(ty, v as f64);
        if ty != "f32" {
            return match *self {
                UnaryKind::Relu => format!("max({x}, {})", l(0.0)),
                UnaryKind::Neg => format!("(-{x})"),
                UnaryKind::Abs => format!("abs({x})"),
                UnaryKind::Sign => format!("sign({x})"),
                UnaryKind::Clip { .. } => format!("min(max({x}, clip_lo), clip_hi)"),
                UnaryKind::Shrink { bias, lambd } => {
                    // Compared in f32; an integral bias is added exactly in the integer type.
                    let (lo, hi) = (wgsl::literal("f32", -lambd as f64), wgsl::literal("f32", lambd as f64));
                    let (below, above) = if bias.fract() == 0.0 {
                        (format!("({x} + {})", l(bias)), format!("({x} - {})", l(bias)))
                    } else {
                        let b = wgsl::literal("f32", bias as f64);
                        (format!("{ty}(f32({x}) + {b})"), format!("{ty}(f32({x}) - {b})"))
                    };
                    format!("select(select({}, {above}, f32({x}) > {hi}), {below}, f32({x}) < {lo})", l(0.0))
                }
                _ => x.to_string(),
            };
        }
        match *self {
            UnaryKind::Relu => format!("max({x}, 0.0)"),
            UnaryKind::LeakyRelu { alpha } => format!("select({} * {x}, {x}, {x} >= 0.0)", l(alpha)),
            UnaryKind::Clip { .. } => format!("min(max({x}, clip_lo), clip_hi)"),
            UnaryKind::Sigmoid => format!("(1.0 / (1.0 + exp(-{x})))"),
            UnaryKind::HardSigmoid { alpha, beta } => format!("clamp({} * {x} + {}, 0.0, 1.0)", l(alpha), l(beta)),
            UnaryKind::HardSwish => format!("({x} * clamp({x} / 6.0 + 0.5, 0.0, 1.0))"),
            // tanh via exp of a clamped argument: WGSL's tanh may return NaN for large |x|.
            UnaryKind::Tanh => format!("tanh(clamp({x}, -15.0, 15.0))"),
            UnaryKind::Exp => format!("exp({x})"),
            UnaryKind::Log => format!("log({x})"),
            UnaryKind::Sqrt => format!("sqrt({x})"),
            UnaryKind::Neg => format!("(-{x})"),
            UnaryKind::Abs => format!("abs({x})"),
            UnaryKind::Reciprocal => format!("(1.0 / {x})"),
            UnaryKind::Floor => format!("floor({x})"),
            UnaryKind::Ceil => format!("ceil({x})"),
            UnaryKind::Sin => format!("sin({x})"),
            UnaryKind::Cos => format!("cos({x})"),
            UnaryKind::Softplus => format!("select(log(1.0 + exp({x})), {x}, {x} > 20.0)"),
            UnaryKind::Softsign => format!("({x} / (1.0 + abs({x})))"),
            UnaryKind::Elu { alpha } => format!("select({} * (exp({x}) - 1.0), {x}, {x} >= 0.0)", l(alpha)),
            UnaryKind::Selu { alpha, gamma } => {
                format!("({} * select({} * (exp({x}) - 1.0), {x}, {x} > 0.0))", l(gamma), l(alpha))
            }
            UnaryKind::Sign => format!("sign({x})"),
            UnaryKind::Erf => format!("kiln_erf({x})"),
            UnaryKind::Round => format!("round({x})"),
            UnaryKind::Tan => format!("tan({x})"),
            // Through atan2: the drivers' asin/acos approximations are coarse (~1e-4).
            UnaryKind::Asin => format!("kiln_asin({x})"),
            UnaryKind::Acos => format!("kiln_acos({x})"),
            UnaryKind::Atan => format!("atan({x})"),
            UnaryKind::Sinh => format!("sinh({x})"),
            UnaryKind::Cosh => format!("cosh({x})"),
            UnaryKind::Asinh => format!("kiln_asinh({x})"),
            UnaryKind::Acosh => format!("kiln_acosh({x})"),
            UnaryKind::Atanh => format!("kiln_atanh({x})"),
            UnaryKind::Mish => format!("({x} * tanh(clamp(kiln_softplus({x}), -15.0, 15.0)))"),
            UnaryKind::Celu { alpha } => {
                format!("(max({x}, 0.0) + min({a} * (exp({x} / {a}) - 1.0), 0.0))", a = l(alpha))
            }
            UnaryKind::ThresholdedRelu { alpha } => format!("select(0.0, {x}, {x} > {})", l(alpha)),
            UnaryKind::Shrink { bias, lambd } => format!(
                "select(select(0.0, {x} - {b}, {x} > {hi}), {x} + {b}, {x} < {lo})",
                b = l(bias),
                hi = l(lambd),
                lo = l(-lambd)
            ),
            UnaryKind::Swish { alpha } => format!("({x} / (1.0 + exp({} * {x})))", l(-alpha)),
            UnaryKind::Gelu { tanh: false } => format!("(0.5 * {x} * (1.0 + kiln_erf({x} * 0.70710678118654752)))"),
            UnaryKind::Gelu { tanh: true } => format!(
                "(0.5 * {x} * (1.0 + tanh(clamp({} * ({x} + 0.044715 * {x} * {x} * {x}), -15.0, 15.0))))",
                l(GELU_TANH_SCALE as f32)
            ),
        }
    }

    /// WGSL functions the kind's expression calls.
    pub fn wgsl_helpers(&self) -> &'static str {
        match self {
            UnaryKind::Erf | UnaryKind::Gelu { tanh: false } => ERF_WGSL,
            UnaryKind::Mish => SOFTPLUS_WGSL,
            UnaryKind::Asinh | UnaryKind::Acosh | UnaryKind::Atanh => INVERSE_HYPERBOLIC_WGSL,
            UnaryKind::Asin | UnaryKind::Acos => INVERSE_TRIG_WGSL,
            _ => "",
        }
    }
}

/// A unary elementwise op application.
#[derive(Debug)]
pub struct Unary {
    pub kind: UnaryKind,
}

impl Unary {
    /// Clip's bounds for this run: attributes, or constant/run-time inputs 1 and 2.
    fn clip_bounds(&self, min_in: Option<&Tensor>, max_in: Option<&Tensor>) -> Result<UnaryKind> {
        let UnaryKind::Clip { mut min, mut max } = self.kind else { return Ok(self.kind) };
        for (i, t, slot) in [(1, min_in, &mut min), (2, max_in, &mut max)] {
            if let Some(t) = t {
                if t.len() != 1 {
                    return Err(OpError::input(i, format!("Clip bound must be a scalar, got shape {:?}", t.dims())));
                }
                *slot = t.to_f64_vec()[0] as f32;
            }
        }
        Ok(UnaryKind::Clip { min, max })
    }
}

impl Op for Unary {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        self.kind.op_name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, self.kind.dtypes())?;
        let max_inputs = if matches!(self.kind, UnaryKind::Clip { .. }) { 3 } else { 1 };
        if inputs.len() > max_inputs {
            return Err(OpError::invalid(format!("{} takes at most {max_inputs} input(s), got {}", self.name(), inputs.len())));
        }
        for (i, a) in inputs.iter().enumerate().skip(1) {
            if let Some(a) = a {
                if a.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from input 0's {dtype}", a.dtype())));
                }
            }
        }
        Ok(vec![TensorType::new(dtype, required(inputs, 0)?.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Unary {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let kind = self.clip_bounds(inputs.get(1).copied().flatten(), inputs.get(2).copied().flatten())?;
        let out = &mut outputs[0];
        match x.dtype() {
            DType::F32 => {
                let src = x.as_slice::<f32>()?;
                let dst = out.as_mut_slice::<f32>()?;
                cpu::par_chunks_mut(dst, 1, 8, |start, part| {
                    part.copy_from_slice(&src[start..start + part.len()]);
                    kind.apply_slice_f32_fast(part);
                });
            }
            d if d.is_float() => {
                let v: Vec<f64> = x.to_f64_vec().into_iter().map(|v| kind.apply_f64(v)).collect();
                *out = Tensor::from_f64(d, x.dims(), &v)?;
            }
            d => {
                let v: Vec<i64> = x.to_i64_vec()?.into_iter().map(|v| kind.apply_i64(v)).collect();
                *out = super::zip::from_i64_bits(d, x.dims(), &v)?;
            }
        }
        Ok(())
    }
}

impl WgslKernel for Unary {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let mut buffers = vec![("x", ty, true)];
        let mut bindings = vec![Binding::Input(0)];
        let mut prelude = String::new();
        if let UnaryKind::Clip { min, max } = self.kind {
            // Bounds: baked when constant, read from their buffers otherwise.
            for (i, name, default) in [(1usize, "clip_lo", min), (2, "clip_hi", max)] {
                match inputs.get(i).copied().flatten() {
                    Some(Arg { value: Some(t), .. }) => {
                        let v = t.to_f64_vec().first().copied().unwrap_or(default as f64);
                        prelude += &format!("let {name} = {};\n    ", wgsl::literal(ty, v));
                    }
                    Some(_) => {
                        let buf = if i == 1 { "lo_buf" } else { "hi_buf" };
                        buffers.push((buf, ty, true));
                        bindings.push(Binding::Input(i));
                        prelude += &format!("let {name} = {buf}[0];\n    ");
                    }
                    None => {
                        let v = if ty == "f32" { default as f64 } else if i == 1 { f64::MIN } else { f64::MAX };
                        prelude += &format!("let {name} = {};\n    ", wgsl::literal(ty, v));
                    }
                }
            }
        }
        buffers.push(("y", ty, false));
        bindings.push(Binding::Output(0));
        let body = format!("{prelude}let x = x[i];\n    y[i] = {};", self.kind.wgsl_expr("x", ty));
        let helpers = self.kind.wgsl_helpers();
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name(),
            outputs[0].len(),
            wg,
            &buffers,
            bindings,
            helpers,
            &body,
        )))
    }
}

/// `sqrt(2 / pi)`, the scale inside Gelu's tanh approximation.
const GELU_TANH_SCALE: f64 = 0.797_884_560_802_865_4;

/// Shrink of one value (the reference semantics).
fn shrink(x: f64, bias: f64, lambd: f64) -> f64 {
    if x < -lambd {
        x + bias
    } else if x > lambd {
        x - bias
    } else {
        0.0
    }
}

/// The kind of a unary node (attributes parsed; Clip's input bounds are not read).
pub fn unary_kind_of(spec: &NodeSpec) -> Result<Option<UnaryKind>> {
    let Some(kind) = UnaryKind::from_name_params(&spec.node.op_type, &[0.0, 0.0]) else { return Ok(None) };
    Ok(Some(parse(spec, kind)?))
}

fn parse(spec: &NodeSpec, kind: UnaryKind) -> Result<UnaryKind> {
    Ok(match kind {
        UnaryKind::LeakyRelu { .. } => UnaryKind::LeakyRelu { alpha: spec.float("alpha", 0.01)? },
        UnaryKind::HardSigmoid { .. } => {
            UnaryKind::HardSigmoid { alpha: spec.float("alpha", 0.2)?, beta: spec.float("beta", 0.5)? }
        }
        UnaryKind::Elu { .. } => UnaryKind::Elu { alpha: spec.float("alpha", 1.0)? },
        UnaryKind::Selu { .. } => UnaryKind::Selu {
            alpha: spec.float("alpha", 1.673_263_2)?,
            gamma: spec.float("gamma", 1.050_701)?,
        },
        UnaryKind::Clip { .. } => UnaryKind::Clip {
            min: spec.float("min", f32::NEG_INFINITY)?,
            max: spec.float("max", f32::INFINITY)?,
        },
        UnaryKind::Celu { .. } => {
            let alpha = spec.float("alpha", 1.0)?;
            if alpha == 0.0 {
                return Err(spec.bad("alpha", "Celu's alpha must not be 0"));
            }
            UnaryKind::Celu { alpha }
        }
        UnaryKind::ThresholdedRelu { .. } => UnaryKind::ThresholdedRelu { alpha: spec.float("alpha", 1.0)? },
        UnaryKind::Shrink { .. } => UnaryKind::Shrink { bias: spec.float("bias", 0.0)?, lambd: spec.float("lambd", 0.5)? },
        UnaryKind::Swish { .. } => UnaryKind::Swish { alpha: spec.float("alpha", 1.0)? },
        UnaryKind::Gelu { .. } => match spec.string("approximate", "none")?.as_str() {
            "none" => UnaryKind::Gelu { tanh: false },
            "tanh" => UnaryKind::Gelu { tanh: true },
            other => return Err(spec.bad("approximate", format!("expected \"none\" or \"tanh\", found \"{other}\""))),
        },
        k => k,
    })
}

/// Every unary kind (parameters at their defaults), one per ONNX op.
const KINDS: &[UnaryKind] = &[
        UnaryKind::Relu,
        UnaryKind::LeakyRelu { alpha: 0.0 },
        UnaryKind::Clip { min: 0.0, max: 0.0 },
        UnaryKind::Sigmoid,
        UnaryKind::HardSigmoid { alpha: 0.0, beta: 0.0 },
        UnaryKind::HardSwish,
        UnaryKind::Tanh,
        UnaryKind::Exp,
        UnaryKind::Log,
        UnaryKind::Sqrt,
        UnaryKind::Neg,
        UnaryKind::Abs,
        UnaryKind::Reciprocal,
        UnaryKind::Floor,
        UnaryKind::Ceil,
        UnaryKind::Sin,
        UnaryKind::Cos,
        UnaryKind::Softplus,
        UnaryKind::Softsign,
        UnaryKind::Elu { alpha: 0.0 },
        UnaryKind::Selu { alpha: 0.0, gamma: 0.0 },
        UnaryKind::Sign,
        UnaryKind::Erf,
        UnaryKind::Round,
        UnaryKind::Tan,
        UnaryKind::Asin,
        UnaryKind::Acos,
        UnaryKind::Atan,
        UnaryKind::Sinh,
        UnaryKind::Cosh,
        UnaryKind::Asinh,
        UnaryKind::Acosh,
        UnaryKind::Atanh,
        UnaryKind::Mish,
        UnaryKind::Celu { alpha: 1.0 },
        UnaryKind::ThresholdedRelu { alpha: 1.0 },
        UnaryKind::Shrink { bias: 0.0, lambd: 0.5 },
        UnaryKind::Swish { alpha: 1.0 },
        UnaryKind::Gelu { tanh: false },
    ];

pub(crate) fn register(r: &mut Registry) {
    for &kind in KINDS {
        r.register("", kind.op_name(), move |spec| Ok(Box::new(Unary { kind: parse(spec, kind)? })));
    }
}

#[cfg(test)]
#[path = "unary_tests.rs"]
mod tests;
