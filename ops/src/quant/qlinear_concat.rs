//! QLinearConcat (com.microsoft, attribute `axis`): inputs `Y_scale, Y_zero_point`, then
//! one triple `(X, X_scale, X_zero_point)` per tensor; 8-bit tensors requantized to Y's
//! scale and zero point and concatenated. As onnxruntime does it: each input through a
//! lookup table of its values dequantized and quantized again in f32
//! ([`qlinear::lookup_table`] with the identity; an input with Y's own parameters comes
//! out unchanged either way).
use super::qlinear::{self, check_scalar, QParams, MS_DOMAIN, Q8, SCALE};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, norm_axis, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub(super) struct QLinearConcat {
    axis: i64,
}

/// How each input lands in the output: `outer` blocks of `inner` elements per input,
/// at `offset` within each output block of `out_inner`.
struct Layout {
    outer: usize,
    out_inner: usize,
    /// Per input: (inner, offset).
    parts: Vec<(usize, usize)>,
}

impl QLinearConcat {
    fn count(inputs: usize) -> Result<usize> {
        if inputs < 5 || !(inputs - 2).is_multiple_of(3) {
            return Err(OpError::invalid(format!("expected Y_scale, Y_zero_point and then (X, X_scale, X_zero_point) triples, got {inputs} inputs")));
        }
        Ok((inputs - 2) / 3)
    }

    fn layout(&self, dims: &[&[usize]]) -> Result<(Layout, Vec<usize>)> {
        let first = dims[0];
        let axis = norm_axis(self.axis, first.len())?;
        let mut out = first.to_vec();
        out[axis] = 0;
        for (j, d) in dims.iter().enumerate() {
            let same = d.len() == first.len() && d.iter().zip(first).enumerate().all(|(k, (a, b))| k == axis || a == b);
            if !same {
                return Err(OpError::input(2 + 3 * j, format!("shape {d:?} differs from the first input's {first:?} outside axis {axis}")));
            }
            out[axis] += d[axis];
        }
        let rest: usize = first[axis + 1..].iter().product();
        let mut offset = 0;
        let parts = dims
            .iter()
            .map(|d| {
                let part = (d[axis] * rest, offset);
                offset += d[axis] * rest;
                part
            })
            .collect();
        Ok((Layout { outer: first[..axis].iter().product(), out_inner: out[axis] * rest, parts }, out))
    }
}

