//! Specialisation: concrete input types in, a typed, folded step list out. Every value
//! gets a concrete type; nodes whose inputs are all known (weights, shape computations
//! of exported models) run once on the host with their CPU kernels and become
//! constants; what is left, and needed by an output, are the steps a device runs.
use super::{InferError, Result};
use crate::{Arg, Op, OpError, TensorType};
use kiln_graph::{Graph, NodeId, Tensor, ValueId};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Bounds on what inference may produce: no value (nor all values folded on the host
/// together) may need more bytes than `memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub memory: u64,
}

impl Limits {
    /// This machine's RAM (from /proc/meminfo), or 64 GiB where that is unknown.
    pub fn physical_memory() -> u64 {
        static TOTAL: OnceLock<u64> = OnceLock::new();
        *TOTAL.get_or_init(|| {
            std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|s| {
                    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
                    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
                })
                .unwrap_or(64 << 30)
        })
    }
}

impl Default for Limits {
    /// Three quarters of the machine's RAM.
    fn default() -> Self {
        Limits { memory: Limits::physical_memory() / 4 * 3 }
    }
}

/// A node that runs on the device at each run.
#[derive(Clone, Debug)]
pub struct Step {
    pub node: NodeId,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
}

/// A graph specialised to concrete input types.
#[derive(Debug)]
pub struct Specialized {
    /// Concrete type of every value that exists in this specialisation.
    pub types: Vec<Option<TensorType>>,
    /// Values known before running: weights and folded results.
    pub constants: HashMap<ValueId, Tensor>,
    pub steps: Vec<Step>,
    /// Number of nodes evaluated at specialisation time.
    pub folded: usize,
}

impl Specialized {
    /// The type of a value of a step (every one is typed during specialisation).
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.types[v].as_ref().expect("every value of a step is typed during specialisation")
    }

    /// The argument view (type + constant value) of a value.
    pub fn arg(&self, v: ValueId) -> Arg<'_> {
        Arg { ty: self.ty(v), value: self.constants.get(&v) }
    }

    pub fn args(&self, inputs: &[Option<ValueId>]) -> Vec<Option<Arg<'_>>> {
        inputs.iter().map(|v| v.map(|v| self.arg(v))).collect()
    }
}

/// Why a specialisation could not be built.
#[derive(Debug)]
pub enum SpecializeError {
    /// A node needs the value of one of its inputs, which is not known; `inputs` are
    /// the graph inputs (by index) that the value is computed from.
    NeedsValue { inputs: Vec<usize>, error: InferError },
    Other(InferError),
}

impl From<InferError> for SpecializeError {
    fn from(e: InferError) -> Self {
        SpecializeError::Other(e)
    }
}

impl SpecializeError {
    pub fn into_error(self) -> InferError {
        match self {
            SpecializeError::NeedsValue { error, .. } | SpecializeError::Other(error) => error,
        }
    }
}

/// Types and known values of a specialisation in progress (kept when it fails, so the
/// symbolic checks can look at what was inferred before the failing node).
pub(crate) struct Walk {
    pub types: Vec<Option<TensorType>>,
    pub constants: HashMap<ValueId, Tensor>,
    limits: Limits,
    /// Bytes of the values folded so far.
    folded_bytes: u64,
}

impl Walk {
    pub(crate) fn new(graph: &Graph, input_types: &[TensorType], input_values: &[Option<&Tensor>], limits: Limits) -> Walk {
        let mut types: Vec<Option<TensorType>> = vec![None; graph.values.len()];
        let mut constants: HashMap<ValueId, Tensor> = HashMap::new();
        for (&v, t) in &graph.initializers {
            types[v] = Some(TensorType::of(t));
            constants.insert(v, t.clone());
        }
        for (&v, t) in graph.inputs.iter().zip(input_types) {
            types[v] = Some(t.clone());
        }
        for (&v, t) in graph.inputs.iter().zip(input_values) {
            if let Some(t) = t {
                constants.insert(v, (*t).clone());
            }
        }
        Walk { types, constants, limits, folded_bytes: 0 }
    }

