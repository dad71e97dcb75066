//! kiln-samples: sample networks built in code with [`kiln_graph::GraphBuilder`], with
//! deterministic pseudo-random weights. They exercise the main op families (convolution,
//! pooling, normalisation, matmul, elementwise, softmax) without any model file, so the
//! demo and the examples run on a fresh machine.
//!
//! Depends on kiln-graph only.
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Result, Tensor, ValueId};

pub use kiln_graph::rng::Rng;

#[allow(clippy::too_many_arguments)]
fn conv_bn_relu(b: &mut GraphBuilder, rng: &mut Rng, x: ValueId, cin: usize, cout: usize, k: usize, stride: usize, group: usize, name: &str) -> Result<ValueId> {
    let y = conv_bn(b, rng, x, cin, cout, k, stride, group, name)?;
    Ok(b.node("Relu", &[y], &[]))
}

/// A convolution (`k x k`, padding `k / 2`) and an inference-mode BatchNormalization.
#[allow(clippy::too_many_arguments)]
fn conv_bn(b: &mut GraphBuilder, rng: &mut Rng, x: ValueId, cin: usize, cout: usize, k: usize, stride: usize, group: usize, name: &str) -> Result<ValueId> {
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
    Ok(b.node("BatchNormalization", &[y, scale, bias, mean, var], &[("epsilon", Attr::Float(1e-5))]))
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

/// LeNet-5 for 28x28 digits: two 5x5 convolutions with ReLU and max pooling, then three
/// fully connected layers. Input `image` f32[batch,1,28,28]; output `logits`
/// f32[batch,10].
pub fn lenet(seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("lenet");
    let x = b.input("image", DType::F32, kiln_graph::Shape(vec!["batch".into(), 1usize.into(), 28usize.into(), 28usize.into()]));
    let pool = |b: &mut GraphBuilder, v: ValueId| b.node("MaxPool", &[v], &[("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))]);
    let mut y = x;
    for (i, (cin, cout, pad)) in [(1usize, 6usize, 2i64), (6, 16, 0)].into_iter().enumerate() {
        let w = b.constant(&format!("conv{i}.weight"), rng.tensor(&[cout, cin, 5, 5], (3.0 / (cin * 25) as f32).sqrt())?);
        let bias = b.constant(&format!("conv{i}.bias"), rng.tensor(&[cout], 0.05)?);
        let c = b.node("Conv", &[y, w, bias], &[("kernel_shape", Attr::Ints(vec![5, 5])), ("pads", Attr::Ints(vec![pad; 4]))]);
        let r = b.node("Relu", &[c], &[]);
        y = pool(&mut b, r);
    }
    let mut y = b.node("Flatten", &[y], &[("axis", Attr::Int(1))]);
    for (i, (fan_in, n)) in [(400usize, 120usize), (120, 84), (84, 10)].into_iter().enumerate() {
        let w = b.constant(&format!("fc{i}.weight"), rng.tensor(&[n, fan_in], (3.0 / fan_in as f32).sqrt())?);
        let bias = b.constant(&format!("fc{i}.bias"), rng.tensor(&[n], 0.05)?);
        y = b.node("Gemm", &[y, w, bias], &[("transB", Attr::Int(1))]);
        if i < 2 {
            y = b.node("Relu", &[y], &[]);
        }
    }
    b.rename(y, "logits");
    b.output(y);
    b.finish()
}

/// A ResNet stage: a 3x3 stem, then `blocks` basic blocks (two 3x3 convolutions with
/// batch normalisation and a residual add), the first of them strided with a 1x1
/// projection shortcut; global pooling and a classifier. Input `image`
/// f32[batch,3,size,size]; output `logits` f32[batch,classes].
pub fn resnet_blocks(size: usize, width: usize, blocks: usize, classes: usize, seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("resnet_blocks");
    let x = b.input("image", DType::F32, kiln_graph::Shape(vec!["batch".into(), 3usize.into(), size.into(), size.into()]));
    let mut y = conv_bn_relu(&mut b, &mut rng, x, 3, width / 2, 3, 1, 1, "stem")?;
    let mut cin = width / 2;
    for i in 0..blocks {
        let stride = if i == 0 { 2 } else { 1 };
        let a = conv_bn_relu(&mut b, &mut rng, y, cin, width, 3, stride, 1, &format!("block{i}.conv1"))?;
        // The second convolution without its ReLU: the residual add comes first.
        let c2 = conv_bn(&mut b, &mut rng, a, width, width, 3, 1, 1, &format!("block{i}.conv2"))?;
        let shortcut = if i == 0 { conv_bn(&mut b, &mut rng, y, cin, width, 1, stride, 1, &format!("block{i}.down"))? } else { y };
        let sum = b.node("Add", &[c2, shortcut], &[]);
        y = b.node("Relu", &[sum], &[]);
        cin = width;
    }
    let gap = b.node("GlobalAveragePool", &[y], &[]);
    let flat = b.node("Flatten", &[gap], &[("axis", Attr::Int(1))]);
    let w = b.constant("fc.weight", rng.tensor(&[classes, width], (3.0 / width as f32).sqrt())?);
    let bias = b.constant("fc.bias", rng.tensor(&[classes], 0.05)?);
    let logits = b.node("Gemm", &[flat, w, bias], &[("transB", Attr::Int(1))]);
    b.rename(logits, "logits");
    b.output(logits);
    b.finish()
}

/// A transformer encoder block (pre-norm): LayerNormalization, multi-head self-attention
/// written out in MatMul, Reshape, Transpose and Softmax (as exporters write it), a
/// residual add, then LayerNormalization, a GELU MLP (written with Erf) and a second
/// residual add. Input `x` f32[batch,seq,dim]; output `y` of the same
/// shape.
pub fn transformer_block(dim: usize, heads: usize, seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("transformer_block");
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec!["batch".into(), "seq".into(), dim.into()]));
    let hd = dim / heads;
    let ints = |b: &mut GraphBuilder, name: &str, v: &[i64]| b.constant(name, Tensor::from_vec(&[v.len()], v.to_vec()).expect("dims"));
    let norm = |b: &mut GraphBuilder, rng: &mut Rng, v: ValueId, name: &str| -> Result<ValueId> {
        let g = b.constant(&format!("{name}.weight"), Tensor::from_vec(&[dim], (0..dim).map(|_| 1.0 + 0.1 * rng.next_f32()).collect()).expect("dims"));
        let beta = b.constant(&format!("{name}.bias"), rng.tensor(&[dim], 0.05)?);
        Ok(b.node("LayerNormalization", &[v, g, beta], &[("axis", Attr::Int(-1)), ("epsilon", Attr::Float(1e-5))]))
    };
    let linear = |b: &mut GraphBuilder, rng: &mut Rng, v: ValueId, fan_in: usize, n: usize, name: &str| -> Result<ValueId> {
        let w = b.constant(&format!("{name}.weight"), rng.tensor(&[fan_in, n], (3.0 / fan_in as f32).sqrt())?);
        let bias = b.constant(&format!("{name}.bias"), rng.tensor(&[n], 0.02)?);
        let y = b.node("MatMul", &[v, w], &[]);
        Ok(b.node("Add", &[y, bias], &[]))
    };
    let h = norm(&mut b, &mut rng, x, "ln1")?;
    // [batch, seq, dim] -> [batch, heads, seq, hd]
    let split = ints(&mut b, "heads_shape", &[0, 0, heads as i64, hd as i64]);
    let mut qkv = vec![];
    for name in ["q", "k", "v"] {
        let p = linear(&mut b, &mut rng, h, dim, dim, name)?;
        let r = b.node("Reshape", &[p, split], &[]);
        let perm = if name == "k" { vec![0, 2, 3, 1] } else { vec![0, 2, 1, 3] };
        qkv.push(b.node("Transpose", &[r], &[("perm", Attr::Ints(perm))]));
    }
    let scores = b.node("MatMul", &[qkv[0], qkv[1]], &[]);
    let scale = b.constant("attn.scale", Tensor::from_vec(&[], vec![1.0 / (hd as f32).sqrt()]).expect("dims"));
    let scaled = b.node("Mul", &[scores, scale], &[]);
    let probs = b.node("Softmax", &[scaled], &[("axis", Attr::Int(-1))]);
    let ctx = b.node("MatMul", &[probs, qkv[2]], &[]);
    let ctx = b.node("Transpose", &[ctx], &[("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
    let merge = ints(&mut b, "merge_shape", &[0, 0, dim as i64]);
    let ctx = b.node("Reshape", &[ctx, merge], &[]);
    let attn = linear(&mut b, &mut rng, ctx, dim, dim, "attn.out")?;
    let x1 = b.node("Add", &[x, attn], &[]);
    let h2 = norm(&mut b, &mut rng, x1, "ln2")?;
    let up = linear(&mut b, &mut rng, h2, dim, 4 * dim, "mlp.up")?;
    // GELU(u) = 0.5 * u * (1 + erf(u / sqrt(2)))
    let c = |b: &mut GraphBuilder, name: &str, v: f32| b.constant(name, Tensor::from_vec(&[], vec![v]).expect("dims"));
    let (inv_sqrt2, one, half) = (c(&mut b, "gelu.inv_sqrt2", std::f32::consts::FRAC_1_SQRT_2), c(&mut b, "gelu.one", 1.0), c(&mut b, "gelu.half", 0.5));
    let e = b.node("Mul", &[up, inv_sqrt2], &[]);
    let e = b.node("Erf", &[e], &[]);
    let e = b.node("Add", &[e, one], &[]);
    let g = b.node("Mul", &[up, e], &[]);
    let g = b.node("Mul", &[g, half], &[]);
    let down = linear(&mut b, &mut rng, g, 4 * dim, dim, "mlp.down")?;
    let y = b.node("Add", &[x1, down], &[]);
    b.rename(y, "y");
    b.output(y);
    b.finish()
}

/// One decoding step of self-attention with a KV cache: the new tokens' queries, keys
/// and values are projected from `x` f32[batch,new,dim]; the keys and values are
/// appended to the cache (`past_k`, `past_v` f32[batch,heads,past,dim/heads]) along the
/// sequence axis and returned as `present_k`, `present_v`; the queries attend over the
/// whole cache. Outputs `y` f32[batch,new,dim], `present_k`, `present_v`.
pub fn attention_kv_cache(dim: usize, heads: usize, seed: u64) -> Result<Graph> {
    let mut rng = Rng::new(seed);
    let mut b = GraphBuilder::new("attention_kv_cache");
    let hd = dim / heads;
    let x = b.input("x", DType::F32, kiln_graph::Shape(vec!["batch".into(), "new".into(), dim.into()]));
    let cache = |b: &mut GraphBuilder, name: &str| b.input(name, DType::F32, kiln_graph::Shape(vec!["batch".into(), heads.into(), "past".into(), hd.into()]));
    let (past_k, past_v) = (cache(&mut b, "past_k"), cache(&mut b, "past_v"));
    let split = b.constant("heads_shape", Tensor::from_vec(&[4], vec![0i64, 0, heads as i64, hd as i64]).expect("dims"));
    let mut proj = vec![];
    for name in ["q", "k", "v"] {
        let w = b.constant(&format!("{name}.weight"), rng.tensor(&[dim, dim], (3.0 / dim as f32).sqrt())?);
        let p = b.node("MatMul", &[x, w], &[]);
        let r = b.node("Reshape", &[p, split], &[]);
        proj.push(b.node("Transpose", &[r], &[("perm", Attr::Ints(vec![0, 2, 1, 3]))]));
    }
    let present_k = b.node("Concat", &[past_k, proj[1]], &[("axis", Attr::Int(2))]);
    let present_v = b.node("Concat", &[past_v, proj[2]], &[("axis", Attr::Int(2))]);
    let kt = b.node("Transpose", &[present_k], &[("perm", Attr::Ints(vec![0, 1, 3, 2]))]);
    let scores = b.node("MatMul", &[proj[0], kt], &[]);
    let scale = b.constant("attn.scale", Tensor::from_vec(&[], vec![1.0 / (hd as f32).sqrt()]).expect("dims"));
    let scaled = b.node("Mul", &[scores, scale], &[]);
    let probs = b.node("Softmax", &[scaled], &[("axis", Attr::Int(-1))]);
    let ctx = b.node("MatMul", &[probs, present_v], &[]);
    let ctx = b.node("Transpose", &[ctx], &[("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
    let merge = b.constant("merge_shape", Tensor::from_vec(&[3], vec![0i64, 0, dim as i64]).expect("dims"));
    let ctx = b.node("Reshape", &[ctx, merge], &[]);
    let w = b.constant("out.weight", rng.tensor(&[dim, dim], (3.0 / dim as f32).sqrt())?);
    let y = b.node("MatMul", &[ctx, w], &[]);
    b.rename(y, "y");
    b.rename(present_k, "present_k");
    b.rename(present_v, "present_v");
    b.output(y);
    b.output(present_k);
    b.output(present_v);
    b.finish()
}

/// A sample ready to run: its graph and deterministic inputs.
pub struct Sample {
    pub name: String,
    /// One line on what it is.
    pub about: &'static str,
    pub graph: Graph,
    pub inputs: Vec<(String, Tensor)>,
}

/// The names [`sample`] knows, in the order `kiln demo --sample all` runs them.
pub const SAMPLES: [&str; 6] = ["tiny_cnn", "mlp", "lenet", "resnet_blocks", "transformer_block", "attention_kv_cache"];

/// Sample `name` (one of [`SAMPLES`]; `None` for another name) with a batch of `batch`
/// inputs drawn from a fixed seed; `size` is the image size of the image models that
/// take one (tiny_cnn, resnet_blocks).
pub fn sample(name: &str, batch: usize, size: usize) -> Result<Option<Sample>> {
    let mut rng = Rng::new(7);
    let (about, graph, inputs): (&'static str, Graph, Vec<(&str, Vec<usize>)>) = match name {
        "tiny_cnn" => ("a MobileNet-style classifier: stem, depthwise-separable blocks, softmax", tiny_cnn(size, 10, 42)?, vec![("image", vec![batch, 3, size, size])]),
        "mlp" => ("a multilayer perceptron: three MatMul + Add layers with ReLU", mlp(784, 256, 2, 10, 42)?, vec![("x", vec![batch, 784])]),
        "lenet" => ("LeNet-5 on 28x28 digits", lenet(42)?, vec![("image", vec![batch, 1, 28, 28])]),
        "resnet_blocks" => ("a ResNet stage: basic blocks with batch norm and residual adds", resnet_blocks(size, 32, 3, 10, 42)?, vec![("image", vec![batch, 3, size, size])]),
        "transformer_block" => ("a pre-norm transformer encoder block: 4-head attention and a GELU MLP", transformer_block(64, 4, 42)?, vec![("x", vec![batch, 32, 64])]),
        "attention_kv_cache" => (
            "one decoding step of 4-head attention over a KV cache of 31 tokens",
            attention_kv_cache(64, 4, 42)?,
            vec![("x", vec![batch, 1, 64]), ("past_k", vec![batch, 4, 31, 16]), ("past_v", vec![batch, 4, 31, 16])],
        ),
        _ => return Ok(None),
    };
    let inputs = inputs.into_iter().map(|(n, dims)| Ok((n.to_string(), rng.tensor(&dims, 1.0)?))).collect::<Result<Vec<_>>>()?;
    Ok(Some(Sample { name: name.to_string(), about, graph, inputs }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_build_and_validate() {
        let g = super::tiny_cnn(64, 10, 1).unwrap();
        assert!(g.nodes.len() > 15);
        assert_eq!(g.values[g.outputs[0]].name, "probabilities");
        for name in super::SAMPLES {
            let s = super::sample(name, 2, 32).unwrap().unwrap();
            assert_eq!(s.name, name);
            assert!(!s.graph.nodes.is_empty() && !s.inputs.is_empty(), "{name}");
        }
        assert!(super::sample("nope", 1, 32).unwrap().is_none());
        let m = super::mlp(32, 64, 2, 10, 1).unwrap();
        assert_eq!(m.op_histogram().iter().find(|(o, _)| o == "MatMul").map(|x| x.1), Some(3));
    }
}
