//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12/13). Input
//! `(N, C, d1..dk)` holds log-probabilities (NLL) or scores (SCE, which takes a
//! log-softmax over C first, optionally returned as output 1 `log_prob`); target
//! `(N, d1..dk)` holds class indices. Each position's loss is `-logp[target] *
//! weight[target]` (weight 1 without the `weight` input; 0 where target ==
//! `ignore_index`). `reduction`: none (per position), sum, or mean (the sum divided by
//! the sum of the position weights). WGSL: one invocation per position, then, for sum
//! and mean, one workgroup of lanes folding the losses and weights (scratch buffers).
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

#[derive(Debug)]
pub struct Loss {
    /// SoftmaxCrossEntropyLoss (a log-softmax first) rather than NLL.
    softmax: bool,
    reduction: Reduction,
    ignore_index: Option<i64>,
}

/// (N, C, positions per sample) of an input of dims `x`.
fn layout(x: &[usize]) -> (usize, usize, usize) {
    (x[0], x[1], x[2..].iter().product())
}

impl Loss {
    fn parse(spec: &NodeSpec, softmax: bool) -> Result<Loss> {
        let reduction = match spec.string("reduction", "mean")?.as_str() {
            "none" => Reduction::None,
            "sum" => Reduction::Sum,
            "mean" => Reduction::Mean,
            other => return Err(spec.bad("reduction", format!("expected none, sum or mean, found '{other}'"))),
        };
        Ok(Loss { softmax, reduction, ignore_index: spec.int_opt("ignore_index")? })
    }
}

