//! Data movement: reshapes, Transpose, Concat/Split, Slice, Gather (a scatter-add),
//! Expand.
use super::{axis, const_ints, input, int_attr, ints_attr, unsupported, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Attr, Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Reshape", reshape),
    ("Flatten", reshape),
    ("Squeeze", reshape),
    ("Unsqueeze", reshape),
    ("Transpose", transpose),
    ("Concat", concat),
    ("Split", split),
    ("Slice", slice),
    ("Gather", gather),
    ("Expand", expand),
    ("Trilu", trilu),
];

/// Every op that only reinterprets its input's dims: dy takes the input's dims back.
fn reshape(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let xd = e.dims(input(n, 0));
    let mut out = vec![Some(e.reshape(dy[0].unwrap(), &xd)?)];
    out.resize(need.len(), None);
    Ok(out)
}

fn transpose(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let r = e.rank(input(n, 0));
    let perm: Vec<usize> = ints_attr(n, "perm").map(|p| p.iter().map(|&x| x as usize).collect()).unwrap_or_else(|| (0..r).rev().collect());
    let mut inv = vec![0; r];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(vec![Some(e.transpose(dy[0].unwrap(), &inv)?)])
}

fn concat(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let r = e.rank(n.outputs[0]);
    let ax = axis(int_attr(n, "axis", 0), r);
    let sizes: Vec<i64> = n.inputs.iter().map(|v| e.dims(v.unwrap())[ax] as i64).collect();
    let axis_attr = ("axis", Attr::Int(ax as i64));
    let parts = if e.graph.opset() < 13 {
        e.node("", "Split", &[dy[0]], &[axis_attr, ("split", Attr::Ints(sizes.clone()))], sizes.len())?
    } else {
        let split = e.ints(&sizes);
        e.node("", "Split", &[dy[0], Some(split)], &[axis_attr], sizes.len())?
    };
    Ok(parts.into_iter().zip(need).map(|(p, &nd)| nd.then_some(p)).collect())
}

fn split(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let r = e.rank(input(n, 0));
    let ax = axis(int_attr(n, "axis", 0), r);
    let mut parts = vec![];
    for (i, g) in dy.iter().enumerate() {
        parts.push(match g {
            Some(g) => *g,
            None => {
                let d = e.dims(n.outputs[i]);
                e.zeros(e.dtype(n.outputs[i]), &d)?
            }
        });
    }
    let mut out = vec![Some(e.op("Concat", &parts, &[("axis", Attr::Int(ax as i64))])?)];
    out.resize(need.len(), None);
    Ok(out)
}

fn slice(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let x = input(n, 0);
    let xd = e.dims(x);
    let r = xd.len();
    let get = |e: &Emit, i: usize| -> Result<Option<Vec<i64>>> {
        match n.inputs.get(i).copied().flatten() {
            Some(v) => const_ints(e, v).map(Some).ok_or_else(|| unsupported(n, "starts, ends, axes or steps computed at run time")),
            None => Ok(None),
        }
    };
    let (starts, _ends, axes, steps) = if e.graph.opset() >= 10 {
        let starts = get(e, 1)?.unwrap_or_default();
        let ends = get(e, 2)?.unwrap_or_default();
        let axes = get(e, 3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = get(e, 4)?.unwrap_or_else(|| vec![1; starts.len()]);
        (starts, ends, axes, steps)
    } else {
        let starts = ints_attr(n, "starts").unwrap_or_default();
        let axes = ints_attr(n, "axes").unwrap_or_else(|| (0..starts.len() as i64).collect());
        (starts.clone(), ints_attr(n, "ends").unwrap_or_default(), axes, vec![1; starts.len()])
    };
    // The slice as zero padding of dy: before = start, after = what is left.
    let mut pads = vec![0i64; 2 * r];
    let out = e.dims(n.outputs[0]);
    for k in 0..starts.len() {
        if steps[k] != 1 {
            return Err(unsupported(n, format!("step {} (only step 1 has a gradient)", steps[k])));
        }
        let a = axis(axes[k], r);
        let d = xd[a] as i64;
        let s = if starts[k] < 0 { starts[k].saturating_add(d) } else { starts[k] }.clamp(0, d);
        pads[a] = s;
        pads[a + r] = d - s - out[a] as i64;
    }
    let pads = e.ints(&pads);
    let mut res = vec![Some(e.op("Pad", &[dy[0].unwrap(), pads], &[])?)];
    res.resize(need.len(), None);
    Ok(res)
}

fn gather(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (data, idx) = (input(n, 0), input(n, 1));
    let dd = e.dims(data);
    let ax = axis(int_attr(n, "axis", 0), dd.len());
    if ax != 0 {
        return Err(unsupported(n, format!("axis {ax} (rows of axis 0 only, as embeddings)")));
    }
    if !need[0] {
        return Ok(vec![None, None]);
    }
    // Rows gathered more than once get the sum of their gradients: a scatter-add
    // of dy's rows into zeros.
    let id = e.dims(idx);
    let count: usize = id.iter().product();
    let row: Vec<usize> = dd[1..].to_vec();
    let mut upd_dims = vec![count];
    upd_dims.extend(&row);
    let flat_idx = e.reshape(idx, &[count, 1])?;
    let flat_idx = if e.dtype(flat_idx) != kiln_graph::DType::I64 { e.op("Cast", &[flat_idx], &[("to", Attr::Int(7))])? } else { flat_idx };
    let upd = e.reshape(dy[0].unwrap(), &upd_dims)?;
    let zeros = e.zeros(e.dtype(upd), &dd)?;
    let s = e.op("ScatterND", &[zeros, flat_idx, upd], &[("reduction", Attr::String("add".into()))])?;
    Ok(vec![Some(s), None])
}

fn expand(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let xd = e.dims(input(n, 0));
    Ok(vec![Some(e.sum_to(dy[0].unwrap(), &xd)?), None])
}

/// The kept triangle passes its gradient, the zeroed one none: the same Trilu of dy.
fn trilu(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let mut ins = vec![dy[0]];
    ins.extend(n.inputs.get(1).copied());
    let attrs: Vec<(&str, Attr)> = n.attrs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let g = e.node("", "Trilu", &ins, &attrs, 1)?[0];
    Ok(vec![Some(g), None])
}
