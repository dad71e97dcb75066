//! What LSTM, GRU and RNN share: the attributes (direction, hidden_size, activations
//! with their alpha/beta, clip, layout), the gate activations, the shapes of the inputs
//! and outputs in both layouts, and [`Recurrent`], the one [`Op`] type that runs each
//! op's [`Cell`] on the CPU and in WGSL.
use super::recurrence_cpu::{self, Real, Step};
use super::recurrence_wgsl::{self, Phase, WgslCtx};
use crate::cpu::CpuKernel;
use crate::elementwise::UnaryKind;
use crate::wgsl::{TuneParam, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Result, TensorType, TuneValues};
use kiln_graph::{Attr, DType, Tensor};
use std::fmt;

/// Input indices, as the spec numbers them (initial_c and P are LSTM's only).
pub(crate) const X: usize = 0;
pub(crate) const W: usize = 1;
pub(crate) const R: usize = 2;
pub(crate) const B: usize = 3;
pub(crate) const SEQ_LENS: usize = 4;
pub(crate) const INITIAL_H: usize = 5;
pub(crate) const INITIAL_C: usize = 6;
pub(crate) const P: usize = 7;

const INPUT_NAMES: [&str; 8] = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"];

/// The float dtypes of X, W, R, B, initial_h, initial_c and P.
pub(crate) const FLOAT_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// What distinguishes one recurrent op from another, for the shared code.
#[derive(Debug)]
pub(crate) struct CellSpec {
    pub name: &'static str,
    /// Gates stacked along W's and R's dim 1, in the spec's order ("iofc", "zrh", "i").
    pub gates: &'static str,
    /// The default activations of one direction (f, g, h...).
    pub activations: &'static [&'static str],
    /// Outputs the op may have (Y, Y_h and for LSTM Y_c).
    pub max_outputs: usize,
    /// Whether the op takes initial_c and P (LSTM).
    pub has_cell_state: bool,
}

impl CellSpec {
    pub fn gates(&self) -> usize {
        self.gates.len()
    }
}

/// One recurrent op's cell: the gate equations of one time step, on the CPU and in WGSL.
/// The shared code ([`recurrence_cpu`], [`recurrence_wgsl`]) does everything else:
/// attributes, shapes, the input projection of every step at once, directions,
/// sequence lengths, layouts, initial and final states.
pub(crate) trait Cell: fmt::Debug + Clone + Send + Sync + 'static {
    const SPEC: CellSpec;

    /// Whether gate `g`'s recurrence bias `Rb` is added inside the cell (GRU's `Rbh`
    /// with linear_before_reset) instead of being folded into the input projection.
    fn rb_inside(&self, _g: usize) -> bool {
        false
    }

    /// Per-unit scratch regions the WGSL phases use ([`WgslCtx::extra`]).
    fn extra_regions(&self) -> usize {
        0
    }

    /// One time step of one direction for every batch row that is still running.
    fn step<T: Real>(&self, st: &mut Step<T>) -> Result<()>;

    /// The WGSL dispatches of one time step (each one or more invocations per hidden
    /// unit of every direction and batch row); the last one stores the new state.
    fn phases(&self, w: &WgslCtx) -> Vec<Phase>;
}

/// Which way a direction runs through the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Forward,
    Reverse,
    Bidirectional,
}

impl Direction {
    pub fn count(self) -> usize {
        if self == Direction::Bidirectional { 2 } else { 1 }
    }

    /// Whether direction index `d` (0 or 1) runs forward in time.
    pub fn is_forward(self, d: usize) -> bool {
        self == Direction::Forward || (self == Direction::Bidirectional && d == 0)
    }
}

/// A gate activation `post * f(pre * x) + shift`: one of the unary table's kinds
/// (Sigmoid, Tanh, Relu, LeakyRelu, ThresholdedRelu, HardSigmoid, Elu, Softsign,
/// Softplus), Affine (`alpha * x + beta`, no kind) or ScaledTanh (`alpha * tanh(beta *
/// x)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Activation {
    pub pre: f32,
    pub kind: Option<UnaryKind>,
    pub post: f32,
    pub shift: f32,
}

