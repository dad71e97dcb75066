//! CumSum and CumProd: running sums/products along the axis given by the constant
//! input 1, optionally `exclusive` (each output leaves out its own element) and
//! `reverse` (from the end). Floats and integers (integers wrap).
//!
//! GPU: short lines run one invocation per line; long lines (or few of them) run one
//! workgroup per line whose lanes each scan a chunk, share chunk totals in workgroup
//! memory and rescan with their offset, which keeps each invocation's loops under
//! [`wgsl::MAX_LOOP_ITERATIONS`]; lines too long even for 256 lanes are an error.
use super::common::const_ints;
use super::numeric::{split_at_axis, store, Num, NUMERIC};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sum,
    Prod,
}

#[derive(Debug)]
pub struct Cumulative {
    kind: Kind,
    exclusive: bool,
    reverse: bool,
}

impl Cumulative {
    /// (outer, axis length, inner) of the scan.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize, usize)> {
        let x = required(inputs, 0)?;
        expect_dtype(inputs, 0, &NUMERIC)?;
        let axis = const_ints(inputs, 1, "axis")?;
        if axis.len() != 1 {
            return Err(OpError::input(1, format!("axis must be a single integer, found {} values", axis.len())));
        }
        if x.rank() == 0 {
            return Err(OpError::input(0, "the input must have rank >= 1"));
        }
        let axis = norm_axis(axis[0], x.rank())?;
        Ok(split_at_axis(x.dims(), axis))
    }

    fn name_str(&self) -> &'static str {
        match self.kind {
            Kind::Sum => "CumSum",
            Kind::Prod => "CumProd",
        }
    }

    /// Scans `x` into `y` (same layout).
    fn scan<T: Copy>(&self, x: &[T], y: &mut [T], (outer, n, inner): (usize, usize, usize), id: T, f: impl Fn(T, T) -> T) {
        for o in 0..outer {
            for r in 0..inner {
                let mut acc = id;
                for p in 0..n {
                    let q = if self.reverse { n - 1 - p } else { p };
                    let at = (o * n + q) * inner + r;
                    if self.exclusive {
                        y[at] = acc;
                        acc = f(acc, x[at]);
                    } else {
                        acc = f(acc, x[at]);
                        y[at] = acc;
                    }
                }
            }
        }
    }
}

impl Op for Cumulative {
    fn name(&self) -> &str {
        self.name_str()
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

impl CpuKernel for Cumulative {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let shape = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let sum = self.kind == Kind::Sum;
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            let ys = outputs[0].as_mut_slice::<f32>()?;
            if sum {
                self.scan(xs, ys, shape, 0.0, |a, b| a + b);
            } else {
                self.scan(xs, ys, shape, 1.0, |a, b| a * b);
            }
            return Ok(());
        }
        let result = match Num::of(x) {
            Num::F(v) => {
                let mut y = vec![0.0; v.len()];
                if sum {
                    self.scan(&v, &mut y, shape, 0.0, |a, b| a + b);
                } else {
                    self.scan(&v, &mut y, shape, 1.0, |a, b| a * b);
                }
                Num::F(y)
            }
            Num::I(v) => {
                let mut y = vec![0; v.len()];
                if sum {
                    self.scan(&v, &mut y, shape, 0, i64::wrapping_add);
                } else {
                    self.scan(&v, &mut y, shape, 1, i64::wrapping_mul);
                }
                Num::I(y)
            }
        };
        let t = result.into_tensor(x.dtype(), x.dims())?;
        store(&mut outputs[0], t)
    }
}

/// Most lanes a long line is split over.
const MAX_LANES: usize = 256;

