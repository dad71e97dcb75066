use crate::{OpError, Result};
use kiln_graph::{Attr, Node, Tensor};

/// What an op factory sees of a node: its attributes, input/output counts and the
/// opset version, with typed attribute accessors whose errors name the attribute.
#[derive(Clone, Copy, Debug)]
pub struct NodeSpec<'a> {
    pub node: &'a Node,
    pub opset: i64,
    /// The registry the node's op is created from, for ops that create the ops of
    /// their subgraphs (If, Loop, Scan); `None`: the built-in one.
    pub registry: Option<&'a crate::Registry>,
}

fn wrong(attr: &str, expected: &str, got: &Attr) -> OpError {
    OpError::Attr { attr: attr.into(), what: format!("expected {expected}, found {}", got.kind()) }
}

impl<'a> NodeSpec<'a> {
    pub fn new(node: &'a Node, opset: i64) -> Self {
        NodeSpec { node, opset, registry: None }
    }

    /// The same node, created from `registry` (custom ops inside its subgraphs).
    pub fn with_registry(self, registry: &'a crate::Registry) -> Self {
        NodeSpec { registry: Some(registry), ..self }
    }

    pub fn n_inputs(&self) -> usize {
        self.node.inputs.len()
    }

    pub fn n_outputs(&self) -> usize {
        self.node.outputs.len()
    }

    /// Whether optional input `i` is present.
    pub fn has_input(&self, i: usize) -> bool {
        matches!(self.node.inputs.get(i), Some(Some(_)))
    }

    pub fn has(&self, name: &str) -> bool {
        self.node.attrs.contains_key(name)
    }

    pub fn int_opt(&self, name: &str) -> Result<Option<i64>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(a) => Err(wrong(name, "an int", a)),
        }
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    pub fn float_opt(&self, name: &str) -> Result<Option<f32>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(Attr::Int(v)) => Ok(Some(*v as f32)),
            Some(a) => Err(wrong(name, "a float", a)),
        }
    }

    pub fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    pub fn ints_opt(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(a) => Err(wrong(name, "a list of ints", a)),
        }
    }

    pub fn ints(&self, name: &str, default: &[i64]) -> Result<Vec<i64>> {
        Ok(self.ints_opt(name)?.unwrap_or_else(|| default.to_vec()))
    }

    pub fn floats_opt(&self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v.clone())),
            Some(a) => Err(wrong(name, "a list of floats", a)),
        }
    }

    pub fn string_opt(&self, name: &str) -> Result<Option<String>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::String(v)) => Ok(Some(v.clone())),
            Some(a) => Err(wrong(name, "a string", a)),
        }
    }

    pub fn strings_opt(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Strings(v)) => Ok(Some(v.clone())),
            Some(a) => Err(wrong(name, "a list of strings", a)),
        }
    }

    pub fn string(&self, name: &str, default: &str) -> Result<String> {
        Ok(self.string_opt(name)?.unwrap_or_else(|| default.to_string()))
    }

    pub fn tensor_opt(&self, name: &str) -> Result<Option<Tensor>> {
        match self.node.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Tensor(t)) => Ok(Some(t.clone())),
            Some(a) => Err(wrong(name, "a tensor", a)),
        }
    }

    /// Error for an attribute value outside what the op accepts.
    pub fn bad(&self, name: &str, what: impl Into<String>) -> OpError {
        OpError::Attr { attr: name.into(), what: what.into() }
    }
}
