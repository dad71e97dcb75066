//! Bernoulli (opset 15): 1 with probability `p` (each input element), else 0, as the
//! `dtype` attribute (default: the input's dtype). Element `i` is 1 when uniform `i` of
//! [`super::generator`] is below `p`, so probabilities outside [0, 1] saturate.
use super::generator::{self, Seed};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Bernoulli {
    dtype: Option<DType>,
    seed: Seed,
}

impl Op for Bernoulli {
    fn name(&self) -> &str {
        "Bernoulli"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn varies_between_runs(&self) -> bool {
        !self.seed.is_fixed()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let x = required(inputs, 0)?;
        generator::check_count(x.ty.len())?;
        Ok(vec![TensorType::new(self.dtype.unwrap_or(dtype), x.dims().to_vec())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Bernoulli {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = cpu::input(inputs, 0)?.to_f64_vec();
        let key = self.seed.key();
        let v: Vec<f64> = p.iter().enumerate().map(|(i, &p)| if generator::uniform(key, i as u32) < p { 1.0 } else { 0.0 }).collect();
        let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
        outputs[0] = Tensor::from_f64(dtype, &dims, &v)?;
        Ok(())
    }
}

impl WgslKernel for Bernoulli {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let key = self.seed.gpu_key("Bernoulli")?;
        let ty = wgsl::elem(outputs[0].dtype);
        let body = format!("y[i] = select({}, {}, rng_uniform(i) < p[i]);", wgsl::literal(ty, 0.0), wgsl::literal(ty, 1.0));
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Bernoulli",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("p", "f32", true), ("y", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            &generator::wgsl(key),
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec) -> Result<Bernoulli> {
    let dtype = match spec.int_opt("dtype")? {
        None => None,
        Some(code) => Some(
            i32::try_from(code)
                .ok()
                .and_then(DType::from_onnx_code)
                .ok_or_else(|| spec.bad("dtype", format!("unsupported data type code {code}")))?,
        ),
    };
    Ok(Bernoulli { dtype, seed: Seed::parse(spec)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Bernoulli", |spec| parse(spec).map(|b| Box::new(b) as Box<dyn Op>));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    #[test]
    fn frequencies_follow_the_probabilities() {
        // 4 probabilities, 2000 draws each: standard errors below 0.012.
        let probs = [0.0f32, 0.1, 0.5, 0.9];
        let p = f32s(&[2000, 4], &(0..8000).map(|i| probs[i % 4]).collect::<Vec<_>>());
        let case = Case::new("Bernoulli").opset(15).input(p).attr("seed", Attr::Float(5.0));
        let y = case.run_cpu().unwrap()[0].to_f64_vec();
        assert!(y.iter().all(|&v| v == 0.0 || v == 1.0));
        for (k, &pk) in probs.iter().enumerate() {
            let f = y.iter().skip(k).step_by(4).sum::<f64>() / 2000.0;
            assert!((f - pk as f64).abs() < 0.05, "p = {pk}: frequency {f}");
        }
        assert_eq!(case.run_cpu().unwrap()[0].to_f64_vec(), y, "a seed repeats");
        let typed = Case::new("Bernoulli").opset(15).input(rand(DType::F64, &[5], 2)).attr("dtype", Attr::Int(9)).run_cpu().unwrap();
        assert_eq!(typed[0].dtype(), DType::Bool);
        assert!(Case::new("Bernoulli").opset(15).input(i64_vec(&[1])).run_cpu().is_err());
    }
}
