//! Every graph pass on a small graph built for it: the graph before and after, as
//! `kiln_compiler::passes::dump` writes it, must equal tests/golden/<pass>.txt.
//! `KILN_UPDATE_GOLDEN=1` rewrites the files (review the diff). The same graphs also run
//! before and after the pass on the CPU, and must give the same outputs.
use kiln_compiler::passes::{self, dump, PassContext};
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Shape, Tensor, ValueId};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::path::PathBuf;
use kiln_ops::elementwise::{ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};

fn t(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0).collect();
    Tensor::from_vec(dims, v).unwrap()
}

fn finish(mut b: GraphBuilder, outputs: &[(ValueId, &str)]) -> Graph {
    for &(v, name) in outputs {
        b.rename(v, name);
        b.output(v);
    }
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    for (i, n) in g.nodes.iter_mut().enumerate() {
        n.name = format!("n{i}_{}", n.op_type.to_lowercase());
    }
    g
}

fn x_input(b: &mut GraphBuilder, dims: &[usize]) -> ValueId {
    let mut shape: Vec<kiln_graph::Dim> = vec!["batch".into()];
    shape.extend(dims.iter().map(|&d| kiln_graph::Dim::from(d)));
    b.input("x", DType::F32, Shape(shape))
}

fn run(g: &Graph, x: &Tensor) -> Vec<Tensor> {
    let s = Session::new(g.clone(), SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    s.run(&[("x", x)]).unwrap()
}

fn golden(name: &str, g: Graph, pass: fn(&mut Graph, &mut PassContext) -> usize, x_dims: &[usize]) -> usize {
    golden_within(name, g, pass, x_dims, None)
}

/// [`golden`]; with `step`, outputs may differ by at most that much per element instead
/// (one quantization step: the integer path rounds where the f32 emulation's rounding
/// error can land on the other side of a tie).
fn golden_within(name: &str, mut g: Graph, pass: fn(&mut Graph, &mut PassContext) -> usize, x_dims: &[usize], step: Option<f64>) -> usize {
    let before = dump(&g);
    let x = t(x_dims, 5);
    let want = run(&g, &x);
    let changes = pass(&mut g, &mut PassContext::builtin());
    g.validate().unwrap();
    let after = dump(&g);
    let got = run(&g, &x);
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.dims(), b.dims(), "{name}");
        if let Some(step) = step {
            let d = a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(d <= step * 1.0001, "{name}: outputs differ by {d}, more than one step {step}");
            continue;
        }
        assert!(a.rel_l2_error(b) < 1e-5, "{name}: outputs changed (rel L2 {})", a.rel_l2_error(b));
    }
    let text = format!("# pass {name}: {changes} change(s)\n## before\n{before}## after\n{after}");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.txt"));
    if std::env::var_os("KILN_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).unwrap();
    } else {
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{} is missing: run with KILN_UPDATE_GOLDEN=1", path.display()));
        assert_eq!(text, expected, "{name}: the graph after the pass differs from {} (KILN_UPDATE_GOLDEN=1 rewrites it)", path.display());
    }
    changes
}

#[test]
fn eliminate_identity() {
    let mut b = GraphBuilder::new("identity");
    let x = x_input(&mut b, &[4]);
    let i = b.node("Identity", &[x], &[]);
    let c = b.node("Cast", &[i], &[("to", Attr::Int(1))]); // f32 -> f32
    let shape = b.constant("same_shape", Tensor::from_vec(&[2], vec![-1i64, 4]).unwrap());
    let r = b.node("Reshape", &[c, shape], &[]);
    let p = b.node("Transpose", &[r], &[("perm", Attr::Ints(vec![0, 1]))]);
    let y = b.node("Relu", &[p], &[]);
    let o = b.node("Identity", &[y], &[]); // a graph output: Relu writes it directly
    let g = finish(b, &[(o, "y")]);
    assert_eq!(golden("eliminate_identity", g, passes::eliminate_identity, &[3, 4]), 5);
}

/// Whole-range slices go; a reversing slice (same shape, step -1) and a partial one stay.
#[test]
fn eliminate_identity_slices() {
    let mut b = GraphBuilder::new("identity_slices");
    let x = x_input(&mut b, &[4]);
    let ints = |b: &mut GraphBuilder, name: &str, v: Vec<i64>| b.constant(name, Tensor::from_vec(&[v.len()], v).unwrap());
    let (starts, ends) = (ints(&mut b, "starts", vec![0, 0]), ints(&mut b, "ends", vec![i64::from(i32::MAX), 1_000_000_000]));
    let axes = ints(&mut b, "axes", vec![0, 1]);
    let whole = b.node("Slice", &[x, starts, ends, axes], &[]);
    let (rs, re, ra, rstep) = (ints(&mut b, "rev_starts", vec![-1]), ints(&mut b, "rev_ends", vec![-1_000_000_000]), ints(&mut b, "rev_axes", vec![1]), ints(&mut b, "rev_steps", vec![-1]));
    let reversed = b.node("Slice", &[whole, rs, re, ra, rstep], &[]);
    let (ps, pe) = (ints(&mut b, "part_starts", vec![1]), ints(&mut b, "part_ends", vec![3]));
    let part_axes = ints(&mut b, "part_axes", vec![1]);
    let part = b.node("Slice", &[reversed, ps, pe, part_axes], &[]);
    let y = b.node("Relu", &[part], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("eliminate_identity_slices", g, passes::eliminate_identity, &[3, 4]), 1);
}

