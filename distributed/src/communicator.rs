//! [`Communicator`]: a transport and an all-reduce algorithm, as the runtime's
//! collective ops see it ([`kiln_ops::collective::Communicator`]). It serialises the
//! transport's use (a session's kernels may call from any thread) and counts what the
//! reductions moved and how long they took.
//!
//! Started reductions run on a thread of the communicator's own, one after the other
//! in the order they were started; a blocking reduction asked for meanwhile queues
//! behind them, so every rank performs its reductions in the same order. The thread
//! starts with the first started reduction and is joined when the communicator drops.
//!
//! A watchdog ([`Communicator::with_watchdog`]) notices a reduction that has waited
//! longer than a timeout for the other ranks (one hangs, or died without the engine
//! noticing) and reports it, naming this rank and the neighbour it waits on; the
//! caller decides what to do (the CLI aborts the job).
use crate::ring::{self, Wire};
use crate::{Traffic, Transport};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Which all-reduce to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Baidu's ring over point-to-point messages ([`ring::all_reduce`]).
    Ring,
    /// The engine's own all-reduce (MPI_Allreduce); the ring where the transport has none.
    Native,
    /// Two levels: within each machine, then a ring across machines
    /// ([`ring::hierarchical_all_reduce`]; [`Communicator::hierarchical`]).
    Hierarchical,
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Algorithm, String> {
        match s {
            "ring" => Ok(Algorithm::Ring),
            "mpi" | "native" => Ok(Algorithm::Native),
            "hierarchical" => Ok(Algorithm::Hierarchical),
            _ => Err(format!("unknown all-reduce '{s}' (expected ring, mpi or hierarchical)")),
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
    /// Seconds the callers were blocked: in blocking reductions, and waiting for
    /// started ones. `seconds - blocked` of the reductions' time was hidden behind
    /// other work.
    pub blocked: f64,
}

/// The transport and the counters, shared with the reduction thread.
struct Shared<T> {
    /// The two levels of the hierarchical algorithm (dropped before the transport, whose
    /// drop may finalise the engine).
    levels: Option<Mutex<(T, T)>>,
    transport: Mutex<T>,
    algorithm: Algorithm,
    stats: Mutex<CommStats>,
    /// Started reductions the thread has not finished.
    in_flight: AtomicUsize,
    /// The reduction under way: when it began and its length.
    busy: Mutex<Option<(Instant, usize)>>,
}

type Reply = Sender<Result<Vec<f32>, String>>;

/// A queued reduction: the values, how they travel, where the sum goes.
type Job = (Vec<f32>, Wire, Reply);

/// The reduction thread, once started.
struct Background {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

pub struct Communicator<T> {
    shared: Arc<Shared<T>>,
    rank: usize,
    size: usize,
    background: Mutex<Option<Background>>,
    /// Started reductions not yet waited for, by ticket.
    pending: Mutex<HashMap<u64, Receiver<Result<Vec<f32>, String>>>>,
    next_ticket: Mutex<u64>,
    /// The watchdog's thread, stopped by dropping the sender.
    watchdog: Option<(Sender<()>, JoinHandle<()>)>,
    /// How compressible values travel (f16: compressed).
    wire: Wire,
}

fn lock<X>(m: &Mutex<X>) -> std::sync::MutexGuard<'_, X> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T: Transport> Shared<T> {
    /// Sums `data` in place, the ring's values travelling as `wire` says.
    fn reduce(&self, data: &mut [f32], wire: Wire) -> Result<(), String> {
        if data.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        *lock(&self.busy) = Some((start, data.len()));
        let traffic = {
            let t = lock(&self.transport);
            let native = if self.algorithm == Algorithm::Native { t.native_all_reduce(data) } else { None };
            match (native, &self.levels) {
                (Some(done), _) => done.map(|()| Traffic::default()),
                (None, Some(levels)) => {
                    let levels = lock(levels);
                    ring::hierarchical_all_reduce(&levels.0, &levels.1, data, wire)
                }
                (None, None) => ring::all_reduce_on(&*t, data, wire),
            }
        }
        .map_err(|e| e.to_string());
        *lock(&self.busy) = None;
        let traffic = traffic?;
        let mut s = lock(&self.stats);
        s.calls += 1;
        s.bytes += 4 * data.len() as u64;
        s.traffic.sent += traffic.sent;
        s.traffic.received += traffic.received;
        s.seconds += start.elapsed().as_secs_f64();
        Ok(())
    }
}

impl<T: Transport + Send + 'static> Communicator<T> {
    /// A communicator over `transport`; [`Algorithm::Hierarchical`] needs
    /// [`Communicator::hierarchical`] (here it falls back to the ring).
    pub fn new(transport: T, algorithm: Algorithm) -> Communicator<T> {
        Communicator::build(transport, algorithm, None)
    }

    /// The hierarchical all-reduce over the job's `world` transport and its two levels:
    /// `local` (the ranks of this machine) and `cross` (the ranks of the same local
    /// index on every machine).
    pub fn hierarchical(world: T, local: T, cross: T) -> Communicator<T> {
        Communicator::build(world, Algorithm::Hierarchical, Some((local, cross)))
    }

    fn build(transport: T, algorithm: Algorithm, levels: Option<(T, T)>) -> Communicator<T> {
        let (rank, size) = (transport.rank(), transport.size());
        Communicator {
            shared: Arc::new(Shared {
                levels: levels.map(Mutex::new),
                transport: Mutex::new(transport),
                algorithm,
                stats: Mutex::new(CommStats::default()),
                in_flight: AtomicUsize::new(0),
                busy: Mutex::new(None),
            }),
            rank,
            size,
            background: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            next_ticket: Mutex::new(0),
            watchdog: None,
            wire: Wire::F32,
        }
    }

    /// Sends the ring's compressible values (gradients) as f16 (half the bytes, summed
    /// in f32; see [`Wire::F16`]); MPI's own all-reduce ([`Algorithm::Native`]) stays in
    /// f32.
    pub fn with_f16_wire(mut self) -> Communicator<T> {
        self.wire = Wire::F16;
        self
    }

    /// How values of a reduction travel.
    fn wire_for(&self, compressible: bool) -> Wire {
        if compressible {
            self.wire
        } else {
            Wire::F32
        }
    }

    /// Watches every reduction: one that has waited more than `timeout` for the other
    /// ranks calls `on_timeout` once with a message naming this rank and the rank it
    /// waits on (the ring's left neighbour). Fails only when the thread cannot start.
    pub fn with_watchdog(mut self, timeout: std::time::Duration, on_timeout: impl Fn(String) + Send + 'static) -> crate::Result<Communicator<T>> {
        let shared = self.shared.clone();
        let (rank, size) = (self.rank, self.size);
        let (stop, stopped) = channel::<()>();
        let tick = (timeout / 10).clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(1));
        let thread = std::thread::Builder::new()
            .name(format!("kiln-watchdog-{rank}"))
            .spawn(move || {
                // Wakes every tick until the communicator drops (the sender goes).
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    let late = lock(&shared.busy).filter(|(since, _)| since.elapsed() > timeout);
                    if let Some((since, len)) = late {
                        on_timeout(format!(
                            "rank {rank}: an all-reduce of {len} values has waited {:.0} s for the other ranks (rank {} sends to it next): a rank hangs or has died",
                            since.elapsed().as_secs_f64(),
                            (rank + size - 1) % size
                        ));
                        return;
                    }
                }
            })
            .map_err(|e| crate::CommError::Transport { rank, what: format!("cannot start the watchdog thread: {e}") })?;
        self.watchdog = Some((stop, thread));
        Ok(self)
    }

    pub fn stats(&self) -> CommStats {
        *lock(&self.shared.stats)
    }

    /// Queues a reduction on the background thread (starting it first).
    fn enqueue(&self, data: Vec<f32>, compressible: bool) -> Result<Receiver<Result<Vec<f32>, String>>, String> {
        let mut bg = lock(&self.background);
        if bg.is_none() {
            let (jobs, queue) = channel::<Job>();
            let shared = self.shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kiln-allreduce-{}", self.rank))
                .spawn(move || {
                    for (mut data, wire, reply) in queue {
                        let summed = shared.reduce(&mut data, wire).map(|()| data);
                        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                        // The caller may have given up waiting; nothing to do then.
                        let _ = reply.send(summed);
                    }
                })
                .map_err(|e| format!("rank {}: cannot start the reduction thread: {e}", self.rank))?;
            *bg = Some(Background { jobs, thread });
        }
        let (reply, answer) = channel();
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let job = (data, self.wire_for(compressible), reply);
        bg.as_ref().expect("started above").jobs.send(job).map_err(|_| format!("rank {}: the reduction thread has stopped", self.rank))?;
        Ok(answer)
    }

    /// A reduction the caller waits for: behind any started reductions, so the order
    /// is the same on every rank; with none in flight, here (a hand-over to the thread
    /// costs two wake-ups).
    fn blocking(&self, data: &mut [f32], compressible: bool) -> Result<(), String> {
        if self.size == 1 {
            return Ok(());
        }
        let start = Instant::now();
        if self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            let summed = self.enqueue(data.to_vec(), compressible)?.recv().map_err(|_| format!("rank {}: the reduction thread has stopped", self.rank))??;
            data.copy_from_slice(&summed);
        } else {
            self.shared.reduce(data, self.wire_for(compressible))?;
        }
        self.blocked_for(start);
        Ok(())
    }

    fn blocked_for(&self, start: Instant) {
        lock(&self.shared.stats).blocked += start.elapsed().as_secs_f64();
    }
}

