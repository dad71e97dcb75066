//! BitShift (direction LEFT or RIGHT), broadcasting, on every integer dtype. Results
//! wrap to the dtype's width (`u8 << 3` keeps 8 bits); right shifts of signed values
//! are arithmetic. A shift that is negative or at least the width leaves only the sign
//! fill: -1 for a right shift of a negative value, 0 otherwise (opset 28 semantics,
//! which agree with earlier opsets on the unsigned dtypes they allowed).
//!
//! On the GPU values live in 32-bit lanes (signed sign-extended, unsigned
//! zero-extended); results are re-extended from the dtype's width there too. 64-bit
//! dtypes are computed in 32 bits: correct while results fit 32 bits.
use super::zip::{self, int_width, is_unsigned, INTEGERS};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct BitShift {
    pub left: bool,
}

impl BitShift {
    fn parse(spec: &NodeSpec) -> Result<BitShift> {
        match spec.string_opt("direction")?.as_deref() {
            Some("LEFT") => Ok(BitShift { left: true }),
            Some("RIGHT") => Ok(BitShift { left: false }),
            Some(other) => Err(spec.bad("direction", format!("expected \"LEFT\" or \"RIGHT\", found \"{other}\""))),
            None => Err(spec.bad("direction", "is required (\"LEFT\" or \"RIGHT\")")),
        }
    }
}

/// `x` shifted by `s` in a `width`-bit integer (`x` and the result as i64 values:
/// sign-extended when signed, zero-extended when unsigned, except u64's bit pattern).
pub(crate) fn shift(x: i64, s: i64, width: u32, unsigned: bool, left: bool) -> i64 {
    let out_of_range = if unsigned && width == 64 { (s as u64) >= 64 } else { s < 0 || s >= width as i64 };
    if out_of_range {
        return if !left && !unsigned && x < 0 { -1 } else { 0 };
    }
    let s = s as u32;
    let raw = if left {
        ((x as u64) << s) as i64
    } else if unsigned {
        ((x as u64) >> s) as i64
    } else {
        x >> s
    };
    // Back into the dtype's range: truncate to `width` bits, then extend.
    if width == 64 {
        raw
    } else if unsigned {
        raw & ((1i64 << width) - 1)
    } else {
        (raw << (64 - width)) >> (64 - width)
    }
}

