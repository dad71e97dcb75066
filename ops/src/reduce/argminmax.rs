//! ArgMax and ArgMin along one `axis` (default 0), with `keepdims` (default 1) and
//! `select_last_index` (default 0); the output is i64. Like numpy, a NaN counts as
//! the extreme (the first NaN wins, or the last with `select_last_index`).
use super::layout::split_at_axis;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub struct ArgExtreme {
    pub max: bool,
    pub axis: i64,
    pub keepdims: bool,
    pub select_last_index: bool,
}

const NUMBERS: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I16, DType::I32, DType::I64,
    DType::U8, DType::U16, DType::U32, DType::U64,
];

impl ArgExtreme {
    pub fn parse(spec: &NodeSpec, max: bool) -> Result<ArgExtreme> {
        Ok(ArgExtreme {
            max,
            axis: spec.int("axis", 0)?,
            keepdims: spec.int("keepdims", 1)? != 0,
            select_last_index: spec.int("select_last_index", 0)? != 0,
        })
    }

    fn split(&self, dims: &[usize]) -> Result<(usize, (usize, usize, usize))> {
        let axis = norm_axis(self.axis, dims.len())?;
        if dims.is_empty() {
            return Err(OpError::input(0, format!("{} needs an input of rank >= 1", self.name())));
        }
        if dims[axis] == 0 {
            return Err(OpError::input(0, format!("{} over axis {axis} of {dims:?}, which is empty", self.name())));
        }
        Ok((axis, split_at_axis(dims, axis)))
    }

    /// Whether `x` at a later index replaces the current best `cur`.
    #[inline]
    fn better<T: PartialOrd + Copy>(&self, x: T, cur: T) -> bool {
        #[allow(clippy::eq_op)]
        let (x_nan, cur_nan) = (x != x, cur != cur);
        if cur_nan {
            return x_nan && self.select_last_index;
        }
        if x_nan {
            return true;
        }
        match (self.max, self.select_last_index) {
            (true, false) => x > cur,
            (true, true) => x >= cur,
            (false, false) => x < cur,
            (false, true) => x <= cur,
        }
    }

    fn run_typed<T: PartialOrd + Copy + Sync>(&self, xs: &[T], (outer, d, inner): (usize, usize, usize), out: &mut [i64]) {
        if out.len() != outer * inner || xs.len() != outer * d * inner {
            return;
        }
        cpu::par_chunks_mut(out, 1, d, |first, part| {
            for (q, o) in part.iter_mut().enumerate() {
                let idx = first + q;
                let base = (idx / inner) * d * inner + idx % inner;
                let (mut best, mut at) = (xs[base], 0usize);
                for k in 1..d {
                    let x = xs[base + k * inner];
                    if self.better(x, best) {
                        best = x;
                        at = k;
                    }
                }
                *o = at as i64;
            }
        });
    }
}

