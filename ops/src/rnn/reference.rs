//! The tests' reference: LSTM, GRU and RNN written straight from the ONNX spec in f64,
//! one batch row and one direction at a time, with their own activation functions;
//! and the checks the op tests share (random cases against it, output subsets, dtypes,
//! errors).
use crate::testing::{rand, run, tune, Case, Input};
use kiln_graph::{Attr, DType, Tensor};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Lstm { input_forget: bool },
    Gru { linear_before_reset: bool },
    Rnn,
}

impl Kind {
    fn op(self) -> &'static str {
        match self {
            Kind::Lstm { .. } => "LSTM",
            Kind::Gru { .. } => "GRU",
            Kind::Rnn => "RNN",
        }
    }
    fn gates(self) -> usize {
        match self {
            Kind::Lstm { .. } => 4,
            Kind::Gru { .. } => 3,
            Kind::Rnn => 1,
        }
    }
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Lstm { .. } => &["Sigmoid", "Tanh", "Tanh"],
            Kind::Gru { .. } => &["Sigmoid", "Tanh"],
            Kind::Rnn => &["Tanh"],
        }
    }
    fn max_outputs(self) -> usize {
        if matches!(self, Kind::Lstm { .. }) { 3 } else { 2 }
    }
    fn attrs(self) -> Vec<(&'static str, Attr)> {
        match self {
            Kind::Lstm { input_forget } => vec![("input_forget", Attr::Int(input_forget as i64))],
            Kind::Gru { linear_before_reset } => vec![("linear_before_reset", Attr::Int(linear_before_reset as i64))],
            Kind::Rnn => vec![],
        }
    }
}

/// Which optional inputs a case has (B, initial_h and initial_c, P).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opts {
    pub bias: bool,
    pub initial: bool,
    pub peepholes: bool,
}

impl Opts {
    pub const NONE: Opts = Opts { bias: false, initial: false, peepholes: false };
    pub const ALL: Opts = Opts { bias: true, initial: true, peepholes: true };
}

/// An activation as the spec defines it, with its alpha and beta.
#[derive(Clone, Debug)]
struct Act {
    name: String,
    alpha: f64,
    beta: f64,
}

impl Act {
    fn apply(&self, x: f64) -> f64 {
        let (a, b) = (self.alpha, self.beta);
        match self.name.to_lowercase().as_str() {
            "relu" => x.max(0.0),
            "tanh" => x.tanh(),
            "sigmoid" => 1.0 / (1.0 + (-x).exp()),
            "affine" => a * x + b,
            "leakyrelu" => if x >= 0.0 { x } else { a * x },
            "thresholdedrelu" => if x > a { x } else { 0.0 },
            "scaledtanh" => a * (b * x).tanh(),
            "hardsigmoid" => (a * x + b).clamp(0.0, 1.0),
            "elu" => if x >= 0.0 { x } else { a * (x.exp() - 1.0) },
            "softsign" => x / (1.0 + x.abs()),
            "softplus" => (1.0 + x.exp()).ln(),
            n => panic!("no activation {n}"),
        }
    }
}

/// The activations of a node: `names` (defaults when empty) repeated for the second
/// direction when given once, alpha and beta taken in order by those that have them.
fn activations(kind: Kind, dirs: usize, names: &[String], alphas: &[f32], betas: &[f32]) -> Vec<Act> {
    let mut names: Vec<String> = if names.is_empty() { kind.default_activations().iter().map(|s| s.to_string()).collect() } else { names.to_vec() };
    if names.len() < kind.default_activations().len() * dirs {
        names = names.iter().cycle().take(names.len() * dirs).cloned().collect();
    }
    let (mut ai, mut bi) = (alphas.iter().map(|&v| v as f64), betas.iter().map(|&v| v as f64));
    names
        .into_iter()
        .map(|name| {
            let (uses_a, uses_b, da, db) = match name.to_lowercase().as_str() {
                "affine" => (true, true, 1.0, 0.0),
                "leakyrelu" => (true, false, 0.01, 0.0),
                "thresholdedrelu" => (true, false, 1.0, 0.0),
                "scaledtanh" => (true, true, 1.0, 1.0),
                "hardsigmoid" => (true, true, 0.2, 0.5),
                "elu" => (true, false, 1.0, 0.0),
                _ => (false, false, 0.0, 0.0),
            };
            let alpha = if uses_a { ai.next().unwrap_or(da) } else { da };
            let beta = if uses_b { bi.next().unwrap_or(db) } else { db };
            Act { name, alpha, beta }
        })
        .collect()
}

