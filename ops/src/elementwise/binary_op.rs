//! The binary elementwise op: one type runs every kind of the table in [`super::binary`]
//! (inference, the broadcasting CPU loops, the WGSL kernel), and the per-class CPU
//! kernels the table's kinds are monomorphised into.
use super::binary::BinaryKind;
use crate::broadcast::{broadcast_shapes, broadcast_strides};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Element, Tensor};

/// A binary (or variadic) elementwise op application.
#[derive(Debug)]
pub struct Binary {
    pub kind: BinaryKind,
}

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
        if self.kind == BinaryKind::Equal && required(inputs, 0)?.dtype() == DType::String {
            return super::equal_string::infer(inputs);
        }
        let dtype = expect_dtype(inputs, 0, self.kind.dtypes())?;
        let mut shapes = vec![];
        for i in 0..n {
            let a = required(inputs, i)?;
            if a.dtype() != dtype {
                if self.kind.mixed_rhs() && i == 1 {
                    expect_dtype(inputs, i, self.kind.dtypes())?;
                } else {
                    return Err(OpError::input(i, format!("dtype {} differs from input 0's {dtype}", a.dtype())));
                }
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

    fn handles_strings(&self) -> bool {
        self.kind == BinaryKind::Equal
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
    } else if !dst.is_empty() {
        // General broadcast over the merged dims (a per-channel operand of NCHW: rows of
        // H*W), a row of the last dim at a time: a stride-0/1 inner loop.
        let walk = crate::broadcast::RowWalk::new(&dims, &[broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)]);
        let (n, sa, sb) = (walk.n, walk.inner[0], walk.inner[1]);
        cpu::par_chunks_mut(dst, n, n, |r0, part| {
            walk.rows(r0, part.len() / n, |row, offs| {
                let (oa, ob) = (offs[0], offs[1]);
                let orow = &mut part[row * n..(row + 1) * n];
                match (sa, sb) {
                    (1, 1) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k], bv[ob + k])),
                    (1, 0) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k], bv[ob])),
                    (0, 1) => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa], bv[ob + k])),
                    _ => orow.iter_mut().enumerate().for_each(|(k, o)| *o = f(av[oa + k * sa], bv[ob + k * sb])),
                }
            });
        });
    }
    Ok(())
}

/// `out = f(a, b)` computed in f64 (other dtypes: exact for integers up to 2^53), the
/// result converted to `out`'s dtype.
fn via_f64(a: &Tensor, b: &Tensor, out: &mut Tensor, f: impl Fn(f64, f64) -> f64 + Sync) -> Result<()> {
    let dims = out.dims().to_vec();
    let (fa, fb) = (Tensor::from_f64(DType::F64, a.dims(), &a.to_f64_vec())?, Tensor::from_f64(DType::F64, b.dims(), &b.to_f64_vec())?);
    let mut tmp = Tensor::try_zeros(DType::F64, &dims)?;
    map2(&fa, &fb, &mut tmp, f)?;
    *out = Tensor::from_f64(out.dtype(), &dims, tmp.as_slice::<f64>()?)?;
    Ok(())
}

/// Whether the integer tensor `t` holds a zero.
fn has_zero(t: &Tensor) -> Result<bool> {
    Ok(match t.dtype() {
        DType::I64 => t.as_slice::<i64>()?.contains(&0),
        DType::I32 => t.as_slice::<i32>()?.contains(&0),
        _ => t.to_f64_vec().contains(&0.0),
    })
}

/// A `float`-class step (output dtype = input dtype): `f32`/`f64` natively, f16/bf16
/// through f64, integers through `int` on i64 (i64 and i32 natively, others through f64).
#[inline]
pub(super) fn same_dtype(
    kind: BinaryKind,
    a: &Tensor,
    b: &Tensor,
    out: &mut Tensor,
    f32f: impl Fn(f32, f32) -> f32 + Sync,
    f64f: impl Fn(f64, f64) -> f64 + Sync,
    int: impl Fn(i64, i64) -> i64 + Sync,
) -> Result<()> {
    let d = a.dtype();
    if kind.nonzero_divisor() && d.is_int() && has_zero(b)? {
        return Err(OpError::invalid("integer division by zero"));
    }
    match d {
        DType::F32 => map2(a, b, out, f32f),
        DType::F64 => map2(a, b, out, f64f),
        DType::I64 => map2(a, b, out, int),
        DType::I32 => map2(a, b, out, |x: i32, y: i32| int(x as i64, y as i64) as i32),
        d if d.is_int() => via_f64(a, b, out, |x, y| int(x as i64, y as i64) as f64),
        _ => via_f64(a, b, out, f64f),
    }
}

/// A `cmp`-class step (bool output), the predicate compiled per element type.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn compare(
    a: &Tensor,
    b: &Tensor,
    out: &mut Tensor,
    f32f: impl Fn(f32, f32) -> bool + Sync,
    f64f: impl Fn(f64, f64) -> bool + Sync,
    i64f: impl Fn(i64, i64) -> bool + Sync,
    i32f: impl Fn(i32, i32) -> bool + Sync,
    u8f: impl Fn(u8, u8) -> bool + Sync,
) -> Result<()> {
    match a.dtype() {
        DType::F32 => map2(a, b, out, |x: f32, y: f32| f32f(x, y) as u8),
        DType::F64 => map2(a, b, out, |x: f64, y: f64| f64f(x, y) as u8),
        DType::I64 => map2(a, b, out, |x: i64, y: i64| i64f(x, y) as u8),
        DType::I32 => map2(a, b, out, |x: i32, y: i32| i32f(x, y) as u8),
        // Masks: bool in, bool out, byte by byte.
        DType::Bool | DType::U8 => map2(a, b, out, |x: u8, y: u8| u8f(x, y) as u8),
        _ => via_f64(a, b, out, |x, y| f64f(x, y) as u8 as f64),
    }
}

