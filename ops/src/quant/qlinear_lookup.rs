//! The unary quantized ops onnxruntime computes through a 256-entry lookup table
//! (QLinearSigmoid, QLinearLeakyRelu): inputs `X, X_scale, X_zero_point, Y_scale,
//! Y_zero_point` (per tensor, zero points optional), the output of X's dtype. Entry `b`
//! of the table is `quantize(f(dequantize(b)))` in f32 ([`qlinear::lookup_table`]);
//! each op's `f` is in its own file. On the GPU the table is baked into the shader when
//! the scales and zero points are constants, else each element is computed the same way.
use super::qlinear::{self, check_scalar, check_zero_point, QParams, Q8, SCALE};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

/// One lookup op's function of the dequantized value.
pub(super) trait Transform: Send + Sync + std::fmt::Debug + 'static {
    const NAME: &'static str;
    fn apply(&self, x: f32) -> f32;
    /// WGSL statements computing `let v: f32` from `let d: f32`.
    fn wgsl(&self) -> String;
}

#[derive(Debug)]
pub(super) struct QLinearLookup<T: Transform>(pub T);

impl<T: Transform> QLinearLookup<T> {
    fn table(&self, d: kiln_graph::DType, x: QParams, y: QParams) -> [i32; 256] {
        qlinear::lookup_table(d, x, y, |v| self.0.apply(v))
    }
}

impl<T: Transform> Op for QLinearLookup<T> {
    fn name(&self) -> &str {
        T::NAME
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = expect_dtype(inputs, 0, &Q8)?;
        check_scalar(inputs, 1, &SCALE, false)?;
        check_zero_point(inputs, 2, d)?;
        check_scalar(inputs, 3, &SCALE, false)?;
        check_zero_point(inputs, 4, d)?;
        Ok(vec![TensorType::new(d, required(inputs, 0)?.dims())])
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl<T: Transform> CpuKernel for QLinearLookup<T> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let table = self.table(x.dtype(), QParams::of(inputs, 1, 2)?, QParams::of(inputs, 3, 4)?);
        qlinear::apply_table(x, &table, &mut outputs[0])
    }
}

impl<T: Transform> WgslKernel for QLinearLookup<T> {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let out = &outputs[0];
        let d = out.dtype;
        let oe = wgsl::elem(d);
        let mut buffers: Vec<(String, &str)> = vec![("x".into(), oe)];
        let mut bindings = vec![Binding::Input(0)];
        let (helpers, body) = match (QParams::constant(inputs, 1, 2), QParams::constant(inputs, 3, 4)) {
            (Some(xq), Some(yq)) => {
                (qlinear::wgsl_table("LUT", &self.table(d, xq, yq)), format!("y[i] = {oe}(LUT[{}]);", qlinear::wgsl_byte(d, "x[i]")))
            }
            _ => {
                let mut p = qlinear::WgslParams::new();
                let (sx, zx) = (p.scale(inputs, 1, "sx")?, p.zero_point(inputs, 2, "zx")?);
                let (sy, zy) = (p.scale(inputs, 3, "sy")?, p.zero_point(inputs, 4, "zy")?);
                for (name, i, ty) in p.buffers {
                    buffers.push((name, ty));
                    bindings.push(Binding::Input(i));
                }
                let (lo, hi) = qlinear::bounds(d);
                let body = format!(
                    "let d = {sx} * f32(i32(x[i]) - {zx});\n    {}\n    y[i] = {oe}(q_requantize(q_div(v, {sy}), {zy}, {lo}i, {hi}i));",
                    self.0.wgsl()
                );
                (qlinear::WGSL_REQUANTIZE.to_string(), body)
            }
        };
        buffers.push(("y".into(), oe));
        bindings.push(Binding::Output(0));
        let decl: Vec<(&str, &str, bool)> = buffers.iter().enumerate().map(|(k, (n, t))| (n.as_str(), *t, k + 1 < buffers.len())).collect();
        Ok(WgslProgram::single(wgsl::simple_kernel(T::NAME, out.len(), tune.get(&wgsl::workgroup_param()), &decl, bindings, &helpers, &body)))
    }
}
