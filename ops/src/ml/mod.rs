//! Classical machine-learning ops over numbers (no strings): Binarizer,
//! ArrayFeatureExtractor and TreeEnsemble of domain `ai.onnx.ml`, and TfIdfVectorizer (ai.onnx) over
//! integer tokens.
use crate::Registry;

mod array_feature_extractor;
mod binarizer;
mod tree_ensemble;
mod tfidf_vectorizer;

pub(crate) fn register(r: &mut Registry) {
    binarizer::register(r);
    array_feature_extractor::register(r);
    tfidf_vectorizer::register(r);
    tree_ensemble::register(r);
}
