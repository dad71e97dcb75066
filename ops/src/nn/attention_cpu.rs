//! The blocked f32 CPU path of [`Attention`] without past keys or softcap (what
//! `fuse-attention` produces, on 4-D heads or on 3-D activations that the op splits
//! into heads): per block of up to [`BLOCK_ROWS`] query rows of one (batch, head),
//! `S = scale * Q_blk Kᵀ` through the `gemm` crate into per-thread scratch, the mask
//! and a softmax row by row, then `Y_blk = P V` through `gemm` again, written in place
//! (row stride `v_head` for 4-D Y, `q_heads * v_head` for 3-D Y, where one block of
//! rows covers every head). Blocks run in parallel.
use super::attention::{Attention, Data, Geometry};
use crate::cpu;
use kiln_graph::{DType, Tensor};

/// Most query rows per block: the scores of one block (`BLOCK_ROWS x keys`) stay in
/// cache, and the products are large enough for the `gemm` crate's kernels.
const BLOCK_ROWS: usize = 64;

impl Attention {
    /// Whether Y can take the blocked path: f32 everywhere, no past, no softcap.
    pub(super) fn blocked_applies(&self, g: &Geometry, inputs: &[Option<&Tensor>], y: &Tensor) -> bool {
        let f32_in = |i: usize| inputs.get(i).copied().flatten().is_some_and(|t| t.dtype() == DType::F32);
        let mask_ok = inputs.get(3).copied().flatten().is_none_or(|m| matches!(m.dtype(), DType::F32 | DType::Bool));
        f32_in(0) && f32_in(1) && f32_in(2) && mask_ok && y.dtype() == DType::F32 && !g.has_past && self.softcap <= 0.0
    }

    /// Y (`[batch, q_heads, q_len, v_head]`, or `[batch, q_len, q_heads * v_head]` for
    /// 3-D inputs; f32) by blocks of query rows.
    pub(super) fn run_blocked(&self, g: &Geometry, x: &Data, y: &mut [f32]) {
        let (sq, t, dv) = (g.q_len, g.total, g.v_head);
        if y.is_empty() || dv == 0 {
            return;
        }
        if t == 0 {
            // No keys: every row is fully masked.
            y.fill(0.0);
            return;
        }
        // Parallel items of `per` rows (a divisor of q_len, so an item never straddles two
        // heads); a chunk of items is cut into blocks at head boundaries anyway.
        let per = (1..=BLOCK_ROWS.min(sq)).rev().find(|d| sq % d == 0).unwrap_or(1);
        let work = t * (g.head + dv) + 8;
        if g.three_d {
            // Rows of Y are (batch, query) with every head side by side.
            let row = g.q_heads * dv;
            cpu::par_chunks_mut(y, per * row, work * g.q_heads, |first_item, part| {
                let (first, rows) = (first_item * per, part.len() / row);
                let mut r = 0;
                while r < rows {
                    let (b, i0) = ((first + r) / sq, (first + r) % sq);
                    let n = (rows - r).min(sq - i0).min(BLOCK_ROWS);
                    for h in 0..g.q_heads {
                        self.block(g, x, (b, h, i0, n), &mut part[r * row + h * dv..(r + n) * row], row);
                    }
                    r += n;
                }
            });
            return;
        }
        cpu::par_chunks_mut(y, per * dv, work, |first_item, part| {
            let (first, rows) = (first_item * per, part.len() / dv);
            let mut r = 0;
            while r < rows {
                let (bh, i0) = ((first + r) / sq, (first + r) % sq);
                let n = (rows - r).min(sq - i0).min(BLOCK_ROWS);
                self.block(g, x, (bh / g.q_heads, bh % g.q_heads, i0, n), &mut part[r * dv..(r + n) * dv], dv);
                r += n;
            }
        });
    }

