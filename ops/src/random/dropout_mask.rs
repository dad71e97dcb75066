//! kiln.DropoutMask: the scaled keep-mask of training-mode dropout, a tensor of the
//! given shape whose elements are `1 / (1 - ratio)` (kept) or 0 (dropped). The key of
//! the [`super::generator`] stream comes from the `seed` input at run time (a training
//! step feeds a new one each step) and the `stream` attribute (one per Dropout node),
//! so the CPU and WGSL kernels draw the same mask for the same seed, and a GPU program
//! generated once serves every step.
//!
//! Inputs: `shape` (int64, constant), `seed` (an integer scalar whose low 31 bits
//! count). Attributes: `ratio` in [0, 1), `stream`.
use super::generator::{self, mix};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{constant, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct DropoutMask {
    ratio: f32,
    stream: u32,
}

impl DropoutMask {
    /// The generator key of a step's seed.
    fn key(&self, seed: u32) -> [u32; 2] {
        let k0 = mix(seed ^ mix(self.stream.wrapping_add(0x5eed)));
        [k0, mix(k0 ^ 0x9e37_79b9)]
    }

    fn scale(&self) -> f32 {
        (1.0 / (1.0 - self.ratio as f64)) as f32
    }
}

impl Op for DropoutMask {
    fn name(&self) -> &str {
        "DropoutMask"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let shape = constant(inputs, 0, "DropoutMask's shape")?.to_i64_vec()?;
        let seed = required(inputs, 1)?;
        if !seed.dtype().is_int() || seed.ty.len() != 1 {
            return Err(OpError::input(1, format!("the seed must be one integer, found {}", seed.ty)));
        }
        let dims: Vec<usize> = shape.iter().map(|&d| usize::try_from(d).map_err(|_| OpError::input(0, format!("dim {d} is negative")))).collect::<Result<_>>()?;
        let n = kiln_graph::size::elements(&dims).map_err(|e| OpError::input(0, e.to_string()))?;
        generator::check_count(n)?;
        Ok(vec![TensorType::new(DType::F32, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for DropoutMask {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let seed = cpu::input(inputs, 1)?.to_i64_vec()?[0] as u32 & 0x7fff_ffff;
        let key = self.key(seed);
        let (ratio, scale) = (self.ratio as f64, self.scale());
        for (i, y) in outputs[0].as_mut_slice::<f32>()?.iter_mut().enumerate() {
            *y = if generator::uniform(key, i as u32) >= ratio { scale } else { 0.0 };
        }
        Ok(())
    }
}

impl WgslKernel for DropoutMask {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        // The key is derived in the kernel from the seed buffer, as `key` does.
        let helpers = format!(
            "{}\nfn drop_key(seed: u32) -> vec2<u32> {{\n    let k0 = rng_mix(seed ^ rng_mix({}u));\n    return vec2<u32>(k0, rng_mix(k0 ^ 0x9e3779b9u));\n}}\n",
            generator::wgsl([0, 0]),
            self.stream.wrapping_add(0x5eed)
        );
        let body = format!(
            "let k = drop_key(u32(seed[0]) & 0x7fffffffu);\n    let u = f32(rng_mix(rng_mix(i + k.x) ^ k.y) >> 8u) / 16777216.0;\n    \
             y[i] = select(0.0, {}, u >= {});",
            wgsl::literal("f32", self.scale() as f64),
            wgsl::literal("f32", self.ratio as f64)
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "DropoutMask",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("seed", "i32", true), ("y", "f32", false)],
            vec![Binding::Input(1), Binding::Output(0)],
            &helpers,
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec) -> Result<DropoutMask> {
    let ratio = spec.float("ratio", 0.5)?;
    if !(0.0..1.0).contains(&ratio) {
        return Err(spec.bad("ratio", format!("expected a value in [0, 1), found {ratio}")));
    }
    let stream = u32::try_from(spec.int("stream", 0)?).map_err(|_| spec.bad("stream", "expected a value in [0, 2^32)"))?;
    Ok(DropoutMask { ratio, stream })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "DropoutMask", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use kiln_graph::Attr;

    fn mask(seed: i64, ratio: f32, stream: i64, n: usize) -> Vec<f32> {
        let case = Case::new("DropoutMask")
            .domain("kiln")
            .attrs(&[("ratio", Attr::Float(ratio)), ("stream", Attr::Int(stream))])
            .constant(Tensor::from_vec(&[1], vec![n as i64]).unwrap())
            .input(Tensor::scalar(seed));
        case.run_cpu().unwrap()[0].as_slice::<f32>().unwrap().to_vec()
    }

    #[test]
    fn keeps_one_minus_ratio_scaled_and_varies_with_seed_and_stream() {
        let m = mask(7, 0.25, 0, 100_000);
        let kept = m.iter().filter(|&&v| v != 0.0).count() as f64 / m.len() as f64;
        assert!((kept - 0.75).abs() < 0.01, "kept {kept}");
        assert!(m.iter().all(|&v| v == 0.0 || v == (1.0f64 / 0.75) as f32));
        assert_eq!(m, mask(7, 0.25, 0, 100_000), "a seed gives one mask");
        assert_ne!(m, mask(8, 0.25, 0, 100_000));
        assert_ne!(m, mask(7, 0.25, 1, 100_000));
        assert!(mask(7, 0.0, 0, 100).iter().all(|&v| v == 1.0));
    }
}
