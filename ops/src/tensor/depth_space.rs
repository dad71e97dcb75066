//! DepthToSpace and SpaceToDepth: move `blocksize x blocksize` blocks between the
//! channel dim and the spatial dims of an NCHW tensor, in DCR (depth-column-row) or
//! CRD (column-row-depth) channel order. Both are a 6-D transpose, run through the
//! shared [`IndexMap`] gather (so every dtype works).
use super::index_map::{DimMap, IndexMap};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct BlockMove {
    to_space: bool,
    blocksize: usize,
    crd: bool,
}

impl BlockMove {
    fn name_str(&self) -> &'static str {
        if self.to_space {
            "DepthToSpace"
        } else {
            "SpaceToDepth"
        }
    }

    /// The 6-D gather and the 4-D output dims.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(IndexMap, Vec<usize>)> {
        let x = required(inputs, 0)?;
        let &[n, c, h, w] = x.dims() else {
            return Err(OpError::input(0, format!("{} needs a 4-D NCHW input, found shape {:?}", self.name_str(), x.dims())));
        };
        let b = self.blocksize;
        let (hw, chw) = (h * w, c * h * w);
        if self.to_space {
            if c % (b * b) != 0 {
                return Err(OpError::input(0, format!("channels ({c}) must be a multiple of blocksize^2 ({})", b * b)));
            }
            let co = c / (b * b);
            // out[n, co, h, b1, w, b2] = x[n, channel(co, b1, b2), h, w]
            let (s_co, s_b1, s_b2) = if self.crd { (b * b * hw, b * hw, hw) } else { (hw, b * co * hw, co * hw) };
            let map = IndexMap {
                out_dims: vec![n, co, h, b, w, b],
                maps: vec![DimMap::id(); 6],
                strides: vec![chw, s_co, w, s_b1, 1, s_b2],
                base: 0,
            };
            Ok((map, vec![n, co, h * b, w * b]))
        } else {
            if h % b != 0 || w % b != 0 {
                return Err(OpError::input(0, format!("height ({h}) and width ({w}) must be multiples of blocksize ({b})")));
            }
            let (ho, wo) = (h / b, w / b);
            // DCR: out[n, b1, b2, c, ho, wo]; CRD: out[n, c, b1, b2, ho, wo]; = x[n, c, ho*b + b1, wo*b + b2]
            let (out_dims, strides) = if self.crd {
                (vec![n, c, b, b, ho, wo], vec![chw, hw, w, 1, b * w, b])
            } else {
                (vec![n, b, b, c, ho, wo], vec![chw, w, 1, hw, b * w, b])
            };
            let map = IndexMap { out_dims, maps: vec![DimMap::id(); 6], strides, base: 0 };
            Ok((map, vec![n, c * b * b, ho, wo]))
        }
    }
}

impl Op for BlockMove {
    fn name(&self) -> &str {
        self.name_str()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), self.plan(inputs)?.1)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for BlockMove {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (map, _) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        map.run(x, &mut outputs[0], &vec![0; x.dtype().size()])
    }
}

impl WgslKernel for BlockMove {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (map, _) = self.plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let d = map.dispatch(self.name_str(), ty, wg, Binding::Input(0), Binding::Output(0), &wgsl::literal(ty, 0.0), &[]);
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for (name, to_space) in [("DepthToSpace", true), ("SpaceToDepth", false)] {
        r.register("", name, move |spec| {
            let b = spec.int_opt("blocksize")?.ok_or_else(|| spec.bad("blocksize", "is required"))?;
            if !(1..=1 << 16).contains(&b) {
                return Err(spec.bad("blocksize", format!("must be positive, found {b}")));
            }
            let crd = match spec.string("mode", "DCR")?.as_str() {
                "DCR" => false,
                "CRD" => true,
                m => return Err(spec.bad("mode", format!("expected DCR or CRD, found '{m}'"))),
            };
            Ok(Box::new(BlockMove { to_space, blocksize: b as usize, crd }))
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    /// numpy-style reference of the ONNX definitions (reshape + transpose + reshape).
    fn depth_to_space(x: &[f64], [n, c, h, w]: [usize; 4], b: usize, crd: bool) -> Vec<f64> {
        let co = c / (b * b);
        let mut y = vec![0.0; x.len()];
        for ni in 0..n {
            for ci in 0..co {
                for hi in 0..h * b {
                    for wi in 0..w * b {
                        let (b1, b2) = (hi % b, wi % b);
                        let ch = if crd { ci * b * b + b1 * b + b2 } else { (b1 * b + b2) * co + ci };
                        y[((ni * co + ci) * h * b + hi) * w * b + wi] = x[((ni * c + ch) * h + hi / b) * w + wi / b];
                    }
                }
            }
        }
        y
    }

    #[test]
    fn round_trips_and_reference() {
        let dims = [2usize, 8, 3, 5];
        let x = iota_f32(&dims);
        for mode in ["DCR", "CRD"] {
            let d2s = make("DepthToSpace", 13, &[("blocksize", Attr::Int(2)), ("mode", Attr::String(mode.into()))], 1, 1).unwrap();
            let y = run(d2s.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
            assert_eq!(y.dims(), &[2, 2, 6, 10]);
            assert_eq!(y.to_f64_vec(), depth_to_space(&x.to_f64_vec(), dims, 2, mode == "CRD"), "{mode}");
            let s2d = make("SpaceToDepth", 13, &[("blocksize", Attr::Int(2)), ("mode", Attr::String(mode.into()))], 1, 1).unwrap();
            let back = run(s2d.as_ref(), &as_inputs(&[Some(&y)], &[]), &[]).unwrap().remove(0);
            assert_eq!(back, x, "{mode} round trip");
            let xi = iota_i64(&dims);
            let yi = run(d2s.as_ref(), &as_inputs(&[Some(&xi)], &[]), &[]).unwrap().remove(0);
            assert_eq!(run(s2d.as_ref(), &as_inputs(&[Some(&yi)], &[]), &[]).unwrap()[0], xi);
        }
        let d2s = make("DepthToSpace", 13, &[("blocksize", Attr::Int(3))], 1, 1).unwrap();
        let e = run(d2s.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("multiple of blocksize^2"), "{e}");
        let s2d = make("SpaceToDepth", 13, &[("blocksize", Attr::Int(2))], 1, 1).unwrap();
        let e = run(s2d.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("multiples of blocksize"), "{e}");
        assert!(run(s2d.as_ref(), &as_inputs(&[Some(&iota_f32(&[4, 4]))], &[]), &[]).is_err());
        assert!(make("DepthToSpace", 13, &[], 1, 1).is_err());
    }
}
