//! Pad: modes constant, reflect, edge and wrap; negative pads crop. Before opset 11
//! pads and value are attributes (`paddings` in opset 1); from 11 on they are inputs
//! (pads, constant_value, and from 18 axes). The pad value may be a run-time input.
use super::common::{const_ints, norm_axes, opt_const_ints, tensor_args};
use super::index_map::{DimMap, IndexMap, PadMode};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Pad {
    mode: PadMode,
    /// (pads, value) from attributes before opset 11.
    attrs: Option<(Vec<i64>, f32)>,
}

impl Pad {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let rank = x.rank();
        let (pads, axes) = match &self.attrs {
            Some((p, _)) => (p.clone(), (0..rank).collect::<Vec<_>>()),
            None => {
                let pads = const_ints(inputs, 1, "Pad's pads")?;
                let axes = match opt_const_ints(inputs, 3, "Pad's axes")? {
                    Some(a) => norm_axes(&a, rank)?,
                    None => (0..rank).collect(),
                };
                (pads, axes)
            }
        };
        if pads.len() != 2 * axes.len() {
            return Err(OpError::invalid(format!(
                "pads {pads:?} must have 2 values per padded axis ({} axes of input shape {:?})",
                axes.len(),
                x.dims()
            )));
        }
        let mut map = IndexMap {
            out_dims: x.dims().to_vec(),
            maps: vec![DimMap::id(); rank],
            strides: crate::broadcast::strides(x.dims()),
            base: 0,
        };
        for (k, &a) in axes.iter().enumerate() {
            let (before, after) = (pads[k], pads[k + axes.len()]);
            let n = x.dims()[a] as i64;
            let out = n.checked_add(before).and_then(|v| v.checked_add(after)).ok_or_else(|| {
                OpError::invalid(format!("pads {before}, {after} on axis {a} of size {n} overflow the address space"))
            })?;
            if out < 0 {
                return Err(OpError::invalid(format!(
                    "pads {before}, {after} on axis {a} of size {n} give a negative size"
                )));
            }
            if n == 0 && out > 0 && self.mode != PadMode::Constant {
                return Err(OpError::invalid(format!("{:?} padding of the empty axis {a}", self.mode)));
            }
            map.out_dims[a] = out as usize;
            map.maps[a] = DimMap::Pad { before, n, mode: self.mode };
        }
        Ok(map)
    }
}

