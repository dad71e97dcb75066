//! If, Loop and Scan on hand-built bodies: values checked against what the spec's loops
//! compute by hand, and the errors that bad bodies and inputs give.
use crate::testing::Case;
use crate::{Arg, OpError, TensorType};
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Shape, Tensor};
use std::sync::Arc;

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

fn sym(n: usize) -> Shape {
    Shape((0..n).map(|i| kiln_graph::Dim::Sym(format!("d{i}"))).collect())
}

/// A body; `outer` is how many of its last inputs are outer values.
fn body(b: GraphBuilder, outer: usize) -> Attr {
    let mut g: Graph = b.finish().unwrap();
    g.outer_inputs = outer;
    Attr::Graph(Arc::new(g))
}

/// then: x * 2; else: x + 10 (x an outer value of rank 1).
fn branches() -> (Attr, Attr) {
    let mut t = GraphBuilder::new("then");
    let x = t.input("x", DType::F32, sym(1));
    let two = t.constant("two", Tensor::scalar(2f32));
    let y = t.node("Mul", &[x, two], &[]);
    t.output(y);
    let mut e = GraphBuilder::new("else");
    let x = e.input("x", DType::F32, sym(1));
    let ten = e.constant("ten", Tensor::scalar(10f32));
    let y = e.node("Add", &[x, ten], &[]);
    e.output(y);
    (body(t, 1), body(e, 1))
}

#[test]
fn if_runs_the_branch_its_condition_picks() {
    let (then_b, else_b) = branches();
    let x = f32s(&[3], &[1.0, 2.0, 3.0]);
    for (cond, want) in [(true, [2.0, 4.0, 6.0]), (false, [11.0, 12.0, 13.0])] {
        let case = Case::new("If")
            .opset(17)
            .attr("then_branch", then_b.clone())
            .attr("else_branch", else_b.clone())
            .input(Tensor::from_bools(&[], &[cond]).unwrap())
            .input(x.clone());
        let out = case.run_cpu().unwrap();
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &want, "cond {cond}");
    }
}

#[test]
fn if_needs_its_condition_when_the_branches_differ_in_type() {
    let (then_b, _) = branches();
    // else: a constant of another shape.
    let mut e = GraphBuilder::new("else");
    e.input("x", DType::F32, sym(1));
    let c = e.constant("c", f32s(&[2], &[5.0, 6.0]));
    let y = e.node("Identity", &[c], &[]);
    e.output(y);
    let case = Case::new("If").opset(17).attr("then_branch", then_b).attr("else_branch", body(e, 1));
    let op = case.input(Tensor::from_bools(&[], &[true]).unwrap()).input(f32s(&[3], &[1.0, 2.0, 3.0])).op().unwrap();
    let (cond_t, x_t) = (TensorType::new(DType::Bool, vec![]), TensorType::new(DType::F32, vec![3]));
    let err = op.infer(&[Some(Arg { ty: &cond_t, value: None }), Some(Arg { ty: &x_t, value: None })]).unwrap_err();
    assert!(matches!(err, OpError::NeedsValue { index: 0, .. }), "{err}");
    // With the condition known, the branch taken decides.
    let t = Tensor::from_bools(&[], &[false]).unwrap();
    let out = op.infer(&[Some(Arg { ty: &cond_t, value: Some(&t) }), Some(Arg { ty: &x_t, value: None })]).unwrap();
    assert_eq!(out, vec![TensorType::new(DType::F32, vec![2])]);
}

#[test]
fn if_refuses_branches_with_different_output_counts() {
    let (then_b, _) = branches();
    let mut e = GraphBuilder::new("else");
    let x = e.input("x", DType::F32, sym(1));
    let a = e.node("Identity", &[x], &[]);
    let b = e.node("Neg", &[x], &[]);
    e.output(a);
    e.output(b);
    let err = Case::new("If").opset(17).attr("then_branch", then_b).attr("else_branch", body(e, 1)).input(Tensor::from_bools(&[], &[true]).unwrap()).input(f32s(&[1], &[1.0])).op().unwrap_err();
    assert!(err.to_string().contains("then_branch has 1 outputs, else_branch 2"), "{err}");
}

