//! Tile: repeats the input `repeats[d]` times along each dim.
use super::common::{const_ints, tensor_args};
use super::index_map::{DimMap, IndexMap};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Tile;

impl Tile {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let reps = const_ints(inputs, 1, "Tile's repeats")?;
        if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
            return Err(OpError::input(
                1,
                format!("repeats {reps:?} must hold one non-negative count per dim of the input shape {:?}", x.dims()),
            ));
        }
        Ok(IndexMap {
            out_dims: x.dims().iter().zip(&reps).map(|(&d, &r)| d * r as usize).collect(),
            maps: x.dims().iter().map(|&d| DimMap::Modulo { n: d as i64 }).collect(),
            strides: crate::broadcast::strides(x.dims()),
            base: 0,
        })
    }
}

impl Op for Tile {
    fn name(&self) -> &str {
        "Tile"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), self.plan(inputs)?.out_dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Tile {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let map = tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        map.run(x, &mut outputs[0], &vec![0; x.dtype().size()])
    }
}

impl WgslKernel for Tile {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let map = self.plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(map.dispatch("Tile", ty, wg, Binding::Input(0), Binding::Output(0), &wgsl::literal(ty, 0.0), &[])))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Tile", |spec| {
        if spec.opset < 6 {
            return Err(OpError::Unsupported("Tile before opset 6 (tiles/axis inputs)".into()));
        }
        Ok(Box::new(Tile))
    });
}

#[cfg(test)]
mod tests {
    use super::super::common::testing::*;

    #[test]
    fn tile_matches_numpy() {
        let op = make("Tile", 13, &[], 2, 1).unwrap();
        let x = iota_i64(&[2, 3]);
        let out = run(op.as_ref(), &[Some(&x), Some(&i64s(&[2], &[2, 3]))], &[1]).unwrap();
        assert_eq!(out[0].dims(), &[4, 9]);
        // np.tile(np.arange(6).reshape(2,3), (2,3))[3] == [3,4,5]*3
        assert_eq!(out[0].to_f64_vec()[27..36], [3., 4., 5., 3., 4., 5., 3., 4., 5.]);
        let b = kiln_graph::Tensor::from_bools(&[3], &[true, false, false]).unwrap();
        let out = run(op.as_ref(), &[Some(&b), Some(&i64s(&[1], &[2]))], &[1]).unwrap();
        assert_eq!(out[0].bytes(), &[1, 0, 0, 1, 0, 0]);
        let zero = run(op.as_ref(), &[Some(&x), Some(&i64s(&[2], &[0, 1]))], &[1]).unwrap();
        assert_eq!(zero[0].dims(), &[0, 3]);
        assert!(run(op.as_ref(), &[Some(&x), Some(&i64s(&[1], &[2]))], &[1]).is_err());
    }
}
