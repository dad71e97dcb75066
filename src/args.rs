//! Command-line arguments shared by the commands that open a session and run a model
//! (`run`, `bench`), flattened into each (`#[command(flatten)]`), and the parsing of
//! their values.

use anyhow::{anyhow, Result};
use kiln::runtime::DeviceChoice;
use std::path::PathBuf;

/// The model, the device, placement, inputs and output format of a session.
#[derive(clap::Args)]
pub struct SessionArgs {
    /// The model (.onnx, or a .kiln artifact from `kiln compile`).
    pub model: PathBuf,
    /// cpu, gpu, auto, or an adapter name / gpu:N (see `kiln devices`).
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// An input as NAME=FILE (.npy or ONNX TensorProto .pb); random values for the rest.
    #[arg(long = "input", short = 'i')]
    pub inputs: Vec<String>,
    /// Size of a symbolic dim for random inputs, NAME=VALUE (default: what given inputs
    /// bind, else 1).
    #[arg(long = "dim")]
    pub dims: Vec<String>,
    /// Seed of the random inputs (the same seed gives the same values).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write every input the run uses, given or random, to DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    pub save_inputs: Option<PathBuf>,
    /// Run the imported graph as is, without the graph passes (fusion, ...).
    #[arg(long)]
    pub no_passes: bool,
    /// A custom op's manifest (JSON, see docs/custom-ops.md), for models that use it
    /// (repeatable).
    #[arg(long = "custom-op", value_name = "MANIFEST")]
    pub custom_ops: Vec<PathBuf>,
    /// Place nodes (by name or op type) on a device: OP_OR_NODE=DEVICE with cpu, gpu,
    /// gpu:N or an adapter name (repeatable); `auto` places the rest by the cost model
    /// (devices measured once); otherwise a GPU session runs the rest on the GPU where a
    /// kernel exists, else on the CPU.
    #[arg(long = "place")]
    pub place: Vec<String>,
    /// The most memory a run may use for its tensors (inputs included), in bytes or with
    /// a K, M, G or T suffix (powers of 1024); default: three quarters of physical memory.
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Keep subnormal floats on the CPU (by default the worker threads flush them to
    /// zero, which is faster on many CPUs).
    #[arg(long)]
    pub keep_denormals: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tuning: TuningArgs,
}

/// Which tuned choices (passes and kernels) a session uses (`kiln tune` writes them).
#[derive(clap::Args, Clone)]
pub struct TuningArgs {
    /// Run every kernel with its default parameters and the default passes: ignore the
    /// tuning database and the artifact's embedded choices.
    #[arg(long, conflicts_with = "tuning_db")]
    pub no_tuning: bool,
    /// The tuning database file to use instead of the per-device files under the user's
    /// cache directory ($XDG_CACHE_HOME/kiln/tuning).
    #[arg(long, value_name = "FILE")]
    pub tuning_db: Option<PathBuf>,
}

impl TuningArgs {
    /// The session's tuning source; `embedded`: an artifact's choices (used first).
    pub fn tuning(&self, embedded: Option<&kiln::runtime::artifact::ArtifactInfo>) -> kiln::runtime::Tuning {
        if self.no_tuning {
            return kiln::runtime::Tuning::off();
        }
        let mut t = match &self.tuning_db {
            Some(p) => kiln::runtime::Tuning::file(p),
            None => kiln::runtime::Tuning::user_cache(),
        };
        if let Some(info) = embedded {
            t.embedded = info.tuning.clone();
        }
        t
    }
}

/// A byte count such as `1048576`, `512M`, `8G` or `1.5T` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'B' => 0,
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(anyhow!("'{s}' is not a size (e.g. 4096, 512M, 8G; units K, M, G, T)")),
            };
            (&t[..i], (1u64 << shift) as f64)
        }
        _ => (t, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| anyhow!("'{s}' is not a size (e.g. 4096, 512M, 8G)"))?;
    let bytes = v * mult;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(anyhow!("'{s}' is not a usable memory limit"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("8g").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
        for bad in ["", "x", "-1", "0", "3Q", "1e30T", "NaN"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
