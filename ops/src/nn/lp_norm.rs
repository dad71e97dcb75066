//! LpNormalization: `x / ||x||_p` along one `axis` (default -1), p = 1 or 2; a zero
//! norm gives zeros. WGSL: one invocation per vector, or a workgroup of lanes per long
//! vector ([`super::plane_lanes`]).
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct LpNorm {
    axis: i64,
    p: i64,
}

impl LpNorm {
    /// (vectors, length, stride): vector `r` starts at `(r / stride) * length * stride +
    /// r % stride`, its elements `stride` apart.
    fn layout(&self, dims: &[usize]) -> Result<(usize, usize, usize)> {
        if dims.is_empty() {
            return Ok((1, 1, 1));
        }
        let a = norm_axis(self.axis, dims.len())?;
        let inner: usize = dims[a + 1..].iter().product();
        Ok((dims[..a].iter().product::<usize>() * inner, dims[a], inner))
    }
}

impl Op for LpNorm {
    fn name(&self) -> &str {
        "LpNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        self.layout(x.dims())?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for LpNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (vectors, len, stride) = self.layout(x.dims())?;
        let mut v = x.to_f64_vec();
        for r in 0..vectors {
            let at = |k: usize| (r / stride) * len * stride + r % stride + k * stride;
            let norm = if self.p == 1 { (0..len).map(|k| v[at(k)].abs()).sum::<f64>() } else { (0..len).map(|k| v[at(k)] * v[at(k)]).sum::<f64>().sqrt() };
            for k in 0..len {
                v[at(k)] = if norm == 0.0 { 0.0 } else { v[at(k)] / norm };
            }
        }
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &v)?;
        Ok(())
    }
}

impl WgslKernel for LpNorm {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (vectors, len, stride) = self.layout(required(inputs, 0)?.dims())?;
        if vectors * len == 0 {
            return Ok(WgslProgram::default());
        }
        let buffers = [("x", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Output(0)];
        let acc = if self.p == 1 { "t = t + abs(x[start + j * STRIDE]);" } else { "let v = x[start + j * STRIDE];\nt = t + v * v;" }.replace("STRIDE", &format!("{stride}u"));
        let norm = if self.p == 1 { "SUM" } else { "sqrt(SUM)" };
        let write = format!("y[start + j * {stride}u] = x[start + j * {stride}u] * inv;");
        let start = format!("let start = (i / {stride}u) * {}u + i % {stride}u;\n    var t = 0.0;\n    ", len * stride);
        let lanes = plane_lanes(self.name(), len, 2, 1)?;
        let inv = |sum: &str| format!("let nrm = {};\n    let inv = select(1.0 / nrm, 0.0, nrm == 0.0);\n    ", norm.replace("SUM", sum));
        if lanes == 1 {
            let l = format!("{len}u");
            let body = format!("{start}{}    {}{}", wgsl::for_loop("j", "0u", &l, "1u", &acc), inv("t"), wgsl::for_loop("j", "0u", &l, "1u", &write));
            let wg = tune.get(&wgsl::workgroup_param());
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), vectors, wg, &buffers, bindings, "", &body)));
        }
        let body = format!("{start}{}    {}    {}{}", lane_loop(len, lanes, &acc), tree(lanes, "red[lid.x] + red[lid.x + w]"), inv("red[0]"), lane_loop(len, lanes, &write));
        Ok(WgslProgram::single(lanes_dispatch(self.name(), vectors, lanes, &buffers, bindings, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "LpNormalization", |spec: &NodeSpec| {
        let p = spec.int("p", 2)?;
        if p != 1 && p != 2 {
            return Err(spec.bad("p", format!("expected 1 or 2, found {p}")));
        }
        Ok(Box::new(LpNorm { axis: spec.int("axis", -1)?, p }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn lp_norm_matches_a_reference() {
        for (dims, axis) in [(vec![2usize, 3, 5], -1i64), (vec![2, 3, 5], 1), (vec![4, 7], 0), (vec![2, 5000], 1)] {
            for p in [1i64, 2] {
                let x = rand_f32(&dims, 3);
                let y = run(make("LpNormalization", 19, &[("axis", Attr::Int(axis)), ("p", Attr::Int(p))], 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
                let a = if axis < 0 { dims.len() as i64 + axis } else { axis } as usize;
                let (outer, d, inner): (usize, usize, usize) = (dims[..a].iter().product(), dims[a], dims[a + 1..].iter().product());
                let xv = x.to_f64_vec();
                let mut want = xv.clone();
                for o in 0..outer {
                    for i in 0..inner {
                        let idx = |k: usize| (o * d + k) * inner + i;
                        let norm: f64 = (0..d).map(|k| xv[idx(k)].abs().powi(p as i32)).sum::<f64>().powf(1.0 / p as f64);
                        (0..d).for_each(|k| want[idx(k)] = xv[idx(k)] / norm);
                    }
                }
                assert_close(&y, &want, 1e-5, &format!("LpNormalization {dims:?} axis {axis} p {p}"));
            }
        }
        let zeros = Tensor::from_slice(&[2, 2], &[0f32, 0.0, 3.0, 4.0]).unwrap();
        let y = run(make("LpNormalization", 19, &[], 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&zeros)], &[]), &[]).unwrap().remove(0);
        assert_close(&y, &[0.0, 0.0, 0.6, 0.8], 1e-6, "a zero vector stays zero");
        assert!(make("LpNormalization", 19, &[("p", Attr::Int(3))], 1, 1).is_err());
    }
}
