//! Split: cuts the input along `axis` into several outputs. Sizes come from the
//! `split` attribute (opset < 13), the `split` input (13+), or equal parts by the
//! output count / `num_outputs` (18; the last part may be smaller).
use super::common::{opt_const_ints, tensor_args};
use super::index_map::{DimMap, IndexMap};
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Split {
    axis: i64,
    n_outputs: usize,
    split_attr: Option<Vec<i64>>,
}

impl Split {
    /// The axis and each output's size along it.
    fn sizes(&self, inputs: &[Option<Arg>]) -> Result<(usize, Vec<usize>)> {
        let x = required(inputs, 0)?;
        let axis = norm_axis(self.axis, x.rank())?;
        let dim = *x.dims().get(axis).ok_or_else(|| OpError::input(0, "Split needs an input of rank 1 or more"))?;
        let sizes: Vec<usize> = match self.split_attr.clone().map(Some).unwrap_or(opt_const_ints(inputs, 1, "Split's split")?) {
            Some(s) => {
                if s.len() != self.n_outputs || s.iter().any(|&v| v < 0) || s.iter().sum::<i64>() != dim as i64 {
                    return Err(OpError::invalid(format!(
                        "split {s:?} must give {} non-negative sizes summing to {dim} (axis {axis} of {:?})",
                        self.n_outputs,
                        x.dims()
                    )));
                }
                s.iter().map(|&v| v as usize).collect()
            }
            None => {
                let chunk = dim.div_ceil(self.n_outputs.max(1));
                (0..self.n_outputs).map(|k| chunk.min(dim.saturating_sub(k * chunk))).collect()
            }
        };
        Ok((axis, sizes))
    }

    /// One index map per output (the WGSL kernel's gathers).
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<Vec<IndexMap>> {
        let x = required(inputs, 0)?;
        let (axis, sizes) = self.sizes(inputs)?;
        let strides = crate::broadcast::strides(x.dims());
        let mut start = 0;
        Ok(sizes
            .iter()
            .map(|&n| {
                let mut m = IndexMap { out_dims: x.dims().to_vec(), maps: vec![DimMap::id(); x.rank()], strides: strides.clone(), base: 0 };
                m.out_dims[axis] = n;
                m.maps[axis] = DimMap::Affine { start: start as i64, step: 1 };
                start += n;
                m
            })
            .collect())
    }
}

impl Op for Split {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "Split"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = required(inputs, 0)?.dtype();
        Ok(self.plan(inputs)?.into_iter().map(|m| TensorType::new(dtype, m.out_dims)).collect())
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Split {
    /// Copies of contiguous runs: for each slab of the dims before the axis, each
    /// output's part of it, all in one parallel loop.
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (axis, sizes) = tensor_args(inputs, |a| self.sizes(a))?;
        let x = cpu::input(inputs, 0)?;
        let d = x.dims();
        let unit = d[axis + 1..].iter().product::<usize>() * x.dtype().size();
        let (outer, slab) = (d[..axis].iter().product::<usize>(), d[axis] * unit);
        if outputs.len() != sizes.len() {
            return Err(OpError::invalid(format!("Split has {} outputs, its sizes {sizes:?} give {}", outputs.len(), sizes.len())));
        }
        if x.dtype().is_string() {
            // Strings are not bytes: the same runs, cloned.
            let (xs, inner) = (x.as_strings()?, d[axis + 1..].iter().product::<usize>());
            let mut at = 0;
            for (out, &n) in outputs.iter_mut().zip(&sizes) {
                let mut dims = d.to_vec();
                dims[axis] = n;
                let v: Vec<String> = (0..outer).flat_map(|o| xs[(o * d[axis] + at) * inner..][..n * inner].iter().cloned()).collect();
                *out = Tensor::from_strings(&dims, v)?;
                at += n;
            }
            return Ok(());
        }
        let mut starts = Vec::with_capacity(sizes.len());
        let mut dsts = Vec::with_capacity(sizes.len());
        let mut at = 0;
        for (j, (out, &n)) in outputs.iter_mut().zip(&sizes).enumerate() {
            if out.dtype() != x.dtype() || out.bytes().len() != outer * n * unit {
                return Err(OpError::invalid(format!("Split output {j} must hold {outer} x {n} x {unit} bytes of {}", x.dtype())));
            }
            starts.push(at);
            at += n * unit;
            dsts.push(cpu::SharedPtr(out.bytes_mut().as_mut_ptr()));
        }
        let (src, parts) = (x.bytes(), sizes.len());
        let (sizes, starts, dsts) = (&sizes, &starts, &dsts);
        cpu::par_ranges(outer * parts, slab / parts.max(1) / 4 + 1, |a, b| {
            for t in a..b {
                let (o, j) = (t / parts, t % parts);
                let len = sizes[j] * unit;
                let from = &src[o * slab + starts[j]..][..len];
                // SAFETY: task (o, j) writes bytes o * len.. of output j only, inside it
                // (its length was checked above).
                unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dsts[j].get().add(o * len), len) };
            }
        });
        Ok(())
    }
}

