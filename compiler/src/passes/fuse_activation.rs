//! Epilogue fusion of activations: `Conv -> Relu` (and Gemm/MatMul followed by Relu,
//! Clip with constant bounds, LeakyRelu, HardSigmoid, HardSwish, Sigmoid, Tanh, Elu,
//! Selu, Softplus) becomes one node that applies the activation to its results before
//! storing them, saving a pass over memory and a kernel launch per activation.
//! The activation travels as the node attributes `kiln_activation` and
//! `kiln_activation_params`, which the producers' ops read. A reshape between producer
//! and activation (GPT-2's Gemm -> Reshape -> Gelu) is looked through: the activation
//! moves into the producer and the reshape writes the activation's output.
use super::{producers, remove_nodes, scalar_const, use_counts};
use super::PassContext;
use kiln_graph::{Attr, Graph};
use kiln_ops::elementwise::{unary_kind_of, UnaryKind, ACTIVATION_ATTR, ACTIVATION_PARAMS_ATTR};
use kiln_ops::NodeSpec;

/// Ops whose kernels apply a fused activation.
const PRODUCERS: &[&str] = &["Conv", "Gemm", "MatMul"];
/// Ops that only change dims, which an elementwise activation commutes with.
const RESHAPES: &[&str] = &["Reshape", "Flatten", "Squeeze", "Unsqueeze"];

fn activation_of(g: &Graph, n: usize) -> Option<UnaryKind> {
    let node = &g.nodes[n];
    if !node.domain.is_empty() && node.domain != "ai.onnx" {
        return None;
    }
    let opset = g.opsets.get(&node.domain).copied().unwrap_or_else(|| g.opset());
    let kind = unary_kind_of(&NodeSpec::new(node, opset)).ok()??;
    match kind {
        UnaryKind::Clip { min, max } => {
            // Bounds from inputs 1 and 2 (opset >= 11) must be constants.
            let lo = match node.inputs.get(1).copied().flatten() {
                Some(v) => scalar_const(g, Some(v))?,
                None => min,
            };
            let hi = match node.inputs.get(2).copied().flatten() {
                Some(v) => scalar_const(g, Some(v))?,
                None => max,
            };
            Some(UnaryKind::Clip { min: lo, max: hi })
        }
        k if k.is_activation() => Some(k),
        _ => None,
    }
}

/// Fuses activations into their producers; returns how many were fused.
pub fn fuse_activation(g: &mut Graph, _cx: &mut PassContext) -> usize {
    let uses = use_counts(g);
    let prod = producers(g);
    let mut dead = vec![];
    for m in 0..g.nodes.len() {
        let Some(kind) = activation_of(g, m) else { continue };
        let Some(mut x) = g.nodes[m].inputs.first().copied().flatten() else { continue };
        let Some(mut p) = prod[x] else { continue };
        // Look through one reshape that only this activation reads.
        let mut view = None;
        if RESHAPES.contains(&g.nodes[p].op_type.as_str()) && g.nodes[p].domain.is_empty() && uses[x] == 1 {
            if let Some((src, sp)) = g.nodes[p].inputs.first().copied().flatten().and_then(|s| Some((s, prod[s]?))) {
                view = Some(p);
                (x, p) = (src, sp);
            }
        }
        let producer = &g.nodes[p];
        let fusible = PRODUCERS.contains(&producer.op_type.as_str())
            && producer.domain.is_empty()
            && producer.outputs.len() == 1
            && !producer.attrs.contains_key(ACTIVATION_ATTR)
            && uses[x] == 1
            && g.values[x].ty.as_ref().is_none_or(|t| t.dtype == kiln_graph::DType::F32);
        if !fusible {
            continue;
        }
        let out = g.nodes[m].outputs[0];
        let producer = &mut g.nodes[p];
        producer.attrs.insert(ACTIVATION_ATTR.into(), Attr::String(kind.op_name().into()));
        producer.attrs.insert(ACTIVATION_PARAMS_ATTR.into(), Attr::Floats(kind.params()));
        match view {
            Some(v) => g.nodes[v].outputs[0] = out,
            None => producer.outputs[0] = out,
        }
        dead.push(m);
    }
    remove_nodes(g, &dead);
    dead.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::{DType, GraphBuilder, Tensor};

    #[test]
    fn conv_relu_and_clip_fuse_but_shared_outputs_do_not() {
        let mut b = GraphBuilder::new("t");
        let x = b.input("x", DType::F32, [1usize, 2, 5, 5]);
        let w = b.constant("w", Tensor::zeros(DType::F32, &[2, 2, 1, 1]));
        let c1 = b.node("Conv", &[x, w], &[]);
        let r1 = b.node("Relu", &[c1], &[]);
        let c2 = b.node("Conv", &[r1, w], &[]);
        let lo = b.constant("lo", Tensor::scalar(0f32));
        let hi = b.constant("hi", Tensor::scalar(6f32));
        let r2 = b.node("Clip", &[c2, lo, hi], &[]);
        let c3 = b.node("Conv", &[r2, w], &[]);
        let r3 = b.node("Relu", &[c3], &[]);
        let s = b.node("Add", &[c3, r3], &[]); // c3 has two readers: no fusion
        b.output(s);
        let mut g = b.finish().unwrap();
        let fused = fuse_activation(&mut g, &mut super::PassContext::builtin());
        g.validate().unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(fused, 2);
        assert_eq!(ops, ["Conv", "Conv", "Conv", "Relu", "Add"]);
        assert_eq!(g.nodes[1].attrs.get(ACTIVATION_PARAMS_ATTR), Some(&Attr::Floats(vec![0.0, 6.0])));
    }

    #[test]
    fn a_reshape_between_producer_and_activation_is_looked_through() {
        let mut b = GraphBuilder::new("t");
        let x = b.input("x", DType::F32, [4usize, 3]);
        let w = b.constant("w", Tensor::zeros(DType::F32, &[3, 6]));
        let h = b.node("Gemm", &[x, w], &[]);
        let shape = b.constant("shape", Tensor::from_vec(&[3], vec![2i64, 2, 6]).unwrap());
        let r = b.node("Reshape", &[h, shape], &[]);
        let y = b.node("Gelu", &[r], &[]);
        b.output(y);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 20);
        assert_eq!(fuse_activation(&mut g, &mut super::PassContext::builtin()), 1);
        g.validate().unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["Gemm", "Reshape"]);
        assert_eq!(g.nodes[0].attrs.get(ACTIVATION_ATTR), Some(&Attr::String("Gelu".into())));
        assert_eq!(g.nodes[1].outputs[0], y);
    }
}
