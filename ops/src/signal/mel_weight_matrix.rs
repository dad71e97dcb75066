//! MelWeightMatrix (opset 17): the `[dft_length/2 + 1, num_mel_bins]` matrix that
//! maps a one-sided spectrum onto triangular mel-scale filters, as `output_datatype`.
//! The band `[lower_edge_hertz, upper_edge_hertz]` is split evenly on the mel scale
//! (`mel = 2595 log10(1 + hz/700)`) into `num_mel_bins + 2` steps (the step divides
//! by `num_mel_bins + 2`, as onnx.reference and onnxruntime do, where the spec's text
//! says `+ 1`); edge `b` is the spectrogram bin `floor((dft_length + 1) hz_b /
//! sample_rate)`, and filter `i` rises linearly from edge `i` to edge `i + 1` and falls
//! to edge `i + 2` (a filter whose rise is empty is 1 at its centre).
//!
//! The shape comes from the values of `num_mel_bins` and `dft_length`, so inference
//! needs them known. The CPU computes the edges in f64 and fails when an edge lies
//! past the last bin (an upper edge above `sample_rate / 2`); the GPU runs one
//! invocation per element, computing its three edges in f32 from the input buffers
//! (edges past the last bin simply add nothing there).
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Largest `num_mel_bins` and `dft_length` accepted.
const MAX_COUNT: i64 = 1 << 24;

#[derive(Debug)]
pub struct MelWeightMatrix {
    dtype: DType,
}

const INTS: [DType; 2] = [DType::I32, DType::I64];
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// The triangle weight of filter edges `(left, center, right)` at bin `j`.
fn weight(j: i64, left: i64, center: i64, right: i64) -> f64 {
    let mut v = 0.0;
    if (left..=center).contains(&j) {
        v = if center == left { 1.0 } else { (j - left) as f64 / (center - left) as f64 };
    }
    if right > center && (center..right).contains(&j) {
        v = (right - j) as f64 / (right - center) as f64;
    }
    v
}

impl MelWeightMatrix {
    /// (num_mel_bins, dft_length) from the inputs' values.
    fn sizes(inputs: &[Option<Arg>]) -> Result<(usize, usize)> {
        let mut out = [0usize; 2];
        for (k, what) in [(0, "num_mel_bins"), (1, "dft_length")] {
            let v = super::scalar_int(inputs, k, what)?;
            if !(1..=MAX_COUNT).contains(&v) {
                return Err(OpError::input(k, format!("{what} {v} is outside [1, {MAX_COUNT}]")));
            }
            out[k] = v as usize;
        }
        Ok((out[0], out[1]))
    }

    fn check(inputs: &[Option<Arg>]) -> Result<()> {
        for i in 0..3 {
            expect_dtype(inputs, i, &INTS)?;
        }
        for i in 3..5 {
            expect_dtype(inputs, i, &FLOATS)?;
        }
        for i in 0..5 {
            if required(inputs, i)?.ty.len() != 1 {
                return Err(OpError::input(i, format!("expected a scalar, found shape {:?}", required(inputs, i)?.dims())));
            }
        }
        Ok(())
    }
}

