//! Control flow through sessions on every device: a Loop whose condition the body
//! computes (read back every iteration), a Scan and an If, against the CPU. On a GPU
//! the bodies run as GPU work (sessions of the bodies on the same adapter), which the
//! run's statistics show: every iteration submits GPU work.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Shape, Tensor};
use kiln_ops::testing::compare;
use kiln_runtime::{Session, SessionOptions};
use std::sync::Arc;

/// Rows of x: more floats than sessions bind by value, so that the loops run when the
/// model runs (a Loop whose inputs are all bound folds when the session specialises).
const ROWS: usize = 4;

fn body(b: GraphBuilder, outer: usize) -> Attr {
    let mut g: Graph = b.finish().unwrap();
    g.outer_inputs = outer;
    Attr::Graph(Arc::new(g))
}

/// x: f32[ROWS, 8], steps: i64 scalar, mode: bool scalar.
/// Loop (at most `steps` times, while mean |h| > 0.05): h = tanh(h W); scan output
/// sum(h). Then If mode: softmax(h) else relu(-h). Then Scan over the rows of x:
/// s = s + x[t], emitting s * 2.
fn graph() -> Graph {
    let mut b = GraphBuilder::new("control");
    let x = b.input("x", DType::F32, [ROWS, 8]);
    let steps = b.input("steps", DType::I64, Shape::default());
    let mode = b.input("mode", DType::Bool, Shape::default());
    let w: Vec<f32> = (0..64).map(|k| ((k * 37 % 17) as f32 - 8.0) * 0.09).collect();
    let w = b.constant("W", Tensor::from_slice(&[8, 8], &w).unwrap());
    let yes = b.constant("yes", Tensor::from_bools(&[], &[true]).unwrap());

    let mut lb = GraphBuilder::new("loop_body");
    lb.input("i", DType::I64, Shape::default());
    lb.input("cond_in", DType::Bool, Shape::default());
    let h = lb.input("h_in", DType::F32, [ROWS, 8]);
    let wb = lb.input("W", DType::F32, [8, 8]);
    let hw = lb.node("MatMul", &[h, wb], &[]);
    let h_out = lb.node("Tanh", &[hw], &[]);
    let a = lb.node("Abs", &[h_out], &[]);
    let m = lb.node("ReduceMean", &[a], &[("keepdims", Attr::Int(0))]);
    let thr = lb.constant("thr", Tensor::scalar(0.05f32));
    let cond = lb.node("Greater", &[m, thr], &[]);
    let total = lb.node("ReduceSum", &[h_out], &[("keepdims", Attr::Int(0))]);
    for v in [cond, h_out, total] {
        lb.output(v);
    }
    let outs = b.node_multi("Loop", &[Some(steps), Some(yes), Some(x), Some(w)], &[("body", body(lb, 1))], 2);

    let mut t = GraphBuilder::new("then");
    let h = t.input("h", DType::F32, [ROWS, 8]);
    let y = t.node("Softmax", &[h], &[]);
    t.output(y);
    let mut e = GraphBuilder::new("else");
    let h = e.input("h", DType::F32, [ROWS, 8]);
    let n = e.node("Neg", &[h], &[]);
    let y = e.node("Relu", &[n], &[]);
    e.output(y);
    let branch = b.node_multi("If", &[Some(mode), Some(outs[0])], &[("then_branch", body(t, 1)), ("else_branch", body(e, 1))], 1)[0];
    // The If's branches read the Loop's result as an outer value named "h".
    b.rename(outs[0], "h");

    let mut sb = GraphBuilder::new("scan_body");
    let s = sb.input("s_in", DType::F32, [8]);
    let xt = sb.input("xt", DType::F32, [8]);
    let s_out = sb.node("Add", &[s, xt], &[]);
    let two = sb.constant("two", Tensor::scalar(2f32));
    let emit = sb.node("Mul", &[s_out, two], &[]);
    sb.output(s_out);
    sb.output(emit);
    let zero = b.constant("s0", Tensor::from_slice(&[8], &[0f32; 8]).unwrap());
    let scan = b.node_multi("Scan", &[Some(zero), Some(x)], &[("body", body(sb, 0)), ("num_scan_inputs", Attr::Int(1))], 2);
    for (v, name) in [(outs[1], "sums"), (branch, "y"), (scan[0], "s_last"), (scan[1], "running")] {
        b.rename(v, name);
        b.output(v);
    }
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

#[test]
fn bodies_run_on_every_device_and_as_gpu_work_on_gpus() {
    let cpu = Session::new(graph(), SessionOptions::device(kiln_runtime::DeviceChoice::Cpu)).unwrap();
    let gpus: Vec<_> = devices().iter().filter(|d| !d.is_cpu()).map(|d| (d.label.clone(), Session::new(graph(), SessionOptions::device(d.choice.clone())).unwrap())).collect();
    // Each run's inputs differ (a Loop evaluated as a stage barrier remembers its last
    // inputs and outputs).
    for (run, (steps, mode, scale)) in [(6i64, true, 0.15f32), (40, false, 0.15), (40, true, 0.1)].into_iter().enumerate() {
        let x: Vec<f32> = (0..ROWS * 8).map(|k| (k as f32 - 15.5) * scale).collect();
        let x = Tensor::from_slice(&[ROWS, 8], &x).unwrap();
        let steps_t = Tensor::scalar(steps);
        let mode_t = Tensor::from_bools(&[], &[mode]).unwrap();
        let feeds = [("x", &x), ("steps", &steps_t), ("mode", &mode_t)];
        let (want, cpu_stats) = cpu.run_with_stats(&feeds).unwrap();
        assert_eq!(cpu_stats.submits, 0);
        let iterations = want[0].dims()[0];
        assert!(iterations >= 2 && iterations as i64 <= steps, "run {run}: {iterations} iterations of at most {steps}");
        for (label, session) in &gpus {
            let (got, stats) = session.run_with_stats(&feeds).unwrap_or_else(|e| panic!("{label}: {e}"));
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                compare(g, w, 1e-5).unwrap_or_else(|e| panic!("{label} run {run}: output {k}: {e}"));
            }
            // One submit at least per Loop iteration (its condition is read back each
            // time), one for the Scan's rows (one chain), one for the If.
            assert!(stats.submits >= iterations + 2, "{label} run {run}: {} submits for {iterations} iterations", stats.submits);
        }
    }
}

