//! The stable CI smoke of every fuzz target (see `kiln_fuzz::smoke`): regressions,
//! seeds (checked in and from the zoo) and deterministic mutations, each case in a
//! memory-limited child process with a time limit. New panics, aborts and hangs fail
//! with the reproducer written under the target dir; known ones are listed with their
//! owner; a known failure that passes fails too (delete its line in known.txt).

use kiln_fuzz::smoke::{self, Config, Outcome};
use kiln_fuzz::Target;
use std::path::PathBuf;
use std::time::Duration;

fn config(name: &str) -> Config {
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-fuzz-smoke").join(name);
    let mb: u64 = std::env::var("KILN_FUZZ_MEMORY_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(3072);
    Config {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_kiln-fuzz")),
        work,
        memory_limit: mb << 20,
        case_timeout: Duration::from_secs(10),
        env: vec![],
    }
}

/// Mutations per target: `KILN_FUZZ_SMOKE_SCALE` (default 1) multiplies them.
fn mutations(base: usize) -> usize {
    let scale: f64 = std::env::var("KILN_FUZZ_SMOKE_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1.0);
    (base as f64 * scale) as usize
}

fn smoke(target: Target, zoo_max_model: u64, n: usize, max_base: usize) {
    let zoo = kiln_fuzz::corpus::zoo_dir();
    assert!(zoo.is_dir(), "the model zoo is missing at {} (set KILN_ZOO): the smoke seeds from it", zoo.display());
    let config = config(target.name());
    let cases = smoke::build_cases(target, zoo_max_model, mutations(n), max_base, &config.work.join("cases")).expect("cases");
    assert!(cases.len() > 10, "{}: only {} cases", target.name(), cases.len());
    let report = smoke::run_cases(target, cases, &config).expect("the runner");
    let failures_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-fuzz-failures");
    let (lines, bad) = smoke::judge(&report, &smoke::known_failures(), &failures_dir);
    eprintln!(
        "{}: {} cases ({} named errors, {} failures, {} child restarts) in {:.1} s",
        target.name(),
        report.cases,
        report.errors,
        report.failures.len(),
        report.restarts,
        report.elapsed.as_secs_f64()
    );
    for l in &lines {
        eprintln!("{l}");
    }
    assert!(!bad, "{}: new failures or stale known failures:\n{}", target.name(), lines.join("\n"));
}

#[test]
fn smoke_onnx_import() {
    smoke(Target::OnnxImport, u64::MAX, 4000, 1 << 20);
}

#[test]
fn smoke_artifact_load() {
    smoke(Target::ArtifactLoad, 1 << 20, 3000, 1 << 20);
}

#[test]
fn smoke_npy_read() {
    smoke(Target::NpyRead, 1 << 20, 5000, 1 << 16);
}

#[test]
fn smoke_session_run() {
    smoke(Target::SessionRun, 1 << 20, 8000, 1 << 20);
}

/// The runner itself: each kind of failure is seen and charged to its case, and the
/// cases after a crash still run.
#[test]
fn the_runner_sees_panics_aborts_ooms_and_hangs() {
    let mut config = config("selftest");
    config.case_timeout = Duration::from_secs(3);
    config.memory_limit = 1 << 30;
    config.env.push(("KILN_FUZZ_SELFTEST".into(), "1".into()));
    let dir = config.work.join("cases");
    std::fs::create_dir_all(&dir).unwrap();
    let inputs: [&[u8]; 7] = [b"ok", b"panic", b"err", b"abort", b"oom", b"hang", b"fine"];
    let cases = inputs
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let path = dir.join(i.to_string());
            std::fs::write(&path, b).unwrap();
            smoke::Case { label: i.to_string(), path, hash: i.to_string() }
        })
        .collect();
    let report = smoke::run_cases(Target::NpyRead, cases, &config).unwrap();
    assert_eq!(report.errors, 1);
    let got: Vec<(usize, &str)> = report
        .failures
        .iter()
        .map(|(i, o)| {
            (*i, match o {
                Outcome::Panic(m) if m.contains("self-test panic") => "panic",
                Outcome::Crash(_) => "crash",
                Outcome::Hang(_) => "hang",
                _ => "other",
            })
        })
        .collect();
    assert_eq!(got, vec![(1, "panic"), (3, "crash"), (4, "crash"), (5, "hang")]);
}
