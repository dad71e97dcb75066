//! CPU convolution kernels (f32), parallel with rayon:
//! - pointwise (1x1, stride 1, no padding): one GEMM straight on the input;
//! - depthwise 1-D/2-D: per channel plane, zero-padded stride-phase copies and a flat
//!   FMA kernel (runtime-dispatched AVX2+FMA); 3-D depthwise: a direct row loop;
//! - everything else: im2col into per-thread scratch tiles + GEMM (the `gemm` crate;
//!   its own parallelism when there are too few tiles to share out).
//!
//! A fused activation is applied to each output block right after it is computed; a
//! fused residual, which the caller puts into the output first (or whose memory the
//! output takes over), is accumulated into, before the activation.
//! f64 tensors take a direct f64 loop ([`conv_f64`]; the caller adds the residual and
//! applies the activation).
use super::conv_depthwise8;
use super::conv_small_k;
use super::window::Geometry;
use crate::cpu;
use crate::elementwise::UnaryKind;

/// The shape of one convolution: NC(D)(H)W input, [M, C/group, k..] weights.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvProblem {
    pub batch: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub group: usize,
    pub geo: Geometry,
}

impl ConvProblem {
    /// The same problem with a last spatial dim that is 1 everywhere (input, kernel,
    /// output, no padding: an `[N, C, L, 1]` "1-D as 2-D" layout) swapped with the one
    /// before it. The memory layout is the same, and the CPU kernels, which walk output
    /// rows along the last dim, then see rows of L pixels instead of L rows of one.
    pub(crate) fn for_cpu(mut self) -> ConvProblem {
        let g = &mut self.geo;
        let unit = g.input[2] == 1 && g.kernel[2] == 1 && g.output[2] == 1 && g.pad_begin[2] == 0 && g.pad_end[2] == 0;
        if unit && g.output[1] > 1 {
            g.input.swap(1, 2);
            g.output.swap(1, 2);
            g.kernel.swap(1, 2);
            g.stride.swap(1, 2);
            g.dilation.swap(1, 2);
            g.pad_begin.swap(1, 2);
            g.pad_end.swap(1, 2);
        }
        self
    }

    pub(crate) fn in_per_group(&self) -> usize {
        self.in_channels / self.group
    }
    pub(crate) fn out_per_group(&self) -> usize {
        self.out_channels / self.group
    }
    /// Length of one im2col column (reduction size of the GEMM).
    pub(crate) fn reduction(&self) -> usize {
        self.in_per_group() * self.geo.kernel_size()
    }
    pub(crate) fn macs(&self) -> u64 {
        (self.batch * self.out_channels * self.geo.output_size()) as u64 * self.reduction() as u64
    }
    pub(crate) fn is_pointwise(&self) -> bool {
        let g = &self.geo;
        g.kernel == [1; 3] && g.stride == [1; 3] && g.pad_begin == [0; 3] && g.pad_end == [0; 3]
    }
    pub(crate) fn is_depthwise(&self) -> bool {
        self.group > 1 && self.group == self.in_channels
    }
}

/// What the f32 kernels do to each convolution result before storing it:
/// `act(y0 + conv + bias)`, where `y0` is the output's previous value when `residual`
/// (a fused residual the caller has put there) and zero otherwise.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    pub bias: Option<&'a [f32]>,
    pub act: Option<UnaryKind>,
    pub residual: bool,
}

pub(crate) use crate::cpu::SharedOut;

/// f32 convolution: `y` (N, M, out..) = `act`([`y` +] conv(`x`, `w`) + `bias`) (see
/// [`Epilogue`]). The fused activation is applied to each block of outputs as soon as
/// it is computed, while it is still in cache.
pub(crate) fn conv_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    if p.is_depthwise() {
        let g = &p.geo;
        if g.input[0] == 1 && g.kernel[0] == 1 && g.output[0] == 1 {
            depthwise_2d_f32(p, x, w, epi, y);
        } else {
            depthwise_f32(p, x, w, epi, y);
        }
    } else if p.reduction() <= conv_small_k::MAX_REDUCTION {
        small_k_conv_f32(p, x, w, epi, y);
    } else if images_per_block(p.batch, p.geo.output_size()) > 1 {
        batched_conv_f32(p, x, w, epi, y);
    } else {
        gemm_conv_f32(p, x, w, epi, y);
    }
}

