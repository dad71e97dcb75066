//! LSTM, GRU and RNN on every device against the f64 reference: every direction, both
//! layouts, sequence lengths (some ended early, one empty), initial states, biases,
//! peepholes, clip, activations with alpha and beta, GRU's two reset modes, output
//! subsets, odd sizes and sequences longer than a workgroup's worth of steps.
mod common;
use common::*;
use kiln_graph::{Attr, DType, Tensor};

/// A case of `op` with sizes `(seq, batch, input, hidden)`, every optional input when
/// `full`, `lens` as sequence_lens (a run-time input).
fn case(op: &str, direction: &str, layout: i64, (s, n, i, h): (usize, usize, usize, usize), full: bool, lens: Option<&[i32]>, seed: u64) -> Case {
    let gates = match op {
        "LSTM" => 4,
        "GRU" => 3,
        _ => 1,
    };
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    let x_dims = if layout == 1 { [n, s, i] } else { [s, n, i] };
    let state = if layout == 1 { [n, dirs, h] } else { [dirs, n, h] };
    let mut c = Case::new(op)
        .opset(14)
        .attr("hidden_size", Attr::Int(h as i64))
        .attr("direction", Attr::String(direction.into()))
        .attr("layout", Attr::Int(layout))
        .input(rand_f32(&x_dims, seed))
        .constant(rand_f32_map(&[dirs, gates * h, i], seed + 1, |v| v * 0.6))
        .constant(rand_f32_map(&[dirs, gates * h, h], seed + 2, |v| v * 0.6));
    c = if full { c.constant(rand_f32(&[dirs, 2 * gates * h], seed + 3)) } else { c.omitted() };
    c = match lens {
        Some(l) => c.input(Tensor::from_slice(&[n], l).unwrap()),
        None => c.omitted(),
    };
    if full {
        c = c.input(rand_f32(&state, seed + 4));
        if op == "LSTM" {
            c = c.input(rand_f32(&state, seed + 5)).constant(rand_f32(&[dirs, 3 * h], seed + 6));
        }
    }
    while matches!(c.inputs.last(), Some(Input::Omitted)) {
        c.inputs.pop();
    }
    c.outputs(if op == "LSTM" { 3 } else { 2 })
}

fn tol() -> Tolerance {
    Tolerance::f32(1e-4)
}

