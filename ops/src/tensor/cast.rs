//! Cast and CastLike: elementwise dtype conversion between every pair of dtypes.
//! Float -> int truncates toward zero (then wraps like a C cast of the integer);
//! int -> int wraps; anything -> bool is `!= 0`; bool -> anything is 0/1. Into float8 and
//! float4, values round to nearest even and, with `saturate` (the default), clamp to the
//! largest finite value (see `kiln_graph::narrow`); float8e8m0 rounds as `round_mode`
//! says. 4- and 2-bit integers take the low bits (wrap) like every integer type.
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use kiln_graph::narrow::{self, E8M0Round, MiniFloat};
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
            d => unreachable!("narrow dtype {d} reached a compute-type conversion"),
        }
    };
}

/// How a conversion into a narrow float rounds (Cast's `saturate` and `round_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rounding {
    pub saturate: bool,
    pub e8m0: E8M0Round,
}

impl Default for Rounding {
    fn default() -> Self {
        Rounding { saturate: true, e8m0: E8M0Round::Up }
    }
}

/// Converts `src` into `dst` (same dims, `dst`'s dtype).
pub(crate) fn cast_rounding(src: &Tensor, dst: &mut Tensor, rounding: Rounding) -> Result<()> {
    if src.len() != dst.len() {
        return Err(OpError::invalid(format!("Cast of {:?} into {:?}", src.dims(), dst.dims())));
    }
    if src.dtype().is_string() || dst.dtype().is_string() {
        return super::cast_string::cast(src, dst, |wide, dst| cast_rounding(wide, dst, rounding));
    }
    if src.dtype() == dst.dtype() {
        *dst = src.reshaped(dst.dims())?;
        return Ok(());
    }
    if src.dtype().is_narrow() {
        // Narrow sources widen exactly: floats to f64, integers to i64.
        let wide = if src.dtype().is_narrow_float() { DType::F64 } else { DType::I64 };
        let widened = Tensor::from_f64(wide, src.dims(), &src.to_f64_vec())?;
        return cast_rounding(&widened, dst, rounding);
    }
    if dst.dtype().is_narrow() {
        narrow_from(src, dst, rounding);
        return Ok(());
    }
    with_type!(src.dtype(), S, with_type!(dst.dtype(), D, convert::<S, D>(src, dst)));
    Ok(())
}

/// Converts a compute-dtype tensor into a narrow one.
fn narrow_from(src: &Tensor, dst: &mut Tensor, rounding: Rounding) {
    let to = dst.dtype();
    let encode: Box<dyn Fn(f64, i128) -> u8 + Sync> = if let Some(f) = MiniFloat::of(to) {
        Box::new(move |v: f64, _| f.encode(v, rounding.saturate))
    } else if to == DType::F8E8M0 {
        Box::new(move |v: f64, _| narrow::e8m0_encode(v as f32, rounding.saturate, rounding.e8m0))
    } else {
        let (bits, signed) = narrow::narrow_int(to).expect("a narrow dtype is a float or an integer");
        Box::new(move |_, i: i128| narrow::wrap_int(i, bits, signed))
    };
    with_type!(src.dtype(), S, {
        let s: &[S] = bytemuck::cast_slice(src.bytes());
        // Float -> integer truncates toward zero; NaN and infinities give 0 (as ONNX's
        // reference does for the 4- and 2-bit types).
        let int_of = |x: S| if S::FLOAT { let v = x.to_f64(); if v.is_finite() { v.trunc() as i128 } else { 0 } } else { x.to_i128() };
        cpu::par_chunks_mut(dst.bytes_mut(), 1, 1, |start, part| {
            for (o, &x) in part.iter_mut().zip(&s[start..]) {
                *o = encode(x.to_f64(), int_of(x));
            }
        });
    });
}

/// WGSL helpers for conversions into narrow floats, on their f32 values (see
/// `kiln_graph::narrow`): the nearest value of the format, ties to even, or `over`
/// past its largest finite value; and float8e8m0's rounding of an f32's exponent.
pub(crate) const NARROW_WGSL: &str = "
fn kiln_minifloat(x: f32, mbits: i32, emin: i32, maxv: f32, over: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let sign = bits & 0x80000000u;
    if ((bits & 0x7fffffffu) > 0x7f800000u) { return x; }
    let a = bitcast<f32>(bits & 0x7fffffffu);
    if (a > maxv * 2.0) { return bitcast<f32>(bitcast<u32>(over) ^ sign); }
    let e = max(i32((bits >> 23u) & 0xffu) - 127, emin);
    // Scaling by powers of two is exact; round() rounds ties to even.
    let r = round(a * bitcast<f32>(u32(127 + mbits - e) << 23u)) * bitcast<f32>(u32(127 - mbits + e) << 23u);
    if (r > maxv) { return bitcast<f32>(bitcast<u32>(over) ^ sign); }
    return bitcast<f32>(bitcast<u32>(r) | sign);
}
fn kiln_e8m0(x: f32, mode: u32, saturate: bool) -> f32 {
    let bits = bitcast<u32>(x);
    let e = (bits >> 23u) & 0xffu;
    let frac = bits & 0x7fffffu;
    if (e == 0xffu) { return bitcast<f32>(0x7fc00000u); }
    var up = false;
    if (mode == 1u) { up = frac != 0u; }
    if (mode == 2u) { up = (frac & 0x400000u) != 0u && ((frac & 0x3fffffu) != 0u || e > 0u); }
    if (saturate && e == 0xfeu) { up = false; }
    let r = e + select(0u, 1u, up);
    if (r == 0xffu) { return bitcast<f32>(0x7fc00000u); }
    if (r == 0u) { return bitcast<f32>(0x00400000u); }
    return bitcast<f32>(r << 23u);
}
";

