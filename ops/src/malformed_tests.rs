//! Malformed and unusual inputs never panic: each op of the signal, random, ml and
//! training families (kiln's backward ops among them), of the string ops and of onnxruntime's attention contrib ops is run from a valid
//! case with one thing changed at a time (an input of another rank, dtype or shape,
//! empty, omitted, constant, filled with extreme values; an attribute missing, of
//! another type or out of range), and must give outputs or an error, never a panic.
use crate::testing::{all_ort_cases, f32s, i64_vec, ints, iota_f32, rand, rand_f32_map, string, Case, Input};
use crate::{Arg, TensorType};
use kiln_graph::{Attr, DType, Tensor};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The valid cases the sweep starts from.
fn valid_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = all_ort_cases()
        .iter()
        .filter(|c| ["Attention", "MultiHeadAttention", "GroupQueryAttention", "EmbedLayerNormalization"].contains(&c.op))
        .map(|c| c.case())
        .collect();
    let signal = rand(DType::F32, &[2, 16, 1], 3);
    cases.push(Case::new("DFT").opset(20).input(signal.clone()).constant(Tensor::scalar(10i64)).attr("onesided", Attr::Int(1)));
    cases.push(Case::new("DFT").opset(20).input(rand(DType::F32, &[2, 3, 4, 1], 4)).omitted().constant(Tensor::scalar(-2i64)));
    cases.push(Case::new("DFT").opset(17).input(rand(DType::F32, &[2, 8, 2], 5)).attrs(&[("inverse", Attr::Int(1)), ("axis", Attr::Int(1))]));
    let window = f32s(&[8], &[0.1, 0.3, 0.6, 1.0, 1.0, 0.6, 0.3, 0.1]);
    cases.push(Case::new("STFT").opset(17).input(rand(DType::F32, &[2, 30], 6)).constant(Tensor::scalar(3i64)).input(window).attr("onesided", Attr::Int(0)));
    cases.push(Case::new("STFT").opset(17).input(rand(DType::F32, &[1, 30, 1], 7)).constant(Tensor::scalar(2i64)).omitted().constant(Tensor::scalar(6i64)));
    let mel = |c: Case| c.constant(Tensor::scalar(5i32)).constant(Tensor::scalar(32i32)).input(Tensor::scalar(16000i32)).input(Tensor::scalar(100f32)).input(Tensor::scalar(7000f32));
    cases.push(mel(Case::new("MelWeightMatrix").opset(17)));
    cases.push(Case::new("Bernoulli").opset(15).input(rand_f32_map(&[3, 4], 8, f32::abs)).attr("seed", Attr::Float(5.0)));
    cases.push(Case::new("Multinomial").opset(7).input(rand(DType::F32, &[2, 3], 9)).attrs(&[("sample_size", Attr::Int(4)), ("seed", Attr::Float(2.0))]));
    cases.push(Case::new("RandomNormal").attrs(&[("shape", ints(&[3, 4])), ("mean", Attr::Float(2.0)), ("scale", Attr::Float(0.5)), ("seed", Attr::Float(3.0))]));
    cases.push(Case::new("RandomNormalLike").input(rand(DType::F16, &[2, 5], 1)).attr("seed", Attr::Float(1.0)));
    cases.push(Case::new("RandomUniform").attrs(&[("shape", ints(&[4, 5])), ("low", Attr::Float(-2.0)), ("high", Attr::Float(3.0)), ("seed", Attr::Float(1.0))]));
    cases.push(Case::new("RandomUniformLike").input(i64_vec(&[1, 2])).attr("dtype", Attr::Int(1)));
    // Training's backward ops (they can also appear in a model someone writes).
    let kiln = |op: &str| Case::new(op).domain("kiln").opset(1);
    // Collectives (unbound here: each run is the clear "needs a communicator" error).
    cases.push(kiln("AllReduce").input(rand(DType::F32, &[3, 4], 21)).input(rand(DType::F32, &[2], 22)));
    cases.push(kiln("AllReduceStart").input(rand(DType::F32, &[3, 4], 23)));
    cases.push(kiln("AllReduceWait").input(Tensor::scalar(0i64)).input(rand(DType::F32, &[3, 4], 24)));
    cases.push(kiln("DropoutMask").constant(i64_vec(&[3, 4])).input(Tensor::scalar(7i64)).attrs(&[("ratio", Attr::Float(0.25)), ("stream", Attr::Int(1))]));
    let pool = [("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
    cases.push(kiln("MaxPoolGrad").input(rand(DType::F32, &[1, 2, 4, 6], 10)).input(rand(DType::F32, &[1, 2, 2, 3], 11)).attrs(&pool));
    cases.push(kiln("ConvWeightGrad").input(rand(DType::F32, &[2, 2, 5, 5], 12)).input(rand(DType::F32, &[2, 4, 3, 3], 13)).attrs(&[("kernel_shape", ints(&[3, 3])), ("group", Attr::Int(2))]));
    let ml = |op: &str| Case::new(op).domain("ai.onnx.ml").opset(1);
    cases.push(ml("ArrayFeatureExtractor").input(iota_f32(&[2, 3, 4])).input(i64_vec(&[3, 0, 3])));
    cases.push(ml("ArrayFeatureExtractor").input(iota_f32(&[2, 3, 4])).constant(i64_vec(&[1])));
    cases.push(ml("Binarizer").input(rand(DType::F32, &[6], 2)).attr("threshold", Attr::Float(0.1)));
    let tfidf = Case::new("TfIdfVectorizer").opset(9).input(Tensor::from_slice(&[2, 6], &[1i32, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]).unwrap()).attrs(&[
        ("min_gram_length", Attr::Int(1)),
        ("max_gram_length", Attr::Int(2)),
        ("max_skip_count", Attr::Int(5)),
        ("mode", string("TFIDF")),
        ("ngram_counts", ints(&[0, 4])),
        ("ngram_indexes", ints(&[0, 1, 2, 3, 4, 5, 6])),
        ("pool_int64s", ints(&[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])),
        ("weights", Attr::Floats(vec![0.5, 1.5, 2.0, 0.25, 3.0, 0.75, 1.25])),
    ]);
    cases.push(tfidf);
    let tree = Case::new("TreeEnsemble").domain("ai.onnx.ml").opset(5).attrs(&[
        ("aggregate_function", Attr::Int(1)),
        ("leaf_targetids", ints(&[0, 1, 0, 1])),
        ("leaf_weights", Attr::Tensor(f32s(&[4], &[5.23, 12.12, -12.23, 7.21]))),
        ("n_targets", Attr::Int(2)),
        ("nodes_falseleafs", ints(&[0, 1, 1])),
        ("nodes_falsenodeids", ints(&[2, 2, 3])),
        ("nodes_featureids", ints(&[0, 0, 1])),
        ("nodes_modes", ints(&[0, 0, 0])),
        ("nodes_splits", Attr::Tensor(f32s(&[3], &[3.14, 1.2, 4.2]))),
        ("nodes_trueleafs", ints(&[0, 1, 1])),
        ("nodes_truenodeids", ints(&[1, 0, 1])),
        ("post_transform", Attr::Int(0)),
        ("tree_roots", ints(&[0])),
    ]);
    cases.push(tree.input(Tensor::from_slice(&[3, 2], &[1.2f64, 3.4, -0.12, 1.66, 4.14, 1.77]).unwrap()));
    let words = |v: &[&str]| Attr::Strings(v.iter().map(|s| s.to_string()).collect());
    let text = rand(DType::String, &[2, 3], 4);
    cases.push(Case::new("StringConcat").opset(20).input(text.clone()).input(rand(DType::String, &[3], 5)));
    cases.push(Case::new("StringSplit").opset(20).outputs(2).constant(text.clone()).attrs(&[("delimiter", string(" ")), ("maxsplit", Attr::Int(1))]));
    cases.push(Case::new("RegexFullMatch").opset(20).input(text.clone()).attr("pattern", string(r"\w+( \w)?")));
    cases.push(Case::new("StringNormalizer").opset(10).constant(rand(DType::String, &[1, 6], 6)).attrs(&[("case_change_action", string("UPPER")), ("stopwords", words(&["monday"]))]));
    cases.push(Case::new("Equal").opset(19).input(text.clone()).input(rand(DType::String, &[1, 3], 7)));
    cases.push(Case::new("Cast").opset(21).input(text.clone()).attr("to", Attr::Int(1)));
    cases.push(Case::new("Cast").opset(21).input(rand(DType::F32, &[2, 3], 8)).attr("to", Attr::Int(8)));
    cases.push(ml("LabelEncoder").opset(4).input(text).attrs(&[("keys_strings", words(&["a", "Monday"])), ("values_int64s", ints(&[1, 2])), ("default_int64", Attr::Int(7))]));
    let train = |op: &str, outputs: usize| Case::new(op).domain("ai.onnx.preview.training").opset(1).outputs(outputs).input(Tensor::scalar(0.1f32)).input(Tensor::scalar(2i64));
    let two = || f32s(&[2], &[1.2, 2.8]);
    cases.push(train("Adagrad", 2).attrs(&[("decay_factor", Attr::Float(0.1)), ("epsilon", Attr::Float(1e-5))]).input(two()).input(two()).input(two()));
    cases.push(train("Adam", 3).attrs(&[("alpha", Attr::Float(0.95)), ("beta", Attr::Float(0.1))]).input(two()).input(two()).input(two()).input(two()));
    cases.push(train("Momentum", 2).attrs(&[("alpha", Attr::Float(0.95)), ("beta", Attr::Float(0.1)), ("mode", string("nesterov"))]).input(two()).input(two()).input(two()));
    cases
}

/// Tensors of `dims` filled with `v` in `dtype`.
fn filled(dtype: DType, dims: &[usize], v: f64) -> Tensor {
    let n: usize = dims.iter().product();
    if dtype == DType::String {
        return Tensor::from_strings(dims, vec![v.to_string(); n]).unwrap();
    }
    Tensor::from_f64(dtype, dims, &vec![v; n]).unwrap()
}

/// The variants of input `t`: other ranks, shapes and dtypes, empty, extreme values.
fn input_variants(t: &Tensor) -> Vec<Tensor> {
    let d = t.dims().to_vec();
    let mut shapes: Vec<Vec<usize>> = vec![vec![], [vec![2], d.clone()].concat(), [d.clone(), vec![3]].concat()];
    if !d.is_empty() {
        shapes.push(d[..d.len() - 1].to_vec());
        for i in 0..d.len() {
            let mut z = d.clone();
            z[i] = 0;
            shapes.push(z);
            let mut more = d.clone();
            more[i] += 1;
            shapes.push(more);
        }
    }
    let mut out: Vec<Tensor> = shapes.iter().map(|s| rand(t.dtype(), s, 11)).collect();
    for other in [DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::U8, DType::Bool, DType::String] {
        if other != t.dtype() {
            out.push(rand(other, &d, 12));
        }
    }
    let extremes: &[f64] = if t.dtype().is_float() { &[f64::NAN, f64::INFINITY, -1e30, 0.0] } else { &[-1.0, 0.0, -(2f64.powi(31)), 2f64.powi(31) - 1.0, 2f64.powi(62)] };
    out.extend(extremes.iter().map(|&v| filled(t.dtype(), &d, v)));
    out
}

/// Attribute values tried in place of each attribute.
fn attr_variants() -> Vec<Option<Attr>> {
    vec![
        None,
        Some(Attr::Int(-1)),
        Some(Attr::Int(0)),
        Some(Attr::Int(7)),
        Some(Attr::Int(i64::MAX)),
        Some(Attr::Int(i64::MIN)),
        Some(Attr::Float(f32::NAN)),
        Some(Attr::Float(-1.0)),
        Some(Attr::Ints(vec![])),
        Some(Attr::Ints(vec![-1, i64::MAX])),
        Some(Attr::Floats(vec![])),
        Some(Attr::String("bogus".into())),
        Some(Attr::Tensor(f32s(&[0], &[]))),
    ]
}

/// Runs `case` on the CPU unless its outputs would be large (sessions refuse those
/// against their memory limit); `Err` with the panic message if anything panicked.
fn run_checked(case: &Case) -> Result<(), String> {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let Ok(op) = case.op() else { return };
        let types: Vec<Option<TensorType>> = case.inputs.iter().map(|x| x.tensor().map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
        let args: Vec<Option<Arg>> = types.iter().zip(&case.inputs).map(|(ty, x)| ty.as_ref().map(|ty| Arg { ty, value: x.known_value() })).collect();
        let Ok(outs) = op.infer(&args) else { return };
        let bytes = outs.iter().map(|t| kiln_graph::size::bytes(t.dtype, &t.dims).unwrap_or(usize::MAX)).fold(0usize, usize::saturating_add);
        if bytes > 64 << 20 {
            return;
        }
        let _ = crate::testing::run(op.as_ref(), &case.inputs, &[]);
    }));
    outcome.map_err(|e| e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default())
}

