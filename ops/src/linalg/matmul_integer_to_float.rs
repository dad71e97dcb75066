//! MatMulIntegerToFloat (com.microsoft): inputs `A, B, a_scale, b_scale, a_zero_point,
//! b_zero_point, bias`; `Y = (A - a_zp) x (B - b_zp) * (a_scale * b_scale) + bias` in
//! f32, with MatMul's broadcasting. As onnxruntime computes it: the product exact in
//! int32 ([`int_product`]), converted to f32, times the multiplier `a_scale *
//! b_scale[n]` (one f32 product per column), then plus the bias (a separate f32
//! addition). a's scale and zero point are per tensor; b's per tensor or per column;
//! the bias has B's last dim. [`scale_and_bias`] is shared with DynamicQuantizeMatMul.
use super::matmul::plan;
use super::matmul_integer::{full, int_product, int_product_wgsl, zero_point_dims, IntOperands};
use super::qlinear_matmul::per_output;
use crate::broadcast::for_each_offset;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::{check_scalar, scalar_f32, MS_DOMAIN, Q8, SCALE};
use crate::wgsl::{WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct MatMulIntegerToFloat;

/// Input indices of B's operands in a product with a float output: B, its scale and
/// zero point, the bias.
#[derive(Clone, Copy)]
pub(super) struct BInputs {
    pub b: usize,
    pub scale: usize,
    pub zero_point: usize,
    pub bias: usize,
}

/// Checks B's scale (f32, per tensor or per column), zero point (optional, B's dtype,
/// per tensor or per column) and bias (optional, f32 [N]) against A's dims `a`; the
/// output type.
pub(super) fn infer_float_product(inputs: &[Option<Arg>], a: &[usize], ix: BInputs) -> Result<TensorType> {
    let db = expect_dtype(inputs, ix.b, &Q8)?;
    let b = required(inputs, ix.b)?.dims();
    let (_, fb) = full(a, b);
    expect_dtype(inputs, ix.scale, &SCALE)?;
    zero_point_dims(ix.scale, false, required(inputs, ix.scale)?.dims(), &fb)?;
    if let Some(z) = inputs.get(ix.zero_point).copied().flatten() {
        expect_dtype(inputs, ix.zero_point, &[db])?;
        zero_point_dims(ix.zero_point, false, z.dims(), &fb)?;
    }
    let (_, dims) = plan(a, b)?;
    if let Some(bias) = inputs.get(ix.bias).copied().flatten() {
        expect_dtype(inputs, ix.bias, &SCALE)?;
        let n = fb[fb.len() - 1];
        if bias.dims() != [n] {
            return Err(OpError::input(ix.bias, format!("bias must have B's last dim, [{n}], got {:?}", bias.dims())));
        }
    }
    Ok(TensorType::new(DType::F32, dims))
}

/// `y = f32(acc) * (a_scale * b_scale) + bias` over the output (`acc` the exact int32
/// product of operands of dims `a` and `b`).
pub(super) fn scale_and_bias(acc: &[i32], a_scale: f32, inputs: &[Option<&Tensor>], ix: BInputs, a: &[usize], y: &mut [f32]) -> Result<()> {
    let b = cpu::input(inputs, ix.b)?.dims();
    let (_, fb) = full(a, b);
    let (p, _) = plan(a, b)?;
    let mut dims = p.batch.clone();
    dims.extend([p.m, p.n]);
    let (sb, sb_strides) = per_output(cpu::input(inputs, ix.scale)?, ix.scale, false, &fb, &dims)?;
    let multipliers: Vec<f32> = sb.iter().map(|&s| a_scale * s).collect();
    let bias = match inputs.get(ix.bias).copied().flatten() {
        Some(t) => t.as_slice::<f32>()?.to_vec(),
        None => vec![],
    };
    let n = p.n;
    for_each_offset(&dims, &[sb_strides], |o, offs| {
        let v = acc[o] as f32 * multipliers[offs[0]];
        y[o] = if bias.is_empty() { v } else { v + bias[o % n] };
    });
    Ok(())
}

/// Extra buffers of [`int_product_wgsl`]: name, input index, and for a per-row or
/// per-column tensor whether it is A's.
pub(super) type ExtraBuffers = Vec<(&'static str, usize, Option<bool>)>;

/// The WGSL epilogue of [`scale_and_bias`]: the extra buffers (`sb`, per column, and
/// `bias`) and the statements storing `y[i]` from the sum `s` and the f32 expression
/// `a_scale`.
pub(super) fn scale_and_bias_wgsl(inputs: &[Option<Arg>], ix: BInputs, a_scale: &str) -> (ExtraBuffers, String) {
    let mut extra = vec![("sb", ix.scale, Some(false))];
    let bias = if inputs.get(ix.bias).copied().flatten().is_some() {
        extra.push(("bias", ix.bias, Some(false)));
        " + bias[bias_at(i)]"
    } else {
        ""
    };
    (extra, format!("y[i] = f32(s) * ({a_scale} * sb[sb_at(i)]){bias};"))
}

const INPUTS: BInputs = BInputs { b: 1, scale: 3, zero_point: 5, bias: 6 };

impl Op for MatMulIntegerToFloat {
    fn name(&self) -> &str {
        "MatMulIntegerToFloat"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let da = expect_dtype(inputs, 0, &Q8)?;
        check_scalar(inputs, 2, &SCALE, false)?;
        check_scalar(inputs, 4, &[da], true)?;
        Ok(vec![infer_float_product(inputs, required(inputs, 0)?.dims(), INPUTS)?])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let k = inputs.first().copied().flatten().and_then(|a| a.dims().last().copied()).unwrap_or(1);
        Cost { flops: 2 * (outputs[0].len() * k) as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MatMulIntegerToFloat {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let a = cpu::input(inputs, 0)?;
        let ops = IntOperands { a, b: cpu::input(inputs, 1)?, za: opt(4), zb: opt(5), za_input: 4, zb_input: 5 };
        let mut acc = vec![0i32; outputs[0].len()];
        int_product(&ops, &mut acc)?;
        scale_and_bias(&acc, scalar_f32(inputs, 2)?, inputs, INPUTS, a.dims(), outputs[0].as_mut_slice::<f32>()?)
    }
}

impl WgslKernel for MatMulIntegerToFloat {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (mut extra, epilogue) = scale_and_bias_wgsl(inputs, INPUTS, "sa[0]");
        extra.insert(0, ("sa", 2, None));
        int_product_wgsl("MatMulIntegerToFloat", inputs, [0, 1], [Some(4), Some(5)], &extra, &outputs[0], &epilogue, tune)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "MatMulIntegerToFloat", |_| Ok(Box::new(MatMulIntegerToFloat)));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::Tensor;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// onnxruntime 1.32's outputs for the same inputs, bit for bit.
    #[test]
    fn matches_onnxruntime() {
        let a = u8s(&[2, 2, 7], &[128, 85, 111, 238, 52, 135, 83, 75, 206, 39, 81, 30, 38, 71, 178, 148, 114, 43, 204, 204, 60, 15, 81, 37, 204, 133, 129, 74]);
        let b = i8s(&[7, 3], &[1, 119, -68, 68, -125, -48, 110, 95, -107, 87, 88, -12, -34, 122, 115, 45, -26, -75, 111, -60, 14]);
        let sb = Tensor::from_vec(&[3], vec![0.01f32, 0.002, 0.03]).unwrap();
        let bias = Tensor::from_vec(&[3], vec![0.5, -1.25, 3.0f32]).unwrap();
        // Batched A, b's scale and zero point per column, a bias.
        let c = ms("MatMulIntegerToFloat").input(a.clone()).constant(b).constant(f(0.05)).constant(sb).constant(u8s(&[], &[130])).constant(i8s(&[3], &[1, 0, -3])).constant(bias);
        let y = c.run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), [2, 2, 3]);
        assert_eq!(bits(&y), [0x3fbed917, 0xbf1fbe76, 0xc0f9cac0, 0xc0f14396, 0xc098dd30, 0x410d24dd, 0xc0e0dd30, 0xbf30e560, 0x40831687, 0xc0c5d70b, 0xbfee7a10, 0x41f1eb85]);
        // uint8 B, no a zero point, no bias.
        let a0 = u8s(&[2, 7], &a.as_slice::<u8>().unwrap()[..14]);
        let c = ms("MatMulIntegerToFloat").input(a0).input(u8s(&[7, 2], &[172, 61, 80, 189, 50, 172, 241, 175, 165, 118, 247, 56, 91, 164])).input(f(0.05)).input(f(0.013)).omitted().input(u8s(&[], &[128]));
        assert_eq!(bits(&c.run_cpu().unwrap()[0]), [0x41b478a1, 0x4061c361, 0x3fd25461, 0x4102dfa4]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let c = ms("MatMulIntegerToFloat").input(u8s(&[2, 3], &[0; 6])).input(u8s(&[3, 2], &[0; 6])).input(f(0.1)).input(Tensor::from_vec(&[3], vec![0.1f32; 3]).unwrap());
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 3"), "{e}");
        let c = ms("MatMulIntegerToFloat").input(u8s(&[2, 3], &[0; 6])).input(u8s(&[3, 2], &[0; 6])).input(f(0.1)).input(f(0.1)).omitted().omitted().input(Tensor::from_vec(&[3], vec![0f32; 3]).unwrap());
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("bias"), "{e}");
    }
}