/// x: f32[ROWS, 8], steps: i64 scalar. A for-loop (no condition input; the body
/// returns its condition unchanged): h = tanh(h W + i / 100), scan output sum(h).
fn for_loop(with_condition: bool) -> Graph {
    let mut b = GraphBuilder::new("for");
    let x = b.input("x", DType::F32, [ROWS, 8]);
    let steps = b.input("steps", DType::I64, Shape::default());
    let w: Vec<f32> = (0..64).map(|k| ((k * 29 % 13) as f32 - 6.0) * 0.1).collect();
    let w = b.constant("W", Tensor::from_slice(&[8, 8], &w).unwrap());
    let mut lb = GraphBuilder::new("for_body");
    let i = lb.input("i", DType::I64, Shape::default());
    let cond = lb.input("cond_in", DType::Bool, Shape::default());
    let h = lb.input("h_in", DType::F32, [ROWS, 8]);
    let wb = lb.input("W", DType::F32, [8, 8]);
    let hw = lb.node("MatMul", &[h, wb], &[]);
    let fi = lb.node("Cast", &[i], &[("to", Attr::Int(1))]);
    let hundred = lb.constant("hundred", Tensor::scalar(100f32));
    let shift = lb.node("Div", &[fi, hundred], &[]);
    let pre = lb.node("Add", &[hw, shift], &[]);
    let h_out = lb.node("Tanh", &[pre], &[]);
    let total = lb.node("ReduceSum", &[h_out], &[("keepdims", Attr::Int(0))]);
    let cond_out = if with_condition { lb.node("Identity", &[cond], &[]) } else { cond };
    for v in [cond_out, h_out, total] {
        lb.output(v);
    }
    let yes = b.constant("yes", Tensor::from_bools(&[], &[true]).unwrap());
    let cond_input = if with_condition { Some(yes) } else { None };
    let outs = b.node_multi("Loop", &[Some(steps), cond_input, Some(x), Some(w)], &[("body", body(lb, 1))], 2);
    for (v, name) in [(outs[0], "h"), (outs[1], "sums")] {
        b.rename(v, name);
        b.output(v);
    }
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

/// A Loop whose trip count is known and whose condition does not change runs on a GPU
/// in chains of up to 16 iterations, one submit each, and equals the CPU's.
#[test]
fn known_trip_counts_batch_iterations_into_one_submit() {
    for with_condition in [false, true] {
        let cpu = Session::new(for_loop(with_condition), SessionOptions::device(kiln_runtime::DeviceChoice::Cpu)).unwrap();
        let gpus: Vec<_> = devices().iter().filter(|d| !d.is_cpu()).map(|d| (d.label.clone(), Session::new(for_loop(with_condition), SessionOptions::device(d.choice.clone())).unwrap())).collect();
        for (run, steps) in [37i64, 1, 0, 16].into_iter().enumerate() {
            let x: Vec<f32> = (0..ROWS * 8).map(|k| (k as f32 - 15.5) * 0.05 + run as f32 * 0.01).collect();
            let x = Tensor::from_slice(&[ROWS, 8], &x).unwrap();
            let steps_t = Tensor::scalar(steps);
            let feeds = [("x", &x), ("steps", &steps_t)];
            let want = cpu.run(&feeds).unwrap();
            assert_eq!(want[1].dims(), &[steps as usize]);
            for (label, session) in &gpus {
                let (got, stats) = session.run_with_stats(&feeds).unwrap_or_else(|e| panic!("{label}: {e}"));
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    compare(g, w, 1e-5).unwrap_or_else(|e| panic!("{label} {steps} steps: output {k}: {e}"));
                }
                // 37 = 16 + 16 + 4 + 1: three chains and one single iteration.
                let most = match steps {
                    37 => 4,
                    16 => 1,
                    s => s as usize,
                };
                assert!(stats.submits >= most && stats.submits <= most + 1, "{label} {steps} steps: {} submits", stats.submits);
            }
        }
    }
}

