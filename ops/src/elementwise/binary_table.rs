//! The machinery behind the binary op table in [`super::binary`]: the `binary_ops!`
//! macro that turns one entry per op into the [`super::BinaryKind`] enum and everything
//! the rest of kiln asks of a kind (name, flags, dtypes, output dtype, the scalar
//! functions, the CPU kernel step, the fused f32 block loop, the WGSL expression).
//!
//! An entry reads
//!
//! ```text
//! /// doc
//! Name class (flags) dtypes: &[DType],
//!     [helpers: WGSL_FUNCTIONS,]        // WGSL functions the expression calls
//!     [wide: &Overflow,]                // i64/u64 on the GPU: computed in 32 bits, overflow reported
//!     [fast: fn(&Tensor, &Tensor, &mut Tensor) -> Result<bool>,]  // a CPU shortcut tried first
//!     f: |a, b| expression,             // the scalar function of the element class
//!     [int: |a, b| i64 expression,]     // class `float` only (required there)
//!     wgsl: |a, b, ty| String;          // WGSL of `a op b`, operands of element type `ty`
//! ```
//!
//! The element class says what `f` computes, and so the output dtype:
//! - `float`: in the input dtype, compiled for f32 and f64 (f16 and bf16 go through
//!   f64), with `int` on i64 for every integer dtype (wrapping);
//! - `cmp`: a bool predicate, compiled for every element type (f32, f64, i64, i32, u8;
//!   others through f64); the output is bool;
//! - `bool`: a function of two bools; the output is bool.
//!
//! Flags (any of, in parentheses): `variadic` (1 or more inputs, folded left to right),
//! `fuse` (the elementwise fusion pass may put it in a `kiln.FusedElementwise` program:
//! f32, two operands), `average` (the folded result is divided by the input count),
//! `nonzero_divisor` (an integer zero in the second operand is an error), `mixed_rhs`
//! (the second operand may have another numeric dtype: it is converted to the first's).
//!
//! Every function is a closure of its own type, so each kind's CPU loops are
//! monomorphised per kind and per dtype: no per-element dispatch on the kind.

/// Floats the table's `float` expressions are compiled for.
pub(crate) trait Float: Copy {
    /// The canonical quiet NaN (what Max/Min return when an operand is NaN).
    fn nan() -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn nan() -> f32 {
        f32::NAN
    }
}

impl Float for f64 {
    #[inline(always)]
    fn nan() -> f64 {
        f64::NAN
    }
}

/// How an op on 64-bit integers, computed on the GPU in 32-bit lanes, detects a result
/// that does not fit: `op` between `acc` and `b` gives `r`; `signed` and `unsigned` are
/// WGSL conditions on `acc`, `b` and `r` that are true on overflow.
pub(crate) struct Overflow {
    pub op: &'static str,
    pub signed: &'static str,
    pub unsigned: &'static str,
}

