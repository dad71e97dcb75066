//! The CPU worker threads a session's kernels run on.
//!
//! A session's CPU work runs on [`Workers`]: a rayon pool of Kiln's own (never the
//! global pool), so that its thread count is the session's choice
//! (`SessionOptions::threads`, default: one per core) and the floating-point mode is set
//! where its threads start; pools are shared process-wide by configuration. A run is
//! handed to the pool, whose other threads then spin as a gang between the run's
//! parallel loops (`kiln_ops::cpu::gang`: no wake-up per kernel), except a run too
//! small to share out ([`Workers::run_here`]), which stays on the calling thread with the mode set for its duration: it would pay
//! more for the hand-over than for its kernels.
//!
//! Denormals: unless a session asks otherwise, its worker threads flush subnormal
//! results to zero and read subnormal inputs as zero (x86 MXCSR FTZ and DAZ; AArch64
//! FPCR.FZ). Masked softmax rows and decaying activations otherwise produce subnormal
//! floats, which cost some CPUs (Intel cores in particular) about a hundred cycles per
//! operation. onnxruntime offers the same mode as a session option; here it is the
//! default, as the values lost are below 1.2e-38.
use crate::{Result, RuntimeError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// How a session's CPU threads are set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThreadConfig {
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Flush subnormal results to zero and treat subnormal inputs as zero.
    pub denormals_are_zero: bool,
}

impl ThreadConfig {
    /// `threads` workers (`None`: one per core, as the machine reports them).
    pub fn new(threads: Option<usize>, denormals_are_zero: bool) -> Result<ThreadConfig> {
        let threads = match threads {
            Some(0) => return Err(RuntimeError::OutOfRange("a session needs at least 1 CPU thread, got 0".into())),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(ThreadConfig { threads, denormals_are_zero })
    }
}

/// Where a session's CPU work runs (see the module docs).
#[derive(Clone)]
pub struct Workers {
    pool: Arc<rayon::ThreadPool>,
    denormals_are_zero: bool,
}

impl Workers {
    /// The workers for `config`.
    pub fn new(config: ThreadConfig) -> Result<Workers> {
        Ok(Workers { pool: pool(config)?, denormals_are_zero: config.denormals_are_zero })
    }

    /// Workers of a pool of their own, shared with no other session: for sessions that
    /// wait on each other while they run (data-parallel workers in one process, whose
    /// collectives pair up), which one shared pool would run one after the other.
    pub fn private(config: ThreadConfig) -> Result<Workers> {
        Ok(Workers { pool: Arc::new(build_pool(config)?), denormals_are_zero: config.denormals_are_zero })
    }

    /// Runs `f` on the pool (the calling thread waits), with the pool's other threads
    /// held as a gang for `f`'s parallel loops (`kiln_ops::cpu::gang`).
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(|| kiln_ops::cpu::gang(f))
    }

    /// Runs `f` on the calling thread, in the pool's floating-point mode, every kernel
    /// serial (`kiln_ops::cpu::serial`).
    pub fn run_here<R>(&self, f: impl FnOnce() -> R) -> R {
        let _mode = DenormalMode::set(self.denormals_are_zero);
        kiln_ops::cpu::serial(f)
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

/// The calling thread's denormal mode, set for a scope and restored after.
struct DenormalMode(Option<bool>);

impl DenormalMode {
    fn set(on: bool) -> DenormalMode {
        let before = denormals_are_zero();
        if before == Some(on) {
            return DenormalMode(None);
        }
        set_denormals_are_zero(on);
        DenormalMode(before)
    }
}

impl Drop for DenormalMode {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            set_denormals_are_zero(before);
        }
    }
}

/// Whether the calling thread flushes subnormals (None where unknown).
fn denormals_are_zero() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(deprecated)]
        // SAFETY: reads MXCSR.
        let csr = unsafe { std::arch::x86_64::_mm_getcsr() };
        Some(csr & (1 << 15) != 0)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let fpcr: u64;
        // SAFETY: reads FPCR.
        unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) fpcr) };
        Some(fpcr & (1 << 24) != 0)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    None
}

