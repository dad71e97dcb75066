//! Reductions: the output gradient spread back over the reduced axes.
use super::{axis, const_ints, input, int_attr, ints_attr, unsupported, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[("ReduceSum", reduce_sum), ("ReduceMean", reduce_mean)];

/// The axes a reduction reduces (normalised, sorted); `None` when it reduces none.
fn reduced_axes(e: &Emit, n: &Node) -> Result<Option<Vec<usize>>> {
    let r = e.rank(input(n, 0));
    let listed = match ints_attr(n, "axes") {
        Some(a) => Some(a),
        None => match n.inputs.get(1).copied().flatten() {
            Some(v) => Some(const_ints(e, v).ok_or_else(|| unsupported(n, "axes computed at run time"))?),
            None => None,
        },
    };
    let mut axes: Vec<usize> = match listed {
        Some(a) if !a.is_empty() => a.iter().map(|&x| axis(x, r)).collect(),
        _ if int_attr(n, "noop_with_empty_axes", 0) != 0 => return Ok(None),
        _ => (0..r).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    Ok(Some(axes))
}

/// dy reshaped to keep the reduced axes, then broadcast to the input's dims.
fn spread(e: &mut Emit, n: &Node, dy: ValueId) -> Result<(ValueId, usize)> {
    let xd = e.dims(input(n, 0));
    let Some(axes) = reduced_axes(e, n)? else { return Ok((dy, 1)) };
    let kept: Vec<usize> = xd.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let count: usize = axes.iter().map(|&a| xd[a]).product();
    let k = e.reshape(dy, &kept)?;
    Ok((e.expand(k, &xd)?, count))
}

fn reduce_sum(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (g, _) = spread(e, n, dy[0].unwrap())?;
    Ok(vec![Some(g)])
}

fn reduce_mean(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let d = dy[0].unwrap();
    let (g, count) = spread(e, n, d)?;
    Ok(vec![Some(e.scale(g, 1.0 / count as f64)?)])
}