/// Everything a reference run needs.
struct Problem {
    kind: Kind,
    forward: Vec<bool>,
    batch_first: bool,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    acts: Vec<Act>,
    clip: Option<f64>,
    x: Vec<f64>,
    w: Vec<f64>,
    r: Vec<f64>,
    b: Option<Vec<f64>>,
    lens: Vec<usize>,
    h0: Option<Vec<f64>>,
    c0: Option<Vec<f64>>,
    p: Option<Vec<f64>>,
}

impl Problem {
    /// Y, Y_h and Y_c, in the node's layout.
    fn solve(&self) -> [Vec<f64>; 3] {
        let (s, n, h, dirs) = (self.seq, self.batch, self.hidden, self.forward.len());
        let per_dir = self.acts.len() / dirs;
        let mut y = vec![0.0; s * dirs * n * h];
        let mut yh = vec![0.0; dirs * n * h];
        let mut yc = vec![0.0; dirs * n * h];
        let state_at = |d: usize, b: usize| if self.batch_first { (b * dirs + d) * h } else { (d * n + b) * h };
        for d in 0..dirs {
            let act = |k: usize, v: f64| {
                let v = match self.clip {
                    Some(c) if k < 2 || !matches!(self.kind, Kind::Lstm { .. }) => v.clamp(-c, c),
                    _ => v,
                };
                self.acts[d * per_dir + k].apply(v)
            };
            for b in 0..n {
                let mut hs: Vec<f64> = self.h0.as_ref().map_or(vec![0.0; h], |v| v[state_at(d, b)..][..h].to_vec());
                let mut cs: Vec<f64> = self.c0.as_ref().map_or(vec![0.0; h], |v| v[state_at(d, b)..][..h].to_vec());
                let len = self.lens[b];
                for step in 0..len {
                    let t = if self.forward[d] { step } else { len - 1 - step };
                    let xt: Vec<f64> = (0..self.input).map(|k| self.x[if self.batch_first { (b * s + t) * self.input + k } else { (t * n + b) * self.input + k }]).collect();
                    let g = self.kind.gates();
                    // Xt W[row]^T + Wb[row], and src R[row]^T + Rb[row].
                    let xw = |row: usize| -> f64 {
                        let wb = self.b.as_ref().map_or(0.0, |bv| bv[d * 2 * g * h + row]);
                        (0..self.input).map(|k| xt[k] * self.w[(d * g * h + row) * self.input + k]).sum::<f64>() + wb
                    };
                    let hr = |row: usize, src: &[f64]| -> f64 {
                        let rb = self.b.as_ref().map_or(0.0, |bv| bv[d * 2 * g * h + g * h + row]);
                        (0..h).map(|k| src[k] * self.r[(d * g * h + row) * h + k]).sum::<f64>() + rb
                    };
                    let peep = |k: usize, j: usize| self.p.as_ref().map_or(0.0, |p| p[d * 3 * h + k * h + j]);
                    let new_h: Vec<f64> = match self.kind {
                        Kind::Rnn => (0..h).map(|j| act(0, xw(j) + hr(j, &hs))).collect(),
                        Kind::Gru { linear_before_reset } => {
                            let z: Vec<f64> = (0..h).map(|j| act(0, xw(j) + hr(j, &hs))).collect();
                            let r: Vec<f64> = (0..h).map(|j| act(0, xw(h + j) + hr(h + j, &hs))).collect();
                            let rh: Vec<f64> = (0..h).map(|j| r[j] * hs[j]).collect();
                            (0..h)
                                .map(|j| {
                                    let cand = if linear_before_reset { act(1, xw(2 * h + j) + r[j] * hr(2 * h + j, &hs)) } else { act(1, xw(2 * h + j) + hr(2 * h + j, &rh)) };
                                    (1.0 - z[j]) * cand + z[j] * hs[j]
                                })
                                .collect()
                        }
                        Kind::Lstm { input_forget } => {
                            let i: Vec<f64> = (0..h).map(|j| act(0, xw(j) + hr(j, &hs) + peep(0, j) * cs[j])).collect();
                            let f: Vec<f64> = (0..h).map(|j| if input_forget { 1.0 - i[j] } else { act(0, xw(2 * h + j) + hr(2 * h + j, &hs) + peep(2, j) * cs[j]) }).collect();
                            let c: Vec<f64> = (0..h).map(|j| act(1, xw(3 * h + j) + hr(3 * h + j, &hs))).collect();
                            cs = (0..h).map(|j| f[j] * cs[j] + i[j] * c[j]).collect();
                            let o: Vec<f64> = (0..h).map(|j| act(0, xw(h + j) + hr(h + j, &hs) + peep(1, j) * cs[j])).collect();
                            (0..h).map(|j| o[j] * act(2, cs[j])).collect()
                        }
                    };
                    hs = new_h;
                    let at = if self.batch_first { ((b * s + t) * dirs + d) * h } else { ((t * dirs + d) * n + b) * h };
                    y[at..at + h].copy_from_slice(&hs);
                }
                if len > 0 {
                    yh[state_at(d, b)..][..h].copy_from_slice(&hs);
                    yc[state_at(d, b)..][..h].copy_from_slice(&cs);
                }
            }
        }
        [y, yh, yc]
    }
}

