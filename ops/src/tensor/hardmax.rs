//! Hardmax: 1 at the first maximum of each line along `axis`, 0 elsewhere. From opset
//! 13 the line is `axis` alone (default -1); before, the input is seen as a 2-D matrix
//! `[prod(dims[..axis]), prod(dims[axis..])]` (default axis 1), as the old Softmax did.
//!
//! GPU: one invocation per element finds the first maximum of its line (the line must
//! be at most [`wgsl::MAX_LOOP_ITERATIONS`] long).
use super::numeric::{split_at_axis, NUMERIC};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Hardmax {
    axis: i64,
    /// Opset < 13: coerce to 2-D at `axis`.
    coerce_2d: bool,
}

impl Hardmax {
    /// (outer, n, inner) of the lines.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize, usize)> {
        let x = required(inputs, 0)?;
        expect_dtype(inputs, 0, &NUMERIC)?;
        if x.rank() == 0 {
            return Err(OpError::input(0, "Hardmax needs an input of rank >= 1"));
        }
        let axis = norm_axis(self.axis, x.rank())?;
        if self.coerce_2d {
            Ok((x.dims()[..axis].iter().product(), x.dims()[axis..].iter().product(), 1))
        } else {
            Ok(split_at_axis(x.dims(), axis))
        }
    }
}

impl Op for Hardmax {
    fn name(&self) -> &str {
        "Hardmax"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        self.plan(inputs)?;
        Ok(vec![required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Hardmax {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (outer, n, inner) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let v = x.to_f64_vec();
        let mut y = vec![0.0; v.len()];
        for o in 0..outer {
            for r in 0..inner {
                let at = |p: usize| (o * n + p) * inner + r;
                let best = (1..n).fold(0, |b, p| if v[at(p)] > v[at(b)] || (v[at(b)].is_nan() && !v[at(p)].is_nan()) { p } else { b });
                if n > 0 {
                    y[at(best)] = 1.0;
                }
            }
        }
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for Hardmax {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (_, n, inner) = self.plan(inputs)?;
        if n > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "Hardmax over lines of {n} elements: the GPU kernel scans a line in one invocation, at most {}; \
                 run this model on the CPU",
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let inner = inner.max(1);
        let body = format!(
            "let r = i % {inner}u;\n    let p = (i / {inner}u) % {n}u;\n    let base = (i / ({inner}u * {n}u)) * {n}u * {inner}u + r;\n    \
             var best = 0u;\n    var bv = src[base];\n    for (var m = 1u; m < {n}u; m = m + 1u) {{\n        \
             let w = src[base + m * {inner}u];\n        if (w > bv) {{ best = m; bv = w; }}\n    }}\n    \
             dst[i] = select({zero}, {one}, best == p);",
            zero = wgsl::literal(ty, 0.0),
            one = wgsl::literal(ty, 1.0)
        );
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Hardmax",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Hardmax", |spec| {
        let coerce_2d = spec.opset < 13;
        Ok(Box::new(Hardmax { axis: spec.int("axis", if coerce_2d { 1 } else { -1 })?, coerce_2d }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn reference(x: &[f64], outer: usize, n: usize, inner: usize) -> Vec<f64> {
        let mut y = vec![0.0; x.len()];
        for o in 0..outer {
            for r in 0..inner {
                let mut best = 0;
                for p in 1..n {
                    if x[(o * n + p) * inner + r] > x[(o * n + best) * inner + r] {
                        best = p;
                    }
                }
                y[(o * n + best) * inner + r] = 1.0;
            }
        }
        y
    }

    #[test]
    fn hardmax_axes_and_opsets() {
        let dims = [3usize, 4, 5];
        let x = f32s(&dims, &(0..60).map(|v| ((v * 7) % 11) as f32).collect::<Vec<_>>());
        let xv = x.to_f64_vec();
        for axis in [0i64, 1, 2, -1, -3] {
            let a = axis.rem_euclid(3) as usize;
            let op = make("Hardmax", 13, &[("axis", Attr::Int(axis))], 1, 1).unwrap();
            let (o, n, i) = super::split_at_axis(&dims, a);
            assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), reference(&xv, o, n, i), "axis {axis}");
            let old = make("Hardmax", 11, &[("axis", Attr::Int(axis))], 1, 1).unwrap();
            let (o, n) = (dims[..a].iter().product(), dims[a..].iter().product());
            assert_eq!(run(old.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), reference(&xv, o, n, 1), "opset 11 axis {axis}");
        }
        let ties = make("Hardmax", 13, &[], 1, 1).unwrap();
        let x = Tensor::from_f64(kiln_graph::DType::F64, &[2, 3], &[2.0, 2.0, 1.0, -1.0, 3.0, 3.0]).unwrap();
        assert_eq!(run(ties.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let bad = make("Hardmax", 13, &[("axis", Attr::Int(3))], 1, 1).unwrap();
        assert!(run(bad.as_ref(), &as_inputs(&[Some(&iota_f32(&[2, 2]))], &[]), &[]).is_err());
    }
}
