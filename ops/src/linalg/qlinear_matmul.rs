//! QLinearMatMul: the int8/uint8 product requantized,
//! `y = saturate(round_half_to_even((A - za) x (B - zb) * (sa * sb / sy)) + zy)`: the
//! product exact in int32 ([`int_product`]), the multiplier and the rounding in f32 as
//! onnxruntime computes them. Scales and zero points of A per tensor or per row, of B
//! per tensor or per column; y's per tensor.
use super::matmul::plan;
use super::matmul_integer::{full, int_product, int_product_wgsl, zero_point_dims, IntOperands};
use crate::broadcast::broadcast_strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::range;
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const DTYPES: [DType; 2] = [DType::I8, DType::U8];
const SCALES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[derive(Debug, Clone, PartialEq)]
pub struct QLinearMatMul;

impl Op for QLinearMatMul {
    fn name(&self) -> &str {
        "QLinearMatMul"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let da = expect_dtype(inputs, 0, &DTYPES)?;
        let db = expect_dtype(inputs, 3, &DTYPES)?;
        let dy = expect_dtype(inputs, 7, &DTYPES)?;
        for s in [1, 4, 6] {
            expect_dtype(inputs, s, &SCALES)?;
        }
        let (a, b) = (required(inputs, 0)?.dims(), required(inputs, 3)?.dims());
        let (fa, fb) = full(a, b);
        for (i, d, of_a) in [(1, None, true), (2, Some(da), true), (4, None, false), (5, Some(db), false)] {
            let t = required(inputs, i)?;
            if d.is_some_and(|d| d != t.dtype()) {
                return Err(OpError::input(i, format!("zero point dtype {} differs from its operand's", t.dtype())));
            }
            zero_point_dims(i, of_a, t.dims(), if of_a { &fa } else { &fb })?;
        }
        for i in [6, 7] {
            if required(inputs, i)?.ty.len() != 1 {
                return Err(OpError::input(i, format!("y's scale and zero point are per tensor (one element), got {:?}", required(inputs, i)?.dims())));
            }
        }
        let (_, dims) = plan(a, b)?;
        Ok(vec![TensorType::new(dy, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Per-tensor or per-row/column values of input `i` against operand dims `x`, one per
/// output element of `out` (`[batch..., m, n]`).
pub(super) fn per_output(t: &Tensor, i: usize, of_a: bool, x: &[usize], out: &[usize]) -> Result<(Vec<f32>, Vec<usize>)> {
    let zd = zero_point_dims(i, of_a, t.dims(), x)?;
    let mut padded = vec![1; out.len().saturating_sub(zd.len())];
    padded.extend(&zd);
    Ok((t.to_f64_vec().into_iter().map(|v| v as f32).collect(), broadcast_strides(&padded, out)))
}

impl CpuKernel for QLinearMatMul {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let t = |i: usize| cpu::input(inputs, i);
        let (a, b) = (t(0)?, t(3)?);
        let ops = IntOperands { a, b, za: Some(t(2)?), zb: Some(t(5)?), za_input: 2, zb_input: 5 };
        let n_out = outputs[0].len();
        let mut acc = vec![0i32; n_out];
        int_product(&ops, &mut acc)?;
        let (fa, fb) = full(a.dims(), b.dims());
        let (p, _) = plan(a.dims(), b.dims())?;
        let mut dims = p.batch.clone();
        dims.extend([p.m, p.n]);
        let (sa, sa_st) = per_output(t(1)?, 1, true, &fa, &dims)?;
        let (sb, sb_st) = per_output(t(4)?, 4, false, &fb, &dims)?;
        let sy = t(6)?.to_f64_vec()[0] as f32;
        let zy = t(7)?.to_f64_vec()[0] as f32;
        let bounds = range(outputs[0].dtype());
        let mut q = vec![0i64; n_out];
        crate::broadcast::for_each_offset(&dims, &[sa_st, sb_st], |o, offs| {
            let m = sa[offs[0]] * sb[offs[1]] / sy;
            q[o] = ((acc[o] as f32 * m).round_ties_even() + zy).clamp(bounds.0, bounds.1) as i64;
        });
        crate::tensor::write_i64(&mut outputs[0], &q)
    }
}

impl WgslKernel for QLinearMatMul {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (lo, hi) = range(outputs[0].dtype);
        let ye = wgsl::elem(outputs[0].dtype);
        let epilogue = format!(
            "let mult = q_div(sa[sa_at(i)] * sb[sb_at(i)], sy[0]);\n    y[i] = {ye}(clamp(round(f32(s) * mult) + f32(zy[0]), {}, {}));",
            wgsl::literal("f32", lo as f64),
            wgsl::literal("f32", hi as f64)
        );
        let extra = [("sa", 1, Some(true)), ("sb", 4, Some(false)), ("sy", 6, None), ("zy", 7, None)];
        int_product_wgsl("QLinearMatMul", inputs, [0, 3], [Some(2), Some(5)], &extra, &outputs[0], &epilogue, tune)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "QLinearMatMul", |_| Ok(Box::new(QLinearMatMul)));
}