/// A `bool`-class step: bool in, bool out, byte by byte (And/Or/Xor of attention masks).
#[inline]
pub(super) fn logic(a: &Tensor, b: &Tensor, out: &mut Tensor, f: impl Fn(bool, bool) -> bool + Sync) -> Result<()> {
    match a.dtype() {
        DType::Bool => map2(a, b, out, |x: u8, y: u8| f(x != 0, y != 0) as u8),
        _ => via_f64(a, b, out, |x, y| f(x != 0.0, y != 0.0) as u8 as f64),
    }
}

impl CpuKernel for Binary {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let kind = self.kind;
        let out = &mut outputs[0];
        let n = inputs.len();
        if n == 0 || (!kind.variadic() && n != 2) {
            return Err(OpError::invalid(format!("{} takes {} inputs, got {n}", self.name(), if kind.variadic() { "1 or more" } else { "2" })));
        }
        if kind == BinaryKind::Equal && n == 2 && cpu::input(inputs, 0)?.dtype() == DType::String {
            return super::equal_string::run(cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, out);
        }
        let first = cpu::input(inputs, 0)?;
        if n == 1 {
            // Variadic op of one input: a copy (Mean of one is itself).
            *out = first.clone().reshaped(out.dims())?;
            return Ok(());
        }
        // The running result of a variadic op's first inputs (never a copy of input 0:
        // cloning a tensor of the plan's arena copies it).
        let mut partial: Option<Tensor> = None;
        for i in 1..n {
            let acc = partial.as_ref().unwrap_or(first);
            let b = cpu::input(inputs, i)?;
            let converted;
            let b = if kind.mixed_rhs() && b.dtype() != acc.dtype() {
                converted = Tensor::from_f64(acc.dtype(), b.dims(), &b.to_f64_vec())?;
                &converted
            } else {
                b
            };
            if i + 1 == n {
                kind.step(acc, b, out)?;
            } else {
                let dims = broadcast_shapes(&[acc.dims(), b.dims()])?;
                let mut tmp = Tensor::try_zeros(out.dtype(), &dims)?;
                kind.step(acc, b, &mut tmp)?;
                partial = Some(tmp);
            }
        }
        if kind.averages() {
            let d = out.dims().to_vec();
            let v: Vec<f64> = out.to_f64_vec().into_iter().map(|x| x / n as f64).collect();
            *out = Tensor::from_f64(out.dtype(), &d, &v)?;
        }
        Ok(())
    }
}

impl WgslKernel for Binary {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// f16 operands stored as halves are computed on in f32.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let out = &outputs[0];
        if required(inputs, 0)?.dtype() == DType::String {
            return Err(OpError::Unsupported("string tensors stay on the host".into()));
        }
        let in_ty = wgsl::elem(required(inputs, 0)?.dtype());
        if halves.any() && in_ty != "f32" {
            return Err(OpError::Unsupported(format!("halves for {} of {}", self.name(), required(inputs, 0)?.dtype())));
        }
        let out_ty = if halves.output(0) { "f16" } else { wgsl::elem(out.dtype) };
        let wg = tune.get(&wgsl::workgroup_param());
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("in{i}")).collect();
        let mut buffers = vec![];
        let mut helpers = String::new();
        let mut bindings = vec![];
        for (i, name) in names.iter().enumerate() {
            let a = required(inputs, i)?;
            buffers.push((name.as_str(), if halves.input(i) { "f16" } else { wgsl::elem(a.dtype()) }, true));
            bindings.push(Binding::Input(i));
            helpers += &wgsl::offset_fn(&format!("off{i}"), &out.dims, &broadcast_strides(a.dims(), &out.dims));
        }
        buffers.push(("out", out_ty, false));
        bindings.push(Binding::Output(0));
        helpers += self.kind.wgsl_helpers();
        let read = |i: usize| -> Result<String> {
            let a = required(inputs, i)?;
            let raw = format!("in{i}[off{i}(i)]");
            Ok(if wgsl::elem(a.dtype()) != in_ty || halves.input(i) { format!("{in_ty}({raw})") } else { raw })
        };
        let wide = matches!(out.dtype, DType::I64 | DType::U64);
        if let Some(overflow) = self.kind.wgsl_overflow().filter(|_| wide) {
            // 64-bit integers computed in 32 bits: a result that does not fit is reported.
            let status = bindings.len();
            bindings.push(Binding::Status);
            helpers += &wgsl::status_decl(status);
            let (op, check) = (overflow.op, if in_ty == "i32" { overflow.signed } else { overflow.unsigned });
            let mut body = format!("var acc = {};\n", read(0)?);
            for i in 1..inputs.len() {
                let b = read(i)?;
                body += &format!(
                    "    {{\n        let b = {b};\n        let r = acc {op} b;\n        if ({check}) {{ {} }}\n        acc = r;\n    }}\n",
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
        if self.kind.averages() {
            expr = format!("({expr} / {})", wgsl::literal(in_ty, inputs.len() as f64));
        }
        let body = format!("out[i] = {};", wgsl::store(&expr, "f32", halves.output(0)));
        let refs: Vec<(&str, &str, bool)> = buffers.iter().map(|(n, t, r)| (*n, *t, *r)).collect();
        let mut d = wgsl::simple_kernel(self.name(), out.len(), wg, &refs, bindings, &helpers, &body);
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

pub(crate) fn register(r: &mut Registry) {
    for kind in BinaryKind::ALL {
        r.register("", kind.op_name(), move |_| Ok(Box::new(Binary { kind })));
    }
}

#[cfg(test)]
#[path = "binary_tests.rs"]
mod tests;
