//! Structure-aware mutations of an ONNX `ModelProto` (decoded with the prost messages of
//! `kiln_compiler::onnx::proto`): tensor dims and dtypes, attribute values and types,
//! node wiring (inputs and outputs renamed, dropped, duplicated), op types and domains,
//! value-info shapes, graph inputs and outputs, opset imports, ir_version and external
//! data references. Subgraphs (If/Loop/Scan bodies) are mutated like the main graph.

use crate::rng::Rng;
use kiln_compiler::onnx::proto::{
    attribute_type, AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
    DATA_LOCATION_EXTERNAL,
};

/// Attribute names that ops of the builtin registry read.
const ATTR_NAMES: &[&str] = &[
    "axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "transA", "transB", "alpha",
    "beta", "to", "mode", "keepdims", "epsilon", "auto_pad", "split", "num_outputs", "value", "starts", "ends", "shape",
    "allowzero", "batch_dims", "k", "largest", "sorted", "blocksize", "direction", "coordinate_transformation_mode",
    "count_include_pad", "ceil_mode", "storage_order", "exclusive", "reverse", "upper", "noop_with_empty_axes",
    "select_last_index", "center_point_box", "output_padding", "output_shape", "hidden_size", "scales", "sizes",
    "kiln_activation", "kiln_activation_params", "kiln_residual", "num_heads", "q_num_heads", "kv_num_heads", "scale",
    "is_causal", "seed", "dtype", "min", "max", "then_branch", "else_branch", "body", "equation", "depth", "antialias",
];

const STRINGS: &[&[u8]] = &[
    b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"constant", b"reflect", b"edge", b"wrap", b"linear",
    b"nearest", b"cubic", b"half_pixel", b"asymmetric", b"align_corners", b"forward", b"reverse", b"bidirectional",
    b"Relu", b"Gelu", b"tanh", b"none", b"ij,jk->ik", b"...,ii->...i", b"\xff\xfe", b"DCR", b"CRD",
];

const DOMAINS: &[&str] = &["", "ai.onnx", "com.microsoft", "kiln", "ai.onnx.ml", "bogus.domain", "ai.onnx.preview.training"];

/// Names an external data reference can take: files the fuzz directory holds (see
/// `crate::ext_dir`), and paths that must be refused.
const LOCATIONS: &[&str] = &[
    "data.bin", "fifo", "missing.bin", "sub", "sub/../data.bin", "link_out", "link_in", "../data.bin", "/etc/hostname",
    "/dev/zero", ".", "", "data.bin\0x",
];

/// Applies 1 to 3 structure-aware edits.
pub fn mutate_model(m: &mut ModelProto, rng: &mut Rng) {
    for _ in 0..1 + rng.below(3) {
        edit(m, rng);
    }
}

fn edit(m: &mut ModelProto, rng: &mut Rng) {
    match rng.below(20) {
        0 => m.ir_version = if rng.chance(1, 2) { *rng.pick(&[0, 1, 3, 7, 8, 9, 10, 11, 12, 13, 99]) } else { rng.interesting_i64() },
        1 | 2 => mutate_opsets(&mut m.opset_import, rng),
        _ => {
            let graph = m.graph.get_or_insert_with(GraphProto::default);
            let path = pick_path(graph, rng);
            let g = follow(graph, &path);
            mutate_graph(g, rng);
        }
    }
}

fn mutate_opsets(opsets: &mut Vec<OperatorSetIdProto>, rng: &mut Rng) {
    const VERSIONS: &[i64] = &[0, -1, 1, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 99, 1 << 40];
    match rng.below(5) {
        0 if !opsets.is_empty() => {
            let i = rng.below(opsets.len());
            opsets.remove(i);
        }
        1 => opsets.push(OperatorSetIdProto { domain: rng.pick(DOMAINS).to_string(), version: *rng.pick(VERSIONS) }),
        2 if !opsets.is_empty() => {
            let i = rng.below(opsets.len());
            opsets[i].domain = rng.pick(DOMAINS).to_string();
        }
        3 => opsets.clear(),
        _ if !opsets.is_empty() => {
            let i = rng.below(opsets.len());
            opsets[i].version = if rng.chance(3, 4) { *rng.pick(VERSIONS) } else { rng.interesting_i64() };
        }
        _ => opsets.push(OperatorSetIdProto { domain: String::new(), version: *rng.pick(VERSIONS) }),
    }
}

/// A path to a subgraph: (node, attribute, None for `g` or Some(k) for `graphs[k]`).
type Path = Vec<(usize, usize, Option<usize>)>;

