//! Cast to and from strings, as the ONNX reference (numpy's `astype(str)` and
//! `astype(float)`) does it.
//!
//! Numbers to strings: integers in decimal; bool as `True`/`False`; floats as the
//! shortest digits that read back to the same value of their dtype, positional when
//! `1e-4 <= |x| < 10^p` (p = 16 for f64, 7 for f32 and the float8/float4 types, 3 for
//! f16 and bf16) and otherwise scientific with a signed exponent of at least two digits
//! (`1e-05`, `1.2345679e+08`); `nan`, `inf`, `-inf`.
//! Strings to numbers: surrounding whitespace is ignored; floats read plain and
//! scientific notation and `nan`/`inf`/`infinity` in any case and with a sign; integers
//! read as integers (else as a float truncated toward zero), then wrap like every
//! integer Cast; bool reads `true`/`false` in any case or a number (`!= 0`). A string
//! that is no number is an error naming it.
use crate::{OpError, Result};
use half::{bf16, f16};
use kiln_graph::{DType, Tensor};

/// `dst = cast(src)` where one side is a string tensor; `via` converts between the
/// numeric dtypes (the wide intermediate and `dst`).
pub(crate) fn cast(src: &Tensor, dst: &mut Tensor, via: impl Fn(&Tensor, &mut Tensor) -> Result<()>) -> Result<()> {
    let dims = dst.dims().to_vec();
    match (src.dtype(), dst.dtype()) {
        (DType::String, DType::String) => *dst = src.reshaped(&dims)?,
        (from, DType::String) => *dst = Tensor::from_strings(&dims, to_strings(src, from)?)?,
        (_, to) => {
            let wide = from_strings(src.as_strings()?, &dims, to)?;
            via(&wide, dst)?;
        }
    }
    Ok(())
}

/// The decimal digits of a float's exponent threshold: positional below `10^p`.
fn positional_digits(dtype: DType) -> i32 {
    match dtype {
        DType::F64 => 16,
        DType::F16 | DType::BF16 => 3,
        _ => 7,
    }
}

fn to_strings(t: &Tensor, dtype: DType) -> Result<Vec<String>> {
    if dtype == DType::Bool {
        return Ok(t.bytes().iter().map(|&b| if b != 0 { "True" } else { "False" }.to_string()).collect());
    }
    if dtype.is_int() || matches!(dtype, DType::I4 | DType::U4 | DType::I2 | DType::U2) {
        return Ok(match dtype {
            DType::U64 => t.as_slice::<u64>()?.iter().map(|v| v.to_string()).collect(),
            _ => t.to_i64_vec()?.iter().map(|v| v.to_string()).collect(),
        });
    }
    let p = positional_digits(dtype);
    let same: fn(f64, f64) -> bool = match dtype {
        DType::F64 => |a, b| a == b,
        DType::F16 => |a, b| f16::from_f64(a) == f16::from_f64(b),
        DType::BF16 => |a, b| bf16::from_f64(a) == bf16::from_f64(b),
        // f32 and the narrow floats (whose values are all exact in f32).
        _ => |a, b| a as f32 == b as f32,
    };
    Ok(t.to_f64_vec().into_iter().map(|v| format_float(v, p, same)).collect())
}