/// Convolution with a short reduction (`reduction() <= MAX_REDUCTION`): the direct
/// register-blocked kernel of [`conv_small_k`], straight on the input for pointwise
/// convolutions, on per-tile im2col blocks otherwise. Parallel over pixel tiles, about
/// one per thread (a few more for big layers), each computing all output channels.
fn small_k_conv_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    let Epilogue { bias, act, residual } = epi;
    let (cg, mg, kc) = (p.in_per_group(), p.out_per_group(), p.reduction());
    let (in_size, out_size) = (p.geo.input_size(), p.geo.output_size());
    let pointwise = p.is_pointwise();
    let threads = cpu::threads().max(1);
    let flops = 2 * p.macs() as usize;
    // Tiles: im2col blocks of at most ~64 KiB; at least one per thread when there is
    // enough work to share, counted over all images and groups.
    let per_plane = (p.batch * p.group).max(1);
    let want = if flops < (1 << 16) { 1 } else { threads.div_ceil(per_plane) };
    let max_tile = if pointwise { out_size } else { (1 << 14) / kc.max(1) };
    let (n_tiles, tile) = tiles(out_size, out_size.div_ceil(want).min(max_tile.max(16)));
    let tasks = per_plane * n_tiles;
    let out = SharedOut(y.as_mut_ptr());
    let run_task = |t: usize| {
        let (img_group, ti) = (t / n_tiles, t % n_tiles);
        let (img, g) = (img_group / p.group, img_group % p.group);
        let p0 = ti * tile;
        let p1 = (p0 + tile).min(out_size);
        let cols = p1 - p0;
        let xg = &x[(img * p.in_channels + g * cg) * in_size..][..cg * in_size];
        let kernel = conv_small_k::SmallK { w: &w[g * mg * kc..][..mg * kc], k: kc, bias: bias.map(|b| &b[g * mg..][..mg]), act, accumulate: residual };
        // SAFETY: each task owns rows [g*mg, (g+1)*mg) x columns [p0, p1) of image img.
        let dst = unsafe { out.ptr().add((img * p.out_channels + g * mg) * out_size + p0) };
        if pointwise {
            // SAFETY: xg holds cg = kc rows of in_size (= out_size) pixels.
            unsafe { kernel.run(xg[p0..].as_ptr(), in_size, cols, dst, out_size) };
        } else {
            cpu::with_scratch(kc * cols, |col| {
                im2col(&p.geo, xg, cg, p0, p1, col);
                // SAFETY: col is kc rows of cols pixels.
                unsafe { kernel.run(col.as_ptr(), cols, cols, dst, out_size) };
            });
        }
    };
    if threads == 1 || tasks == 1 {
        (0..tasks).for_each(run_task);
    } else {
        cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
    }
}

/// How many images of `pixels` output pixels each one GEMM covers: 1 for planes big
/// enough to fill a GEMM on their own, else enough images for about 256 columns (tiny
/// per-image GEMMs cost more in their setup than in their arithmetic).
pub(crate) fn images_per_block(batch: usize, pixels: usize) -> usize {
    if pixels == 0 || pixels >= 128 {
        return 1;
    }
    (256 / pixels).clamp(1, batch.max(1))
}

/// Channels `c0 .. c0 + channels` of `images` (NC.. tensor `t` with `total` channels
/// of `plane` elements) as one matrix: row `c` holds image `i`'s plane at columns
/// `i * plane ..`. Returns its start and row stride: `t` itself for one image, else
/// `scratch` (`channels x images.len() * plane`), filled.
pub(crate) fn planes_side_by_side(t: &[f32], images: std::ops::Range<usize>, (c0, channels, total): (usize, usize, usize), plane: usize, scratch: &mut [f32]) -> (*const f32, usize) {
    if images.len() == 1 {
        return (t[(images.start * total + c0) * plane..].as_ptr(), plane);
    }
    let cols = images.len() * plane;
    for (i, img) in images.enumerate() {
        for c in 0..channels {
            scratch[c * cols + i * plane..][..plane].copy_from_slice(&t[(img * total + c0 + c) * plane..][..plane]);
        }
    }
    (scratch.as_ptr(), cols)
}

/// Convolution of small planes: im2col of a block of images side by side (row `r` of
/// image `i` at columns `i * P ..`), one GEMM for the block into scratch, then the
/// epilogue while copying each image's rows out. Parallel over blocks and groups.
fn batched_conv_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    let Epilogue { bias, act, residual } = epi;
    let (cg, mg, kc) = (p.in_per_group(), p.out_per_group(), p.reduction());
    let (in_size, out_size) = (p.geo.input_size(), p.geo.output_size());
    let ipb = images_per_block(p.batch, out_size);
    let blocks = p.batch.div_ceil(ipb);
    let tasks = blocks * p.group;
    let out = SharedOut(y.as_mut_ptr());
    let run_task = |t: usize| {
        let (block, g) = (t / p.group, t % p.group);
        let images = block * ipb..((block + 1) * ipb).min(p.batch);
        let cols = images.len() * out_size;
        cpu::with_scratch((kc + mg) * cols, |scratch| {
            let (col, prod) = scratch.split_at_mut(kc * cols);
            for (i, img) in images.clone().enumerate() {
                let xg = &x[(img * p.in_channels + g * cg) * in_size..][..cg * in_size];
                im2col_strided(&p.geo, xg, cg, 0, out_size, &mut col[i * out_size..], cols);
            }
            let wg = &w[g * mg * kc..][..mg * kc];
            // SAFETY: prod is mg x cols, wg mg x kc, col kc x cols (row strides as given).
            unsafe {
                gemm::gemm(
                    mg, cols, kc, prod.as_mut_ptr(), 1, cols as isize, false, wg.as_ptr(), 1, kc as isize, col.as_ptr(), 1,
                    cols as isize, 0.0, 1.0, false, false, false, gemm::Parallelism::None,
                )
            };
            for (i, img) in images.clone().enumerate() {
                for r in 0..mg {
                    let m = g * mg + r;
                    // SAFETY: this task alone writes channel m of the images of its block.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr().add((img * p.out_channels + m) * out_size), out_size) };
                    let src = &prod[r * cols + i * out_size..][..out_size];
                    let b = bias.map_or(0.0, |b| b[m]);
                    if residual {
                        dst.iter_mut().zip(src).for_each(|(o, &v)| *o += v + b);
                    } else {
                        dst.iter_mut().zip(src).for_each(|(o, &v)| *o = v + b);
                    }
                    if let Some(k) = act {
                        k.apply_slice_f32_fast(dst);
                    }
                }
            }
        });
    };
    cpu::par_ranges(tasks, 2 * p.macs() as usize / tasks.max(1), |a, b| (a..b).for_each(&run_task));
}

