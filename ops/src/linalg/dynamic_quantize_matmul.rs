//! DynamicQuantizeMatMul (com.microsoft): inputs `A (f32), B, b_scale, b_zero_point,
//! bias`. A is quantized to uint8 at run time as onnxruntime does it
//! (GetQuantizationParameter): its range widened to include 0, `scale = (max - min) /
//! 255` (1 when the range is empty), `zero_point = round_half_even(clamp(0 - min /
//! scale, 0, 255))`, each element `clamp(round(a / scale) + zero_point)`; then the
//! product and its scaling are MatMulIntegerToFloat's with `a_scale = scale`
//! ([`scale_and_bias`]). On the GPU one workgroup finds the range and the parameters,
//! then the product quantizes A's elements as it packs them.
use super::matmul::plan;
use super::matmul_integer::{full, int_product, strided_operand, zero_point_dims, IntOperands};
use super::matmul_integer_to_float::{infer_float_product, scale_and_bias, BInputs};
use super::product::BatchedProduct;
use super::qproduct_wgsl::{Buffer, IntOperand, IntProduct};
use crate::broadcast::broadcast_strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::dynamic_quantize_linear::{wgsl_range, RANGE_DECL, RANGE_LANES};
use crate::quant::qlinear::{self, MS_DOMAIN};
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{Arg, Cost, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct DynamicQuantizeMatMul;

const INPUTS: BInputs = BInputs { b: 1, scale: 2, zero_point: 3, bias: 4 };

/// onnxruntime's uint8 quantization parameters of data with range `lo..=hi`.
pub(super) fn dynamic_params(data: &[f32]) -> (f32, i32) {
    let (lo, hi) = crate::quant::dynamic_quantize_linear::range(data);
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    let zp = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even();
    (scale, zp as i32)
}

impl Op for DynamicQuantizeMatMul {
    fn name(&self) -> &str {
        "DynamicQuantizeMatMul"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
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

impl CpuKernel for DynamicQuantizeMatMul {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let a = cpu::input(inputs, 0)?;
        let av = a.as_slice::<f32>()?;
        let (scale, zp) = dynamic_params(av);
        let q: Vec<u8> = av.iter().map(|&x| qlinear::requantize(x / scale, zp, (0, 255)) as u8).collect();
        let (qa, za) = (Tensor::from_vec(a.dims(), q)?, Tensor::scalar(zp as u8));
        let ops = IntOperands { a: &qa, b: cpu::input(inputs, 1)?, za: Some(&za), zb: inputs.get(3).copied().flatten(), za_input: 0, zb_input: 3 };
        let mut acc = vec![0i32; outputs[0].len()];
        int_product(&ops, &mut acc)?;
        scale_and_bias(&acc, scale, inputs, INPUTS, a.dims(), outputs[0].as_mut_slice::<f32>()?)
    }
}

impl WgslKernel for DynamicQuantizeMatMul {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
        let len = a.ty.len();
        if len.div_ceil(RANGE_LANES) > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("DynamicQuantizeMatMul of an A of {len} elements on the GPU (at most {})", RANGE_LANES * wgsl::MAX_LOOP_ITERATIONS)));
        }
        // 1. A's range and quantization parameters into scratch: [scale, zero point].
        let range = format!(
            "{}{}{RANGE_DECL}@compute @workgroup_size({RANGE_LANES})\nfn main(@builtin(local_invocation_id) lid: vec3<u32>) {{\n{}\
             \x20   if (l == 0u) {{\n\
             \x20       let scale = select(q_div(hi[0] - lo[0], 255.0), 1.0, hi[0] == lo[0]);\n\
             \x20       params[0] = scale;\n        params[1] = round(clamp(0.0 - q_div(lo[0], scale), 0.0, 255.0));\n    }}\n}}\n",
            wgsl::declare(&[("x", "f32", true), ("params", "f32", false)]),
            qlinear::WGSL_REQUANTIZE,
            wgsl_range("x[e]", &format!("{len}u"))
        );
        let first = Dispatch { label: "DynamicQuantizeMatMul range".into(), source: range, entry_point: "main".into(), workgroups: [1, 1, 1], bindings: vec![Binding::Input(0), Binding::Scratch(0)] };
        // 2. The product, quantizing A's elements as it reads them.
        let (ad, bd) = (a.dims(), b.dims());
        let (_, fb) = full(ad, bd);
        let (p, _): (BatchedProduct, _) = plan(ad, bd)?;
        let mut dims = p.batch.clone();
        dims.extend([p.m, p.n]);
        let mut buffers: Vec<Buffer> = vec![("params".into(), "f32", Binding::Scratch(0))];
        let mut helpers = qlinear::WGSL_REQUANTIZE.to_string();
        // B's per-column tensors, each with its offset function over the output.
        let mut per_column = |name: &str, i: usize| -> Result<()> {
            let t = required(inputs, i)?;
            let zd = zero_point_dims(i, false, t.dims(), &fb)?;
            let mut padded = vec![1; dims.len().saturating_sub(zd.len())];
            padded.extend(&zd);
            helpers += &wgsl::offset_fn(&format!("{name}_at"), &dims, &broadcast_strides(&padded, &dims));
            buffers.push((name.to_string(), wgsl::elem(t.dtype()), Binding::Input(i)));
            Ok(())
        };
        per_column("sb", INPUTS.scale)?;
        let zb = if inputs.get(INPUTS.zero_point).copied().flatten().is_some() {
            per_column("zb", INPUTS.zero_point)?;
            "i32(zb[zb_at(i)])"
        } else {
            "0i"
        };
        let bias = if inputs.get(INPUTS.bias).copied().flatten().is_some() {
            per_column("bias", INPUTS.bias)?;
            " + bias[bias_at(i)]"
        } else {
            ""
        };
        buffers.push(("y".into(), "f32", Binding::Output(0)));
        // A, quantized to uint8 as it is packed.
        let (batches, batch_of) = IntOperand::batching(p.batch_count(), &p.a_batch_strides);
        let a = IntOperand {
            rows: p.m,
            batches,
            batch_of,
            buffers: vec![("xa".into(), "f32", Binding::Input(0)), ("params".into(), "f32", Binding::Scratch(0))],
            helpers: format!(
                "{}{}fn raw(pb: u32, r: u32, k: u32) -> i32 {{ return clamp(q_round(q_div(xa[xa_batch(pb) + r * {}u + k * {}u], params[0])) + i32(params[1]), 0i, 255i); }}\n",
                qlinear::WGSL_REQUANTIZE,
                wgsl::offset_fn("xa_batch", &p.batch, &p.a_batch_strides),
                p.a.rs,
                p.a.cs
            ),
            signed: false,
            zero: "i32(params[1])".into(),
        };
        let product = IntProduct {
            label: "DynamicQuantizeMatMul",
            batch: p.batch_count(),
            m: p.m,
            n: p.n,
            k: p.k,
            a,
            b: strided_operand("xb", 1, b.dtype(), &p, false, zb.into()),
            buffers,
            helpers,
            prelude: String::new(),
            epilogue: format!("y[i] = q_mul(f32(s), params[0] * sb[sb_at(i)], i){bias};"),
            scratch: 1,
        };
        let (mut dispatches, mut scratch_bytes) = product.program(tune.get(&wgsl::workgroup_param()))?;
        dispatches.insert(0, first);
        scratch_bytes.insert(0, 8);
        Ok(WgslProgram { dispatches, scratch_bytes })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "DynamicQuantizeMatMul", |_| Ok(Box::new(DynamicQuantizeMatMul)));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::Tensor;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    fn floats(dims: &[usize], bits: &[u32]) -> Tensor {
        Tensor::from_vec(dims, bits.iter().map(|&b| f32::from_bits(b)).collect()).unwrap()
    }

    /// onnxruntime 1.32's outputs for the same inputs, bit for bit.
    #[test]
    fn matches_onnxruntime() {
        let a = floats(&[3, 6], &[0x40200000, 0xbecb08b4, 0x3e4154aa, 0xbcaddcd3, 0x3f1bf59d, 0xbebad552, 0xbe1c04c1, 0x3e7832d6, 0x3dd2fdcc, 0xbf5d6edb, 0x3f65520a, 0xbfa634a2, 0xbf99be28, 0xbfa428b1, 0x3f778b7f, 0xbeb8a1a9, 0xbf7895d7, 0xbf916926]);
        let b = i8s(&[6, 4], &[113, -26, -20, 13, 37, -6, 26, 117, 59, -47, -20, -26, -90, -128, 74, -21, -38, 33, 16, 111, 29, 108, 20, -45]);
        let sb = Tensor::from_vec(&[4], vec![0.01f32, 0.02, 0.005, 0.03]).unwrap();
        let bias = Tensor::from_vec(&[4], vec![1f32, 2., 3., 4.]).unwrap();
        let c = ms("DynamicQuantizeMatMul").input(a.clone()).constant(b.clone()).constant(sb).omitted().constant(bias.clone());
        assert_eq!(bits(&c.run_cpu().unwrap()[0]), [0x405e2408, 0x3e6f8b48, 0x402be26a, 0x40be0c65, 0x3f85914a, 0x3ffa0354, 0x402a1797, 0x411f799c, 0x3dc300f8, 0xbe98a7d8, 0x402232ce, 0xc04c59d2]);
        // Non-negative A (zero point 0), uint8 B with a zero point.
        let abs = Tensor::from_vec(&[3, 6], a.as_slice::<f32>().unwrap().iter().map(|v| v.abs()).collect()).unwrap();
        let c = ms("DynamicQuantizeMatMul").input(abs).input(u8s(&[6, 2], &[82, 253, 150, 48, 212, 210, 2, 40, 177, 103, 87, 18])).input(f(0.02)).input(u8s(&[], &[127]));
        assert_eq!(bits(&c.run_cpu().unwrap()[0]), [0xbfbdfdfe, 0x409bef22, 0xc0094949, 0xc092086f, 0x3e9e6b38, 0xbf749b01]);
        // All zeros: scale 1, zero point 0; only the bias is left.
        let c = ms("DynamicQuantizeMatMul").input(Tensor::from_vec(&[2, 6], vec![0f32; 12]).unwrap()).constant(b).constant(f(0.02)).omitted().constant(bias);
        assert_eq!(bits(&c.run_cpu().unwrap()[0]), [0x3f800000, 0x40000000, 0x40400000, 0x40800000, 0x3f800000, 0x40000000, 0x40400000, 0x40800000]);
    }

    #[test]
    fn parameters_are_onnxruntime_s() {
        assert_eq!(super::dynamic_params(&[0.0, 0.0]), (1.0, 0));
        let (s, z) = super::dynamic_params(&[-1.0, 2.0]);
        assert_eq!((s, z), (3.0 / 255.0, 85));
    }
}
