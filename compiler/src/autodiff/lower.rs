//! Before differentiation: ops whose training form Kiln has no kernel for, or whose
//! gradient is simplest through their parts, become primitives.
//!
//! - BatchNormalization in training mode: batch statistics, normalisation, and the
//!   running statistics updated as its extra outputs (PyTorch's convention: the
//!   running variance takes the unbiased batch variance). Synchronized across
//!   data-parallel workers when asked: the statistics' sums are all-reduced.
//! - LayerNormalization: statistics over the trailing axes, with its optional Mean and
//!   InvStdDev outputs.
//! - Dropout in training mode: the input times a `kiln.DropoutMask` drawn from the
//!   graph input [`DROPOUT_SEED`] (a new seed each step), one stream per node.
//! - SoftmaxCrossEntropyLoss: LogSoftmax, then NegativeLogLikelihoodLoss.
use super::emit::Emit;
use super::parallel::{self, DataParallel};
use super::rules::{axis, float_attr, input, int_attr};
use super::{replace_uses, Result};
use kiln_graph::{DType, Node, ValueId};
use kiln_ops::TensorType;
use std::collections::HashMap;

/// The scalar int64 input that seeds training-mode dropout (one value per step).
pub const DROPOUT_SEED: &str = "kiln.dropout_seed";

/// What lowering did.
pub struct Lowered {
    /// The values that replace the lowered nodes' outputs (every read of them is
    /// redirected already).
    pub subst: HashMap<ValueId, ValueId>,
    /// The dropout seed input, when the graph has training-mode dropout.
    pub seed: Option<ValueId>,
}

/// Lowers the nodes of `e`'s graph in place; the graph's nodes are left in a
/// topological order. With `sync`, BatchNormalization's statistics are those of the
/// global batch.
pub fn lower(e: &mut Emit, sync: Option<&DataParallel>) -> Result<Lowered> {
    let nodes = std::mem::take(&mut e.graph.nodes);
    let mut subst = HashMap::new();
    let mut seed = None;
    let mut streams = 0;
    for n in nodes {
        match n.op_type.as_str() {
            "Dropout" if n.domain.is_empty() && dropout_ratio(e, &n).is_some() => {
                dropout(e, &n, &mut subst, &mut seed, streams)?;
                streams += 1;
            }
            "BatchNormalization" if n.domain.is_empty() && is_training_bn(&n) => batch_norm(e, &n, &mut subst, sync)?,
            "LayerNormalization" if n.domain.is_empty() => layer_norm(e, &n, &mut subst)?,
            "SoftmaxCrossEntropyLoss" if n.domain.is_empty() => softmax_cross_entropy(e, &n, &mut subst)?,
            _ => e.graph.nodes.push(n),
        }
    }
    for (&old, &new) in &subst {
        replace_uses(e.graph, old, new);
    }
    let order = e.graph.validate().map_err(|err| super::AutodiffError::Model(err.to_string()))?;
    let mut nodes = std::mem::take(&mut e.graph.nodes);
    let mut sorted: Vec<Option<Node>> = nodes.drain(..).map(Some).collect();
    e.graph.nodes = order.into_iter().map(|i| sorted[i].take().expect("each node once")).collect();
    e.set_scope("");
    Ok(Lowered { subst, seed })
}

/// Training mode: `training_mode=1` (opset 14+), or the running statistics asked for
/// as outputs (older opsets).
pub fn is_training_bn(n: &Node) -> bool {
    int_attr(n, "training_mode", 0) != 0 || n.outputs.len() > 1
}

