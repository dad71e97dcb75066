//! BatchNormalization folded into the Conv before it: with constant statistics,
//! `BN(Conv(x, W, b))` is `Conv(x, W', b')` where each output channel's filter is
//! scaled by `s = scale / sqrt(var + eps)` and `b' = (b - mean) * s + B`. The Conv's
//! result must have no other reader. New weights are written (the old ones may be
//! shared) and dead-code elimination drops the unused ones.
use super::use_counts;
use kiln_graph::{Attr, Graph, Tensor};

fn f64s(g: &Graph, v: Option<usize>) -> Option<Vec<f64>> {
    g.initializers.get(&v?).map(|t| t.to_f64_vec())
}

/// Folds BatchNormalization into preceding Convs; returns how many.
pub fn fold_batchnorm(g: &mut Graph) -> usize {
    let uses = use_counts(g);
    let mut dead = vec![];
    for bn in 0..g.nodes.len() {
        let node = &g.nodes[bn];
        if node.op_type != "BatchNormalization" || !node.domain.is_empty() || node.inputs.len() < 5 {
            continue;
        }
        if matches!(node.attrs.get("training_mode"), Some(Attr::Int(t)) if *t != 0) || node.outputs.len() > 1 {
            continue;
        }
        let eps = match node.attrs.get("epsilon") {
            Some(Attr::Float(e)) => *e as f64,
            _ => 1e-5,
        };
        let Some(y) = node.inputs[0] else { continue };
        let (Some(scale), Some(shift), Some(mean), Some(var)) =
            (f64s(g, node.inputs[1]), f64s(g, node.inputs[2]), f64s(g, node.inputs[3]), f64s(g, node.inputs[4]))
        else {
            continue;
        };
        let Some(c) = g.nodes.iter().position(|n| n.outputs.first() == Some(&y)) else { continue };
        let conv = &g.nodes[c];
        if conv.op_type != "Conv" || !conv.domain.is_empty() || uses[y] != 1 || conv.attrs.contains_key(kiln_ops::elementwise::ACTIVATION_ATTR) {
            continue;
        }
        let Some(w) = conv.inputs.get(1).copied().flatten().and_then(|v| g.initializers.get(&v)) else { continue };
        let m = w.dims().first().copied().unwrap_or(0);
        if [scale.len(), shift.len(), mean.len(), var.len()].iter().any(|&l| l != m) || m == 0 {
            continue;
        }
        let bias = match conv.inputs.get(2).copied().flatten() {
            Some(b) => match f64s(g, Some(b)) {
                Some(b) if b.len() == m => b,
                _ => continue,
            },
            None => vec![0.0; m],
        };
        let s: Vec<f64> = (0..m).map(|k| scale[k] / (var[k] + eps).sqrt()).collect();
        let per = w.len() / m;
        let wv: Vec<f64> = w.to_f64_vec().iter().enumerate().map(|(i, &x)| x * s[i / per.max(1)]).collect();
        let bv: Vec<f64> = (0..m).map(|k| (bias[k] - mean[k]) * s[k] + shift[k]).collect();
        let (Ok(w2), Ok(b2)) = (Tensor::from_f64(w.dtype(), w.dims(), &wv), Tensor::from_f64(w.dtype(), &[m], &bv)) else { continue };
        let conv_name = conv.name.clone();
        let wid = g.add_value(format!("{conv_name}.folded_weight"), None);
        let bid = g.add_value(format!("{conv_name}.folded_bias"), None);
        g.initializers.insert(wid, w2);
        g.initializers.insert(bid, b2);
        let out = g.nodes[bn].outputs[0];
        let conv = &mut g.nodes[c];
        conv.inputs.resize(3, None);
        conv.inputs[1] = Some(wid);
        conv.inputs[2] = Some(bid);
        conv.outputs[0] = out;
        dead.push(bn);
    }
    super::remove_nodes(g, &dead);
    dead.len()
}
