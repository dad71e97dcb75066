//! The narrow element types: 8- and 4-bit floats and 4- and 2-bit integers.
//!
//! Kiln stores every one of them unpacked, one byte per element, so that kernels index
//! them like any other dtype: a float8 or float4 element is its bit pattern (low bits of
//! the byte), a 4- or 2-bit integer is its value (sign-extended into an `i8` for the
//! signed ones). Only files pack them (ONNX `raw_data` holds two 4-bit or four 2-bit
//! elements per byte, low bits first): see [`pack`] and [`unpack`].
//!
//! The conversions follow the ONNX Cast specification: round to nearest, ties to even;
//! with `saturate`, values beyond the largest finite magnitude (infinities included)
//! become that magnitude, without it they become infinity where the format has one and
//! NaN where it does not. FNUZ formats have no negative zero and one NaN (0x80).

use crate::DType;

/// How a minifloat format spends its special encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Specials {
    /// IEEE-like: the all-ones exponent holds infinities (mantissa 0) and NaNs (E5M2).
    Ieee,
    /// No infinities; only S.1111.111 is NaN (E4M3FN).
    FiniteNan,
    /// No infinities and no negative zero: 0x80 is the one NaN (E4M3FNUZ, E5M2FNUZ).
    Fnuz,
    /// Neither infinities nor NaN (E2M1).
    Finite,
}

/// A sign bit, `ebits` exponent bits and `mbits` mantissa bits.
#[derive(Clone, Copy, Debug)]
pub struct MiniFloat {
    ebits: u32,
    mbits: u32,
    bias: i32,
    specials: Specials,
}

impl MiniFloat {
    pub const E4M3FN: MiniFloat = MiniFloat { ebits: 4, mbits: 3, bias: 7, specials: Specials::FiniteNan };
    pub const E4M3FNUZ: MiniFloat = MiniFloat { ebits: 4, mbits: 3, bias: 8, specials: Specials::Fnuz };
    pub const E5M2: MiniFloat = MiniFloat { ebits: 5, mbits: 2, bias: 15, specials: Specials::Ieee };
    pub const E5M2FNUZ: MiniFloat = MiniFloat { ebits: 5, mbits: 2, bias: 16, specials: Specials::Fnuz };
    pub const E2M1: MiniFloat = MiniFloat { ebits: 2, mbits: 1, bias: 1, specials: Specials::Finite };

    /// The format of a float8/float4 dtype (not E8M0, which has no sign or mantissa).
    pub fn of(dtype: DType) -> Option<MiniFloat> {
        Some(match dtype {
            DType::F8E4M3FN => Self::E4M3FN,
            DType::F8E4M3FNUZ => Self::E4M3FNUZ,
            DType::F8E5M2 => Self::E5M2,
            DType::F8E5M2FNUZ => Self::E5M2FNUZ,
            DType::F4E2M1 => Self::E2M1,
            _ => return None,
        })
    }

    fn sign_bit(self) -> u8 {
        1 << (self.ebits + self.mbits)
    }

    fn exp_max(self) -> u32 {
        (1 << self.ebits) - 1
    }

    /// Smallest normal exponent (unbiased).
    pub fn emin(self) -> i32 {
        1 - self.bias
    }

    /// Mantissa bits.
    pub fn mbits(self) -> u32 {
        self.mbits
    }

    /// The code of the largest finite magnitude.
    fn max_code(self) -> u8 {
        let all = self.sign_bit() - 1;
        match self.specials {
            Specials::Ieee => all - (1 << self.mbits), // exponent all-ones is special
            Specials::FiniteNan => all - 1,            // only S.1..1.1..1 is NaN
            Specials::Fnuz | Specials::Finite => all,
        }
    }

    /// The largest finite value.
    pub fn max(self) -> f64 {
        self.decode(self.max_code())
    }

    fn nan(self, negative: bool) -> u8 {
        match self.specials {
            Specials::Ieee => ((self.exp_max() << self.mbits) as u8 | (1 << (self.mbits - 1))) | if negative { self.sign_bit() } else { 0 },
            Specials::FiniteNan => (self.sign_bit() - 1) | if negative { self.sign_bit() } else { 0 },
            Specials::Fnuz => 0x80,
            // E2M1 has no NaN; ONNX's reference (ml_dtypes) gives negative zero.
            Specials::Finite => self.sign_bit(),
        }
    }

