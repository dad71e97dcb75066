//! The stable smoke: every target over its regressions, its seeds and a fixed number of
//! deterministic mutations, each case in a child process (`kiln-fuzz child`) with a
//! memory limit (RLIMIT_AS) and a per-case time limit, so that panics, aborts (out of
//! memory included) and hangs are all caught, named, and written out as reproducers.
//!
//! Protocol: the parent writes every case to a file and lists the files in a manifest;
//! the child runs them from a start index, printing `@@kiln-fuzz B i` before case `i`
//! and `@@kiln-fuzz E i ok|err|panic MESSAGE` after it. A child that dies or stops
//! reporting within the time limit is charged to the case it had begun, and a new
//! child resumes after that case.
//!
//! Known failures (`regressions/known.txt`: `TARGET KEY OWNER CAUSE...`) are reported
//! with their owner and do not fail the smoke. KEY is either the
//! [`crate::rng::content_hash`] of one case, or `~TEXT`: every failure whose outcome
//! (message, and for aborts and panics the innermost frames in Kiln's sources, e.g.
//! `compiler/src/npy.rs`) contains TEXT, which is how mutated cases that hit a known
//! root cause are recognised. A known failure that no longer fails (a hash that
//! passes, a class that matches nothing) fails the smoke, so the list shrinks when a
//! fix lands and nothing stays silently excused.

use crate::corpus::{self, Seed};
use crate::rng::{content_hash, Rng};
use crate::Target;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TAG: &str = "@@kiln-fuzz";

/// How one case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Ok,
    /// A named error: the expected end of malformed input.
    Err,
    Panic(String),
    /// The process died (abort, signal, out of memory) while running the case.
    Crash(String),
    /// No answer within the time limit; where the child was waiting (its main
    /// thread's kernel wait channel, e.g. `fifo_open`).
    Hang(String),
}

impl Outcome {
    pub fn is_failure(&self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Err)
    }
}

/// Limits and sizes of a smoke run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `kiln-fuzz` executable that runs cases.
    pub exe: PathBuf,
    /// Scratch directory (case files, the external-data directory).
    pub work: PathBuf,
    /// Address-space limit of the child, in bytes.
    pub memory_limit: u64,
    /// Time one case may take.
    pub case_timeout: Duration,
    /// Extra environment for the child.
    pub env: Vec<(String, String)>,
}

/// One case of a run: where its bytes are, and what it is.
pub struct Case {
    pub label: String,
    pub path: PathBuf,
    pub hash: String,
}

/// What a target's run found.
pub struct Report {
    pub target: Target,
    pub cases: usize,
    pub errors: usize,
    pub failures: Vec<(usize, Outcome)>,
    pub restarts: usize,
    pub elapsed: Duration,
    pub list: Vec<Case>,
}

/// A line of `regressions/known.txt`.
#[derive(Clone, Debug)]
pub struct Known {
    pub target: String,
    pub hash: String,
    pub owner: String,
    pub cause: String,
}

pub fn known_failures() -> Vec<Known> {
    let text = std::fs::read_to_string(corpus::crate_dir().join("regressions/known.txt")).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut rest = l;
            let mut field = || {
                let t = rest.trim_start();
                let end = t.find(char::is_whitespace).unwrap_or(t.len());
                rest = &t[end..];
                (end > 0).then(|| t[..end].to_string())
            };
            let (target, hash, owner) = (field()?, field()?, field()?);
            Some(Known { target, hash, owner, cause: rest.trim().into() })
        })
        .collect()
}

