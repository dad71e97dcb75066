//! Det (opset 11): the determinant of each square matrix of `X` (`[*, M, M]` -> `[*]`),
//! by Gaussian elimination with partial pivoting (the product of the pivots, negated
//! per row swap). The CPU eliminates in f64; the GPU runs one invocation per matrix,
//! eliminating in f32 in a scratch copy, for matrices whose elimination fits one
//! invocation's loop budget ([`MAX_GPU_ORDER`]).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Largest order the GPU kernel eliminates (`M^3` loop iterations stay under
/// [`wgsl::MAX_LOOP_ITERATIONS`]).
const MAX_GPU_ORDER: usize = 48;

#[derive(Debug)]
pub struct Det;

impl Det {
    /// (matrices, order) of the input.
    fn dims(inputs: &[Option<Arg>]) -> Result<(usize, usize)> {
        expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
        let d = required(inputs, 0)?.dims();
        match d {
            [.., m, n] if m == n => Ok((d[..d.len() - 2].iter().product(), *m)),
            _ => Err(OpError::input(0, format!("expected [*, M, M] square matrices, found shape {d:?}"))),
        }
    }
}

/// The determinant of the `n x n` row-major matrix `a` (overwritten).
fn determinant(a: &mut [f64], n: usize) -> f64 {
    let mut det = 1.0;
    for k in 0..n {
        let pivot = (k..n).fold(k, |p, r| if a[r * n + k].abs() > a[p * n + k].abs() { r } else { p });
        if a[pivot * n + k] == 0.0 {
            return 0.0;
        }
        if pivot != k {
            for c in 0..n {
                a.swap(k * n + c, pivot * n + c);
            }
            det = -det;
        }
        let d = a[k * n + k];
        det *= d;
        for r in k + 1..n {
            let f = a[r * n + k] / d;
            for c in k + 1..n {
                a[r * n + c] -= f * a[k * n + c];
            }
        }
    }
    det
}

impl Op for Det {
    fn name(&self) -> &str {
        "Det"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Self::dims(inputs)?;
        let x = required(inputs, 0)?;
        Ok(vec![TensorType::new(x.dtype(), x.dims()[..x.rank() - 2].to_vec())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = Self::dims(inputs).map(|(b, n)| (b * n * n * n) as u64).unwrap_or(0);
        Cost { flops, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Det {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (b, n) = crate::tensor::tensor_args(inputs, Self::dims)?;
        let x = cpu::input(inputs, 0)?.to_f64_vec();
        let mut y = vec![0.0; b];
        cpu::par_chunks_mut(&mut y, 1, n * n * n, |m0, part| {
            let mut a = vec![0.0; n * n];
            for (k, out) in part.iter_mut().enumerate() {
                let m = m0 + k;
                a.copy_from_slice(&x[m * n * n..(m + 1) * n * n]);
                *out = determinant(&mut a, n);
            }
        });
        let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
        outputs[0] = Tensor::from_f64(dtype, &dims, &y)?;
        Ok(())
    }
}

impl WgslKernel for Det {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (b, n) = Self::dims(inputs)?;
        if n > MAX_GPU_ORDER {
            return Err(OpError::Unsupported(format!("Det of {n}x{n} matrices: the GPU kernel eliminates at most {MAX_GPU_ORDER}x{MAX_GPU_ORDER} in one invocation")));
        }
        let nn = n * n;
        let body = format!(
            "let base = i * {nn}u;\n    for (var p = 0u; p < {nn}u; p = p + 1u) {{ a[base + p] = x[base + p]; }}\n    \
             var det = 1.0;\n    for (var k = 0u; k < {n}u; k = k + 1u) {{\n        var piv = k;\n        \
             for (var r = k + 1u; r < {n}u; r = r + 1u) {{ if (abs(a[base + r * {n}u + k]) > abs(a[base + piv * {n}u + k])) {{ piv = r; }} }}\n        \
             if (a[base + piv * {n}u + k] == 0.0) {{ det = 0.0; break; }}\n        \
             if (piv != k) {{\n            for (var c = 0u; c < {n}u; c = c + 1u) {{\n                let t = a[base + k * {n}u + c];\n                \
             a[base + k * {n}u + c] = a[base + piv * {n}u + c];\n                a[base + piv * {n}u + c] = t;\n            }}\n            det = -det;\n        }}\n        \
             let d = a[base + k * {n}u + k];\n        det = det * d;\n        \
             for (var r = k + 1u; r < {n}u; r = r + 1u) {{\n            let f = a[base + r * {n}u + k] / d;\n            \
             for (var c = k + 1u; c < {n}u; c = c + 1u) {{ a[base + r * {n}u + c] = a[base + r * {n}u + c] - f * a[base + k * {n}u + c]; }}\n        }}\n    }}\n    \
             y[i] = det;"
        );
        let mut d = wgsl::simple_kernel(
            "Det",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", "f32", true), ("y", "f32", false), ("a", "f32", false)],
            vec![Binding::Input(0), Binding::Output(0), Binding::Scratch(0)],
            "",
            &body,
        );
        d.label = format!("Det {b} x {n}x{n}");
        Ok(WgslProgram { dispatches: vec![d], scratch_bytes: vec![(b * nn * 4).max(4) as u64] })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Det", |_| Ok(Box::new(Det)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    /// The determinant by cofactor expansion along the first row (the definition).
    fn cofactor(a: &[f64], n: usize) -> f64 {
        if n == 1 {
            return a[0];
        }
        (0..n)
            .map(|j| {
                let minor: Vec<f64> = (1..n).flat_map(|r| (0..n).filter(move |&c| c != j).map(move |c| a[r * n + c])).collect();
                let sign = if j % 2 == 0 { 1.0 } else { -1.0 };
                sign * a[j] * cofactor(&minor, n - 1)
            })
            .sum()
    }

    #[test]
    fn matches_cofactor_expansion() {
        for (dims, seed) in [(vec![2usize, 2], 1u64), (vec![3, 2, 2], 2), (vec![2, 1, 5, 5], 3), (vec![1, 1], 4), (vec![4, 4], 5)] {
            let x = rand_f32(&dims, seed);
            let n = dims[dims.len() - 1];
            let v = x.to_f64_vec();
            let want: Vec<f64> = v.chunks(n * n).map(|m| cofactor(m, n)).collect();
            let got = Case::new("Det").opset(11).input(x).run_cpu().unwrap();
            assert_eq!(got[0].dims(), &dims[..dims.len() - 2]);
            assert_close(&got[0], &want, 1e-5, &format!("{dims:?}"));
        }
        // Singular (a repeated row), and a pivot that needs a swap.
        let got = Case::new("Det").opset(11).input(f32s(&[2, 3, 3], &[1., 2., 3., 1., 2., 3., 4., 5., 6., 0., 1., 0., 1., 0., 0., 0., 0., 2.])).run_cpu().unwrap();
        assert_close(&got[0], &[0.0, -2.0], 1e-6, "singular and swapped");
        assert!(Case::new("Det").opset(11).input(rand_f32(&[2, 3], 1)).run_cpu().is_err());
        assert!(Case::new("Det").opset(11).input(rand_f32(&[3], 1)).run_cpu().is_err());
    }
}
