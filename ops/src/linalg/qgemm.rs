//! QGemm (com.microsoft; attributes `alpha`, `transA`, `transB`): inputs `A, a_scale,
//! a_zero_point, B, b_scale, b_zero_point, C, y_scale, y_zero_point`. The int32 product
//! `(A - a_zp) x (B - b_zp)` is exact ([`int_product`]); C (int32, broadcast to [M, N])
//! is added to it (wrapping); the result is scaled by `alpha * a_scale * b_scale[n]`
//! (f32, in that order; b's scale and zero point per tensor or per column) and, when
//! `y_scale` is given, divided by it and requantized around `y_zero_point` (MLAS's
//! rounding half to even, saturated); else the output is that f32 value.
use super::matmul_integer::{int_product, strided_operand, IntOperands};
use super::product::{BatchedProduct, Layout};
use super::qmatmul_packed::{self, PackedIntMatMul};
use crate::linalg::int8_kernel::CH;
use super::qproduct_wgsl::{Buffer, IntProduct};
use crate::cpu::{self, CpuKernel, SharedPtr};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::{self, check_scalar, MS_DOMAIN, Q8, SCALE};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Clone, Debug)]
pub struct QGemm {
    alpha: f32,
    trans_a: bool,
    trans_b: bool,
}

/// The problem's sizes and how C broadcasts.
struct Shape {
    m: usize,
    k: usize,
    n: usize,
    /// C's element for output (m, n): `m * c_rs + n * c_cs`.
    c: Option<(usize, usize)>,
}

impl QGemm {
    fn parse(spec: &NodeSpec) -> Result<QGemm> {
        Ok(QGemm { alpha: spec.float("alpha", 1.0)?, trans_a: spec.int("transA", 0)? != 0, trans_b: spec.int("transB", 0)? != 0 })
    }

    fn shape(&self, inputs: &[Option<Arg>]) -> Result<Shape> {
        let (a, b) = (required(inputs, 0)?.dims(), required(inputs, 3)?.dims());
        if a.len() != 2 || b.len() != 2 {
            return Err(OpError::input(if a.len() != 2 { 0 } else { 3 }, format!("A and B must be matrices (rank 2), got A {a:?} and B {b:?}")));
        }
        let (m, k) = if self.trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
        let (kb, n) = if self.trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
        if k != kb {
            return Err(OpError::invalid(format!("inner dimensions differ: A {a:?} (transA {}) has K = {k}, B {b:?} (transB {}) has K = {kb}", self.trans_a as i32, self.trans_b as i32)));
        }
        let c = match inputs.get(6).copied().flatten() {
            None => None,
            Some(c) => Some(c_strides(c.dims(), m, n).ok_or_else(|| OpError::input(6, format!("C of shape {:?} does not broadcast to [M, N] = [{m}, {n}]", c.dims())))?),
        };
        Ok(Shape { m, k, n, c })
    }

    /// The output dtype: y_zero_point's when the output is quantized, else f32.
    fn out_dtype(inputs: &[Option<Arg>]) -> Result<DType> {
        let present = |i: usize| inputs.get(i).copied().flatten().is_some();
        match (present(7), present(8)) {
            (false, false) => Ok(DType::F32),
            (true, true) => {
                check_scalar(inputs, 7, &SCALE, false)?;
                let d = expect_dtype(inputs, 8, &Q8)?;
                check_scalar(inputs, 8, &[d], false)?;
                Ok(d)
            }
            (y, _) => Err(OpError::input(if y { 8 } else { 7 }, "y_scale and y_zero_point come together (a quantized output) or not at all (an f32 output)")),
        }
    }

    /// A's or B's matrix as stored, or its transpose (8-bit data: bytes).
    fn oriented(t: &Tensor, transposed: bool) -> Result<Tensor> {
        if !transposed {
            return Ok(t.clone());
        }
        let (r, c) = (t.dims()[0], t.dims()[1]);
        let src = t.bytes();
        let mut dst = vec![0u8; r * c];
        for i in 0..r {
            for j in 0..c {
                dst[j * r + i] = src[i * c + j];
            }
        }
        Ok(Tensor::from_bytes(t.dtype(), &[c, r], &dst)?)
    }
}