    /// The value of a code (its low `1 + ebits + mbits` bits).
    pub fn decode(self, code: u8) -> f64 {
        let code = code & (self.sign_bit() | (self.sign_bit() - 1));
        let negative = code & self.sign_bit() != 0;
        let exp = ((code >> self.mbits) as u32) & self.exp_max();
        let man = (code as u32) & ((1 << self.mbits) - 1);
        let special = match self.specials {
            Specials::Fnuz if code == 0x80 => Some(f64::NAN),
            Specials::FiniteNan if exp == self.exp_max() && man == (1 << self.mbits) - 1 => Some(f64::NAN),
            Specials::Ieee if exp == self.exp_max() => Some(if man == 0 { f64::INFINITY } else { f64::NAN }),
            _ => None,
        };
        let magnitude = special.unwrap_or_else(|| {
            if exp == 0 {
                man as f64 * pow2(self.emin() - self.mbits as i32)
            } else {
                (1.0 + man as f64 * pow2(-(self.mbits as i32))) * pow2(exp as i32 - self.bias)
            }
        });
        if negative && !magnitude.is_nan() { -magnitude } else { magnitude }
    }

    /// The code of `x` rounded to nearest, ties to even.
    pub fn encode(self, x: f64, saturate: bool) -> u8 {
        if x.is_nan() {
            return self.nan(x.is_sign_negative());
        }
        let negative = x.is_sign_negative();
        let sign = if negative { self.sign_bit() } else { 0 };
        let overflow = || match (saturate, self.specials) {
            (true, _) | (_, Specials::Finite) => sign | self.max_code(),
            (false, Specials::Ieee) => sign | ((self.exp_max() << self.mbits) as u8),
            (false, _) => self.nan(negative),
        };
        let a = x.abs();
        if a.is_infinite() {
            return overflow();
        }
        // The spacing of representable values around `a`: exact powers of two, so the
        // division and the rounding below are exact in f64.
        let e = if a == 0.0 { self.emin() } else { a.log2().floor() as i32 };
        let e = if a != 0.0 && pow2(e) > a { e - 1 } else if a != 0.0 && pow2(e + 1) <= a { e + 1 } else { e };
        let ulp = pow2(e.max(self.emin()) - self.mbits as i32);
        let r = (a / ulp).round_ties_even() * ulp;
        if r > self.max() {
            return overflow();
        }
        let magnitude = if r == 0.0 {
            0
        } else if r < pow2(self.emin()) {
            (r / pow2(self.emin() - self.mbits as i32)) as u8
        } else {
            let e = r.log2().floor() as i32;
            let e = if pow2(e) > r { e - 1 } else if pow2(e + 1) <= r { e + 1 } else { e };
            let man = (r / pow2(e - self.mbits as i32)) as u32 - (1 << self.mbits);
            (((e + self.bias) as u32) << self.mbits | man) as u8
        };
        if magnitude == 0 && self.specials == Specials::Fnuz { 0 } else { sign | magnitude }
    }
}

/// How Cast rounds into float8e8m0 (its `round_mode` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E8M0Round {
    Up,
    Down,
    Nearest,
}

impl E8M0Round {
    pub fn parse(s: &str) -> Option<E8M0Round> {
        Some(match s {
            "up" => E8M0Round::Up,
            "down" => E8M0Round::Down,
            "nearest" => E8M0Round::Nearest,
            _ => return None,
        })
    }
}

/// float8e8m0: a bare biased exponent, 2^(code - 127); 0xFF is NaN.
pub fn e8m0_decode(code: u8) -> f64 {
    if code == 0xff { f64::NAN } else { pow2(code as i32 - 127) }
}

