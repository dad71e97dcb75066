//! ModelProto -> [`Graph`]: values by name, nodes with their attributes, initializers,
//! graph inputs and outputs, value types, opset imports; `Constant` nodes are folded
//! into initializers. The structure is always validated (dangling inputs, duplicate
//! producers, cycles); the op checks run against a [`Registry`] unless disabled.

use super::attrs::{constant_value, convert_attr};
use super::check::check_nodes;
use super::error::{ImportError, NodeProblem};
use super::schema::{check_model, node_problems};
use super::proto::{DimensionValue, ModelProto, NodeProto, TypeProto, TypeProtoTensor, ValueInfoProto};
use super::tensor::{convert, ExternalFiles};
use bytes::Bytes;
use kiln_graph::{Attributes, DType, Dim, GraphError, Graph, Node, NodeId, Shape, ValueId, ValueKind, ValueType};
use kiln_ops::{canonical_domain, Registry};
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// How to import a model.
#[derive(Clone, Copy)]
pub struct ImportOptions<'a> {
    /// The operators to check every node against; `None` skips the op checks (the
    /// graph is still validated structurally).
    pub registry: Option<&'a Registry>,
}

impl Default for ImportOptions<'_> {
    fn default() -> Self {
        ImportOptions { registry: Some(Registry::builtin()) }
    }
}

impl<'a> ImportOptions<'a> {
    /// No op checks: for tools that classify models (e.g. a conformance runner).
    pub fn unchecked() -> Self {
        ImportOptions { registry: None }
    }

    /// Checks ops against `registry` (e.g. the builtin one plus custom ops).
    pub fn with_registry(registry: &'a Registry) -> Self {
        ImportOptions { registry: Some(registry) }
    }
}

/// Imports an .onnx file and checks that Kiln supports every node.
/// External data is read relative to the file's directory.
pub fn import_file(path: impl AsRef<Path>) -> Result<Graph, ImportError> {
    import_file_with(path, &ImportOptions::default())
}

/// Imports an .onnx file without the op checks.
pub fn import_file_unchecked(path: impl AsRef<Path>) -> Result<Graph, ImportError> {
    import_file_with(path, &ImportOptions::unchecked())
}

pub fn import_file_with(path: impl AsRef<Path>, options: &ImportOptions) -> Result<Graph, ImportError> {
    let path = path.as_ref();
    let bytes = super::file::read_regular(path).map_err(|source| ImportError::Io { path: path.to_path_buf(), error: source })?;
    let source_name = path.display().to_string();
    // Decoding from `Bytes` slices raw_data out of the file buffer instead of copying it.
    let model = decode_model(Bytes::from(bytes), &source_name)?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    build(model, &source_name, base, options)
}

/// Imports a model from memory and checks that Kiln supports every node. External data,
/// if any, is read relative to `base_dir`.
pub fn import_bytes(bytes: &[u8], base_dir: Option<&Path>) -> Result<Graph, ImportError> {
    import_bytes_with(bytes, base_dir, &ImportOptions::default())
}

pub fn import_bytes_with(bytes: &[u8], base_dir: Option<&Path>, options: &ImportOptions) -> Result<Graph, ImportError> {
    let model = decode_model(bytes, "<memory>")?;
    build(model, "<memory>", base_dir, options)
}

/// Decodes a ModelProto; `source_name` names the file in errors.
pub fn decode_model(buf: impl bytes::Buf, source_name: &str) -> Result<ModelProto, ImportError> {
    ModelProto::decode(buf).map_err(|error| ImportError::Decode {
        source_name: source_name.to_string(),
        what: "model",
        error,
    })
}

/// Builds a graph from a decoded model.
pub fn build(model: ModelProto, source_name: &str, base_dir: Option<&Path>, options: &ImportOptions) -> Result<Graph, ImportError> {
    if model.graph.is_none() {
        return Err(ImportError::NoGraph(source_name.to_string()));
    }
    let opsets = check_model(&model, source_name)?;
    let gp = model.graph.ok_or_else(|| ImportError::NoGraph(source_name.to_string()))?;
    let mut ext = ExternalFiles::new(base_dir);
    let Built { graph, problems, invalid, captures } = build_graph(gp, &opsets, &mut ext)?;
    // The main graph has no outer scope: a value it reads from one is dangling.
    if let Some(name) = captures.first() {
        let v = graph.find_value(name).expect("captured values are named");
        let reader = graph.nodes.iter().find(|n| n.inputs.contains(&Some(v)));
        return Err(match reader {
            Some(n) => GraphError::DanglingInput { node: n.name.clone(), op: n.op_type.clone(), value: name.clone() },
            None => GraphError::DanglingOutput(name.clone()),
        }
        .into());
    }
    graph.validate()?;
    match options.registry {
        Some(registry) => check_nodes(&graph, registry, problems, invalid)?,
        None if !invalid.is_empty() => return Err(ImportError::InvalidNodes(invalid)),
        None => {
            for (n, what) in problems {
                log::warn!("node {}: {what}", graph.nodes[n].label());
            }
        }
    }
    Ok(graph)
}