/// See the module documentation for the entry syntax.
macro_rules! binary_ops {
    // One rule per flag: whether the flag list holds it.
    (@variadic) => { false };
    (@variadic variadic $($r:ident)*) => { true };
    (@variadic $x:ident $($r:ident)*) => { binary_ops!(@variadic $($r)*) };
    (@fuse) => { false };
    (@fuse fuse $($r:ident)*) => { true };
    (@fuse $x:ident $($r:ident)*) => { binary_ops!(@fuse $($r)*) };
    (@average) => { false };
    (@average average $($r:ident)*) => { true };
    (@average $x:ident $($r:ident)*) => { binary_ops!(@average $($r)*) };
    (@nonzero_divisor) => { false };
    (@nonzero_divisor nonzero_divisor $($r:ident)*) => { true };
    (@nonzero_divisor $x:ident $($r:ident)*) => { binary_ops!(@nonzero_divisor $($r)*) };
    (@mixed_rhs) => { false };
    (@mixed_rhs mixed_rhs $($r:ident)*) => { true };
    (@mixed_rhs $x:ident $($r:ident)*) => { binary_ops!(@mixed_rhs $($r)*) };
    (@helpers) => { "" };
    (@helpers $h:expr) => { $h };
    (@opt) => { None };
    (@opt $v:expr) => { Some($v) };

    // Per element class: the output dtype, the f64 reference, the CPU step, the f32 block.
    (@bool_out float) => { false };
    (@bool_out cmp) => { true };
    (@bool_out bool) => { true };
    (@f64 $x:ident, $y:ident; float |$a:ident, $b:ident| $f:expr) => {
        (|$a: f64, $b: f64| -> f64 { $f })($x, $y)
    };
    (@f64 $x:ident, $y:ident; cmp |$a:ident, $b:ident| $f:expr) => {
        (|$a: f64, $b: f64| -> bool { $f })($x, $y) as u8 as f64
    };
    (@f64 $x:ident, $y:ident; bool |$a:ident, $b:ident| $f:expr) => {
        (|$a: bool, $b: bool| -> bool { $f })($x != 0.0, $y != 0.0) as u8 as f64
    };
    (@step $k:ident, $x:ident, $y:ident, $out:ident; float |$a:ident, $b:ident| $f:expr; |$ia:ident, $ib:ident| $int:expr) => {
        same_dtype($k, $x, $y, $out, |$a: f32, $b: f32| -> f32 { $f }, |$a: f64, $b: f64| -> f64 { $f }, |$ia: i64, $ib: i64| -> i64 { $int })
    };
    (@step $k:ident, $x:ident, $y:ident, $out:ident; cmp |$a:ident, $b:ident| $f:expr;) => {
        compare(
            $x, $y, $out,
            |$a: f32, $b: f32| -> bool { $f },
            |$a: f64, $b: f64| -> bool { $f },
            |$a: i64, $b: i64| -> bool { $f },
            |$a: i32, $b: i32| -> bool { $f },
            |$a: u8, $b: u8| -> bool { $f },
        )
    };
    (@step $k:ident, $x:ident, $y:ident, $out:ident; bool |$a:ident, $b:ident| $f:expr;) => {
        logic($x, $y, $out, |$a: bool, $b: bool| -> bool { $f })
    };
    (@zip $k:ident, $x:ident, $y:ident, $out:ident; float |$a:ident, $b:ident| $f:expr) => {
        zip($x, $y, $out, |$a: f32, $b: f32| -> f32 { $f })
    };
    (@zip $k:ident, $x:ident, $y:ident, $out:ident; $class:ident |$a:ident, $b:ident| $f:expr) => {
        zip($x, $y, $out, |u: f32, v: f32| $k.apply_f64(u as f64, v as f64) as f32)
    };

    ($(
        $(#[doc = $doc:literal])*
        $name:ident $class:ident ($($flag:ident)*) dtypes: $dtypes:expr,
        $(helpers: $helpers:expr,)?
        $(wide: $wide:expr,)?
        $(fast: $fast:expr,)?
        f: |$a:ident, $b:ident| $f:expr,
        $(int: |$ia:ident, $ib:ident| $int:expr,)?
        wgsl: |$wa:ident, $wb:ident, $wty:ident| $wgsl:expr;
    )*) => {
        /// A broadcasting binary (or variadic) elementwise op (one variant per ONNX op).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum BinaryKind {
            $( $(#[doc = $doc])* $name, )*
        }

        #[allow(unused_variables, clippy::redundant_closure_call)]
        impl BinaryKind {
            /// Every kind, for lookups by name.
            pub const ALL: [BinaryKind; [$(stringify!($name)),*].len()] = [$(BinaryKind::$name),*];

            /// The kind of an ONNX op name.
            pub fn from_name(name: &str) -> Option<BinaryKind> {
                BinaryKind::ALL.into_iter().find(|k| k.op_name() == name)
            }

            /// The ONNX op type of this kind.
            pub fn op_name(self) -> &'static str {
                match self { $( BinaryKind::$name => stringify!($name), )* }
            }

            /// Whether the op takes 1 or more inputs (folded left to right), not exactly 2.
            pub fn variadic(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@variadic $($flag)*), )* }
            }

            /// Whether the fusion pass may put the op in a `kiln.FusedElementwise` program.
            pub fn fusible(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@fuse $($flag)*), )* }
            }

            /// Whether the folded result is divided by the number of inputs (Mean).
            pub(crate) fn averages(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@average $($flag)*), )* }
            }

            /// Whether an integer zero in the second operand is an error (Div).
            pub(crate) fn nonzero_divisor(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@nonzero_divisor $($flag)*), )* }
            }

            /// Whether the second operand may have another numeric dtype (Pow's exponent).
            pub(crate) fn mixed_rhs(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@mixed_rhs $($flag)*), )* }
            }

            /// Dtypes the op accepts (every input, the second one too unless `mixed_rhs`).
            pub(crate) fn dtypes(self) -> &'static [DType] {
                match self { $( BinaryKind::$name => $dtypes, )* }
            }

            /// Whether the output is bool (comparisons and logic), else the input dtype.
            pub(crate) fn bool_output(self) -> bool {
                match self { $( BinaryKind::$name => binary_ops!(@bool_out $class), )* }
            }

            /// The output dtype for inputs of dtype `input`.
            pub(crate) fn out_dtype(self, input: DType) -> DType {
                if self.bool_output() { DType::Bool } else { input }
            }

            /// WGSL functions [`BinaryKind::wgsl_expr`] may call.
            pub fn wgsl_helpers(self) -> &'static str {
                match self { $( BinaryKind::$name => binary_ops!(@helpers $($helpers)?), )* }
            }

            /// For i64/u64 on the GPU: the op is computed in 32 bits and an overflow reported.
            pub(crate) fn wgsl_overflow(self) -> Option<&'static Overflow> {
                match self { $( BinaryKind::$name => binary_ops!(@opt $($wide)?), )* }
            }

            /// Scalar semantics in f64 (floats; the reference). Bool results are 0 or 1.
            pub fn apply_f64(self, x: f64, y: f64) -> f64 {
                match self { $( BinaryKind::$name => binary_ops!(@f64 x, y; $class |$a, $b| $f), )* }
            }

            /// The WGSL expression of `a op b`, operands of element type `ty`.
            pub fn wgsl_expr(self, a: &str, b: &str, ty: &str) -> String {
                match self {
                    $( BinaryKind::$name => (|$wa: &str, $wb: &str, $wty: &str| -> String { $wgsl })(a, b, ty), )*
                }
            }

            /// `out = a op b` over equal-length f32 slices (the fused program's blocks):
            /// monomorphised per kind, inlined so that AVX2 callers vectorise it.
            #[inline(always)]
            pub fn zip_f32(self, x: &[f32], y: &[f32], out: &mut [f32]) {
                #[inline(always)]
                fn zip(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
                    for ((o, &u), &v) in out.iter_mut().zip(a).zip(b) {
                        *o = f(u, v);
                    }
                }
                match self { $( BinaryKind::$name => binary_ops!(@zip self, x, y, out; $class |$a, $b| $f), )* }
            }

            /// One CPU step `out = x op y` (dims of `out` the broadcast of both).
            pub(crate) fn step(self, x: &Tensor, y: &Tensor, out: &mut Tensor) -> Result<()> {
                match self {
                    $( BinaryKind::$name => {
                        $( let fast: fn(&Tensor, &Tensor, &mut Tensor) -> Result<bool> = $fast;
                           if fast(x, y, out)? { return Ok(()); } )?
                        binary_ops!(@step self, x, y, out; $class |$a, $b| $f; $(|$ia, $ib| $int)?)
                    } )*
                }
            }
        }
    };
}

pub(crate) use binary_ops;