/// The WGSL expression rounding the f32 expression `x` into the narrow float `to`.
pub(crate) fn wgsl_narrow_float(x: &str, to: DType, rounding: Rounding) -> String {
    if to == DType::F8E8M0 {
        let mode = match rounding.e8m0 {
            E8M0Round::Down => 0,
            E8M0Round::Up => 1,
            E8M0Round::Nearest => 2,
        };
        return format!("kiln_e8m0({x}, {mode}u, {})", rounding.saturate);
    }
    let f = MiniFloat::of(to).expect("a narrow float");
    let max = f.max();
    // Past the largest value: itself when saturating (and for float4, which has no
    // infinity or NaN), else infinity (E5M2) or NaN (the finite formats).
    let over = if rounding.saturate || to == DType::F4E2M1 {
        max
    } else if to == DType::F8E5M2 {
        f64::INFINITY
    } else {
        f64::NAN
    };
    format!("kiln_minifloat({x}, {}, {}, {}, {})", f.mbits(), f.emin(), wgsl::literal("f32", max), wgsl::literal("f32", over))
}

/// The WGSL expression converting `x` (stored as `from`'s GPU type) to `to`.
fn wgsl_cast(x: &str, from: DType, to: DType, rounding: Rounding) -> String {
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
        DType::I4 => format!("(({wide}) << 28u) >> 28u"),
        DType::I2 => format!("(({wide}) << 30u) >> 30u"),
        DType::U4 => format!("(({wide}) & 0xfu)"),
        DType::U2 => format!("(({wide}) & 0x3u)"),
        d if d.is_narrow_float() => wgsl_narrow_float(&wide, d, rounding),
        _ => wide,
    }
}

/// Cast (target from the `to` attribute) or CastLike (target = input 1's dtype).
#[derive(Debug)]
pub struct Cast {
    to: Option<DType>,
    rounding: Rounding,
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

    fn handles_narrow(&self) -> bool {
        true
    }

