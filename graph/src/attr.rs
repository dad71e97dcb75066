use crate::Tensor;
use std::collections::BTreeMap;

/// An attribute value of a node (ONNX AttributeProto, restricted to what Kiln runs).
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    String(String),
    Tensor(Tensor),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<String>),
}

impl Attr {
    pub fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::String(_) => "string",
            Attr::Tensor(_) => "tensor",
            Attr::Ints(_) => "ints",
            Attr::Floats(_) => "floats",
            Attr::Strings(_) => "strings",
        }
    }
}

/// The attributes of a node, by name (sorted, so dumps are stable).
pub type Attributes = BTreeMap<String, Attr>;