fn pick_path(g: &GraphProto, rng: &mut Rng) -> Path {
    let mut path = vec![];
    let mut g = g;
    while rng.chance(1, 2) {
        let mut subs = vec![];
        for (n, node) in g.node.iter().enumerate() {
            for (a, attr) in node.attribute.iter().enumerate() {
                if attr.g.is_some() {
                    subs.push((n, a, None));
                }
                subs.extend((0..attr.graphs.len()).map(|k| (n, a, Some(k))));
            }
        }
        if subs.is_empty() {
            break;
        }
        let step = *rng.pick(&subs);
        let attr = &g.node[step.0].attribute[step.1];
        g = match step.2 {
            None => attr.g.as_ref().expect("listed above"),
            Some(k) => &attr.graphs[k],
        };
        path.push(step);
    }
    path
}

fn follow<'a>(g: &'a mut GraphProto, path: &Path) -> &'a mut GraphProto {
    let mut g = g;
    for &(n, a, k) in path {
        let attr = &mut g.node[n].attribute[a];
        g = match k {
            None => attr.g.as_mut().expect("picked from this graph"),
            Some(k) => &mut attr.graphs[k],
        };
    }
    g
}

fn value_names(g: &GraphProto) -> Vec<String> {
    let mut names: Vec<String> = g.initializer.iter().map(|t| t.name.clone()).collect();
    names.extend(g.input.iter().chain(&g.output).map(|v| v.name.clone()));
    for n in &g.node {
        names.extend(n.input.iter().chain(&n.output).cloned());
    }
    names.retain(|n| !n.is_empty());
    names
}

fn any_name(g: &GraphProto, rng: &mut Rng) -> String {
    let names = value_names(g);
    if names.is_empty() || rng.chance(1, 8) {
        rng.pick(&["ghost", "", "x", "a/b", "a_b"]).to_string()
    } else {
        rng.pick(&names).clone()
    }
}

