//! Architecture invariant: the importer and the passes do not link the runtime, wgpu
//! or naga (`cargo tree -p kiln-compiler -e normal` has none of them).
use std::process::Command;

#[test]
fn the_compiler_links_no_gpu_stack() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "kiln-compiler", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("kiln-ops ")), "unexpected cargo tree output:\n{tree}");
    let banned: Vec<&str> = tree.lines().filter(|l| ["wgpu", "naga", "kiln-runtime"].iter().any(|b| l.starts_with(&format!("{b} ")) || l.starts_with(&format!("{b}-")))).collect();
    assert!(banned.is_empty(), "kiln-compiler depends on {banned:?}");
}
