//! Gradient rules, one file per op family. A rule receives the forward node, the
//! gradient of each of its outputs (`None` where no gradient flows) and which inputs
//! need one; it adds the nodes that compute them and returns one entry per input.
//! Every rule is written in Kiln ops, so both backends run it.
use super::emit::Emit;
use super::{AutodiffError, Result};
use kiln_graph::{Attr, Node, ValueId};

mod collective;
mod elementwise;
mod linalg;
mod loss;
mod nn;
mod reduce;
mod tensor;

/// `(emit, node, output gradients, inputs that need a gradient) -> input gradients`.
pub type Rule = fn(&mut Emit, &Node, &[Option<ValueId>], &[bool]) -> Result<Vec<Option<ValueId>>>;

/// The rule of an op of the default domain, if it has one.
pub fn find(domain: &str, op_type: &str) -> Option<Rule> {
    if domain == kiln_ops::collective::DOMAIN {
        return collective::RULES.iter().find(|(name, _)| *name == op_type).map(|(_, rule)| *rule);
    }
    if !(domain.is_empty() || domain == "ai.onnx") {
        return None;
    }
    [elementwise::RULES, linalg::RULES, loss::RULES, nn::RULES, reduce::RULES, tensor::RULES]
        .iter()
        .flat_map(|r| r.iter())
        .find(|(name, _)| *name == op_type)
        .map(|(_, rule)| *rule)
}

/// Every op type with a rule (for documentation and tests).
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<&str> = [elementwise::RULES, linalg::RULES, loss::RULES, nn::RULES, reduce::RULES, tensor::RULES].iter().flat_map(|r| r.iter().map(|(n, _)| *n)).collect();
    v.sort_unstable();
    v
}

// Small helpers shared by the rule files.

pub(crate) fn int_attr(node: &Node, name: &str, default: i64) -> i64 {
    match node.attr(name) {
        Some(Attr::Int(v)) => *v,
        _ => default,
    }
}

pub(crate) fn float_attr(node: &Node, name: &str, default: f32) -> f32 {
    match node.attr(name) {
        Some(Attr::Float(v)) => *v,
        _ => default,
    }
}

pub(crate) fn ints_attr(node: &Node, name: &str) -> Option<Vec<i64>> {
    match node.attr(name) {
        Some(Attr::Ints(v)) => Some(v.clone()),
        _ => None,
    }
}

/// Input `i` of `node` (present).
pub(crate) fn input(node: &Node, i: usize) -> ValueId {
    node.inputs[i].expect("a present input")
}

/// A rule's refusal of a form of its op it does not differentiate.
pub(crate) fn unsupported(node: &Node, what: impl Into<String>) -> AutodiffError {
    AutodiffError::NoGradient { nodes: vec![(node.name.clone(), format!("{}: {}", node.op_type, what.into()))] }
}

/// An axis attribute normalised against `rank`.
pub(crate) fn axis(a: i64, rank: usize) -> usize {
    if a < 0 {
        (a + rank as i64) as usize
    } else {
        a as usize
    }
}

/// The values of a constant int64 input, if it is a constant.
pub(crate) fn const_ints(e: &Emit, v: ValueId) -> Option<Vec<i64>> {
    e.value(v).and_then(|t| t.to_i64_vec().ok())
}
