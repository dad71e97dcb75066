//! The random stream of the random ops: a counter-based generator, so element `i` of
//! an output is a pure function of (key, i) and the CPU and WGSL kernels draw the same
//! numbers in any order and any number of threads. `bits(key, i) = mix(mix(i + k0) ^
//! k1)`, where `mix` is a 32-bit integer finalizer (xor-shift/multiply rounds with the
//! constants 0x21f0aaad and 0xd35a2d97 from Chris Wellons' hash-prospector); uniforms
//! take the top 24 bits, so they are exact in f32 and equal on every backend.
//!
//! A `seed` attribute (a float, as ONNX has it) fixes the key from its bits: the same
//! output on every run and device. Without one, every run takes a fresh key from a
//! per-process random value and a counter ([`Seed::key`]); a GPU program is generated
//! once per plan, with its key baked in, so unseeded random ops run on the CPU (their
//! WGSL generators answer `Unsupported` and placement keeps them on the host), and
//! such ops are never folded into constants ([`crate::Op::varies_between_runs`]).
use crate::{NodeSpec, OpError, Result};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Most elements one random op draws (counters are 32-bit; a normal takes two).
pub(crate) const MAX_DRAWS: usize = 1 << 31;

/// The op's `seed` attribute, or none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Seed {
    Fixed(f32),
    Fresh,
}

impl Seed {
    pub fn parse(spec: &NodeSpec) -> Result<Seed> {
        Ok(match spec.float_opt("seed")? {
            Some(s) if s.is_finite() => Seed::Fixed(s),
            Some(s) => return Err(spec.bad("seed", format!("expected a finite number, found {s}"))),
            None => Seed::Fresh,
        })
    }

    /// The key of one run: fixed by the seed, else fresh each call.
    pub fn key(self) -> [u32; 2] {
        let x = match self {
            Seed::Fixed(s) => s.to_bits() as u64 | 0x5eed_0000_0000_0000,
            Seed::Fresh => {
                static PROCESS: OnceLock<u64> = OnceLock::new();
                static RUNS: AtomicU64 = AtomicU64::new(0);
                let base = *PROCESS.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish());
                base ^ RUNS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            }
        };
        [mix(x as u32 ^ mix((x >> 32) as u32)), mix((x >> 32) as u32 ^ 0x9e37_79b9)]
    }

    pub fn is_fixed(self) -> bool {
        matches!(self, Seed::Fixed(_))
    }

    /// The key a WGSL program bakes in, or `Unsupported` for an unseeded op.
    pub fn gpu_key(self, op: &str) -> Result<[u32; 2]> {
        match self {
            Seed::Fixed(_) => Ok(self.key()),
            Seed::Fresh => Err(OpError::Unsupported(format!(
                "{op} without a seed draws a fresh key on every run, which a GPU program generated once cannot; it runs on the CPU"
            ))),
        }
    }
}

/// The 32-bit finalizer.
pub(crate) fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x21f0_aaad);
    x ^= x >> 15;
    x = x.wrapping_mul(0xd35a_2d97);
    x ^= x >> 15;
    x
}

/// The random bits of counter `i`.
pub(crate) fn bits(key: [u32; 2], i: u32) -> u32 {
    mix(mix(i.wrapping_add(key[0])) ^ key[1])
}

/// Uniform in [0, 1) (24 bits).
pub(crate) fn uniform(key: [u32; 2], i: u32) -> f64 {
    (bits(key, i) >> 8) as f64 / (1u32 << 24) as f64
}

/// Standard normal of element `i` (Box-Muller on counters 2i and 2i + 1).
pub(crate) fn normal(key: [u32; 2], i: u32) -> f64 {
    let u1 = ((bits(key, 2 * i) >> 8) + 1) as f64 / (1u32 << 24) as f64;
    let u2 = uniform(key, 2 * i + 1);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Checks that an output of `n` elements fits the 32-bit counters.
pub(crate) fn check_count(n: usize) -> Result<()> {
    if n > MAX_DRAWS {
        return Err(OpError::invalid(format!("{n} random values exceed the generator's {MAX_DRAWS} per op")));
    }
    Ok(())
}

/// The same functions in WGSL, for key `key`: `rng_bits(i)`, `rng_uniform(i)` (f32 in
/// [0, 1)) and `rng_normal(i)`.
pub(crate) fn wgsl(key: [u32; 2]) -> String {
    format!(
        "fn rng_mix(v: u32) -> u32 {{\n    var x = v;\n    x = x ^ (x >> 16u);\n    x = x * 0x21f0aaadu;\n    x = x ^ (x >> 15u);\n    \
         x = x * 0xd35a2d97u;\n    x = x ^ (x >> 15u);\n    return x;\n}}\n\
         fn rng_bits(i: u32) -> u32 {{ return rng_mix(rng_mix(i + {k0}u) ^ {k1}u); }}\n\
         fn rng_uniform(i: u32) -> f32 {{ return f32(rng_bits(i) >> 8u) / 16777216.0; }}\n\
         fn rng_normal(i: u32) -> f32 {{\n    let u1 = f32((rng_bits(2u * i) >> 8u) + 1u) / 16777216.0;\n    \
         let u2 = rng_uniform(2u * i + 1u);\n    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n}}\n",
        k0 = key[0],
        k1 = key[1]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_and_normal_moments() {
        let key = Seed::Fixed(3.0).key();
        let n = 200_000u32;
        let u: Vec<f64> = (0..n).map(|i| uniform(key, i)).collect();
        let mean = u.iter().sum::<f64>() / n as f64;
        let var = u.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard errors: 1/sqrt(12 n) ~ 0.00065 for the mean.
        assert!((mean - 0.5).abs() < 0.004 && (var - 1.0 / 12.0).abs() < 0.002, "uniform mean {mean} var {var}");
        assert!(u.iter().all(|v| (0.0..1.0).contains(v)));
        let z: Vec<f64> = (0..n).map(|i| normal(key, i)).collect();
        let mean = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let within1 = z.iter().filter(|v| v.abs() < 1.0).count() as f64 / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "normal mean {mean} var {var}");
        assert!((within1 - 0.6827).abs() < 0.01, "normal P(|z| < 1) = {within1}");
        // Neighbouring counters are uncorrelated.
        let lag: f64 = (0..n - 1).map(|i| (u[i as usize] - 0.5) * (u[i as usize + 1] - 0.5)).sum::<f64>() / (n - 1) as f64 * 12.0;
        assert!(lag.abs() < 0.01, "lag-1 correlation {lag}");
    }

    #[test]
    fn seeds_fix_keys_and_fresh_keys_differ() {
        assert_eq!(Seed::Fixed(1.5).key(), Seed::Fixed(1.5).key());
        assert_ne!(Seed::Fixed(1.5).key(), Seed::Fixed(2.5).key());
        assert_ne!(Seed::Fresh.key(), Seed::Fresh.key());
        assert!(Seed::Fresh.gpu_key("RandomNormal").is_err());
    }
}
