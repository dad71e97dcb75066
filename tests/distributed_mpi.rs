//! `kiln train --distributed` under mpirun (Open MPI on loopback, ranks as processes):
//! the checkpoints of 1, 2, 3 and 4 ranks, with the ring and with MPI's Allreduce, equal
//! the single-process run's; a rank killed mid-run ends the job with an error naming
//! it, and the last checkpoint still resumes. Built with `--features mpi` only (the
//! test script installs Open MPI and runs it); the in-process equivalence of the same
//! step is tests/distributed.rs.
#![cfg(feature = "mpi")]
mod common;

use common::runs::zero_gradient;
use common::*;
use kiln::runtime::npz;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kiln() -> &'static str {
    env!("CARGO_BIN_EXE_kiln")
}

/// mpirun as root, ranks oversubscribing the cores, on loopback (without the program).
fn mpirun_bare() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "lo"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// `ranks` ranks of kiln.
fn mpirun(ranks: usize) -> Command {
    let mut c = mpirun_bare();
    c.args(["-np", &ranks.to_string()]).arg(kiln());
    c
}

/// `kiln train` of lenet_digits_sgd (PyTorch's hyper-parameters) for `steps` steps.
fn lenet_args(c: &mut Command, steps: u64, checkpoint: &Path) {
    let d = training_dir();
    c.arg("train")
        .arg(d.join("lenet_digits_sgd/model.onnx"))
        .arg("--data")
        .arg(d.join("digits"))
        .args(["--batch", "64", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4", "--threads", "1", "--json"])
        .args(["--steps", &steps.to_string()])
        .arg("--checkpoint")
        .arg(checkpoint);
}

fn run_ok(mut c: Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// The largest relative L2 distance between two checkpoints' values (zero-gradient
/// elements left out, see `zero_gradient`), and where.
fn farthest(a: &Path, b: &Path) -> (f64, String) {
    let (a, b) = (npz::read_file(a).unwrap(), npz::read_file(b).unwrap());
    let mut worst = (0.0, String::new());
    for (n, x) in a.iter().filter(|(n, _)| !n.starts_with("kiln.")) {
        let y = &b.iter().find(|(m, _)| m == n).unwrap_or_else(|| panic!("no '{n}' in the other checkpoint")).1;
        let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
        let noise = zero_gradient("lenet_digits_sgd", n.split(':').next().unwrap_or(n), x.len()).unwrap_or(0..0);
        let keep = |v: &[f64]| -> Vec<f64> { v.iter().enumerate().filter(|(i, _)| !noise.contains(i)).map(|(_, v)| *v).collect() };
        let (x, y) = (keep(&x), keep(&y));
        let diff = x.iter().zip(&y).map(|(p, q)| (p - q) * (p - q)).sum::<f64>().sqrt();
        let norm = y.iter().map(|q| q * q).sum::<f64>().sqrt();
        let e = if norm > 0.0 { diff / norm } else { diff };
        if e > worst.0 {
            worst = (e, n.clone());
        }
    }
    worst
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-dp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn any_rank_count_trains_like_one_process() {
    let dir = scratch("eq");
    let single = dir.join("single.npz");
    let mut c = Command::new(kiln());
    lenet_args(&mut c, 20, &single);
    run_ok(c, "one process");
    // Buckets overlapped with backward or not (the default).
    for (ranks, allreduce, bucket_mb, overlap) in [(1, "ring", "25", true), (2, "ring", "0.01", true), (2, "ring", "0.01", false), (2, "mpi", "25", true), (3, "ring", "0", true), (4, "mpi", "0.01", false), (4, "ring", "0.01", true), (4, "hierarchical", "0.01", false)] {
        let ck = dir.join(format!("{ranks}-{allreduce}-{overlap}.npz"));
        let mut c = mpirun(ranks);
        lenet_args(&mut c, 20, &ck);
        c.args(["--distributed", "--allreduce", allreduce, "--bucket-mb", bucket_mb]);
        if allreduce == "hierarchical" {
            // Two "machines" of two ranks on this one.
            c.args(["--ranks-per-node", "2"]);
        }
        if overlap {
            c.arg("--overlap");
        }
        let out = run_ok(c, &format!("{ranks} ranks ({allreduce})"));
        let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(last["ranks"], ranks, "{out}");
        assert_eq!(out.lines().filter(|l| l.contains("\"final\"")).count(), 1, "only rank 0 reports:\n{out}");
        let (e, at) = farthest(&ck, &single);
        eprintln!("{ranks} ranks, {allreduce}, buckets of {bucket_mb} MB, overlap {overlap}: farthest from one process at '{at}': {e:.2e}");
        assert!(e <= 1e-5, "{ranks} ranks ({allreduce}): '{at}' is {e:.2e} (relative L2) from the single-process run after 20 steps");
    }
    // f16 compression over MPI's 16-bit messages: the error it adds (lenet amplifies
    // rounding; tests/distributed.rs measures it in one process too).
    let ck = dir.join("f16.npz");
    let mut c = mpirun(2);
    lenet_args(&mut c, 20, &ck);
    c.args(["--distributed", "--compress", "f16", "--bucket-mb", "0.01"]);
    run_ok(c, "2 ranks with f16 compression");
    let (e, at) = farthest(&ck, &single);
    eprintln!("2 ranks, ring, f16 compression: farthest from one process at '{at}': {e:.2e}");
    assert!(e > 0.0 && e <= 1e-1, "f16 compression: '{at}' is {e:.2e} from the single-process run");
    std::fs::remove_dir_all(&dir).ok();
}

/// SIGKILL to one rank while the job trains: mpirun ends it within 30 s, saying which
/// rank died, and the checkpoint rank 0 last wrote (written whole, then renamed) resumes.
#[test]
fn a_killed_rank_ends_the_job_and_the_checkpoint_survives() {
    let dir = scratch("kill");
    let ck = dir.join("ck.npz");
    let mut c = mpirun(2);
    lenet_args(&mut c, 10_000_000, &ck);
    c.args(["--distributed", "--checkpoint-every", "20"]).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut job = c.spawn().unwrap();
    let start = Instant::now();
    while !ck.exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint after 120 s");
        assert!(job.try_wait().unwrap().is_none(), "the job ended before its first checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let ranks = String::from_utf8(Command::new("pgrep").args(["-P", &job.id().to_string()]).output().unwrap().stdout).unwrap();
    let victim = ranks.lines().last().unwrap_or_else(|| panic!("mpirun has no rank processes")).trim().to_string();
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-9", &victim]).status().unwrap().success());
    let status = loop {
        if let Some(s) = job.try_wait().unwrap() {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            job.kill().ok();
            panic!("the job still runs 30 s after a rank was killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(job.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    eprintln!("the job ended {:.1} s after the kill: {status}", killed.elapsed().as_secs_f64());
    assert!(!status.success(), "the job succeeded after a rank was killed");
    // Open MPI says "mpirun noticed that process rank R with PID .. exited on signal 9".
    let named = stderr.lines().any(|l| l.contains("process rank") && l.contains("signal 9"));
    assert!(named, "the error should name the killed rank (pid {victim}):\n{stderr}");
    // The checkpoint is whole and resumes (one process, a few more steps).
    let saved = npz::read_file(&ck).unwrap();
    let step = saved.iter().find(|(n, _)| n == "kiln.step").unwrap().1.to_i64_vec().unwrap()[0];
    assert!(step > 0 && step % 20 == 0, "checkpoint at step {step}");
    let mut c = Command::new(kiln());
    lenet_args(&mut c, step as u64 + 3, &dir.join("resumed.npz"));
    c.arg("--resume").arg(&ck);
    let out = run_ok(c, "resuming the checkpoint");
    assert!(out.contains(&format!("\"steps\":{}", step + 3)), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// An error on the ranks (here: a negative bucket size) reaches the
/// user with the rank that met it, and ends the job instead of leaving the others
/// waiting.
#[test]
fn a_rank_error_names_the_rank_and_ends_the_job() {
    let dir = scratch("err");
    let mut c = mpirun(2);
    lenet_args(&mut c, 5, &dir.join("ck.npz"));
    c.args(["--distributed", "--bucket-mb=-1"]);
    let start = Instant::now();
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(30), "the job took {:?} to end", start.elapsed());
    assert!(stderr.contains("kiln: rank ") && stderr.contains("--bucket-mb must be"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Heterogeneous ranks (Open MPI's MPMD form: one rank on the CPU, one on the GPU,
/// lavapipe in CI) with `--balance`: the global batch is shared by the devices'
/// measured speeds, and rank 0's state after 20 steps is one CPU process's within 1e-4.
#[test]
fn a_cpu_rank_and_a_gpu_rank_balance_the_batch_and_train_like_one_process() {
    gpu_env();
    let dir = scratch("hetero");
    let single = dir.join("single.npz");
    let mut c = Command::new(kiln());
    lenet_args(&mut c, 20, &single);
    run_ok(c, "one process");
    let ck = dir.join("hetero.npz");
    let mut c = mpirun_bare();
    for (k, device) in ["cpu", "gpu"].into_iter().enumerate() {
        if k > 0 {
            c.arg(":");
        }
        c.args(["-np", "1"]).arg(kiln());
        lenet_args(&mut c, 20, &ck);
        c.args(["--distributed", "--balance", "--device", device]);
    }
    let out = run_ok(c, "a CPU rank and a GPU rank");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let rows: Vec<u64> = last["rows_per_rank"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).collect();
    assert_eq!(rows.iter().sum::<u64>(), 64, "{out}");
    assert!(rows.iter().all(|&r| r >= 1), "{rows:?}");
    let (e, at) = farthest(&ck, &single);
    eprintln!("a CPU and a GPU rank, rows {rows:?}: farthest from one process at '{at}': {e:.2e}");
    assert!(e <= 1e-4, "CPU + GPU ranks: '{at}' is {e:.2e} (relative L2) from the single-process run after 20 steps");
    std::fs::remove_dir_all(&dir).ok();
}
