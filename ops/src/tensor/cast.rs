//! Cast and CastLike: elementwise dtype conversion between every pair of dtypes.
//! Float -> int truncates toward zero (then wraps like a C cast of the integer);
//! int -> int wraps; anything -> bool is `!= 0`; bool -> anything is 0/1. The opset 19
//! `saturate` attribute only concerns float8 types, which Kiln does not have.
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use kiln_graph::{DType, Tensor};

/// A bool element (one byte, 0 or 1), distinct from u8 for conversions.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(transparent)]
struct Bool8(u8);

/// Conversions of one element type through f64 (for float sources) or i128 (for
/// integer and bool sources, exact for every integer).
trait Scalar: Pod + Send + Sync {
    const FLOAT: bool;
    fn to_f64(self) -> f64;
    fn to_i128(self) -> i128;
    fn from_f64(v: f64) -> Self;
    fn from_i128(v: i128) -> Self;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const FLOAT: bool = false;
            fn to_f64(self) -> f64 { self as f64 }
            fn to_i128(self) -> i128 { self as i128 }
            // truncation toward zero (NaN -> 0, saturating at i128), then wrapping
            fn from_f64(v: f64) -> Self { (v as i128) as $t }
            fn from_i128(v: i128) -> Self { v as $t }
        }
    )*};
}
int_scalar!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_scalar {
    ($($t:ty: $to:expr, $from:expr, $from_i:expr);*) => {$(
        impl Scalar for $t {
            const FLOAT: bool = true;
            fn to_f64(self) -> f64 { $to(self) }
            fn to_i128(self) -> i128 { $to(self) as i128 }
            fn from_f64(v: f64) -> Self { $from(v) }
            fn from_i128(v: i128) -> Self { $from_i(v) }
        }
    )*};
}
float_scalar!(
    f32: |x: f32| x as f64, |v: f64| v as f32, |v: i128| v as f32;
    f64: |x: f64| x, |v: f64| v, |v: i128| v as f64;
    f16: |x: f16| x.to_f64(), f16::from_f64, |v: i128| f16::from_f64(v as f64);
    bf16: |x: bf16| x.to_f64(), bf16::from_f64, |v: i128| bf16::from_f64(v as f64)
);

impl Scalar for Bool8 {
    const FLOAT: bool = false;
    fn to_f64(self) -> f64 {
        (self.0 != 0) as u8 as f64
    }
    fn to_i128(self) -> i128 {
        (self.0 != 0) as i128
    }
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
    fn from_i128(v: i128) -> Self {
        Bool8((v != 0) as u8)
    }
}

