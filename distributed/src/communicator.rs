//! [`Communicator`]: a transport and an all-reduce algorithm, as the runtime's
//! collective ops see it ([`kiln_ops::collective::Communicator`]). It serialises the
//! transport's use (a session's kernels may call from any thread) and counts what the
//! reductions moved and how long they took.
use crate::{ring, Traffic, Transport};
use std::sync::Mutex;
use std::time::Instant;

/// Which all-reduce to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Baidu's ring over point-to-point messages ([`ring::all_reduce`]).
    Ring,
    /// The engine's own all-reduce (MPI_Allreduce); the ring where the transport has none.
    Native,
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Algorithm, String> {
        match s {
            "ring" => Ok(Algorithm::Ring),
            "mpi" | "native" => Ok(Algorithm::Native),
            _ => Err(format!("unknown all-reduce '{s}' (expected ring or mpi)")),
        }
    }
}

/// What the reductions of a communicator did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommStats {
    /// All-reduce calls.
    pub calls: u64,
    /// Bytes handed to the reductions (the buffers' sizes).
    pub bytes: u64,
    /// Bytes this rank sent and received, counted (the ring's; MPI does not say).
    pub traffic: Traffic,
    /// Seconds spent inside the reductions (waiting for other ranks included).
    pub seconds: f64,
}

pub struct Communicator<T> {
    transport: Mutex<T>,
    algorithm: Algorithm,
    rank: usize,
    size: usize,
    stats: Mutex<CommStats>,
}

impl<T: Transport> Communicator<T> {
    pub fn new(transport: T, algorithm: Algorithm) -> Communicator<T> {
        let (rank, size) = (transport.rank(), transport.size());
        Communicator { transport: Mutex::new(transport), algorithm, rank, size, stats: Mutex::new(CommStats::default()) }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    pub fn stats(&self) -> CommStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with the transport (for collectives the op set does not cover: a
    /// barrier, a maximum over ranks).
    pub fn with_transport<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.transport.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn reduce(&self, data: &mut [f32]) -> crate::Result<Traffic> {
        let t = self.transport.lock().unwrap_or_else(|p| p.into_inner());
        if self.algorithm == Algorithm::Native {
            if let Some(done) = t.native_all_reduce(data) {
                return done.map(|()| Traffic::default());
            }
        }
        ring::all_reduce(&*t, data)
    }
}

impl<T: Transport + Send> kiln_ops::collective::Communicator for Communicator<T> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
        let start = Instant::now();
        let traffic = self.reduce(data).map_err(|e| e.to_string())?;
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.calls += 1;
        s.bytes += 4 * data.len() as u64;
        s.traffic.sent += traffic.sent;
        s.traffic.received += traffic.received;
        s.seconds += start.elapsed().as_secs_f64();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local;
    use kiln_ops::collective::Communicator as _;

    #[test]
    fn sums_and_counts_through_the_op_interface() {
        let out = local::run(3, |t| {
            let comm = Communicator::new(t, Algorithm::Ring);
            let mut v = vec![comm.rank() as f32 + 1.0; 6];
            comm.all_reduce_sum(&mut v).unwrap();
            (v, comm.stats())
        });
        for (v, stats) in out {
            assert_eq!(v, vec![6.0; 6]);
            assert_eq!((stats.calls, stats.bytes), (1, 24));
            assert_eq!(stats.traffic.sent, 2 * 2 * 4 * 2); // 2(N-1) chunks of 2 elements
        }
    }
}
