//! Shape and Size: values computed from the input's type alone, so the compiler folds
//! them (`eval_from_types`); the kernels exist for completeness.
use crate::cpu::CpuKernel;
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Which query the op answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Query {
    /// Dims `start..end` (opset 15 attributes; negative counts from the back, clamped).
    Shape { start: i64, end: Option<i64> },
    /// Number of elements.
    Size,
}

#[derive(Debug)]
pub struct ShapeOf {
    query: Query,
}

impl ShapeOf {
    fn values(&self, dims: &[usize]) -> (Vec<usize>, Vec<i64>) {
        match self.query {
            Query::Size => (vec![], vec![dims.iter().product::<usize>() as i64]),
            Query::Shape { start, end } => {
                let r = dims.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
                let v: Vec<i64> = if s < e { dims[s..e].iter().map(|&d| d as i64).collect() } else { vec![] };
                (vec![v.len()], v)
            }
        }
    }
}

impl Op for ShapeOf {
    fn name(&self) -> &str {
        match self.query {
            Query::Shape { .. } => "Shape",
            Query::Size => "Size",
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (dims, _) = self.values(required(inputs, 0)?.dims());
        Ok(vec![TensorType::new(DType::I64, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn handles_strings(&self) -> bool {
        true
    }

    fn eval_from_types(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        Some(required(inputs, 0).and_then(|x| {
            let (dims, v) = self.values(x.dims());
            Ok(vec![Tensor::from_slice(&dims, &v)?])
        }))
    }
}

impl CpuKernel for ShapeOf {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = crate::cpu::input(inputs, 0)?;
        let (dims, v) = self.values(x.dims());
        outputs[0] = Tensor::from_slice(&dims, &v)?;
        Ok(())
    }
}

impl WgslKernel for ShapeOf {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (_, v) = self.values(required(inputs, 0)?.dims());
        let helpers = super::common::baked_array("VALUES", "i32", &v.iter().map(|&d| d as f64).collect::<Vec<_>>());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name(),
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("dst", "i32", false)],
            vec![Binding::Output(0)],
            &helpers,
            "dst[i] = VALUES_at(i);",
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Shape", |spec| {
        Ok(Box::new(ShapeOf { query: Query::Shape { start: spec.int("start", 0)?, end: spec.int_opt("end")? } }))
    });
    r.register("", "Size", |_| Ok(Box::new(ShapeOf { query: Query::Size })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor, DType};

    #[test]
    fn shape_and_size() {
        let x = Tensor::zeros(DType::Bool, &[3, 4, 5]);
        let s = make("Shape", 15, &[], 1, 1).unwrap();
        assert_eq!(run(s.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], i64s(&[3], &[3, 4, 5]));
        for (start, end, want) in [(1i64, None, vec![4i64, 5]), (-1, None, vec![5]), (0, Some(-1), vec![3, 4]), (-10, Some(10), vec![3, 4, 5]), (2, Some(1), vec![])] {
            let mut attrs = vec![("start", Attr::Int(start))];
            if let Some(e) = end {
                attrs.push(("end", Attr::Int(e)));
            }
            let s = make("Shape", 15, &attrs, 1, 1).unwrap();
            let out = run(s.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
            assert_eq!(out[0], i64s(&[want.len()], &want), "start {start} end {end:?}");
        }
        let z = make("Size", 13, &[], 1, 1).unwrap();
        assert_eq!(run(z.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], Tensor::scalar(60i64));
        let ty = crate::TensorType::new(DType::F32, vec![2, 0]);
        let folded = z.eval_from_types(&[Some(crate::Arg { ty: &ty, value: None })]).unwrap().unwrap();
        assert_eq!(folded[0], Tensor::scalar(0i64));
    }
}
