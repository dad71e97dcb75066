//! Data parallelism for Kiln's training: gradients reduced across workers.
//!
//! - [`Transport`]: what the reductions need from a distributed engine (rank, size, and a
//!   paired send and receive). MPI (Open MPI through the `mpi` crate, behind the `mpi`
//!   cargo feature) is the engine of real runs ([`mpi_transport`]); [`local`] is an
//!   in-process stand-in for the algorithm's tests only.
//! - [`ring::all_reduce`]: Baidu's ring all-reduce (a scatter-reduce, then an
//!   all-gather, around the ring of ranks), which moves 2(N-1)/N of the buffer's bytes
//!   per rank whatever N is, and counts them.
//!
//! - [`communicator::Communicator`]: a transport and an algorithm (the ring, or the
//!   engine's own all-reduce) behind the interface of Kiln's collective ops
//!   ([`kiln_ops::collective`]), which data-parallel training graphs call.
//!
//! Every reduction sums in a fixed order that depends only on the rank count, never on
//! timing, so a run can be reproduced.
pub mod communicator;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi_transport;
pub mod ring;

/// A failure of the distributed engine, naming the ranks involved.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank}: {what}")]
    Transport { rank: usize, what: String },
    #[error("rank {rank}: buffer of {len} elements: {what}")]
    Buffer { rank: usize, len: usize, what: String },
}

pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// The point-to-point messages a reduction needs.
pub trait Transport {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `send` to rank `to` and receives `recv.len()` elements from rank `from`, at
    /// once (MPI_Sendrecv): neither side waits for the other to post first.
    fn send_receive(&self, send: &[f32], to: usize, recv: &mut [f32], from: usize) -> Result<()>;
    /// The same with 16-bit elements (f16 bit patterns: compressed gradients).
    fn send_receive_halves(&self, send: &[u16], to: usize, recv: &mut [u16], from: usize) -> Result<()>;
    /// The engine's own all-reduce (sum, in place), where it has one.
    fn native_all_reduce(&self, _data: &mut [f32]) -> Option<Result<()>> {
        None
    }
}

/// Bytes one rank sent and received in a reduction, counted as they are handed to the
/// transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub sent: u64,
    pub received: u64,
}

pub use communicator::{Algorithm, CommStats, Communicator};
