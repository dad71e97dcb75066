//! Variants of a WGSL kernel for one step: the program generated with candidate
//! values, dispatched alone on the step's device with the step's input types.
//!
//! Timing: with `TIMESTAMP_QUERY` (requested when the adapter has it), the GPU's own
//! timestamps at the start and end of one compute pass that runs the program `reps`
//! times; otherwise (or with `KILN_TUNE_WALL_CLOCK` set) the wall time of submitting
//! that pass and waiting for it.
use super::measure::Variant;
use super::step::step_inputs;
use crate::gpu::{from_gpu, to_gpu, GpuContext};
use kiln_graph::Tensor;
use kiln_ops::infer::{Specialized, Step};
use kiln_ops::wgsl::Binding;
use kiln_ops::{Arg, Op, TensorType, TuneValues, WgslProgram};
use std::sync::Arc;
use std::time::Instant;
use wgpu::util::DeviceExt;

/// A step's WGSL kernel, its device, and the input buffers every variant reads.
pub(crate) struct GpuBench<'a> {
    ctx: Arc<GpuContext>,
    op: &'a dyn Op,
    args: Vec<Option<Arg<'a>>>,
    out_types: Vec<TensorType>,
    inputs: Vec<Option<wgpu::Buffer>>,
}

fn gpu_bytes(t: &TensorType) -> u64 {
    (t.len() as u64 * 4).max(4)
}

impl<'a> GpuBench<'a> {
    pub fn new(ctx: Arc<GpuContext>, op: &'a dyn Op, spec: &'a Specialized, step: &Step) -> Result<GpuBench<'a>, String> {
        let args = spec.args(&step.inputs);
        let out_types: Vec<TensorType> = step.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
        let max = ctx.limits.max_storage_buffer_binding_size as u64;
        let mut inputs = vec![];
        for (i, t) in step_inputs(&args)?.into_iter().enumerate() {
            inputs.push(match t {
                None => None,
                Some(t) => {
                    let mut bytes = to_gpu(&t, &format!("input {i}")).map_err(|e| e.to_string())?;
                    if bytes.len() as u64 > max {
                        return Err(format!("input {i} needs {} bytes, more than this adapter binds", bytes.len()));
                    }
                    bytes.resize(bytes.len().max(4), 0);
                    Some(ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some("tune input"), contents: &bytes, usage: wgpu::BufferUsages::STORAGE }))
                }
            });
        }
        if out_types.iter().any(|t| gpu_bytes(t) > max) {
            return Err("an output is larger than this adapter binds".into());
        }
        Ok(GpuBench { ctx, op, args, out_types, inputs })
    }

    /// The program at values `tune`.
    pub fn program(&self, tune: &TuneValues) -> Result<WgslProgram, String> {
        self.op.wgsl().ok_or("the op has no WGSL kernel")?.generate(&self.args, &self.out_types, tune).map_err(|e| e.to_string())
    }

    /// The variant with values `tune`: its program generated, validated and compiled.
    pub fn variant(&self, tune: &TuneValues) -> Result<Box<dyn Variant + '_>, String> {
        let program = self.program(tune)?;
        let dev = &self.ctx.device;
        let storage = |size: u64, label: &str| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: size.max(4),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let outputs: Vec<wgpu::Buffer> = self.out_types.iter().map(|t| storage(gpu_bytes(t), "tune output")).collect();
        let scratch: Vec<wgpu::Buffer> = program.scratch_bytes.iter().map(|&b| storage(b, "tune scratch")).collect();
        let status = storage(16, "tune status");
        let mut dispatches = vec![];
        for d in &program.dispatches {
            if d.workgroups.iter().any(|&w| w > self.ctx.limits.max_compute_workgroups_per_dimension) {
                return Err(format!("'{}' launches {:?} workgroups, more than this adapter allows", d.label, d.workgroups));
            }
            let mut bufs: Vec<&wgpu::Buffer> = vec![];
            let mut read_only = vec![];
            for b in &d.bindings {
                let (buf, ro) = match *b {
                    Binding::Input(i) => (self.inputs.get(i).and_then(Option::as_ref).ok_or_else(|| format!("the kernel binds missing input {i}"))?, true),
                    Binding::Output(i) => (outputs.get(i).ok_or_else(|| format!("the kernel binds missing output {i}"))?, false),
                    Binding::Scratch(i) => (scratch.get(i).ok_or_else(|| format!("the kernel binds missing scratch {i}"))?, false),
                    Binding::Status => (&status, false),
                };
                bufs.push(buf);
                read_only.push(ro);
            }
            let pipeline = self.ctx.pipeline(&format!("tune: {}", d.label), &d.source, &d.entry_point, &read_only).map_err(|e| e.to_string())?;
            let entries: Vec<wgpu::BindGroupEntry> = bufs.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
            let group = dev.create_bind_group(&wgpu::BindGroupDescriptor { label: Some("tune"), layout: &pipeline.layout, entries: &entries });
            dispatches.push((pipeline, group, d.workgroups));
        }
        self.ctx.take_error().map_err(|e| e.to_string())?;
        let wall_clock = std::env::var_os("KILN_TUNE_WALL_CLOCK").is_some();
        let queries = (self.ctx.timestamps && !wall_clock).then(|| {
            let set = dev.create_query_set(&wgpu::QuerySetDescriptor { label: Some("tune timestamps"), ty: wgpu::QueryType::Timestamp, count: 2 });
            let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tune timestamps"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (set, resolve, read_buffer(dev, 16))
        });
        Ok(Box::new(GpuVariant { bench: self, dispatches, outputs, queries }))
    }
}

