//! kiln-runtime: runs graphs on devices. A [`Session`] holds a graph, its ops and a
//! device (the CPU backend, or a GPU through wgpu); each distinct set of input shapes
//! is specialised once (types inferred, shape computations folded on the host, kernels
//! generated, buffers allocated) and cached, so later runs only execute.
//!
//! Depends on kiln-graph and kiln-ops, wgpu and naga; never on the compiler or on
//! protobuf, so that applications that run models link this crate alone.
//! Invariant: only this crate links wgpu.

mod arena;
mod bodies;
mod calibrate;
mod carried;
pub mod artifact;
pub mod cpu;
mod device;
mod error;
pub mod file;
mod gpu;
pub mod npy;
pub mod npz;
mod placement;
mod plan;
mod schedule;
mod session;
pub mod threads;
pub mod tune;

pub use arena::MemoryPlan;
pub use device::{AdapterInfo, CpuInfo, DeviceChoice, DeviceKind, DevicesReport};
pub use gpu::{device_kind, list_devices};
pub use error::{Result, RuntimeError};
pub use gpu::{KernelRecord, PipelineCacheData};
pub use calibrate::calibrate;
pub use carried::Carried;
pub use placement::{DeviceProfile, PlacementRule};
pub use session::{NodeProfile, NodeReport, RunStats, RunTrace, Session, SessionOptions, TraceSlice, MAX_FLOAT_VALUE_INPUT, MAX_VALUE_INPUT};
pub use tune::{TuneOptions, TuneReport, Tuning, TuningDatabase};
pub use kiln_ops::infer::{Limits, Specialized, Step, SymbolicShapes};