/// A graph as read, with what is wrong with its nodes and the names it reads from
/// enclosing scopes.
struct Built {
    graph: Graph,
    problems: Vec<(NodeId, String)>,
    invalid: Vec<NodeProblem>,
    /// Names read but not defined here (the enclosing graph's values), in order of first
    /// use; they have been appended to the graph's inputs.
    captures: Vec<String>,
}

/// Reads one graph: the model's, or a subgraph attribute's. A subgraph is made closed:
/// the outer values it reads become extra inputs after its declared ones (see
/// [`kiln_graph::Attr::Graph`]), and the node that holds it gets them as extra inputs.
fn build_graph(gp: super::proto::GraphProto, opsets: &HashMap<String, i64>, ext: &mut ExternalFiles) -> Result<Built, ImportError> {
    let mut b = Builder::new(&gp.name);
    b.graph.opsets = opsets.clone();
    b.reserve_symbols(gp.input.iter().chain(&gp.output).chain(&gp.value_info));

    for tp in gp.initializer {
        if tp.name.is_empty() {
            return Err(ImportError::Invalid("an initializer has no name".into()));
        }
        if b.by_name.contains_key(&tp.name) {
            return Err(ImportError::Invalid(format!("two initializers are named '{}'", tp.name)));
        }
        let t = convert(&tp, ext)?;
        let v = b.named(&tp.name);
        b.graph.values[v].ty = Some(ValueType::new(t.dtype(), t.dims()));
        b.graph.initializers.insert(v, t);
    }

    for vi in &gp.input {
        if vi.name.is_empty() {
            return Err(ImportError::Invalid("a graph input has no name".into()));
        }
        if let Some(&v) = b.by_name.get(&vi.name) {
            if b.graph.initializers.contains_key(&v) {
                continue; // old opsets list initializers among the inputs
            }
            return Err(ImportError::Invalid(format!("two graph inputs are named '{}'", vi.name)));
        }
        let ty = b.value_type(vi).map_err(|what| {
            ImportError::UnsupportedDtype(format!("graph input '{}' {what}", vi.name))
        })?;
        let v = b.named(&vi.name);
        b.graph.values[v].ty = ty;
        b.graph.inputs.push(v);
    }

    let names = node_names(&gp.node);
    let mut problems: Vec<(NodeId, String)> = Vec::new();
    // Violations of the ONNX spec: errors even when the op checks are off.
    let mut invalid: Vec<NodeProblem> = Vec::new();
    for (np, name) in gp.node.iter().zip(names) {
        if np.op_type.is_empty() {
            return Err(ImportError::Invalid(format!("node '{name}' has no op_type")));
        }
        let spec_problems = node_problems(np, &name, opsets);
        let mut reported = !spec_problems.is_empty();
        invalid.extend(spec_problems.into_iter().map(|problem| NodeProblem {
            node: name.clone(),
            op_type: np.op_type.clone(),
            domain: canonical_domain(&np.domain).to_string(),
            problem,
        }));
        if !reported && np.op_type == "Constant" && canonical_domain(&np.domain).is_empty() && np.output.len() == 1 {
            match constant_value(&np.attribute, ext) {
                Ok(t) => {
                    b.fold_constant(np, &name, t)?;
                    continue;
                }
                Err(what) => {
                    problems.push((b.graph.nodes.len(), what));
                    reported = true;
                }
            }
        }
        let mut attrs = Attributes::new();
        // The subgraphs' outer values, in order of first use over all of them.
        let mut captures: Vec<String> = vec![];
        // (attribute, the subgraph's declared input count)
        let mut subgraphs: Vec<(String, usize)> = vec![];
        for a in &np.attribute {
            if super::attrs::kind(a) == super::proto::attribute_type::GRAPH && a.ref_attr_name.is_empty() {
                let Some(g) = a.g.clone() else {
                    problems.push((b.graph.nodes.len(), format!("attribute '{}' is a GRAPH but holds none", a.name)));
                    continue;
                };
                let sub = build_graph(g, opsets, ext)?;
                for (n, what) in sub.problems {
                    problems.push((b.graph.nodes.len(), format!("subgraph '{}', node {}: {what}", a.name, sub.graph.nodes[n].label())));
                }
                for p in sub.invalid {
                    problems.push((b.graph.nodes.len(), format!("subgraph '{}', node '{}' ({}): {}", a.name, p.node, p.op_type, p.problem)));
                }
                for c in &sub.captures {
                    if !captures.contains(c) {
                        captures.push(c.clone());
                    }
                }
                subgraphs.push((a.name.clone(), sub.graph.inputs.len() - sub.captures.len()));
                attrs.insert(a.name.clone(), kiln_graph::Attr::Graph(std::sync::Arc::new(sub.graph)));
                continue;
            }
            match convert_attr(a, ext) {
                Ok(v) => {
                    attrs.insert(a.name.clone(), v);
                }
                Err(what) if !reported => problems.push((b.graph.nodes.len(), what)),
                Err(_) => {}
            }
        }
        // Every subgraph of the node takes all of the node's captured values, in one order.
        for (attr, declared) in &subgraphs {
            if let Some(kiln_graph::Attr::Graph(g)) = attrs.get_mut(attr) {
                let g = std::sync::Arc::make_mut(g);
                let own: Vec<ValueId> = g.inputs.split_off(*declared);
                for c in &captures {
                    let v = own.iter().copied().find(|&v| &g.values[v].name == c).unwrap_or_else(|| g.add_value(c.clone(), None));
                    g.inputs.push(v);
                }
                g.outer_inputs = captures.len();
            }
        }
        let mut inputs: Vec<Option<ValueId>> = np.input.iter().map(|i| (!i.is_empty()).then(|| b.named(i))).collect();
        inputs.extend(captures.iter().map(|c| Some(b.named(c))));
        // Trailing omitted outputs are dropped; omitted outputs in between get a
        // private value that nothing can read.
        let n_out = np.output.iter().rposition(|o| !o.is_empty()).map_or(0, |i| i + 1);
        let outputs = np.output[..n_out]
            .iter()
            .enumerate()
            .map(|(k, o)| if o.is_empty() { b.graph.add_value(format!("{name}:unused_output_{k}"), None) } else { b.named(o) })
            .collect();
        b.graph.nodes.push(Node {
            name,
            op_type: np.op_type.clone(),
            domain: canonical_domain(&np.domain).to_string(),
            attrs,
            inputs,
            outputs,
        });
    }

    for vi in &gp.output {
        if vi.name.is_empty() {
            return Err(ImportError::Invalid("a graph output has no name".into()));
        }
        let v = b.named(&vi.name);
        if b.graph.values[v].ty.is_none() {
            b.graph.values[v].ty = b.value_type(vi).unwrap_or(None);
        }
        b.graph.outputs.push(v);
    }
    for vi in &gp.value_info {
        if let Some(&v) = b.by_name.get(&vi.name) {
            if b.graph.values[v].ty.is_none() {
                b.graph.values[v].ty = b.value_type(vi).unwrap_or(None);
            }
        }
    }

    // Values read here but defined nowhere here come from an enclosing scope.
    let mut graph = b.graph;
    let mut defined = vec![false; graph.values.len()];
    for &v in graph.inputs.iter().chain(graph.initializers.keys()) {
        defined[v] = true;
    }
    for n in &graph.nodes {
        for &o in &n.outputs {
            defined[o] = true;
        }
    }
    let mut captures = vec![];
    let read = graph.nodes.iter().flat_map(|n| n.inputs.iter().flatten().copied()).chain(graph.outputs.iter().copied()).collect::<Vec<_>>();
    for v in read {
        if !defined[v] {
            defined[v] = true;
            captures.push(graph.values[v].name.clone());
            graph.inputs.push(v);
        }
    }
    Ok(Built { graph, problems, invalid, captures })
}

