//! The ONNX loss ops. SoftmaxCrossEntropyLoss is lowered to LogSoftmax and
//! NegativeLogLikelihoodLoss before differentiation (`lower.rs`); this is the rule of
//! the latter: each position's gradient is `-weight[target] * dy` (scaled by the mean's
//! denominator) at its target class, zero elsewhere and where the target is ignored.
use super::{input, unsupported, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Attr, DType, Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[("NegativeLogLikelihoodLoss", nll)];

fn nll(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let mut out = vec![None; need.len()];
    if !need[0] {
        return Ok(out);
    }
    let (x, t) = (input(n, 0), input(n, 1));
    let (xd, dtype) = (e.dims(x), e.dtype(x));
    let c = xd[1];
    let reduction = match n.attr("reduction") {
        Some(Attr::String(s)) => s.clone(),
        _ => "mean".into(),
    };
    let ignore = match n.attr("ignore_index") {
        Some(Attr::Int(i)) => Some(*i),
        _ => None,
    };
    let t = if e.dtype(t) == DType::I64 { t } else { e.op("Cast", &[t], &[("to", Attr::Int(DType::I64.onnx_code() as i64))])? };
    let td = e.dims(t);
    // The target class at each position, as a one-hot over the class axis (1).
    let mut at_class = td.clone();
    at_class.insert(1, 1);
    let tu = e.reshape(t, &at_class)?;
    let mut range_dims = vec![1; xd.len()];
    range_dims[1] = c;
    let range = e.ints(&(0..c as i64).collect::<Vec<_>>());
    let range = e.reshape(range, &range_dims)?;
    let hit = e.op("Equal", &[tu, range], &[])?;
    let onehot = e.op("Cast", &[hit], &[("to", Attr::Int(dtype.onnx_code() as i64))])?;
    // Each position's weight: weight[target] (1 without weights), 0 where ignored.
    let keep = match ignore {
        Some(i) => {
            let iv = e.constant(kiln_graph::Tensor::scalar(i));
            let is = e.op("Equal", &[t, iv], &[])?;
            Some(e.op("Not", &[is], &[])?)
        }
        None => None,
    };
    let mut w = match n.inputs.get(2).copied().flatten() {
        Some(weights) => {
            // An ignored target may be no class at all: gather class 0 there instead.
            let safe = match keep {
                Some(k) => {
                    let zero = e.constant(kiln_graph::Tensor::scalar(0i64));
                    e.op("Where", &[k, t, zero], &[])?
                }
                None => t,
            };
            Some(e.op("Gather", &[weights, safe], &[("axis", Attr::Int(0))])?)
        }
        None => None,
    };
    if let Some(k) = keep {
        let kf = e.op("Cast", &[k], &[("to", Attr::Int(dtype.onnx_code() as i64))])?;
        w = Some(match w {
            Some(w) => e.mul(w, kf)?,
            None => kf,
        });
    }
    let g = dy[0].ok_or_else(|| unsupported(n, "no gradient reaches the loss"))?;
    let g = match reduction.as_str() {
        "none" | "sum" => g,
        "mean" => match w {
            Some(w) => {
                let all: Vec<usize> = (0..td.len()).collect();
                let den = e.reduce_sum(w, &all, false)?;
                e.div(g, den)?
            }
            None => e.scale(g, 1.0 / td.iter().product::<usize>().max(1) as f64)?,
        },
        other => return Err(unsupported(n, format!("reduction '{other}'"))),
    };
    let coef = match w {
        Some(w) => e.mul(g, w)?,
        None => g,
    };
    let coef = e.neg(coef)?;
    let coef = if e.rank(coef) == 0 { coef } else { e.reshape(coef, &at_class)? };
    out[0] = Some(e.mul(onehot, coef)?);
    Ok(out)
}
