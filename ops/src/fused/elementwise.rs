//! `kiln.FusedElementwise`: a tree of f32 elementwise ops (unary math and activations,
//! Add/Sub/Mul/Div/Pow/Max/Min with broadcasting) evaluated in one kernel, written by the
//! graph compiler's elementwise fusion pass.
//!
//! The program is a list of instructions over registers: registers `0..inputs` are the
//! node's inputs (broadcast to the output shape), register `inputs + k` is the result of
//! instruction `k`, and the last instruction is the output. It travels as attributes:
//! `kiln_ops` (op names), `kiln_operands` (two register numbers per instruction, -1 for
//! none), `kiln_params` and `kiln_param_counts` (each unary op's parameters).
//!
//! CPU: the output is processed in blocks of [`BLOCK`] elements; each instruction runs
//! over a whole block of registers (vectorised loops, cache-resident), so a chain of N
//! ops reads its inputs and writes its output once instead of N times. WGSL: one
//! invocation per output element, one `let` per instruction.
use crate::broadcast::{broadcast_shapes, broadcast_strides, for_each_offset_in};
use crate::cpu::{self, CpuKernel};
use crate::elementwise::{BinaryKind, UnaryKind};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, ElementwiseFn, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{Attr, DType, Graph, Node, Tensor};
use std::sync::Arc;

/// Elements per CPU block.
const BLOCK: usize = 512;

/// One instruction of a fused program.
#[derive(Clone, Debug, PartialEq)]
pub enum Instr {
    Unary(UnaryKind, usize),
    Binary(BinaryKind, usize, usize),
    /// An op's own elementwise function ([`crate::Op::elementwise`]: custom ops).
    Custom(CustomFn, usize),
}

/// A fused op that is not Kiln's: its function and the node it came from (kept, as the
/// node attribute `kiln_custom_nodes`, so that the op is created again from a registry
/// that has it when the fused node is loaded).
#[derive(Clone)]
pub struct CustomFn {
    pub f: Arc<dyn ElementwiseFn>,
    pub node: Node,
}

impl std::fmt::Debug for CustomFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Custom({}.{}: {:?})", self.node.domain, self.node.op_type, self.f)
    }
}

impl PartialEq for CustomFn {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node
    }
}

/// The attribute holding the custom nodes of a fused program (a graph of those nodes,
/// in instruction order).
pub const CUSTOM_NODES_ATTR: &str = "kiln_custom_nodes";

/// Binary kinds the fuser accepts (same dtype in and out, two operands).
pub fn fusible_binary(k: BinaryKind) -> bool {
    k.fusible()
}

#[derive(Debug)]
pub struct FusedElementwise {
    pub instrs: Vec<Instr>,
}

impl FusedElementwise {
    /// The node attributes that describe `instrs`.
    pub fn attrs(instrs: &[Instr]) -> Vec<(String, Attr)> {
        let mut ops = vec![];
        let mut operands = vec![];
        let mut params = vec![];
        let mut counts = vec![];
        let mut custom = Graph::new("kiln_custom_nodes");
        for i in instrs {
            match i {
                Instr::Custom(c, a) => {
                    ops.push(format!("custom:{}.{}", c.node.domain, c.node.op_type));
                    operands.extend([*a as i64, -1]);
                    counts.push(0);
                    // The nodes form a chain (node k reads value k, writes value k + 1),
                    // so that the subgraph is a valid graph.
                    if custom.values.is_empty() {
                        let v = custom.add_value("v0".to_string(), None);
                        custom.inputs.push(v);
                    }
                    let k = custom.nodes.len();
                    let out = custom.add_value(format!("v{}", k + 1), None);
                    custom.nodes.push(Node { inputs: vec![Some(k)], outputs: vec![out], ..c.node.clone() });
                }
                &Instr::Unary(k, a) => {
                    ops.push(k.op_name().to_string());
                    operands.extend([a as i64, -1]);
                    let p = k.params();
                    counts.push(p.len() as i64);
                    params.extend(p);
                }
                &Instr::Binary(k, a, b) => {
                    ops.push(k.op_name().to_string());
                    operands.extend([a as i64, b as i64]);
                    counts.push(0);
                }
            }
        }
        let mut attrs = vec![
            ("kiln_ops".into(), Attr::Strings(ops)),
            ("kiln_operands".into(), Attr::Ints(operands)),
            ("kiln_params".into(), Attr::Floats(params)),
            ("kiln_param_counts".into(), Attr::Ints(counts)),
        ];
        if let Some(last) = custom.nodes.last().map(|n| n.outputs[0]) {
            custom.outputs.push(last);
            attrs.push((CUSTOM_NODES_ATTR.into(), Attr::Graph(Arc::new(custom))));
        }
        attrs
    }