/// Node names: the file's, or `{op_type}_{index}` (made unique) for unnamed nodes.
fn node_names(nodes: &[NodeProto]) -> Vec<String> {
    let used: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).filter(|n| !n.is_empty()).collect();
    let mut generated: HashSet<String> = HashSet::new();
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if !n.name.is_empty() {
                return n.name.clone();
            }
            let base = format!("{}_{i}", n.op_type);
            let mut name = base.clone();
            let mut k = 1;
            while used.contains(name.as_str()) || generated.contains(&name) {
                name = format!("{base}_{k}");
                k += 1;
            }
            generated.insert(name.clone());
            name
        })
        .collect()
}

struct Builder {
    graph: Graph,
    by_name: HashMap<String, ValueId>,
    /// dim_param names used in the file (fresh symbols avoid them).
    symbols: HashSet<String>,
    next_unknown: usize,
}

impl Builder {
    fn new(name: &str) -> Self {
        Builder { graph: Graph::new(name), by_name: HashMap::new(), symbols: HashSet::new(), next_unknown: 0 }
    }

    fn reserve_symbols<'v>(&mut self, infos: impl Iterator<Item = &'v ValueInfoProto>) {
        for vi in infos {
            let shape = vi.r#type.as_ref().and_then(|t| tensor_type_of(t).map(|(tt, _)| tt)).and_then(|t| t.shape.as_ref());
            for d in shape.map(|s| s.dim.as_slice()).unwrap_or_default() {
                if let Some(DimensionValue::DimParam(p)) = &d.value {
                    self.symbols.insert(p.clone());
                }
            }
        }
    }

    /// The value named `name`, created (untyped) on first use.
    fn named(&mut self, name: &str) -> ValueId {
        if let Some(&v) = self.by_name.get(name) {
            return v;
        }
        let v = self.graph.add_value(name, None);
        self.by_name.insert(name.to_string(), v);
        v
    }

    fn fresh_symbol(&mut self) -> Dim {
        loop {
            let s = format!("unk__{}", self.next_unknown);
            self.next_unknown += 1;
            if !self.symbols.contains(&s) {
                return Dim::Sym(s);
            }
        }
    }

    /// The declared type: `None` if the type or the rank is unknown, an error message if
    /// the element type is one Kiln does not support.
    fn value_type(&mut self, vi: &ValueInfoProto) -> Result<Option<ValueType>, String> {
        let Some(ty) = vi.r#type.as_ref() else { return Ok(None) };
        // Maps and nested sequences stay undeclared (the ops that read them are missing).
        let Some((tt, kind)) = tensor_type_of(ty) else { return Ok(None) };
        if tt.elem_type == 0 {
            return Ok(None);
        }
        let dtype: DType = super::tensor::dtype_of(tt.elem_type)?;
        let Some(shape) = &tt.shape else {
            // A sequence's elements may differ in rank: its type is known without it.
            return Ok((!kind.is_tensor()).then(|| ValueType::container(kind, dtype, Shape::default())));
        };
        let dims = shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(DimensionValue::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                // Some exporters write "?" (or "-1") for "unknown": not one shared symbol.
                Some(DimensionValue::DimParam(p)) if !matches!(p.as_str(), "" | "?" | "-1") => Dim::Sym(p.clone()),
                _ => self.fresh_symbol(),
            })
            .collect();
        Ok(Some(ValueType::container(kind, dtype, Shape(dims))))
    }

    fn fold_constant(&mut self, np: &NodeProto, name: &str, t: kiln_graph::Tensor) -> Result<(), ImportError> {
        let out = &np.output[0];
        if out.is_empty() {
            return Ok(()); // nobody can read it
        }
        let v = self.named(out);
        if self.graph.initializers.contains_key(&v) || self.graph.inputs.contains(&v) {
            return Err(GraphError::DuplicateProducer {
                value: out.clone(),
                first: "a graph input or initializer".into(),
                second: format!("'{name}' (Constant)"),
            }
            .into());
        }
        self.graph.values[v].ty = Some(ValueType::new(t.dtype(), t.dims()));
        self.graph.initializers.insert(v, t);
        Ok(())
    }
}

