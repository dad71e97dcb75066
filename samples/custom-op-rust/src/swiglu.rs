//! `com.example.SwiGlu`, a custom op written against Kiln's public op trait: SwiGLU
//! gating over the last axis, `x = [a, b]` split in halves, `y = a * sigmoid(beta * a) * b`.
//! Shape inference, cost, a CPU kernel and a WGSL kernel with a tunable workgroup size:
//! what a built-in op has.
//!
//! The same op as the manifest in `samples/custom-op-manifest/` (tests/custom_ops.rs runs
//! both on one model).

use kiln_graph::{DType, Tensor};
use kiln_ops::wgsl::{simple_kernel, workgroup_param};
use kiln_ops::{Arg, Binding, Cost, CpuKernel, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues, WgslKernel, WgslProgram};

pub const DOMAIN: &str = "com.example";

#[derive(Debug)]
pub struct SwiGlu {
    beta: f32,
}

impl SwiGlu {
    /// Parses the node's attributes: `beta` (float, default 1).
    pub fn from_node(spec: &NodeSpec) -> Result<SwiGlu> {
        if let Some(other) = spec.node.attrs.keys().find(|k| *k != "beta") {
            return Err(spec.bad(other, "SwiGlu has one attribute, 'beta'"));
        }
        Ok(SwiGlu { beta: spec.float("beta", 1.0)? })
    }
}

/// Adds the op to `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(DOMAIN, "SwiGlu", |spec| Ok(Box::new(SwiGlu::from_node(spec)?) as Box<dyn Op>));
}

/// Rows and the half width of an input of dims `[.., 2h]`.
fn split(dims: &[usize]) -> (usize, usize) {
    let last = dims.last().copied().unwrap_or(0);
    (dims[..dims.len().saturating_sub(1)].iter().product(), last / 2)
}

impl Op for SwiGlu {
    fn name(&self) -> &str {
        "SwiGlu"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = kiln_ops::required(inputs, 0)?;
        kiln_ops::expect_dtype(inputs, 0, &[DType::F32])?;
        let dims = x.dims();
        match dims.last() {
            Some(&w) if w % 2 == 0 => {}
            _ => return Err(OpError::input(0, format!("expected a last dim of even size, got dims {dims:?}"))),
        }
        let mut out = dims.to_vec();
        *out.last_mut().expect("rank checked") /= 2;
        Ok(vec![TensorType::new(DType::F32, out)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        // exp, add, div, two muls per output element.
        Cost { flops: 5 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
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
}

impl CpuKernel for SwiGlu {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = kiln_ops::cpu::input(inputs, 0)?;
        let (rows, half) = split(x.dims());
        let xs = x.as_slice::<f32>()?;
        let ys = outputs[0].as_mut_slice::<f32>()?;
        for r in 0..rows {
            let (a, b) = xs[r * 2 * half..(r + 1) * 2 * half].split_at(half);
            for ((y, &a), &b) in ys[r * half..(r + 1) * half].iter_mut().zip(a).zip(b) {
                *y = a / (1.0 + (-self.beta * a).exp()) * b;
            }
        }
        Ok(())
    }
}

impl WgslKernel for SwiGlu {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        // The tuner (`kiln tune`) measures 32..256 and keeps the fastest.
        vec![workgroup_param()]
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = kiln_ops::required(inputs, 0)?;
        let (_, half) = split(x.dims());
        let wg = tune.get(&workgroup_param());
        let beta = kiln_ops::wgsl::literal("f32", self.beta as f64);
        let body = format!(
            "let row = i / {half}u;\n    let col = i % {half}u;\n    let a = x[row * {w}u + col];\n    let b = x[row * {w}u + {half}u + col];\n    y[i] = a / (1.0 + exp(-{beta} * a)) * b;",
            w = 2 * half
        );
        Ok(WgslProgram::single(simple_kernel(
            "swiglu",
            outputs[0].len(),
            wg,
            &[("x", "f32", true), ("y", "f32", false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &body,
        )))
    }
}
