//! The auto-tuner: kernels declare their choices (`CpuKernel::params`,
//! `WgslKernel::params`), the tuner measures them on the real device, and plans use the
//! winners.
//!
//! - [`key`]: what a choice is keyed by (op, attributes, input types, device
//!   fingerprint, kernel version);
//! - [`db`]: the versioned, checksummed database files;
//! - [`choices`]: a session's lookups (artifact, then measured, then database, then
//!   defaults) and its untuned keys;
//! - [`measure`], [`cpu_bench`], [`gpu_bench`], [`tuner`]: timing variants, checking
//!   them against the default, and the descent over parameters;
//! - [`in_model`]: which CPU choices also pay inside the whole model;
//! - [`report`]: what tuning reports.
mod choices;
mod cpu_bench;
pub mod db;
mod gpu_bench;
mod hash;
mod in_model;
mod key;
mod measure;
mod report;
mod step;
mod tuner;

pub use choices::{ChoiceSource, Tuning, TuningDatabase};
pub use db::{TuneEntry, DB_FORMAT};
pub use hash::hex as content_hash;
pub use key::{DeviceFingerprint, TuneKey};
pub use measure::same_outputs;
pub use report::{values_text, KeyReport, KeyStatus, TuneOptions, TuneProgress, TuneReport};
pub use tuner::TIE;

pub(crate) use choices::Choices;
pub(crate) use in_model::losing_choices;
pub(crate) use step::{cpu_key, gpu_key};
pub(crate) use tuner::{tune_steps, StepDevice};
