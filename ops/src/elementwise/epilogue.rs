//! Epilogues fused into a producer (Conv, Gemm, MatMul) by the graph compiler: the one
//! home of the node attributes that carry them (bias, residual, activation), and the
//! activation's WGSL and CPU application.
use super::unary::UnaryKind;
use crate::{NodeSpec, Result};
use kiln_graph::{DType, Tensor};

/// The attributes that carry an activation fused into a producer's epilogue.
pub const ACTIVATION_ATTR: &str = "kiln_activation";
pub const ACTIVATION_PARAMS_ATTR: &str = "kiln_activation_params";
/// The attribute that marks a MatMul whose input 2 is a fused bias vector.
pub const BIAS_ATTR: &str = "kiln_bias";
/// The attribute that marks a MatMul or Conv whose input 3 is a fused residual.
pub const RESIDUAL_ATTR: &str = "kiln_residual";

/// The fused epilogue activation of a node (Conv, Gemm, MatMul), if the graph compiler
/// put one there.
pub fn fused_activation(spec: &NodeSpec) -> Result<Option<UnaryKind>> {
    let Some(name) = spec.string_opt(ACTIVATION_ATTR)? else { return Ok(None) };
    let params = spec.floats_opt(ACTIVATION_PARAMS_ATTR)?.unwrap_or_default();
    match UnaryKind::from_name_params(&name, &params) {
        Some(k) if k.is_activation() => Ok(Some(k)),
        _ => Err(spec.bad(ACTIVATION_ATTR, format!("'{name}' with parameters {params:?} is not a fusible activation"))),
    }
}

/// WGSL functions `kiln_act(x: f32) -> f32` and `kiln_act4(v: vec4<f32>)` applying a
/// fused activation (the identity when there is none).
pub fn activation_wgsl(act: Option<UnaryKind>) -> String {
    let body = act.map_or_else(|| "x".to_string(), |k| k.wgsl_expr("x", "f32"));
    let helpers = act.map(|k| k.wgsl_helpers()).unwrap_or_default();
    format!(
        "{helpers}fn kiln_act(x: f32) -> f32 {{ return {body}; }}\n\
         fn kiln_act4(v: vec4<f32>) -> vec4<f32> {{ return vec4<f32>(kiln_act(v.x), kiln_act(v.y), kiln_act(v.z), kiln_act(v.w)); }}\n"
    )
}

/// Applies an optional fused activation to a tensor in place (f32 fast, others via f64).
pub fn apply_activation(act: Option<UnaryKind>, t: &mut Tensor) -> Result<()> {
    let Some(k) = act else { return Ok(()) };
    if t.dtype() == DType::F32 {
        let xs = t.as_mut_slice::<f32>()?;
        crate::cpu::par_chunks_mut(xs, 1, 4, |_, part| k.apply_slice_f32_fast(part));
    } else {
        let d = t.dims().to_vec();
        let v: Vec<f64> = t.to_f64_vec().into_iter().map(|x| k.apply_f64(x)).collect();
        *t = Tensor::from_f64(t.dtype(), &d, &v)?;
    }
    Ok(())
}