impl Op for Pad {
    fn name(&self) -> &str {
        "Pad"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        if let Some(v) = inputs.get(2).copied().flatten() {
            if v.ty.len() != 1 {
                return Err(OpError::input(2, format!("constant_value must be a scalar, found shape {:?}", v.dims())));
            }
        }
        Ok(vec![TensorType::new(x.dtype(), self.plan(inputs)?.out_dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Pad {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let map = tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let fill = match (&self.attrs, inputs.get(2).copied().flatten()) {
            (Some((_, v)), _) => Tensor::from_f64(x.dtype(), &[], &[*v as f64])?,
            (None, Some(v)) if v.dtype() == x.dtype() && v.len() == 1 => v.clone(),
            (None, Some(v)) => Tensor::from_f64(x.dtype(), &[], &v.to_f64_vec()[..1.min(v.len())])?,
            (None, None) => Tensor::zeros(x.dtype(), &[]),
        };
        map.run(x, &mut outputs[0], fill.bytes())
    }
}

impl WgslKernel for Pad {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let map = self.plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let mut extra = vec![];
        let fill = match (&self.attrs, inputs.get(2).copied().flatten()) {
            (Some((_, v)), _) => wgsl::literal(ty, *v as f64),
            (None, None) => wgsl::literal(ty, 0.0),
            (None, Some(Arg { value: Some(v), .. })) => wgsl::literal(ty, v.to_f64_vec().first().copied().unwrap_or(0.0)),
            (None, Some(_)) if map.may_fill() => {
                extra.push(("pad_value", Binding::Input(2)));
                "pad_value[0]".to_string()
            }
            (None, Some(_)) => wgsl::literal(ty, 0.0),
        };
        Ok(WgslProgram::single(map.dispatch("Pad", ty, wg, Binding::Input(0), Binding::Output(0), &fill, &extra)))
    }
}

fn parse(spec: &NodeSpec) -> Result<Pad> {
    let mode = match spec.string("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(spec.bad("mode", format!("expected constant, reflect, edge or wrap, found '{m}'"))),
    };
    let attrs = if spec.opset < 11 {
        let name = if spec.opset < 2 && spec.has("paddings") { "paddings" } else { "pads" };
        let pads = spec.ints_opt(name)?.ok_or_else(|| spec.bad(name, "required before opset 11"))?;
        Some((pads, spec.float("value", 0.0)?))
    } else {
        None
    };
    Ok(Pad { mode, attrs })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Pad", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::super::index_map::{pad_index, PadMode};
    use kiln_graph::{Attr, Tensor};

    /// Naive 2-D pad reference (pads = [b0, b1, a0, a1]).
    fn reference(x: &[f64], dims: [usize; 2], pads: [i64; 4], mode: PadMode, value: f64) -> Vec<f64> {
        let out = [dims[0] as i64 + pads[0] + pads[2], dims[1] as i64 + pads[1] + pads[3]];
        let mut v = vec![];
        for i in 0..out[0] {
            for j in 0..out[1] {
                let (a, b) = (pad_index(i - pads[0], dims[0] as i64, mode), pad_index(j - pads[1], dims[1] as i64, mode));
                v.push(match (a, b) {
                    (Some(a), Some(b)) => x[a as usize * dims[1] + b as usize],
                    _ => value,
                });
            }
        }
        v
    }

    #[test]
    fn pad_modes_and_opsets() {
        let dims = [3usize, 5];
        let x = iota_f32(&dims);
        let xi = iota_i64(&dims);
        for (mode, name) in [(PadMode::Constant, "constant"), (PadMode::Reflect, "reflect"), (PadMode::Edge, "edge"), (PadMode::Wrap, "wrap")] {
            for pads in [[1i64, 2, 2, 1], [0, -1, 1, -2], [2, 4, 2, 4]] {
                let op = make("Pad", 19, &[("mode", Attr::String(name.into()))], 3, 1).unwrap();
                let p = i64s(&[4], &pads);
                let v = Tensor::scalar(-1.5f32);
                let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&p), Some(&v)], &[1]), &[]).unwrap();
                let want = reference(&x.to_f64_vec(), dims, pads, mode, -1.5);
                assert_eq!(out[0].to_f64_vec(), want, "{name} {pads:?}");
                let vi = Tensor::scalar(7i64);
                let out = run(op.as_ref(), &as_inputs(&[Some(&xi), Some(&p), Some(&vi)], &[1, 2]), &[]).unwrap();
                assert_eq!(out[0].to_f64_vec(), reference(&xi.to_f64_vec(), dims, pads, mode, 7.0), "{name} {pads:?} i64");
            }
        }
        // opset 2 attributes
        let old = make("Pad", 2, &[("pads", ints(&[0, 1, 0, 1])), ("value", Attr::Float(9.0))], 1, 1).unwrap();
        let out = run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[3, 7]);
        assert_eq!(out[0].to_f64_vec()[..7], [9., 0., 1., 2., 3., 4., 9.]);
        // opset 18 axes
        let op = make("Pad", 18, &[], 4, 1).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[1, 1])), None, Some(&i64s(&[1], &[-1]))], &[1, 3]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[3, 7]);
        // bool data
        let b = Tensor::from_bools(&[2], &[true, false]).unwrap();
        let e = make("Pad", 13, &[("mode", Attr::String("edge".into()))], 2, 1).unwrap();
        let out = run(e.as_ref(), &as_inputs(&[Some(&b), Some(&i64s(&[2], &[1, 2]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].bytes(), &[1, 1, 0, 0, 0]);
        // errors
        let bad = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[3], &[1, 1, 1])), None, None], &[1]), &[]).unwrap_err();
        assert!(bad.to_string().contains("2 values per padded axis"), "{bad}");
        assert!(make("Pad", 13, &[("mode", Attr::String("mirror".into()))], 2, 1).is_err());
    }
}
