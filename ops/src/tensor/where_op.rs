//! Where: `cond ? x : y` elementwise with numpy broadcasting of all three inputs.
use crate::broadcast::{broadcast_shapes, broadcast_strides, RowWalk};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use bytemuck::Pod;
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct Where;

impl Op for Where {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Where"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (c, x, y) = (required(inputs, 0)?, required(inputs, 1)?, required(inputs, 2)?);
        if c.dtype() != DType::Bool {
            return Err(OpError::input(0, format!("condition must be bool, found {}", c.dtype())));
        }
        if x.dtype() != y.dtype() {
            return Err(OpError::input(2, format!("dtype {} differs from input 1's {}", y.dtype(), x.dtype())));
        }
        Ok(vec![TensorType::new(x.dtype(), broadcast_shapes(&[c.dims(), x.dims(), y.dims()])?)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

fn select<T: Pod + Send + Sync>(c: &Tensor, x: &Tensor, y: &Tensor, out: &mut Tensor) {
    let dims = out.dims().to_vec();
    let (cv, xv, yv): (&[u8], &[T], &[T]) = (c.bytes(), bytemuck::cast_slice(x.bytes()), bytemuck::cast_slice(y.bytes()));
    let dst: &mut [T] = bytemuck::cast_slice_mut(out.bytes_mut());
    if c.dims() == dims.as_slice() && x.dims() == dims.as_slice() && y.dims() == dims.as_slice() {
        cpu::par_chunks_mut(dst, 1, 1, |s, part| {
            for (k, o) in part.iter_mut().enumerate() {
                *o = if cv[s + k] != 0 { xv[s + k] } else { yv[s + k] };
            }
        });
        return;
    }
    // A row of the merged dims at a time (an attention mask: a bool plane choosing
    // between two scalars is one row): loops per stride pattern that vectorize.
    let walk = RowWalk::new(&dims, &[broadcast_strides(c.dims(), &dims), broadcast_strides(x.dims(), &dims), broadcast_strides(y.dims(), &dims)]);
    let n = walk.n;
    let [sc, sx, sy] = [walk.inner[0], walk.inner[1], walk.inner[2]];
    cpu::par_chunks_mut(dst, n, 1, |r0, part| {
        walk.rows(r0, part.len() / n, |row, o| {
            let orow = &mut part[row * n..(row + 1) * n];
            let (c, x, y) = (&cv[o[0]..], &xv[o[1]..], &yv[o[2]..]);
            match (sc, sx, sy) {
                (1, 0, 0) => orow.iter_mut().zip(&c[..n]).for_each(|(d, &c)| *d = if c != 0 { x[0] } else { y[0] }),
                (1, 1, 0) => orow.iter_mut().zip(c[..n].iter().zip(&x[..n])).for_each(|(d, (&c, &x))| *d = if c != 0 { x } else { y[0] }),
                (1, 0, 1) => orow.iter_mut().zip(c[..n].iter().zip(&y[..n])).for_each(|(d, (&c, &y))| *d = if c != 0 { x[0] } else { y }),
                (0, 1, 1) => orow.copy_from_slice(if c[0] != 0 { &x[..n] } else { &y[..n] }),
                _ => orow.iter_mut().enumerate().for_each(|(k, d)| *d = if c[k * sc] != 0 { x[k * sx] } else { y[k * sy] }),
            }
        });
    });
}

impl CpuKernel for Where {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (c, x, y) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?, cpu::input(inputs, 2)?);
        let out = &mut outputs[0];
        if out.dtype().is_string() {
            // Strings are not bytes: chosen per element and cloned.
            let dims = out.dims().to_vec();
            let st = [broadcast_strides(c.dims(), &dims), broadcast_strides(x.dims(), &dims), broadcast_strides(y.dims(), &dims)];
            let (cv, xv, yv) = (c.bytes(), x.as_strings()?, y.as_strings()?);
            let mut v = Vec::with_capacity(out.len());
            crate::broadcast::for_each_offset(&dims, &st, |_, o| v.push(if cv[o[0]] != 0 { xv[o[1]].clone() } else { yv[o[2]].clone() }));
            *out = Tensor::from_strings(&dims, v)?;
            return Ok(());
        }
        match out.dtype().size() {
            1 => select::<u8>(c, x, y, out),
            2 => select::<u16>(c, x, y, out),
            4 => select::<u32>(c, x, y, out),
            _ => select::<u64>(c, x, y, out),
        }
        Ok(())
    }
}

impl WgslKernel for Where {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let out = &outputs[0];
        let ty = wgsl::elem(out.dtype);
        let mut helpers = String::new();
        for (i, name) in ["off_c", "off_x", "off_y"].iter().enumerate() {
            helpers += &wgsl::offset_fn(name, &out.dims, &broadcast_strides(required(inputs, i)?.dims(), &out.dims));
        }
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Where",
            out.len(),
            tune.get(&wgsl::workgroup_param()),
            &[("cond", "u32", true), ("x", ty, true), ("y", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0)],
            &helpers,
            "dst[i] = select(y[off_y(i)], x[off_x(i)], cond[off_c(i)] != 0u);",
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Where", |_| Ok(Box::new(Where)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    #[test]
    fn where_broadcasts_any_dtype() {
        let op = make("Where", 16, &[], 3, 1).unwrap();
        let c = Tensor::from_bools(&[2, 1], &[true, false]).unwrap();
        let x = iota_f32(&[3]);
        let y = f32s(&[2, 3], &[10., 11., 12., 13., 14., 15.]);
        let out = run(op.as_ref(), &as_inputs(&[Some(&c), Some(&x), Some(&y)], &[]), &[]).unwrap();
        assert_eq!(out[0], f32s(&[2, 3], &[0., 1., 2., 13., 14., 15.]));
        let ci = Tensor::from_bools(&[5], &[true, false, false, true, true]).unwrap();
        let (xi, yi) = (iota_i64(&[5]), Tensor::scalar(-1i64));
        let out = run(op.as_ref(), &as_inputs(&[Some(&ci), Some(&xi), Some(&yi)], &[]), &[]).unwrap();
        assert_eq!(out[0], i64s(&[5], &[0, -1, -1, 3, 4]));
        let (xb, yb) = (Tensor::from_bools(&[5], &[true; 5]).unwrap(), Tensor::from_bools(&[1], &[false]).unwrap());
        let out = run(op.as_ref(), &as_inputs(&[Some(&ci), Some(&xb), Some(&yb)], &[]), &[]).unwrap();
        assert_eq!(out[0].bytes(), &[1, 0, 0, 1, 1]);
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&x), Some(&y)], &[]), &[]).unwrap_err().to_string().contains("bool"));
        assert!(run(op.as_ref(), &as_inputs(&[Some(&c), Some(&x), Some(&yi)], &[]), &[]).is_err());
        let (xs, ys) = (Tensor::from_strings(&[5], ["a", "b", "c", "d", "e"].map(String::from).to_vec()).unwrap(), Tensor::from_strings(&[], vec!["-".into()]).unwrap());
        let out = run(op.as_ref(), &as_inputs(&[Some(&ci), Some(&xs), Some(&ys)], &[]), &[]).unwrap();
        assert_eq!(out[0].as_strings().unwrap(), ["a", "-", "-", "d", "e"]);
    }

    /// Every stride pattern of the row walk against a per-element reference: a mask
    /// between scalars, one side broadcast, the condition broadcast, all mixed.
    #[test]
    fn where_rows_match_a_per_element_walk() {
        use crate::broadcast::{broadcast_shapes, broadcast_strides, for_each_offset};
        let shapes: [[&[usize]; 3]; 7] = [
            [&[1, 1, 4, 37], &[], &[1]],
            [&[2, 3, 37], &[2, 3, 37], &[1, 1, 1]],
            [&[2, 3, 37], &[], &[3, 37]],
            [&[2, 3, 1], &[1, 3, 37], &[2, 1, 37]],
            [&[3, 1], &[3, 37], &[37]],
            [&[5, 1, 2], &[1, 4, 1], &[5, 4, 2]],
            [&[64, 1, 300], &[1, 50, 300], &[]], // large enough for parallel chunks
        ];
        let op = make("Where", 16, &[], 3, 1).unwrap();
        for (k, [cd, xd, yd]) in shapes.into_iter().enumerate() {
            let n = |d: &[usize]| d.iter().product::<usize>();
            let cb: Vec<bool> = (0..n(cd)).map(|i| (i * 7 + k) % 3 == 0).collect();
            let c = Tensor::from_bools(cd, &cb).unwrap();
            let (x, y) = (rand_f32(xd, 80 + k as u64), rand_f32(yd, 90 + k as u64));
            let out = broadcast_shapes(&[cd, xd, yd]).unwrap();
            let (xv, yv) = (x.to_f64_vec(), y.to_f64_vec());
            let mut want = vec![0f64; n(&out)];
            let st = [broadcast_strides(cd, &out), broadcast_strides(xd, &out), broadcast_strides(yd, &out)];
            for_each_offset(&out, &st, |o, offs| want[o] = if cb[offs[0]] { xv[offs[1]] } else { yv[offs[2]] });
            let got = run(op.as_ref(), &as_inputs(&[Some(&c), Some(&x), Some(&y)], &[]), &[]).unwrap().remove(0);
            assert_eq!(got.dims(), out.as_slice(), "case {k}");
            assert_eq!(got.to_f64_vec(), want, "case {k}: c{cd:?} x{xd:?} y{yd:?}");
        }
    }
}
