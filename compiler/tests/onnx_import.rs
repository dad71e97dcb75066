//! ONNX import of hand-built models: structure, types, attributes, constants,
//! initializers of every dtype, external data, and the errors for broken models.

use kiln_compiler::onnx::proto::*;
use kiln_compiler::onnx::{self, ImportError, ImportOptions};
use kiln_graph::{Attr, DType, Dim, Tensor};
use prost::Message;
use std::path::{Path, PathBuf};

fn tensor_vi(name: &str, elem: DType, dims: &[Dimension]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem.onnx_code(),
                shape: Some(TensorShapeProto { dim: dims.to_vec() }),
            }),
            ..Default::default()
        }),
    }
}

fn d(n: i64) -> Dimension {
    Dimension { value: Some(DimensionValue::DimValue(n)) }
}

fn sym(s: &str) -> Dimension {
    Dimension { value: Some(DimensionValue::DimParam(s.into())) }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn with_attrs(mut n: NodeProto, attrs: Vec<AttributeProto>) -> NodeProto {
    n.attribute = attrs;
    n
}

fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: name.into(), f, r#type: attribute_type::FLOAT, ..Default::default() }
}

fn attr_s(name: &str, s: &str) -> AttributeProto {
    AttributeProto { name: name.into(), s: s.as_bytes().to_vec(), r#type: attribute_type::STRING, ..Default::default() }
}

fn raw(name: &str, t: &Tensor) -> TensorProto {
    onnx::tensor_to_proto(name, t)
}

struct M {
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    inits: Vec<TensorProto>,
    value_info: Vec<ValueInfoProto>,
    opsets: Vec<(&'static str, i64)>,
}

impl M {
    fn new(nodes: Vec<NodeProto>) -> M {
        M {
            nodes,
            inputs: vec![tensor_vi("x", DType::F32, &[d(2), d(3)])],
            outputs: vec![tensor_vi("y", DType::F32, &[d(2), d(3)])],
            inits: vec![],
            value_info: vec![],
            opsets: vec![("", 17)],
        }
    }

    fn proto(self) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: self
                .opsets
                .iter()
                .map(|(d, v)| OperatorSetIdProto { domain: d.to_string(), version: *v })
                .collect(),
            graph: Some(GraphProto {
                name: "test".into(),
                node: self.nodes,
                initializer: self.inits,
                input: self.inputs,
                output: self.outputs,
                value_info: self.value_info,
            }),
            ..Default::default()
        }
    }

    fn bytes(self) -> Vec<u8> {
        self.proto().encode_to_vec()
    }
}

fn import(m: M) -> Result<kiln_graph::Graph, ImportError> {
    onnx::import_bytes(&m.bytes(), None)
}

fn import_unchecked(m: M) -> Result<kiln_graph::Graph, ImportError> {
    onnx::import_bytes_with(&m.bytes(), None, &ImportOptions::unchecked())
}

#[test]
fn simple_model() {
    let w = Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let mut m = M::new(vec![node("Relu", "", &["x"], &["r"]), node("Add", "add", &["r", "w"], &["y"])]);
    m.inits.push(raw("w", &w));
    m.value_info.push(tensor_vi("r", DType::F32, &[d(2), d(3)]));
    m.opsets.push(("com.example", 3));
    let g = import(m).unwrap();
    assert_eq!(g.name, "test");
    assert_eq!(g.nodes.len(), 2);
    assert_eq!(g.nodes[0].name, "Relu_0");
    assert_eq!(g.nodes[1].name, "add");
    assert_eq!(g.inputs.iter().map(|&v| g.value_name(v)).collect::<Vec<_>>(), ["x"]);
    assert_eq!(g.outputs.iter().map(|&v| g.value_name(v)).collect::<Vec<_>>(), ["y"]);
    let wv = g.find_value("w").unwrap();
    assert_eq!(g.initializers[&wv], w);
    assert_eq!(g.values[wv].ty.as_ref().unwrap().to_string(), "f32[3]");
    assert_eq!(g.values[g.find_value("r").unwrap()].ty.as_ref().unwrap().to_string(), "f32[2,3]");
    assert_eq!(g.values[g.find_value("y").unwrap()].ty.as_ref().unwrap().to_string(), "f32[2,3]");
    assert_eq!(g.opset(), 17);
    assert_eq!(g.opsets["com.example"], 3);
    assert_eq!(g.nodes[1].inputs, vec![g.find_value("r"), Some(wv)]);
}

