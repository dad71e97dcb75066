//! Seed inputs for every target: the checked-in seeds (`seeds/TARGET/`, small files),
//! the regression reproducers (`regressions/TARGET/`), and seeds made from the model
//! zoo (`$KILN_ZOO`, default `../shared/zoo`) and the ONNX node tests
//! (`$KILN_ONNX_TESTS`), read in place, never copied into the repository.

use crate::case::SessionCase;
use crate::{npy_reader, Target};
use kiln_compiler::onnx::proto::{ModelProto, TensorProto};
use prost::Message;
use std::path::{Path, PathBuf};

/// One seed: a label (for messages) and its bytes or the file that holds them.
pub struct Seed {
    pub label: String,
    pub source: Source,
}

pub enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl Seed {
    pub fn bytes(&self) -> std::io::Result<Vec<u8>> {
        match &self.source {
            Source::File(p) => std::fs::read(p),
            Source::Bytes(b) => Ok(b.clone()),
        }
    }
}

/// This crate's directory (seeds/ and regressions/ live here).
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The model zoo: `$KILN_ZOO`, else `shared/zoo` beside the repository.
pub fn zoo_dir() -> PathBuf {
    match std::env::var_os("KILN_ZOO") {
        Some(d) => PathBuf::from(d),
        None => crate_dir().join("../../shared/zoo"),
    }
}

/// Files of a directory in name order (none if it does not exist).
pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

pub fn checked_in(target: Target) -> Vec<Seed> {
    files_in(&crate_dir().join("seeds").join(target.name())).into_iter().map(file_seed).collect()
}

pub fn regressions(target: Target) -> Vec<Seed> {
    files_in(&crate_dir().join("regressions").join(target.name())).into_iter().map(file_seed).collect()
}

fn file_seed(p: PathBuf) -> Seed {
    Seed { label: p.display().to_string(), source: Source::File(p) }
}

/// Model folders (`DIR/NAME/model.onnx`) in name order.
pub fn model_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("model.onnx").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(u64::MAX)
}

/// Seeds made from a folder of models (the zoo or the node tests): whole models for the
/// importer; for the other targets only models of at most `max_model_bytes`: a session
/// case with the first data set's inputs, a `.kiln` compiled from the model, and the
/// data set's tensors as `.npy` files.
pub fn model_seeds(root: &Path, target: Target, max_model_bytes: u64) -> Vec<Seed> {
    let mut seeds = vec![];
    for dir in model_dirs(root) {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let model = dir.join("model.onnx");
        if target == Target::OnnxImport {
            seeds.push(file_seed(model));
            continue;
        }
        if file_len(&model) > max_model_bytes {
            continue;
        }
        let data: Vec<PathBuf> = files_in(&dir.join("test_data_set_0")).into_iter().filter(|p| p.extension().is_some_and(|e| e == "pb")).collect();
        match target {
            Target::SessionRun => {
                if let Some(bytes) = session_case(&model, &data) {
                    seeds.push(Seed { label: format!("{name} (session case)"), source: Source::Bytes(bytes) });
                }
            }
            Target::ArtifactLoad => {
                if let Some(bytes) = compiled_artifact(&model) {
                    seeds.push(Seed { label: format!("{name} (compiled)"), source: Source::Bytes(bytes) });
                }
            }
            Target::NpyRead => {
                for p in data {
                    if let Ok((_, t)) = kiln_compiler::onnx::read_tensor_pb(&p) {
                        let file = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                        seeds.push(Seed { label: format!("{name}/{file} (as .npy)"), source: Source::Bytes(npy_reader::write_npy(&t)) });
                    }
                }
            }
            Target::OnnxImport => unreachable!("handled above"),
        }
    }
    seeds
}

/// A session case: the model and the given input tensors (`input_*.pb`).
pub fn session_case(model: &Path, data: &[PathBuf]) -> Option<Vec<u8>> {
    let m = ModelProto::decode(std::fs::read(model).ok()?.as_slice()).ok()?;
    let inputs = data
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("input_")))
        .filter_map(|p| TensorProto::decode(std::fs::read(p).ok()?.as_slice()).ok())
        .collect();
    Some(SessionCase { model: Some(m), inputs, seed: 1, skip_passes: false }.encode_to_vec())
}

/// A `.kiln` artifact of a model: imported, optimised, saved (no GPU kernels).
pub fn compiled_artifact(model: &Path) -> Option<Vec<u8>> {
    let mut graph = kiln_compiler::onnx::import_file(model).ok()?;
    kiln_compiler::passes::optimize(&mut graph);
    let tmp = std::env::temp_dir().join(format!("kiln-fuzz-seed-{}-{:?}.kiln", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    let info = kiln_runtime::artifact::ArtifactInfo { kiln_version: "fuzz-seed".into(), device: "cpu".into(), ..Default::default() };
    kiln_runtime::artifact::save(&tmp, &graph, &info).ok()?;
    let bytes = std::fs::read(&tmp).ok();
    std::fs::remove_file(&tmp).ok();
    bytes
}
