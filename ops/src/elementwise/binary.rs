//! Broadcasting binary (and variadic) elementwise ops: Add, Sub, Mul, Div, Pow, Max,
//! Min, Sum, Mean, and the comparisons Equal, Less, LessOrEqual, Greater,
//! GreaterOrEqual, And, Or, Xor (bool outputs). One variant per op: its CPU function
//! per element type and its WGSL expression.
use crate::broadcast::{broadcast_shapes, broadcast_strides};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Element, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    /// Variadic sum (pairwise Add).
    Sum,
    /// Variadic mean.
    Mean,
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    And,
    Or,
    Xor,
}

impl BinaryKind {
    /// Every kind, for lookups by name.
    pub const ALL: [BinaryKind; 17] = [
        BinaryKind::Add, BinaryKind::Sub, BinaryKind::Mul, BinaryKind::Div, BinaryKind::Pow, BinaryKind::Max, BinaryKind::Min,
        BinaryKind::Sum, BinaryKind::Mean, BinaryKind::Equal, BinaryKind::Less, BinaryKind::LessOrEqual, BinaryKind::Greater,
        BinaryKind::GreaterOrEqual, BinaryKind::And, BinaryKind::Or, BinaryKind::Xor,
    ];

    /// The kind of an ONNX op name.
    pub fn from_name(name: &str) -> Option<BinaryKind> {
        BinaryKind::ALL.into_iter().find(|k| k.op_name() == name)
    }