/// The tensor type a type is or holds, and which kind of value it is: a tensor, a
/// sequence of tensors, an optional tensor or sequence. `None` for other types (maps,
/// sequences of sequences, ...).
pub(crate) fn tensor_type_of(t: &TypeProto) -> Option<(&TypeProtoTensor, ValueKind)> {
    if let Some(tt) = &t.tensor_type {
        return Some((tt, ValueKind::Tensor));
    }
    if let Some(s) = &t.sequence_type {
        return Some((s.elem_type.as_deref()?.tensor_type.as_ref()?, ValueKind::Sequence));
    }
    match tensor_type_of(t.optional_type.as_ref()?.elem_type.as_deref()?)? {
        (tt, ValueKind::Tensor) => Some((tt, ValueKind::OptionalTensor)),
        (tt, ValueKind::Sequence) => Some((tt, ValueKind::OptionalSequence)),
        _ => None,
    }
}

/// A type written in an attribute (TYPE_PROTO): a tensor, sequence or optional type whose
/// dims are sizes or symbols (`?` where neither is given).
pub(crate) fn type_of(t: &TypeProto) -> Result<ValueType, String> {
    let (tt, kind) = tensor_type_of(t).ok_or("only tensor, sequence and optional types are supported")?;
    let dtype = super::tensor::dtype_of(tt.elem_type)?;
    let dims = tt.shape.as_ref().map_or_else(Vec::new, |s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(DimensionValue::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as usize),
                Some(DimensionValue::DimParam(p)) if !p.is_empty() => Dim::Sym(p.clone()),
                _ => Dim::Sym("?".into()),
            })
            .collect()
    });
    Ok(ValueType::container(kind, dtype, Shape(dims)))
}