#[test]
fn symbolic_and_unknown_dims() {
    let unknown = Dimension { value: None };
    let mut m = M::new(vec![node("Relu", "r", &["x"], &["y"])]);
    m.inputs = vec![tensor_vi("x", DType::F32, &[sym("batch"), unknown.clone(), sym("?"), sym("?"), d(-1), sym("unk__0")])];
    m.outputs = vec![tensor_vi("y", DType::F32, &[sym("batch"), unknown])];
    let g = import(m).unwrap();
    let x = g.values[g.inputs[0]].ty.clone().unwrap();
    let y = g.values[g.outputs[0]].ty.clone().unwrap();
    assert_eq!(x.shape.0[0], Dim::Sym("batch".into()));
    assert_eq!(x.shape.0[5], Dim::Sym("unk__0".into()));
    let fresh: Vec<&str> = x.shape.symbols().skip(1).take(4).collect();
    assert_eq!(fresh.len(), 4);
    let mut uniq = fresh.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 4, "each unknown dim gets its own symbol: {x}");
    assert!(!fresh.contains(&"unk__0"), "fresh symbols avoid the file's names: {x}");
    assert_eq!(y.shape.0[0], Dim::Sym("batch".into()));
    let Dim::Sym(y1) = &y.shape.0[1] else { panic!("{y}") };
    assert!(!x.shape.symbols().any(|s| s == y1), "{x} {y}");
}

#[test]
fn initializers_listed_as_inputs_are_not_inputs() {
    let w = Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let mut m = M::new(vec![node("Add", "add", &["x", "w"], &["y"])]);
    m.inits.push(raw("w", &w));
    m.inputs.push(tensor_vi("w", DType::F32, &[d(3)]));
    m.opsets = vec![("ai.onnx", 7)];
    let g = import(m).unwrap();
    assert_eq!(g.inputs.len(), 1);
    assert_eq!(g.opset(), 7);
}

#[test]
fn omitted_inputs_and_outputs() {
    let m = M::new(vec![
        node("Custom", "a", &["x"], &["y", "", "t", "", ""]),
        node("Custom", "b", &["", "t"], &["u"]),
    ]);
    let g = import_unchecked(m).unwrap();
    assert_eq!(g.nodes[0].outputs.len(), 3, "trailing omitted outputs are dropped");
    assert_eq!(g.nodes[1].inputs[0], None);
    assert_eq!(g.value_name(g.nodes[0].outputs[1]), "a:unused_output_1");
}

