//! GroupNormalization (opset 18/21): the C channels of `X (N, C, ..)` split into
//! `num_groups` groups; each (n, group) block of `C / G * spatial` contiguous elements
//! is normalised by its mean and variance, then scaled and shifted. Opset 21 takes
//! per-channel `scale`/`bias` (C values); opset 18 per-group ones (G values). WGSL: one
//! invocation per block, or a workgroup of lanes per big block ([`super::plane_lanes`]).
use super::plane_lanes::{lane_loop, lanes_dispatch, plane_lanes, tree};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct GroupNorm {
    groups: usize,
    epsilon: f32,
    /// Opset >= 21: scale and bias per channel (else per group).
    per_channel: bool,
}

/// Dims of one application: channels per group, spatial size per channel.
struct Blocks {
    channels_per_group: usize,
    spatial: usize,
    /// N * groups.
    count: usize,
}

impl GroupNorm {
    fn blocks(&self, x: &[usize]) -> Result<Blocks> {
        if x.len() < 2 {
            return Err(OpError::input(0, format!("expected (N, C, ..), found shape {x:?}")));
        }
        if !x[1].is_multiple_of(self.groups) {
            return Err(OpError::input(0, format!("{} channels cannot be split into num_groups = {} groups", x[1], self.groups)));
        }
        Ok(Blocks { channels_per_group: x[1] / self.groups, spatial: x[2..].iter().product(), count: x[0] * self.groups })
    }

    fn param_len(&self, x: &[usize]) -> usize {
        if self.per_channel { x[1] } else { self.groups }
    }
}

