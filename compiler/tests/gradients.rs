//! Every gradient rule (and the lowerings and losses) against central finite
//! differences in f64, on random inputs of odd shapes: the loss is `sum(y * w)` for a
//! fixed random `w` of each output, its gradient by autodiff is compared element by
//! element with `(L(x + h) - L(x - h)) / 2h`.
use kiln_compiler::autodiff::{gradients, lower::lower, training::specialize_forward, Emit, Loss};
use kiln_graph::{rng::Rng, Attr, DType, Graph, Node, Tensor, ValueId, ValueType};
use kiln_ops::infer::{create_ops, specialize, Limits};
use kiln_ops::{Registry, TensorType};

#[derive(Clone)]
enum In {
    /// A differentiated f64 input in [-1, 1).
    Rand(Vec<usize>),
    /// A differentiated f64 input in [0.5, 1.5).
    Pos(Vec<usize>),
    /// A constant (not differentiated).
    Const(Tensor),
}

fn ints(v: &[i64]) -> In {
    In::Const(Tensor::from_slice(&[v.len()], v).unwrap())
}

fn rand(d: &[usize]) -> In {
    In::Rand(d.to_vec())
}

/// Uniform in [lo, lo + 1) when `lo` is 0.5, else in [-1, 1).
fn random(dims: &[usize], seed: u64, lo: f64) -> Tensor {
    let mut r = Rng::new(seed);
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| r.next_f32() as f64).map(|u| if lo == 0.5 { 1.0 + 0.5 * u } else { u }).collect();
    Tensor::from_vec(dims, v).unwrap()
}

/// Evaluates `g` with every input given, on the host (everything folds).
fn eval(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let reg = Registry::builtin();
    let ops = create_ops(g, reg).unwrap();
    let order = g.validate().unwrap();
    let types: Vec<TensorType> = inputs.iter().map(|t| TensorType::new(t.dtype(), t.dims().to_vec())).collect();
    let values: Vec<Option<&Tensor>> = inputs.iter().map(Some).collect();
    let s = specialize(g, &ops, &order, &types, &values, Limits::default()).unwrap_or_else(|e| panic!("{:?}", e.into_error()));
    g.outputs.iter().map(|o| s.constants.get(o).unwrap_or_else(|| panic!("output '{}' did not fold", g.values[*o].name)).clone()).collect()
}

/// Types of every value of `g` for these inputs.
fn types(g: &Graph, inputs: &[Tensor]) -> Vec<Option<TensorType>> {
    let types: Vec<TensorType> = inputs.iter().map(|t| TensorType::new(t.dtype(), t.dims().to_vec())).collect();
    specialize_forward(g, &types, Registry::builtin()).unwrap().0.types
}

struct Built {
    graph: Graph,
    inputs: Vec<Tensor>,
    /// Graph outputs: the loss, then one gradient per input.
    n_grads: usize,
}

