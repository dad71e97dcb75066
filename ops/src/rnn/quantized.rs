//! com.microsoft DynamicQuantizeLSTM: an LSTM whose W and R are 8-bit, stored
//! transposed (`W[d]` is `[input_size, 4*hidden]`, `R[d]` `[hidden, 4*hidden]`), with a
//! scale and zero point per direction or per column (inputs 8 to 11: W_scale,
//! W_zero_point, R_scale, R_zero_point). Each product quantizes its float operand as
//! onnxruntime does: X once for every step, the hidden state at each step, each to
//! uint8 with the scale and zero point of its own range (zero included, as
//! DynamicQuantizeLinear); the int32 sums of `(a - za)(w - zw)` are exact and scaled by
//! `a_scale * w_scale[column]` in f32. The gates then run as LSTM's. With
//! sequence_lens, the hidden state of a row whose sequence ended before the previous
//! step enters the recurrent product's quantization as zeros, as onnxruntime's does.
use super::common::{Dims, P, R, W, X};
use crate::linalg::qproduct_wgsl::{IntOperand, IntProduct};
use crate::op::required;
use crate::quant::dynamic_quantize_linear::{dynamic_params, wgsl_range, RANGE_DECL, RANGE_LANES};
use crate::quant::quantize_linear::run_const;
use crate::wgsl::{self, Binding, Dispatch};
use crate::{Arg, OpError, Result};
use kiln_graph::{DType, Tensor};

/// Input indices of the quantization parameters.
pub(crate) const W_SCALE: usize = 8;
pub(crate) const W_ZERO: usize = 9;
pub(crate) const R_SCALE: usize = 10;
pub(crate) const R_ZERO: usize = 11;
const NAMES: [&str; 4] = ["W_scale", "W_zero_point", "R_scale", "R_zero_point"];

/// One direction's 8-bit matrix `[k][n]` with its zero points subtracted, and the
/// scale of each column.
pub(crate) struct QuantMatrix {
    pub k: usize,
    pub n: usize,
    pub w: Vec<i32>,
    pub scale: Vec<f32>,
}

impl QuantMatrix {
    /// `out[i][j] = sum_k (qa[i][k] - za) * w[k][col0 + j] * (sa * scale[col0 + j])` for
    /// columns `col0..col0 + out_cols` (`a` is `[m][k]`, `out` `[m][out_cols]`), `a`
    /// quantized over all its values.
    pub fn product(&self, a: &[f32], col0: usize, out_cols: usize, out: &mut [f32]) {
        let m = a.len() / self.k;
        let (lo, hi) = crate::quant::dynamic_quantize_linear::range(a);
        let (sa, za) = dynamic_params(lo, hi);
        let mut qa = vec![0u8; a.len()];
        if sa != 0.0 && sa.is_finite() {
            run_const(a, &mut qa, sa, za, (0.0, 255.0));
        }
        let za = za as i32;
        let mult: Vec<f32> = self.scale[col0..col0 + out_cols].iter().map(|&s| sa * s).collect();
        let mut acc = vec![0i32; out_cols];
        for (row, dst) in qa.chunks_exact(self.k).zip(out.chunks_exact_mut(out_cols)).take(m) {
            acc.fill(0);
            for (kk, &q) in row.iter().enumerate() {
                let v = q as i32 - za;
                let wrow = &self.w[kk * self.n + col0..][..out_cols];
                acc.iter_mut().zip(wrow).for_each(|(s, &w)| *s += v * w);
            }
            for ((d, &s), &f) in dst.iter_mut().zip(&acc).zip(&mult) {
                *d = s as f32 * f;
            }
        }
    }
}