#[test]
fn constants_fold_into_initializers() {
    let t = Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap();
    let attr = |name: &str, f: &dyn Fn(&mut AttributeProto)| {
        let mut a = AttributeProto { name: name.into(), ..Default::default() };
        f(&mut a);
        a
    };
    let consts = vec![
        ("c_tensor", attr("value", &|a| {
            a.r#type = attribute_type::TENSOR;
            a.t = Some(raw("", &t));
        })),
        ("c_float", attr("value_float", &|a| {
            a.r#type = attribute_type::FLOAT;
            a.f = 2.5;
        })),
        ("c_floats", attr("value_floats", &|a| {
            a.r#type = attribute_type::FLOATS;
            a.floats = vec![1.0, 2.0];
        })),
        ("c_int", attr("value_int", &|a| {
            a.r#type = attribute_type::INT;
            a.i = -7;
        })),
        ("c_ints", attr("value_ints", &|a| {
            a.r#type = attribute_type::INTS;
            a.ints = vec![3, 4, 5];
        })),
        ("c_empty", attr("value_ints", &|a| a.r#type = attribute_type::INTS)),
    ];
    let mut nodes: Vec<NodeProto> =
        consts.iter().map(|(out, a)| with_attrs(node("Constant", "", &[], &[out]), vec![a.clone()])).collect();
    nodes.push(node("Relu", "r", &["x"], &["y"]));
    let mut m = M::new(nodes);
    for (out, _) in &consts {
        m.outputs.push(ValueInfoProto { name: out.to_string(), r#type: None });
    }
    let g = import(m).unwrap();
    assert_eq!(g.nodes.len(), 1, "Constant nodes are folded");
    assert_eq!(g.nodes[0].name, "r");
    let get = |n: &str| g.initializers[&g.find_value(n).unwrap()].clone();
    assert_eq!(get("c_tensor"), t);
    assert_eq!(get("c_float"), Tensor::scalar(2.5f32));
    assert_eq!(get("c_floats"), Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
    assert_eq!(get("c_int"), Tensor::scalar(-7i64));
    assert_eq!(get("c_ints"), Tensor::from_vec(&[3], vec![3i64, 4, 5]).unwrap());
    assert_eq!(get("c_empty"), Tensor::zeros(DType::I64, &[0]));
    assert_eq!(g.values[g.find_value("c_ints").unwrap()].ty.as_ref().unwrap().to_string(), "i64[3]");
    // Constant node names do not shift the generated names of later nodes.
    let g = import(M::new(vec![
        with_attrs(node("Constant", "", &[], &["c"]), vec![consts[1].1.clone()]),
        node("Add", "", &["x", "c"], &["y"]),
    ]))
    .unwrap();
    assert_eq!(g.nodes[0].name, "Add_1");
}

/// Every dtype, through raw_data and through the typed fields.
#[test]
fn initializers_of_every_dtype() {
    for dtype in DType::ALL {
        // Values every dtype holds (2-bit integers only -2..3, E8M0 only powers of two,
        // E2M1 only 0.5 steps up to 2 then 3, 4, 6).
        let vals: Vec<f64> = (0..6).map(|i| if dtype == DType::Bool { (i % 2) as f64 } else if matches!(dtype, DType::I2 | DType::U2) { (i % 2) as f64 } else if dtype == DType::F8E8M0 { (1 << i) as f64 } else if dtype == DType::F4E2M1 { [0.5, 1., 1.5, 2., 3., 4.][i] } else { i as f64 + 1.0 }).collect();
        let t = Tensor::from_f64(dtype, &[2, 3], &vals).unwrap();
        let mut typed = TensorProto { name: "w".into(), dims: vec![2, 3], data_type: dtype.onnx_code(), ..Default::default() };
        let b = t.bytes();
        match dtype {
            DType::F32 => typed.float_data = bytemuck::cast_slice::<u8, f32>(b).to_vec(),
            DType::F64 => typed.double_data = bytemuck::cast_slice::<u8, f64>(b).to_vec(),
            DType::I64 => typed.int64_data = bytemuck::cast_slice::<u8, i64>(b).to_vec(),
            DType::I32 => typed.int32_data = bytemuck::cast_slice::<u8, i32>(b).to_vec(),
            DType::U64 => typed.uint64_data = bytemuck::cast_slice::<u8, u64>(b).to_vec(),
            DType::U32 => typed.uint64_data = bytemuck::cast_slice::<u8, u32>(b).iter().map(|&v| v as u64).collect(),
            DType::F16 | DType::BF16 | DType::U16 => {
                typed.int32_data = bytemuck::cast_slice::<u8, u16>(b).iter().map(|&v| v as i32).collect()
            }
            DType::I16 => typed.int32_data = bytemuck::cast_slice::<u8, i16>(b).iter().map(|&v| v as i32).collect(),
            DType::I8 => typed.int32_data = b.iter().map(|&v| v as i8 as i32).collect(),
            DType::U8 | DType::Bool => typed.int32_data = b.iter().map(|&v| v as i32).collect(),
            // float8 bit patterns, one per entry; 4- and 2-bit types packed, a byte per entry.
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0 => {
                typed.int32_data = b.iter().map(|&v| v as i32).collect()
            }
            DType::F4E2M1 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                typed.int32_data = kiln_graph::narrow::pack(dtype, b).iter().map(|&v| v as i32).collect()
            }
            DType::String => unreachable!("DType::ALL holds the byte dtypes"),
        }
        for proto in [raw("w", &t), typed] {
            let mut m = M::new(vec![node("Relu", "r", &["x"], &["y"])]);
            m.inits.push(proto);
            let g = import(m).unwrap();
            assert_eq!(g.initializers[&g.find_value("w").unwrap()], t, "{dtype}");
        }
        let back = onnx::tensor_from_proto(&raw("w", &t), None).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_f64_vec(), vals, "{dtype}");
    }
    // raw_data packs 4-bit types two per byte, low nibble first, sign-extended on read.
    let p = TensorProto { name: "q".into(), dims: vec![3], data_type: DType::I4.onnx_code(), raw_data: vec![0x78, 0x0f].into(), ..Default::default() };
    assert_eq!(onnx::tensor_from_proto(&p, None).unwrap().to_f64_vec(), vec![-8., 7., -1.]);
    let short = TensorProto { raw_data: vec![0x78].into(), ..p };
    assert!(onnx::tensor_from_proto(&short, None).unwrap_err().to_string().contains("packs into 2"));
}

/// STRING tensors: string_data, one UTF-8 string per element, round trip.
#[test]
fn string_initializers() {
    let p = TensorProto { name: "s".into(), dims: vec![2], data_type: 8, string_data: vec![b"a".to_vec(), "é".as_bytes().to_vec()], ..Default::default() };
    let t = onnx::tensor_from_proto(&p, None).unwrap();
    assert_eq!((t.dtype(), t.as_strings().unwrap()), (DType::String, &["a".to_string(), "é".to_string()][..]));
    assert_eq!(onnx::tensor_to_proto("s", &t), p);
    let mut m = M::new(vec![node("Identity", "i", &["s"], &["y"])]);
    m.inits.push(p);
    let g = import(m).unwrap();
    assert_eq!(g.initializers[&g.find_value("s").unwrap()], t);
}

#[test]
fn bad_initializers() {
    let bad = |p: TensorProto| {
        let mut m = M::new(vec![node("Relu", "r", &["x"], &["y"])]);
        m.inits.push(p);
        import(m).unwrap_err().to_string()
    };
    let e = bad(TensorProto { name: "s".into(), dims: vec![1], data_type: 8, ..Default::default() });
    assert!(e.contains("'s'") && e.contains("string_data has 0 values"), "{e}");
    let e = bad(TensorProto { name: "s".into(), dims: vec![1], data_type: 8, string_data: vec![vec![0xff]], ..Default::default() });
    assert!(e.contains("'s'") && e.contains("not valid UTF-8"), "{e}");
    let e = bad(TensorProto { name: "s".into(), dims: vec![1], data_type: 8, raw_data: vec![b'a'].into(), ..Default::default() });
    assert!(e.contains("string_data, not in raw"), "{e}");
    let e = bad(TensorProto { name: "c".into(), dims: vec![1], data_type: 14, ..Default::default() });
    assert!(e.contains("COMPLEX64"), "{e}");
    let e = bad(TensorProto { name: "f".into(), dims: vec![4], data_type: 1, float_data: vec![1.0], ..Default::default() });
    assert!(e.contains("float_data has 1 values") && e.contains("needs 4"), "{e}");
    let e = bad(TensorProto { name: "r".into(), dims: vec![4], data_type: 1, raw_data: vec![0u8; 15].into(), ..Default::default() });
    assert!(e.contains("raw_data has 15 bytes"), "{e}");
    let e = bad(TensorProto { name: "n".into(), dims: vec![-1], data_type: 1, ..Default::default() });
    assert!(e.contains("negative"), "{e}");
    let e = bad(TensorProto { name: "".into(), dims: vec![], data_type: 1, float_data: vec![1.0], ..Default::default() });
    assert!(e.contains("no name"), "{e}");
}

#[test]
fn dangling_input_is_an_error() {
    let e = import(M::new(vec![node("Add", "add", &["x", "ghost"], &["y"])])).unwrap_err();
    assert!(matches!(e, ImportError::Graph(kiln_graph::GraphError::DanglingInput { .. })), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("'add'") && msg.contains("'ghost'"), "{msg}");
    let e = import(M::new(vec![node("Relu", "r", &["x"], &["z"])])).unwrap_err().to_string();
    assert!(e.contains("graph output 'y'"), "{e}");
}

#[test]
fn cycle_is_an_error() {
    let e = import(M::new(vec![
        node("Add", "a", &["x", "b_out"], &["a_out"]),
        node("Relu", "b", &["a_out"], &["b_out"]),
        node("Relu", "c", &["a_out"], &["y"]),
    ]))
    .unwrap_err();
    assert!(matches!(e, ImportError::Graph(kiln_graph::GraphError::Cycle { .. })), "{e:?}");
    assert!(e.to_string().contains("cycle"));
}

#[test]
fn duplicate_producers_are_an_error() {
    let e = import(M::new(vec![node("Relu", "a", &["x"], &["y"]), node("Relu", "b", &["x"], &["y"])])).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("produced twice") && msg.contains("'a'") && msg.contains("'b'"), "{msg}");
    let mut m = M::new(vec![node("Relu", "a", &["x"], &["y"])]);
    m.inits.push(raw("y", &Tensor::scalar(1.0f32)));
    assert!(import(m).unwrap_err().to_string().contains("produced twice"));
}

#[test]
fn all_unsupported_ops_are_listed_at_once() {
    let mut attention = node("SparseAttention", "attn", &["x"], &["a"]);
    attention.domain = "com.microsoft".into();
    let mut m = M::new(vec![
        node("FooBar", "f1", &["x"], &["f1"]),
        node("FooBar", "", &["f1"], &["f2"]),
        node("FooBar", "f3", &["f2"], &["f3"]),
        node("FooBar", "f4", &["f3"], &["f4"]),
        attention,
        node("Relu", "ok", &["f4"], &["r"]),
        node("Add", "sum", &["r", "a"], &["y"]),
    ]);
    m.opsets.push(("com.microsoft", 1));
    let bytes = m.bytes();
    let e = onnx::import_bytes(&bytes, None).unwrap_err();
    let ImportError::UnsupportedOps(list) = &e else { panic!("{e:?}") };
    assert_eq!(list.len(), 2);
    assert_eq!((list[0].domain.as_str(), list[0].op_type.as_str(), list[0].opset, list[0].count), ("", "FooBar", Some(17), 4));
    assert_eq!(list[0].nodes, ["f1", "FooBar_1", "f3"]);
    assert_eq!((list[1].domain.as_str(), list[1].op_type.as_str(), list[1].opset, list[1].count), ("com.microsoft", "SparseAttention", Some(1), 1));
    let msg = e.to_string();
    println!("{msg}");
    assert!(msg.contains("2 operators") && msg.contains("5 nodes"), "{msg}");
    assert!(msg.contains("FooBar") && msg.contains("com.microsoft") && msg.contains("SparseAttention"), "{msg}");
    assert!(msg.contains("'f1', 'FooBar_1', 'f3', ..."), "{msg}");
    // Unchecked import keeps them; the check can run later with another registry.
    let g = onnx::import_bytes_with(&bytes, None, &ImportOptions::unchecked()).unwrap();
    assert_eq!(g.nodes.len(), 7);
    assert!(matches!(onnx::check_ops(&g, kiln_ops::Registry::builtin()), Err(ImportError::UnsupportedOps(_))));
    let mut custom = kiln_ops::Registry::builtin().clone();
    for (dom, op) in [("", "FooBar"), ("com.microsoft", "SparseAttention")] {
        custom.register(dom, op, |spec| kiln_ops::Registry::builtin().create(&kiln_ops::NodeSpec::new(
            &kiln_graph::Node { op_type: "Relu".into(), domain: String::new(), ..spec.node.clone() },
            spec.opset,
        )));
    }
    onnx::import_bytes_with(&bytes, None, &ImportOptions::with_registry(&custom)).unwrap();
}

#[test]
fn bad_attributes_are_listed_per_node() {
    let graph_attr = AttributeProto {
        name: "body".into(),
        r#type: attribute_type::GRAPHS,
        graphs: vec![GraphProto::default()],
        ..Default::default()
    };
    let m = M::new(vec![
        with_attrs(node("LeakyRelu", "lr1", &["x"], &["a"]), vec![attr_s("alpha", "big")]),
        with_attrs(node("LeakyRelu", "lr2", &["a"], &["b"]), vec![attr_f("alpha", 0.1)]),
        with_attrs(node("Relu", "sub", &["b"], &["y"]), vec![graph_attr]),
    ]);
    let e = import(m).unwrap_err();
    let ImportError::InvalidNodes(list) = &e else { panic!("{e:?}") };
    assert_eq!(list.len(), 2, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("'lr1' (LeakyRelu)") && msg.contains("alpha"), "{msg}");
    assert!(msg.contains("'sub' (Relu)") && msg.contains("list of subgraphs"), "{msg}");
    assert!(!msg.contains("lr2"), "{msg}");
}

#[test]
fn attribute_kinds() {
    let a = |name: &str, f: &dyn Fn(&mut AttributeProto)| {
        let mut a = AttributeProto { name: name.into(), ..Default::default() };
        f(&mut a);
        a
    };
    let t = Tensor::from_vec(&[2], vec![1.0f64, 2.0]).unwrap();
    let attrs = vec![
        a("i", &|a| {
            a.r#type = attribute_type::INT;
            a.i = 5
        }),
        a("f", &|a| {
            a.r#type = attribute_type::FLOAT;
            a.f = 0.5
        }),
        a("s", &|a| {
            a.r#type = attribute_type::STRING;
            a.s = b"hi".to_vec()
        }),
        a("t", &|a| {
            a.r#type = attribute_type::TENSOR;
            a.t = Some(raw("", &t))
        }),
        a("is", &|a| {
            a.r#type = attribute_type::INTS;
            a.ints = vec![1, -2]
        }),
        a("fs", &|a| {
            a.r#type = attribute_type::FLOATS;
            a.floats = vec![1.5]
        }),
        a("ss", &|a| {
            a.r#type = attribute_type::STRINGS;
            a.strings = vec![b"a".to_vec(), b"b".to_vec()]
        }),
        // legacy files without `type`
        a("legacy_ints", &|a| a.ints = vec![7]),
        a("legacy_float", &|a| a.f = 1.25),
    ];
    let g = import_unchecked(M::new(vec![with_attrs(node("Custom", "c", &["x"], &["y"]), attrs)])).unwrap();
    let n = &g.nodes[0];
    assert_eq!(n.attr("i"), Some(&Attr::Int(5)));
    assert_eq!(n.attr("f"), Some(&Attr::Float(0.5)));
    assert_eq!(n.attr("s"), Some(&Attr::String("hi".into())));
    assert_eq!(n.attr("t"), Some(&Attr::Tensor(t)));
    assert_eq!(n.attr("is"), Some(&Attr::Ints(vec![1, -2])));
    assert_eq!(n.attr("fs"), Some(&Attr::Floats(vec![1.5])));
    assert_eq!(n.attr("ss"), Some(&Attr::Strings(vec!["a".into(), "b".into()])));
    assert_eq!(n.attr("legacy_ints"), Some(&Attr::Ints(vec![7])));
    assert_eq!(n.attr("legacy_float"), Some(&Attr::Float(1.25)));
}

#[test]
fn model_without_graph() {
    let bytes = ModelProto { ir_version: 8, ..Default::default() }.encode_to_vec();
    let e = onnx::import_bytes(&bytes, None).unwrap_err();
    assert!(matches!(e, ImportError::NoGraph(_)), "{e:?}");
    assert!(e.to_string().contains("no graph"));
}

#[test]
fn garbage_bytes_give_clean_errors() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for len in [1usize, 7, 64, 1000, 100_000] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let e = onnx::import_bytes(&bytes, None).unwrap_err().to_string();
        assert!(!e.is_empty());
    }
    let e = onnx::import_bytes(b"\x0a\xff\xff\xff\x0f", None).unwrap_err().to_string();
    assert!(e.contains("not a valid ONNX model"), "{e}");
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("kiln-onnx-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn external(name: &str, dtype: DType, dims: &[i64], entries: &[(&str, &str)]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: dtype.onnx_code(),
        data_location: DATA_LOCATION_EXTERNAL,
        external_data: entries
            .iter()
            .map(|(k, v)| StringStringEntryProto { key: k.to_string(), value: v.to_string() })
            .collect(),
        ..Default::default()
    }
}