/// The forward graph of `node` over `ins`, a loss summing each output times a random
/// weight (or `loss` on output 0 against `label`), and the gradients.
fn build(op: &str, attrs: &[(&str, Attr)], ins: &[In], n_out: usize, opset: i64, loss: Option<(Loss, Tensor)>) -> Built {
    let mut g = Graph::new(op);
    g.opsets.insert(String::new(), opset);
    let mut inputs = vec![];
    let mut node_inputs = vec![];
    for (i, inp) in ins.iter().enumerate() {
        let v = match inp {
            In::Rand(d) | In::Pos(d) => {
                let t = random(d, 17 + i as u64, if matches!(inp, In::Pos(_)) { 0.5 } else { -1.0 });
                let v = g.add_value(format!("x{i}"), Some(ValueType::new(DType::F64, d.clone())));
                g.inputs.push(v);
                inputs.push(t);
                v
            }
            In::Const(t) => {
                let v = g.add_value(format!("c{i}"), Some(ValueType::new(t.dtype(), t.dims())));
                g.initializers.insert(v, t.clone());
                v
            }
        };
        node_inputs.push(Some(v));
    }
    let outs: Vec<ValueId> = (0..n_out).map(|k| g.add_value(format!("y{k}"), None)).collect();
    g.nodes.push(Node {
        name: "node".into(),
        op_type: op.into(),
        domain: String::new(),
        attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        inputs: node_inputs,
        outputs: outs.clone(),
    });
    g.outputs = outs.clone();
    let tys = types(&g, &inputs);
    let wrt: Vec<ValueId> = g.inputs.clone();
    let reg = Registry::builtin();
    let mut e = Emit::new(&mut g, tys, reg);
    let lowered = lower(&mut e, None).unwrap();
    let subst = lowered.subst;
    // A dropout seed becomes a constant: the masks are fixed for the differences.
    if let Some(s) = lowered.seed {
        e.graph.inputs.retain(|&i| i != s);
        e.graph.initializers.insert(s, Tensor::scalar(5i64));
    }
    let outs: Vec<ValueId> = outs.iter().map(|o| *subst.get(o).unwrap_or(o)).collect();
    let l = match &loss {
        Some((loss, label)) => {
            let lv = e.constant(label.clone());
            loss.emit(&mut e, outs[0], lv).unwrap()
        }
        None => {
            let mut total: Option<ValueId> = None;
            for (k, &o) in outs.iter().enumerate() {
                if !e.dtype(o).is_float() {
                    continue;
                }
                let d = e.dims(o);
                let w = e.constant(random(&d, 1000 + k as u64, -1.0));
                let p = e.mul(o, w).unwrap();
                let all: Vec<usize> = (0..d.len()).collect();
                let s = e.reduce_sum(p, &all, false).unwrap();
                total = Some(match total {
                    Some(t) => e.add(t, s).unwrap(),
                    None => s,
                });
            }
            total.unwrap()
        }
    };
    let order = e.graph.validate().unwrap();
    let grads = gradients(&mut e, &order, l, &wrt).unwrap_or_else(|err| panic!("{op}: {err}"));
    drop(e);
    g.outputs = std::iter::once(l).chain(grads).collect();
    Built { graph: g, inputs, n_grads: wrt.len() }
}

fn check_grad(op: &str, attrs: &[(&str, Attr)], ins: &[In], n_out: usize) {
    check_full(op, attrs, ins, n_out, 21, None)
}

