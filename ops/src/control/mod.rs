//! Control flow: If, Loop and Scan. Each holds its subgraphs as [`Body`]s (ops created
//! once); the op's kernel drives the loop on the host and runs a body per iteration.
//! A body runs through the [`BodyRunner`] its caller installed ([`with_body_runner`]:
//! a GPU session runs bodies as GPU work), else on the host through the same
//! specialisation every graph goes through: with every input known, a body folds to
//! its outputs with the CPU kernels.
//! Output types follow from the bodies' inference where they do not depend on values
//! (If with branches of one type, Scan, a Loop without scan outputs whose carried
//! values keep their types); otherwise the op needs its input values, and a session
//! runs it once those are computed.
mod chain;
mod if_op;
mod loop_op;
mod scan;

use crate::infer::{self, InferError, Limits, SpecializeError};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{Attr, Graph, NodeId, Tensor};
use chain::Feed;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most iterations of a loop whose trip count is known that run as one chain.
pub(crate) const CHAIN: usize = 16;

/// The length of the next chain for `left` iterations: the largest power of two that
/// fits, at most [`CHAIN`] (a few chain lengths serve any count).
pub(crate) fn chain_length(left: usize) -> usize {
    let left = CHAIN.min(left.max(1));
    1usize << (usize::BITS - 1 - left.leading_zeros())
}

/// A chain's outputs ([`Body::run_chain`]): returns the carried values (the first
/// `carried`) and appends each of the `k` applications' emitted values to `emitted`.
pub(crate) fn unchain(outs: Vec<Tensor>, carried: usize, k: usize, emitted: &mut [Vec<Tensor>], op: &str) -> Result<Vec<Tensor>> {
    if outs.len() != carried + k * emitted.len() {
        return Err(OpError::invalid(format!("a chain of {k} applications of {op}'s body returned {} outputs, not {}", outs.len(), carried + k * emitted.len())));
    }
    let mut outs = outs.into_iter();
    let state = outs.by_ref().take(carried).collect();
    for _ in 0..k {
        for (e, o) in emitted.iter_mut().zip(outs.by_ref()) {
            e.push(o);
        }
    }
    Ok(state)
}

/// Runs control-flow bodies somewhere other than the host (a GPU session's device).
/// The op keeps the loop's semantics; the runner computes one application of a body:
/// `graph`'s outputs for its inputs (declared ones, then the enclosing graph's values
/// it reads). `Ok(None)` leaves that application to the host (a body over sequences,
/// say).
pub trait BodyRunner: Sync {
    fn run(&self, graph: &Arc<Graph>, inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>>;
}

thread_local! {
    static RUNNER: std::cell::Cell<Option<&'static dyn BodyRunner>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with `runner` running the control-flow bodies that kernels on this thread
/// execute (the previous runner, if any, is back afterwards, also on a panic).
pub fn with_body_runner<R>(runner: &dyn BodyRunner, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<&'static dyn BodyRunner>);
    impl Drop for Restore {
        fn drop(&mut self) {
            RUNNER.with(|r| r.set(self.0));
        }
    }
    // SAFETY: the reference is only reachable through RUNNER while `f` runs, and
    // `Restore` takes it out again before this function returns or unwinds, so it
    // never outlives `runner`.
    let runner: &'static dyn BodyRunner = unsafe { std::mem::transmute::<&dyn BodyRunner, &'static dyn BodyRunner>(runner) };
    let _restore = Restore(RUNNER.with(|r| r.replace(Some(runner))));
    f()
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "If", |s| Ok(Box::new(if_op::If::parse(s)?)));
    r.register("", "Loop", |s| Ok(Box::new(loop_op::Loop::parse(s)?)));
    r.register("", "Scan", |s| Ok(Box::new(scan::Scan::parse(s)?)));
}

/// A subgraph with its ops, ready to be inferred and run on the host.
pub(crate) struct Body {
    /// The attribute it came from (for messages).
    attr: String,
    graph: Arc<Graph>,
    ops: Vec<Box<dyn Op>>,
    order: Vec<NodeId>,
    /// Chains of this body by length (`None`: it cannot be chained), built on first use.
    chains: Mutex<HashMap<usize, Option<Arc<Graph>>>>,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Body({} '{}', {} nodes)", self.attr, self.graph.name, self.graph.nodes.len())
    }
}

impl Body {
    /// The subgraph of attribute `attr`, its ops created from the node's registry.
    pub fn parse(spec: &NodeSpec, attr: &str) -> Result<Body> {
        let graph = match spec.node.attrs.get(attr) {
            Some(Attr::Graph(g)) => g.clone(),
            Some(other) => return Err(OpError::Attr { attr: attr.into(), what: format!("expected a graph, found {}", other.kind()) }),
            None => return Err(OpError::Attr { attr: attr.into(), what: "required (a subgraph)".into() }),
        };
        let bad = |e: &dyn std::fmt::Display| OpError::Attr { attr: attr.into(), what: format!("subgraph '{}': {e}", graph.name) };
        let order = graph.validate().map_err(|e| bad(&e))?;
        let registry = spec.registry.unwrap_or_else(|| Registry::builtin());
        let ops = infer::create_ops(&graph, registry).map_err(|e| bad(&e))?;
        Ok(Body { attr: attr.into(), graph, ops, order, chains: Mutex::default() })
    }

