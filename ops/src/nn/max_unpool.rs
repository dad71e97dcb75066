//! MaxUnpool (opset 9/11/22): the partial inverse of MaxPool. `X (N, C, D1..Dr)` is
//! scattered into a zero tensor at `I`, the indices MaxPool returned (offsets into the
//! whole flattened output, every element of X to one of them). The output's spatial
//! dims are `(in - 1) * stride + kernel - pad_begin - pad_end`, or the optional third
//! input `output_shape` (a known value; at least those dims, with X's N and C). An index
//! outside the output is an error; when indices repeat, the element of X that comes
//! last wins, as in onnxruntime's sequential loop.
//!
//! With `output_shape`, the indices are offsets into that output, as in onnxruntime
//! (and as MaxPool's indices of an input of that shape are). The ONNX reference
//! instead scatters into the unpooled shape and pads it at the ends to
//! `output_shape`; the node test `maxunpool_export_with_output_shape` follows the
//! reference, and Kiln's output differs from it exactly as onnxruntime's does.
//!
//! WGSL: three dispatches over one scratch word per output element: clear it, let each
//! input element `k` raise its target's word to `k + 1` (atomicMax, so the last
//! writer wins whatever the order of invocations), then each output element reads the
//! winner (or 0).
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const INTS: &[DType] = &[DType::I64, DType::I32];
const VALUES: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
];

#[derive(Debug)]
pub struct MaxUnpool {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    /// Begins then ends, one per spatial dim each.
    pads: Vec<usize>,
}

impl MaxUnpool {
    /// The output dims, after checking X, I and (when given) the output_shape value.
    fn out_dims(&self, inputs: &[Option<Arg>]) -> Result<Vec<usize>> {
        expect_dtype(inputs, 0, VALUES)?;
        expect_dtype(inputs, 1, INTS)?;
        let x = required(inputs, 0)?.dims();
        let r = self.kernel.len();
        if x.len() != r + 2 {
            return Err(OpError::input(0, format!("MaxUnpool with a {r}-D kernel_shape needs X of shape (N, C, D1..D{r}), found {x:?}")));
        }
        let i = required(inputs, 1)?.dims();
        if i != x {
            return Err(OpError::input(1, format!("MaxUnpool's indices must have X's shape {x:?}, found {i:?}")));
        }
        let mut dims = x.to_vec();
        for d in 0..r {
            let full = (x[d + 2] as i64 - 1) * self.strides[d] as i64 + self.kernel[d] as i64 - self.pads[d] as i64 - self.pads[d + r] as i64;
            if x[d + 2] > 0 && full < 0 {
                return Err(OpError::invalid(format!("MaxUnpool: the pads {:?} leave spatial dim {d} of {} elements negative", self.pads, x[d + 2])));
            }
            dims[d + 2] = full.max(0) as usize;
        }
        if inputs.get(2).copied().flatten().is_none() {
            return Ok(dims);
        }
        let shape = constant(inputs, 2, "MaxUnpool's output_shape")?;
        if !shape.dtype().is_int() {
            return Err(OpError::input(2, format!("MaxUnpool's output_shape must be an integer tensor, found {}", shape.dtype())));
        }
        let shape = shape.to_i64_vec()?;
        if shape.len() != x.len() {
            return Err(OpError::input(2, format!("MaxUnpool's output_shape must have {} values (X's rank), found {shape:?}", x.len())));
        }
        if shape[0] != x[0] as i64 || shape[1] != x[1] as i64 {
            return Err(OpError::input(2, format!("MaxUnpool's output_shape {shape:?} must keep X's batch and channels [{}, {}]", x[0], x[1])));
        }
        if shape.iter().zip(&dims).any(|(&s, &d)| s < d as i64) {
            return Err(OpError::input(2, format!("MaxUnpool's output_shape {shape:?} is smaller than the unpooled shape {dims:?}")));
        }
        Ok(shape.iter().map(|&s| s as usize).collect())
    }
}

impl Op for MaxUnpool {
    fn name(&self) -> &str {
        "MaxUnpool"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dims = self.out_dims(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), dims)])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }
}

