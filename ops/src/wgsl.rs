//! The GPU side of an op: the [`WgslKernel`] trait, the program it generates, and code
//! generation helpers shared by kernels.
//!
//! Conventions: every GPU buffer holds 4-byte elements. Floats are `f32`; signed
//! integers (i8..i64) are `i32` (the runtime checks on upload that i64 values fit);
//! unsigned integers are `u32`; bool is `u32` (0 or 1). The narrow dtypes hold their
//! values: float8/float4 as `f32` (every value they can take is an f32), 4- and 2-bit
//! integers as `i32`/`u32`. Shapes are concrete when code
//! is generated, so dims and strides are baked into the source as constants.
use crate::{Arg, Result, TensorType};
use kiln_graph::DType;
use std::collections::BTreeMap;
use std::fmt::Write;

/// WGSL functions for results that must equal the CPU's bit for bit on every GPU
/// (`q_round`, `q_requantize`, and the correctly rounded `q_div` and unfused `q_mul`):
/// see [`crate::quant::qlinear::WGSL_REQUANTIZE`]. Every quantizing kernel uses them.
pub use crate::quant::qlinear::WGSL_REQUANTIZE as EXACT_ARITHMETIC;

/// What a binding of a dispatch refers to. Bindings are numbered 0.. in group 0, in the
/// order listed; inputs are read-only storage, outputs and scratch read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Binding {
    Input(usize),
    Output(usize),
    Scratch(usize),
    /// The run's status word for this node (see [`status_decl`]): kernels that find bad
    /// data (an index out of range) report it there, and the run fails with an error
    /// naming the node, instead of clamping or reading out of bounds.
    Status,
}

/// Declares the status buffer (`kiln_status`) at `binding`; bind it with
/// [`Binding::Status`] and report with [`report_index_error`].
pub fn status_decl(binding: usize) -> String {
    format!("@group(0) @binding({binding}) var<storage, read_write> kiln_status: array<atomic<u32>, 4>;\n")
}

/// What a status word reports (its word 0).
pub const STATUS_INDEX: u32 = 1;
pub const STATUS_OVERFLOW: u32 = 2;

/// WGSL statements reporting that index `value` is outside `[-bound, bound)` (both i32
/// expressions). The run then fails with "index VALUE is out of range ... of size BOUND".
pub fn report_index_error(value: &str, bound: &str) -> String {
    format!(
        "atomicStore(&kiln_status[1], bitcast<u32>({value})); atomicStore(&kiln_status[2], bitcast<u32>({bound})); atomicStore(&kiln_status[0], {STATUS_INDEX}u);"
    )
}

/// WGSL statements reporting that a 64-bit integer result of operands `a` and `b` (i32
/// or u32 expressions) does not fit the 32 bits the GPU computes in.
pub fn report_overflow(a: &str, b: &str) -> String {
    format!(
        "atomicStore(&kiln_status[1], bitcast<u32>({a})); atomicStore(&kiln_status[2], bitcast<u32>({b})); atomicStore(&kiln_status[0], {STATUS_OVERFLOW}u);"
    )
}

/// One compute dispatch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Dispatch {
    pub label: String,
    pub source: String,
    pub entry_point: String,
    pub workgroups: [u32; 3],
    pub bindings: Vec<Binding>,
}

/// The dispatches of one op application, run in order, and the scratch buffers
/// (sizes in bytes) they share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WgslProgram {
    pub dispatches: Vec<Dispatch>,
    pub scratch_bytes: Vec<u64>,
}

impl WgslProgram {
    pub fn single(d: Dispatch) -> Self {
        WgslProgram { dispatches: vec![d], scratch_bytes: vec![] }
    }
}

/// A tunable parameter of a WGSL kernel and the values worth trying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneParam {
    pub name: &'static str,
    pub default: u32,
    pub candidates: Vec<u32>,
}

/// Chosen values of tunable parameters (missing ones take their defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TuneValues(pub BTreeMap<String, u32>);

impl TuneValues {
    pub fn get(&self, p: &TuneParam) -> u32 {
        self.0.get(p.name).copied().unwrap_or(p.default)
    }
}

/// Generates WGSL for concrete input and output types.
pub trait WgslKernel: Send + Sync {
    /// Tunable parameters for these types, with their defaults.
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        vec![workgroup_param()]
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram>;

    /// Whether this kernel can bind f16 tensors as `array<f16>` (see [`Halves`]).
    fn half_storage(&self) -> HalfStorage {
        HalfStorage::No
    }

    /// [`Self::generate`] with some f16 tensors stored as halves. Only kernels whose
    /// [`Self::half_storage`] allows it are asked for halves.
    fn generate_halves(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues, halves: &Halves) -> Result<WgslProgram> {
        if halves.any() {
            return Err(crate::OpError::Unsupported("this kernel binds f16 tensors as f32 only".into()));
        }
        self.generate(inputs, outputs, tune)
    }
}

