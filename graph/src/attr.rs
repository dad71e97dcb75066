use crate::{Graph, Tensor, ValueType};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// A subgraph (the body of If, Loop, Scan). Closed: it reads nothing from the
    /// enclosing graph by name. Values it uses from outer scopes are extra inputs of
    /// the subgraph after the ones its op declares (`Graph::outer_inputs` of them), fed
    /// by the node's last inputs, in the same order (the ONNX importer makes them so;
    /// all subgraphs of a node take the same outer values).
    Graph(Arc<Graph>),
    /// A value type (ONNX TYPE_PROTO attributes, such as Optional's `type`).
    Type(ValueType),
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
            Attr::Graph(_) => "graph",
            Attr::Type(_) => "type",
        }
    }
}

/// The attributes of a node, by name (sorted, so dumps are stable).
pub type Attributes = BTreeMap<String, Attr>;