    fn parse(spec: &NodeSpec) -> Result<FusedElementwise> {
        let ops = match spec.node.attrs.get("kiln_ops") {
            Some(Attr::Strings(s)) => s.clone(),
            _ => return Err(spec.bad("kiln_ops", "a list of op names is required")),
        };
        let operands = spec.ints("kiln_operands", &[])?;
        let params = spec.floats_opt("kiln_params")?.unwrap_or_default();
        let counts = spec.ints("kiln_param_counts", &[])?;
        if ops.is_empty() || operands.len() != 2 * ops.len() || counts.len() != ops.len() {
            return Err(spec.bad("kiln_operands", format!("{} ops need {} operands and {} parameter counts", ops.len(), 2 * ops.len(), ops.len())));
        }
        let inputs = spec.node.inputs.len();
        let mut instrs = vec![];
        let mut p = 0usize;
        let mut custom_seen = 0;
        for (k, name) in ops.iter().enumerate() {
            let available = inputs + k;
            let reg = |v: i64| -> Result<usize> {
                usize::try_from(v).ok().filter(|&r| r < available).ok_or_else(|| {
                    spec.bad("kiln_operands", format!("instruction {k} ({name}) reads register {v}; only 0..{available} exist"))
                })
            };
            let n = usize::try_from(counts[k]).map_err(|_| spec.bad("kiln_param_counts", "negative count"))?;
            let ps = params.get(p..p + n).ok_or_else(|| spec.bad("kiln_params", "fewer parameters than counted"))?;
            p += n;
            if name.starts_with("custom:") {
                let Some(Attr::Graph(nodes)) = spec.node.attrs.get(CUSTOM_NODES_ATTR) else {
                    return Err(spec.bad(CUSTOM_NODES_ATTR, format!("instruction {k} ({name}) needs the custom nodes")));
                };
                let node = nodes.nodes.get(custom_seen).ok_or_else(|| spec.bad(CUSTOM_NODES_ATTR, format!("instruction {k} ({name}) has no node")))?;
                custom_seen += 1;
                let registry = spec.registry.unwrap_or_else(|| Registry::builtin());
                let opset = nodes.opsets.get(&node.domain).copied().unwrap_or(1);
                let op = registry.create(&NodeSpec::new(node, opset))?;
                let f = op.elementwise().ok_or_else(|| spec.bad("kiln_ops", format!("{name} is not an elementwise op")))?;
                instrs.push(Instr::Custom(CustomFn { f, node: node.clone() }, reg(operands[2 * k])?));
            } else if let Some(kind) = BinaryKind::from_name(name).filter(|k| fusible_binary(*k)) {
                instrs.push(Instr::Binary(kind, reg(operands[2 * k])?, reg(operands[2 * k + 1])?));
            } else if let Some(kind) = UnaryKind::from_name_params(name, ps) {
                instrs.push(Instr::Unary(kind, reg(operands[2 * k])?));
            } else {
                return Err(spec.bad("kiln_ops", format!("'{name}' cannot be fused")));
            }
        }
        Ok(FusedElementwise { instrs })
    }

    fn names(&self) -> String {
        self.instrs
            .iter()
            .map(|i| match i {
                Instr::Unary(k, _) => k.op_name(),
                Instr::Binary(k, _, _) => k.op_name(),
                Instr::Custom(c, _) => c.node.op_type.as_str(),
            })
            .collect::<Vec<_>>()
            .join("+")
    }
}

