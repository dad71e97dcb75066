//! libFuzzer target: import, passes::optimize, Session::new on the CPU and run.
//! The body and the structure-aware mutator are `kiln_fuzz::Target::SessionRun`'s.
#![no_main]
use kiln_fuzz::{rng::Rng, Target};
use libfuzzer_sys::{fuzz_mutator, fuzz_target};

fuzz_target!(|data: &[u8]| {
    let _ = Target::SessionRun.run(data);
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let mut rng = Rng::new(seed as u64);
    // A quarter of the time libFuzzer's own byte-level mutations (with its
    // comparison feedback); otherwise the structure-aware ones.
    if rng.chance(1, 4) {
        return libfuzzer_sys::fuzzer_mutate(data, size, max_size);
    }
    let out = Target::SessionRun.mutate(&data[..size], &mut rng, max_size);
    data[..out.len()].copy_from_slice(&out);
    out.len()
});
