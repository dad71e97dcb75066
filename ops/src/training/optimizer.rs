//! [`Optimizer`]: the op type of the preview training optimizers (domain
//! `ai.onnx.preview.training`: Adagrad, Adam, Momentum). Each updates `n` parameter
//! tensors at once: inputs `R` (learning rate, a float scalar), `T` (the step count, an
//! int64 scalar), then `X_1..X_n`, `G_1..G_n` (gradients) and each state's
//! `S_1..S_n`; outputs the new `X`s, then each state's new tensors. The update is one
//! elementwise [`Rule`]: the CPU computes it in f64, the GPU in f32, one dispatch per
//! parameter tensor reading `R` and `T` from their buffers.
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// One optimizer's elementwise update.
pub(crate) trait Rule: Send + Sync + std::fmt::Debug {
    const NAME: &'static str;
    /// State tensors per parameter (Adagrad's H: 1, Adam's V and H: 2).
    const STATES: usize;
    /// New (x, states) from the learning rate, step count, x, gradient and states.
    fn step(&self, r: f64, t: i64, x: f64, g: f64, s: &[f64]) -> (f64, [f64; 2]);
    /// WGSL statements computing `xn` and `s0n` (and `s1n`) from `r: f32`, `t: i32`,
    /// `x`, `g`, `s0` (and `s1`).
    fn wgsl(&self) -> String;
}

#[derive(Debug)]
pub(crate) struct Optimizer<R: Rule> {
    pub rule: R,
}

impl<R: Rule> Optimizer<R> {
    /// The number of parameter tensors.
    fn count(inputs: &[Option<Arg>]) -> Result<usize> {
        let per = 2 + R::STATES;
        if inputs.len() < 2 + per || (inputs.len() - 2) % per != 0 {
            return Err(OpError::invalid(format!("{} takes R, T and {per} tensors per parameter, found {} inputs", R::NAME, inputs.len())));
        }
        let r = required(inputs, 0)?;
        if !r.dtype().is_float() || r.ty.len() != 1 {
            return Err(OpError::input(0, format!("R must be a float scalar, found {}", r.ty)));
        }
        let t = required(inputs, 1)?;
        if t.dtype() != DType::I64 || t.ty.len() != 1 {
            return Err(OpError::input(1, format!("T must be an int64 scalar, found {}", t.ty)));
        }
        let n = (inputs.len() - 2) / per;
        for i in 0..n {
            let x = required(inputs, 2 + i)?;
            if !matches!(x.dtype(), DType::F32 | DType::F64) {
                return Err(OpError::input(2 + i, format!("parameters must be f32 or f64, found {}", x.dtype())));
            }
            for k in 1..per {
                let j = 2 + k * n + i;
                if required(inputs, j)?.ty != x.ty {
                    return Err(OpError::input(j, format!("expected the type of X_{} ({}), found {}", i + 1, x.ty, required(inputs, j)?.ty)));
                }
            }
        }
        Ok(n)
    }
}

impl<R: Rule + 'static> Op for Optimizer<R> {
    fn name(&self) -> &str {
        R::NAME
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let n = Self::count(inputs)?;
        let mut out = vec![];
        for k in 0..1 + R::STATES {
            let from = if k == 0 { 0 } else { 1 + k };
            for i in 0..n {
                out.push(required(inputs, 2 + from * n + i)?.ty.clone());
            }
        }
        Ok(out)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl<R: Rule + 'static> CpuKernel for Optimizer<R> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let n = crate::tensor::tensor_args(inputs, Self::count)?;
        let r = cpu::input(inputs, 0)?.to_f64_vec()[0];
        let t = cpu::input(inputs, 1)?.to_i64_vec()?[0];
        for i in 0..n {
            let x = cpu::input(inputs, 2 + i)?;
            let xv = x.to_f64_vec();
            let g = cpu::input(inputs, 2 + n + i)?.to_f64_vec();
            let states: Vec<Vec<f64>> = (0..R::STATES).map(|k| cpu::input(inputs, 2 + (2 + k) * n + i).map(|s| s.to_f64_vec())).collect::<Result<_>>()?;
            let mut xn = vec![0.0; xv.len()];
            let mut sn = vec![vec![0.0; xv.len()]; R::STATES];
            for j in 0..xv.len() {
                let s: Vec<f64> = states.iter().map(|s| s[j]).collect();
                let (a, b) = self.rule.step(r, t, xv[j], g[j], &s);
                xn[j] = a;
                for k in 0..R::STATES {
                    sn[k][j] = b[k];
                }
            }
            outputs[i] = Tensor::from_f64(x.dtype(), x.dims(), &xn)?;
            for k in 0..R::STATES {
                outputs[(1 + k) * n + i] = Tensor::from_f64(x.dtype(), x.dims(), &sn[k])?;
            }
        }
        Ok(())
    }
}

impl<R: Rule + 'static> WgslKernel for Optimizer<R> {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let n = Self::count(inputs)?;
        let wg = tune.get(&wgsl::workgroup_param());
        let names = ["s0", "s1"];
        let mut dispatches = vec![];
        for i in 0..n {
            let mut buffers = vec![("rate", "f32", true), ("step", "i32", true), ("xs", "f32", true), ("gs", "f32", true)];
            let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2 + i), Binding::Input(2 + n + i)];
            let state_in = ["s0s", "s1s"];
            let state_out = ["s0o", "s1o"];
            for k in 0..R::STATES {
                buffers.push((state_in[k], "f32", true));
                bindings.push(Binding::Input(2 + (2 + k) * n + i));
            }
            buffers.push(("xo", "f32", false));
            bindings.push(Binding::Output(i));
            for k in 0..R::STATES {
                buffers.push((state_out[k], "f32", false));
                bindings.push(Binding::Output((1 + k) * n + i));
            }
            let mut body = String::from("let r = rate[0];\n    let t = step[0];\n    let x = xs[i];\n    let g = gs[i];\n");
            for k in 0..R::STATES {
                body += &format!("    let {} = {}[i];\n", names[k], state_in[k]);
            }
            body += &format!("    {}\n    xo[i] = xn;\n", self.rule.wgsl());
            for k in 0..R::STATES {
                body += &format!("    {}[i] = {}n;\n", state_out[k], names[k]);
            }
            dispatches.push(wgsl::simple_kernel(&format!("{} {}", R::NAME, i + 1), outputs[i].len(), wg, &buffers, bindings, "", &body));
        }
        Ok(WgslProgram { dispatches, scratch_bytes: vec![] })
    }
}