    /// Inputs the subgraph's op declares (the rest are values of the enclosing graph).
    pub fn declared(&self) -> usize {
        self.graph.inputs.len() - self.graph.outer_inputs
    }

    pub fn n_inputs(&self) -> usize {
        self.graph.inputs.len()
    }

    pub fn n_outputs(&self) -> usize {
        self.graph.outputs.len()
    }

    fn error(&self, e: InferError) -> OpError {
        OpError::invalid(format!("subgraph '{}' ('{}'): {e}", self.attr, self.graph.name))
    }

    /// The output types for these input types (and values, where known). A body that
    /// needs a value it is not given makes the op need its input values:
    /// `NeedsValue` on `first_unknown`.
    pub fn infer(&self, inputs: &[(TensorType, Option<&Tensor>)], first_unknown: usize) -> Result<Vec<TensorType>> {
        self.check_count(inputs.len())?;
        let types: Vec<TensorType> = inputs.iter().map(|(t, _)| t.clone()).collect();
        let values: Vec<Option<&Tensor>> = inputs.iter().map(|(_, v)| *v).collect();
        match infer::specialize(&self.graph, &self.ops, &self.order, &types, &values, Limits::default()) {
            Ok(s) => Ok(self.graph.outputs.iter().map(|&o| s.ty(o).clone()).collect()),
            Err(SpecializeError::NeedsValue { error, .. }) => {
                Err(OpError::NeedsValue { index: first_unknown, what: format!("the inputs of subgraph '{}' ({error})", self.attr) })
            }
            Err(SpecializeError::Other(e)) => Err(self.error(e)),
        }
    }

    /// Runs the subgraph on known inputs: through this thread's [`BodyRunner`] if any,
    /// else every node on the host.
    pub fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check_count(inputs.len())?;
        if let Some(runner) = RUNNER.with(|r| r.get()) {
            let ran = runner.run(&self.graph, inputs).map_err(|e| OpError::invalid(format!("subgraph '{}' ('{}'): {e}", self.attr, self.graph.name)))?;
            if let Some(outs) = ran {
                return Ok(outs);
            }
        }
        let types: Vec<TensorType> = inputs.iter().map(|t| TensorType::of(t)).collect();
        let values: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        let s = infer::specialize(&self.graph, &self.ops, &self.order, &types, &values, Limits::default()).map_err(|e| self.error(e.into_error()))?;
        if let Some(step) = s.steps.first() {
            let n = &self.graph.nodes[step.node];
            return Err(OpError::Unsupported(format!(
                "subgraph '{}': node '{}' ({}) has no CPU kernel (control-flow bodies run on the host)",
                self.attr, n.name, n.op_type
            )));
        }
        self.graph
            .outputs
            .iter()
            .map(|o| s.constants.get(o).cloned().ok_or_else(|| OpError::invalid(format!("subgraph '{}': output {} was not computed", self.attr, self.graph.values[*o].name))))
            .collect()
    }

    /// Runs `k` applications as one [`chain::chain`] (see there for `feeds`,
    /// `carried_out`, `emitted` and the order of `inputs` and outputs) through this
    /// thread's [`BodyRunner`]. `None`: no runner, a body that cannot be chained, or
    /// one the runner leaves to the host; the caller then runs the applications one by
    /// one.
    pub fn run_chain(&self, k: usize, feeds: &[Feed], carried_out: &[usize], emitted: &[usize], inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
        let Some(runner) = RUNNER.with(|r| r.get()) else { return Ok(None) };
        let chain = {
            let mut chains = self.chains.lock().map_err(|_| OpError::invalid("a body's chain cache was poisoned"))?;
            chains.entry(k).or_insert_with(|| chain::chain(&self.graph, k, feeds, carried_out, emitted).map(Arc::new)).clone()
        };
        let Some(chain) = chain else { return Ok(None) };
        runner.run(&chain, inputs).map_err(|e| OpError::invalid(format!("subgraph '{}' ('{}'), {k} iterations chained: {e}", self.attr, self.graph.name)))
    }

    /// Whether the body returns its condition input unchanged (directly, through
    /// Identity, or a constant true), so that the loop's condition is not data-dependent.
    pub fn keeps_condition(&self) -> bool {
        let g = &self.graph;
        let (Some(&cond_in), Some(&cond_out)) = (g.inputs.get(1), g.outputs.first()) else { return false };
        if cond_out == cond_in {
            return true;
        }
        if let Some(t) = g.initializers.get(&cond_out) {
            return t.len() == 1 && t.to_f64_vec()[0] != 0.0;
        }
        g.nodes.iter().any(|n| n.op_type == "Identity" && n.domain.is_empty() && n.outputs.first() == Some(&cond_out) && n.inputs.first() == Some(&Some(cond_in)))
    }

    fn check_count(&self, n: usize) -> Result<()> {
        if n != self.n_inputs() {
            return Err(OpError::invalid(format!(
                "subgraph '{}' ('{}') takes {} inputs ({} of the enclosing graph), the node gives {n}",
                self.attr,
                self.graph.name,
                self.n_inputs(),
                self.graph.outer_inputs
            )));
        }
        Ok(())
    }
}