    /// A walk that starts from values of known types (and some known values) instead
    /// of the graph's inputs; the graph's weights are known too.
    pub(crate) fn from_known(graph: &Graph, types: &[(ValueId, TensorType)], values: &HashMap<ValueId, Tensor>, limits: Limits) -> Walk {
        let mut walk = Walk::new(graph, &[], &[], limits);
        for (v, t) in types {
            walk.types[*v] = Some(t.clone());
        }
        for (v, t) in values {
            walk.types[*v] = Some(TensorType::of(t));
            walk.constants.insert(*v, t.clone());
        }
        walk
    }

    /// Infers (and where possible folds) every node in `order`; returns the nodes left to
    /// run and the number folded, or the node that failed and why.
    #[allow(clippy::type_complexity)]
    pub(crate) fn run(&mut self, graph: &Graph, ops: &[Box<dyn Op>], order: &[NodeId]) -> Result<(Vec<Step>, usize), (NodeId, SpecializeError)> {
        let mut live = vec![];
        let mut folded = 0;
        for &n in order {
            match self.node(graph, ops, n) {
                Ok(true) => folded += 1,
                Ok(false) => {
                    let node = &graph.nodes[n];
                    live.push(Step { node: n, inputs: node.inputs.clone(), outputs: node.outputs.clone() })
                }
                Err(e) => return Err((n, e)),
            }
        }
        Ok((live, folded))
    }

