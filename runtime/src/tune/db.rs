//! The tuning database: measured choices by key, one file per device under the user's
//! cache directory (`$XDG_CACHE_HOME/kiln/tuning`, else `~/.cache/kiln/tuning`), or one
//! explicit file (`--tuning-db`) that may hold several devices' entries.
//!
//! File layout: one header line `KILNTUNE <format> <checksum> <body bytes>\n`, then the
//! body, JSON ([`DbBody`]). The checksum is FNV-1a 64 of the body bytes, in hex. A file
//! of another format, with a wrong checksum or length, or a body that does not parse is
//! ignored with a warning (tuning is an accelerator: never an error); the next save
//! replaces it. Saves write a temporary file in the same directory and rename it over
//! the old one, so readers see the old or the new file, never half of one.
use super::hash;
use super::key::DeviceFingerprint;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The database file format this Kiln reads and writes.
pub const DB_FORMAT: u32 = 1;
const MAGIC: &str = "KILNTUNE";

/// One measured choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    /// The chosen values of the kernel's parameters (the defaults when none won).
    pub values: BTreeMap<String, u32>,
    /// Milliseconds per run of the default variant, and of the chosen one.
    pub default_ms: f64,
    pub best_ms: f64,
    /// Op and input types, for listings.
    pub summary: String,
}

impl TuneEntry {
    pub fn tune_values(&self) -> kiln_ops::TuneValues {
        kiln_ops::TuneValues(self.values.clone())
    }
}

/// What a database file holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DbBody {
    /// The Kiln version that last wrote the file.
    pub kiln_version: String,
    /// Device fingerprints by id ([`DeviceFingerprint::id`]).
    pub devices: BTreeMap<String, String>,
    /// Choices by key text ([`super::TuneKey::text`]).
    pub entries: BTreeMap<String, TuneEntry>,
}

/// A database file's contents, and why it could not be used when it could not.
#[derive(Debug, Default)]
pub struct Loaded {
    pub body: DbBody,
    /// Set when the file exists but was ignored (damaged, stale format, unreadable).
    pub problem: Option<String>,
}

/// The directory of the per-device databases: `$XDG_CACHE_HOME/kiln/tuning`, else
/// `$HOME/.cache/kiln/tuning`; None when neither variable is set.
pub fn default_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("kiln").join("tuning"))
}

/// The default database file of a device.
pub fn default_path(device: &DeviceFingerprint) -> Option<PathBuf> {
    Some(default_dir()?.join(format!("{}.json", device.file_stem())))
}

/// Encodes a body as a database file.
pub fn encode(body: &DbBody) -> Vec<u8> {
    let json = serde_json::to_vec_pretty(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = format!("{MAGIC} {DB_FORMAT} {} {}\n", hash::hex(&json), json.len()).into_bytes();
    out.extend_from_slice(&json);
    out
}

/// Decodes a database file; the error says why it cannot be used.
pub fn decode(bytes: &[u8]) -> Result<DbBody, String> {
    let nl = bytes.iter().position(|&b| b == b'\n').ok_or("no header line")?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| "the header line is not text")?;
    let fields: Vec<&str> = header.split(' ').collect();
    let [magic, format, checksum, len] = fields.as_slice() else { return Err(format!("malformed header line '{header}'")) };
    if *magic != MAGIC {
        return Err("not a Kiln tuning database".into());
    }
    let format: u32 = format.parse().map_err(|_| format!("malformed format version '{format}'"))?;
    if format != DB_FORMAT {
        return Err(format!("database format {format}, this Kiln reads format {DB_FORMAT} (stale: it will be replaced when tuning)"));
    }
    let body = &bytes[nl + 1..];
    if len.parse::<usize>().ok() != Some(body.len()) {
        return Err(format!("the body is {} bytes, the header says {len} (truncated or damaged)", body.len()));
    }
    if hash::hex(body) != *checksum {
        return Err("checksum mismatch (damaged)".into());
    }
    serde_json::from_slice(body).map_err(|e| format!("the body does not parse: {e}"))
}

/// Reads a database file. A missing file is an empty database; a file that cannot be
/// used is an empty database with the reason in [`Loaded::problem`] (logged as a warning).
pub fn load(path: &Path) -> Loaded {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::default(),
        Err(e) => return ignored(path, format!("cannot read it: {e}")),
    };
    match decode(&bytes) {
        Ok(body) => {
            log::debug!("tuning database {}: {} entries", path.display(), body.entries.len());
            Loaded { body, problem: None }
        }
        Err(why) => ignored(path, why),
    }
}

fn ignored(path: &Path, why: String) -> Loaded {
    log::warn!("tuning database {} ignored: {why}", path.display());
    Loaded { body: DbBody::default(), problem: Some(why) }
}

/// Writes a database file atomically (a temporary file in the same directory, renamed
/// over the old one); creates the directory.
pub fn save(path: &Path, body: &DbBody) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "tuning".into());
    let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, encode(body)).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Adds `entries` (measured on `device`) to the database at `path`, re-reading it first
/// so that entries other processes wrote meanwhile are kept.
pub fn merge_into(path: &Path, device: &DeviceFingerprint, entries: &BTreeMap<String, TuneEntry>) -> std::io::Result<()> {
    let mut body = load(path).body;
    body.kiln_version = env!("CARGO_PKG_VERSION").into();
    body.devices.insert(device.id(), device.text.clone());
    for (k, e) in entries {
        body.entries.insert(k.clone(), e.clone());
    }
    save(path, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> DbBody {
        let mut b = DbBody { kiln_version: "t".into(), ..Default::default() };
        let values = [("workgroup".to_string(), 128u32)].into_iter().collect();
        b.entries.insert("k".into(), TuneEntry { values, default_ms: 2.0, best_ms: 1.0, summary: "Op(f32[2])".into() });
        b
    }

    #[test]
    fn round_trip_and_damage_is_detected() {
        let bytes = encode(&body());
        assert_eq!(decode(&bytes).unwrap(), body());
        // Any flipped byte of the body fails the checksum or the parse.
        for i in (bytes.iter().position(|&b| b == b'\n').unwrap() + 1..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert!(decode(&bad).is_err(), "byte {i} flipped went unnoticed");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).unwrap_err().contains("truncated"));
        let stale = String::from_utf8(bytes.clone()).unwrap().replacen("KILNTUNE 1 ", "KILNTUNE 0 ", 1);
        assert!(decode(stale.as_bytes()).unwrap_err().contains("stale"));
        assert!(decode(b"garbage").is_err());
    }

    #[test]
    fn saves_are_atomic_renames_and_merge() {
        let dir = std::env::temp_dir().join(format!("kiln-db-unit-{}", std::process::id()));
        let path = dir.join("sub").join("db.json");
        let dev = DeviceFingerprint { kind: "cpu", name: "x".into(), text: "cpu x".into() };
        merge_into(&path, &dev, &body().entries).unwrap();
        let mut more = BTreeMap::new();
        more.insert("k2".to_string(), TuneEntry { values: BTreeMap::new(), default_ms: 1.0, best_ms: 1.0, summary: String::new() });
        merge_into(&path, &dev, &more).unwrap();
        let l = load(&path);
        assert!(l.problem.is_none());
        assert_eq!(l.body.entries.len(), 2);
        assert_eq!(l.body.devices.get(&dev.id()).map(String::as_str), Some("cpu x"));
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        std::fs::write(&path, b"KILNTUNE 1 0000000000000000 3\n{}x").unwrap();
        let l = load(&path);
        assert!(l.problem.is_some() && l.body.entries.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