/// How a kernel can bind f16 tensors on adapters with SHADER_F16. Every f16 tensor is
/// stored as f32 by default (the conventions above); the runtime stores one as halves
/// when its producer and every consumer can bind it so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfStorage {
    No,
    /// Each f16 input and output as f32 or as halves, independently.
    Each,
    /// The f16 input 0 and output 0 both as f32 or both as halves (data movement).
    Together,
}

/// Which f16 inputs and outputs of a step are stored as halves (`array<f16>`); missing
/// entries are f32.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Halves {
    pub inputs: Vec<bool>,
    pub outputs: Vec<bool>,
}

impl Halves {
    pub fn input(&self, i: usize) -> bool {
        self.inputs.get(i).copied().unwrap_or(false)
    }
    pub fn output(&self, i: usize) -> bool {
        self.outputs.get(i).copied().unwrap_or(false)
    }
    pub fn any(&self) -> bool {
        self.inputs.iter().chain(&self.outputs).any(|&h| h)
    }
}

/// WGSL of f16 storage: the `enable` directive that must open the module, and
/// `kiln_half`/`kiln_half4`, f32 to f16 as the CPU's Cast rounds (beyond the f16 range
/// to infinity, NaN kept; WGSL leaves out-of-range conversions undefined, so the bits
/// are chosen first and the f32 holding exactly them converted).
pub const HALF_HEADER: &str = "enable f16;\n";
pub const HALF_FNS: &str = "fn kiln_half(x: f32) -> f16 {
    var bits = pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
    if (x != x) { bits = 0x7e00u; }
    if (x >= 65520.0) { bits = 0x7c00u; }
    if (x <= -65520.0) { bits = 0xfc00u; }
    return f16(unpack2x16float(bits).x);
}
fn kiln_half4(v: vec4<f32>) -> vec4<f16> {
    return vec4<f16>(kiln_half(v.x), kiln_half(v.y), kiln_half(v.z), kiln_half(v.w));
}
";

/// The storage element type of a binding: `ty` (a vector or scalar of f32), or its
/// f16 counterpart when stored as halves.
pub fn stored(ty: &str, half: bool) -> String {
    if half { ty.replace("f32", "f16") } else { ty.to_string() }
}

/// An f32 (`ty`) expression of element `e` of a binding stored as `stored(ty, half)`.
pub fn load(e: &str, ty: &str, half: bool) -> String {
    if half { format!("{ty}({e})") } else { e.to_string() }
}

/// The value to store of f32 (`ty`) expression `e` in a binding stored as halves or not.
pub fn store(e: &str, ty: &str, half: bool) -> String {
    match (half, ty.starts_with("vec4")) {
        (false, _) => e.to_string(),
        (true, true) => format!("kiln_half4({e})"),
        (true, false) => format!("kiln_half({e})"),
    }
}

/// `source` with f16 storage enabled (when `halves`) and the helpers added.
pub fn with_halves(source: String, halves: bool) -> String {
    if halves { format!("{HALF_HEADER}{HALF_FNS}{source}") } else { source }
}

/// The usual 1-D workgroup size parameter.
pub fn workgroup_param() -> TuneParam {
    TuneParam { name: "workgroup", default: 64, candidates: vec![32, 64, 128, 256] }
}

/// WGSL storage element type of a dtype (see the module docs).
pub fn elem(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::F64 => "f32",
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0 | DType::F4E2M1 => "f32",
        DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::I4 | DType::I2 => "i32",
        DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool | DType::U4 | DType::U2 => "u32",
        // Never bound: steps that touch strings run on the host (the runtime refuses
        // to generate them); a name is needed only to keep this function total.
        DType::String => "u32",
    }
}

/// A WGSL literal of element type `ty` ("f32", "i32", "u32") for `v`.
pub fn literal(ty: &str, v: f64) -> String {
    match ty {
        "f32" => {
            if v.is_nan() {
                "bitcast<f32>(0x7fc00000u)".into()
            } else if v.is_infinite() {
                if v > 0.0 { "bitcast<f32>(0x7f800000u)".into() } else { "bitcast<f32>(0xff800000u)".into() }
            } else {
                let f = v as f32;
                if f.is_infinite() {
                    if f > 0.0 { "bitcast<f32>(0x7f800000u)".into() } else { "bitcast<f32>(0xff800000u)".into() }
                } else {
                    format!("bitcast<f32>({}u)", f.to_bits())
                }
            }
        }
        "i32" => {
            let i = v.clamp(i32::MIN as f64, i32::MAX as f64) as i64;
            if i == i32::MIN as i64 { "i32(-2147483648)".into() } else { format!("i32({i})") }
        }
        _ => format!("{}u", v.clamp(0.0, u32::MAX as f64) as u64),
    }
}