/// x: f32[n, 8]. Scan over x's rows backwards (s = s * 0.5 + x[t], emitting s + 1
/// along axis 1 of the output).
fn scan_graph(n: usize) -> Graph {
    let mut b = GraphBuilder::new("scan");
    let x = b.input("x", DType::F32, [n, 8]);
    let mut sb = GraphBuilder::new("scan_body");
    let s = sb.input("s_in", DType::F32, [8]);
    let xt = sb.input("xt", DType::F32, [8]);
    let half = sb.constant("half", Tensor::scalar(0.5f32));
    let sh = sb.node("Mul", &[s, half], &[]);
    let s_out = sb.node("Add", &[sh, xt], &[]);
    let one = sb.constant("one", Tensor::scalar(1f32));
    let emit = sb.node("Add", &[s_out, one], &[]);
    let axes = sb.constant("axes", Tensor::from_slice(&[1], &[0i64]).unwrap());
    let emit = sb.node("Unsqueeze", &[emit, axes], &[]);
    sb.output(s_out);
    sb.output(emit);
    let zero = b.constant("s0", Tensor::from_slice(&[8], &[0f32; 8]).unwrap());
    let attrs = [("body", body(sb, 0)), ("num_scan_inputs", Attr::Int(1)), ("scan_input_directions", Attr::Ints(vec![1])), ("scan_output_axes", Attr::Ints(vec![1]))];
    let outs = b.node_multi("Scan", &[Some(zero), Some(x)], &attrs, 2);
    for (v, name) in [(outs[0], "s_last"), (outs[1], "running")] {
        b.rename(v, name);
        b.output(v);
    }
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

/// A Scan's sequence length is known: its rows run on a GPU in chains of up to 16, one
/// submit each, and equal the CPU's.
#[test]
fn scans_batch_rows_into_one_submit() {
    for (n, chains) in [(37usize, 4usize), (3, 2), (1, 1)] {
        let x: Vec<f32> = (0..n * 8).map(|k| ((k * 13 % 31) as f32 - 15.0) * 0.1).collect();
        let x = Tensor::from_slice(&[n, 8], &x).unwrap();
        let want = Session::new(scan_graph(n), SessionOptions::device(kiln_runtime::DeviceChoice::Cpu)).unwrap().run(&[("x", &x)]).unwrap();
        assert_eq!(want[1].dims(), &[1, n, 8]);
        for dev in devices().iter().filter(|d| !d.is_cpu()) {
            let session = Session::new(scan_graph(n), SessionOptions::device(dev.choice.clone())).unwrap();
            let (got, stats) = session.run_with_stats(&[("x", &x)]).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                compare(g, w, 1e-6).unwrap_or_else(|e| panic!("{} {n} rows: output {k}: {e}", dev.label));
            }
            // 37 = 16 + 16 + 4 + 1; 3 = 2 + 1.
            assert!(stats.submits >= chains && stats.submits <= chains + 1, "{} {n} rows: {} submits", dev.label, stats.submits);
        }
    }
}