impl Op for BitShift {
    fn name(&self) -> &str {
        "BitShift"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        zip::infer_same_dtype_pair("BitShift", inputs, INTEGERS)
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for BitShift {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let d = a.dtype();
        let (width, unsigned, left) = (int_width(d), is_unsigned(d), self.left);
        zip::zip_ints(a, b, &mut outputs[0], move |x, s| shift(x, s, width, unsigned, left))
    }
}

impl WgslKernel for BitShift {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let wg = tune.get(&wgsl::workgroup_param());
        let (a, b) = (required(inputs, 0)?, required(inputs, 1)?);
        let d = a.dtype();
        // Widths above 32 (the 64-bit dtypes) are held in 32-bit lanes. Shift amounts
        // are clamped to 31 before shifting (WGSL takes them modulo 32), the
        // out-of-range cases are chosen by `select`.
        let (w, full) = (int_width(d).min(32), int_width(d));
        let expr = if is_unsigned(d) {
            let mask = if w == 32 { String::new() } else { format!(" & {}u", (1u64 << w) - 1) };
            if self.left {
                format!("select(0u, (a << min(b, 31u)){mask}, b < {w}u)")
            } else {
                format!("select(0u, a >> min(b, 31u), b < {w}u)")
            }
        } else if self.left {
            // Shift, then sign-extend from bit w-1 (a no-op for 32-bit lanes).
            let ext = 32 - w;
            format!("select(0, ((a << u32(clamp(b, 0, 31))) << {ext}u) >> {ext}u, b >= 0 && b < {w})")
        } else {
            // Arithmetic shift of the sign-extended lane; negative shifts and shifts of
            // the full width or more leave the sign fill.
            format!("select(a >> 31u, a >> u32(clamp(b, 0, 31)), b >= 0 && b < {full})")
        };
        if full == 64 && self.left {
            // 64-bit values live in 32-bit lanes: a left shift whose result leaves the
            // lane is reported (the run fails), never wrapped.
            let (ty, zero, shift) = if is_unsigned(d) { ("u32", "0u", "b") } else { ("i32", "0i", "u32(b)") };
            let valid = if is_unsigned(d) { "b < 64u" } else { "b >= 0 && b < 64" };
            let helper = format!(
                "fn kiln_shl(a: {ty}, b: {ty}) -> {ty} {{\n    if (!({valid}) || a == {zero}) {{ return {zero}; }}\n    \
                 if ({shift} >= 32u) {{ {report} return {zero}; }}\n    let r = a << {shift};\n    \
                 if ((r >> {shift}) != a) {{ {report} }}\n    return r;\n}}\n",
                report = wgsl::report_overflow("a", "b")
            );
            let mut dispatch = zip::binary_kernel("BitShift", a, b, &outputs[0], wg, &helper, "kiln_shl(a, b)");
            dispatch.bindings.push(Binding::Status);
            dispatch.source = wgsl::status_decl(3) + &dispatch.source;
            return Ok(WgslProgram::single(dispatch));
        }
        Ok(WgslProgram::single(zip::binary_kernel("BitShift", a, b, &outputs[0], wg, "", &expr)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "BitShift", |spec| Ok(Box::new(BitShift::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(left: bool, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = BitShift { left };
        let (ta, tb) = (TensorType::new(a.dtype(), a.dims()), TensorType::new(b.dtype(), b.dims()));
        let args = [Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })];
        let ty = op.infer(&args)?;
        let prog = op.generate(&args, &ty, &TuneValues::default())?;
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(ty[0].dtype, &ty[0].dims)];
        op.run(&[Some(a), Some(b)], &mut out)?;
        Ok(out.remove(0))
    }

    #[test]
    fn unsigned_shifts_wrap_to_the_width() {
        let a = Tensor::from_slice(&[4], &[16u8, 255, 1, 200]).unwrap();
        let s = Tensor::from_slice(&[4], &[1u8, 3, 7, 8]).unwrap();
        assert_eq!(run(true, &a, &s).unwrap().as_slice::<u8>().unwrap(), &[32, 248, 128, 0]);
        assert_eq!(run(false, &a, &s).unwrap().as_slice::<u8>().unwrap(), &[8, 31, 0, 0]);
        let a = Tensor::from_slice(&[3], &[u64::MAX, 1, 5]).unwrap();
        let s = Tensor::from_slice(&[1], &[63u64]).unwrap();
        assert_eq!(run(true, &a, &s).unwrap().as_slice::<u64>().unwrap(), &[1u64 << 63, 1u64 << 63, 1u64 << 63]);
        assert_eq!(run(false, &a, &s).unwrap().as_slice::<u64>().unwrap(), &[1, 0, 0]);
    }

    #[test]
    fn signed_shifts_follow_opset_28() {
        let a = Tensor::from_slice(&[3], &[-8i8, 4, -1]).unwrap();
        for (s, left, want) in [
            ([-1i8, -8, -16], true, [0i8, 0, 0]),
            ([8, 9, 127], true, [0, 0, 0]),
            ([-1, -8, -16], false, [-1, 0, -1]),
            ([1, 1, 1], false, [-4, 2, -1]),
            ([4, 5, 7], true, [-128, -128, -128]),
        ] {
            let st = Tensor::from_slice(&[3], &s).unwrap();
            assert_eq!(run(left, &a, &st).unwrap().as_slice::<i8>().unwrap(), &want, "{s:?} left={left}");
        }
        assert_eq!(shift(1 << 30, 1, 32, false, true), i32::MIN as i64);
        assert_eq!(shift(-8, 100, 32, false, false), -1);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let f = Tensor::from_slice(&[1], &[1f32]).unwrap();
        assert!(run(true, &f, &f).is_err());
        let a = Tensor::from_slice(&[1], &[1u8]).unwrap();
        let b = Tensor::from_slice(&[1], &[1u16]).unwrap();
        assert!(run(true, &a, &b).is_err());
    }
}
