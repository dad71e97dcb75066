//! Collective operations: values summed across the workers of a data-parallel run.
//!
//! The graph says *what* is reduced (`kiln.AllReduce` nodes, which the training
//! compiler puts on the gradients and inside synchronized BatchNormalization); a
//! [`Communicator`] bound into the registry says *how* (a ring over MPI, MPI's own
//! Allreduce, threads in one process). The built-in registry knows the op's types but
//! has no communicator: running it there is an error that says so.
use crate::Registry;
use std::sync::Arc;

mod all_reduce;
mod started;

pub use all_reduce::AllReduce;

/// The domain and op types of the collective nodes.
pub const DOMAIN: &str = "kiln";
pub const ALL_REDUCE: &str = "AllReduce";
/// The split form, which lets the work between them overlap the reduction:
/// `AllReduceStart(x...) -> ticket` hands the values over and returns at once;
/// `AllReduceWait(ticket, x...) -> sum...` waits for the sums (the `x` there give the
/// outputs' types only). Runtimes schedule starts as early and waits as late as the
/// graph allows ([`crate::Schedule`]).
pub const ALL_REDUCE_START: &str = "AllReduceStart";
pub const ALL_REDUCE_WAIT: &str = "AllReduceWait";
/// The attribute (int, default 0) of AllReduce and AllReduceStart that marks values a
/// communicator may send compressed (gradients; never statistics or the loss).
pub const COMPRESSIBLE: &str = "compressible";

/// What a collective node needs from the workers' engine. Every worker calls the same
/// collectives in the same order (they run the same graph); an implementation may rely
/// on that.
pub trait Communicator: Send + Sync {
    /// This worker's index, 0..size.
    fn rank(&self) -> usize;
    /// How many workers take part.
    fn size(&self) -> usize;
    /// Replaces `data` on every worker with the elementwise sum over the workers, in an
    /// order that depends on the worker count only (so runs reproduce). An error names
    /// the worker that failed and why.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String>;
    /// [`Communicator::all_reduce_sum`] of values that tolerate a lossy transfer
    /// (gradients: a communicator may compress them); exact by default.
    fn all_reduce_compressible(&self, data: &mut [f32]) -> Result<(), String> {
        self.all_reduce_sum(data)
    }
    /// Starts summing `data` across the workers and returns a ticket for
    /// [`Communicator::wait_all_reduce`] at once, the reduction going on meanwhile
    /// (`compressible`: as [`Communicator::all_reduce_compressible`]). Reductions,
    /// started or not, are carried out in the order they are asked for.
    fn start_all_reduce(&self, data: Vec<f32>, compressible: bool) -> Result<u64, String>;
    /// The sum of a started reduction, once it is done.
    fn wait_all_reduce(&self, ticket: u64) -> Result<Vec<f32>, String>;
}

/// True for ops that talk to other workers: never folded, merged or reordered across
/// each other.
pub fn is_collective(domain: &str, op_type: &str) -> bool {
    domain == DOMAIN && [ALL_REDUCE, ALL_REDUCE_START, ALL_REDUCE_WAIT].contains(&op_type)
}

pub(crate) fn register(r: &mut Registry) {
    all_reduce::register(r, None);
    started::register(r, None);
}

/// Binds `comm` to the collective ops of `registry` (a clone of the built-in one, say):
/// sessions created from it reduce through `comm`.
pub fn bind(registry: &mut Registry, comm: Arc<dyn Communicator>) {
    all_reduce::register(registry, Some(comm.clone()));
    started::register(registry, Some(comm));
}

/// The `compressible` attribute of a node of `op` (the only one it takes).
pub(crate) fn compressible(spec: &crate::NodeSpec, op: &str) -> crate::Result<bool> {
    for (name, value) in &spec.node.attrs {
        match (name.as_str(), value) {
            (COMPRESSIBLE, kiln_graph::Attr::Int(v)) if *v == 0 || *v == 1 => {}
            (COMPRESSIBLE, _) => return Err(crate::OpError::Attr { attr: name.clone(), what: "expected 0 or 1".into() }),
            _ => return Err(crate::OpError::Attr { attr: name.clone(), what: format!("{op} takes only '{COMPRESSIBLE}'") }),
        }
    }
    Ok(matches!(spec.node.attrs.get(COMPRESSIBLE), Some(kiln_graph::Attr::Int(1))))
}

/// The error of a collective run where the registry binds no communicator.
pub(crate) fn unbound(op: &str) -> crate::OpError {
    crate::OpError::Unsupported(format!("kiln.{op} needs a communicator: it runs in data-parallel training (a distributed Trainer, `kiln train --distributed`), whose registry binds one"))
}

/// The f32 inputs `from..` of a collective, checked, as their types.
pub(crate) fn float_inputs(inputs: &[Option<crate::Arg>], from: usize, op: &str) -> crate::Result<Vec<crate::TensorType>> {
    if inputs.len() <= from {
        return Err(crate::OpError::invalid(format!("{op} needs at least one value to sum")));
    }
    inputs[from..]
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let a = a.as_ref().ok_or_else(|| crate::OpError::input(from + i, format!("is missing (every input of {op} is required)")))?;
            if a.dtype() != kiln_graph::DType::F32 || !a.ty.is_tensor() {
                return Err(crate::OpError::input(from + i, format!("{op} sums f32 tensors; found {}", a.ty)));
            }
            Ok(a.ty.clone())
        })
        .collect()
}

/// The inputs `from..` packed into one buffer.
pub(crate) fn pack(inputs: &[Option<&kiln_graph::Tensor>], from: usize) -> crate::Result<Vec<f32>> {
    let mut buf = vec![];
    for i in from..inputs.len() {
        buf.extend_from_slice(crate::cpu::input(inputs, i)?.as_slice::<f32>().map_err(|e| crate::OpError::input(i, e.to_string()))?);
    }
    Ok(buf)
}

/// `buf` cut into the outputs, in order.
pub(crate) fn unpack(buf: &[f32], outputs: &mut [kiln_graph::Tensor]) -> crate::Result<()> {
    let want: usize = outputs.iter().map(|o| o.len()).sum();
    if want != buf.len() {
        return Err(crate::OpError::invalid(format!("the reduction returned {} values for outputs of {want}", buf.len())));
    }
    let mut at = 0;
    for out in outputs.iter_mut() {
        let o = out.as_mut_slice::<f32>()?;
        o.copy_from_slice(&buf[at..at + o.len()]);
        at += o.len();
    }
    Ok(())
}
