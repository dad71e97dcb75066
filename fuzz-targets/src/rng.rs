//! A small deterministic random generator (SplitMix64) for the mutators and the
//! synthesised inputs: the same seed gives the same mutations on every machine, so the
//! stable smoke is reproducible and a failing case is named by its seed.

/// SplitMix64: a 64-bit state advanced by a constant and mixed on output.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// An integer that tends to break size arithmetic: boundaries, powers of two,
    /// negatives, and small values that are plausible dims or axes.
    pub fn interesting_i64(&mut self) -> i64 {
        const VALUES: &[i64] = &[
            0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 1024, 65535, 65536, 1 << 20, 1 << 24, i32::MAX as i64,
            1 << 31, 1 << 32, 1 << 40, 1 << 62, i64::MAX, -1, -2, -3, -4, -128, i32::MIN as i64,
            i64::MIN, i64::MIN + 1, 3_000_000_000, 10_000_000_000,
        ];
        if self.chance(1, 4) {
            self.below(9) as i64 - 2
        } else {
            *self.pick(VALUES)
        }
    }

    pub fn interesting_f32(&mut self) -> f32 {
        const VALUES: &[f32] = &[
            0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, 1e30, f32::MAX, f32::MIN, f32::MIN_POSITIVE, f32::EPSILON,
            f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 4e9, -4e9,
        ];
        *self.pick(VALUES)
    }
}

/// FNV-1a over the bytes: names reproducers and known failures by their content.
pub fn content_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}
