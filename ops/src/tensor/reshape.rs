//! Reshape and Flatten: views that give the same elements new dims.
use super::common::{const_ints, COPY};
use crate::cpu::CpuKernel;
use crate::op::required;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};

/// Reshape: target shape from input 1 (opset >= 5) or the `shape` attribute (opset < 5).
/// 0 copies the input dim (unless `allowzero`), one -1 is inferred.
#[derive(Debug)]
pub struct Reshape {
    allowzero: bool,
    shape_attr: Option<Vec<i64>>,
}

/// The output dims of reshaping `input` to `shape` (ONNX rules).
pub(crate) fn reshape_dims(input: &[usize], shape: &[i64], allowzero: bool) -> Result<Vec<usize>> {
    let total: usize = input.iter().product();
    let bad = |why: String| OpError::invalid(format!("cannot reshape {input:?} to {shape:?}: {why}"));
    let mut out = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 => {
                if infer_at.replace(i).is_some() {
                    return Err(bad("more than one -1".into()));
                }
                out.push(1);
            }
            0 if !allowzero => {
                let d = input.get(i).ok_or_else(|| bad(format!("0 at position {i} copies a dim the input does not have")))?;
                out.push(*d);
            }
            s if s < 0 => return Err(bad(format!("negative dim {s}"))),
            s => out.push(s as usize),
        }
    }
    let known = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| bad("size overflows".into()))?;
    if let Some(i) = infer_at {
        if known == 0 {
            if allowzero && shape.contains(&0) {
                return Err(bad("-1 together with a 0 dim (allowzero=1)".into()));
            }
            if total != 0 {
                return Err(bad("-1 cannot be inferred next to a 0 dim".into()));
            }
            out[i] = 0;
        } else if !total.is_multiple_of(known) {
            return Err(bad(format!("{total} elements are not a multiple of {known}")));
        } else {
            out[i] = total / known;
        }
    } else if known != total {
        return Err(bad(format!("{total} elements vs {known}")));
    }
    Ok(out)
}

impl Op for Reshape {
    fn name(&self) -> &str {
        "Reshape"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        let shape = match &self.shape_attr {
            Some(s) => s.clone(),
            None => const_ints(inputs, 1, "Reshape's shape")?,
        };
        Ok(vec![TensorType::new(x.dtype(), reshape_dims(x.dims(), &shape, self.allowzero)?)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(&COPY)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(&COPY)
    }

    fn is_view(&self) -> bool {
        true
    }
}

/// Flatten: 2-D view `[prod(dims[..axis]), prod(dims[axis..])]`.
#[derive(Debug)]
pub struct Flatten {
    axis: i64,
}

impl Op for Flatten {
    fn name(&self) -> &str {
        "Flatten"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        let r = x.rank() as i64;
        if self.axis < -r || self.axis > r {
            return Err(OpError::invalid(format!("Flatten axis {} is out of range for rank {r}", self.axis)));
        }
        let axis = if self.axis < 0 { self.axis + r } else { self.axis } as usize;
        let outer = x.dims()[..axis].iter().product::<usize>();
        let inner = x.dims()[axis..].iter().product::<usize>();
        Ok(vec![TensorType::new(x.dtype(), vec![outer, inner])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(&COPY)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(&COPY)
    }

    fn is_view(&self) -> bool {
        true
    }
}

fn parse_reshape(spec: &NodeSpec) -> Result<Reshape> {
    let shape_attr = if spec.opset < 5 || (spec.n_inputs() < 2 && spec.has("shape")) {
        Some(spec.ints_opt("shape")?.ok_or_else(|| spec.bad("shape", "required before opset 5"))?)
    } else {
        None
    };
    Ok(Reshape { allowzero: spec.int("allowzero", 0)? != 0, shape_attr })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Reshape", |spec| Ok(Box::new(parse_reshape(spec)?)));
    r.register("", "Flatten", |spec| Ok(Box::new(Flatten { axis: spec.int("axis", 1)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::{Attr, DType, Tensor};

    #[test]
    fn reshape_rules() {
        assert_eq!(reshape_dims(&[2, 3, 4], &[0, -1], false).unwrap(), vec![2, 12]);
        assert_eq!(reshape_dims(&[2, 3, 4], &[4, 0, 2], false).unwrap(), vec![4, 3, 2]);
        assert_eq!(reshape_dims(&[0, 3], &[3, 0], true).unwrap(), vec![3, 0]);
        assert_eq!(reshape_dims(&[0, 3], &[-1, 3], false).unwrap(), vec![0, 3]);
        assert_eq!(reshape_dims(&[1], &[], false).unwrap(), Vec::<usize>::new());
        let e = reshape_dims(&[2, 3], &[4, -1], false).unwrap_err().to_string();
        assert!(e.contains("[2, 3]") && e.contains("[4, -1]"), "{e}");
        assert!(reshape_dims(&[2, 3], &[-1, -1], false).is_err());
        assert!(reshape_dims(&[2, 3], &[5], false).unwrap_err().to_string().contains("[5]"));
        assert!(reshape_dims(&[2, 3], &[1, 1, 0], false).is_err());
    }

    #[test]
    fn reshape_and_flatten_run() {
        let x = iota_i64(&[2, 3, 5]);
        let op = make("Reshape", 14, &[], 2, 1).unwrap();
        assert!(op.is_view());
        let s = i64s(&[3], &[3, -1, 0]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s)], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[3, 2, 5]);
        assert_eq!(out[0].bytes(), x.bytes());
        // non-constant shape is a clear error
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&s)], &[]), &[]).unwrap_err().to_string().contains("constant"));
        let old = make("Reshape", 4, &[("shape", ints(&[-1]))], 1, 1).unwrap();
        assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[30]);

        let b = Tensor::from_bools(&[2, 3, 1], &[true, false, true, true, false, false]).unwrap();
        for (axis, want) in [(0i64, [1usize, 6]), (1, [2, 3]), (-1, [6, 1]), (3, [6, 1])] {
            let f = make("Flatten", 13, &[("axis", Attr::Int(axis))], 1, 1).unwrap();
            let out = run(f.as_ref(), &as_inputs(&[Some(&b)], &[]), &[]).unwrap();
            assert_eq!(out[0].dims(), &want, "axis {axis}");
            assert_eq!(out[0].dtype(), DType::Bool);
        }
        let f = make("Flatten", 13, &[("axis", Attr::Int(4))], 1, 1).unwrap();
        assert!(run(f.as_ref(), &as_inputs(&[Some(&b)], &[]), &[]).is_err());
    }
}
