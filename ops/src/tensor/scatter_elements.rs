//! ScatterElements (and the deprecated Scatter of opsets 9-10): a copy of `data` where
//! `out[c with its axis coordinate replaced by indices[c]] (reduction)= updates[c]`
//! for every position `c` of `indices`/`updates`; reductions none/add/mul/max/min.
//!
//! Updates are applied in row-major order of `indices`, so with duplicate indices and
//! `reduction=none` the last one in that order wins, on the CPU and on the GPU alike
//! (ONNX leaves the result undefined). Out-of-range indices (after adding the axis
//! size to negative ones) are an error on the CPU and, when the indices are a
//! constant, at specialisation; the GPU kernel reports a run-time one through the run's
//! status word (the run fails naming the node).
//!
//! GPU: one invocation per output element scans the updates that can reach it (the
//! `axis` dim of `indices`), in order; that dim must be at most
//! [`wgsl::MAX_LOOP_ITERATIONS`] long.
use super::numeric::{store, Num};
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

/// How an update combines with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduction {
    pub fn parse(spec: &NodeSpec) -> Result<Reduction> {
        Ok(match spec.string("reduction", "none")?.as_str() {
            "none" => Reduction::None,
            "add" => Reduction::Add,
            "mul" => Reduction::Mul,
            "max" => Reduction::Max,
            "min" => Reduction::Min,
            r => return Err(spec.bad("reduction", format!("expected none, add, mul, max or min, found '{r}'"))),
        })
    }

    pub fn apply_f(self, a: f64, u: f64) -> f64 {
        match self {
            Reduction::None => u,
            Reduction::Add => a + u,
            Reduction::Mul => a * u,
            Reduction::Max => a.max(u),
            Reduction::Min => a.min(u),
        }
    }

    pub fn apply_i(self, a: i64, u: i64) -> i64 {
        match self {
            Reduction::None => u,
            Reduction::Add => a.wrapping_add(u),
            Reduction::Mul => a.wrapping_mul(u),
            Reduction::Max => a.max(u),
            Reduction::Min => a.min(u),
        }
    }

    /// WGSL expression combining `acc` with `u`.
    pub fn wgsl(self) -> &'static str {
        match self {
            Reduction::None => "u",
            Reduction::Add => "acc + u",
            Reduction::Mul => "acc * u",
            Reduction::Max => "max(acc, u)",
            Reduction::Min => "min(acc, u)",
        }
    }
}

/// Applies `updates` to a copy of `data` at flat offsets `targets` (one per update
/// element, in order).
pub(crate) fn apply_updates(data: &Tensor, updates: &Tensor, targets: &[usize], red: Reduction, out: &mut Tensor) -> Result<()> {
    // f32 data replaced or summed into (gradients' scatter-adds): in f32, in place,
    // as the GPU kernel sums.
    if data.dtype() == DType::F32 && updates.dtype() == DType::F32 && matches!(red, Reduction::None | Reduction::Add) {
        let mut d = data.as_slice::<f32>()?.to_vec();
        for (&t, &v) in targets.iter().zip(updates.as_slice::<f32>()?) {
            d[t] = if red == Reduction::Add { d[t] + v } else { v };
        }
        return store(out, Tensor::from_vec(data.dims(), d)?);
    }
    let result = match (Num::of(data), Num::of(updates)) {
        (Num::F(mut d), Num::F(u)) => {
            for (&t, &v) in targets.iter().zip(&u) {
                d[t] = red.apply_f(d[t], v);
            }
            Num::F(d)
        }
        (Num::I(mut d), Num::I(u)) => {
            for (&t, &v) in targets.iter().zip(&u) {
                d[t] = red.apply_i(d[t], v);
            }
            Num::I(d)
        }
        _ => return Err(OpError::input(2, format!("updates ({}) must have the dtype of data ({})", updates.dtype(), data.dtype()))),
    };
    store(out, result.into_tensor(data.dtype(), data.dims())?)
}

/// `raw` made non-negative against `n`, or an error naming the index and the bound.
pub(crate) fn norm_index(raw: i64, n: usize, what: &str) -> Result<usize> {
    let j = if raw < 0 { raw + n as i64 } else { raw };
    if (0..n as i64).contains(&j) {
        Ok(j as usize)
    } else {
        Err(OpError::input(1, format!("index {raw} is out of range for {what} of size {n} (valid: {} ..= {})", -(n as i64), n as i64 - 1)))
    }
}

#[derive(Debug)]
pub struct ScatterElements {
    axis: i64,
    reduction: Reduction,
}