/// Splits `pixels` output pixels into balanced tiles of about `target` each.
fn tiles(pixels: usize, target: usize) -> (usize, usize) {
    let count = pixels.div_ceil(target.max(1)).max(1);
    let size = pixels.div_ceil(count).next_multiple_of(8).min(pixels);
    (pixels.div_ceil(size), size)
}

fn gemm_conv_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    let Epilogue { bias, act, residual } = epi;
    let (cg, mg, kc) = (p.in_per_group(), p.out_per_group(), p.reduction());
    let (in_size, out_size) = (p.geo.input_size(), p.geo.output_size());
    let pointwise = p.is_pointwise();
    let threads = cpu::threads().max(1);
    // Tiles keep an im2col block (kc x tile) around half a megabyte.
    let (mut n_tiles, mut tile) = tiles(out_size, (1 << 17) / kc.max(1));
    let mut tasks = p.batch * p.group * n_tiles;
    let flops = 2 * p.macs() as usize;
    // Output-channel chunks per image and group (more than one only for small
    // pointwise layers, see below).
    let mut row_chunks = 1;
    let few_tasks = threads > 1 && tasks < 2 * threads;
    // Few tasks of a pointwise convolution: one task per thread, over pixels for big
    // planes, else over output channels (no im2col to repeat, no GEMM-internal sync).
    let own_split = few_tasks && pointwise && flops > (1 << 20);
    if own_split {
        let per_plane = (p.batch * p.group).max(1);
        let parts = threads.div_ceil(per_plane);
        if out_size >= 64 * parts || mg < 16 * parts {
            (n_tiles, tile) = tiles(out_size, out_size.div_ceil(parts));
        } else {
            (n_tiles, tile) = (1, out_size);
            row_chunks = parts;
        }
        tasks = per_plane * n_tiles * row_chunks;
    }
    // Few large tasks: one tile per image and group, GEMM parallel on its own.
    let inner_parallel = few_tasks && !own_split && flops > (1 << 22);
    if inner_parallel {
        (n_tiles, tile) = (1, out_size);
        tasks = p.batch * p.group;
    }
    let rows_per_chunk = mg.div_ceil(row_chunks).next_multiple_of(8).min(mg);
    let par = if inner_parallel { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    let out = SharedOut(y.as_mut_ptr());
    let run_task = |t: usize| {
        let (img_group, rest) = (t / (n_tiles * row_chunks), t % (n_tiles * row_chunks));
        let (ti, chunk) = (rest / row_chunks, rest % row_chunks);
        let (img, g) = (img_group / p.group, img_group % p.group);
        let r0 = (chunk * rows_per_chunk).min(mg);
        let rows = rows_per_chunk.min(mg - r0);
        if rows == 0 {
            return;
        }
        let p0 = ti * tile;
        let p1 = (p0 + tile).min(out_size);
        let cols = p1 - p0;
        let xg = &x[(img * p.in_channels + g * cg) * in_size..][..cg * in_size];
        let wg = &w[(g * mg + r0) * kc..][..rows * kc];
        let dst_offset = (img * p.out_channels + g * mg + r0) * out_size + p0;
        // SAFETY: each task owns rows [g*mg + r0, g*mg + r0 + rows) x columns [p0, p1)
        // of image img.
        let dst = unsafe { out.ptr().add(dst_offset) };
        // Serial tasks add the bias after the GEMM, in the same pass as the activation
        // (the GEMM then need not read `dst` unless it holds a residual); the
        // GEMM-parallel path starts from it (when there is no residual there).
        let bias_after = if inner_parallel && !residual { None } else { bias };
        let bias_first = bias.is_some() && bias_after.is_none();
        if let (true, Some(b)) = (bias_first, bias) {
            for r in 0..rows {
                // SAFETY: row r of this task's block (see above).
                let row = unsafe { std::slice::from_raw_parts_mut(dst.add(r * out_size), cols) };
                row.fill(b[g * mg + r0 + r]);
            }
        }
        let read_dst = bias_first || residual;
        let gemm_into = |rhs: *const f32, rhs_rs: usize| unsafe {
            gemm::gemm(
                rows, cols, kc, dst, 1, out_size as isize, read_dst, wg.as_ptr(), 1, kc as isize, rhs, 1,
                rhs_rs as isize, 1.0, 1.0, false, false, false, par,
            )
        };
        if pointwise {
            gemm_into(xg[p0..].as_ptr(), in_size);
        } else {
            cpu::with_scratch(kc * cols, |col| {
                im2col(&p.geo, xg, cg, p0, p1, col);
                gemm_into(col.as_ptr(), cols);
            });
        }
        if act.is_none() && bias_after.is_none() {
            return;
        }
        let finish = |r: usize, row: &mut [f32]| {
            if let Some(b) = bias_after {
                let v = b[g * mg + r0 + r];
                row.iter_mut().for_each(|o| *o += v);
            }
            if let Some(k) = act {
                k.apply_slice_f32_fast(row);
            }
        };
        if inner_parallel {
            // One tile spans whole rows: the block is contiguous; share it out by rows.
            // SAFETY: as above, this task's block [dst, dst + rows * out_size).
            let block = unsafe { std::slice::from_raw_parts_mut(dst, rows * out_size) };
            cpu::par_chunks_mut(block, out_size, 4, |first, part| {
                part.chunks_mut(out_size).enumerate().for_each(|(i, row)| finish(first + i, row))
            });
            return;
        }
        for r in 0..rows {
            // SAFETY: row r of this task's block (see above).
            finish(r, unsafe { std::slice::from_raw_parts_mut(dst.add(r * out_size), cols) });
        }
    };
    if inner_parallel || threads == 1 || tasks == 1 {
        (0..tasks).for_each(run_task);
    } else {
        cpu::par_ranges(tasks, flops / tasks.max(1), |a, b| (a..b).for_each(&run_task));
    }
}

