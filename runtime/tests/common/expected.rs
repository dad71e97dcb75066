//! Expected failures, per device: what a backend cannot do yet (or by design), stated
//! once here instead of as skips in the tests. The runner requires each listed case to
//! fail on the listed devices, and fails the test when one passes, so that the list
//! only shrinks.

/// A case that is expected to fail on some devices.
#[derive(Clone, Copy, Debug)]
pub struct Expected {
    /// Case-insensitive substring of the device label (`cpu`, `gpu:1`, `vulkan`, `gl`).
    pub device: &'static str,
    /// Substring of the case's label (`Attention`, `Cast [data f16`, ...).
    pub case: &'static str,
    /// Why, and what would fix it.
    pub why: &'static str,
}

impl Expected {
    pub fn matches(&self, device: &str, case: &str) -> bool {
        device.to_lowercase().contains(&self.device.to_lowercase()) && case.contains(self.case)
    }
}

/// Known failures of the cross-device suites.
pub const EXPECTED_FAILURES: &[Expected] = &[Expected {
    device: "(Gl)",
    case: "Mod [data i",
    why: "signed integer Mod on wgpu's GL backend: naga writes WGSL's `%` as GLSL's, which GLSL ES leaves \
          undefined for negative operands (lavapipe's GL adapter returns wrong remainders); the kernel \
          should compute on magnitudes and fix the sign (ops/src/elementwise/modulo.rs)",
}];

/// Op types whose CPU kernels have no f64 path: their reference is the CPU at the
/// case's own dtype, so the CPU is not checked against an independent reference.
/// An op listed here that runs in f64 fails the test (remove it from the list).
/// The quantization ops are defined on f32 arithmetic (as onnxruntime computes them):
/// their CPU kernels are checked against exact values in their unit tests.
pub const NO_F64_REFERENCE: &[&str] = &[
    // Reinterprets the bytes of its input's own dtype: widened to f64 they are other bytes.
    "BitCast",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "QLinearMatMul",
    "QLinearConv",
    // onnxruntime's contrib ops (com.microsoft).
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearConcat",
    "QGemm",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
    "DynamicQuantizeLSTM",
];
