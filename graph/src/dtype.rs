//! [`DType`] (ONNX element types with their sizes, codes and numpy names) and
//! [`Element`], the Rust types tensors hold.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor. The names follow ONNX's TensorProto.DataType.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    /// float8 E4M3, finite (no infinities, one NaN per sign); stored as its bit pattern.
    F8E4M3FN,
    /// float8 E4M3, finite, unsigned zero (no negative zero, NaN is 0x80).
    F8E4M3FNUZ,
    /// float8 E5M2, IEEE-like (infinities and NaNs).
    F8E5M2,
    /// float8 E5M2, finite, unsigned zero.
    F8E5M2FNUZ,
    /// float8 E8M0: an unsigned power of two, 2^(code - 127), for microscaling.
    F8E8M0,
    /// float4 E2M1 (one byte per element, low 4 bits).
    F4E2M1,
    /// 4-bit signed integer (one byte per element, sign-extended).
    I4,
    /// 4-bit unsigned integer (one byte per element).
    U4,
    /// 2-bit signed integer (one byte per element, sign-extended).
    I2,
    /// 2-bit unsigned integer (one byte per element).
    U2,
    /// UTF-8 strings. Not bytes: a string tensor holds Rust `String`s (see
    /// [`crate::Tensor::as_strings`]), lives on the host and never in an arena or a GPU
    /// buffer; only the ops that say so take it (`Op::handles_strings`).
    String,
}

impl DType {
    /// The dtypes stored as bytes (every dtype but [`DType::String`]).
    pub const ALL: [DType; 23] = [
        DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8, DType::I16, DType::I32,
        DType::I64, DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool,
        DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F8E8M0,
        DType::F4E2M1, DType::I4, DType::U4, DType::I2, DType::U2,
    ];

    /// The dtypes arithmetic kernels compute in (every dtype but the narrow ones).
    pub const COMPUTE: [DType; 13] = [
        DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8, DType::I16, DType::I32,
        DType::I64, DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            // Narrow dtypes are stored unpacked, one element per byte (see `narrow`).
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0
            | DType::F4E2M1 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            // Nominal (a handle per element): what memory plans and limits count; the
            // characters live on the heap.
            DType::String => 8,
        }
    }

    /// True for [`DType::String`], the one dtype whose elements are not bytes.
    pub fn is_string(self) -> bool {
        self == DType::String
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32 | DType::U64
        )
    }

    /// The float8, float4, 4-bit and 2-bit dtypes: storage and conversion only (Cast,
    /// QuantizeLinear, DequantizeLinear and data movement); arithmetic kernels refuse them.
    pub fn is_narrow(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0
                | DType::F4E2M1 | DType::I4 | DType::U4 | DType::I2 | DType::U2
        )
    }

    /// The narrow float dtypes (float8 and float4).
    pub fn is_narrow_float(self) -> bool {
        self.is_narrow() && !matches!(self, DType::I4 | DType::U4 | DType::I2 | DType::U2)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::I4 | DType::I2)
            || self.is_float()
            || (self.is_narrow_float() && self != DType::F8E8M0)
    }

    /// The ONNX TensorProto.DataType code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3FN => 17,
            DType::F8E4M3FNUZ => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2FNUZ => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
            DType::F8E8M0 => 24,
            DType::U2 => 25,
            DType::I2 => 26,
            DType::String => 8,
        }
    }

    /// The dtype for an ONNX TensorProto.DataType code, if Kiln supports it.
    pub fn from_onnx_code(code: i32) -> Option<DType> {
        DType::ALL.into_iter().chain([DType::String]).find(|d| d.onnx_code() == code)
    }

    /// Short lowercase name, as in `f32`, `i64`, `bool`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F8E8M0 => "f8e8m0",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
            DType::String => "string",
        }
    }

    /// numpy's dtype descriptor (little endian), as used in .npy headers; `None` for the
    /// narrow dtypes, which numpy lacks.
    pub fn numpy_descr(self) -> Option<&'static str> {
        Some(match self {
            DType::F32 => "<f4",
            DType::F16 => "<f2",
            DType::BF16 => "<V2",
            DType::F64 => "<f8",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::Bool => "|b1",
            _ => return None,
        })
    }

    pub fn from_numpy_descr(descr: &str) -> Option<DType> {
        let d = descr.replace('=', "<");
        DType::ALL.into_iter().find(|t| t.numpy_descr().is_some_and(|n| n == d || n.replace('|', "<") == d))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of a tensor of some [`DType`].
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static + fmt::Debug {
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(half::f16, F16);
element!(half::bf16, BF16);
element!(i8, I8);
element!(i16, I16);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);
element!(u16, U16);
element!(u32, U32);
element!(u64, U64);
