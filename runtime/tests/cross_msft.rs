//! onnxruntime's transformer contrib ops (domain com.microsoft: Gelu, FastGelu,
//! BiasGelu, SkipLayerNormalization, SkipSimplifiedLayerNormalization,
//! SimplifiedLayerNormalization, EmbedLayerNormalization, Attention,
//! MultiHeadAttention, RotaryEmbedding, GroupQueryAttention) on every device against the
//! f64 CPU reference: every case recorded from onnxruntime (kiln_ops::testing's
//! `all_ort_cases`, whose CPU results the ops crate checks against onnxruntime's), with
//! each device's outputs also held to onnxruntime's; then larger odd sizes.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};
use kiln_ops::testing::all_ort_cases;

const MS: &str = "com.microsoft";

#[test]
fn recorded_onnxruntime_cases_agree_on_every_device() {
    let mut s = Suite::new("com.microsoft transformer ops (onnxruntime cases)");
    let mut errors = vec![];
    for c in all_ort_cases() {
        s.check(c.case(), Tolerance::f32(1e-5));
        // Each device against onnxruntime's own outputs.
        let (graph, feeds) = c.case().graph();
        for dev in devices() {
            if let Err(e) = dev.run(graph.clone(), &feeds).map_err(|e| e.to_string()).and_then(|outs| c.check(&outs, 1e-4)) {
                errors.push(format!("{} on {}: {e}", c.name, dev.label));
            }
        }
    }
    s.finish();
    assert!(errors.is_empty(), "outputs differ from onnxruntime's:\n{}", errors.join("\n"));
}

fn ints(dims: &[usize], v: &[i32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

#[test]
fn larger_odd_sizes_agree() {
    let mut s = Suite::new("com.microsoft transformer ops (odd sizes)");
    let ms = |op: &str| Case::new(op).domain(MS);
    // Rows of 300 (beyond one workgroup), a broadcast skip, every output.
    let (x, skip) = (rand_f32(&[3, 37, 300], 1), rand_f32(&[37, 300], 2));
    let p = |seed| rand_f32(&[300], seed);
    s.check(ms("SkipLayerNormalization").input(x.clone()).input(skip.clone()).input(p(3)).input(p(4)).input(p(5)).outputs(4), Tolerance::f32(1e-5));
    s.check(ms("SkipSimplifiedLayerNormalization").input(x.clone()).input(skip).input(p(3)).input(p(5)).outputs(4), Tolerance::f32(1e-5));
    // Long rows: the RMS statistics take a workgroup of lanes per row.
    s.check(ms("SimplifiedLayerNormalization").input(rand_f32(&[3, 5000], 6)).input(rand_f32(&[5000], 7)).outputs(2), Tolerance::f32(1e-5));
    s.check(ms("FastGelu").input(rand_f32(&[5, 37, 129], 8)).input(rand_f32(&[129], 9)), Tolerance::f32(1e-5));
    s.check(ms("BiasGelu").input(rand_f32(&[5, 37, 129], 8)).input(rand_f32(&[129], 9)), Tolerance::f32(1e-5));
    // Embeddings with segments and a mask of 37 tokens.
    let ids: Vec<i32> = (0..3 * 37).map(|i| (i * 13 % 50) as i32).collect();
    let segs: Vec<i32> = (0..3 * 37).map(|i| (i % 3 == 0) as i32).collect();
    let mask: Vec<i32> = (0..3 * 37).map(|i| (i % 37 < 30 - i / 37 * 5) as i32).collect();
    let embed = ms("EmbedLayerNormalization")
        .input(ints(&[3, 37], &ids))
        .input(ints(&[3, 37], &segs))
        .input(rand_f32(&[50, 36], 10))
        .input(rand_f32(&[40, 36], 11))
        .input(rand_f32(&[2, 36], 12))
        .input(rand_f32(&[36], 13))
        .input(rand_f32(&[36], 14))
        .input(ints(&[3, 37], &mask));
    s.check(embed.outputs(3), Tolerance::f32(1e-5));
    // Attention: 37 tokens, 4 heads of 5, a 2-D key mask and causal; a 1-D mask.
    let key_mask: Vec<i32> = (0..2 * 37).map(|i| (i % 37 < 37 - i / 37 * 11) as i32).collect();
    let att = || ms("Attention").attr("num_heads", Attr::Int(4)).input(rand_f32(&[2, 37, 19], 15)).input(rand_f32(&[19, 60], 16)).input(rand_f32(&[60], 17));
    s.check(att().input(ints(&[2, 37], &key_mask)).attr("unidirectional", Attr::Int(1)), Tolerance::f32(1e-5));
    s.check(att().input(ints(&[2], &[30, 37])), Tolerance::f32(1e-5));
    // MultiHeadAttention: 9 queries over 33 keys with a bias and lengths.
    let mha = ms("MultiHeadAttention").attr("num_heads", Attr::Int(3)).input(rand_f32(&[2, 9, 12], 18)).input(rand_f32(&[2, 33, 12], 19)).input(rand_f32(&[2, 33, 9], 20));
    s.check(mha.input(rand_f32(&[33], 21)).input(ints(&[2], &[33, 20])), Tolerance::f32(1e-5));
    // GroupQueryAttention: 17 tokens, 6 query heads over 2 KV heads, a window.
    let gqa = ms("GroupQueryAttention").attr("num_heads", Attr::Int(6)).attr("kv_num_heads", Attr::Int(2)).attr("local_window_size", Attr::Int(5));
    let gqa = gqa.input(rand_f32(&[2, 17, 48], 22)).input(rand_f32(&[2, 17, 16], 23)).input(rand_f32(&[2, 17, 16], 24)).omitted().omitted();
    s.check(gqa.input(ints(&[2], &[16, 9])).input(Tensor::from_slice(&[], &[17i32]).unwrap()).outputs(3), Tolerance::f32(1e-5));
    // RotaryEmbedding: 4-D (B, N, S, H) input, position ids into a 40-row cache.
    let pos: Vec<i64> = (0..2 * 11).map(|i| (i * 7 % 40) as i64).collect();
    let rot = ms("RotaryEmbedding").attr("interleaved", Attr::Int(1)).input(rand_f32(&[2, 3, 11, 10], 25)).input(Tensor::from_slice(&[2, 11], &pos).unwrap());
    s.check(rot.input(rand_f32(&[40, 5], 26)).input(rand_f32(&[40, 5], 27)), Tolerance::f32(1e-6));
    s.finish();
}