#[test]
fn lstm_agrees() {
    let mut s = Suite::new("LSTM");
    for (k, direction) in ["forward", "reverse", "bidirectional"].into_iter().enumerate() {
        for layout in [0, 1] {
            let seed = 10 * k as u64 + layout as u64;
            s.check(case("LSTM", direction, layout, (5, 3, 7, 9), false, None, seed), tol());
            s.check(case("LSTM", direction, layout, (6, 3, 5, 11), true, Some(&[6, 0, 3]), seed + 100), tol());
        }
    }
    // Clip, input_forget, activations with alpha and beta, no sequence_lens.
    let acts = Attr::Strings(["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "ScaledTanh", "Affine"].map(String::from).to_vec());
    let c = case("LSTM", "bidirectional", 0, (4, 2, 3, 6), true, None, 40).attr("clip", Attr::Float(0.8)).attr("input_forget", Attr::Int(1));
    s.check(c.attr("activations", acts).attr("activation_alpha", Attr::Floats(vec![0.3, 1.2, 0.7])).attr("activation_beta", Attr::Floats(vec![0.45, 0.9, 0.1])), tol());
    // A longer sequence and more units than one workgroup; only Y_h requested.
    s.check(case("LSTM", "forward", 0, (37, 2, 19, 70), true, None, 50).outputs(2), tol());
    // Only Y.
    s.check(case("LSTM", "reverse", 1, (4, 5, 3, 4), true, Some(&[1, 4, 2, 3, 4]), 60).outputs(1), tol());
    s.finish();
}

#[test]
fn gru_agrees() {
    let mut s = Suite::new("GRU");
    for lbr in [0, 1] {
        for (k, direction) in ["forward", "reverse", "bidirectional"].into_iter().enumerate() {
            for layout in [0, 1] {
                let seed = 10 * k as u64 + layout as u64 + 100 * lbr as u64;
                s.check(case("GRU", direction, layout, (5, 3, 7, 9), false, None, seed).attr("linear_before_reset", Attr::Int(lbr)), tol());
                s.check(case("GRU", direction, layout, (6, 3, 5, 11), true, Some(&[2, 6, 0]), seed + 1000).attr("linear_before_reset", Attr::Int(lbr)), tol());
            }
        }
        let acts = Attr::Strings(["Relu", "Elu", "LeakyRelu", "Softplus"].map(String::from).to_vec());
        let c = case("GRU", "bidirectional", 1, (4, 2, 3, 6), true, Some(&[3, 4]), 40 + lbr as u64).attr("linear_before_reset", Attr::Int(lbr));
        s.check(c.attr("clip", Attr::Float(0.6)).attr("activations", acts).attr("activation_alpha", Attr::Floats(vec![0.5, 0.2])), tol());
        s.check(case("GRU", "forward", 0, (33, 1, 17, 65), true, None, 50 + lbr as u64).attr("linear_before_reset", Attr::Int(lbr)), tol());
    }
    s.check(case("GRU", "forward", 0, (3, 2, 4, 5), true, None, 70).outputs(1), tol());
    s.finish();
}

#[test]
fn rnn_agrees() {
    let mut s = Suite::new("RNN");
    for (k, direction) in ["forward", "reverse", "bidirectional"].into_iter().enumerate() {
        for layout in [0, 1] {
            let seed = 10 * k as u64 + layout as u64;
            s.check(case("RNN", direction, layout, (5, 3, 7, 9), false, None, seed), tol());
            s.check(case("RNN", direction, layout, (6, 3, 5, 11), true, Some(&[4, 0, 6]), seed + 100), tol());
        }
    }
    for (act, alpha) in [("Relu", vec![]), ("ThresholdedRelu", vec![0.2]), ("Affine", vec![0.5])] {
        let c = case("RNN", "bidirectional", 1, (4, 2, 3, 6), true, Some(&[4, 2]), 40).attr("clip", Attr::Float(2.0));
        s.check(c.attr("activations", Attr::Strings(vec![act.into()])).attr("activation_alpha", Attr::Floats(alpha)), tol());
    }
    s.check(case("RNN", "forward", 0, (45, 4, 3, 7), true, None, 50).outputs(1), tol());
    s.finish();
}

/// A com.microsoft DynamicQuantizeLSTM case of sizes `(seq, batch, input, hidden)`:
/// 8-bit W and R of `dtype` (stored transposed, as onnxruntime's), their scales and
/// zero points per column or per direction; every optional input when `full`.
fn dq_lstm(direction: &str, (s, n, i, h): (usize, usize, usize, usize), dtype: DType, per_column: bool, full: bool, lens: Option<&[i32]>, seed: u64) -> Case {
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    let ints = |dims: &[usize], seed: u64| {
        let (lo, span) = if dtype == DType::I8 { (-128i64, 256i64) } else { (0, 256) };
        let count: usize = dims.iter().product();
        let v: Vec<f64> = (0..count).map(|k| (lo + (k as i64 * 7919 + seed as i64 * 104_729) % span) as f64).collect();
        Tensor::from_f64(dtype, dims, &v).unwrap()
    };
    let q: &[usize] = if per_column { &[dirs, 4 * h] } else { &[dirs] };
    let scale = |seed| rand_f32_map(q, seed, |v| v.abs() * 0.004 + 0.001);
    let mut c = Case::new("DynamicQuantizeLSTM")
        .domain("com.microsoft")
        .opset(1)
        .attr("hidden_size", Attr::Int(h as i64))
        .attr("direction", Attr::String(direction.into()))
        .input(rand_f32(&[s, n, i], seed))
        .constant(ints(&[dirs, i, 4 * h], seed + 1))
        .constant(ints(&[dirs, h, 4 * h], seed + 2));
    c = if full { c.constant(rand_f32(&[dirs, 8 * h], seed + 3)) } else { c.omitted() };
    c = match lens {
        Some(l) => c.input(Tensor::from_slice(&[n], l).unwrap()),
        None => c.omitted(),
    };
    c = if full { c.input(rand_f32(&[dirs, n, h], seed + 4)).input(rand_f32(&[dirs, n, h], seed + 5)) } else { c.omitted().omitted() };
    c.omitted().constant(scale(seed + 6)).constant(ints(q, seed + 7)).constant(scale(seed + 8)).constant(ints(q, seed + 9)).outputs(3)
}

/// The quantized LSTM on every device against the CPU. Its integer sums are exact on
/// both, but the hidden state is requantized at every step from gates whose f32
/// activations differ by an ulp between devices, which can move a value across a
/// rounding boundary: 1e-4 absorbs that.
#[test]
fn dynamic_quantize_lstm_agrees() {
    let mut s = Suite::new("DynamicQuantizeLSTM");
    s.check(dq_lstm("bidirectional", (6, 3, 5, 7), DType::I8, true, true, Some(&[6, 0, 3]), 1), tol());
    s.check(dq_lstm("forward", (5, 2, 9, 6), DType::U8, false, false, None, 2), tol());
    s.check(dq_lstm("reverse", (4, 2, 3, 5), DType::U8, true, true, Some(&[2, 4]), 3), tol());
    // More units than a workgroup, and a longer sequence.
    s.check(dq_lstm("forward", (23, 2, 13, 70), DType::I8, false, true, None, 4), tol());
    s.finish();
}

/// f16 data on the devices that carry it (through f32 on the CPU).
#[test]
fn f16_runs() {
    let mut s = Suite::new("LSTM f16");
    s.check(case("LSTM", "bidirectional", 0, (3, 2, 4, 5), true, Some(&[3, 1]), 80).with_floats_as(DType::F16), Tolerance::DEFAULT.with(DType::F16, 1e-2));
    s.finish();
}

/// A sequence length beyond the sequence is an error on every device, never a clamp.
#[test]
fn bad_sequence_lens_are_errors() {
    for op in ["LSTM", "GRU", "RNN"] {
        let (graph, feeds) = case(op, "forward", 0, (3, 2, 4, 5), true, Some(&[3, 7]), 90).graph();
        for dev in devices() {
            let err = dev.run(graph.clone(), &feeds).map(|_| ()).unwrap_err().to_string();
            eprintln!("{op} on {}: {err}", dev.label);
            assert!(err.contains(op) && err.contains('7'), "{op} on {}: {err}", dev.label);
        }
    }
}