/// Writes the im2col block of output pixels `p0..p1` for the `channels` input planes of
/// `x`: row `(c, kd, kh, kw)`, column `p - p0` holds the input value under that tap
/// (zero in padding).
pub(crate) fn im2col(g: &Geometry, x: &[f32], channels: usize, p0: usize, p1: usize, col: &mut [f32]) {
    im2col_strided(g, x, channels, p0, p1, col, p1 - p0);
}

/// [`im2col`] into rows `row_stride` apart (the block of one image among several).
pub(crate) fn im2col_strided(g: &Geometry, x: &[f32], channels: usize, p0: usize, p1: usize, col: &mut [f32], row_stride: usize) {
    let cols = p1 - p0;
    let plane = g.input_size();
    if (p0, p1) == (0, g.output_size()) && g.output[2] < 16 && g.kernel[0] == 1 && g.input[0] == 1 && g.pad_begin[1] >= 0 && g.pad_begin[2] >= 0 {
        im2col_narrow_2d(g, x, channels, col, row_stride);
        return;
    }
    let mut row_index = 0;
    for c in 0..channels {
        let xc = &x[c * plane..][..plane];
        for kd in 0..g.kernel[0] {
            for kh in 0..g.kernel[1] {
                for kw in 0..g.kernel[2] {
                    im2col_row(g, xc, [kd, kh, kw], p0, &mut col[row_index * row_stride..][..cols]);
                    row_index += 1;
                }
            }
        }
    }
}

/// Whole-plane im2col of 2-D planes with short output rows, where [`im2col_row`]'s cost
/// per row segment dominates: each input plane is copied once into a zero-padded
/// plane, and every tap's rows are then plain copies (or strided reads) from it.
fn im2col_narrow_2d(g: &Geometry, x: &[f32], channels: usize, col: &mut [f32], row_stride: usize) {
    let ([_, ih_n, iw_n], [_, oh_n, ow_n]) = (g.input, g.output);
    let ([_, kh_n, kw_n], [_, sh, sw], [_, dh, dw]) = (g.kernel, g.stride, g.dilation);
    let (top, left) = (g.pad_begin[1] as usize, g.pad_begin[2] as usize);
    // The padded plane spans every position a tap reads.
    let ph = ((oh_n.max(1) - 1) * sh + (kh_n.max(1) - 1) * dh + 1).max(top + ih_n);
    let pw = ((ow_n.max(1) - 1) * sw + (kw_n.max(1) - 1) * dw + 1).max(left + iw_n);
    let mut padded = vec![0f32; ph * pw];
    let mut row_index = 0;
    for c in 0..channels {
        let xc = &x[c * ih_n * iw_n..][..ih_n * iw_n];
        for (ih, src) in xc.chunks_exact(iw_n.max(1)).enumerate().take(ih_n) {
            padded[(top + ih) * pw + left..][..iw_n].copy_from_slice(src);
        }
        for kh in 0..kh_n {
            for kw in 0..kw_n {
                let dst = &mut col[row_index * row_stride..][..oh_n * ow_n];
                row_index += 1;
                for (oh, out) in dst.chunks_exact_mut(ow_n.max(1)).enumerate() {
                    let start = (oh * sh + kh * dh) * pw + kw * dw;
                    if sw == 1 {
                        out.copy_from_slice(&padded[start..][..ow_n]);
                    } else {
                        out.iter_mut().enumerate().for_each(|(ow, o)| *o = padded[start + ow * sw]);
                    }
                }
            }
        }
    }
}

