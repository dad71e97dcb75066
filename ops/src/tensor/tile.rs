//! Tile: repeats the input `repeats[d]` times along each dim.
use super::common::const_ints;
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap};
use crate::op::required;
use crate::{Arg, OpError, Registry, Result};

#[derive(Debug)]
pub struct Tile;

impl PlansIndexMap for Tile {
    const NAME: &'static str = "Tile";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let reps = const_ints(inputs, 1, "Tile's repeats")?;
        if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
            return Err(OpError::input(
                1,
                format!("repeats {reps:?} must hold one non-negative count per dim of the input shape {:?}", x.dims()),
            ));
        }
        let out_dims = x
            .dims()
            .iter()
            .zip(&reps)
            .map(|(&d, &r)| d.checked_mul(r as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| OpError::input(1, format!("repeats {reps:?} of the input shape {:?} overflow the address space", x.dims())))?;
        Ok(IndexMap {
            out_dims,
            maps: x.dims().iter().map(|&d| DimMap::Modulo { n: d as i64 }).collect(),
            strides: crate::broadcast::strides(x.dims()),
            base: 0,
        })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Tile", |spec| {
        if spec.opset < 6 {
            return Err(OpError::Unsupported("Tile before opset 6 (tiles/axis inputs)".into()));
        }
        Ok(Box::new(MappedOp(Tile)))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn tile_matches_numpy() {
        let op = make("Tile", 13, &[], 2, 1).unwrap();
        let x = iota_i64(&[2, 3]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[2, 3]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[4, 9]);
        // np.tile(np.arange(6).reshape(2,3), (2,3))[3] == [3,4,5]*3
        assert_eq!(out[0].to_f64_vec()[27..36], [3., 4., 5., 3., 4., 5., 3., 4., 5.]);
        let b = kiln_graph::Tensor::from_bools(&[3], &[true, false, false]).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&b), Some(&i64s(&[1], &[2]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].bytes(), &[1, 0, 0, 1, 0, 0]);
        let zero = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[0, 1]))], &[1]), &[]).unwrap();
        assert_eq!(zero[0].dims(), &[0, 3]);
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[2]))], &[1]), &[]).is_err());
    }
}
