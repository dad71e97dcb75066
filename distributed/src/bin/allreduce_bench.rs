//! All-reduce bandwidth: the ring over MPI point-to-point messages against MPI's own
//! Allreduce, f32 sums, message sizes from 4 KB to 256 MB. Run under mpirun:
//!
//!     mpirun -np 4 --oversubscribe target/release/kiln-allreduce-bench [--max-mb 256] [--json]
//!
//! `--fail-rank R` makes rank R panic before the first reduction: the job must end
//! with an error naming the rank (the test of the panic hook), never hang.
//! `--ranks-per-node G` also times the hierarchical all-reduce with G consecutive ranks
//! taken as one machine (0: the ranks that share memory), checked equal to MPI's.
//! `--hang-rank R` makes rank R sleep forever instead: the others' watchdog
//! (`--timeout S`, default 5) must end the job, naming the rank that waits.
//!
//! Each size: one warm-up, then repeated ops (a barrier before each, the input copied
//! outside the timing); the time of an op is the slowest rank's mean. Algorithm
//! bandwidth = bytes / time. The ring's bytes per rank are counted as they are sent and
//! printed against the 2(N-1)/N of the buffer that the algorithm promises. Both results
//! are checked equal (integer-valued data, so exact).
use kiln_distributed::mpi_transport::MpiTransport;
use kiln_distributed::{ring, Transport};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<usize>().ok());
    let max_mb = flag("--max-mb").unwrap_or(256);
    let fail_rank = flag("--fail-rank");
    let t = match MpiTransport::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("kiln-allreduce-bench: {e}");
            std::process::exit(2);
        }
    };
    let (n, rank) = (t.size(), t.rank());
    if fail_rank == Some(rank) {
        panic!("rank {rank} fails on purpose (--fail-rank)");
    }
    if let Some(hang) = flag("--hang-rank") {
        use kiln_ops::collective::Communicator as _;
        let timeout = std::time::Duration::from_secs(flag("--timeout").unwrap_or(5) as u64);
        let comm = kiln_distributed::Communicator::new(t, kiln_distributed::Algorithm::Ring).with_watchdog(timeout, |m| {
            eprintln!("kiln-allreduce-bench: {m}; ending the job");
            kiln_distributed::mpi_transport::abort(75)
        })
        .expect("a watchdog thread");
        if rank == hang {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        let mut v = vec![1.0f32; 1024];
        comm.all_reduce_sum(&mut v).expect("all-reduce");
        unreachable!("rank {hang} never takes part");
    }
    let levels = flag("--ranks-per-node").map(|g| t.two_levels(if g == 0 { None } else { Some(g) }).expect("two levels"));
    let mut bytes = 4096usize;
    if rank == 0 && !json {
        println!("{n} ranks; algbw GB/s (time per op); ring bytes sent per rank / buffer (2(N-1)/N = {:.3})", 2.0 * (n as f64 - 1.0) / n as f64);
        let hier = if levels.is_some() { " hierarchical |" } else { "" };
        println!("| size | MPI Allreduce | ring | ring/MPI | ring bytes sent / buffer |{hier}");
        println!("|---|---|---|---|---|{}", if levels.is_some() { "---|" } else { "" });
    }
    while bytes <= max_mb << 20 {
        let len = bytes / 4;
        let input: Vec<f32> = (0..len).map(|i| ((i * 7 + rank * 13) % 31) as f32).collect();
        let mut out = vec![0f32; len];
        let mut work = input.clone();
        let iters = match bytes {
            b if b <= 64 << 10 => 200,
            b if b <= 1 << 20 => 50,
            b if b <= 4 << 20 => 20,
            b if b <= 16 << 20 => 10,
            b if b <= 64 << 20 => 5,
            _ => 3,
        };
        // 0: MPI's Allreduce, 1: the ring, 2: the hierarchical all-reduce.
        let time = |op: u8, out: &mut Vec<f32>, work: &mut Vec<f32>| -> (f64, u64) {
            let mut total = 0.0;
            let mut sent = 0;
            for k in 0..iters + 1 {
                work.copy_from_slice(&input);
                t.barrier();
                let start = Instant::now();
                match (op, &levels) {
                    (1, _) => sent = ring::all_reduce(&t, work).expect("ring all-reduce").sent,
                    (2, Some((local, cross))) => sent = ring::hierarchical_all_reduce(local, cross, work, ring::Wire::F32).expect("hierarchical all-reduce").sent,
                    _ => {
                        t.mpi_all_reduce(&input, out).expect("MPI all-reduce");
                    }
                }
                if k > 0 {
                    total += start.elapsed().as_secs_f64();
                }
            }
            (t.max_over_ranks(total / iters as f64), sent)
        };
        let (mpi_s, _) = time(0, &mut out, &mut work);
        let hier_s = match levels {
            Some(_) => {
                let (s, _) = time(2, &mut out, &mut work);
                assert_eq!(work, out, "rank {rank}: the hierarchical sums differ from MPI's at {bytes} bytes");
                Some(s)
            }
            None => None,
        };
        let (ring_s, sent) = time(1, &mut out, &mut work);
        assert_eq!(work, out, "rank {rank}: the ring's sums differ from MPI's at {bytes} bytes");
        // Counted bytes: 2(N-1)/N of the buffer, up to one element per chunk sent.
        let promised = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64;
        assert!((sent as f64 - promised).abs() <= 8.0 * n as f64, "rank {rank}: the ring sent {sent} bytes of a {bytes}-byte buffer, {promised} promised");
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        if rank == 0 {
            let ratio = sent as f64 / bytes as f64;
            if json {
                let hier = hier_s.map(|h| format!(", \"hier_gbs\": {:.4}, \"hier_us\": {:.2}", gbs(h), h * 1e6)).unwrap_or_default();
                println!(
                    "{{\"ranks\": {n}, \"bytes\": {bytes}, \"mpi_gbs\": {:.4}, \"ring_gbs\": {:.4}, \"mpi_us\": {:.2}, \"ring_us\": {:.2}{hier}, \"ring_sent_bytes\": {sent}, \"ring_sent_ratio\": {ratio:.4}}}",
                    gbs(mpi_s),
                    gbs(ring_s),
                    mpi_s * 1e6,
                    ring_s * 1e6
                );
            } else {
                let size = if bytes >= 1 << 20 { format!("{} MB", bytes >> 20) } else { format!("{} KB", bytes >> 10) };
                let hier = hier_s.map(|h| format!(" {:.2} ({:.0} us) |", gbs(h), h * 1e6)).unwrap_or_default();
                println!("| {size} | {:.2} ({:.0} us) | {:.2} ({:.0} us) | {:.2}x | {ratio:.3} |{hier}", gbs(mpi_s), mpi_s * 1e6, gbs(ring_s), ring_s * 1e6, mpi_s / ring_s);
            }
        }
        bytes *= 4;
    }
}