/// The activation names the spec lists.
const ACTIVATION_NAMES: &str = "Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus";

impl Activation {
    fn of(kind: UnaryKind) -> Activation {
        Activation { pre: 1.0, kind: Some(kind), post: 1.0, shift: 0.0 }
    }

    /// The activation called `name` (any case), taking its alpha and beta, where it has
    /// them, from the lists' next unread values or else the defaults of the ONNX op of
    /// that name (the lists are consumed in the order of the activations, as
    /// onnxruntime reads them).
    pub fn parse(name: &str, alphas: &mut impl Iterator<Item = f32>, betas: &mut impl Iterator<Item = f32>) -> Result<Activation> {
        let mut alpha = |default: f32| alphas.next().unwrap_or(default);
        Ok(match name.to_ascii_lowercase().as_str() {
            "sigmoid" => Activation::of(UnaryKind::Sigmoid),
            "tanh" => Activation::of(UnaryKind::Tanh),
            "relu" => Activation::of(UnaryKind::Relu),
            "softsign" => Activation::of(UnaryKind::Softsign),
            "softplus" => Activation::of(UnaryKind::Softplus),
            "leakyrelu" => Activation::of(UnaryKind::LeakyRelu { alpha: alpha(0.01) }),
            "thresholdedrelu" => Activation::of(UnaryKind::ThresholdedRelu { alpha: alpha(1.0) }),
            "elu" => Activation::of(UnaryKind::Elu { alpha: alpha(1.0) }),
            "hardsigmoid" => {
                let a = alpha(0.2);
                Activation::of(UnaryKind::HardSigmoid { alpha: a, beta: betas.next().unwrap_or(0.5) })
            }
            "affine" => {
                let a = alpha(1.0);
                Activation { pre: 1.0, kind: None, post: a, shift: betas.next().unwrap_or(0.0) }
            }
            "scaledtanh" => {
                let a = alpha(1.0);
                Activation { pre: betas.next().unwrap_or(1.0), kind: Some(UnaryKind::Tanh), post: a, shift: 0.0 }
            }
            _ => {
                return Err(OpError::Attr {
                    attr: "activations".into(),
                    what: format!("unknown activation '{name}' (expected one of {ACTIVATION_NAMES})"),
                })
            }
        })
    }

    /// Applies the activation to every element of `xs`.
    pub fn apply<T: Real>(&self, xs: &mut [T]) {
        if self.pre != 1.0 {
            let pre = T::of(self.pre);
            xs.iter_mut().for_each(|v| *v = *v * pre);
        }
        if let Some(k) = self.kind {
            T::activate(k, xs);
        }
        if self.post != 1.0 || self.shift != 0.0 {
            let (post, shift) = (T::of(self.post), T::of(self.shift));
            xs.iter_mut().for_each(|v| *v = *v * post + shift);
        }
    }

    /// The WGSL statements of a function body computing the activation of f32 `x`
    /// (ending in a `return`), and the helper functions it calls.
    pub fn wgsl(&self) -> (String, &'static str) {
        let lit = |v: f32| crate::wgsl::literal("f32", v as f64);
        let mut body = String::new();
        if self.pre != 1.0 {
            body += &format!("let xs = {} * x;\n    ", lit(self.pre));
        } else {
            body += "let xs = x;\n    ";
        }
        let inner = match self.kind {
            Some(k) => k.wgsl_expr("xs", "f32"),
            None => "xs".to_string(),
        };
        body += &format!("let v = {inner};\n    return ");
        body += &match (self.post != 1.0, self.shift != 0.0) {
            (false, false) => "v;".to_string(),
            (true, false) => format!("{} * v;", lit(self.post)),
            (_, true) => format!("{} * v + {};", lit(self.post), lit(self.shift)),
        };
        (body, self.kind.map_or("", |k| k.wgsl_helpers()))
    }
}

