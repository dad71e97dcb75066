//! MatMul with numpy semantics: 1-D operands get a dim prepended (A) or appended (B)
//! that is removed from the result; leading (batch) dims broadcast. Runs as a
//! [`BatchedProduct`] on the CPU (gemm crate for floats) and the register-blocked
//! product kernel in WGSL.
use super::product::BatchedProduct;
use super::product_wgsl::{self, Epilogue};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, TuneParam, WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

pub(crate) const PRODUCT_DTYPES: &[DType] = &[
    DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U64,
    DType::I8, DType::I16, DType::U8, DType::U16,
];

#[derive(Debug, Default)]
pub struct MatMul {
    /// Activation fused by the graph compiler (see `elementwise::fused_activation`).
    pub activation: Option<crate::elementwise::UnaryKind>,
    /// A bias fused by the graph compiler (attribute [`crate::elementwise::BIAS_ATTR`]): input 2 is a vector
    /// of the output's last dim, added to every row before the activation.
    pub bias: bool,
    /// A residual fused by the graph compiler (attribute [`crate::elementwise::RESIDUAL_ATTR`]): input 3 has
    /// the output's shape and is added (after the bias, before the activation).
    pub residual: bool,
}


/// The product plan and output dims for operand dims `a` and `b`.
pub fn plan(a: &[usize], b: &[usize]) -> Result<(BatchedProduct, Vec<usize>)> {
    if a.is_empty() || b.is_empty() {
        return Err(OpError::invalid(format!("MatMul operands must have rank >= 1, got A {a:?} and B {b:?}")));
    }
    let (m, ka, a_batch) = if a.len() == 1 { (1, a[0], &a[..0]) } else { (a[a.len() - 2], a[a.len() - 1], &a[..a.len() - 2]) };
    let (kb, n, b_batch) = if b.len() == 1 { (b[0], 1, &b[..0]) } else { (b[b.len() - 2], b[b.len() - 1], &b[..b.len() - 2]) };
    if ka != kb {
        return Err(OpError::invalid(format!(
            "MatMul inner dimensions differ: A {a:?} has {ka} columns but B {b:?} has {kb} rows"
        )));
    }
    let p = BatchedProduct::broadcast(a, b, a_batch, b_batch, m, n, ka)?;
    let mut dims = p.batch.clone();
    if a.len() > 1 {
        dims.push(m);
    }
    if b.len() > 1 {
        dims.push(n);
    }
    Ok((p, dims))
}

