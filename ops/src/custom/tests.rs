//! Manifest mistakes are errors naming the file, the line and what was expected; a good
//! manifest's op infers, costs and generates validated WGSL.

use super::*;
use kiln_graph::Node;

const MANIFEST: &str = r#"{
  "domain": "com.test",
  "op_type": "Gate",
  "inputs": [{ "name": "x" }],
  "outputs": [{ "name": "y", "shape": ["x[0]", "x[1] / 2"], "dtype": "x" }],
  "attributes": [{ "name": "beta", "type": "float", "default": 1.0 }, { "name": "k", "type": "int", "default": 2 }],
  "wgsl": { "file": "gate.wgsl", "tune_workgroup_sizes": [64, 128] },
  "cost": { "flops": "k * numel(y)" }
}
"#;

const WGSL: &str = "@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(KILN_WORKGROUP)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = kiln_index(gid);
    if (i >= KILN_INVOCATIONS) { return; }
    let h = y_shape[1];
    let r = i / h;
    let c = i % h;
    y[i] = x[r * x_shape[1] + c] * beta + f32(k) * x[r * x_shape[1] + h + c];
}
";

/// Writes the manifest and kernel into a fresh folder and loads them.
fn load(manifest: &str, wgsl: &str) -> Result<CustomOp> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("kiln-custom-op-test-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("gate.json"), manifest).unwrap();
    std::fs::write(dir.join("gate.wgsl"), wgsl).unwrap();
    let op = CustomOp::load(dir.join("gate.json"));
    let _ = std::fs::remove_dir_all(&dir);
    op
}

fn error(manifest: &str, wgsl: &str) -> String {
    load(manifest, wgsl).expect_err("the mistake is found").to_string()
}

fn assert_has(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "expected '{p}' in: {e}");
    }
}

#[test]
fn a_good_manifest_infers_costs_and_generates_validated_wgsl() {
    let op = load(MANIFEST, WGSL).unwrap();
    let mut registry = Registry::new();
    op.register(&mut registry);
    let mut node = Node { name: "g".into(), op_type: "Gate".into(), domain: "com.test".into(), attrs: Default::default(), inputs: vec![Some(0)], outputs: vec![1] };
    node.attrs.insert("beta".into(), Attr::Float(0.5));
    let created = registry.create(&NodeSpec::new(&node, 1)).unwrap();
    let x = TensorType::new(DType::F32, vec![3, 10]);
    let inputs = [Some(Arg { ty: &x, value: None })];
    let out = created.infer(&inputs).unwrap();
    assert_eq!(out, vec![TensorType::new(DType::F32, vec![3, 5])]);
    assert_eq!(created.cost(&inputs, &out).flops, 30);
    let k = created.wgsl().unwrap();
    assert_eq!(k.params(&inputs, &out)[0].candidates, vec![64, 128]);
    for wg in [64, 128] {
        let tune = TuneValues([("workgroup".to_string(), wg)].into());
        let p = k.generate(&inputs, &out, &tune).unwrap();
        let d = &p.dispatches[0];
        assert!(d.source.contains(&format!("const KILN_WORKGROUP: u32 = {wg}u;")) && d.source.contains("const beta: f32 = 0.5f;") && d.source.contains("const k: i32 = i32(2);"), "{}", d.source);
        crate::testing::validate_wgsl(&d.source);
        assert_eq!(d.bindings, vec![crate::Binding::Input(0), crate::Binding::Output(0)]);
    }
    // Wrong inputs are named.
    let i = TensorType::new(DType::I64, vec![3, 10]);
    let e = created.infer(&[Some(Arg { ty: &i, value: None })]).unwrap_err().to_string();
    assert_has(&e, &["'x' has dtype i64", "allows f32"]);
    // A node attribute the manifest does not declare, or of the wrong kind.
    node.attrs.insert("gamma".into(), Attr::Int(1));
    let e = registry.create(&NodeSpec::new(&node, 1)).unwrap_err().to_string();
    assert_has(&e, &["gamma", "not declared", "beta, k"]);
    node.attrs.remove("gamma");
    node.attrs.insert("k".into(), Attr::Float(1.0));
    let e = registry.create(&NodeSpec::new(&node, 1)).unwrap_err().to_string();
    assert_has(&e, &["'k'", "expected int, found float"]);
}

#[test]
fn the_embedded_form_rebuilds_the_same_op() {
    let op = load(MANIFEST, WGSL).unwrap();
    let again = CustomOp::from_source(op.source()).unwrap();
    assert_eq!(again.source(), op.source());
    assert!(again.has_gpu_kernel() && !again.has_cpu_kernel());
}