    /// WGSL functions [`BinaryKind::wgsl_expr`] may call.
    pub fn wgsl_helpers(self) -> &'static str {
        match self {
            BinaryKind::Pow => POW_HELPERS,
            _ => "",
        }
    }

    pub fn op_name(self) -> &'static str {
        match self {
            BinaryKind::Add => "Add",
            BinaryKind::Sub => "Sub",
            BinaryKind::Mul => "Mul",
            BinaryKind::Div => "Div",
            BinaryKind::Pow => "Pow",
            BinaryKind::Max => "Max",
            BinaryKind::Min => "Min",
            BinaryKind::Sum => "Sum",
            BinaryKind::Mean => "Mean",
            BinaryKind::Equal => "Equal",
            BinaryKind::Less => "Less",
            BinaryKind::LessOrEqual => "LessOrEqual",
            BinaryKind::Greater => "Greater",
            BinaryKind::GreaterOrEqual => "GreaterOrEqual",
            BinaryKind::And => "And",
            BinaryKind::Or => "Or",
            BinaryKind::Xor => "Xor",
        }
    }

    fn variadic(self) -> bool {
        matches!(self, BinaryKind::Max | BinaryKind::Min | BinaryKind::Sum | BinaryKind::Mean)
    }

    fn is_compare(self) -> bool {
        matches!(
            self,
            BinaryKind::Equal | BinaryKind::Less | BinaryKind::LessOrEqual | BinaryKind::Greater | BinaryKind::GreaterOrEqual
        )
    }

    fn is_logical(self) -> bool {
        matches!(self, BinaryKind::And | BinaryKind::Or | BinaryKind::Xor)
    }

    fn out_dtype(self, input: DType) -> DType {
        if self.is_compare() || self.is_logical() {
            DType::Bool
        } else {
            input
        }
    }

    /// Scalar semantics on f64 (floats; the reference).
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryKind::Add | BinaryKind::Sum | BinaryKind::Mean => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
            BinaryKind::Pow => a.powf(b),
            BinaryKind::Max => if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) },
            BinaryKind::Min => if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) },
            BinaryKind::Equal => (a == b) as u8 as f64,
            BinaryKind::Less => (a < b) as u8 as f64,
            BinaryKind::LessOrEqual => (a <= b) as u8 as f64,
            BinaryKind::Greater => (a > b) as u8 as f64,
            BinaryKind::GreaterOrEqual => (a >= b) as u8 as f64,
            BinaryKind::And => ((a != 0.0) && (b != 0.0)) as u8 as f64,
            BinaryKind::Or => ((a != 0.0) || (b != 0.0)) as u8 as f64,
            BinaryKind::Xor => ((a != 0.0) != (b != 0.0)) as u8 as f64,
        }
    }

    /// Scalar semantics on i64 (integers: wrapping, C-style truncating division).
    fn apply_i64(self, a: i64, b: i64) -> Result<i64> {
        Ok(match self {
            BinaryKind::Add | BinaryKind::Sum | BinaryKind::Mean => a.wrapping_add(b),
            BinaryKind::Sub => a.wrapping_sub(b),
            BinaryKind::Mul => a.wrapping_mul(b),
            BinaryKind::Div => {
                if b == 0 {
                    return Err(OpError::invalid("integer division by zero"));
                }
                a.wrapping_div(b)
            }
            BinaryKind::Pow => {
                if b < 0 { 0 } else { a.wrapping_pow(b.min(u32::MAX as i64) as u32) }
            }
            BinaryKind::Max => a.max(b),
            BinaryKind::Min => a.min(b),
            k => k.apply_f64(a as f64, b as f64) as i64,
        })
    }

    /// WGSL expression of `a` and `b` (element type `ty`).
    pub fn wgsl_expr(self, a: &str, b: &str, ty: &str) -> String {
        match self {
            BinaryKind::Add | BinaryKind::Sum | BinaryKind::Mean => format!("({a} + {b})"),
            BinaryKind::Sub => format!("({a} - {b})"),
            BinaryKind::Mul => format!("({a} * {b})"),
            BinaryKind::Div => format!("({a} / {b})"),
            BinaryKind::Pow if ty == "f32" => format!("kiln_pow({a}, {b})"),
            BinaryKind::Pow => format!("kiln_ipow({a}, {b})"),
            // NaN propagates (WGSL's max/min need not).
            BinaryKind::Max if ty == "f32" => super::wgsl_max(a, b),
            BinaryKind::Min if ty == "f32" => super::wgsl_min(a, b),
            BinaryKind::Max => format!("max({a}, {b})"),
            BinaryKind::Min => format!("min({a}, {b})"),
            BinaryKind::Equal => format!("u32({a} == {b})"),
            BinaryKind::Less => format!("u32({a} < {b})"),
            BinaryKind::LessOrEqual => format!("u32({a} <= {b})"),
            BinaryKind::Greater => format!("u32({a} > {b})"),
            BinaryKind::GreaterOrEqual => format!("u32({a} >= {b})"),
            BinaryKind::And => format!("u32(({a} != 0u) && ({b} != 0u))"),
            BinaryKind::Or => format!("u32(({a} != 0u) || ({b} != 0u))"),
            BinaryKind::Xor => format!("u32(({a} != 0u) != ({b} != 0u))"),
        }
    }
}

/// WGSL helpers for Pow: ONNX defines negative bases with integral exponents.
const POW_HELPERS: &str = "
fn kiln_pow(a: f32, b: f32) -> f32 {
    if (b == 2.0) { return a * a; }
    if (b == 1.0) { return a; }
    if (b == 0.0) { return 1.0; }
    let r = pow(abs(a), b);
    if (a < 0.0) {
        if (fract(b) != 0.0) { return bitcast<f32>(0x7fc00000u); }
        if (fract(b * 0.5) != 0.0) { return -r; }
    }
    return r;
}
fn kiln_ipow(a: i32, b: i32) -> i32 {
    var r = 1;
    for (var k = 0; k < b; k = k + 1) { r = r * a; }
    return r;
}
";

#[derive(Debug)]
pub struct Binary {
    pub kind: BinaryKind,
}

const LOGICAL: &[DType] = &[DType::Bool];

