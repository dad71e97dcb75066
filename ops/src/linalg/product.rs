//! The batched matrix product shared by MatMul and Gemm on the CPU: a description of
//! strided operands (no copies for transposes or broadcast batches) and its execution,
//! through the `gemm` crate for f32/f64 and plain loops (wrapping i64) for integers.
use crate::broadcast::{broadcast_strides, strides};
use super::gemv;
use crate::cpu;
use crate::tensor::write_i64;
use crate::{OpError, Result};
use kiln_graph::{DType, Tensor};

/// How element (row, col) of one matrix operand is addressed: `row * rs + col * cs`
/// from the operand's batch offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub rs: usize,
    pub cs: usize,
}

impl Layout {
    pub fn row_major(cols: usize) -> Layout {
        Layout { rs: cols, cs: 1 }
    }
    pub fn transposed(self) -> Layout {
        Layout { rs: self.cs, cs: self.rs }
    }
}

/// `out[b] = A[b] x B[b]` for every index `b` over the batch dims, with `A[b]` an
/// `m x k` matrix and `B[b]` a `k x n` matrix. The output is contiguous
/// `[batch..., m, n]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchedProduct {
    /// Output batch dims (may be empty).
    pub batch: Vec<usize>,
    /// Element offset into A of each batch dim's step (0 on broadcast dims).
    pub a_batch_strides: Vec<usize>,
    pub b_batch_strides: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Layout,
    pub b: Layout,
}

impl BatchedProduct {
    /// A plan for row-major operands with batch dims `a_batch`/`b_batch` (broadcast
    /// together numpy-style). The error names both shapes.
    pub fn broadcast(a_dims: &[usize], b_dims: &[usize], a_batch: &[usize], b_batch: &[usize], m: usize, n: usize, k: usize) -> Result<BatchedProduct> {
        let batch = crate::broadcast::broadcast_shapes(&[a_batch, b_batch]).map_err(|_| {
            OpError::invalid(format!(
                "batch dims {a_batch:?} of A {a_dims:?} and {b_batch:?} of B {b_dims:?} cannot be broadcast together"
            ))
        })?;
        let scale = |s: Vec<usize>, size: usize| s.into_iter().map(|v| v * size).collect::<Vec<_>>();
        Ok(BatchedProduct {
            a_batch_strides: scale(broadcast_strides(a_batch, &batch), m * k),
            b_batch_strides: scale(broadcast_strides(b_batch, &batch), k * n),
            batch,
            m,
            n,
            k,
            a: Layout::row_major(k),
            b: Layout::row_major(n),
        })
    }

    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    /// Multiply-adds of the whole product.
    pub fn macs(&self) -> u64 {
        self.batch_count() as u64 * self.m as u64 * self.n as u64 * self.k as u64
    }

    /// Offsets of A and B for batch index `b` (row-major over `batch`).
    pub fn offsets(&self, mut b: usize) -> (usize, usize) {
        let (mut oa, mut ob) = (0, 0);
        for d in (0..self.batch.len()).rev() {
            let i = b % self.batch[d];
            b /= self.batch[d];
            oa += i * self.a_batch_strides[d];
            ob += i * self.b_batch_strides[d];
        }
        (oa, ob)
    }

    /// When B is shared by all batches and A's batches are consecutive row-major
    /// matrices, the whole product is one `(batch*m) x k` by `k x n` product.
    fn folded(&self) -> Option<BatchedProduct> {
        let count = self.batch_count();
        if count <= 1 || self.b_batch_strides.iter().any(|&s| s != 0) || self.a != Layout::row_major(self.k) {
            return None;
        }
        let contiguous: Vec<usize> = strides(&self.batch).into_iter().map(|s| s * self.m * self.k).collect();
        if contiguous != self.a_batch_strides {
            return None;
        }
        Some(BatchedProduct { batch: vec![], a_batch_strides: vec![], b_batch_strides: vec![], m: count * self.m, ..self.clone() })
    }

    /// Runs the product into `out` (`len == batch * m * n`). When `accumulate`, `out`
    /// already holds a bias that the product is added to; `alpha` scales the product.
    pub fn run(&self, a: &Tensor, b: &Tensor, out: &mut Tensor, alpha: f64, accumulate: bool) -> Result<()> {
        match out.dtype() {
            DType::F32 => self.run_float::<f32>(a.as_slice()?, b.as_slice()?, out.as_mut_slice()?, alpha as f32, accumulate),
            DType::F64 => self.run_float::<f64>(a.as_slice()?, b.as_slice()?, out.as_mut_slice()?, alpha, accumulate),
            DType::F16 | DType::BF16 => {
                // Through f32 (rare on the CPU).
                let (fa, fb) = (to_f32(a)?, to_f32(b)?);
                let mut fo = to_f32(out)?;
                self.run(&fa, &fb, &mut fo, alpha, accumulate)?;
                *out = Tensor::from_f64(out.dtype(), out.dims(), &fo.to_f64_vec())?;
                Ok(())
            }
            d if d.is_int() => {
                let (ia, ib) = (a.to_i64_vec()?, b.to_i64_vec()?);
                let mut io = out.to_i64_vec()?;
                self.run_int(&ia, &ib, &mut io, alpha as i64, accumulate);
                write_i64(out, &io)
            }
            d => Err(OpError::Unsupported(format!("matrix product of {d} tensors"))),
        }
    }