impl Op for FusedElementwise {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        "FusedElementwise"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let mut dims: Vec<&[usize]> = vec![];
        for (i, a) in inputs.iter().enumerate() {
            let a = a.as_ref().ok_or_else(|| OpError::input(i, "every input of a fused elementwise node is required"))?;
            if a.dtype() != DType::F32 {
                return Err(OpError::input(i, format!("fused elementwise kernels take f32, got {}", a.dtype())));
            }
            dims.push(a.dims());
        }
        Ok(vec![TensorType::new(DType::F32, broadcast_shapes(&dims)?)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: outputs[0].len() as u64 * self.instrs.len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

/// How a block of an input is read.
enum Access {
    Same,
    Scalar,
    /// The input is the trailing dims of the output, repeated (`n` elements).
    Trailing(usize),
    /// The input is a middle block of the output's dims (1 before and after it, e.g. a
    /// per-channel `[1, C, 1, 1]` scale of `[N, C, H, W]`): each of its `len` values
    /// covers `inner` consecutive outputs, cyclically.
    Spread { len: usize, inner: usize },
    General(Vec<usize>),
}

fn access(dims: &[usize], out: &[usize]) -> Access {
    let len: usize = dims.iter().product();
    if dims == out {
        return Access::Same;
    }
    if len == 1 {
        return Access::Scalar;
    }
    let lead = dims.iter().take_while(|&&d| d == 1).count();
    let tail = &dims[lead..];
    if tail.len() <= out.len() && tail == &out[out.len() - tail.len()..] {
        return Access::Trailing(len);
    }
    if dims.len() <= out.len() {
        // Aligned to the output's rank (numpy pads leading ones).
        let pad = out.len() - dims.len();
        let trail = dims.iter().rev().take_while(|&&d| d == 1).count();
        let (from, to) = (pad + lead, out.len() - trail);
        if from < to && dims[lead..dims.len() - trail] == out[from..to] {
            return Access::Spread { len, inner: out[to..].iter().product() };
        }
    }
    Access::General(broadcast_strides(dims, out))
}

#[inline(always)]
fn load(a: &Access, src: &[f32], out_dims: &[usize], start: usize, dst: &mut [f32]) {
    match a {
        Access::Same => dst.copy_from_slice(&src[start..start + dst.len()]),
        Access::Scalar => dst.fill(src[0]),
        Access::Trailing(n) => {
            let mut k = 0;
            while k < dst.len() {
                let at = (start + k) % n;
                let run = (n - at).min(dst.len() - k);
                dst[k..k + run].copy_from_slice(&src[at..at + run]);
                k += run;
            }
        }
        Access::Spread { len, inner } => {
            let mut k = 0;
            while k < dst.len() {
                let i = start + k;
                let run = (inner - i % inner).min(dst.len() - k);
                dst[k..k + run].fill(src[(i / inner) % len]);
                k += run;
            }
        }
        Access::General(st) => {
            for_each_offset_in(out_dims, std::slice::from_ref(st), start, start + dst.len(), &mut |o, offs| dst[o - start] = src[offs[0]]);
        }
    }
}

/// `out = a op b` over a block (f32): the table's f32 function, except Pow.
#[inline(always)]
fn binary_block(k: BinaryKind, a: &[f32], b: &[f32], out: &mut [f32]) {
    #[inline(always)]
    fn zip(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    }
    match k {
        BinaryKind::Pow if b.iter().all(|&e| e == 2.0) => zip(a, b, out, |x, _| x * x),
        BinaryKind::Pow if b.iter().all(|&e| e == 3.0) => zip(a, b, out, |x, _| x * x * x),
        BinaryKind::Pow if b.iter().all(|&e| e == 0.5) => zip(a, b, out, |x, _| x.sqrt()),
        // Computed in f64, as the fused program always has.
        BinaryKind::Pow => zip(a, b, out, |x, y| k.apply_f64(x as f64, y as f64) as f32),
        k => k.zip_f32(a, b, out),
    }
}

impl FusedElementwise {
    /// Evaluates the blocks of `part` (output elements from `first * BLOCK`).
    #[inline(always)]
    /// A `None` source is the input run in place: its values are in `part` itself.
    fn blocks(&self, srcs: &[Option<&[f32]>], accesses: &[Access], out_dims: &[usize], first: usize, part: &mut [f32], scratch: &mut [f32]) {
        let inputs = srcs.len();
        let regs = inputs + self.instrs.len();
        for (b, out) in part.chunks_mut(BLOCK).enumerate() {
            let start = (first + b) * BLOCK;
            let n = out.len();
            for (r, (a, src)) in accesses.iter().zip(srcs).enumerate() {
                let dst = &mut scratch[r * BLOCK..r * BLOCK + n];
                match src {
                    Some(src) => load(a, src, out_dims, start, dst),
                    None => dst.copy_from_slice(out),
                }
            }
            for (k, ins) in self.instrs.iter().enumerate() {
                let (before, rest) = scratch.split_at_mut((inputs + k) * BLOCK);
                let target = &mut rest[..n];
                match *ins {
                    Instr::Unary(kind, a) => {
                        target.copy_from_slice(&before[a * BLOCK..a * BLOCK + n]);
                        kind.apply_slice_f32(target);
                    }
                    Instr::Binary(kind, a, c) => {
                        binary_block(kind, &before[a * BLOCK..a * BLOCK + n], &before[c * BLOCK..c * BLOCK + n], target);
                    }
                    Instr::Custom(ref c, a) => {
                        target.copy_from_slice(&before[a * BLOCK..a * BLOCK + n]);
                        c.f.apply(target);
                    }
                }
            }
            out.copy_from_slice(&scratch[(regs - 1) * BLOCK..(regs - 1) * BLOCK + n]);
        }
    }

    /// [`FusedElementwise::blocks`] compiled for AVX2 + FMA (8 lanes instead of SSE's 4).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn blocks_avx2(&self, srcs: &[Option<&[f32]>], accesses: &[Access], out_dims: &[usize], first: usize, part: &mut [f32], scratch: &mut [f32]) {
        self.blocks(srcs, accesses, out_dims, first, part, scratch)
    }
}


impl CpuKernel for FusedElementwise {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        self.run_over(inputs, None, outputs)
    }

    /// Any f32 input of the output's dims (read element by element, block by block).
    fn in_place_inputs(&self, inputs: &[Option<&TensorType>], output: &TensorType) -> Vec<usize> {
        let fits = |t: &TensorType| t.dtype == DType::F32 && t.dims == output.dims;
        inputs.iter().enumerate().filter(|(_, t)| t.is_some_and(fits)).map(|(i, _)| i).collect()
    }

    fn run_in_place(&self, inputs: &[Option<&Tensor>], i: usize, outputs: &mut [Tensor]) -> Result<()> {
        self.run_over(inputs, Some(i), outputs)
    }
}

impl FusedElementwise {
    /// Runs the program; input `in_place` (if any) is read from the output itself.
    fn run_over(&self, inputs: &[Option<&Tensor>], in_place: Option<usize>, outputs: &mut [Tensor]) -> Result<()> {
        let out_dims = outputs[0].dims().to_vec();
        let srcs: Vec<Option<&[f32]>> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| match t {
                _ if Some(i) == in_place => Ok(None),
                Some(t) => Ok(Some(t.as_slice::<f32>()?)),
                None => Err(OpError::input(i, "missing")),
            })
            .collect::<Result<_>>()?;
        let accesses: Vec<Access> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let dims = if Some(i) == in_place { out_dims.as_slice() } else { t.map(|t| t.dims()).unwrap_or(&[]) };
                access(dims, &out_dims)
            })
            .collect();
        let regs = inputs.len() + self.instrs.len();
        let dst = outputs[0].as_mut_slice::<f32>()?;
        let work = self.instrs.len() * 4 + inputs.len();
        let avx2 = cpu::has_avx2();
        cpu::par_chunks_mut(dst, BLOCK, work * BLOCK, |first, part| {
            cpu::with_scratch(regs * BLOCK, |scratch| {
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { self.blocks_avx2(&srcs, &accesses, &out_dims, first, part, scratch) };
                    return;
                }
                let _ = avx2;
                self.blocks(&srcs, &accesses, &out_dims, first, part, scratch)
            })
        });
        Ok(())
    }
}

