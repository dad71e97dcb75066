//! Adding typed nodes to a graph whose every value has a concrete type: what gradient
//! rules, losses and optimizers build with. Each node is created and inferred as it is
//! added, so a rule that builds something ill-typed fails at once, naming its node.
use super::{AutodiffError, Result};
use kiln_graph::{Attr, Attributes, DType, Graph, Node, Tensor, ValueId, ValueType};
use kiln_ops::{Arg, NodeSpec, Registry, TensorType};

pub struct Emit<'g> {
    pub graph: &'g mut Graph,
    types: Vec<Option<TensorType>>,
    registry: &'g Registry,
    /// Name prefix of the nodes added now (the forward node a rule differentiates).
    scope: String,
    counter: usize,
}

impl<'g> Emit<'g> {
    /// `types[v]` is the concrete type of value `v` (every value a rule may read).
    /// Weights missing from `types` take their own type.
    pub fn new(graph: &'g mut Graph, mut types: Vec<Option<TensorType>>, registry: &'g Registry) -> Emit<'g> {
        types.resize(types.len().max(graph.values.len()), None);
        for (&v, t) in &graph.initializers {
            if types[v].is_none() {
                types[v] = Some(TensorType::new(t.dtype(), t.dims().to_vec()));
            }
        }
        Emit { graph, types, registry, scope: String::new(), counter: 0 }
    }

    /// Names the nodes added from now on `{scope}/...`.
    pub fn set_scope(&mut self, scope: impl Into<String>) {
        self.scope = scope.into();
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.types[v].as_ref().unwrap_or_else(|| panic!("value '{}' has no type", self.graph.values[v].name))
    }

    pub fn dims(&self, v: ValueId) -> Vec<usize> {
        self.ty(v).dims.clone()
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.ty(v).dtype
    }

    pub fn rank(&self, v: ValueId) -> usize {
        self.ty(v).dims.len()
    }

    /// The constant value of `v`, when it is a weight.
    pub fn value(&self, v: ValueId) -> Option<&Tensor> {
        self.graph.initializers.get(&v)
    }

    fn fresh_name(&mut self, what: &str) -> String {
        self.counter += 1;
        if self.scope.is_empty() {
            format!("{what}_{}", self.counter)
        } else {
            format!("{}/{what}_{}", self.scope, self.counter)
        }
    }

    /// Adds a value with a known type (a new graph input, say).
    pub fn value_of_type(&mut self, name: &str, ty: TensorType) -> ValueId {
        let v = self.graph.add_value(name, Some(ValueType::new(ty.dtype, ty.dims.clone())));
        self.set_type(v, ty);
        v
    }

    pub(crate) fn set_type(&mut self, v: ValueId, ty: TensorType) {
        if self.types.len() <= v {
            self.types.resize(v + 1, None);
        }
        self.types[v] = Some(ty);
    }

    /// A constant.
    pub fn constant(&mut self, t: Tensor) -> ValueId {
        let name = self.fresh_name("const");
        let ty = TensorType::new(t.dtype(), t.dims().to_vec());
        let v = self.graph.add_value(name, Some(ValueType::new(ty.dtype, ty.dims.clone())));
        self.graph.initializers.insert(v, t);
        self.set_type(v, ty);
        v
    }

    /// A scalar constant of `dtype` (a float or integer type).
    pub fn scalar(&mut self, value: f64, dtype: DType) -> ValueId {
        let t = Tensor::from_f64(dtype, &[], &[value]).expect("a scalar of a numeric dtype");
        self.constant(t)
    }

    /// A 1-D int64 constant (shapes, axes, pads).
    pub fn ints(&mut self, values: &[i64]) -> ValueId {
        self.constant(Tensor::from_slice(&[values.len()], values).expect("a vector"))
    }

    /// Adds a node of the default domain with one output.
    pub fn op(&mut self, op_type: &str, inputs: &[ValueId], attrs: &[(&str, Attr)]) -> Result<ValueId> {
        let ins: Vec<Option<ValueId>> = inputs.iter().map(|&v| Some(v)).collect();
        Ok(self.node("", op_type, &ins, attrs, 1)?[0])
    }

    /// Adds a node with `n_outputs` outputs (optional inputs as `None`), infers them.
    pub fn node(&mut self, domain: &str, op_type: &str, inputs: &[Option<ValueId>], attrs: &[(&str, Attr)], n_outputs: usize) -> Result<Vec<ValueId>> {
        let name = self.fresh_name(op_type);
        let outputs: Vec<ValueId> = (0..n_outputs).map(|i| self.graph.add_value(format!("{name}:{i}"), None)).collect();
        let attrs: Attributes = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let node = Node { name, op_type: op_type.into(), domain: domain.into(), attrs, inputs: inputs.to_vec(), outputs: outputs.clone() };
        let tys = self.infer(&node)?;
        for (&o, t) in outputs.iter().zip(tys) {
            self.graph.values[o].ty = Some(ValueType::new(t.dtype, t.dims.clone()));
            self.set_type(o, t);
        }
        self.graph.nodes.push(node);
        Ok(outputs)
    }

    /// The output types of `node` from the types (and constant values) of its inputs.
    pub(crate) fn infer(&self, node: &Node) -> Result<Vec<TensorType>> {
        let opset = self.graph.opsets.get(&node.domain).copied().unwrap_or_else(|| self.graph.opset());
        let spec = NodeSpec::new(node, opset).with_registry(self.registry);
        let fail = |e: kiln_ops::OpError| AutodiffError::Build { node: node.name.clone(), op: node.op_type.clone(), what: e.to_string() };
        let op = self.registry.create(&spec).map_err(fail)?;
        let args: Vec<Option<Arg>> = node
            .inputs
            .iter()
            .map(|v| v.map(|v| Arg { ty: self.ty(v), value: self.graph.initializers.get(&v) }))
            .collect();
        op.infer(&args).map_err(fail)
    }

    // Shorthands for the ops rules use most.

    pub fn add(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op("Add", &[a, b], &[])
    }
    pub fn sub(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op("Sub", &[a, b], &[])
    }
    pub fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op("Mul", &[a, b], &[])
    }
    pub fn div(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op("Div", &[a, b], &[])
    }
    pub fn neg(&mut self, a: ValueId) -> Result<ValueId> {
        self.op("Neg", &[a], &[])
    }
    /// `a * c` for a constant `c` of `a`'s dtype.
    pub fn scale(&mut self, a: ValueId, c: f64) -> Result<ValueId> {
        if c == 1.0 {
            return Ok(a);
        }
        let k = self.scalar(c, self.dtype(a));
        self.mul(a, k)
    }
    pub fn reshape(&mut self, a: ValueId, dims: &[usize]) -> Result<ValueId> {
        if self.ty(a).dims == dims {
            return Ok(a);
        }
        let shape = self.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
        self.op("Reshape", &[a, shape], &[])
    }
    pub fn transpose(&mut self, a: ValueId, perm: &[usize]) -> Result<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(a);
        }
        self.op("Transpose", &[a], &[("perm", Attr::Ints(perm.iter().map(|&p| p as i64).collect()))])
    }
    pub fn reduce_sum(&mut self, a: ValueId, axes: &[usize], keepdims: bool) -> Result<ValueId> {
        if axes.is_empty() {
            return Ok(a);
        }
        let axes: Vec<i64> = axes.iter().map(|&x| x as i64).collect();
        let keep = ("keepdims", Attr::Int(keepdims as i64));
        if self.graph.opset() < 13 {
            return self.op("ReduceSum", &[a], &[keep, ("axes", Attr::Ints(axes))]);
        }
        let axes = self.ints(&axes);
        self.op("ReduceSum", &[a, axes], &[keep])
    }
    pub fn expand(&mut self, a: ValueId, dims: &[usize]) -> Result<ValueId> {
        if self.ty(a).dims == dims {
            return Ok(a);
        }
        let shape = self.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
        self.op("Expand", &[a, shape], &[])
    }
    /// `g`, or zeros of `like`'s type where there is no gradient.
    pub fn or_zeros(&mut self, g: Option<ValueId>, like: ValueId) -> Result<ValueId> {
        match g {
            Some(g) => Ok(g),
            None => {
                let dims = self.dims(like);
                self.zeros(self.dtype(like), &dims)
            }
        }
    }
    pub fn zeros(&mut self, dtype: DType, dims: &[usize]) -> Result<ValueId> {
        let z = self.scalar(0.0, dtype);
        self.expand(z, dims)
    }

    /// The sum of the squares of every element of `values` (a scalar), `None` for none.
    pub fn sum_of_squares(&mut self, values: &[ValueId]) -> Result<Option<ValueId>> {
        let mut total: Option<ValueId> = None;
        for &g in values {
            let sq = self.mul(g, g)?;
            let all: Vec<usize> = (0..self.rank(g)).collect();
            let s = self.reduce_sum(sq, &all, false)?;
            let s = self.reshape(s, &[])?;
            total = Some(match total {
                Some(t) => self.add(t, s)?,
                None => s,
            });
        }
        Ok(total)
    }

    /// Whether `v` is neither NaN nor infinite (bool, elementwise).
    pub fn is_finite(&mut self, v: ValueId) -> Result<ValueId> {
        let nan = self.op("IsNaN", &[v], &[])?;
        let inf = self.op("IsInf", &[v], &[])?;
        let bad = self.op("Or", &[nan, inf], &[])?;
        self.op("Not", &[bad], &[])
    }

    /// Sums a gradient of a broadcast result down to the dims of the operand it came
    /// from (numpy broadcasting: leading axes added, size-1 axes stretched).
    pub fn sum_to(&mut self, grad: ValueId, dims: &[usize]) -> Result<ValueId> {
        let gdims = self.dims(grad);
        if gdims == dims {
            return Ok(grad);
        }
        let lead = gdims.len() - dims.len();
        let axes: Vec<usize> = (0..gdims.len()).filter(|&i| i < lead || (dims[i - lead] == 1 && gdims[i] != 1)).collect();
        let s = self.reduce_sum(grad, &axes, true)?;
        self.reshape(s, dims)
    }
}
