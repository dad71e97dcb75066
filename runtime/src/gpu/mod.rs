//! The wgpu backend: adapter discovery and selection, the device context (limits,
//! pipeline cache, WGSL validation), and the execution plan of a specialisation.
mod convert;
mod half;
mod plan;
mod resident;

pub(crate) use convert::{from_gpu, to_gpu};
pub(crate) use plan::{generate, GpuPlan, GpuTiming, WeightCache};
pub(crate) use resident::Resident;

use crate::error::poisoned;
use crate::{AdapterInfo, DeviceChoice, DeviceKind, DevicesReport, Result, RuntimeError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env()))
}

/// All adapters of every backend that can run compute shaders, in a stable order. Enumerated once per process:
/// enumerating the GL backend from several threads at once is not safe.
pub(crate) fn enumerate() -> Vec<wgpu::Adapter> {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS
        .get_or_init(|| {
            let mut v = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
            // An adapter that wgpu says has no compute shaders cannot run a kernel, so it
            // is not offered. (NVIDIA's headless EGL adapter passes this check with a GL
            // 3.3 context and fails when its device opens: `GpuUnavailable`.)
            v.retain(|a| {
                let ok = a.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS);
                if !ok {
                    let info = a.get_info();
                    log::info!("adapter {} ({:?}) skipped: it has no compute shaders", info.name, info.backend);
                }
                ok
            });
            v.sort_by_key(rank);
            v
        })
        .clone()
}

/// Lower is better: hardware before software, native APIs before GL.
fn rank(a: &wgpu::Adapter) -> (u8, u8) {
    let info = a.get_info();
    let t = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let b = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (t, b)
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
}

pub(crate) fn describe(index: usize, a: &wgpu::Adapter) -> AdapterInfo {
    let info = a.get_info();
    let l = a.limits();
    let f = a.features();
    let mut features = vec![];
    for (name, flag) in [
        ("shader-f16", wgpu::Features::SHADER_F16),
        ("shader-int64", wgpu::Features::SHADER_INT64),
        ("shader-f64", wgpu::Features::SHADER_F64),
        ("subgroup", wgpu::Features::SUBGROUP),
        ("timestamp-query", wgpu::Features::TIMESTAMP_QUERY),
        ("timestamp-query-inside-passes", wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
        ("pipeline-cache", wgpu::Features::PIPELINE_CACHE),
    ] {
        if f.contains(flag) {
            features.push(name.to_string());
        }
    }
    AdapterInfo {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        vendor: info.vendor,
        device: info.device,
        software: is_software(&info),
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size as u64,
        max_buffer_size: l.max_buffer_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
        features,
    }
}

/// The kind of device a session with this choice runs on (adapters are looked up
/// once per process); an error when the choice names a GPU that is not there.
pub fn device_kind(choice: &DeviceChoice) -> Result<DeviceKind> {
    Ok(match select(choice)? {
        Some(_) => DeviceKind::Gpu,
        None => DeviceKind::Cpu,
    })
}

/// Lists the CPU and every wgpu adapter.
pub fn list_devices() -> DevicesReport {
    let adapters = enumerate().iter().enumerate().map(|(i, a)| describe(i, a)).collect();
    DevicesReport { cpu: crate::device::cpu_info(), adapters }
}

/// Picks the adapter for a choice; `Ok(None)` means "use the CPU" (auto without a
/// hardware GPU).
pub(crate) fn select(choice: &DeviceChoice) -> Result<Option<wgpu::Adapter>> {
    if *choice == DeviceChoice::Cpu {
        return Ok(None);
    }
    let adapters = enumerate();
    let names = || {
        adapters
            .iter()
            .enumerate()
            .map(|(i, a)| format!("gpu:{i} {} ({:?})", a.get_info().name, a.get_info().backend))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Auto => Ok(adapters.into_iter().find(|a| !is_software(&a.get_info()))),
        DeviceChoice::Gpu => match adapters.into_iter().next() {
            Some(a) => Ok(Some(a)),
            None => Err(RuntimeError::NoGpu(
                "no GPU adapter was found (on Linux without a GPU, install Mesa's lavapipe: \
                 apt-get install -y mesa-vulkan-drivers libvulkan1)"
                    .into(),
            )),
        },
        DeviceChoice::Adapter(want) => {
            let w = want.to_ascii_lowercase();
            if let Some(i) = w.strip_prefix("gpu:").and_then(|n| n.parse::<usize>().ok()) {
                let listed = names();
                return adapters.into_iter().nth(i).map(Some).ok_or_else(|| {
                    RuntimeError::NoGpu(format!("there is no adapter gpu:{i}; adapters: [{listed}]"))
                });
            }
            let listed = names();
            adapters
                .into_iter()
                .find(|a| {
                    let i = a.get_info();
                    i.name.to_ascii_lowercase().contains(&w) || format!("{:?}", i.backend).to_ascii_lowercase() == w
                })
                .map(Some)
                .ok_or_else(|| RuntimeError::NoGpu(format!("no adapter matches '{want}'; adapters: [{listed}]")))
        }
    }
}

type PipelineKey = (String, String);

/// An open GPU device: queue, limits, and the pipelines compiled so far.
pub(crate) struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// SHADER_F16 is enabled: f16 graph inputs and outputs cross the bus as 2-byte
    /// halves and are converted by GPU kernels (`half.rs`); without it the host converts.
    /// f16 values between kernels that bind halves are stored as halves (`plan.rs`).
    pub f16: bool,
    /// TIMESTAMP_QUERY is enabled: the tuner times kernels with the GPU's timestamps.
    pub timestamps: bool,
    /// TIMESTAMP_QUERY_INSIDE_PASSES is enabled too: a profile stamps every dispatch
    /// inside the run's one pass (else it gives each dispatch a pass of its own).
    pub timestamps_inside_passes: bool,
    /// The driver's pipeline cache that new pipelines go through (PIPELINE_CACHE
    /// enabled, Vulkan): empty when the device opens, replaced by an artifact's stored
    /// cache when one for this adapter and driver is loaded.
    cache: Mutex<Option<wgpu::PipelineCache>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    error: Arc<Mutex<Option<String>>>,
}

pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// What it was built from (artifacts store these to prebuild pipelines).
    pub record: KernelRecord,
}

/// A generated WGSL kernel, as `.kiln` artifacts store it: enough to build its pipeline
/// again without the op that generated it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KernelRecord {
    pub label: String,
    pub source: String,
    pub entry: String,
    /// Per binding: read-only storage or not.
    pub read_only: Vec<bool>,
}

/// A GPU driver's pipeline cache (the compiled pipelines of some kernels, in the
/// driver's own format) and the identity of the adapter and driver that wrote it.
/// Only a device with the same key uses it; for any other it means nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineCacheData {
    /// [`wgpu::util::pipeline_cache_key`] (backend, vendor, device) with the driver's
    /// name and version.
    pub key: String,
    pub data: Vec<u8>,
}

/// The open device of an adapter, shared by every session on it (one device per
/// adapter, so pipelines compiled for one session serve the others).
pub(crate) fn context_for(adapter: wgpu::Adapter) -> Result<Arc<GpuContext>> {
    static OPEN: OnceLock<Mutex<Vec<(wgpu::Adapter, Arc<GpuContext>)>>> = OnceLock::new();
    let open = OPEN.get_or_init(Mutex::default);
    let mut open = open.lock().map_err(|_| poisoned())?;
    if let Some((_, ctx)) = open.iter().find(|(a, _)| *a == adapter) {
        return Ok(ctx.clone());
    }
    let ctx = Arc::new(GpuContext::new(adapter.clone())?);
    open.push((adapter, ctx.clone()));
    Ok(ctx)
}