impl Op for QGemm {
    fn name(&self) -> &str {
        "QGemm"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let da = expect_dtype(inputs, 0, &Q8)?;
        let db = expect_dtype(inputs, 3, &Q8)?;
        let s = self.shape(inputs)?;
        check_scalar(inputs, 1, &SCALE, false)?;
        check_scalar(inputs, 2, &[da], true)?;
        expect_dtype(inputs, 4, &SCALE)?;
        for (i, d) in [(4, None), (5, Some(db))] {
            let Some(t) = inputs.get(i).copied().flatten() else { continue };
            if let Some(d) = d {
                expect_dtype(inputs, i, &[d])?;
            }
            if t.ty.len() != 1 && t.dims() != [s.n] {
                return Err(OpError::input(i, format!("b's scale and zero point are per tensor or per column ([{}]), got shape {:?}", s.n, t.dims())));
            }
        }
        if inputs.get(6).copied().flatten().is_some() {
            expect_dtype(inputs, 6, &[DType::I32])?;
        }
        Ok(vec![TensorType::new(Self::out_dtype(inputs)?, vec![s.m, s.n])])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let k = self.shape(inputs).map(|s| s.k).unwrap_or(1);
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

/// How C (int32) broadcasts to [M, N]: element (m, n) is `m * rs + n * cs`; `None`
/// when it does not (C is (), (1,), (1, 1), (N,), (1, N), (M, 1) or (M, N)).
fn c_strides(d: &[usize], m: usize, n: usize) -> Option<(usize, usize)> {
    match d {
        _ if d.iter().product::<usize>() == 1 => Some((0, 0)),
        [c] if *c == n => Some((0, 1)),
        [1, c] if *c == n => Some((0, 1)),
        [r, 1] if *r == m => Some((1, 0)),
        [r, c] if *r == m && *c == n => Some((n, 1)),
        _ => None,
    }
}

/// The per-column output scales: `alpha * a_scale * b_scale[n]`, divided by `y_scale`
/// when the output is quantized (as onnxruntime's QGemm computes them).
fn output_scales(alpha: f32, sa: f32, sb: &[f32], sy: Option<f32>) -> Vec<f32> {
    sb.iter().map(|&b| alpha * sa * b).map(|s| sy.map_or(s, |y| s / y)).collect()
}

/// What follows the int32 product: C added (wrapping), the per-column scale, and the
/// requantization (`zy`, output range) when the output is 8-bit.
struct Finish<'a> {
    c: Option<(&'a [i32], usize, usize)>,
    scales: Vec<f32>,
    quant: Option<(i32, (i32, i32))>,
}

impl<'a> Finish<'a> {
    fn new(op: &QGemm, inputs: &[Option<&'a Tensor>], out: DType, m: usize, n: usize) -> Result<Finish<'a>> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let c = match opt(6) {
            None => None,
            Some(c) => {
                let (rs, cs) = c_strides(c.dims(), m, n).ok_or_else(|| OpError::input(6, format!("C of shape {:?} does not broadcast to [{m}, {n}]", c.dims())))?;
                Some((c.as_slice::<i32>()?, rs, cs))
            }
        };
        let sb: Vec<f32> = cpu::input(inputs, 4)?.to_f64_vec().into_iter().map(|v| v as f32).collect();
        if sb.len() != 1 && sb.len() != n {
            return Err(OpError::input(4, format!("{} scales for {n} columns", sb.len())));
        }
        let sy = opt(7).map(|_| qlinear::scalar_f32(inputs, 7)).transpose()?;
        let scales = output_scales(op.alpha, qlinear::scalar_f32(inputs, 1)?, &sb, sy);
        let quant = match sy {
            Some(_) => Some((qlinear::zero_point(inputs, 8)?, qlinear::bounds(out))),
            None => None,
        };
        Ok(Finish { c, scales, quant })
    }

    /// Output (r, col)'s value before rounding: `(acc + C) * scale`.
    #[inline]
    fn value(&self, r: usize, col: usize, acc: i32) -> f32 {
        let acc = match self.c {
            Some((c, rs, cs)) => acc.wrapping_add(c[r * rs + col * cs]),
            None => acc,
        };
        acc as f32 * self.scales[if self.scales.len() == 1 { 0 } else { col }]
    }
}

impl CpuKernel for QGemm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let (a, b) = (Self::oriented(cpu::input(inputs, 0)?, self.trans_a)?, Self::oriented(cpu::input(inputs, 3)?, self.trans_b)?);
        let (m, n) = (a.dims()[0], b.dims()[1]);
        let mut acc = vec![0i32; m * n];
        int_product(&IntOperands { a: &a, b: &b, za: opt(2), zb: opt(5), za_input: 2, zb_input: 5 }, &mut acc)?;
        let out = &mut outputs[0];
        let finish = Finish::new(self, inputs, out.dtype(), m, n)?;
        let Some((zy, range)) = finish.quant else {
            for (o, (y, &v)) in out.as_mut_slice::<f32>()?.iter_mut().zip(&acc).enumerate() {
                *y = finish.value(o / n, o % n, v);
            }
            return Ok(());
        };
        let q: Vec<i32> = acc.iter().enumerate().map(|(o, &v)| qlinear::requantize(finish.value(o / n, o % n, v), zy, range)).collect();
        qlinear::write_ints(out, &q)
    }

    /// The instruction set of the packed integer kernel ([`PackedIntMatMul`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        qmatmul_packed::params(packable(inputs))
    }

