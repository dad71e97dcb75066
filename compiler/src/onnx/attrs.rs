//! AttributeProto -> [`Attr`], and the folding of `Constant` nodes into tensors.

use super::proto::{attribute_type as at, AttributeProto};
use super::tensor::{convert, ExternalFiles};
use kiln_graph::{Attr, Tensor};

/// The attribute type, inferred from the set fields for old files that omit `type`.
pub(crate) fn kind(a: &AttributeProto) -> i32 {
    if a.r#type != at::UNDEFINED {
        return a.r#type;
    }
    if a.t.is_some() {
        at::TENSOR
    } else if a.g.is_some() {
        at::GRAPH
    } else if !a.floats.is_empty() {
        at::FLOATS
    } else if !a.ints.is_empty() {
        at::INTS
    } else if !a.strings.is_empty() {
        at::STRINGS
    } else if !a.tensors.is_empty() {
        at::TENSORS
    } else if !a.graphs.is_empty() {
        at::GRAPHS
    } else if !a.s.is_empty() {
        at::STRING
    } else if a.f != 0.0 {
        at::FLOAT
    } else {
        at::INT
    }
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "string is not valid UTF-8".to_string())
}

/// Converts one attribute. Errors are messages naming the attribute (the caller names
/// the node).
pub(crate) fn convert_attr(a: &AttributeProto, ext: &mut ExternalFiles) -> Result<Attr, String> {
    let name = &a.name;
    if !a.ref_attr_name.is_empty() {
        return Err(format!(
            "attribute '{name}' refers to function attribute '{}' (functions are not supported)",
            a.ref_attr_name
        ));
    }
    let code = kind(a);
    Ok(match code {
        at::FLOAT => Attr::Float(a.f),
        at::INT => Attr::Int(a.i),
        at::STRING => Attr::String(utf8(&a.s).map_err(|e| format!("attribute '{name}': {e}"))?),
        at::FLOATS => Attr::Floats(a.floats.clone()),
        at::INTS => Attr::Ints(a.ints.clone()),
        at::STRINGS => Attr::Strings(
            a.strings.iter().map(|s| utf8(s)).collect::<Result<_, _>>().map_err(|e| format!("attribute '{name}': {e}"))?,
        ),
        at::TENSOR => {
            let t = a.t.as_ref().ok_or_else(|| format!("attribute '{name}' is a TENSOR but holds none"))?;
            Attr::Tensor(convert(t, ext).map_err(|e| format!("attribute '{name}': {e}"))?)
        }
        at::TYPE_PROTO => {
            let tp = a.tp.as_ref().ok_or_else(|| format!("attribute '{name}' is a TYPE_PROTO but holds none"))?;
            Attr::Type(super::import::type_of(tp).map_err(|e| format!("attribute '{name}': {e}"))?)
        }
        // Subgraphs (GRAPH) are read by the importer, which makes them closed graphs.
        at::GRAPH => return Err(format!("attribute '{name}' is a subgraph, which only the importer reads")),
        at::GRAPHS => return Err(format!("attribute '{name}' is a list of subgraphs (GRAPHS), which Kiln does not support")),
        c => return Err(format!("attribute '{name}' has type {}, which Kiln does not support", at::name(c))),
    })
}

/// The value of a `Constant` node, from whichever `value*` attribute it has.
pub(crate) fn constant_value(attrs: &[AttributeProto], ext: &mut ExternalFiles) -> Result<Tensor, String> {
    let [a] = attrs else {
        return Err(format!("a Constant needs exactly one attribute, found {}", attrs.len()));
    };
    let value = convert_attr(a, ext);
    let wrong = |expected: &str| format!("attribute '{}' should be {expected}", a.name);
    match (a.name.as_str(), value?) {
        ("value", Attr::Tensor(t)) => Ok(t),
        ("value_float", Attr::Float(v)) => Ok(Tensor::scalar(v)),
        ("value_int", Attr::Int(v)) => Ok(Tensor::scalar(v)),
        ("value_floats", Attr::Floats(v)) => Tensor::from_slice(&[v.len()], &v).map_err(|e| e.to_string()),
        ("value_ints", Attr::Ints(v)) => Tensor::from_slice(&[v.len()], &v).map_err(|e| e.to_string()),
        // An empty list has no set field, so its kind reads as INT.
        ("value_floats", Attr::Int(0)) => Ok(Tensor::zeros(kiln_graph::DType::F32, &[0])),
        ("value_ints", Attr::Int(0)) => Ok(Tensor::zeros(kiln_graph::DType::I64, &[0])),
        ("value_string", Attr::String(v)) => Ok(Tensor::from_strings(&[], vec![v]).map_err(|e| e.to_string())?),
        ("value_strings", Attr::Strings(v)) => Tensor::from_strings(&[v.len()], v).map_err(|e| e.to_string()),
        ("value_strings", Attr::Int(0)) => Ok(Tensor::zeros(kiln_graph::DType::String, &[0])),
        ("value_string", _) => Err(wrong("a string")),
        ("value_strings", _) => Err(wrong("a list of strings")),
        ("sparse_value", _) => Err("sparse constants are not supported".into()),
        ("value", _) => Err(wrong("a tensor")),
        ("value_float", _) => Err(wrong("a float")),
        ("value_int", _) => Err(wrong("an int")),
        ("value_floats", _) => Err(wrong("a list of floats")),
        ("value_ints", _) => Err(wrong("a list of ints")),
        (other, _) => Err(format!("unknown Constant attribute '{other}'")),
    }
}