#[test]
fn malformed_inputs_and_attributes_are_errors_not_panics() {
    let mut panics = vec![];
    let mut runs = 0;
    for base in valid_cases() {
        assert!(run_checked(&base).is_ok(), "{} base case panicked", base.op_type);
        for i in 0..base.inputs.len() {
            let Some(t) = base.inputs[i].tensor().cloned() else { continue };
            let mut variants: Vec<Input> = input_variants(&t).into_iter().flat_map(|v| [Input::Data(v.clone()), Input::Const(v)]).collect();
            variants.extend([Input::Omitted, Input::Const(t.clone())]);
            for v in variants {
                let mut c = base.clone();
                let what = format!("{} input {i} <- {v:?}", c.op_type);
                c.inputs[i] = v;
                runs += 1;
                if let Err(e) = run_checked(&c) {
                    panics.push(format!("{what}: {e}"));
                }
            }
        }
        for (name, _) in &base.attrs {
            for v in attr_variants() {
                let mut c = base.clone();
                c.attrs.retain(|(k, _)| k != name);
                let what = format!("{} attribute {name} <- {v:?}", c.op_type);
                if let Some(v) = v {
                    c.attrs.push((name.clone(), v));
                }
                runs += 1;
                if let Err(e) = run_checked(&c) {
                    panics.push(format!("{what}: {e}"));
                }
            }
        }
    }
    assert!(runs > 1000, "only {runs} variants ran");
    assert!(panics.is_empty(), "{} of {runs} variants panicked:\n{}", panics.len(), panics.join("\n"));
}

