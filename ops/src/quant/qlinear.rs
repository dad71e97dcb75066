//! What onnxruntime's quantized contrib ops (domain `com.microsoft`) share: their
//! per-tensor scale and zero point inputs, MLAS's requantization (`cvtps2dq`: round half
//! to even, NaN and out-of-range values to `i32::MIN`, then clamped into the output
//! type's range around the zero point) on the CPU and in WGSL, and the 256-entry
//! lookup tables through which onnxruntime computes unary ops on 8-bit data.
use crate::cpu;
use crate::op::{expect_dtype, required};
use crate::wgsl;
use crate::{Arg, OpError, Result};
use kiln_graph::{DType, Tensor};

/// The ONNX domain of onnxruntime's contrib ops.
pub(crate) const MS_DOMAIN: &str = "com.microsoft";

/// The 8-bit types the contrib ops quantize to.
pub(crate) const Q8: [DType; 2] = [DType::U8, DType::I8];

/// Scales are f32 in every contrib op.
pub(crate) const SCALE: [DType; 1] = [DType::F32];

/// The integer range of a quantized dtype.
pub(crate) fn bounds(d: DType) -> (i32, i32) {
    match d {
        DType::I8 => (-128, 127),
        _ => (0, 255),
    }
}

/// x86's `cvtps2dq` in the default rounding mode, which MLAS converts with: round half
/// to even; NaN and values outside i32 give `i32::MIN`.
#[inline(always)]
pub(crate) fn round_i32(x: f32) -> i32 {
    if (-2147483648.0..2147483648.0).contains(&x) {
        x.round_ties_even() as i32
    } else {
        i32::MIN
    }
}

/// MLAS's requantization of a value already divided by the output scale: rounded
/// ([`round_i32`]), clamped to the output range shifted by the zero point, plus the
/// zero point. (MlasQuantizeLinear clamps before rounding; the bounds are integers, so
/// the result is the same.)
#[inline(always)]
pub(crate) fn requantize(x: f32, zp: i32, (lo, hi): (i32, i32)) -> i32 {
    round_i32(x).clamp(lo - zp, hi - zp) + zp
}

/// WGSL of [`round_i32`] and [`requantize`] (`fn q_round(x: f32) -> i32`, `fn
/// q_requantize(x: f32, zp: i32, lo: i32, hi: i32) -> i32`), and the exact f32
/// arithmetic that a value rounded to an integer needs to come out as the CPU's, bit for
/// bit, on every GPU:
///
/// - `fn q_div(a: f32, b: f32) -> f32`: the correctly rounded quotient. WGSL's `/` may
///   be 2.5 ulp off (Vulkan allows it, and NVIDIA's is), and a quotient 1 ulp off rounds
///   to the other integer when it lies near a half. Integer long division over the
///   24-bit significands. Zeros, infinities and NaN give IEEE's results (NVIDIA's `/`
///   gives NaN for `inf / 3e38`), an overflow gives an infinity, and a subnormal
///   operand or quotient takes `/` (a GPU may flush subnormals anyway).
/// - `fn q_mul(a: f32, b: f32, i: u32) -> f32`: the product rounded to f32 on its own.
///   A driver may fuse `a * b + c` into one fused multiply-add with one rounding (SPIR-V
///   allows it unless told otherwise, and WGSL cannot tell it), the CPU rounds twice. The
///   product passes through an integer OR with `i == 0xffffffff` (the invocation index,
///   never that large), which the compiler cannot fold away.
pub const WGSL_REQUANTIZE: &str = "fn q_round(x: f32) -> i32 {\n\
    \x20   if (x >= -2147483648.0 && x < 2147483648.0) { return i32(round(x)); }\n\
    \x20   return i32(-2147483648);\n}\n\
    fn q_requantize(x: f32, zp: i32, lo: i32, hi: i32) -> i32 {\n\
    \x20   return clamp(q_round(x), lo - zp, hi - zp) + zp;\n}\n\
    fn q_div(a: f32, b: f32) -> f32 {\n\
    \x20   let ua = bitcast<u32>(a);\n    let ub = bitcast<u32>(b);\n\
    \x20   let ea = i32((ua >> 23u) & 0xffu);\n    let eb = i32((ub >> 23u) & 0xffu);\n\
    \x20   let sign = (ua ^ ub) & 0x80000000u;\n\
    \x20   if (ea == 0 || ea == 255 || eb == 0 || eb == 255) {\n\
    \x20       let na = ea == 255 && (ua & 0x7fffffu) != 0u;\n        let nb = eb == 255 && (ub & 0x7fffffu) != 0u;\n\
    \x20       let ia = ea == 255 && !na;\n        let ib = eb == 255 && !nb;\n\
    \x20       let za = (ua & 0x7fffffffu) == 0u;\n        let zb = (ub & 0x7fffffffu) == 0u;\n\
    \x20       if (na || nb || (ia && ib) || (za && zb)) { return bitcast<f32>(0x7fc00000u); }\n\
    \x20       if (ia || zb) { return bitcast<f32>(sign | 0x7f800000u); }\n\
    \x20       if (ib || za) { return bitcast<f32>(sign); }\n\
    \x20       return a / b;\n\
    \x20   }\n\
    \x20   let mb = (ub & 0x7fffffu) | 0x800000u;\n    var r = (ua & 0x7fffffu) | 0x800000u;\n\
    \x20   var e = ea - eb + 127;\n\
    \x20   if (r < mb) { r = r << 1u; e = e - 1; }\n\
    \x20   var q = 0u;\n\
    \x20   for (var k = 0u; k < 25u; k++) { let ge = r >= mb; r = select(r, r - mb, ge) << 1u; q = (q << 1u) | u32(ge); }\n\
    \x20   let half = q & 1u;\n    q = q >> 1u;\n\
    \x20   if (half == 1u && (r != 0u || (q & 1u) == 1u)) { q = q + 1u; }\n\
    \x20   if (q == 0x1000000u) { q = 0x800000u; e = e + 1; }\n\
    \x20   if (e >= 255) { return bitcast<f32>(sign | 0x7f800000u); }\n\
    \x20   if (e <= 0) { return a / b; }\n\
    \x20   return bitcast<f32>(sign | (u32(e) << 23u) | (q & 0x7fffffu));\n}\n\
    fn q_mul(a: f32, b: f32, i: u32) -> f32 {\n\
    \x20   return bitcast<f32>(bitcast<u32>(a * b) | u32(i == 0xffffffffu));\n}\n";