/// The op's shapes as LSTM's checks read them: W and R as `[dirs, 4*hidden, k]` in X's
/// dtype, and only LSTM's eight inputs.
pub(crate) fn as_lstm_shapes(shapes: &[Option<(&[usize], DType)>]) -> Result<Vec<Option<(Vec<usize>, DType)>>> {
    let x_dtype = shapes.get(X).copied().flatten().map_or(DType::F32, |s| s.1);
    let mut out: Vec<Option<(Vec<usize>, DType)>> = shapes.iter().take(P + 1).map(|s| s.map(|(d, t)| (d.to_vec(), t))).collect();
    for i in [W, R] {
        let Some((dims, dtype)) = shapes.get(i).copied().flatten() else { continue };
        if !matches!(dtype, DType::I8 | DType::U8) {
            return Err(OpError::input(i, format!("DynamicQuantizeLSTM: {} has dtype {dtype}; expected int8 or uint8", ["", "W", "R"][i])));
        }
        if dims.len() != 3 {
            return Err(OpError::input(i, format!("DynamicQuantizeLSTM: {} must be 3-D [num_directions, k, 4*hidden_size], got {dims:?}", ["", "W", "R"][i])));
        }
        out[i] = Some((vec![dims[0], dims[2], dims[1]], x_dtype));
    }
    if x_dtype != DType::F32 {
        return Err(OpError::input(X, format!("DynamicQuantizeLSTM: X has dtype {x_dtype}; expected f32")));
    }
    for (i, name) in (W_SCALE..=R_ZERO).zip(NAMES) {
        let Some((dims, dtype)) = shapes.get(i).copied().flatten() else {
            return Err(OpError::input(i, format!("DynamicQuantizeLSTM needs input {i} ({name})")));
        };
        let weights = if i < R_SCALE { W } else { R };
        let want = if i % 2 == 0 { DType::F32 } else { shapes[weights].map_or(DType::I8, |s| s.1) };
        if dtype != want {
            return Err(OpError::input(i, format!("DynamicQuantizeLSTM: {name} has dtype {dtype}; expected {want}")));
        }
        let w = shapes[weights].map(|s| s.0).unwrap_or(&[]);
        if w.len() == 3 && dims != [w[0]] && dims != [w[0], w[2]] {
            return Err(OpError::input(i, format!("DynamicQuantizeLSTM: {name} must have shape [{}] or [{}, {}] (per direction or per column), got {dims:?}", w[0], w[0], w[2])));
        }
    }
    Ok(out)
}

/// Per direction, the quantized W (or R, `which`) with its zero points subtracted.
pub(crate) fn matrices(inputs: &[Option<&Tensor>], which: usize, dims: &Dims) -> Result<Vec<QuantMatrix>> {
    let (scale_i, zero_i) = if which == W { (W_SCALE, W_ZERO) } else { (R_SCALE, R_ZERO) };
    let get = |i: usize| crate::cpu::input(inputs, i);
    let w = crate::quant::qlinear::ints(get(which)?)?;
    let scales: Vec<f32> = get(scale_i)?.as_slice::<f32>()?.to_vec();
    let zeros = crate::quant::qlinear::ints(get(zero_i)?)?;
    let (k, n) = (if which == W { dims.input } else { dims.hidden }, dims.gh());
    let per_column = scales.len() == dims.dirs * n;
    if scales.len() != zeros.len() {
        return Err(OpError::input(zero_i, format!("DynamicQuantizeLSTM: {} zero points for {} scales", zeros.len(), scales.len())));
    }
    Ok((0..dims.dirs)
        .map(|d| {
            let at = |j: usize| if per_column { d * n + j } else { d };
            let w = (0..k * n).map(|i| w[d * k * n + i] - zeros[at(i % n)]).collect();
            QuantMatrix { k, n, w, scale: (0..n).map(|j| scales[at(j)]).collect() }
        })
        .collect())
}

/// Scratch buffers of the quantized op's WGSL program beyond the recurrence's two
/// (`work`, the step counters): the quantization parameters (`qp`: X's scale and zero
/// point, then each direction's hidden state's), then the packed operands of the
/// input projection.
pub(crate) const QP_SCRATCH: usize = 2;

/// Bytes of the `qp` scratch.
pub(crate) fn qp_bytes(dirs: usize) -> u64 {
    (4 * (2 + 2 * dirs) as u64).next_multiple_of(16)
}

