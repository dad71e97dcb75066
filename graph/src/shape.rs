//! [`Dim`], [`Shape`] and [`ValueType`]: the (possibly symbolic) types of graph values.

use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One dimension of a shape: a fixed size, or a named symbol (`batch`, `sequence`)
/// bound to a size when a session runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    Fixed(usize),
    Sym(String),
}

impl Dim {
    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Self {
        Dim::Sym(s.to_string())
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// A tensor shape whose dims may be symbolic.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The concrete dims, if no dim is symbolic.
    pub fn as_fixed(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::fixed).collect()
    }

    pub fn is_fixed(&self) -> bool {
        self.0.iter().all(|d| d.fixed().is_some())
    }

    /// Names of the symbolic dims, in order of appearance.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|d| match d {
            Dim::Sym(s) => Some(s.as_str()),
            Dim::Fixed(_) => None,
        })
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape::fixed(&v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape::fixed(v)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Which kind of value a graph value is: a tensor, or one of ONNX's host-side
/// containers of tensors (a sequence, an optional tensor, an optional sequence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueKind {
    #[default]
    Tensor,
    Sequence,
    OptionalTensor,
    OptionalSequence,
}

impl ValueKind {
    pub fn is_tensor(self) -> bool {
        self == ValueKind::Tensor
    }

    pub fn is_optional(self) -> bool {
        matches!(self, ValueKind::OptionalTensor | ValueKind::OptionalSequence)
    }

    /// The kind an optional holds (a tensor or a sequence); other kinds are themselves.
    pub fn element(self) -> ValueKind {
        match self {
            ValueKind::OptionalTensor => ValueKind::Tensor,
            ValueKind::OptionalSequence => ValueKind::Sequence,
            k => k,
        }
    }

    /// The optional of this kind (an optional stays itself).
    pub fn optional(self) -> ValueKind {
        match self {
            ValueKind::Tensor | ValueKind::OptionalTensor => ValueKind::OptionalTensor,
            ValueKind::Sequence | ValueKind::OptionalSequence => ValueKind::OptionalSequence,
        }
    }

    /// `ty` written as this kind's type: `f32[2,3]`, `seq(f32[2,3])`, `optional(...)`.
    pub fn describe(self, ty: &str) -> String {
        match self {
            ValueKind::Tensor => ty.to_string(),
            ValueKind::Sequence => format!("seq({ty})"),
            ValueKind::OptionalTensor => format!("optional({ty})"),
            ValueKind::OptionalSequence => format!("optional(seq({ty}))"),
        }
    }
}

/// Type of a value: its element type and its (possibly symbolic) shape. For a sequence
/// or an optional (`kind`), the dtype and shape are those of the tensors it holds (the
/// shape has a symbol for each dim the elements do not share, and is empty when even
/// their rank is unknown).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ValueType {
    pub dtype: DType,
    pub shape: Shape,
    #[serde(default, skip_serializing_if = "is_tensor_kind")]
    pub kind: ValueKind,
}

fn is_tensor_kind(k: &ValueKind) -> bool {
    k.is_tensor()
}

impl ValueType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Self {
        ValueType { dtype, shape: shape.into(), kind: ValueKind::Tensor }
    }

    /// A sequence or optional whose tensors are of `dtype` and `shape`.
    pub fn container(kind: ValueKind, dtype: DType, shape: impl Into<Shape>) -> Self {
        ValueType { dtype, shape: shape.into(), kind }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind.describe(&format!("{}{}", self.dtype, self.shape)))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape::fixed(&v)
    }
}