impl Op for Loss {
    fn name(&self) -> &str {
        if self.softmax { "SoftmaxCrossEntropyLoss" } else { "NegativeLogLikelihoodLoss" }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        expect_dtype(inputs, 1, &[DType::I64, DType::I32])?;
        let (x, t) = (required(inputs, 0)?, required(inputs, 1)?);
        if x.rank() < 2 {
            return Err(OpError::input(0, format!("expected (N, C, d1..dk), found shape {:?}", x.dims())));
        }
        let want: Vec<usize> = [x.dims()[0]].into_iter().chain(x.dims()[2..].iter().copied()).collect();
        if t.dims() != want {
            return Err(OpError::input(1, format!("target must have shape (N, d1..dk) = {want:?}, found {:?}", t.dims())));
        }
        if let Some(w) = inputs.get(2).copied().flatten() {
            if w.dims() != [x.dims()[1]] || w.dtype() != dtype {
                return Err(OpError::input(2, format!("weight must be a {dtype} vector of {} (the classes), found {}", x.dims()[1], w.ty)));
            }
        }
        let loss = if self.reduction == Reduction::None { want } else { vec![] };
        Ok(vec![TensorType::new(dtype, loss), TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let n = inputs.first().copied().flatten().map_or(0, |x| x.ty.len()) as u64;
        Cost { flops: if self.softmax { 4 * n } else { n }, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Loss {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (n, c, inner) = layout(x.dims());
        let target = cpu::input(inputs, 1)?.to_i64_vec()?;
        let weight = inputs.get(2).copied().flatten().map(|w| w.to_f64_vec());
        let mut xs = x.to_f64_vec();
        if self.softmax {
            // Log-softmax over C at each position, in place.
            for p in 0..n * inner {
                let at = |k: usize| (p / inner) * c * inner + k * inner + p % inner;
                let m = (0..c).map(|k| xs[at(k)]).fold(f64::NEG_INFINITY, f64::max);
                let lse = m + (0..c).map(|k| (xs[at(k)] - m).exp()).sum::<f64>().ln();
                for k in 0..c {
                    xs[at(k)] -= lse;
                }
            }
            if let Some(out) = outputs.get_mut(1) {
                *out = Tensor::from_f64(x.dtype(), x.dims(), &xs)?;
            }
        }
        let positions = n * inner;
        let mut losses = vec![0f64; positions];
        let mut weights = vec![0f64; positions];
        for p in 0..positions {
            let t = target[p];
            if Some(t) == self.ignore_index {
                continue;
            }
            if t < 0 || t >= c as i64 {
                return Err(OpError::input(1, format!("target {t} at position {p} is not a class in [0, {c}) (nor ignore_index)")));
            }
            let w = weight.as_ref().map_or(1.0, |w| w[t as usize]);
            losses[p] = -xs[(p / inner) * c * inner + t as usize * inner + p % inner] * w;
            weights[p] = w;
        }
        let out = match self.reduction {
            Reduction::None => losses,
            Reduction::Sum => vec![losses.iter().sum()],
            Reduction::Mean => vec![losses.iter().sum::<f64>() / weights.iter().sum::<f64>()],
        };
        let dims = outputs[0].dims().to_vec();
        outputs[0] = Tensor::from_f64(x.dtype(), &dims, &out)?;
        Ok(())
    }
}

impl WgslKernel for Loss {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (n, c, inner) = layout(x.dims());
        let positions = n * inner;
        if positions == 0 || c == 0 {
            return Err(OpError::Unsupported(format!("{} over an empty input", self.name())));
        }
        if self.softmax && 3 * c > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("{} over {c} classes exceeds the GPU loop budget", self.name())));
        }
        let wg = tune.get(&wgsl::workgroup_param());
        let has_weight = inputs.get(2).copied().flatten().is_some();
        let log_prob = self.softmax && outputs.len() > 1;
        let reduce = self.reduction != Reduction::None;
        let mut buffers = vec![("x", "f32", true), ("labels", "i32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        if has_weight {
            buffers.push(("weight", "f32", true));
            bindings.push(Binding::Input(2));
        }
        if reduce {
            buffers.extend([("losses", "f32", false), ("weights", "f32", false)]);
            bindings.extend([Binding::Scratch(0), Binding::Scratch(1)]);
        } else {
            buffers.push(("losses", "f32", false));
            bindings.push(Binding::Output(0));
        }
        if log_prob {
            buffers.push(("log_prob", "f32", false));
            bindings.push(Binding::Output(1));
        }
        let mut body = format!("let base = (i / {inner}u) * {}u + i % {inner}u;\n", c * inner);
        let cl = format!("{c}u");
        if self.softmax {
            body += &format!("    var m = {};\n    ", wgsl::literal("f32", f64::NEG_INFINITY));
            body += &wgsl::for_loop("k", "0u", &cl, "1u", &format!("m = max(m, x[base + k * {inner}u]);"));
            body += "    var s = 0.0;\n    ";
            body += &wgsl::for_loop("k", "0u", &cl, "1u", &format!("s = s + exp(x[base + k * {inner}u] - m);"));
            body += "    let lse = m + log(s);\n";
            if log_prob {
                body += "    ";
                body += &wgsl::for_loop("k", "0u", &cl, "1u", &format!("log_prob[base + k * {inner}u] = x[base + k * {inner}u] - lse;"));
            }
        } else {
            body += "    let lse = 0.0;\n";
        }
        let w = if has_weight { "weight[tc]" } else { "1.0" };
        let _ = std::fmt::Write::write_fmt(
            &mut body,
            format_args!(
                "    let t = labels[i];\n    let ignored = {};\n    \
                 if (!ignored && (t < 0i || t >= {c}i)) {{ {} }}\n    \
                 let tc = select(u32(t), 0u, ignored || t < 0i || t >= {c}i);\n    var w = {w};\n    \
                 if (ignored) {{ w = 0.0; }}\n    let l = -(x[base + tc * {inner}u] - lse) * w;\n",
                match self.ignore_index {
                    Some(ii) => format!("t == {}", wgsl::literal("i32", ii as f64)),
                    None => "false".to_string(),
                },
                wgsl::report_index_error("t", &format!("{c}i")),
            ),
        );
        let status = bindings.len();
        bindings.push(Binding::Status);
        body += "    losses[i] = select(l, 0.0, w == 0.0);\n";
        if reduce {
            body += "    weights[i] = w;\n";
        }
        let mut prog = WgslProgram::single(wgsl::simple_kernel(self.name(), positions, wg, &buffers, bindings, &wgsl::status_decl(status), &body));
        if reduce {
            prog.scratch_bytes = vec![positions as u64 * 4, positions as u64 * 4];
            let lanes = plane_lanes(self.name(), positions, 2, 2)?;
            let sum = "red[lid.x] + red[lid.x + w]";
            let result = if self.reduction == Reduction::Mean { "total / red[0]" } else { "total" };
            let body = format!(
                "var t = 0.0;\n    {}    {}    let total = red[0];\n    workgroupBarrier();\n    t = 0.0;\n    {}    {}    if (lid.x == 0u) {{ out[0] = {result}; }}",
                lane_loop(positions, lanes, "t = t + losses[j];"),
                tree(lanes, sum),
                lane_loop(positions, lanes, "t = t + weights[j];"),
                tree(lanes, sum),
            );
            let buffers = [("losses", "f32", false), ("weights", "f32", false), ("out", "f32", false)];
            let bindings = vec![Binding::Scratch(0), Binding::Scratch(1), Binding::Output(0)];
            prog.dispatches.push(lanes_dispatch(&format!("{} reduce", self.name()), 1, lanes, &buffers, bindings, &body));
        }
        Ok(prog)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "NegativeLogLikelihoodLoss", |spec| Ok(Box::new(Loss::parse(spec, false)?)));
    r.register("", "SoftmaxCrossEntropyLoss", |spec| Ok(Box::new(Loss::parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    /// Naive reference: (loss, log_prob).
    fn reference(x: &Tensor, target: &[i64], weight: Option<&[f64]>, reduction: &str, ii: Option<i64>, softmax: bool) -> (Vec<f64>, Vec<f64>) {
        let d = x.dims();
        let (n, c) = (d[0], d[1]);
        let inner: usize = d[2..].iter().product();
        let mut xv = x.to_f64_vec();
        if softmax {
            for b in 0..n {
                for p in 0..inner {
                    let idx = |k: usize| (b * c + k) * inner + p;
                    let s: f64 = (0..c).map(|k| xv[idx(k)].exp()).sum();
                    let ls = s.ln();
                    for k in 0..c {
                        xv[idx(k)] -= ls;
                    }
                }
            }
        }
        let (mut losses, mut wsum) = (vec![], 0.0);
        for b in 0..n {
            for p in 0..inner {
                let t = target[b * inner + p];
                if Some(t) == ii {
                    losses.push(0.0);
                    continue;
                }
                let w = weight.map_or(1.0, |w| w[t as usize]);
                wsum += w;
                losses.push(-xv[(b * c + t as usize) * inner + p] * w);
            }
        }
        let loss = match reduction {
            "none" => losses,
            "sum" => vec![losses.iter().sum()],
            _ => vec![losses.iter().sum::<f64>() / wsum],
        };
        (loss, xv)
    }

    #[test]
    fn losses_match_the_reference() {
        for dims in [vec![3usize, 5], vec![2, 4, 3], vec![2, 3, 2, 5]] {
            let (n, c) = (dims[0], dims[1]);
            let inner: usize = dims[2..].iter().product();
            let x = rand_f32(&dims, 1);
            let target: Vec<i64> = (0..n * inner).map(|i| ((i * 7 + 1) % c) as i64).collect();
            let mut tdims = vec![n];
            tdims.extend_from_slice(&dims[2..]);
            let tt = Tensor::from_slice(&tdims, &target).unwrap();
            let w = Tensor::from_slice(&[c], &(0..c).map(|k| 0.5 + k as f32 * 0.25).collect::<Vec<_>>()).unwrap();
            let wv = w.to_f64_vec();
            for (op, softmax) in [("NegativeLogLikelihoodLoss", false), ("SoftmaxCrossEntropyLoss", true)] {
                for reduction in ["none", "sum", "mean"] {
                    for ii in [None, Some(target[0])] {
                        for weighted in [false, true] {
                            let mut attrs = vec![("reduction", Attr::String(reduction.into()))];
                            if let Some(ii) = ii {
                                attrs.push(("ignore_index", Attr::Int(ii)));
                            }
                            let inputs = if weighted { vec![Some(&x), Some(&tt), Some(&w)] } else { vec![Some(&x), Some(&tt)] };
                            let outs = if softmax { 2 } else { 1 };
                            let got = run(make(op, 19, &attrs, inputs.len(), outs).unwrap().as_ref(), &as_inputs(&inputs, &[]), &[]).unwrap();
                            let (loss, lp) = reference(&x, &target, weighted.then_some(&wv[..]), reduction, ii, softmax);
                            let what = format!("{op} {dims:?} {reduction} ii={ii:?} weighted={weighted}");
                            assert_close(&got[0], &loss, 1e-5, &what);
                            if softmax {
                                assert_close(&got[1], &lp, 1e-5, &what);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_targets_and_shapes_are_errors() {
        let x = rand_f32(&[2, 3], 1);
        let bad = Tensor::from_slice(&[2], &[0i64, 3]).unwrap();
        let op = make("NegativeLogLikelihoodLoss", 19, &[], 2, 1).unwrap();
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&bad)], &[]), &[]).unwrap_err().to_string().contains("not a class"));
        let wrong = Tensor::from_slice(&[3], &[0i64, 1, 2]).unwrap();
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&wrong)], &[]), &[]).unwrap_err().to_string().contains("(N, d1..dk)"));
        assert!(make("SoftmaxCrossEntropyLoss", 19, &[("reduction", Attr::String("max".into()))], 2, 1).is_err());
    }
}
