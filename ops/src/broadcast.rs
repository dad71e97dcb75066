//! Numpy-style broadcasting of shapes and index arithmetic shared by CPU kernels and
//! WGSL generators.
use crate::{OpError, Result};

/// The broadcast of several shapes (numpy rules), or an error naming the shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(OpError::invalid(format!("shapes {:?} cannot be broadcast together", shapes)));
            }
        }
    }
    Ok(out)
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Strides to read an input of shape `dims` broadcast to `out` (0 on broadcast dims),
/// one per dim of `out`.
pub fn broadcast_strides(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let st = strides(dims);
    let off = out.len() - dims.len();
    (0..out.len())
        .map(|i| if i < off || dims[i - off] == 1 { 0 } else { st[i - off] })
        .collect()
}

/// Merges adjacent dims of `out` that every input walks the same way (contiguously, or
/// broadcast along both), and drops dims of size 1: the same walk over fewer, longer
/// dims. Returns the merged dims and each input's strides over them.
pub fn collapse(out: &[usize], in_strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut dims: Vec<usize> = vec![];
    let mut st: Vec<Vec<usize>> = vec![vec![]; in_strides.len()];
    for d in 0..out.len() {
        if out[d] == 1 {
            continue;
        }
        let merge = !dims.is_empty() && in_strides.iter().zip(&st).all(|(s, m)| *m.last().expect("one per dim") == s[d] * out[d]);
        if merge {
            *dims.last_mut().expect("not empty") *= out[d];
            for (m, s) in st.iter_mut().zip(in_strides) {
                *m.last_mut().expect("one per dim") = s[d];
            }
        } else {
            dims.push(out[d]);
            for (m, s) in st.iter_mut().zip(in_strides) {
                m.push(s[d]);
            }
        }
    }
    if dims.is_empty() {
        return (vec![1], vec![vec![0]; in_strides.len()]);
    }
    (dims, st)
}

/// A broadcast walk a row at a time: the output's dims merged by [`collapse`], cut into
/// rows of the last merged dim, along which each input moves by stride 0 or 1 (or any
/// other: `inner` holds them). Kernels write a row with a tight loop.
pub struct RowWalk {
    outer: Vec<usize>,
    outer_st: Vec<Vec<usize>>,
    /// Elements per row.
    pub n: usize,
    /// Each input's stride along a row.
    pub inner: Vec<usize>,
}

impl RowWalk {
    pub fn new(out: &[usize], in_strides: &[Vec<usize>]) -> RowWalk {
        let (dims, st) = collapse(out, in_strides);
        let rank = dims.len();
        RowWalk {
            outer: dims[..rank - 1].to_vec(),
            outer_st: st.iter().map(|s| s[..rank - 1].to_vec()).collect(),
            n: dims[rank - 1],
            inner: st.iter().map(|s| s[rank - 1]).collect(),
        }
    }

    /// Calls `f(r, starts)` for rows `r0..r0 + rows` (`r` counted from `r0`), `starts`
    /// each input's offset at the row's first element.
    pub fn rows(&self, r0: usize, rows: usize, mut f: impl FnMut(usize, &[usize])) {
        let mut r = 0;
        for_each_offset_in(&self.outer, &self.outer_st, r0, r0 + rows, &mut |_, offs| {
            f(r, offs);
            r += 1;
        });
    }
}

/// Iterates, in row-major order over `out`, the offset into each input given their
/// broadcast strides, calling `f(out_index, offsets)`. Walks an odometer, so it costs a
/// few adds per element; kernels call it per contiguous chunk via [`for_each_offset_in`].
pub fn for_each_offset(out: &[usize], in_strides: &[Vec<usize>], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = out.iter().product();
    for_each_offset_in(out, in_strides, 0, n, &mut f)
}

/// Like [`for_each_offset`] for output indices `start..end` only (for parallel chunks).
pub fn for_each_offset_in(
    out: &[usize],
    in_strides: &[Vec<usize>],
    start: usize,
    end: usize,
    f: &mut impl FnMut(usize, &[usize]),
) {
    if start >= end {
        return;
    }
    let rank = out.len();
    let mut idx = vec![0usize; rank];
    let mut rem = start;
    for d in (0..rank).rev() {
        idx[d] = rem % out[d];
        rem /= out[d];
    }
    let mut offs: Vec<usize> =
        in_strides.iter().map(|s| idx.iter().zip(s).map(|(i, s)| i * s).sum()).collect();
    for o in start..end {
        f(o, &offs);
        // advance the odometer
        let mut d = rank;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for (k, s) in in_strides.iter().enumerate() {
                offs[k] += s[d];
            }
            if idx[d] < out[d] {
                break;
            }
            for (k, s) in in_strides.iter().enumerate() {
                offs[k] -= s[d] * out[d];
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_merges_dims_walked_alike() {
        // A per-channel operand of NCHW: H and W merge, N and C stay apart.
        let out = [2, 3, 4, 5];
        let (dims, st) = collapse(&out, &[strides(&out), broadcast_strides(&[1, 3, 1, 1], &out)]);
        assert_eq!(dims, vec![2, 3, 20]);
        assert_eq!(st, vec![vec![60, 20, 1], vec![0, 1, 0]]);
        // Size-1 dims drop out; a scalar walk is one element.
        let (dims, st) = collapse(&[1, 6, 1], &[vec![0, 1, 0]]);
        assert_eq!((dims, st), (vec![6], vec![vec![1]]));
        assert_eq!(collapse(&[1, 1], &[vec![0, 0]]), (vec![1], vec![vec![0]]));
        // The walk visits the same offsets as the uncollapsed one.
        let out = [3, 1, 4, 2];
        let ins = [broadcast_strides(&[3, 1, 1, 2], &out), broadcast_strides(&[4, 1], &out)];
        let (mut a, mut b) = (vec![], vec![]);
        for_each_offset(&out, &ins, |_, o| a.push(o.to_vec()));
        let (dims, st) = collapse(&out, &ins);
        for_each_offset(&dims, &st, |_, o| b.push(o.to_vec()));
        assert_eq!(a, b);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[&[2, 1, 3], &[4, 1]]).unwrap(), vec![2, 4, 3]);
        assert!(broadcast_shapes(&[&[2, 3], &[4]]).is_err());
        assert_eq!(broadcast_strides(&[4, 1], &[2, 4, 3]), vec![0, 1, 0]);
        let mut seen = vec![];
        for_each_offset(&[2, 3], &[broadcast_strides(&[3], &[2, 3]), strides(&[2, 3])], |o, offs| {
            seen.push((o, offs[0], offs[1]))
        });
        assert_eq!(seen[4], (4, 1, 4));
        let mut part = vec![];
        for_each_offset_in(&[2, 3], &[broadcast_strides(&[2, 1], &[2, 3])], 2, 5, &mut |o, offs| {
            part.push((o, offs[0]))
        });
        assert_eq!(part, vec![(2, 0), (3, 1), (4, 1)]);
    }
}
