//! `kiln-fuzz`: runs fuzz target bodies outside libFuzzer.
//!
//! ```text
//! kiln-fuzz run TARGET FILE...            run inputs in this process, print each outcome
//! kiln-fuzz child TARGET MANIFEST START   the smoke's child process (see kiln_fuzz::smoke)
//! kiln-fuzz seed OUT_DIR [MAX_BYTES]      write libFuzzer corpora OUT_DIR/TARGET/ from the
//!                                         zoo and the ONNX node tests ($KILN_ONNX_TESTS)
//! kiln-fuzz pick-seeds NODE_TESTS OUT_DIR  choose the checked-in seeds (seeds/): per op
//!                                         type, the first node test that runs as a session
//!                                         case, small files only
//! kiln-fuzz triage TARGET FILE...         run inputs like the smoke does (child process,
//!                                         memory and time limits) and print each failure
//!                                         with its known-failure class, if any
//! kiln-fuzz targets                       list the targets
//! ```

use kiln_fuzz::{corpus, rng::content_hash, Target};
use std::path::PathBuf;
use std::process::ExitCode;

fn target(name: Option<&String>) -> Result<Target, String> {
    let name = name.ok_or("missing TARGET")?;
    Target::from_name(name).ok_or_else(|| format!("unknown target '{name}' (targets: {})", Target::ALL.map(|t| t.name()).join(", ")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("child") => target(args.get(1)).and_then(|t| {
            let manifest = PathBuf::from(args.get(2).ok_or("missing MANIFEST")?);
            let start = args.get(3).and_then(|s| s.parse().ok()).ok_or("missing START")?;
            kiln_fuzz::smoke::child_main(t, &manifest, start).map_err(|e| e.to_string())
        }),
        Some("seed") => seed(&args[1..]),
        Some("pick-seeds") => pick_seeds(&args[1..]),
        Some("triage") => triage(&args[1..]),
        Some("targets") => {
            for t in Target::ALL {
                println!("{}", t.name());
            }
            Ok(())
        }
        _ => Err("usage: kiln-fuzz run TARGET FILE... | child TARGET MANIFEST START | seed OUT_DIR [MAX_BYTES] | targets".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln-fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let t = target(args.first())?;
    for file in &args[1..] {
        let data = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        match t.run(&data) {
            Ok(()) => println!("{file}: ok"),
            Err(e) => println!("{file}: error: {e}"),
        }
    }
    Ok(())
}

/// Writes every target's seeds (zoo and node tests) as files named by content hash.
fn seed(args: &[String]) -> Result<(), String> {
    let out = PathBuf::from(args.first().ok_or("missing OUT_DIR")?);
    let max: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    let mut roots = vec![corpus::zoo_dir()];
    if let Some(d) = std::env::var_os("KILN_ONNX_TESTS") {
        roots.push(PathBuf::from(d));
    }
    for t in Target::ALL {
        let dir = out.join(t.name());
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut n = 0;
        let mut seeds = corpus::checked_in(t);
        seeds.extend(corpus::regressions(t));
        for root in &roots {
            seeds.extend(corpus::model_seeds(root, t, max));
        }
        for s in seeds {
            let bytes = s.bytes().map_err(|e| format!("{}: {e}", s.label))?;
            if bytes.len() as u64 > max {
                continue;
            }
            std::fs::write(dir.join(content_hash(&bytes)), &bytes).map_err(|e| e.to_string())?;
            n += 1;
        }
        println!("{}: {n} seeds in {}", t.name(), dir.display());
    }
    Ok(())
}

/// Writes small, op-diverse seeds for every target from the ONNX node tests: per op
/// type, the first test (in name order) whose session case runs, under 16 KiB.
fn pick_seeds(args: &[String]) -> Result<(), String> {
    let tests = PathBuf::from(args.first().ok_or("missing NODE_TESTS")?);
    let out = PathBuf::from(args.get(1).ok_or("missing OUT_DIR")?);
    for t in Target::ALL {
        std::fs::create_dir_all(out.join(t.name())).map_err(|e| e.to_string())?;
    }
    let mut done = std::collections::HashSet::new();
    let (mut n, mut size) = (0, 0usize);
    for dir in corpus::model_dirs(&tests) {
        let meta: serde_json::Value = std::fs::read(dir.join("meta.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let Some(op) = meta.get("op").and_then(|o| o.as_str()) else { continue };
        if done.contains(op) {
            continue;
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let data: Vec<PathBuf> = corpus::files_in(&dir.join("test_data_set_0"));
        let Some(case) = corpus::session_case(&dir.join("model.onnx"), &data) else { continue };
        if case.len() > 16 << 10 || Target::SessionRun.run(&case).is_err() {
            continue;
        }
        done.insert(op.to_string());
        let write = |t: Target, ext: &str, bytes: &[u8]| std::fs::write(out.join(t.name()).join(format!("{name}.{ext}")), bytes).map(|_| bytes.len());
        let model = std::fs::read(dir.join("model.onnx")).map_err(|e| e.to_string())?;
        size += write(Target::SessionRun, "case", &case).map_err(|e| e.to_string())?;
        size += write(Target::OnnxImport, "onnx", &model).map_err(|e| e.to_string())?;
        if n % 3 == 0 {
            if let Some(k) = corpus::compiled_artifact(&dir.join("model.onnx")).filter(|k| k.len() < 16 << 10) {
                size += write(Target::ArtifactLoad, "kiln", &k).map_err(|e| e.to_string())?;
            }
        }
        if let Some(t) = data.iter().find(|p| p.to_string_lossy().contains("input_")).and_then(|p| kiln_compiler::onnx::read_tensor_pb(p).ok()) {
            let npy = kiln_fuzz::npy_reader::write_npy(&t.1);
            if npy.len() < 2048 && n % 2 == 0 {
                size += write(Target::NpyRead, "npy", &npy).map_err(|e| e.to_string())?;
            }
        }
        n += 1;
    }
    println!("{n} op types, {size} bytes of seeds in {}", out.display());
    Ok(())
}

/// Runs files through the smoke's runner and sorts the failures by known class.
fn triage(args: &[String]) -> Result<(), String> {
    use kiln_fuzz::smoke;
    let t = target(args.first())?;
    let cases = args[1..]
        .iter()
        .map(|f| {
            let bytes = std::fs::read(f).map_err(|e| format!("{f}: {e}"))?;
            Ok(smoke::Case { label: f.clone(), path: PathBuf::from(f).canonicalize().map_err(|e| e.to_string())?, hash: content_hash(&bytes) })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let config = smoke::Config {
        exe,
        work: std::env::temp_dir().join(format!("kiln-fuzz-triage-{}", std::process::id())),
        memory_limit: 3 << 30,
        case_timeout: std::time::Duration::from_secs(10),
        env: vec![],
    };
    let report = smoke::run_cases(t, cases, &config).map_err(|e| e.to_string())?;
    let known = smoke::known_failures();
    println!("{} cases: {} ok or named errors, {} failures", report.cases, report.cases - report.failures.len(), report.failures.len());
    for (i, outcome) in &report.failures {
        let text = format!("{outcome:?}");
        let class = known.iter().find(|k| k.target == t.name() && k.hash.starts_with('~') && text.contains(&k.hash[1..]));
        let tag = class.map_or("NEW".to_string(), |k| format!("known {} ({})", k.hash, k.owner));
        println!("{tag}: {}: {text}", report.list[*i].label);
    }
    std::fs::remove_dir_all(&config.work).ok();
    Ok(())
}