/// Storage declarations for the bindings: `(name, element type, read_only)` in
/// binding order.
pub fn declare(buffers: &[(&str, &str, bool)]) -> String {
    let mut s = String::new();
    for (i, (name, ty, ro)) in buffers.iter().enumerate() {
        let access = if *ro { "read" } else { "read_write" };
        let _ = writeln!(s, "@group(0) @binding({i}) var<storage, {access}> {name}: array<{ty}>;");
    }
    s
}

/// Largest workgroup count per grid dimension (WebGPU's default limit).
pub const MAX_GROUPS: u32 = 65535;

/// A 1-D launch of `n` invocations in workgroups of `wg`, laid out on a 2-D grid when
/// the count exceeds [`MAX_GROUPS`]. Returns the grid and the WGSL statements that
/// compute `let i: u32` (the invocation index) from `gid` and return when `i >= n`.
pub fn grid_1d(n: usize, wg: u32) -> ([u32; 3], String) {
    let groups = (n as u64).div_ceil(wg as u64).max(1);
    let x = groups.min(MAX_GROUPS as u64);
    let y = groups.div_ceil(x);
    let code = format!("let i = gid.x + gid.y * {}u;\n    if (i >= {}u) {{ return; }}\n", x * wg as u64, n);
    ([x as u32, y as u32, 1], code)
}

/// A WGSL function `fn {name}(i: u32) -> u32` mapping a row-major linear index over
/// `out` dims to the offset given by `strides` (one per out dim; 0 for broadcast dims).
pub fn offset_fn(name: &str, out: &[usize], strides: &[usize]) -> String {
    let mut body = String::new();
    let contiguous = crate::broadcast::strides(out) == strides;
    if contiguous {
        return format!("fn {name}(i: u32) -> u32 {{ return i; }}\n");
    }
    let _ = writeln!(body, "fn {name}(i: u32) -> u32 {{\n    var r = i;\n    var o = 0u;");
    for d in (0..out.len()).rev() {
        if out[d] == 1 {
            continue;
        }
        if d == 0 {
            if strides[d] != 0 {
                let _ = writeln!(body, "    o += r * {}u;", strides[d]);
            }
        } else {
            if strides[d] != 0 {
                let _ = writeln!(body, "    o += (r % {}u) * {}u;", out[d], strides[d]);
            }
            let _ = writeln!(body, "    r = r / {}u;", out[d]);
        }
    }
    body.push_str("    return o;\n}\n");
    body
}

/// A complete single-dispatch elementwise-style kernel: one invocation per element of
/// output 0, `body` computing `out[i]` from the declared buffers. `buffers` are the
/// bindings in order (as in [`declare`]); `helpers` are extra WGSL functions.
pub fn simple_kernel(
    label: &str,
    n: usize,
    wg: u32,
    buffers: &[(&str, &str, bool)],
    bindings: Vec<Binding>,
    helpers: &str,
    body: &str,
) -> Dispatch {
    let (grid, index) = grid_1d(n, wg);
    let source = format!(
        "{}\n{}\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {}    {}\n}}\n",
        declare(buffers),
        helpers,
        index,
        body
    );
    Dispatch { label: label.to_string(), source, entry_point: "main".into(), workgroups: grid, bindings }
}

#[cfg(test)]
pub(crate) mod testing {
    //! The naga validation of generated WGSL, for this crate's tests.
    pub use crate::testing::validate_wgsl as validate;
}

/// Most loop iterations one invocation may run on every driver: Mesa's
/// llvmpipe/lavapipe counts the iterations of all loops of an invocation together and
/// silently leaves every loop after 65535 of them (measured here: a 70000-element sum
/// stopped at 65535, also split into nested or consecutive loops). Kernels whose
/// per-invocation loops can be longer spread the work over a workgroup
/// ([`lanes_for`]) or fail with a clear error.
pub const MAX_LOOP_ITERATIONS: usize = 65535;

/// The fewest lanes (a power of two, at most 256) that keep `iterations` of loop work,
/// shared evenly between lanes, under [`MAX_LOOP_ITERATIONS`] per invocation; `None`
/// when even 256 lanes are not enough.
pub fn lanes_for(iterations: usize) -> Option<u32> {
    (0..=8).map(|p| 1u32 << p).find(|&l| iterations.div_ceil(l as usize) <= MAX_LOOP_ITERATIONS)
}

/// WGSL for `for (var {var} = {start}; {var} < {end}; {var} += {step}) { body }`.
pub fn for_loop(var: &str, start: &str, end: &str, step: &str, body: &str) -> String {
    format!("for (var {var} = {start}; {var} < {end}; {var} = {var} + {step}) {{\n{body}\n}}\n")
}

#[cfg(test)]
mod half_tests {
    use super::*;
    use kiln_graph::{Attr, Node};