/// The pool for `config`, created on first use and shared by every session with the
/// same configuration.
pub fn pool(config: ThreadConfig) -> Result<Arc<rayon::ThreadPool>> {
    static POOLS: OnceLock<Mutex<HashMap<ThreadConfig, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Mutex::default).lock().map_err(|_| crate::error::poisoned())?;
    if let Some(p) = pools.get(&config) {
        return Ok(p.clone());
    }
    let pool = Arc::new(build_pool(config)?);
    pools.insert(config, pool.clone());
    Ok(pool)
}

fn build_pool(config: ThreadConfig) -> Result<rayon::ThreadPool> {
    let daz = config.denormals_are_zero;
    rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .thread_name(|i| format!("kiln-cpu-{i}"))
        .start_handler(move |_| set_denormals_are_zero(daz))
        .build()
        .map_err(|e| RuntimeError::Unsupported { node: "the session's CPU threads".into(), what: format!("cannot start {} worker threads: {e}", config.threads) })
}

/// Sets (or clears) flush-to-zero and denormals-are-zero on the calling thread.
pub fn set_denormals_are_zero(on: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // MXCSR bit 15 is FTZ, bit 6 DAZ (every x86-64 CPU has SSE2, and DAZ since the
        // Pentium 4).
        const BITS: u32 = (1 << 15) | (1 << 6);
        #[allow(deprecated)]
        // SAFETY: only the FTZ and DAZ bits change; SSE is part of x86-64.
        unsafe {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            let csr = _mm_getcsr();
            _mm_setcsr(if on { csr | BITS } else { csr & !BITS });
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        const FZ: u64 = 1 << 24;
        // SAFETY: only FPCR.FZ changes.
        unsafe {
            let mut fpcr: u64;
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr);
            fpcr = if on { fpcr | FZ } else { fpcr & !FZ };
            std::arch::asm!("msr fpcr, {}", in(reg) fpcr);
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = on;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_shared_and_sized() {
        let a = pool(ThreadConfig::new(Some(3), true).unwrap()).unwrap();
        let b = pool(ThreadConfig::new(Some(3), true).unwrap()).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.install(rayon::current_num_threads), 3);
        assert!(ThreadConfig::new(Some(0), true).is_err());
    }

    #[test]
    fn small_runs_stay_on_the_calling_thread_with_its_mode_restored() {
        let w = Workers::new(ThreadConfig::new(Some(2), true).unwrap()).unwrap();
        set_denormals_are_zero(false);
        let caller = std::thread::current().id();
        // Not inlined: the compiler does not order float arithmetic after MXCSR writes.
        #[inline(never)]
        fn halve_tiny() -> f32 {
            std::hint::black_box(f32::MIN_POSITIVE) * 0.5
        }
        let (thread, half) = w.run_here(|| (std::thread::current().id(), halve_tiny()));
        assert_eq!((thread, half), (caller, 0.0));
        assert_eq!(halve_tiny(), f32::MIN_POSITIVE * 0.5, "the mode is restored");
        assert_ne!(w.run(|| std::thread::current().id()), caller);
    }

    #[test]
    fn workers_run_on_a_pool_of_the_configured_size() {
        let other = Workers::new(ThreadConfig::new(Some(3), true).unwrap()).unwrap();
        assert_eq!((other.threads(), other.run(rayon::current_num_threads)), (3, 3));
    }

    #[test]
    fn workers_flush_subnormals_only_when_asked() {
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let half = |p: &rayon::ThreadPool| p.install(|| std::hint::black_box(tiny) * std::hint::black_box(0.5f32));
        let on = pool(ThreadConfig::new(Some(1), true).unwrap()).unwrap();
        let off = pool(ThreadConfig::new(Some(1), false).unwrap()).unwrap();
        assert_eq!(half(&on), 0.0);
        assert_eq!(half(&off), f32::MIN_POSITIVE * 0.5);
    }
}
