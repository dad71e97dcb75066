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

pub use all_reduce::AllReduce;

/// The domain and op type of the all-reduce node.
pub const DOMAIN: &str = "kiln";
pub const ALL_REDUCE: &str = "AllReduce";

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
}

/// True for ops that talk to other workers: never folded, merged or reordered across
/// each other.
pub fn is_collective(domain: &str, op_type: &str) -> bool {
    domain == DOMAIN && op_type == ALL_REDUCE
}

pub(crate) fn register(r: &mut Registry) {
    all_reduce::register(r, None);
}

/// Binds `comm` to the collective ops of `registry` (a clone of the built-in one, say):
/// sessions created from it reduce through `comm`.
pub fn bind(registry: &mut Registry, comm: Arc<dyn Communicator>) {
    all_reduce::register(registry, Some(comm));
}