/// Where the batch dim sits: `[seq, batch, ...]` (layout 0) or `[batch, seq, ...]` (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    SeqFirst,
    BatchFirst,
}

/// The attributes every recurrent op has.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RnnAttrs {
    pub direction: Direction,
    pub hidden_size: Option<usize>,
    /// `activations[d * per_direction + n]`: activation `n` (f, g, h) of direction `d`.
    pub activations: Vec<Activation>,
    pub clip: Option<f32>,
    pub layout: Layout,
}

impl RnnAttrs {
    pub fn parse(spec: &NodeSpec, cell: &CellSpec) -> Result<RnnAttrs> {
        let direction = match spec.string("direction", "forward")?.as_str() {
            "forward" => Direction::Forward,
            "reverse" => Direction::Reverse,
            "bidirectional" => Direction::Bidirectional,
            d => return Err(spec.bad("direction", format!("'{d}' is not one of forward, reverse, bidirectional"))),
        };
        let hidden_size = match spec.int_opt("hidden_size")? {
            Some(h) if h < 1 => return Err(spec.bad("hidden_size", format!("must be positive, got {h}"))),
            h => h.map(|h| h as usize),
        };
        let per_dir = cell.activations.len();
        let dirs = direction.count();
        let names: Vec<String> = match spec.node.attrs.get("activations") {
            None => cell.activations.iter().map(|s| s.to_string()).collect(),
            Some(Attr::Strings(v)) => v.clone(),
            Some(Attr::String(s)) => vec![s.clone()],
            Some(a) => return Err(spec.bad("activations", format!("expected a list of strings, found {}", a.kind()))),
        };
        let names: Vec<String> = if names.len() == per_dir * dirs {
            names
        } else if names.len() == per_dir {
            names.iter().cycle().take(per_dir * dirs).cloned().collect()
        } else {
            return Err(spec.bad(
                "activations",
                format!(
                    "{} needs {} activations per direction ({}), {} in all for {} direction(s); got {} ({names:?})",
                    cell.name,
                    per_dir,
                    cell.activations.join(", "),
                    per_dir * dirs,
                    dirs,
                    names.len()
                ),
            ));
        };
        let alphas = spec.floats_opt("activation_alpha")?.unwrap_or_default();
        let betas = spec.floats_opt("activation_beta")?.unwrap_or_default();
        let (mut ai, mut bi) = (alphas.into_iter(), betas.into_iter());
        let activations = names.iter().map(|n| Activation::parse(n, &mut ai, &mut bi)).collect::<Result<Vec<_>>>()?;
        let clip = match spec.float_opt("clip")? {
            Some(c) if c.is_nan() || c <= 0.0 => return Err(spec.bad("clip", format!("must be positive, got {c}"))),
            c => c,
        };
        let layout = match spec.int("layout", 0)? {
            0 => Layout::SeqFirst,
            1 => Layout::BatchFirst,
            l => return Err(spec.bad("layout", format!("must be 0 or 1, got {l}"))),
        };
        Ok(RnnAttrs { direction, hidden_size, activations, clip, layout })
    }

    /// Activation `n` of direction `d`.
    pub fn activation(&self, d: usize, n: usize) -> &Activation {
        let per_dir = self.activations.len() / self.direction.count();
        &self.activations[d * per_dir + n]
    }
}

/// The sizes of one application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dims {
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    pub dirs: usize,
    /// Gates per direction.
    pub gates: usize,
    pub layout: Layout,
}

impl Dims {
    /// Columns of one direction's input projection (`gates * hidden`).
    pub fn gh(&self) -> usize {
        self.gates * self.hidden
    }

    /// The row of X (and of the input projection) holding time `t` of batch row `b`.
    pub fn x_row(&self, t: usize, b: usize) -> usize {
        match self.layout {
            Layout::SeqFirst => t * self.batch + b,
            Layout::BatchFirst => b * self.seq + t,
        }
    }