/// Loop body: (i, cond, acc) -> (acc' < limit, acc' = acc + i * w, scan: acc'), `w` outer.
fn loop_body() -> Attr {
    let mut b = GraphBuilder::new("body");
    let i = b.input("i", DType::I64, Shape(vec![]));
    b.input("cond", DType::Bool, Shape(vec![]));
    let acc = b.input("acc", DType::F32, sym(1));
    let w = b.input("w", DType::F32, sym(1));
    let fi = b.node("Cast", &[i], &[("to", Attr::Int(DType::F32.onnx_code() as i64))]);
    let step = b.node("Mul", &[fi, w], &[]);
    let next = b.node("Add", &[acc, step], &[]);
    let total = b.node("ReduceSum", &[next], &[("keepdims", Attr::Int(0))]);
    let limit = b.constant("limit", Tensor::scalar(20f32));
    let cond = b.node("Less", &[total, limit], &[]);
    let out = b.node("Identity", &[next], &[]);
    b.output(cond);
    b.output(next);
    b.output(out);
    body(b, 1)
}

/// The loop computed by hand: returns (final acc, scan rows).
fn reference_loop(trips: Option<i64>, cond: Option<bool>, acc: &[f32], w: &[f32]) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut acc = acc.to_vec();
    let mut rows = vec![];
    let mut c = cond.unwrap_or(true);
    let mut i = 0;
    while c && trips.is_none_or(|m| i < m) {
        acc = acc.iter().zip(w).map(|(a, w)| a + i as f32 * w).collect();
        rows.push(acc.clone());
        if cond.is_some() {
            c = acc.iter().sum::<f32>() < 20.0;
        }
        i += 1;
    }
    (acc, rows)
}

#[test]
fn loop_stops_at_its_trip_count_or_its_condition() {
    let acc = [0.5f32, 1.0];
    let w = [1.0f32, 2.0];
    for (trips, cond) in [(Some(3), Some(true)), (Some(10), Some(true)), (Some(4), None), (None, Some(true)), (Some(5), Some(false)), (Some(0), Some(true))] {
        // Constants: a Loop with scan outputs needs its input values to infer its types.
        let mut case = Case::new("Loop").opset(16).attr("body", loop_body()).outputs(2);
        case = match trips {
            Some(m) => case.constant(Tensor::scalar(m)),
            None => case.omitted(),
        };
        case = match cond {
            Some(c) => case.constant(Tensor::from_bools(&[], &[c]).unwrap()),
            None => case.omitted(),
        };
        let out = case.constant(f32s(&[2], &acc)).constant(f32s(&[2], &w)).run_cpu().unwrap();
        let (want_acc, rows) = reference_loop(trips, cond, &acc, &w);
        assert_eq!(out[0].as_slice::<f32>().unwrap(), want_acc.as_slice(), "M {trips:?} cond {cond:?}");
        assert_eq!(out[1].dims(), &[rows.len(), 2], "M {trips:?} cond {cond:?}");
        assert_eq!(out[1].as_slice::<f32>().unwrap(), rows.concat().as_slice(), "M {trips:?} cond {cond:?}");
    }
}

#[test]
fn loop_without_trip_count_or_condition_is_refused() {
    let err = Case::new("Loop").opset(16).attr("body", loop_body()).outputs(2).omitted().omitted().constant(f32s(&[2], &[0.0, 0.0])).constant(f32s(&[2], &[1.0, 1.0])).run_cpu().unwrap_err();
    assert!(err.to_string().contains("would run forever"), "{err}");
}

#[test]
fn loop_with_scan_outputs_needs_its_input_values() {
    let case = Case::new("Loop").opset(16).attr("body", loop_body()).outputs(2).input(Tensor::scalar(3i64)).input(Tensor::from_bools(&[], &[true]).unwrap()).input(f32s(&[2], &[0.0, 0.0])).input(f32s(&[2], &[1.0, 1.0]));
    let op = case.op().unwrap();
    let tys = [TensorType::new(DType::I64, vec![]), TensorType::new(DType::Bool, vec![]), TensorType::new(DType::F32, vec![2]), TensorType::new(DType::F32, vec![2])];
    let args: Vec<Option<Arg>> = tys.iter().map(|t| Some(Arg { ty: t, value: None })).collect();
    assert!(matches!(op.infer(&args).unwrap_err(), OpError::NeedsValue { .. }));
}

