//! MatMulInteger: `(A - a_zero_point) x (B - b_zero_point)` of int8/uint8 matrices into
//! int32, exactly, with MatMul's broadcasting. A zero point is a scalar, per row of A
//! (`[M]` for a 2-D A, else `[..., M, 1]`) or per column of B (`[N]` or `[..., 1, N]`).
use super::matmul::plan;
use crate::broadcast::broadcast_strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const DTYPES: [DType; 2] = [DType::I8, DType::U8];

#[derive(Debug, Clone, PartialEq)]
pub struct MatMulInteger;

/// Operand dims as matrices (a 1-D A is one row, a 1-D B one column).
fn full(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let a = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    (a, b)
}

/// Zero point `zi`'s dims as they broadcast against its operand `x` (a per-row `[M]`
/// of a 2-D A stands for `[M, 1]`), checked.
fn zero_point_dims(zi: usize, z: &[usize], x: &[usize]) -> Result<Vec<usize>> {
    let dims = if zi == 2 && z.len() == 1 && x.len() == 2 && z[0] != 1 { vec![z[0], 1] } else { z.to_vec() };
    let n: usize = dims.iter().product();
    let r = x.len();
    let ok = n == 1
        || (dims.len() <= r
            && dims.iter().rev().zip(x.iter().rev()).enumerate().all(|(i, (&d, &xd))| {
                // The per-row/per-column axis matches; K (the other matrix axis) is 1.
                let k_axis = if zi == 2 { 0 } else { 1 };
                if i == k_axis { d == 1 } else { d == xd || d == 1 }
            }));
    if !ok {
        let what = if zi == 2 { "a scalar, [M] or [..., M, 1]" } else { "a scalar, [N] or [..., 1, N]" };
        return Err(OpError::input(zi, format!("zero point of shape {z:?} does not fit operand {x:?}: expected {what}")));
    }
    Ok(dims)
}