    /// Offset of `Y[t, d, b, 0]` (`Y[b, t, d, 0]` in layout 1).
    pub fn y_offset(&self, t: usize, d: usize, b: usize) -> usize {
        match self.layout {
            Layout::SeqFirst => ((t * self.dirs + d) * self.batch + b) * self.hidden,
            Layout::BatchFirst => ((b * self.seq + t) * self.dirs + d) * self.hidden,
        }
    }

    /// Offset of `Y_h[d, b, 0]` (`Y_h[b, d, 0]` in layout 1); initial_h and initial_c,
    /// Y_c are laid out the same way.
    pub fn state_offset(&self, d: usize, b: usize) -> usize {
        match self.layout {
            Layout::SeqFirst => (d * self.batch + b) * self.hidden,
            Layout::BatchFirst => (b * self.dirs + d) * self.hidden,
        }
    }

    pub fn y_dims(&self) -> Vec<usize> {
        match self.layout {
            Layout::SeqFirst => vec![self.seq, self.dirs, self.batch, self.hidden],
            Layout::BatchFirst => vec![self.batch, self.seq, self.dirs, self.hidden],
        }
    }

    pub fn state_dims(&self) -> Vec<usize> {
        match self.layout {
            Layout::SeqFirst => vec![self.dirs, self.batch, self.hidden],
            Layout::BatchFirst => vec![self.batch, self.dirs, self.hidden],
        }
    }
}

/// Checks every input's dtype and shape against the op and its attributes; the sizes.
/// `inputs[i]` is input `i`'s dims and dtype when present.
pub(crate) fn check_inputs(cell: &CellSpec, attrs: &RnnAttrs, inputs: &[Option<(&[usize], DType)>]) -> Result<Dims> {
    let name = cell.name;
    let get = |i: usize| inputs.get(i).copied().flatten();
    let need = |i: usize| get(i).ok_or_else(|| OpError::input(i, format!("{name} needs input {i} ({})", INPUT_NAMES[i])));
    let (x, dtype) = need(X)?;
    if !FLOAT_DTYPES.contains(&dtype) {
        return Err(OpError::input(X, format!("{name}: X has dtype {dtype}; expected f32, f64, f16 or bf16")));
    }
    let n_in = if cell.has_cell_state { 8 } else { 6 };
    if let Some(i) = (n_in..inputs.len()).find(|&i| get(i).is_some()) {
        return Err(OpError::input(i, format!("{name} takes at most {n_in} inputs")));
    }
    for i in [W, R, B, INITIAL_H, INITIAL_C, P] {
        if let Some((_, dt)) = get(i) {
            if dt != dtype {
                return Err(OpError::input(i, format!("{name}: {} has dtype {dt}, differing from X's {dtype}", INPUT_NAMES[i])));
            }
        }
    }
    if x.len() != 3 {
        let want = if attrs.layout == Layout::SeqFirst { "[seq_length, batch_size, input_size]" } else { "[batch_size, seq_length, input_size]" };
        return Err(OpError::input(X, format!("{name}: X must be 3-D {want}, got {x:?}")));
    }
    let (seq, batch) = if attrs.layout == Layout::SeqFirst { (x[0], x[1]) } else { (x[1], x[0]) };
    let input = x[2];
    let dirs = attrs.direction.count();
    let g = cell.gates();
    let (r, _) = need(R)?;
    let hidden = match attrs.hidden_size {
        Some(h) => h,
        None if r.len() == 3 => r[2],
        None => return Err(OpError::input(R, format!("{name}: R must be 3-D [num_directions, {g}*hidden_size, hidden_size], got {r:?}"))),
    };
    if hidden == 0 {
        return Err(OpError::input(R, format!("{name}: hidden_size is 0 (R {r:?})")));
    }
    let gates = cell.gates;
    let shape = |i: usize, want: Vec<usize>, what: String| -> Result<()> {
        match get(i) {
            Some((d, _)) if d != want.as_slice() => Err(OpError::input(
                i,
                format!("{name}: {} must have shape {want:?} ({what}), got {d:?}", INPUT_NAMES[i]),
            )),
            _ => Ok(()),
        }
    };
    let dir_text = format!("{dirs} direction(s), hidden_size {hidden}, gates {gates}");
    need(W)?;
    shape(W, vec![dirs, g * hidden, input], format!("[num_directions, {g}*hidden_size, input_size]: {dir_text}, input_size {input}"))?;
    shape(R, vec![dirs, g * hidden, hidden], format!("[num_directions, {g}*hidden_size, hidden_size]: {dir_text}"))?;
    shape(B, vec![dirs, 2 * g * hidden], format!("[num_directions, {}*hidden_size]: {dir_text}", 2 * g))?;
    let dims = Dims { seq, batch, input, hidden, dirs, gates: g, layout: attrs.layout };
    if let Some((s, dt)) = get(SEQ_LENS) {
        if dt != DType::I32 {
            return Err(OpError::input(SEQ_LENS, format!("{name}: sequence_lens has dtype {dt}; expected i32")));
        }
        if s != [batch] {
            return Err(OpError::input(SEQ_LENS, format!("{name}: sequence_lens must have shape [{batch}] (batch_size), got {s:?}")));
        }
    }
    let state = if attrs.layout == Layout::SeqFirst { "[num_directions, batch_size, hidden_size]" } else { "[batch_size, num_directions, hidden_size]" };
    for i in [INITIAL_H, INITIAL_C] {
        shape(i, dims.state_dims(), state.to_string())?;
    }
    shape(P, vec![dirs, 3 * hidden], format!("[num_directions, 3*hidden_size]: {dir_text}"))?;
    kiln_graph::size::elements(&[dirs, seq, batch, g * hidden]).map_err(|e| OpError::invalid(format!("{name}: the input projection {e}")))?;
    Ok(dims)
}

