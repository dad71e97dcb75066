//! The importer's strictness: the malformed models of issue 10 (a zoo model mutated
//! through the prost messages, and tiny hand-built ones) give errors naming the node,
//! the op and what was expected; FIFOs are refused instead of blocking.

use kiln_compiler::onnx::proto::*;
use kiln_compiler::onnx::{self, ImportError, ImportOptions};
use prost::Message;
use std::path::PathBuf;

fn zoo() -> PathBuf {
    let dir = std::env::var_os("KILN_ZOO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/zoo"));
    assert!(dir.join("mlp/model.onnx").is_file(), "the model zoo is missing at {}: set KILN_ZOO", dir.display());
    dir
}

/// The zoo's MLP (Gemm, Relu, Gemm; ai.onnx opset 17), decoded.
fn mlp() -> ModelProto {
    let bytes = std::fs::read(zoo().join("mlp/model.onnx")).unwrap();
    ModelProto::decode(bytes.as_slice()).unwrap()
}

fn import(m: &ModelProto) -> Result<kiln_graph::Graph, ImportError> {
    onnx::import_bytes(&m.encode_to_vec(), None)
}

/// The error message, checked to be an error in both the checked and unchecked modes.
fn error(m: &ModelProto) -> String {
    let unchecked = onnx::import_bytes_with(&m.encode_to_vec(), None, &ImportOptions::unchecked());
    assert!(unchecked.is_err(), "the unchecked import accepted it too");
    import(m).map(|_| ()).unwrap_err().to_string()
}

fn gemm(m: &mut ModelProto) -> &mut NodeProto {
    m.graph.as_mut().unwrap().node.iter_mut().find(|n| n.op_type == "Gemm").unwrap()
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i, r#type: attribute_type::INT, ..Default::default() }
}

#[test]
fn the_unmutated_model_imports() {
    import(&mlp()).unwrap();
}

#[test]
fn unknown_opset_versions_are_refused() {
    for v in [0, -1, 99, 1 << 40] {
        let mut m = mlp();
        m.opset_import.iter_mut().filter(|o| o.domain.is_empty() || o.domain == "ai.onnx").for_each(|o| o.version = v);
        let e = error(&m);
        assert!(e.contains(&format!("version {v}")) && e.contains("ai.onnx"), "{v}: {e}");
    }
    // A custom domain's version is the registry's business, but never below 1.
    let mut m = mlp();
    m.opset_import.push(OperatorSetIdProto { domain: "com.example".into(), version: 0 });
    assert!(error(&m).contains("com.example"));
    m.opset_import.last_mut().unwrap().version = 7;
    import(&m).unwrap();
    // Two different versions of one domain.
    let mut m = mlp();
    m.opset_import.push(OperatorSetIdProto { domain: "ai.onnx".into(), version: 13 });
    assert!(error(&m).contains("imported twice"));
}

#[test]
fn a_missing_default_opset_import_is_refused() {
    let mut m = mlp();
    m.opset_import.clear();
    let e = error(&m);
    assert!(e.contains("no opset of the default domain") && e.contains("Gemm"), "{e}");
    m.opset_import.push(OperatorSetIdProto { domain: "com.example".into(), version: 1 });
    assert!(error(&m).contains("no opset of the default domain"));
}

#[test]
fn unknown_ir_versions_are_refused() {
    for v in [0, 99, -3] {
        let mut m = mlp();
        m.ir_version = v;
        let e = error(&m);
        assert!(e.contains(&format!("IR version {v}")), "{e}");
    }
}

#[test]
fn wrong_input_and_output_counts_name_node_op_and_expectation() {
    let mut m = mlp();
    let g = gemm(&mut m);
    let name = g.name.clone();
    let first = g.input[0].clone();
    g.input = vec![first; 53];
    let e = error(&m);
    assert!(e.contains(&format!("'{name}' (Gemm)")) && e.contains("53 inputs given, expected 2 to 3"), "{e}");
    let mut m = mlp();
    gemm(&mut m).input.truncate(1);
    assert!(error(&m).contains("1 inputs given, expected 2 to 3"));
    let mut m = mlp();
    gemm(&mut m).output.push("extra".into());
    assert!(error(&m).contains("2 outputs given, expected 1"));
}

#[test]
fn attributes_must_have_their_type_be_unique_and_flags_be_flags() {
    let mut m = mlp();
    gemm(&mut m).attribute.push(int_attr("transB", 5));
    gemm(&mut m).attribute.retain(|a| a.name != "transB" || a.i == 5);
    let e = error(&m);
    assert!(e.contains("'transB' is 5, expected 0 or 1") && e.contains("(Gemm)"), "{e}");

    let mut m = mlp();
    gemm(&mut m).attribute.retain(|a| a.name != "alpha");
    gemm(&mut m).attribute.push(AttributeProto { name: "alpha".into(), s: b"one".to_vec(), r#type: attribute_type::STRING, ..Default::default() });
    let e = error(&m);
    assert!(e.contains("'alpha' is STRING, expected FLOAT"), "{e}");

    let mut m = mlp();
    let g = gemm(&mut m);
    g.attribute.push(int_attr("transA", 0));
    g.attribute.push(int_attr("transA", 1));
    let e = error(&m);
    assert!(e.contains("'transA' is given twice"), "{e}");

    // Unknown attributes are warnings only.
    let mut m = mlp();
    gemm(&mut m).attribute.push(int_attr("no_such_attribute", 3));
    import(&m).unwrap();
}

#[test]
fn an_op_newer_than_the_model_opset_is_refused() {
    let mut m = mlp();
    m.graph.as_mut().unwrap().node.iter_mut().find(|n| n.op_type == "Relu").unwrap().op_type = "Gelu".into();
    let e = error(&m);
    assert!(e.contains("Gelu is not in opset 17") && e.contains("added in opset 20"), "{e}");
}

#[cfg(unix)]
fn mkfifo(path: &std::path::Path) -> bool {
    std::process::Command::new("mkfifo").arg(path).status().is_ok_and(|s| s.success())
}

#[cfg(unix)]
#[test]
fn fifos_are_refused_not_read() {
    let dir = std::env::temp_dir().join(format!("kiln-strict-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The model itself, a .pb tensor and an external-data file.
    let model = dir.join("model.onnx");
    assert!(mkfifo(&model));
    let e = onnx::import_file(&model).unwrap_err().to_string();
    assert!(e.contains("model.onnx") && e.contains("FIFO"), "{e}");
    let pb = dir.join("input_0.pb");
    assert!(mkfifo(&pb));
    let e = onnx::read_tensor_pb(&pb).unwrap_err().to_string();
    assert!(e.contains("input_0.pb") && e.contains("FIFO"), "{e}");

    let weights = dir.join("weights.bin");
    assert!(mkfifo(&weights));
    let mut m = mlp();
    let init = &mut m.graph.as_mut().unwrap().initializer[0];
    let n_bytes = init.raw_data.len();
    init.raw_data = Default::default();
    init.data_location = 1;
    init.external_data = vec![
        StringStringEntryProto { key: "location".into(), value: "weights.bin".into() },
        StringStringEntryProto { key: "length".into(), value: n_bytes.to_string() },
    ];
    let e = onnx::import_bytes(&m.encode_to_vec(), Some(&dir)).unwrap_err().to_string();
    assert!(e.contains("weights.bin") && e.contains("FIFO"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
