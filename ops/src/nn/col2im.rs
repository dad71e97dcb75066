//! Col2Im (opset 18): the inverse of im2col. `input (N, C * prod(block_shape), L)`
//! holds, for each of the `L` sliding blocks of an image of `image_shape` (padded by
//! `pads`, blocks `strides` apart, taps `dilations` apart), the block's values; they
//! are summed back into `(N, C, image_shape...)`, overlapping taps adding up. Any
//! number of spatial dims; `image_shape` and `block_shape` are inputs whose values
//! must be known. `L` must equal the number of blocks that fit, as onnxruntime checks.
//!
//! WGSL: one invocation per output pixel gathers the taps that land on it (a loop over
//! the block's `prod(block_shape)` offsets, at most [`wgsl::MAX_LOOP_ITERATIONS`]).
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct Col2Im {
    dilations: Option<Vec<i64>>,
    pads: Option<Vec<i64>>,
    strides: Option<Vec<i64>>,
}

/// The geometry of one application.
#[derive(Clone, Debug)]
struct Plan {
    n: usize,
    c: usize,
    image: Vec<usize>,
    block: Vec<usize>,
    /// Blocks per spatial dim.
    blocks: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads_begin: Vec<usize>,
}

impl Plan {
    /// Elements per block (rows of the input per channel).
    fn k(&self) -> usize {
        self.block.iter().product()
    }
    fn l(&self) -> usize {
        self.blocks.iter().product()
    }
    fn out_dims(&self) -> Vec<usize> {
        [self.n, self.c].into_iter().chain(self.image.iter().copied()).collect()
    }
}

