//! Classical machine-learning ops: Binarizer, ArrayFeatureExtractor, TreeEnsemble and
//! LabelEncoder (strings, integers or floats to one another) of domain `ai.onnx.ml`, and
//! TfIdfVectorizer (ai.onnx) over integer tokens.
use crate::Registry;

mod array_feature_extractor;
mod binarizer;
mod label_encoder;
mod tree_ensemble;
mod tfidf_vectorizer;

pub(crate) fn register(r: &mut Registry) {
    binarizer::register(r);
    label_encoder::register(r);
    array_feature_extractor::register(r);
    tfidf_vectorizer::register(r);
    tree_ensemble::register(r);
}
