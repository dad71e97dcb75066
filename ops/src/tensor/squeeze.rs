//! Squeeze and Unsqueeze: views that remove or insert size-1 dims. Axes are an
//! attribute before opset 13 and a (constant) input from 13 on.
use super::common::{norm_axes, opt_const_ints, COPY};
use crate::cpu::CpuKernel;
use crate::op::required;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};

/// Where the axes come from.
#[derive(Debug, Clone)]
enum Axes {
    Attr(Option<Vec<i64>>),
    Input,
}

impl Axes {
    fn parse(spec: &NodeSpec) -> Result<Axes> {
        Ok(if spec.opset < 13 { Axes::Attr(spec.ints_opt("axes")?) } else { Axes::Input })
    }

    fn get(&self, inputs: &[Option<Arg>]) -> Result<Option<Vec<i64>>> {
        match self {
            Axes::Attr(a) => Ok(a.clone()),
            Axes::Input => opt_const_ints(inputs, 1, "axes"),
        }
    }
}

#[derive(Debug)]
pub struct Squeeze {
    axes: Axes,
}

impl Op for Squeeze {
    fn name(&self) -> &str {
        "Squeeze"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        let dims = x.dims();
        let out: Vec<usize> = match self.axes.get(inputs)? {
            None => dims.iter().copied().filter(|&d| d != 1).collect(),
            Some(axes) => {
                let axes = norm_axes(&axes, dims.len())?;
                for &a in &axes {
                    if dims[a] != 1 {
                        return Err(OpError::invalid(format!(
                            "cannot squeeze axis {a} of shape {dims:?}: its size is {}, not 1",
                            dims[a]
                        )));
                    }
                }
                dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
            }
        };
        Ok(vec![TensorType::new(x.dtype(), out)])
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

#[derive(Debug)]
pub struct Unsqueeze {
    axes: Axes,
}

impl Op for Unsqueeze {
    fn name(&self) -> &str {
        "Unsqueeze"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        let axes = self.axes.get(inputs)?.ok_or_else(|| OpError::invalid("Unsqueeze needs axes"))?;
        let rank = x.rank() + axes.len();
        let axes = norm_axes(&axes, rank)?;
        let mut src = x.dims().iter();
        let out: Vec<usize> = (0..rank).map(|i| if axes.contains(&i) { 1 } else { *src.next().unwrap_or(&1) }).collect();
        Ok(vec![TensorType::new(x.dtype(), out)])
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

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Squeeze", |spec| Ok(Box::new(Squeeze { axes: Axes::parse(spec)? })));
    r.register("", "Unsqueeze", |spec| Ok(Box::new(Unsqueeze { axes: Axes::parse(spec)? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn squeeze_variants() {
        let x = iota_f32(&[1, 3, 1, 5]);
        let all = make("Squeeze", 13, &[], 1, 1).unwrap();
        assert_eq!(run(all.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[3, 5]);
        let ax = i64s(&[1], &[-2]);
        let one = make("Squeeze", 13, &[], 2, 1).unwrap();
        let out = run(one.as_ref(), &as_inputs(&[Some(&x), Some(&ax)], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[1, 3, 5]);
        assert_eq!(out[0].bytes(), x.bytes());
        let old = make("Squeeze", 11, &[("axes", ints(&[0]))], 1, 1).unwrap();
        assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[3, 1, 5]);
        let bad = i64s(&[1], &[1]);
        let e = run(one.as_ref(), &as_inputs(&[Some(&x), Some(&bad)], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("size is 3"), "{e}");
        let oor = i64s(&[1], &[4]);
        assert!(run(one.as_ref(), &as_inputs(&[Some(&x), Some(&oor)], &[1]), &[]).unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn unsqueeze_variants() {
        let x = iota_i64(&[3, 4, 5]);
        let u = make("Unsqueeze", 13, &[], 2, 1).unwrap();
        let ax = i64s(&[3], &[0, 4, -1]);
        let out = run(u.as_ref(), &as_inputs(&[Some(&x), Some(&ax)], &[1]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[1, 3, 4, 5, 1, 1]);
        let old = make("Unsqueeze", 11, &[("axes", ints(&[1, 3]))], 1, 1).unwrap();
        assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[3, 1, 4, 1, 5]);
        let s = kiln_graph::Tensor::scalar(7i64);
        let ax0 = i64s(&[1], &[0]);
        assert_eq!(run(u.as_ref(), &as_inputs(&[Some(&s), Some(&ax0)], &[1]), &[]).unwrap()[0].dims(), &[1]);
        let dup = i64s(&[2], &[1, 1]);
        assert!(run(u.as_ref(), &as_inputs(&[Some(&x), Some(&dup)], &[1]), &[]).unwrap_err().to_string().contains("repeated"));
    }
}
