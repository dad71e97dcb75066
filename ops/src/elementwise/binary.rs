//! The broadcasting binary (and variadic) elementwise ops, one table entry each: the
//! ONNX name, flags (variadic, fusible, ...), the dtypes, the scalar function per
//! element class (`float` with its `int` twin, `cmp` or `bool`; the class also says
//! whether the output is bool), and the WGSL expression. Adding a binary op is one entry
//! here plus its test; `binary_table.rs` has the entry syntax, `binary_op.rs` the op that
//! runs any kind (inference, broadcasting CPU loops, WGSL kernel).
//!
//! NaN propagates through Max and Min on both backends (WGSL's max/min need not).
pub(crate) use super::binary_op::map2;
use super::binary_op::{compare, logic, same_dtype};
use super::binary_table::{binary_ops, Float, Overflow};
use super::unary::NUMBERS;
use super::{wgsl_max, wgsl_min};
use crate::Result;
use kiln_graph::{DType, Tensor};

/// Every compute dtype (comparisons; Equal of bool masks).
const ANY: &[DType] = &DType::COMPUTE;
/// Bool only (logic).
const BOOL: &[DType] = &[DType::Bool];

const ADD: Overflow = Overflow { op: "+", signed: "((acc ^ r) & (b ^ r)) < 0i", unsigned: "r < acc" };
const SUB: Overflow = Overflow { op: "-", signed: "((acc ^ b) & (acc ^ r)) < 0i", unsigned: "b > acc" };
const MUL: Overflow = Overflow {
    op: "*",
    signed: "(acc != 0i && (r / acc != b || (acc == -1i && b == bitcast<i32>(0x80000000u)))) || (b == -1i && acc == bitcast<i32>(0x80000000u))",
    unsigned: "acc != 0u && r / acc != b",
};

/// WGSL helpers for Pow: ONNX defines negative bases with integral exponents.
const POW_HELPERS: &str = "
fn kiln_pow(a: f32, b: f32) -> f32 {
    if (b == 2.0) { return a * a; }
    if (b == 1.0) { return a; }
    if (b == 0.0) { return 1.0; }
    let r = pow(abs(a), b);
    if (a < 0.0) {
        if (fract(b) != 0.0) { return bitcast<f32>(0x7fc00000u); }
        if (fract(b * 0.5) != 0.0) { return -r; }
    }
    return r;
}
fn kiln_ipow(a: i32, b: i32) -> i32 {
    var r = 1;
    for (var k = 0; k < b; k = k + 1) { r = r * a; }
    return r;
}
fn kiln_upow(a: u32, b: u32) -> u32 {
    var r = 1u;
    for (var k = 0u; k < b; k = k + 1u) { r = r * a; }
    return r;
}
";

/// f32 Pow by a constant 1, 2 or 3 (x^2, x^3 in GELU and variance decompositions) as
/// multiplications.
fn pow_small_exponent(a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<bool> {
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 || b.len() != 1 {
        return Ok(false);
    }
    match b.as_slice::<f32>()?[0] {
        1.0 => map2(a, b, out, |x: f32, _: f32| x)?,
        2.0 => map2(a, b, out, |x: f32, _: f32| x * x)?,
        3.0 => map2(a, b, out, |x: f32, _: f32| x * x * x)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Integer power: wrapping; a negative exponent gives 0.
fn pow_i64(a: i64, b: i64) -> i64 {
    if b < 0 { 0 } else { a.wrapping_pow(b.min(u32::MAX as i64) as u32) }
}

binary_ops! {
    Add float (fuse) dtypes: NUMBERS, wide: &ADD,
        f: |a, b| a + b, int: |a, b| a.wrapping_add(b),
        wgsl: |a, b, ty| format!("({a} + {b})");
    Sub float (fuse) dtypes: NUMBERS, wide: &SUB,
        f: |a, b| a - b, int: |a, b| a.wrapping_sub(b),
        wgsl: |a, b, ty| format!("({a} - {b})");
    Mul float (fuse) dtypes: NUMBERS, wide: &MUL,
        f: |a, b| a * b, int: |a, b| a.wrapping_mul(b),
        wgsl: |a, b, ty| format!("({a} * {b})");
    /// Integer division truncates (C-style); an integer zero divisor is an error.
    Div float (fuse nonzero_divisor) dtypes: NUMBERS,
        f: |a, b| a / b, int: |a, b| if b == 0 { 0 } else { a.wrapping_div(b) },
        wgsl: |a, b, ty| format!("({a} / {b})");
    /// The exponent may have another numeric dtype.
    Pow float (fuse mixed_rhs) dtypes: NUMBERS, helpers: POW_HELPERS, fast: pow_small_exponent,
        f: |a, b| a.powf(b), int: |a, b| pow_i64(a, b),
        wgsl: |a, b, ty| match ty {
            "f32" => format!("kiln_pow({a}, {b})"),
            "u32" => format!("kiln_upow({a}, {b})"),
            _ => format!("kiln_ipow({a}, {b})"),
        };
    Max float (variadic fuse) dtypes: NUMBERS,
        f: |a, b| if a.is_nan() || b.is_nan() { Float::nan() } else { a.max(b) }, int: |a, b| a.max(b),
        wgsl: |a, b, ty| if ty == "f32" { wgsl_max(a, b) } else { format!("max({a}, {b})") };
    Min float (variadic fuse) dtypes: NUMBERS,
        f: |a, b| if a.is_nan() || b.is_nan() { Float::nan() } else { a.min(b) }, int: |a, b| a.min(b),
        wgsl: |a, b, ty| if ty == "f32" { wgsl_min(a, b) } else { format!("min({a}, {b})") };
    /// Variadic sum (pairwise Add).
    Sum float (variadic) dtypes: NUMBERS, wide: &ADD,
        f: |a, b| a + b, int: |a, b| a.wrapping_add(b),
        wgsl: |a, b, ty| format!("({a} + {b})");
    /// Variadic mean.
    Mean float (variadic average) dtypes: NUMBERS,
        f: |a, b| a + b, int: |a, b| a.wrapping_add(b),
        wgsl: |a, b, ty| format!("({a} + {b})");
    Equal cmp () dtypes: ANY, f: |a, b| a == b, wgsl: |a, b, ty| format!("u32({a} == {b})");
    Less cmp () dtypes: ANY, f: |a, b| a < b, wgsl: |a, b, ty| format!("u32({a} < {b})");
    LessOrEqual cmp () dtypes: ANY, f: |a, b| a <= b, wgsl: |a, b, ty| format!("u32({a} <= {b})");
    Greater cmp () dtypes: ANY, f: |a, b| a > b, wgsl: |a, b, ty| format!("u32({a} > {b})");
    GreaterOrEqual cmp () dtypes: ANY, f: |a, b| a >= b, wgsl: |a, b, ty| format!("u32({a} >= {b})");
    And bool () dtypes: BOOL, f: |a, b| a && b, wgsl: |a, b, ty| format!("u32(({a} != 0u) && ({b} != 0u))");
    Or bool () dtypes: BOOL, f: |a, b| a || b, wgsl: |a, b, ty| format!("u32(({a} != 0u) || ({b} != 0u))");
    Xor bool () dtypes: BOOL, f: |a, b| a != b, wgsl: |a, b, ty| format!("u32(({a} != 0u) != ({b} != 0u))");
}
