//! Helpers shared by the tensor ops: reading constant integer inputs, a plain-copy
//! kernel (for views), WGSL constant tables.
use crate::cpu::{self, CpuKernel};
use crate::op::constant;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, OpError, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

/// The constant integer input `i` as i64 values (shape, axes, pads, starts, ...).
pub(crate) fn const_ints(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<Vec<i64>> {
    let t = constant(inputs, i, what)?;
    if !t.dtype().is_int() {
        return Err(OpError::input(i, format!("{what} must be an integer tensor, found {}", t.dtype())));
    }
    Ok(t.to_i64_vec()?)
}

/// Optional constant integer input `i` (None when omitted).
pub(crate) fn opt_const_ints(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    match inputs.get(i).copied().flatten() {
        None => Ok(None),
        Some(_) => const_ints(inputs, i, what).map(Some),
    }
}

/// Calls `f` with `inputs` seen as [`Arg`]s whose values are all known (at run time
/// every input is concrete), so a CPU kernel can reuse the op's planning code.
pub(crate) fn tensor_args<R>(inputs: &[Option<&Tensor>], f: impl FnOnce(&[Option<Arg>]) -> R) -> R {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
    let args: Vec<Option<Arg>> =
        inputs.iter().zip(&types).map(|(t, ty)| ty.as_ref().map(|ty| Arg { ty, value: *t })).collect();
    f(&args)
}

/// Normalises a list of possibly negative axes against `rank`, rejecting duplicates.
pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = crate::norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError::invalid(format!("axis {a} is repeated in axes {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// Copies input 0 to output 0 unchanged (bytes), whatever the dims say: the kernel of
/// view ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
pub(crate) struct CopyKernel;

impl CpuKernel for CopyKernel {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let out = &mut outputs[0];
        if x.bytes().len() != out.bytes().len() {
            return Err(OpError::invalid(format!(
                "copy of {}{:?} into {}{:?}: sizes differ",
                x.dtype(),
                x.dims(),
                out.dtype(),
                out.dims()
            )));
        }
        *out = x.reshaped(out.dims())?;
        Ok(())
    }
}

impl WgslKernel for CopyKernel {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "copy",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            "dst[i] = src[i];",
        )))
    }
}

pub(crate) static COPY: CopyKernel = CopyKernel;

/// A module-scope WGSL constant array `name` holding `values` (stored as u32 bit
/// patterns, since WGSL constant expressions cannot bitcast) and a function
/// `fn name_at(k: u32) -> ty` reading element k in element type `ty` (f32/i32/u32).
pub(crate) fn baked_array(name: &str, ty: &str, values: &[f64]) -> String {
    let bits: Vec<String> = values
        .iter()
        .map(|&v| {
            let b = match ty {
                "f32" => (v as f32).to_bits(),
                "i32" => v.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32,
                _ => v.clamp(0.0, u32::MAX as f64) as u32,
            };
            format!("{b}u")
        })
        .collect();
    let body = if bits.is_empty() { "0u".to_string() } else { bits.join(", ") };
    format!(
        "const {name} = array<u32, {n}>({body});\nfn {name}_at(k: u32) -> {ty} {{ return bitcast<{ty}>({name}[k]); }}\n",
        n = values.len().max(1)
    )
}
