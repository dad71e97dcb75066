//! Shared support of the runtime's integration tests: the cross-device runner
//! ([`Suite`], [`check`]: a [`Case`] on the CPU and every GPU adapter against an f64
//! reference, with per-device expected failures), the device list, and the op test
//! builder and data helpers of `kiln_ops::testing`, re-exported.
#![allow(dead_code, unused_imports)]
mod devices;
mod expected;
mod runner;

pub use devices::{devices, gpu_env, TestDevice};
pub use expected::{Expected, EXPECTED_FAILURES, NO_F64_REFERENCE};
pub use kiln_ops::testing::*;
pub use runner::{check, Suite};

use kiln_graph::Tensor;

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    got.rel_l2_error(want)
}
