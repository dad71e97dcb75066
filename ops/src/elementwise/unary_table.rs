//! The machinery behind the unary op table in [`super::unary`]: the `unary_ops!` macro
//! that turns one entry per op into the [`super::UnaryKind`] enum and everything the
//! rest of kiln asks of a kind (name, parameters, attribute parsing, dtypes, the f32/f64
//! scalar function, the hot f32 slice loop, the integer function, the WGSL expression),
//! and the small traits the entries' expressions are written against.
//!
//! An entry reads
//!
//! ```text
//! /// doc
//! Name [{ field: type = default, ... }] act: bool,
//!     [int: |x| i64 expression,]          // defined on integers (else floats only)
//!     [parse: |spec| Result<UnaryKind>,]  // attributes other than one float per field
//!     [helpers: WGSL_FUNCTIONS,]          // WGSL functions the expression calls
//!     f: |x| expression,                  // compiled for f32 and f64 (see [`Real`])
//!     wgsl: |x, ty| String;               // WGSL of `x` with element type `ty`
//! ```
//!
//! Inside `f`, each field is bound as the float type being computed; inside `int`,
//! `parse` and `wgsl` fields keep their stored type (`f32`, `bool`). A field's ONNX
//! attribute has the field's name unless `parse` says otherwise. `f` is monomorphised
//! per kind, so the slice loop over it vectorises (also under AVX2, see
//! `UnaryKind::apply_slice_f32_fast`).

/// Float functions the table's `f` expressions use, with one meaning per type: the
/// vectorising approximations of [`crate::cpu`] for f32 (the hot path), the exact
/// functions for f64 (the reference, also used for f64, f16 and bf16 tensors).
pub(crate) trait Real: Copy {
    /// erf: `cpu::fast_erf` for f32, libm's for f64.
    fn erf_fast(self) -> Self;
    /// tanh: `cpu::fast_tanh` for f32, std's for f64.
    fn tanh_fast(self) -> Self;
    /// The logistic function: `cpu::fast_sigmoid` for f32, `1 / (1 + e^-x)` for f64.
    fn sigmoid(self) -> Self;
    /// `max(x, lo)` then `min(., hi)` as C++'s std::max/min do (onnxruntime's Clip): a
    /// NaN `x` stays NaN, a NaN bound is ignored.
    fn clip(self, lo: Self, hi: Self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn erf_fast(self) -> f32 {
        crate::cpu::fast_erf(self)
    }
    #[inline(always)]
    fn tanh_fast(self) -> f32 {
        crate::cpu::fast_tanh(self)
    }
    #[inline(always)]
    fn sigmoid(self) -> f32 {
        crate::cpu::fast_sigmoid(self)
    }
    #[inline(always)]
    fn clip(self, lo: f32, hi: f32) -> f32 {
        let v = if self < lo { lo } else { self };
        if v > hi { hi } else { v }
    }
}

impl Real for f64 {
    #[inline(always)]
    fn erf_fast(self) -> f64 {
        libm::erf(self)
    }
    #[inline(always)]
    fn tanh_fast(self) -> f64 {
        self.tanh()
    }
    #[inline(always)]
    fn sigmoid(self) -> f64 {
        1.0 / (1.0 + (-self).exp())
    }
    #[inline(always)]
    fn clip(self, lo: f64, hi: f64) -> f64 {
        let v = if self < lo { lo } else { self };
        if v > hi { hi } else { v }
    }
}

/// How a stored field is seen inside an `f` expression computing in `T`: float fields
/// become `T`, flags stay `bool`.
pub(crate) trait BindAs<T> {
    type Out;
    fn bind(self) -> Self::Out;
}

impl BindAs<f32> for f32 {
    type Out = f32;
    #[inline(always)]
    fn bind(self) -> f32 {
        self
    }
}

impl BindAs<f64> for f32 {
    type Out = f64;
    #[inline(always)]
    fn bind(self) -> f64 {
        self as f64
    }
}

impl<T> BindAs<T> for bool {
    type Out = bool;
    #[inline(always)]
    fn bind(self) -> bool {
        self
    }
}

/// A field's place in the flat `f32` parameter list ([`super::UnaryKind::params`]) that
/// fused nodes carry, and its default attribute parsing.
pub(crate) trait Param: Sized {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// The field from the node attribute `name` (`default` when absent).
    fn attr(spec: &crate::NodeSpec, name: &str, default: Self) -> crate::Result<Self>;
}

impl Param for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> f32 {
        v
    }
    fn attr(spec: &crate::NodeSpec, name: &str, default: f32) -> crate::Result<f32> {
        spec.float(name, default)
    }
}

impl Param for bool {
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
    fn from_f32(v: f32) -> bool {
        v != 0.0
    }
    fn attr(spec: &crate::NodeSpec, name: &str, default: bool) -> crate::Result<bool> {
        Ok(spec.int(name, default as i64)? != 0)
    }
}

/// A WGSL literal of `v` in element type `ty` (for the table's `wgsl` expressions).
pub(crate) fn lit(ty: &str, v: impl Into<f64>) -> String {
    crate::wgsl::literal(ty, v.into())
}

