//! Multinomial (opset 7): `sample_size` (default 1) class indices per batch row of
//! `input` (`[batch, classes]`, unnormalized log-probabilities), as int32 (default) or
//! int64. Sample `s` of row `b` takes uniform `u` (counter `b * sample_size + s` of
//! [`super::generator`]) and returns the first class whose cumulative probability
//! `sum_{c' <= c} exp(x[c'] - max) / sum exp(x - max)` exceeds `u` (the last class
//! when rounding leaves none).
//!
//! GPU: one invocation per sample scans its row twice (maximum and total, then the
//! search), so a row may hold at most a third of [`wgsl::MAX_LOOP_ITERATIONS`] classes.
use super::generator::{self, Seed};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Multinomial {
    dtype: DType,
    samples: usize,
    seed: Seed,
}

impl Multinomial {
    fn dims(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize)> {
        expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        match *required(inputs, 0)?.dims() {
            [b, c] if c > 0 => {
                generator::check_count(b.saturating_mul(self.samples))?;
                Ok((b, c))
            }
            ref d => Err(OpError::input(0, format!("expected [batch, classes] with classes > 0, found shape {d:?}"))),
        }
    }
}

impl Op for Multinomial {
    fn name(&self) -> &str {
        "Multinomial"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn varies_between_runs(&self) -> bool {
        !self.seed.is_fixed()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (b, _) = self.dims(inputs)?;
        Ok(vec![TensorType::new(self.dtype, vec![b, self.samples])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Multinomial {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (b, c) = match *x.dims() {
            [b, c] if c > 0 => (b, c),
            ref d => return Err(OpError::input(0, format!("expected [batch, classes], found shape {d:?}"))),
        };
        let v = x.to_f64_vec();
        let key = self.seed.key();
        let mut y = vec![0.0; b * self.samples];
        for r in 0..b {
            let row = &v[r * c..(r + 1) * c];
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = row.iter().map(|&x| (x - max).exp()).sum();
            for s in 0..self.samples {
                let target = generator::uniform(key, (r * self.samples + s) as u32) * total;
                let mut cum = 0.0;
                let mut pick = c - 1;
                for (k, &x) in row.iter().enumerate() {
                    cum += (x - max).exp();
                    if cum > target {
                        pick = k;
                        break;
                    }
                }
                y[r * self.samples + s] = pick as f64;
            }
        }
        outputs[0] = Tensor::from_f64(self.dtype, &[b, self.samples], &y)?;
        Ok(())
    }
}

impl WgslKernel for Multinomial {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let key = self.seed.gpu_key("Multinomial")?;
        let (_, c) = self.dims(inputs)?;
        if 3 * c > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("Multinomial over {c} classes: the GPU kernel scans a row three times in one invocation")));
        }
        let s = self.samples;
        let body = format!(
            "let base = (i / {s}u) * {c}u;\n    var m = x[base];\n    \
             for (var k = 1u; k < {c}u; k = k + 1u) {{ m = max(m, x[base + k]); }}\n    \
             var total = 0.0;\n    for (var k = 0u; k < {c}u; k = k + 1u) {{ total = total + exp(x[base + k] - m); }}\n    \
             let goal = rng_uniform(i) * total;\n    var cum = 0.0;\n    var pick = {last}u;\n    \
             for (var k = 0u; k < {c}u; k = k + 1u) {{\n        cum = cum + exp(x[base + k] - m);\n        \
             if (cum > goal) {{ pick = k; break; }}\n    }}\n    y[i] = i32(pick);",
            last = c - 1
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Multinomial",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", "f32", true), ("y", "i32", false)],
            vec![Binding::Input(0), Binding::Output(0)],
            &generator::wgsl(key),
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec) -> Result<Multinomial> {
    let dtype = match spec.int("dtype", 6)? {
        6 => DType::I32,
        7 => DType::I64,
        d => return Err(spec.bad("dtype", format!("expected 6 (int32) or 7 (int64), found {d}"))),
    };
    let samples = spec.int("sample_size", 1)?;
    let samples = usize::try_from(samples).ok().filter(|&s| s >= 1).ok_or_else(|| spec.bad("sample_size", format!("expected >= 1, found {samples}")))?;
    Ok(Multinomial { dtype, samples, seed: Seed::parse(spec)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Multinomial", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    #[test]
    fn frequencies_follow_the_softmax() {
        // Row 0: log-probabilities of (0.1, 0.2, 0.7); row 1: one class certain.
        let x = f32s(&[2, 3], &[0.1f32.ln(), 0.2f32.ln(), 0.7f32.ln(), -50.0, 0.0, -50.0]);
        let case = Case::new("Multinomial").opset(7).input(x).attrs(&[("sample_size", Attr::Int(3000)), ("seed", Attr::Float(2.0))]);
        let y = case.run_cpu().unwrap();
        assert_eq!((y[0].dtype(), y[0].dims()), (DType::I32, &[2usize, 3000][..]));
        let v = y[0].to_f64_vec();
        for (k, p) in [0.1, 0.2, 0.7].into_iter().enumerate() {
            let f = v[..3000].iter().filter(|&&c| c == k as f64).count() as f64 / 3000.0;
            assert!((f - p).abs() < 0.03, "class {k}: frequency {f}, probability {p}");
        }
        assert!(v[3000..].iter().all(|&c| c == 1.0));
        assert_eq!(case.run_cpu().unwrap()[0].to_f64_vec(), v, "a seed repeats");
        assert!(Case::new("Multinomial").opset(7).input(rand_f32(&[2, 0], 1)).run_cpu().is_err());
        assert!(Case::new("Multinomial").opset(7).input(rand_f32(&[2, 3], 1)).attr("dtype", Attr::Int(1)).run_cpu().is_err());
    }
}
