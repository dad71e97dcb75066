//! TopK: the `k` largest (or smallest) elements along `axis` and their indices (i64),
//! sorted best first; equal values keep the lower index first, as ONNX specifies.
//! `k` is an attribute before opset 10 and a constant input from then on. NaN ranks
//! above every number on the CPU; the GPU kernel does not order NaNs.
//!
//! GPU: one invocation per input element counts the elements of its line that rank
//! before it (the line length must be at most [`wgsl::MAX_LOOP_ITERATIONS`]) and,
//! when that rank is below `k`, writes itself to that output position.
use super::common::const_ints;
use super::numeric::{split_at_axis, store, Num, NUMERIC};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::cmp::Ordering;

#[derive(Debug)]
pub struct TopK {
    axis: i64,
    largest: bool,
    /// `k` from the attribute (opset < 10).
    k_attr: Option<i64>,
}

impl TopK {
    /// (outer, n, inner, axis, k).
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize, usize, usize, usize)> {
        let x = required(inputs, 0)?;
        expect_dtype(inputs, 0, &NUMERIC)?;
        let k = match self.k_attr {
            Some(k) => k,
            None => {
                let v = const_ints(inputs, 1, "k")?;
                if v.len() != 1 {
                    return Err(OpError::input(1, format!("k must hold one value, found {}", v.len())));
                }
                v[0]
            }
        };
        if x.rank() == 0 {
            return Err(OpError::input(0, "TopK needs an input of rank >= 1"));
        }
        let axis = norm_axis(self.axis, x.rank())?;
        let (outer, n, inner) = split_at_axis(x.dims(), axis);
        if k < 0 || k as usize > n {
            return Err(OpError::input(1, format!("k = {k} must be in 0..={n} (the size of axis {axis} of shape {:?})", x.dims())));
        }
        Ok((outer, n, inner, axis, k as usize))
    }

    /// Whether value `a` at index `ia` ranks before `b` at `ib`.
    fn order(&self, a: f64, b: f64) -> Ordering {
        let c = match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        };
        if self.largest {
            c.reverse()
        } else {
            c
        }
    }
}