impl Op for MatMul {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "MatMul"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, PRODUCT_DTYPES)?;
        let b = required(inputs, 1)?;
        if b.dtype() != dtype {
            return Err(OpError::input(1, format!("dtype {} differs from A's {dtype}", b.dtype())));
        }
        let (_, dims) = plan(required(inputs, 0)?.dims(), b.dims())?;
        if self.residual {
            let r = required(inputs, 3)?;
            if r.dtype() != dtype || r.dims() != dims.as_slice() {
                return Err(OpError::input(3, format!("a fused residual must be {dtype} {dims:?}, got {} {:?}", r.dtype(), r.dims())));
            }
        }
        if self.bias {
            let c = required(inputs, 2)?;
            let n = dims.last().copied().unwrap_or(1);
            if c.dtype() != dtype || c.ty.len() != n || c.dims().last().copied().unwrap_or(1) != n {
                return Err(OpError::input(2, format!("a fused bias must be a {dtype} vector of {n} elements, got {} {:?}", c.dtype(), c.dims())));
            }
        }
        Ok(vec![TensorType::new(dtype, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let flops = match (required(inputs, 0), required(inputs, 1)) {
            (Ok(a), Ok(b)) => plan(a.dims(), b.dims()).map(|(p, _)| 2 * p.macs()).unwrap_or(0),
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

impl CpuKernel for MatMul {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let (p, _) = plan(a.dims(), b.dims())?;
        if outputs[0].dtype() == DType::F32 {
            return self.run_f32(&p, inputs, &mut outputs[0]);
        }
        let accumulate = (self.bias || self.residual) && p.m * p.n > 0;
        if accumulate {
            let out = &mut outputs[0];
            if self.residual {
                out.bytes_mut().copy_from_slice(cpu::input(inputs, 3)?.bytes());
            } else {
                out.bytes_mut().fill(0);
            }
        }
        if accumulate && self.bias {
            let c = cpu::input(inputs, 2)?;
            let out = &mut outputs[0];
            let n = c.len();
            // Rare dtypes (f32 took `run_f32`): through f64.
            let cv = c.to_f64_vec();
            let v: Vec<f64> = out.to_f64_vec().iter().enumerate().map(|(i, x)| x + cv[i % n.max(1)]).collect();
            *out = Tensor::from_f64(out.dtype(), &out.dims().to_vec(), &v)?;
        }
        p.run(a, b, &mut outputs[0], 1.0, accumulate)?;
        crate::elementwise::apply_activation(self.activation, &mut outputs[0])
    }
}

impl MatMul {
    /// f32: the product, then per block of rows (while in cache) the bias, the residual
    /// and the activation.
    fn run_f32(&self, p: &BatchedProduct, inputs: &[Option<&Tensor>], out: &mut Tensor) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?.as_slice::<f32>()?, cpu::input(inputs, 1)?.as_slice::<f32>()?);
        let bias = if self.bias { Some(cpu::input(inputs, 2)?.as_slice::<f32>()?) } else { None };
        let residual = if self.residual { Some(cpu::input(inputs, 3)?.as_slice::<f32>()?) } else { None };
        let n = p.n;
        let act = self.activation;
        let epilogue = |row0: usize, rows: &mut [f32]| {
            if let Some(r) = residual {
                rows.iter_mut().zip(&r[row0 * n..]).for_each(|(o, r)| *o += r);
            }
            if let Some(c) = bias {
                rows.chunks_mut(n).for_each(|row| row.iter_mut().zip(c).for_each(|(o, b)| *o += b));
            }
            if let Some(k) = act {
                k.apply_slice_f32_fast(rows);
            }
        };
        p.run_f32_rows(a, b, out.as_mut_slice::<f32>()?, 1.0, &epilogue)
    }
}

impl WgslKernel for MatMul {
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
        let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
        let (p, _) = plan(a.dims(), b.dims())?;
        let bias = self.bias.then_some((0, 1));
        let epi = Epilogue { activation: self.activation, bias, beta: 1.0, residual: self.residual, ..Epilogue::NONE };
        product_wgsl::generate_halves("MatMul", &p, wgsl::elem(outputs[0].dtype), &epi, tune, halves)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::testing::{assert_close, naive_product, rand_tensor};

    fn check(a_dims: &[usize], b_dims: &[usize], want_dims: &[usize], dtype: DType) {
        let (a, b) = (rand_tensor(dtype, a_dims, 1), rand_tensor(dtype, b_dims, 2));
        let (ta, tb) = (TensorType::new(dtype, a_dims), TensorType::new(dtype, b_dims));
        let args = [Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })];
        let ty = MatMul::default().infer(&args).unwrap();
        assert_eq!(ty[0].dims, want_dims, "{a_dims:?} x {b_dims:?}");
        let mut out = vec![Tensor::zeros(dtype, &ty[0].dims)];
        MatMul::default().run(&[Some(&a), Some(&b)], &mut out).unwrap();
        let want = naive_product(&a, &b);
        assert_close(&out[0], &want, &format!("{a_dims:?} x {b_dims:?} {dtype}"));
        for rows in [1, 4, 8] {
            let mut tune = TuneValues::default();
            tune.0.insert("rows_per_thread".into(), rows);
            let prog = MatMul::default().generate(&args, &ty, &tune).unwrap();
            crate::wgsl::testing::validate(&prog.dispatches[0].source);
        }
    }

    #[test]
    fn fused_bias_and_residual_match_the_unfused_form() {
        use crate::linalg::testing::{assert_close, naive_product, rand_tensor};
        for (a_dims, b_dims) in [(vec![2usize, 3, 5], vec![5usize, 6]), (vec![4, 7], vec![7, 8])] {
            let (a, b) = (rand_tensor(DType::F32, &a_dims, 1), rand_tensor(DType::F32, &b_dims, 2));
            let n = b_dims[1];
            let prod = naive_product(&a, &b);
            let bias = rand_tensor(DType::F32, &[n], 3);
            let res = rand_tensor(DType::F32, prod.dims(), 4);
            let want: Vec<f64> = prod.to_f64_vec().iter().enumerate().map(|(i, p)| p + bias.to_f64_vec()[i % n] + res.to_f64_vec()[i]).collect();
            let want = Tensor::from_f64(DType::F32, prod.dims(), &want).unwrap();
            let op = MatMul { activation: None, bias: true, residual: true };
            let ins = [Some(&a), Some(&b), Some(&bias), Some(&res)];
            let mut out = vec![Tensor::zeros(DType::F32, prod.dims())];
            op.run(&ins, &mut out).unwrap();
            assert_close(&out[0], &want, "bias + residual");
            let types: Vec<TensorType> = ins.iter().map(|t| TensorType::new(DType::F32, t.unwrap().dims())).collect();
            let args: Vec<Option<Arg>> = types.iter().map(|t| Some(Arg { ty: t, value: None })).collect();
            let outs = op.infer(&args).unwrap();
            let p = op.generate(&args, &outs, &TuneValues::default()).unwrap();
            crate::wgsl::testing::validate(&p.dispatches[0].source);
            assert!(p.dispatches[0].source.contains("res["));
            // A residual of another shape is refused.
            let bad = TensorType::new(DType::F32, vec![1, n]);
            let mut args2 = args.clone();
            args2[3] = Some(Arg { ty: &bad, value: None });
            assert!(op.infer(&args2).unwrap_err().to_string().contains("residual"));
        }
    }

    #[test]
    fn shapes_and_values_match_the_reference() {
        for &(m, n, k) in &[(1, 1, 1), (7, 33, 65), (33, 7, 1), (65, 65, 33), (1, 65, 7), (4, 8, 16), (64, 64, 64)] {
            check(&[m, k], &[k, n], &[m, n], DType::F32);
        }
        check(&[3], &[3], &[], DType::F32);
        check(&[3], &[2, 3, 5], &[2, 5], DType::F32);
        check(&[2, 4, 3], &[3], &[2, 4], DType::F32);
        check(&[2, 1, 5, 3], &[4, 3, 7], &[2, 4, 5, 7], DType::F32);
        check(&[2, 3, 5, 4], &[4, 6], &[2, 3, 5, 6], DType::F32);
        check(&[5, 4], &[2, 3, 4, 6], &[2, 3, 5, 6], DType::F32);
        check(&[1, 2, 128, 64], &[1, 2, 64, 128], &[1, 2, 128, 128], DType::F32);
        check(&[6, 33, 17], &[6, 17, 9], &[6, 33, 9], DType::F32);
        check(&[2, 7, 5], &[2, 5, 3], &[2, 7, 3], DType::F64);
        check(&[2, 7, 5], &[5, 3], &[2, 7, 3], DType::I64);
        check(&[7, 5], &[5, 3], &[7, 3], DType::I32);
        check(&[3, 8], &[8, 4], &[3, 4], DType::U32);
        check(&[3, 0], &[0, 4], &[3, 4], DType::F32);
        check(&[3, 5], &[5, 0], &[3, 0], DType::F32);
    }

    #[test]
    fn mismatches_are_clear_errors() {
        let (ta, tb) = (TensorType::new(DType::F32, vec![2, 5, 3]), TensorType::new(DType::F32, vec![4, 7]));
        let err = MatMul::default().infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })]).unwrap_err().to_string();
        assert!(err.contains("[2, 5, 3]") && err.contains("[4, 7]"), "{err}");
        let (ta, tb) = (TensorType::new(DType::F32, vec![2, 5, 3]), TensorType::new(DType::F32, vec![4, 3, 7]));
        let err = MatMul::default().infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })]).unwrap_err().to_string();
        assert!(err.contains("[2, 5, 3]") && err.contains("[4, 3, 7]"), "{err}");
        let tc = TensorType::new(DType::I64, vec![3, 7]);
        assert!(MatMul::default().infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tc, value: None })]).is_err());
        let cost = MatMul::default().cost(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &TensorType::new(DType::F32, vec![3, 7]), value: None })], &[]);
        assert_eq!(cost.flops, 2 * 2 * 5 * 7 * 3);
    }
}
