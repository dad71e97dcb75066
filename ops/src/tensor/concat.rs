//! Concat: joins any number of inputs along `axis` (inputs may be empty along it).
//! String tensors join on the CPU (the runtime keeps them off GPUs).
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Concat {
    axis: i64,
}

impl Concat {
    /// Output type and the normalised axis.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(TensorType, usize)> {
        let first = required(inputs, 0)?;
        let axis = norm_axis(self.axis, first.rank())?;
        let mut dims = first.dims().to_vec();
        dims[axis] = 0;
        for i in 0..inputs.len() {
            let a = required(inputs, i)?;
            let same = a.rank() == first.rank()
                && a.dims().iter().zip(first.dims()).enumerate().all(|(d, (x, y))| d == axis || x == y);
            if !same || a.dtype() != first.dtype() {
                return Err(OpError::input(
                    i,
                    format!(
                        "{} cannot be concatenated on axis {axis} with input 0's {}",
                        a.ty, first.ty
                    ),
                ));
            }
            dims[axis] += a.dims()[axis];
        }
        Ok((TensorType::new(first.dtype(), dims), axis))
    }
}

impl Op for Concat {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Concat"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if inputs.is_empty() {
            return Err(OpError::invalid("Concat needs at least one input"));
        }
        Ok(vec![self.plan(inputs)?.0])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn handles_strings(&self) -> bool {
        true
    }
}

/// Concat of string tensors: `chunks[i]` elements of input `i` per outer row.
fn concat_strings(xs: &[&Tensor], out: &mut Tensor, axis: usize) -> Result<()> {
    let inner: usize = out.dims()[axis + 1..].iter().product();
    let chunks: Vec<usize> = xs.iter().map(|x| x.dims().get(axis).copied().unwrap_or(0) * inner).collect();
    let row: usize = chunks.iter().sum();
    let rows = if row == 0 { 0 } else { out.len() / row };
    let mut v = Vec::with_capacity(out.len());
    for r in 0..rows {
        for (x, &c) in xs.iter().zip(&chunks) {
            let part = x.as_strings()?.get(r * c..(r + 1) * c).ok_or_else(|| OpError::invalid("Concat: input sizes do not match the output"))?;
            v.extend_from_slice(part);
        }
    }
    *out = Tensor::from_strings(out.dims(), v)?;
    Ok(())
}

impl CpuKernel for Concat {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let xs: Vec<&Tensor> = (0..inputs.len()).map(|i| cpu::input(inputs, i)).collect::<Result<_>>()?;
        let out = &mut outputs[0];
        let axis = norm_axis(self.axis, out.rank())?;
        if out.dtype().is_string() {
            return concat_strings(&xs, out, axis);
        }
        let elem = out.dtype().size();
        let inner: usize = out.dims()[axis + 1..].iter().product::<usize>() * elem;
        // bytes each input contributes to one outer row
        let chunks: Vec<usize> = xs.iter().map(|x| x.dims().get(axis).copied().unwrap_or(0) * inner).collect();
        let row: usize = chunks.iter().sum();
        if row == 0 || out.is_empty() {
            return Ok(());
        }
        let dst = out.bytes_mut();
        if !dst.len().is_multiple_of(row) || xs.iter().zip(&chunks).any(|(x, c)| x.bytes().len() != c * (dst.len() / row)) {
            return Err(OpError::invalid("Concat: input sizes do not match the output"));
        }
        cpu::par_chunks_mut(dst, row, 1, |r0, part| {
            for (r, out_row) in part.chunks_mut(row).enumerate() {
                let mut o = 0;
                for (x, &c) in xs.iter().zip(&chunks) {
                    let s = (r0 + r) * c;
                    out_row[o..o + c].copy_from_slice(&x.bytes()[s..s + c]);
                    o += c;
                }
            }
        });
        Ok(())
    }
}

