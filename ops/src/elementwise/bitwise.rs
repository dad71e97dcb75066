//! Logical Not (bool) and the bitwise ops on integers: BitwiseNot, BitwiseAnd,
//! BitwiseOr, BitwiseXor (broadcasting). On the GPU narrow integers live in 32-bit
//! lanes: signed ones sign-extended (which and/or/xor/not preserve) and unsigned ones
//! zero-extended, so BitwiseNot masks its result to the dtype's width.
use super::zip::{self, INTEGERS};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Which bitwise/logical op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitwiseKind {
    /// Logical not of a bool tensor.
    Not,
    BitwiseNot,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
}

impl BitwiseKind {
    fn op_name(self) -> &'static str {
        match self {
            BitwiseKind::Not => "Not",
            BitwiseKind::BitwiseNot => "BitwiseNot",
            BitwiseKind::BitwiseAnd => "BitwiseAnd",
            BitwiseKind::BitwiseOr => "BitwiseOr",
            BitwiseKind::BitwiseXor => "BitwiseXor",
        }
    }

    fn is_unary(self) -> bool {
        matches!(self, BitwiseKind::Not | BitwiseKind::BitwiseNot)
    }

    /// The op on i64 bit patterns (the result is truncated to the dtype afterwards).
    fn apply(self, a: i64, b: i64) -> i64 {
        match self {
            BitwiseKind::Not => (a == 0) as i64,
            BitwiseKind::BitwiseNot => !a,
            BitwiseKind::BitwiseAnd => a & b,
            BitwiseKind::BitwiseOr => a | b,
            BitwiseKind::BitwiseXor => a ^ b,
        }
    }
}

#[derive(Debug)]
pub struct Bitwise {
    pub kind: BitwiseKind,
}

impl Op for Bitwise {
    fn name(&self) -> &str {
        self.kind.op_name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let want = if self.kind.is_unary() { 1 } else { 2 };
        if inputs.len() != want {
            return Err(OpError::invalid(format!("{} takes {want} input(s), got {}", self.name(), inputs.len())));
        }
        let allowed: &[DType] = if self.kind == BitwiseKind::Not { &[DType::Bool] } else { INTEGERS };
        let dtype = expect_dtype(inputs, 0, allowed)?;
        if self.kind.is_unary() {
            return Ok(vec![TensorType::new(dtype, required(inputs, 0)?.dims())]);
        }
        zip::infer_same_dtype_pair(self.name(), inputs, allowed)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Bitwise {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let a = cpu::input(inputs, 0)?;
        let out = &mut outputs[0];
        let kind = self.kind;
        if kind.is_unary() {
            if a.dtype() == DType::Bool {
                let (src, dst) = (a.as_slice::<u8>()?, out.as_mut_slice::<u8>()?);
                dst.iter_mut().zip(src).for_each(|(o, &x)| *o = (x == 0) as u8);
            } else {
                let v: Vec<i64> = a.to_i64_vec()?.into_iter().map(|x| kind.apply(x, 0)).collect();
                *out = crate::tensor::from_i64(a.dtype(), a.dims(), &v)?;
            }
            return Ok(());
        }
        let b = cpu::input(inputs, 1)?;
        zip::zip_ints(a, b, out, move |x, y| kind.apply(x, y))
    }
}

impl WgslKernel for Bitwise {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let wg = tune.get(&wgsl::workgroup_param());
        let a = required(inputs, 0)?;
        let out = &outputs[0];
        let d = a.dtype();
        let dispatch = match self.kind {
            BitwiseKind::Not => zip::unary_kernel(self.name(), a, out, wg, "", "u32(x == 0u)"),
            BitwiseKind::BitwiseNot => {
                let expr = match d {
                    DType::U8 => "(~x & 0xffu)",
                    DType::U16 => "(~x & 0xffffu)",
                    DType::U32 => "(~x)",
                    DType::U64 => {
                        return Err(OpError::Unsupported(
                            "BitwiseNot of uint64 on the GPU: the result does not fit its 32-bit lanes".into(),
                        ))
                    }
                    _ => "(~x)",
                };
                zip::unary_kernel(self.name(), a, out, wg, "", expr)
            }
            k => {
                let op = match k {
                    BitwiseKind::BitwiseAnd => "&",
                    BitwiseKind::BitwiseOr => "|",
                    _ => "^",
                };
                zip::binary_kernel(self.name(), a, required(inputs, 1)?, out, wg, "", &format!("(a {op} b)"))
            }
        };
        Ok(WgslProgram::single(dispatch))
    }
}