/// See the module documentation for the entry syntax.
macro_rules! unary_ops {
    (@dtypes) => { FLOATS };
    (@dtypes $x:ident) => { NUMBERS };
    (@int $v:ident) => { $v };
    (@int $v:ident, $ix:ident, $int:expr) => {{
        let f = |$ix: i64| -> i64 { $int };
        f($v)
    }};
    (@helpers) => { "" };
    (@helpers $h:expr) => { $h };
    (@parse $spec:ident, $name:ident { $($field:ident = $default:expr),* }) => {
        UnaryKind::$name { $($field: Param::attr($spec, stringify!($field), $default)?),* }
    };
    (@parse $spec:ident, $name:ident { $($field:ident = $default:expr),* }, $parse:expr) => {
        ($parse)($spec)?
    };
    ($(
        $(#[doc = $doc:literal])*
        $name:ident $({ $($field:ident : $fty:ty = $default:expr),* })? act: $act:literal,
        $(int: |$ix:ident| $int:expr,)?
        $(parse: $parse:expr,)?
        $(helpers: $helpers:expr,)?
        f: |$x:ident| $f:expr,
        wgsl: |$wx:ident, $wty:ident| $wgsl:expr;
    )*) => {
        /// A unary elementwise op with its attributes (one variant per ONNX op).
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum UnaryKind {
            $( $(#[doc = $doc])* $name $({ $($field: $fty),* })?, )*
        }

        /// Every unary kind (parameters at their defaults), one per ONNX op.
        pub(super) const KINDS: &[UnaryKind] = &[ $( UnaryKind::$name { $($($field: $default),*)? }, )* ];

        #[allow(unused_variables, unused_mut, unused_assignments, clippy::redundant_closure_call)]
        impl UnaryKind {
            /// The ONNX op type of this kind.
            pub fn op_name(&self) -> &'static str {
                match self { $( UnaryKind::$name { .. } => stringify!($name), )* }
            }

            /// The kind's parameters, in a fixed order (see [`UnaryKind::from_name_params`]).
            pub fn params(&self) -> Vec<f32> {
                match *self { $( UnaryKind::$name { $($($field),*)? } => vec![$($(Param::to_f32($field)),*)?], )* }
            }

            /// The kind of op type `name` with `params` (as [`UnaryKind::params`] gives them).
            pub fn from_name_params(name: &str, params: &[f32]) -> Option<UnaryKind> {
                let mut it = params.iter().copied();
                Some(match name {
                    $( stringify!($name) => UnaryKind::$name { $($($field: Param::from_f32(it.next()?)),*)? }, )*
                    _ => return None,
                })
            }

            /// Whether the kind can be fused as an epilogue activation (f32, no extra inputs).
            pub fn is_activation(&self) -> bool {
                match self { $( UnaryKind::$name { .. } => $act, )* }
            }

            /// Dtypes the op accepts.
            pub(crate) fn dtypes(&self) -> &'static [DType] {
                match self { $( UnaryKind::$name { .. } => unary_ops!(@dtypes $($ix)?), )* }
            }

            /// The kind with its attributes read from the node (`self`'s kind only).
            pub(crate) fn parse_attrs(&self, spec: &NodeSpec) -> Result<UnaryKind> {
                Ok(match self {
                    $( UnaryKind::$name { .. } =>
                        unary_ops!(@parse spec, $name { $($($field = $default),*)? } $(, $parse)?), )*
                })
            }

            /// Scalar semantics in f64 (the reference; also used for f64, f16 and bf16 tensors).
            pub fn apply_f64(&self, x: f64) -> f64 {
                match *self {
                    $( UnaryKind::$name { $($($field),*)? } => {
                        $($( let $field = BindAs::<f64>::bind($field); )*)?
                        let f = |$x: f64| -> f64 { $f };
                        f(x)
                    } )*
                }
            }

            /// Applies the op to an f32 slice in place: the hot path, monomorphised per kind.
            /// Inlined, so that callers compiled for wider vectors (AVX2) vectorise it too.
            #[inline(always)]
            pub fn apply_slice_f32(&self, xs: &mut [f32]) {
                #[inline(always)]
                fn each(xs: &mut [f32], f: impl Fn(f32) -> f32) {
                    // A plain loop, not `for_each`: an outlined `for_each` would not be
                    // compiled for the AVX2 caller (`apply_slice_f32_fast`).
                    for v in xs.iter_mut() {
                        *v = f(*v);
                    }
                }
                match *self {
                    $( UnaryKind::$name { $($($field),*)? } => {
                        $($( let $field = BindAs::<f32>::bind($field); )*)?
                        each(xs, #[inline(always)] |$x: f32| -> f32 { $f })
                    } )*
                }
            }

            /// Integer semantics (for the kinds defined on integers; others are the identity).
            pub(crate) fn apply_i64(&self, x: i64) -> i64 {
                match *self { $( UnaryKind::$name { $($($field),*)? } => unary_ops!(@int x $(, $ix, $int)?), )* }
            }

            /// The WGSL expression computing the op of `x`, of element type `ty`.
            pub fn wgsl_expr(&self, x: &str, ty: &str) -> String {
                match *self {
                    $( UnaryKind::$name { $($($field),*)? } => {
                        let f = |$wx: &str, $wty: &str| -> String { $wgsl };
                        f(x, ty)
                    } )*
                }
            }

            /// WGSL functions the kind's expression calls.
            pub fn wgsl_helpers(&self) -> &'static str {
                match self { $( UnaryKind::$name { .. } => unary_ops!(@helpers $($helpers)?), )* }
            }
        }
    };
}

pub(crate) use unary_ops;
