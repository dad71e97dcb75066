//! The channel-blocked layout's boundary reorders, `kiln.ToNchwc` and `kiln.FromNchwc`,
//! which the compiler's `layout-nchwc` pass puts where a chain of blocked CPU
//! convolutions meets the rest of the graph: `[N, C, H, W]` <-> `[N, C/8, H, W, 8]`
//! (pixel `p`, channel `8b + l` at `((n * C/8 + b) * H * W + p) * 8 + l`; the spatial
//! dims may be any number). f32 only, C a multiple of 8; 8x8 blocks are transposed in
//! registers where the CPU has AVX. CPU only, like the pass.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

/// Channels per block.
pub const BLOCK: usize = 8;

#[derive(Debug)]
pub struct Reorder {
    /// True: NCHW in, blocked out.
    to_blocked: bool,
}

impl Op for Reorder {
    fn name(&self) -> &str {
        if self.to_blocked {
            "ToNchwc"
        } else {
            "FromNchwc"
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let d = required(inputs, 0)?.dims().to_vec();
        let dims = if self.to_blocked {
            if d.len() < 3 || d[1] % BLOCK != 0 {
                return Err(OpError::input(0, format!("expected [N, C, spatial...] with C a multiple of {BLOCK}, found {d:?}")));
            }
            let mut out = vec![d[0], d[1] / BLOCK];
            out.extend(&d[2..]);
            out.push(BLOCK);
            out
        } else {
            if d.len() < 4 || d[d.len() - 1] != BLOCK {
                return Err(OpError::input(0, format!("expected a blocked [N, C/{BLOCK}, spatial..., {BLOCK}], found {d:?}")));
            }
            let mut out = vec![d[0], d[1] * BLOCK];
            out.extend(&d[2..d.len() - 1]);
            out
        };
        Ok(vec![TensorType::new(DType::F32, dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for Reorder {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let y = &mut outputs[0];
        if x.len() != y.len() || x.dtype() != DType::F32 {
            return Err(OpError::input(0, format!("{} {:?} does not reorder into {:?}", x.dtype(), x.dims(), y.dims())));
        }
        let (n, blocks) = if self.to_blocked { (x.dims()[0], x.dims()[1] / BLOCK) } else { (x.dims()[0], x.dims()[1]) };
        let units = n * blocks;
        if units == 0 {
            return Ok(());
        }
        let plane = x.len() / units / BLOCK;
        let (x, y) = (x.as_slice::<f32>()?, y.as_mut_slice::<f32>()?);
        let out = super::conv_cpu::SharedOut(y.as_mut_ptr());
        let to = self.to_blocked;
        cpu::par_ranges(units, plane * BLOCK, |a, b| {
            for u in a..b {
                let (src, at) = (&x[u * plane * BLOCK..][..plane * BLOCK], u * plane * BLOCK);
                // SAFETY: unit u's output range is written by this iteration only.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(at), plane * BLOCK) };
                if to {
                    planes_to_block(src, dst, plane);
                } else {
                    block_to_planes(src, dst, plane);
                }
            }
        });
        Ok(())
    }
}

/// Eight planes of `plane` pixels -> `[pixel][8]`.
fn planes_to_block(x: &[f32], y: &mut [f32], plane: usize) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        // SAFETY: AVX2 checked; both slices hold 8 * plane floats.
        done = unsafe { x86::planes_to_block(x.as_ptr(), y.as_mut_ptr(), plane) };
    }
    for p in done..plane {
        for l in 0..BLOCK {
            y[p * BLOCK + l] = x[l * plane + p];
        }
    }
}

/// `[pixel][8]` -> eight planes of `plane` pixels.
fn block_to_planes(x: &[f32], y: &mut [f32], plane: usize) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        // SAFETY: AVX2 checked; both slices hold 8 * plane floats.
        done = unsafe { x86::block_to_planes(x.as_ptr(), y.as_mut_ptr(), plane) };
    }
    for p in done..plane {
        for l in 0..BLOCK {
            y[l * plane + p] = x[p * BLOCK + l];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::linalg::microkernel::transpose8x8;
    use std::arch::x86_64::*;

    /// [`super::planes_to_block`] for the first `8 * (plane / 8)` pixels; returns them.
    ///
    /// # Safety
    /// The CPU has AVX; `x` and `y` hold `8 * plane` floats.
    #[target_feature(enable = "avx")]
    pub unsafe fn planes_to_block(x: *const f32, y: *mut f32, plane: usize) -> usize {
        for p in (0..plane - plane % 8).step_by(8) {
            let rows: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(x.add(l * plane + p)));
            for (j, v) in transpose8x8(rows).into_iter().enumerate() {
                _mm256_storeu_ps(y.add((p + j) * 8), v);
            }
        }
        plane - plane % 8
    }

    /// [`super::block_to_planes`] for the first `8 * (plane / 8)` pixels; returns them.
    ///
    /// # Safety
    /// The CPU has AVX; `x` and `y` hold `8 * plane` floats.
    #[target_feature(enable = "avx")]
    pub unsafe fn block_to_planes(x: *const f32, y: *mut f32, plane: usize) -> usize {
        for p in (0..plane - plane % 8).step_by(8) {
            let rows: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(x.add((p + i) * 8)));
            for (l, v) in transpose8x8(rows).into_iter().enumerate() {
                _mm256_storeu_ps(y.add(l * plane + p), v);
            }
        }
        plane - plane % 8
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "ToNchwc", |_spec: &NodeSpec| Ok(Box::new(Reorder { to_blocked: true })));
    r.register("kiln", "FromNchwc", |_spec: &NodeSpec| Ok(Box::new(Reorder { to_blocked: false })));
}