impl Op for ArgExtreme {
    fn name(&self) -> &str {
        if self.max { "ArgMax" } else { "ArgMin" }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, NUMBERS)?;
        let dims = required(inputs, 0)?.dims();
        let (axis, _) = self.split(dims)?;
        let mut out = dims.to_vec();
        if self.keepdims {
            out[axis] = 1;
        } else {
            out.remove(axis);
        }
        Ok(vec![TensorType::new(DType::I64, out)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ArgExtreme {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (_, split) = self.split(x.dims())?;
        let out = outputs[0].as_mut_slice::<i64>()?;
        match x.dtype() {
            DType::F32 => self.run_typed(x.as_slice::<f32>()?, split, out),
            DType::F64 => self.run_typed(x.as_slice::<f64>()?, split, out),
            DType::I64 => self.run_typed(x.as_slice::<i64>()?, split, out),
            DType::I32 => self.run_typed(x.as_slice::<i32>()?, split, out),
            d if d.is_int() => self.run_typed(&x.to_i64_vec()?, split, out),
            _ => self.run_typed(&x.to_f64_vec(), split, out),
        }
        Ok(())
    }
}

impl WgslKernel for ArgExtreme {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let (_, (_, d, inner)) = self.split(x.dims())?;
        let ty = wgsl::elem(x.dtype());
        let cmp = match (self.max, self.select_last_index) {
            (true, false) => ">",
            (true, true) => ">=",
            (false, false) => "<",
            (false, true) => "<=",
        };
        if d > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("{} over {d} elements exceeds the GPU loop budget ({} per invocation)", self.name(), wgsl::MAX_LOOP_ITERATIONS)));
        }
        let scan = wgsl::for_loop(
            "k",
            "1u",
            &format!("{d}u"),
            "1u",
            &format!("let v = x[base + k * {inner}u];\n        if (v {cmp} best) {{ best = v; at = k; }}"),
        );
        let body = format!(
            "let base = (i / {inner}u) * {}u + i % {inner}u;\n    var best = x[base];\n    var at = 0u;\n    {scan}    out[i] = i32(at);",
            d * inner
        );
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("x", ty, true), ("out", "i32", false)];
        let n = outputs[0].len();
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), n, wg, &buffers, vec![Binding::Input(0), Binding::Output(0)], "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ArgMax", |spec| Ok(Box::new(ArgExtreme::parse(spec, true)?)));
    r.register("", "ArgMin", |spec| Ok(Box::new(ArgExtreme::parse(spec, false)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{Input, first, make, run};
    use super::*;
    use kiln_graph::Attr;

    fn reference(x: &Tensor, axis: usize, max: bool, last: bool) -> Vec<i64> {
        let (outer, d, inner) = split_at_axis(x.dims(), axis);
        let v = x.to_f64_vec();
        let mut out = vec![];
        for o in 0..outer {
            for j in 0..inner {
                let vals: Vec<f64> = (0..d).map(|k| v[o * d * inner + k * inner + j]).collect();
                let best = vals.iter().cloned().fold(if max { f64::NEG_INFINITY } else { f64::INFINITY }, |a, b| if max { a.max(b) } else { a.min(b) });
                let pos = if last { vals.iter().rposition(|&x| x == best) } else { vals.iter().position(|&x| x == best) };
                out.push(pos.unwrap() as i64);
            }
        }
        out
    }

    #[test]
    fn axes_keepdims_and_last_index() {
        // Small integers, so ties are common.
        let x = Tensor::from_f64(DType::F32, &[3, 4, 5], &crate::linalg::testing::rand_tensor(DType::I64, &[3, 4, 5], 3).to_f64_vec()).unwrap();
        for (name, max) in [("ArgMax", true), ("ArgMin", false)] {
            for axis in [0i64, 1, 2, -1] {
                for keep in [0i64, 1] {
                    for last in [0i64, 1] {
                        let op = make(name, 13, &[("axis", Attr::Int(axis)), ("keepdims", Attr::Int(keep)), ("select_last_index", Attr::Int(last))], 1, 1).unwrap();
                        for xt in [x.clone(), Tensor::from_f64(DType::I64, x.dims(), &x.to_f64_vec()).unwrap()] {
                            let got = run(&*op, &[Input::Data(xt)], &[]).map(first).unwrap();
                            let a = norm_axis(axis, 3).unwrap();
                            let mut dims = vec![3, 4, 5];
                            if keep == 1 { dims[a] = 1 } else { dims.remove(a); }
                            assert_eq!(got.dims(), dims.as_slice());
                            assert_eq!(got.as_slice::<i64>().unwrap(), reference(&x, a, max, last == 1).as_slice(), "{name} axis {axis} last {last}");
                        }
                    }
                }
            }
        }
        let nan = Tensor::from_slice(&[4], &[1f32, f32::NAN, 5., f32::NAN]).unwrap();
        assert_eq!(run(&*make("ArgMax", 13, &[], 1, 1).unwrap(), &[Input::Data(nan.clone())], &[]).map(first).unwrap().as_slice::<i64>().unwrap(), &[1]);
        assert_eq!(run(&*make("ArgMin", 13, &[("select_last_index", Attr::Int(1))], 1, 1).unwrap(), &[Input::Data(nan)], &[]).map(first).unwrap().as_slice::<i64>().unwrap(), &[3]);
        assert!(run(&*make("ArgMax", 13, &[("axis", Attr::Int(1))], 1, 1).unwrap(), &[Input::Data(Tensor::zeros(DType::F32, &[2, 0]))], &[]).map(first).is_err());
        assert!(run(&*make("ArgMax", 13, &[("axis", Attr::Int(2))], 1, 1).unwrap(), &[Input::Data(Tensor::zeros(DType::F32, &[2, 3]))], &[]).map(first).is_err());
    }
}
