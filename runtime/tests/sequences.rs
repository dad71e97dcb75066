//! Sequences and optionals through sessions, on every device: sequence inputs and
//! outputs by value, sequence nodes on the host between device stages, and the errors
//! a wrong kind of input gives.
mod common;
use common::*;
use kiln_graph::{DType, Graph, GraphBuilder, Shape, Tensor, Value, ValueKind, ValueType};
use kiln_runtime::{RuntimeError, Session, SessionOptions};

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

fn seq_type() -> ValueType {
    ValueType::container(ValueKind::Sequence, DType::F32, Shape::default())
}

/// s: seq(f32), x: f32[4, 5]. y = SequenceInsert(s, Relu(x)) at the front;
/// n = SequenceLength(y); c = ConcatFromSequence(SplitToSequence(Relu(x)), axis 0) + 1.
/// Relu runs on the device; x is too large to bind by value, so the sequence nodes run
/// on the host between stages.
fn staged_graph() -> Graph {
    let mut b = GraphBuilder::new("seq");
    let s = b.input_typed("s", seq_type());
    let x = b.input("x", DType::F32, [4, 5]);
    let r = b.node("Relu", &[x], &[]);
    let zero = b.constant("zero", Tensor::scalar(0i64));
    let y = b.node("SequenceInsert", &[s, r, zero], &[]);
    let n = b.node("SequenceLength", &[y], &[]);
    let parts = b.node("SplitToSequence", &[r], &[]);
    let c = b.node("ConcatFromSequence", &[parts], &[("axis", kiln_graph::Attr::Int(0))]);
    let one = b.constant("one", Tensor::scalar(1f32));
    let d = b.node("Add", &[c, one], &[]);
    for (v, name) in [(y, "y"), (n, "n"), (d, "d")] {
        b.rename(v, name);
        b.output(v);
    }
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

#[test]
fn sequences_run_on_the_host_between_device_stages() {
    let x: Vec<f32> = (0..20).map(|i| i as f32 - 10.0).collect();
    let relu: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
    let x = f32s(&[4, 5], &x);
    let s = Value::sequence(DType::F32, vec![f32s(&[2], &[7.0, 8.0])]);
    for dev in devices() {
        let session = Session::new(staged_graph(), SessionOptions::device(dev.choice.clone())).unwrap();
        for _ in 0..2 {
            let outs = session.run_values(&[("s", &s), ("x", &Value::Tensor(x.clone()))]).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
            let y = outs[0].as_sequence().unwrap_or_else(|| panic!("{}: y is {:?}", dev.label, outs[0]));
            assert_eq!(y.len(), 2, "{}", dev.label);
            assert_eq!(y[0].as_slice::<f32>().unwrap(), relu.as_slice(), "{}: the device's Relu, first", dev.label);
            assert_eq!(y[1].as_slice::<f32>().unwrap(), &[7.0, 8.0], "{}", dev.label);
            assert_eq!(outs[1].as_tensor().unwrap().as_slice::<i64>().unwrap(), &[2], "{}", dev.label);
            let want: Vec<f32> = relu.iter().map(|v| v + 1.0).collect();
            assert_eq!(outs[2].as_tensor().unwrap().as_slice::<f32>().unwrap(), want.as_slice(), "{}", dev.label);
        }
    }
}

/// o: optional(seq(f32)) in; out: whether it holds a value, and Identity of it.
fn optional_graph() -> Graph {
    let mut b = GraphBuilder::new("opt");
    let o = b.input_typed("o", ValueType::container(ValueKind::OptionalSequence, DType::F32, Shape::default()));
    let has = b.node("OptionalHasElement", &[o], &[]);
    let same = b.node("Identity", &[o], &[]);
    b.output(has);
    b.output(same);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 18);
    g
}

#[test]
fn optionals_pass_through_sessions_and_wrong_kinds_are_named() {
    let full = Value::some(Value::sequence(DType::F32, vec![f32s(&[1], &[3.0])]));
    let empty = Value::none(ValueKind::Sequence, DType::F32);
    for dev in devices() {
        let session = Session::new(optional_graph(), SessionOptions::device(dev.choice.clone())).unwrap();
        for (v, has) in [(&full, true), (&empty, false)] {
            let outs = session.run_values(&[("o", v)]).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
            assert_eq!(outs[0].as_tensor().unwrap().as_slice::<u8>().unwrap(), &[has as u8], "{}", dev.label);
            assert_eq!(&outs[1], v, "{}", dev.label);
        }
        let tensor = Tensor::scalar(1f32);
        match session.run(&[("o", &tensor)]) {
            Err(RuntimeError::InputMismatch { name, expected, got }) => {
                assert_eq!((name.as_str(), expected.as_str()), ("o", "optional(seq(f32[]))"));
                assert!(got.contains("a tensor"), "{got}");
            }
            other => panic!("{}: expected an input mismatch, got {other:?}", dev.label),
        }
        let wrong_dtype = Value::some(Value::sequence(DType::I64, vec![]));
        let err = session.run_values(&[("o", &wrong_dtype)]).unwrap_err();
        assert!(err.to_string().contains("optional(seq(i64))"), "{err}");
    }
}
