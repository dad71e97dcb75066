use crate::{CpuKernel, OpError, Result, WgslKernel};
use kiln_graph::{DType, Tensor, ValueKind};
use std::fmt;

/// A concrete tensor type: dtype and dims (no symbols: sessions specialize shapes
/// before kernels are chosen). A sequence or an optional (`kind`, see
/// [`TensorType::container`]) has the dtype of its tensors and dims `[0]`: it holds no
/// tensor memory, as the composite tensor that carries it ([`Tensor::from_value`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub kind: ValueKind,
}

impl TensorType {
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType { dtype, dims: dims.into(), kind: ValueKind::Tensor }
    }

    /// The type of a sequence or optional (`kind`) of tensors of `dtype`.
    pub fn container(kind: ValueKind, dtype: DType) -> TensorType {
        TensorType { dtype, dims: vec![0], kind }
    }

    /// The type of a value (a tensor, or the sequence or optional it carries).
    pub fn of(t: &Tensor) -> TensorType {
        TensorType { dtype: t.dtype(), dims: t.dims().to_vec(), kind: t.kind() }
    }

    pub fn is_tensor(&self) -> bool {
        self.kind.is_tensor()
    }
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
    /// Elements, or None when the shape does not fit in memory (`kiln_graph::size`).
    pub fn checked_len(&self) -> Option<usize> {
        kiln_graph::size::elements(&self.dims).ok()
    }
    /// Bytes, or None when the shape does not fit in memory (`kiln_graph::size`).
    pub fn checked_bytes(&self) -> Option<usize> {
        kiln_graph::size::bytes(self.dtype, &self.dims).ok()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ValueKind::Tensor => write!(f, "{}{:?}", self.dtype, self.dims),
            k => f.write_str(&k.describe(&self.dtype.to_string())),
        }
    }
}

/// One input of an op as seen by inference and kernel generation: its type and, when
/// the value is a constant (weights, folded shape computations), the value itself.
#[derive(Clone, Copy, Debug)]
pub struct Arg<'a> {
    pub ty: &'a TensorType,
    pub value: Option<&'a Tensor>,
}

impl<'a> Arg<'a> {
    pub fn dims(&self) -> &'a [usize] {
        &self.ty.dims
    }
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }
    pub fn rank(&self) -> usize {
        self.ty.dims.len()
    }
}

/// Estimated work of one op application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub flops: u64,
    /// Bytes read and written.
    pub bytes: u64,
}

impl Cost {
    /// Bytes an op reads and writes: every present input and every output.
    pub fn io_bytes(inputs: &[Option<Arg>], outputs: &[TensorType]) -> u64 {
        (inputs.iter().flatten().map(|a| a.ty.bytes()).sum::<usize>() + outputs.iter().map(|o| o.bytes()).sum::<usize>()) as u64
    }
}

/// A unary f32 function that an op computes element by element (output dims = input
/// dims): the compiler's elementwise fusion folds such ops, custom ones included, into
/// `kiln.FusedElementwise` chains with Kiln's own.
pub trait ElementwiseFn: Send + Sync + fmt::Debug {
    /// Applies the function to a block of values, in place (CPU).
    fn apply(&self, x: &mut [f32]);
    /// A WGSL f32 expression of the result for the f32 expression `x` (it may repeat
    /// `x`, which is always a plain name).
    fn wgsl(&self, x: &str) -> String;
}

/// An operator, with its attributes parsed. Implemented once per op; see the crate docs.
pub trait Op: Send + Sync + fmt::Debug {
    /// The op type, as in the ONNX spec (`Conv`, `MatMul`, ...).
    fn name(&self) -> &str;

    /// Output types for concrete input types. `inputs[i]` is `None` for an omitted
    /// optional input. Values are given for constant inputs.
    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>>;

