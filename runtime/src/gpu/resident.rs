//! Device buffers that hold a session's carried state between runs
//! (`crate::carried`): a GPU plan copies each into its input's place before the first
//! dispatch and copies the matching output back into it after the last, in the run's
//! one submit, so the state never crosses the bus unless the host asks for it.
use super::convert::from_gpu;
use super::GpuContext;
use crate::{Result, RuntimeError};
use kiln_graph::{DType, Tensor};
use std::sync::Arc;

pub(crate) struct Resident {
    pub ctx: Arc<GpuContext>,
    /// One per carried variable, in the carried order.
    pub buffers: Vec<wgpu::Buffer>,
    pub dims: Vec<Vec<usize>>,
}

/// Device bytes of an f32 tensor of `len` elements (buffers are never empty).
fn bytes_of(len: usize) -> u64 {
    (len as u64 * 4).max(4)
}

impl Resident {
    /// Buffers for f32 values of these dims, uninitialised.
    pub fn new(ctx: Arc<GpuContext>, dims: Vec<Vec<usize>>) -> Resident {
        let buffers = dims
            .iter()
            .map(|d| {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("carried state"),
                    size: bytes_of(d.iter().product()),
                    usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .collect();
        Resident { ctx, buffers, dims }
    }

    /// Bytes a copy moves for variable `k` (0 for an empty tensor).
    pub fn copy_bytes(&self, k: usize) -> u64 {
        self.dims[k].iter().product::<usize>() as u64 * 4
    }

    /// Writes `t` (f32, of variable `k`'s dims) into its buffer; queued before the next
    /// submit.
    pub fn upload(&self, k: usize, t: &Tensor) -> Result<()> {
        if t.dtype() != DType::F32 || t.dims() != self.dims[k].as_slice() {
            return Err(RuntimeError::Gpu(format!("carried value {k}: expected f32{:?}, got {}{:?}", self.dims[k], t.dtype(), t.dims())));
        }
        if !t.is_empty() {
            self.ctx.queue.write_buffer(&self.buffers[k], 0, t.bytes());
        }
        Ok(())
    }

    /// Reads variable `k` back (one copy, one submit, waited for).
    pub fn download(&self, k: usize) -> Result<Tensor> {
        let dims = &self.dims[k];
        let bytes = self.copy_bytes(k);
        if bytes == 0 {
            return Ok(Tensor::zeros(DType::F32, dims));
        }
        let dev = &self.ctx.device;
        let staging = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("carried state readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("carried state readback") });
        enc.copy_buffer_to_buffer(&self.buffers[k], 0, &staging, 0, bytes);
        let idx = self.ctx.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        dev.poll(wgpu::PollType::Wait { submission_index: Some(idx), timeout: None }).map_err(|e| RuntimeError::Gpu(format!("waiting for the GPU failed: {e}")))?;
        rx.recv()
            .map_err(|_| RuntimeError::Gpu("reading carried state back: no answer from the device".into()))?
            .map_err(|e| RuntimeError::Gpu(format!("reading carried state back failed: {e}")))?;
        self.ctx.take_error()?;
        let t = {
            let view = staging.get_mapped_range(..).map_err(|e| RuntimeError::Gpu(format!("mapping carried state failed: {e}")))?;
            from_gpu(&view, DType::F32, dims)?
        };
        staging.unmap();
        Ok(t)
    }
}