/// One im2col row: for output pixels `p0 .. p0 + dst.len()`, the value of input plane
/// `xc` under kernel tap `tap` (zero in padding).
pub(crate) fn im2col_row(g: &Geometry, xc: &[f32], tap: [usize; 3], p0: usize, dst: &mut [f32]) {
    let [kd, kh, kw] = tap;
    let p1 = p0 + dst.len();
    if p0 == p1 {
        return;
    }
    let [_, oh_n, ow_n] = g.output;
    let [id_n, ih_n, iw_n] = g.input;
    let (first_row, last_row) = (p0 / ow_n, (p1 - 1) / ow_n);
    let (w_lo, w_hi) = g.valid_outputs(2, kw);
    let w_off = kw as i64 * g.dilation[2] as i64 - g.pad_begin[2];
    for r in first_row..=last_row {
        let (od, oh) = (r / oh_n, r % oh_n);
        let seg_lo = p0.max(r * ow_n) - r * ow_n;
        let seg_hi = p1.min((r + 1) * ow_n) - r * ow_n;
        let out = &mut dst[r * ow_n + seg_lo - p0..r * ow_n + seg_hi - p0];
        let id = (od * g.stride[0]) as i64 - g.pad_begin[0] + (kd * g.dilation[0]) as i64;
        let ih = (oh * g.stride[1]) as i64 - g.pad_begin[1] + (kh * g.dilation[1]) as i64;
        if id < 0 || id >= id_n as i64 || ih < 0 || ih >= ih_n as i64 {
            out.fill(0.0);
            continue;
        }
        let src = &xc[(id as usize * ih_n + ih as usize) * iw_n..][..iw_n];
        let lo = w_lo.clamp(seg_lo, seg_hi);
        let hi = w_hi.clamp(lo, seg_hi);
        out[..lo - seg_lo].fill(0.0);
        out[hi - seg_lo..].fill(0.0);
        let body = &mut out[lo - seg_lo..hi - seg_lo];
        if body.is_empty() {
            continue;
        }
        let start = ((lo * g.stride[2]) as i64 + w_off) as usize;
        if g.stride[2] == 1 {
            copy_short(body, &src[start..start + body.len()]);
        } else {
            let s = g.stride[2];
            let span = &src[start..start + (body.len() - 1) * s + 1];
            if s == 2 {
                // Pairs (even, odd): the even element of each.
                let (pairs, last) = span.split_at(span.len() - 1);
                let (head, tail) = body.split_at_mut(body.len() - 1);
                for (v, pair) in head.iter_mut().zip(pairs.chunks_exact(2)) {
                    *v = pair[0];
                }
                tail[0] = last[0];
            } else {
                for (v, &x) in body.iter_mut().zip(span.iter().step_by(s)) {
                    *v = x;
                }
            }
        }
    }
}

/// Depthwise (group == C) convolution, parallel over output channel planes; each
/// output row accumulates whole input rows, which vectorises for stride 1.
fn depthwise_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    let Epilogue { bias, act, residual } = epi;
    let g = &p.geo;
    let (in_size, out_size, ksize) = (g.input_size(), g.output_size(), g.kernel_size());
    let multiplier = p.out_per_group();
    let [od_n, oh_n, ow_n] = g.output;
    let [id_n, ih_n, iw_n] = g.input;
    let kw_ranges: Vec<(usize, usize, i64)> = (0..g.kernel[2])
        .map(|kw| {
            let (lo, hi) = g.valid_outputs(2, kw);
            (lo, hi, kw as i64 * g.dilation[2] as i64 - g.pad_begin[2])
        })
        .collect();
    cpu::par_chunks_mut(y, out_size, ksize * 2, |first, planes| {
        for (i, out) in planes.chunks_mut(out_size).enumerate() {
            let plane = first + i;
            let (img, m) = (plane / p.out_channels, plane % p.out_channels);
            let c = m / multiplier;
            let xc = &x[(img * p.in_channels + c) * in_size..][..in_size];
            let wm = &w[m * ksize..][..ksize];
            let b = bias.map_or(0.0, |b| b[m]);
            if residual {
                out.iter_mut().for_each(|o| *o += b);
            } else {
                out.fill(b);
            }
            for od in 0..od_n {
                for oh in 0..oh_n {
                    let orow = &mut out[(od * oh_n + oh) * ow_n..][..ow_n];
                    for kd in 0..g.kernel[0] {
                        let id = (od * g.stride[0]) as i64 - g.pad_begin[0] + (kd * g.dilation[0]) as i64;
                        if id < 0 || id >= id_n as i64 {
                            continue;
                        }
                        for kh in 0..g.kernel[1] {
                            let ih = (oh * g.stride[1]) as i64 - g.pad_begin[1] + (kh * g.dilation[1]) as i64;
                            if ih < 0 || ih >= ih_n as i64 {
                                continue;
                            }
                            let irow = &xc[(id as usize * ih_n + ih as usize) * iw_n..][..iw_n];
                            let wrow = &wm[(kd * g.kernel[1] + kh) * g.kernel[2]..][..g.kernel[2]];
                            for (&wv, &(lo, hi, off)) in wrow.iter().zip(&kw_ranges) {
                                if lo >= hi {
                                    continue;
                                }
                                let start = (lo as i64 * g.stride[2] as i64 + off) as usize;
                                if g.stride[2] == 1 {
                                    for (o, &v) in orow[lo..hi].iter_mut().zip(&irow[start..start + hi - lo]) {
                                        *o += wv * v;
                                    }
                                } else {
                                    let s = g.stride[2];
                                    for (j, o) in orow[lo..hi].iter_mut().enumerate() {
                                        *o += wv * irow[start + j * s];
                                    }
                                }
                            }
                        }
                    }
                }
            }
            if let Some(k) = act {
                k.apply_slice_f32_fast(out);
            }
        }
    });
}

