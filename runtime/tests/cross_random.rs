//! The random ops on every device: with a seed, every device draws the same values
//! (one counter-based stream), so seeded cases compare against the CPU like any op;
//! without a seed, two runs of one session differ, on every device.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Tensor};
use kiln_runtime::{Session, SessionOptions};

#[test]
fn seeded_random_ops_agree() {
    let mut s = Suite::new("random ops");
    let seed = ("seed", Attr::Float(3.0));
    let x = rand_f32(&[7, 45], 1);
    s.check(Case::new("RandomUniformLike").input(x.clone()).attrs(&[seed.clone(), ("low", Attr::Float(-2.0)), ("high", Attr::Float(5.0))]), Tolerance::f32(1e-6));
    s.check(Case::new("RandomNormalLike").input(x.clone()).attrs(&[seed.clone(), ("mean", Attr::Float(1.0)), ("scale", Attr::Float(0.5))]), Tolerance::f32(1e-5));
    let p = rand_f32_map(&[9, 31], 2, |v| v.abs());
    s.check(Case::new("Bernoulli").opset(15).input(p.clone()).attr("seed", Attr::Float(1.0)), Tolerance::EXACT);
    s.check(Case::new("Bernoulli").opset(15).input(p).attrs(&[("seed", Attr::Float(1.0)), ("dtype", Attr::Int(DType::I32.onnx_code() as i64))]), Tolerance::EXACT);
    let logits = rand_f32(&[4, 6], 3);
    s.check(Case::new("Multinomial").opset(7).input(logits).attrs(&[("seed", Attr::Float(9.0)), ("sample_size", Attr::Int(50))]), Tolerance::EXACT);
    // Dropout's mask: the key from a seed input at run time, the same on every device.
    let mask = Case::new("DropoutMask").domain("kiln").constant(Tensor::from_vec(&[2], vec![13i64, 41]).unwrap());
    s.check(mask.input(Tensor::scalar(12345i64)).attrs(&[("ratio", Attr::Float(0.3)), ("stream", Attr::Int(2))]), Tolerance::EXACT);
    // The same shape from attributes (folded on the host: a seeded draw is a constant).
    s.check(Case::new("RandomNormal").attrs(&[seed, ("shape", ints(&[3, 4]))]), Tolerance::f32(1e-6));
    s.finish();
}

#[test]
fn unseeded_draws_differ_between_runs() {
    gpu_env();
    let cases = [
        Case::new("RandomUniform").attr("shape", ints(&[64])),
        Case::new("RandomNormalLike").input(rand_f32(&[64], 1)),
        Case::new("Bernoulli").opset(15).input(Tensor::from_slice(&[64], &[0.5f32; 64]).unwrap()),
    ];
    for dev in devices() {
        for case in &cases {
            let (graph, feeds) = case.graph();
            let session = Session::new(graph, SessionOptions::device(dev.choice.clone())).unwrap();
            let feeds: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let a = session.run(&feeds).unwrap();
            let b = session.run(&feeds).unwrap();
            assert_ne!(a[0].bytes(), b[0].bytes(), "{case} on {}: two runs without a seed drew the same values", dev.label);
        }
    }
}
