//! A gang: the threads of the current rayon pool held for the length of one model run,
//! spinning between parallel loops instead of going to sleep.
//!
//! A model run is a sequence of kernels, most of them a fraction of a millisecond. A
//! parallel loop handed to rayon as a fresh scope wakes the other threads each time;
//! when they slept, the wake-up (a futex call, tens of microseconds on a VM) often lasts
//! longer than the loop, and the calling thread ends up doing all the work itself. In
//! a gang, the other threads of the pool wait in a spin loop for the next loop of the
//! run, claim its chunks from one atomic counter, and go back to waiting; a loop costs
//! about a microsecond to hand out. The spin yields the core after a while without
//! work, so that an oversubscribed machine (tests in parallel) still makes progress.
//!
//! Between loops, a helper also takes jobs queued in the rayon pool, so that kernels
//! that parallelise through rayon itself (the `gemm` crate) still get its thread.
//!
//! [`gang`] holds the gang while `f` runs on the calling thread; [`super::par_ranges`]
//! and [`super::par_chunks_mut`] use it when their caller holds one. Loops started from
//! inside a chunk run serially (the gang is busy with the loop around them).
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The loop the gang works on: chunk `i` of `n` is `f(i)`.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

/// What the calling thread and its helpers share.
struct Shared {
    /// The current job's epoch (high 32 bits), chunk count (16 bits) and next
    /// unclaimed chunk (low 16 bits): one atomic, so that a claim is always of the job
    /// whose count it checked.
    state: AtomicU64,
    job: AtomicPtr<Job<'static>>,
    /// Chunks of the current job finished (by anyone).
    done: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

thread_local! {
    /// The gang the calling thread holds, if any.
    static HELD: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread is running a gang chunk (loops inside run serially).
    static IN_CHUNK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside a gang chunk.
pub(super) fn in_chunk() -> bool {
    IN_CHUNK.with(|c| c.get())
}

/// Runs `f` on the calling thread with the other threads of the current rayon pool
/// held as its gang (see the module docs). Without other threads, or when already
/// inside a gang, `f` just runs.
pub fn gang<R>(f: impl FnOnce() -> R) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0 || !HELD.with(|h| h.get()).is_null() || in_chunk() || super::threads() == 1 {
        return f();
    }
    let shared = Shared {
        state: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    let owner = std::thread::current().id();
    rayon::in_place_scope(|s| {
        for _ in 0..helpers {
            let shared = &shared;
            s.spawn(move |_| {
                // rayon may run a spawned job on the thread waiting for the scope: the
                // holder itself then has nothing to help with.
                if std::thread::current().id() != owner {
                    help(shared);
                }
            });
        }
        struct Release<'a>(&'a Shared);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.stop.store(true, Ordering::Release);
                HELD.with(|h| h.set(std::ptr::null()));
            }
        }
        HELD.with(|h| h.set(&shared));
        let _release = Release(&shared);
        f()
    })
}

/// A helper's life: wait for a new epoch, claim and run its chunks, until `stop`.
fn help(shared: &Shared) {
    let mut idle = 0u32;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if claim_and_run(shared) {
            idle = 0;
            continue;
        }
        // Kernels that parallelise through rayon itself (the `gemm` crate's) queue
        // jobs in the pool: take one if any.
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < 1 << 14 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Claims one chunk of the current job and runs it; false when there was none.
fn claim_and_run(shared: &Shared) -> bool {
    let state = shared.state.load(Ordering::Acquire);
    let (n, next) = ((state >> 16) & 0xFFFF, state & 0xFFFF);
    if next >= n {
        return false;
    }
    if shared
        .state
        .compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return true; // someone else claimed it (or a new job began): look again
    }
    // The claim succeeded at this epoch, so the job read below is this epoch's and
    // stays alive until `done` counts this chunk.
    let job = shared.job.load(Ordering::Acquire);
    // SAFETY: published before the epoch with Release; the holder waits for every
    // chunk of the job to be done before the job goes out of scope.
    let job = unsafe { &*job };
    let was = IN_CHUNK.with(|c| c.replace(true));
    let ok =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(next as usize))).is_ok();
    IN_CHUNK.with(|c| c.set(was));
    if !ok {
        shared.panicked.store(true, Ordering::Release);
    }
    shared.done.fetch_add(1, Ordering::AcqRel);
    true
}

/// The most chunks one loop may have.
pub(super) const MAX_CHUNKS: usize = 0xFFFF;

/// Runs `f(0..n)` on the held gang (the caller takes chunks too) and returns when all
/// are done; `None` when the calling thread holds no gang (or `n > MAX_CHUNKS`).
pub(super) fn run(n: usize, f: &(dyn Fn(usize) + Sync)) -> Option<()> {
    let held = HELD.with(|h| h.get());
    if held.is_null() || in_chunk() || n > MAX_CHUNKS {
        return None;
    }
    // SAFETY: set by `gang` on this thread for the length of its scope, which encloses
    // this call.
    let shared = unsafe { &*held };
    let job = Job { f };
    let epoch = ((shared.state.load(Ordering::Relaxed) >> 32) + 1) & 0xFFFF_FFFF;
    shared.done.store(0, Ordering::Relaxed);
    // SAFETY (lifetime): the job is only read after a claim of this epoch, and every
    // claimed chunk finishes before this function returns.
    shared.job.store(
        &job as *const Job<'_> as *mut Job<'static>,
        Ordering::Release,
    );
    shared
        .state
        .store(epoch << 32 | (n as u64) << 16, Ordering::Release);
    while claim_and_run(shared) {}
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < n {
        spins = spins.saturating_add(1);
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now(); // a helper was descheduled mid-chunk
        }
    }
    if shared.panicked.swap(false, Ordering::AcqRel) {
        panic!("a parallel chunk of a CPU kernel panicked");
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use crate::cpu;
    use std::sync::Mutex;

    #[test]
    fn gang_shares_loops_between_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let ids = Mutex::new(vec![]);
        pool.install(|| {
            cpu::gang(|| {
                for _ in 0..20 {
                    cpu::par_ranges(2, 1 << 20, |a, _| {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        ids.lock().unwrap().push((a, std::thread::current().id()));
                    });
                }
            })
        });
        let ids = ids.into_inner().unwrap();
        let helpers = ids.iter().filter(|(_, t)| *t != ids[0].1).count();
        assert!(helpers > 0, "every chunk ran on one thread: {ids:?}");
        assert_eq!(ids.len(), 40);
    }
}
