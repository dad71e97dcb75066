//! HannWindow, HammingWindow and BlackmanWindow (opset 17): the 1-D window of `size`
//! points (input 0, a scalar), periodic (the default: `N = size`) or symmetric
//! (`N = size - 1`), as `output_datatype`. The length is the input's value, so
//! inference needs it constant, as Range's.
use crate::cpu::CpuKernel;
use crate::op::{constant, expect_dtype};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// Longest window accepted (a size from a model never allocates more).
const MAX_SIZE: i64 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Hann,
    Hamming,
    Blackman,
}

impl Kind {
    /// The window at point `n` of denominator `m` (`N` above), as ONNX's reference.
    fn at(self, n: f64, m: f64) -> f64 {
        use std::f64::consts::PI;
        match self {
            Kind::Hann => (PI * n / m).sin().powi(2),
            Kind::Hamming => 25.0 / 46.0 - (2.0 * PI * n / m).cos() * (21.0 / 46.0),
            Kind::Blackman => 0.42 - 0.5 * (2.0 * PI * n / m).cos() + 0.08 * (4.0 * PI * n / m).cos(),
        }
    }

    /// The same in WGSL, of `n` and `m` (f32 expressions).
    fn wgsl(self, n: &str, m: &str) -> String {
        let t = format!("(6.283185307179586 * {n} / {m})");
        match self {
            Kind::Hann => format!("pow(sin(3.141592653589793 * {n} / {m}), 2.0)"),
            Kind::Hamming => format!("({} - cos({t}) * {})", 25.0f32 / 46.0, 21.0f32 / 46.0),
            Kind::Blackman => format!("(0.42 - 0.5 * cos({t}) + 0.08 * cos(2.0 * {t}))"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Hann => "HannWindow",
            Kind::Hamming => "HammingWindow",
            Kind::Blackman => "BlackmanWindow",
        }
    }
}

#[derive(Debug)]
pub struct WindowFunction {
    kind: Kind,
    periodic: bool,
    dtype: DType,
}

impl WindowFunction {
    /// The window's length from the `size` tensor.
    fn size(t: &Tensor) -> Result<usize> {
        let v = t.to_i64_vec()?;
        match v.as_slice() {
            [n] if (0..=MAX_SIZE).contains(n) => Ok(*n as usize),
            [n] => Err(OpError::input(0, format!("window size {n} is outside [0, {MAX_SIZE}]"))),
            _ => Err(OpError::input(0, format!("the window size must be a scalar, found shape {:?}", t.dims()))),
        }
    }

    /// `N`: the size, less one for a symmetric window.
    fn denominator(&self, size: usize) -> f64 {
        if self.periodic { size as f64 } else { size as f64 - 1.0 }
    }
}

impl Op for WindowFunction {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::I32, DType::I64])?;
        let n = Self::size(constant(inputs, 0, "the window size")?)?;
        Ok(vec![TensorType::new(self.dtype, vec![n])])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for WindowFunction {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let n = Self::size(crate::cpu::input(inputs, 0)?)?;
        if n != outputs[0].len() {
            return Err(OpError::invalid(format!("a window of {n} points does not fit the planned {}", outputs[0].len())));
        }
        let m = self.denominator(n);
        let v: Vec<f64> = (0..n).map(|i| self.kind.at(i as f64, m)).collect();
        outputs[0] = Tensor::from_f64(self.dtype, &[n], &v)?;
        Ok(())
    }
}

impl WgslKernel for WindowFunction {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let n = Self::size(constant(inputs, 0, "the window size")?)?;
        let ty = wgsl::elem(self.dtype);
        let m = wgsl::literal("f32", self.denominator(n));
        let value = self.kind.wgsl("f32(i)", &m);
        let body = if ty == "f32" { format!("y[i] = {value};") } else { format!("y[i] = {ty}({value});") };
        Ok(WgslProgram::single(wgsl::simple_kernel(
            self.name(),
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("y", ty, false)],
            vec![Binding::Output(0)],
            "",
            &body,
        )))
    }
}

fn parse(spec: &NodeSpec, kind: Kind) -> Result<WindowFunction> {
    let code = spec.int("output_datatype", DType::F32.onnx_code() as i64)?;
    let dtype = i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .filter(|d| *d != DType::Bool)
        .ok_or_else(|| spec.bad("output_datatype", format!("unsupported data type code {code}")))?;
    let periodic = match spec.int("periodic", 1)? {
        0 => false,
        1 => true,
        p => return Err(spec.bad("periodic", format!("expected 0 or 1, found {p}"))),
    };
    Ok(WindowFunction { kind, periodic, dtype })
}

pub(crate) fn register(r: &mut Registry) {
    for kind in [Kind::Hann, Kind::Hamming, Kind::Blackman] {
        r.register("", kind.name(), move |spec| Ok(Box::new(parse(spec, kind)?)));
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    #[test]
    fn windows_match_the_onnx_reference() {
        // numpy: onnx.reference's HannWindow/HammingWindow/BlackmanWindow of size 10.
        let hann_periodic = [0.0, 0.0954915, 0.3454915, 0.6545085, 0.9045085, 1.0, 0.9045085, 0.6545085, 0.3454915, 0.0954915];
        let hamming_symmetric = [0.08695652, 0.19376232, 0.46420409, 0.77173913, 0.97246837, 0.97246837, 0.77173913, 0.46420409, 0.19376232, 0.08695652];
        let blackman_periodic = [0.0, 0.0402128, 0.2007701, 0.5097871, 0.8492299, 1.0, 0.8492299, 0.5097871, 0.2007701, 0.0402128];
        for (op, periodic, want) in
            [("HannWindow", 1, hann_periodic), ("HammingWindow", 0, hamming_symmetric), ("BlackmanWindow", 1, blackman_periodic)]
        {
            let case = Case::new(op).opset(17).constant(Tensor::scalar(10i64)).attr("periodic", Attr::Int(periodic));
            let got = case.run_cpu().unwrap();
            assert_close(&got[0], &want, 1e-6, op);
        }
        // An integer output type, and sizes that must not allocate.
        let case = Case::new("HannWindow").opset(17).constant(Tensor::scalar(4i32)).attr("output_datatype", Attr::Int(DType::I64.onnx_code() as i64));
        assert_eq!(case.run_cpu().unwrap()[0].dtype(), DType::I64);
        for size in [-1i64, 1 << 40] {
            assert!(Case::new("HannWindow").opset(17).constant(Tensor::scalar(size)).run_cpu().is_err(), "size {size}");
        }
    }
}