/// `dst.copy_from_slice(src)` for short rows (a 7-float row of a small plane), inlined
/// as vector moves: `copy_from_slice` calls `memmove`, whose fixed cost is larger than
/// such a copy. Blocks of 8, then an overlapping last block.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    let src = &src[..n];
    fn block<const B: usize>(dst: &mut [f32], src: &[f32], at: usize) {
        let d: &mut [f32; B] = (&mut dst[at..at + B]).try_into().expect("block");
        *d = src[at..at + B].try_into().expect("block");
    }
    match n {
        0 => {}
        1..=3 => (0..n).for_each(|i| dst[i] = src[i]),
        4..=7 => {
            block::<4>(dst, src, 0);
            block::<4>(dst, src, n - 4);
        }
        _ => {
            for at in (0..n - 8).step_by(8) {
                block::<8>(dst, src, at);
            }
            block::<8>(dst, src, n - 8);
        }
    }
}

/// `a * b + c`, fused when the caller was compiled with FMA enabled.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `acc += w * a` over `acc.len()` elements.
#[inline(always)]
fn axpy<const FMA: bool>(acc: &mut [f32], w: f32, a: &[f32]) {
    let a = &a[..acc.len()];
    for (o, &v) in acc.iter_mut().zip(a) {
        *o = madd::<FMA>(w, v, *o);
    }
}

/// `out = b + sum_t w[t] * src[t]` for nine taps (a 3x3 kernel) in one pass, then
/// clamped to `[lo, hi]` when `CLAMP` (like `UnaryKind::Clip`: a NaN stays NaN).
#[inline(always)]
fn taps9<const FMA: bool, const CLAMP: bool>(out: &mut [f32], b: f32, w: &[f32; 9], src: [&[f32]; 9], (lo, hi): (f32, f32)) {
    let n = out.len();
    let [s0, s1, s2, s3, s4, s5, s6, s7, s8] = src.map(|s| &s[..n]);
    // Three independent kernel-row sums: a dependency chain of 3 FMAs + 2 adds
    // instead of 9 FMAs, so the loop is not bound by FMA latency.
    for i in 0..n {
        let r0 = madd::<FMA>(w[2], s2[i], madd::<FMA>(w[1], s1[i], madd::<FMA>(w[0], s0[i], b)));
        let r1 = madd::<FMA>(w[5], s5[i], madd::<FMA>(w[4], s4[i], w[3] * s3[i]));
        let r2 = madd::<FMA>(w[8], s8[i], madd::<FMA>(w[7], s7[i], w[6] * s6[i]));
        let v = r0 + (r1 + r2);
        out[i] = if CLAMP {
            let v = if v < lo { lo } else { v };
            if v > hi {
                hi
            } else {
                v
            }
        } else {
            v
        };
    }
}

/// Fixed shapes of a 1-D/2-D depthwise convolution, see [`depthwise_2d_f32`].
struct DepthwisePlan<'a> {
    g: &'a Geometry,
    /// Padded rows read (`pad_h`); phase planes are `ceil(pad_h / stride)` x `hw`.
    pad_h: usize,
    hw: usize,
    phase_len: usize,
    /// Flat accumulator length: outputs at the phase width `hw`.
    acc_len: usize,
}

