//! [`Case`]: one node and its inputs, the unit every op test is written in. The same
//! case builds an op through the registry (unit tests of kiln-ops), or a one-node
//! graph with its feeds (sessions on every device, in kiln-runtime's tests).
use super::data;
use crate::{NodeSpec, Op, Registry, Result};
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Node, Tensor};
use std::fmt;

/// The opset a [`Case`] is built at unless it says otherwise.
pub const DEFAULT_OPSET: i64 = 19;

/// One input of a case.
#[derive(Clone, Debug)]
pub enum Input {
    /// A value known only at run time (a graph input): inference and kernel
    /// generation see its type, not its value.
    Data(Tensor),
    /// A constant (weights, shape arguments): inference and kernel generation see its
    /// value (a graph initializer in a session).
    Const(Tensor),
    /// An omitted optional input.
    Omitted,
}

impl Input {
    /// The tensor, when the input is present.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Input::Data(t) | Input::Const(t) => Some(t),
            Input::Omitted => None,
        }
    }

    /// The value that inference and kernel generation may read (constants only).
    pub fn known_value(&self) -> Option<&Tensor> {
        match self {
            Input::Const(t) => Some(t),
            _ => None,
        }
    }

    fn map(&self, f: impl Fn(&Tensor) -> Tensor) -> Input {
        match self {
            Input::Data(t) => Input::Data(f(t)),
            Input::Const(t) => Input::Const(f(t)),
            Input::Omitted => Input::Omitted,
        }
    }
}

/// A node of one op type with its attributes, opset, inputs and output count.
///
/// ```ignore
/// let case = Case::new("Conv").attr("strides", ints(&[2, 2]))
///     .rand(DType::F32, &[1, 3, 13, 11]).constant(rand_f32(&[5, 3, 3, 3], 1));
/// let outputs = case.run_cpu()?;   // kiln-ops unit tests
/// let (graph, feeds) = case.graph(); // a session, on any device
/// ```
#[derive(Clone, Debug)]
pub struct Case {
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
    pub attrs: Vec<(String, Attr)>,
    pub inputs: Vec<Input>,
    pub n_outputs: usize,
    /// Seed of the next random input ([`Case::rand`]); bumped by each.
    pub seed: u64,
}

impl Case {
    /// A case of `op_type` (default domain, [`DEFAULT_OPSET`], one output, no inputs).
    pub fn new(op_type: &str) -> Case {
        Case { op_type: op_type.into(), domain: String::new(), opset: DEFAULT_OPSET, attrs: vec![], inputs: vec![], n_outputs: 1, seed: 1 }
    }

    pub fn opset(mut self, opset: i64) -> Case {
        self.opset = opset;
        self
    }

    pub fn domain(mut self, domain: &str) -> Case {
        self.domain = domain.into();
        self
    }

    /// Sets (or replaces) one attribute.
    pub fn attr(mut self, name: &str, value: Attr) -> Case {
        self.attrs.retain(|(k, _)| k != name);
        self.attrs.push((name.into(), value));
        self
    }

    /// Sets several attributes.
    pub fn attrs(self, attrs: &[(&str, Attr)]) -> Case {
        attrs.iter().fold(self, |c, (k, v)| c.attr(k, v.clone()))
    }

    /// Appends a run-time input.
    pub fn input(mut self, t: Tensor) -> Case {
        self.inputs.push(Input::Data(t));
        self
    }

    /// Appends a constant input.
    pub fn constant(mut self, t: Tensor) -> Case {
        self.inputs.push(Input::Const(t));
        self
    }

    /// Appends an omitted optional input.
    pub fn omitted(mut self) -> Case {
        self.inputs.push(Input::Omitted);
        self
    }

    /// Appends inputs given as [`Input`]s.
    pub fn inputs(mut self, inputs: impl IntoIterator<Item = Input>) -> Case {
        self.inputs.extend(inputs);
        self
    }

    /// Appends a seeded random run-time input ([`data::rand`]).
    pub fn rand(mut self, dtype: DType, dims: &[usize]) -> Case {
        let t = data::rand(dtype, dims, self.seed);
        self.seed += 1;
        self.input(t)
    }

    /// Appends a seeded random constant input ([`data::rand`]).
    pub fn rand_const(mut self, dtype: DType, dims: &[usize]) -> Case {
        let t = data::rand(dtype, dims, self.seed);
        self.seed += 1;
        self.constant(t)
    }

    /// Sets the seed of the following random inputs.
    pub fn seed(mut self, seed: u64) -> Case {
        self.seed = seed;
        self
    }

