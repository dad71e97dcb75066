//! MatMulInteger: `(A - a_zero_point) x (B - b_zero_point)` of int8/uint8 matrices into
//! int32, exactly, with MatMul's broadcasting. A zero point is a scalar, per row of A
//! (`[M]` for a 2-D A, else `[..., M, 1]`) or per column of B (`[N]` or `[..., 1, N]`).
use super::matmul::plan;
use crate::broadcast::broadcast_strides;
use super::qmatmul_packed::{self, PackedIntMatMul};
use crate::cpu::{self, CpuKernel, SharedPtr};
use crate::linalg::int8_kernel::CH;
use crate::op::{expect_dtype, required};
use super::product::BatchedProduct;
use super::qproduct_wgsl::{strided_raw, Buffer, IntOperand, IntProduct};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

const DTYPES: [DType; 2] = [DType::I8, DType::U8];

#[derive(Debug, Clone, PartialEq)]
pub struct MatMulInteger;

/// Operand dims as matrices (a 1-D A is one row, a 1-D B one column).
pub(super) fn full(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let a = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    (a, b)
}

/// Zero point (or scale) dims, input `zi`, as they broadcast against operand `x` (A's
/// when `of_a`: a per-row `[M]` of a 2-D A stands for `[M, 1]`), checked.
pub(super) fn zero_point_dims(zi: usize, of_a: bool, z: &[usize], x: &[usize]) -> Result<Vec<usize>> {
    let dims = if of_a && z.len() == 1 && x.len() == 2 && z[0] != 1 { vec![z[0], 1] } else { z.to_vec() };
    let n: usize = dims.iter().product();
    let r = x.len();
    let ok = n == 1
        || (dims.len() <= r
            && dims.iter().rev().zip(x.iter().rev()).enumerate().all(|(i, (&d, &xd))| {
                // The per-row/per-column axis matches; K (the other matrix axis) is 1.
                let k_axis = if of_a { 0 } else { 1 };
                if i == k_axis { d == 1 } else { d == xd || d == 1 }
            }));
    if !ok {
        let what = if of_a { "a scalar, [M] or [..., M, 1]" } else { "a scalar, [N] or [..., 1, N]" };
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
                zero_point_dims(zi, zi == 2, z.dims(), x)?;
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

/// Operand `x` minus its zero point `z` (input index `zi`), as i32.
fn shifted(x: &Tensor, z: Option<&Tensor>, zi: usize, of_a: bool, dims: &[usize]) -> Result<Vec<i32>> {
    let xv = x.to_i64_vec()?;
    let Some(z) = z else {
        return Ok(xv.into_iter().map(|v| v as i32).collect());
    };
    let zd = zero_point_dims(zi, of_a, z.dims(), dims)?;
    let zv = z.to_i64_vec()?;
    let mut out = vec![0i32; xv.len()];
    crate::broadcast::for_each_offset(dims, &[broadcast_strides(&zd, dims)], |o, offs| out[o] = (xv[o] - zv[offs[0]]) as i32);
    Ok(out)
}

/// The operands of an integer product: A and B with their zero points (each `None`
/// when absent) and the input indices the zero points have (for errors).
pub(super) struct IntOperands<'a> {
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub za: Option<&'a Tensor>,
    pub zb: Option<&'a Tensor>,
    pub za_input: usize,
    pub zb_input: usize,
}

/// `(A - za) x (B - zb)` into `y` (int32, the output's shape), exact.
pub(super) fn int_product(ops: &IntOperands, y: &mut [i32]) -> Result<()> {
    let (ad, bd) = (ops.a.dims().to_vec(), ops.b.dims().to_vec());
    let (fa, fb) = full(&ad, &bd);
    let (p, _) = plan(&ad, &bd)?;
    let a = shifted(ops.a, ops.za, ops.za_input, true, &fa)?;
    let b = shifted(ops.b, ops.zb, ops.zb_input, false, &fb)?;
    let (m, n, k) = (p.m, p.n, p.k);
    if m * n == 0 {
        return Ok(());
    }
    // Rows of the output in parallel; each row sums k rows of B scaled by A's values
    // (the inner loop runs along B's rows: it vectorises).
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

impl CpuKernel for MatMulInteger {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let ops = IntOperands { a: cpu::input(inputs, 0)?, b: cpu::input(inputs, 1)?, za: opt(2), zb: opt(3), za_input: 2, zb_input: 3 };
        int_product(&ops, outputs[0].as_mut_slice::<i32>()?)
    }

    /// The instruction set of the packed integer kernel ([`PackedIntMatMul`]).
    fn params(&self, inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        qmatmul_packed::params(packable(inputs, 3))
    }

    /// Packs a constant 2-D B (with constant zero points) once for the fast kernel.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        let Some((da, b, zb)) = packable(inputs, 3) else { return Ok(None) };
        Ok(Some(Box::new(PackedMatMulInteger { packed: PackedIntMatMul::new(da, b, false, &zb, tune)? })))
    }
}

