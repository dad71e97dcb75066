//! kiln-ops: the operator library. Each operator is defined once, as one type that
//! implements [`Op`]: attribute parsing (in its factory), shape/type inference, cost,
//! a CPU kernel ([`CpuKernel`]) and a WGSL kernel generator ([`WgslKernel`]) with its
//! tunable parameters. The [`Registry`] maps ONNX (domain, op type) to factories; custom
//! ops register into it the same way.
//!
//! Depends on kiln-graph only (plus numeric crates). It knows nothing of wgpu: WGSL is
//! generated as text, and the runtime compiles and dispatches it.

pub mod broadcast;
pub mod collective;
mod control;
pub use control::{with_body_runner, BodyRunner};
pub mod cpu;
pub mod custom;
mod error;
pub mod infer;
mod op;
mod registry;
mod spec;
pub mod wgsl;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub mod elementwise;
pub mod fused;
mod linalg;
#[cfg(test)]
mod malformed_tests;
mod ml;
mod nn;
mod quant;
mod reduce;
mod rnn;
mod sequence;
mod random;
mod signal;
mod tensor;
mod text;
mod training;

pub use cpu::CpuKernel;
pub use error::{OpError, Result};
pub use op::{constant, expect_dtype, norm_axis, required, Arg, Cost, ElementwiseFn, Op, Schedule, TensorType};
pub use registry::{canonical_domain, OpFactory, Registry};
pub use linalg::{BIAS_ATTR as MATMUL_BIAS_ATTR, RESIDUAL_ATTR as MATMUL_RESIDUAL_ATTR};
pub use nn::INPUT_BLOCKED_ATTR as CONV_INPUT_BLOCKED_ATTR;
pub use spec::NodeSpec;
pub use wgsl::{Binding, Dispatch, TuneParam, TuneValues, WgslKernel, WgslProgram};

/// A hash of this crate's sources (every `.rs` file under `src/`, FNV-1a 64 in hex,
/// computed by `build.rs`): the kernel version of CPU kernels in tuning keys, so that a
/// changed kernel never reuses a pick measured on an older one.
pub const SOURCE_HASH: &str = env!("KILN_SOURCE_HASH");