fn strings(attrs: &[(&str, Attr)], name: &str) -> Vec<String> {
    attrs.iter().find(|(k, _)| *k == name).map_or(vec![], |(_, v)| if let Attr::Strings(s) = v { s.clone() } else { vec![] })
}

fn floats(attrs: &[(&str, Attr)], name: &str) -> Vec<f32> {
    attrs.iter().find(|(k, _)| *k == name).map_or(vec![], |(_, v)| if let Attr::Floats(s) = v { s.clone() } else { vec![] })
}

/// A random case of `kind` (sizes `(seq, batch, input, hidden)`) and its reference
/// problem.
#[allow(clippy::too_many_arguments)]
fn build(kind: Kind, direction: &str, layout: usize, (s, n, i, h): (usize, usize, usize, usize), opts: Opts, lens: Option<Vec<i32>>, attrs: &[(&str, Attr)], outputs: usize) -> (Case, Problem) {
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    let g = kind.gates();
    let is_lstm = matches!(kind, Kind::Lstm { .. });
    let batch_first = layout == 1;
    let x = rand(DType::F32, &if batch_first { [n, s, i] } else { [s, n, i] }, 1);
    let w = rand(DType::F32, &[dirs, g * h, i], 2);
    let r = rand(DType::F32, &[dirs, g * h, h], 3);
    let b = opts.bias.then(|| rand(DType::F32, &[dirs, 2 * g * h], 4));
    let state = if batch_first { [n, dirs, h] } else { [dirs, n, h] };
    let h0 = opts.initial.then(|| rand(DType::F32, &state, 5));
    let c0 = (opts.initial && is_lstm).then(|| rand(DType::F32, &state, 6));
    let p = (opts.peepholes && is_lstm).then(|| rand(DType::F32, &[dirs, 3 * h], 7));
    let lens_t = lens.as_ref().map(|l| Tensor::from_slice(&[n], l).unwrap());
    let mut inputs = vec![Input::Data(x.clone()), Input::Const(w.clone()), Input::Const(r.clone())];
    let opt = |t: &Option<Tensor>, data: bool| match t {
        Some(t) if data => Input::Data(t.clone()),
        Some(t) => Input::Const(t.clone()),
        None => Input::Omitted,
    };
    inputs.extend([opt(&b, false), opt(&lens_t, true), opt(&h0, true)]);
    if is_lstm {
        inputs.extend([opt(&c0, true), opt(&p, false)]);
    }
    while matches!(inputs.last(), Some(Input::Omitted)) {
        inputs.pop();
    }
    let mut case = Case::new(kind.op()).opset(14).attr("hidden_size", Attr::Int(h as i64)).attr("direction", Attr::String(direction.into())).attr("layout", Attr::Int(layout as i64));
    case = case.attrs(&kind.attrs()).attrs(attrs).inputs(inputs).outputs(outputs);
    let v = |t: &Tensor| t.to_f64_vec();
    let clip = attrs.iter().find(|(k, _)| *k == "clip").map(|(_, a)| if let Attr::Float(c) = a { *c as f64 } else { panic!() });
    let problem = Problem {
        kind,
        forward: if direction == "bidirectional" { vec![true, false] } else { vec![direction == "forward"] },
        batch_first,
        seq: s,
        batch: n,
        input: i,
        hidden: h,
        acts: activations(kind, dirs, &strings(attrs, "activations"), &floats(attrs, "activation_alpha"), &floats(attrs, "activation_beta")),
        clip,
        x: v(&x),
        w: v(&w),
        r: v(&r),
        b: b.as_ref().map(v),
        lens: lens.map_or(vec![s; n], |l| l.iter().map(|&v| v as usize).collect()),
        h0: h0.as_ref().map(v),
        c0: c0.as_ref().map(v),
        p: p.as_ref().map(v),
    };
    (case, problem)
}

