//! Gemm: `Y = alpha * op(A) * op(B) + beta * C` for 2-D A and B (op = optional
//! transpose, done through strides, never copies) and an optional C that broadcasts
//! unidirectionally to `[M, N]` (scalar, `[N]`, `[1, N]`, `[M, 1]`, `[M, N]`).
use super::matmul::PRODUCT_DTYPES;
use super::product::{BatchedProduct, Layout};
use crate::tensor::write_i64;
use super::product_wgsl::{self, Epilogue};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, TuneParam, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug, Clone, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Activation fused by the graph compiler (see `elementwise::fused_activation`).
    pub activation: Option<crate::elementwise::UnaryKind>,
}

impl Gemm {
    pub fn parse(spec: &NodeSpec) -> Result<Gemm> {
        Ok(Gemm {
            alpha: spec.float("alpha", 1.0)?,
            beta: spec.float("beta", 1.0)?,
            trans_a: spec.int("transA", 0)? != 0,
            trans_b: spec.int("transB", 0)? != 0,
            activation: crate::elementwise::fused_activation(spec)?,
        })
    }

    /// The product plan and, when C is present and used, its (row, col) strides.
    fn plan(&self, a: &[usize], b: &[usize], c: Option<&[usize]>) -> Result<(BatchedProduct, Option<(usize, usize)>)> {
        if a.len() != 2 || b.len() != 2 {
            return Err(OpError::invalid(format!("Gemm needs 2-D A and B, got A {a:?} and B {b:?}")));
        }
        let (m, ka) = if self.trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
        let (kb, n) = if self.trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
        if ka != kb {
            return Err(OpError::invalid(format!(
                "Gemm inner dimensions differ: A {a:?}{} has K={ka} but B {b:?}{} has K={kb}",
                if self.trans_a { " (transposed)" } else { "" },
                if self.trans_b { " (transposed)" } else { "" }
            )));
        }
        let mut p = BatchedProduct::broadcast(a, b, &[], &[], m, n, ka)?;
        p.a = if self.trans_a { Layout::row_major(m).transposed() } else { Layout::row_major(ka) };
        p.b = if self.trans_b { Layout::row_major(kb).transposed() } else { Layout::row_major(n) };
        let bias = match c {
            Some(c) if self.beta != 0.0 => Some(bias_strides(c, m, n)?),
            _ => None,
        };
        Ok((p, bias))
    }
}

/// Strides of C broadcast unidirectionally to `[m, n]`, or an error naming both shapes.
fn bias_strides(c: &[usize], m: usize, n: usize) -> Result<(usize, usize)> {
    let bad = || OpError::input(2, format!("C {c:?} cannot be broadcast to the output [{m}, {n}]"));
    let (rows, cols) = match c.len() {
        0 => (1, 1),
        1 => (1, c[0]),
        2 => (c[0], c[1]),
        _ => return Err(bad()),
    };
    if (rows != 1 && rows != m) || (cols != 1 && cols != n) {
        return Err(bad());
    }
    Ok((if rows == 1 { 0 } else { cols }, if cols == 1 { 0 } else { 1 }))
}

fn dims_of<'a>(inputs: &[Option<Arg<'a>>], i: usize) -> Option<&'a [usize]> {
    inputs.get(i).copied().flatten().map(|a| a.dims())
}