impl WgslKernel for Concat {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (out, axis) = self.plan(inputs)?;
        if out.dtype.is_string() {
            return Err(OpError::Unsupported("string tensors stay on the host".into()));
        }
        let ty = wgsl::elem(out.dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let inner: usize = out.dims[axis + 1..].iter().product();
        let out_row = out.dims[axis] * inner;
        let mut dispatches = vec![];
        let mut offset = 0;
        for i in 0..inputs.len() {
            let a = required(inputs, i)?;
            let row = a.dims()[axis] * inner;
            if !a.ty.is_empty() {
                let body = format!("dst[(i / {row}u) * {out_row}u + {offset}u + i % {row}u] = src[i];");
                let d: Dispatch = wgsl::simple_kernel(
                    &format!("Concat[{i}]"),
                    a.ty.len(),
                    wg,
                    &[("src", ty, true), ("dst", ty, false)],
                    vec![Binding::Input(i), Binding::Output(0)],
                    "",
                    &body,
                );
                dispatches.push(d);
            }
            offset += row;
        }
        let _ = outputs;
        Ok(WgslProgram { dispatches, scratch_bytes: vec![] })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Concat", |spec| {
        let axis = match spec.int_opt("axis")? {
            Some(a) => a,
            None if spec.opset < 4 => 1,
            None => return Err(spec.bad("axis", "required")),
        };
        Ok(Box::new(Concat { axis }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn concat_axes_dtypes_and_empty() {
        let a = iota_f32(&[2, 3, 2]);
        let b = f32s(&[2, 1, 2], &[100., 101., 102., 103.]);
        let e = f32s(&[2, 0, 2], &[]);
        let op = make("Concat", 13, &[("axis", Attr::Int(-2))], 3, 1).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&a), Some(&e), Some(&b)], &[]), &[]).unwrap();
        assert_eq!(out[0].dims(), &[2, 4, 2]);
        assert_eq!(out[0].to_f64_vec(), vec![0., 1., 2., 3., 4., 5., 100., 101., 6., 7., 8., 9., 10., 11., 102., 103.]);
        let op0 = make("Concat", 13, &[("axis", Attr::Int(0))], 2, 1).unwrap();
        let (x, y) = (i64s(&[1], &[3]), i64s(&[2], &[-1, 5]));
        assert_eq!(run(op0.as_ref(), &as_inputs(&[Some(&x), Some(&y)], &[]), &[]).unwrap()[0], i64s(&[3], &[3, -1, 5]));
        let (p, q) = (Tensor::from_bools(&[1, 2], &[true, false]).unwrap(), Tensor::from_bools(&[1, 2], &[false, true]).unwrap());
        let op1 = make("Concat", 13, &[("axis", Attr::Int(1))], 2, 1).unwrap();
        assert_eq!(run(op1.as_ref(), &as_inputs(&[Some(&p), Some(&q)], &[]), &[]).unwrap()[0].bytes(), &[1, 0, 0, 1]);
        let op2 = make("Concat", 13, &[("axis", Attr::Int(2))], 2, 1).unwrap();
        let err = run(op2.as_ref(), &as_inputs(&[Some(&a), Some(&b)], &[]), &[]).unwrap_err().to_string();
        assert!(err.contains("cannot be concatenated"), "{err}");
        let op5 = make("Concat", 13, &[("axis", Attr::Int(5))], 1, 1).unwrap();
        assert!(run(op5.as_ref(), &as_inputs(&[Some(&a)], &[]), &[]).unwrap_err().to_string().contains("out of range"));
        let (s, t) = (strs(&[2, 1], &["a", "b"]), strs(&[2, 2], &["c", "d", "e", ""]));
        let got = run(op1.as_ref(), &as_inputs(&[Some(&s), Some(&t)], &[]), &[]).unwrap();
        assert_eq!((got[0].dims(), got[0].as_strings().unwrap()), (&[2usize, 3][..], &["a", "c", "d", "b", "e", ""].map(String::from)[..]));
        assert!(run(op1.as_ref(), &as_inputs(&[Some(&s), Some(&p)], &[]), &[]).is_err());
    }
}
