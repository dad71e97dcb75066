// Hashes the crate's sources into `KILN_SOURCE_HASH` (read by `kiln_ops::SOURCE_HASH`,
// and by `kiln_compiler::SOURCE_HASH`, whose build script includes this file): the
// tuning database keys CPU kernels' choices by the first and graph-level choices by
// both, so that a changed kernel or pass never reuses a pick measured on an older one.
// The hash covers every `.rs` file under `src/` (relative path and contents, in path
// order), FNV-1a 64.
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    println!("cargo:rerun-if-changed=src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    files.sort();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap_or(f).to_string_lossy().replace('\\', "/");
        h = fnv1a(h, rel.as_bytes());
        h = fnv1a(h, &[0]);
        h = fnv1a(h, &std::fs::read(f).unwrap_or_default());
        h = fnv1a(h, &[0]);
    }
    println!("cargo:rustc-env=KILN_SOURCE_HASH={h:016x}");
}
