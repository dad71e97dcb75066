//! `kiln-fuzz`: runs fuzz target bodies outside libFuzzer.
//!
//! ```text
//! kiln-fuzz run TARGET FILE...            run inputs in this process, print each outcome
//! kiln-fuzz child TARGET MANIFEST START   the smoke's child process (see kiln_fuzz::smoke)
//! kiln-fuzz seed OUT_DIR [MAX_BYTES]      write libFuzzer corpora OUT_DIR/TARGET/ from the
//!                                         zoo and the ONNX node tests ($KILN_ONNX_TESTS)
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