impl Op for Gemm {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Gemm"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, PRODUCT_DTYPES)?;
        for i in 1..3 {
            if let Some(x) = inputs.get(i).copied().flatten() {
                if x.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from A's {dtype}", x.dtype())));
                }
            }
        }
        let (p, _) = self.plan(required(inputs, 0)?.dims(), required(inputs, 1)?.dims(), dims_of(inputs, 2))?;
        Ok(vec![TensorType::new(dtype, vec![p.m, p.n])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let flops = match (dims_of(inputs, 0), dims_of(inputs, 1)) {
            (Some(a), Some(b)) => self.plan(a, b, None).map(|(p, _)| 2 * p.macs() + 2 * (p.m * p.n) as u64).unwrap_or(0),
            _ => 0,
        };
        Cost { flops, bytes }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Fills `out` (`[m, n]`, not f32: that takes the row-block epilogue) with `beta * C`
/// broadcast.
fn fill_bias(out: &mut Tensor, c: &Tensor, (rs, cs): (usize, usize), beta: f64) -> Result<()> {
    let n = out.dims()[1];
    match out.dtype() {
        d if d.is_int() => {
            let cv = c.to_i64_vec()?;
            let v: Vec<i64> = (0..out.len()).map(|o| cv[(o / n) * rs + (o % n) * cs].wrapping_mul(beta as i64)).collect();
            write_i64(out, &v)?;
        }
        _ => {
            let cv = c.to_f64_vec();
            let v: Vec<f64> = (0..out.len()).map(|o| beta * cv[(o / n) * rs + (o % n) * cs]).collect();
            *out = Tensor::from_f64(out.dtype(), &out.dims().to_vec(), &v)?;
        }
    }
    Ok(())
}

impl CpuKernel for Gemm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let c = inputs.get(2).copied().flatten();
        let (p, bias) = self.plan(a.dims(), b.dims(), c.map(|c| c.dims()))?;
        let out = &mut outputs[0];
        if out.dtype() == DType::F32 {
            // The product, then per block of rows (while in cache) beta * C and the activation.
            let c = match (c, bias) {
                (Some(c), Some(strides)) => Some((c.as_slice::<f32>()?, strides)),
                _ => None,
            };
            let (n, beta, act) = (p.n, self.beta, self.activation);
            let epilogue = |row0: usize, rows: &mut [f32]| {
                if let Some((cv, (rs, cs))) = c {
                    for (i, row) in rows.chunks_mut(n).enumerate() {
                        let base = (row0 + i) * rs;
                        if cs == 1 {
                            row.iter_mut().zip(&cv[base..base + n]).for_each(|(o, c)| *o += beta * c);
                        } else {
                            row.iter_mut().enumerate().for_each(|(j, o)| *o += beta * cv[base + j * cs]);
                        }
                    }
                }
                if let Some(k) = act {
                    k.apply_slice_f32_fast(rows);
                }
            };
            return p.run_f32_rows(a.as_slice()?, b.as_slice()?, out.as_mut_slice::<f32>()?, self.alpha, &epilogue);
        }
        let accumulate = match (c, bias) {
            (Some(c), Some(strides)) if p.m * p.n > 0 => {
                fill_bias(out, c, strides, self.beta as f64)?;
                true
            }
            _ => false,
        };
        p.run(a, b, out, self.alpha as f64, accumulate)?;
        crate::elementwise::apply_activation(self.activation, out)
    }
}

