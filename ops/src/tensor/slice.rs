//! Slice: strided windows along chosen axes. Before opset 10 starts/ends/axes are
//! attributes; from 10 on they are (constant) inputs, with steps (negative allowed).
//! Out-of-range starts/ends (e.g. INT64_MAX) are clamped as in numpy.
use super::common::{const_ints, norm_axes, opt_const_ints};
use super::index_map::{DimMap, IndexMap, MappedOp, PlansIndexMap};
use crate::op::required;
use crate::{Arg, NodeSpec, OpError, Registry, Result};

/// Slice parameters held as attributes (opset < 10).
#[derive(Debug, Clone)]
struct AttrParams {
    starts: Vec<i64>,
    ends: Vec<i64>,
    axes: Option<Vec<i64>>,
}

#[derive(Debug)]
pub struct Slice {
    attrs: Option<AttrParams>,
}

/// (start, output length) of slicing a dim of size `dim` by start/end/step (ONNX rules).
pub(crate) fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> (i64, usize) {
    let d = dim as i64;
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (mut s, mut e) = (norm(start), norm(end));
    // numpy semantics (the ONNX reference): a negative step clamps to [-1, dim - 1].
    let len = if step > 0 {
        s = s.max(0).min(d);
        e = e.max(0).min(d);
        if e > s { (e - s + step - 1) / step } else { 0 }
    } else {
        s = s.max(-1).min(d - 1);
        e = e.max(-1).min(d - 1);
        if s > e { (s - e - step - 1) / -step } else { 0 }
    };
    (s, len.max(0) as usize)
}

impl PlansIndexMap for Slice {
    const NAME: &'static str = "Slice";

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<IndexMap> {
        let x = required(inputs, 0)?;
        let (starts, ends, axes, steps) = match &self.attrs {
            Some(a) => (a.starts.clone(), a.ends.clone(), a.axes.clone(), None),
            None => (
                const_ints(inputs, 1, "Slice's starts")?,
                const_ints(inputs, 2, "Slice's ends")?,
                opt_const_ints(inputs, 3, "Slice's axes")?,
                opt_const_ints(inputs, 4, "Slice's steps")?,
            ),
        };
        let n = starts.len();
        let axes = axes.unwrap_or_else(|| (0..n as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; n]);
        if ends.len() != n || axes.len() != n || steps.len() != n {
            return Err(OpError::invalid(format!(
                "starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} must have the same length"
            )));
        }
        let axes_n = norm_axes(&axes, x.rank())?;
        if x.rank() == 0 && n > 0 {
            return Err(OpError::input(0, "Slice needs an input of rank 1 or more"));
        }
        let mut map = IndexMap {
            out_dims: x.dims().to_vec(),
            maps: vec![DimMap::id(); x.rank()],
            strides: crate::broadcast::strides(x.dims()),
            base: 0,
        };
        for k in 0..n {
            if steps[k] == 0 {
                return Err(OpError::invalid(format!("Slice step for axis {} is 0", axes[k])));
            }
            let a = axes_n[k];
            let (start, len) = slice_range(x.dims()[a], starts[k], ends[k], steps[k]);
            map.out_dims[a] = len;
            map.maps[a] = DimMap::Affine { start, step: steps[k] };
        }
        Ok(map)
    }
}

fn parse(spec: &NodeSpec) -> Result<Slice> {
    if spec.opset >= 10 {
        return Ok(Slice { attrs: None });
    }
    let starts = spec.ints_opt("starts")?.ok_or_else(|| spec.bad("starts", "required before opset 10"))?;
    let ends = spec.ints_opt("ends")?.ok_or_else(|| spec.bad("ends", "required before opset 10"))?;
    Ok(Slice { attrs: Some(AttrParams { starts, ends, axes: spec.ints_opt("axes")? }) })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Slice", |spec| Ok(Box::new(MappedOp(parse(spec)?))));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::slice_range;

    /// Python's range(len)[start:end:step] semantics as a list of indices.
    fn py_slice(len: i64, start: i64, end: i64, step: i64) -> Vec<i64> {
        let norm = |v: i64, lo: i64, hi: i64| {
            let v = if v < 0 { v.saturating_add(len) } else { v };
            v.max(lo).min(hi)
        };
        let (s, e) = if step > 0 { (norm(start, 0, len), norm(end, 0, len)) } else { (norm(start, -1, len - 1), norm(end, -1, len - 1)) };
        let mut out = vec![];
        let mut i = s;
        while (step > 0 && i < e) || (step < 0 && i > e) {
            out.push(i);
            i += step;
        }
        out
    }

    #[test]
    fn ranges_match_python() {
        for len in [0usize, 1, 5, 7] {
            for start in [-9i64, -3, -1, 0, 2, 6, 9, i64::MIN, i64::MAX] {
                for end in [-9i64, -1, 0, 3, 7, 10, i64::MIN, i64::MAX] {
                    for step in [-3i64, -1, 1, 2, 5] {
                        let want = py_slice(len as i64, start, end, step);
                        let (s, n) = slice_range(len, start, end, step);
                        let got: Vec<i64> = (0..n as i64).map(|k| s + k * step).collect();
                        assert_eq!(got, want, "len {len} [{start}:{end}:{step}]");
                    }
                }
            }
        }
    }

    #[test]
    fn slice_opsets_and_errors() {
        let x = iota_f32(&[5, 7, 3]);
        let op = make("Slice", 13, &[], 5, 1).unwrap();
        let (st, en, ax, sp) = (i64s(&[2], &[-1, 1]), i64s(&[2], &[i64::MIN, i64::MAX]), i64s(&[2], &[1, 0]), i64s(&[2], &[-2, 3]));
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&st), Some(&en), Some(&ax), Some(&sp)], &[1, 2, 3, 4]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[2, 4, 3]);
        let xv = x.to_f64_vec();
        let mut want = vec![];
        for i in [1usize, 4] {
            for j in [6usize, 4, 2, 0] {
                for k in 0..3 {
                    want.push(xv[i * 21 + j * 3 + k]);
                }
            }
        }
        assert_eq!(out[0].to_f64_vec(), want);
        let xi = iota_i64(&[5, 7, 3]);
        let outi = run(op.as_ref(), &as_inputs(&[Some(&xi), Some(&st), Some(&en), Some(&ax), Some(&sp)], &[1, 2, 3, 4]), &[]).unwrap();
        assert_eq!(outi[0].to_f64_vec(), want);
        // opset 9 attributes, default axes
        let old = make("Slice", 9, &[("starts", ints(&[1])), ("ends", ints(&[3]))], 1, 1).unwrap();
        assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].dims(), &[2, 7, 3]);
        // three inputs only (default axes and steps)
        let op3 = make("Slice", 13, &[], 3, 1).unwrap();
        let out = run(op3.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[10])), Some(&i64s(&[1], &[20]))], &[1, 2]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[0, 7, 3]);
        let zero = i64s(&[1], &[0]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&zero), Some(&zero), Some(&zero), Some(&zero)], &[1, 2, 3, 4]), &[]).unwrap_err();
        assert!(e.to_string().contains("step"), "{e}");
        let bad_axis = i64s(&[1], &[3]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&zero), Some(&zero), Some(&bad_axis), None], &[1, 2, 3]), &[]).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&zero), Some(&zero), None, None], &[1]), &[]).unwrap_err();
        assert!(e.to_string().contains("constant"), "{e}");
    }
}
