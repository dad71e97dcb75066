//! MatMulIntegerToFloat (com.microsoft): inputs `A, B, a_scale, b_scale, a_zero_point,
//! b_zero_point, bias`; `Y = (A - a_zp) x (B - b_zp) * (a_scale * b_scale) + bias` in
//! f32, with MatMul's broadcasting. As onnxruntime computes it: the product exact in
//! int32 ([`int_product`]), converted to f32, times the multiplier `a_scale *
//! b_scale[n]` (one f32 product per column), then plus the bias (a separate f32
//! addition). a's scale and zero point are per tensor; b's per tensor or per column;
//! the bias has B's last dim. [`scale_and_bias`] is shared with DynamicQuantizeMatMul.
use super::matmul::plan;
use super::matmul_integer::{full, int_product, int_product_wgsl, packable, zero_point_dims, IntOperands};
use super::qmatmul_packed::{self, PackedIntMatMul};
use crate::cpu::SharedPtr;
use crate::linalg::int8_kernel::CH;
use super::qlinear_matmul::per_output;
use crate::broadcast::for_each_offset;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::{check_scalar, scalar_f32, MS_DOMAIN, Q8, SCALE};
use crate::wgsl::{WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues};
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
    // q_mul: the product is rounded before the bias is added, as on the CPU (a fused
    // multiply-add would round once).
    (extra, format!("y[i] = q_mul(f32(s), {a_scale} * sb[sb_at(i)], i){bias};"))
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

    /// The instruction set of the packed integer kernel ([`PackedIntMatMul`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        qmatmul_packed::params(packable(inputs, INPUTS.zero_point))
    }

    /// Packs a constant 2-D B (with constant zero points) once for the fast kernel, whose
    /// tiles are scaled (and biased) as they are stored.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        let Some((da, b, zb)) = packable(inputs, INPUTS.zero_point) else { return Ok(None) };
        Ok(Some(Box::new(PackedToFloat { packed: PackedIntMatMul::new(da, b, false, &zb, tune)? })))
    }
}

/// MatMulIntegerToFloat with B packed once per plan: A's rows (every leading dim
/// flattened) through [`PackedIntMatMul`], each int32 tile stored as
/// `f32(acc) * (a_scale * b_scale[n]) + bias[n]`. A per-row A zero point, or a B scale
/// that is neither one value nor one per column, runs the general product.
struct PackedToFloat {
    packed: PackedIntMatMul,
}

impl CpuKernel for PackedToFloat {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let a = cpu::input(inputs, 0)?;
        let n = self.packed.n();
        let sb = cpu::input(inputs, INPUTS.scale)?;
        let za = match opt(4) {
            None => 0,
            Some(z) if z.len() == 1 => crate::quant::qlinear::zero_point(inputs, 4)?,
            Some(_) => return MatMulIntegerToFloat.run(inputs, outputs),
        };
        if sb.len() != 1 && sb.len() != n {
            return MatMulIntegerToFloat.run(inputs, outputs);
        }
        let a_scale = scalar_f32(inputs, 2)?;
        let sb = sb.as_slice::<f32>()?;
        let multipliers: Vec<f32> = (0..n).map(|j| a_scale * sb[if sb.len() == 1 { 0 } else { j }]).collect();
        let bias = match opt(INPUTS.bias) {
            Some(t) if t.len() == n => Some(t.as_slice::<f32>()?),
            Some(t) => return Err(OpError::input(INPUTS.bias, format!("bias must have {n} values, got {}", t.len()))),
            None => None,
        };
        let rows = a.len() / a.dims().last().copied().unwrap_or(1).max(1);
        let y = &mut outputs[0];
        if y.len() != rows * n {
            return Err(OpError::invalid(format!("output of {} elements for {rows} rows of {n}", y.len())));
        }
        let out = SharedPtr(y.as_mut_slice::<f32>()?.as_mut_ptr());
        self.packed.run(a.bytes(), rows, za, |r0, count, c0, cols, c| {
            let mult = &multipliers[c0..c0 + cols];
            for j in 0..count {
                // SAFETY: row r0 + j, columns c0..c0 + cols belong to this tile alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add((r0 + j) * n + c0), cols) };
                let acc = &c[j * CH..j * CH + cols];
                match bias {
                    Some(bias) => {
                        for (((d, &s), &m), &b) in dst.iter_mut().zip(acc).zip(mult).zip(&bias[c0..c0 + cols]) {
                            *d = s as f32 * m + b;
                        }
                    }
                    None => {
                        for ((d, &s), &m) in dst.iter_mut().zip(acc).zip(mult) {
                            *d = s as f32 * m;
                        }
                    }
                }
            }
        })
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

    /// The packed kernel (every instruction set) stores the same bits as the general
    /// product: per-column and per-tensor B scales, with and without a bias, batched A.
    #[test]
    fn packed_variants_equal_the_general_product() {
        let (k, n) = (37, 21);
        let a = u8s(&[2, 5, k], &(0..2 * 5 * k).map(|i| (i * 89 % 256) as u8).collect::<Vec<_>>());
        let b = i8s(&[k, n], &(0..k * n).map(|i| (i * 53 % 255) as i8).collect::<Vec<_>>());
        let zb = i8s(&[n], &(0..n).map(|i| (i % 5) as i8 - 2).collect::<Vec<_>>());
        let bias = Tensor::from_vec(&[n], (0..n).map(|i| i as f32 * 0.37 - 3.0).collect()).unwrap();
        for (per_column, with_bias) in [(true, true), (false, false), (true, false)] {
            let sb = if per_column { Tensor::from_vec(&[n], (0..n).map(|i| 0.001 + i as f32 * 0.0007).collect()).unwrap() } else { f(0.013) };
            let mut c = ms("MatMulIntegerToFloat").input(a.clone()).constant(b.clone()).input(f(0.021)).constant(sb).input(u8s(&[], &[129])).constant(zb.clone());
            if with_bias {
                c = c.constant(bias.clone());
            }
            let op = c.op().unwrap();
            let variants = crate::testing::run_cpu_variants(op.as_ref(), &c.inputs).unwrap();
            assert!(variants.iter().any(|(name, _)| name.starts_with("isa=")), "no packed variant");
            for (name, outs) in &variants[1..] {
                assert_eq!(bits(&outs[0]), bits(&variants[0].1[0]), "{per_column} {with_bias}: variant {name}");
            }
        }
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