impl Op for Binary {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        self.kind.op_name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let n = inputs.len();
        if n == 0 || (!self.kind.variadic() && n != 2) {
            return Err(OpError::invalid(format!("{} takes {} inputs, got {n}", self.name(), if self.kind.variadic() { "1 or more" } else { "2" })));
        }
        let first = required(inputs, 0)?;
        let dtype = first.dtype();
        if self.kind.is_logical() && !LOGICAL.contains(&dtype) {
            return Err(OpError::input(0, format!("{} needs bool inputs, got {dtype}", self.name())));
        }
        let mut shapes = vec![];
        for i in 0..n {
            let a = required(inputs, i)?;
            // Pow's exponent may have another numeric type.
            if a.dtype() != dtype && !(self.kind == BinaryKind::Pow && i == 1) {
                return Err(OpError::input(i, format!("dtype {} differs from input 0's {dtype}", a.dtype())));
            }
            shapes.push(a.dims());
        }
        let dims = broadcast_shapes(&shapes)?;
        Ok(vec![TensorType::new(self.kind.out_dtype(dtype), dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Whether a tensor of dims `small` broadcast to `out` is its own bytes repeated: its
/// dims, leading 1s dropped, equal the trailing dims of `out`.
fn repeats_trailing(small: &[usize], out: &[usize]) -> bool {
    let lead = small.iter().take_while(|&&d| d == 1).count();
    let s = &small[lead..];
    !s.is_empty() && s.len() <= out.len() && s == &out[out.len() - s.len()..]
}

/// `out[i] = f(a[..], b[..])` with broadcasting, in parallel chunks.
pub(crate) fn map2<T: Element, U: Element>(a: &Tensor, b: &Tensor, out: &mut Tensor, f: impl Fn(T, T) -> U + Sync) -> Result<()> {
    let (av, bv) = (a.as_slice::<T>()?, b.as_slice::<T>()?);
    let dims = out.dims().to_vec();
    let dst = out.as_mut_slice::<U>()?;
    if a.dims() == dims.as_slice() && b.dims() == dims.as_slice() {
        cpu::par_chunks_mut(dst, 1, 1, |s, part| {
            for (k, o) in part.iter_mut().enumerate() {
                *o = f(av[s + k], bv[s + k]);
            }
        });
    } else if b.len() == 1 && a.dims() == dims.as_slice() {
        let y = bv[0];
        cpu::par_chunks_mut(dst, 1, 1, |s, part| {
            for (k, o) in part.iter_mut().enumerate() {
                *o = f(av[s + k], y);
            }
        });
    } else if a.len() == 1 && b.dims() == dims.as_slice() {
        let x = av[0];
        cpu::par_chunks_mut(dst, 1, 1, |s, part| {
            for (k, o) in part.iter_mut().enumerate() {
                *o = f(x, bv[s + k]);
            }
        });
    } else if a.dims() == dims.as_slice() && repeats_trailing(b.dims(), &dims) {
        // b is the trailing block of the output, repeated (bias adds): zip per block.
        let n = bv.len().max(1);
        cpu::par_chunks_mut(dst, n, n, |s, part| {
            for (r, orow) in part.chunks_mut(n).enumerate() {
                let arow = &av[(s + r) * n..][..n];
                for k in 0..n {
                    orow[k] = f(arow[k], bv[k]);
                }
            }
        });
    } else if b.dims() == dims.as_slice() && repeats_trailing(a.dims(), &dims) {
        let n = av.len().max(1);
        cpu::par_chunks_mut(dst, n, n, |s, part| {
            for (r, orow) in part.chunks_mut(n).enumerate() {
                let brow = &bv[(s + r) * n..][..n];
                for k in 0..n {
                    orow[k] = f(av[k], brow[k]);
                }
            }
        });
    } else if dims.last().is_some_and(|&n| n > 1) {
        // General broadcast, a row of the last dim at a time: the row's start offsets
        // from the outer index, then a stride-0/1 inner loop.
        let st = [broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)];
        let (rank, n) = (dims.len(), dims[dims.len() - 1]);
        let (sa, sb) = (st[0][rank - 1], st[1][rank - 1]);
        let outer = &dims[..rank - 1];
        let outer_st = [st[0][..rank - 1].to_vec(), st[1][..rank - 1].to_vec()];
        cpu::par_chunks_mut(dst, n, n, |r0, part| {
            let rows = part.len() / n;
            let mut row = 0;
            crate::broadcast::for_each_offset_in(outer, &outer_st, r0, r0 + rows, &mut |_, offs| {
                let (oa, ob) = (offs[0], offs[1]);
                let orow = &mut part[row * n..(row + 1) * n];
                match (sa, sb) {
                    (1, 1) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k], bv[ob + k])),
                    (1, 0) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k], bv[ob])),
                    (0, 1) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa], bv[ob + k])),
                    _ => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k * sa], bv[ob + k * sb])),
                }
                row += 1;
            });
        });
    } else {
        let st = [broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)];
        cpu::par_chunks_mut(dst, 1, 2, |s, part| {
            crate::broadcast::for_each_offset_in(&dims, &st, s, s + part.len(), &mut |o, offs| {
                part[o - s] = f(av[offs[0]], bv[offs[1]]);
            });
        });
    }
    Ok(())
}

