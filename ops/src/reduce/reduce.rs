//! The ReduceX family: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
//! ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare. Axes come from
//! the `axes` attribute before opset 13 (ReduceSum) / 18 (the others) and from the
//! optional constant input 1 after; `keepdims` and `noop_with_empty_axes` as in ONNX.
//! Empty reductions give the identity of the reduction (0, 1, -inf, +inf; NaN for the
//! mean). Floats reduce in f64; integers (and bool for Max/Min) in i64.
use super::kernels::{reduce_rows, ReduceKind};
use super::layout::{normalize_axes, ReduceLayout};
use crate::cpu::{self, CpuKernel};
use crate::tensor::write_i64;
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, Dispatch, TuneParam, WgslKernel, WgslProgram};
use crate::{constant, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

#[derive(Debug, Clone)]
pub struct Reduce {
    pub kind: ReduceKind,
    /// Axes from the attribute (older opsets); `None` means "from input 1 or all".
    pub axes_attr: Option<Vec<i64>>,
    pub axes_from_input: bool,
    pub keepdims: bool,
    pub noop_with_empty_axes: bool,
}

const NUMBERS: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64,
];
const NUMBERS_AND_BOOL: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool,
];

impl Reduce {
    pub fn parse(spec: &NodeSpec, kind: ReduceKind) -> Result<Reduce> {
        let input_since = if kind == ReduceKind::Sum { 13 } else { 18 };
        let axes_from_input = spec.opset >= input_since;
        Ok(Reduce {
            kind,
            axes_attr: if axes_from_input { None } else { spec.ints_opt("axes")? },
            axes_from_input,
            keepdims: spec.int("keepdims", 1)? != 0,
            noop_with_empty_axes: spec.int("noop_with_empty_axes", 0)? != 0,
        })
    }

    /// Normalised axes to reduce (empty = none, i.e. identity), from the attribute or
    /// the axes tensor.
    fn axes(&self, rank: usize, axes_input: Option<&Tensor>) -> Result<Vec<usize>> {
        let given: Option<Vec<i64>> = match (&self.axes_attr, axes_input) {
            (Some(a), _) => Some(a.clone()),
            (None, Some(t)) if self.axes_from_input => Some(t.to_i64_vec().map_err(|e| OpError::input(1, e.to_string()))?),
            _ => None,
        };
        match given {
            Some(a) if !a.is_empty() => normalize_axes(&a, rank),
            _ if self.noop_with_empty_axes => Ok(vec![]),
            _ => Ok((0..rank).collect()),
        }
    }

    fn axes_tensor<'a>(&self, inputs: &[Option<Arg<'a>>]) -> Result<Option<&'a Tensor>> {
        if self.axes_from_input && matches!(inputs.get(1), Some(Some(_))) {
            Ok(Some(constant(inputs, 1, "axes")?))
        } else {
            Ok(None)
        }
    }

    fn out_dims(&self, dims: &[usize], axes: &[usize]) -> Vec<usize> {
        let mut out = vec![];
        for (d, &size) in dims.iter().enumerate() {
            if !axes.contains(&d) {
                out.push(size);
            } else if self.keepdims {
                out.push(1);
            }
        }
        out
    }
}