/// The cases of a target: regressions, checked-in seeds, zoo seeds, then `mutations`
/// deterministic mutations of those seeds no larger than `max_base` bytes (a third of
/// them mutate an earlier mutation again). Duplicate contents run once.
pub fn build_cases(target: Target, zoo_max_model: u64, mutations: usize, max_base: usize, dir: &Path) -> std::io::Result<Vec<Case>> {
    std::fs::create_dir_all(dir)?;
    // Regressions run as they are; only seeds are mutated (a mutated reproducer would
    // mostly find its own root cause again).
    let mut seeds: Vec<Seed> = corpus::regressions(target);
    let n_regressions = seeds.len();
    seeds.extend(corpus::checked_in(target));
    seeds.extend(corpus::model_seeds(&corpus::zoo_dir(), target, zoo_max_model));
    let mut cases = vec![];
    let mut seen = HashSet::new();
    let mut pool: Vec<Vec<u8>> = vec![];
    for (k, s) in seeds.iter().enumerate() {
        let bytes = s.bytes()?;
        let hash = content_hash(&bytes);
        if !seen.insert(hash.clone()) {
            continue;
        }
        let path = match &s.source {
            corpus::Source::File(p) => p.clone(),
            corpus::Source::Bytes(b) => {
                let p = dir.join(&hash);
                std::fs::write(&p, b)?;
                p
            }
        };
        if bytes.len() <= max_base && k >= n_regressions {
            pool.push(bytes);
        }
        cases.push(Case { label: s.label.clone(), path, hash });
    }
    if pool.is_empty() {
        return Ok(cases);
    }
    let mut made: Vec<Vec<u8>> = vec![];
    let base_seed = content_hash(target.name().as_bytes());
    for i in 0..mutations {
        let mut rng = Rng::new(u64::from_str_radix(&base_seed, 16).unwrap_or(0) ^ (i as u64).wrapping_mul(0x9e37_79b9));
        let base = if !made.is_empty() && rng.chance(1, 3) { made[rng.below(made.len())].clone() } else { pool[rng.below(pool.len())].clone() };
        let bytes = target.mutate(&base, &mut rng, max_base.max(base.len()));
        let hash = content_hash(&bytes);
        if seen.insert(hash.clone()) {
            let path = dir.join(&hash);
            std::fs::write(&path, &bytes)?;
            cases.push(Case { label: format!("mutation {i}"), path, hash });
        }
        made.push(bytes);
    }
    Ok(cases)
}

/// Runs the cases in child processes; returns what ended badly.
pub fn run_cases(target: Target, cases: Vec<Case>, config: &Config) -> std::io::Result<Report> {
    let start_time = Instant::now();
    std::fs::create_dir_all(&config.work)?;
    let manifest = config.work.join(format!("{}.manifest", target.name()));
    let mut text = String::new();
    for c in &cases {
        text.push_str(&c.path.display().to_string());
        text.push('\n');
    }
    std::fs::write(&manifest, text)?;
    let ext = config.work.join("ext");
    let mut failures = vec![];
    let mut errors = 0;
    let mut restarts = 0;
    let mut next = 0;
    while next < cases.len() {
        let stderr_path = config.work.join(format!("{}.stderr", target.name()));
        let mut child = Command::new(&config.exe)
            .args(["child", target.name(), &manifest.display().to_string(), &next.to_string()])
            .env("KILN_FUZZ_DIR", &ext)
            .env("KILN_FUZZ_MEMORY_LIMIT", config.memory_limit.to_string())
            .env("RUST_BACKTRACE", "1")
            // Backtraces name the workspace's files relative to the working directory.
            .current_dir(corpus::crate_dir().join(".."))
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path)?)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with(TAG) && tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut current: Option<usize> = None;
        let mut hung = false;
        let mut wait_channel = String::new();
        loop {
            match rx.recv_timeout(config.case_timeout) {
                Ok(line) => {
                    let mut parts = line[TAG.len()..].trim_start().splitn(4, ' ');
                    let (kind, idx) = (parts.next().unwrap_or(""), parts.next().and_then(|i| i.parse::<usize>().ok()));
                    let Some(idx) = idx else { continue };
                    match kind {
                        "B" => current = Some(idx),
                        "E" => {
                            current = None;
                            next = idx + 1;
                            match parts.next().unwrap_or("") {
                                "ok" => {}
                                "err" => errors += 1,
                                _ => failures.push((idx, Outcome::Panic(unescape(parts.next().unwrap_or(""))))),
                            }
                        }
                        _ => {}
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if current.is_some() {
                        hung = true;
                        let wchan = std::fs::read_to_string(format!("/proc/{}/wchan", child.id())).unwrap_or_default();
                        wait_channel = format!("no answer in {:?}, waiting in '{wchan}'", config.case_timeout);
                        child.kill().ok();
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait()?;
        reader.join().ok();
        if let Some(idx) = current {
            let outcome = if hung {
                Outcome::Hang(wait_channel)
            } else {
                let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                Outcome::Crash(format!("{}{}", describe(&status), crash_detail(&stderr)))
            };
            failures.push((idx, outcome));
            next = idx + 1;
            restarts += 1;
        } else if next < cases.len() {
            // The child died between cases (or never started one): a harness problem.
            return Err(std::io::Error::other(format!("the child for {} exited ({}) before case {next}", target.name(), describe(&status))));
        }
    }
    Ok(Report { target, cases: cases.len(), errors, failures, restarts, elapsed: start_time.elapsed(), list: cases })
}

fn describe(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                6 => "SIGABRT (abort, e.g. out of memory)",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                7 => "SIGBUS",
                4 => "SIGILL",
                _ => "a signal",
            };
            return format!("killed by signal {sig}, {name}");
        }
    }
    format!("exited with {status}")
}