/// Checks that input `i` holds one value (a per-tensor scale or zero point) of one of
/// `dtypes`; an absent optional input passes.
pub(crate) fn check_scalar(inputs: &[Option<Arg>], i: usize, dtypes: &[DType], optional: bool) -> Result<()> {
    let Some(a) = inputs.get(i).copied().flatten() else {
        return if optional { Ok(()) } else { Err(OpError::input(i, "required input is missing")) };
    };
    expect_dtype(inputs, i, dtypes)?;
    if a.ty.len() != 1 {
        return Err(OpError::input(i, format!("expected a per-tensor value (one element), got shape {:?}", a.dims())));
    }
    Ok(())
}

/// Checks that optional zero point `i`, when present, has the dtype `of` of the data it
/// belongs to (and one element).
pub(crate) fn check_zero_point(inputs: &[Option<Arg>], i: usize, of: DType) -> Result<()> {
    check_scalar(inputs, i, &[of], true)
}

/// The first element of input `i` as f32 (scales).
pub(crate) fn scalar_f32(inputs: &[Option<&Tensor>], i: usize) -> Result<f32> {
    let t = cpu::input(inputs, i)?;
    t.to_f64_vec().first().map(|&v| v as f32).ok_or_else(|| OpError::input(i, "expected one element, got none"))
}

/// The first element of zero point `i` as i32, 0 when the input is absent.
pub(crate) fn zero_point(inputs: &[Option<&Tensor>], i: usize) -> Result<i32> {
    match inputs.get(i).copied().flatten() {
        None => Ok(0),
        Some(t) => t.to_i64_vec()?.first().map(|&v| v as i32).ok_or_else(|| OpError::input(i, "expected one element, got none")),
    }
}

/// The integer values of 8-bit data as i32.
pub(crate) fn ints(t: &Tensor) -> Result<Vec<i32>> {
    match t.dtype() {
        DType::U8 => Ok(t.as_slice::<u8>()?.iter().map(|&v| v as i32).collect()),
        DType::I8 => Ok(t.as_slice::<i8>()?.iter().map(|&v| v as i32).collect()),
        d => Err(OpError::Unsupported(format!("quantized data of dtype {d}"))),
    }
}

/// Writes integer results into an 8-bit output.
pub(crate) fn write_ints(out: &mut Tensor, v: &[i32]) -> Result<()> {
    match out.dtype() {
        DType::U8 => out.as_mut_slice::<u8>()?.iter_mut().zip(v).for_each(|(o, &x)| *o = x as u8),
        DType::I8 => out.as_mut_slice::<i8>()?.iter_mut().zip(v).for_each(|(o, &x)| *o = x as i8),
        d => return Err(OpError::Unsupported(format!("quantized output of dtype {d}"))),
    }
    Ok(())
}

/// The value a byte of 8-bit data of dtype `d` stands for.
fn byte_value(d: DType, b: usize) -> i32 {
    if d == DType::I8 { b as u8 as i8 as i32 } else { b as i32 }
}

/// Per-tensor quantization parameters of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QParams {
    pub scale: f32,
    pub zp: i32,
}

impl QParams {
    /// Scale input `si` and optional zero point `zi` of a run.
    pub fn of(inputs: &[Option<&Tensor>], si: usize, zi: usize) -> Result<QParams> {
        Ok(QParams { scale: scalar_f32(inputs, si)?, zp: zero_point(inputs, zi)? })
    }

    /// The same from constant inputs, `None` when one is not constant.
    pub fn constant(inputs: &[Option<Arg>], si: usize, zi: usize) -> Option<QParams> {
        let scale = required(inputs, si).ok()?.value?.to_f64_vec().first().copied()? as f32;
        let zp = match inputs.get(zi).copied().flatten() {
            None => 0,
            Some(z) => *z.value?.to_i64_vec().ok()?.first()? as i32,
        };
        Some(QParams { scale, zp })
    }

