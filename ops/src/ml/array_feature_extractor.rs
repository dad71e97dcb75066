//! ArrayFeatureExtractor (ai.onnx.ml 1): selects elements of the last axis of `X` by
//! the int64 `Y` indices (all of them, flattened): `[..., N]` -> `[..., count]`, and a
//! 1-D `X` gives `[1, count]` (as onnxruntime). An index outside `[0, N)` is an error
//! (onnxruntime's rule; negative indices do not count from the end). String `X` runs on
//! the CPU only.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct ArrayFeatureExtractor;

impl ArrayFeatureExtractor {
    /// (rows, N, count) and the output type.
    fn plan(inputs: &[Option<Arg>]) -> Result<(usize, usize, usize, TensorType)> {
        let x = required(inputs, 0)?;
        expect_dtype(inputs, 1, &[DType::I64])?;
        let count = required(inputs, 1)?.ty.len();
        let (rows, n, mut dims) = match x.dims() {
            [] => return Err(OpError::input(0, "X must have rank >= 1")),
            [n] => (1, *n, vec![1]),
            d => (d[..d.len() - 1].iter().product(), d[d.len() - 1], d[..d.len() - 1].to_vec()),
        };
        if count == 0 {
            return Err(OpError::input(1, "Y must hold at least one index"));
        }
        dims.push(count);
        Ok((rows, n, count, TensorType::new(x.dtype(), dims)))
    }
}

impl Op for ArrayFeatureExtractor {
    fn name(&self) -> &str {
        "ArrayFeatureExtractor"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![Self::plan(inputs)?.3])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn handles_strings(&self) -> bool {
        true
    }
}

impl CpuKernel for ArrayFeatureExtractor {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (rows, n, count, out) = crate::tensor::tensor_args(inputs, Self::plan)?;
        let x = cpu::input(inputs, 0)?;
        let idx = cpu::input(inputs, 1)?.to_i64_vec()?;
        if let Some(bad) = idx.iter().find(|&&j| j < 0 || j >= n as i64) {
            return Err(OpError::input(1, format!("index {bad} is out of range for a last axis of {n}")));
        }
        if let Ok(s) = x.as_strings() {
            let picked = (0..rows).flat_map(|r| idx.iter().map(move |&j| s[r * n + j as usize].clone())).collect();
            outputs[0] = Tensor::from_strings(&out.dims, picked)?;
            return Ok(());
        }
        let size = x.dtype().size();
        let src = x.bytes();
        let mut dst = vec![0u8; rows * count * size];
        for r in 0..rows {
            for (k, &j) in idx.iter().enumerate() {
                let from = (r * n + j as usize) * size;
                dst[(r * count + k) * size..][..size].copy_from_slice(&src[from..from + size]);
            }
        }
        outputs[0] = Tensor::from_bytes(out.dtype, &out.dims, &dst)?;
        Ok(())
    }
}

impl WgslKernel for ArrayFeatureExtractor {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (_, n, count, _) = Self::plan(inputs)?;
        if outputs[0].dtype.is_string() {
            return Err(OpError::Unsupported("string tensors stay on the host".into()));
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let body = format!(
            "let j = idx[i % {count}u];\n    if (j < 0 || j >= {n}i) {{ {} y[i] = {}; return; }}\n    y[i] = x[(i / {count}u) * {n}u + u32(j)];",
            wgsl::report_index_error("j", &format!("{n}i")),
            wgsl::literal(ty, 0.0)
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "ArrayFeatureExtractor",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", ty, true), ("idx", "i32", true), ("y", ty, false)],
            vec![Binding::Input(0), Binding::Input(1), Binding::Output(0), Binding::Status],
            &wgsl::status_decl(3),
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.ml", "ArrayFeatureExtractor", |_| Ok(Box::new(ArrayFeatureExtractor)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    fn case(x: kiln_graph::Tensor, idx: &[i64]) -> Case {
        Case::new("ArrayFeatureExtractor").domain("ai.onnx.ml").opset(1).input(x).input(i64_vec(idx))
    }

    #[test]
    fn selects_along_the_last_axis() {
        let x = iota_f32(&[2, 3, 4]);
        let got = case(x, &[3, 0, 3]).run_cpu().unwrap();
        assert_eq!(got[0].dims(), &[2, 3, 3]);
        let want: Vec<f64> = (0..6).flat_map(|r| [3, 0, 3].map(|j| (r * 4 + j) as f64)).collect();
        assert_close(&got[0], &want, 0.0, "3-D");
        let got = case(i64_vec(&[5, 6, 7]), &[2]).run_cpu().unwrap();
        assert_eq!((got[0].dims(), got[0].to_i64_vec().unwrap()), (&[1usize, 1][..], vec![7]));
        assert!(case(iota_f32(&[2, 3]), &[3]).run_cpu().is_err());
        assert!(case(iota_f32(&[2, 3]), &[-1]).run_cpu().is_err());
        let got = case(strs(&[2, 2], &["a", "b", "c", "d"]), &[1, 1, 0]).run_cpu().unwrap();
        assert_eq!((got[0].dims(), got[0].as_strings().unwrap()), (&[2usize, 3][..], &["b", "b", "a", "d", "d", "c"].map(String::from)[..]));
    }
}