#[test]
fn fold_constants() {
    let mut b = GraphBuilder::new("fold");
    let x = x_input(&mut b, &[4]);
    let a = b.constant("a", t(&[4], 1));
    let c = b.constant("c", t(&[4], 2));
    let s = b.node("Add", &[a, c], &[]);
    let e = b.node("Exp", &[s], &[]);
    let y = b.node("Mul", &[x, e], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fold_constants", g, passes::fold_constants, &[2, 4]), 2);
}

#[test]
fn fold_batchnorm() {
    let mut b = GraphBuilder::new("bn");
    let x = x_input(&mut b, &[3, 5, 5]);
    let w = b.constant("w", t(&[4, 3, 3, 3], 1));
    let bias = b.constant("bias", t(&[4], 2));
    let conv = b.node("Conv", &[x, w, bias], &[("pads", Attr::Ints(vec![1, 1, 1, 1]))]);
    let scale = b.constant("scale", t(&[4], 3));
    let shift = b.constant("shift", t(&[4], 4));
    let mean = b.constant("mean", t(&[4], 5));
    let var = b.constant("var", Tensor::from_vec(&[4], vec![0.5f32, 1.0, 2.0, 0.1]).unwrap());
    let y = b.node("BatchNormalization", &[conv, scale, shift, mean, var], &[("epsilon", Attr::Float(1e-3))]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fold_batchnorm", g, passes::fold_batchnorm, &[2, 3, 5, 5]), 1);
}

#[test]
fn fold_batchnorm_linear() {
    let mut b = GraphBuilder::new("bn_linear");
    let x = x_input(&mut b, &[6]);
    let bn_params = |b: &mut GraphBuilder, n: usize, seed: u64| -> Vec<ValueId> {
        let var: Vec<f32> = (0..n).map(|i| 0.2 + i as f32 * 0.3).collect();
        let name = |what: &str| format!("bn{seed}_{what}");
        vec![
            b.constant(&name("scale"), t(&[n], seed)),
            b.constant(&name("shift"), t(&[n], seed + 1)),
            b.constant(&name("mean"), t(&[n], seed + 2)),
            b.constant(&name("var"), Tensor::from_vec(&[n], var).unwrap()),
        ]
    };
    let bn = |b: &mut GraphBuilder, y: ValueId, p: Vec<ValueId>| b.node("BatchNormalization", &[y, p[0], p[1], p[2], p[3]], &[("epsilon", Attr::Float(1e-3))]);
    // Gemm with transB and a [1, N] C scaled by beta: folds.
    let w1 = b.constant("w1", t(&[5, 6], 1));
    let c1 = b.constant("c1", t(&[1, 5], 2));
    let g1 = b.node("Gemm", &[x, w1, c1], &[("transB", Attr::Int(1)), ("beta", Attr::Float(0.5)), ("alpha", Attr::Float(2.0))]);
    let p = bn_params(&mut b, 5, 10);
    let y1 = bn(&mut b, g1, p);
    // MatMul with a constant [5, 4] weight: becomes a Gemm with a bias.
    let w2 = b.constant("w2", t(&[5, 4], 3));
    let m2 = b.node("MatMul", &[y1, w2], &[]);
    let p = bn_params(&mut b, 4, 20);
    let y2 = bn(&mut b, m2, p);
    // Gemm without C: folds, C appears.
    let w3 = b.constant("w3", t(&[4, 3], 4));
    let g3 = b.node("Gemm", &[y2, w3], &[]);
    let p = bn_params(&mut b, 3, 30);
    let y3 = bn(&mut b, g3, p);
    // Not folded: the MatMul's output has another reader...
    let w4 = b.constant("w4", t(&[3, 3], 5));
    let m4 = b.node("MatMul", &[y3, w4], &[]);
    let p = bn_params(&mut b, 3, 40);
    let y4 = bn(&mut b, m4, p);
    let shared = b.node("Relu", &[m4], &[]);
    // ...and the weight of this one is computed, not a constant.
    let w5 = b.node("Transpose", &[w4], &[("perm", Attr::Ints(vec![1, 0]))]);
    let m5 = b.node("MatMul", &[y4, w5], &[]);
    let p = bn_params(&mut b, 3, 50);
    let y5 = bn(&mut b, m5, p);
    let g = finish(b, &[(y5, "y"), (shared, "shared")]);
    assert_eq!(golden("fold_batchnorm_linear", g, passes::fold_batchnorm, &[2, 6]), 3);
}

#[test]
fn cse() {
    let mut b = GraphBuilder::new("cse");
    let x = x_input(&mut b, &[4]);
    let a1 = b.node("Exp", &[x], &[]);
    let a2 = b.node("Exp", &[x], &[]);
    let b1 = b.node("Neg", &[a1], &[]);
    let b2 = b.node("Neg", &[a2], &[]);
    let y = b.node("Add", &[b1, b2], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("cse", g, passes::eliminate_common_subexpressions, &[2, 4]), 2);
}

#[test]
fn simplify_algebra() {
    let mut b = GraphBuilder::new("algebra");
    let x = x_input(&mut b, &[3, 4]);
    let t1 = b.node("Transpose", &[x], &[("perm", Attr::Ints(vec![0, 2, 1]))]);
    let t2 = b.node("Transpose", &[t1], &[("perm", Attr::Ints(vec![0, 2, 1]))]);
    let s1 = b.constant("s1", Tensor::from_vec(&[2], vec![-1i64, 12]).unwrap());
    let r1 = b.node("Reshape", &[t2, s1], &[]);
    let s2 = b.constant("s2", Tensor::from_vec(&[3], vec![-1i64, 6, 2]).unwrap());
    let r2 = b.node("Reshape", &[r1, s2], &[]);
    let one = b.constant("one", Tensor::scalar(1f32));
    let m = b.node("Mul", &[r2, one], &[]);
    let zero = b.constant("zero", Tensor::from_vec(&[1], vec![0f32]).unwrap());
    let y = b.node("Add", &[m, zero], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("simplify_algebra", g, passes::simplify_algebra, &[2, 3, 4]), 4);
}

#[test]
fn broadcast_expand() {
    let mut b = GraphBuilder::new("expand");
    let x = x_input(&mut b, &[3, 4]);
    let axes = b.constant("axes", Tensor::from_vec(&[1], vec![2i64]).unwrap());
    let s = b.node("ReduceSum", &[x, axes], &[("keepdims", Attr::Int(1))]);
    let shape = b.node("Shape", &[x], &[]);
    let e = b.node("Expand", &[s, shape], &[]);
    // x has the result's shape: the Add reads s.
    let y = b.node("Add", &[x, e], &[]);
    // A [3, 1] operand does not: the Mul keeps the Expand.
    let c = b.constant("c", t(&[3, 1], 2));
    let z = b.node("Mul", &[e, c], &[]);
    let g = finish(b, &[(y, "y"), (z, "z")]);
    assert_eq!(golden("broadcast_expand", g, passes::broadcast_expand, &[2, 3, 4]), 1);
}

#[test]
fn eliminate_dead() {
    let mut b = GraphBuilder::new("dead");
    let x = x_input(&mut b, &[4]);
    let unused_w = b.constant("unused", t(&[4], 1));
    let d = b.node("Mul", &[x, unused_w], &[]);
    let _ = b.node("Exp", &[d], &[]);
    let y = b.node("Relu", &[x], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("eliminate_dead", g, passes::eliminate_dead, &[2, 4]), 3);
}

#[test]
fn fuse_activation() {
    let mut b = GraphBuilder::new("act");
    let x = x_input(&mut b, &[3, 5, 5]);
    let w = b.constant("w", t(&[4, 3, 1, 1], 1));
    let c = b.node("Conv", &[x, w], &[]);
    let y = b.node("Relu", &[c], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fuse_activation", g, passes::fuse_activation, &[2, 3, 5, 5]), 1);
}

#[test]
fn fuse_elementwise() {
    let mut b = GraphBuilder::new("ew");
    let x = x_input(&mut b, &[8]);
    let w = b.constant("w", t(&[8, 8], 1));
    let h = b.node("MatMul", &[x, w], &[]);
    let bias = b.constant("bias", t(&[8], 2));
    let a = b.node("Add", &[h, bias], &[]);
    let half = b.constant("half", Tensor::scalar(0.5f32));
    let m = b.node("Mul", &[a, half], &[]);
    let e = b.node("Erf", &[m], &[]);
    let y = b.node("Mul", &[e, a], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fuse_elementwise", g, passes::fuse_elementwise, &[2, 8]), 3);
}

#[test]
fn fuse_gelu() {
    let mut b = GraphBuilder::new("gelu");
    let x = x_input(&mut b, &[8]);
    let c = |b: &mut GraphBuilder, name: &str, v: f32| b.constant(name, Tensor::scalar(v));
    // erf form, as torch exports it: x * 0.5 * (1 + erf(x / 1.4142135))
    let sqrt2 = c(&mut b, "sqrt2", 1.414_213_5);
    let d = b.node("Div", &[x, sqrt2], &[]);
    let e = b.node("Erf", &[d], &[]);
    let one = c(&mut b, "one", 1.0);
    let a = b.node("Add", &[e, one], &[]);
    let m = b.node("Mul", &[x, a], &[]);
    let half = c(&mut b, "half", 0.5);
    let g1 = b.node("Mul", &[m, half], &[]);
    // tanh form (GPT-2's gelu_new), factors in another order: 0.5 * x * (1 + tanh(k * (x + 0.044715 * x^3)))
    let three = c(&mut b, "three", 3.0);
    let p = b.node("Pow", &[g1, three], &[]);
    let k1 = c(&mut b, "k1", 0.044715);
    let q = b.node("Mul", &[k1, p], &[]);
    let s = b.node("Add", &[g1, q], &[]);
    let k2 = c(&mut b, "k2", 0.797_884_6);
    let r = b.node("Mul", &[s, k2], &[]);
    let th = b.node("Tanh", &[r], &[]);
    // A one-element constant of x's rank (as tf2onnx folds them) counts as a scalar
    // where x's rank is inferred (x here is an intermediate value without a declared type).
    let one2 = b.constant("one2", Tensor::from_vec(&[1, 1], vec![1.0f32]).unwrap());
    let u = b.node("Add", &[one2, th], &[]);
    let half2 = c(&mut b, "half2", 0.5);
    let hx = b.node("Mul", &[half2, g1], &[]);
    let g2 = b.node("Mul", &[hx, u], &[]);
    // Not a GELU (0.3 instead of 0.5): stays.
    let e3 = b.node("Erf", &[g2], &[]);
    let a3 = b.node("Add", &[e3, one], &[]);
    let m3 = b.node("Mul", &[g2, a3], &[]);
    let k3 = c(&mut b, "k3", 0.3);
    let y = b.node("Mul", &[m3, k3], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fuse_gelu", g, passes::fuse_gelu, &[2, 8]), 2);
}

#[test]
fn fuse_bias() {
    let mut b = GraphBuilder::new("bias");
    let x = x_input(&mut b, &[5, 8]);
    let w = b.constant("w", t(&[8, 6], 1));
    let h = b.node("MatMul", &[x, w], &[]);
    let bias = b.constant("bias", t(&[1, 6], 2));
    let y = b.node("Add", &[bias, h], &[]);
    let r = b.node("Relu", &[y], &[]);
    let w2 = b.constant("w2", t(&[6, 3], 3));
    let h2 = b.node("MatMul", &[r, w2], &[]);
    let wide = b.constant("wide", t(&[2, 1, 3], 4)); // broadcasts over rows: not a bias
    let z = b.node("Add", &[h2, wide], &[]);
    let g = finish(b, &[(z, "z")]);
    assert_eq!(golden("fuse_bias", g, passes::fuse_bias, &[2, 5, 8]), 1);
}

#[test]
fn fuse_layernorm() {
    let mut b = GraphBuilder::new("ln");
    let x = x_input(&mut b, &[5, 8]);
    let axes = [("axes", Attr::Ints(vec![-1]))];
    let m = b.node("ReduceMean", &[x], &axes);
    let d = b.node("Sub", &[x, m], &[]);
    let two = b.constant("two", Tensor::scalar(2f32));
    let p = b.node("Pow", &[d, two], &[]);
    let v = b.node("ReduceMean", &[p], &axes);
    let eps = b.constant("eps", Tensor::scalar(1e-5f32));
    let a = b.node("Add", &[v, eps], &[]);
    let s = b.node("Sqrt", &[a], &[]);
    let n = b.node("Div", &[d, s], &[]);
    let gamma = b.constant("gamma", t(&[8], 1));
    let scaled = b.node("Mul", &[n, gamma], &[]);
    let beta = b.constant("beta", t(&[8], 2));
    let y = b.node("Add", &[scaled, beta], &[]);
    let g = finish(b, &[(y, "y")]);
    assert_eq!(golden("fuse_layernorm", g, passes::fuse_layernorm, &[2, 5, 8]), 1);
}

/// The decomposed layer norm of `x` over the last axis, times `gamma` (a constant).
fn decomposed_layernorm(b: &mut GraphBuilder, x: ValueId, gamma: ValueId, tag: &str) -> ValueId {
    let axes = [("axes", Attr::Ints(vec![-1]))];
    let m = b.node("ReduceMean", &[x], &axes);
    let d = b.node("Sub", &[x, m], &[]);
    let two = b.constant(&format!("{tag}_two"), Tensor::scalar(2f32));
    let p = b.node("Pow", &[d, two], &[]);
    let v = b.node("ReduceMean", &[p], &axes);
    let eps = b.constant(&format!("{tag}_eps"), Tensor::scalar(1e-5f32));
    let a = b.node("Add", &[v, eps], &[]);
    let s = b.node("Sqrt", &[a], &[]);
    let n = b.node("Div", &[d, s], &[]);
    b.node("Mul", &[n, gamma], &[])
}

#[test]
fn fuse_layernorm_after_a_rejected_pattern() {
    let mut b = GraphBuilder::new("ln2");
    let x = x_input(&mut b, &[5, 8]);
    // gamma of the wrong width (broadcasts over rows, not a per-channel vector): left alone.
    let wide = b.constant("gamma_rows", t(&[5, 1], 1));
    let y1 = decomposed_layernorm(&mut b, x, wide, "first");
    let gamma = b.constant("gamma", t(&[8], 2));
    let y2 = decomposed_layernorm(&mut b, y1, gamma, "second");
    let g = finish(b, &[(y2, "y")]);
    assert_eq!(golden("fuse_layernorm_rejected", g, passes::fuse_layernorm, &[2, 5, 8]), 1);
}

#[test]
fn fuse_residual() {
    let mut b = GraphBuilder::new("residual");
    let x = x_input(&mut b, &[5, 8]);
    let w = b.constant("w", t(&[8, 8], 1));
    let h = b.node("MatMul", &[x, w], &[]);
    let bias = b.constant("bias", t(&[8], 2));
    let hb = b.node("Add", &[h, bias], &[]);
    let y = b.node("Add", &[x, hb], &[]); // the skip connection
    let w2 = b.constant("w2", t(&[8, 4], 3));
    let h2 = b.node("MatMul", &[y, w2], &[]);
    let e = b.node("Exp", &[h2], &[]);
    let out = b.node("Add", &[h2, e], &[]); // h2 has two readers: not fused
    let g = finish(b, &[(out, "out"), (y, "y")]);
    let mut g2 = g.clone();
    passes::fuse_bias(&mut g2, &mut PassContext::builtin());
    assert_eq!(golden("fuse_residual", g2, passes::fuse_residual, &[2, 5, 8]), 1);
}

/// ResNet blocks: `Conv -> Add(skip) -> Relu` and a downsampling block whose skip is
/// another Conv become one Conv with the residual and Relu (fuse-conv-residual, then
/// fuse-activation). Not fused: a Conv whose Relu was already fused (the Relu would
/// apply before the add) and an Add that broadcasts.
#[test]
fn fuse_residual_conv() {
    let mut b = GraphBuilder::new("resnet_blocks");
    let x = x_input(&mut b, &[4, 6, 6]);
    let pads = || ("pads", Attr::Ints(vec![1; 4]));
    let (w1, b1) = (b.constant("w1", t(&[4, 4, 3, 3], 1)), b.constant("b1", t(&[4], 2)));
    let c1 = b.node("Conv", &[x, w1, b1], &[pads()]);
    let s1 = b.node("Add", &[c1, x], &[]);
    let y1 = b.node("Relu", &[s1], &[]);
    let w2 = b.constant("w2", t(&[8, 4, 3, 3], 3));
    let c2 = b.node("Conv", &[y1, w2], &[pads(), ("strides", Attr::Ints(vec![2, 2]))]);
    let wd = b.constant("wd", t(&[8, 4, 1, 1], 4));
    let d = b.node("Conv", &[y1, wd], &[("strides", Attr::Ints(vec![2, 2]))]);
    let s2 = b.node("Add", &[d, c2], &[]);
    let y2 = b.node("Relu", &[s2], &[]);
    let w3 = b.constant("w3", t(&[8, 8, 3, 3], 5));
    let relu = [pads(), (ACTIVATION_ATTR, Attr::String("Relu".into())), (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![]))];
    let c3 = b.node("Conv", &[y2, w3], &relu);
    let s3 = b.node("Add", &[c3, y2], &[]);
    let y3 = b.node("Relu", &[s3], &[]);
    let w4 = b.constant("w4", t(&[8, 8, 1, 1], 6));
    let c4 = b.node("Conv", &[y3, w4], &[]);
    let mean = b.node("ReduceMean", &[y3], &[("axes", Attr::Ints(vec![2, 3]))]);
    let out = b.node("Add", &[c4, mean], &[]); // [b, 8, 3, 3] + [b, 8, 1, 1]
    let g = finish(b, &[(out, "out")]);
    let both = |g: &mut Graph, cx: &mut PassContext| passes::fuse_conv_residual(g, cx) + passes::fuse_activation(g, cx);
    assert_eq!(golden("fuse_residual_conv", g, both, &[2, 4, 6, 6]), 4);
}

#[test]
fn fuse_attention() {
    // Two heads of 8 over 6 positions, as a BERT exporter writes them.
    let mut b = GraphBuilder::new("attention");
    let x = x_input(&mut b, &[6, 16]);
    let heads = b.constant("heads_shape", Tensor::from_vec(&[4], vec![-1i64, 6, 2, 8]).unwrap());
    let project = |b: &mut GraphBuilder, name: &str, seed: u64, perm: Vec<i64>| {
        let w = b.constant(name, t(&[16, 16], seed));
        let h = b.node("MatMul", &[x, w], &[]);
        let r = b.node("Reshape", &[h, heads], &[]);
        b.node("Transpose", &[r], &[("perm", Attr::Ints(perm))])
    };
    let q = project(&mut b, "wq", 1, vec![0, 2, 1, 3]);
    let kt = project(&mut b, "wk", 2, vec![0, 2, 3, 1]); // K already transposed
    let v = project(&mut b, "wv", 3, vec![0, 2, 1, 3]);
    // Scale, a finite causal mask over [1, 1, q, k], Softmax, times V: fused.
    let s = b.node("MatMul", &[q, kt], &[]);
    let c = b.constant("scale", Tensor::scalar(0.35f32));
    let s = b.node("Mul", &[s, c], &[]);
    let causal: Vec<f32> = (0..36).map(|i| if i % 6 <= i / 6 { 0.0 } else { f32::MIN }).collect();
    let mask = b.constant("causal_mask", Tensor::from_vec(&[1, 1, 6, 6], causal).unwrap());
    let s = b.node("Add", &[s, mask], &[]);
    let p = b.node("Softmax", &[s], &[("axis", Attr::Int(-1))]);
    let y1 = b.node("MatMul", &[p, v], &[]);
    // Q against itself, Kt from a Transpose of Q read only here, divided, no mask: fused,
    // and the Transpose goes (its perm becomes the identity).
    let qt = b.node("Transpose", &[q], &[("perm", Attr::Ints(vec![0, 1, 3, 2]))]);
    let s = b.node("MatMul", &[q, qt], &[]);
    let root = b.constant("root", Tensor::scalar(2.5f32));
    let s = b.node("Div", &[s, root], &[]);
    let p = b.node("Softmax", &[s], &[("axis", Attr::Int(3))]);
    let y2 = b.node("MatMul", &[p, y1], &[]);
    // Not fused: a mask whose last dim broadcasts (the Attention op would mask the keys).
    let s = b.node("MatMul", &[y2, kt], &[]);
    let rows = b.constant("row_mask", t(&[1, 1, 6, 1], 4));
    let s = b.node("Add", &[s, rows], &[]);
    let p = b.node("Softmax", &[s], &[("axis", Attr::Int(-1))]);
    let y3 = b.node("MatMul", &[p, v], &[]);
    // Not fused: the probabilities are also an output.
    let s = b.node("MatMul", &[y3, kt], &[]);
    let p4 = b.node("Softmax", &[s], &[("axis", Attr::Int(-1))]);
    let y4 = b.node("MatMul", &[p4, v], &[]);
    let g = finish(b, &[(y4, "y"), (p4, "probs")]);
    assert_eq!(golden("fuse_attention", g, passes::fuse_attention, &[2, 6, 16]), 2);
}

/// A transformer layer's attention on heads split from `[batch, 6, 16]` by Reshape +
/// Transpose (two heads of 8), its scores divided by `scale` where there is one, and
/// the output's heads transposed back: the `[batch, 6, 2, 8]` value to merge.
fn split_heads_attention(b: &mut GraphBuilder, scale: Option<f32>) -> ValueId {
    let x = x_input(b, &[6, 16]);
    let heads = b.constant("heads_shape", Tensor::from_vec(&[4], vec![0i64, 0, 2, 8]).unwrap());
    let project = |b: &mut GraphBuilder, name: &str, seed: u64, perm: Vec<i64>| {
        let w = b.constant(name, t(&[16, 16], seed));
        let h = b.node("MatMul", &[x, w], &[]);
        let r = b.node("Reshape", &[h, heads], &[]);
        b.node("Transpose", &[r], &[("perm", Attr::Ints(perm))])
    };
    let q = project(b, "wq", 1, vec![0, 2, 1, 3]);
    let kt = project(b, "wk", 2, vec![0, 2, 3, 1]);
    let v = project(b, "wv", 3, vec![0, 2, 1, 3]);
    let mut s = b.node("MatMul", &[q, kt], &[]);
    if let Some(scale) = scale {
        let c = b.constant("scale", Tensor::scalar(scale));
        s = b.node("Div", &[s, c], &[]);
    }
    let p = b.node("Softmax", &[s], &[("axis", Attr::Int(-1))]);
    let y = b.node("MatMul", &[p, v], &[]);
    b.node("Transpose", &[y], &[("perm", Attr::Ints(vec![0, 2, 1, 3]))])
}

#[test]
fn fuse_attention_on_split_heads() {
    // BERT's layer: heads split by Reshape + Transpose and merged back after by a
    // Reshape to a constant shape. The Attention node takes and gives the 3-D
    // activations (q_num_heads = 2).
    let mut b = GraphBuilder::new("attention_heads");
    let back = split_heads_attention(&mut b, Some(0.35));
    let merged = b.constant("merged_shape", Tensor::from_vec(&[3], vec![0i64, 0, 16]).unwrap());
    let out = b.node("Reshape", &[back, merged], &[]);
    let g = finish(b, &[(out, "y")]);
    assert_eq!(golden("fuse_attention_heads", g, passes::fuse_attention, &[3, 6, 16]), 1);
}

#[test]
fn fuse_attention_on_split_heads_with_a_shape_reader() {
    // GPT-2's layer: the merged shape is computed from the transposed output's Shape
    // (its first two dims, then heads * dim). The Transpose still goes; the Shape reads
    // the 3-D output instead (Shape(out, end = 2) concatenated with [heads, dim]), and
    // the 4-D shape stays an output to check its values.
    let mut b = GraphBuilder::new("attention_heads_shape");
    let back = split_heads_attention(&mut b, None);
    let shape = b.node("Shape", &[back], &[]);
    let (zero, two) = (b.constant("zero", Tensor::from_vec(&[1], vec![0i64]).unwrap()), b.constant("two", Tensor::from_vec(&[1], vec![2i64]).unwrap()));
    let outer = b.node("Slice", &[shape, zero, two], &[]);
    let width = b.constant("width", Tensor::from_vec(&[1], vec![16i64]).unwrap());
    let merged = b.node("Concat", &[outer, width], &[("axis", Attr::Int(0))]);
    let out = b.node("Reshape", &[back, merged], &[]);
    let g = finish(b, &[(out, "y"), (shape, "shape")]);
    assert_eq!(golden("fuse_attention_heads_shape", g, passes::fuse_attention, &[3, 6, 16]), 1);
}

#[test]
fn layout_nchwc() {
    // A stem over 3 channels (read as NCHW), a blocked MaxPool, a fire module (1x1
    // squeeze, 1x1 and depthwise 3x3 expands, channel Concat), a residual that comes
    // from a plain op (ToNchwc), a plain reader of a blocked value and a blocked
    // GlobalAveragePool (FromNchwc each), and a Conv of 12 channels that stays plain.
    let mut b = GraphBuilder::new("blocked");
    let x = x_input(&mut b, &[3, 12, 12]);
    let pads = || ("pads", Attr::Ints(vec![1; 4]));
    let relu = || [(ACTIVATION_ATTR, Attr::String("Relu".into())), (ACTIVATION_PARAMS_ATTR, Attr::Floats(vec![]))];
    let (w0, b0) = (b.constant("w0", t(&[16, 3, 3, 3], 1)), b.constant("b0", t(&[16], 2)));
    let stem = b.node("Conv", &[x, w0, b0], &[pads(), relu()[0].clone(), relu()[1].clone()]);
    let pool = b.node("MaxPool", &[stem], &[("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))]);
    let ws = b.constant("ws", t(&[8, 16, 1, 1], 3));
    let sq = b.node("Conv", &[pool, ws], &[]);
    let sq = b.node("Relu", &[sq], &[]);
    let we = b.constant("we", t(&[8, 8, 1, 1], 4));
    let e1 = b.node("Conv", &[sq, we], &[]);
    let wd = b.constant("wd", t(&[8, 1, 3, 3], 5));
    let e3 = b.node("Conv", &[sq, wd], &[pads(), ("group", Attr::Int(8))]);
    let cat = b.node("Concat", &[e1, e3], &[("axis", Attr::Int(1))]);
    let neg = b.node("Neg", &[cat], &[]);
    let wr = b.constant("wr", t(&[16, 16, 3, 3], 6));
    let c = b.node("Conv", &[cat, wr], &[pads()]);
    let res = b.node("Add", &[c, neg], &[]);
    let w12 = b.constant("w12", t(&[12, 16, 1, 1], 7));
    let plain = b.node("Conv", &[res, w12], &[]);
    let gap = b.node("GlobalAveragePool", &[res], &[]);
    let g = finish(b, &[(gap, "gap"), (plain, "plain")]);
    let all = |g: &mut Graph, cx: &mut PassContext| passes::fuse_conv_residual(g, cx) + passes::fuse_activation(g, cx) + passes::layout_nchwc(g, cx);
    golden("layout_nchwc", g, all, &[2, 3, 12, 12]);
}

/// A QDQ model in miniature, as onnxruntime's quantizer writes one: the input
/// quantized, a Conv with per-channel int8 filters and an int32 bias, a MaxPool between
/// equal Q/DQ parameters, a residual Add, GlobalAveragePool, Flatten and a Gemm with
/// per-column weights; and a DQ -> Q pair with equal parameters. Every pattern becomes its integer op; the
/// outputs agree with the f32 emulation within one step of the output's scale (measured:
/// the rel. L2 difference is 1.1e-2 on these 10 outputs, where one step is ~1e-2 of the
/// norm: roundings near ties go either way).
#[test]
fn fuse_qdq() {
    let mut b = GraphBuilder::new("qdq");
    let x = x_input(&mut b, &[3, 6, 6]);
    let scalar = |b: &mut GraphBuilder, name: &str, v: f32| b.constant(name, Tensor::from_vec(&[], vec![v]).unwrap());
    let zp = |b: &mut GraphBuilder, name: &str, v: u8| b.constant(name, Tensor::from_vec(&[], vec![v]).unwrap());
    let q = |b: &mut GraphBuilder, v: ValueId, s: ValueId, z: ValueId| b.node("QuantizeLinear", &[v, s, z], &[]);
    let dq = |b: &mut GraphBuilder, v: ValueId, s: ValueId, z: ValueId| b.node("DequantizeLinear", &[v, s, z], &[]);
    let axis0 = [("axis", Attr::Int(0))];
    let (sx, zx) = (scalar(&mut b, "x_scale", 0.0078), zp(&mut b, "x_zp", 128));
    let xq = q(&mut b, x, sx, zx);
    let xd = dq(&mut b, xq, sx, zx);
    // Conv: int8 per-channel filters, int32 bias with scale sx * sw.
    let m = 4;
    let wq: Vec<i8> = (0..m * 3 * 9).map(|i| ((i * 37) % 255) as i8).collect();
    let wq = b.constant("w_q", Tensor::from_vec(&[m, 3, 3, 3], wq).unwrap());
    let swv: Vec<f32> = (0..m).map(|i| 0.002 + 0.0005 * i as f32).collect();
    let sw = b.constant("w_scale", Tensor::from_vec(&[m], swv.clone()).unwrap());
    let zw = b.constant("w_zp", Tensor::from_vec(&[m], vec![0i8; m]).unwrap());
    let wd = b.node("DequantizeLinear", &[wq, sw, zw], &axis0);
    let bq = b.constant("b_q", Tensor::from_vec(&[m], vec![100i32, -250, 3000, -7]).unwrap());
    let sb = b.constant("b_scale", Tensor::from_vec(&[m], swv.iter().map(|s| s * 0.0078).collect::<Vec<f32>>()).unwrap());
    let zb = b.constant("b_zp", Tensor::from_vec(&[m], vec![0i32; m]).unwrap());
    let bd = b.node("DequantizeLinear", &[bq, sb, zb], &axis0);
    let pads = || ("pads", Attr::Ints(vec![1; 4]));
    let conv = b.node("Conv", &[xd, wd, bd], &[pads()]);
    let (s1, z1) = (scalar(&mut b, "c_scale", 0.011), zp(&mut b, "c_zp", 0));
    let cq = q(&mut b, conv, s1, z1);
    let cd = dq(&mut b, cq, s1, z1);
    let pool = b.node("MaxPool", &[cd], &[("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))]);
    let pq = q(&mut b, pool, s1, z1);
    let pd = dq(&mut b, pq, s1, z1);
    // A second Conv on the pooled tensor; a residual Add.
    let w2: Vec<i8> = (0..m * m * 9).map(|i| ((i * 53) % 251) as i8).collect();
    let w2 = b.constant("w2_q", Tensor::from_vec(&[m, m, 3, 3], w2).unwrap());
    let w2d = b.node("DequantizeLinear", &[w2, sw, zw], &axis0);
    let b2q = b.constant("b2_q", Tensor::from_vec(&[m], vec![-90i32, 400, 12, 0]).unwrap());
    let sb2 = b.constant("b2_scale", Tensor::from_vec(&[m], swv.iter().map(|s| s * 0.011).collect::<Vec<f32>>()).unwrap());
    let b2 = b.node("DequantizeLinear", &[b2q, sb2, zb], &axis0);
    let conv2 = b.node("Conv", &[pd, w2d, b2], &[pads()]);
    let (s2, z2) = (scalar(&mut b, "c2_scale", 0.013), zp(&mut b, "c2_zp", 120));
    let c2q = q(&mut b, conv2, s2, z2);
    let c2d = dq(&mut b, c2q, s2, z2);
    let add = b.node("Add", &[c2d, pd], &[]);
    let (s3, z3) = (scalar(&mut b, "add_scale", 0.02), zp(&mut b, "add_zp", 0));
    let aq = q(&mut b, add, s3, z3);
    let ad = dq(&mut b, aq, s3, z3);
    let gap = b.node("GlobalAveragePool", &[ad], &[]);
    let (s4, z4) = (scalar(&mut b, "gap_scale", 0.009), zp(&mut b, "gap_zp", 0));
    let gq = q(&mut b, gap, s4, z4);
    let gd = dq(&mut b, gq, s4, z4);
    let flat = b.node("Flatten", &[gd], &[]);
    let fq = q(&mut b, flat, s4, z4);
    let fd = dq(&mut b, fq, s4, z4);
    // A DQ -> Q pair with equal parameters vanishes.
    let fq2 = q(&mut b, fd, s4, z4);
    let fd2 = dq(&mut b, fq2, s4, z4);
    // Gemm with transB and per-row (output column) scales, an int32 bias.
    let n = 5;
    let wf: Vec<i8> = (0..n * m).map(|i| ((i * 71) % 253) as i8).collect();
    let wf = b.constant("fc_q", Tensor::from_vec(&[n, m], wf).unwrap());
    let sfv: Vec<f32> = (0..n).map(|i| 0.003 + 0.0002 * i as f32).collect();
    let sf = b.constant("fc_scale", Tensor::from_vec(&[n], sfv.clone()).unwrap());
    let zf = b.constant("fc_zp", Tensor::from_vec(&[n], vec![0i8; n]).unwrap());
    let wfd = b.node("DequantizeLinear", &[wf, sf, zf], &axis0);
    let bf = b.constant("fc_b_q", Tensor::from_vec(&[n], vec![500i32, -40, 0, 77, -3000]).unwrap());
    let sbf = b.constant("fc_b_scale", Tensor::from_vec(&[n], sfv.iter().map(|s| s * 0.009).collect::<Vec<f32>>()).unwrap());
    let zbf = b.constant("fc_b_zp", Tensor::from_vec(&[n], vec![0i32; n]).unwrap());
    let bfd = b.node("DequantizeLinear", &[bf, sbf, zbf], &axis0);
    let gemm = b.node("Gemm", &[fd2, wfd, bfd], &[("transB", Attr::Int(1))]);
    let (s5, z5) = (scalar(&mut b, "y_scale", 0.004), zp(&mut b, "y_zp", 128));
    let yq = q(&mut b, gemm, s5, z5);
    let y = dq(&mut b, yq, s5, z5);
    let g = finish(b, &[(y, "y")]);
    // Conv x2, MaxPool, Add, GlobalAveragePool, Flatten, the DQ -> Q pair, Gemm.
    assert_eq!(golden_within("fuse_qdq", g, passes::fuse_qdq, &[2, 3, 6, 6], Some(0.004)), 8);
}

/// A hand-built graph whose QuantizeLinear nodes have no outputs (the importer never
/// makes one; the builder API can): fuse-qdq leaves those patterns alone instead of
/// reading a missing output.
#[test]
fn fuse_qdq_skips_quantize_nodes_without_outputs() {
    let mut b = GraphBuilder::new("qdq_no_outputs");
    let x = x_input(&mut b, &[3, 4]);
    let s = b.constant("s", Tensor::from_vec(&[], vec![0.01f32]).unwrap());
    let z = b.constant("z", Tensor::from_vec(&[], vec![128u8]).unwrap());
    let xq = b.node("QuantizeLinear", &[x, s, z], &[]);
    let xd = b.node("DequantizeLinear", &[xq, s, z], &[]);
    let add = b.node("Add", &[xd, xd], &[]);
    let aq = b.node("QuantizeLinear", &[add, s, z], &[]);
    let pass = b.node("QuantizeLinear", &[xd, s, z], &[]);
    let y = b.node("Add", &[add, add], &[]);
    let mut g = finish(b, &[(y, "y"), (aq, "aq"), (pass, "pass")]);
    for n in g.nodes.iter_mut().filter(|n| n.op_type == "QuantizeLinear" && n.inputs[0] != Some(x)) {
        n.outputs.clear();
    }
    g.outputs.retain(|&v| v == y);
    assert_eq!(passes::fuse_qdq(&mut g, &mut PassContext::builtin()), 0);
    assert!(g.nodes.iter().all(|n| n.domain.is_empty()), "nothing fused");
}

/// A dynamically quantized linear layer as onnxruntime's `quantize_dynamic` writes it:
/// DynamicQuantizeLinear, MatMulInteger with per-column weight zero points, Cast, the
/// product of the scales, the bias Add; and a second layer without a bias, whose
/// per-tensor weight scale is the scales' Mul's first input. Both become
/// MatMulIntegerToFloat, with the same output bits.
#[test]
fn fuse_matmul_integer() {
    let mut b = GraphBuilder::new("matmul_integer");
    let x = x_input(&mut b, &[3, 8]);
    let q = b.node_multi("DynamicQuantizeLinear", &[Some(x)], &[], 3);
    let (xq, xs, xz) = (q[0], q[1], q[2]);
    let w: Vec<i8> = (0..8 * 6).map(|i| ((i * 53) % 255) as i8).collect();
    let w = b.constant("w_q", Tensor::from_vec(&[8, 6], w).unwrap());
    let wz = b.constant("w_zp", Tensor::from_vec(&[6], vec![0i8, 1, -2, 3, 0, -1]).unwrap());
    let ws = b.constant("w_scale", Tensor::from_vec(&[6], vec![0.01f32, 0.02, 0.005, 0.03, 0.011, 0.007]).unwrap());
    let s = b.node("Mul", &[xs, ws], &[]);
    let acc = b.node("MatMulInteger", &[xq, w, xz, wz], &[]);
    let f = b.node("Cast", &[acc], &[("to", Attr::Int(1))]);
    let y = b.node("Mul", &[f, s], &[]);
    let bias = b.constant("bias", Tensor::from_vec(&[6], vec![0.5f32, -1.0, 0.25, 2.0, -0.75, 0.0]).unwrap());
    let y = b.node("Add", &[bias, y], &[]);
    // Second layer: per-tensor weight scale first in the scales' Mul, no bias.
    let q2 = b.node_multi("DynamicQuantizeLinear", &[Some(y)], &[], 3);
    let w2: Vec<i8> = (0..6 * 4).map(|i| ((i * 29) % 255) as i8).collect();
    let w2 = b.constant("w2_q", Tensor::from_vec(&[6, 4], w2).unwrap());
    let ws2 = b.constant("w2_scale", Tensor::from_vec(&[], vec![0.013f32]).unwrap());
    let s2 = b.node("Mul", &[ws2, q2[1]], &[]);
    let acc2 = b.node("MatMulInteger", &[q2[0], w2, q2[2]], &[]);
    let f2 = b.node("Cast", &[acc2], &[("to", Attr::Int(1))]);
    let z = b.node("Mul", &[s2, f2], &[]);
    let g = finish(b, &[(z, "z")]);
    let x_t = t(&[2, 3, 8], 5);
    let want = run(&g, &x_t);
    let mut fused = g.clone();
    assert_eq!(passes::fuse_matmul_integer(&mut fused, &mut PassContext::builtin()), 2);
    assert_eq!(run(&fused, &x_t)[0].bytes(), want[0].bytes(), "the same f32 operations in the same order");
    assert_eq!(golden("fuse_matmul_integer", g, passes::fuse_matmul_integer, &[2, 3, 8]), 2);
}

/// The integer product stays as it is when another node reads its int32 result, when
/// the Cast is not to f32, or when neither scale is a single value.
#[test]
fn fuse_matmul_integer_keeps_what_it_cannot_fuse() {
    let build = |cast_to: i64, wide_scale: bool, acc_output: bool| {
        let mut b = GraphBuilder::new("matmul_integer_kept");
        let x = x_input(&mut b, &[3, 8]);
        let q = b.node_multi("DynamicQuantizeLinear", &[Some(x)], &[], 3);
        let w = b.constant("w_q", Tensor::from_vec(&[8, 6], vec![3i8; 48]).unwrap());
        let ws = b.constant("w_scale", Tensor::from_vec(&[6], vec![0.01f32; 6]).unwrap());
        let six = b.constant("six", Tensor::from_vec(&[1], vec![6i64]).unwrap());
        let xs = if wide_scale { b.node("Expand", &[q[1], six], &[]) } else { q[1] };
        let s = b.node("Mul", &[xs, ws], &[]);
        let acc = b.node("MatMulInteger", &[q[0], w, q[2]], &[]);
        let f = b.node("Cast", &[acc], &[("to", Attr::Int(cast_to))]);
        let s = if cast_to == 1 { s } else { b.node("Cast", &[s], &[("to", Attr::Int(cast_to))]) };
        let y = b.node("Mul", &[f, s], &[]);
        let mut outs = vec![(y, "y")];
        if acc_output {
            outs.push((acc, "acc"));
        }
        finish(b, &outs)
    };
    for (cast_to, wide, acc_output) in [(1, false, true), (11, false, false), (1, true, false)] {
        let mut g = build(cast_to, wide, acc_output);
        assert_eq!(passes::fuse_matmul_integer(&mut g, &mut PassContext::builtin()), 0, "{cast_to} {wide} {acc_output}");
    }
    // The same graph without those obstacles fuses.
    assert_eq!(passes::fuse_matmul_integer(&mut build(1, false, false), &mut PassContext::builtin()), 1);
}

/// A MobileNet block in miniature, quantized (QDQ, then fuse-qdq makes the integer ops):
/// a pointwise 8 -> 16 convolution over the quantized input (ToNhwc), a depthwise 3x3, a
/// pointwise 16 -> 8 with a residual QLinearAdd, a plain reader of the depthwise output
/// (its DequantizeLinear: FromNhwc) and a QLinearGlobalAveragePool (channels_last). The
/// integer results are the same bit for bit before and after.
#[test]
fn layout_nhwc_int8() {
    let mut b = GraphBuilder::new("nhwc");
    let x = x_input(&mut b, &[8, 6, 6]);
    let scalar = |b: &mut GraphBuilder, name: &str, v: f32| b.constant(name, Tensor::from_vec(&[], vec![v]).unwrap());
    let zp = |b: &mut GraphBuilder, name: &str, v: u8| b.constant(name, Tensor::from_vec(&[], vec![v]).unwrap());
    let qdq = |b: &mut GraphBuilder, v: ValueId, name: &str, s: f32, z: u8| {
        let (s, z) = (scalar(b, &format!("{name}_scale"), s), zp(b, &format!("{name}_zp"), z));
        let q = b.node("QuantizeLinear", &[v, s, z], &[]);
        b.node("DequantizeLinear", &[q, s, z], &[])
    };
    let axis0 = [("axis", Attr::Int(0))];
    // A convolution of int8 per-channel filters `[m, cg, k, k]` with an int32 bias.
    let conv = |b: &mut GraphBuilder, x: ValueId, name: &str, (m, cg, k, group): (usize, usize, usize, i64), sx: f32| {
        let wq: Vec<i8> = (0..m * cg * k * k).map(|i| ((i * 37 + name.len() * 11) % 255) as i8).collect();
        let wq = b.constant(&format!("{name}_w"), Tensor::from_vec(&[m, cg, k, k], wq).unwrap());
        let swv: Vec<f32> = (0..m).map(|i| 0.002 + 0.0003 * i as f32).collect();
        let sw = b.constant(&format!("{name}_w_scale"), Tensor::from_vec(&[m], swv.clone()).unwrap());
        let zw = b.constant(&format!("{name}_w_zp"), Tensor::from_vec(&[m], vec![0i8; m]).unwrap());
        let wd = b.node("DequantizeLinear", &[wq, sw, zw], &axis0);
        let bq = b.constant(&format!("{name}_b"), Tensor::from_vec(&[m], (0..m as i32).map(|i| i * 97 - 400).collect::<Vec<_>>()).unwrap());
        let sb = b.constant(&format!("{name}_b_scale"), Tensor::from_vec(&[m], swv.iter().map(|s| s * sx).collect::<Vec<f32>>()).unwrap());
        let zb = b.constant(&format!("{name}_b_zp"), Tensor::from_vec(&[m], vec![0i32; m]).unwrap());
        let bd = b.node("DequantizeLinear", &[bq, sb, zb], &axis0);
        let pads = ("pads", Attr::Ints(vec![(k / 2) as i64; 4]));
        b.node("Conv", &[x, wd, bd], &[pads, ("group", Attr::Int(group))])
    };
    let xd = qdq(&mut b, x, "x", 0.0078, 128);
    let c1 = conv(&mut b, xd, "expand", (16, 8, 1, 1), 0.0078);
    let c1 = qdq(&mut b, c1, "expand_out", 0.011, 0);
    let c2 = conv(&mut b, c1, "depthwise", (16, 1, 3, 16), 0.011);
    let c2 = qdq(&mut b, c2, "depthwise_out", 0.013, 3);
    let c3 = conv(&mut b, c2, "project", (8, 16, 1, 1), 0.013);
    let c3 = qdq(&mut b, c3, "project_out", 0.012, 120);
    let add = b.node("Add", &[c3, xd], &[]);
    let add = qdq(&mut b, add, "add_out", 0.02, 128);
    let gap = b.node("GlobalAveragePool", &[add], &[]);
    let gap = qdq(&mut b, gap, "gap_out", 0.009, 128);
    let mut g = finish(b, &[(gap, "pooled"), (c2, "depthwise")]);
    passes::fuse_qdq(&mut g, &mut PassContext::builtin());
    passes::eliminate_dead(&mut g, &mut PassContext::builtin());
    // Three convolutions, the add and the pool.
    assert_eq!(golden("layout_nhwc_int8", g, passes::layout_nhwc_int8, &[2, 8, 6, 6]), 5);
}