impl Binary {
    /// One pairwise step `a op b` into `out` (dims already the broadcast of both).
    fn step(&self, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<()> {
        let k = self.kind;
        let cmp = k.is_compare() || k.is_logical();
        match a.dtype() {
            DType::F32 if !cmp => match k {
                BinaryKind::Add | BinaryKind::Sum | BinaryKind::Mean => map2(a, b, out, |x: f32, y| x + y),
                BinaryKind::Sub => map2(a, b, out, |x: f32, y| x - y),
                BinaryKind::Mul => map2(a, b, out, |x: f32, y| x * y),
                BinaryKind::Div => map2(a, b, out, |x: f32, y| x / y),
                // Constant small exponents (x^2, x^3 in GELU and variance decompositions).
                BinaryKind::Pow if b.len() == 1 && [1.0, 2.0, 3.0].contains(&b.as_slice::<f32>()?[0]) => {
                    match b.as_slice::<f32>()?[0] {
                        1.0 => map2(a, b, out, |x: f32, _| x),
                        2.0 => map2(a, b, out, |x: f32, _| x * x),
                        _ => map2(a, b, out, |x: f32, _| x * x * x),
                    }
                }
                BinaryKind::Pow => map2(a, b, out, |x: f32, y: f32| x.powf(y)),
                _ => map2(a, b, out, |x: f32, y: f32| k.apply_f64(x as f64, y as f64) as f32),
            },
            DType::F32 => map2(a, b, out, |x: f32, y: f32| k.apply_f64(x as f64, y as f64) as u8),
            DType::F64 if !cmp => map2(a, b, out, |x: f64, y| k.apply_f64(x, y)),
            // Masks: bool in, bool out, byte by byte (And/Or/Xor/Equal of attention masks).
            DType::Bool if cmp => map2(a, b, out, |x: u8, y: u8| k.apply_f64(x as f64, y as f64) as u8),
            DType::I64 if !cmp => {
                if k == BinaryKind::Div && b.as_slice::<i64>()?.contains(&0) {
                    return Err(OpError::invalid("integer division by zero"));
                }
                map2(a, b, out, |x: i64, y| k.apply_i64(x, y).unwrap_or(0))
            }
            DType::I64 => map2(a, b, out, |x: i64, y: i64| k.apply_f64(x as f64, y as f64) as u8),
            DType::I32 if !cmp => {
                if k == BinaryKind::Div && b.as_slice::<i32>()?.contains(&0) {
                    return Err(OpError::invalid("integer division by zero"));
                }
                map2(a, b, out, |x: i32, y| k.apply_i64(x as i64, y as i64).unwrap_or(0) as i32)
            }
            d => {
                // Other dtypes: through f64 (exact for all integers up to 2^53) or i64.
                let dims = out.dims().to_vec();
                let (fa, fb) = (Tensor::from_f64(DType::F64, a.dims(), &a.to_f64_vec())?, Tensor::from_f64(DType::F64, b.dims(), &b.to_f64_vec())?);
                let mut tmp = Tensor::zeros(DType::F64, &dims);
                if d.is_int() && !cmp {
                    let (ia, ib) = (fa.as_slice::<f64>()?, fb.as_slice::<f64>()?);
                    if k == BinaryKind::Div && ib.contains(&0.0) {
                        return Err(OpError::invalid("integer division by zero"));
                    }
                    let _ = (ia, ib);
                    map2(&fa, &fb, &mut tmp, |x: f64, y: f64| k.apply_i64(x as i64, y as i64).unwrap_or(0) as f64)?;
                } else {
                    map2(&fa, &fb, &mut tmp, |x: f64, y: f64| k.apply_f64(x, y))?;
                }
                *out = Tensor::from_f64(out.dtype(), &dims, tmp.as_slice::<f64>()?)?;
                Ok(())
            }
        }
    }
}

impl CpuKernel for Binary {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let out = &mut outputs[0];
        let n = inputs.len();
        let mut b0 = cpu::input(inputs, 0)?.clone();
        if self.kind == BinaryKind::Pow {
            let e = cpu::input(inputs, 1)?;
            let e = if e.dtype() == b0.dtype() { e.clone() } else { Tensor::from_f64(b0.dtype(), e.dims(), &e.to_f64_vec())? };
            return self.step(&b0, &e, out);
        }
        if n == 1 {
            // Variadic op of one input: a copy (Mean of one is itself).
            *out = b0.reshaped(out.dims())?;
            return Ok(());
        }
        for i in 1..n {
            let b = cpu::input(inputs, i)?;
            if i + 1 == n {
                self.step(&b0, b, out)?;
            } else {
                let dims = broadcast_shapes(&[b0.dims(), b.dims()])?;
                let mut tmp = Tensor::zeros(out.dtype(), &dims);
                self.step(&b0, b, &mut tmp)?;
                b0 = tmp;
            }
        }
        if self.kind == BinaryKind::Mean {
            let d = out.dims().to_vec();
            let v: Vec<f64> = out.to_f64_vec().into_iter().map(|x| x / n as f64).collect();
            *out = Tensor::from_f64(out.dtype(), &d, &v)?;
        }
        Ok(())
    }
}