impl WgslKernel for Cumulative {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (outer, n, inner) = self.plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let lines = outer * inner;
        let (id, op) = match self.kind {
            Kind::Sum => (wgsl::literal(ty, 0.0), "+"),
            Kind::Prod => (wgsl::literal(ty, 1.0), "*"),
        };
        let pos = if self.reverse { format!("({}u - 1u - p)", n) } else { "p".to_string() };
        let step = if self.exclusive {
            format!("let at = base + {pos} * {inner}u;\n        let v = src[at];\n        dst[at] = acc;\n        acc = acc {op} v;")
        } else {
            format!("let at = base + {pos} * {inner}u;\n        acc = acc {op} src[at];\n        dst[at] = acc;")
        };
        let buffers = [("src", ty, true), ("dst", ty, false)];
        let bindings = vec![Binding::Input(0), Binding::Output(0)];
        let one_per_line = n <= 256 || (n <= wgsl::MAX_LOOP_ITERATIONS && lines >= 256);
        if one_per_line || lines == 0 || n == 0 {
            let wg = tune.get(&wgsl::workgroup_param());
            let body = format!(
                "let base = (i / {inner}u) * {len}u + i % {inner}u;\n    var acc = {id};\n    \
                 for (var p = 0u; p < {n}u; p = p + 1u) {{\n        {step}\n    }}",
                inner = inner.max(1),
                len = n * inner
            );
            let name = self.name_str();
            return Ok(WgslProgram::single(wgsl::simple_kernel(name, lines, wg, &buffers, bindings, "", &body)));
        }
        // One workgroup of `lanes` lanes per line: 2 * chunk + lanes loop iterations each.
        let fits = |l: usize| 2 * n.div_ceil(l) + l <= wgsl::MAX_LOOP_ITERATIONS;
        let lanes = (6..=8).map(|p| 1usize << p).find(|&l| fits(l)).filter(|&l| l <= MAX_LANES).ok_or_else(|| {
            OpError::Unsupported(format!(
                "{} over an axis of {n} elements: the GPU kernel splits a line over at most {MAX_LANES} lanes of \
                 {} loop iterations each; run this model on the CPU",
                self.name_str(),
                wgsl::MAX_LOOP_ITERATIONS
            ))
        })?;
        let chunk = n.div_ceil(lanes);
        let x = lines.min(wgsl::MAX_GROUPS as usize);
        let y = lines.div_ceil(x);
        let source = format!(
            "{decl}\nvar<workgroup> totals: array<{ty}, {lanes}>;\n\n@compute @workgroup_size({lanes})\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{\n    \
             let line = wid.x + wid.y * {x}u;\n    if (line >= {lines}u) {{ return; }}\n    \
             let base = (line / {inner}u) * {len}u + line % {inner}u;\n    let lane = lid.x;\n    \
             let first = min(lane * {chunk}u, {n}u);\n    let last = min(first + {chunk}u, {n}u);\n    \
             var acc = {id};\n    for (var p = first; p < last; p = p + 1u) {{\n        acc = acc {op} src[base + {pos} * {inner}u];\n    }}\n    \
             totals[lane] = acc;\n    workgroupBarrier();\n    acc = {id};\n    \
             for (var l = 0u; l < lane; l = l + 1u) {{\n        acc = acc {op} totals[l];\n    }}\n    \
             for (var p = first; p < last; p = p + 1u) {{\n        {step}\n    }}\n}}\n",
            decl = wgsl::declare(&buffers),
            inner = inner.max(1),
            len = n * inner,
        );
        Ok(WgslProgram::single(Dispatch {
            label: format!("{} lanes={lanes}", self.name_str()),
            source,
            entry_point: "main".into(),
            workgroups: [x as u32, y as u32, 1],
            bindings,
        }))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for (name, kind) in [("CumSum", Kind::Sum), ("CumProd", Kind::Prod)] {
        r.register("", name, move |spec| {
            let flag = |a: &str| -> Result<bool> {
                match spec.int(a, 0)? {
                    0 => Ok(false),
                    1 => Ok(true),
                    v => Err(spec.bad(a, format!("must be 0 or 1, found {v}"))),
                }
            };
            Ok(Box::new(Cumulative { kind, exclusive: flag("exclusive")?, reverse: flag("reverse")? }))
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::Attr;

    fn reference(x: &[f64], dims: &[usize], axis: usize, prod: bool, excl: bool, rev: bool) -> Vec<f64> {
        let (outer, n, inner) = split_at_axis(dims, axis);
        let mut y = vec![0.0; x.len()];
        for o in 0..outer {
            for r in 0..inner {
                for q in 0..n {
                    let mut acc = if prod { 1.0 } else { 0.0 };
                    for p in 0..n {
                        let included = if rev { p > q || (p == q && !excl) } else { p < q || (p == q && !excl) };
                        if included {
                            let v = x[(o * n + p) * inner + r];
                            acc = if prod { acc * v } else { acc + v };
                        }
                    }
                    y[(o * n + q) * inner + r] = acc;
                }
            }
        }
        y
    }

    #[test]
    fn scans_match_reference() {
        let dims = [3usize, 5, 2];
        let x = Tensor::from_f64(DType::F32, &dims, &(0..30).map(|v| (v % 7) as f64 * 0.5 - 1.0).collect::<Vec<_>>()).unwrap();
        for op_name in ["CumSum", "CumProd"] {
            for (excl, rev) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                for axis in [0i64, 1, 2, -1, -3] {
                    let attrs = [("exclusive", Attr::Int(excl)), ("reverse", Attr::Int(rev))];
                    let op = make(op_name, 14, &attrs, 2, 1).unwrap();
                    let a = Tensor::scalar(axis);
                    let want = reference(&x.to_f64_vec(), &dims, axis.rem_euclid(3) as usize, op_name == "CumProd", excl == 1, rev == 1);
                    let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&a)], &[1]), &[]).unwrap()[0].to_f64_vec();
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() < 1e-5, "{op_name} {excl} {rev} {axis}: {got:?} vs {want:?}");
                    }
                    for dt in [DType::I64, DType::I32, DType::F64, DType::F16] {
                        let xi = Tensor::from_f64(dt, &dims, &(0..30).map(|v| (v % 5) as f64 - 2.0).collect::<Vec<_>>()).unwrap();
                        let want = reference(&xi.to_f64_vec(), &dims, axis.rem_euclid(3) as usize, op_name == "CumProd", excl == 1, rev == 1);
                        let got = run(op.as_ref(), &as_inputs(&[Some(&xi), Some(&Tensor::scalar(axis as i32))], &[1]), &[]).unwrap();
                        assert_eq!(got[0].dtype(), dt);
                        assert_eq!(got[0].to_f64_vec(), want, "{op_name} {dt}");
                    }
                }
            }
        }
    }

    #[test]
    fn long_lines_use_lanes_and_too_long_is_an_error() {
        let op = Cumulative { kind: Kind::Sum, exclusive: true, reverse: true };
        for (dims, lanes) in [(vec![1usize, 70_000], true), (vec![3, 1000], true), (vec![4096, 3], false), (vec![1usize << 25], true)] {
            let (tx, ta) = (TensorType::new(DType::F32, dims.clone()), TensorType::new(DType::I64, vec![]));
            let axis = Tensor::scalar(-1i64);
            let args = [Some(Arg { ty: &tx, value: None }), Some(Arg { ty: &ta, value: Some(&axis) })];
            let out = op.infer(&args).unwrap();
            let prog = op.generate(&args, &out, &TuneValues::default());
            if dims[0] == 1 << 25 {
                let e = prog.unwrap_err().to_string();
                assert!(e.contains("run this model on the CPU"), "{e}");
                continue;
            }
            let prog = prog.unwrap();
            crate::wgsl::testing::validate(&prog.dispatches[0].source);
            assert_eq!(prog.dispatches[0].label.contains("lanes"), lanes, "{dims:?}");
        }
        let bad = make("CumSum", 14, &[], 2, 1).unwrap();
        let x = iota_f32(&[2, 2]);
        let e = run(bad.as_ref(), &as_inputs(&[Some(&x), Some(&Tensor::scalar(2i64))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        let e = run(bad.as_ref(), &as_inputs(&[Some(&x), Some(&Tensor::scalar(0i64))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("axis must be known"), "{e}");
        assert!(make("CumSum", 14, &[("reverse", Attr::Int(2))], 2, 1).is_err());
    }
}
