//! MeanVarianceNormalization (opset 9/13): `(x - mean) / (std + 1e-9)` with the mean
//! and (population) standard deviation taken over `axes` (default [0, 2, 3]). Each
//! group of elements sharing the kept indices is normalised on its own. WGSL: one
//! invocation per group, or a workgroup of lanes per big group
//! ([`super::plane_lanes`]); element offsets come from baked stride functions.
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const EPSILON: f64 = 1e-9;

#[derive(Debug)]
pub struct Mvn {
    axes: Vec<i64>,
}

/// Dims and strides of the kept axes and of the reduced axes.
struct Split {
    kept: (Vec<usize>, Vec<usize>),
    reduced: (Vec<usize>, Vec<usize>),
}

impl Split {
    fn groups(&self) -> usize {
        self.kept.0.iter().product()
    }
    fn size(&self) -> usize {
        self.reduced.0.iter().product()
    }
}

/// Offset of linear index `i` over `dims` with `strides`.
fn offset(mut i: usize, (dims, st): &(Vec<usize>, Vec<usize>)) -> usize {
    let mut o = 0;
    for d in (0..dims.len()).rev() {
        o += (i % dims[d]) * st[d];
        i /= dims[d];
    }
    o
}

impl Mvn {
    fn split(&self, dims: &[usize]) -> Result<Split> {
        let mut reduced = vec![false; dims.len()];
        for &a in &self.axes {
            let a = norm_axis(a, dims.len())?;
            let slot = reduced.get_mut(a).ok_or_else(|| OpError::input(0, format!("axis {a} is out of range for the input shape {dims:?}")))?;
            if std::mem::replace(slot, true) {
                return Err(OpError::invalid(format!("axis {a} is listed twice in axes {:?}", self.axes)));
            }
        }
        let st = strides(dims);
        let pick = |want: bool| -> (Vec<usize>, Vec<usize>) { (0..dims.len()).filter(|&d| reduced[d] == want).map(|d| (dims[d], st[d])).unzip() };
        Ok(Split { kept: pick(false), reduced: pick(true) })
    }
}

impl Op for Mvn {
    fn name(&self) -> &str {
        "MeanVarianceNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        self.split(x.dims())?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Mvn {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let s = self.split(x.dims())?;
        let (groups, size) = (s.groups(), s.size());
        if groups * size == 0 {
            return Ok(());
        }
        let mut v = x.to_f64_vec();
        let offsets: Vec<usize> = (0..size).map(|r| offset(r, &s.reduced)).collect();
        for g in 0..groups {
            let base = offset(g, &s.kept);
            let mean = offsets.iter().map(|&o| v[base + o]).sum::<f64>() / size as f64;
            let var = offsets.iter().map(|&o| (v[base + o] - mean).powi(2)).sum::<f64>() / size as f64;
            let div = var.sqrt() + EPSILON;
            offsets.iter().for_each(|&o| v[base + o] = (v[base + o] - mean) / div);
        }
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &v)?;
        Ok(())
    }
}

impl WgslKernel for Mvn {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let s = self.split(required(inputs, 0)?.dims())?;
        let (groups, size) = (s.groups(), s.size());
        if groups * size == 0 {
            return Ok(WgslProgram::default());
        }
        let helpers = wgsl::offset_fn("kept_at", &s.kept.0, &s.kept.1) + &wgsl::offset_fn("reduced_at", &s.reduced.0, &s.reduced.1);
        let buffers = [("x", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Output(0)];
        let nl = wgsl::literal("f32", size as f64);
        let eps = wgsl::literal("f32", EPSILON);
        let write = "let o = base + reduced_at(j);\ny[o] = (x[o] - mean) * inv;";
        let lanes = plane_lanes(self.name(), size, 3, 2)?;
        if lanes == 1 {
            let n = format!("{size}u");
            let body = format!(
                "let base = kept_at(i);\n    var mean = 0.0;\n    {}    mean = mean / {nl};\n    var v = 0.0;\n    {}    let inv = 1.0 / (sqrt(v / {nl}) + {eps});\n    {}",
                wgsl::for_loop("j", "0u", &n, "1u", "mean = mean + x[base + reduced_at(j)];"),
                wgsl::for_loop("j", "0u", &n, "1u", "let d = x[base + reduced_at(j)] - mean;\nv = v + d * d;"),
                wgsl::for_loop("j", "0u", &n, "1u", write),
            );
            let wg = tune.get(&wgsl::workgroup_param());
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), groups, wg, &buffers, bindings, &helpers, &body)));
        }
        let sum = "red[lid.x] + red[lid.x + w]";
        let body = format!(
            "let base = kept_at(i);\n    var t = 0.0;\n    {}    {}    let mean = red[0] / {nl};\n    workgroupBarrier();\n    t = 0.0;\n    {}    {}    let inv = 1.0 / (sqrt(red[0] / {nl}) + {eps});\n    {}",
            lane_loop(size, lanes, "t = t + x[base + reduced_at(j)];"),
            tree(lanes, sum),
            lane_loop(size, lanes, "let d = x[base + reduced_at(j)] - mean;\nt = t + d * d;"),
            tree(lanes, sum),
            lane_loop(size, lanes, write),
        );
        let mut d = lanes_dispatch(self.name(), groups, lanes, &buffers, bindings, &body);
        d.source = format!("{helpers}\n{}", d.source);
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MeanVarianceNormalization", |spec: &NodeSpec| Ok(Box::new(Mvn { axes: spec.ints("axes", &[0, 2, 3])? })));
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use crate::testing::ints;

    #[test]
    fn mvn_matches_a_reference() {
        for (dims, axes) in [(vec![3usize, 3, 3, 1], vec![0i64, 2, 3]), (vec![2, 3, 4, 5], vec![1]), (vec![2, 3, 4], vec![-1, 0]), (vec![1, 3, 60, 70], vec![0, 2, 3])] {
            let x = rand_f32(&dims, 5);
            let y = run(make("MeanVarianceNormalization", 19, &[("axes", ints(&axes))], 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
            // Reference: for every element, the statistics of the elements that agree with
            // it on every kept axis (quadratic, fine for these sizes except the big one).
            let xv = x.to_f64_vec();
            let rank = dims.len();
            let red: Vec<bool> = (0..rank).map(|d| axes.iter().any(|&a| (if a < 0 { a + rank as i64 } else { a }) as usize == d)).collect();
            let st = crate::broadcast::strides(&dims);
            let key = |i: usize| -> Vec<usize> { (0..rank).filter(|&d| !red[d]).map(|d| (i / st[d]) % dims[d]).collect() };
            let mut stats = std::collections::HashMap::new();
            for (i, &v) in xv.iter().enumerate() {
                let e = stats.entry(key(i)).or_insert((0.0, 0.0, 0.0));
                e.0 += v;
                e.1 += v * v;
                e.2 += 1.0;
            }
            let want: Vec<f64> = xv
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (s, s2, n) = stats[&key(i)];
                    let mean = s / n;
                    (v - mean) / ((s2 / n - mean * mean).max(0.0).sqrt() + 1e-9)
                })
                .collect();
            assert_close(&y, &want, 1e-4, &format!("MVN {dims:?} axes {axes:?}"));
        }
        assert!(run(make("MeanVarianceNormalization", 19, &[("axes", ints(&[1, 1]))], 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&rand_f32(&[2, 3], 1))], &[]), &[]).is_err());
    }
}