    fn op(op_type: &str, attrs: &[(&str, kiln_graph::Attr)]) -> Box<dyn crate::Op> {
        let (domain, op_type) = op_type.split_once('.').unwrap_or(("", op_type));
        let node = Node { name: "n".into(), op_type: op_type.into(), domain: domain.into(), attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(), inputs: vec![], outputs: vec![] };
        crate::Registry::builtin().create(&crate::NodeSpec::new(&node, 17)).unwrap()
    }

    /// Every kernel that binds halves generates valid WGSL for each mix of halves and
    /// f32 bindings it allows, and uses f16 storage exactly where asked.
    #[test]
    fn kernels_with_half_storage_generate_valid_wgsl() {
        let h = |dims: &[usize]| TensorType::new(DType::F16, dims.to_vec());
        let f = |dims: &[usize]| TensorType::new(DType::F32, dims.to_vec());
        let cases: Vec<(Box<dyn crate::Op>, Vec<TensorType>, usize)> = vec![
            (op("MatMul", &[]), vec![h(&[2, 5, 8]), h(&[8, 12])], 2),
            (op("MatMul", &[]), vec![h(&[3, 7]), h(&[7, 5])], 2),
            (op("Gemm", &[("transB", kiln_graph::Attr::Int(1))]), vec![h(&[4, 6]), h(&[3, 6]), h(&[3])], 3),
            (op("Transpose", &[("perm", kiln_graph::Attr::Ints(vec![1, 0]))]), vec![h(&[3, 5])], 1),
            (op("Cast", &[("to", kiln_graph::Attr::Int(DType::F32.onnx_code() as i64))]), vec![h(&[9])], 1),
            (op("Cast", &[("to", kiln_graph::Attr::Int(DType::F16.onnx_code() as i64))]), vec![f(&[9])], 1),
            (op("Conv", &[("pads", Attr::Ints(vec![1, 1, 1, 1]))]), vec![h(&[2, 3, 6, 5]), h(&[4, 3, 3, 3]), h(&[4])], 3),
            (op("ConvTranspose", &[("strides", Attr::Ints(vec![2, 2]))]), vec![h(&[2, 3, 4, 4]), h(&[3, 2, 3, 3]), h(&[2])], 3),
            (op("kiln.ConvWeightGrad", &[("kernel_shape", Attr::Ints(vec![3, 3]))]), vec![h(&[2, 3, 6, 5]), h(&[2, 4, 4, 3])], 2),
            (op("ReduceSum", &[("axes", Attr::Ints(vec![0, 2])), ("keepdims", Attr::Int(0))]), vec![h(&[4, 3, 5])], 1),
            (op("ReduceSum", &[("axes", Attr::Ints(vec![0])), ("keepdims", Attr::Int(0))]), vec![h(&[5000, 3])], 1),
            (op("MaxPool", &[("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))]), vec![h(&[2, 3, 6, 6])], 1),
            (op("kiln.MaxPoolGrad", &[("kernel_shape", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2, 2]))]), vec![h(&[2, 3, 6, 6]), h(&[2, 3, 3, 3])], 2),
            (op("Relu", &[]), vec![h(&[7])], 1),
            (op("Add", &[]), vec![h(&[2, 3]), h(&[3])], 2),
            (op("Div", &[]), vec![h(&[4]), h(&[])], 2),
        ];
        for (op, types, n_in) in cases {
            let args: Vec<Option<Arg>> = types.iter().map(|ty| Some(Arg { ty, value: None })).collect();
            let outs = op.infer(&args).unwrap();
            let k = op.wgsl().unwrap();
            assert_ne!(k.half_storage(), HalfStorage::No, "{}", op.name());
            let halves = Halves { inputs: types.iter().map(|t| t.dtype == DType::F16).collect(), outputs: outs.iter().map(|t| t.dtype == DType::F16).collect() };
            let mut mixes = vec![halves.clone()];
            if k.half_storage() == HalfStorage::Each {
                // One half at a time, the rest f32.
                for i in 0..n_in {
                    if halves.input(i) {
                        mixes.push(Halves { inputs: (0..n_in).map(|j| j == i).collect(), outputs: vec![false] });
                    }
                }
            }
            for mix in mixes {
                let p = k.generate_halves(&args, &outs, &TuneValues::default(), &mix).unwrap();
                for d in &p.dispatches {
                    crate::testing::validate_wgsl(&d.source);
                    assert_eq!(d.source.contains("array<f16>") || d.source.contains("array<vec4<f16>>"), mix.any(), "{}: {mix:?}\n{}", op.name(), d.source);
                }
            }
            assert!(k.generate_halves(&args, &outs, &TuneValues::default(), &Halves { inputs: vec![], outputs: vec![false] }).is_ok());
        }
    }
}