/// Scan body: (s, x) -> (s + x, s * x).
fn scan_body(rank: usize) -> Attr {
    let mut b = GraphBuilder::new("scan_body");
    let s = b.input("s", DType::F32, sym(rank));
    let x = b.input("x", DType::F32, sym(rank));
    let n = b.node("Add", &[s, x], &[]);
    let m = b.node("Mul", &[s, x], &[]);
    b.output(n);
    b.output(m);
    body(b, 0)
}

#[test]
fn scan_follows_axes_and_directions() {
    // x: [2, 3]; scan along axis 1 (3 steps of [2]), reversed; outputs stacked on axis 1, reversed.
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let s0 = f32s(&[2], &[10.0, 20.0]);
    let out = Case::new("Scan")
        .opset(16)
        .attr("body", scan_body(1))
        .attr("num_scan_inputs", Attr::Int(1))
        .attr("scan_input_axes", Attr::Ints(vec![1]))
        .attr("scan_input_directions", Attr::Ints(vec![1]))
        .attr("scan_output_axes", Attr::Ints(vec![-1]))
        .attr("scan_output_directions", Attr::Ints(vec![1]))
        .outputs(2)
        .input(s0)
        .input(x)
        .run_cpu()
        .unwrap();
    // Steps read columns 2, 1, 0: s = [10,20] -> [13,26] -> [15,31] -> [16,35];
    // emitted s*x: [30,120], [26,130], [15,124]; reversed along the stacked axis.
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[16.0, 35.0]);
    assert_eq!(out[1].dims(), &[2, 3]);
    assert_eq!(out[1].as_slice::<f32>().unwrap(), &[15.0, 26.0, 30.0, 124.0, 130.0, 120.0]);
}

#[test]
fn scan_opset8_runs_one_scan_per_batch_item() {
    // x: [batch 2, seq 2, 1]; states [2, 1].
    let x = f32s(&[2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    let s0 = f32s(&[2, 1], &[0.0, 100.0]);
    let out = Case::new("Scan")
        .opset(8)
        .attr("body", scan_body(1))
        .attr("num_scan_inputs", Attr::Int(1))
        .outputs(2)
        .omitted()
        .input(s0)
        .input(x)
        .run_cpu()
        .unwrap();
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &[3.0, 107.0]);
    assert_eq!(out[1].dims(), &[2, 2, 1]);
    assert_eq!(out[1].as_slice::<f32>().unwrap(), &[0.0, 2.0, 300.0, 412.0]);
}

#[test]
fn scan_refuses_scan_inputs_of_different_lengths() {
    let mut b = GraphBuilder::new("two");
    let s = b.input("s", DType::F32, sym(1));
    let x = b.input("x", DType::F32, sym(1));
    let y = b.input("y", DType::F32, sym(1));
    let n = b.node("Sum", &[s, x, y], &[]);
    b.output(n);
    let err = Case::new("Scan")
        .opset(16)
        .attr("body", body(b, 0))
        .attr("num_scan_inputs", Attr::Int(2))
        .input(f32s(&[1], &[0.0]))
        .input(f32s(&[3, 1], &[1.0, 2.0, 3.0]))
        .input(f32s(&[2, 1], &[1.0, 2.0]))
        .run_cpu()
        .unwrap_err();
    assert!(err.to_string().contains("has 2 elements along its scan axis, scan input 0 has 3"), "{err}");
}

#[test]
fn a_body_with_an_unknown_op_names_the_subgraph() {
    let mut b = GraphBuilder::new("bad_body");
    let x = b.input("x", DType::F32, sym(1));
    let y = b.node("NoSuchOp", &[x], &[]);
    b.output(y);
    let err = Case::new("If").opset(17).attr("then_branch", body(b, 1)).attr("else_branch", branches().1).input(Tensor::from_bools(&[], &[true]).unwrap()).input(f32s(&[1], &[1.0])).op().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("then_branch") && text.contains("bad_body") && text.contains("NoSuchOp"), "{text}");
}
