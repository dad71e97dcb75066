//! kiln-samples: sample networks built in code with [`kiln_graph::GraphBuilder`], with
//! deterministic pseudo-random weights. They exercise the main op families (convolution,
//! pooling, normalisation, matmul, elementwise, softmax) without any model file, so the
//! demo and the examples run on a fresh machine.
//!
//! Depends on kiln-graph only.
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Result, Tensor, ValueId};

pub use kiln_graph::rng::Rng;

fn conv_bn_relu(b: &mut GraphBuilder, rng: &mut Rng, x: ValueId, cin: usize, cout: usize, k: usize, stride: usize, group: usize, name: &str) -> Result<ValueId> {
    let fan_in = (cin / group * k * k) as f32;
    let w = b.constant(&format!("{name}.weight"), rng.tensor(&[cout, cin / group, k, k], (3.0 / fan_in).sqrt())?);
    let p = (k / 2) as i64;
    let y = b.node(
        "Conv",
        &[x, w],
        &[
            ("kernel_shape", Attr::Ints(vec![k as i64, k as i64])),
            ("strides", Attr::Ints(vec![stride as i64, stride as i64])),
            ("pads", Attr::Ints(vec![p, p, p, p])),
            ("group", Attr::Int(group as i64)),
        ],
    );
    let scale = b.constant(&format!("{name}.bn.scale"), Tensor::from_vec(&[cout], (0..cout).map(|_| 1.0 + 0.1 * rng.next_f32()).collect()).expect("dims"));
    let bias = b.constant(&format!("{name}.bn.bias"), rng.tensor(&[cout], 0.1)?);
    let mean = b.constant(&format!("{name}.bn.mean"), rng.tensor(&[cout], 0.1)?);
    let var = b.constant(&format!("{name}.bn.var"), Tensor::from_vec(&[cout], (0..cout).map(|_| 1.0 + 0.5 * rng.next_f32().abs()).collect()).expect("dims"));
    let y = b.node("BatchNormalization", &[y, scale, bias, mean, var], &[("epsilon", Attr::Float(1e-5))]);
    Ok(b.node("Relu", &[y], &[]))
}

/// A small image classifier in the style of MobileNet: a strided stem, depthwise-
/// separable blocks with a residual connection, global pooling, a linear classifier
/// and a softmax. Input `image` f32[batch,3,size,size]; output `probabilities`
/// f32[batch,classes].
pub fn tiny_cnn(size: usize, classes: usize, seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("tiny_cnn");
    let x = b.input("image", DType::F32, kiln_graph::Shape(vec!["batch".into(), 3usize.into(), size.into(), size.into()]));
    let stem = conv_bn_relu(&mut b, &mut rng, x, 3, 16, 3, 2, 1, "stem")?;
    let pooled = b.node(
        "MaxPool",
        &[stem],
        &[("kernel_shape", Attr::Ints(vec![3, 3])), ("strides", Attr::Ints(vec![2, 2])), ("pads", Attr::Ints(vec![1, 1, 1, 1]))],
    );
    let dw = conv_bn_relu(&mut b, &mut rng, pooled, 16, 16, 3, 1, 16, "block1.dw")?;
    let pw = conv_bn_relu(&mut b, &mut rng, dw, 16, 16, 1, 1, 1, "block1.pw")?;
    let res = b.node("Add", &[pooled, pw], &[]);
    let dw2 = conv_bn_relu(&mut b, &mut rng, res, 16, 16, 3, 2, 16, "block2.dw")?;
    let pw2 = conv_bn_relu(&mut b, &mut rng, dw2, 16, 32, 1, 1, 1, "block2.pw")?;
    let gap = b.node("GlobalAveragePool", &[pw2], &[]);
    let flat = b.node("Flatten", &[gap], &[("axis", Attr::Int(1))]);
    let w = b.constant("fc.weight", rng.tensor(&[classes, 32], (3.0f32 / 32.0).sqrt())?);
    let bias = b.constant("fc.bias", rng.tensor(&[classes], 0.1)?);
    let logits = b.node("Gemm", &[flat, w, bias], &[("transB", Attr::Int(1))]);
    let probs = b.node("Softmax", &[logits], &[("axis", Attr::Int(-1))]);
    b.rename(probs, "probabilities");
    b.output(probs);
    b.finish()
}

/// A multilayer perceptron with `hidden` layers of `width` units (MatMul + Add + GELU-
/// free ReLU), input `x` f32[batch,inputs], output `y` f32[batch,outputs].
pub fn mlp(inputs: usize, width: usize, hidden: usize, outputs: usize, seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("mlp");
    let mut x = b.input("x", DType::F32, kiln_graph::Shape(vec!["batch".into(), inputs.into()]));
    let mut fan_in = inputs;
    for l in 0..=hidden {
        let n = if l == hidden { outputs } else { width };
        let w = b.constant(&format!("l{l}.weight"), rng.tensor(&[fan_in, n], (3.0 / fan_in as f32).sqrt())?);
        let bias = b.constant(&format!("l{l}.bias"), rng.tensor(&[n], 0.05)?);
        let y = b.node("MatMul", &[x, w], &[]);
        x = b.node("Add", &[y, bias], &[]);
        if l < hidden {
            x = b.node("Relu", &[x], &[]);
        }
        fan_in = n;
    }
    b.rename(x, "y");
    b.output(x);
    b.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_build_and_validate() {
        let g = super::tiny_cnn(64, 10, 1).unwrap();
        assert!(g.nodes.len() > 15);
        assert_eq!(g.values[g.outputs[0]].name, "probabilities");
        let m = super::mlp(32, 64, 2, 10, 1).unwrap();
        assert_eq!(m.op_histogram().iter().find(|(o, _)| o == "MatMul").map(|x| x.1), Some(3));
    }
}