impl WgslKernel for FusedElementwise {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let out = &outputs[0];
        let names: Vec<String> = (0..inputs.len()).map(|i| format!("in{i}")).collect();
        let mut buffers = vec![];
        let mut bindings = vec![];
        let mut helpers = String::new();
        let mut body = String::new();
        for (i, name) in names.iter().enumerate() {
            let a = crate::required(inputs, i)?;
            buffers.push((name.as_str(), "f32", true));
            bindings.push(Binding::Input(i));
            let st = broadcast_strides(a.dims(), &out.dims);
            if a.ty.len() == 1 {
                body += &format!("let r{i} = {name}[0];\n    ");
            } else {
                helpers += &wgsl::offset_fn(&format!("off{i}"), &out.dims, &st);
                body += &format!("let r{i} = {name}[off{i}(i)];\n    ");
            }
        }
        buffers.push(("out", "f32", false));
        bindings.push(Binding::Output(0));
        let mut seen: Vec<&'static str> = vec![];
        for (k, ins) in self.instrs.iter().enumerate() {
            let r = inputs.len() + k;
            let (expr, h) = match *ins {
                Instr::Unary(kind, a) => (kind.wgsl_expr(&format!("r{a}"), "f32"), kind.wgsl_helpers()),
                Instr::Binary(kind, a, b) => (kind.wgsl_expr(&format!("r{a}"), &format!("r{b}"), "f32"), kind.wgsl_helpers()),
                Instr::Custom(ref c, a) => (c.f.wgsl(&format!("r{a}")), ""),
            };
            if !h.is_empty() && !seen.contains(&h) {
                seen.push(h);
                helpers += h;
            }
            body += &format!("let r{r} = {expr};\n    ");
        }
        body += &format!("out[i] = r{};", inputs.len() + self.instrs.len() - 1);
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(&format!("Fused[{}]", self.names()), out.len(), wg, &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("kiln", "FusedElementwise", |spec| Ok(Box::new(FusedElementwise::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::Node;

    fn node(instrs: &[Instr], inputs: usize) -> Node {
        Node {
            name: "fused".into(),
            op_type: "FusedElementwise".into(),
            domain: "kiln".into(),
            attrs: FusedElementwise::attrs(instrs).into_iter().collect(),
            inputs: (0..inputs).map(Some).collect(),
            outputs: vec![inputs],
        }
    }

    fn rand(dims: &[usize], seed: u64) -> Tensor {
        let n: usize = dims.iter().product();
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 4.0 - 2.0
            })
            .collect();
        Tensor::from_vec(dims, v).unwrap()
    }

    /// GELU (tanh form) as exported: 0.5 * x * (1 + tanh(0.79788 * (x + 0.044715 * x^3))).
    fn gelu_program() -> Vec<Instr> {
        // registers: 0 x, 1 three, 2 c0 (0.044715), 3 c1 (0.79788), 4 one, 5 half
        vec![
            Instr::Binary(BinaryKind::Pow, 0, 1),  // 6 = x^3
            Instr::Binary(BinaryKind::Mul, 6, 2),  // 7
            Instr::Binary(BinaryKind::Add, 0, 7),  // 8
            Instr::Binary(BinaryKind::Mul, 8, 3),  // 9
            Instr::Unary(UnaryKind::Tanh, 9),      // 10
            Instr::Binary(BinaryKind::Add, 10, 4), // 11
            Instr::Binary(BinaryKind::Mul, 0, 11), // 12
            Instr::Binary(BinaryKind::Mul, 12, 5), // 13
        ]
    }

    fn gelu_ref(x: f64) -> f64 {
        0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x * x * x)).tanh())
    }

    #[test]
    fn gelu_chain_matches_the_scalar_reference_with_broadcast_constants() {
        let instrs = gelu_program();
        let n = node(&instrs, 6);
        let op = FusedElementwise::parse(&NodeSpec::new(&n, 17)).unwrap();
        for dims in [vec![3usize, 1000], vec![1], vec![7, 5, 3]] {
            let x = rand(&dims, 7);
            let consts = [3.0f32, 0.044715, 0.7978845608, 1.0, 0.5].map(Tensor::scalar);
            let mut ins: Vec<Option<&Tensor>> = vec![Some(&x)];
            ins.extend(consts.iter().map(Some));
            let mut out = vec![Tensor::zeros(DType::F32, &dims)];
            op.run(&ins, &mut out).unwrap();
            for (g, &xv) in out[0].as_slice::<f32>().unwrap().iter().zip(x.as_slice::<f32>().unwrap()) {
                assert!((*g as f64 - gelu_ref(xv as f64)).abs() < 2e-6, "{g} vs {}", gelu_ref(xv as f64));
            }
            let args: Vec<TensorType> = ins.iter().map(|t| TensorType::new(DType::F32, t.unwrap().dims())).collect();
            let a: Vec<Option<Arg>> = args.iter().map(|t| Some(Arg { ty: t, value: None })).collect();
            let p = op.generate(&a, &op.infer(&a).unwrap(), &TuneValues::default()).unwrap();
            crate::wgsl::testing::validate(&p.dispatches[0].source);
        }
    }

    /// Per-channel inputs (`[C, 1, 1]`, `[1, C, 1]`-style middle blocks) against the
    /// general strided walk, on odd sizes that split blocks mid-run.
    #[test]
    fn spread_inputs_match_the_general_broadcast() {
        let instrs = vec![Instr::Binary(BinaryKind::Mul, 0, 1), Instr::Binary(BinaryKind::Add, 3, 2)];
        let op = FusedElementwise::parse(&NodeSpec::new(&node(&instrs, 3), 17)).unwrap();
        for (od, bd, cd) in [
            (vec![2, 5, 7, 9], vec![1, 5, 1, 1], vec![5, 1, 1]),
            (vec![3, 700, 3], vec![3, 1, 1], vec![1, 700, 1]),
            (vec![4, 6], vec![4, 1], vec![1, 6]),
        ] {
            assert!(matches!(access(&bd, &od), Access::Spread { .. }), "{bd:?} of {od:?}");
            let (a, b, c) = (rand(&od, 1), rand(&bd, 2), rand(&cd, 3));
            let mut out = vec![Tensor::zeros(DType::F32, &od)];
            op.run(&[Some(&a), Some(&b), Some(&c)], &mut out).unwrap();
            let st = |d: &[usize]| broadcast_strides(d, &od);
            let (sb, sc) = (st(&bd), st(&cd));
            let (av, bv, cv, got) = (a.to_f64_vec(), b.to_f64_vec(), c.to_f64_vec(), out[0].to_f64_vec());
            for_each_offset_in(&od, &[sb, sc], 0, av.len(), &mut |i, offs| {
                let want = av[i] * bv[offs[0]] + cv[offs[1]];
                assert!((got[i] - want).abs() < 1e-6, "{od:?} at {i}: {} vs {want}", got[i]);
            });
        }
    }

    #[test]
    fn broadcasting_inputs_of_every_layout() {
        // (a + b) * c - d with a [2,3,4], b [4] (trailing), c [2,1,4] (general), d scalar.
        let instrs = vec![Instr::Binary(BinaryKind::Add, 0, 1), Instr::Binary(BinaryKind::Mul, 4, 2), Instr::Binary(BinaryKind::Sub, 5, 3), Instr::Unary(UnaryKind::Relu, 6)];
        let op = FusedElementwise::parse(&NodeSpec::new(&node(&instrs, 4), 17)).unwrap();
        let (a, b, c, d) = (rand(&[2, 3, 4], 1), rand(&[4], 2), rand(&[2, 1, 4], 3), Tensor::scalar(0.25f32));
        let mut out = vec![Tensor::zeros(DType::F32, &[2, 3, 4])];
        op.run(&[Some(&a), Some(&b), Some(&c), Some(&d)], &mut out).unwrap();
        let (av, bv, cv) = (a.to_f64_vec(), b.to_f64_vec(), c.to_f64_vec());
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    let want = ((av[i * 12 + j * 4 + k] + bv[k]) * cv[i * 4 + k] - 0.25).max(0.0);
                    let got = out[0].to_f64_vec()[i * 12 + j * 4 + k];
                    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn running_in_place_of_any_full_size_input_matches_the_normal_run() {
        // (a + b) * c - d with a and c of the output's dims, b and d broadcast.
        let instrs = vec![Instr::Binary(BinaryKind::Add, 0, 1), Instr::Binary(BinaryKind::Mul, 4, 2), Instr::Binary(BinaryKind::Sub, 5, 3)];
        let op = FusedElementwise::parse(&NodeSpec::new(&node(&instrs, 4), 17)).unwrap();
        let dims = [3, 700];
        let (a, b, c, d) = (rand(&dims, 1), rand(&[700], 2), rand(&dims, 3), Tensor::scalar(0.25f32));
        let ins = [Some(&a), Some(&b), Some(&c), Some(&d)];
        let mut want = vec![Tensor::zeros(DType::F32, &dims)];
        op.run(&ins, &mut want).unwrap();
        let types: Vec<TensorType> = ins.iter().map(|t| TensorType::new(DType::F32, t.unwrap().dims().to_vec())).collect();
        let refs: Vec<Option<&TensorType>> = types.iter().map(Some).collect();
        let candidates = op.cpu().unwrap().in_place_inputs(&refs, &TensorType::new(DType::F32, dims.to_vec()));
        assert_eq!(candidates, vec![0, 2]);
        for i in candidates {
            let mut taken = ins;
            taken[i] = None;
            let mut out = vec![ins[i].unwrap().clone()];
            op.run_in_place(&taken, i, &mut out).unwrap();
            assert_eq!(out[0], want[0], "in place of input {i}");
        }
    }

    #[test]
    fn malformed_programs_are_rejected() {
        let mut n = node(&[Instr::Binary(BinaryKind::Add, 0, 5)], 2);
        let e = FusedElementwise::parse(&NodeSpec::new(&n, 17)).unwrap_err().to_string();
        assert!(e.contains("register 5"), "{e}");
        n.attrs.insert("kiln_ops".into(), Attr::Strings(vec!["Equal".into()]));
        let e = FusedElementwise::parse(&NodeSpec::new(&n, 17)).unwrap_err().to_string();
        assert!(e.contains("cannot be fused"), "{e}");
        let ok = node(&[Instr::Unary(UnaryKind::Relu, 0)], 1);
        let op = FusedElementwise::parse(&NodeSpec::new(&ok, 17)).unwrap();
        let ty = TensorType::new(DType::I64, vec![2]);
        assert!(op.infer(&[Some(Arg { ty: &ty, value: None })]).unwrap_err().to_string().contains("f32"));
    }
}