impl ScatterElements {
    /// Checks the shapes; returns the normalised axis.
    fn check(&self, inputs: &[Option<Arg>]) -> Result<usize> {
        let (data, idx, upd) = (required(inputs, 0)?, required(inputs, 1)?, required(inputs, 2)?);
        if !idx.dtype().is_int() {
            return Err(OpError::input(1, format!("indices must be integers, found {}", idx.dtype())));
        }
        if upd.dtype() != data.dtype() {
            return Err(OpError::input(2, format!("updates ({}) must have the dtype of data ({})", upd.dtype(), data.dtype())));
        }
        if idx.dims() != upd.dims() {
            return Err(OpError::input(2, format!("updates {:?} must have the shape of indices {:?}", upd.dims(), idx.dims())));
        }
        let (d, i) = (data.dims(), idx.dims());
        if d.is_empty() || d.len() != i.len() {
            return Err(OpError::input(1, format!("data {d:?} and indices {i:?} must have the same rank (>= 1)")));
        }
        let axis = norm_axis(self.axis, d.len())?;
        if let Some(k) = (0..d.len()).find(|&k| k != axis && i[k] > d[k]) {
            return Err(OpError::input(1, format!("indices {i:?} exceed data {d:?} in dim {k}")));
        }
        Ok(axis)
    }

    /// Flat output offset of every update, in order (validating the indices).
    fn targets(&self, data: &[usize], idx_dims: &[usize], idx: &[i64], axis: usize) -> Result<Vec<usize>> {
        let ds = strides(data);
        let mut coord = vec![0usize; idx_dims.len()];
        let mut out = Vec::with_capacity(idx.len());
        let n = data[axis] as i64;
        for &raw in idx {
            let j = if raw < 0 { raw + n } else { raw };
            if !(0..n).contains(&j) {
                return Err(norm_index(raw, data[axis], &format!("axis {axis} of data {data:?}")).unwrap_err());
            }
            let j = j as usize;
            out.push(coord.iter().enumerate().map(|(d, &c)| if d == axis { j } else { c } * ds[d]).sum());
            for d in (0..coord.len()).rev() {
                coord[d] += 1;
                if coord[d] < idx_dims[d] {
                    break;
                }
                coord[d] = 0;
            }
        }
        Ok(out)
    }
}