/// What a dead child's stderr says: the allocation that failed (or the last message
/// line), and where, as the innermost frames of Kiln's own code.
fn crash_detail(stderr: &str) -> String {
    let message = stderr
        .lines()
        .find(|l| l.contains("memory allocation of"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim_start().starts_with("at ") && !l.trim().is_empty() && !l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit()) && !l.starts_with("note:")))
        .unwrap_or("")
        .trim();
    let frames = kiln_frames(stderr);
    format!(": {message}{}", if frames.is_empty() { String::new() } else { format!(" at {frames}") })
}

/// The first frames of a printed backtrace that lie in Kiln's sources (not the
/// harness), innermost first: `graph/src/tensor.rs:56 < compiler/src/npy.rs:84`.
pub fn kiln_frames(backtrace: &str) -> String {
    let frames: Vec<&str> = backtrace
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("at ./"))
        .filter(|f| !f.starts_with("fuzz-targets/") && !f.starts_with("fuzz/"))
        .map(|f| f.rsplit_once(':').map_or(f, |(a, _)| a))
        .take(3)
        .collect();
    frames.join(" < ")
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn unescape(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\\\", "\\")
}

/// The child: sets its memory limit, then runs the manifest's cases from `start`.
pub fn child_main(target: Target, manifest: &Path, start: usize) -> std::io::Result<()> {
    if let Some(limit) = std::env::var("KILN_FUZZ_MEMORY_LIMIT").ok().and_then(|v| v.parse::<u64>().ok()) {
        set_memory_limit(limit);
    }
    let captured: &'static std::sync::Mutex<Option<String>> = Box::leak(Box::default());
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| info.payload().downcast_ref::<String>().cloned()).unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let frames = kiln_frames(&std::backtrace::Backtrace::force_capture().to_string());
        if let Ok(mut c) = captured.lock() {
            c.get_or_insert(format!("{msg}{at} (in {frames})"));
        }
    }));
    let selftest = std::env::var_os("KILN_FUZZ_SELFTEST").is_some();
    let list = std::fs::read_to_string(manifest)?;
    let out = std::io::stdout();
    for (i, path) in list.lines().enumerate().skip(start) {
        let data = std::fs::read(path)?;
        writeln!(out.lock(), "{TAG} B {i}")?;
        out.lock().flush()?;
        if let Ok(mut c) = captured.lock() {
            *c = None;
        }
        let result = std::panic::catch_unwind(|| {
            if selftest {
                selftest_case(&data)
            } else {
                target.run(&data)
            }
        });
        let line = match result {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(_)) => "err".to_string(),
            Err(_) => format!("panic {}", escape(&captured.lock().ok().and_then(|c| c.clone()).unwrap_or_default())),
        };
        writeln!(out.lock(), "{TAG} E {i} {line}")?;
        out.lock().flush()?;
    }
    Ok(())
}

