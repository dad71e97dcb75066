use crate::{Attr, Attributes, GraphError, Result, Tensor, ValueType};
use petgraph::graph::DiGraph;
use std::collections::HashMap;

/// Index of a value (an edge of the dataflow graph) in [`Graph::values`].
pub type ValueId = usize;
/// Index of a node in [`Graph::nodes`].
pub type NodeId = usize;

/// A named value: a graph input, an initializer, or the output of a node.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    pub name: String,
    /// Type when known (inputs, outputs, initializers; intermediates after inference).
    pub ty: Option<ValueType>,
}

/// One operator application. `name` is the source model's node name (kept so that
/// errors and profiles name the node a user recognises).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    /// Operator domain ("" is the default ONNX domain).
    pub domain: String,
    pub attrs: Attributes,
    /// Inputs in order; `None` is an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
}

impl Node {
    /// `name (op_type)` for messages.
    pub fn label(&self) -> String {
        format!("'{}' ({})", self.name, self.op_type)
    }

    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.get(name)
    }
}

/// A dataflow graph of operator nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub name: String,
    pub values: Vec<ValueInfo>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Constant values (weights), by value id.
    pub initializers: HashMap<ValueId, Tensor>,
    /// Operator set versions by domain ("" = ai.onnx).
    pub opsets: HashMap<String, i64>,
    /// For a subgraph (see [`crate::Attr::Graph`]): how many of the last inputs are
    /// values of the enclosing graph rather than inputs its op declares; 0 otherwise.
    pub outer_inputs: usize,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Default::default() }
    }

    /// Adds a value and returns its id.
    pub fn add_value(&mut self, name: impl Into<String>, ty: Option<ValueType>) -> ValueId {
        self.values.push(ValueInfo { name: name.into(), ty });
        self.values.len() - 1
    }

    pub fn value_name(&self, v: ValueId) -> &str {
        &self.values[v].name
    }

    /// Finds a value by name.
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }

    /// Opset version of the default domain (ai.onnx); 21 when unspecified.
    pub fn opset(&self) -> i64 {
        self.opsets.get("").or_else(|| self.opsets.get("ai.onnx")).copied().unwrap_or(21)
    }

    /// Which node produces each value (None for inputs, initializers and unproduced values).
    pub fn producers(&self) -> Result<Vec<Option<NodeId>>> {
        let mut prod: Vec<Option<NodeId>> = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &o in &n.outputs {
                if let Some(first) = prod[o] {
                    return Err(GraphError::DuplicateProducer {
                        value: self.values[o].name.clone(),
                        first: self.nodes[first].label(),
                        second: n.label(),
                    });
                }
                if self.inputs.contains(&o) || self.initializers.contains_key(&o) {
                    return Err(GraphError::DuplicateProducer {
                        value: self.values[o].name.clone(),
                        first: "a graph input or initializer".into(),
                        second: n.label(),
                    });
                }
                prod[o] = Some(i);
            }
        }
        Ok(prod)
    }

    /// Checks that every value read is produced, that no value is produced twice and
    /// that there is no cycle; returns the nodes in a topological order.
    pub fn validate(&self) -> Result<Vec<NodeId>> {
        let prod = self.producers()?;
        let mut dag = DiGraph::<NodeId, ()>::with_capacity(self.nodes.len(), self.nodes.len());
        let idx: Vec<_> = (0..self.nodes.len()).map(|i| dag.add_node(i)).collect();
        for (i, n) in self.nodes.iter().enumerate() {
            for v in n.inputs.iter().flatten() {
                match prod[*v] {
                    Some(p) => {
                        dag.add_edge(idx[p], idx[i], ());
                    }
                    None if self.inputs.contains(v) || self.initializers.contains_key(v) => {}
                    None => {
                        return Err(GraphError::DanglingInput {
                            node: n.name.clone(),
                            op: n.op_type.clone(),
                            value: self.values[*v].name.clone(),
                        })
                    }
                }
            }
        }
        for &o in &self.outputs {
            if prod[o].is_none() && !self.inputs.contains(&o) && !self.initializers.contains_key(&o) {
                return Err(GraphError::DanglingOutput(self.values[o].name.clone()));
            }
        }
        petgraph::algo::toposort(&dag, None)
            .map(|order| order.into_iter().map(|n| dag[n]).collect())
            .map_err(|c| {
                let n = &self.nodes[dag[c.node_id()]];
                GraphError::Cycle { node: n.name.clone(), op: n.op_type.clone() }
            })
    }

    /// Number of nodes of each op type, sorted by op type.
    pub fn op_histogram(&self) -> Vec<(String, usize)> {
        let mut m: std::collections::BTreeMap<String, usize> = Default::default();
        for n in &self.nodes {
            *m.entry(n.op_type.clone()).or_default() += 1;
        }
        m.into_iter().collect()
    }
}