    /// The f32 product (times `alpha`) into `out` (overwritten), then `epilogue(first_row, rows)` on
    /// blocks of whole output rows (`first_row` counts rows over all batches), each block
    /// right after its product while it is in cache. Large single products are split by
    /// rows over the threads, each part one single-threaded `gemm` call followed by its
    /// epilogue: one fork-join per product instead of one per pass over the output.
    pub fn run_f32_rows(&self, a: &[f32], b: &[f32], out: &mut [f32], alpha: f32, epilogue: &(dyn Fn(usize, &mut [f32]) + Sync)) -> Result<()> {
        self.check_len(a.len(), b.len(), out.len())?;
        if let Some(f) = self.folded() {
            return f.run_f32_rows(a, b, out, alpha, epilogue);
        }
        let (m, n, k) = (self.m, self.n, self.k);
        if m == 0 || n == 0 {
            return Ok(());
        }
        let product = |bi: usize, i0: usize, dst: &mut [f32], par: gemm::Parallelism| {
            let rows = dst.len() / n;
            if k == 0 {
                dst.fill(0.0);
                return;
            }
            let (oa, ob) = self.offsets(bi);
            // SAFETY: check_len proved every offset of batch `bi` in bounds; rows
            // i0..i0 + rows of A lie within its m rows, and dst is rows x n.
            unsafe {
                gemm::gemm(
                    rows, n, k,
                    dst.as_mut_ptr(), 1, n as isize, false,
                    a.as_ptr().add(oa + i0 * self.a.rs), self.a.cs as isize, self.a.rs as isize,
                    b.as_ptr().add(ob), self.b.cs as isize, self.b.rs as isize,
                    0.0, alpha, false, false, false, par,
                );
            }
        };
        let count = self.batch_count();
        let threads = cpu::threads().max(1);
        let per_batch = m * n * k;
        if count >= 2 && threads > 1 && per_batch < (1 << 21) {
            // Many small products: one per task.
            cpu::par_chunks_mut(out, m * n, k, |first, part| {
                for (j, dst) in part.chunks_mut(m * n).enumerate() {
                    product(first + j, 0, dst, gemm::Parallelism::None);
                    epilogue((first + j) * m, dst);
                }
            });
        } else if threads > 1 && per_batch >= (1 << 15) && m >= 16 * threads {
            // Rows split over the threads, batch by batch.
            let rows = m.div_ceil(threads);
            for (bi, dst) in out.chunks_mut(m * n).enumerate() {
                cpu::par_chunks_mut(dst, rows * n, cpu::PAR_GRAIN, |first, part| {
                    let i0 = first * rows;
                    product(bi, i0, part, gemm::Parallelism::None);
                    epilogue(bi * m + i0, part);
                });
            }
        } else if count == 1 && (m == 1 || (m <= gemv::MAX_ROWS && k * n <= gemv::CACHED_B)) && self.a.cs == 1 && gemv::applies(self.b.rs, self.b.cs) {
            // Matrix-vector products (batch-1 classifiers, recurrent steps): bound by
            // reading B, which stays in cache from one row to the next.
            let (oa, ob) = self.offsets(0);
            let x = |i: usize| &a[oa + i * self.a.rs..][..k];
            let mut rows = out.chunks_mut(n).enumerate();
            while let Some((i, row)) = rows.next() {
                match (self.b.cs == 1).then(|| rows.next()).flatten() {
                    // Row-major B: two rows per pass over it.
                    Some((_, next)) => gemv::gemv2([x(i), x(i + 1)], &b[ob..], self.b.rs, alpha, [row, next]),
                    None => gemv::gemv(x(i), &b[ob..], self.b.rs, self.b.cs, alpha, row),
                }
            }
            epilogue(0, out);
        } else {
            let par = if per_batch >= (1 << 15) && threads > 1 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
            for (bi, dst) in out.chunks_mut(m * n).enumerate() {
                product(bi, 0, dst, par);
                epilogue(bi * m, dst);
            }
        }
        Ok(())
    }

    fn check_len(&self, a: usize, b: usize, out: usize) -> Result<()> {
        let need_a = self.extent(&self.a_batch_strides, self.a, self.m, self.k);
        let need_b = self.extent(&self.b_batch_strides, self.b, self.k, self.n);
        if a < need_a || b < need_b || out != self.batch_count() * self.m * self.n {
            return Err(OpError::invalid(format!(
                "matrix product buffers too small: A has {a} (needs {need_a}), B {b} (needs {need_b}), out {out}"
            )));
        }
        Ok(())
    }