/// WGSL finishing a range reduction ([`wgsl_range`]) by lane 0: the scale and zero
/// point of [`dynamic_params`] into `qp[at]`, `qp[at + 1]` (0 and 0 where the scale
/// is 0 or not finite, which quantizes everything to 0 as the CPU does).
pub(crate) fn wgsl_store_params(at: &str) -> String {
    format!(
        "    if (l == 0u) {{\n\
         \x20       let scale = q_div(hi[0] - lo[0], 255.0);\n\
         \x20       let ok = scale > 0.0 && scale <= 3.4028235e38;\n\
         \x20       qp[{at}] = scale;\n        qp[{at} + 1u] = select(0.0, round(clamp(-q_div(lo[0], scale), 0.0, 255.0)), ok);\n    }}\n"
    )
}

/// The WGSL quantized value (as i32, its zero point subtracted) of f32 `v` with the
/// scale and zero point in `qp[at]`, `qp[at + 1]`.
pub(crate) fn wgsl_quantized(v: &str, at: &str) -> String {
    format!("q_value({v}, qp[{at}], qp[{at} + 1u])")
}

/// The WGSL function behind [`wgsl_quantized`].
pub(crate) const WGSL_Q_VALUE: &str = "fn q_value(v: f32, scale: f32, zp: f32) -> i32 {\n\
    \x20   if (!(scale > 0.0 && scale <= 3.4028235e38)) { return 0i; }\n\
    \x20   return i32(clamp(round(q_div(v, scale)) + zp, 0.0, 255.0)) - i32(zp);\n}\n";

/// The input projection on the GPU: X's range and parameters into `qp[0..2]`, then
/// `X W[d]` for every direction as an exact integer product ([`IntProduct`]), scaled
/// into `work[(d * rows + row) * 4H + column]`.
pub(crate) fn wgsl_projection(dims: &Dims, inputs: &[Option<Arg>], wg: u32) -> Result<(Vec<Dispatch>, Vec<u64>)> {
    let len = dims.seq * dims.batch * dims.input;
    if len.div_ceil(RANGE_LANES) > wgsl::MAX_LOOP_ITERATIONS {
        return Err(OpError::Unsupported(format!("DynamicQuantizeLSTM with an X of {len} elements on the GPU (at most {})", RANGE_LANES * wgsl::MAX_LOOP_ITERATIONS)));
    }
    let qp = ("qp".to_string(), "f32", Binding::Scratch(QP_SCRATCH));
    let range = format!(
        "{}{}{RANGE_DECL}@compute @workgroup_size({RANGE_LANES})\nfn main(@builtin(local_invocation_id) lid: vec3<u32>) {{\n{}{}}}\n",
        wgsl::declare(&[("x", "f32", true), ("qp", "f32", false)]),
        crate::quant::qlinear::WGSL_REQUANTIZE,
        wgsl_range("x[e]", &format!("{len}u")),
        wgsl_store_params("0u")
    );
    let range = Dispatch { label: "DynamicQuantizeLSTM X range".into(), source: range, entry_point: "main".into(), workgroups: [1, 1, 1], bindings: vec![Binding::Input(X), Binding::Scratch(QP_SCRATCH)] };
    let (gh, input) = (dims.gh(), dims.input);
    let per_column = |i: usize| required(inputs, i).map(|t| t.ty.len() != dims.dirs);
    let at = |i: usize| -> Result<&str> { Ok(if per_column(i)? { "bi * GHu + n" } else { "bi" }) };
    let (scale_at, zero_at) = (at(W_SCALE)?.replace("GH", &gh.to_string()), at(W_ZERO)?.replace("GH", &gh.to_string()));
    let x = IntOperand {
        rows: dims.seq * dims.batch,
        batches: 1,
        batch_of: "0u".into(),
        buffers: vec![("x".into(), "f32", Binding::Input(X)), qp.clone()],
        helpers: format!("{WGSL_Q_VALUE}{}fn raw(pb: u32, r: u32, k: u32) -> i32 {{ return {} + i32(qp[1]); }}\n", crate::quant::qlinear::WGSL_REQUANTIZE, wgsl_quantized(&format!("x[r * {input}u + k]"), "0u")),
        signed: false,
        zero: "i32(qp[1])".into(),
    };
    let w_dtype = required(inputs, W)?.dtype();
    let w = IntOperand {
        rows: gh,
        batches: dims.dirs,
        batch_of: "bi".into(),
        buffers: vec![("w".into(), wgsl::elem(w_dtype), Binding::Input(W))],
        helpers: format!("fn raw(pb: u32, r: u32, k: u32) -> i32 {{ return i32(w[pb * {}u + k * {gh}u + r]); }}\n", input * gh),
        signed: w_dtype == DType::I8,
        zero: format!("i32(wz[{zero_at}])"),
    };
    let product = IntProduct {
        label: "DynamicQuantizeLSTM input projection",
        batch: dims.dirs,
        m: dims.seq * dims.batch,
        n: gh,
        k: input,
        a: x,
        b: w,
        buffers: vec![
            qp,
            ("ws".into(), "f32", Binding::Input(W_SCALE)),
            ("wz".into(), wgsl::elem(required(inputs, W_ZERO)?.dtype()), Binding::Input(W_ZERO)),
            ("work".into(), "f32", Binding::Scratch(0)),
        ],
        helpers: String::new(),
        prelude: String::new(),
        epilogue: format!("work[i] = f32(s) * (qp[0] * ws[{scale_at}]);"),
        scratch: QP_SCRATCH + 1,
    };
    let (mut dispatches, sizes) = product.program(wg)?;
    dispatches.insert(0, range);
    Ok((dispatches, sizes))
}

