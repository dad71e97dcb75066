//! Where a session's tuned values come from, and the lookup plans make for each step.
//!
//! Lookup order: the choices embedded in the artifact ([`Tuning::embedded`]), then the
//! choices this session measured ([`crate::Session::tune`]), then the database, then the
//! kernel's defaults. A stored choice that names a parameter the kernel no longer has,
//! or a value outside its candidates, is stale: ignored with a warning. Keys looked up
//! and not found are recorded ([`Choices::untuned`]) so runs can say what to tune.
use super::db::{self, TuneEntry};
use super::key::{DeviceFingerprint, TuneKey};
use crate::error::poisoned;
use crate::Result;
use kiln_ops::{TuneParam, TuneValues};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Which tuning database a session reads (and `Session::tune` writes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TuningDatabase {
    /// No database: kernels run with their defaults unless the artifact embeds choices.
    #[default]
    Off,
    /// One file per device under the user's cache directory (see [`db::default_dir`]).
    UserCache,
    /// This file, for every device.
    File(PathBuf),
}

/// A session's tuning source: the database to read, and choices embedded in an
/// artifact (`ArtifactInfo::tuning`), which come first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tuning {
    pub database: TuningDatabase,
    /// Choices by key text ([`TuneKey::text`]); keys of other devices never match.
    pub embedded: BTreeMap<String, TuneEntry>,
}

impl Tuning {
    /// Defaults everywhere (the default of `SessionOptions`).
    pub fn off() -> Tuning {
        Tuning::default()
    }

    /// The per-device databases under the user's cache directory (what the CLI uses).
    pub fn user_cache() -> Tuning {
        Tuning { database: TuningDatabase::UserCache, embedded: BTreeMap::new() }
    }

    /// One database file.
    pub fn file(path: impl Into<PathBuf>) -> Tuning {
        Tuning { database: TuningDatabase::File(path.into()), embedded: BTreeMap::new() }
    }
}

/// Where a step's values came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChoiceSource {
    Embedded,
    Measured,
    Database,
    /// Not found: the kernel's defaults.
    Default,
}

/// A session's lookups (shared by its plans).
pub(crate) struct Choices {
    tuning: Tuning,
    cpu: OnceLock<DeviceFingerprint>,
    /// Database files read so far, by path.
    files: Mutex<HashMap<PathBuf, Arc<BTreeMap<String, TuneEntry>>>>,
    measured: Mutex<BTreeMap<String, TuneEntry>>,
    /// Key texts looked up and not found, with their summaries.
    untuned: Mutex<BTreeMap<String, String>>,
    /// Stale entries already warned about.
    warned: Mutex<BTreeSet<String>>,
}

impl Choices {
    pub fn new(tuning: Tuning) -> Choices {
        Choices { tuning, cpu: OnceLock::new(), files: Mutex::default(), measured: Mutex::default(), untuned: Mutex::default(), warned: Mutex::default() }
    }

    /// This machine's CPU fingerprint (computed once per session).
    pub fn cpu_device(&self) -> &DeviceFingerprint {
        self.cpu.get_or_init(DeviceFingerprint::cpu)
    }

    /// The database file of `device`, when the session has a database.
    pub fn db_path(&self, device: &DeviceFingerprint) -> Option<PathBuf> {
        match &self.tuning.database {
            TuningDatabase::Off => None,
            TuningDatabase::UserCache => db::default_path(device),
            TuningDatabase::File(p) => Some(p.clone()),
        }
    }

    fn database(&self, device: &DeviceFingerprint) -> Result<Option<Arc<BTreeMap<String, TuneEntry>>>> {
        let Some(path) = self.db_path(device) else { return Ok(None) };
        let mut files = self.files.lock().map_err(|_| poisoned())?;
        if let Some(f) = files.get(&path) {
            return Ok(Some(f.clone()));
        }
        let entries = Arc::new(db::load(&path).body.entries);
        files.insert(path, entries.clone());
        Ok(Some(entries))
    }

    /// Forgets the database files read (the next lookup reads them again).
    pub fn reload(&self) -> Result<()> {
        self.files.lock().map_err(|_| poisoned())?.clear();
        Ok(())
    }