impl WgslKernel for Gemm {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        product_wgsl::params()
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let (p, bias) = self.plan(required(inputs, 0)?.dims(), required(inputs, 1)?.dims(), dims_of(inputs, 2))?;
        let epi = Epilogue { alpha: self.alpha as f64, beta: self.beta as f64, bias, residual: false, activation: self.activation };
        product_wgsl::generate_halves("Gemm", &p, wgsl::elem(outputs[0].dtype), &epi, tune, halves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::testing::{assert_close, naive_product, rand_tensor};

    fn transpose(t: &Tensor) -> Tensor {
        let (r, c) = (t.dims()[0], t.dims()[1]);
        let v = t.to_f64_vec();
        let tv: Vec<f64> = (0..r * c).map(|o| v[(o % r) * c + o / r]).collect();
        Tensor::from_f64(t.dtype(), &[c, r], &tv).unwrap()
    }

    fn check(g: &Gemm, m: usize, n: usize, k: usize, c_dims: Option<&[usize]>, dtype: DType) {
        let a = rand_tensor(dtype, &[m, k], 3);
        let b = rand_tensor(dtype, &[k, n], 4);
        let c = c_dims.map(|d| rand_tensor(dtype, d, 5));
        let a_in = if g.trans_a { transpose(&a) } else { a.clone() };
        let b_in = if g.trans_b { transpose(&b) } else { b.clone() };
        let types: Vec<TensorType> = [Some(&a_in), Some(&b_in), c.as_ref()].iter().flatten().map(|t| TensorType::new(t.dtype(), t.dims())).collect();
        let args: Vec<Option<Arg>> = types.iter().map(|ty| Some(Arg { ty, value: None })).collect();
        let ty = g.infer(&args).unwrap();
        assert_eq!(ty[0].dims, vec![m, n]);
        let mut out = vec![Tensor::zeros(dtype, &[m, n])];
        g.run(&[Some(&a_in), Some(&b_in), c.as_ref()], &mut out).unwrap();
        // Reference: alpha * AB + beta * C in f64.
        let ab = naive_product(&a, &b).to_f64_vec();
        let cv = c.as_ref().map(|c| c.to_f64_vec());
        let want: Vec<f64> = (0..m * n)
            .map(|o| {
                let (i, j) = (o / n, o % n);
                let bias = match (&cv, c_dims) {
                    (Some(cv), Some(d)) => {
                        let rows = if d.len() == 2 { d[0] } else { 1 };
                        let cols = d.last().copied().unwrap_or(1);
                        cv[(if rows == 1 { 0 } else { i }) * cols + if cols == 1 { 0 } else { j }]
                    }
                    _ => 0.0,
                };
                g.alpha as f64 * ab[o] + g.beta as f64 * bias
            })
            .collect();
        assert_close(&out[0], &Tensor::from_f64(dtype, &[m, n], &want).unwrap(), &format!("{g:?} {m}x{n}x{k} C {c_dims:?}"));
        let prog = g.generate(&args, &ty, &TuneValues::default()).unwrap();
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        assert_eq!(prog.dispatches[0].bindings.len(), if c.is_some() && g.beta != 0.0 { 4 } else { 3 });
    }

    #[test]
    fn all_attribute_and_bias_variants() {
        for (alpha, beta) in [(1.0, 1.0), (0.25, 0.35), (2.0, 0.0)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let g = Gemm { alpha, beta, trans_a: ta, trans_b: tb, activation: None };
                for (m, n, k) in [(7, 33, 65), (1, 8, 4), (33, 7, 1), (4, 4, 8)] {
                    for c in [None, Some(&[][..]), Some(&[n][..]), Some(&[1, n][..]), Some(&[m, 1][..]), Some(&[m, n][..]), Some(&[1][..])] {
                        check(&g, m, n, k, c, DType::F32);
                    }
                }
                check(&g, 5, 3, 7, Some(&[5, 3]), DType::F64);
            }
        }
        check(&Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true, activation: None }, 5, 3, 7, Some(&[3]), DType::I64);
        check(&Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false, activation: None }, 1, 256, 784, Some(&[256]), DType::F32);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let g = Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false, activation: None };
        let t = |d: &[usize]| TensorType::new(DType::F32, d.to_vec());
        let (a, b, c) = (t(&[3, 4]), t(&[5, 6]), t(&[3, 6]));
        let err = g.infer(&[Some(Arg { ty: &a, value: None }), Some(Arg { ty: &b, value: None })]).unwrap_err().to_string();
        assert!(err.contains("[3, 4]") && err.contains("[5, 6]"), "{err}");
        let (b2, c2) = (t(&[4, 6]), t(&[2, 6]));
        let err = g.infer(&[Some(Arg { ty: &a, value: None }), Some(Arg { ty: &b2, value: None }), Some(Arg { ty: &c2, value: None })]).unwrap_err().to_string();
        assert!(err.contains("[2, 6]"), "{err}");
        assert!(g.infer(&[Some(Arg { ty: &a, value: None }), Some(Arg { ty: &b2, value: None }), Some(Arg { ty: &c, value: None })]).is_ok());
        assert!(g.infer(&[Some(Arg { ty: &t(&[2, 3, 4]), value: None }), Some(Arg { ty: &b2, value: None })]).is_err());
    }
}