fn assert_near(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (k, (a, b)) in g.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}: element {k} is {a}, expected {b}");
    }
}

/// Runs a random case of `kind` in f32 and f64 (CPU, and the WGSL validated) and
/// compares every output with the reference.
pub(crate) fn check(kind: Kind, direction: &str, layout: usize, sizes: (usize, usize, usize, usize), opts: Opts, lens: Option<Vec<i32>>, attrs: &[(&str, Attr)]) {
    let (case, problem) = build(kind, direction, layout, sizes, opts, lens, attrs, kind.max_outputs());
    let want = problem.solve();
    // The WGSL of other tunings validates too (the projection's tiles, the steps' workgroups).
    let tunes = [tune(&[("workgroup", 256), ("rows_per_thread", 1), ("wg_x", 16), ("wg_y", 4)]), tune(&[("workgroup", 32), ("rows_per_thread", 8)])];
    run(case.op().unwrap().as_ref(), &case.inputs, &tunes).unwrap_or_else(|e| panic!("{case}: {e}"));
    for (dtype, tol) in [(DType::F32, 3e-5), (DType::F64, 1e-12)] {
        let c = case.with_floats_as(dtype);
        let outs = c.run_cpu().unwrap_or_else(|e| panic!("{c}: {e}"));
        assert_eq!(outs.len(), kind.max_outputs());
        for (k, o) in outs.iter().enumerate() {
            assert_eq!(o.dtype(), dtype);
            assert_near(o, &want[k], tol, &format!("{c} output {k}"));
        }
    }
}

/// The first `outputs` outputs only (empty trailing output names), and hidden_size
/// taken from R when the attribute is absent.
pub(crate) fn check_outputs(kind: Kind, outputs: usize) {
    let (mut case, problem) = build(kind, "bidirectional", 0, (3, 2, 3, 4), Opts::ALL, Some(vec![3, 2]), &[], outputs);
    case.attrs.retain(|(k, _)| k != "hidden_size");
    let want = problem.solve();
    let outs = case.run_cpu().unwrap();
    assert_eq!(outs.len(), outputs);
    for (k, o) in outs.iter().enumerate() {
        assert_near(o, &want[k], 3e-5, &format!("{case} output {k}"));
    }
}

