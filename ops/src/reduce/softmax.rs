//! Softmax and LogSoftmax. Before opset 13 the input is coerced to 2-D at `axis`
//! (default 1) and each row of `prod(dims[axis..])` elements is normalised; from 13 on
//! the op normalises along the single `axis` (default -1). Both are numerically stable
//! (the row max is subtracted before `exp`). CPU: parallel over rows. WGSL: one
//! invocation per row, or one workgroup per row (`lanes` > 1) with a strided loop and
//! a shared-memory tree reduction.
use super::layout::split_at_axis;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, Dispatch, TuneParam, WgslKernel, WgslProgram, MAX_GROUPS};
use crate::{norm_axis, Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

#[derive(Debug, Clone, PartialEq)]
pub struct Softmax {
    pub log: bool,
    pub axis: i64,
    /// Opset < 13: coerce to 2-D at `axis`.
    pub coerce_2d: bool,
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

impl Softmax {
    pub fn parse(spec: &NodeSpec, log: bool) -> Result<Softmax> {
        let coerce_2d = spec.opset < 13;
        Ok(Softmax { log, axis: spec.int("axis", if coerce_2d { 1 } else { -1 })?, coerce_2d })
    }

    /// `(outer, d, inner)`: rows of `d` elements `inner` apart.
    fn rows(&self, dims: &[usize]) -> Result<(usize, usize, usize)> {
        let axis = norm_axis(self.axis, dims.len())?;
        if dims.is_empty() {
            return Ok((1, 1, 1));
        }
        Ok(if self.coerce_2d {
            (dims[..axis].iter().product(), dims[axis..].iter().product(), 1)
        } else {
            split_at_axis(dims, axis)
        })
    }
}

impl Op for Softmax {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        if self.log { "LogSoftmax" } else { "Softmax" }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        self.rows(x.dims())?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let n = outputs.first().map(|o| o.len()).unwrap_or(0) as u64;
        let bytes = Cost::io_bytes(inputs, outputs);
        Cost { flops: 4 * n, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// The float math the CPU kernel needs, for f32 and f64.
trait Real: Copy + Send + Sync + PartialOrd + std::ops::Sub<Output = Self> + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
    const NEG_INF: Self;
    const ZERO: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn maxv(self, o: Self) -> Self;
    fn recip(self) -> Self;
}

macro_rules! real {
    ($t:ty, $exp:expr) => {
        impl Real for $t {
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            const ZERO: $t = 0.0;
            fn exp(self) -> $t {
                $exp(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn maxv(self, o: $t) -> $t {
                <$t>::max(self, o)
            }
            fn recip(self) -> $t {
                1.0 / self
            }
        }
    };
}
real!(f32, crate::cpu::fast_exp);
real!(f64, f64::exp);

/// Sum in 8 independent lanes (so it vectorizes).
fn lane_sum<T: Real>(v: &[T]) -> T {
    let mut lanes = [T::ZERO; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = *l + x;
        }
    }
    lanes.iter().chain(rest).fold(T::ZERO, |a, &b| a + b)
}

/// Normalises one contiguous row.
fn softmax_row<T: Real>(xr: &[T], or: &mut [T], log: bool) {
    let m = xr.iter().fold(T::NEG_INF, |a, &b| a.maxv(b));
    for (o, &x) in or.iter_mut().zip(xr) {
        *o = (x - m).exp();
    }
    let sum = lane_sum(or);
    if log {
        let ls = sum.ln();
        for (o, &x) in or.iter_mut().zip(xr) {
            *o = (x - m) - ls;
        }
    } else {
        let r = sum.recip();
        for o in or.iter_mut() {
            *o = *o * r;
        }
    }
}

/// Normalises rows of `d` elements at stride `inner`, in parallel over outer blocks.
fn softmax_rows<T: Real>(x: &[T], out: &mut [T], (outer, d, inner): (usize, usize, usize), log: bool) {
    let block = d * inner;
    if block == 0 || outer == 0 || x.len() != out.len() {
        return;
    }
    if inner == 1 {
        cpu::par_chunks_mut(out, d, 8, |first, part| {
            for (q, or) in part.chunks_mut(d).enumerate() {
                softmax_row(&x[(first + q) * d..(first + q + 1) * d], or, log);
            }
        });
        return;
    }
    cpu::par_chunks_mut(out, block, 8, |first, part| {
        for (q, ob) in part.chunks_mut(block).enumerate() {
            let xb = &x[(first + q) * block..(first + q + 1) * block];
            for j in 0..inner {
                let mut m = T::NEG_INF;
                for k in 0..d {
                    m = m.maxv(xb[k * inner + j]);
                }
                let mut sum = T::ZERO;
                for k in 0..d {
                    let e = (xb[k * inner + j] - m).exp();
                    ob[k * inner + j] = e;
                    sum = sum + e;
                }
                if log {
                    let ls = sum.ln();
                    for k in 0..d {
                        ob[k * inner + j] = (xb[k * inner + j] - m) - ls;
                    }
                } else {
                    let r = sum.recip();
                    for k in 0..d {
                        ob[k * inner + j] = ob[k * inner + j] * r;
                    }
                }
            }
        }
    });
}

impl CpuKernel for Softmax {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let rows = self.rows(x.dims())?;
        let out = &mut outputs[0];
        match x.dtype() {
            DType::F32 => softmax_rows(x.as_slice::<f32>()?, out.as_mut_slice::<f32>()?, rows, self.log),
            DType::F64 => softmax_rows(x.as_slice::<f64>()?, out.as_mut_slice::<f64>()?, rows, self.log),
            _ => {
                let xs: Vec<f32> = x.to_f64_vec().into_iter().map(|v| v as f32).collect();
                let mut res = vec![0f32; xs.len()];
                softmax_rows(&xs, &mut res, rows, self.log);
                let res: Vec<f64> = res.into_iter().map(|v| v as f64).collect();
                *out = Tensor::from_f64(out.dtype(), &out.dims().to_vec(), &res)?;
            }
        }
        Ok(())
    }
}

fn lanes_param(rows: usize, d: usize) -> TuneParam {
    // Barrier-free (one invocation per row) unless there are few, long rows.
    let default = if rows < 64 && d >= 1024 { 64 } else { 1 };
    TuneParam { name: "lanes", default, candidates: vec![1, 32, 64, 128, 256] }
}

impl WgslKernel for Softmax {
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        match required(inputs, 0).and_then(|x| self.rows(x.dims())) {
            Ok((outer, d, inner)) => vec![wgsl::workgroup_param(), lanes_param(outer * inner, d)],
            Err(_) => vec![wgsl::workgroup_param()],
        }
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (outer, d, inner) = self.rows(required(inputs, 0)?.dims())?;
        let rows = outer * inner;
        // Three passes over each row per invocation must fit the driver's loop budget.
        let min_lanes = wgsl::lanes_for(3 * d)
            .ok_or_else(|| OpError::Unsupported(format!("a softmax row of {d} elements exceeds the GPU loop budget")))?;
        let lanes = tune.get(&lanes_param(rows, d)).clamp(1, 256).next_power_of_two().max(min_lanes);
        let bufs = wgsl::declare(&[("x", "f32", true), ("out", "f32", false)]);
        // Row r starts at (r / inner) * d * inner + r % inner; elements are `inner` apart.
        let start = format!("(row / {inner}u) * {}u + row % {inner}u", d * inner);
        let at = |k: &str| format!("start + ({k}) * {inner}u");
        let dend = format!("{d}u");
        // `lanes` keeps each invocation within the driver loop budget (wgsl::lanes_for).
        let finish = |first: &str, step: &str| {
            if self.log {
                format!("let ls = log(s);\n    {}", wgsl::for_loop("k", first, &dend, step, &format!("out[{}] = (x[{}] - m) - ls;", at("k"), at("k"))))
            } else {
                format!("let inv = 1.0 / s;\n    {}", wgsl::for_loop("k", first, &dend, step, &format!("out[{}] = exp(x[{}] - m) * inv;", at("k"), at("k"))))
            }
        };
        let neg_inf = wgsl::literal("f32", f64::NEG_INFINITY);
        let dispatch = if lanes == 1 {
            let wg = tune.get(&wgsl::workgroup_param());
            let (grid, index) = wgsl::grid_1d(rows, wg);
            let mut s = bufs;
            let _ = writeln!(s, "\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {index}    let row = i;");
            let _ = writeln!(s, "    let start = {start};\n    var m = {neg_inf};");
            s += &wgsl::for_loop("k", "0u", &dend, "1u", &format!("m = max(m, x[{}]);", at("k")));
            s += "    var s = 0.0;\n";
            s += &wgsl::for_loop("k", "0u", &dend, "1u", &format!("s = s + exp(x[{}] - m);", at("k")));
            s += "    ";
            s += &finish("0u", "1u");
            s += "}\n";
            Dispatch { label: self.name().into(), source: s, entry_point: "main".into(), workgroups: grid, bindings: vec![Binding::Input(0), Binding::Output(0)] }
        } else {
            let gx = rows.clamp(1, MAX_GROUPS as usize);
            let gy = rows.div_ceil(gx).max(1);
            let mut s = bufs;
            let _ = writeln!(s, "var<workgroup> red: array<f32, {lanes}>;\n");
            let _ = writeln!(s, "@compute @workgroup_size({lanes})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{");
            let _ = writeln!(s, "    let row = wid.x + wid.y * {gx}u;\n    if (row >= {rows}u) {{ return; }}\n    let start = {start};");
            let tree = |op: &str| {
                format!(
                    "    red[lid.x] = t;\n    workgroupBarrier();\n    for (var w = {}u; w > 0u; w = w >> 1u) {{\n        if (lid.x < w) {{ red[lid.x] = {op}; }}\n        workgroupBarrier();\n    }}\n",
                    lanes / 2
                )
            };
            let lane_step = format!("{lanes}u");
            let _ = writeln!(s, "    var t = {neg_inf};");
            s += &wgsl::for_loop("k", "lid.x", &dend, &lane_step, &format!("t = max(t, x[{}]);", at("k")));
            s += &tree("max(red[lid.x], red[lid.x + w])");
            s += "    let m = red[0];\n    workgroupBarrier();\n";
            s += "    t = 0.0;\n";
            s += &wgsl::for_loop("k", "lid.x", &dend, &lane_step, &format!("t = t + exp(x[{}] - m);", at("k")));
            s += &tree("red[lid.x] + red[lid.x + w]");
            s += "    let s = red[0];\n    ";
            s += &finish("lid.x", &lane_step);
            s += "}\n";
            Dispatch {
                label: self.name().into(),
                source: s,
                entry_point: "main".into(),
                workgroups: [gx as u32, gy as u32, 1],
                bindings: vec![Binding::Input(0), Binding::Output(0)],
            }
        };
        let _ = outputs;
        Ok(WgslProgram::single(dispatch))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Softmax", |spec| Ok(Box::new(Softmax::parse(spec, false)?)));
    r.register("", "LogSoftmax", |spec| Ok(Box::new(Softmax::parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{Input, first, make, run, tune};
    use super::*;
    use crate::linalg::testing::{assert_close, rand_tensor};
    use kiln_graph::Attr;

    /// Reference: normalise each group of elements sharing all indices outside
    /// `axes_from..=axes_to`, in f64 (naive exp; inputs are small).
    fn reference(x: &Tensor, from: usize, to: usize, log: bool) -> Tensor {
        let dims = x.dims();
        let (outer, d, inner): (usize, usize, usize) = (dims[..from].iter().product(), dims[from..=to].iter().product(), dims[to + 1..].iter().product());
        let v = x.to_f64_vec();
        let mut out = vec![0.0; v.len()];
        for o in 0..outer {
            for j in 0..inner {
                let at = |k: usize| o * d * inner + k * inner + j;
                let sum: f64 = (0..d).map(|k| v[at(k)].exp()).sum();
                for k in 0..d {
                    out[at(k)] = if log { v[at(k)] - sum.ln() } else { v[at(k)].exp() / sum };
                }
            }
        }
        Tensor::from_f64(x.dtype(), dims, &out).unwrap()
    }

    #[test]
    fn opsets_axes_and_variants() {
        let x = rand_tensor(DType::F32, &[3, 4, 5], 11);
        let tunes = [TuneValues::default(), tune(&[("lanes", 64)]), tune(&[("lanes", 32)])];
        for (name, log) in [("Softmax", false), ("LogSoftmax", true)] {
            // opset 13+: a single axis.
            for (axis, a) in [(0i64, 0), (1, 1), (2, 2), (-1, 2), (-2, 1)] {
                let got = run(&*make(name, 13, &[("axis", Attr::Int(axis))], 1, 1).unwrap(), &[Input::Data(x.clone())], &tunes).map(first).unwrap();
                assert_close(&got, &reference(&x, a, a, log), &format!("{name} axis {axis} v13"));
            }
            let got = run(&*make(name, 13, &[], 1, 1).unwrap(), &[Input::Data(x.clone())], &tunes).map(first).unwrap();
            assert_close(&got, &reference(&x, 2, 2, log), &format!("{name} default v13"));
            // opset < 13: coerced to 2-D at axis (default 1).
            for (axis, a) in [(0i64, 0), (1, 1), (2, 2), (-1, 2)] {
                let got = run(&*make(name, 11, &[("axis", Attr::Int(axis))], 1, 1).unwrap(), &[Input::Data(x.clone())], &tunes).map(first).unwrap();
                assert_close(&got, &reference(&x, a, 2, log), &format!("{name} axis {axis} v11"));
            }
            let got = run(&*make(name, 11, &[], 1, 1).unwrap(), &[Input::Data(x.clone())], &tunes).map(first).unwrap();
            assert_close(&got, &reference(&x, 1, 2, log), &format!("{name} default v11"));
            // Large values stay finite (max subtraction).
            let big = Tensor::from_slice(&[2, 4], &[0f32, 1., 2., 3., 10000., 10001., 10002., 10003.]).unwrap();
            let got = run(&*make(name, 13, &[], 1, 1).unwrap(), &[Input::Data(big.clone())], &[]).map(first).unwrap().to_f64_vec();
            assert!(got.iter().all(|v| v.is_finite()), "{got:?}");
            assert!((got[0] - got[4]).abs() < 1e-5);
            // f64, and a big parallel case.
            let xd = rand_tensor(DType::F64, &[2, 7, 3], 5);
            assert_close(&run(&*make(name, 13, &[("axis", Attr::Int(1))], 1, 1).unwrap(), &[Input::Data(xd.clone())], &[]).map(first).unwrap(), &reference(&xd, 1, 1, log), name);
            let xl = rand_tensor(DType::F32, &[333, 129], 5);
            assert_close(&run(&*make(name, 13, &[], 1, 1).unwrap(), &[Input::Data(xl.clone())], &tunes).map(first).unwrap(), &reference(&xl, 1, 1, log), name);
        }
        assert!(run(&*make("Softmax", 13, &[("axis", Attr::Int(3))], 1, 1).unwrap(), &[Input::Data(x.clone())], &[]).map(first).is_err());
        assert!(run(&*make("Softmax", 13, &[], 1, 1).unwrap(), &[Input::Data(rand_tensor(DType::I64, &[3], 1))], &[]).map(first).is_err());
    }
}