/// The sequence length of every batch row: `sequence_lens` checked against the
/// sequence (0 to seq_length), or seq_length.
pub(crate) fn sequence_lengths(name: &str, lens: Option<&Tensor>, dims: &Dims) -> Result<Vec<usize>> {
    let Some(t) = lens else { return Ok(vec![dims.seq; dims.batch]) };
    t.as_slice::<i32>()?
        .iter()
        .enumerate()
        .map(|(b, &l)| {
            if l < 0 || l as usize > dims.seq {
                Err(OpError::input(SEQ_LENS, format!("{name}: sequence_lens[{b}] is {l}; it must be between 0 and seq_length {}", dims.seq)))
            } else {
                Ok(l as usize)
            }
        })
        .collect()
}

/// A recurrent op: its cell, the shared attributes, and how many outputs the node has.
#[derive(Clone, Debug)]
pub(crate) struct Recurrent<C: Cell> {
    pub cell: C,
    pub attrs: RnnAttrs,
    pub n_outputs: usize,
    /// com.microsoft DynamicQuantizeLSTM: 8-bit W and R ([`super::quantized`]).
    pub quantized: bool,
}

impl<C: Cell> Recurrent<C> {
    /// Builds the op of a node (attributes, output count).
    pub fn parse(spec: &NodeSpec, cell: C) -> Result<Recurrent<C>> {
        let attrs = RnnAttrs::parse(spec, &C::SPEC)?;
        let n_outputs = spec.n_outputs();
        if n_outputs > C::SPEC.max_outputs {
            return Err(OpError::invalid(format!("{} has at most {} outputs, the node has {n_outputs}", C::SPEC.name, C::SPEC.max_outputs)));
        }
        Ok(Recurrent { cell, attrs, n_outputs, quantized: false })
    }

    /// The sizes of these inputs.
    pub fn dims(&self, inputs: &[Option<Arg>]) -> Result<Dims> {
        let shapes: Vec<Option<(&[usize], DType)>> = inputs.iter().map(|a| a.map(|a| (a.dims(), a.dtype()))).collect();
        self.check(&shapes)
    }

