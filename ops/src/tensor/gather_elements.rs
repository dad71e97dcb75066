//! GatherElements: `out[i] = data[i with its `axis` coordinate replaced by
//! indices[i]]`; the output has the shape of `indices` (negative indices count from
//! the end). Out-of-range indices are an error on the CPU and are clamped on the GPU.
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{norm_axis, Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;
use std::fmt::Write;

#[derive(Debug)]
pub struct GatherElements {
    axis: i64,
}

impl GatherElements {
    fn check(&self, data: &[usize], idx: &[usize]) -> Result<usize> {
        if data.is_empty() || data.len() != idx.len() {
            return Err(OpError::invalid(format!("data {data:?} and indices {idx:?} must have the same rank (>= 1)")));
        }
        let axis = norm_axis(self.axis, data.len())?;
        if let Some(d) = (0..data.len()).find(|&d| d != axis && idx[d] > data[d]) {
            return Err(OpError::input(1, format!("indices {idx:?} exceed data {data:?} in dim {d}")));
        }
        Ok(axis)
    }
}

impl Op for GatherElements {
    fn name(&self) -> &str {
        "GatherElements"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (data, idx) = (required(inputs, 0)?, required(inputs, 1)?);
        if !idx.dtype().is_int() {
            return Err(OpError::input(1, format!("indices must be integers, found {}", idx.dtype())));
        }
        self.check(data.dims(), idx.dims())?;
        Ok(vec![TensorType::new(data.dtype(), idx.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for GatherElements {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let data = cpu::input(inputs, 0)?;
        let it = cpu::input(inputs, 1)?;
        let axis = self.check(data.dims(), it.dims())?;
        let idx = it.to_i64_vec()?;
        let n = data.dims()[axis] as i64;
        let ds = strides(data.dims());
        let dims = it.dims().to_vec();
        let es = data.dtype().size();
        let src = data.bytes();
        let dst = outputs[0].bytes_mut();
        let mut coord = vec![0usize; dims.len()];
        for (o, &raw) in idx.iter().enumerate() {
            let j = if raw < 0 { raw + n } else { raw };
            if !(0..n).contains(&j) {
                return Err(OpError::input(1, format!("index {raw} at position {o} is out of range for axis {axis} of size {n}")));
            }
            let off: usize = coord.iter().enumerate().map(|(d, &c)| if d == axis { j as usize } else { c } * ds[d]).sum();
            dst[o * es..(o + 1) * es].copy_from_slice(&src[off * es..(off + 1) * es]);
            for d in (0..dims.len()).rev() {
                coord[d] += 1;
                if coord[d] < dims[d] {
                    break;
                }
                coord[d] = 0;
            }
        }
        Ok(())
    }
}

impl WgslKernel for GatherElements {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let data = required(inputs, 0)?;
        let dims = outputs[0].dims.clone();
        let axis = self.check(data.dims(), &dims)?;
        let ds = strides(data.dims());
        let n = data.dims()[axis];
        let ty = wgsl::elem(data.dtype());
        let mut body = String::from("var r = i;\n    var off = 0u;\n");
        let _ = writeln!(
            body,
            "    var j = idx[i];\n    if (j < 0) {{ j = j + {n}; }}\n    if (j < 0 || j >= {n}) {{ {} out[i] = {}; return; }}\n    let ju = u32(j);",
            wgsl::report_index_error("idx[i]", &format!("{n}i")),
            wgsl::literal(ty, 0.0)
        );
        for d in (0..dims.len()).rev() {
            let c = if d == 0 { "r".to_string() } else { format!("(r % {}u)", dims[d]) };
            if d == axis {
                let _ = writeln!(body, "    off = off + ju * {}u;", ds[d]);
            } else {
                let _ = writeln!(body, "    off = off + {c} * {}u;", ds[d]);
            }
            if d > 0 {
                let _ = writeln!(body, "    r = r / {}u;", dims[d]);
            }
        }
        body += "    out[i] = data[off];";
        let buffers = [("data", ty, true), ("idx", "i32", true), ("out", ty, false)];
        let wg = tune.get(&wgsl::workgroup_param());
        let b = vec![Binding::Input(0), Binding::Input(1), Binding::Output(0), Binding::Status];
        Ok(WgslProgram::single(wgsl::simple_kernel("GatherElements", outputs[0].len(), wg, &buffers, b, &wgsl::status_decl(3), &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "GatherElements", |spec| Ok(Box::new(GatherElements { axis: spec.int("axis", 0)? })));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::DType;

    #[test]
    fn gathers_along_each_axis_and_rejects_bad_indices() {
        let data = Tensor::from_slice(&[2, 3], &[1i64, 2, 3, 4, 5, 6]).unwrap();
        let idx = Tensor::from_slice(&[2, 2], &[0i64, -1, 2, 0]).unwrap();
        let op = GatherElements { axis: 1 };
        let mut out = vec![Tensor::zeros(DType::I64, &[2, 2])];
        op.run(&[Some(&data), Some(&idx)], &mut out).unwrap();
        assert_eq!(out[0].as_slice::<i64>().unwrap(), &[1, 3, 6, 4]);
        let op0 = GatherElements { axis: 0 };
        let idx0 = Tensor::from_slice(&[1, 3], &[1i64, 0, 1]).unwrap();
        let mut out0 = vec![Tensor::zeros(DType::I64, &[1, 3])];
        op0.run(&[Some(&data), Some(&idx0)], &mut out0).unwrap();
        assert_eq!(out0[0].as_slice::<i64>().unwrap(), &[4, 2, 6]);
        let far = Tensor::from_slice(&[1, 1], &[7i64]).unwrap();
        let mut o = vec![Tensor::zeros(DType::I64, &[1, 1])];
        assert!(op.run(&[Some(&data), Some(&far)], &mut o).is_err());
        let (td, ti) = (TensorType::new(DType::F32, vec![2, 3]), TensorType::new(DType::I64, vec![2, 2]));
        let args = [Some(Arg { ty: &td, value: None }), Some(Arg { ty: &ti, value: None })];
        let ty = op.infer(&args).unwrap();
        let prog = op.generate(&args, &ty, &TuneValues::default()).unwrap();
        crate::wgsl::testing::validate(&prog.dispatches[0].source);
        let wrong_rank = TensorType::new(DType::I64, vec![4]);
        assert!(op.infer(&[args[0], Some(Arg { ty: &wrong_rank, value: None })]).is_err());
    }
}
