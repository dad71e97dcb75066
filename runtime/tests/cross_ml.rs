//! The classical ML ops (Binarizer, ArrayFeatureExtractor, TfIdfVectorizer,
//! TreeEnsemble) and the preview training optimizers (Adagrad, Adam, Momentum) on
//! every device against the f64 CPU reference.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn ml_ops_agree() {
    let mut s = Suite::new("ai.onnx.ml and TfIdfVectorizer");
    let ml = |op: &str| Case::new(op).domain("ai.onnx.ml").opset(1);
    s.check(ml("Binarizer").input(rand_f32(&[3, 4, 5], 1)).attr("threshold", Attr::Float(0.25)), Tolerance::EXACT);
    s.check(ml("Binarizer").input(i64s(&[4], &[-3, 0, 2, 9])).attr("threshold", Attr::Float(1.5)), Tolerance::EXACT);
    s.check(ml("ArrayFeatureExtractor").input(rand_f32(&[2, 3, 7], 2)).input(i64_vec(&[6, 0, 3, 3])), Tolerance::EXACT);
    s.check(ml("ArrayFeatureExtractor").input(i64_vec(&[5, 6, 7])).input(i64_vec(&[2, 1])), Tolerance::EXACT);
    let tokens = Tensor::from_slice(&[3, 11], &(0..33).map(|i| ((i * 5) % 9) as i32).collect::<Vec<_>>()).unwrap();
    for (mode, min, max, skips) in [("TF", 1, 2, 3), ("IDF", 2, 3, 1), ("TFIDF", 1, 3, 0)] {
        let case = Case::new("TfIdfVectorizer").opset(9).input(tokens.clone()).attrs(&[
            ("mode", string(mode)),
            ("min_gram_length", Attr::Int(min)),
            ("max_gram_length", Attr::Int(max)),
            ("max_skip_count", Attr::Int(skips)),
            ("ngram_counts", ints(&[0, 3, 7])),
            ("ngram_indexes", ints(&[0, 1, 2, 3, 4, 1, 5])),
            ("pool_int64s", ints(&[1, 5, 7, 1, 6, 5, 1, 0, 5, 1, 1, 6, 2])),
            ("weights", Attr::Floats(vec![0.5, 2.0, 1.0, 3.0, 0.25, 4.0])),
        ]);
        s.check(case, Tolerance::EXACT);
    }
    // Two trees: one with a membership node, one with a NaN-tracking split.
    let trees = ml("TreeEnsemble").opset(5).attrs(&[
        ("aggregate_function", Attr::Int(0)),
        ("n_targets", Attr::Int(3)),
        ("tree_roots", ints(&[0, 3])),
        ("nodes_modes", ints(&[0, 6, 3, 2, 1])),
        ("nodes_featureids", ints(&[0, 1, 2, 2, 0])),
        ("nodes_splits", Attr::Tensor(f32s(&[5], &[0.1, f32::NAN, -0.3, 0.0, 0.5]))),
        ("nodes_truenodeids", ints(&[1, 0, 2, 4, 3])),
        ("nodes_trueleafs", ints(&[0, 1, 1, 0, 1])),
        ("nodes_falsenodeids", ints(&[2, 1, 3, 5, 4])),
        ("nodes_falseleafs", ints(&[0, 1, 1, 1, 1])),
        ("nodes_missing_value_tracks_true", ints(&[0, 0, 0, 1, 0])),
        ("membership_values", Attr::Tensor(f32s(&[3], &[0.5, -0.25, f32::NAN]))),
        ("leaf_targetids", ints(&[0, 1, 2, 0, 1, 2])),
        ("leaf_weights", Attr::Tensor(f32s(&[6], &[1.5, -2.0, 4.0, 0.25, 8.0, -1.0]))),
    ]);
    let x = f32s(&[4, 3], &[0.0, 0.5, -1.0, 0.2, -0.25, 0.4, f32::NAN, 1.0, f32::NAN, -0.5, 0.3, 0.1]);
    s.check(trees.clone().input(x.clone()), Tolerance::f32(1e-6));
    s.check(trees.attr("aggregate_function", Attr::Int(3)).input(x), Tolerance::f32(1e-6));
    s.finish();
}

#[test]
fn training_optimizers_agree() {
    let mut s = Suite::new("Adagrad, Adam, Momentum");
    let training = |op: &str, outputs: usize| Case::new(op).domain("ai.onnx.preview.training").opset(1).outputs(outputs);
    let (x1, x2) = (rand_f32(&[3, 5], 1), rand_f32(&[7], 2));
    let (g1, g2) = (rand_f32(&[3, 5], 3), rand_f32(&[7], 4));
    let pos = |dims: &[usize], seed| rand_f32_map(dims, seed, |v| v.abs());
    let tol = Tolerance::f32(1e-5);
    for t in [0i64, 3] {
        let base = |c: Case| c.input(Tensor::scalar(0.1f32)).input(Tensor::scalar(t)).input(x1.clone()).input(x2.clone()).input(g1.clone()).input(g2.clone());
        let adagrad = base(training("Adagrad", 4)).input(pos(&[3, 5], 5)).input(pos(&[7], 6));
        s.check(adagrad.attrs(&[("decay_factor", Attr::Float(0.1)), ("epsilon", Attr::Float(1e-5)), ("norm_coefficient", Attr::Float(0.01))]), tol);
        let adam = base(training("Adam", 6)).input(rand_f32(&[3, 5], 7)).input(rand_f32(&[7], 8)).input(pos(&[3, 5], 9)).input(pos(&[7], 10));
        s.check(adam.attrs(&[("alpha", Attr::Float(0.9)), ("beta", Attr::Float(0.99)), ("norm_coefficient_post", Attr::Float(0.01))]), tol);
        for mode in ["standard", "nesterov"] {
            let m = base(training("Momentum", 4)).input(rand_f32(&[3, 5], 11)).input(rand_f32(&[7], 12));
            s.check(m.attrs(&[("alpha", Attr::Float(0.9)), ("beta", Attr::Float(0.5)), ("norm_coefficient", Attr::Float(0.02)), ("mode", string(mode))]), tol);
        }
    }
    s.finish();
}