fn convert<S: Scalar, D: Scalar>(src: &Tensor, dst: &mut Tensor) {
    let s: &[S] = bytemuck::cast_slice(src.bytes());
    let d: &mut [D] = bytemuck::cast_slice_mut(dst.bytes_mut());
    cpu::par_chunks_mut(d, 1, 1, |start, part| {
        for (o, &x) in part.iter_mut().zip(&s[start..]) {
            *o = if S::FLOAT { D::from_f64(x.to_f64()) } else { D::from_i128(x.to_i128()) };
        }
    });
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dt`.
macro_rules! with_type {
    ($dt:expr, $T:ident, $body:expr) => {
        match $dt {
            DType::F32 => { type $T = f32; $body }
            DType::F64 => { type $T = f64; $body }
            DType::F16 => { type $T = f16; $body }
            DType::BF16 => { type $T = bf16; $body }
            DType::I8 => { type $T = i8; $body }
            DType::I16 => { type $T = i16; $body }
            DType::I32 => { type $T = i32; $body }
            DType::I64 => { type $T = i64; $body }
            DType::U8 => { type $T = u8; $body }
            DType::U16 => { type $T = u16; $body }
            DType::U32 => { type $T = u32; $body }
            DType::U64 => { type $T = u64; $body }
            DType::Bool => { type $T = Bool8; $body }
        }
    };
}

/// Converts `src` into `dst` (same dims, `dst`'s dtype).
pub(crate) fn cast_into(src: &Tensor, dst: &mut Tensor) -> Result<()> {
    if src.len() != dst.len() {
        return Err(OpError::invalid(format!("Cast of {:?} into {:?}", src.dims(), dst.dims())));
    }
    if src.dtype() == dst.dtype() {
        *dst = src.reshaped(dst.dims())?;
        return Ok(());
    }
    with_type!(src.dtype(), S, with_type!(dst.dtype(), D, convert::<S, D>(src, dst)));
    Ok(())
}

/// The WGSL expression converting `x` (stored as `from`'s GPU type) to `to`.
fn wgsl_cast(x: &str, from: DType, to: DType) -> String {
    let src = wgsl::elem(from);
    // First the value in the GPU type of `to`, then the narrowing of that dtype.
    let wide = match (src, wgsl::elem(to)) {
        (_, _) if to == DType::Bool => {
            return format!("select(0u, 1u, {x} != {})", wgsl::literal(src, 0.0));
        }
        (a, b) if a == b => x.to_string(),
        ("f32", "u32") => format!("select(u32(i32({x})), u32({x}), {x} >= 2147483648.0)"),
        (_, t) => format!("{t}({x})"),
    };
    match to {
        DType::F16 => format!("unpack2x16float(pack2x16float(vec2<f32>({wide}, 0.0))).x"),
        DType::BF16 => format!(
            "bitcast<f32>((bitcast<u32>({wide}) + 0x7fffu + ((bitcast<u32>({wide}) >> 16u) & 1u)) & 0xffff0000u)"
        ),
        DType::I8 => format!("(({wide}) << 24u) >> 24u"),
        DType::I16 => format!("(({wide}) << 16u) >> 16u"),
        DType::U8 => format!("(({wide}) & 0xffu)"),
        DType::U16 => format!("(({wide}) & 0xffffu)"),
        _ => wide,
    }
}

/// Cast (target from the `to` attribute) or CastLike (target = input 1's dtype).
#[derive(Debug)]
pub struct Cast {
    to: Option<DType>,
}

impl Cast {
    fn target(&self, inputs: &[Option<Arg>]) -> Result<DType> {
        match self.to {
            Some(d) => Ok(d),
            None => Ok(required(inputs, 1)?.dtype()),
        }
    }
}

impl Op for Cast {
    fn name(&self) -> &str {
        if self.to.is_some() { "Cast" } else { "CastLike" }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(self.target(inputs)?, required(inputs, 0)?.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Cast {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        cast_into(cpu::input(inputs, 0)?, &mut outputs[0])
    }
}

impl WgslKernel for Cast {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let from = required(inputs, 0)?.dtype();
        let to = outputs[0].dtype;
        let body = format!("let x = src[i];\n    dst[i] = {};", wgsl_cast("x", from, to));
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name(),
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("src", wgsl::elem(from), true), ("dst", wgsl::elem(to), false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

fn parse_cast(spec: &NodeSpec) -> Result<Cast> {
    let code = spec.int_opt("to")?.ok_or_else(|| spec.bad("to", "required"))?;
    let to = DType::from_onnx_code(code as i32)
        .ok_or_else(|| OpError::Unsupported(format!("Cast to ONNX data type {code} (Kiln has no such dtype)")))?;
    Ok(Cast { to: Some(to) })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Cast", |spec| Ok(Box::new(parse_cast(spec)?)));
    r.register("", "CastLike", |_| Ok(Box::new(Cast { to: None })));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use super::*;
    use kiln_graph::Attr;

    fn cast(x: &Tensor, to: DType) -> Tensor {
        let op = make("Cast", 19, &[("to", Attr::Int(to.onnx_code() as i64))], 1, 1).unwrap();
        run(op.as_ref(), &as_inputs(&[Some(x)], &[]), &[]).unwrap().remove(0)
    }

    #[test]
    fn every_pair_round_trips_small_integers() {
        let vals = [0.0, 1.0, 2.0, 7.0, 100.0];
        for from in DType::ALL {
            for to in DType::ALL {
                let src = Tensor::from_f64(from, &[5], &vals).unwrap();
                let out = cast(&src, to);
                let want: Vec<f64> = if to == DType::Bool { vals.iter().map(|&v| (v != 0.0) as u8 as f64).collect() } else if from == DType::Bool { vals.iter().map(|&v| (v != 0.0) as u8 as f64).collect() } else { vals.to_vec() };
                assert_eq!(out.to_f64_vec(), want, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn float_to_int_truncates_and_ints_wrap() {
        let x = f32s(&[6], &[-2.7, -0.5, 0.5, 2.9, 300.0, -1.0]);
        assert_eq!(cast(&x, DType::I64).to_f64_vec(), vec![-2., 0., 0., 2., 300., -1.]);
        assert_eq!(cast(&x, DType::I8).to_f64_vec(), vec![-2., 0., 0., 2., 44., -1.]);
        assert_eq!(cast(&x, DType::U8).to_f64_vec(), vec![254., 0., 0., 2., 44., 255.]);
        assert_eq!(cast(&x, DType::Bool).bytes(), &[1, 1, 1, 1, 1, 1]);
        let big = i64s(&[2], &[i64::MAX, -1]);
        assert_eq!(cast(&big, DType::I32).as_slice::<i32>().unwrap(), &[-1, -1]);
        assert_eq!(cast(&big, DType::U64).as_slice::<u64>().unwrap(), &[i64::MAX as u64, u64::MAX]);
        let h = cast(&f32s(&[2], &[1.0 / 3.0, 65520.0]), DType::F16);
        assert_eq!(h.as_slice::<f16>().unwrap()[0], f16::from_f32(1.0 / 3.0));
        assert!(h.as_slice::<f16>().unwrap()[1].is_infinite());
        let nan = cast(&f32s(&[1], &[f32::NAN]), DType::F64);
        assert!(nan.as_slice::<f64>().unwrap()[0].is_nan());
    }

    #[test]
    fn castlike_and_errors() {
        let op = make("CastLike", 19, &[], 2, 1).unwrap();
        let x = i64s(&[3], &[1, 0, -4]);
        let like = Tensor::from_bools(&[1], &[true]).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&like)], &[]), &[]).unwrap()[0].bytes(), &[1, 0, 1]);
        let e = make("Cast", 19, &[("to", Attr::Int(17))], 1, 1).unwrap_err().to_string();
        assert!(e.contains("17"), "{e}");
    }
}