    /// Types node `n`'s outputs; returns whether it was folded to constants.
    fn node(&mut self, graph: &Graph, ops: &[Box<dyn Op>], n: NodeId) -> Result<bool, SpecializeError> {
        let limit = self.limits.memory;
        let (types, constants) = (&mut self.types, &mut self.constants);
        let node = &graph.nodes[n];
        let op = &ops[n];
        let in_types: Vec<Option<TensorType>> = node.inputs.iter().map(|v| v.and_then(|v| types[v].clone())).collect();
        let args: Vec<Option<Arg>> = node
            .inputs
            .iter()
            .zip(&in_types)
            .map(|(v, t)| match (v, t) {
                (Some(v), Some(t)) => Some(Arg { ty: t, value: constants.get(v) }),
                _ => None,
            })
            .collect();
        if let Some((i, a)) = args.iter().enumerate().find_map(|(i, a)| a.filter(|a| a.dtype().is_narrow() && !op.handles_narrow()).map(|a| (i, a))) {
            let what = format!("dtype {} is supported only by Cast, CastLike, QuantizeLinear, DequantizeLinear and reshapes (cast it first)", a.dtype());
            return Err(InferError::node(node, OpError::input(i, what)).into());
        }
        if !op.handles_containers() {
            if let Some((i, a)) = args.iter().enumerate().find_map(|(i, a)| a.filter(|a| !a.ty.is_tensor()).map(|a| (i, a))) {
                let what = format!("{} is not a tensor, and {} takes tensors only", a.ty, node.op_type);
                return Err(InferError::node(node, OpError::input(i, what)).into());
            }
        }
        if let Some(i) = args.iter().position(|a| a.is_some_and(|a| a.dtype().is_string()) && !op.handles_strings()) {
            let what = format!("dtype string is not supported by op {} (string tensors reach only the string ops, LabelEncoder, ArrayFeatureExtractor, TfIdfVectorizer, Equal, Cast, CastLike, Concat, Shape, Size and reshapes)", node.op_type);
            return Err(InferError::node(node, OpError::input(i, what)).into());
        }
        let all_const = node.inputs.iter().flatten().all(|v| constants.contains_key(v));
        let evaluated = match all_const && !op.varies_between_runs() {
            true => op.eval_to_infer(&args).transpose().map_err(|e| InferError::node(node, e))?,
            false => None,
        };
        let inferred = match &evaluated {
            Some(v) => Ok(v.iter().map(|t| TensorType::new(t.dtype(), t.dims())).collect()),
            None => op.infer(&args),
        };
        let out_types = match inferred {
            Ok(t) => t,
            Err(OpError::NeedsValue { index, what }) => {
                let error = InferError::node(node, OpError::NeedsValue { index, what });
                let inputs = node.inputs.get(index).copied().flatten().map(|v| unknown_sources(graph, constants, v)).unwrap_or_default();
                return Err(SpecializeError::NeedsValue { inputs, error });
            }
            Err(e) => return Err(InferError::node(node, e).into()),
        };
        if out_types.len() < node.outputs.len() {
            return Err(InferError::node(node, OpError::invalid(format!("the node has {} outputs but the op produces {}", node.outputs.len(), out_types.len()))).into());
        }
        let mut out_bytes = 0u64;
        for (i, t) in out_types.iter().enumerate() {
            let bytes = t.checked_bytes().map(|b| b as u64);
            if bytes.is_none_or(|b| b > limit) {
                let output = node.outputs.get(i).map_or_else(|| format!("#{i}"), |&o| format!("'{}'", graph.values[o].name));
                let bytes = bytes.map_or_else(|| "more bytes than an address space holds".to_string(), |b| format!("{b} bytes"));
                return Err(InferError::TooLarge { node: node.name.clone(), op: node.op_type.clone(), output, ty: t.to_string(), bytes, limit }.into());
            }
            out_bytes += bytes.unwrap_or(0);
        }
        // Sequences and optionals live on the host: a node that sees one is folded once
        // its inputs are known (sessions evaluate it between stages), never a device step.
        let containers = args.iter().flatten().any(|a| !a.ty.is_tensor()) || out_types.iter().any(|t| !t.is_tensor());
        if containers && !all_const {
            let index = node.inputs.iter().position(|v| v.is_some_and(|v| !constants.contains_key(&v))).unwrap_or(0);
            let what = format!("the value of input {index} (a node over sequences or optionals runs on the host, from known inputs)");
            let error = InferError::node(node, OpError::NeedsValue { index, what });
            let inputs = node.inputs.get(index).copied().flatten().map(|v| unknown_sources(graph, constants, v)).unwrap_or_default();
            return Err(SpecializeError::NeedsValue { inputs, error });
        }
        if containers && (op.cpu().is_none() || op.varies_between_runs()) {
            return Err(InferError::node(node, OpError::Unsupported("a node over sequences or optionals needs a CPU kernel that gives the same outputs on every run (it runs on the host)".into())).into());
        }
        let mut values: Option<Vec<Tensor>> = match (evaluated, op.eval_from_types(&args)) {
            (Some(v), _) => {
                self.folded_bytes += out_bytes;
                Some(v)
            }
            (None, Some(r)) => Some(r.map_err(|e| InferError::node(node, e))?),
            (None, None) => None,
        };
        if values.is_none() && all_const && !op.varies_between_runs() && self.folded_bytes.saturating_add(out_bytes) <= limit {
            if let Some(k) = op.cpu() {
                let ins: Vec<Option<&Tensor>> = node.inputs.iter().map(|v| v.and_then(|v| constants.get(&v))).collect();
                let mut outs: Vec<Tensor> = out_types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
                k.run(&ins, &mut outs).map_err(|e| InferError::node(node, e))?;
                self.folded_bytes += out_bytes;
                values = Some(outs);
            }
        }
        drop(args);
        for (i, &o) in node.outputs.iter().enumerate() {
            types[o] = Some(out_types[i].clone());
        }
        Ok(match values {
            Some(vals) => {
                for (&o, t) in node.outputs.iter().zip(vals) {
                    constants.insert(o, t);
                }
                true
            }
            None => false,
        })
    }
}

/// Specialises for concrete input types; `input_values[i]` is the value of graph input
/// `i` when it is bound by value (inputs that feed shapes, axes, pads).
pub fn specialize(
    graph: &Graph,
    ops: &[Box<dyn Op>],
    order: &[NodeId],
    input_types: &[TensorType],
    input_values: &[Option<&Tensor>],
    limits: Limits,
) -> Result<Specialized, SpecializeError> {
    let mut walk = Walk::new(graph, input_types, input_values, limits);
    let (live, folded) = walk.run(graph, ops, order).map_err(|(_, e)| e)?;
    let Walk { types, mut constants, .. } = walk;
    // Graph inputs bound by value are constants of this specialisation, not steps.
    // Keep only the steps an output needs.
    let mut needed = vec![false; graph.values.len()];
    for &o in &graph.outputs {
        needed[o] = true;
    }
    let mut steps = vec![];
    for s in live.into_iter().rev() {
        if s.outputs.iter().any(|&o| needed[o]) {
            for v in s.inputs.iter().flatten() {
                needed[*v] = true;
            }
            steps.push(s);
        }
    }
    steps.reverse();
    constants.retain(|v, _| needed[*v]);
    Ok(Specialized { types, constants, steps, folded })
}

