//! Index layout of a reduction over a set of axes, shared by the CPU kernels and the
//! WGSL generators. Dims are collapsed into alternating groups of kept and reduced
//! dims (size-1 dims dropped); a trailing kept group becomes the contiguous `inner`
//! run, so that an output element `o` is `(outer = o / inner, j = o % inner)` and reads
//! input `base(outer) + r + j` for every reduced offset `r`.
use crate::{norm_axis, OpError, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceLayout {
    /// Kept groups before the inner run: (size, input stride), outermost first.
    pub outer: Vec<(usize, usize)>,
    /// Reduced groups: (size, input stride), outermost first.
    pub reduced: Vec<(usize, usize)>,
    /// Length of the trailing contiguous kept run (1 when the last dim is reduced).
    pub inner: usize,
}

impl ReduceLayout {
    /// Layout for reducing `axes` (normalised, distinct) of `dims`.
    pub fn new(dims: &[usize], axes: &[usize]) -> ReduceLayout {
        let mut groups: Vec<(usize, usize, bool)> = vec![]; // (size, stride, reduced)
        let mut stride = 1usize;
        for d in (0..dims.len()).rev() {
            let size = dims[d];
            let reduced = axes.contains(&d);
            if size != 1 {
                match groups.last_mut() {
                    Some(g) if g.2 == reduced => g.0 *= size,
                    _ => groups.push((size, stride, reduced)),
                }
            }
            stride *= size;
        }
        groups.reverse();
        let inner = match groups.last() {
            Some(&(size, _, false)) => {
                groups.pop();
                size
            }
            _ => 1,
        };
        ReduceLayout {
            outer: groups.iter().filter(|g| !g.2).map(|g| (g.0, g.1)).collect(),
            reduced: groups.iter().filter(|g| g.2).map(|g| (g.0, g.1)).collect(),
            inner,
        }
    }

    /// `(a, mid, b)` when the reduction keeps one middle run of `mid` and reduces the
    /// `a` blocks before it and the `b` elements after it (a channel's sums over batch
    /// and pixels): output `m` sums `x[(i * mid + m) * b + j]` over `i` and `j`.
    pub fn around_middle(&self) -> Option<(usize, usize, usize)> {
        match (&self.outer[..], &self.reduced[..], self.inner) {
            ([(mid, b)], [(a, sa), (bb, 1)], 1) if *bb == *b && *sa == mid * b => Some((*a, *mid, *b)),
            _ => None,
        }
    }

    /// Number of elements reduced into each output.
    pub fn reduced_len(&self) -> usize {
        self.reduced.iter().map(|g| g.0).product()
    }

    /// Number of output elements.
    pub fn out_len(&self) -> usize {
        self.outer.iter().map(|g| g.0).product::<usize>() * self.inner
    }

    /// Input offset of the first element reduced into outer index `o`.
    pub fn base(&self, mut o: usize) -> usize {
        let mut off = 0;
        for &(size, stride) in self.outer.iter().rev() {
            off += (o % size) * stride;
            o /= size;
        }
        off
    }

    /// Offsets of the reduced elements relative to `base`, in row-major order.
    pub fn reduced_offsets(&self) -> Vec<usize> {
        let mut offs = vec![0usize];
        for &(size, stride) in &self.reduced {
            offs = offs.iter().flat_map(|&o| (0..size).map(move |i| o + i * stride)).collect();
        }
        if self.reduced_len() == 0 {
            offs.clear();
        }
        offs
    }

    /// True when the reduced elements of an output are one contiguous run.
    pub fn contiguous_rows(&self) -> bool {
        self.inner == 1 && (self.reduced.is_empty() || (self.reduced.len() == 1 && self.reduced[0].1 == 1))
    }
}

/// Normalises `axes` against `rank`, rejecting repeats; the error names the axis.
pub fn normalize_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError::invalid(format!("axis {a} is repeated in axes {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// `(outer, d, inner)` around a single `axis` of `dims`.
pub fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_collapse() {
        assert_eq!(ReduceLayout::new(&[64, 32, 4, 4], &[0, 2, 3]).around_middle(), Some((64, 32, 16)));
        assert_eq!(ReduceLayout::new(&[5, 3, 7], &[0, 2]).around_middle(), Some((5, 3, 7)));
        assert_eq!(ReduceLayout::new(&[5, 3, 7], &[0]).around_middle(), None);
        assert_eq!(ReduceLayout::new(&[5, 3, 7], &[2]).around_middle(), None);
        let l = ReduceLayout::new(&[2, 3, 4, 5], &[1, 2]);
        assert_eq!(l.outer, vec![(2, 60)]);
        assert_eq!(l.reduced, vec![(12, 5)]);
        assert_eq!(l.inner, 5);
        assert_eq!(l.out_len(), 10);
        let l = ReduceLayout::new(&[2, 3, 1, 4], &[0, 3]);
        assert_eq!((l.outer.clone(), l.reduced.clone(), l.inner), (vec![(3, 4)], vec![(2, 12), (4, 1)], 1));
        assert_eq!(l.reduced_offsets(), vec![0, 1, 2, 3, 12, 13, 14, 15]);
        assert_eq!(l.base(2), 8);
        let l = ReduceLayout::new(&[2, 0, 4], &[1]);
        assert_eq!((l.reduced_len(), l.out_len()), (0, 8));
        assert!(ReduceLayout::new(&[6, 7], &[1]).contiguous_rows());
        assert!(normalize_axes(&[1, -2], 3).is_err());
    }
}