#[cfg(test)]
mod tests {
    use crate::testing::Case;
    use kiln_graph::{Attr, DType, Tensor};

    const H: usize = 3;
    const I: usize = 4;

    /// X on its own quantization grid (its range is 0..=255 steps of 0.05), so that
    /// quantizing it loses nothing; R zero, so the hidden state's quantization does not
    /// matter: the op must then equal LSTM with the dequantized W.
    fn x() -> Tensor {
        let v: Vec<f32> = (0..2 * 2 * I).map(|i| if i == 0 { 0.0 } else if i == 1 { 12.75 } else { ((i * 37) % 256) as f32 * 0.05 }).collect();
        Tensor::from_vec(&[2, 2, I], v).unwrap()
    }

    fn quantized(per_column: bool, w_dtype: DType) -> (Case, Tensor) {
        let g = 4 * H;
        let wq: Vec<f64> = (0..I * g).map(|i| ((i * 29) % 61) as f64 - 30.0 + if w_dtype == DType::U8 { 128.0 } else { 0.0 }).collect();
        let n = if per_column { g } else { 1 };
        let scale: Vec<f32> = (0..n).map(|j| 0.004 + 0.001 * j as f32).collect();
        let zero: Vec<f64> = (0..n).map(|j| if w_dtype == DType::U8 { 126.0 + j as f64 } else { j as f64 % 3.0 - 1.0 }).collect();
        let dims: &[usize] = if per_column { &[1, g] } else { &[1] };
        // W as LSTM takes it: [1, 4H, I], dequantized.
        let w_float: Vec<f32> = (0..g * I).map(|o| {
            let (j, k) = (o / I, o % I);
            let at = if per_column { j } else { 0 };
            ((wq[k * g + j] - zero[at]) as f32) * scale[at]
        }).collect();
        let case = Case::new("DynamicQuantizeLSTM")
            .domain("com.microsoft")
            .attr("hidden_size", Attr::Int(H as i64))
            .input(x())
            .constant(Tensor::from_f64(w_dtype, &[1, I, g], &wq).unwrap())
            .constant(Tensor::from_f64(w_dtype, &[1, H, g], &vec![if w_dtype == DType::U8 { 128.0 } else { 0.0 }; H * g]).unwrap())
            .omitted()
            .omitted()
            .omitted()
            .omitted()
            .omitted()
            .constant(Tensor::from_vec(dims, scale.clone()).unwrap())
            .constant(Tensor::from_f64(w_dtype, dims, &zero).unwrap())
            .constant(Tensor::from_vec(&[1], vec![0.01f32]).unwrap())
            .constant(Tensor::from_f64(w_dtype, &[1], &[if w_dtype == DType::U8 { 128.0 } else { 0.0 }]).unwrap());
        (case, Tensor::from_vec(&[1, g, I], w_float).unwrap())
    }