/// A specialisation of part of a graph: the nodes of `order` up to the first whose output
/// types need values that are only computed at run time (see [`specialize_stage`]).
#[derive(Debug)]
pub struct Stage {
    pub spec: Specialized,
    /// The position in `order` of the node the stage stopped at, and why it stopped.
    pub barrier: Option<(usize, InferError)>,
}

/// Specialises the nodes of `order` (in order) from values of known types (`types`)
/// and known values (`values`, plus the graph's weights), stopping before the first
/// node that needs an input value nobody knows yet. The steps kept are those that the
/// graph's outputs, or the nodes from the barrier on, need; so are the constants.
pub fn specialize_stage(
    graph: &Graph,
    ops: &[Box<dyn Op>],
    order: &[NodeId],
    types: &[(ValueId, TensorType)],
    values: &HashMap<ValueId, Tensor>,
    limits: Limits,
) -> Result<Stage, InferError> {
    let mut walk = Walk::from_known(graph, types, values, limits);
    let mut live = vec![];
    let mut folded = 0;
    let mut barrier = None;
    for (pos, &n) in order.iter().enumerate() {
        match walk.node(graph, ops, n) {
            Ok(true) => folded += 1,
            Ok(false) => {
                let node = &graph.nodes[n];
                live.push(Step { node: n, inputs: node.inputs.clone(), outputs: node.outputs.clone() })
            }
            Err(SpecializeError::NeedsValue { error, .. }) => {
                barrier = Some((pos, error));
                break;
            }
            Err(SpecializeError::Other(e)) => return Err(e),
        }
    }
    let Walk { types, mut constants, .. } = walk;
    let mut needed = vec![false; graph.values.len()];
    for &o in &graph.outputs {
        needed[o] = true;
    }
    if let Some((pos, _)) = &barrier {
        for &n in &order[*pos..] {
            for v in graph.nodes[n].inputs.iter().flatten() {
                needed[*v] = true;
            }
        }
    }
    let mut steps = vec![];
    for s in live.into_iter().rev() {
        if s.outputs.iter().any(|&o| needed[o]) {
            for v in s.inputs.iter().flatten() {
                needed[*v] = true;
            }
            steps.push(s);
        }
    }
    steps.reverse();
    constants.retain(|v, _| needed[*v]);
    Ok(Stage { spec: Specialized { types, constants, steps, folded }, barrier })
}

/// Evaluates node `n` on the host from the known values of its inputs (its op's CPU
/// kernel, or what it computes from types); returns its outputs, in order.
pub fn evaluate(graph: &Graph, ops: &[Box<dyn Op>], n: NodeId, values: &HashMap<ValueId, Tensor>, limits: Limits) -> Result<Vec<Tensor>, InferError> {
    let mut walk = Walk::from_known(graph, &[], values, limits);
    let node = &graph.nodes[n];
    let folded = walk.node(graph, ops, n).map_err(SpecializeError::into_error)?;
    if !folded {
        return Err(InferError::node(node, OpError::Unsupported("evaluating the node on the host (its output types depend on values computed at run time) needs a CPU kernel".into())));
    }
    Ok(node.outputs.iter().map(|o| walk.constants.remove(o).expect("a folded node's outputs are known")).collect())
}

/// The graph inputs (indices) that value `v` depends on through values not yet known.
fn unknown_sources(graph: &Graph, constants: &HashMap<ValueId, Tensor>, v: ValueId) -> Vec<usize> {
    let mut producer: Vec<Option<NodeId>> = vec![None; graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for &o in &n.outputs {
            producer[o] = Some(i);
        }
    }
    let mut found = vec![];
    let mut stack = vec![v];
    let mut seen = vec![false; graph.values.len()];
    while let Some(v) = stack.pop() {
        if constants.contains_key(&v) || std::mem::replace(&mut seen[v], true) {
            continue;
        }
        if let Some(i) = graph.inputs.iter().position(|&x| x == v) {
            found.push(i);
        } else if let Some(n) = producer[v] {
            stack.extend(graph.nodes[n].inputs.iter().flatten());
        }
    }
    found
}