/// Cases that misbehave on purpose, to check that the runner sees every kind of failure.
fn selftest_case(data: &[u8]) -> Result<(), String> {
    match data {
        b"panic" => panic!("self-test panic"),
        b"abort" => std::process::abort(),
        b"oom" => {
            let v: Vec<u8> = Vec::with_capacity(std::hint::black_box(usize::MAX / 4));
            Err(format!("allocated {}", std::hint::black_box(v).capacity()))
        }
        b"hang" => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        b"err" => Err("a named error".into()),
        _ => Ok(()),
    }
}

fn set_memory_limit(bytes: u64) {
    #[cfg(unix)]
    {
        let lim = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
        // SAFETY: setrlimit reads the struct; lowering our own limit is always allowed.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
    }
}

/// Sorts a report's failures into known (with the owner) and new, writes each new
/// failure's reproducer under `failures_dir/TARGET/HASH`, and lists known failures that
/// now pass. Returns the lines to print and whether the run is a failure.
pub fn judge(report: &Report, known: &[Known], failures_dir: &Path) -> (Vec<String>, bool) {
    let mut lines = vec![];
    let mut bad = false;
    let mine: Vec<&Known> = known.iter().filter(|k| k.target == report.target.name()).collect();
    let by_hash: HashMap<&str, &Known> = mine.iter().filter(|k| !k.hash.starts_with('~')).map(|k| (k.hash.as_str(), *k)).collect();
    let classes: Vec<&Known> = mine.iter().filter(|k| k.hash.starts_with('~')).copied().collect();
    let failed: HashSet<&str> = report.failures.iter().map(|(i, _)| report.list[*i].hash.as_str()).collect();
    let ran: HashSet<&str> = report.list.iter().map(|c| c.hash.as_str()).collect();
    let mut class_hits: HashMap<&str, usize> = HashMap::new();
    for (i, outcome) in &report.failures {
        let case = &report.list[*i];
        let text = format!("{outcome:?}");
        let class = classes.iter().find(|k| text.contains(&k.hash[1..]));
        if let Some(k) = class {
            *class_hits.entry(k.hash.as_str()).or_default() += 1;
        }
        match by_hash.get(case.hash.as_str()).or(class) {
            Some(k) => lines.push(format!("  KNOWN FAILURE (owner: {}) {} {}: {:?}; {}", k.owner, report.target.name(), case.hash, outcome, k.cause)),
            None => {
                bad = true;
                let dir = failures_dir.join(report.target.name());
                let out = dir.join(&case.hash);
                let saved = std::fs::create_dir_all(&dir).and_then(|_| std::fs::copy(&case.path, &out));
                let where_ = if saved.is_ok() { out.display().to_string() } else { case.path.display().to_string() };
                lines.push(format!(
                    "  NEW FAILURE {} ({}): {:?}\n    reproducer: {where_}\n    rerun: cargo run --release -p kiln-fuzz -- run {} {where_}",
                    report.target.name(),
                    case.label,
                    outcome,
                    report.target.name()
                ));
            }
        }
    }
    for k in &classes {
        match class_hits.get(k.hash.as_str()) {
            Some(n) => lines.push(format!("  known failure class {} (owner {}): {n} cases", k.hash, k.owner)),
            None => {
                bad = true;
                lines.push(format!("  FIXED: no case of known failure class {} {} (owner {}) fails any more: delete its line in regressions/known.txt", k.target, k.hash, k.owner));
            }
        }
    }
    for k in by_hash.values() {
        if !ran.contains(k.hash.as_str()) {
            bad = true;
            lines.push(format!("  known failure {} {} has no reproducer in regressions/{}/", k.target, k.hash, k.target));
        } else if !failed.contains(k.hash.as_str()) {
            bad = true;
            lines.push(format!("  FIXED: known failure {} {} (owner {}) now passes: delete its line in regressions/known.txt", k.target, k.hash, k.owner));
        }
    }
    (lines, bad)
}