impl Op for ScatterElements {
    fn name(&self) -> &str {
        "ScatterElements"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let axis = self.check(inputs)?;
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        if let Some(v) = idx.value {
            self.targets(data.dims(), idx.dims(), &v.to_i64_vec()?, axis)?;
        }
        Ok(vec![data.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ScatterElements {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let axis = super::common::tensor_args(inputs, |a| self.check(a))?;
        let (data, idx, upd) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, cpu::input(inputs, 2)?);
        let targets = self.targets(data.dims(), idx.dims(), &idx.to_i64_vec()?, axis)?;
        apply_updates(data, upd, &targets, self.reduction, &mut outputs[0])
    }
}

impl WgslKernel for ScatterElements {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let axis = self.check(inputs)?;
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        let (d, i) = (data.dims(), idx.dims());
        let steps = i[axis];
        if steps > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "ScatterElements with {steps} updates along axis {axis}: the GPU kernel scans them in one \
                 invocation, at most {}; run this model on the CPU",
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let is = strides(i);
        let ty = wgsl::elem(data.dtype());
        let mut body = String::from("var r = i;\n");
        let mut inside = vec![];
        let mut base = vec!["0u".to_string()];
        for k in (0..d.len()).rev() {
            if k == 0 {
                let _ = writeln!(body, "    let c{k} = r;");
            } else {
                let _ = writeln!(body, "    let c{k} = r % {}u;\n    r = r / {}u;", d[k].max(1), d[k].max(1));
            }
            if k != axis {
                if i[k] < d[k] {
                    inside.push(format!("c{k} < {}u", i[k]));
                }
                base.push(format!("c{k} * {}u", is[k]));
            }
        }
        let inside = if inside.is_empty() { "true".to_string() } else { inside.join(" && ") };
        let _ = write!(
            body,
            "    var acc = data[i];\n    if ({inside}) {{\n        let base = {};\n        \
             for (var k = 0u; k < {steps}u; k = k + 1u) {{\n            let at = base + k * {}u;\n            \
             var j = idx[at];\n            if (j < 0i) {{ j = j + {}i; }}\n            \
             if (j < 0i || j >= {n}i) {{ {report} }}\n            \
             if (j == i32(c{axis})) {{\n                let u = upd[at];\n                acc = {};\n            }}\n        }}\n    }}\n    out[i] = acc;",
            base.join(" + "),
            is[axis],
            d[axis],
            self.reduction.wgsl(),
            n = d[axis],
            report = wgsl::report_index_error("idx[at]", &format!("{}i", d[axis]))
        );
        let buffers = [("data", ty, true), ("idx", "i32", true), ("upd", ty, true), ("out", ty, false)];
        let b = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0), Binding::Status];
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("ScatterElements", outputs[0].len(), wg, &buffers, b, &wgsl::status_decl(4), &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ScatterElements", |spec| {
        Ok(Box::new(ScatterElements { axis: spec.int("axis", 0)?, reduction: Reduction::parse(spec)? }))
    });
    r.register("", "Scatter", |spec| Ok(Box::new(ScatterElements { axis: spec.int("axis", 0)?, reduction: Reduction::None })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::{Attr, DType};

    /// Naive reference: updates applied in row-major order of the indices.
    fn reference(data: &[f64], d: &[usize], idx: &[i64], i: &[usize], upd: &[f64], axis: usize, red: Reduction) -> Vec<f64> {
        let mut out = data.to_vec();
        let ds = strides(d);
        for (p, (&raw, &u)) in idx.iter().zip(upd).enumerate() {
            let mut rem = p;
            let mut off = 0;
            for k in (0..i.len()).rev() {
                let c = rem % i[k];
                rem /= i[k];
                let c = if k == axis { (raw + if raw < 0 { d[k] as i64 } else { 0 }) as usize } else { c };
                off += c * ds[k];
            }
            out[off] = red.apply_f(out[off], u);
        }
        out
    }

    #[test]
    fn scatter_elements_matches_reference() {
        let d = [4usize, 5, 3];
        let data = iota_f32(&d);
        let i = [3usize, 2, 3];
        let upd = Tensor::from_f64(DType::F32, &i, &(0..18).map(|v| v as f64 * 0.5 - 3.0).collect::<Vec<_>>()).unwrap();
        for axis in [0i64, 1, 2, -1] {
            let a = axis.rem_euclid(3) as usize;
            let n = d[a] as i64;
            let idx: Vec<i64> = (0..18).map(|v| (v * 7 % (2 * n)) - n).collect(); // duplicates and negatives
            let it = Tensor::from_slice(&i, &idx).unwrap();
            for (name, red) in [("none", Reduction::None), ("add", Reduction::Add), ("mul", Reduction::Mul), ("max", Reduction::Max), ("min", Reduction::Min)] {
                let op = make("ScatterElements", 18, &[("axis", Attr::Int(axis)), ("reduction", Attr::String(name.into()))], 3, 1).unwrap();
                let want = reference(&data.to_f64_vec(), &d, &idx, &i, &upd.to_f64_vec(), a, red);
                let got = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&it), Some(&upd)], &[1]), &[]).unwrap();
                assert_eq!(got[0].to_f64_vec(), want, "axis {axis} {name}");
                let di = Tensor::from_f64(DType::I32, &d, &data.to_f64_vec()).unwrap();
                let ui = Tensor::from_f64(DType::I32, &i, &upd.to_f64_vec().iter().map(|v| v.round()).collect::<Vec<_>>()).unwrap();
                let want = reference(&di.to_f64_vec(), &d, &idx, &i, &ui.to_f64_vec(), a, red);
                assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&di), Some(&it), Some(&ui)], &[]), &[]).unwrap()[0].to_f64_vec(), want);
            }
        }
        // Scatter (opset 9) is ScatterElements without reduction
        let op = make("Scatter", 9, &[("axis", Attr::Int(1))], 3, 1).unwrap();
        let data = f32s(&[1, 5], &[1., 2., 3., 4., 5.]);
        let got = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[1, 2], &[1, 3])), Some(&f32s(&[1, 2], &[1.1, 2.1]))], &[]), &[]).unwrap();
        assert_eq!(got[0], f32s(&[1, 5], &[1.0, 1.1, 3.0, 2.1, 5.0]));
    }

    #[test]
    fn scatter_elements_rejects_bad_input() {
        let op = make("ScatterElements", 18, &[("axis", Attr::Int(1))], 3, 1).unwrap();
        let data = iota_f32(&[2, 3]);
        let upd = f32s(&[1, 1], &[9.0]);
        for bad in [3i64, -4] {
            let idx = i64s(&[1, 1], &[bad]);
            for consts in [vec![1usize], vec![]] {
                let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&idx), Some(&upd)], &consts), &[]).unwrap_err().to_string();
                assert!(e.contains(&format!("index {bad} is out of range")) && e.contains("size 3"), "{e}");
            }
        }
        let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[1, 2], &[0, 0])), Some(&upd)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("shape of indices"), "{e}");
        let e = run(op.as_ref(), &as_inputs(&[Some(&data), Some(&i64s(&[3, 1], &[0, 0, 0])), Some(&f32s(&[3, 1], &[0.; 3]))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("exceed data"), "{e}");
        assert!(make("ScatterElements", 18, &[("reduction", Attr::String("avg".into()))], 3, 1).is_err());
    }
}