    /// Records `entries` measured on `device` (used before the database's from now on)
    /// and merges them into its database file; a file that cannot be written is a
    /// warning. Returns the file written, if any.
    pub fn store(&self, device: &DeviceFingerprint, entries: &BTreeMap<String, TuneEntry>) -> Result<Option<PathBuf>> {
        self.add_measured(entries)?;
        let Some(path) = self.db_path(device) else { return Ok(None) };
        match db::merge_into(&path, device, entries) {
            Ok(()) => {
                self.reload()?;
                Ok(Some(path))
            }
            Err(e) => {
                log::warn!("cannot write the tuning database {}: {e}", path.display());
                Ok(None)
            }
        }
    }

    /// Records choices measured by this session (used before the database's).
    pub fn add_measured(&self, entries: &BTreeMap<String, TuneEntry>) -> Result<()> {
        let mut m = self.measured.lock().map_err(|_| poisoned())?;
        let mut untuned = self.untuned.lock().map_err(|_| poisoned())?;
        for (k, e) in entries {
            m.insert(k.clone(), e.clone());
            untuned.remove(k);
        }
        Ok(())
    }

    /// The stored choice of `key` without recording a miss (the tuner's "already tuned").
    pub fn find(&self, key: &TuneKey, device: &DeviceFingerprint, params: &[TuneParam]) -> Result<Option<(TuneEntry, ChoiceSource)>> {
        let text = key.text();
        let mut found = self.tuning.embedded.get(&text).map(|e| (e.clone(), ChoiceSource::Embedded));
        if found.is_none() {
            found = self.measured.lock().map_err(|_| poisoned())?.get(&text).map(|e| (e.clone(), ChoiceSource::Measured));
        }
        if found.is_none() {
            found = self.database(device)?.and_then(|d| d.get(&text).map(|e| (e.clone(), ChoiceSource::Database)));
        }
        match found {
            Some((e, src)) => match check(&e.values, params) {
                Ok(()) => Ok(Some((e, src))),
                Err(why) => {
                    if self.warned.lock().map_err(|_| poisoned())?.insert(text.clone()) {
                        log::warn!("tuned choice for {} ignored ({src:?}): {why}", key.summary());
                    }
                    Ok(None)
                }
            },
            None => Ok(None),
        }
    }

    /// The values a plan uses for `key`: the first stored choice in lookup order, else
    /// the defaults (the key is then recorded as untuned).
    pub fn lookup(&self, key: &TuneKey, device: &DeviceFingerprint, params: &[TuneParam]) -> Result<(TuneValues, ChoiceSource)> {
        match self.find(key, device, params)? {
            Some((e, src)) => Ok((e.tune_values(), src)),
            None => {
                self.untuned.lock().map_err(|_| poisoned())?.insert(key.text(), key.summary());
                Ok((TuneValues::default(), ChoiceSource::Default))
            }
        }
    }

    /// Keys looked up and not found so far (key text, summary).
    pub fn untuned(&self) -> Result<Vec<(String, String)>> {
        Ok(self.untuned.lock().map_err(|_| poisoned())?.iter().map(|(k, s)| (k.clone(), s.clone())).collect())
    }
}

/// Whether stored `values` still mean something for a kernel with `params`.
fn check(values: &BTreeMap<String, u32>, params: &[TuneParam]) -> std::result::Result<(), String> {
    for (name, v) in values {
        let p = params.iter().find(|p| p.name == name).ok_or_else(|| format!("the kernel has no parameter '{name}' any more"))?;
        if *v != p.default && !p.candidates.contains(v) {
            return Err(format!("{name}={v} is not among the kernel's candidates {:?}", p.candidates));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_values_are_refused() {
        let params = vec![TuneParam { name: "workgroup", default: 64, candidates: vec![32, 64, 128] }];
        let ok: BTreeMap<String, u32> = [("workgroup".to_string(), 128)].into_iter().collect();
        assert!(check(&ok, &params).is_ok());
        let bad: BTreeMap<String, u32> = [("workgroup".to_string(), 96)].into_iter().collect();
        assert!(check(&bad, &params).is_err());
        let gone: BTreeMap<String, u32> = [("tile".to_string(), 4)].into_iter().collect();
        assert!(check(&gone, &params).is_err());
    }
}