    /// onnxruntime's dequantization of one value, `scale * (x - zp)` in f32.
    #[inline(always)]
    pub fn dequantize(&self, x: i32) -> f32 {
        self.scale * (x.wrapping_sub(self.zp)) as f32
    }
}

/// onnxruntime's lookup table of a unary op on 8-bit data of dtype `d`
/// (QlinearBuildLookupTable): entry `b` is the op's result for the value byte `b`
/// stands for, dequantized with `x`, transformed by `f` in f32 and quantized with `y`
/// (MlasQuantizeLinear: divided by the scale, rounded, plus the zero point).
pub(crate) fn lookup_table(d: DType, x: QParams, y: QParams, f: impl Fn(f32) -> f32) -> [i32; 256] {
    let range = bounds(d);
    std::array::from_fn(|b| requantize(f(x.dequantize(byte_value(d, b))) / y.scale, y.zp, range))
}

/// Maps 8-bit data through a table (indexed by the raw byte).
pub(crate) fn apply_table(x: &Tensor, table: &[i32; 256], out: &mut Tensor) -> Result<()> {
    let src = x.bytes();
    match out.dtype() {
        DType::U8 => cpu::par_chunks_mut(out.as_mut_slice::<u8>()?, 1, 1, |first, part| {
            part.iter_mut().zip(&src[first..]).for_each(|(o, &b)| *o = table[b as usize] as u8)
        }),
        DType::I8 => cpu::par_chunks_mut(out.as_mut_slice::<i8>()?, 1, 1, |first, part| {
            part.iter_mut().zip(&src[first..]).for_each(|(o, &b)| *o = table[b as usize] as i8)
        }),
        d => return Err(OpError::Unsupported(format!("lookup table to {d}"))),
    }
    Ok(())
}

/// WGSL declaring a table as `const {name} = array<i32, 256>(...)`.
pub(crate) fn wgsl_table(name: &str, table: &[i32; 256]) -> String {
    let values: Vec<String> = table.iter().map(|v| format!("{v}i")).collect();
    format!("const {name} = array<i32, 256>({});\n", values.join(", "))
}

/// The WGSL expression of the table index of element `e` (a u32 or i32 expression) of
/// 8-bit data of dtype `d`: its raw byte.
pub(crate) fn wgsl_byte(d: DType, e: &str) -> String {
    if d == DType::I8 { format!("(bitcast<u32>({e}) & 255u)") } else { format!("({e})") }
}

/// How a kernel reads per-tensor parameters in WGSL: from bound scalar inputs, or as
/// literals when the parameters are constant.
pub(crate) struct WgslParams {
    /// `(name, input index, element type)` of every buffer to bind.
    pub buffers: Vec<(String, usize, &'static str)>,
}

impl WgslParams {
    pub fn new() -> WgslParams {
        WgslParams { buffers: vec![] }
    }

    /// The WGSL expression of a scale (f32) at input `i`, bound as `name`.
    pub fn scale(&mut self, inputs: &[Option<Arg>], i: usize, name: &str) -> Result<String> {
        let a = required(inputs, i)?;
        if let Some(v) = a.value.and_then(|v| v.to_f64_vec().first().copied()) {
            return Ok(wgsl::literal("f32", v));
        }
        self.buffers.push((name.to_string(), i, "f32"));
        Ok(format!("{name}[0]"))
    }

    /// The WGSL i32 expression of an optional zero point at input `i`.
    pub fn zero_point(&mut self, inputs: &[Option<Arg>], i: usize, name: &str) -> Result<String> {
        let Some(a) = inputs.get(i).copied().flatten() else { return Ok("0i".into()) };
        if let Some(v) = a.value.and_then(|v| v.to_i64_vec().ok()).and_then(|v| v.first().copied()) {
            return Ok(wgsl::literal("i32", v as f64));
        }
        self.buffers.push((name.to_string(), i, wgsl::elem(a.dtype())));
        Ok(format!("i32({name}[0])"))
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Builders of the contrib ops' unit tests (expected values come from onnxruntime
    //! 1.32, computed once and written into the tests).
    use crate::testing::Case;
    use kiln_graph::Tensor;

    /// A case of a `com.microsoft` op (opset 1).
    pub fn ms(op: &str) -> Case {
        Case::new(op).domain(super::MS_DOMAIN).opset(1)
    }

    pub fn u8s(dims: &[usize], v: &[u8]) -> Tensor {
        Tensor::from_slice(dims, v).unwrap()
    }

    pub fn i8s(dims: &[usize], v: &[i8]) -> Tensor {
        Tensor::from_slice(dims, v).unwrap()
    }

    /// A scalar f32 (scales).
    pub fn f(v: f32) -> Tensor {
        Tensor::scalar(v)
    }

    /// The integer values of an output.
    pub fn ints(t: &Tensor) -> Vec<i64> {
        t.to_i64_vec().unwrap()
    }
}