    fn handles_strings(&self) -> bool {
        true
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    /// Every element is converted, so a recycled buffer may hold the result.
    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for Cast {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        cast_rounding(cpu::input(inputs, 0)?, &mut outputs[0], self.rounding)
    }
}

impl WgslKernel for Cast {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// An f16 source stored as halves is read into f32; an f16 result stored as halves
    /// is rounded once, from the source's f32 value, by `kiln_half`.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let from = required(inputs, 0)?.dtype();
        let to = outputs[0].dtype;
        if from.is_string() || to.is_string() {
            return Err(OpError::Unsupported("string tensors stay on the host".into()));
        }
        let (half_in, half_out) = (halves.input(0) && from == DType::F16, halves.output(0) && to == DType::F16);
        if halves.any() && !(half_in || half_out) {
            return Err(OpError::Unsupported(format!("halves for a Cast from {from} to {to}")));
        }
        let src = if half_in { "f32(src[i])" } else { "src[i]" };
        let body = if half_out {
            format!("let x = {src};\n    dst[i] = kiln_half({});", wgsl_cast("x", from, DType::F32, self.rounding))
        } else {
            format!("let x = {src};\n    dst[i] = {};", wgsl_cast("x", from, to, self.rounding))
        };
        let (src_ty, dst_ty) = (wgsl::stored(wgsl::elem(from), half_in), wgsl::stored(wgsl::elem(to), half_out));
        let mut d = wgsl::simple_kernel(
            self.name(),
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("src", &src_ty, true), ("dst", &dst_ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            if to.is_narrow_float() { NARROW_WGSL } else { "" },
            &body,
        );
        d.source = wgsl::with_halves(d.source, half_in || half_out);
        Ok(WgslProgram::single(d))
    }
}

/// `saturate` (opset 19) and `round_mode` (opset 24), shared by Cast and CastLike.
fn parse_rounding(spec: &NodeSpec) -> Result<Rounding> {
    let saturate = spec.int_opt("saturate")?.unwrap_or(1) != 0;
    let mode = spec.string("round_mode", "up")?;
    let e8m0 = E8M0Round::parse(&mode).ok_or_else(|| spec.bad("round_mode", "expected \"up\", \"down\" or \"nearest\""))?;
    Ok(Rounding { saturate, e8m0 })
}

fn parse_cast(spec: &NodeSpec) -> Result<Cast> {
    let code = spec.int_opt("to")?.ok_or_else(|| spec.bad("to", "required"))?;
    let to = DType::from_onnx_code(code as i32)
        .ok_or_else(|| OpError::Unsupported(format!("Cast to ONNX data type {code} (Kiln has no such dtype)")))?;
    Ok(Cast { to: Some(to), rounding: parse_rounding(spec)? })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Cast", |spec| Ok(Box::new(parse_cast(spec)?)));
    r.register("", "CastLike", |spec| Ok(Box::new(Cast { to: None, rounding: parse_rounding(spec)? })));
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
        for from in DType::COMPUTE {
            for to in DType::COMPUTE {
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

    fn cast_with(x: &Tensor, to: DType, attrs: &[(&str, Attr)]) -> Tensor {
        let mut all = vec![("to", Attr::Int(to.onnx_code() as i64))];
        all.extend(attrs.iter().cloned());
        let op = make("Cast", 25, &all, 1, 1).unwrap();
        run(op.as_ref(), &as_inputs(&[Some(x)], &[]), &[]).unwrap().remove(0)
    }

    #[test]
    fn narrow_floats_round_to_even_and_saturate() {
        let x = f32s(&[6], &[0.478_925_47, 1e6, -1e6, f32::INFINITY, -1e-7, 0.75]);
        let y = cast(&x, DType::F8E4M3FN);
        assert_eq!(y.dtype(), DType::F8E4M3FN);
        assert_eq!(y.bytes(), &[0x2f, 0x7e, 0xfe, 0x7e, 0x80, 0x34]);
        assert_eq!(y.to_f64_vec(), vec![0.46875, 448., -448., 448., -0., 0.75]);
        // Without saturation the finite format gives NaN and E5M2 infinity.
        let y = cast_with(&x, DType::F8E4M3FN, &[("saturate", Attr::Int(0))]);
        assert_eq!(&y.bytes()[1..4], &[0x7f, 0xff, 0x7f]);
        let y = cast_with(&x, DType::F8E5M2, &[("saturate", Attr::Int(0))]);
        assert_eq!(&y.bytes()[1..4], &[0x7c, 0xfc, 0x7c]);
        // FNUZ has no negative zero.
        assert_eq!(cast(&x, DType::F8E4M3FNUZ).bytes()[4], 0);
        // Back to f32 and f16, exactly.
        let back = cast(&cast(&x, DType::F8E5M2), DType::F16);
        assert_eq!(back.to_f64_vec()[5], 0.75);
        let f4 = cast(&f32s(&[4], &[0.25, 1.05, -3.5, 9.0]), DType::F4E2M1);
        assert_eq!(f4.to_f64_vec(), vec![0.0, 1.0, -4.0, 6.0]);
    }

    #[test]
    fn e8m0_round_modes_and_narrow_ints() {
        let x = f32s(&[3], &[1.1, 0.124, 3.0]);
        assert_eq!(cast(&x, DType::F8E8M0).to_f64_vec(), vec![2.0, 0.125, 4.0]);
        let down = cast_with(&x, DType::F8E8M0, &[("round_mode", Attr::String("down".into()))]);
        assert_eq!(down.to_f64_vec(), vec![1.0, 0.0625, 2.0]);
        let bad = make("Cast", 25, &[("to", Attr::Int(24)), ("round_mode", Attr::String("sideways".into()))], 1, 1).unwrap_err().to_string();
        assert!(bad.contains("round_mode"), "{bad}");
        // Float -> 4-bit integers truncates then wraps; NaN gives 0.
        let x = f32s(&[5], &[-9.0, 8.0, 7.9, -2.5, f32::NAN]);
        assert_eq!(cast(&x, DType::I4).to_f64_vec(), vec![7., -8., 7., -2., 0.]);
        assert_eq!(cast(&x, DType::U4).to_f64_vec(), vec![7., 8., 7., 14., 0.]);
        assert_eq!(cast(&cast(&x, DType::I4), DType::I8).to_f64_vec(), vec![7., -8., 7., -2., 0.]);
        assert_eq!(cast(&i64s(&[3], &[-3, 2, 3]), DType::I2).to_f64_vec(), vec![1., -2., -1.]);
    }

    #[test]
    fn castlike_and_errors() {
        let op = make("CastLike", 19, &[], 2, 1).unwrap();
        let x = i64s(&[3], &[1, 0, -4]);
        let like = Tensor::from_bools(&[1], &[true]).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&like)], &[]), &[]).unwrap()[0].bytes(), &[1, 0, 1]);
        let e = make("Cast", 19, &[("to", Attr::Int(14))], 1, 1).unwrap_err().to_string();
        assert!(e.contains("14"), "{e}");
    }
}