#[test]
fn manifest_mistakes_name_the_file_the_line_and_what_was_expected() {
    // An unknown field (line 5).
    let e = error(&MANIFEST.replace("\"shape\"", "\"shap\""), WGSL);
    assert_has(&e, &["gate.json:5:", "unknown field `shap`", "expected one of `name`, `shape`, `dtype`"]);
    // A shape rule that does not parse.
    let e = error(&MANIFEST.replace("x[1] / 2", "x[1] /"), WGSL);
    assert_has(&e, &["gate.json:5:", "output 'y' shape", "does not parse", "found the end of the expression"]);
    // A shape rule reading a name that is neither an input nor an integer attribute.
    let e = error(&MANIFEST.replace("x[1] / 2", "z[1]"), WGSL);
    assert_has(&e, &["gate.json:5:", "reads 'z', which is not an input", "expected one of: x"]);
    let e = error(&MANIFEST.replace("x[1] / 2", "x[1] / beta"), WGSL);
    assert_has(&e, &["gate.json:5:", "'beta', which is not an integer attribute", "integer attributes: k"]);
    // A missing required field, a wrong JSON type, an unknown dtype.
    let e = error(&MANIFEST.replace("\"op_type\": \"Gate\",", ""), WGSL);
    assert_has(&e, &["gate.json:", "missing field `op_type`"]);
    let e = error(&MANIFEST.replace("\"shape\": [\"x[0]\", \"x[1] / 2\"]", "\"shape\": 3"), WGSL);
    assert_has(&e, &["gate.json:5:", "a shape: the name of an input"]);
    let e = error(&MANIFEST.replace("{ \"name\": \"x\" }", "{ \"name\": \"x\", \"dtypes\": [\"float\"] }"), WGSL);
    assert_has(&e, &["gate.json:4:", "unknown dtype 'float'", "f32, f16"]);
    let e = error(&MANIFEST.replace("\"default\": 2", "\"default\": 2.5"), WGSL);
    assert_has(&e, &["gate.json:6:", "attribute 'k'", "expected an integer, found 2.5"]);
    let e = error(&MANIFEST.replace("\"com.test\"", "\"\""), WGSL);
    assert_has(&e, &["gate.json:2:", "domain of its own"]);
}

#[test]
fn kernel_mistakes_point_into_the_wgsl_file() {
    // WGSL that does not compile (a missing ';' at the end of line 8, found on line 9).
    let e = error(MANIFEST, &WGSL.replace("let h = y_shape[1];", "let h = y_shape[1]"));
    assert_has(&e, &["gate.wgsl:9:5: expected `;`", "let r = i / h;"]);
    assert_eq!(e.matches("expected `;`").count(), 2, "the message once, then the excerpt's marker: {e}");
    // A name that does not exist (line 11).
    let e = error(MANIFEST, &WGSL.replace("* beta +", "* gamma +"));
    assert_has(&e, &["gate.wgsl:11:", "gamma"]);
    // A binding too many (line 3).
    let extra = WGSL.replace("\n\n@compute", "\n@group(0) @binding(2) var<storage, read_write> z: array<f32>;\n@compute");
    let e = error(MANIFEST, &extra);
    assert_has(&e, &["gate.wgsl:3:", "@binding(2) 'z'", "declares 2 values", "@binding(0) x (read, array<f32>), @binding(1) y (read_write, array<f32>)"]);
    // A binding missing.
    let missing = WGSL.replace("@group(0) @binding(1) var<storage, read_write> y: array<f32>;", "var<private> y: array<f32, 4>;");
    let e = error(MANIFEST, &missing);
    assert_has(&e, &["gate.wgsl", "@binding(1) for 'y' is missing"]);
    // An input bound read-write, an element type that is not the dtype's.
    let e = error(MANIFEST, &WGSL.replace("var<storage, read> x", "var<storage, read_write> x"));
    assert_has(&e, &["gate.wgsl:1:", "expected var<storage, read> x: array<f32>"]);
    let e = error(MANIFEST, &WGSL.replace("x: array<f32>", "x: array<u32>"));
    assert_has(&e, &["gate.wgsl:1:", "array<f32>"]);
    // A fixed workgroup size that is not the manifest's, and no entry point.
    let e = error(MANIFEST, &WGSL.replace("@workgroup_size(KILN_WORKGROUP)", "@workgroup_size(32)"));
    assert_has(&e, &["gate.wgsl:5:", "@workgroup_size(KILN_WORKGROUP)"]);
    let e = error(MANIFEST, &WGSL.replace("fn main(", "fn other("));
    assert_has(&e, &["gate.wgsl", "no entry point 'main'", "found: other"]);
    // The kernel file is missing.
    let dir = std::env::temp_dir().join(format!("kiln-custom-op-missing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("gate.json"), MANIFEST).unwrap();
    let e = CustomOp::load(dir.join("gate.json")).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert_has(&e, &["cannot read the WGSL kernel", "gate.wgsl"]);
}
