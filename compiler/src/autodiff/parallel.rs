//! Data parallelism compiled into the step: each worker runs the same training graph on
//! its rows of a global batch, and `kiln.AllReduce` nodes (summed by the communicator
//! the runtime binds, [`kiln_ops::collective`]) make the workers agree:
//!
//! - the loss: each worker differentiates `rows / global_batch` times its own mean
//!   loss, so the sum over workers is the global batch's mean loss, whatever the
//!   shards' sizes; the reported loss is that sum (every worker sees the same value,
//!   so a non-finite loss stops every worker at the same step);
//! - the gradients: summed over workers in buckets of about `bucket_bytes`, taken in
//!   reverse layer order (the order backward produces them), before clipping and the
//!   finiteness checks, which then see the same values on every worker;
//! - synchronized BatchNormalization: the batch statistics' sums are reduced, so every
//!   worker normalises with the global batch's mean and variance (and its backward,
//!   through the all-reduce's own rule, with the global sums of the gradients).
//!
//! Every worker builds the same sequence of collectives, so they pair up in order.
use super::emit::Emit;
use super::{AutodiffError, Result};
use kiln_graph::ValueId;
use kiln_graph::Attr;
use kiln_ops::collective::{ALL_REDUCE, ALL_REDUCE_START, ALL_REDUCE_WAIT, COMPRESSIBLE, DOMAIN};

/// This worker's part of a data-parallel step.
#[derive(Clone, Debug, PartialEq)]
pub struct DataParallel {
    /// The rows of the global batch this worker trains on (its batch dimension).
    pub rows: usize,
    /// The rows of every worker together.
    pub global_batch: usize,
    /// Gradients are reduced in messages of at least this many bytes (the last one may
    /// be smaller); 0 reduces each gradient on its own.
    pub bucket_bytes: usize,
    /// BatchNormalization in training mode normalises with the global batch's
    /// statistics (else each worker's own, and the running statistics differ between
    /// workers).
    pub sync_batch_norm: bool,
    /// Each bucket's reduction starts as soon as backward has produced it and is waited
    /// for only by the update (`kiln.AllReduceStart` / `kiln.AllReduceWait`), so that it
    /// overlaps the rest of the backward pass; else each bucket is reduced where it is
    /// produced, backward waiting.
    pub overlap: bool,
}

/// PyTorch DistributedDataParallel's default bucket: 25 MB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

impl DataParallel {
    /// The weight of this worker's mean loss in the global mean.
    pub fn weight(&self) -> f64 {
        self.rows as f64 / self.global_batch as f64
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.rows == 0 || self.rows > self.global_batch {
            return Err(AutodiffError::Model(format!("data parallelism: a worker's {} rows must be between 1 and the global batch of {}", self.rows, self.global_batch)));
        }
        Ok(())
    }
}

/// One `kiln.AllReduce` node summing `values` across the workers (one message);
/// `compressible` lets a communicator send them lossily (gradients only).
pub fn all_reduce(e: &mut Emit, values: &[ValueId], compressible: bool) -> Result<Vec<ValueId>> {
    let inputs: Vec<Option<ValueId>> = values.iter().map(|&v| Some(v)).collect();
    e.node(DOMAIN, ALL_REDUCE, &inputs, &[(COMPRESSIBLE, Attr::Int(compressible.into()))], values.len())
}

/// `values` summed across workers by a started reduction and its wait (see
/// [`DataParallel::overlap`]).
fn all_reduce_overlapped(e: &mut Emit, values: &[ValueId]) -> Result<Vec<ValueId>> {
    let inputs: Vec<Option<ValueId>> = values.iter().map(|&v| Some(v)).collect();
    let ticket = e.node(DOMAIN, ALL_REDUCE_START, &inputs, &[(COMPRESSIBLE, Attr::Int(1))], 1)?[0];
    let waited: Vec<Option<ValueId>> = std::iter::once(Some(ticket)).chain(inputs).collect();
    e.node(DOMAIN, ALL_REDUCE_WAIT, &waited, &[], values.len())
}

/// The gradients (in the parameters' order) summed across workers, bucket by bucket in
/// reverse order; returned in the parameters' order.
pub(crate) fn reduce_gradients(e: &mut Emit, grads: &[ValueId], bucket_bytes: usize, overlap: bool) -> Result<Vec<ValueId>> {
    let mut reduced = grads.to_vec();
    let mut bucket: Vec<usize> = vec![];
    let mut bytes = 0;
    for k in (0..grads.len()).rev() {
        bucket.push(k);
        bytes += e.ty(grads[k]).bytes();
        if bytes >= bucket_bytes || k == 0 {
            let values: Vec<ValueId> = bucket.iter().map(|&i| grads[i]).collect();
            // Gradients: a communicator may send them compressed.
            let summed = if overlap { all_reduce_overlapped(e, &values)? } else { all_reduce(e, &values, true)? };
            for (&i, r) in bucket.iter().zip(summed) {
                reduced[i] = r;
            }
            bucket.clear();
            bytes = 0;
        }
    }
    Ok(reduced)
}