impl WgslKernel for Binary {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let out = &outputs[0];
        let in_ty = wgsl::elem(required(inputs, 0)?.dtype());
        let out_ty = wgsl::elem(out.dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("in{i}")).collect();
        let mut buffers = vec![];
        let mut helpers = String::new();
        let mut bindings = vec![];
        for (i, name) in names.iter().enumerate() {
            let a = required(inputs, i)?;
            buffers.push((name.as_str(), wgsl::elem(a.dtype()), true));
            bindings.push(Binding::Input(i));
            helpers += &wgsl::offset_fn(&format!("off{i}"), &out.dims, &broadcast_strides(a.dims(), &out.dims));
        }
        buffers.push(("out", out_ty, false));
        bindings.push(Binding::Output(0));
        helpers += self.kind.wgsl_helpers();
        let read = |i: usize| -> Result<String> {
            let a = required(inputs, i)?;
            let raw = format!("in{i}[off{i}(i)]");
            Ok(if wgsl::elem(a.dtype()) != in_ty { format!("{in_ty}({raw})") } else { raw })
        };
        let wide = matches!(out.dtype, DType::I64 | DType::U64);
        if wide && matches!(self.kind, BinaryKind::Add | BinaryKind::Sub | BinaryKind::Mul | BinaryKind::Sum) {
            // 64-bit integers computed in 32 bits: a result that does not fit is reported.
            let status = bindings.len();
            bindings.push(Binding::Status);
            helpers += &wgsl::status_decl(status);
            let signed = in_ty == "i32";
            let mut body = format!("var acc = {};\n", read(0)?);
            for i in 1..inputs.len() {
                let b = read(i)?;
                let (op, overflow) = match (self.kind, signed) {
                    (BinaryKind::Sub, true) => ("-", "((acc ^ b) & (acc ^ r)) < 0i"),
                    (BinaryKind::Sub, false) => ("-", "b > acc"),
                    (BinaryKind::Mul, true) => ("*", "(acc != 0i && (r / acc != b || (acc == -1i && b == bitcast<i32>(0x80000000u)))) || (b == -1i && acc == bitcast<i32>(0x80000000u))"),
                    (BinaryKind::Mul, false) => ("*", "acc != 0u && r / acc != b"),
                    (_, true) => ("+", "((acc ^ r) & (b ^ r)) < 0i"),
                    (_, false) => ("+", "r < acc"),
                };
                body += &format!(
                    "    {{\n        let b = {b};\n        let r = acc {op} b;\n        if ({overflow}) {{ {} }}\n        acc = r;\n    }}\n",
                    wgsl::report_overflow("acc", "b")
                );
            }
            body += "    out[i] = acc;";
            let refs: Vec<(&str, &str, bool)> = buffers.iter().map(|(n, t, r)| (*n, *t, *r)).collect();
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), out.len(), wg, &refs, bindings, &helpers, &body)));
        }
        let mut expr = read(0)?;
        for i in 1..inputs.len() {
            expr = self.kind.wgsl_expr(&expr, &read(i)?, in_ty);
        }
        if self.kind == BinaryKind::Mean {
            expr = format!("({expr} / {})", wgsl::literal(in_ty, inputs.len() as f64));
        }
        let body = format!("out[i] = {expr};");
        let refs: Vec<(&str, &str, bool)> = buffers.iter().map(|(n, t, r)| (*n, *t, *r)).collect();
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), out.len(), wg, &refs, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    use BinaryKind::*;
    for kind in [Add, Sub, Mul, Div, Pow, Max, Min, Sum, Mean, Equal, Less, LessOrEqual, Greater, GreaterOrEqual, And, Or, Xor] {
        r.register("", kind.op_name(), move |_| Ok(Box::new(Binary { kind })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: BinaryKind, a: &Tensor, b: &Tensor) -> Tensor {
        let op = Binary { kind };
        let (ta, tb) = (TensorType::new(a.dtype(), a.dims()), TensorType::new(b.dtype(), b.dims()));
        let args = [Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })];
        let ty = op.infer(&args).unwrap();
        let prog = op.generate(&args, &ty, &TuneValues::default()).unwrap();
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let mut out = vec![Tensor::zeros(ty[0].dtype, &ty[0].dims)];
        op.run(&[Some(a), Some(b)], &mut out).unwrap();
        out.remove(0)
    }

    #[test]
    fn broadcast_add_and_compare() {
        let a = Tensor::from_slice(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]).unwrap();
        let b = Tensor::from_slice(&[3], &[10f32, 20., 30.]).unwrap();
        assert_eq!(run(BinaryKind::Add, &a, &b).as_slice::<f32>().unwrap(), &[11., 22., 33., 14., 25., 36.]);
        let c = Tensor::from_slice(&[2, 1], &[2f32, 5.]).unwrap();
        let lt = run(BinaryKind::Less, &a, &c);
        assert_eq!(lt.dtype(), DType::Bool);
        assert_eq!(lt.as_slice::<u8>().unwrap(), &[1, 0, 0, 1, 0, 0]);
        let p = run(BinaryKind::Pow, &Tensor::from_slice(&[2], &[-2f32, 3.]).unwrap(), &Tensor::scalar(3i64));
        assert_eq!(p.as_slice::<f32>().unwrap(), &[-8., 27.]);
    }

    #[test]
    fn integer_division_by_zero_is_an_error() {
        let op = Binary { kind: BinaryKind::Div };
        let a = Tensor::from_slice(&[2], &[4i64, 2]).unwrap();
        let b = Tensor::from_slice(&[2], &[2i64, 0]).unwrap();
        let mut out = vec![Tensor::zeros(DType::I64, &[2])];
        assert!(op.run(&[Some(&a), Some(&b)], &mut out).is_err());
        assert!(op
            .infer(&[Some(Arg { ty: &TensorType::new(DType::F32, vec![2, 3]), value: None }), Some(Arg { ty: &TensorType::new(DType::F32, vec![4]), value: None })])
            .is_err());
    }
}