/// f16 and bf16 run through f32: within their precision of the reference.
pub(crate) fn check_dtypes(kind: Kind) {
    let (case, problem) = build(kind, "forward", 0, (3, 2, 3, 4), Opts::ALL, None, &[], kind.max_outputs());
    let want = problem.solve();
    for (dtype, tol) in [(DType::F16, 1e-2), (DType::BF16, 6e-2)] {
        let c = case.with_floats_as(dtype);
        for (k, o) in c.run_cpu().unwrap().iter().enumerate() {
            assert_eq!(o.dtype(), dtype);
            assert_near(o, &want[k], tol, &format!("{c} output {k}"));
        }
    }
}

/// Bad attributes and inputs give errors naming what was expected.
pub(crate) fn check_errors(kind: Kind) {
    let (case, _) = build(kind, "forward", 0, (3, 2, 3, 4), Opts::ALL, Some(vec![3, 1]), &[], kind.max_outputs());
    let g = kind.gates();
    let err = |c: Case| c.run_cpu().map(|_| ()).unwrap_err().to_string();
    let with_input = |i: usize, t: Tensor| {
        let mut c = case.clone();
        c.inputs[i] = if matches!(c.inputs[i], Input::Const(_)) { Input::Const(t) } else { Input::Data(t) };
        c
    };
    let f32s = |dims: &[usize]| rand(DType::F32, dims, 9);
    let cases: Vec<(Case, String)> = vec![
        (with_input(1, f32s(&[1, g * 4, 5])), format!("W must have shape [1, {}, 3]", g * 4)),
        (with_input(2, f32s(&[1, g * 4, 3])), format!("R must have shape [1, {}, 4]", g * 4)),
        (with_input(3, f32s(&[1, g * 4])), format!("B must have shape [1, {}]", 2 * g * 4)),
        (with_input(0, f32s(&[3, 2])), "X must be 3-D".into()),
        (with_input(5, f32s(&[1, 3, 4])), "initial_h must have shape [1, 2, 4]".into()),
        (with_input(4, Tensor::from_slice(&[2], &[4i32, 1]).unwrap()), "sequence_lens[0] is 4".into()),
        (with_input(4, Tensor::from_slice(&[2], &[3i64, 1]).unwrap()), "expected i32".into()),
        (with_input(1, rand(DType::F64, &[1, g * 4, 3], 9)), "differing from X's f32".into()),
        (case.clone().attr("hidden_size", Attr::Int(5)), format!("W must have shape [1, {}, 3]", g * 5)),
        (case.clone().attr("hidden_size", Attr::Int(0)), "hidden_size".into()),
        (case.clone().attr("activations", Attr::Strings(vec!["Swish".into(); kind.default_activations().len()])), "unknown activation 'Swish'".into()),
        (case.clone().attr("activations", Attr::Strings(vec!["Tanh".into(); 5])), "activations per direction".into()),
        (case.clone().attr("direction", Attr::String("sideways".into())), "direction".into()),
        (case.clone().attr("layout", Attr::Int(2)), "layout".into()),
        (case.clone().attr("clip", Attr::Float(-1.0)), "clip".into()),
        (case.clone().outputs(kind.max_outputs() + 1), "outputs".into()),
    ];
    for (c, want) in cases {
        let e = err(c.clone());
        assert!(e.contains(&want), "{c}: error '{e}' does not say '{want}'");
    }
    // Errors from inputs name the op.
    let e = err(with_input(1, f32s(&[1, 1, 1])));
    assert!(e.contains(kind.op()), "{e}");
}
