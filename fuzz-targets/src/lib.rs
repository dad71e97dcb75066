//! kiln-fuzz: the bodies of Kiln's fuzz targets, their structure-aware mutators, seed
//! corpora, and a stable smoke that runs every target (see docs/reliability.md).
//!
//! The targets take bytes and return `Ok` or a named error; any panic, abort, hang or
//! memory blow-up is a finding. The libFuzzer targets in `fuzz/` (nightly, cargo-fuzz)
//! call [`Target::run`] and [`Target::mutate`]; so does the smoke test on stable.
//!
//! Depends on kiln-compiler and kiln-runtime; nothing depends on it.

pub mod case;
pub mod corpus;
pub mod mutate;
pub mod npy_reader;
pub mod rng;
pub mod smoke;

use case::SessionCase;
use kiln_compiler::onnx::proto::ModelProto;
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use prost::Message;
use rng::Rng;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A fuzz target: one entry point of Kiln that reads untrusted bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `kiln_compiler::onnx::import_bytes` (with the op checks) on a `.onnx` file.
    OnnxImport,
    /// `kiln_runtime::artifact::load` on a `.kiln` file, then a CPU session runs it.
    ArtifactLoad,
    /// The `.npy` reader ([`npy_reader::read_npy`]).
    NpyRead,
    /// Import, `passes::optimize`, `Session::new` on the CPU and `run`, on a [`SessionCase`].
    SessionRun,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::OnnxImport, Target::ArtifactLoad, Target::NpyRead, Target::SessionRun];

    pub fn name(self) -> &'static str {
        match self {
            Target::OnnxImport => "onnx_import",
            Target::ArtifactLoad => "artifact_load",
            Target::NpyRead => "npy_read",
            Target::SessionRun => "session_run",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Runs the target on one input. `Err` is a named error (the expected outcome for
    /// malformed input); a panic, an abort or a hang is a bug.
    pub fn run(self, data: &[u8]) -> Result<(), String> {
        match self {
            Target::OnnxImport => kiln_compiler::onnx::import_bytes(data, Some(ext_dir())).map(|_| ()).map_err(|e| e.to_string()),
            Target::ArtifactLoad => run_artifact(data),
            Target::NpyRead => npy_reader::read_npy(data).map(|_| ()),
            Target::SessionRun => run_session_case(data),
        }
    }

    /// A mutated copy of `data`, at most `max_len` bytes: mostly structure-aware edits
    /// of the target's format, sometimes raw byte edits (always when `data` does not
    /// parse).
    pub fn mutate(self, data: &[u8], rng: &mut Rng, max_len: usize) -> Vec<u8> {
        let structured = if rng.chance(1, 5) {
            None
        } else {
            match self {
                Target::OnnxImport => ModelProto::decode(data).ok().map(|mut m| {
                    mutate::model::mutate_model(&mut m, rng);
                    m.encode_to_vec()
                }),
                Target::SessionRun => SessionCase::decode(data).ok().map(|mut c| {
                    mutate_case(&mut c, rng);
                    c.encode_to_vec()
                }),
                Target::ArtifactLoad => mutate::artifact::mutate_artifact(data, rng),
                Target::NpyRead => mutate::npy::mutate_npy(data, rng),
            }
        };
        match structured {
            Some(out) if out.len() <= max_len => out,
            _ => {
                let mut out = data.to_vec();
                mutate::bytes::mutate_bytes(&mut out, rng, max_len);
                out
            }
        }
    }
}

fn mutate_case(c: &mut SessionCase, rng: &mut Rng) {
    match rng.below(10) {
        0 | 1 if !c.inputs.is_empty() => {
            let i = rng.below(c.inputs.len());
            let names = vec![c.inputs[i].name.clone()];
            mutate::model::mutate_tensor(&mut c.inputs[i], &names, rng);
        }
        2 => {
            if rng.chance(1, 2) && !c.inputs.is_empty() {
                c.inputs.remove(rng.below(c.inputs.len())); // synthesised instead
            } else {
                c.seed = rng.next_u64();
            }
        }
        3 if rng.chance(1, 3) => c.skip_passes = !c.skip_passes,
        _ => mutate::model::mutate_model(c.model.get_or_insert_with(ModelProto::default), rng),
    }
}

/// The options of every session the targets build: the CPU backend.
pub fn session_options() -> SessionOptions {
    SessionOptions::device(DeviceChoice::Cpu)
}

fn run_session_case(data: &[u8]) -> Result<(), String> {
    let case = SessionCase::decode(data).map_err(|e| format!("harness: not a session case: {e}"))?;
    let model = case.model.unwrap_or_default();
    let options = kiln_compiler::onnx::ImportOptions::default();
    let mut graph = kiln_compiler::onnx::build(model, "<fuzz>", Some(ext_dir()), &options).map_err(|e| e.to_string())?;
    if !case.skip_passes {
        kiln_compiler::passes::optimize(&mut graph);
    }
    let given: Vec<(String, kiln_graph::Tensor)> = case
        .inputs
        .iter()
        .filter_map(|p| kiln_compiler::onnx::tensor_from_proto(p, None).ok().map(|t| (p.name.clone(), t)))
        .collect();
    run_graph(graph, &given, case.seed)
}

/// Builds a CPU session for `graph` and runs it once on `given` plus synthesised inputs.
pub fn run_graph(graph: kiln_graph::Graph, given: &[(String, kiln_graph::Tensor)], seed: u64) -> Result<(), String> {
    let session = Session::new(graph, session_options()).map_err(|e| e.to_string())?;
    let inputs = case::inputs_for(&session.inputs(), given, seed)?;
    let refs: Vec<(&str, &kiln_graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    session.run(&refs).map(|_| ()).map_err(|e| e.to_string())
}

fn run_artifact(data: &[u8]) -> Result<(), String> {
    // The loader maps a file: each thread writes its input to its own file.
    let path = ext_dir().join(format!("case-{:?}.kiln", std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&path, data).map_err(|e| format!("harness: cannot write {}: {e}", path.display()))?;
    let loaded = kiln_runtime::artifact::load(&path);
    let result = loaded.map_err(|e| e.to_string()).and_then(|(graph, _info)| run_graph(graph, &[], 0));
    std::fs::remove_file(&path).ok();
    result
}

/// The directory that external data references are resolved against: a regular data
/// file (`data.bin`, 4 KiB), a FIFO (`fifo`, unless `KILN_FUZZ_NO_FIFO` is set), a subdirectory (`sub/inner.bin`) and
/// symbolic links inside (`link_in`) and outside (`link_out`) of it. Made once per
/// process, under `$KILN_FUZZ_DIR` if set, else the temporary directory.
pub fn ext_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("KILN_FUZZ_DIR") {
            Some(d) => PathBuf::from(d),
            None => std::env::temp_dir().join(format!("kiln-fuzz-{}", std::process::id())),
        };
        make_ext_dir(&dir).unwrap_or_else(|e| panic!("harness: cannot prepare {}: {e}", dir.display()));
        dir
    })
}

fn make_ext_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("sub"))?;
    let data: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    std::fs::write(dir.join("data.bin"), &data)?;
    std::fs::write(dir.join("sub").join("inner.bin"), &data[..256])?;
    #[cfg(unix)]
    {
        // KILN_FUZZ_NO_FIFO=1 leaves the FIFO out, for long fuzzing runs while a FIFO
        // still blocks the importer (each such input would cost a full timeout); the
        // smoke always has it.
        let fifo = dir.join("fifo");
        if !fifo.exists() && std::env::var_os("KILN_FUZZ_NO_FIFO").is_none() {
            let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("no NUL in a temp path");
            // SAFETY: a valid NUL-terminated path; mkfifo only creates a file system node.
            if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        for (link, to) in [("link_out", Path::new("/etc/hostname")), ("link_in", Path::new("data.bin"))] {
            if std::fs::symlink_metadata(dir.join(link)).is_err() {
                std::os::unix::fs::symlink(to, dir.join(link))?;
            }
        }
    }
    Ok(())
}
