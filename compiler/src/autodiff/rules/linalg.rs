//! Products: MatMul (batched, broadcasting, 1-D operands) and Gemm.
use super::{float_attr, input, int_attr, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Attr, Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[("MatMul", matmul), ("Gemm", gemm)];

/// Swaps the last two axes.
fn t_last(e: &mut Emit, v: ValueId) -> Result<ValueId> {
    let r = e.rank(v);
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    e.transpose(v, &perm)
}

fn matmul(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (a, b) = (input(n, 0), input(n, 1));
    let (adims, bdims) = (e.dims(a), e.dims(b));
    let mut dy = dy[0].unwrap();
    // Promote 1-D operands to matrices, and dy with them.
    let a2 = if adims.len() == 1 { e.reshape(a, &[1, adims[0]])? } else { a };
    let b2 = if bdims.len() == 1 { e.reshape(b, &[bdims[0], 1])? } else { b };
    let mut ddims = e.dims(dy);
    if adims.len() == 1 {
        ddims.insert(ddims.len().saturating_sub(if bdims.len() == 1 { 0 } else { 1 }), 1);
    }
    if bdims.len() == 1 {
        ddims.push(1);
    }
    dy = e.reshape(dy, &ddims)?;
    let a2dims = e.dims(a2);
    let b2dims = e.dims(b2);
    let da = if need[0] {
        // dA = dY B^T, summed over broadcast batch axes.
        let bt = t_last(e, b2)?;
        let p = e.op("MatMul", &[dy, bt], &[])?;
        let s = e.sum_to(p, &a2dims)?;
        Some(e.reshape(s, &adims)?)
    } else {
        None
    };
    let db = if need[1] {
        let p = if b2dims.len() == 2 && a2dims.len() > 2 {
            // A weight shared by every batch row: one product over the flattened rows.
            let k = a2dims[a2dims.len() - 1];
            let rows: usize = a2dims[..a2dims.len() - 1].iter().product();
            let nn = ddims[ddims.len() - 1];
            let af = e.reshape(a2, &[rows, k])?;
            let df = e.reshape(dy, &[rows, nn])?;
            e.op("Gemm", &[af, df], &[("transA", Attr::Int(1))])?
        } else {
            let at = t_last(e, a2)?;
            let p = e.op("MatMul", &[at, dy], &[])?;
            e.sum_to(p, &b2dims)?
        };
        Some(e.reshape(p, &bdims)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn gemm(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (a, b) = (input(n, 0), input(n, 1));
    let dy = dy[0].unwrap();
    let ta = int_attr(n, "transA", 0) != 0;
    let tb = int_attr(n, "transB", 0) != 0;
    let alpha = float_attr(n, "alpha", 1.0);
    let beta = float_attr(n, "beta", 1.0);
    let gemm = |e: &mut Emit, x: ValueId, y: ValueId, tx: bool, ty: bool| -> Result<ValueId> {
        let mut attrs = vec![("transA", Attr::Int(tx as i64)), ("transB", Attr::Int(ty as i64))];
        if alpha != 1.0 {
            attrs.push(("alpha", Attr::Float(alpha)));
        }
        e.op("Gemm", &[x, y], &attrs)
    };
    // Y = alpha A' B' + beta C with A' = op(A), B' = op(B).
    let da = if need[0] {
        Some(if ta { gemm(e, b, dy, tb, true)? } else { gemm(e, dy, b, false, !tb)? })
    } else {
        None
    };
    let db = if need[1] {
        Some(if tb { gemm(e, dy, a, true, ta)? } else { gemm(e, a, dy, !ta, false)? })
    } else {
        None
    };
    let dc = match n.inputs.get(2).copied().flatten() {
        Some(c) if need.get(2).copied().unwrap_or(false) => {
            let cd = e.dims(c);
            let s = e.sum_to(dy, &cd)?;
            Some(e.scale(s, beta as f64)?)
        }
        _ => None,
    };
    Ok(vec![da, db, dc])
}