impl Op for MatMulInteger {
    fn name(&self) -> &str {
        "MatMulInteger"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let da = expect_dtype(inputs, 0, &DTYPES)?;
        let db = expect_dtype(inputs, 1, &DTYPES)?;
        let (a, b) = (required(inputs, 0)?.dims(), required(inputs, 1)?.dims());
        let (fa, fb) = full(a, b);
        for (zi, d, x) in [(2, da, &fa), (3, db, &fb)] {
            if let Some(z) = inputs.get(zi).copied().flatten() {
                if z.dtype() != d {
                    return Err(OpError::input(zi, format!("zero point dtype {} differs from its operand's {d}", z.dtype())));
                }
                zero_point_dims(zi, z.dims(), x)?;
            }
        }
        let (_, dims) = plan(a, b)?;
        Ok(vec![TensorType::new(DType::I32, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// Operand `i` minus its zero point, as i32.
fn shifted(inputs: &[Option<&Tensor>], i: usize, dims: &[usize]) -> Result<Vec<i32>> {
    let x = cpu::input(inputs, i)?.to_i64_vec()?;
    let Some(z) = inputs.get(i + 2).copied().flatten() else {
        return Ok(x.into_iter().map(|v| v as i32).collect());
    };
    let zd = zero_point_dims(i + 2, z.dims(), dims)?;
    let zv = z.to_i64_vec()?;
    let mut out = vec![0i32; x.len()];
    crate::broadcast::for_each_offset(dims, &[broadcast_strides(&zd, dims)], |o, offs| out[o] = (x[o] - zv[offs[0]]) as i32);
    Ok(out)
}

impl CpuKernel for MatMulInteger {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (ad, bd) = (cpu::input(inputs, 0)?.dims().to_vec(), cpu::input(inputs, 1)?.dims().to_vec());
        let (fa, fb) = full(&ad, &bd);
        let (p, _) = plan(&ad, &bd)?;
        let (a, b) = (shifted(inputs, 0, &fa)?, shifted(inputs, 1, &fb)?);
        let (m, n, k) = (p.m, p.n, p.k);
        let y = outputs[0].as_mut_slice::<i32>()?;
        if m * n == 0 {
            return Ok(());
        }
        // Rows of the output in parallel; each row sums k rows of B scaled by A's
        // values (the inner loop runs along B's rows: it vectorises).
        cpu::par_chunks_mut(y, n, 2 * k, |first, rows| {
            for (r, row) in rows.chunks_mut(n).enumerate() {
                let (bi, i) = ((first + r) / m, (first + r) % m);
                let (oa, ob) = p.offsets(bi);
                row.fill(0);
                for kk in 0..k {
                    let av = a[oa + i * k + kk];
                    if av == 0 {
                        continue;
                    }
                    for (o, &bv) in row.iter_mut().zip(&b[ob + kk * n..ob + (kk + 1) * n]) {
                        *o = o.wrapping_add(av.wrapping_mul(bv));
                    }
                }
            }
        });
        Ok(())
    }
}

impl WgslKernel for MatMulInteger {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (ad, bd) = (required(inputs, 0)?.dims(), required(inputs, 1)?.dims());
        let (fa, fb) = full(ad, bd);
        let (p, _) = plan(ad, bd)?;
        let (m, n, k) = (p.m, p.n, p.k);
        if k > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("MatMulInteger with K = {k} on the GPU (at most {})", wgsl::MAX_LOOP_ITERATIONS)));
        }
        // Output [batch..., m, n]: where each operand's row or column starts.
        let mut out = p.batch.clone();
        out.extend([m, n]);
        let mut sa = p.a_batch_strides.clone();
        sa.extend([k, 0]);
        let mut sb = p.b_batch_strides.clone();
        sb.extend([0, 1]);
        let mut helpers = wgsl::offset_fn("a_at", &out, &sa) + &wgsl::offset_fn("b_at", &out, &sb);
        let mut buffers = vec![("a", wgsl::elem(required(inputs, 0)?.dtype()), true), ("b", wgsl::elem(required(inputs, 1)?.dtype()), true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
        let mut zero = |zi: usize, x: &[usize], name: &'static str| -> Result<String> {
            let Some(z) = inputs.get(zi).copied().flatten() else { return Ok("0".into()) };
            let zd = zero_point_dims(zi, z.dims(), x)?;
            let mut zd_out = vec![1; out.len().saturating_sub(zd.len())];
            zd_out.extend(&zd);
            let strides = broadcast_strides(&zd_out, &out);
            helpers += &wgsl::offset_fn(&format!("{name}_at"), &out, &strides);
            buffers.push((name, wgsl::elem(z.dtype()), true));
            bindings.push(Binding::Input(zi));
            Ok(format!("i32({name}[{name}_at(i)])"))
        };
        let za = zero(2, &fa, "za")?;
        let zb = zero(3, &fb, "zb")?;
        buffers.push(("y", "i32", false));
        bindings.push(Binding::Output(0));
        let body = format!(
            "let ab = a_at(i);\n    let bb = b_at(i);\n    let za = {za};\n    let zb = {zb};\n    var s = 0i;\n\
             \x20   for (var kk = 0u; kk < {k}u; kk++) {{ s += (i32(a[ab + kk]) - za) * (i32(b[bb + kk * {n}u]) - zb); }}\n    y[i] = s;"
        );
        Ok(WgslProgram::single(wgsl::simple_kernel("MatMulInteger", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MatMulInteger", |_| Ok(Box::new(MatMulInteger)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{DType, Tensor};

    #[test]
    fn zero_points_per_tensor_row_and_column() {
        let op = make("MatMulInteger", 10, &[], 4, 1).unwrap();
        // A [2, 3] uint8 with per-row zero points, B [3, 2] int8 with per-column ones.
        let a = Tensor::from_f64(DType::U8, &[2, 3], &[1., 2., 3., 250., 0., 7.]).unwrap();
        let b = Tensor::from_f64(DType::I8, &[3, 2], &[-128., 1., 127., 2., 0., -3.]).unwrap();
        let za = Tensor::from_f64(DType::U8, &[2], &[1., 7.]).unwrap();
        let zb = Tensor::from_f64(DType::I8, &[2], &[0., -1.]).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&a), Some(&b), Some(&za), Some(&zb)], &[]), &[]).unwrap().remove(0);
        // A - za = [[0, 1, 2], [243, -7, 0]]; B - zb = [[-128, 2], [127, 3], [0, -2]].
        assert_eq!(y.dtype(), DType::I32);
        assert_eq!(y.to_f64_vec(), vec![127., -1., -31993., 465.]);
        // Batched A against a shared B, no zero points.
        let op = make("MatMulInteger", 10, &[], 2, 1).unwrap();
        let a = Tensor::from_f64(DType::I8, &[2, 1, 2], &[1., -1., 3., 4.]).unwrap();
        let b = Tensor::from_f64(DType::I8, &[2, 1], &[5., 6.]).unwrap();
        let y = run(op.as_ref(), &as_inputs(&[Some(&a), Some(&b)], &[]), &[]).unwrap().remove(0);
        assert_eq!((y.dims().to_vec(), y.to_f64_vec()), (vec![2, 1, 1], vec![-1., 39.]));
    }
}
