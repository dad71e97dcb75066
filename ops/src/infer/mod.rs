//! Type inference over whole graphs, beside the ops it runs.
//!
//! - [`create_ops`]: every node's [`Op`] from a registry (all failures reported together).
//! - [`specialize`]: concrete input types in, a typed, host-folded step list out
//!   ([`Specialized`]): what sessions plan and run.
//! - [`check_symbolic`]: the graph inferred for generic bindings of its symbolic dims,
//!   failing only for nodes that can never run ([`SymbolicShapes`]).
//! - [`value_types`]: the fitted symbolic type of every value, what graph passes know
//!   about shapes before inputs are bound.
//!
//! Every size inference produces is checked: a type whose byte size overflows, or a
//! value folded on the host larger than the [`Limits`], is an error naming the node.
mod error;
mod symbolic;
mod walk;

pub use error::InferError;
pub use symbolic::{check as check_symbolic, value_types, SymbolicShapes};
pub use walk::{evaluate, specialize, specialize_stage, Limits, SpecializeError, Specialized, Stage, Step};

use crate::{NodeSpec, Op, Registry};
use kiln_graph::Graph;

pub type Result<T, E = InferError> = std::result::Result<T, E>;

/// Creates every node's op; all failures are reported together.
pub fn create_ops(graph: &Graph, registry: &Registry) -> Result<Vec<Box<dyn Op>>> {
    let opset = graph.opset();
    let mut ops = Vec::with_capacity(graph.nodes.len());
    let mut errors: Vec<(String, String)> = vec![];
    for node in &graph.nodes {
        let opset = graph.opsets.get(&node.domain).copied().unwrap_or(opset);
        match registry.create(&NodeSpec::new(node, opset).with_registry(registry)) {
            Ok(op) => ops.push(op),
            Err(e) => errors.push((format!("node '{}' ({})", node.name, node.op_type), e.to_string())),
        }
    }
    match errors.len() {
        0 => Ok(ops),
        1 => {
            let (node, what) = errors.remove(0);
            Err(InferError::Unsupported { node, what })
        }
        n => {
            let shown: Vec<String> = errors.iter().take(20).map(|(n, w)| format!("{n}: {w}")).collect();
            Err(InferError::Unsupported {
                node: format!("{n} nodes cannot run"),
                what: format!("\n  {}{}", shown.join("\n  "), if n > 20 { "\n  ..." } else { "" }),
            })
        }
    }
}