    /// Packs a constant B once for the fast integer kernel.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        let Some((da, b, zb)) = packable(inputs) else { return Ok(None) };
        let packed = PackedIntMatMul::new(da, b, self.trans_b, &zb, tune)?;
        Ok(Some(Box::new(PackedQGemm { op: self.clone(), packed })))
    }
}

/// A's dtype, a constant B and its constant zero points, when B is constant.
fn packable<'a>(inputs: &[Option<Arg<'a>>]) -> Option<(DType, &'a Tensor, Vec<i32>)> {
    let (a, b) = (inputs.first().copied().flatten()?, inputs.get(3).copied().flatten()?);
    let zb = match inputs.get(5).copied().flatten() {
        Some(z) => qlinear::ints(z.value?).ok()?,
        None => vec![0],
    };
    (b.dims().len() == 2).then_some((a.dtype(), b.value?, zb))
}

/// QGemm with B packed once per plan.
struct PackedQGemm {
    op: QGemm,
    packed: PackedIntMatMul,
}

impl CpuKernel for PackedQGemm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let a = QGemm::oriented(cpu::input(inputs, 0)?, self.op.trans_a)?;
        let (m, n) = (a.dims()[0], self.packed.n());
        let za = qlinear::zero_point(inputs, 2)?;
        let out = &mut outputs[0];
        if out.len() != m * n {
            return Err(OpError::invalid(format!("output of {} elements for [{m}, {n}]", out.len())));
        }
        let finish = Finish::new(&self.op, inputs, out.dtype(), m, n)?;
        let y = SharedPtr(out.bytes_mut().as_mut_ptr());
        self.packed.run(a.bytes(), m, za, |r0, rows, c0, cols, c| {
            for j in 0..rows {
                for l in 0..cols {
                    let (r, col) = (r0 + j, c0 + l);
                    let v = finish.value(r, col, c[j * CH + l]);
                    // SAFETY: element (r, col) belongs to this tile alone.
                    unsafe {
                        match finish.quant {
                            None => *(y.get() as *mut f32).add(r * n + col) = v,
                            Some((zy, range)) => *y.get().add(r * n + col) = qlinear::requantize(v, zy, range) as u8,
                        }
                    }
                }
            }
        })
    }
}