    /// Sets the number of outputs.
    pub fn outputs(mut self, n: usize) -> Case {
        self.n_outputs = n;
        self
    }

    /// The node: inputs are values 0..n (omitted ones `None`), outputs follow.
    pub fn node(&self) -> Node {
        let n = self.inputs.len();
        Node {
            name: "n".into(),
            op_type: self.op_type.clone(),
            domain: self.domain.clone(),
            attrs: self.attrs.iter().cloned().collect(),
            inputs: self.inputs.iter().enumerate().map(|(i, x)| x.tensor().map(|_| i)).collect(),
            outputs: (n..n + self.n_outputs).collect(),
        }
    }

    /// The op, created by the builtin registry at the case's opset.
    pub fn op(&self) -> Result<Box<dyn Op>> {
        Registry::builtin().create(&NodeSpec::new(&self.node(), self.opset))
    }

    /// Infers, runs the CPU kernel and validates every generated WGSL dispatch
    /// ([`super::run`]); the CPU outputs.
    pub fn run_cpu(&self) -> Result<Vec<Tensor>> {
        super::run(self.op()?.as_ref(), &self.inputs, &[])
    }

    /// A graph of this one node: run-time inputs are graph inputs `x{i}`, constants
    /// initializers `c{i}`, every output a graph output; and the feeds of the inputs.
    pub fn graph(&self) -> (Graph, Vec<(String, Tensor)>) {
        let mut b = GraphBuilder::new(&self.op_type);
        let mut ids = vec![];
        let mut feeds = vec![];
        for (i, input) in self.inputs.iter().enumerate() {
            ids.push(match input {
                Input::Data(t) => {
                    let name = format!("x{i}");
                    feeds.push((name.clone(), t.clone()));
                    Some(match t.kind() {
                        kiln_graph::ValueKind::Tensor => b.input(&name, t.dtype(), t.dims()),
                        kind => b.input_typed(&name, kiln_graph::ValueType::container(kind, t.dtype(), kiln_graph::Shape::default())),
                    })
                }
                Input::Const(t) => Some(b.constant(&format!("c{i}"), t.clone())),
                Input::Omitted => None,
            });
        }
        let attrs: Vec<(&str, Attr)> = self.attrs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        for o in b.node_multi(&self.op_type, &ids, &attrs, self.n_outputs) {
            b.output(o);
        }
        let mut g = b.finish().expect("a one-node graph is valid");
        g.nodes[0].domain = self.domain.clone();
        g.opsets.insert(self.domain.clone(), self.opset);
        (g, feeds)
    }

    /// Whether any input is a float tensor.
    pub fn has_float_inputs(&self) -> bool {
        self.inputs.iter().filter_map(Input::tensor).any(|t| t.dtype().is_float())
    }

    /// The same case with every float input converted to `dtype` (an f64 reference
    /// run widens them).
    pub fn with_floats_as(&self, dtype: DType) -> Case {
        let inputs = self.inputs.iter().map(|x| x.map(|t| if t.dtype().is_float() { data::cast(t, dtype) } else { t.clone() })).collect();
        Case { inputs, ..self.clone() }
    }
}

/// `Conv [data f32[1, 3, 5], const f32[2, 3, 1], none] {group: 1} opset 11`: what a
/// failure message names.
impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ins: Vec<String> = self
            .inputs
            .iter()
            .map(|i| match i {
                Input::Data(t) => format!("data {}{:?}", t.dtype(), t.dims()),
                Input::Const(t) => format!("const {}{:?}", t.dtype(), t.dims()),
                Input::Omitted => "none".into(),
            })
            .collect();
        let domain = if self.domain.is_empty() { String::new() } else { format!("{}.", self.domain) };
        write!(f, "{domain}{} [{}]", self.op_type, ins.join(", "))?;
        if !self.attrs.is_empty() {
            let attrs: Vec<String> = self.attrs.iter().map(|(k, v)| format!("{k}: {}", attr_text(v))).collect();
            write!(f, " {{{}}}", attrs.join(", "))?;
        }
        write!(f, " opset {}", self.opset)
    }
}

fn attr_text(a: &Attr) -> String {
    match a {
        Attr::Int(v) => v.to_string(),
        Attr::Float(v) => v.to_string(),
        Attr::String(s) => format!("{s:?}"),
        Attr::Tensor(t) => format!("{t:?}"),
        Attr::Ints(v) => format!("{v:?}"),
        Attr::Floats(v) => format!("{v:?}"),
        Attr::Strings(v) => format!("{v:?}"),
        Attr::Graph(g) => format!("graph '{}' ({} nodes)", g.name, g.nodes.len()),
        Attr::Type(t) => t.to_string(),
    }
}