/// Mean and variance (biased) over `axes`, kept as size-1 dims, and `1/sqrt(var+eps)`.
/// With `global`, the sums are all-reduced across workers and divided by the global
/// element count `global`.
fn moments(e: &mut Emit, x: ValueId, axes: &[usize], eps: f32, global: Option<usize>) -> Result<(ValueId, ValueId, ValueId, ValueId)> {
    let xd = e.dims(x);
    let count: usize = global.unwrap_or_else(|| axes.iter().map(|&a| xd[a]).product());
    let sum = |e: &mut Emit, v: ValueId| -> Result<ValueId> {
        let s = e.reduce_sum(v, axes, true)?;
        Ok(if global.is_some() { parallel::all_reduce(e, &[s], false)?[0] } else { s })
    };
    let s = sum(e, x)?;
    let mean = e.scale(s, 1.0 / count as f64)?;
    let d = e.sub(x, mean)?;
    let d2 = e.mul(d, d)?;
    let s2 = sum(e, d2)?;
    let var = e.scale(s2, 1.0 / count as f64)?;
    let epsv = e.scalar(eps as f64, e.dtype(x));
    let ve = e.add(var, epsv)?;
    let sd = e.op("Sqrt", &[ve], &[])?;
    let one = e.scalar(1.0, e.dtype(x));
    let inv = e.div(one, sd)?;
    Ok((mean, var, d, inv))
}

fn batch_norm(e: &mut Emit, n: &Node, subst: &mut HashMap<ValueId, ValueId>, sync: Option<&DataParallel>) -> Result<()> {
    e.set_scope(n.name.clone());
    let (x, scale, bias, rmean, rvar) = (input(n, 0), input(n, 1), input(n, 2), input(n, 3), input(n, 4));
    let xd = e.dims(x);
    let c = xd[1];
    let axes: Vec<usize> = std::iter::once(0).chain(2..xd.len()).collect();
    let mut count: usize = axes.iter().map(|&a| xd[a]).product();
    let global = match sync {
        Some(dp) if xd[0] != dp.rows => {
            return Err(super::AutodiffError::Model(format!(
                "synchronized BatchNormalization: node '{}' normalises {} rows, but this worker trains on {} rows of the global batch",
                n.name, xd[0], dp.rows
            )))
        }
        Some(dp) => {
            count = count / dp.rows * dp.global_batch;
            Some(count)
        }
        None => None,
    };
    let eps = float_attr(n, "epsilon", 1e-5);
    let momentum = float_attr(n, "momentum", 0.9) as f64;
    let (mean, var, d, inv) = moments(e, x, &axes, eps, global)?;
    let mut bshape = vec![1; xd.len()];
    bshape[1] = c;
    let xhat = e.mul(d, inv)?;
    let sr = e.reshape(scale, &bshape)?;
    let br = e.reshape(bias, &bshape)?;
    let ys = e.mul(xhat, sr)?;
    let y = e.add(ys, br)?;
    subst.insert(n.outputs[0], y);
    // Running statistics: r * momentum + batch * (1 - momentum), the variance unbiased.
    if let Some(&out_mean) = n.outputs.get(1) {
        let m = e.reshape(mean, &[c])?;
        let new = blend(e, rmean, m, momentum, 1.0)?;
        subst.insert(out_mean, new);
    }
    if let Some(&out_var) = n.outputs.get(2) {
        let v = e.reshape(var, &[c])?;
        let unbias = if count > 1 { count as f64 / (count - 1) as f64 } else { 1.0 };
        let new = blend(e, rvar, v, momentum, unbias)?;
        subst.insert(out_var, new);
    }
    Ok(())
}

/// `running * momentum + batch * factor * (1 - momentum)`.
fn blend(e: &mut Emit, running: ValueId, batch: ValueId, momentum: f64, factor: f64) -> Result<ValueId> {
    let a = e.scale(running, momentum)?;
    let b = e.scale(batch, factor * (1.0 - momentum))?;
    e.add(a, b)
}

