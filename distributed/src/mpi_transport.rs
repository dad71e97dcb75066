//! [`Transport`] over MPI (Open MPI through the `mpi` crate), and MPI's own Allreduce
//! as the baseline the ring is measured against.
//!
//! A rank that panics calls MPI_Abort, which ends the whole job with an error within a
//! second: with Rust's default unwinding the crate's MPI_Finalize never completes and
//! the other ranks wait forever.
use crate::{CommError, Result, Traffic, Transport};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::datatype::Equivalence;

pub struct MpiTransport {
    world: SimpleCommunicator,
    /// The whole job's transport holds MPI's environment (finalised when it drops);
    /// the sub-communicators of [`MpiTransport::two_levels`] do not.
    _universe: Option<mpi::environment::Universe>,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED (checked in `init`): any thread
// may call it, one at a time. The handles are plain values valid on every thread; Kiln
// uses a transport from one thread at a time (a `Communicator` holds it in a mutex).
unsafe impl Send for MpiTransport {}

/// The exit code of a job that a rank's panic aborted.
pub const PANIC_EXIT_CODE: i32 = 70;

impl MpiTransport {
    /// Initialises MPI (once per process) and makes a panic on any rank abort the job.
    pub fn init() -> Result<MpiTransport> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized).ok_or_else(|| CommError::Transport { rank: 0, what: "MPI is already initialised in this process".into() })?;
        let world = universe.world();
        if threading < mpi::Threading::Serialized {
            return Err(CommError::Transport { rank: world.rank() as usize, what: format!("this MPI offers {threading:?} threading; Kiln needs Serialized") });
        }
        let rank = world.rank();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("kiln: rank {rank} panicked; aborting the MPI job");
            abort(PANIC_EXIT_CODE);
        }));
        Ok(MpiTransport { world, _universe: Some(universe) })
    }

    /// The two levels of the hierarchical all-reduce ([`crate::ring::hierarchical_all_reduce`]):
    /// the ranks of this machine (those sharing memory, MPI_COMM_TYPE_SHARED; or each
    /// `per_node` consecutive ranks, to try two levels on one machine), and the ranks of
    /// the same local index on every machine. Every machine must hold as many ranks.
    pub fn two_levels(&self, per_node: Option<usize>) -> Result<(MpiTransport, MpiTransport)> {
        use mpi::topology::Color;
        let rank = self.world.rank();
        let fail = |what: String| CommError::Transport { rank: rank as usize, what };
        let local = match per_node {
            Some(0) => return Err(fail("ranks per machine must be at least 1".into())),
            Some(g) => self.world.split_by_color_with_key(Color::with_value(rank / g as i32), rank).ok_or_else(|| fail("cannot split the ranks by machine".into()))?,
            None => self.world.split_shared(rank),
        };
        let (size, mut least, mut most) = (local.size(), 0, 0);
        self.world.all_reduce_into(&size, &mut least, SystemOperation::min());
        self.world.all_reduce_into(&size, &mut most, SystemOperation::max());
        if least != most {
            return Err(fail(format!("machines hold {least} to {most} ranks; the hierarchical all-reduce needs as many ranks on each")));
        }
        let cross = self.world.split_by_color_with_key(Color::with_value(local.rank()), rank).ok_or_else(|| fail("cannot split the ranks across machines".into()))?;
        Ok((MpiTransport { world: local, _universe: None }, MpiTransport { world: cross, _universe: None }))
    }

    /// MPI_Sendrecv of `send` to rank `to` and `recv.len()` elements from rank `from`.
    fn exchange<E: Equivalence>(&self, send: &[E], to: usize, recv: &mut [E], from: usize) -> Result<()> {
        let (to_p, from_p) = (self.world.process_at_rank(to as i32), self.world.process_at_rank(from as i32));
        let status = mpi::point_to_point::send_receive_into(send, &to_p, recv, &from_p);
        let got = status.count(E::equivalent_datatype()) as usize;
        if got != recv.len() {
            return Err(CommError::Buffer { rank: self.rank(), len: recv.len(), what: format!("rank {from} sent {got} elements") });
        }
        Ok(())
    }

    pub fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// Sums `send` over every rank into `recv` with MPI's Allreduce (the baseline).
    pub fn mpi_all_reduce(&self, send: &[f32], recv: &mut [f32]) -> Result<Traffic> {
        if send.len() != recv.len() {
            return Err(CommError::Buffer { rank: self.rank(), len: recv.len(), what: format!("the input has {} elements", send.len()) });
        }
        self.world.all_reduce_into(send, recv, SystemOperation::sum());
        // MPI does not say what it moved.
        Ok(Traffic::default())
    }

    pub fn barrier(&self) {
        self.world.barrier();
    }

    /// The largest of every rank's `value` (for timings: the slowest rank's).
    pub fn max_over_ranks(&self, value: f64) -> f64 {
        let mut out = 0.0;
        self.world.all_reduce_into(&value, &mut out, SystemOperation::max());
        out
    }
}

/// Ends the whole MPI job with `code` (every rank), after this rank's error: the others
/// would otherwise wait for it in their next collective forever. Call only after
/// [`MpiTransport::init`].
pub fn abort(code: i32) -> ! {
    // SAFETY: MPI is initialised (callers hold or held a transport) and the world
    // communicator is valid until finalisation; MPI_Abort does not return.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}

impl Transport for MpiTransport {
    fn native_all_reduce(&self, data: &mut [f32]) -> Option<Result<()>> {
        let send = data.to_vec();
        Some(self.mpi_all_reduce(&send, data).map(|_| ()))
    }
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn send_receive(&self, send: &[f32], to: usize, recv: &mut [f32], from: usize) -> Result<()> {
        self.exchange(send, to, recv, from)
    }
    fn send_receive_halves(&self, send: &[u16], to: usize, recv: &mut [u16], from: usize) -> Result<()> {
        self.exchange(send, to, recv, from)
    }
}
