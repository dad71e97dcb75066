//! The ONNX protobuf messages, declared with prost derive macros (no protoc, no build
//! script). Only the fields Kiln reads are declared; prost skips the others when
//! decoding. Field numbers follow onnx.proto (proto2); fields are declared without
//! presence, so an absent field reads as its default (0, "", empty).
//!
//! `bytes` fields decode as [`bytes::Bytes`]: decoding from a `Bytes` buffer slices it
//! instead of copying, so initializer data is copied once, into the [`kiln_graph::Tensor`].

use bytes::Bytes;

/// A model file: the graph plus the operator sets it was written against.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
}

/// One operator set import: a domain ("" or "ai.onnx" for the default) and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// AttributeProto.AttributeType codes.
pub mod attribute_type {
    pub const UNDEFINED: i32 = 0;
    pub const FLOAT: i32 = 1;
    pub const INT: i32 = 2;
    pub const STRING: i32 = 3;
    pub const TENSOR: i32 = 4;
    pub const GRAPH: i32 = 5;
    pub const FLOATS: i32 = 6;
    pub const INTS: i32 = 7;
    pub const STRINGS: i32 = 8;
    pub const TENSORS: i32 = 9;
    pub const GRAPHS: i32 = 10;
    pub const SPARSE_TENSOR: i32 = 11;
    pub const SPARSE_TENSORS: i32 = 12;
    pub const TYPE_PROTO: i32 = 13;
    pub const TYPE_PROTOS: i32 = 14;

    /// The ONNX name of a code, for messages.
    pub fn name(code: i32) -> &'static str {
        match code {
            FLOAT => "FLOAT",
            INT => "INT",
            STRING => "STRING",
            TENSOR => "TENSOR",
            GRAPH => "GRAPH",
            FLOATS => "FLOATS",
            INTS => "INTS",
            STRINGS => "STRINGS",
            TENSORS => "TENSORS",
            GRAPHS => "GRAPHS",
            SPARSE_TENSOR => "SPARSE_TENSOR",
            SPARSE_TENSORS => "SPARSE_TENSORS",
            TYPE_PROTO => "TYPE_PROTO",
            TYPE_PROTOS => "TYPE_PROTOS",
            _ => "UNDEFINED",
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    /// An [`attribute_type`] code.
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// Set in function bodies: the attribute refers to an attribute of the caller.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
}

/// TensorProto.DataType codes Kiln names in messages (the supported ones map to
/// [`kiln_graph::DType::from_onnx_code`]).
pub fn data_type_name(code: i32) -> &'static str {
    match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        27 => "FLOAT6E2M3",
        28 => "FLOAT6E3M2",
        _ => "unknown",
    }
}

/// TensorProto.DataLocation: the data is in an external file.
pub const DATA_LOCATION_EXTERNAL: i32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// int32, and the 8/16-bit types (f16 and bf16 as their bit patterns), one per entry.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// STRING tensors: one UTF-8 byte string per element.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "bytes", tag = "9")]
    pub raw_data: Bytes,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// `location`, `offset`, `length` (and `checksum`) when `data_location` is external.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// A value's type: a tensor, a sequence or an optional (maps and sparse tensors decode
/// as a `TypeProto` with none of these).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
    #[prost(message, optional, boxed, tag = "4")]
    pub sequence_type: Option<Box<TypeProtoElement>>,
    #[prost(message, optional, boxed, tag = "9")]
    pub optional_type: Option<Box<TypeProtoElement>>,
}

/// TypeProto.Sequence and TypeProto.Optional: the type of what they hold.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoElement {
    #[prost(message, optional, boxed, tag = "1")]
    pub elem_type: Option<Box<TypeProto>>,
}

/// SequenceProto / OptionalProto `elem_type`: what the value holds.
pub const ELEM_TENSOR: i32 = 1;
pub const ELEM_SEQUENCE: i32 = 3;

/// A sequence value (test data files): tensors or, nested, sequences.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, repeated, tag = "3")]
    pub tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "5")]
    pub sequence_values: Vec<SequenceProto>,
}

/// An optional value (test data files): a tensor, a sequence, or nothing.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionalProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "3")]
    pub tensor_value: Option<TensorProto>,
    #[prost(message, optional, tag = "5")]
    pub sequence_value: Option<SequenceProto>,
}

/// TypeProto.Tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// Absent when the rank is unknown.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// TensorShapeProto.Dimension: a size, a symbol, or neither (unknown).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    #[prost(int64, tag = "1")]
    DimValue(i64),
    #[prost(string, tag = "2")]
    DimParam(String),
}