impl WgslKernel for QGemm {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let s = self.shape(inputs)?;
        let (m, k, n) = (s.m, s.k, s.n);
        let a = if self.trans_a { Layout { rs: 1, cs: m } } else { Layout::row_major(k) };
        let b = if self.trans_b { Layout { rs: 1, cs: k } } else { Layout::row_major(n) };
        let p = BatchedProduct { batch: vec![], a_batch_strides: vec![], b_batch_strides: vec![], m, n, k, a, b };
        let input = |i: usize| inputs.get(i).copied().flatten();
        let mut buffers: Vec<Buffer> = vec![];
        let mut bind = |name: &str, i: usize| -> Result<()> {
            buffers.push((name.to_string(), wgsl::elem(required(inputs, i)?.dtype()), Binding::Input(i)));
            Ok(())
        };
        let per_column = |i: usize| input(i).is_some_and(|t| t.ty.len() != 1);
        let za = if input(2).is_some() { bind("za", 2)?; "i32(za[0])" } else { "0i" };
        let zb = match (input(5).is_some(), per_column(5)) {
            (false, _) => "0i",
            (true, col) => {
                bind("zb", 5)?;
                if col { "i32(zb[n])" } else { "i32(zb[0])" }
            }
        };
        bind("sa", 1)?;
        bind("sb", 4)?;
        let sb = if per_column(4) { "sb[n]" } else { "sb[0]" };
        let c = match s.c {
            None => "0i".to_string(),
            Some((rs, cs)) => {
                bind("c", 6)?;
                format!("c[m * {rs}u + n * {cs}u]")
            }
        };
        let out = &outputs[0];
        let alpha = wgsl::literal("f32", self.alpha as f64);
        let epilogue = if out.dtype == DType::F32 {
            format!("let acc = s + {c};\n    y[i] = f32(acc) * (({alpha} * sa[0]) * {sb});")
        } else {
            bind("sy", 7)?;
            bind("zy", 8)?;
            let (lo, hi) = qlinear::bounds(out.dtype);
            format!(
                "let acc = s + {c};\n    let scale = q_div(({alpha} * sa[0]) * {sb}, sy[0]);\n    y[i] = {}(q_requantize(f32(acc) * scale, i32(zy[0]), {lo}i, {hi}i));",
                wgsl::elem(out.dtype)
            )
        };
        buffers.push(("y".into(), wgsl::elem(out.dtype), Binding::Output(0)));
        let product = IntProduct {
            label: "QGemm",
            batch: 1,
            m,
            n,
            k,
            a: strided_operand("xa", 0, required(inputs, 0)?.dtype(), &p, true, za.into()),
            b: strided_operand("xb", 3, required(inputs, 3)?.dtype(), &p, false, zb.into()),
            buffers,
            helpers: qlinear::WGSL_REQUANTIZE.to_string(),
            prelude: String::new(),
            epilogue,
            scratch: 0,
        };
        let (dispatches, scratch_bytes) = product.program(tune.get(&wgsl::workgroup_param()))?;
        Ok(WgslProgram { dispatches, scratch_bytes })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QGemm", |spec| Ok(Box::new(QGemm::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use crate::testing::run_cpu_variants;
    use kiln_graph::{Attr, Tensor};