#[cfg(test)]
mod every_kind {
    use super::*;

    /// Every unary kind survives the round trip through the node attributes (the pass
    /// writes them, the factory reads them back), with its parameters.
    #[test]
    fn every_unary_kind_round_trips_through_attributes() {
        let mut count = 0;
        for name in crate::Registry::builtin().op_types().filter(|(d, _)| d.is_empty()).map(|(_, o)| o.to_string()).collect::<Vec<_>>() {
            let Some(kind) = UnaryKind::from_name_params(&name, &[0.25, 0.75]) else { continue };
            let instrs = [Instr::Unary(kind, 0)];
            let node = kiln_graph::Node {
                name: "f".into(),
                op_type: "FusedElementwise".into(),
                domain: "kiln".into(),
                attrs: FusedElementwise::attrs(&instrs).into_iter().collect(),
                inputs: vec![Some(0)],
                outputs: vec![1],
            };
            let op = FusedElementwise::parse(&NodeSpec::new(&node, 21)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(op.instrs, instrs, "{name}");
            let ty = TensorType::new(DType::F32, vec![5]);
            let a = [Some(Arg { ty: &ty, value: None })];
            let p = op.generate(&a, &[ty.clone()], &TuneValues::default()).unwrap();
            crate::wgsl::testing::validate(&p.dispatches[0].source);
            count += 1;
        }
        assert!(count >= 30, "only {count} unary kinds found");
    }
}