impl<T> Drop for Communicator<T> {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.watchdog.take() {
            drop(stop);
            let _ = thread.join();
        }
        // Stop the reduction thread and join it, so that the transport (MPI's
        // finalisation with it) is dropped on the thread that drops the communicator.
        if let Some(bg) = self.background.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            drop(bg.jobs);
            let _ = bg.thread.join();
        }
    }
}

impl<T: Transport + Send + 'static> kiln_ops::collective::Communicator for Communicator<T> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
        self.blocking(data, false)
    }
    fn all_reduce_compressible(&self, data: &mut [f32]) -> Result<(), String> {
        self.blocking(data, true)
    }
    fn start_all_reduce(&self, data: Vec<f32>, compressible: bool) -> Result<u64, String> {
        let answer = if self.size == 1 {
            // The sum over one worker is its own value: no thread needed.
            let (reply, answer) = channel();
            let _ = reply.send(Ok(data));
            answer
        } else {
            self.enqueue(data, compressible)?
        };
        let mut next = lock(&self.next_ticket);
        let ticket = *next;
        *next += 1;
        lock(&self.pending).insert(ticket, answer);
        Ok(ticket)
    }
    fn wait_all_reduce(&self, ticket: u64) -> Result<Vec<f32>, String> {
        let start = Instant::now();
        let answer = lock(&self.pending).remove(&ticket).ok_or_else(|| format!("rank {}: no started all-reduce has ticket {ticket}", self.rank))?;
        let summed = answer.recv().map_err(|_| format!("rank {}: the reduction thread has stopped", self.rank))?;
        self.blocked_for(start);
        summed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local;
    use kiln_ops::collective::Communicator as _;

    /// Started reductions finish in the order they were started, blocking ones queue
    /// behind them, and a ticket is good once.
    #[test]
    fn started_reductions_keep_their_order() {
        let out = local::run(3, |t| {
            let comm = Communicator::new(t, Algorithm::Ring);
            let r = comm.rank() as f32;
            let a = comm.start_all_reduce(vec![r; 4], false).unwrap();
            let b = comm.start_all_reduce(vec![10.0 * r; 2], true).unwrap();
            let mut c = vec![100.0 * r; 3];
            comm.all_reduce_sum(&mut c).unwrap();
            let (vb, va) = (comm.wait_all_reduce(b).unwrap(), comm.wait_all_reduce(a).unwrap());
            assert!(comm.wait_all_reduce(a).is_err());
            (va, vb, c, comm.stats())
        });
        for (va, vb, c, stats) in out {
            assert_eq!((va, vb, c), (vec![3.0; 4], vec![30.0; 2], vec![300.0; 3]));
            assert_eq!(stats.calls, 3);
            assert!(stats.blocked >= 0.0 && stats.seconds > 0.0);
        }
    }

    /// A rank that comes 1.5 s late trips a 0.3 s watchdog on the others, whose message
    /// names the waiting rank; the late rank's own watchdog stays quiet.
    #[test]
    fn the_watchdog_reports_a_reduction_that_waits_too_long() {
        let out = local::run(2, |t| {
            let (tx, rx) = channel();
            let comm = Communicator::new(t, Algorithm::Ring).with_watchdog(std::time::Duration::from_millis(300), move |m| tx.send(m).unwrap()).unwrap();
            if comm.rank() == 1 {
                std::thread::sleep(std::time::Duration::from_millis(1500));
            }
            let mut v = vec![1.0f32; 8];
            comm.all_reduce_sum(&mut v).unwrap();
            assert_eq!(v, vec![2.0; 8]);
            drop(comm);
            rx.try_recv().ok()
        });
        let m = out[0].as_deref().expect("rank 0's watchdog fired");
        assert!(m.starts_with("rank 0: an all-reduce of 8 values has waited") && m.contains("rank 1 sends"), "{m}");
        assert_eq!(out[1], None);
    }

    /// The hierarchical communicator sums as the ring does (2 machines of 2 ranks).
    #[test]
    fn hierarchical_communicators_sum() {
        let worlds = std::sync::Arc::new(Mutex::new(local::group(4).into_iter().map(Some).collect::<Vec<_>>()));
        let out = local::run_two_level(2, 2, move |rank, l, c| {
            let world = lock(&worlds)[rank].take().unwrap();
            let comm = Communicator::hierarchical(world, l, c);
            let mut v = vec![rank as f32; 5];
            comm.all_reduce_sum(&mut v).unwrap();
            v
        });
        assert!(out.iter().all(|v| v == &vec![6.0; 5]), "{out:?}");
    }

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
