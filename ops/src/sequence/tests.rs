//! The sequence and optional ops on hand-built values: results checked against what
//! the spec says, and the errors bad positions, kinds and splits give.
use crate::infer::{self, Limits, SpecializeError};
use crate::testing::Case;
use crate::{OpError, Registry};
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Shape, Tensor, Value, ValueKind, ValueType};
use std::sync::Arc;

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

fn seq(tensors: &[Tensor]) -> Tensor {
    Tensor::from_value(Value::sequence(DType::F32, tensors.to_vec()))
}

/// The tensors of a sequence output.
fn tensors(t: &Tensor) -> Vec<Tensor> {
    t.composite().and_then(Value::as_sequence).expect("a sequence").to_vec()
}

fn first_values(t: &[Tensor]) -> Vec<f32> {
    t.iter().map(|t| t.as_slice::<f32>().unwrap()[0]).collect()
}

fn abc() -> (Tensor, Tensor, Tensor) {
    (f32s(&[1], &[1.0]), f32s(&[2], &[2.0, 2.5]), f32s(&[1, 1], &[3.0]))
}

#[test]
fn construct_at_length_insert_and_erase() {
    let (a, b, c) = abc();
    let out = Case::new("SequenceConstruct").constant(a.clone()).constant(b.clone()).constant(c.clone()).run_cpu().unwrap();
    let s = out[0].clone();
    assert_eq!(first_values(&tensors(&s)), [1.0, 2.0, 3.0]);
    for (pos, want) in [(0i64, &a), (-1, &c), (1, &b)] {
        let out = Case::new("SequenceAt").constant(s.clone()).constant(Tensor::scalar(pos)).run_cpu().unwrap();
        assert_eq!(&out[0], want, "position {pos}");
    }
    let len = Case::new("SequenceLength").constant(s.clone()).run_cpu().unwrap();
    assert_eq!(len[0].as_slice::<i64>().unwrap(), &[3]);
    let x = f32s(&[1], &[9.0]);
    let front = Case::new("SequenceInsert").constant(s.clone()).constant(x.clone()).constant(Tensor::scalar(-3i32)).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&front[0])), [9.0, 1.0, 2.0, 3.0]);
    let back = Case::new("SequenceInsert").constant(s.clone()).constant(x.clone()).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&back[0])), [1.0, 2.0, 3.0, 9.0]);
    let at_end = Case::new("SequenceInsert").constant(s.clone()).constant(x).constant(Tensor::scalar(3i64)).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&at_end[0])), [1.0, 2.0, 3.0, 9.0], "position len inserts at the end");
    let last = Case::new("SequenceErase").constant(s.clone()).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&last[0])), [1.0, 2.0]);
    let second = Case::new("SequenceErase").constant(s.clone()).constant(Tensor::scalar(-2i64)).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&second[0])), [1.0, 3.0]);
    let empty = Case::new("SequenceEmpty").attr("dtype", Attr::Int(7)).run_cpu().unwrap();
    assert_eq!((empty[0].kind(), empty[0].dtype(), tensors(&empty[0]).len()), (ValueKind::Sequence, DType::I64, 0));
}

#[test]
fn bad_positions_kinds_and_dtypes_name_the_input() {
    let (a, b, _) = abc();
    let s = seq(&[a.clone(), b]);
    let at = |p: i64| Case::new("SequenceAt").constant(s.clone()).constant(Tensor::scalar(p)).run_cpu();
    assert!(matches!(at(2), Err(OpError::Input { index: 1, ref what }) if what.contains("out of range [-2, 1]")), "{:?}", at(2));
    assert!(at(-3).is_err());
    let ins = Case::new("SequenceInsert").constant(s.clone()).constant(a.clone()).constant(Tensor::scalar(3i64)).run_cpu();
    assert!(matches!(ins, Err(OpError::Input { index: 2, .. })), "{ins:?}");
    let i64_elem = Case::new("SequenceInsert").constant(s.clone()).constant(Tensor::scalar(1i64)).run_cpu();
    assert!(matches!(i64_elem, Err(OpError::Input { index: 1, ref what }) if what.contains("cannot join a sequence of f32")), "{i64_elem:?}");
    let not_seq = Case::new("SequenceLength").constant(a.clone()).run_cpu();
    assert!(matches!(not_seq, Err(OpError::Input { index: 0, ref what }) if what.contains("expected a seq(tensor)")), "{not_seq:?}");
    let mixed = Case::new("SequenceConstruct").constant(a).constant(Tensor::scalar(1i64)).run_cpu();
    assert!(matches!(mixed, Err(OpError::Input { index: 1, .. })), "{mixed:?}");
    let empty = Case::new("SequenceErase").constant(seq(&[])).run_cpu();
    assert!(empty.is_err());
}