    /// [`check_inputs`] of these shapes (a quantized op's read as LSTM's).
    pub fn check(&self, shapes: &[Option<(&[usize], DType)>]) -> Result<Dims> {
        if !self.quantized {
            return check_inputs(&C::SPEC, &self.attrs, shapes);
        }
        let owned = super::quantized::as_lstm_shapes(shapes)?;
        let view: Vec<Option<(&[usize], DType)>> = owned.iter().map(|s| s.as_ref().map(|(d, t)| (d.as_slice(), *t))).collect();
        check_inputs(&C::SPEC, &self.attrs, &view)
    }
}

impl<C: Cell> Op for Recurrent<C> {
    fn name(&self) -> &str {
        if self.quantized {
            "DynamicQuantizeLSTM"
        } else {
            C::SPEC.name
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dims = self.dims(inputs)?;
        let dtype = inputs[X].map_or(DType::F32, |x| x.dtype());
        let types = [TensorType::new(dtype, dims.y_dims()), TensorType::new(dtype, dims.state_dims()), TensorType::new(dtype, dims.state_dims())];
        Ok(types.into_iter().take(self.n_outputs).collect())
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let bytes = Cost::io_bytes(inputs, outputs);
        let flops = self.dims(inputs).map_or(0, |d| {
            let steps = (d.dirs * d.seq * d.batch) as u64;
            steps * (2 * d.gh() as u64 * (d.input + d.hidden) as u64 + 10 * d.gh() as u64)
        });
        Cost { flops, bytes }
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

impl<C: Cell> CpuKernel for Recurrent<C> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        recurrence_cpu::run(self, inputs, outputs, Default::default())
    }

    /// Constant weights built once per plan: the quantized op's 8-bit W and R, zero
    /// points subtracted (when they and their scales and zero points are constants),
    /// or an f32 R transposed for the steps' products.
    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], _tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        use super::quantized::{matrices, R_SCALE, R_ZERO, W_SCALE, W_ZERO};
        let known: Vec<Option<&Tensor>> = inputs.iter().map(|a| a.and_then(|a| a.value)).collect();
        let constant = |i: usize| known.get(i).copied().flatten();
        if self.quantized {
            if [W, R, W_SCALE, W_ZERO, R_SCALE, R_ZERO].iter().any(|&i| constant(i).is_none()) {
                return Ok(None);
            }
            let dims = self.dims(inputs)?;
            let quantized = (matrices(&known, W, &dims)?, matrices(&known, R, &dims)?);
            return Ok(Some(Box::new(PreparedWeights { op: self.clone(), quantized: Some(quantized), r_rows: None })));
        }
        let Some(r) = constant(R).filter(|r| r.dtype() == DType::F32) else { return Ok(None) };
        let dims = self.dims(inputs)?;
        let r_rows = recurrence_cpu::transpose_r(r.as_slice::<f32>()?, dims.dirs, dims.gh(), dims.hidden);
        Ok(Some(Box::new(PreparedWeights { op: self.clone(), quantized: None, r_rows: Some(r_rows) })))
    }
}

/// A recurrent op with its constant weights prepared ([`Recurrent::prepare`]).
struct PreparedWeights<C: Cell> {
    op: Recurrent<C>,
    quantized: Option<(Vec<super::quantized::QuantMatrix>, Vec<super::quantized::QuantMatrix>)>,
    r_rows: Option<Vec<f32>>,
}

impl<C: Cell> CpuKernel for PreparedWeights<C> {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let prepared = recurrence_cpu::Prepared {
            quantized: self.quantized.as_ref().map(|(w, r)| (&w[..], &r[..])),
            // Only an f32 X runs the f32 steps that read it.
            r_rows: self.r_rows.as_deref().filter(|_| inputs.first().copied().flatten().is_some_and(|x| x.dtype() == DType::F32)),
        };
        recurrence_cpu::run(&self.op, inputs, outputs, prepared)
    }
}

impl<C: Cell> WgslKernel for Recurrent<C> {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        recurrence_wgsl::params()
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        recurrence_wgsl::generate(self, inputs, outputs, tune)
    }
}
