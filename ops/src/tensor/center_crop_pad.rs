//! CenterCropPad (opset 18): crops or zero-pads `input_data` along `axes` (default:
//! every axis) to the known `shape`, keeping the centre. A dim shrinking by `d` drops
//! `d / 2` elements at the start (the odd one at the end); one growing by `d` gets
//! `d / 2` zeros before and the rest after, as the ONNX reference does. Every dtype;
//! a gather of the shared [`IndexMap`] engine on every backend.
use super::common::{const_ints, norm_axes};
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap, PadMode};
use crate::op::required;
use crate::{Arg, OpError, Registry, Result};

#[derive(Debug)]
pub struct CenterCropPad {
    axes: Option<Vec<i64>>,
}

impl PlansIndexMap for CenterCropPad {
    const NAME: &'static str = "CenterCropPad";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let shape = const_ints(inputs, 1, "CenterCropPad's shape")?;
        let axes = match &self.axes {
            Some(a) => norm_axes(a, x.rank())?,
            None => (0..x.rank()).collect(),
        };
        if shape.len() != axes.len() {
            return Err(OpError::input(1, format!("CenterCropPad's shape {shape:?} must have one value per axis ({} axes of input shape {:?})", axes.len(), x.dims())));
        }
        let mut map = IndexMap { out_dims: x.dims().to_vec(), maps: vec![DimMap::id(); x.rank()], strides: crate::broadcast::strides(x.dims()), base: 0 };
        for (&a, &target) in axes.iter().zip(&shape) {
            let n = x.dims()[a] as i64;
            let t = usize::try_from(target).map_err(|_| OpError::input(1, format!("CenterCropPad's shape {shape:?} has the negative size {target}")))?;
            map.out_dims[a] = t;
            map.maps[a] = if target < n {
                DimMap::Affine { start: (n - target) / 2, step: 1 }
            } else if target > n {
                DimMap::Pad { before: (target - n) / 2, n, mode: PadMode::Constant }
            } else {
                DimMap::id()
            };
        }
        Ok(map)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "CenterCropPad", |spec| Ok(Box::new(MappedOp(CenterCropPad { axes: spec.ints_opt("axes")? }))));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{DType, Tensor};

    fn ccp(x: Tensor, shape: &[i64]) -> Case {
        Case::new("CenterCropPad").opset(18).input(x).constant(i64_vec(shape))
    }

    /// An f64 reference from the spec: output index `o` along an axis reads input
    /// `o + crop_start - pad_start`, zero outside.
    fn reference(x: &[f64], dims: &[usize], target: &[usize]) -> Vec<f64> {
        let shift: Vec<i64> = dims.iter().zip(target).map(|(&d, &t)| if t < d { ((d - t) / 2) as i64 } else { -(((t - d) / 2) as i64) }).collect();
        let n: usize = target.iter().product();
        (0..n)
            .map(|mut o| {
                let mut off = 0usize;
                let mut ok = true;
                for k in (0..dims.len()).rev() {
                    let i = (o % target[k]) as i64 + shift[k];
                    o /= target[k];
                    ok &= (0..dims[k] as i64).contains(&i);
                    off += i.max(0) as usize * dims[k + 1..].iter().product::<usize>();
                }
                if ok { x[off] } else { 0.0 }
            })
            .collect()
    }

    #[test]
    fn crops_and_pads_like_the_reference() {
        // onnxruntime 1.32: 5x6 (0..30) to 2x9.
        let x = f32s(&[5, 6], &(0..30).map(|v| v as f32).collect::<Vec<_>>());
        let y = ccp(x, &[2, 9]).run_cpu().unwrap().remove(0);
        let row = |a: f64| [0.0, a, a + 1.0, a + 2.0, a + 3.0, a + 4.0, a + 5.0, 0.0, 0.0];
        assert_close(&y, &[row(6.0), row(12.0)].concat(), 0.0, "onnxruntime");
        let x = rand_f32(&[4, 7, 5], 1);
        for target in [[4usize, 7, 5], [3, 10, 2], [8, 1, 6], [0, 7, 9]] {
            let y = ccp(x.clone(), &target.map(|v| v as i64)).run_cpu().unwrap().remove(0);
            assert_eq!(y.dims(), &target);
            assert_close(&y, &reference(&x.to_f64_vec(), &[4, 7, 5], &target), 0.0, &format!("{target:?}"));
        }
        // Axes (negative too); integer dtypes bit for bit.
        let xi = Tensor::from_slice(&[3, 4, 2], &(0..24).map(|v| v * 1_000_000_007i64).collect::<Vec<_>>()).unwrap();
        let y = ccp(xi.clone(), &[2, 1]).attr("axes", ints(&[-2, 0])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 2, 2]);
        assert_eq!(y.to_i64_vec().unwrap(), [10, 11, 12, 13].map(|v| v * 1_000_000_007i64));
        let y = ccp(cast(&xi, DType::U8), &[5]).attr("axes", ints(&[2])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[3, 4, 5]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let x = rand_f32(&[4, 5], 1);
        let e = ccp(x.clone(), &[2]).run_cpu().unwrap_err().to_string();
        assert!(e.contains("must have one value per axis (2 axes"), "{e}");
        let e = ccp(x.clone(), &[2, -1]).run_cpu().unwrap_err().to_string();
        assert!(e.contains("negative size -1"), "{e}");
        let e = ccp(x.clone(), &[2, 2]).attr("axes", ints(&[0, 0])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("repeated"), "{e}");
        let e = Case::new("CenterCropPad").opset(18).input(x).input(i64_vec(&[2, 2])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("shape must be known"), "{e}");
    }
}
