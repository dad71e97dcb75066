//! BitCast (opset 26): reinterprets each element's bytes as dtype `to`, which must have
//! the input's element size (so the shape is kept). A bool output requires bytes of 0
//! or 1.
//!
//! GPU: buffers hold 4-byte values (see [`crate::wgsl`]), so the kernel rebuilds each
//! element's bit pattern from its value (f16 through `pack2x16float`, bf16 as the high
//! half of an f32, narrow integers masked) and reads it back as `to`. 8-byte types live
//! on the GPU as converted 32-bit values whose bits are gone, and a bool output must be
//! checked; those casts run on the CPU.
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct BitCast {
    to: DType,
}

impl Op for BitCast {
    fn name(&self) -> &str {
        "BitCast"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        if x.dtype().size() != self.to.size() {
            return Err(OpError::input(0, format!("a {} element ({} bytes) cannot be reinterpreted as {} ({} bytes)", x.dtype(), x.dtype().size(), self.to, self.to.size())));
        }
        Ok(vec![TensorType::new(self.to, x.dims().to_vec())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for BitCast {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        if self.to == DType::Bool {
            if let Some(b) = x.bytes().iter().find(|&&b| b > 1) {
                return Err(OpError::input(0, format!("byte {b} is not a bool (0 or 1)")));
            }
        }
        outputs[0] = Tensor::from_bytes(self.to, x.dims(), x.bytes())?;
        Ok(())
    }
}

/// WGSL of the bit pattern (u32, zero-extended) of value `v` of dtype `d`.
fn to_bits(d: DType, v: &str) -> Option<String> {
    Some(match d {
        DType::F32 | DType::I32 => format!("bitcast<u32>({v})"),
        DType::U32 | DType::U16 | DType::U8 | DType::Bool => v.to_string(),
        DType::F16 => format!("(pack2x16float(vec2<f32>({v}, 0.0)) & 0xffffu)"),
        DType::BF16 => format!("(bitcast<u32>({v}) >> 16u)"),
        DType::I16 => format!("(bitcast<u32>({v}) & 0xffffu)"),
        DType::I8 => format!("(bitcast<u32>({v}) & 0xffu)"),
        _ => return None,
    })
}

/// WGSL of the value of dtype `d` whose bit pattern is `b` (u32).
fn from_bits(d: DType, b: &str) -> Option<String> {
    Some(match d {
        DType::F32 => format!("bitcast<f32>({b})"),
        DType::I32 => format!("bitcast<i32>({b})"),
        DType::U32 | DType::U16 | DType::U8 => b.to_string(),
        DType::F16 => format!("unpack2x16float({b}).x"),
        DType::BF16 => format!("bitcast<f32>({b} << 16u)"),
        DType::I16 => format!("(bitcast<i32>({b} << 16u) >> 16u)"),
        DType::I8 => format!("(bitcast<i32>({b} << 24u) >> 24u)"),
        _ => return None,
    })
}

impl WgslKernel for BitCast {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let from = required(inputs, 0)?.dtype();
        let expr = to_bits(from, "x[i]").and_then(|b| from_bits(self.to, &b)).ok_or_else(|| {
            OpError::Unsupported(format!("BitCast from {from} to {}: the GPU holds 8-byte and bool values converted; it runs on the CPU", self.to))
        })?;
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "BitCast",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", wgsl::elem(from), true), ("y", wgsl::elem(self.to), false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &format!("y[i] = {expr};"),
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "BitCast", |spec| {
        let code = spec.int_opt("to")?.ok_or_else(|| spec.bad("to", "the attribute is required"))?;
        let to = i32::try_from(code).ok().and_then(DType::from_onnx_code).ok_or_else(|| spec.bad("to", format!("unsupported data type code {code}")))?;
        Ok(Box::new(BitCast { to }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn bitcast(x: Tensor, to: DType) -> crate::Result<Tensor> {
        Case::new("BitCast").opset(26).input(x).attr("to", Attr::Int(to.onnx_code() as i64)).run_cpu().map(first)
    }

    #[test]
    fn reinterprets_bytes() {
        let x = f32s(&[3], &[1.0, -2.5, 0.0]);
        let y = bitcast(x, DType::I32).unwrap();
        assert_eq!(y.as_slice::<i32>().unwrap(), &[1.0f32.to_bits() as i32, (-2.5f32).to_bits() as i32, 0]);
        let y = bitcast(Tensor::from_slice(&[2], &[-1i8, 5]).unwrap(), DType::U8).unwrap();
        assert_eq!(y.as_slice::<u8>().unwrap(), &[255, 5]);
        let y = bitcast(Tensor::from_slice(&[1], &[-2.0f64]).unwrap(), DType::I64).unwrap();
        assert_eq!(y.as_slice::<i64>().unwrap(), &[(-2.0f64).to_bits() as i64]);
        let y = bitcast(bools(&[2], &[true, false]), DType::U8).unwrap();
        assert_eq!(y.as_slice::<u8>().unwrap(), &[1, 0]);
        assert!(bitcast(Tensor::from_slice(&[1], &[2u8]).unwrap(), DType::Bool).is_err(), "2 is no bool");
        assert!(bitcast(f32s(&[1], &[1.0]), DType::I64).is_err(), "sizes differ");
    }
}
