//! Device choice and discovery: the CPU backend and the wgpu adapters of this machine.
use serde::Serialize;
use std::fmt;

/// Which device a session runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// A hardware GPU if there is one, else the CPU (never a software adapter).
    Auto,
    /// The CPU backend (native kernels).
    Cpu,
    /// The best GPU adapter, software ones (lavapipe) included.
    Gpu,
    /// The adapter whose name or backend contains this text (case-insensitive), or
    /// `gpu:N` for the N-th adapter of `kiln devices`.
    Adapter(String),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => DeviceChoice::Auto,
            "cpu" => DeviceChoice::Cpu,
            "gpu" => DeviceChoice::Gpu,
            "" => return Err("empty device name".into()),
            _ => DeviceChoice::Adapter(s.to_string()),
        })
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Gpu => f.write_str("gpu"),
            DeviceChoice::Adapter(s) => f.write_str(s),
        }
    }
}

/// The kind of device a session ended up on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

/// What `kiln devices` reports of one adapter.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterInfo {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
    pub software: bool,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub features: Vec<String>,
}

/// The devices of this machine.
#[derive(Clone, Debug, Serialize)]
pub struct DevicesReport {
    pub cpu: CpuInfo,
    pub adapters: Vec<AdapterInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CpuInfo {
    pub name: String,
    pub threads: usize,
    pub simd: Vec<String>,
}

/// This machine's CPU, as `kiln devices` reports it.
pub fn cpu_info() -> CpuInfo {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let simd = kiln_ops::cpu::CpuFeatures::get().names().into_iter().map(String::from).collect();
    CpuInfo { name, threads: rayon::current_num_threads(), simd }
}
