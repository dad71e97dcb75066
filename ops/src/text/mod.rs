//! String operators (ONNX `STRING` tensors, [`kiln_graph::DType::String`]):
//! StringNormalizer, StringConcat, StringSplit and RegexFullMatch. They run on the
//! host only (no WGSL kernels; sessions place every step that touches a string tensor
//! on the CPU, in GPU sessions too). Equal on strings lives with Equal
//! (`elementwise/equal_string.rs`), casts with Cast (`tensor/cast_string.rs`),
//! LabelEncoder with the other `ai.onnx.ml` ops (`ml/label_encoder.rs`).
use crate::Registry;

mod regex_full_match;
mod string_concat;
mod string_normalizer;
mod string_split;

pub(crate) fn register(r: &mut Registry) {
    regex_full_match::register(r);
    string_concat::register(r);
    string_normalizer::register(r);
    string_split::register(r);
}

/// Checks that input `i` is a string tensor.
pub(crate) fn expect_strings(inputs: &[Option<crate::Arg>], i: usize) -> crate::Result<()> {
    crate::op::expect_dtype(inputs, i, &[kiln_graph::DType::String]).map(|_| ())
}