/// A's dtype, B and its zero points (input `zb_input`), when B (input 1) is a constant
/// matrix whose zero points are constant (one, or one per column) and A has at least
/// one dim.
pub(super) fn packable<'a>(inputs: &[Option<Arg<'a>>], zb_input: usize) -> Option<(DType, &'a Tensor, Vec<i32>)> {
    let (a, b) = (inputs.first().copied().flatten()?, inputs.get(1).copied().flatten()?);
    let zb = match inputs.get(zb_input).copied().flatten() {
        Some(z) if z.ty.len() == 1 || z.dims() == [b.dims().get(1).copied().unwrap_or(0)] => crate::quant::qlinear::ints(z.value?).ok()?,
        Some(_) => return None,
        None => vec![0],
    };
    (b.dims().len() == 2 && !a.dims().is_empty()).then_some((a.dtype(), b.value?, zb))
}

/// MatMulInteger with B packed once per plan: A's rows (every leading dim flattened)
/// through [`PackedIntMatMul`]; A's zero point must be one value (a per-row one runs
/// the general product).
struct PackedMatMulInteger {
    packed: PackedIntMatMul,
}

impl CpuKernel for PackedMatMulInteger {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let a = cpu::input(inputs, 0)?;
        let za = match inputs.get(2).copied().flatten() {
            None => 0,
            Some(z) if z.len() == 1 => crate::quant::qlinear::zero_point(inputs, 2)?,
            Some(_) => return MatMulInteger.run(inputs, outputs),
        };
        let n = self.packed.n();
        let rows = a.len() / a.dims().last().copied().unwrap_or(1).max(1);
        let y = &mut outputs[0];
        if y.len() != rows * n {
            return Err(OpError::invalid(format!("output of {} elements for {rows} rows of {n}", y.len())));
        }
        let out = SharedPtr(y.as_mut_slice::<i32>()?.as_mut_ptr());
        self.packed.run(a.bytes(), rows, za, |r0, count, c0, cols, c| {
            for j in 0..count {
                for l in 0..cols {
                    // SAFETY: element (r0 + j, c0 + l) belongs to this tile alone.
                    unsafe { *out.get().add((r0 + j) * n + c0 + l) = c[j * CH + l] };
                }
            }
        })
    }
}

