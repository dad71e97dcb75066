//! Multi-rank runs under `mpirun` (Open MPI, on loopback): the ring's sums equal MPI's
//! Allreduce bit for bit and move the bytes the algorithm promises, on 2, 3 and 4
//! ranks; a rank that panics ends the job with an error naming it, within seconds; a
//! rank that hangs trips the others' watchdog, which ends the job.
#![cfg(feature = "mpi")]
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn mpirun(np: usize, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["120", "mpirun", "--oversubscribe", "-np", &np.to_string(), env!("CARGO_BIN_EXE_kiln-allreduce-bench")])
        .args(args)
        // Open MPI refuses to run as root without these (CI runs as root).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("mpirun (install openmpi-bin)");
    (out, start.elapsed())
}

#[test]
fn the_ring_equals_mpi_allreduce_and_moves_two_n_minus_one_over_n() {
    for np in [2, 3, 4] {
        let (out, _) = mpirun(np, &["--max-mb", "1", "--json"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{np} ranks: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(lines.len(), 5, "4 KB to 1 MB: {stdout}");
        let want = 2.0 * (np as f64 - 1.0) / np as f64;
        for l in lines {
            let ratio: f64 = l.split("\"ring_sent_ratio\": ").nth(1).and_then(|r| r.trim_end_matches('}').trim().parse().ok()).unwrap();
            assert!((ratio - want).abs() < 1e-2, "{np} ranks: {l}");
        }
    }
}

#[test]
fn a_rank_that_panics_ends_the_job_naming_it() {
    let (out, took) = mpirun(3, &["--max-mb", "1", "--fail-rank", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the job must fail");
    assert_ne!(out.status.code(), Some(124), "the job hung until the timeout: {stderr}");
    assert!(stderr.contains("rank 1 panicked"), "{stderr}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_rank_that_hangs_trips_the_watchdog() {
    let (out, took) = mpirun(3, &["--hang-rank", "1", "--timeout", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the job must fail");
    assert_ne!(out.status.code(), Some(124), "the job hung until the timeout: {stderr}");
    assert!(stderr.contains("has waited") && stderr.contains("a rank hangs"), "{stderr}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// The hierarchical all-reduce under MPI (4 ranks as 2 machines of 2, and 6 as 3 of 2)
/// sums exactly what MPI's Allreduce sums (the benchmark asserts it on every rank).
#[test]
fn the_hierarchical_all_reduce_equals_mpi_allreduce() {
    for (np, per) in [(4, "2"), (6, "2")] {
        let (out, _) = mpirun(np, &["--max-mb", "1", "--json", "--ranks-per-node", per]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{np} ranks: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().filter(|l| l.contains("hier_gbs")).count(), 5, "{stdout}");
    }
}