/// steps: i64 scalar, x: f32[20] (more floats than sessions bind by value, so the Loop
/// runs when the model runs). A Loop whose carried value grows by one element an
/// iteration (h = Concat(h, [i * x[0]])), with its condition computed by the body
/// (i < 20) when `computed_condition`, else a for-loop.
fn growing(computed_condition: bool) -> Graph {
    let mut b = GraphBuilder::new("growing");
    let x = b.input("x", DType::F32, [20]);
    let steps = b.input("steps", DType::I64, Shape::default());
    let mut lb = GraphBuilder::new("grow_body");
    let i = lb.input("i", DType::I64, Shape::default());
    let cond = lb.input("cond_in", DType::Bool, Shape::default());
    let h = lb.input("h_in", DType::F32, Shape(vec![kiln_graph::Dim::Sym("n".into())]));
    let xb = lb.input("x", DType::F32, [20]);
    let fi = lb.node("Cast", &[i], &[("to", Attr::Int(1))]);
    let first = lb.constant("first", Tensor::from_slice(&[1], &[0i64]).unwrap());
    let x0 = lb.node("Gather", &[xb, first], &[]);
    let v = lb.node("Mul", &[x0, fi], &[]);
    let h_out = lb.node("Concat", &[h, v], &[("axis", Attr::Int(0))]);
    let cond_out = if computed_condition {
        let limit = lb.constant("limit", Tensor::scalar(20i64));
        lb.node("Less", &[i, limit], &[])
    } else {
        cond
    };
    lb.output(cond_out);
    lb.output(h_out);
    let yes = b.constant("yes", Tensor::from_bools(&[], &[true]).unwrap());
    let h0 = b.constant("h0", Tensor::from_slice(&[1], &[1f32]).unwrap());
    let out = b.node_multi("Loop", &[Some(steps), Some(yes), Some(h0), Some(x)], &[("body", body(lb, 1))], 1)[0];
    b.rename(out, "h");
    b.output(out);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

/// Carried values whose shape changes every iteration: one body session serves them
/// all (its plans per shape), with the condition read back or the iterations chained.
#[test]
fn carried_values_may_grow() {
    let x: Vec<f32> = (0..20).map(|k| 0.5 + k as f32).collect();
    let x = Tensor::from_slice(&[20], &x).unwrap();
    for computed_condition in [true, false] {
        let cpu = Session::new(growing(computed_condition), SessionOptions::device(kiln_runtime::DeviceChoice::Cpu)).unwrap();
        for dev in devices().iter().filter(|d| !d.is_cpu()) {
            let session = Session::new(growing(computed_condition), SessionOptions::device(dev.choice.clone())).unwrap();
            for steps in [37i64, 5] {
                let steps_t = Tensor::scalar(steps);
                let feeds = [("x", &x), ("steps", &steps_t)];
                let want = cpu.run(&feeds).unwrap();
                let iterations = if computed_condition { steps.min(21) } else { steps } as usize;
                assert_eq!(want[0].dims(), &[1 + iterations]);
                let (got, stats) = session.run_with_stats(&feeds).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
                compare(&got[0], &want[0], 0.0).unwrap_or_else(|e| panic!("{} {steps} steps: {e}", dev.label));
                assert!(stats.submits > 0, "{} {steps} steps: the loop ran on the host", dev.label);
            }
        }
    }
}

/// x: f32[40], steps: i64 scalar. Loop while i < 38: acc = acc + Slice(x, i, i + 1):
/// the body's iteration number sets a slice's bounds, so the body's session binds it
/// by value, one plan per iteration, more than a body's session keeps.
fn slicing() -> Graph {
    let mut b = GraphBuilder::new("slicing");
    let x = b.input("x", DType::F32, [40]);
    let steps = b.input("steps", DType::I64, Shape::default());
    let mut lb = GraphBuilder::new("slice_body");
    let i = lb.input("i", DType::I64, Shape::default());
    lb.input("cond_in", DType::Bool, Shape::default());
    let acc = lb.input("acc_in", DType::F32, [1]);
    let xb = lb.input("x", DType::F32, [40]);
    let axes = lb.constant("axes", Tensor::from_slice(&[1], &[0i64]).unwrap());
    let start = lb.node("Unsqueeze", &[i, axes], &[]);
    let one = lb.constant("one", Tensor::from_slice(&[1], &[1i64]).unwrap());
    let end = lb.node("Add", &[start, one], &[]);
    let piece = lb.node("Slice", &[xb, start, end], &[]);
    let acc_out = lb.node("Add", &[acc, piece], &[]);
    let limit = lb.constant("limit", Tensor::scalar(38i64));
    let cond = lb.node("Less", &[i, limit], &[]);
    lb.output(cond);
    lb.output(acc_out);
    let yes = b.constant("yes", Tensor::from_bools(&[], &[true]).unwrap());
    let acc0 = b.constant("acc0", Tensor::from_slice(&[1], &[0f32]).unwrap());
    let out = b.node_multi("Loop", &[Some(steps), Some(yes), Some(acc0), Some(x)], &[("body", body(lb, 1))], 1)[0];
    b.rename(out, "acc");
    b.output(out);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    g
}

/// More signatures than a body's session keeps plans for: the oldest are dropped and
/// results stay right.
#[test]
fn bodies_that_specialise_per_iteration_stay_bounded_and_right() {
    let x: Vec<f32> = (0..40).map(|k| k as f32 * 0.25).collect();
    let x = Tensor::from_slice(&[40], &x).unwrap();
    let steps = Tensor::scalar(100i64);
    let feeds = [("x", &x), ("steps", &steps)];
    let want = Session::new(slicing(), SessionOptions::device(kiln_runtime::DeviceChoice::Cpu)).unwrap().run(&feeds).unwrap();
    // 39 iterations (i = 0..=38): the sum of x[0..39].
    assert_eq!(want[0].as_slice::<f32>().unwrap(), &[(0..39).map(|k| k as f32 * 0.25).sum::<f32>()]);
    for dev in devices().iter().filter(|d| !d.is_cpu()) {
        let session = Session::new(slicing(), SessionOptions::device(dev.choice.clone())).unwrap();
        let (got, stats) = session.run_with_stats(&feeds).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
        compare(&got[0], &want[0], 0.0).unwrap_or_else(|e| panic!("{}: {e}", dev.label));
        assert!(stats.submits >= 39, "{}: {} submits", dev.label, stats.submits);
    }
}