fn read_buffer(dev: &wgpu::Device, size: u64) -> wgpu::Buffer {
    dev.create_buffer(&wgpu::BufferDescriptor { label: Some("tune readback"), size: size.max(4), usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false })
}

struct GpuVariant<'b, 'a> {
    bench: &'b GpuBench<'a>,
    dispatches: Vec<(Arc<crate::gpu::Pipeline>, wgpu::BindGroup, [u32; 3])>,
    outputs: Vec<wgpu::Buffer>,
    /// Timestamp queries, their resolve buffer and its readback.
    queries: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
}

impl GpuVariant<'_, '_> {
    /// Encodes one pass of `reps` program runs (timestamped when `stamp`).
    fn pass(&self, enc: &mut wgpu::CommandEncoder, reps: usize, stamp: bool) {
        let timestamp_writes = match (&self.queries, stamp) {
            (Some((set, _, _)), true) => Some(wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: Some(1) }),
            _ => None,
        };
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("tune"), timestamp_writes });
        for _ in 0..reps {
            for (p, g, wg) in &self.dispatches {
                if wg.contains(&0) {
                    continue;
                }
                pass.set_pipeline(&p.pipeline);
                pass.set_bind_group(0, g, &[]);
                pass.dispatch_workgroups(wg[0], wg[1], wg[2]);
            }
        }
    }

    /// Submits `enc`, maps `reads` and waits.
    fn finish(&self, enc: wgpu::CommandEncoder, reads: &[&wgpu::Buffer]) -> Result<(), String> {
        let ctx = &self.bench.ctx;
        let idx = ctx.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        for b in reads {
            let tx = tx.clone();
            b.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
        }
        drop(tx);
        ctx.device.poll(wgpu::PollType::Wait { submission_index: Some(idx), timeout: None }).map_err(|e| format!("waiting for the GPU failed: {e}"))?;
        for r in rx.iter() {
            r.map_err(|e| format!("reading back failed: {e}"))?;
        }
        ctx.take_error().map_err(|e| e.to_string())
    }
}

impl Variant for GpuVariant<'_, '_> {
    fn outputs(&mut self) -> Result<Vec<Tensor>, String> {
        let dev = &self.bench.ctx.device;
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tune outputs") });
        self.pass(&mut enc, 1, false);
        let reads: Vec<wgpu::Buffer> = self.bench.out_types.iter().map(|t| read_buffer(dev, gpu_bytes(t))).collect();
        for ((o, r), t) in self.outputs.iter().zip(&reads).zip(&self.bench.out_types) {
            enc.copy_buffer_to_buffer(o, 0, r, 0, gpu_bytes(t));
        }
        self.finish(enc, &reads.iter().collect::<Vec<_>>())?;
        let mut outs = vec![];
        for (r, t) in reads.iter().zip(&self.bench.out_types) {
            let tensor = {
                let view = r.get_mapped_range(..).map_err(|e| format!("mapping an output failed: {e}"))?;
                from_gpu(&view, t.dtype, &t.dims).map_err(|e| e.to_string())?
            };
            r.unmap();
            outs.push(tensor);
        }
        Ok(outs)
    }

    fn time(&mut self, reps: usize) -> Result<f64, String> {
        let ctx = &self.bench.ctx;
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tune timing") });
        self.pass(&mut enc, reps, true);
        let started = Instant::now();
        match &self.queries {
            Some((set, resolve, read)) => {
                enc.resolve_query_set(set, 0..2, resolve, 0);
                enc.copy_buffer_to_buffer(resolve, 0, read, 0, 16);
                self.finish(enc, &[read])?;
                let ticks: [u64; 2] = {
                    let view = read.get_mapped_range(..).map_err(|e| format!("mapping the timestamps failed: {e}"))?;
                    let w: &[u64] = bytemuck::cast_slice(&view[..16]);
                    [w[0], w[1]]
                };
                read.unmap();
                let ns = ticks[1].saturating_sub(ticks[0]) as f64 * ctx.queue.get_timestamp_period() as f64;
                if ns > 0.0 {
                    return Ok(ns * 1e-9 / reps.max(1) as f64);
                }
                // A driver that reports no elapsed ticks: fall back to the wall time.
                Ok(started.elapsed().as_secs_f64() / reps.max(1) as f64)
            }
            None => {
                self.finish(enc, &[])?;
                Ok(started.elapsed().as_secs_f64() / reps.max(1) as f64)
            }
        }
    }
}