fn check_full(op: &str, attrs: &[(&str, Attr)], ins: &[In], n_out: usize, opset: i64, loss: Option<(Loss, Tensor)>) {
    let b = build(op, attrs, ins, n_out, opset, loss);
    let out = eval(&b.graph, &b.inputs);
    for gi in 0..b.n_grads {
        let ad = out[1 + gi].to_f64_vec();
        let x = b.inputs[gi].to_f64_vec();
        assert_eq!(ad.len(), x.len(), "{op}: gradient {gi} has the input's size");
        for k in 0..x.len() {
            let h = 1e-6 * x[k].abs().max(1.0);
            let at = |dx: f64| {
                let mut ins = b.inputs.clone();
                let mut v = x.clone();
                v[k] += dx;
                ins[gi] = Tensor::from_vec(b.inputs[gi].dims(), v).unwrap();
                eval(&b.graph, &ins)[0].to_f64_vec()[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let err = (ad[k] - fd).abs();
            assert!(err <= 1e-6 + 1e-5 * fd.abs(), "{op} {attrs:?} opset {opset}: d/d input {gi}[{k}]: autodiff {} vs finite differences {fd}", ad[k]);
        }
    }
}

#[test]
fn elementwise_with_broadcasting() {
    for op in ["Add", "Sub", "Mul"] {
        check_grad(op, &[], &[rand(&[2, 3, 4]), rand(&[3, 1])], 1);
        check_grad(op, &[], &[rand(&[1, 3]), rand(&[2, 1, 3])], 1);
    }
    check_grad("Div", &[], &[rand(&[2, 3]), In::Pos(vec![3])], 1);
    check_grad("Pow", &[], &[In::Pos(vec![2, 3]), rand(&[3])], 1);
    for op in ["Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Identity"] {
        check_grad(op, &[], &[rand(&[3, 5])], 1);
    }
    for op in ["Log", "Sqrt", "Reciprocal"] {
        check_grad(op, &[], &[In::Pos(vec![4, 3])], 1);
    }
    let cond = Tensor::from_bools(&[2, 3], &[true, false, true, false, false, true]).unwrap();
    check_grad("Where", &[], &[In::Const(cond), rand(&[2, 3]), rand(&[3])], 1);
}

#[test]
fn products() {
    check_grad("MatMul", &[], &[rand(&[2, 3, 4]), rand(&[4, 5])], 1);
    check_grad("MatMul", &[], &[rand(&[4]), rand(&[2, 4, 3])], 1);
    check_grad("MatMul", &[], &[rand(&[3, 4]), rand(&[4])], 1);
    check_grad("MatMul", &[], &[rand(&[2, 1, 3, 4]), rand(&[3, 4, 2])], 1);
    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let a = if ta == 1 { vec![4, 3] } else { vec![3, 4] };
        let b = if tb == 1 { vec![5, 4] } else { vec![4, 5] };
        let attrs = [("transA", Attr::Int(ta)), ("transB", Attr::Int(tb)), ("alpha", Attr::Float(0.5)), ("beta", Attr::Float(2.0))];
        check_grad("Gemm", &attrs, &[In::Rand(a), In::Rand(b), rand(&[5])], 1);
    }
}

#[test]
fn convolution_and_pooling() {
    let i = |v: &[i64]| Attr::Ints(v.to_vec());
    check_grad("Conv", &[("pads", i(&[1, 0, 1, 1])), ("strides", i(&[2, 1]))], &[rand(&[2, 3, 6, 5]), rand(&[4, 3, 3, 2]), rand(&[4])], 1);
    check_grad("Conv", &[("dilations", i(&[2, 1])), ("strides", i(&[1, 2]))], &[rand(&[1, 2, 7, 6]), rand(&[3, 2, 2, 3])], 1);
    check_grad("Conv", &[("group", Attr::Int(2)), ("pads", i(&[1, 1, 1, 1]))], &[rand(&[2, 4, 5, 5]), rand(&[6, 2, 3, 3]), rand(&[6])], 1);
    check_grad("Conv", &[("strides", i(&[3]))], &[rand(&[2, 2, 10]), rand(&[3, 2, 4])], 1);
    // auto_pad: the odd pad at the end (UPPER) or the beginning (LOWER), strided.
    let same = |mode: &str| ("auto_pad", Attr::String(mode.into()));
    check_grad("Conv", &[same("SAME_UPPER"), ("strides", i(&[2, 1]))], &[rand(&[2, 2, 7, 6]), rand(&[3, 2, 3, 2]), rand(&[3])], 1);
    check_grad("Conv", &[same("SAME_LOWER"), ("dilations", i(&[2, 1]))], &[rand(&[1, 2, 6, 5]), rand(&[2, 2, 3, 2])], 1);
    check_grad("Conv", &[same("VALID"), ("strides", i(&[2, 1]))], &[rand(&[1, 2, 7, 5]), rand(&[2, 2, 3, 3])], 1);
    check_grad("AveragePool", &[same("SAME_UPPER"), ("kernel_shape", i(&[3, 2])), ("strides", i(&[2, 2]))], &[rand(&[1, 2, 7, 6])], 1);
    let avg_same = [same("SAME_LOWER"), ("kernel_shape", i(&[2, 3])), ("strides", i(&[2, 1])), ("count_include_pad", Attr::Int(1))];
    check_grad("AveragePool", &avg_same, &[rand(&[2, 1, 5, 6])], 1);
    // ceil_mode: windows hanging over the end, counting pads or not.
    for include in [0, 1] {
        let a = [("kernel_shape", i(&[3, 2])), ("strides", i(&[2, 2])), ("pads", i(&[1, 0, 0, 0])), ("ceil_mode", Attr::Int(1)), ("count_include_pad", Attr::Int(include))];
        check_grad("AveragePool", &a, &[rand(&[1, 2, 6, 5])], 1);
    }
    check_grad("MaxPool", &[same("SAME_UPPER"), ("kernel_shape", i(&[3, 3])), ("strides", i(&[2, 2])), ("storage_order", Attr::Int(1))], &[rand(&[1, 2, 5, 6])], 1);
    check_grad("MaxPool", &[("kernel_shape", i(&[2, 2])), ("strides", i(&[2, 2]))], &[rand(&[2, 3, 4, 6])], 1);
    check_grad("MaxPool", &[("kernel_shape", i(&[3, 3])), ("strides", i(&[2, 2])), ("pads", i(&[1, 1, 1, 1]))], &[rand(&[1, 2, 5, 5])], 1);
    check_grad("GlobalAveragePool", &[], &[rand(&[2, 3, 4, 5])], 1);
    check_grad("AveragePool", &[("kernel_shape", i(&[2, 2])), ("strides", i(&[2, 2]))], &[rand(&[2, 3, 4, 6])], 1);
    check_grad("AveragePool", &[("kernel_shape", i(&[3, 3])), ("strides", i(&[2, 1])), ("pads", i(&[1, 1, 1, 0]))], &[rand(&[1, 2, 5, 5])], 1);
    check_grad("AveragePool", &[("kernel_shape", i(&[3, 2])), ("strides", i(&[2, 2])), ("pads", i(&[1, 0, 1, 1])), ("count_include_pad", Attr::Int(1))], &[rand(&[1, 2, 6, 5])], 1);
}

#[test]
fn softmax_reductions_and_normalisation() {
    check_grad("Softmax", &[("axis", Attr::Int(1))], &[rand(&[2, 5, 3])], 1);
    check_grad("Softmax", &[], &[rand(&[3, 4])], 1);
    check_grad("LogSoftmax", &[("axis", Attr::Int(-1))], &[rand(&[2, 3, 5])], 1);
    check_full("Softmax", &[("axis", Attr::Int(1))], &[rand(&[2, 3, 4])], 1, 11, None);
    for keep in [0, 1] {
        check_grad("ReduceSum", &[("keepdims", Attr::Int(keep))], &[rand(&[2, 3, 4]), ints(&[0, -1])], 1);
        check_grad("ReduceMean", &[("keepdims", Attr::Int(keep))], &[rand(&[2, 3, 4]), ints(&[1])], 1);
    }
    check_grad("ReduceMean", &[], &[rand(&[3, 2])], 1);
    // Lowered to primitives first.
    check_grad("LayerNormalization", &[("epsilon", Attr::Float(1e-5))], &[rand(&[2, 3, 4]), rand(&[4]), rand(&[4])], 3);
    check_grad("LayerNormalization", &[("axis", Attr::Int(1))], &[rand(&[2, 3, 2]), rand(&[3, 2])], 1);
    let yes = || In::Const(Tensor::from_bools(&[], &[true]).unwrap());
    let ratio = || In::Const(Tensor::scalar(0.3f64));
    check_grad("Dropout", &[], &[rand(&[3, 7]), ratio(), yes()], 2);
    check_grad("BatchNormalization", &[("training_mode", Attr::Int(1))], &[rand(&[3, 2, 2, 3]), rand(&[2]), rand(&[2]), In::Const(Tensor::from_vec(&[2], vec![0.1f64, -0.2]).unwrap()), In::Const(Tensor::from_vec(&[2], vec![1.0f64, 2.0]).unwrap())], 3);
}

#[test]
fn data_movement() {
    check_grad("Reshape", &[], &[rand(&[2, 3, 4]), ints(&[4, -1])], 1);
    check_grad("Flatten", &[("axis", Attr::Int(2))], &[rand(&[2, 3, 2, 2])], 1);
    check_grad("Unsqueeze", &[], &[rand(&[2, 3]), ints(&[1])], 1);
    check_grad("Squeeze", &[], &[rand(&[2, 1, 3]), ints(&[1])], 1);
    check_grad("Cast", &[("to", Attr::Int(11))], &[rand(&[2, 3])], 1);
    check_grad("Transpose", &[("perm", Attr::Ints(vec![2, 0, 1]))], &[rand(&[2, 3, 4])], 1);
    check_grad("Concat", &[("axis", Attr::Int(1))], &[rand(&[2, 3]), rand(&[2, 1]), rand(&[2, 2])], 1);
    check_grad("Split", &[("axis", Attr::Int(1))], &[rand(&[2, 5]), ints(&[2, 3])], 2);
    check_grad("Slice", &[], &[rand(&[4, 5]), ints(&[1, -4]), ints(&[3, 100]), ints(&[0, 1])], 1);
    check_grad("Gather", &[], &[rand(&[5, 3]), In::Const(Tensor::from_vec(&[2, 3], vec![0i64, 4, 0, 2, -1, 0]).unwrap())], 1);
    // Another axis (repeats, a negative index), and int32 indices.
    let idx = In::Const(Tensor::from_vec(&[2, 2], vec![1i64, 3, 1, -1]).unwrap());
    check_grad("Gather", &[("axis", Attr::Int(1))], &[rand(&[2, 4, 3]), idx], 1);
    check_grad("Gather", &[("axis", Attr::Int(-1))], &[rand(&[3, 5]), In::Const(Tensor::from_vec(&[3], vec![4i32, 0, 4]).unwrap())], 1);
    // Steps other than 1: every other element, reversed, with negative starts.
    check_grad("Slice", &[], &[rand(&[5, 7]), ints(&[0, -1]), ints(&[5, 0]), ints(&[0, 1]), ints(&[2, -2])], 1);
    check_grad("Slice", &[], &[rand(&[4, 3, 6]), ints(&[-1]), ints(&[-100]), ints(&[2]), ints(&[-1])], 1);
    check_grad("Slice", &[], &[rand(&[3, 2, 8]), ints(&[1, 1]), ints(&[3, 8]), ints(&[0, 2]), ints(&[1, 3])], 1);
    check_grad("Expand", &[], &[rand(&[3, 1]), ints(&[2, 3, 4])], 1);
    check_grad("Trilu", &[("upper", Attr::Int(0))], &[rand(&[2, 3, 4]), In::Const(Tensor::scalar(1i64))], 1);
    check_grad("Trilu", &[], &[rand(&[4, 3])], 1);
}

#[test]
fn losses() {
    let labels = Tensor::from_vec(&[2, 3], vec![1i64, 0, 3, 2, 3, 1]).unwrap();
    let ce = |ignore, smoothing| (Loss::CrossEntropy { ignore_index: ignore, label_smoothing: smoothing }, labels.clone());
    check_full("Identity", &[], &[rand(&[2, 3, 4])], 1, 21, Some(ce(None, 0.0)));
    check_full("Identity", &[], &[rand(&[2, 3, 4])], 1, 21, Some(ce(Some(3), 0.1)));
    let target = random(&[3, 4], 5, -1.0);
    check_full("Identity", &[], &[rand(&[3, 4])], 1, 21, Some((Loss::MeanSquaredError, target)));
}

/// The ONNX loss ops in the model: NegativeLogLikelihoodLoss (a rule) and
/// SoftmaxCrossEntropyLoss (lowered to LogSoftmax and NLL), every reduction, class
/// weights, ignored targets (one outside the classes), extra dims after the classes.
#[test]
fn onnx_loss_ops() {
    let t = |d: &[usize], v: Vec<i64>| In::Const(Tensor::from_vec(d, v).unwrap());
    let weights = || In::Const(Tensor::from_vec(&[3], vec![0.5f64, 2.0, 1.25]).unwrap());
    let red = |r: &str| ("reduction", Attr::String(r.into()));
    for op in ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"] {
        let outs = if op == "SoftmaxCrossEntropyLoss" { 2 } else { 1 };
        check_grad(op, &[], &[rand(&[4, 3]), t(&[4], vec![1, 0, 2, 1])], outs);
        check_grad(op, &[red("sum")], &[rand(&[2, 3, 5]), t(&[2, 5], vec![0, 1, 2, 2, 1, 0, 0, 1, 2, 1]), weights()], outs);
        let ignored = t(&[2, 4], vec![0, -1, 2, 1, -1, 2, 2, 0]);
        check_grad(op, &[red("none"), ("ignore_index", Attr::Int(-1))], &[rand(&[2, 3, 4]), ignored.clone()], outs);
        let outside = t(&[2, 4], vec![0, 7, 2, 1, 7, 2, 2, 0]);
        check_grad(op, &[("ignore_index", Attr::Int(7))], &[rand(&[2, 3, 4]), outside, weights()], outs);
        check_grad(op, &[red("mean"), ("ignore_index", Attr::Int(-1))], &[rand(&[2, 3, 4]), ignored, weights()], outs);
    }
}