impl Op for MelWeightMatrix {
    fn name(&self) -> &str {
        "MelWeightMatrix"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Self::check(inputs)?;
        let (mels, len) = Self::sizes(inputs)?;
        let out = TensorType::new(self.dtype, vec![len / 2 + 1, mels]);
        if out.checked_bytes().is_none() {
            return Err(OpError::invalid(format!("the mel weight matrix {out} does not fit in memory")));
        }
        Ok(vec![out])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MelWeightMatrix {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (mels, len) = crate::tensor::tensor_args(inputs, Self::sizes)?;
        let scalar = |i: usize| -> Result<f64> { Ok(cpu::input(inputs, i)?.to_f64_vec()[0]) };
        let rate = scalar(2)?;
        if rate <= 0.0 {
            return Err(OpError::input(2, format!("sample_rate must be positive, found {rate}")));
        }
        let (low, high) = (scalar(3)?, scalar(4)?);
        let mel = |hz: f64| 2595.0 * (hz / 700.0).ln_1p() / std::f64::consts::LN_10;
        let (low_mel, high_mel) = (mel(low), mel(high));
        let step = (high_mel - low_mel) / (mels + 2) as f64;
        let bins = len / 2 + 1;
        let edges: Vec<i64> = (0..mels + 2)
            .map(|b| {
                let hz = 700.0 * ((b as f64 * step + low_mel) / 2595.0 * std::f64::consts::LN_10).exp_m1();
                ((len + 1) as f64 * hz / rate).floor() as i64
            })
            .collect();
        if let Some(bad) = edges.iter().find(|&&e| e < 0 || e as usize >= bins) {
            return Err(OpError::invalid(format!(
                "the band [{low}, {high}] Hz at sample rate {rate} maps to spectrogram bin {bad}, outside the {bins} bins of a dft_length of {len}"
            )));
        }
        let mut y = vec![0.0; bins * mels];
        for j in 0..bins {
            for i in 0..mels {
                y[j * mels + i] = weight(j as i64, edges[i], edges[i + 1], edges[i + 2]);
            }
        }
        outputs[0] = Tensor::from_f64(self.dtype, &[bins, mels], &y)?;
        Ok(())
    }
}

impl WgslKernel for MelWeightMatrix {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        Self::check(inputs)?;
        let (mels, len) = Self::sizes(inputs)?;
        let ty = wgsl::elem(self.dtype);
        let helpers = format!(
            "fn mel(hz: f32) -> f32 {{ return 2595.0 * log(1.0 + hz / 700.0) / log(10.0); }}\n\
             fn edge(b: u32) -> i32 {{\n    let lo = mel(low[0]);\n    let step = (mel(high[0]) - lo) / {steps}.0;\n    \
             let hz = 700.0 * (exp((f32(b) * step + lo) / 2595.0 * log(10.0)) - 1.0);\n    \
             return i32(floor({n1}.0 * hz / f32(rate[0])));\n}}\n",
            steps = mels + 2,
            n1 = len + 1
        );
        let value = "var v = 0.0;\n    if (j >= l && j <= c) { v = select(f32(j - l) / f32(c - l), 1.0, c == l); }\n    \
                     if (r > c && j >= c && j < r) { v = f32(r - j) / f32(r - c); }";
        let store = if ty == "f32" { "y[i] = v;".to_string() } else { format!("y[i] = {ty}(v);") };
        let body = format!(
            "let m = i % {mels}u;\n    let j = i32(i / {mels}u);\n    let l = edge(m);\n    let c = edge(m + 1u);\n    let r = edge(m + 2u);\n    {value}\n    {store}"
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "MelWeightMatrix",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("rate", "i32", true), ("low", "f32", true), ("high", "f32", true), ("y", ty, false)],
            vec![Binding::Input(2), Binding::Input(3), Binding::Input(4), Binding::Output(0)],
            &helpers,
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec) -> Result<MelWeightMatrix> {
    let code = spec.int("output_datatype", DType::F32.onnx_code() as i64)?;
    let dtype = i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .filter(|d| *d != DType::Bool)
        .ok_or_else(|| spec.bad("output_datatype", format!("unsupported data type code {code}")))?;
    Ok(MelWeightMatrix { dtype })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "MelWeightMatrix", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Tensor;

    fn case(mels: i32, len: i32, rate: i32, low: f32, high: f32) -> Case {
        Case::new("MelWeightMatrix")
            .opset(17)
            .constant(Tensor::scalar(mels))
            .constant(Tensor::scalar(len))
            .input(Tensor::scalar(rate))
            .input(Tensor::scalar(low))
            .input(Tensor::scalar(high))
    }

    #[test]
    fn matches_the_onnx_reference() {
        // onnx.reference (and onnxruntime) at (5, 32, 16000, 100 Hz, 7000 Hz): the
        // nonzero (bin, filter, weight) entries of its [17, 5] output.
        let nonzero = [
            (0, 0, 1.0), (1, 1, 1.0), (2, 2, 1.0), (3, 2, 0.5), (3, 3, 0.5), (4, 3, 1.0), (5, 3, 0.5), (5, 4, 0.5),
            (6, 4, 1.0), (7, 4, 0.75), (8, 4, 0.5), (9, 4, 0.25),
        ];
        let mut want = vec![0.0; 17 * 5];
        for (j, i, w) in nonzero {
            want[j * 5 + i] = w;
        }
        let got = case(5, 32, 16000, 100.0, 7000.0).run_cpu().unwrap();
        assert_eq!(got[0].dims(), &[17, 5]);
        assert_close(&got[0], &want, 0.0, "mel weights");
    }

    #[test]
    fn an_upper_edge_past_nyquist_is_an_error() {
        assert!(case(4, 16, 8000, 0.0, 7000.0).run_cpu().is_err());
        assert!(case(0, 16, 8000, 0.0, 3000.0).run_cpu().is_err());
    }
}