impl Op for GroupNorm {
    fn name(&self) -> &str {
        "GroupNormalization"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        self.blocks(x.dims())?;
        let want = self.param_len(x.dims());
        for (i, what) in [(1, "scale"), (2, "bias")] {
            let a = required(inputs, i)?;
            if a.dims() != [want] {
                let per = if self.per_channel { "channel" } else { "group" };
                return Err(OpError::input(i, format!("{what} must be a vector of {want} (one per {per}), found {}", a.ty)));
            }
        }
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 5 * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GroupNorm {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let b = self.blocks(x.dims())?;
        let size = b.channels_per_group * b.spatial;
        if size == 0 || b.count == 0 {
            return Ok(());
        }
        let (scale, bias) = (cpu::input(inputs, 1)?.to_f64_vec(), cpu::input(inputs, 2)?.to_f64_vec());
        let eps = self.epsilon as f64;
        // (scale, shift) of element k of block `blk`, given its mean and 1/std.
        let param = |blk: usize, k: usize| {
            let g = blk % self.groups;
            if self.per_channel { g * b.channels_per_group + k / b.spatial } else { g }
        };
        let stats = |v: &mut dyn Iterator<Item = f64>| {
            let vals: Vec<f64> = v.collect();
            let mean = vals.iter().sum::<f64>() / size as f64;
            let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / size as f64;
            (mean, 1.0 / (var + eps).sqrt())
        };
        if x.dtype() == DType::F32 {
            let xs = x.as_slice::<f32>()?;
            cpu::par_chunks_mut(outputs[0].as_mut_slice::<f32>()?, size, 4, |first, part| {
                for (r, yr) in part.chunks_mut(size).enumerate() {
                    let blk = first + r;
                    let xr = &xs[blk * size..][..size];
                    let (mean, inv) = stats(&mut xr.iter().map(|&v| v as f64));
                    for (k, (y, &v)) in yr.iter_mut().zip(xr).enumerate() {
                        let p = param(blk, k);
                        *y = ((v as f64 - mean) * inv * scale[p] + bias[p]) as f32;
                    }
                }
            });
        } else {
            let mut y = x.to_f64_vec();
            for (blk, yr) in y.chunks_mut(size).enumerate() {
                let (mean, inv) = stats(&mut yr.iter().copied());
                for (k, v) in yr.iter_mut().enumerate() {
                    let p = param(blk, k);
                    *v = (*v - mean) * inv * scale[p] + bias[p];
                }
            }
            outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        }
        Ok(())
    }
}

impl WgslKernel for GroupNorm {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let b = self.blocks(required(inputs, 0)?.dims())?;
        let size = b.channels_per_group * b.spatial;
        if size == 0 || b.count == 0 {
            return Ok(WgslProgram::default());
        }
        let g = self.groups;
        let param = if self.per_channel { format!("(i % {g}u) * {}u + j / {}u", b.channels_per_group, b.spatial) } else { format!("i % {g}u") };
        let nl = wgsl::literal("f32", size as f64);
        let eps = wgsl::literal("f32", self.epsilon as f64);
        let buffers = [("x", "f32", true), ("scale", "f32", true), ("bias", "f32", true), ("y", "f32", false)];
        let bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2), Binding::Output(0)];
        let write = format!("let p = {param};\ny[base + j] = (x[base + j] - mean) * inv * scale[p] + bias[p];");
        let lanes = plane_lanes(self.name(), size, 3, 2)?;
        if lanes == 1 {
            let n = format!("{size}u");
            let body = format!(
                "let base = i * {size}u;\n    var mean = 0.0;\n    {}    mean = mean / {nl};\n    var v = 0.0;\n    {}    let inv = 1.0 / sqrt(v / {nl} + {eps});\n    {}",
                wgsl::for_loop("j", "0u", &n, "1u", "mean = mean + x[base + j];"),
                wgsl::for_loop("j", "0u", &n, "1u", "let d = x[base + j] - mean;\nv = v + d * d;"),
                wgsl::for_loop("j", "0u", &n, "1u", &write),
            );
            let wg = tune.get(&wgsl::workgroup_param());
            return Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), b.count, wg, &buffers, bindings, "", &body)));
        }
        let sum = "red[lid.x] + red[lid.x + w]";
        let body = format!(
            "let base = i * {size}u;\n    var t = 0.0;\n    {}    {}    let mean = red[0] / {nl};\n    workgroupBarrier();\n    t = 0.0;\n    {}    {}    let inv = 1.0 / sqrt(red[0] / {nl} + {eps});\n    {}",
            lane_loop(size, lanes, "t = t + x[base + j];"),
            tree(lanes, sum),
            lane_loop(size, lanes, "let d = x[base + j] - mean;\nt = t + d * d;"),
            tree(lanes, sum),
            lane_loop(size, lanes, &write),
        );
        Ok(WgslProgram::single(lanes_dispatch(self.name(), b.count, lanes, &buffers, bindings, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GroupNormalization", |spec: &NodeSpec| {
        let groups = spec.int("num_groups", 0)?;
        if groups <= 0 {
            return Err(spec.bad("num_groups", format!("expected a positive group count, found {groups}")));
        }
        if spec.int("stash_type", 1)? != 1 {
            return Err(spec.bad("stash_type", "only stash_type=1 (f32 statistics) is supported"));
        }
        Ok(Box::new(GroupNorm { groups: groups as usize, epsilon: spec.float("epsilon", 1e-5)?, per_channel: spec.opset >= 21 }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, rand_f32, run};
    use crate::{NodeSpec, Registry};
    use kiln_graph::{Attr, Node};

    fn op(groups: i64, opset: i64) -> Box<dyn crate::Op> {
        let node = Node {
            name: "gn".into(),
            op_type: "GroupNormalization".into(),
            domain: String::new(),
            attrs: [("num_groups".to_string(), Attr::Int(groups))].into_iter().collect(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
        };
        Registry::builtin().create(&NodeSpec::new(&node, opset)).unwrap()
    }

    #[test]
    fn group_norm_matches_a_reference_in_both_opsets() {
        for (dims, groups) in [(vec![3usize, 4, 2, 3], 2usize), (vec![2, 6, 5], 3), (vec![1, 4, 70, 70], 2), (vec![2, 3], 3)] {
            for opset in [18, 21] {
                let (n, c) = (dims[0], dims[1]);
                let spatial: usize = dims[2..].iter().product();
                let plen = if opset >= 21 { c } else { groups };
                let (x, s, b) = (rand_f32(&dims, 1), rand_f32(&[plen], 2), rand_f32(&[plen], 3));
                let y = run(op(groups as i64, opset).as_ref(), &as_inputs(&[Some(&x), Some(&s), Some(&b)], &[]), &[]).unwrap().remove(0);
                let (xv, sv, bv) = (x.to_f64_vec(), s.to_f64_vec(), b.to_f64_vec());
                let size = c / groups * spatial;
                let mut want = vec![];
                for blk in 0..n * groups {
                    let r = &xv[blk * size..][..size];
                    let mean = r.iter().sum::<f64>() / size as f64;
                    let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / size as f64;
                    for (k, v) in r.iter().enumerate() {
                        let p = if opset >= 21 { (blk % groups) * (c / groups) + k / spatial } else { blk % groups };
                        want.push((v - mean) / (var + 1e-5f32 as f64).sqrt() * sv[p] + bv[p]);
                    }
                }
                assert_close(&y, &want, 1e-4, &format!("GroupNormalization {dims:?} opset {opset}"));
            }
        }
        let err = run(op(3, 21).as_ref(), &as_inputs(&[Some(&rand_f32(&[1, 4, 2], 1)), Some(&rand_f32(&[4], 2)), Some(&rand_f32(&[4], 3))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("num_groups"), "{err}");
        let err = run(op(2, 21).as_ref(), &as_inputs(&[Some(&rand_f32(&[1, 4, 2], 1)), Some(&rand_f32(&[2], 2)), Some(&rand_f32(&[4], 3))], &[]), &[]).unwrap_err();
        assert!(err.to_string().contains("one per channel"), "{err}");
    }
}
