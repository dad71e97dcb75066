//! Conv on the CPU for small output planes (ResNet's 7x7 and 14x14 layers): the GEMM
//! transposed, `Y^T [pixels x M] = im2col^T [pixels x K] * W^T [K x M]`, so that the
//! micro-kernel's vector lanes run along output channels (always a multiple of 8 or 16
//! in real networks) and its broadcast rows along pixels (49 pixels fill 7 tiles of 8;
//! along the vector lanes they would fill 2 of 32). The filters are packed once as
//! NR-channel panels; each reduction slice of im2col^T is packed into MR-pixel panels per
//! run. A block of output channels accumulates in a transposed scratch tile, which is
//! stored into the NCHW output with the epilogue at the end.
use super::conv_cpu::{im2col_row, ConvProblem, SharedOut};
use crate::cpu;
use crate::elementwise::UnaryKind;
use crate::linalg::microkernel::Isa;

/// Whether the flipped GEMM computes this problem (ungrouped, non-depthwise).
pub(crate) fn applies(p: &ConvProblem) -> bool {
    p.group == 1
}

/// The filters as `W^T` (`K x M`), packed into panels of NR output channels (zero
/// channels pad the last panel): panel `j` holds `K` rows of NR values.
pub(crate) struct FlippedFilters {
    isa: Isa,
    k: usize,
    m: usize,
    data: Vec<f32>,
    /// Reduction slice.
    kc: usize,
    /// Output channels per task (a multiple of NR).
    nc: usize,
}

impl FlippedFilters {
    pub(crate) fn new(p: &ConvProblem, w: &[f32], isa: Isa, kc: usize, threads: usize) -> FlippedFilters {
        let (m, k, nr) = (p.out_channels, p.reduction(), isa.nr());
        let panels = m.div_ceil(nr);
        let mut data = vec![0f32; panels * k * nr];
        for oc in 0..m {
            let (j, lane) = (oc / nr, oc % nr);
            for (kk, &v) in w[oc * k..][..k].iter().enumerate() {
                data[(j * k + kk) * nr + lane] = v;
            }
        }
        // Channel blocks: about two per thread per image, whole panels.
        let per_task = panels.div_ceil(threads.max(1).div_ceil(p.batch.max(1)).max(1)).max(1);
        FlippedFilters { isa, k, m, data, kc: kc.clamp(1, k.max(1)), nc: per_task * nr }
    }

    /// `y = act([y +] conv(x) + bias)`.
    pub(crate) fn run(&self, p: &ConvProblem, x: &[f32], bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: &mut [f32]) {
        let blocks = self.m.div_ceil(self.nc);
        let tasks = p.batch * blocks;
        let (in_len, out_len) = (p.in_channels * p.geo.input_size(), p.out_channels * p.geo.output_size());
        let out = SharedOut(y.as_mut_ptr());
        let run_task = |t: usize| {
            let (img, b) = (t / blocks, t % blocks);
            let n0 = b * self.nc;
            let n1 = (n0 + self.nc).min(self.m);
            // SAFETY: this task writes output channels n0..n1 of image img only.
            unsafe { self.run_block(p, &x[img * in_len..][..in_len], n0, n1, bias, act, residual, out.ptr().add(img * out_len)) };
        };
        let flops = 2 * p.macs() as usize;
        // Serial for one task or one thread (`par_ranges` decides).
        cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
    }

    /// Output channels `n0..n1` of one image (`x`: `[C, ...]`, `y`: `[M, pixels]`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_block(&self, p: &ConvProblem, x: &[f32], n0: usize, n1: usize, bias: Option<&[f32]>, act: Option<UnaryKind>, residual: bool, y: *mut f32) {
        let (isa, k) = (self.isa, self.k);
        let (mr, nr) = (isa.mr(), isa.nr());
        let px = p.geo.output_size();
        let px_pad = px.next_multiple_of(mr);
        let (j0, j1) = (n0 / nr, n1.div_ceil(nr));
        let cols = (j1 - j0) * nr;
        let kc_max = self.kc;
        let plane = p.geo.input_size();
        let taps = p.geo.kernel_size();
        let [_, kh_n, kw_n] = p.geo.kernel;
        cpu::with_scratch(px_pad * cols + px_pad * kc_max + px, |scratch| {
            let (ct, rest) = scratch.split_at_mut(px_pad * cols);
            let (ap, row) = rest.split_at_mut(px_pad * kc_max);
            let mut kb = 0;
            while kb < k {
                let kcur = kc_max.min(k - kb);
                // Pack im2col^T rows kb..kb+kcur into MR-pixel panels: panel i, step kk.
                for kk in 0..kcur {
                    let kg = kb + kk;
                    let (c, t) = (kg / taps, kg % taps);
                    let tap = [t / (kh_n * kw_n), (t / kw_n) % kh_n, t % kw_n];
                    im2col_row(&p.geo, &x[c * plane..][..plane], tap, 0, &mut row[..px]);
                    for (i, chunk) in row[..px].chunks(mr).enumerate() {
                        let dst = &mut ap[(i * kcur + kk) * mr..][..mr];
                        dst[..chunk.len()].copy_from_slice(chunk);
                        dst[chunk.len()..].fill(0.0);
                    }
                }
                for j in j0..j1 {
                    let bpanel = self.data.as_ptr().add((j * k + kb) * nr);
                    for i in 0..px_pad / mr {
                        let apanel = ap.as_ptr().add(i * kcur * mr);
                        let c_tile = ct.as_mut_ptr().add(i * mr * cols + (j - j0) * nr);
                        isa.tile(kcur, apanel, bpanel, c_tile, cols, kb > 0);
                    }
                }
                kb += kcur;
            }
            if k == 0 {
                ct.fill(0.0);
            }
            // Y[ch][pixel] = C^T[pixel][ch] + bias (+ residual), then the activation.
            for ch in n0..n1 {
                let dst = std::slice::from_raw_parts_mut(y.add(ch * px), px);
                let b = bias.map_or(0.0, |b| b[ch]);
                let col = ch - j0 * nr;
                for (pix, o) in dst.iter_mut().enumerate() {
                    let v = ct[pix * cols + col] + b;
                    *o = if residual { *o + v } else { v };
                }
                if let Some(a) = act {
                    a.apply_slice_f32_fast(dst);
                }
            }
        });
    }
}
