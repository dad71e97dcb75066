use crate::{Attr, Attributes, DType, Graph, Node, Result, Shape, Tensor, ValueId, ValueType};

/// Builds a [`Graph`] in code.
///
/// ```
/// use kiln_graph::{DType, GraphBuilder, Attr};
/// let mut b = GraphBuilder::new("tiny");
/// let x = b.input("x", DType::F32, [1usize, 4]);
/// let y = b.node("Relu", &[x], &[]);
/// b.output(y);
/// let g = b.finish().unwrap();
/// assert_eq!(g.nodes.len(), 1);
/// ```
pub struct GraphBuilder {
    graph: Graph,
    counter: usize,
}

impl GraphBuilder {
    pub fn new(name: &str) -> Self {
        let mut graph = Graph::new(name);
        graph.opsets.insert(String::new(), 21);
        GraphBuilder { graph, counter: 0 }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}_{}", self.counter)
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: impl Into<Shape>) -> ValueId {
        let v = self.graph.add_value(name, Some(ValueType::new(dtype, shape)));
        self.graph.inputs.push(v);
        v
    }

    /// Declares a graph input of any type (a sequence or an optional too).
    pub fn input_typed(&mut self, name: &str, ty: ValueType) -> ValueId {
        let v = self.graph.add_value(name, Some(ty));
        self.graph.inputs.push(v);
        v
    }

    /// Adds a constant (weight).
    pub fn constant(&mut self, name: &str, t: Tensor) -> ValueId {
        let ty = ValueType::new(t.dtype(), t.dims());
        let v = self.graph.add_value(name, Some(ty));
        self.graph.initializers.insert(v, t);
        v
    }

    /// Adds a node with one output and returns that output.
    pub fn node(&mut self, op_type: &str, inputs: &[ValueId], attrs: &[(&str, Attr)]) -> ValueId {
        self.node_multi(op_type, &inputs.iter().map(|&v| Some(v)).collect::<Vec<_>>(), attrs, 1)[0]
    }

    /// Adds a node with optional inputs and `n_outputs` outputs.
    pub fn node_multi(
        &mut self,
        op_type: &str,
        inputs: &[Option<ValueId>],
        attrs: &[(&str, Attr)],
        n_outputs: usize,
    ) -> Vec<ValueId> {
        let name = self.fresh(op_type);
        let outputs: Vec<ValueId> =
            (0..n_outputs).map(|i| self.graph.add_value(format!("{name}:{i}"), None)).collect();
        let attrs: Attributes = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        self.graph.nodes.push(Node {
            name,
            op_type: op_type.to_string(),
            domain: String::new(),
            attrs,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        outputs
    }

    /// Renames a value (e.g. to give a graph output a friendly name).
    pub fn rename(&mut self, v: ValueId, name: &str) {
        self.graph.values[v].name = name.to_string();
    }

    /// Marks a value as a graph output.
    pub fn output(&mut self, v: ValueId) {
        self.graph.outputs.push(v);
    }

    /// Validates and returns the graph.
    pub fn finish(self) -> Result<Graph> {
        self.graph.validate()?;
        Ok(self.graph)
    }
}