/// Every rule the autodiff module has is exercised above (keep this list in step).
#[test]
fn every_rule_is_checked() {
    let checked = "Add Sub Mul Div Pow Neg Relu Sigmoid Tanh Exp Erf Identity Log Sqrt Reciprocal Where MatMul Gemm Conv MaxPool GlobalAveragePool AveragePool Trilu Softmax LogSoftmax ReduceSum ReduceMean Reshape Flatten Unsqueeze Squeeze Transpose Concat Split Slice Gather Expand Cast NegativeLogLikelihoodLoss";
    for op in kiln_compiler::autodiff::rules::supported() {
        assert!(checked.split(' ').any(|c| c == op), "{op} has a rule but no finite-difference check");
    }
}

/// A training step over ops without a gradient is refused, every such node named at
/// once; a named parameter the loss does not depend on, or an unknown input, too.
#[test]
fn training_graph_errors_name_what_is_wrong() {
    use kiln_compiler::autodiff::{build, Optimizer, OptimizerKind, TrainConfig, Trainable};
    use kiln_graph::GraphBuilder;
    let mut b = GraphBuilder::new("no-grad");
    let x = b.input("x", DType::F32, [2usize, 3]);
    let w = b.constant("w", Tensor::from_vec(&[3], vec![1f32, 2., 3.]).unwrap());
    let u = b.constant("unused", Tensor::from_vec(&[1], vec![1f32]).unwrap());
    let a = b.node("Mul", &[x, w], &[]);
    let c = b.node("Cos", &[a], &[]);
    let s = b.node("Sin", &[c], &[]);
    let y = b.node("Add", &[s, a], &[]);
    b.output(y);
    let _ = u;
    let g = b.finish().unwrap();
    let config = |trainable: Trainable, input: &str| TrainConfig {
        inputs: vec![(input.to_string(), TensorType::new(DType::F32, vec![2, 3]))],
        output: None,
        loss: Loss::MeanSquaredError,
        optimizer: Optimizer::new(OptimizerKind::Sgd { momentum: 0.0, nesterov: false }),
        trainable,
        keep_state_unless_finite: false,
        mixed_precision: None,
        data_parallel: None,
    };
    let err = build(&g, &config(Trainable::All, "x"), Registry::builtin()).err().expect("no gradient for Cos and Sin").to_string();
    assert!(err.contains("2 node(s)") && err.contains("(Cos)") && err.contains("(Sin)"), "{err}");
    let err = build(&g, &config(Trainable::Exactly(vec!["w".into(), "unused".into()]), "x"), Registry::builtin()).err().unwrap().to_string();
    assert!(err.contains("does not depend on 'unused'"), "{err}");
    let err = build(&g, &config(Trainable::All, "images"), Registry::builtin()).err().unwrap().to_string();
    assert!(err.contains("no input 'images'"), "{err}");
}

