//! Imports every model of the shared zoo (KILN_ZOO, default ../shared/zoo from the
//! workspace root) and its test data, and checks what broken files do.

use kiln_compiler::onnx::{self, ImportError};
use kiln_graph::{Dim, Graph};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn zoo() -> PathBuf {
    let dir = std::env::var_os("KILN_ZOO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/zoo"));
    assert!(
        dir.join("resnet18/model.onnx").is_file(),
        "the model zoo is missing at {}: set KILN_ZOO to the zoo directory (the shared zoo lives in /work/shared/zoo; see its README.md)",
        dir.display()
    );
    dir
}

/// (model, nodes after Constant folding, inputs, outputs, ai.onnx opset, an op it must contain)
const EXPECTED: &[(&str, usize, &[&str], &[&str], i64, &str)] = &[
    ("mlp", 3, &["x"], &["logits"], 17, "Gemm"),
    ("lenet", 12, &["x"], &["logits"], 17, "Conv"),
    ("resnet18", 49, &["x"], &["logits"], 17, "Conv"),
    ("mobilenet_v2", 100, &["x"], &["logits"], 17, "Clip"),
    ("squeezenet1_1", 83, &["x"], &["logits"], 17, "Concat"),
    ("bert_tiny", 203, &["input_ids", "attention_mask"], &["last_hidden_state", "pooler_output"], 17, "Softmax"),
    ("gpt2_tiny", 308, &["input_ids", "attention_mask"], &["last_hidden_state"], 17, "Tanh"),
    ("ppocr_cls", 258, &["x"], &["save_infer_model/scale_0.tmp_1"], 11, "HardSigmoid"),
    ("ppocr_det", 330, &["x"], &["sigmoid_0.tmp_0"], 12, "ConvTranspose"),
    ("magika", 95, &["bytes"], &["target_label"], 15, "ReduceSum"),
];

fn names(g: &Graph, ids: &[usize]) -> Vec<String> {
    ids.iter().map(|&v| g.value_name(v).to_string()).collect()
}

#[test]
fn every_zoo_model_imports() {
    let zoo = zoo();
    let mut seen = 0;
    for entry in std::fs::read_dir(&zoo).unwrap() {
        let dir = entry.unwrap().path();
        let path = dir.join("model.onnx");
        if !path.is_file() {
            continue;
        }
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let g = onnx::import_file_unchecked(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let hist: BTreeMap<String, usize> = g.op_histogram().into_iter().collect();
        println!("{name}: {} nodes, {} initializers, ops {hist:?}", g.nodes.len(), g.initializers.len());
        if let Err(e) = onnx::check_ops(&g, kiln_ops::Registry::builtin()) {
            println!("  (informational) {e}");
        }
        assert!(!g.nodes.is_empty() && !g.inputs.is_empty() && !g.outputs.is_empty(), "{name}");
        assert!(!hist.contains_key("Constant"), "{name}: Constant nodes are folded");
        for n in &g.nodes {
            assert!(!n.name.is_empty() && !n.op_type.is_empty(), "{name}");
        }
        let node_names: std::collections::HashSet<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(node_names.len(), g.nodes.len(), "{name}: node names are unique");
        for &v in &g.inputs {
            assert!(g.values[v].ty.is_some(), "{name}: input {} is typed", g.value_name(v));
            assert!(!g.initializers.contains_key(&v));
        }
        for (v, t) in &g.initializers {
            let ty = g.values[*v].ty.as_ref().unwrap();
            assert_eq!((ty.dtype, ty.shape.as_fixed().unwrap()), (t.dtype(), t.dims().to_vec()), "{name}");
        }
        if let Some(&(_, nodes, inputs, outputs, opset, op)) = EXPECTED.iter().find(|e| e.0 == name) {
            assert_eq!(g.nodes.len(), nodes, "{name}");
            assert_eq!(names(&g, &g.inputs), inputs, "{name}");
            assert_eq!(names(&g, &g.outputs), outputs, "{name}");
            assert_eq!(g.opset(), opset, "{name}");
            assert!(hist.contains_key(op), "{name} has {op}");
            seen += 1;
        }
        check_test_data(&name, &dir, &g);
    }
    assert!(seen >= EXPECTED.len(), "found {seen} of the {} expected zoo models", EXPECTED.len());
}

/// Reads every test_data_set_*/*.pb: inputs are named like graph inputs and fit their types.
fn check_test_data(name: &str, dir: &std::path::Path, g: &Graph) {
    let mut sets = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let set = entry.unwrap().path();
        if !set.file_name().unwrap().to_str().unwrap().starts_with("test_data_set_") {
            continue;
        }
        sets += 1;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&set).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "pb")) {
            let (tname, t) = onnx::read_tensor_pb(f).unwrap_or_else(|e| panic!("{name}: {e}"));
            let file = f.file_name().unwrap().to_str().unwrap();
            let list = if file.starts_with("input_") { &g.inputs } else { &g.outputs };
            let i: usize = file.trim_start_matches(|c: char| !c.is_ascii_digit()).trim_end_matches(".pb").parse().unwrap();
            let v = list[i];
            if !tname.is_empty() {
                assert_eq!(tname, g.value_name(v), "{name}/{file}");
            }
            if let Some(ty) = &g.values[v].ty {
                assert_eq!(ty.dtype, t.dtype(), "{name}/{file}");
                assert_eq!(ty.shape.rank(), t.rank(), "{name}/{file}");
                for (d, &n) in ty.shape.0.iter().zip(t.dims()) {
                    if let Dim::Fixed(k) = d {
                        assert_eq!(*k, n, "{name}/{file}: {ty} vs {:?}", t.dims());
                    }
                }
            }
        }
    }
    assert!(sets > 0, "{name} has test data");
}

#[test]
fn truncated_model_gives_a_clean_error() {
    let path = zoo().join("resnet18/model.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 1, 1000, 3] {
        let p = dir.join("half.onnx");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = onnx::import_file(&p).unwrap_err();
        assert!(matches!(e, ImportError::Decode { .. } | ImportError::NoGraph(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("half.onnx"), "{msg}");
        if cut == bytes.len() / 2 {
            println!("{msg}");
            assert!(msg.contains("not a valid ONNX model"), "{msg}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resnet18_weights_import_whole() {
    let path = zoo().join("resnet18/model.onnx");
    let g = onnx::import_file_unchecked(&path).unwrap();
    let bytes: usize = g.initializers.values().map(|t| t.bytes().len()).sum();
    assert!(bytes > 40 << 20, "only {bytes} bytes of weights");
}