impl Op for Reduce {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        self.kind.op_name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let allowed = if matches!(self.kind, ReduceKind::Max | ReduceKind::Min) { NUMBERS_AND_BOOL } else { NUMBERS };
        let dtype = expect_dtype(inputs, 0, allowed)?;
        let x = required(inputs, 0)?;
        let axes = self.axes(x.rank(), self.axes_tensor(inputs)?)?;
        Ok(vec![TensorType::new(dtype, self.out_dims(x.dims(), &axes))])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Reduce {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let axes_t = if self.axes_from_input { inputs.get(1).copied().flatten() } else { None };
        let axes = self.axes(x.rank(), axes_t)?;
        let layout = ReduceLayout::new(x.dims(), &axes);
        let out = &mut outputs[0];
        let kind = self.kind;
        let count = layout.reduced_len();
        let merge = |a, b| kind.merge_f64(a, b);
        match x.dtype() {
            DType::F32 => run_f32(kind, &layout, x.as_slice::<f32>()?, out.as_mut_slice::<f32>()?),
            DType::F64 => {
                let xs = x.as_slice::<f64>()?;
                reduce_rows(&layout, out.as_mut_slice::<f64>()?, kind.init_f64(), |a, i| kind.fold_f64(a, xs[i]), merge, |a| kind.finish_f64(a, count));
            }
            d if (d.is_int() || d == DType::Bool) && kind.exact_on_ints() => {
                let xs = x.to_i64_vec()?;
                let mut res = vec![0i64; out.len()];
                let init = kind.init_i64(d);
                reduce_rows(&layout, &mut res, init, |a, i| kind.fold_i64(a, xs[i]), |a, b| kind.merge_i64(a, b), |a| kind.finish_i64(a, count));
                write_i64(out, &res)?;
            }
            _ => {
                // f16/bf16, and L2, LogSum, LogSumExp of integers: in f64, cast back.
                let xs = x.to_f64_vec();
                let mut res = vec![0f64; out.len()];
                reduce_rows(&layout, &mut res, kind.init_f64(), |a, i| kind.fold_f64(a, xs[i]), merge, |a| kind.finish_f64(a, count));
                *out = Tensor::from_f64(out.dtype(), &out.dims().to_vec(), &res)?;
            }
        }
        Ok(())
    }
}

/// f32 input: one monomorphic fold per kind on an f64 accumulator (LogSumExp keeps the
/// general two-field accumulator).
fn run_f32(kind: ReduceKind, layout: &ReduceLayout, xs: &[f32], out: &mut [f32]) {
    let count = layout.reduced_len();
    // Per-channel sums over batch and pixels (normalisation statistics, bias
    // gradients): one pass in memory order, each row summed then added to its channel.
    if let (ReduceKind::Sum | ReduceKind::Mean, Some((a, mid, b))) = (kind, layout.around_middle()) {
        if xs.len() <= 1 << 20 && out.len() == mid && mid > 0 && b > 0 {
            let mut acc = vec![0f64; mid];
            for (k, row) in xs.chunks_exact(b).enumerate() {
                acc[k % mid] += row.iter().map(|&v| v as f64).sum::<f64>();
            }
            let div = if kind == ReduceKind::Mean { (a * b) as f64 } else { 1.0 };
            for (o, s) in out.iter_mut().zip(acc) {
                *o = (s / div) as f32;
            }
            return;
        }
    }
    macro_rules! go {
        ($init:expr, $fold:expr, $merge:expr, $finish:expr) => {
            reduce_rows(layout, out, $init, |a: f64, i: usize| $fold(a, xs[i] as f64), $merge, $finish)
        };
    }
    let add = |a: f64, b: f64| a + b;
    match kind {
        ReduceKind::Sum => go!(0.0, add, add, |a: f64| a as f32),
        ReduceKind::Mean => go!(0.0, add, add, |a: f64| (a / count as f64) as f32),
        ReduceKind::LogSum => go!(0.0, add, add, |a: f64| a.ln() as f32),
        ReduceKind::L1 => go!(0.0, |a: f64, x: f64| a + x.abs(), add, |a: f64| a as f32),
        ReduceKind::SumSquare => go!(0.0, |a: f64, x: f64| a + x * x, add, |a: f64| a as f32),
        ReduceKind::L2 => go!(0.0, |a: f64, x: f64| a + x * x, add, |a: f64| a.sqrt() as f32),
        ReduceKind::Prod => go!(1.0, |a: f64, x: f64| a * x, |a: f64, b: f64| a * b, |a: f64| a as f32),
        ReduceKind::Max | ReduceKind::Min | ReduceKind::LogSumExp => {
            let merge = |a, b| kind.merge_f64(a, b);
            reduce_rows(layout, out, kind.init_f64(), |a, i| kind.fold_f64(a, xs[i] as f64), merge, |a| kind.finish_f64(a, count) as f32)
        }
    }
}

