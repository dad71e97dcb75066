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
