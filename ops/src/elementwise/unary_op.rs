//! The unary elementwise op: one type runs every kind of the table in [`super::unary`]
//! (inference, CPU kernel with the AVX2 slice path, WGSL kernel), Clip's bounds from
//! attributes or inputs, attribute parsing and registration.
use super::unary::{clip_expr, UnaryKind, KINDS};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

impl UnaryKind {
    /// The f32 function (f64 too, through [`UnaryKind::apply_f64`]).
    pub fn apply_f32(self, x: f32) -> f32 {
        self.apply_f64(x as f64) as f32
    }

    /// [`Self::apply_slice_f32`] compiled for AVX-512 or AVX2 + FMA when the CPU has
    /// them (16 or 8 lanes instead of SSE's 4): what kernels call on their outputs.
    pub fn apply_slice_f32_fast(&self, xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx512() {
            // SAFETY: the CPU has AVX-512 F/BW/VL/DQ, AVX2 and FMA (checked just above).
            unsafe { self.apply_slice_avx512(xs) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { self.apply_slice_avx2(xs) };
            return;
        }
        self.apply_slice_unswitched(xs)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn apply_slice_avx2(&self, xs: &mut [f32]) {
        self.apply_slice_unswitched(xs)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
    unsafe fn apply_slice_avx512(&self, xs: &mut [f32]) {
        self.apply_slice_unswitched(xs)
    }

    /// [`UnaryKind::apply_slice_f32`] with the kinds whose attributes choose between
    /// formulas (Gelu's `tanh`) given as constants, so that the choice leaves the loop.
    #[inline(always)]
    fn apply_slice_unswitched(&self, xs: &mut [f32]) {
        match *self {
            UnaryKind::Gelu { tanh: true } => UnaryKind::Gelu { tanh: true }.apply_slice_f32(xs),
            UnaryKind::Gelu { tanh: false } => UnaryKind::Gelu { tanh: false }.apply_slice_f32(xs),
            k => k.apply_slice_f32(xs),
        }
    }
}

/// A unary elementwise op application.
#[derive(Debug)]
pub struct Unary {
    pub kind: UnaryKind,
}

impl Unary {
    /// Clip's bounds for this run: attributes, or constant/run-time inputs 1 and 2.
    fn clip_bounds(&self, min_in: Option<&Tensor>, max_in: Option<&Tensor>) -> Result<UnaryKind> {
        let UnaryKind::Clip { mut min, mut max } = self.kind else { return Ok(self.kind) };
        for (i, t, slot) in [(1, min_in, &mut min), (2, max_in, &mut max)] {
            if let Some(t) = t {
                if t.len() != 1 {
                    return Err(OpError::input(i, format!("Clip bound must be a scalar, got shape {:?}", t.dims())));
                }
                *slot = t.to_f64_vec()[0] as f32;
            }
        }
        Ok(UnaryKind::Clip { min, max })
    }
}

impl Op for Unary {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        self.kind.op_name()
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, self.kind.dtypes())?;
        let max_inputs = if matches!(self.kind, UnaryKind::Clip { .. }) { 3 } else { 1 };
        if inputs.len() > max_inputs {
            return Err(OpError::invalid(format!("{} takes at most {max_inputs} input(s), got {}", self.name(), inputs.len())));
        }
        for (i, a) in inputs.iter().enumerate().skip(1) {
            if let Some(a) = a {
                if a.dtype() != dtype {
                    return Err(OpError::input(i, format!("dtype {} differs from input 0's {dtype}", a.dtype())));
                }
            }
        }
        Ok(vec![TensorType::new(dtype, required(inputs, 0)?.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Unary {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let kind = self.clip_bounds(inputs.get(1).copied().flatten(), inputs.get(2).copied().flatten())?;
        let out = &mut outputs[0];
        match x.dtype() {
            DType::F32 => {
                let src = x.as_slice::<f32>()?;
                let dst = out.as_mut_slice::<f32>()?;
                cpu::par_chunks_mut(dst, 1, 8, |start, part| {
                    part.copy_from_slice(&src[start..start + part.len()]);
                    kind.apply_slice_f32_fast(part);
                });
            }
            d if d.is_float() => {
                let v: Vec<f64> = x.to_f64_vec().into_iter().map(|v| kind.apply_f64(v)).collect();
                *out = Tensor::from_f64(d, x.dims(), &v)?;
            }
            d => {
                let v: Vec<i64> = x.to_i64_vec()?.into_iter().map(|v| kind.apply_i64(v)).collect();
                *out = crate::tensor::from_i64(d, x.dims(), &v)?;
            }
        }
        Ok(())
    }
}

impl WgslKernel for Unary {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &wgsl::Halves::default())
    }

    fn half_storage(&self) -> wgsl::HalfStorage {
        wgsl::HalfStorage::Each
    }

    /// f16 operands stored as halves are computed on in f32.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &wgsl::Halves) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        if halves.any() && ty != "f32" {
            return Err(OpError::Unsupported(format!("halves for {} of {}", self.name(), outputs[0].dtype)));
        }
        let stored = |half: bool| if half { "f16" } else { ty };
        let wg = tune.get(&wgsl::workgroup_param());
        let mut buffers = vec![("x", stored(halves.input(0)), true)];
        let mut bindings = vec![Binding::Input(0)];
        let mut prelude = String::new();
        if let UnaryKind::Clip { min, max } = self.kind {
            // Bounds: baked when constant, read from their buffers otherwise.
            for (i, name, default) in [(1usize, "clip_lo", min), (2, "clip_hi", max)] {
                match inputs.get(i).copied().flatten() {
                    Some(Arg { value: Some(t), .. }) => {
                        let v = t.to_f64_vec().first().copied().unwrap_or(default as f64);
                        prelude += &format!("let {name} = {};\n    ", wgsl::literal(ty, v));
                    }
                    Some(_) => {
                        let buf = if i == 1 { "lo_buf" } else { "hi_buf" };
                        buffers.push((buf, stored(halves.input(i)), true));
                        bindings.push(Binding::Input(i));
                        prelude += &format!("let {name} = {};\n    ", wgsl::load(&format!("{buf}[0]"), ty, halves.input(i)));
                    }
                    None => {
                        let v = if ty == "f32" { default as f64 } else if i == 1 { f64::MIN } else { f64::MAX };
                        prelude += &format!("let {name} = {};\n    ", wgsl::literal(ty, v));
                    }
                }
            }
        }
        buffers.push(("y", stored(halves.output(0)), false));
        bindings.push(Binding::Output(0));
        let expr = match self.kind {
            UnaryKind::Clip { .. } => clip_expr("x", "clip_lo", "clip_hi", ty),
            k => k.wgsl_expr("x", ty),
        };
        let body = format!("{prelude}let x = {};\n    y[i] = {};", wgsl::load("x[i]", ty, halves.input(0)), wgsl::store(&expr, ty, halves.output(0)));
        let helpers = self.kind.wgsl_helpers();
        let mut d = wgsl::simple_kernel(self.name(), outputs[0].len(), wg, &buffers, bindings, helpers, &body);
        d.source = wgsl::with_halves(d.source, halves.any());
        Ok(WgslProgram::single(d))
    }
}

/// The kind of a unary node (attributes parsed; Clip's input bounds are not read).
pub fn unary_kind_of(spec: &NodeSpec) -> Result<Option<UnaryKind>> {
    let Some(kind) = KINDS.iter().find(|k| k.op_name() == spec.node.op_type) else { return Ok(None) };
    Ok(Some(parse(spec, *kind)?))
}

/// `kind` with its attributes read from the node.
pub(super) fn parse(spec: &NodeSpec, kind: UnaryKind) -> Result<UnaryKind> {
    kind.parse_attrs(spec)
}

pub(crate) fn register(r: &mut Registry) {
    for &kind in KINDS {
        r.register("", kind.op_name(), move |spec| Ok(Box::new(Unary { kind: parse(spec, kind)? })));
    }
}

#[cfg(test)]
#[path = "unary_tests.rs"]
mod tests;