/// The known integer values of input `i`.
fn shape_input(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<Vec<i64>> {
    let t = constant(inputs, i, what)?;
    if !t.dtype().is_int() || t.rank() != 1 {
        return Err(OpError::input(i, format!("{what} must be a 1-D integer tensor, found {}{:?}", t.dtype(), t.dims())));
    }
    Ok(t.to_i64_vec()?)
}

impl Col2Im {
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<Plan> {
        expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?.dims();
        let image = shape_input(inputs, 1, "Col2Im's image_shape")?;
        let block = shape_input(inputs, 2, "Col2Im's block_shape")?;
        let r = image.len();
        if r == 0 || block.len() != r {
            return Err(OpError::input(2, format!("Col2Im's block_shape {block:?} must have one value per dim of image_shape {image:?} (at least one)")));
        }
        if image.iter().any(|&v| v < 1) || block.iter().any(|&v| v < 1) {
            return Err(OpError::input(1, format!("Col2Im's image_shape {image:?} and block_shape {block:?} must be positive")));
        }
        let attr = |v: &Option<Vec<i64>>, name: &str, len: usize, default: i64, min: i64| -> Result<Vec<usize>> {
            let v = v.clone().unwrap_or_else(|| vec![default; len]);
            if v.len() != len || v.iter().any(|&x| x < min) {
                return Err(OpError::Attr { attr: name.into(), what: format!("must be {len} values of at least {min} for a {r}-D image, found {v:?}") });
            }
            Ok(v.iter().map(|&x| x as usize).collect())
        };
        let strides = attr(&self.strides, "strides", r, 1, 1)?;
        let dilations = attr(&self.dilations, "dilations", r, 1, 1)?;
        let pads = attr(&self.pads, "pads", 2 * r, 0, 0)?;
        let too_big = || OpError::invalid(format!("Col2Im: image_shape {image:?}, block_shape {block:?} and pads {pads:?} overflow"));
        let mut blocks = vec![];
        for d in 0..r {
            let reach = (dilations[d] as u64).checked_mul(block[d] as u64 - 1).ok_or_else(too_big)? + 1;
            let padded = (image[d] as u64).checked_add(pads[d] as u64 + pads[d + r] as u64).ok_or_else(too_big)?;
            if padded < reach {
                return Err(OpError::invalid(format!(
                    "Col2Im: a block reaching {reach} elements does not fit dim {d} of the padded image ({padded} elements)"
                )));
            }
            blocks.push(((padded - reach) / strides[d] as u64 + 1) as usize);
        }
        let to_usize = |v: &[i64]| v.iter().map(|&x| usize::try_from(x).map_err(|_| too_big())).collect::<Result<Vec<usize>>>();
        let (image, block) = (to_usize(&image)?, to_usize(&block)?);
        let k = kiln_graph::size::elements(&block).map_err(|e| OpError::invalid(format!("Col2Im: {e}")))?;
        if x.len() != 3 || x[1] % k != 0 {
            return Err(OpError::input(0, format!("Col2Im's input must have shape (N, C * {k}, L) for block_shape {block:?}, found {x:?}")));
        }
        let l = kiln_graph::size::elements(&blocks).map_err(|e| OpError::invalid(format!("Col2Im: {e}")))?;
        if x[2] != l {
            return Err(OpError::input(
                0,
                format!("Col2Im's input has {} blocks (dim 2) but image_shape {image:?}, block_shape {block:?}, pads, strides and dilations give {l}", x[2]),
            ));
        }
        let pads_begin = pads[..r].to_vec();
        Ok(Plan { n: x[0], c: x[1] / k, image, block, blocks, strides, dilations, pads_begin })
    }
}

impl Op for Col2Im {
    fn name(&self) -> &str {
        "Col2Im"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let p = self.plan(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), p.out_dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: inputs.first().copied().flatten().map_or(0, |a| a.ty.len() as u64), bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Col2Im {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = crate::tensor::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let xv = x.to_f64_vec();
        let (k, l, r) = (p.k(), p.l(), p.image.len());
        let plane: usize = p.image.iter().product();
        let image_strides = crate::broadcast::strides(&p.image);
        // Per dim d, the offset in the plane of tap k_d of block b_d (at
        // `[k_d * blocks_d + b_d]`), or -1 outside the image.
        let dim_offsets: Vec<Vec<i64>> = (0..r)
            .map(|d| {
                let (blocks, size) = (p.blocks[d], p.image[d] as i64);
                (0..p.block[d] * blocks)
                    .map(|kb| {
                        let pix = ((kb % blocks) * p.strides[d] + (kb / blocks) * p.dilations[d]) as i64 - p.pads_begin[d] as i64;
                        if (0..size).contains(&pix) { pix * image_strides[d] as i64 } else { -1 }
                    })
                    .collect()
            })
            .collect();
        let mut y = vec![0f64; p.n * p.c * plane];
        cpu::par_chunks_mut(&mut y, plane, k * l, |first, part| {
            // One tap's target offsets for every block (-1: outside the image).
            let mut row = vec![0i64; l];
            let (mut kk, mut bb) = (vec![0usize; r], vec![0usize; r]);
            for (j, out) in part.chunks_mut(plane).enumerate() {
                let cols = &xv[(first + j) * k * l..][..k * l];
                for t in 0..k {
                    let mut rem = t;
                    for d in (0..r).rev() {
                        kk[d] = rem % p.block[d];
                        rem /= p.block[d];
                    }
                    bb.fill(0);
                    for target in row.iter_mut() {
                        let mut off = 0i64;
                        for d in 0..r {
                            let o = dim_offsets[d][kk[d] * p.blocks[d] + bb[d]];
                            off = if o < 0 || off < 0 { -1 } else { off + o };
                        }
                        *target = off;
                        // Next block, innermost dim fastest.
                        for d in (0..r).rev() {
                            bb[d] += 1;
                            if bb[d] < p.blocks[d] {
                                break;
                            }
                            bb[d] = 0;
                        }
                    }
                    for (v, &o) in cols[t * l..(t + 1) * l].iter().zip(&row) {
                        if o >= 0 {
                            out[o as usize] += v;
                        }
                    }
                }
            }
        });
        outputs[0] = Tensor::from_f64(x.dtype(), &p.out_dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for Col2Im {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.plan(inputs)?;
        let len = outputs[0].len();
        if len == 0 {
            return Ok(WgslProgram::default());
        }
        let (k, l, r) = (p.k(), p.l(), p.image.len());
        if k > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "Col2Im with blocks of {k} elements: the GPU kernel loops over a block per pixel, at most {}; the CPU runs it",
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        let plane: usize = p.image.iter().product();
        let (block_strides, blocks_strides) = (crate::broadcast::strides(&p.block), crate::broadcast::strides(&p.blocks));
        let mut body = format!("let nc = i / {plane}u;\n    var rem = i % {plane}u;\n");
        for d in (0..r).rev() {
            let _ = writeln!(body, "    let p{d} = i32(rem % {}u);\n    rem = rem / {}u;", p.image[d], p.image[d]);
        }
        let _ = writeln!(body, "    let base = nc * {}u;\n    var acc = 0.0;", k * l);
        let mut tap = String::new();
        for d in 0..r {
            let _ = writeln!(
                tap,
                "        let t{d} = p{d} + {pad} - i32((t / {bs}u) % {b}u) * {dil};\n        \
                 if (t{d} < 0 || t{d} % {s} != 0 || t{d} / {s} >= {n}) {{ continue; }}\n        \
                 l = l + u32(t{d} / {s}) * {ls}u;",
                pad = p.pads_begin[d],
                bs = block_strides[d],
                b = p.block[d],
                dil = p.dilations[d],
                s = p.strides[d],
                n = p.blocks[d],
                ls = blocks_strides[d],
            );
        }
        body += &wgsl::for_loop("t", "0u", &format!("{k}u"), "1u", &format!("        var l = 0u;\n{tap}        acc = acc + x[base + t * {l}u + l];"));
        body += "    y[i] = acc;";
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("x", "f32", true), ("y", "f32", false)];
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), len, wg, &buffers, vec![Binding::Input(0), Binding::Output(0)], "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Col2Im", |spec: &NodeSpec| {
        Ok(Box::new(Col2Im { dilations: spec.ints_opt("dilations")?, pads: spec.ints_opt("pads")?, strides: spec.ints_opt("strides")? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn col2im(x: Tensor, image: &[i64], block: &[i64], attrs: &[(&str, Attr)]) -> Case {
        Case::new("Col2Im").opset(18).input(x).constant(i64_vec(image)).constant(i64_vec(block)).attrs(attrs)
    }

    /// An f64 reference written from the spec: every (tap, block) pair adds its value
    /// at `block * stride + tap * dilation - pad` when that lies in the image (2-D).
    fn reference(x: &[f64], (n, c): (usize, usize), img: [usize; 2], blk: [usize; 2], s: [usize; 2], dil: [usize; 2], pads: [usize; 4]) -> Vec<f64> {
        let nb = |d: usize| (img[d] + pads[d] + pads[d + 2] - (dil[d] * (blk[d] - 1) + 1)) / s[d] + 1;
        let (bh, bw) = (nb(0), nb(1));
        let mut y = vec![0.0; n * c * img[0] * img[1]];
        for b in 0..n * c {
            for ky in 0..blk[0] {
                for kx in 0..blk[1] {
                    for by in 0..bh {
                        for bx in 0..bw {
                            let py = (by * s[0] + ky * dil[0]) as i64 - pads[0] as i64;
                            let px = (bx * s[1] + kx * dil[1]) as i64 - pads[1] as i64;
                            if py >= 0 && px >= 0 && (py as usize) < img[0] && (px as usize) < img[1] {
                                let row = ky * blk[1] + kx;
                                y[(b * img[0] + py as usize) * img[1] + px as usize] += x[(b * blk[0] * blk[1] + row) * bh * bw + by * bw + bx];
                            }
                        }
                    }
                }
            }
        }
        y
    }

    #[test]
    fn matches_onnxruntime_and_a_reference() {
        // onnxruntime 1.32: 1..=24 as (1, 4, 6) into 3x4 with 2x2 blocks.
        let x = f32s(&[1, 4, 6], &(1..=24).map(|v| v as f32).collect::<Vec<_>>());
        let y = col2im(x, &[3, 4], &[2, 2], &[]).run_cpu().unwrap().remove(0);
        assert_close(&y, &[1.0, 9.0, 11.0, 9.0, 17.0, 48.0, 52.0, 33.0, 16.0, 39.0, 41.0, 24.0], 0.0, "onnxruntime");
        // Strides, dilations and asymmetric pads against the reference.
        for (img, blk, s, dil, pads) in [([5, 6], [2, 3], [1, 2], [2, 1], [1, 0, 0, 2]), ([7, 4], [3, 2], [2, 1], [1, 1], [1, 1, 1, 1]), ([4, 4], [1, 1], [1, 1], [1, 1], [0, 0, 0, 0])] {
            let nb = |d: usize| (img[d] + pads[d] + pads[d + 2] - (dil[d] * (blk[d] - 1) + 1)) / s[d] + 1;
            let dims = [2, 3 * blk[0] * blk[1], nb(0) * nb(1)];
            let x = rand_f32(&dims, 3);
            let attrs = [("strides", ints(&s.map(|v| v as i64))), ("dilations", ints(&dil.map(|v| v as i64))), ("pads", ints(&pads.map(|v| v as i64)))];
            let y = col2im(x.clone(), &img.map(|v| v as i64), &blk.map(|v| v as i64), &attrs).run_cpu().unwrap().remove(0);
            assert_eq!(y.dims(), &[2, 3, img[0], img[1]]);
            assert_close(&y, &reference(&x.to_f64_vec(), (2, 3), img, blk, s, dil, pads), 1e-6, &format!("{img:?} {blk:?} {s:?} {dil:?} {pads:?}"));
        }
        // 1-D and 3-D images (a 3-D image of 1x1x1 blocks is the identity).
        let x = rand_f32(&[1, 2, 24], 5);
        let y = col2im(x.clone(), &[2, 3, 4], &[1, 1, 1], &[]).run_cpu().unwrap().remove(0);
        assert_close(&y, &x.to_f64_vec(), 0.0, "3-D identity");
        let y = col2im(f32s(&[1, 2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), &[4], &[2], &[]).run_cpu().unwrap().remove(0);
        assert_close(&y, &[1.0, 6.0, 8.0, 6.0], 0.0, "1-D");
        let y64 = col2im(cast(&x, DType::F64), &[2, 3, 4], &[1, 1, 1], &[]).run_cpu().unwrap().remove(0);
        assert_eq!(y64.dtype(), DType::F64);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let err = |c: Case| c.run_cpu().unwrap_err().to_string();
        let e = err(col2im(rand_f32(&[1, 4, 5], 1), &[3, 4], &[2, 2], &[]));
        assert!(e.contains("has 5 blocks (dim 2) but image_shape [3, 4], block_shape [2, 2], pads, strides and dilations give 6"), "{e}");
        let e = err(col2im(rand_f32(&[1, 5, 6], 1), &[3, 4], &[2, 2], &[]));
        assert!(e.contains("must have shape (N, C * 4, L)"), "{e}");
        let e = err(col2im(rand_f32(&[1, 4, 6], 1), &[3, 4], &[2], &[]));
        assert!(e.contains("one value per dim of image_shape"), "{e}");
        let e = err(col2im(rand_f32(&[1, 4, 6], 1), &[1, 4], &[2, 2], &[]));
        assert!(e.contains("does not fit dim 0"), "{e}");
        let e = err(col2im(rand_f32(&[1, 4, 6], 1), &[3, 4], &[2, 2], &[("strides", ints(&[1]))]));
        assert!(e.contains("'strides'"), "{e}");
        let e = err(col2im(rand_f32(&[1, 4, 6], 1), &[3, 4], &[2, 0], &[]));
        assert!(e.contains("must be positive"), "{e}");
        let e = Case::new("Col2Im").opset(18).input(rand_f32(&[1, 4, 6], 1)).input(i64_vec(&[3, 4])).constant(i64_vec(&[2, 2])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("image_shape must be known"), "{e}");
    }
}
