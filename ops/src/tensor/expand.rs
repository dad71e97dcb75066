//! Expand: broadcasts the input to (the broadcast of its shape with) a constant shape.
use super::common::const_ints;
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap};
use crate::broadcast::{broadcast_shapes, broadcast_strides};
use crate::op::required;
use crate::{Arg, OpError, Registry, Result};

#[derive(Debug)]
pub struct Expand;

impl PlansIndexMap for Expand {
    const NAME: &'static str = "Expand";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let shape = const_ints(inputs, 1, "Expand's shape")?;
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(OpError::input(1, format!("negative dim {d} in shape {shape:?}")));
        }
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let out = broadcast_shapes(&[x.dims(), &shape]).map_err(|_| {
            OpError::invalid(format!("input shape {:?} cannot be expanded to {shape:?}", x.dims()))
        })?;
        Ok(IndexMap {
            strides: broadcast_strides(x.dims(), &out),
            maps: vec![DimMap::id(); out.len()],
            out_dims: out,
            base: 0,
        })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Expand", |_| Ok(Box::new(MappedOp(Expand))));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn expand_broadcasts_both_ways() {
        let op = make("Expand", 13, &[], 2, 1).unwrap();
        let x = iota_i64(&[3, 1]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[3], &[2, 1, 4]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[2, 3, 4]);
        let want: Vec<f64> = (0..24).map(|i| ((i / 4) % 3) as f64).collect();
        assert_eq!(out[0].to_f64_vec(), want);
        // shape smaller than the input: the input shape wins
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[1]))], &[1]), &[]).unwrap();
        assert_eq!(out[0], x);
        let f = iota_f32(&[1, 5]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&f), Some(&i64s(&[2], &[3, 1]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[3, 5]);
        assert_eq!(out[0].to_f64_vec()[5..10], f.to_f64_vec()[..]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&f), Some(&i64s(&[1], &[3]))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("[1, 5]") && e.contains("[3]"), "{e}");
    }
}