/// `v` as numpy prints a float whose dtype `same` compares in (see the module docs).
pub(crate) fn format_float(v: f64, p: i32, same: fn(f64, f64) -> bool) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // The shortest scientific form that reads back to the same value.
    let sci = (0..17usize)
        .map(|digits| format!("{v:.digits$e}"))
        .find(|s| s.parse::<f64>().is_ok_and(|r| same(r, v)))
        .unwrap_or_else(|| format!("{v:e}"));
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if mantissa.starts_with('-') { "-" } else { "" };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    if v.abs() >= 1e-4 && v.abs() < 10f64.powi(p) {
        let body = if exp >= 0 {
            let e = exp as usize;
            let int: String = digits.chars().chain(std::iter::repeat('0')).take(e + 1).collect();
            let frac = digits.get(e + 1..).filter(|f| !f.is_empty()).unwrap_or("0");
            format!("{int}.{frac}")
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        format!("{sign}{first}{dot}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// Strings read as numbers: an f64 tensor for float and bool targets, an i64 tensor
/// for integer targets (u64 for u64, so that large values survive).
fn from_strings(s: &[String], dims: &[usize], to: DType) -> Result<Tensor> {
    let bad = |i: usize, v: &str| OpError::invalid(format!("element {i} ({v:?}) is not a number (casting strings to {to})"));
    if to == DType::U64 {
        let v = s.iter().enumerate().map(|(i, v)| parse_int(v).map(|x| x as u64).ok_or_else(|| bad(i, v.as_str()))).collect::<Result<Vec<u64>>>()?;
        return Ok(Tensor::from_slice(dims, &v)?);
    }
    if to.is_int() || matches!(to, DType::I4 | DType::U4 | DType::I2 | DType::U2) {
        let v = s.iter().enumerate().map(|(i, v)| parse_int(v).map(|x| x as i64).ok_or_else(|| bad(i, v.as_str()))).collect::<Result<Vec<i64>>>()?;
        return Ok(Tensor::from_slice(dims, &v)?);
    }
    let parse = |i: usize, v: &String| -> Result<f64> {
        let t = v.trim();
        if to == DType::Bool {
            if t.eq_ignore_ascii_case("true") {
                return Ok(1.0);
            }
            if t.eq_ignore_ascii_case("false") {
                return Ok(0.0);
            }
        }
        t.parse::<f64>().map_err(|_| bad(i, v.as_str()))
    };
    let v = s.iter().enumerate().map(|(i, v)| parse(i, v)).collect::<Result<Vec<f64>>>()?;
    Ok(Tensor::from_slice(dims, &v)?)
}

/// An integer string, or a float one truncated toward zero (i128 keeps u64 and i64).
fn parse_int(v: &str) -> Option<i128> {
    let t = v.trim();
    t.parse::<i128>().ok().or_else(|| t.parse::<f64>().ok().filter(|f| f.is_finite()).map(|f| f.trunc() as i128))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use kiln_graph::Attr;

    fn cast(x: Tensor, to: DType) -> crate::Result<Tensor> {
        Ok(Case::new("Cast").opset(21).input(x).attr("to", Attr::Int(to.onnx_code() as i64)).run_cpu()?.remove(0))
    }

    #[test]
    fn floats_print_as_numpy_prints_them() {
        let x = f32s(&[9], &[1e8, 123456789.0, 1e-4, 1e-5, 1.0, -0.0, 0.1, 3.14159, f32::NEG_INFINITY]);
        let y = cast(x, DType::String).unwrap();
        assert_eq!(y.as_strings().unwrap(), ["1e+08", "1.2345679e+08", "1e-04", "1e-05", "1.0", "-0.0", "0.1", "3.14159", "-inf"]);
        let x = Tensor::from_slice(&[3], &[100000000.0f64, 1e16, 0.0001]).unwrap();
        assert_eq!(cast(x, DType::String).unwrap().as_strings().unwrap(), ["100000000.0", "1e+16", "0.0001"]);
        let x = Tensor::from_slice(&[2], &[f16::from_f32(1000.0), f16::from_f32(3.14159)]).unwrap();
        assert_eq!(cast(x, DType::String).unwrap().as_strings().unwrap(), ["1e+03", "3.14"]);
        assert_eq!(cast(i64_vec(&[-3, 7]), DType::String).unwrap().as_strings().unwrap(), ["-3", "7"]);
        assert_eq!(cast(bools(&[2], &[true, false]), DType::String).unwrap().as_strings().unwrap(), ["True", "False"]);
    }

    #[test]
    fn strings_parse_as_numbers() {
        let s = strs(&[5], &["1.5", " 1e-5", "NaN", "-INF", "+inf"]);
        let y = cast(s, DType::F32).unwrap();
        let v = y.as_slice::<f32>().unwrap();
        assert_eq!((v[0], v[1], v[3], v[4]), (1.5, 1e-5, f32::NEG_INFINITY, f32::INFINITY));
        assert!(v[2].is_nan());
        assert_eq!(cast(strs(&[3], &["12", "-7", "3.9"]), DType::I32).unwrap().to_i64_vec().unwrap(), vec![12, -7, 3]);
        assert_eq!(cast(strs(&[3], &["True", "false", "2"]), DType::Bool).unwrap().to_i64_vec().unwrap(), vec![1, 0, 1]);
        let e = cast(strs(&[2], &["1", "one"]), DType::F32).unwrap_err().to_string();
        assert!(e.contains("\"one\"") && e.contains("element 1"), "{e}");
        let like = Case::new("CastLike").opset(21).input(f32s(&[1], &[2.5])).input(strs(&[0], &[])).run_cpu().unwrap();
        assert_eq!(like[0].as_strings().unwrap(), ["2.5"]);
    }
}