pub(crate) fn register(r: &mut Registry) {
    use BitwiseKind::*;
    for kind in [Not, BitwiseNot, BitwiseAnd, BitwiseOr, BitwiseXor] {
        r.register("", kind.op_name(), move |_| Ok(Box::new(Bitwise { kind })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: BitwiseKind, ins: &[&Tensor]) -> Result<Tensor> {
        let op = Bitwise { kind };
        let tys: Vec<TensorType> = ins.iter().map(|t| TensorType::new(t.dtype(), t.dims())).collect();
        let args: Vec<Option<Arg>> = tys.iter().map(|ty| Some(Arg { ty, value: None })).collect();
        let out_ty = op.infer(&args)?;
        let prog = op.generate(&args, &out_ty, &TuneValues::default())?;
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(out_ty[0].dtype, &out_ty[0].dims)];
        let ins: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
        op.run(&ins, &mut out)?;
        Ok(out.remove(0))
    }

    #[test]
    fn not_and_bitwise_not() {
        let b = Tensor::from_bools(&[3], &[true, false, true]).unwrap();
        assert_eq!(run(BitwiseKind::Not, &[&b]).unwrap().as_slice::<u8>().unwrap(), &[0, 1, 0]);
        let u = Tensor::from_slice(&[3], &[0u8, 37, 255]).unwrap();
        assert_eq!(run(BitwiseKind::BitwiseNot, &[&u]).unwrap().as_slice::<u8>().unwrap(), &[255, 218, 0]);
        let i = Tensor::from_slice(&[2], &[-1i16, 5]).unwrap();
        assert_eq!(run(BitwiseKind::BitwiseNot, &[&i]).unwrap().as_slice::<i16>().unwrap(), &[0, -6]);
        let w = Tensor::from_slice(&[2], &[0u64, 1u64 << 40]).unwrap();
        assert_eq!(Bitwise { kind: BitwiseKind::BitwiseNot }.run_cpu_u64(&w), vec![u64::MAX, !(1u64 << 40)]);
        // Wrong dtypes.
        assert!(run(BitwiseKind::Not, &[&u]).is_err());
        assert!(run(BitwiseKind::BitwiseNot, &[&b]).is_err());
        assert!(run(BitwiseKind::BitwiseNot, &[&Tensor::from_slice(&[1], &[1f32]).unwrap()]).is_err());
    }

    impl Bitwise {
        fn run_cpu_u64(&self, t: &Tensor) -> Vec<u64> {
            let mut out = vec![Tensor::zeros(DType::U64, t.dims())];
            self.run(&[Some(t)], &mut out).unwrap();
            out[0].as_slice::<u64>().unwrap().to_vec()
        }
    }

    #[test]
    fn and_or_xor_broadcast_against_reference() {
        let a: Vec<i32> = (0..24).map(|i| i * 37 - 400).collect();
        let b: Vec<i32> = vec![0x0f0f, -1, 0x1234, -77];
        let (ta, tb) = (Tensor::from_slice(&[2, 3, 4], &a).unwrap(), Tensor::from_slice(&[4], &b).unwrap());
        for (kind, f) in [
            (BitwiseKind::BitwiseAnd, (|x, y| x & y) as fn(i32, i32) -> i32),
            (BitwiseKind::BitwiseOr, |x, y| x | y),
            (BitwiseKind::BitwiseXor, |x, y| x ^ y),
        ] {
            let got = run(kind, &[&ta, &tb]).unwrap();
            let want: Vec<i32> = a.iter().enumerate().map(|(i, &x)| f(x, b[i % 4])).collect();
            assert_eq!(got.as_slice::<i32>().unwrap(), want.as_slice(), "{kind:?}");
        }
        let big = Tensor::from_slice(&[2], &[u64::MAX, 1u64 << 63]).unwrap();
        let one = Tensor::from_slice(&[1], &[(1u64 << 63) | 1]).unwrap();
        assert_eq!(run(BitwiseKind::BitwiseAnd, &[&big, &one]).unwrap().as_slice::<u64>().unwrap(), &[(1u64 << 63) | 1, 1u64 << 63]);
        let other = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
        assert!(run(BitwiseKind::BitwiseOr, &[&big, &other]).is_err(), "mixed dtypes");
        assert!(run(BitwiseKind::BitwiseOr, &[&ta, &Tensor::from_slice(&[3], &[1i32, 2, 3]).unwrap()]).is_err(), "shapes");
    }
}