impl crate::Op for QLinearConcat {
    fn name(&self) -> &str {
        "QLinearConcat"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let n = Self::count(inputs.len())?;
        check_scalar(inputs, 0, &SCALE, false)?;
        let d = expect_dtype(inputs, 1, &Q8)?;
        check_scalar(inputs, 1, &[d], false)?;
        let mut dims = vec![];
        for j in 0..n {
            let x = 2 + 3 * j;
            let t = required(inputs, x)?;
            if t.dtype() != d {
                return Err(OpError::input(x, format!("dtype {} differs from Y_zero_point's {d}", t.dtype())));
            }
            check_scalar(inputs, x + 1, &SCALE, false)?;
            check_scalar(inputs, x + 2, &[d], false)?;
            dims.push(t.dims());
        }
        Ok(vec![TensorType::new(d, self.layout(&dims)?.1)])
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

impl CpuKernel for QLinearConcat {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let n = Self::count(inputs.len())?;
        let yq = QParams::of(inputs, 0, 1)?;
        let xs: Vec<&Tensor> = (0..n).map(|j| cpu::input(inputs, 2 + 3 * j)).collect::<Result<_>>()?;
        let dims: Vec<&[usize]> = xs.iter().map(|t| t.dims()).collect();
        let (l, _) = self.layout(&dims)?;
        let out = &mut outputs[0];
        let d = out.dtype();
        let mut y = vec![0i32; out.len()];
        for (j, x) in xs.iter().enumerate() {
            let table = qlinear::lookup_table(d, QParams::of(inputs, 3 + 3 * j, 4 + 3 * j)?, yq, |v| v);
            let (inner, offset) = l.parts[j];
            let src = x.bytes();
            for o in 0..l.outer {
                let dst = &mut y[o * l.out_inner + offset..][..inner];
                dst.iter_mut().zip(&src[o * inner..]).for_each(|(t, &b)| *t = table[b as usize]);
            }
        }
        qlinear::write_ints(out, &y)
    }
}

impl WgslKernel for QLinearConcat {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let n = Self::count(inputs.len())?;
        let dims: Vec<&[usize]> = (0..n).map(|j| required(inputs, 2 + 3 * j).map(|a| a.dims())).collect::<Result<_>>()?;
        let (l, _) = self.layout(&dims)?;
        let d = outputs[0].dtype;
        let (oe, (lo, hi)) = (wgsl::elem(d), qlinear::bounds(d));
        let mut program = WgslProgram::default();
        // One dispatch per input, each writing its slabs of the output.
        for (j, &(inner, offset)) in l.parts.iter().enumerate() {
            let count = l.outer * inner;
            if count == 0 {
                continue;
            }
            let x = 2 + 3 * j;
            let mut decl = vec![("x".to_string(), oe, true)];
            let mut bindings = vec![Binding::Input(x)];
            let (helpers, value) = match (QParams::constant(inputs, x + 1, x + 2), QParams::constant(inputs, 0, 1)) {
                (Some(xq), Some(yq)) => (qlinear::wgsl_table("LUT", &qlinear::lookup_table(d, xq, yq, |v| v)), format!("LUT[{}]", qlinear::wgsl_byte(d, "x[i]"))),
                _ => {
                    let mut p = qlinear::WgslParams::new();
                    let (sx, zx) = (p.scale(inputs, x + 1, "sx")?, p.zero_point(inputs, x + 2, "zx")?);
                    let (sy, zy) = (p.scale(inputs, 0, "sy")?, p.zero_point(inputs, 1, "zy")?);
                    for (name, i, ty) in p.buffers {
                        decl.push((name, ty, true));
                        bindings.push(Binding::Input(i));
                    }
                    (qlinear::WGSL_REQUANTIZE.to_string(), format!("q_requantize(q_div({sx} * f32(i32(x[i]) - {zx}), {sy}), {zy}, {lo}i, {hi}i)"))
                }
            };
            decl.push(("y".into(), oe, false));
            bindings.push(Binding::Output(0));
            let decl: Vec<(&str, &str, bool)> = decl.iter().map(|(nm, t, r)| (nm.as_str(), *t, *r)).collect();
            let body = format!("y[(i / {inner}u) * {}u + {offset}u + i % {inner}u] = {oe}({value});", l.out_inner);
            program.dispatches.push(wgsl::simple_kernel("QLinearConcat", count, tune.get(&wgsl::workgroup_param()), &decl, bindings, &helpers, &body));
        }
        Ok(program)
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearConcat", |spec| {
        let axis = spec.int_opt("axis")?.ok_or_else(|| spec.bad("axis", "is required"))?;
        Ok(Box::new(QLinearConcat { axis }))
    });
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::Attr;

    /// onnxruntime 1.32's outputs for the same inputs.
    #[test]
    fn matches_onnxruntime() {
        // uint8 along axis 1; the first and the last input share Y's scale and zero point.
        let c = ms("QLinearConcat").attr("axis", Attr::Int(1)).constant(f(0.06)).constant(u8s(&[], &[120]));
        let c = c.input(u8s(&[2, 1, 3], &[34, 32, 204, 127, 151, 153])).constant(f(0.05)).constant(u8s(&[], &[128]));
        let c = c.input(u8s(&[2, 2, 3], &[182, 7, 124, 37, 102, 237, 140, 18, 138, 33, 193, 242])).constant(f(0.06)).constant(u8s(&[], &[120]));
        let c = c.input(u8s(&[2, 1, 3], &[250, 159, 222, 94, 37, 130])).input(f(0.2)).input(u8s(&[], &[3]));
        let y = c.run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), [2, 4, 3]);
        assert_eq!(ints(&y), [42, 40, 183, 182, 7, 124, 37, 102, 237, 255, 255, 255, 119, 139, 141, 140, 18, 138, 33, 193, 242, 255, 233, 255]);
        // int8 along the last axis (-1), parameters known only at run time.
        let c = ms("QLinearConcat").attr("axis", Attr::Int(-1)).input(f(0.1)).input(i8s(&[], &[-3]));
        let c = c.input(i8s(&[4, 2], &[-15, 41, 126, -58, 91, -93, -39, 73])).input(f(0.07)).input(i8s(&[], &[10]));
        let c = c.input(i8s(&[4, 3], &[-65, 43, -11, 3, 112, 81, 86, 12, 123, 123, -94, -76])).input(f(0.3)).input(i8s(&[], &[-100]));
        let y = c.run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), [4, 5]);
        assert_eq!(ints(&y), [-21, 19, 102, 127, 127, 78, -51, 127, 127, 127, 54, -75, 127, 127, 127, -37, 41, 127, 15, 69]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let base = || ms("QLinearConcat").attr("axis", Attr::Int(0)).constant(f(0.1)).constant(u8s(&[], &[0]));
        // Shapes differ outside the axis.
        let c = base().input(u8s(&[1, 2], &[1, 2])).constant(f(0.1)).constant(u8s(&[], &[0])).input(u8s(&[1, 3], &[1, 2, 3])).constant(f(0.1)).constant(u8s(&[], &[0]));
        assert!(c.run_cpu().unwrap_err().to_string().contains("differs from the first input"));
        // A missing zero point of a triple.
        let c = base().input(u8s(&[1, 2], &[1, 2])).constant(f(0.1));
        assert!(c.run_cpu().unwrap_err().to_string().contains("triples"));
        // int8 data with a uint8 Y.
        let c = base().input(i8s(&[1], &[1])).constant(f(0.1)).constant(i8s(&[], &[0]));
        assert!(c.run_cpu().unwrap_err().to_string().contains("input 2"));
    }
}