impl Op for TopK {
    fn name(&self) -> &str {
        "TopK"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (_, _, _, axis, k) = self.plan(inputs)?;
        let x = required(inputs, 0)?;
        let mut dims = x.dims().to_vec();
        dims[axis] = k;
        Ok(vec![TensorType::new(x.dtype(), dims.clone()), TensorType::new(DType::I64, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// The order of line `line` (its values), best first, ties by index.
fn ranked<T: Copy>(line: &mut [usize], vals: &[T], cmp: impl Fn(T, T) -> Ordering) {
    line.sort_by(|&a, &b| cmp(vals[a], vals[b]).then(a.cmp(&b)));
}

impl CpuKernel for TopK {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (outer, n, inner, _, k) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let vals = Num::of(x);
        let mut out_idx = vec![0i64; outer * k * inner];
        let mut order: Vec<usize> = Vec::with_capacity(n);
        let mut line_f = Vec::with_capacity(n);
        let mut line_i = Vec::with_capacity(n);
        for o in 0..outer {
            for r in 0..inner {
                order.clear();
                order.extend(0..n);
                match &vals {
                    Num::F(v) => {
                        line_f.clear();
                        line_f.extend((0..n).map(|p| v[(o * n + p) * inner + r]));
                        ranked(&mut order, &line_f, |a, b| self.order(a, b));
                    }
                    Num::I(v) => {
                        line_i.clear();
                        line_i.extend((0..n).map(|p| v[(o * n + p) * inner + r]));
                        let unsigned = !x.dtype().is_signed();
                        ranked(&mut order, &line_i, |a: i64, b: i64| {
                            let c = if unsigned { (a as u64).cmp(&(b as u64)) } else { a.cmp(&b) };
                            if self.largest {
                                c.reverse()
                            } else {
                                c
                            }
                        });
                    }
                }
                for (j, &p) in order.iter().take(k).enumerate() {
                    out_idx[(o * k + j) * inner + r] = p as i64;
                }
            }
        }
        let gather = |p: usize| {
            let (o, rest) = (p / (k * inner), p % (k * inner));
            let r = rest % inner;
            (o * n + out_idx[p] as usize) * inner + r
        };
        let values = match vals {
            Num::F(v) => Num::F((0..out_idx.len()).map(|p| v[gather(p)]).collect()),
            Num::I(v) => Num::I((0..out_idx.len()).map(|p| v[gather(p)]).collect()),
        };
        let dims = outputs[0].dims().to_vec();
        store(&mut outputs[0], values.into_tensor(x.dtype(), &dims)?)?;
        store(&mut outputs[1], Tensor::from_slice(&dims, &out_idx)?)
    }
}

impl WgslKernel for TopK {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (outer, n, inner, _, k) = self.plan(inputs)?;
        if n > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "TopK over an axis of {n} elements: the GPU kernel ranks each element in one invocation, at most {}; \
                 run this model on the CPU",
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let better = if self.largest { ">" } else { "<" };
        let inner = inner.max(1);
        let body = format!(
            "let r = i % {inner}u;\n    let p = (i / {inner}u) % {n}u;\n    let o = i / ({inner}u * {n}u);\n    \
             let base = o * {n}u * {inner}u + r;\n    let v = src[i];\n    var rank = 0u;\n    \
             for (var m = 0u; m < {n}u; m = m + 1u) {{\n        let w = src[base + m * {inner}u];\n        \
             if (w {better} v || (w == v && m < p)) {{ rank = rank + 1u; }}\n    }}\n    \
             if (rank < {k}u) {{\n        let at = (o * {k}u + rank) * {inner}u + r;\n        vals[at] = v;\n        idx[at] = i32(p);\n    }}"
        );
        let buffers = [("src", ty, true), ("vals", ty, false), ("idx", "i32", false)];
        let b = vec![Binding::Input(0), Binding::Output(0), Binding::Output(1)];
        let wg = tune.get(&wgsl::workgroup_param());
        let len = if k == 0 { 0 } else { outer * n * inner };
        Ok(WgslProgram::single(wgsl::simple_kernel("TopK", len, wg, &buffers, b, "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "TopK", |spec| {
        let flag = |a: &str| -> Result<bool> {
            match spec.int(a, 1)? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(spec.bad(a, format!("must be 0 or 1, found {v}"))),
            }
        };
        // `sorted=0` allows any order; the sorted order is one of them.
        flag("sorted")?;
        let k_attr = if spec.opset < 10 { Some(spec.int_opt("k")?.ok_or_else(|| spec.bad("k", "is required before opset 10"))?) } else { None };
        Ok(Box::new(TopK { axis: spec.int("axis", -1)?, largest: flag("largest")?, k_attr }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::Attr;

    #[test]
    fn top_k_matches_reference_with_ties() {
        let dims = [3usize, 6, 2];
        let vals: Vec<f64> = (0..36).map(|v| ((v * 5) % 7) as f64).collect(); // many ties
        for dt in [DType::F32, DType::I64, DType::U64, DType::F16] {
            let x = Tensor::from_f64(dt, &dims, &vals).unwrap();
            for axis in [0i64, 1, -1] {
                let a = axis.rem_euclid(3) as usize;
                for largest in [0i64, 1] {
                    let k = dims[a] - 1;
                    let op = make("TopK", 11, &[("axis", Attr::Int(axis)), ("largest", Attr::Int(largest))], 2, 2).unwrap();
                    let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[k as i64]))], &[1]), &[]).unwrap();
                    let (outer, n, inner) = split_at_axis(&dims, a);
                    let (mut wv, mut wi) = (vec![0.0; outer * k * inner], vec![0.0; outer * k * inner]);
                    for o in 0..outer {
                        for r in 0..inner {
                            let mut line: Vec<(f64, usize)> = (0..n).map(|p| (vals[(o * n + p) * inner + r], p)).collect();
                            line.sort_by(|x, y| {
                                let c = x.0.partial_cmp(&y.0).unwrap();
                                (if largest == 1 { c.reverse() } else { c }).then(x.1.cmp(&y.1))
                            });
                            for j in 0..k {
                                wv[(o * k + j) * inner + r] = line[j].0;
                                wi[(o * k + j) * inner + r] = line[j].1 as f64;
                            }
                        }
                    }
                    assert_eq!(got[0].to_f64_vec(), wv, "{dt} axis {axis} largest {largest}");
                    assert_eq!(got[1].to_f64_vec(), wi, "{dt} axis {axis} largest {largest}");
                    assert_eq!(got[1].dtype(), DType::I64);
                }
            }
        }
        // opset 1: k attribute
        let op = make("TopK", 1, &[("k", Attr::Int(2))], 1, 2).unwrap();
        let got = run(op.as_ref(), &as_inputs(&[Some(&f32s(&[4], &[1.0, 4.0, 2.0, 4.0]))], &[]), &[]).unwrap();
        assert_eq!(got[0], f32s(&[2], &[4.0, 4.0]));
        assert_eq!(got[1], i64s(&[2], &[1, 3]));
    }

    #[test]
    fn top_k_errors() {
        let op = make("TopK", 11, &[], 2, 2).unwrap();
        let x = iota_f32(&[2, 3]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[4]))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("k = 4 must be in 0..=3"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[1], &[1]))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("k must be known"), "{e}");
        assert!(make("TopK", 9, &[], 1, 2).is_err());
    }
}
