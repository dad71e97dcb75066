//! GFLOP/s of the packed GEMM (each micro-kernel) against the `gemm` crate on
//! convolution-shaped products, one thread: `cargo run --release -p kiln-ops --example packed_gemm`.
use kiln_ops::cpu::Isa;
use kiln_ops::cpu::packed::{Blocking, MatrixRows, PackedA, PackedGemm};
use std::time::Instant;

fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    // (m, n, k): resnet18's 3x3 layers as out-channels x pixels x (in-channels * 9).
    for &(m, n, k) in &[(64, 3136, 576), (128, 784, 1152), (256, 196, 2304), (512, 49, 4608), (128, 512, 128), (32, 256, 144), (32, 144, 256)] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let t = time(|| unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), 1, k as isize, b.as_ptr(), 1, n as isize, 0.0, 1.0, false, false, false, gemm::Parallelism::None)
        });
        print!("{m:4}x{n:5}x{k:5}  gemm crate {:6.1} GFLOP/s", flops / t / 1e9);
        for isa in Isa::available() {
            let packed = PackedA::pack(isa, &a, m, k);
            for kc in [128, 256, 512] {
                let g = PackedGemm::new(&packed, n, Blocking { kc, mc: m, nc: 256 });
                let (mb, nb) = g.blocks();
                let t = time(|| {
                    for mi in 0..mb {
                        for ni in 0..nb {
                            unsafe { g.run_block(mi, ni, &MatrixRows { data: &b, ld: n }, c.as_mut_ptr(), n, false, &|_, _| {}) };
                        }
                    }
                });
                print!("  {isa:?}/kc{kc} {:6.1}", flops / t / 1e9);
            }
        }
        println!();
    }
}