    /// onnxruntime 1.32's outputs for the same inputs.
    #[test]
    fn matches_onnxruntime() {
        let a = u8s(&[3, 5], &[171, 206, 5, 206, 120, 131, 161, 73, 250, 13, 71, 98, 146, 104, 33]);
        let b = i8s(&[4, 5], &[-117, -128, -116, -90, 127, -80, 39, 64, -68, -56, -17, -61, 121, -83, 101, 76, 88, -99, -28, 32]);
        let sb = Tensor::from_vec(&[4], vec![0.011f32, 0.02, 0.007, 0.015]).unwrap();
        let c = Tensor::from_vec(&[4], vec![100, -2000, 30000, -5i32]).unwrap();
        // Quantized output, B transposed with per-column scales and zero points, a bias.
        let case = ms("QGemm").attr("transB", Attr::Int(1)).input(a.clone()).constant(f(0.04)).constant(u8s(&[], &[120]));
        let case = case.constant(b.clone()).constant(sb.clone()).constant(i8s(&[4], &[0, 3, -2, 1])).constant(c.clone());
        let y = case.constant(f(0.3)).constant(u8s(&[], &[110])).run_cpu().unwrap().remove(0);
        assert_eq!((y.dims(), ints(&y)), (&[3usize, 4][..], vec![93, 67, 113, 151, 71, 91, 110, 114, 104, 134, 136, 89]));
        // f32 output with alpha 0.5 (bit for bit: the same f32 operations).
        let case = ms("QGemm").attrs(&[("transB", Attr::Int(1)), ("alpha", Attr::Float(0.5))]).input(a).input(f(0.04)).input(u8s(&[], &[120]));
        let y = case.constant(b).input(sb).input(i8s(&[4], &[0, 3, -2, 1])).input(c).run_cpu().unwrap().remove(0);
        let bits: Vec<u32> = y.as_slice::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, [0xc01ec082, 0xc0d01a37, 0x3eda9fbf, 0x40c2f4f0, 0xc0b8f472, 0xc038db8b, 0x3c40ad04, 0x3f199999, 0xbf5feda6, 0x4069ba5e, 0x4076fdca, 0xc04832ca]);
        // int8, A transposed, C per row, alpha 2.
        let case = ms("QGemm").attrs(&[("transA", Attr::Int(1)), ("alpha", Attr::Float(2.0))]).input(i8s(&[6, 2], &[-2, 42, 45, 41, -113, 117, 14, 103, -59, -36, 97, -81])).constant(f(0.02)).constant(i8s(&[], &[-4]));
        let case = case.input(i8s(&[6, 3], &[-112, -33, 45, -97, 94, -41, -70, 11, 101, 98, 95, -50, -124, 71, 53, 69, -128, -119])).constant(f(0.03)).constant(i8s(&[], &[5])).constant(Tensor::from_vec(&[2, 1], vec![7i32, -9000]).unwrap());
        let y = case.constant(f(0.05)).constant(i8s(&[], &[-10])).run_cpu().unwrap().remove(0);
        assert_eq!((y.dims(), ints(&y)), (&[2usize, 3][..], vec![127, -128, -128, -128, 127, 98]));
    }

    /// Every CPU variant (the plain kernel, B packed for each instruction set) gives the
    /// same outputs bit for bit: shapes off the 6 x 16 tile, both transposes, signed and
    /// unsigned operands, per-tensor and per-column zero points, C of each broadcast,
    /// quantized and f32 outputs.
    #[test]
    fn packed_variants_equal_the_plain_kernel() {
        let mut seed = 99u64;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect()
        };
        for (case_no, &(m, k, n, ta, tb, signed, per_col, c_dims, quant)) in [
            (13, 37, 70, false, true, false, true, &[70usize][..], true),
            (1, 512, 40, false, true, false, false, &[1, 40][..], true),
            (7, 9, 17, true, false, true, false, &[7, 1][..], true),
            (6, 64, 16, false, false, false, true, &[6, 16][..], false),
            (20, 33, 5, true, true, true, true, &[][..], false),
            (9, 21, 33, false, true, false, false, &[33][..], true),
        ]
        .iter()
        .enumerate()
        {
            let q8 = |dims: &[usize], v: Vec<u8>| if signed { i8s(dims, &v.iter().map(|&b| b as i8).collect::<Vec<_>>()) } else { u8s(dims, &v) };
            let a = q8(&if ta { [k, m] } else { [m, k] }, bytes(m * k));
            let b = i8s(&if tb { [n, k] } else { [k, n] }, &bytes(k * n).iter().map(|&v| v as i8).collect::<Vec<_>>());
            let nz = if per_col { n } else { 1 };
            // The last case: unsigned A, zero zero points (the quads layout).
            let zb = i8s(&[nz], &(0..nz).map(|i| if case_no == 5 { 0 } else { (i as i8 % 7) - 3 }).collect::<Vec<_>>());
            let sb = Tensor::from_vec(&[nz], (0..nz).map(|i| 0.002 + 0.0001 * i as f32).collect()).unwrap();
            let cn: usize = c_dims.iter().product();
            let c = Tensor::from_vec(c_dims, (0..cn as i32).map(|i| (i * 7919) % 4001 - 2000).collect()).unwrap();
            let za = if signed { i8s(&[], &[-5]) } else { u8s(&[], &[131]) };
            let case = ms("QGemm").attrs(&[("transA", Attr::Int(ta as i64)), ("transB", Attr::Int(tb as i64)), ("alpha", Attr::Float(0.75))]);
            let case = case.input(a).constant(f(0.03)).constant(za).constant(b).constant(sb).constant(zb).constant(c);
            let case = if quant { case.constant(f(0.2)).constant(if signed { i8s(&[], &[3]) } else { u8s(&[], &[100]) }) } else { case };
            let variants = run_cpu_variants(case.op().unwrap().as_ref(), &case.inputs).unwrap();
            assert!(variants.iter().any(|(name, _)| name.starts_with("isa=")), "case {case_no}: no packed variant");
            let bits = |t: &Tensor| t.bytes().to_vec();
            for (name, outs) in &variants[1..] {
                assert_eq!(bits(&outs[0]), bits(&variants[0].1[0]), "case {case_no}: variant {name}");
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let base = |b: Tensor| ms("QGemm").input(u8s(&[2, 3], &[0; 6])).constant(f(0.1)).constant(u8s(&[], &[0])).constant(b).constant(f(0.1)).constant(u8s(&[], &[0]));
        let e = base(u8s(&[2, 2], &[0; 4])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("inner dimensions"), "{e}");
        // y_scale without y_zero_point.
        let e = base(u8s(&[3, 2], &[0; 6])).omitted().constant(f(0.1)).run_cpu().unwrap_err().to_string();
        assert!(e.contains("y_zero_point"), "{e}");
        // C that does not broadcast to [M, N].
        let e = base(u8s(&[3, 2], &[0; 6])).constant(Tensor::from_vec(&[3], vec![1i32, 2, 3]).unwrap()).run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 6"), "{e}");
    }
}
