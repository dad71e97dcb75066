//! Deterministic test data: seeded pseudo-random tensors of any dtype and small
//! constructors for literal tensors and attributes.
use kiln_graph::{Attr, DType, Tensor};

/// The `n` values in [-1, 1) of the seeded generator behind [`rand`] (a 64-bit LCG,
/// rounded through f32 so that f32 tensors hold exactly these values).
pub fn rand_values(n: usize, seed: u64) -> Vec<f32> {
    let step = |s: u64| s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut s = step(seed);
    (0..n)
        .map(|_| {
            s = step(s);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A seeded pseudo-random tensor: floats in [-1, 1), signed integers in [-5, 5],
/// unsigned integers in [0, 10], bools about half true, strings of short words
/// (some empty, some with spaces). Same seed, same tensor.
pub fn rand(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let u = rand_values(dims.iter().product(), seed);
    if dtype == DType::String {
        const WORDS: [&str; 8] = ["", "a", "Monday", "b c", "Ünï", "x-y", "  ", "tuesday"];
        let v = u.iter().map(|&x| WORDS[((x + 1.0) * 4.0).clamp(0.0, 7.0) as usize].to_string()).collect();
        return Tensor::from_strings(dims, v).expect("dims and values agree");
    }
    let v: Vec<f64> = u
        .iter()
        .map(|&x| {
            let x = x as f64;
            match dtype {
                d if d.is_float() => x,
                DType::Bool => (x > 0.0) as u8 as f64,
                d if d.is_signed() => (x * 5.5).round(),
                _ => ((x + 1.0) * 5.0).floor(),
            }
        })
        .collect();
    Tensor::from_f64(dtype, dims, &v).expect("dims and values agree")
}

/// A seeded pseudo-random f32 tensor in [-1, 1).
pub fn rand_f32(dims: &[usize], seed: u64) -> Tensor {
    rand(DType::F32, dims, seed)
}

/// [`rand_f32`] mapped by `f` (wider ranges, positive values, offsets).
pub fn rand_f32_map(dims: &[usize], seed: u64, f: impl Fn(f32) -> f32) -> Tensor {
    let v: Vec<f32> = rand_values(dims.iter().product(), seed).into_iter().map(f).collect();
    f32s(dims, &v)
}

/// An f32 tensor from literal values.
pub fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).expect("dims and values agree")
}

/// An i64 tensor from literal values.
pub fn i64s(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_slice(dims, v).expect("dims and values agree")
}

/// A rank-1 i64 tensor (shapes, axes, pads, starts).
pub fn i64_vec(v: &[i64]) -> Tensor {
    i64s(&[v.len()], v)
}

/// A string tensor from literal values.
pub fn strs(dims: &[usize], v: &[&str]) -> Tensor {
    Tensor::from_strings(dims, v.iter().map(|s| s.to_string()).collect()).expect("dims and values agree")
}

/// A bool tensor from literal values.
pub fn bools(dims: &[usize], v: &[bool]) -> Tensor {
    Tensor::from_bools(dims, v).expect("dims and values agree")
}

/// 0, 1, 2, ... as f32 of the given dims.
pub fn iota_f32(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    f32s(dims, &(0..n).map(|v| v as f32).collect::<Vec<_>>())
}

/// 0, 1, 2, ... as i64 of the given dims.
pub fn iota_i64(dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    i64s(dims, &(0..n as i64).collect::<Vec<_>>())
}

/// `t` converted to `dtype` through f64 (C-style casts, as [`Tensor::from_f64`]).
pub fn cast(t: &Tensor, dtype: DType) -> Tensor {
    Tensor::from_f64(dtype, t.dims(), &t.to_f64_vec()).expect("same dims")
}

/// An `ints` attribute.
pub fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// A `string` attribute.
pub fn string(s: &str) -> Attr {
    Attr::String(s.to_string())
}
