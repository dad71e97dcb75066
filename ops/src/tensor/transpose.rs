//! Transpose: permutes dims (`perm`, default reversed).
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap};
use crate::op::required;
use crate::{Arg, OpError, Registry, Result};

#[derive(Debug)]
pub struct Transpose {
    perm: Option<Vec<i64>>,
}

impl PlansIndexMap for Transpose {
    const NAME: &'static str = "Transpose";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let rank = x.rank();
        let perm: Vec<i64> = self.perm.clone().unwrap_or_else(|| (0..rank as i64).rev().collect());
        let mut seen = vec![false; rank];
        let ok = perm.len() == rank
            && perm.iter().all(|&p| p >= 0 && (p as usize) < rank && !std::mem::replace(&mut seen[p as usize], true));
        if !ok {
            return Err(OpError::invalid(format!(
                "perm {perm:?} is not a permutation of 0..{rank} (input shape {:?})",
                x.dims()
            )));
        }
        let st = crate::broadcast::strides(x.dims());
        Ok(IndexMap {
            out_dims: perm.iter().map(|&p| x.dims()[p as usize]).collect(),
            maps: vec![DimMap::id(); rank],
            strides: perm.iter().map(|&p| st[p as usize]).collect(),
            base: 0,
        })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Transpose", |spec| Ok(Box::new(MappedOp(Transpose { perm: spec.ints_opt("perm")? }))));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    /// Naive transpose of row-major `dims` by `perm`.
    fn reference(x: &[f64], dims: &[usize], perm: &[usize]) -> Vec<f64> {
        let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let st = crate::broadcast::strides(dims);
        let n: usize = out.iter().product();
        (0..n)
            .map(|mut i| {
                let mut off = 0;
                for d in (0..out.len()).rev() {
                    off += (i % out[d]) * st[perm[d]];
                    i /= out[d];
                }
                x[off]
            })
            .collect()
    }

    #[test]
    fn transpose_odd_shapes_all_dtypes() {
        let dims = [3usize, 1, 5, 7];
        for perm in [[3usize, 1, 0, 2], [0, 2, 1, 3], [3, 2, 1, 0]] {
            let op = make("Transpose", 13, &[("perm", ints(&perm.map(|p| p as i64)))], 1, 1).unwrap();
            let xf = iota_f32(&dims);
            let want = reference(&xf.to_f64_vec(), &dims, &perm);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&xf)], &[]), &[]).unwrap()[0].to_f64_vec(), want);
            let xi = iota_i64(&dims);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&xi)], &[]), &[]).unwrap()[0].to_f64_vec(), want);
            let bools: Vec<bool> = (0..105).map(|i| i % 3 == 0).collect();
            let xb = Tensor::from_bools(&dims, &bools).unwrap();
            let wb = reference(&xb.to_f64_vec(), &dims, &perm);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&xb)], &[]), &[]).unwrap()[0].to_f64_vec(), wb);
            let xh = Tensor::from_f64(kiln_graph::DType::F16, &dims, &xf.to_f64_vec()).unwrap();
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&xh)], &[]), &[]).unwrap()[0].to_f64_vec(), want);
        }
        // Batches of 2-D transposes (NCHW <-> NHWC, merged dims), tiles past 32 and
        // ragged ones.
        let dims = [2usize, 35, 9, 8];
        for perm in [[0usize, 2, 3, 1], [0, 3, 1, 2], [1, 0, 2, 3], [2, 3, 0, 1]] {
            let op = make("Transpose", 13, &[("perm", ints(&perm.map(|p| p as i64)))], 1, 1).unwrap();
            let x = iota_f32(&dims);
            let want = reference(&x.to_f64_vec(), &dims, &perm);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), want, "perm {perm:?}");
            let xb = Tensor::from_f64(kiln_graph::DType::U8, &dims, &x.to_f64_vec().iter().map(|v| v % 251.0).collect::<Vec<_>>()).unwrap();
            let wb = reference(&xb.to_f64_vec(), &dims, &perm);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&xb)], &[]), &[]).unwrap()[0].to_f64_vec(), wb, "u8 perm {perm:?}");
        }
        // Only size-1 dims move (a channels-last pooled vector back to NCHW), or nothing
        // but size-1 dims: copies.
        for (dims, perm) in [(vec![2usize, 1, 1, 37], [0usize, 3, 1, 2]), (vec![1, 1, 1, 1], [3, 2, 0, 1]), (vec![1, 5, 1, 1], [0, 2, 3, 1])] {
            let op = make("Transpose", 13, &[("perm", ints(&perm.map(|p| p as i64)))], 1, 1).unwrap();
            let x = iota_f32(&dims);
            let want = reference(&x.to_f64_vec(), &dims, &perm);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), want, "dims {dims:?} perm {perm:?}");
        }
        let default = make("Transpose", 13, &[], 1, 1).unwrap();
        let x = iota_f32(&[2, 3]);
        assert_eq!(run(default.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], f32s(&[3, 2], &[0., 3., 1., 4., 2., 5.]));
        for bad in [vec![0i64, 0], vec![0], vec![0, 2]] {
            let op = make("Transpose", 13, &[("perm", ints(&bad))], 1, 1).unwrap();
            let e = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap_err().to_string();
            assert!(e.contains("not a permutation"), "{e}");
        }
    }
}