fn model_with_inits(inits: Vec<TensorProto>) -> ModelProto {
    let mut m = M::new(vec![node("Relu", "r", &["x"], &["y"])]);
    m.inits = inits;
    m.proto()
}

#[test]
fn external_data() {
    let dir = TempDir::new("ext");
    let a = Tensor::from_vec(&[2, 3], vec![1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0]).unwrap();
    let b = Tensor::from_vec(&[4], vec![10i64, 20, 30, 40]).unwrap();
    let mut data = vec![0xAAu8; 16];
    data.extend_from_slice(a.bytes());
    data.extend_from_slice(b.bytes());
    std::fs::create_dir_all(dir.path().join("weights")).unwrap();
    std::fs::write(dir.path().join("weights/model.bin"), &data).unwrap();
    let model = model_with_inits(vec![
        external("a", DType::F32, &[2, 3], &[("location", "weights/model.bin"), ("offset", "16"), ("length", "24")]),
        external("b", DType::I64, &[4], &[("location", "./weights/model.bin"), ("offset", "40")]),
    ]);
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    let g = onnx::import_file(&path).unwrap();
    assert_eq!(g.initializers[&g.find_value("a").unwrap()], a);
    assert_eq!(g.initializers[&g.find_value("b").unwrap()], b);

    let fails = |inits: Vec<TensorProto>| {
        let p = dir.path().join("bad.onnx");
        std::fs::write(&p, model_with_inits(inits).encode_to_vec()).unwrap();
        onnx::import_file(&p).unwrap_err().to_string()
    };
    let outside = dir.path().parent().unwrap().join(format!("kiln-outside-{}.bin", std::process::id()));
    std::fs::write(&outside, a.bytes()).unwrap();
    let outside_name = outside.file_name().unwrap().to_str().unwrap().to_string();
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", &format!("../{outside_name}"))])]);
    assert!(e.contains("inside the model's directory"), "{e}");
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", outside.to_str().unwrap())])]);
    assert!(e.contains("inside the model's directory"), "{e}");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, dir.path().join("link.bin")).unwrap();
        let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", "link.bin")])]);
        assert!(e.contains("outside the model's directory"), "{e}");
    }
    std::fs::remove_file(&outside).unwrap();
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", "nope.bin")])]);
    assert!(e.contains("tensor 'a'") && e.contains("does not exist"), "{e}");
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", "weights/model.bin"), ("offset", "60")])]);
    assert!(e.contains("too short"), "{e}");
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("location", "weights/model.bin"), ("length", "8")])]);
    assert!(e.contains("length 8"), "{e}");
    let e = fails(vec![external("a", DType::F32, &[2, 3], &[("offset", "0")])]);
    assert!(e.contains("location"), "{e}");
    // From memory without a directory, external data cannot be found.
    let e = onnx::import_bytes(&model.encode_to_vec(), None).unwrap_err().to_string();
    assert!(e.contains("not loaded from a directory"), "{e}");
    let g = onnx::import_bytes(&model.encode_to_vec(), Some(dir.path())).unwrap();
    assert_eq!(g.initializers[&g.find_value("b").unwrap()], b);
}