/// The value of a boolean (or numeric) scalar condition.
pub(crate) fn truth(t: &Tensor, what: &str) -> Result<bool> {
    if t.len() != 1 {
        return Err(OpError::invalid(format!("{what} must hold one element, got shape {:?}", t.dims())));
    }
    Ok(t.to_f64_vec()[0] != 0.0)
}

/// The index of the first input whose value is not known (0 when all are).
pub(crate) fn first_unknown(inputs: &[Option<Arg>]) -> usize {
    inputs.iter().position(|a| a.as_ref().is_some_and(|a| a.value.is_none())).unwrap_or(0)
}

/// The values of all present inputs, when every one is known.
pub(crate) fn all_values<'a>(inputs: &[Option<Arg<'a>>]) -> Option<Vec<Option<&'a Tensor>>> {
    inputs.iter().map(|a| match a { None => Some(None), Some(a) => a.value.map(Some) }).collect()
}

/// The results of the last evaluation on constant inputs, so that inference (which must
/// run a Loop to know its output shapes) and folding right after it run the body once.
/// Never for kernels' run-time inputs: those may be buffers that later runs rewrite.
#[derive(Debug, Default)]
pub(crate) struct Memo(Mutex<Option<(Vec<Option<Tensor>>, Vec<Tensor>)>>);

impl Memo {
    pub fn get_or(&self, inputs: &[Option<&Tensor>], run: impl FnOnce() -> Result<Vec<Tensor>>) -> Result<Vec<Tensor>> {
        let key: Vec<Option<Tensor>> = inputs.iter().map(|t| t.cloned()).collect();
        if let Ok(g) = self.0.lock() {
            if let Some((k, v)) = g.as_ref() {
                if *k == key {
                    return Ok(v.clone());
                }
            }
        }
        let out = run()?;
        if let Ok(mut g) = self.0.lock() {
            *g = Some((key, out.clone()));
        }
        Ok(out)
    }
}

/// Writes `src` into a planned output of the same type (the CPU plan owns outputs); a
/// sequence or optional replaces the output.
pub(crate) fn store(out: &mut Tensor, src: &Tensor, what: &str) -> Result<()> {
    if src.composite().is_some() {
        // A sequence or optional is a value of the host, not bytes of a planned buffer.
        *out = src.clone();
        return Ok(());
    }
    if out.dtype() != src.dtype() || out.dims() != src.dims() {
        return Err(OpError::invalid(format!("{what} is {}{:?}, but its planned type is {}{:?}", src.dtype(), src.dims(), out.dtype(), out.dims())));
    }
    out.bytes_mut().copy_from_slice(src.bytes());
    Ok(())
}

/// `dims` split around `axis`: (outer count, length along axis, inner bytes).
fn around(t: &Tensor, axis: usize) -> (usize, usize, usize) {
    let d = t.dims();
    (d[..axis].iter().product(), d[axis], d[axis + 1..].iter().product::<usize>() * t.dtype().size())
}

/// Slice `k` of `t` along `axis`, the axis removed.
pub(crate) fn take(t: &Tensor, axis: usize, k: usize) -> Result<Tensor> {
    let (outer, n, inner) = around(t, axis);
    let mut dims = t.dims().to_vec();
    dims.remove(axis);
    let src = t.bytes();
    let mut bytes = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let at = (o * n + k) * inner;
        bytes.extend_from_slice(&src[at..at + inner]);
    }
    Ok(Tensor::from_bytes(t.dtype(), &dims, &bytes)?)
}

/// The tensors of `parts` (one type) stacked along a new `axis`.
pub(crate) fn stack(parts: &[Tensor], axis: usize, what: &str) -> Result<Tensor> {
    let first = parts.first().ok_or_else(|| OpError::invalid(format!("{what}: nothing to stack")))?;
    if let Some(p) = parts.iter().find(|p| p.dtype() != first.dtype() || p.dims() != first.dims()) {
        return Err(OpError::invalid(format!("{what} changes type between iterations: {}{:?}, then {}{:?}", first.dtype(), first.dims(), p.dtype(), p.dims())));
    }
    if axis > first.rank() {
        return Err(OpError::invalid(format!("{what}: axis {axis} is out of range for rank {}", first.rank() + 1)));
    }
    let mut dims = first.dims().to_vec();
    dims.insert(axis, parts.len());
    let outer: usize = first.dims()[..axis].iter().product();
    let inner = first.bytes().len() / outer.max(1);
    let mut bytes = Vec::with_capacity(first.bytes().len() * parts.len());
    for o in 0..outer {
        for p in parts {
            bytes.extend_from_slice(&p.bytes()[o * inner..(o + 1) * inner]);
        }
    }
    Ok(Tensor::from_bytes(first.dtype(), &dims, &bytes)?)
}

#[cfg(test)]
mod tests;
