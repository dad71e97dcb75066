//! [`RandomFill`]: a tensor of independent draws from one distribution, the op type of
//! RandomUniform, RandomNormal and their `*Like` forms (which take the shape, and
//! unless `dtype` says otherwise the dtype, of their input; its values are not read).
//! Element `i` is the distribution applied to counter `i` of [`super::generator`].
use super::generator::{self, Seed};
use crate::cpu::CpuKernel;
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// A distribution of real values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Dist {
    Uniform { low: f32, high: f32 },
    Normal { mean: f32, scale: f32 },
}

#[derive(Debug)]
pub(crate) struct RandomFill {
    pub name: &'static str,
    pub dist: Dist,
    /// `Some(dims)`: the `shape` attribute; `None`: the input's shape (`*Like`).
    pub shape: Option<Vec<usize>>,
    /// The `dtype` attribute (default: f32, or the input's dtype for `*Like`).
    pub dtype: Option<DType>,
    pub seed: Seed,
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The `dtype` attribute, which must name a float type.
pub(crate) fn float_dtype(spec: &NodeSpec) -> Result<Option<DType>> {
    let Some(code) = spec.int_opt("dtype")? else { return Ok(None) };
    let d = i32::try_from(code).ok().and_then(DType::from_onnx_code).filter(|d| FLOATS.contains(d));
    d.map(Some).ok_or_else(|| spec.bad("dtype", format!("expected a float type, found code {code}")))
}

impl RandomFill {
    fn out_type(&self, inputs: &[Option<Arg>]) -> Result<TensorType> {
        let ty = match &self.shape {
            Some(dims) => TensorType::new(self.dtype.unwrap_or(DType::F32), dims.clone()),
            None => {
                let x = required(inputs, 0)?;
                let dtype = match self.dtype {
                    Some(d) => d,
                    None if FLOATS.contains(&x.dtype()) => x.dtype(),
                    None => return Err(OpError::input(0, format!("{} of a {} input needs a float `dtype` attribute", self.name, x.dtype()))),
                };
                TensorType::new(dtype, x.dims().to_vec())
            }
        };
        let n = ty.checked_len().ok_or_else(|| OpError::invalid(format!("the output {ty} does not fit in memory")))?;
        generator::check_count(n)?;
        Ok(ty)
    }

    fn value(&self, key: [u32; 2], i: u32) -> f64 {
        match self.dist {
            Dist::Uniform { low, high } => low as f64 + generator::uniform(key, i) * (high as f64 - low as f64),
            Dist::Normal { mean, scale } => mean as f64 + scale as f64 * generator::normal(key, i),
        }
    }
}

impl Op for RandomFill {
    fn name(&self) -> &str {
        self.name
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn varies_between_runs(&self) -> bool {
        !self.seed.is_fixed()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![self.out_type(inputs)?])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for RandomFill {
    fn run(&self, _inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
        let key = self.seed.key();
        let v: Vec<f64> = (0..outputs[0].len() as u32).map(|i| self.value(key, i)).collect();
        outputs[0] = Tensor::from_f64(dtype, &dims, &v)?;
        Ok(())
    }
}

impl WgslKernel for RandomFill {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let key = self.seed.gpu_key(self.name)?;
        let value = match self.dist {
            Dist::Uniform { low, high } => {
                format!("{} + rng_uniform(i) * {}", wgsl::literal("f32", low as f64), wgsl::literal("f32", high as f64 - low as f64))
            }
            Dist::Normal { mean, scale } => {
                format!("{} + {} * rng_normal(i)", wgsl::literal("f32", mean as f64), wgsl::literal("f32", scale as f64))
            }
        };
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name,
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("y", "f32", false)],
            vec![Binding::Output(0)],
            &generator::wgsl(key),
            &format!("y[i] = {value};"),
        )))
    }
}

/// The `shape` attribute of RandomUniform/RandomNormal.
pub(crate) fn shape_attr(spec: &NodeSpec) -> Result<Vec<usize>> {
    let dims = spec.ints_opt("shape")?.ok_or_else(|| spec.bad("shape", "the attribute is required"))?;
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| spec.bad("shape", format!("dims must be non-negative, found {dims:?}"))))
        .collect()
}
