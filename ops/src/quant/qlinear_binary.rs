//! The elementwise quantized binary ops of onnxruntime (QLinearAdd, QLinearMul):
//! inputs `A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point`
//! (scales and zero points per tensor, zero points optional), numpy broadcasting, the
//! output of A's dtype. The arithmetic of each op is in its own file
//! ([`super::qlinear_add`], [`super::qlinear_mul`]); this file broadcasts and runs it.
use super::qlinear_binary_cpu::{self as fast, Runs};
use super::qlinear::{self, bounds, check_scalar, check_zero_point, QParams, Q8, SCALE};
use crate::broadcast::{broadcast_shapes, broadcast_strides, for_each_offset_in};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// The per-tensor parameters of a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub a: QParams,
    pub b: QParams,
    pub c: QParams,
    pub bounds: (i32, i32),
    /// onnxruntime's broadcasting hands B to the kernel as one value per span (B is
    /// broadcast along the innermost output dim larger than 1): see [`b_is_span_scalar`].
    pub b_scalar: bool,
}

/// Whether onnxruntime's broadcasting loop calls its kernel with B as a scalar (which
/// changes the order of QLinearAdd's f32 additions): B has size 1, and A does not, in
/// the innermost output dim larger than 1.
pub(super) fn b_is_span_scalar(a: &[usize], b: &[usize], out: &[usize]) -> bool {
    let r = out.len();
    let dim = |x: &[usize], d: usize| if d + x.len() >= r { x[d + x.len() - r] } else { 1 };
    match (0..r).rev().find(|&d| out[d] > 1) {
        Some(d) => dim(b, d) == 1 && dim(a, d) != 1,
        None => false,
    }
}

/// One quantized binary op's arithmetic.
pub(super) trait Arith: Send + Sync + std::fmt::Debug + 'static {
    const NAME: &'static str;
    /// What the op derives from the parameters once per run (MLAS's scale ratios).
    type Consts: Copy + Send + Sync;
    fn consts(&self, p: &Params) -> Self::Consts;
    /// Output element for the integer inputs `a` and `b`.
    fn eval(&self, a: i32, b: i32, p: &Params, k: &Self::Consts) -> i32;
    /// The f32 value that `eval` rounds and saturates, by the same operations in the
    /// same order, for `p.b_scalar == B_SCALAR` (the fast CPU loop of
    /// [`super::qlinear_binary_cpu`] finishes it).
    fn unrounded<const B_SCALAR: bool>(&self, a: i32, b: i32, p: &Params, k: &Self::Consts) -> f32;
    /// The same in WGSL: an i32 expression of `a`, `b` (i32), the f32 scales `sa`, `sb`,
    /// `sc`, the i32 zero points `za`, `zb`, `zc` and the bounds `lo`, `hi` (the helpers
    /// of [`qlinear::WGSL_REQUANTIZE`] are declared), for a B that is `b_scalar`.
    fn wgsl(&self, b_scalar: bool) -> String;
}

#[derive(Debug)]
pub(super) struct QLinearBinary<A: Arith>(pub A);

impl<A: Arith> Op for QLinearBinary<A> {
    fn name(&self) -> &str {
        A::NAME
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = expect_dtype(inputs, 0, &Q8)?;
        let b = required(inputs, 3)?;
        if b.dtype() != d {
            return Err(OpError::input(3, format!("dtype {} differs from A's {d}", b.dtype())));
        }
        for s in [1, 4, 6] {
            check_scalar(inputs, s, &SCALE, false)?;
        }
        for z in [2, 5, 7] {
            check_zero_point(inputs, z, d)?;
        }
        let dims = broadcast_shapes(&[required(inputs, 0)?.dims(), b.dims()])?;
        Ok(vec![TensorType::new(d, dims)])
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

impl<A: Arith> CpuKernel for QLinearBinary<A> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (a, b) = (cpu::input(inputs, 0)?, cpu::input(inputs, 3)?);
        let out = &mut outputs[0];
        let p = Params { a: QParams::of(inputs, 1, 2)?, b: QParams::of(inputs, 4, 5)?, c: QParams::of(inputs, 6, 7)?, bounds: bounds(out.dtype()), b_scalar: false };
        let dims = out.dims().to_vec();
        let p = Params { b_scalar: b_is_span_scalar(a.dims(), b.dims(), &dims), ..p };
        let strides = [broadcast_strides(a.dims(), &dims), broadcast_strides(b.dims(), &dims)];
        let same = a.dtype() == out.dtype() && b.dtype() == out.dtype();
        match Runs::of(&dims, &strides[0], &strides[1]) {
            Some(runs) if same && out.dtype() == DType::U8 => {
                fast::run(&self.0, &p, &runs, a.as_slice::<u8>()?, b.as_slice::<u8>()?, out.as_mut_slice::<u8>()?);
                Ok(())
            }
            Some(runs) if same && out.dtype() == DType::I8 => {
                fast::run(&self.0, &p, &runs, a.as_slice::<i8>()?, b.as_slice::<i8>()?, out.as_mut_slice::<i8>()?);
                Ok(())
            }
            _ => self.run_general(&p, a, b, &strides, out),
        }
    }
}