#[test]
fn split_to_sequence_by_ones_scalar_and_lengths() {
    let x = Tensor::from_slice(&[2, 3], &[1f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let ones = Case::new("SplitToSequence").attr("axis", Attr::Int(1)).attr("keepdims", Attr::Int(0)).constant(x.clone()).run_cpu().unwrap();
    let parts = tensors(&ones[0]);
    assert_eq!(parts.len(), 3);
    assert_eq!((parts[1].dims(), parts[1].as_slice::<f32>().unwrap()), (&[2][..], &[2.0, 5.0][..]));
    let chunks = Case::new("SplitToSequence").attr("axis", Attr::Int(-1)).constant(x.clone()).constant(Tensor::scalar(2i64)).run_cpu().unwrap();
    let parts = tensors(&chunks[0]);
    assert_eq!(parts.iter().map(|p| p.dims().to_vec()).collect::<Vec<_>>(), [vec![2, 2], vec![2, 1]], "the last chunk is shorter");
    assert_eq!(parts[1].as_slice::<f32>().unwrap(), &[3.0, 6.0]);
    let lengths = Case::new("SplitToSequence").constant(x.clone()).constant(Tensor::from_slice(&[2], &[0i64, 2]).unwrap()).run_cpu().unwrap();
    assert_eq!(tensors(&lengths[0]).iter().map(|p| p.dims().to_vec()).collect::<Vec<_>>(), [vec![0, 3], vec![2, 3]]);
    let bad = Case::new("SplitToSequence").constant(x).constant(Tensor::from_slice(&[2], &[1i64, 2]).unwrap()).run_cpu();
    assert!(matches!(bad, Err(OpError::Input { index: 1, ref what }) if what.contains("add up")), "{bad:?}");
}

#[test]
fn concat_from_sequence_joins_or_stacks() {
    let a = Tensor::from_slice(&[2, 1], &[1f32, 2.0]).unwrap();
    let b = Tensor::from_slice(&[2, 1], &[3f32, 4.0]).unwrap();
    let s = seq(&[a, b]);
    let cat = Case::new("ConcatFromSequence").attr("axis", Attr::Int(1)).constant(s.clone()).run_cpu().unwrap();
    assert_eq!((cat[0].dims(), cat[0].as_slice::<f32>().unwrap()), (&[2, 2][..], &[1.0, 3.0, 2.0, 4.0][..]));
    let stacked = Case::new("ConcatFromSequence").attr("axis", Attr::Int(-1)).attr("new_axis", Attr::Int(1)).constant(s.clone()).run_cpu().unwrap();
    assert_eq!((stacked[0].dims(), stacked[0].as_slice::<f32>().unwrap()), (&[2, 1, 2][..], &[1.0, 3.0, 2.0, 4.0][..]));
    let front = Case::new("ConcatFromSequence").attr("axis", Attr::Int(0)).attr("new_axis", Attr::Int(1)).constant(s).run_cpu().unwrap();
    assert_eq!((front[0].dims(), front[0].as_slice::<f32>().unwrap()), (&[2, 2, 1][..], &[1.0, 2.0, 3.0, 4.0][..]));
    let ragged = seq(&[f32s(&[1, 2], &[1.0, 2.0]), f32s(&[2, 1], &[1.0, 2.0])]);
    assert!(Case::new("ConcatFromSequence").attr("axis", Attr::Int(0)).constant(ragged).run_cpu().is_err());
    assert!(Case::new("ConcatFromSequence").attr("axis", Attr::Int(0)).constant(seq(&[])).run_cpu().is_err());
    assert!(Case::new("ConcatFromSequence").constant(seq(&[])).op().is_err(), "axis is required");
}

#[test]
fn optionals_wrap_report_and_unwrap() {
    let (a, b, _) = abc();
    let opt = Case::new("Optional").constant(a.clone()).run_cpu().unwrap();
    assert_eq!(opt[0].kind(), ValueKind::OptionalTensor);
    let has = |t: Option<Tensor>| {
        let case = match t {
            Some(t) => Case::new("OptionalHasElement").constant(t),
            None => Case::new("OptionalHasElement").omitted(),
        };
        case.run_cpu().unwrap()[0].as_slice::<u8>().unwrap()[0] != 0
    };
    let none = Tensor::from_value(Value::none(ValueKind::Sequence, DType::F32));
    assert!(has(Some(opt[0].clone())) && has(Some(a.clone())) && has(Some(seq(&[]))));
    assert!(!has(Some(none.clone())) && !has(None));
    let got = Case::new("OptionalGetElement").constant(opt[0].clone()).run_cpu().unwrap();
    assert_eq!(got[0], a);
    let opt_seq = Case::new("Optional").constant(seq(&[a.clone(), b])).run_cpu().unwrap();
    assert_eq!(opt_seq[0].kind(), ValueKind::OptionalSequence);
    assert_eq!(tensors(&Case::new("OptionalGetElement").constant(opt_seq[0].clone()).run_cpu().unwrap()[0]).len(), 2);
    let empty = Case::new("OptionalGetElement").constant(none).run_cpu();
    assert!(matches!(empty, Err(OpError::Input { index: 0, ref what }) if what.contains("empty")), "{empty:?}");
    assert!(matches!(Case::new("Optional").omitted().op(), Err(OpError::Attr { .. })), "without an input, `type` is required");
    let ty = ValueType::container(ValueKind::Sequence, DType::I64, Shape::default());
    let nothing = Case::new("Optional").attr("type", Attr::Type(ty)).omitted().run_cpu().unwrap();
    assert_eq!(Value::from(nothing[0].clone()), Value::none(ValueKind::Sequence, DType::I64));
}

#[test]
fn sequence_map_runs_the_body_per_element() {
    // body(x, y) = x + y, over a sequence and a tensor.
    let mut b = GraphBuilder::new("body");
    let x = b.input("x", DType::F32, Shape(vec![kiln_graph::Dim::Sym("n".into())]));
    let y = b.input("y", DType::F32, Shape(vec![kiln_graph::Dim::Sym("n".into())]));
    let z = b.node("Add", &[x, y], &[]);
    b.output(z);
    let body = Attr::Graph(Arc::new(b.finish().unwrap()));
    let s = seq(&[f32s(&[2], &[1.0, 2.0]), f32s(&[2], &[3.0, 4.0])]);
    let t = f32s(&[2], &[10.0, 20.0]);
    let out = Case::new("SequenceMap").attr("body", body.clone()).constant(s.clone()).constant(t.clone()).run_cpu().unwrap();
    let parts = tensors(&out[0]);
    assert_eq!(parts.iter().map(|p| p.as_slice::<f32>().unwrap().to_vec()).collect::<Vec<_>>(), [vec![11.0, 22.0], vec![13.0, 24.0]]);
    // Two sequences: elementwise pairs; their lengths must agree.
    let out = Case::new("SequenceMap").attr("body", body.clone()).constant(s.clone()).constant(s.clone()).run_cpu().unwrap();
    assert_eq!(first_values(&tensors(&out[0])), [2.0, 6.0]);
    let short = Case::new("SequenceMap").attr("body", body.clone()).constant(s).constant(seq(&[t.clone()])).run_cpu();
    assert!(matches!(short, Err(OpError::Input { index: 1, .. })), "{short:?}");
    let empty = Case::new("SequenceMap").attr("body", body).constant(seq(&[])).constant(t).run_cpu().unwrap();
    assert_eq!((empty[0].kind(), tensors(&empty[0]).len()), (ValueKind::Sequence, 0));
}

/// A graph whose input `s` is a sequence of f32, `x` a tensor, and `op_type` reads both.
fn graph_over_sequence(op_type: &str) -> Graph {
    let mut b = GraphBuilder::new("g");
    let s = b.input_typed("s", ValueType::container(ValueKind::Sequence, DType::F32, Shape::default()));
    let x = b.input("x", DType::F32, [2]);
    let y = b.node(op_type, &[s, x], &[]);
    b.output(y);
    b.finish().unwrap()
}

#[test]
fn inference_refuses_containers_for_tensor_ops_and_runs_sequence_nodes_on_known_values() {
    let g = graph_over_sequence("Add");
    let ops = infer::create_ops(&g, Registry::builtin()).unwrap();
    let order = g.validate().unwrap();
    let s = seq(&[f32s(&[2], &[1.0, 2.0])]);
    let x = f32s(&[2], &[5.0, 6.0]);
    let types = [crate::TensorType::of(&s), crate::TensorType::of(&x)];
    let err = infer::specialize(&g, &ops, &order, &types, &[Some(&s), None], Limits::default()).unwrap_err().into_error();
    assert!(err.to_string().contains("input 0: seq(f32) is not a tensor, and Add takes tensors only"), "{err}");

    let g = graph_over_sequence("SequenceInsert");
    let ops = infer::create_ops(&g, Registry::builtin()).unwrap();
    let order = g.validate().unwrap();
    // The tensor unknown: the node needs it (sessions bind or stage), naming input x.
    match infer::specialize(&g, &ops, &order, &types, &[Some(&s), None], Limits::default()) {
        Err(SpecializeError::NeedsValue { inputs, .. }) => assert_eq!(inputs, [1]),
        other => panic!("expected NeedsValue, got {other:?}"),
    }
    let done = infer::specialize(&g, &ops, &order, &types, &[Some(&s), Some(&x)], Limits::default()).unwrap();
    assert!(done.steps.is_empty(), "a sequence node is folded on the host, never a step");
    assert_eq!(tensors(&done.constants[&g.outputs[0]]).len(), 2);
}