fn mutate_graph(g: &mut GraphProto, rng: &mut Rng) {
    match rng.below(16) {
        0..=2 => mutate_some_tensor(g, rng),
        3..=5 => {
            if let Some(n) = pick_index(g.node.len(), rng) {
                let names = value_names(g);
                mutate_attributes(&mut g.node[n], &names, rng);
            }
        }
        6..=8 => mutate_wiring(g, rng),
        9 | 10 => mutate_value_infos(g, rng),
        11 => mutate_graph_io(g, rng),
        12 => {
            if let Some(n) = pick_index(g.node.len(), rng) {
                mutate_op(&mut g.node[n], rng);
            }
        }
        13 => {
            // Nodes reordered: a producer after its consumer, or a cycle.
            if g.node.len() >= 2 {
                let (a, b) = (rng.below(g.node.len()), rng.below(g.node.len()));
                g.node.swap(a, b);
            }
        }
        14 => {
            if let Some(n) = pick_index(g.node.len(), rng) {
                if rng.chance(1, 2) {
                    g.node.remove(n);
                } else {
                    let copy = g.node[n].clone();
                    g.node.insert(rng.below(g.node.len() + 1), copy);
                }
            }
        }
        _ => {
            // A node of a random op wired to random values.
            let ops: Vec<(&str, &str)> = kiln_ops::Registry::builtin().op_types().collect();
            let (domain, op) = *rng.pick(&ops);
            let mut node = NodeProto { op_type: op.to_string(), domain: domain.to_string(), ..Default::default() };
            node.input = (0..1 + rng.below(3)).map(|_| any_name(g, rng)).collect();
            node.output = vec![format!("fuzz_out_{}", rng.below(1000))];
            if rng.chance(1, 2) {
                g.output.push(ValueInfoProto { name: node.output[0].clone(), r#type: None });
            }
            g.node.insert(rng.below(g.node.len() + 1), node);
        }
    }
}

fn pick_index(len: usize, rng: &mut Rng) -> Option<usize> {
    (len > 0).then(|| rng.below(len))
}

fn mutate_some_tensor(g: &mut GraphProto, rng: &mut Rng) {
    // Initializers, and tensors held by attributes (Constant's value, ...).
    let mut spots: Vec<(usize, Option<usize>)> = (0..g.initializer.len()).map(|i| (i, None)).collect();
    for (n, node) in g.node.iter().enumerate() {
        for (a, attr) in node.attribute.iter().enumerate() {
            if attr.t.is_some() {
                spots.push((n, Some(a)));
            }
        }
    }
    let Some(&(i, a)) = (!spots.is_empty()).then(|| rng.pick(&spots)) else { return };
    let names = value_names(g);
    let t = match a {
        None => &mut g.initializer[i],
        Some(a) => g.node[i].attribute[a].t.as_mut().expect("listed above"),
    };
    mutate_tensor(t, &names, rng);
}

/// Dims, data type, data fields, name, and external data of one tensor.
pub fn mutate_tensor(t: &mut TensorProto, names: &[String], rng: &mut Rng) {
    match rng.below(10) {
        0 | 1 => {
            if let Some(d) = pick_index(t.dims.len(), rng) {
                t.dims[d] = rng.interesting_i64();
            } else {
                t.dims.push(rng.interesting_i64());
            }
        }
        2 => match rng.below(3) {
            0 => t.dims.push(rng.interesting_i64()),
            1 => {
                t.dims.pop();
            }
            _ => {
                // Same element count, different shape (or a wrapping product).
                let n = t.dims.iter().fold(1i64, |a, &d| a.wrapping_mul(d));
                t.dims = vec![n, 1];
            }
        },
        3 => t.data_type = if rng.chance(1, 2) { rng.below(31) as i32 } else { *rng.pick(&[1, 6, 7, 9, 10, 11, 16]) },
        4 => {
            let len = t.raw_data.len();
            t.raw_data = match rng.below(3) {
                0 => t.raw_data.slice(..len / 2),
                1 => {
                    let mut v = t.raw_data.to_vec();
                    v.extend_from_slice(&[0xff; 13]);
                    v.into()
                }
                _ => bytes::Bytes::new(),
            };
        }
        5 => {
            // Typed fields instead of (or beside) raw bytes.
            match rng.below(4) {
                0 => t.float_data = vec![rng.interesting_f32(); 1 + rng.below(8)],
                1 => t.int64_data = vec![rng.interesting_i64(); 1 + rng.below(8)],
                2 => t.int32_data = vec![rng.interesting_i64() as i32; 1 + rng.below(8)],
                _ => t.double_data = vec![rng.interesting_f32() as f64; 1 + rng.below(8)],
            }
        }
        6 => {
            // Elements overwritten in place: index tensors, shapes, axes get odd values.
            if !t.raw_data.is_empty() {
                let mut v = t.raw_data.to_vec();
                let at = rng.below(v.len());
                let x = rng.interesting_i64().to_le_bytes();
                for (k, b) in x.iter().enumerate() {
                    if let Some(s) = v.get_mut(at + k) {
                        *s = *b;
                    }
                }
                t.raw_data = v.into();
            } else if let Some(i) = pick_index(t.int64_data.len(), rng) {
                t.int64_data[i] = rng.interesting_i64();
            } else if let Some(i) = pick_index(t.float_data.len(), rng) {
                t.float_data[i] = rng.interesting_f32();
            }
        }
        7 => t.name = if names.is_empty() || rng.chance(1, 3) { String::new() } else { rng.pick(names).clone() },
        _ => mutate_external(t, rng),
    }
}

fn mutate_external(t: &mut TensorProto, rng: &mut Rng) {
    t.data_location = if rng.chance(7, 8) { DATA_LOCATION_EXTERNAL } else { rng.interesting_i64() as i32 };
    if rng.chance(3, 4) {
        t.raw_data = bytes::Bytes::new();
    }
    let entry = |k: &str, v: String| StringStringEntryProto { key: k.into(), value: v };
    t.external_data.clear();
    if rng.chance(7, 8) {
        t.external_data.push(entry("location", rng.pick(LOCATIONS).to_string()));
    }
    if rng.chance(1, 2) {
        t.external_data.push(entry("offset", rng.pick(&["0", "64", "4095", "4096", "-1", "x", "18446744073709551615"]).to_string()));
    }
    if rng.chance(1, 2) {
        let len = if rng.chance(1, 2) { rng.interesting_i64().to_string() } else { "16".into() };
        t.external_data.push(entry("length", len));
    }
    if rng.chance(1, 8) {
        t.external_data.push(entry("checksum", "deadbeef".into()));
    }
}

fn mutate_attributes(node: &mut NodeProto, names: &[String], rng: &mut Rng) {
    let attrs = &mut node.attribute;
    if attrs.is_empty() || rng.chance(1, 5) {
        attrs.push(random_attribute(rng));
        return;
    }
    let i = rng.below(attrs.len());
    match rng.below(10) {
        0 => {
            attrs.remove(i);
        }
        1 => {
            // Duplicated, maybe with another type.
            let mut copy = attrs[i].clone();
            if rng.chance(1, 2) {
                copy.r#type = rng.below(15) as i32;
            }
            attrs.push(copy);
        }
        2 => attrs[i].r#type = rng.below(15) as i32,
        3 => {
            // The value moved to another field (the type code may or may not follow).
            let a = &mut attrs[i];
            let v = a.i;
            a.ints = vec![v, rng.interesting_i64()];
            a.f = v as f32;
            if rng.chance(1, 2) {
                a.r#type = *rng.pick(&[attribute_type::INTS, attribute_type::FLOAT, attribute_type::STRING, attribute_type::TENSOR]);
            }
        }
        4 => attrs[i].name = rng.pick(ATTR_NAMES).to_string(),
        5 => {
            let t = attrs[i].t.get_or_insert_with(|| small_tensor(rng));
            mutate_tensor(t, names, rng);
        }
        _ => mutate_attribute_value(&mut attrs[i], rng),
    }
}

fn mutate_attribute_value(a: &mut AttributeProto, rng: &mut Rng) {
    match a.r#type {
        attribute_type::INT => a.i = rng.interesting_i64(),
        attribute_type::FLOAT => a.f = rng.interesting_f32(),
        attribute_type::STRING => a.s = rng.pick(STRINGS).to_vec(),
        attribute_type::INTS => match rng.below(4) {
            0 => a.ints.clear(),
            1 => a.ints.push(rng.interesting_i64()),
            2 => a.ints = vec![rng.interesting_i64(); 1 + rng.below(70)],
            _ => {
                if let Some(k) = pick_index(a.ints.len(), rng) {
                    a.ints[k] = rng.interesting_i64();
                }
            }
        },
        attribute_type::FLOATS => match rng.below(3) {
            0 => a.floats.clear(),
            1 => a.floats.push(rng.interesting_f32()),
            _ => {
                if let Some(k) = pick_index(a.floats.len(), rng) {
                    a.floats[k] = rng.interesting_f32();
                }
            }
        },
        attribute_type::STRINGS => a.strings.push(rng.pick(STRINGS).to_vec()),
        attribute_type::GRAPH => {
            if rng.chance(1, 2) {
                a.g = None;
            } else if let Some(g) = a.g.as_mut() {
                mutate_graph(g, rng);
            }
        }
        _ => {
            a.i = rng.interesting_i64();
            a.f = rng.interesting_f32();
        }
    }
}

fn random_attribute(rng: &mut Rng) -> AttributeProto {
    let mut a = AttributeProto { name: rng.pick(ATTR_NAMES).to_string(), ..Default::default() };
    a.r#type = rng.below(15) as i32;
    match a.r#type {
        attribute_type::INT => a.i = rng.interesting_i64(),
        attribute_type::FLOAT => a.f = rng.interesting_f32(),
        attribute_type::STRING => a.s = rng.pick(STRINGS).to_vec(),
        attribute_type::INTS => a.ints = (0..rng.below(6)).map(|_| rng.interesting_i64()).collect(),
        attribute_type::FLOATS => a.floats = (0..rng.below(6)).map(|_| rng.interesting_f32()).collect(),
        attribute_type::TENSOR => a.t = Some(small_tensor(rng)),
        attribute_type::GRAPH => a.g = Some(GraphProto::default()),
        attribute_type::STRINGS => a.strings = vec![rng.pick(STRINGS).to_vec()],
        _ => {}
    }
    a
}