/// The WGSL integer product ([`IntProduct`]): the exact int32 sum `s` of output `i`,
/// then `epilogue` stores it. Inputs `a`, `b` and zero points `za`/`zb` (input indices,
/// `None` when absent); `extra` buffers (name, input index, and for a per-row or
/// per-column tensor whether it is A's) are bound after them, each shaped one with a
/// function `{name}_at(i)` giving its element for output `i`.
#[allow(clippy::too_many_arguments)]
pub(super) fn int_product_wgsl(
    label: &str,
    inputs: &[Option<Arg>],
    [ai, bi]: [usize; 2],
    [za_i, zb_i]: [Option<usize>; 2],
    extra: &[(&'static str, usize, Option<bool>)],
    out: &TensorType,
    epilogue: &str,
    tune: &TuneValues,
) -> Result<WgslProgram> {
    let (a, b) = (required(inputs, ai)?, required(inputs, bi)?);
    let (fa, fb) = full(a.dims(), b.dims());
    let (p, _) = plan(a.dims(), b.dims())?;
    // Output [batch..., m, n]: where each per-row or per-column tensor's element is.
    let mut dims = p.batch.clone();
    dims.extend([p.m, p.n]);
    let mut helpers = crate::quant::qlinear::WGSL_REQUANTIZE.to_string();
    let mut buffers: Vec<Buffer> = vec![];
    let mut per = |name: &str, zi: usize, operand: &[usize], of_a: bool| -> Result<()> {
        let z = required(inputs, zi)?;
        let zd = zero_point_dims(zi, of_a, z.dims(), operand)?;
        let mut padded = vec![1; dims.len().saturating_sub(zd.len())];
        padded.extend(&zd);
        helpers += &wgsl::offset_fn(&format!("{name}_at"), &dims, &broadcast_strides(&padded, &dims));
        Ok(())
    };
    let mut zero = |zi: Option<usize>, operand: &[usize], name: &'static str, of_a: bool| -> Result<String> {
        let Some(zi) = zi.filter(|&i| inputs.get(i).copied().flatten().is_some()) else { return Ok("0i".into()) };
        per(name, zi, operand, of_a)?;
        buffers.push((name.into(), wgsl::elem(required(inputs, zi)?.dtype()), Binding::Input(zi)));
        Ok(format!("i32({name}[{name}_at(i)])"))
    };
    let za = zero(za_i, &fa, "za", true)?;
    let zb = zero(zb_i, &fb, "zb", false)?;
    for &(name, input, shape) in extra {
        if let Some(of_a) = shape {
            per(name, input, if of_a { &fa } else { &fb }, of_a)?;
        }
        buffers.push((name.into(), wgsl::elem(required(inputs, input)?.dtype()), Binding::Input(input)));
    }
    buffers.push(("y".into(), wgsl::elem(out.dtype), Binding::Output(0)));
    let product = IntProduct {
        label,
        batch: p.batch_count(),
        m: p.m,
        n: p.n,
        k: p.k,
        a: strided_operand("a", ai, a.dtype(), &p, true, za),
        b: strided_operand("b", bi, b.dtype(), &p, false, zb),
        buffers,
        helpers,
        prelude: String::new(),
        epilogue: epilogue.to_string(),
        scratch: 0,
    };
    let (dispatches, scratch_bytes) = product.program(tune.get(&wgsl::workgroup_param()))?;
    Ok(WgslProgram { dispatches, scratch_bytes })
}

/// Operand A (`of_a`) or B of product `p`, read from input `input` (bound as `name`)
/// through its layout and batch strides.
pub(super) fn strided_operand(name: &str, input: usize, dtype: DType, p: &BatchedProduct, of_a: bool, zero: String) -> IntOperand {
    let (layout, strides, rows) = if of_a { (p.a, &p.a_batch_strides, p.m) } else { (p.b, &p.b_batch_strides, p.n) };
    // A's rows run along its row stride; B's "rows" (the packed columns) along its column stride.
    let (rs, ks) = if of_a { (layout.rs, layout.cs) } else { (layout.cs, layout.rs) };
    let (batches, batch_of) = IntOperand::batching(p.batch_count(), strides);
    IntOperand {
        rows,
        batches,
        batch_of,
        buffers: vec![(name.into(), wgsl::elem(dtype), Binding::Input(input))],
        helpers: wgsl::offset_fn(&format!("{name}_batch"), &p.batch, strides) + &strided_raw(name, rs, ks),
        signed: dtype == DType::I8,
        zero,
    }
}

impl WgslKernel for MatMulInteger {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        int_product_wgsl("MatMulInteger", inputs, [0, 1], [Some(2), Some(3)], &[], &outputs[0], "y[i] = s;", tune)
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

    /// With a constant B, every CPU variant (the general product, B packed for each
    /// instruction set, the portable quads layout) gives the same int32 sums: batched
    /// and 1-D A, shapes off the tile, per-column and scalar zero points, a per-row A
    /// zero point (the packed kernel hands it back to the general product).
    #[test]
    fn packed_variants_equal_the_general_product() {
        let mut seed = 5u64;
        let mut bytes = |dtype: DType, dims: &[usize]| {
            let n: usize = dims.iter().product();
            let v: Vec<u8> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            Tensor::from_bytes(dtype, dims, &v).unwrap()
        };
        let u8s = |v: &[f64]| Tensor::from_f64(DType::U8, &[v.len()], v).unwrap();
        let i8s = |v: &[f64]| Tensor::from_f64(DType::I8, &[v.len()], v).unwrap();
        for (n, (a_dims, (k, cols), da, za, zb)) in [
            (vec![2, 5, 37], (37, 21), DType::U8, Some(u8s(&[131.])), Some(i8s(&(0..21).map(|i| (i % 5) as f64 - 2.).collect::<Vec<_>>()))),
            (vec![37], (37, 40), DType::U8, Some(u8s(&[7.])), None),
            (vec![7, 64], (64, 16), DType::I8, Some(i8s(&[-3.])), Some(i8s(&[2.]))),
            (vec![3, 9], (9, 33), DType::U8, Some(u8s(&[1., 200., 3.])), None),
        ]
        .into_iter()
        .enumerate()
        {
            let a = bytes(da, &a_dims);
            let b = bytes(DType::I8, &[k, cols]);
            let zb = zb.unwrap_or_else(|| i8s(&[0.]));
            let za = za.unwrap();
            let za = if za.len() > 1 { Tensor::from_f64(DType::U8, &[za.len()], &za.to_f64_vec()).unwrap() } else { Tensor::from_f64(da, &[], &za.to_f64_vec()).unwrap() };
            let op = make("MatMulInteger", 10, &[], 4, 1).unwrap();
            let variants = run_cpu_variants(op.as_ref(), &as_inputs(&[Some(&a), Some(&b), Some(&za), Some(&zb)], &[1, 3])).unwrap();
            assert!(variants.iter().any(|(name, _)| name.starts_with("isa=")), "case {n}: no packed variant");
            for (name, outs) in &variants[1..] {
                assert_eq!(outs[0].to_f64_vec(), variants[0].1[0].to_f64_vec(), "case {n}: variant {name}");
            }
        }
    }
}