impl WgslKernel for Reduce {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        vec![wgsl::workgroup_param()]
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// An f16 input or output stored as halves is read into (stored from) the f32 the
    /// reduction accumulates in.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (hx, hout) = (halves.input(0), halves.output(0));
        let axes = self.axes(x.rank(), self.axes_tensor(inputs)?)?;
        let layout = ReduceLayout::new(x.dims(), &axes);
        let ty = wgsl::elem(x.dtype());
        // Float math for floats and for the reductions that leave the integers.
        let acc_ty = if ty == "f32" || !self.kind.exact_on_ints() { "f32" } else { ty };
        let k = self.kind;
        // One flat loop over the reduced groups; `r` indexes them, `off` is the offset.
        let total: usize = layout.reduced.iter().map(|g| g.0).product();
        let mut off = String::from("base");
        let mut div = 1usize;
        for &(size, stride) in layout.reduced.iter().rev().filter(|_| total > 0) {
            let idx = if div == 1 { format!("(r % {size}u)") } else { format!("((r / {div}u) % {size}u)") };
            off = format!("{off} + {idx} * {stride}u");
            div *= size;
        }
        let read = if acc_ty == ty && !hx { format!("x[{off}]") } else { format!("{acc_ty}(x[{off}])") };
        // Loop passes over the reduced elements, and the lanes (invocations per output)
        // that keep each invocation within the driver's loop budget.
        let passes = if k == ReduceKind::LogSumExp { 2 } else { 1 };
        let lanes = wgsl::lanes_for(passes * total).ok_or_else(|| {
            OpError::Unsupported(format!("{} over {total} elements per output exceeds the GPU loop budget", self.name()))
        })?;
        let lanes = if lanes == 1 && total >= 4096 && outputs[0].len() < 256 { 64 } else { lanes };
        let store = |res: &str| if hout { wgsl::store(res, "f32", true) } else if acc_ty == ty { res.to_string() } else { format!("{ty}({res})") };
        let out_ty = if hout { "f16" } else { wgsl::elem(outputs[0].dtype) };
        let x_ty = if hx { "f16" } else { ty };
        let n = outputs[0].len();
        let helpers = wgsl::offset_fn("outer_base", &layout.outer.iter().map(|g| g.0).collect::<Vec<_>>(), &layout.outer.iter().map(|g| g.1).collect::<Vec<_>>());
        let prologue = format!("let base = outer_base(i / {inner}u) + i % {inner}u;\n", inner = layout.inner);
        if lanes == 1 {
            let wg = tune.get(&wgsl::workgroup_param());
            let lp = |stmt: &str| wgsl::for_loop("r", "0u", &format!("{total}u"), "1u", &format!("let v = {read};\n{stmt}"));
            let mut body = prologue;
            if k == ReduceKind::LogSumExp {
                let _ = writeln!(body, "var m = {};", wgsl::literal("f32", f64::NEG_INFINITY));
                body += &lp("m = max(m, v);");
                body += "var acc = 0.0;\n";
                body += &lp("acc = acc + exp(v - m);");
                body += "let res = select(m + log(acc), m, abs(m) > 3.0e38);\n";
            } else {
                let _ = writeln!(body, "var acc = {};", k.wgsl_init(acc_ty));
                body += &lp(&format!("acc = {};", k.wgsl_fold("acc", "v", acc_ty)));
                let _ = writeln!(body, "let res = {};", k.wgsl_finish("acc", total, acc_ty));
            }
            let _ = writeln!(body, "out[i] = {};", store("res"));
            let buffers = [("x", x_ty, true), ("out", out_ty, false)];
            let mut d = wgsl::simple_kernel(self.name(), n, wg, &buffers, vec![Binding::Input(0), Binding::Output(0)], &helpers, &body);
            d.source = wgsl::with_halves(d.source, halves.any());
            return Ok(WgslProgram::single(d));
        }
        // A workgroup of `lanes` invocations per output: strided partial folds, then a
        // tree combine in workgroup memory.
        let gx = n.clamp(1, wgsl::MAX_GROUPS as usize);
        let gy = n.div_ceil(gx).max(1);
        let lp = |stmt: &str| wgsl::for_loop("r", "lid.x", &format!("{total}u"), &format!("{lanes}u"), &format!("let v = {read};\n{stmt}"));
        let tree = |combine: &str| {
            format!(
                "red[lid.x] = t;\nworkgroupBarrier();\nfor (var w = {}u; w > 0u; w = w >> 1u) {{\n    if (lid.x < w) {{ red[lid.x] = {combine}; }}\n    workgroupBarrier();\n}}\n",
                lanes / 2
            )
        };
        let combine = match k {
            ReduceKind::Max | ReduceKind::Min => k.wgsl_fold("red[lid.x]", "red[lid.x + w]", acc_ty),
            ReduceKind::Prod => "red[lid.x] * red[lid.x + w]".to_string(),
            _ => "red[lid.x] + red[lid.x + w]".to_string(),
        };
        let mut body = prologue;
        if k == ReduceKind::LogSumExp {
            let _ = writeln!(body, "var t = {};", wgsl::literal("f32", f64::NEG_INFINITY));
            body += &lp("t = max(t, v);");
            body += &tree("max(red[lid.x], red[lid.x + w])");
            body += "let m = red[0];\nworkgroupBarrier();\nt = 0.0;\n";
            body += &lp("t = t + exp(v - m);");
            body += &tree(&combine);
            body += "let acc = red[0];\nlet res = select(m + log(acc), m, abs(m) > 3.0e38);\n";
        } else {
            let _ = writeln!(body, "var t = {};", k.wgsl_init(acc_ty));
            body += &lp(&format!("t = {};", k.wgsl_fold("t", "v", acc_ty)));
            body += &tree(&combine);
            let _ = writeln!(body, "let res = {};", k.wgsl_finish("red[0]", total, acc_ty));
        }
        let _ = writeln!(body, "if (lid.x == 0u) {{ out[i] = {}; }}", store("res"));
        let source = format!(
            "{}\nvar<workgroup> red: array<{acc_ty}, {lanes}>;\n{helpers}\n@compute @workgroup_size({lanes})\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{\n\
             let i = wid.x + wid.y * {gx}u;\nif (i >= {n}u) {{ return; }}\n{body}}}\n",
            wgsl::declare(&[("x", x_ty, true), ("out", out_ty, false)])
        );
        Ok(WgslProgram::single(Dispatch {
            label: self.name().into(),
            source: wgsl::with_halves(source, halves.any()),
            entry_point: "main".into(),
            workgroups: [gx as u32, gy as u32, 1],
            bindings: vec![Binding::Input(0), Binding::Output(0)],
        }))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for kind in ReduceKind::ALL {
        r.register("", kind.op_name(), move |spec| Ok(Box::new(Reduce::parse(spec, kind)?)));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{Input, first, make, run};
    use super::*;
    use crate::linalg::testing::{assert_close, rand_tensor};
    use kiln_graph::Attr;

    /// Straightforward reference: gathers each output's values, then applies the
    /// textbook formula in f64.
    fn reference(kind: ReduceKind, x: &Tensor, axes: &[usize], out_dims: &[usize]) -> Tensor {
        let dims = x.dims();
        let kept: Vec<usize> = (0..dims.len()).filter(|d| !axes.contains(d)).collect();
        let n_out: usize = kept.iter().map(|&d| dims[d]).product();
        let mut groups = vec![vec![]; n_out];
        for (lin, v) in x.to_f64_vec().into_iter().enumerate() {
            let mut idx = vec![0; dims.len()];
            let mut r = lin;
            for d in (0..dims.len()).rev() {
                idx[d] = r % dims[d];
                r /= dims[d];
            }
            let o = kept.iter().fold(0, |acc, &d| acc * dims[d] + idx[d]);
            groups[o].push(v);
        }
        let vals: Vec<f64> = groups
            .iter()
            .map(|g| {
                let sum: f64 = g.iter().sum();
                match kind {
                    ReduceKind::Sum => sum,
                    ReduceKind::Mean => sum / g.len() as f64,
                    ReduceKind::Max => g.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                    ReduceKind::Min => g.iter().cloned().fold(f64::INFINITY, f64::min),
                    ReduceKind::Prod => g.iter().product(),
                    ReduceKind::L1 => g.iter().map(|v| v.abs()).sum(),
                    ReduceKind::L2 => g.iter().map(|v| v * v).sum::<f64>().sqrt(),
                    ReduceKind::LogSum => sum.ln(),
                    ReduceKind::LogSumExp => g.iter().map(|v| v.exp()).sum::<f64>().ln(),
                    ReduceKind::SumSquare => g.iter().map(|v| v * v).sum(),
                }
            })
            .collect();
        Tensor::from_f64(x.dtype(), out_dims, &vals).unwrap()
    }

    fn out_dims(dims: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
        (0..dims.len()).filter_map(|d| if !axes.contains(&d) { Some(dims[d]) } else if keep { Some(1) } else { None }).collect()
    }

    #[test]
    fn all_kinds_axes_and_opsets_match_the_reference() {
        let dims = [3, 4, 5];
        for kind in ReduceKind::ALL {
            let x = if matches!(kind, ReduceKind::LogSum) { rand_tensor(DType::F32, &dims, 7).to_f64_vec() } else { vec![] };
            let x = if x.is_empty() {
                rand_tensor(DType::F32, &dims, 7)
            } else {
                Tensor::from_f64(DType::F32, &dims, &x.iter().map(|v| v.abs() + 0.1).collect::<Vec<_>>()).unwrap()
            };
            for axes in [vec![0i64], vec![1], vec![2], vec![0, 2], vec![-1, -2], vec![0, 1, 2], vec![]] {
                for keep in [0i64, 1] {
                    let norm: Vec<usize> = if axes.is_empty() { vec![0, 1, 2] } else { normalize_axes(&axes, 3).unwrap() };
                    let want = reference(kind, &x, &norm, &out_dims(&dims, &norm, keep == 1));
                    let what = format!("{} axes {axes:?} keepdims {keep}", kind.op_name());
                    // Attribute form (opset 11) and input form (opset 18).
                    let mut attrs = vec![("keepdims", Attr::Int(keep))];
                    if !axes.is_empty() {
                        attrs.push(("axes", Attr::Ints(axes.clone())));
                    }
                    let got = run(&*make(kind.op_name(), 11, &attrs, 1, 1).unwrap(), &[Input::Data(x.clone())], &[]).map(first).unwrap();
                    assert_close(&got, &want, &what);
                    let axes_t = Tensor::from_slice(&[axes.len()], &axes).unwrap();
                    let op = make(kind.op_name(), 18, &[("keepdims", Attr::Int(keep))], 2, 1).unwrap();
                    let got = run(&*op, &[Input::Data(x.clone()), Input::Const(axes_t)], &[]).map(first).unwrap();
                    assert_close(&got, &want, &what);
                }
            }
        }
    }

    #[test]
    fn noop_empty_axes_and_empty_sets() {
        let x = rand_tensor(DType::F32, &[3, 2, 2], 1);
        let op = make("ReduceSum", 13, &[("noop_with_empty_axes", Attr::Int(1))], 2, 1).unwrap();
        let got = run(&*op, &[Input::Data(x.clone()), Input::Const(Tensor::from_slice::<i64>(&[0], &[]).unwrap())], &[]).map(first).unwrap();
        assert_eq!(got, x);
        let op = make("ReduceSum", 13, &[("noop_with_empty_axes", Attr::Int(1))], 1, 1).unwrap();
        assert_eq!(run(&*op, &[Input::Data(x.clone())], &[]).map(first).unwrap(), x);
        let empty = Tensor::zeros(DType::F32, &[2, 0, 4]);
        let axis1 = Tensor::from_slice(&[1], &[1i64]).unwrap();
        for (kind, want) in [
            (ReduceKind::Sum, 0.0),
            (ReduceKind::Prod, 1.0),
            (ReduceKind::Max, f64::NEG_INFINITY),
            (ReduceKind::Min, f64::INFINITY),
            (ReduceKind::LogSum, f64::NEG_INFINITY),
            (ReduceKind::LogSumExp, f64::NEG_INFINITY),
            (ReduceKind::L2, 0.0),
            (ReduceKind::SumSquare, 0.0),
        ] {
            let got = run(&*make(kind.op_name(), 18, &[], 2, 1).unwrap(), &[Input::Data(empty.clone()), Input::Const(axis1.clone())], &[]).map(first).unwrap();
            assert_eq!(got.dims(), &[2, 1, 4]);
            assert!(got.to_f64_vec().iter().all(|&v| v == want), "{kind:?}: {got:?}");
        }
        assert!(run(&*make("ReduceMean", 18, &[], 2, 1).unwrap(), &[Input::Data(empty.clone()), Input::Const(axis1.clone())], &[]).map(first).unwrap().to_f64_vec()[0].is_nan());
        let axis2 = Tensor::from_slice(&[1], &[2i64]).unwrap();
        let got = run(&*make("ReduceSum", 13, &[], 2, 1).unwrap(), &[Input::Data(empty), Input::Const(axis2)], &[]).map(first).unwrap();
        assert_eq!(got.dims(), &[2, 0, 1]);
    }

    #[test]
    fn integers_and_bools() {
        let x = rand_tensor(DType::I64, &[4, 3, 5], 9);
        for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min, ReduceKind::Prod, ReduceKind::SumSquare, ReduceKind::L1, ReduceKind::L2] {
            for dtype in [DType::I64, DType::I32, DType::U32] {
                let xi = if dtype == DType::U32 { rand_tensor(DType::U32, &[4, 3, 5], 9) } else { Tensor::from_f64(dtype, &[4, 3, 5], &x.to_f64_vec()).unwrap() };
                let got = run(&*make(kind.op_name(), 11, &[("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(0))], 1, 1).unwrap(), &[Input::Data(xi.clone())], &[]).map(first).unwrap();
                assert_close(&got, &reference(kind, &xi, &[1], &[4, 5]), &format!("{kind:?} {dtype}"));
            }
        }
        let b = Tensor::from_bools(&[4, 2], &[true, true, true, false, false, true, false, false]).unwrap();
        let got = run(&*make("ReduceMax", 20, &[], 2, 1).unwrap(), &[Input::Data(b.clone()), Input::Const(Tensor::from_slice(&[1], &[1i64]).unwrap())], &[]).map(first).unwrap();
        assert_eq!(got, Tensor::from_bools(&[4, 1], &[true, true, true, false]).unwrap());
        let got = run(&*make("ReduceMin", 20, &[], 2, 1).unwrap(), &[Input::Data(b), Input::Const(Tensor::from_slice(&[1], &[1i64]).unwrap())], &[]).map(first).unwrap();
        assert_eq!(got, Tensor::from_bools(&[4, 1], &[true, false, false, false]).unwrap());
        let e = run(&*make("ReduceMax", 20, &[], 2, 1).unwrap(), &[Input::Data(Tensor::zeros(DType::Bool, &[2, 0])), Input::Const(Tensor::from_slice(&[1], &[1i64]).unwrap())], &[]).map(first).unwrap();
        assert_eq!(e, Tensor::from_bools(&[2, 1], &[false, false]).unwrap());
    }

    #[test]
    fn large_parallel_rows_and_columns() {
        for (dims, axes) in [(vec![300, 257], vec![1i64]), (vec![257, 300], vec![0]), (vec![7, 513, 33], vec![1]), (vec![64, 9, 130], vec![0, 2])] {
            let x = rand_tensor(DType::F32, &dims, 3);
            let norm = normalize_axes(&axes, dims.len()).unwrap();
            for kind in [ReduceKind::Mean, ReduceKind::LogSumExp, ReduceKind::Max] {
                let got = run(&*make(kind.op_name(), 13, &[("axes", Attr::Ints(axes.clone()))], 1, 1).unwrap(), &[Input::Data(x.clone())], &[]).map(first).unwrap();
                assert_close(&got, &reference(kind, &x, &norm, &out_dims(&dims, &norm, true)), &format!("{kind:?} {dims:?} {axes:?}"));
            }
        }
    }

    #[test]
    fn bad_axes_are_errors() {
        let x = rand_tensor(DType::F32, &[3, 4], 1);
        let err = run(&*make("ReduceMean", 13, &[("axes", Attr::Ints(vec![2]))], 1, 1).unwrap(), &[Input::Data(x.clone())], &[]).map(first).unwrap_err().to_string();
        assert!(err.contains("axis 2"), "{err}");
        assert!(run(&*make("ReduceMean", 13, &[("axes", Attr::Ints(vec![1, -1]))], 1, 1).unwrap(), &[Input::Data(x.clone())], &[]).map(first).is_err());
        // An axes input that is not constant is an error, not a guess.
        let op = make("ReduceSum", 13, &[], 2, 1).unwrap();
        let (tx, ta) = (TensorType::new(DType::F32, vec![3, 4]), TensorType::new(DType::I64, vec![1]));
        assert!(op.infer(&[Some(Arg { ty: &tx, value: None }), Some(Arg { ty: &ta, value: None })]).is_err());
        let b = Tensor::from_bools(&[2], &[true, false]).unwrap();
        assert!(run(&*make("ReduceSum", 13, &[], 1, 1).unwrap(), &[Input::Data(b)], &[]).map(first).is_err());
    }
}