    /// One past the largest element offset the product reads from an operand.
    fn extent(&self, batch_strides: &[usize], l: Layout, rows: usize, cols: usize) -> usize {
        if rows == 0 || cols == 0 || self.batch_count() == 0 {
            return 0;
        }
        let last_batch: usize = self.batch.iter().zip(batch_strides).map(|(d, s)| (d - 1) * s).sum();
        last_batch + (rows - 1) * l.rs + (cols - 1) * l.cs + 1
    }

    pub(crate) fn run_float<T: gemm_scalar::Scalar>(&self, a: &[T], b: &[T], out: &mut [T], alpha: T, accumulate: bool) -> Result<()> {
        self.check_len(a.len(), b.len(), out.len())?;
        if let Some(f) = self.folded() {
            return f.run_float(a, b, out, alpha, accumulate);
        }
        let (m, n, k) = (self.m, self.n, self.k);
        if m == 0 || n == 0 {
            return Ok(());
        }
        let count = self.batch_count();
        if k == 0 {
            if !accumulate {
                out.fill(T::ZERO);
            }
            return Ok(());
        }
        let one = |bi: usize, dst: &mut [T], par: gemm::Parallelism| {
            let (oa, ob) = self.offsets(bi);
            // SAFETY: check_len proved every offset read below is in bounds: the
            // largest is extent() - 1 for each operand, and dst is exactly m x n.
            unsafe {
                gemm::gemm(
                    m, n, k,
                    dst.as_mut_ptr(), 1, n as isize, accumulate,
                    a.as_ptr().add(oa), self.a.cs as isize, self.a.rs as isize,
                    b.as_ptr().add(ob), self.b.cs as isize, self.b.rs as isize,
                    T::ONE, alpha, false, false, false, par,
                );
            }
        };
        let per_batch = m * n * k;
        let threads = cpu::threads();
        if count >= 2 && threads > 1 && per_batch < (1 << 21) {
            // Many small products: one per task, each single-threaded.
            cpu::par_chunks_mut(out, m * n, k, |first, part| {
                for (j, dst) in part.chunks_mut(m * n).enumerate() {
                    one(first + j, dst, gemm::Parallelism::None);
                }
            });
        } else {
            let par = if per_batch >= (1 << 15) && threads > 1 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
            for (bi, dst) in out.chunks_mut(m * n).enumerate() {
                one(bi, dst, par);
            }
        }
        Ok(())
    }

    fn run_int(&self, a: &[i64], b: &[i64], out: &mut [i64], alpha: i64, accumulate: bool) {
        if self.check_len(a.len(), b.len(), out.len()).is_err() || self.m * self.n == 0 {
            return;
        }
        let (m, n, k) = (self.m, self.n, self.k);
        for (bi, dst) in out.chunks_mut(m * n).enumerate() {
            let (oa, ob) = self.offsets(bi);
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0i64;
                    for p in 0..k {
                        let x = a[oa + i * self.a.rs + p * self.a.cs];
                        let y = b[ob + p * self.b.rs + j * self.b.cs];
                        s = s.wrapping_add(x.wrapping_mul(y));
                    }
                    let v = s.wrapping_mul(alpha);
                    let d = &mut dst[i * n + j];
                    *d = if accumulate { d.wrapping_add(v) } else { v };
                }
            }
        }
    }
}

/// The float types the `gemm` crate multiplies.
pub(crate) mod gemm_scalar {
    pub trait Scalar: Copy + Send + Sync + 'static {
        const ZERO: Self;
        const ONE: Self;
    }
    impl Scalar for f32 {
        const ZERO: f32 = 0.0;
        const ONE: f32 = 1.0;
    }
    impl Scalar for f64 {
        const ZERO: f64 = 0.0;
        const ONE: f64 = 1.0;
    }
}

fn to_f32(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_f64(DType::F32, t.dims(), &t.to_f64_vec())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_and_offsets() {
        let p = BatchedProduct::broadcast(&[2, 3, 5, 4], &[4, 6], &[2, 3], &[], 5, 6, 4).unwrap();
        let f = p.folded().unwrap();
        assert_eq!((f.m, f.batch_count()), (30, 1));
        let q = BatchedProduct::broadcast(&[2, 1, 5, 3], &[4, 3, 7], &[2, 1], &[4], 5, 7, 3).unwrap();
        assert_eq!(q.batch, vec![2, 4]);
        assert!(q.folded().is_none());
        assert_eq!(q.offsets(5), (15, 21 * 1));
        assert!(BatchedProduct::broadcast(&[2, 5, 3], &[4, 3, 7], &[2], &[4], 5, 7, 3).is_err());
    }
}
