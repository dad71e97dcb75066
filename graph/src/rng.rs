//! A tiny deterministic random generator for values of built graphs and for random
//! inputs (a 64-bit LCG with Knuth's MMIX constants; not for statistics or security):
//! the same seed gives the same values on every run and machine.
use crate::Tensor;

/// 64-bit linear congruential generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1))
    }

    /// Uniform in [-1, 1), 24 bits of resolution.
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// An f32 tensor of uniform values in [-scale, scale); an error when the dims do
    /// not fit in memory.
    pub fn tensor(&mut self, dims: &[usize], scale: f32) -> crate::Result<Tensor> {
        let n = crate::size::elements(dims)?;
        let v: Vec<f32> = (0..n).map(|_| self.next_f32() * scale).collect();
        Tensor::from_slice(dims, &v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        for _ in 0..1000 {
            let x = a.next_f32();
            assert_eq!(x, b.next_f32());
            assert!((-1.0..1.0).contains(&x));
        }
        assert_ne!(Rng::new(1).next_f32(), Rng::new(2).next_f32());
        assert_eq!(Rng::new(5).tensor(&[2, 3], 0.5).unwrap().dims(), &[2, 3]);
    }
}