    #[test]
    fn equals_lstm_with_the_dequantized_weights() {
        for (per_column, dtype) in [(false, DType::I8), (true, DType::I8), (true, DType::U8)] {
            let (case, w) = quantized(per_column, dtype);
            let got = case.run_cpu().unwrap();
            let lstm = Case::new("LSTM").opset(14).attr("hidden_size", Attr::Int(H as i64)).input(x()).constant(w).constant(Tensor::from_vec(&[1, 4 * H, H], vec![0f32; 4 * H * H]).unwrap());
            let want = lstm.run_cpu().unwrap();
            let (a, b) = (got[0].to_f64_vec(), want[0].to_f64_vec());
            assert_eq!(got[0].dims(), want[0].dims());
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6, "{per_column} {dtype}: {a:?} vs {b:?}");
            }
        }
    }

    /// Weights prepared once per plan give the same bits as weights built per run.
    #[test]
    fn prepared_weights_equal_weights_built_per_run() {
        for (per_column, dtype) in [(false, DType::I8), (true, DType::U8)] {
            let (case, _) = quantized(per_column, dtype);
            let op = case.op().unwrap();
            // The weights are constants: the kernel prepares them.
            let types: Vec<Option<crate::TensorType>> = case.inputs.iter().map(|x| x.tensor().map(|t| crate::TensorType::of(t))).collect();
            let args: Vec<Option<crate::Arg>> = types.iter().zip(&case.inputs).map(|(t, x)| t.as_ref().map(|ty| crate::Arg { ty, value: x.known_value() })).collect();
            let outs = op.infer(&args).unwrap();
            assert!(op.cpu().unwrap().prepare(&args, &outs, &Default::default()).unwrap().is_some());
            let runs = crate::testing::run_cpu_variants(op.as_ref(), &case.inputs).unwrap();
            let (plain, prepared) = (&runs[0], &runs[1]);
            assert_eq!((plain.0.as_str(), prepared.0.as_str()), ("plain", "defaults"));
            for (a, b) in plain.1.iter().zip(&prepared.1) {
                assert_eq!(a.bytes(), b.bytes(), "{per_column} {dtype}");
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (case, _) = quantized(true, DType::I8);
        let err = |c: Case| c.run_cpu().map(|_| ()).unwrap_err().to_string();
        let mut float_w = case.clone();
        float_w.inputs[1] = crate::testing::Input::Const(Tensor::from_vec(&[1, I, 4 * H], vec![0f32; I * 4 * H]).unwrap());
        assert!(err(float_w).contains("W has dtype f32; expected int8 or uint8"));
        let mut no_scale = case.clone();
        no_scale.inputs.truncate(10);
        assert!(err(no_scale).contains("needs input 10 (R_scale)"));
        let mut bad_scale = case.clone();
        bad_scale.inputs[8] = crate::testing::Input::Const(Tensor::from_vec(&[5], vec![0.1f32; 5]).unwrap());
        assert!(err(bad_scale).contains("W_scale must have shape [1] or [1, 12]"));
        let mut bad_zero = case;
        bad_zero.inputs[9] = crate::testing::Input::Const(Tensor::from_vec(&[1, 12], vec![0f32; 12]).unwrap());
        assert!(err(bad_zero).contains("W_zero_point has dtype f32; expected i8"));
    }
}
