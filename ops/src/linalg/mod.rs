//! Linear algebra: MatMul and Gemm, sharing one batched, strided matrix product (CPU
//! through the `gemm` crate, WGSL through a register-blocked kernel); the integer products MatMulInteger and
//! QLinearMatMul; onnxruntime's quantized products (domain `com.microsoft`): QGemm,
//! MatMulIntegerToFloat, DynamicQuantizeMatMul (over the exact integer product, WGSL in
//! `qproduct_wgsl`) and MatMulNBits; Det.
use crate::Registry;

mod det;
mod dynamic_quantize_matmul;
mod gemm;
mod gemv;
pub(crate) mod int8_kernel;
mod matmul;
mod matmul_integer;
mod matmul_integer_to_float;
mod matmul_nbits;
mod qgemm;
mod qlinear_matmul;
mod qmatmul_packed;
pub(crate) mod qproduct_wgsl;
pub mod microkernel;
pub mod packed;
pub(crate) mod product;
pub(crate) mod product_wgsl;

pub use gemm::Gemm;
pub use crate::elementwise::{BIAS_ATTR, RESIDUAL_ATTR};
pub use matmul::MatMul;

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MatMul", |spec| {
        let bias = spec.int(BIAS_ATTR, 0)? != 0;
        let residual = spec.int(RESIDUAL_ATTR, 0)? != 0;
        let has = |i: usize| spec.node.inputs.get(i).copied().flatten().is_some();
        if bias != has(2) || residual != has(3) || spec.node.inputs.len() > 4 {
            return Err(spec.bad(
                BIAS_ATTR,
                format!("a MatMul takes a fused bias as input 2 exactly when {} is set, and a residual as input 3 exactly when {} is set", BIAS_ATTR, RESIDUAL_ATTR),
            ));
        }
        Ok(Box::new(MatMul { activation: crate::elementwise::fused_activation(spec)?, bias, residual }))
    });
    r.register("", "Gemm", |spec| Ok(Box::new(Gemm::parse(spec)?)));
    matmul_integer::register(r);
    qlinear_matmul::register(r);
    qgemm::register(r);
    matmul_integer_to_float::register(r);
    dynamic_quantize_matmul::register(r);
    matmul_nbits::register(r);
    det::register(r);
}

#[cfg(test)]
pub(crate) mod testing {
    //! Reference helpers for the linalg tests: deterministic random tensors, a naive
    //! numpy-style matmul in f64, and a tolerance check.
    use kiln_graph::{DType, Tensor};

    /// Deterministic pseudo-random values in [-1, 1) (small integers for int dtypes).
    pub fn rand_tensor(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f64> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                if dtype.is_float() { u * 2.0 - 1.0 } else if dtype.is_signed() { (u * 11.0).floor() - 5.0 } else { (u * 6.0).floor() }
            })
            .collect();
        Tensor::from_f64(dtype, dims, &v).unwrap()
    }

    /// numpy.matmul in f64, written independently of the kernels' plan.
    pub fn naive_product(a: &Tensor, b: &Tensor) -> Tensor {
        let (mut ad, mut bd) = (a.dims().to_vec(), b.dims().to_vec());
        let (a1, b1) = (ad.len() == 1, bd.len() == 1);
        if a1 {
            ad.insert(0, 1);
        }
        if b1 {
            bd.push(1);
        }
        let rank = ad.len().max(bd.len());
        while ad.len() < rank {
            ad.insert(0, 1);
        }
        while bd.len() < rank {
            bd.insert(0, 1);
        }
        let (m, k, n) = (ad[rank - 2], ad[rank - 1], bd[rank - 1]);
        let batch: Vec<usize> = (0..rank - 2).map(|i| ad[i].max(bd[i])).collect();
        let count: usize = batch.iter().product();
        let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
        let mut out = vec![0.0; count * m * n];
        for bi in 0..count {
            let (mut r, mut oa, mut ob, mut sa, mut sb) = (bi, 0, 0, m * k, k * n);
            for d in (0..batch.len()).rev() {
                let i = r % batch[d];
                r /= batch[d];
                oa += if ad[d] == 1 { 0 } else { i * sa };
                ob += if bd[d] == 1 { 0 } else { i * sb };
                sa *= ad[d];
                sb *= bd[d];
            }
            for i in 0..m {
                for j in 0..n {
                    out[bi * m * n + i * n + j] = (0..k).map(|p| av[oa + i * k + p] * bv[ob + p * n + j]).sum();
                }
            }
        }
        let mut dims = batch;
        if !a1 {
            dims.push(m);
        }
        if !b1 {
            dims.push(n);
        }
        Tensor::from_f64(a.dtype(), &dims, &out).unwrap()
    }

    /// Asserts equal dims and values within a tolerance suited to the dtype.
    pub fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
        assert_eq!(got.dims(), want.dims(), "{what}: dims");
        assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
        let tol = match got.dtype() {
            DType::F32 => 1e-4,
            DType::F64 => 1e-10,
            DType::F16 | DType::BF16 => 1e-2,
            _ => 0.0,
        };
        for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            let ok = (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_nan() && w.is_nan()) || g == &w;
            assert!(ok, "{what}: element {i} is {g}, expected {w}");
        }
    }
}