impl CpuKernel for MaxUnpool {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let dims = crate::tensor::tensor_args(inputs, |a| self.out_dims(a))?;
        let (x, idx) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let out = &mut outputs[0];
        if out.dims() != dims || out.dtype() != x.dtype() {
            *out = Tensor::zeros(x.dtype(), &dims);
        }
        let len = out.len();
        let size = x.dtype().size();
        let (src, dst) = (x.bytes(), out.bytes_mut());
        dst.fill(0);
        for (k, &at) in idx.to_i64_vec()?.iter().enumerate() {
            if at < 0 || at as u64 >= len as u64 {
                return Err(OpError::input(1, format!("MaxUnpool's index {at} (element {k}) is outside the output of {len} elements")));
            }
            let at = at as usize;
            dst[at * size..(at + 1) * size].copy_from_slice(&src[k * size..(k + 1) * size]);
        }
        Ok(())
    }
}

impl WgslKernel for MaxUnpool {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        self.out_dims(inputs)?;
        let (n_in, n_out) = (required(inputs, 0)?.ty.len(), outputs[0].len());
        if n_out == 0 {
            return Ok(WgslProgram::default());
        }
        if n_in >= u32::MAX as usize || n_out > i32::MAX as usize {
            return Err(OpError::Unsupported(format!("MaxUnpool of {n_in} into {n_out} elements: beyond the GPU kernel's 32-bit indices")));
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let clear = wgsl::simple_kernel("MaxUnpool clear", n_out, wg, &[("win", "u32", false)], vec![Binding::Scratch(0)], "", "win[i] = 0u;");
        let scatter_body = format!(
            "let at = idx[i];\n    if (at < 0 || at >= {n_out}) {{ {} return; }}\n    atomicMax(&win[u32(at)], i + 1u);",
            wgsl::report_index_error("at", &format!("{n_out}i"))
        );
        let scatter = wgsl::simple_kernel(
            "MaxUnpool scatter",
            n_in,
            wg,
            &[("idx", "i32", true), ("win", "atomic<u32>", false)],
            vec![Binding::Input(1), Binding::Scratch(0), Binding::Status],
            &wgsl::status_decl(2),
            &scatter_body,
        );
        let zero = wgsl::literal(ty, 0.0);
        let gather = wgsl::simple_kernel(
            "MaxUnpool gather",
            n_out,
            wg,
            // Scratch is bound read-write.
            &[("x", ty, true), ("win", "u32", false), ("y", ty, false)],
            vec![Binding::Input(0), Binding::Scratch(0), Binding::Output(0)],
            "",
            &format!("let k = win[i];\n    if (k == 0u) {{ y[i] = {zero}; }} else {{ y[i] = x[k - 1u]; }}"),
        );
        Ok(WgslProgram { dispatches: vec![clear, scatter, gather], scratch_bytes: vec![n_out as u64 * 4] })
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MaxUnpool", |spec: &NodeSpec| {
        let kernel = spec.ints_opt("kernel_shape")?.ok_or_else(|| spec.bad("kernel_shape", "is required"))?;
        let r = kernel.len();
        if r == 0 || kernel.iter().any(|&k| k < 1) {
            return Err(spec.bad("kernel_shape", format!("must be positive sizes, one per spatial dim, found {kernel:?}")));
        }
        let strides = spec.ints("strides", &vec![1; r])?;
        if strides.len() != r || strides.iter().any(|&s| s < 1) {
            return Err(spec.bad("strides", format!("must be {r} positive values, found {strides:?}")));
        }
        let pads = spec.ints("pads", &vec![0; 2 * r])?;
        if pads.len() != 2 * r || pads.iter().any(|&p| p < 0) {
            return Err(spec.bad("pads", format!("must be {} non-negative values (begins, then ends), found {pads:?}", 2 * r)));
        }
        let big = |v: &[i64], name: &str| -> Result<Vec<usize>> {
            v.iter().map(|&x| usize::try_from(x).ok().filter(|&x| x <= u32::MAX as usize).ok_or_else(|| spec.bad(name, format!("{x} is too large")))).collect()
        };
        Ok(Box::new(MaxUnpool { kernel: big(&kernel, "kernel_shape")?, strides: big(&strides, "strides")?, pads: big(&pads, "pads")? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    fn unpool(attrs: &[(&str, Attr)]) -> Case {
        Case::new("MaxUnpool").opset(22).attrs(attrs)
    }

    /// Expected outputs from onnxruntime 1.32.
    #[test]
    fn matches_onnxruntime() {
        let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let k2 = [("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
        let y = unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0, 5, 10, 15])).run_cpu().unwrap().remove(0);
        let mut want = vec![0.0; 16];
        (want[0], want[5], want[10], want[15]) = (1.0, 2.0, 3.0, 4.0);
        assert_close(&y, &want, 0.0, "diagonal");
        // Repeated indices: the last element of X wins.
        let y = unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[5, 5, 10, 5])).run_cpu().unwrap().remove(0);
        let mut want = vec![0.0; 16];
        (want[5], want[10]) = (4.0, 3.0);
        assert_close(&y, &want, 0.0, "repeats");
        // Indices span the whole tensor: batch 1 writing offsets 0..4 lands in batch 0.
        let x2 = f32s(&[2, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let y = unpool(&k2).input(x2).input(i64s(&[2, 1, 2, 2], &[0, 1, 2, 3, 0, 1, 2, 3])).run_cpu().unwrap().remove(0);
        let mut want = vec![0.0; 32];
        want[..4].copy_from_slice(&[5.0, 6.0, 7.0, 8.0]);
        assert_close(&y, &want, 0.0, "whole-tensor offsets");
        // An output_shape larger than the unpooled one.
        let y = unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0, 5, 10, 24])).constant(i64s(&[4], &[1, 1, 5, 5])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 1, 5, 5]);
        assert_eq!(y.to_f64_vec()[24], 4.0);
        // Pads and strides: (2 - 1) * 2 + 3 - 1 - 0 = 4 rows, (2 - 1) * 1 + 2 - 0 - 1 = 2 columns.
        let a = [("kernel_shape", ints(&[3, 2])), ("strides", ints(&[2, 1])), ("pads", ints(&[1, 0, 0, 1]))];
        let y = unpool(&a).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0, 1, 2, 3])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 1, 4, 2]);
        // Strides default to 1: 2 + 2 - 1 = 3.
        let y = unpool(&[("kernel_shape", ints(&[2, 2]))]).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0, 1, 2, 3])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 1, 3, 3]);
        // Other dtypes move bit for bit; 1-D and 3-D kernels.
        let xi = i64s(&[1, 2, 3], &[i64::MAX, -1, 7, 8, 9, i64::MIN]);
        let y = unpool(&[("kernel_shape", ints(&[2])), ("strides", ints(&[2]))]).input(xi).input(i64s(&[1, 2, 3], &[1, 0, 4, 11, 8, 6])).run_cpu().unwrap().remove(0);
        assert_eq!(y, i64s(&[1, 2, 6], &[-1, i64::MAX, 0, 0, 7, 0, i64::MIN, 0, 9, 0, 0, 8]));
        let x3 = cast(&rand_f32(&[1, 1, 2, 2, 2], 1), DType::F16);
        let y = unpool(&[("kernel_shape", ints(&[2, 2, 2])), ("strides", ints(&[2, 2, 2]))]).input(x3).input(i64s(&[1, 1, 2, 2, 2], &[0, 3, 12, 15, 48, 51, 60, 63])).run_cpu().unwrap().remove(0);
        assert_eq!(y.dims(), &[1, 1, 4, 4, 4]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let k2 = [("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
        let err = |c: Case| c.run_cpu().unwrap_err().to_string();
        for bad in [16i64, -1] {
            let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0, bad, 2, 3])));
            assert!(e.contains(&format!("index {bad} (element 1) is outside the output of 16 elements")), "{e}");
        }
        let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0; 4])).constant(i64s(&[4], &[1, 1, 3, 3])));
        assert!(e.contains("smaller than the unpooled shape [1, 1, 4, 4]"), "{e}");
        let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0; 4])).constant(i64s(&[4], &[1, 2, 5, 5])));
        assert!(e.contains("must keep X's batch and channels"), "{e}");
        let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0; 4])).constant(i64s(&[3], &[1, 5, 5])));
        assert!(e.contains("must have 4 values"), "{e}");
        let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 2, 2], &[0; 4])).input(i64s(&[4], &[1, 1, 5, 5])));
        assert!(e.contains("output_shape must be known"), "{e}");
        let e = err(unpool(&k2).input(x.clone()).input(i64s(&[1, 1, 4], &[0; 4])));
        assert!(e.contains("indices must have X's shape"), "{e}");
        let e = err(unpool(&k2).input(f32s(&[1, 4], &[0.0; 4])).input(i64s(&[1, 4], &[0; 4])));
        assert!(e.contains("needs X of shape (N, C, D1..D2)"), "{e}");
        assert!(make("MaxUnpool", 11, &[], 2, 1).is_err());
        assert!(make("MaxUnpool", 11, &[("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2]))], 2, 1).is_err());
        assert!(make("MaxUnpool", 11, &[("kernel_shape", ints(&[2, 2])), ("pads", ints(&[0, 0, -1, 0]))], 2, 1).is_err());
    }
}
