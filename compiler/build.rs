// The sources' hash (`KILN_SOURCE_HASH`, read by `kiln_compiler::SOURCE_HASH`): the same
// build script as kiln-ops', over this crate's `src/`.
include!("../ops/build.rs");