impl GpuContext {
    fn new(adapter: wgpu::Adapter) -> Result<GpuContext> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16) && std::env::var_os("KILN_NO_F16").is_none();
        let caching = adapter.features().contains(wgpu::Features::PIPELINE_CACHE)
            && cache_key(&info).is_some()
            && std::env::var_os("KILN_NO_PIPELINE_CACHE").is_none();
        let timestamps = adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let mut features = wgpu::Features::empty();
        if timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let timestamps_inside_passes = timestamps && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
        if timestamps_inside_passes {
            features |= wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        }
        if f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if caching {
            features |= wgpu::Features::PIPELINE_CACHE;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| RuntimeError::GpuUnavailable(format!("cannot open {} ({:?}): {e}", info.name, info.backend)))?;
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("wgpu: {e}");
            if let Ok(mut s) = sink.lock() {
                s.get_or_insert_with(|| e.to_string());
            }
        }));
        log::info!(
            "GPU: {} ({:?}, {}){}{}",
            info.name,
            info.backend,
            info.driver,
            if f16 { ", shader-f16 enabled" } else { "" },
            if caching { ", pipeline cache enabled" } else { "" }
        );
        let cache = caching.then(|| new_cache(&device, None));
        Ok(GpuContext { device, queue, info, limits, f16, timestamps, timestamps_inside_passes, cache: Mutex::new(cache), pipelines: Mutex::default(), error })
    }

    /// The key a pipeline cache of this device carries (None without pipeline caching).
    pub fn cache_key(&self) -> Option<String> {
        self.cache.lock().ok()?.as_ref()?;
        cache_key(&self.info)
    }

    /// The data of the device's pipeline cache: every pipeline built on this device
    /// since it opened (with an empty cache) or since a stored cache was taken. None
    /// without pipeline caching.
    pub fn cache_data(&self) -> Result<Option<PipelineCacheData>> {
        let Some(key) = self.cache_key() else { return Ok(None) };
        let cache = self.cache.lock().map_err(|_| poisoned())?.clone();
        Ok(cache.and_then(|c| c.get_data()).map(|data| PipelineCacheData { key, data }))
    }

    /// Makes a stored cache the one new pipelines go through when it was written for
    /// this adapter and driver; returns whether it was taken. A cache for another
    /// device is ignored (logged at debug): it only costs the compile time it would
    /// have saved.
    pub fn use_cache(&self, stored: &PipelineCacheData) -> Result<bool> {
        let Some(key) = self.cache_key() else {
            log::debug!("pipeline cache ignored: this device ({}) has no pipeline caching", self.info.name);
            return Ok(false);
        };
        if key != stored.key {
            log::debug!("pipeline cache ignored: written for '{}', this device is '{key}'", stored.key);
            return Ok(false);
        }
        let cache = new_cache(&self.device, Some(&stored.data));
        *self.cache.lock().map_err(|_| poisoned())? = Some(cache);
        log::debug!("pipeline cache of {} bytes loaded for '{key}'", stored.data.len());
        Ok(true)
    }

    /// The first uncaptured device error since the last call, as an error.
    pub fn take_error(&self) -> Result<()> {
        match self.error.lock().ok().and_then(|mut e| e.take()) {
            Some(e) => Err(RuntimeError::Gpu(e)),
            None => Ok(()),
        }
    }

    /// A pipeline for WGSL `source` (validated with naga first), cached by source.
    pub fn pipeline(&self, label: &str, source: &str, entry: &str, read_only: &[bool]) -> Result<Arc<Pipeline>> {
        let key = (source.to_string(), entry.to_string());
        if let Some(p) = self.pipelines.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(p.clone());
        }
        if let Some(dir) = std::env::var_os("KILN_DUMP_WGSL") {
            // Debugging aid: every generated kernel, named after its node.
            let name: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{name}.wgsl")), source);
        }
        let module = naga::front::wgsl::parse_str(source)
            .map_err(|e| RuntimeError::Gpu(format!("kernel '{label}': invalid WGSL: {}", e.emit_to_string(source))))?;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| RuntimeError::Gpu(format!("kernel '{label}': WGSL validation failed: {e:?}")))?;
        if read_only.len() as u32 > self.limits.max_storage_buffers_per_shader_stage {
            return Err(RuntimeError::Gpu(format!(
                "kernel '{label}' binds {} storage buffers; this adapter allows {}",
                read_only.len(),
                self.limits.max_storage_buffers_per_shader_stage
            )));
        }
        let cache = self.cache.lock().map_err(|_| poisoned())?.clone();
        let (pipeline, layout) = self.build(label, source, entry, read_only, cache.as_ref())?;
        let record = KernelRecord { label: label.to_string(), source: source.to_string(), entry: entry.to_string(), read_only: read_only.to_vec() };
        let p = Arc::new(Pipeline { pipeline, layout, record });
        self.pipelines.lock().map_err(|_| poisoned())?.insert(key, p.clone());
        Ok(p)
    }

    /// Creates the pipeline of a validated kernel, through `cache` when given.
    fn build(&self, label: &str, source: &str, entry: &str, read_only: &[bool], cache: Option<&wgpu::PipelineCache>) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let shader = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = read_only
            .iter()
            .enumerate()
            .map(|(i, &ro)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: ro },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries: &entries });
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&pl),
            module: &shader,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Gpu(format!("kernel '{label}': pipeline creation failed: {e}")));
        }
        Ok((pipeline, layout))
    }
}

/// The identity a stored pipeline cache must match: wgpu's key (backend, vendor,
/// device) and the driver's name and version, which the driver's cache also depends on.
fn cache_key(info: &wgpu::AdapterInfo) -> Option<String> {
    wgpu::util::pipeline_cache_key(info).map(|k| format!("{k}; {}; {}; {}", info.name, info.driver, info.driver_info))
}

fn new_cache(device: &wgpu::Device, data: Option<&[u8]>) -> wgpu::PipelineCache {
    // SAFETY: `data` is only ever bytes that `PipelineCache::get_data` returned on a
    // device with the same cache key (checked by `use_cache`), kept intact by the
    // artifact's CRC-32; wgpu checks its own header (adapter, driver, size) and with
    // `fallback` starts an empty cache when the data does not fit.
    unsafe { device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor { label: Some("kiln"), data, fallback: true }) }
}