impl<A: Arith> QLinearBinary<A> {
    /// Every element through [`Arith::eval`], walking the broadcast offsets one by one:
    /// the definition, for the broadcasts whose runs are short.
    pub(super) fn run_general(&self, p: &Params, a: &Tensor, b: &Tensor, strides: &[Vec<usize>; 2], out: &mut Tensor) -> Result<()> {
        let (av, bv) = (qlinear::ints(a)?, qlinear::ints(b)?);
        let dims = out.dims().to_vec();
        let k = self.0.consts(p);
        let mut y = vec![0i32; out.len()];
        cpu::par_chunks_mut(&mut y, 1, 4, |first, part| {
            for_each_offset_in(&dims, strides, first, first + part.len(), &mut |o, offs| part[o - first] = self.0.eval(av[offs[0]], bv[offs[1]], p, &k));
        });
        qlinear::write_ints(out, &y)
    }
}

impl<A: Arith> WgslKernel for QLinearBinary<A> {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let out = &outputs[0];
        let (a, b) = (required(inputs, 0)?, required(inputs, 3)?);
        let mut params = qlinear::WgslParams::new();
        let sa = params.scale(inputs, 1, "sa_in")?;
        let za = params.zero_point(inputs, 2, "za_in")?;
        let sb = params.scale(inputs, 4, "sb_in")?;
        let zb = params.zero_point(inputs, 5, "zb_in")?;
        let sc = params.scale(inputs, 6, "sc_in")?;
        let zc = params.zero_point(inputs, 7, "zc_in")?;
        let (lo, hi) = bounds(out.dtype);
        let mut buffers: Vec<(String, &str, bool)> = vec![("xa".into(), wgsl::elem(a.dtype()), true), ("xb".into(), wgsl::elem(b.dtype()), true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(3)];
        for (name, i, ty) in &params.buffers {
            buffers.push((name.clone(), ty, true));
            bindings.push(Binding::Input(*i));
        }
        buffers.push(("y".into(), wgsl::elem(out.dtype), false));
        bindings.push(Binding::Output(0));
        let decl: Vec<(&str, &str, bool)> = buffers.iter().map(|(n, t, r)| (n.as_str(), *t, *r)).collect();
        let helpers = format!(
            "{}{}{}",
            qlinear::WGSL_REQUANTIZE,
            wgsl::offset_fn("a_at", &out.dims, &broadcast_strides(a.dims(), &out.dims)),
            wgsl::offset_fn("b_at", &out.dims, &broadcast_strides(b.dims(), &out.dims))
        );
        let body = format!(
            "let sa = {sa}; let sb = {sb}; let sc = {sc};\n    let za = {za}; let zb = {zb}; let zc = {zc};\n    let lo = {lo}i; let hi = {hi}i;\n\
             \x20   let ra = q_div(sa, sc); let rb = q_div(sb, sc); let fixed = f32(zc) - (q_mul(ra, f32(za), i) + q_mul(rb, f32(zb), i));\n\
             \x20   let a = i32(xa[a_at(i)]); let b = i32(xb[b_at(i)]);\n    y[i] = {}({});",
            wgsl::elem(out.dtype),
            self.0.wgsl(b_is_span_scalar(a.dims(), b.dims(), &out.dims))
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(A::NAME, out.len(), tune.get(&wgsl::workgroup_param()), &decl, bindings, &helpers, &body)))
    }
}