/// Cases the sweep found, whose WGSL did not validate (a division by a zero extent, an
/// out-of-range literal): each now runs, with the CPU result the sweep's runner checks
/// the WGSL of.
#[test]
fn edge_cases_generate_valid_wgsl() {
    let ort = |op: &str| all_ort_cases().iter().find(|c| c.op == op).unwrap().case();
    // No queries: an empty mask, no dispatch for it.
    for op in ["Attention", "MultiHeadAttention"] {
        let mut c = ort(op);
        let mut dims = c.inputs[0].tensor().unwrap().dims().to_vec();
        dims[1] = 0;
        c.inputs[0] = Input::Data(rand(DType::F32, &dims, 1));
        let y = c.run_cpu().unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(y[0].len(), 0, "{op}");
    }
    // A local window past i32 masks what no window masks.
    let gqa = ort("GroupQueryAttention");
    let huge = gqa.clone().attr("local_window_size", Attr::Int(i64::MAX)).run_cpu().unwrap();
    let none = gqa.attr("local_window_size", Attr::Int(-1)).run_cpu().unwrap();
    assert_eq!(huge[0].to_f64_vec(), none[0].to_f64_vec());
    // A frame step past the signal: one frame, as a step of the signal's length.
    let stft = |step: i64| Case::new("STFT").opset(17).input(rand(DType::F32, &[1, 30, 1], 7)).constant(Tensor::scalar(step)).omitted().constant(Tensor::scalar(6i64)).run_cpu().unwrap();
    let (far, whole) = (stft(1 << 62), stft(30));
    assert_eq!((far[0].dims(), far[0].to_f64_vec()), (whole[0].dims(), whole[0].to_f64_vec()));
    assert_eq!(far[0].dims()[1], 1);
}