fn small_tensor(rng: &mut Rng) -> TensorProto {
    let n = rng.below(4);
    let mut t = TensorProto { dims: if rng.chance(1, 2) { vec![] } else { vec![n as i64] }, ..Default::default() };
    let elems = if t.dims.is_empty() { 1 } else { n };
    if rng.chance(1, 2) {
        t.data_type = 7;
        t.int64_data = (0..elems).map(|_| rng.interesting_i64()).collect();
    } else {
        t.data_type = 1;
        t.float_data = (0..elems).map(|_| rng.interesting_f32()).collect();
    }
    t
}

fn mutate_wiring(g: &mut GraphProto, rng: &mut Rng) {
    let Some(n) = pick_index(g.node.len(), rng) else { return };
    let name = any_name(g, rng);
    let node = &mut g.node[n];
    match rng.below(9) {
        0 | 1 => {
            if let Some(i) = pick_index(node.input.len(), rng) {
                node.input[i] = name;
            } else {
                node.input.push(name);
            }
        }
        2 => {
            if let Some(i) = pick_index(node.input.len(), rng) {
                node.input.remove(i);
            }
        }
        3 => {
            if let Some(i) = pick_index(node.input.len(), rng) {
                node.input[i] = String::new();
            }
        }
        4 => {
            if let Some(i) = pick_index(node.input.len(), rng) {
                let copy = node.input[i].clone();
                node.input.push(copy);
            }
        }
        5 => {
            // Many extra inputs (Gemm with 53 inputs).
            let count = 1 + rng.below(60);
            node.input.extend(std::iter::repeat_n(name, count));
        }
        6 => {
            if let Some(i) = pick_index(node.output.len(), rng) {
                node.output[i] = name;
            }
        }
        7 => {
            if let Some(i) = pick_index(node.output.len(), rng) {
                if rng.chance(1, 2) {
                    node.output.remove(i);
                } else {
                    node.output[i] = String::new();
                }
            }
        }
        _ => {
            let extra = format!("{}_extra{}", node.name, rng.below(4));
            node.output.push(extra);
        }
    }
}

