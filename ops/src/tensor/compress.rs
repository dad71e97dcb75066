//! Compress: the slices of `input` along `axis` (or the elements of the flattened
//! input when `axis` is absent) whose `condition` entry is true. The output shape
//! depends on the condition's values, so they must be known when the model is
//! specialised (a constant, or a bool graph input the session binds by value); the
//! data itself may be computed at run time, on any backend: the selection becomes a
//! lookup table of the shared [`IndexMap`] gather.
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap};
use crate::op::{constant, required};
use crate::{norm_axis, Arg, OpError, Registry, Result};

#[derive(Debug)]
pub struct Compress {
    axis: Option<i64>,
}

impl PlansIndexMap for Compress {
    const NAME: &'static str = "Compress";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let cond = constant(inputs, 1, "condition (the output shape depends on it)")?;
        if cond.rank() != 1 {
            return Err(OpError::input(1, format!("condition must be 1-D, found shape {:?}", cond.dims())));
        }
        let (dims, axis) = match self.axis {
            None => (vec![x.ty.len()], 0),
            Some(a) => (x.dims().to_vec(), norm_axis(a, x.rank())?),
        };
        let n = dims[axis];
        let picked: Vec<i64> = cond.to_f64_vec().iter().enumerate().filter(|(_, &c)| c != 0.0).map(|(i, _)| i as i64).collect();
        if let Some(&bad) = picked.iter().find(|&&i| i >= n as i64) {
            return Err(OpError::input(1, format!("condition is true at position {bad}, beyond the {n} slices along axis {axis}")));
        }
        let mut out_dims = dims.clone();
        out_dims[axis] = picked.len();
        let mut maps = vec![DimMap::id(); dims.len()];
        maps[axis] = DimMap::Table(picked).simplified();
        Ok(IndexMap { out_dims, maps, strides: crate::broadcast::strides(&dims), base: 0 })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Compress", |spec| Ok(Box::new(MappedOp(Compress { axis: spec.int_opt("axis")? }))));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn compress_axes_and_flattened() {
        let x = iota_f32(&[3, 2]);
        let cond = Tensor::from_bools(&[3], &[false, true, true]).unwrap();
        let op = make("Compress", 11, &[("axis", Attr::Int(0))], 2, 1).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&cond)], &[1]), &[]).unwrap()[0], f32s(&[2, 2], &[2., 3., 4., 5.]));
        let op = make("Compress", 11, &[("axis", Attr::Int(-1))], 2, 1).unwrap();
        let c2 = Tensor::from_bools(&[2], &[false, true]).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&c2)], &[1]), &[]).unwrap()[0], f32s(&[3, 1], &[1., 3., 5.]));
        // no axis: flattened; a short condition selects from the first elements only
        let flat = make("Compress", 11, &[], 2, 1).unwrap();
        let c5 = Tensor::from_bools(&[5], &[false, true, false, false, true]).unwrap();
        assert_eq!(run(flat.as_ref(), &as_inputs(&[Some(&x), Some(&c5)], &[1]), &[]).unwrap()[0], f32s(&[2], &[1., 4.]));
        let xi = iota_i64(&[3, 2]);
        assert_eq!(run(flat.as_ref(), &as_inputs(&[Some(&xi), Some(&c5)], &[1]), &[]).unwrap()[0], i64s(&[2], &[1, 4]));
        let none = Tensor::from_bools(&[3], &[false; 3]).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&none)], &[1]), &[]).unwrap()[0].dims(), &[3, 0]);
        let far = Tensor::from_bools(&[4], &[false, false, false, true]).unwrap();
        let op0 = make("Compress", 11, &[("axis", Attr::Int(0))], 2, 1).unwrap();
        let e = run(op0.as_ref(), &as_inputs(&[Some(&x), Some(&far)], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("position 3, beyond the 3 slices"), "{e}");
        let e = run(op0.as_ref(), &as_inputs(&[Some(&x), Some(&cond)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("must be known"), "{e}");
    }
}