/// float8e8m0 of `x` (an f32: the format is defined on its exponent bits). The sign is
/// ignored (negative inputs are unspecified by ONNX); NaN and infinities give NaN.
pub fn e8m0_encode(x: f32, saturate: bool, round: E8M0Round) -> u8 {
    let bits = x.to_bits();
    let exp = (bits >> 23) & 0xff;
    if exp == 0xff {
        return 0xff;
    }
    let frac = bits & 0x7f_ffff;
    let up = match round {
        E8M0Round::Down => false,
        E8M0Round::Up => frac != 0,
        // Guard bit set, and round, sticky or the exponent's own low bit set.
        E8M0Round::Nearest => frac & 0x40_0000 != 0 && (frac & 0x3f_ffff != 0 || exp > 0),
    };
    let up = up && !(saturate && exp == 0xfe);
    (exp + up as u32) as u8
}

/// The narrow integer dtypes' bit widths and signedness.
pub fn narrow_int(dtype: DType) -> Option<(u32, bool)> {
    Some(match dtype {
        DType::I4 => (4, true),
        DType::U4 => (4, false),
        DType::I2 => (2, true),
        DType::U2 => (2, false),
        _ => return None,
    })
}

/// `v` wrapped into a narrow integer type (two's complement), as its stored byte.
pub fn wrap_int(v: i128, bits: u32, signed: bool) -> u8 {
    let low = (v as u128 & ((1u128 << bits) - 1)) as u8;
    if signed && low >> (bits - 1) != 0 { (low | !((1u8 << bits) - 1)) as u8 } else { low }
}

/// The stored byte of a narrow dtype's element as f64.
pub fn decode(dtype: DType, byte: u8) -> f64 {
    if let Some(f) = MiniFloat::of(dtype) {
        f.decode(byte)
    } else if dtype == DType::F8E8M0 {
        e8m0_decode(byte)
    } else if matches!(dtype, DType::I4 | DType::I2) {
        byte as i8 as f64
    } else {
        byte as f64
    }
}

/// Elements per byte in a packed file representation (2 for 4-bit, 4 for 2-bit types).
pub fn per_byte(dtype: DType) -> usize {
    match dtype {
        DType::I4 | DType::U4 | DType::F4E2M1 => 2,
        DType::I2 | DType::U2 => 4,
        _ => 1,
    }
}

/// Packs `n` stored elements of `dtype` into bytes, low bits first.
pub fn pack(dtype: DType, elements: &[u8]) -> Vec<u8> {
    let per = per_byte(dtype);
    let bits = 8 / per;
    let mask = ((1u16 << bits) - 1) as u8;
    elements.chunks(per).map(|c| c.iter().enumerate().fold(0u8, |b, (k, &e)| b | (e & mask) << (k * bits))).collect()
}

/// Unpacks `n` elements of `dtype` from packed bytes (sign-extending signed integers).
/// `None` when the bytes hold fewer than `n` elements.
pub fn unpack(dtype: DType, bytes: &[u8], n: usize) -> Option<Vec<u8>> {
    let per = per_byte(dtype);
    if bytes.len().checked_mul(per)? < n {
        return None;
    }
    let bits = (8 / per) as u32;
    let signed = matches!(dtype, DType::I4 | DType::I2);
    Some(
        (0..n)
            .map(|i| {
                let v = (bytes[i / per] >> ((i % per) as u32 * bits)) & ((1u16 << bits) - 1) as u8;
                if signed { wrap_int(v as i128, bits, true) } else { v }
            })
            .collect(),
    )
}

