//! The CPU backend allocates its intermediate tensors once per runner: a steady-state
//! run allocates only small per-run bookkeeping and the tensors it returns.
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn steady_state_runs_do_not_allocate_intermediates() {
    let graph = kiln_samples::tiny_cnn(128, 10, 3).unwrap();
    let session = Session::new(graph, SessionOptions::device(DeviceChoice::Cpu)).unwrap();
    let x = kiln_samples::Rng::new(1).tensor(&[2, 3, 128, 128], 1.0).unwrap();
    let before = BYTES.load(Ordering::Relaxed);
    session.run(&[("image", &x)]).unwrap(); // specialises and allocates the buffers
    let first = BYTES.load(Ordering::Relaxed) - before;
    session.run(&[("image", &x)]).unwrap();
    let before = BYTES.load(Ordering::Relaxed);
    for _ in 0..3 {
        session.run(&[("image", &x)]).unwrap();
    }
    let steady = (BYTES.load(Ordering::Relaxed) - before) / 3;
    let (_, stats) = session.run_with_stats(&[("image", &x)]).unwrap();
    let memory = stats.memory.expect("CPU runs report their memory plan");
    // The intermediates of this network total several MB; a steady run may allocate
    // step bookkeeping and the returned 2x10 output, not tensors.
    println!("first run allocated {first} bytes, a steady-state run {steady} bytes; intermediates {memory:?}");
    assert!(first as u64 >= memory.planned, "first run allocated only {first} bytes");
    // What remains is bookkeeping (per-step vectors, rayon job records) and kernel
    // workspaces (the gemm crate's packing buffers, the pooling kernels' row buffers per
    // parallel chunk): about 0.27 MB here, against the 1 MB arena that a run allocating
    // its intermediates would add.
    assert!(steady as u64 * 2 < memory.planned, "a steady-state run allocated {steady} bytes (intermediates: {memory:?})");
}