fn layer_norm(e: &mut Emit, n: &Node, subst: &mut HashMap<ValueId, ValueId>) -> Result<()> {
    e.set_scope(n.name.clone());
    let (x, scale) = (input(n, 0), input(n, 1));
    let r = e.rank(x);
    let first = axis(int_attr(n, "axis", -1), r);
    let axes: Vec<usize> = (first..r).collect();
    let (mean, _, d, inv) = moments(e, x, &axes, float_attr(n, "epsilon", 1e-5), None)?;
    let xhat = e.mul(d, inv)?;
    let mut y = e.mul(xhat, scale)?;
    if let Some(b) = n.inputs.get(2).copied().flatten() {
        y = e.add(y, b)?;
    }
    subst.insert(n.outputs[0], y);
    if let Some(&m) = n.outputs.get(1) {
        subst.insert(m, mean);
    }
    if let Some(&s) = n.outputs.get(2) {
        subst.insert(s, inv);
    }
    Ok(())
}

/// SoftmaxCrossEntropyLoss as LogSoftmax over the class axis and
/// NegativeLogLikelihoodLoss (same reduction, ignore_index and weights); its optional
/// `log_prob` output is the LogSoftmax.
fn softmax_cross_entropy(e: &mut Emit, n: &Node, subst: &mut HashMap<ValueId, ValueId>) -> Result<()> {
    e.set_scope(n.name.clone());
    let logp = e.op("LogSoftmax", &[input(n, 0)], &[("axis", kiln_graph::Attr::Int(1))])?;
    let mut ins = vec![Some(logp), n.inputs.get(1).copied().flatten()];
    ins.extend(n.inputs.get(2).copied());
    let attrs: Vec<(&str, kiln_graph::Attr)> = n.attrs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let loss = e.node("", "NegativeLogLikelihoodLoss", &ins, &attrs, 1)?[0];
    subst.insert(n.outputs[0], loss);
    if let Some(&lp) = n.outputs.get(1) {
        subst.insert(lp, logp);
    }
    Ok(())
}

/// The ratio of a Dropout in training mode (its `training_mode` input a constant
/// true), else `None` (inference: the identity, which Kiln's Dropout op runs).
fn dropout_ratio(e: &Emit, n: &Node) -> Option<f32> {
    let training = n.inputs.get(2).copied().flatten().and_then(|v| e.value(v)).and_then(|t| t.to_i64_vec().ok()).is_some_and(|v| v.first() == Some(&1));
    if !training {
        return None;
    }
    Some(match n.inputs.get(1).copied().flatten() {
        Some(r) => e.value(r).map(|t| t.to_f64_vec()).and_then(|v| v.first().copied()).unwrap_or(0.5) as f32,
        None => 0.5,
    })
}

fn dropout(e: &mut Emit, n: &Node, subst: &mut HashMap<ValueId, ValueId>, seed: &mut Option<ValueId>, stream: i64) -> Result<()> {
    e.set_scope(n.name.clone());
    let ratio = dropout_ratio(e, n).expect("checked by the caller");
    if !(0.0..1.0).contains(&ratio) {
        return Err(super::AutodiffError::Model(format!("node '{}' (Dropout): ratio {ratio} is outside [0, 1)", n.name)));
    }
    let x = input(n, 0);
    let dims = e.dims(x);
    let s = match *seed {
        Some(s) => s,
        None => {
            let s = e.value_of_type(DROPOUT_SEED, TensorType::new(DType::I64, vec![]));
            e.graph.inputs.push(s);
            *seed = Some(s);
            s
        }
    };
    let shape = e.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
    let attrs = [("ratio", kiln_graph::Attr::Float(ratio)), ("stream", kiln_graph::Attr::Int(stream))];
    let mask = e.node("kiln", "DropoutMask", &[Some(shape), Some(s)], &attrs, 1)?[0];
    let mask = if e.dtype(x) == DType::F32 { mask } else { e.op("Cast", &[mask], &[("to", kiln_graph::Attr::Int(e.dtype(x).onnx_code() as i64))])? };
    let y = e.mul(x, mask)?;
    subst.insert(n.outputs[0], y);
    if let Some(&m) = n.outputs.get(1) {
        let zero = e.scalar(0.0, e.dtype(mask));
        let kept = e.op("Greater", &[mask, zero], &[])?;
        subst.insert(m, kept);
    }
    Ok(())
}
