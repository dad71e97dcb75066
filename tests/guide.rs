//! docs/guide.md cannot rot: every `sh` block runs here (bash, `set -euo pipefail`, the
//! `kiln` binary on the PATH, `$ZOO` and `$REPO` set, a fresh folder each); the `rust`
//! blocks are doctests of this crate (src/lib.rs), the `python` ones run in
//! python/tests/test_guide.py and the `c` ones in capi/tests/c_program.rs. Any other
//! block language is an error, so no block goes untested.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// The fenced blocks of a Markdown text: (language, code, line of the fence).
pub fn blocks(text: &str) -> Vec<(String, String, usize)> {
    let mut out = vec![];
    let mut open: Option<(String, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.trim().to_string(), String::new(), i + 1)),
            (Some(_), Some(_)) => out.push(open.take().expect("open")),
            (Some((_, code, _)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

#[test]
fn every_shell_block_of_the_guide_runs() {
    run_shell_blocks("docs/guide.md", 8);
}

#[test]
fn every_shell_block_of_the_training_guide_runs() {
    run_shell_blocks("docs/training.md", 2);
}

/// Runs every `sh` block of a page; the page has at least `min` of them.
fn run_shell_blocks(page: &str, min: usize) {
    gpu_env();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(repo.join(page)).unwrap();
    let all = blocks(&guide);
    for (lang, _, line) in &all {
        assert!(["sh", "rust", "python", "c"].contains(&lang.as_str()), "{page}:{line}: a '{lang}' block, which no test runs");
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let shell: Vec<_> = all.iter().filter(|(l, _, _)| l == "sh").collect();
    assert!(shell.len() >= min, "{page}'s shell blocks: {}", shell.len());
    for (k, (_, code, line)) in shell.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("kiln-guide-{}-{}-{k}", std::process::id(), page.replace(['/', '.'], "-")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{code}"))
            .current_dir(&dir)
            .env("PATH", &path)
            .env("ZOO", zoo())
            .env("REPO", repo)
            .output()
            .expect("bash runs");
        assert!(o.status.success(), "{page}:{line}: the block failed:\n{code}\nstdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