impl DepthwisePlan<'_> {
    fn new(g: &Geometry) -> DepthwisePlan<'_> {
        let [_, oh_n, ow_n] = g.output;
        let pad_h = (oh_n - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dilation[1] + 1;
        let pad_w = (ow_n - 1) * g.stride[2] + (g.kernel[2] - 1) * g.dilation[2] + 1;
        let (hh, hw) = (pad_h.div_ceil(g.stride[1]), pad_w.div_ceil(g.stride[2]));
        DepthwisePlan { g, pad_h, hw, phase_len: hh * hw, acc_len: (oh_n - 1) * hw + ow_n }
    }

    /// Scratch floats per thread: the phase planes, one padded row, the accumulator.
    fn scratch_len(&self) -> usize {
        self.g.stride[1] * self.g.stride[2] * self.phase_len + self.hw * self.g.stride[2] + self.acc_len
    }

    /// Convolves one channel plane `xc` with kernel `wm` into `out` (added to `out`'s
    /// values, a fused residual, when `residual`), clamped to `clamp` (a fused
    /// Relu/Clip) if any. `scratch` must be zeroed
    /// before the first plane: padding positions are never written, so they stay zero
    /// from plane to plane.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn plane<const FMA: bool>(&self, xc: &[f32], wm: &[f32], b: f32, clamp: Option<(f32, f32)>, residual: bool, scratch: &mut [f32], out: &mut [f32]) {
        let g = self.g;
        let [_, oh_n, ow_n] = g.output;
        let [_, ih_n, iw_n] = g.input;
        let (sh, sw) = (g.stride[1], g.stride[2]);
        let (ph, pw) = (g.pad_begin[1], g.pad_begin[2]);
        let (hw, phase_len) = (self.hw, self.phase_len);
        let row_len = hw * sw;
        let (phases, rest) = scratch.split_at_mut(sh * sw * phase_len);
        let (row, acc) = rest.split_at_mut(row_len);
        // Phase (qh, qw) row i, column j holds padded position (i*sh + qh, j*sw + qw),
        // i.e. input (i*sh + qh - ph, j*sw + qw - pw), zero outside the input.
        for r in 0..self.pad_h {
            let (qh, i) = (r % sh, r / sh);
            let ih = r as i64 - ph;
            let phase_row = |qw: usize| (qh * sw + qw) * phase_len + i * hw;
            if ih < 0 || ih >= ih_n as i64 {
                continue; // stays zero
            }
            let src = &xc[ih as usize * iw_n..][..iw_n];
            let dst = if sw == 1 { &mut phases[phase_row(0)..][..hw] } else { &mut row[..] };
            let lo = (pw.max(0) as usize).min(dst.len());
            let hi = ((iw_n as i64 + pw).max(0) as usize).clamp(lo, dst.len());
            // dst[..lo] and dst[hi..] are padding and stay zero.
            if hi > lo {
                let start = (lo as i64 - pw) as usize;
                copy_short(&mut dst[lo..hi], &src[start..start + hi - lo]);
            }
            if sw == 2 {
                let (left, right) = phases.split_at_mut(phase_row(1));
                let (even, odd) = (&mut left[phase_row(0)..][..hw], &mut right[..hw]);
                for ((pair, e), o) in row.chunks_exact(2).zip(even.iter_mut()).zip(odd.iter_mut()) {
                    *e = pair[0];
                    *o = pair[1];
                }
            } else if sw > 2 {
                for (j, chunk) in row.chunks_exact(sw).enumerate() {
                    for (qw, &v) in chunk.iter().enumerate() {
                        phases[phase_row(qw) + j] = v;
                    }
                }
            }
        }
        let acc = &mut acc[..self.acc_len];
        // 3x3 kernels clamp while accumulating (unless a residual is still to be
        // added); others while copying out below.
        let clamp = if residual {
            self.accumulate::<FMA>(phases, wm, b, None, acc);
            clamp
        } else if self.accumulate::<FMA>(phases, wm, b, clamp, acc) {
            None
        } else {
            clamp
        };
        for oh in 0..oh_n {
            let (dst, src) = (&mut out[oh * ow_n..][..ow_n], &acc[oh * hw..][..ow_n]);
            match (clamp, residual) {
                // Like `UnaryKind::Clip` (a NaN becomes `lo`), as single max/min ops.
                (Some((lo, hi)), _) => dst.iter_mut().zip(src).for_each(|(o, &v)| {
                    let v = if residual { v + *o } else { v };
                    let v = if v > lo { v } else { lo };
                    *o = if v < hi { v } else { hi };
                }),
                (None, true) => dst.iter_mut().zip(src).for_each(|(o, &v)| *o += v),
                (None, false) => copy_short(dst, src),
            }
        }
    }

    /// The phase plane data under kernel tap (kh, kw), from output position 0 on.
    #[inline(always)]
    fn tap<'a>(&self, phases: &'a [f32], kh: usize, kw: usize) -> &'a [f32] {
        let g = self.g;
        let (sh, sw, dh, dw) = (g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]);
        let (qh, shift_h) = ((kh * dh) % sh, (kh * dh) / sh);
        let (qw, shift_w) = ((kw * dw) % sw, (kw * dw) / sw);
        &phases[(qh * sw + qw) * self.phase_len + shift_h * self.hw + shift_w..]
    }

    /// [`Self::tap`] for the nine taps of a 3x3 kernel, row-major.
    #[inline(always)]
    fn taps3x3<'a>(&self, phases: &'a [f32]) -> [&'a [f32]; 9] {
        let t = |kh, kw| self.tap(phases, kh, kw);
        [t(0, 0), t(0, 1), t(0, 2), t(1, 0), t(1, 1), t(1, 2), t(2, 0), t(2, 1), t(2, 2)]
    }

    /// `acc[q] = b + sum over taps of w * phase[q + tap offset]`, flat over the plane.
    /// Returns whether `clamp` was applied too (3x3 kernels).
    /// A plain function (not a closure) so that it inlines into the FMA-enabled caller.
    #[inline(always)]
    fn accumulate<const FMA: bool>(&self, phases: &[f32], wm: &[f32], b: f32, clamp: Option<(f32, f32)>, acc: &mut [f32]) -> bool {
        let g = self.g;
        let (kh_n, kw_n) = (g.kernel[1], g.kernel[2]);
        let run = |kh: usize, kw: usize| self.tap(phases, kh, kw);
        if kh_n == 3 && kw_n == 3 {
            let w9: &[f32; 9] = wm.try_into().expect("3x3 kernel");
            let src = self.taps3x3(phases);
            match clamp {
                Some(bounds) => taps9::<FMA, true>(acc, b, w9, src, bounds),
                None => taps9::<FMA, false>(acc, b, w9, src, (0.0, 0.0)),
            }
            return true;
        }
        acc.fill(b);
        for kh in 0..kh_n {
            for kw in 0..kw_n {
                axpy::<FMA>(acc, wm[kh * kw_n + kw], run(kh, kw));
            }
        }
        false
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn plane_fma(&self, xc: &[f32], wm: &[f32], b: f32, clamp: Option<(f32, f32)>, residual: bool, scratch: &mut [f32], out: &mut [f32]) {
        self.plane::<true>(xc, wm, b, clamp, residual, scratch, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn plane_dispatch(&self, fma: bool, xc: &[f32], wm: &[f32], b: f32, clamp: Option<(f32, f32)>, residual: bool, scratch: &mut [f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if fma {
            // SAFETY: `fma` is true only when the CPU supports AVX2 and FMA.
            return unsafe { self.plane_fma(xc, wm, b, clamp, residual, scratch, out) };
        }
        let _ = fma;
        self.plane::<false>(xc, wm, b, clamp, residual, scratch, out)
    }
}

/// Depthwise 1-D/2-D convolution. Each channel plane is first copied into zero-padded
/// "phase" planes (phase (qh, qw) holds the padded positions congruent to (qh, qw)
/// modulo the strides), so that every tap reads the plane as one contiguous run: the
/// whole output plane is then a flat vector (computed at the phase width, extra
/// columns dropped), which vectorises well even for 7x7 planes.
fn depthwise_2d_f32(p: &ConvProblem, x: &[f32], w: &[f32], epi: Epilogue, y: &mut [f32]) {
    let Epilogue { bias, act, residual } = epi;
    let g = &p.geo;
    let (in_size, out_size) = (g.input_size(), g.output_size());
    let multiplier = p.out_per_group();
    let plan = DepthwisePlan::new(g);
    let ksize = g.kernel_size();
    let fma = cpu::has_avx2();
    let clamp = act.and_then(|k| conv_small_k::as_clamp(Some(k)));
    let one_plane = |plane: usize, out: &mut [f32], scratch: &mut [f32]| {
        let (img, m) = (plane / p.out_channels, plane % p.out_channels);
        let xc = &x[(img * p.in_channels + m / multiplier) * in_size..][..in_size];
        let wm = &w[m * ksize..][..ksize];
        plan.plane_dispatch(fma, xc, wm, bias.map_or(0.0, |b| b[m]), clamp, residual, scratch, out);
        if let (None, Some(k)) = (clamp, act) {
            k.apply_slice_f32_fast(out);
        }
    };
    #[cfg(target_arch = "x86_64")]
    if conv_depthwise8::applies(p) {
        // Blocks of eight channels (see conv_depthwise8.rs), the odd channels per plane.
        let blocks = p.in_channels / 8;
        let out = SharedOut(y.as_mut_ptr());
        cpu::par_ranges(p.batch * blocks, 8 * out_size * (2 * ksize + 2), |a, b| {
            cpu::with_scratch(conv_depthwise8::scratch_len(p), |scratch| {
                for t in a..b {
                    let (img, c0) = (t / blocks, t % blocks * 8);
                    // SAFETY: applies() held; this task alone writes planes c0..c0 + 8 of img.
                    unsafe {
                        let yi = out.ptr().add(img * p.out_channels * out_size);
                        conv_depthwise8::block8(p, x[img * p.in_channels * in_size..].as_ptr(), w, c0, bias, clamp, residual, yi, scratch);
                        if let (None, Some(k)) = (clamp, act) {
                            k.apply_slice_f32_fast(std::slice::from_raw_parts_mut(yi.add(c0 * out_size), 8 * out_size));
                        }
                    }
                }
            })
        });
        cpu::with_scratch(plan.scratch_len(), |scratch| {
            scratch.fill(0.0);
            for (plane, plane_out) in y.chunks_mut(out_size).enumerate().filter(|(pl, _)| pl % p.out_channels >= blocks * 8) {
                one_plane(plane, plane_out, scratch);
            }
        });
        return;
    }
    cpu::par_chunks_mut(y, out_size, 2 * ksize + 2, |first, planes| {
        cpu::with_scratch(plan.scratch_len(), |scratch| {
            scratch.fill(0.0);
            for (i, out) in planes.chunks_mut(out_size).enumerate() {
                one_plane(first + i, out, scratch);
            }
        })
    });
}

/// Direct convolution in f64 (for f64, f16 and bf16 tensors).
pub(crate) fn conv_f64(p: &ConvProblem, x: &[f64], w: &[f64], bias: Option<&[f64]>, y: &mut [f64]) {
    let g = &p.geo;
    let (cg, mg) = (p.in_per_group(), p.out_per_group());
    let (in_size, out_size, ksize) = (g.input_size(), g.output_size(), g.kernel_size());
    let [_, oh_n, ow_n] = g.output;
    cpu::par_chunks_mut(y, out_size, cg * ksize * 2, |first, planes| {
        for (i, out) in planes.chunks_mut(out_size).enumerate() {
            let plane = first + i;
            let (img, m) = (plane / p.out_channels, plane % p.out_channels);
            let grp = m / mg;
            for (pix, o) in out.iter_mut().enumerate() {
                let (od, oh, ow) = (pix / (oh_n * ow_n), pix / ow_n % oh_n, pix % ow_n);
                let mut acc = bias.map_or(0.0, |b| b[m]);
                for c in 0..cg {
                    let xc = &x[(img * p.in_channels + grp * cg + c) * in_size..][..in_size];
                    for k in 0..ksize {
                        let (kd, kh, kw) = (k / (g.kernel[1] * g.kernel[2]), k / g.kernel[2] % g.kernel[1], k % g.kernel[2]);
                        let pos = [(od, kd, 0), (oh, kh, 1), (ow, kw, 2)].map(|(o, k, d)| {
                            (o * g.stride[d]) as i64 - g.pad_begin[d] + (k * g.dilation[d]) as i64
                        });
                        if (0..3).all(|d| pos[d] >= 0 && pos[d] < g.input[d] as i64) {
                            let idx = (pos[0] as usize * g.input[1] + pos[1] as usize) * g.input[2] + pos[2] as usize;
                            acc += xc[idx] * w[(m * cg + c) * ksize + k];
                        }
                    }
                }
                *o = acc;
            }
        }
    });
}