fn pow2(e: i32) -> f64 {
    2f64.powi(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for (f, name) in [(MiniFloat::E4M3FN, "e4m3fn"), (MiniFloat::E4M3FNUZ, "e4m3fnuz"), (MiniFloat::E5M2, "e5m2"), (MiniFloat::E5M2FNUZ, "e5m2fnuz"), (MiniFloat::E2M1, "e2m1")] {
            let codes = if f.ebits == 2 { 16 } else { 256 };
            for code in 0..codes as u8 {
                let v = f.decode(code);
                if v.is_nan() {
                    assert!(f.decode(f.encode(v, false)).is_nan(), "{name} {code:#x}");
                } else if v.is_infinite() {
                    assert_eq!(f.encode(v, false), code, "{name} {code:#x}");
                } else if !(v == 0.0 && f.specials == Specials::Fnuz) {
                    assert_eq!(f.encode(v, true), code, "{name} {code:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn known_values_from_the_onnx_reference() {
        // Values and codes as ml_dtypes (ONNX's reference) converts them.
        let f = MiniFloat::E4M3FN;
        assert_eq!(f.max(), 448.0);
        assert_eq!([448.0, 464.0, 465.0, 1e6].map(|x| f.encode(x, false)), [0x7e, 0x7e, 0x7f, 0x7f]);
        assert_eq!([1e6, f64::INFINITY, f64::NEG_INFINITY].map(|x| f.encode(x, true)), [0x7e, 0x7e, 0xfe]);
        assert_eq!(f.encode(f64::NEG_INFINITY, false), 0xff);
        assert_eq!(f.decode(f.encode(0.478_925_47, true)), 0.46875);
        assert_eq!(f.encode(-1e-9, true), 0x80);
        let f = MiniFloat::E4M3FNUZ;
        assert_eq!(f.max(), 240.0);
        assert_eq!([247.0, 248.0, -0.0, -1e-9].map(|x| f.encode(x, false)), [0x7f, 0x80, 0, 0]);
        let f = MiniFloat::E5M2;
        assert_eq!(f.max(), 57344.0);
        // 61440 is the tie between the largest finite value and 2^16: ties to even (and
        // IEEE 754's overflow threshold) give infinity; ml_dtypes alone gives 0x7b here.
        assert_eq!([61439.0, 61440.0, 61441.0, f64::INFINITY].map(|x| f.encode(x, false)), [0x7b, 0x7c, 0x7c, 0x7c]);
        assert_eq!(f.encode(f64::NAN, false), 0x7e);
        let f = MiniFloat::E5M2FNUZ;
        assert_eq!([57344.0, 61441.0].map(|x| f.encode(x, false)), [0x7f, 0x80]);
        let f = MiniFloat::E2M1;
        assert_eq!(f.max(), 6.0);
        assert_eq!([0.4, 0.25, 1.05, -3.5, 9.0, f64::INFINITY, 1e-7].map(|x| f.decode(f.encode(x, false))), [0.5, 0.0, 1.0, -4.0, 6.0, 6.0, 0.0]);
        assert_eq!(f.encode(f64::NAN, false), 0x8);
    }

    #[test]
    fn e8m0_rounding_modes() {
        assert_eq!(e8m0_encode(0.124, true, E8M0Round::Up), 124);
        assert_eq!(e8m0_decode(124), 0.125);
        assert_eq!(e8m0_encode(1.1, true, E8M0Round::Up), 128);
        assert_eq!(e8m0_encode(1.1, true, E8M0Round::Down), 127);
        assert_eq!(e8m0_encode(1.6, true, E8M0Round::Nearest), 128);
        assert_eq!(e8m0_encode(1.4, true, E8M0Round::Nearest), 127);
        assert_eq!(e8m0_encode(0.0, true, E8M0Round::Up), 0);
        assert_eq!(e8m0_encode(f32::MAX, true, E8M0Round::Up), 0xfe);
        assert_eq!(e8m0_encode(f32::MAX, false, E8M0Round::Up), 0xff);
        assert_eq!(e8m0_encode(f32::INFINITY, true, E8M0Round::Up), 0xff);
    }

    #[test]
    fn narrow_ints_wrap_and_pack() {
        assert_eq!([-9, 8, 7, -8, 15].map(|v| wrap_int(v, 4, true) as i8), [7, -8, 7, -8, -1]);
        assert_eq!([-9, 16, 15].map(|v| wrap_int(v, 4, false)), [7, 0, 15]);
        assert_eq!([-3, 2, 3].map(|v| wrap_int(v, 2, true) as i8), [1, -2, -1]);
        let v = [(-8i8) as u8, 7, (-1i8) as u8];
        let p = pack(DType::I4, &v);
        assert_eq!(p, vec![0x78, 0x0f]);
        assert_eq!(unpack(DType::I4, &p, 3).unwrap(), v.to_vec());
        assert!(unpack(DType::I4, &p, 5).is_none());
        let v = [1u8, 2, 3, 0, 1];
        assert_eq!(unpack(DType::U2, &pack(DType::U2, &v), 5).unwrap(), v.to_vec());
    }
}