    /// Work estimate; the default counts one flop per output element and all bytes moved.
    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: outputs.iter().map(|o| o.len() as u64).sum(), bytes: Cost::io_bytes(inputs, outputs) }
    }

    /// The CPU kernel, if this op runs on the CPU.
    fn cpu(&self) -> Option<&dyn CpuKernel>;

    /// The WGSL kernel generator, if this op runs on GPUs.
    fn wgsl(&self) -> Option<&dyn WgslKernel>;

    /// Outputs that follow from the input *types* alone (Shape, Size), so that the
    /// compiler can fold them even when the input values are not known.
    fn eval_from_types(&self, _inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        None
    }

    /// The outputs, from known input values, of an op whose output types depend on
    /// those values and are found by computing the outputs (NonMaxSuppression): a
    /// node whose every input is known is then evaluated once, by this, instead of
    /// computed by `infer` and again by its kernel. None: `infer`, then the kernel.
    fn eval_to_infer(&self, _inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        None
    }

    /// True when the op only reinterprets its first input (same bytes, new dims):
    /// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout. Runtimes may alias.
    fn is_view(&self) -> bool {
        false
    }

    /// True when the op takes inputs of the narrow dtypes (float8, float4, 4- and 2-bit
    /// integers; `DType::is_narrow`): Cast, CastLike, QuantizeLinear, DequantizeLinear
    /// and the views. Inference refuses narrow inputs for every other op, naming it.
    fn handles_narrow(&self) -> bool {
        self.is_view()
    }

    /// True when the op takes string inputs (`DType::String`): the string ops,
    /// LabelEncoder, ArrayFeatureExtractor, TfIdfVectorizer (with `pool_strings`), Equal,
    /// Cast, CastLike, Concat, Shape, Size and the views. Inference refuses string inputs for
    /// every other op, naming it. Steps that touch strings run on the host.
    fn handles_strings(&self) -> bool {
        self.is_view()
    }

    /// True when the CPU kernel writes every element of every output. The CPU memory
    /// plan hands out recycled buffers with stale contents; an op that leaves some
    /// elements alone (relying on zeroed outputs) keeps the default `false` and gets its
    /// outputs zeroed first.
    fn overwrites_outputs(&self) -> bool {
        false
    }

    /// True when the op takes or produces sequences or optionals (`TensorType::kind`):
    /// the sequence ops, Identity, If and Loop. Inference refuses such values for every
    /// other op, naming the input; a node that sees one runs on the host only, folded
    /// once its inputs are known (a session evaluates it between stages), never as a
    /// device step.
    fn handles_containers(&self) -> bool {
        false
    }

    /// The op as a unary f32 elementwise function, when it is one (one f32 input, one
    /// output of the same dims) and may be fused with its neighbours; `None` (the
    /// default) keeps it a node of its own. Kiln's unary ops fuse through their own
    /// table; this is the way in for custom ops.
    fn elementwise(&self) -> Option<std::sync::Arc<dyn ElementwiseFn>> {
        None
    }

    /// True when the outputs differ from run to run for the same inputs (random ops
    /// without a seed): such a node is never folded into a constant, so every run
    /// computes it afresh.
    fn varies_between_runs(&self) -> bool {
        false
    }

    /// Where a runtime should place the node among those its dependencies leave free
    /// ([`Schedule`]); `Any` by default.
    fn schedule(&self) -> Schedule {
        Schedule::Any
    }
}

/// Where a node goes in a run's order, within what its dependencies allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Wherever the topological order puts it.
    Any,
    /// As soon as its inputs are ready (it starts work that goes on in the background:
    /// kiln.AllReduceStart).
    Early,
    /// As late as its readers allow, after every node that does not depend on it (it
    /// waits for background work: kiln.AllReduceWait).
    Late,
}

/// Required input `i`, or an error saying it is missing.
pub fn required<'a>(inputs: &[Option<Arg<'a>>], i: usize) -> Result<Arg<'a>> {
    inputs.get(i).copied().flatten().ok_or_else(|| OpError::input(i, "required input is missing"))
}

/// The constant value of input `i`, or an error saying it must be constant.
pub fn constant<'a>(inputs: &[Option<Arg<'a>>], i: usize, what: &str) -> Result<&'a Tensor> {
    required(inputs, i)?.value.ok_or_else(|| OpError::NeedsValue { index: i, what: what.to_string() })
}

/// Checks that input `i` has one of the listed dtypes.
pub fn expect_dtype(inputs: &[Option<Arg>], i: usize, allowed: &[DType]) -> Result<DType> {
    let a = required(inputs, i)?;
    if allowed.contains(&a.dtype()) {
        Ok(a.dtype())
    } else {
        let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
        Err(OpError::input(i, format!("dtype {} is not supported (expected one of {})", a.dtype(), names.join(", "))))
    }
}

/// Normalises a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r.max(1) && !(r == 0 && axis == 0) {
        return Err(OpError::invalid(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}