#[test]
fn tensor_pb_round_trip() {
    let dir = TempDir::new("pb");
    let t = Tensor::from_vec(&[2, 2], vec![half::f16::from_f32(1.5); 4]).unwrap();
    let p = dir.path().join("input_0.pb");
    onnx::write_tensor_pb(&p, "x", &t).unwrap();
    let (name, back) = onnx::read_tensor_pb(&p).unwrap();
    assert_eq!((name.as_str(), back), ("x", t));
    std::fs::write(&p, b"\xff\xff\xff").unwrap();
    let e = onnx::read_tensor_pb(&p).unwrap_err().to_string();
    assert!(e.contains("input_0.pb") && e.contains("not a valid ONNX tensor"), "{e}");
    let e = onnx::read_tensor_pb(dir.path().join("missing.pb")).unwrap_err().to_string();
    assert!(e.contains("missing.pb"), "{e}");
}

#[test]
fn missing_file() {
    let e = onnx::import_file("/nonexistent/model.onnx").unwrap_err().to_string();
    assert!(e.contains("/nonexistent/model.onnx"), "{e}");
}

#[test]
fn unsupported_input_types() {
    let model = |elem_type: i32| {
        let mut m = M::new(vec![node("Identity", "r", &["x"], &["y"])]);
        m.inputs = vec![ValueInfoProto {
            name: "x".into(),
            r#type: Some(TypeProto { tensor_type: Some(TypeProtoTensor { elem_type, shape: Some(TensorShapeProto { dim: vec![d(2)] }) }), ..Default::default() }),
        }];
        m
    };
    let g = import(model(8)).unwrap();
    assert_eq!(g.values[g.inputs[0]].ty.as_ref().map(|t| t.dtype), Some(DType::String));
    let e = import(model(14)).unwrap_err().to_string();
    assert!(e.contains("graph input 'x'") && e.contains("COMPLEX64"), "{e}");
    // A non-tensor type (or an unknown rank) leaves the type unknown.
    let mut m = M::new(vec![node("Relu", "r", &["x"], &["y"])]);
    m.inputs = vec![ValueInfoProto { name: "x".into(), r#type: Some(TypeProto::default()) }];
    let g = import(m).unwrap();
    assert_eq!(g.values[g.inputs[0]].ty, None);
}

#[test]
fn constant_that_cannot_fold_is_reported() {
    let m = M::new(vec![
        with_attrs(node("Constant", "c", &[], &["c"]), vec![attr_s("value_string", "hello"), attr_f("value_float", 1.0)]),
        node("Add", "a", &["x", "c"], &["y"]),
    ]);
    let e = import_unchecked(m).unwrap();
    assert_eq!(e.nodes[0].op_type, "Constant", "kept as a node when unchecked");
    let m = M::new(vec![
        with_attrs(node("Constant", "c", &[], &["c"]), vec![attr_s("value_string", "hello"), attr_f("value_float", 1.0)]),
        node("Add", "a", &["x", "c"], &["y"]),
    ]);
    let e = import(m).unwrap_err().to_string();
    assert!(e.contains("Constant"), "{e}");
}

#[test]
fn string_constants_fold() {
    let m = M::new(vec![
        with_attrs(node("Constant", "c", &[], &["c"]), vec![attr_s("value_string", "hello")]),
        node("Identity", "i", &["c"], &["y"]),
    ]);
    let g = import(m).unwrap();
    let c = &g.initializers[&g.find_value("c").unwrap()];
    assert_eq!((c.dims(), c.as_strings().unwrap()), (&[][..], &["hello".to_string()][..]));
}

/// A subgraph attribute named `name` whose graph computes `nodes` and returns `outputs`.
fn graph_attr(name: &str, nodes: Vec<NodeProto>, outputs: &[&str]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::GRAPH,
        g: Some(GraphProto {
            name: format!("{name}_graph"),
            node: nodes,
            output: outputs.iter().map(|o| ValueInfoProto { name: o.to_string(), ..Default::default() }).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn subgraphs_read_outer_values_through_explicit_inputs() {
    // If(c) then: y = x * w (w an outer initializer, x an outer input); else: y = Neg(x)
    let then_b = graph_attr("then_branch", vec![node("Mul", "m", &["x", "w"], &["t"])], &["t"]);
    let else_b = graph_attr("else_branch", vec![node("Neg", "n", &["x"], &["e"])], &["e"]);
    let mut m = M::new(vec![with_attrs(node("If", "if", &["c"], &["y"]), vec![then_b, else_b])]);
    m.inputs.push(tensor_vi("c", DType::Bool, &[]));
    m.inits.push(raw("w", &Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap()));
    let g = import(m).unwrap();
    let n = &g.nodes[0];
    // The node reads the condition, then every outer value either branch reads.
    let names: Vec<&str> = n.inputs.iter().map(|v| g.value_name(v.unwrap())).collect();
    assert_eq!(names, ["c", "x", "w"]);
    for attr in ["then_branch", "else_branch"] {
        let Some(Attr::Graph(b)) = n.attrs.get(attr) else { panic!("{attr} is not a graph") };
        assert_eq!(b.outer_inputs, 2, "{attr}");
        let inputs: Vec<&str> = b.inputs.iter().map(|&v| b.value_name(v)).collect();
        assert_eq!(inputs, ["x", "w"], "{attr}: every branch takes the same outer values in one order");
        b.validate().unwrap();
    }
}

#[test]
fn a_subgraph_reading_an_unknown_value_is_a_dangling_input() {
    let then_b = graph_attr("then_branch", vec![node("Mul", "m", &["x", "nowhere"], &["t"])], &["t"]);
    let else_b = graph_attr("else_branch", vec![node("Neg", "n", &["x"], &["e"])], &["e"]);
    let mut m = M::new(vec![with_attrs(node("If", "if", &["c"], &["y"]), vec![then_b, else_b])]);
    m.inputs.push(tensor_vi("c", DType::Bool, &[]));
    let e = import(m).unwrap_err().to_string();
    assert!(e.contains("nowhere") && e.contains("'if'"), "{e}");
}
