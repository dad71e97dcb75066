//! `com.example.Swish`, a custom elementwise op: `y = x * sigmoid(beta * x)`. Besides its
//! own kernels it declares itself elementwise (`Op::elementwise`), so the compiler's
//! elementwise fusion folds it into one kernel with its neighbours, as it does Kiln's
//! own activations.

use kiln_graph::{DType, Tensor};
use kiln_ops::wgsl::{simple_kernel, workgroup_param};
use kiln_ops::{Arg, Binding, CpuKernel, ElementwiseFn, NodeSpec, Op, Registry, Result, TensorType, TuneValues, WgslKernel, WgslProgram};
use std::sync::Arc;

#[derive(Debug)]
pub struct Swish {
    beta: f32,
}

pub fn register(registry: &mut Registry) {
    registry.register(super::swiglu::DOMAIN, "Swish", |spec: &NodeSpec| Ok(Box::new(Swish { beta: spec.float("beta", 1.0)? }) as Box<dyn Op>));
}

impl ElementwiseFn for Swish {
    fn apply(&self, x: &mut [f32]) {
        for v in x {
            *v /= 1.0 + (-self.beta * *v).exp();
        }
    }
    fn wgsl(&self, x: &str) -> String {
        format!("({x} / (1.0 + exp(-{} * {x})))", kiln_ops::wgsl::literal("f32", self.beta as f64))
    }
}

impl Op for Swish {
    fn name(&self) -> &str {
        "Swish"
    }
    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        kiln_ops::expect_dtype(inputs, 0, &[DType::F32])?;
        Ok(vec![kiln_ops::required(inputs, 0)?.ty.clone()])
    }
    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }
    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
    fn overwrites_outputs(&self) -> bool {
        true
    }
    fn elementwise(&self) -> Option<Arc<dyn ElementwiseFn>> {
        Some(Arc::new(Swish { beta: self.beta }))
    }
}

impl CpuKernel for Swish {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = kiln_ops::cpu::input(inputs, 0)?.as_slice::<f32>()?;
        let y = outputs[0].as_mut_slice::<f32>()?;
        y.copy_from_slice(x);
        self.apply(y);
        Ok(())
    }
}

impl WgslKernel for Swish {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let body = format!("let v = x[i];\n    y[i] = {};", ElementwiseFn::wgsl(self, "v"));
        let wg = tune.get(&workgroup_param());
        Ok(WgslProgram::single(simple_kernel("swish", outputs[0].len(), wg, &[("x", "f32", true), ("y", "f32", false)], vec![Binding::Input(0), Binding::Output(0)], "", &body)))
    }
}