impl WgslKernel for Split {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let maps = self.plan(inputs)?;
        let ty = wgsl::elem(required(inputs, 0)?.dtype());
        let wg = tune.get(&wgsl::workgroup_param());
        let dispatches = maps
            .iter()
            .enumerate()
            .filter(|(_, m)| m.out_dims.iter().product::<usize>() > 0)
            .map(|(k, m)| m.dispatch(&format!("Split[{k}]"), ty, wg, Binding::Input(0), Binding::Output(k), &wgsl::literal(ty, 0.0), &[]))
            .collect();
        let _ = outputs;
        Ok(WgslProgram { dispatches, scratch_bytes: vec![] })
    }
}

fn parse(spec: &NodeSpec) -> Result<Split> {
    let n_outputs = match spec.int_opt("num_outputs")? {
        Some(n) if n < 1 || n as usize != spec.n_outputs() => {
            return Err(spec.bad("num_outputs", format!("{n} differs from the node's {} outputs", spec.n_outputs())))
        }
        _ => spec.n_outputs(),
    };
    Ok(Split {
        axis: spec.int("axis", 0)?,
        n_outputs,
        split_attr: if spec.opset < 13 { spec.ints_opt("split")? } else { None },
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Split", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    #[test]
    fn split_variants() {
        let x = iota_i64(&[2, 7]);
        // opset 18 uneven: 7 into 3 -> 3, 3, 1
        let op = make("Split", 18, &[("axis", Attr::Int(1)), ("num_outputs", Attr::Int(3))], 1, 3).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap();
        assert_eq!(out.iter().map(|o| o.dims()[1]).collect::<Vec<_>>(), vec![3, 3, 1]);
        assert_eq!(out[2].to_f64_vec(), vec![6., 13.]);
        assert_eq!(out[1].to_f64_vec(), vec![3., 4., 5., 10., 11., 12.]);
        // opset 13 split input with a zero-size part
        let op = make("Split", 13, &[("axis", Attr::Int(-1))], 2, 3).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[3], &[2, 0, 5]))], &[1]), &[]).unwrap();
        assert_eq!(out[1].dims(), &[2, 0]);
        assert_eq!(out[0].to_f64_vec(), vec![0., 1., 7., 8.]);
        // opset 11 attribute on f32, default axis
        let f = iota_f32(&[3, 2]);
        let op = make("Split", 11, &[("split", ints(&[1, 2]))], 1, 2).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&f)], &[]), &[]).unwrap();
        assert_eq!(out[1].to_f64_vec(), vec![2., 3., 4., 5.]);
        // equal parts
        let op = make("Split", 13, &[], 1, 3).unwrap();
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&f)], &[]), &[]).unwrap()[2].to_f64_vec(), vec![4., 5.]);
        let op = make("Split", 13, &[("axis", Attr::Int(1))], 2, 2).unwrap();
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[3, 3]))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("summing to 7"), "{e}");
        // Strings, cloned.
        let st = Tensor::from_strings(&[2, 3], ["a", "b", "c", "d", "e", "f"].map(String::from).to_vec()).unwrap();
        let op = make("Split", 13, &[("axis", Attr::Int(1))], 2, 2).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&st), Some(&i64s(&[2], &[1, 2]))], &[1]), &[]).unwrap();
        assert_eq!(out[0].as_strings().unwrap(), ["a", "d"]);
        assert_eq!(out[1].as_strings().unwrap(), ["b", "c", "e", "f"]);
        // A middle axis, large enough for parallel copies, against the input read back.
        let (d, parts) = ([4usize, 9, 1000], [2usize, 3, 4]);
        let big = iota_f32(&d).to_f64_vec();
        let op = make("Split", 13, &[("axis", Attr::Int(1))], 2, 3).unwrap();
        let out = run(op.as_ref(), &as_inputs(&[Some(&iota_f32(&d)), Some(&i64s(&[3], &[2, 3, 4]))], &[1]), &[]).unwrap();
        let mut start = 0;
        for (o, n) in out.iter().zip(parts) {
            assert_eq!(o.dims(), &[4, n, 1000]);
            let want: Vec<f64> = (0..4).flat_map(|a| big[(a * 9 + start) * 1000..(a * 9 + start + n) * 1000].to_vec()).collect();
            assert_eq!(o.to_f64_vec(), want);
            start += n;
        }
    }
}
