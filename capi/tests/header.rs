//! include/kiln.h is what cbindgen generates from src/lib.rs: this test regenerates it
//! and fails when the checked-in header differs (`KILN_UPDATE_HEADER=1` rewrites it).
use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8");
    let path = dir.join("include/kiln.h");
    if std::env::var_os("KILN_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(current == generated, "capi/include/kiln.h is stale: run `KILN_UPDATE_HEADER=1 cargo test -p kiln-capi --test header`");
}
