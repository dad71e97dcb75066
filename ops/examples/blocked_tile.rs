//! GFLOP/s of one register tile of the channel-blocked convolution kernel on hot data
//! (one thread): `cargo run --release -p kiln-ops --example blocked_tile`.
use kiln_ops::cpu::{BlockedStore, Isa};
use std::time::Instant;

fn main() {
    for isa in Isa::available() {
        for &kc in &[64usize, 576, 1152, 2304, 4608] {
            let (mr, nr) = (isa.mr(), isa.nr());
            let x: Vec<f32> = (0..kc * mr * 8 + 64).map(|i| (i % 7) as f32 * 0.01).collect();
            let xs: [*const f32; 8] = std::array::from_fn(|i| x[8 * i.min(mr - 1)..].as_ptr());
            let offs: Vec<usize> = (0..kc).map(|k| (k / 8) * mr * 8 + k % 8).collect();
            let b: Vec<f32> = (0..kc * nr).map(|i| (i % 5) as f32 * 0.01).collect();
            let bias = vec![0f32; nr];
            let mut c = vec![0f32; mr * 8 * (nr / 8) + 64];
            let out = BlockedStore { block_stride: mr * 8, rows: BlockedStore::CONSECUTIVE, blocks: nr / 8, bias: bias.as_ptr(), residual: false, clamp: Some((0.0, f32::INFINITY)) };
            let reps = 2_000_000_000 / (2 * kc * mr * nr);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    unsafe { isa.tile_rows_blocked(kc, nr, &xs, offs.as_ptr(), b.as_ptr(), c.as_mut_ptr(), &out) };
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!("{isa:?} {mr}x{nr} kc {kc:4}: {:6.1} GFLOP/s", (2 * kc * mr * nr * reps) as f64 / best / 1e9);
        }
    }
}
