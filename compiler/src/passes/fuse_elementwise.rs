//! Elementwise fusion: connected groups of f32 elementwise nodes (unary math and
//! activations, Add/Sub/Mul/Div/Pow/Max/Min with broadcasting) become one
//! `kiln.FusedElementwise` node, so a chain such as an exported GELU (Mul, Pow, Mul,
//! Add, Mul, Tanh, Add, Mul) reads its input and writes its output once, in one kernel.
//!
//! A group grows backwards from its last node: a producer joins when it is fusible and
//! every reader of its output is in the group (values read elsewhere, and graph
//! outputs, stay materialised). Dtypes come from the runtime's inference for a generic
//! binding of the symbols; only f32 nodes fuse.
use super::producers;
use super::PassContext;
use kiln_graph::{DType, Graph, Node, NodeId, ValueId};
use kiln_ops::elementwise::{unary_kind_of, BinaryKind, UnaryKind};
use kiln_ops::fused::{fusible_binary, CustomFn, FusedElementwise, Instr};
use kiln_ops::NodeSpec;
use std::collections::{BTreeSet, HashMap};

/// What a fusible node computes.
#[derive(Clone)]
enum Kind {
    Unary(UnaryKind),
    Binary(BinaryKind),
    /// An op of another domain that declares itself elementwise (`Op::elementwise`).
    Custom(CustomFn),
}

fn kind_of(g: &Graph, node: &Node, dtypes: &[Option<DType>], registry: &kiln_ops::Registry) -> Option<Kind> {
    let f32_value = |v: Option<ValueId>| v.is_some_and(|v| dtypes[v] == Some(DType::F32));
    if node.outputs.len() != 1 || !f32_value(Some(node.outputs[0])) {
        return None;
    }
    if !(node.domain.is_empty() || node.domain == "ai.onnx") {
        // Custom ops (never Kiln's own domain, whose ops are the fused ones).
        if node.domain == "kiln" || node.inputs.len() != 1 || !f32_value(node.inputs[0]) {
            return None;
        }
        let opset = g.opsets.get(&node.domain).copied().unwrap_or(1);
        let op = registry.create(&NodeSpec::new(node, opset)).ok()?;
        return op.elementwise().map(|f| Kind::Custom(CustomFn { f, node: node.clone() }));
    }
    if let Some(k) = BinaryKind::from_name(&node.op_type).filter(|k| fusible_binary(*k)) {
        return (node.inputs.len() == 2 && node.inputs.iter().all(|v| f32_value(*v))).then_some(Kind::Binary(k));
    }
    let opset = g.opsets.get(&node.domain).copied().unwrap_or_else(|| g.opset());
    let kind = unary_kind_of(&NodeSpec::new(node, opset)).ok()??;
    if !f32_value(node.inputs.first().copied().flatten()) {
        return None;
    }
    match kind {
        UnaryKind::Clip { min, max } => {
            // Bounds given as inputs must be constants.
            let bound = |i: usize, default: f32| match node.inputs.get(i).copied().flatten() {
                None => Some(default),
                Some(v) => g.initializers.get(&v).filter(|t| t.len() == 1).map(|t| t.to_f64_vec()[0] as f32),
            };
            Some(Kind::Unary(UnaryKind::Clip { min: bound(1, min)?, max: bound(2, max)? }))
        }
        k => (node.inputs.iter().skip(1).all(|v| v.is_none())).then_some(Kind::Unary(k)),
    }
}

/// Most nodes in one fused group (bounds the size of the generated kernel).
const MAX_GROUP: usize = 256;

