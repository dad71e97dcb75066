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
    let parts: Vec<ValueId> = dy.iter().zip(&n.outputs).map(|(g, &o)| e.or_zeros(*g, o)).collect::<Result<_>>()?;
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
    let (starts, _, axes, steps) = if e.graph.opset() >= 10 {
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
    let out = e.dims(n.outputs[0]);
    // Each sliced axis: its first input position (normalised as Slice does) and step.
    let mut first = vec![0i64; r];
    let mut stride = vec![1i64; r];
    for k in 0..starts.len() {
        let a = axis(axes[k], r);
        let d = xd[a] as i64;
        let s = if starts[k] < 0 { starts[k].saturating_add(d) } else { starts[k] };
        first[a] = if steps[k] > 0 { s.clamp(0, d) } else { s.clamp(0, d - 1) };
        stride[a] = steps[k];
    }
    // dy's elements go back to their input positions, zeros elsewhere. Along each
    // sliced axis: reversed for a negative step, then spread `step` apart (a zero pad
    // after each element, the trailing zeros cut to what fits); then one zero Pad for
    // the offsets before and the rest after.
    let mut g = dy[0].unwrap();
    let mut pads = vec![0i64; 2 * r];
    if out.contains(&0) {
        g = e.zeros(e.dtype(g), &xd)?;
    } else {
        for a in 0..r {
            let (n_a, mut step, mut lo) = (out[a] as i64, stride[a], first[a]);
            if step < 0 {
                let (starts, ends, axes, steps) = (e.ints(&[-1]), e.ints(&[i64::MIN]), e.ints(&[a as i64]), e.ints(&[-1]));
                g = e.op("Slice", &[g, starts, ends, axes, steps], &[])?;
                (lo, step) = (lo + (n_a - 1) * step, -step);
            }
            let mut len = n_a;
            if step > 1 {
                let mut d = e.dims(g);
                d.insert(a + 1, 1);
                g = e.reshape(g, &d)?;
                let mut spread = vec![0i64; 2 * (r + 1)];
                spread[a + 1 + r + 1] = step - 1;
                let spread = e.ints(&spread);
                g = e.op("Pad", &[g, spread], &[])?;
                d.remove(a + 1);
                d[a] *= step as usize;
                g = e.reshape(g, &d)?;
                let room = xd[a] as i64 - lo;
                len = n_a * step;
                if len > room {
                    let (starts, ends, axes) = (e.ints(&[0]), e.ints(&[room]), e.ints(&[a as i64]));
                    g = e.op("Slice", &[g, starts, ends, axes], &[])?;
                    len = room;
                }
            }
            pads[a] = lo;
            pads[a + r] = xd[a] as i64 - lo - len;
        }
    }
    let dx = if pads.iter().all(|&p| p == 0) {
        g
    } else {
        let pads = e.ints(&pads);
        e.op("Pad", &[g, pads], &[])?
    };
    let mut res = vec![Some(dx)];
    res.resize(need.len(), None);
    Ok(res)
}

fn gather(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (data, idx) = (input(n, 0), input(n, 1));
    let dd = e.dims(data);
    let ax = axis(int_attr(n, "axis", 0), dd.len());
    if !need[0] {
        return Ok(vec![None, None]);
    }
    // Rows gathered more than once get the sum of their gradients: a scatter-add of
    // dy's rows into zeros, along axis 0. Another axis is moved to the front first (in
    // data, and dy's index dims), and back after.
    let id = e.dims(idx);
    let (q, r) = (id.len(), dd.len());
    let count: usize = id.iter().product();
    let mut g = dy[0].unwrap();
    // data dims with `ax` first.
    let data_perm: Vec<usize> = std::iter::once(ax).chain((0..r).filter(|&a| a != ax)).collect();
    if ax != 0 {
        // dy: [data[..ax], idx.., data[ax+1..]] -> [idx.., data[..ax], data[ax+1..]].
        let perm: Vec<usize> = (ax..ax + q).chain(0..ax).chain(ax + q..r - 1 + q).collect();
        g = e.transpose(g, &perm)?;
    }
    let front: Vec<usize> = data_perm.iter().map(|&a| dd[a]).collect();
    let mut upd_dims = vec![count];
    upd_dims.extend(&front[1..]);
    let flat_idx = e.reshape(idx, &[count, 1])?;
    let flat_idx = if e.dtype(flat_idx) != kiln_graph::DType::I64 { e.op("Cast", &[flat_idx], &[("to", Attr::Int(7))])? } else { flat_idx };
    let upd = e.reshape(g, &upd_dims)?;
    let zeros = e.zeros(e.dtype(upd), &front)?;
    let mut s = e.op("ScatterND", &[zeros, flat_idx, upd], &[("reduction", Attr::String("add".into()))])?;
    if ax != 0 {
        let mut inv = vec![0; r];
        for (i, &p) in data_perm.iter().enumerate() {
            inv[p] = i;
        }
        s = e.transpose(s, &inv)?;
    }
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