/// Mixed precision's autocast: the products run in f16, an activation after one follows
/// in f16, an addition of a constant beyond f16's range (a -1e9 mask) stays f32, and
/// the step has the loss scale's state and outputs.
#[test]
fn autocast_runs_products_and_followers_in_f16() {
    use kiln_compiler::autodiff::training::{build, TrainConfig, Trainable, STEP_APPLIED};
    use kiln_compiler::autodiff::{MixedPrecision, Optimizer, OptimizerKind, StateKind};
    let mut b = kiln_graph::GraphBuilder::new("mlp");
    let x = b.input("x", DType::F32, [4usize, 6]);
    let w1 = b.constant("w1", Rng::new(1).tensor(&[6, 8], 0.5).unwrap());
    let w2 = b.constant("w2", Rng::new(2).tensor(&[8, 3], 0.5).unwrap());
    let mask = b.constant("mask", Tensor::from_vec(&[3], vec![0f32, -1e9, 0.0]).unwrap());
    let h = b.node("MatMul", &[x, w1], &[]);
    let h = b.node("Relu", &[h], &[]);
    let y = b.node("MatMul", &[h, w2], &[]);
    let y = b.node("Add", &[y, mask], &[]);
    b.output(y);
    let g = b.finish().unwrap();
    let config = TrainConfig {
        inputs: vec![("x".into(), TensorType::new(DType::F32, vec![4, 6]))],
        output: None,
        loss: Loss::MeanSquaredError,
        optimizer: Optimizer::new(OptimizerKind::Sgd { momentum: 0.0, nesterov: false }),
        trainable: Trainable::Among(vec!["w1".into(), "w2".into()]),
        keep_state_unless_finite: false,
        mixed_precision: Some(MixedPrecision::default()),
        data_parallel: None,
    };
    let tg = build(&g, &config, Registry::builtin()).unwrap();
    let t = &tg.graph;
    // A node runs in f16 when autocast widened its output back to f32 by a Cast.
    let in_f16 = |n: &Node| t.nodes.iter().any(|c| c.op_type == "Cast" && c.name == format!("{}/autocast/to_f32", n.name));
    let f16_ops: Vec<&str> = t.nodes.iter().filter(|n| in_f16(n)).map(|n| n.op_type.as_str()).collect();
    assert_eq!(f16_ops.iter().filter(|o| **o == "MatMul").count(), 2, "{f16_ops:?}");
    assert!(f16_ops.contains(&"Relu"), "Relu follows the product: {f16_ops:?}");
    let masked = t.nodes.iter().find(|n| n.op_type == "Add" && n.inputs.iter().any(|&v| v.is_some_and(|v| t.values[v].name == "mask"))).expect("the mask's Add");
    assert!(!in_f16(masked), "-1e9 is beyond f16: the Add stays f32");
    assert_eq!(tg.state.iter().filter(|s| s.kind == StateKind::LossScale).count(), 2);
    assert_eq!(tg.mixed_precision.as_ref().map(|m| m.0.as_str()), Some(STEP_APPLIED));
}