/// Fuses elementwise groups; returns how many nodes were removed.
pub fn fuse_elementwise(g: &mut Graph, cx: &mut PassContext) -> usize {
    let dtypes: Vec<Option<DType>> = cx.types(g).iter().map(|t| t.as_ref().map(|t| t.dtype)).collect();
    let Ok(order) = g.validate() else { return 0 };
    let registry = cx.registry();
    let kinds: Vec<Option<Kind>> = g.nodes.iter().map(|n| kind_of(g, n, &dtypes, registry)).collect();
    let prod = producers(g);
    let mut readers: Vec<Vec<NodeId>> = vec![vec![]; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            readers[*v].push(i);
        }
    }
    let is_output: Vec<bool> = (0..g.values.len()).map(|v| g.outputs.contains(&v)).collect();
    let mut assigned = vec![false; g.nodes.len()];
    let mut groups: Vec<(NodeId, BTreeSet<NodeId>)> = vec![];
    for &root in order.iter().rev() {
        if assigned[root] || kinds[root].is_none() {
            continue;
        }
        // Grow from the root: a producer joins once every reader of its output is in
        // the group, which can only change when one of those readers joins, so each
        // joining node checks the producers of its inputs once.
        let mut group = BTreeSet::from([root]);
        let mut joined = vec![root];
        while let Some(m) = joined.pop() {
            for v in g.nodes[m].inputs.iter().flatten() {
                let Some(p) = prod[*v] else { continue };
                if group.len() >= MAX_GROUP || group.contains(&p) || assigned[p] || kinds[p].is_none() || is_output[*v] {
                    continue;
                }
                if readers[*v].iter().all(|r| group.contains(r)) {
                    group.insert(p);
                    joined.push(p);
                }
            }
        }
        if group.len() >= 2 {
            for &m in &group {
                assigned[m] = true;
            }
            groups.push((root, group));
        }
    }
    let position: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut removed = 0;
    let mut replacement: HashMap<NodeId, Node> = HashMap::new();
    let mut dead: Vec<NodeId> = vec![];
    for (root, group) in &groups {
        let mut members: Vec<NodeId> = group.iter().copied().collect();
        members.sort_by_key(|m| position[m]);
        let mut inputs: Vec<ValueId> = vec![];
        let mut reg: HashMap<ValueId, usize> = HashMap::new();
        let produced: BTreeSet<ValueId> = members.iter().map(|&m| g.nodes[m].outputs[0]).collect();
        for &m in &members {
            let n = &g.nodes[m];
            let count = match &kinds[m] {
                Some(Kind::Binary(_)) => 2,
                _ => 1,
            };
            for v in n.inputs.iter().take(count).flatten() {
                if !produced.contains(v) && !reg.contains_key(v) {
                    reg.insert(*v, inputs.len());
                    inputs.push(*v);
                }
            }
        }
        let mut instrs = vec![];
        for &m in &members {
            let n = &g.nodes[m];
            let r = |i: usize| reg[&n.inputs[i].expect("fusible nodes have their data inputs")];
            instrs.push(match kinds[m].clone().expect("members are fusible") {
                Kind::Unary(k) => Instr::Unary(k, r(0)),
                Kind::Binary(k) => Instr::Binary(k, r(0), r(1)),
                Kind::Custom(c) => Instr::Custom(c, r(0)),
            });
            reg.insert(n.outputs[0], inputs.len() + instrs.len() - 1);
        }
        let root_node = &g.nodes[*root];
        let mut attrs: kiln_graph::Attributes = FusedElementwise::attrs(&instrs).into_iter().collect();
        attrs.insert("kiln_fused_nodes".into(), kiln_graph::Attr::Strings(members.iter().map(|&m| g.nodes[m].name.clone()).collect()));
        let fused = Node {
            name: root_node.name.clone(),
            op_type: "FusedElementwise".into(),
            domain: "kiln".into(),
            attrs,
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: root_node.outputs.clone(),
        };
        replacement.insert(*root, fused);
        dead.extend(members.iter().copied().filter(|m| m != root));
        removed += members.len() - 1;
    }
    for (root, node) in replacement {
        g.nodes[root] = node;
    }
    super::remove_nodes(g, &dead);
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::{Attr, GraphBuilder, Shape, Tensor};

    fn gelu_graph() -> Graph {
        let mut b = GraphBuilder::new("gelu");
        let x = b.input("x", DType::F32, Shape(vec!["batch".into(), 16usize.into()]));
        let w = b.constant("w", Tensor::zeros(DType::F32, &[16, 16]));
        let h = b.node("MatMul", &[x, w], &[]);
        let three = b.constant("three", Tensor::scalar(3f32));
        let c0 = b.constant("c0", Tensor::scalar(0.044715f32));
        let c1 = b.constant("c1", Tensor::scalar(0.7978846f32));
        let one = b.constant("one", Tensor::scalar(1f32));
        let half = b.constant("half", Tensor::scalar(0.5f32));
        let p = b.node("Pow", &[h, three], &[]);
        let m = b.node("Mul", &[p, c0], &[]);
        let a = b.node("Add", &[h, m], &[]);
        let m2 = b.node("Mul", &[a, c1], &[]);
        let t = b.node("Tanh", &[m2], &[]);
        let a2 = b.node("Add", &[t, one], &[]);
        let m3 = b.node("Mul", &[h, a2], &[]);
        let y = b.node("Mul", &[m3, half], &[]);
        b.rename(y, "y");
        b.output(y);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 17);
        g
    }

    #[test]
    fn a_gelu_chain_becomes_one_node() {
        let mut g = gelu_graph();
        assert_eq!(fuse_elementwise(&mut g, &mut super::PassContext::builtin()), 7);
        g.validate().unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["MatMul", "FusedElementwise"]);
        let f = &g.nodes[1];
        assert_eq!(f.attrs.get("kiln_ops"), Some(&Attr::Strings(["Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"].map(String::from).to_vec())));
        // The MatMul result is read three times inside the group: one input register.
        assert_eq!(f.inputs.len(), 6);
    }

    #[test]
    fn values_read_outside_the_group_and_non_f32_values_stay() {
        let mut b = GraphBuilder::new("t");
        let x = b.input("x", DType::F32, [4usize]);
        let e = b.node("Exp", &[x], &[]);
        let n = b.node("Neg", &[e], &[]);
        let s = b.node("Sigmoid", &[n], &[]);
        b.output(e); // e is a graph output: Exp stays its own node
        b.output(s);
        let i = b.input("i", DType::I64, [4usize]);
        let i2 = b.node("Add", &[i, i], &[]);
        let i3 = b.node("Mul", &[i2, i], &[]);
        b.output(i3);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 17);
        assert_eq!(fuse_elementwise(&mut g, &mut super::PassContext::builtin()), 1);
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Exp", "FusedElementwise", "Add", "Mul"]);
    }
}