    /// Rows `i0..i0 + n` of head `(b, h)` into `out` (`n` rows of `v_head`, `out_rs` apart).
    fn block(&self, g: &Geometry, x: &Data, (b, h, i0, n): (usize, usize, usize, usize), out: &mut [f32], out_rs: usize) {
        let (t, d, dv) = (g.total, g.head, g.v_head);
        let hk = h / g.group();
        let q_off = b * g.q_strides[0] + h * g.q_strides[1] + i0 * g.q_strides[2];
        let k_off = b * g.k_strides[0] + hk * g.k_strides[1];
        let v_off = b * g.v_strides[0] + hk * g.v_strides[1];
        // Only the mask (no causal, window or nonpad rule): added row by row directly.
        let mask_only = !self.is_causal && self.left_window < 0 && self.right_window < 0 && !g.has_nonpad;
        // The operands' extents, checked once so the unsafe products below stay in bounds.
        let in_bounds = q_off + (n - 1) * g.q_strides[2] + d <= x.q.len()
            && k_off + (t - 1) * g.k_strides[2] + d <= x.k.len()
            && v_off + (t - 1) * g.v_strides[2] + dv <= x.v.len()
            && out_rs >= dv
            && out.len() >= (n - 1) * out_rs + dv;
        if !in_bounds {
            // Unreachable for shapes the geometry accepted; never read out of bounds.
            out.fill(f32::NAN);
            return;
        }
        cpu::with_scratch(n * t, |s| {
            // SAFETY: S is n x t; Q rows (n x d, row stride q_strides[2]) and K rows
            // (t x d, read transposed) lie inside q and k as checked above.
            if d == 0 {
                s.fill(0.0);
            } else {
                unsafe {
                gemm::gemm(
                    n, t, d,
                    s.as_mut_ptr(), 1, t as isize, false,
                    x.q.as_ptr().add(q_off), 1, g.q_strides[2] as isize,
                    x.k.as_ptr().add(k_off), g.k_strides[2] as isize, 1,
                    0.0, g.scale, false, false, false, gemm::Parallelism::None,
                );
                }
            }
            for (r, row) in s.chunks_mut(t).enumerate() {
                let i = i0 + r;
                match &g.mask {
                    Some(m) if mask_only => {
                        let base = b * m.strides[0] + h * m.strides[1] + i * m.strides[2];
                        for (o, &bias) in row.iter_mut().zip(&x.mask[base..base + m.len]) {
                            *o += bias;
                        }
                        row[m.len..].fill(f32::NEG_INFINITY);
                    }
                    None if mask_only => {}
                    _ => {
                        for (j, o) in row.iter_mut().enumerate() {
                            match self.bias(g, x, b, h, i, j) {
                                Some(bias) => *o += bias,
                                None => *o = f32::NEG_INFINITY,
                            }
                        }
                    }
                }
                softmax(row);
            }
            // SAFETY: P is n x t in scratch, V rows (t x dv) lie inside v, out holds n
            // rows of dv, out_rs apart (checked above).
            unsafe {
                gemm::gemm(
                    n, dv, t,
                    out.as_mut_ptr(), 1, out_rs as isize, false,
                    s.as_ptr(), 1, t as isize,
                    x.v.as_ptr().add(v_off), 1, g.v_strides[2] as isize,
                    0.0, 1.0, false, false, false, gemm::Parallelism::None,
                );
            }
        });
    }
}

/// Softmax of one score row in place; -inf keys get 0, an all-masked row is zeros.
/// Reductions run over 8 lanes and the exponentials branch-free, so all three loops
/// vectorize.
pub(super) fn softmax(row: &mut [f32]) {
    let m = lanes(row, f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    for o in row.iter_mut() {
        let e = cpu::fast_exp(*o - m);
        *o = if *o == f32::NEG_INFINITY { 0.0 } else { e };
    }
    let r = 1.0 / lanes(row, 0.0, |a, b| a + b);
    row.iter_mut().for_each(|o| *o *= r);
}

/// `row` folded with `f` over 8 independent lanes, then across them.
fn lanes(row: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder().iter().fold(init, |a, &v| f(a, v));
    for c in chunks {
        for l in 0..8 {
            acc[l] = f(acc[l], c[l]);
        }
    }
    acc.iter().fold(rest, |a, &v| f(a, v))
}