fn mutate_op(node: &mut NodeProto, rng: &mut Rng) {
    match rng.below(4) {
        0 => node.domain = rng.pick(DOMAINS).to_string(),
        1 => node.op_type = rng.pick(&["", "Foo", "Constant", "Identity", "relu", "If", "Loop"]).to_string(),
        _ => {
            let ops: Vec<(&str, &str)> = kiln_ops::Registry::builtin().op_types().collect();
            let (domain, op) = *rng.pick(&ops);
            node.op_type = op.to_string();
            if rng.chance(1, 2) {
                node.domain = domain.to_string();
            }
        }
    }
}

fn mutate_value_infos(g: &mut GraphProto, rng: &mut Rng) {
    let total = g.input.len() + g.output.len() + g.value_info.len();
    let Some(mut k) = pick_index(total, rng) else { return };
    let list = if k < g.input.len() {
        &mut g.input
    } else {
        k -= g.input.len();
        if k < g.output.len() {
            &mut g.output
        } else {
            k -= g.output.len();
            &mut g.value_info
        }
    };
    let vi = &mut list[k];
    let tt = vi
        .r#type
        .get_or_insert_with(TypeProto::default)
        .tensor_type
        .get_or_insert_with(|| TypeProtoTensor { elem_type: 1, shape: None });
    match rng.below(7) {
        0 => tt.elem_type = if rng.chance(1, 2) { rng.below(31) as i32 } else { *rng.pick(&[1, 6, 7, 9, 10, 11, 16]) },
        1 => tt.shape = None,
        2 => vi.r#type = None,
        3 => tt.shape.get_or_insert_with(TensorShapeProto::default).dim.push(Dimension { value: Some(DimensionValue::DimValue(rng.interesting_i64())) }),
        4 => {
            let shape = tt.shape.get_or_insert_with(TensorShapeProto::default);
            if let Some(d) = pick_index(shape.dim.len(), rng) {
                shape.dim.remove(d);
            }
        }
        _ => {
            let shape = tt.shape.get_or_insert_with(TensorShapeProto::default);
            let value = if rng.chance(1, 2) {
                Some(DimensionValue::DimValue(rng.interesting_i64()))
            } else if rng.chance(1, 6) {
                None
            } else {
                Some(DimensionValue::DimParam(rng.pick(&["batch", "sequence", "N", "?", "", "-1", "unk__0", "H"]).to_string()))
            };
            match pick_index(shape.dim.len(), rng) {
                Some(d) => shape.dim[d].value = value,
                None => shape.dim.push(Dimension { value }),
            }
        }
    }
}

fn mutate_graph_io(g: &mut GraphProto, rng: &mut Rng) {
    match rng.below(6) {
        0 => {
            if let Some(i) = pick_index(g.input.len(), rng) {
                g.input.remove(i);
            }
        }
        1 => {
            if let Some(i) = pick_index(g.output.len(), rng) {
                g.output.remove(i);
            }
        }
        2 => {
            if let Some(i) = pick_index(g.output.len(), rng) {
                let copy = g.output[i].clone();
                g.output.push(copy);
            }
        }
        3 => {
            // An intermediate or an input becomes an output too (no type).
            let name = any_name(g, rng);
            g.output.push(ValueInfoProto { name, r#type: None });
        }
        4 => {
            // An input that shadows an initializer or an intermediate.
            let name = any_name(g, rng);
            let ty = TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: 1,
                    shape: Some(TensorShapeProto { dim: vec![Dimension { value: Some(DimensionValue::DimParam("n".into())) }] }),
                }),
                ..Default::default()
            };
            g.input.push(ValueInfoProto { name, r#type: Some(ty) });
        }
        _ => {
            if let Some(i) = pick_index(g.initializer.len(), rng) {
                g.initializer.remove(i);
            }
        }
    }
}
