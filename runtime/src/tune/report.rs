//! What tuning reports: per key, the default's and the best variant's times and the
//! chosen values; progress while it works.
use super::db::TuneEntry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How to tune.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Total time to spend measuring; keys left when it runs out keep their defaults
    /// (and are reported as [`KeyStatus::OutOfBudget`]).
    pub budget: Duration,
    /// Measure keys that already have a stored choice again.
    pub retune: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions { budget: Duration::from_secs(60), retune: false }
    }
}

/// Where tuning is, for progress bars.
#[derive(Clone, Debug)]
pub struct TuneProgress {
    /// Keys finished, of `total` keys with choices.
    pub done: usize,
    pub total: usize,
    /// The key being measured (its summary), empty when finished.
    pub current: String,
    pub elapsed: Duration,
    pub budget: Duration,
}

/// What became of one key.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyStatus {
    /// Measured now.
    Tuned,
    /// A stored choice was found (embedded, database, or measured earlier by this session).
    AlreadyTuned,
    /// The budget ran out before (or while) it was measured: defaults kept, not stored.
    OutOfBudget,
    /// The default variant could not be measured (e.g. it does not run on these inputs).
    Failed(String),
}

/// One key's result.
#[derive(Clone, Debug)]
pub struct KeyReport {
    /// The key's canonical text ([`super::TuneKey::text`]).
    pub key: String,
    /// Op and input types.
    pub summary: String,
    /// The first node with this key.
    pub node: String,
    /// The device's name.
    pub device: String,
    /// Milliseconds per run of the default variant and of the chosen one.
    pub default_ms: f64,
    pub best_ms: f64,
    /// The chosen values (empty: the defaults).
    pub values: BTreeMap<String, u32>,
    pub status: KeyStatus,
    /// Variants measured or checked (the default included).
    pub tried: usize,
    /// Variants refused, with why (outputs that differ from the default's, variants that
    /// do not build).
    pub rejected: Vec<(String, String)>,
}

impl KeyReport {
    /// A key not measured (yet): no times, the defaults, out of budget until it is.
    pub fn pending(key: String, summary: String, node: String, device: String) -> KeyReport {
        KeyReport { key, summary, node, device, default_ms: 0.0, best_ms: 0.0, values: BTreeMap::new(), status: KeyStatus::OutOfBudget, tried: 0, rejected: vec![] }
    }

    /// Default time over chosen time (1 when unknown).
    pub fn speedup(&self) -> f64 {
        if self.best_ms > 0.0 && self.default_ms > 0.0 {
            self.default_ms / self.best_ms
        } else {
            1.0
        }
    }

    /// The chosen values as text: `workgroup=128, tile=4`, or `default`.
    pub fn config(&self) -> String {
        values_text(&self.values)
    }

    /// The entry a database or an artifact stores (None unless tuned or already tuned).
    pub fn entry(&self) -> Option<TuneEntry> {
        matches!(self.status, KeyStatus::Tuned | KeyStatus::AlreadyTuned).then(|| TuneEntry {
            values: self.values.clone(),
            default_ms: self.default_ms,
            best_ms: self.best_ms,
            summary: self.summary.clone(),
        })
    }
}

/// Values as text: `a=1, b=2`, or `default` when empty.
pub fn values_text(values: &BTreeMap<String, u32>) -> String {
    if values.is_empty() {
        return "default".into();
    }
    values.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// What [`crate::Session::tune`] did.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    pub keys: Vec<KeyReport>,
    /// The devices tuned for (names).
    pub devices: Vec<String>,
    /// The database files written (none when the session has no database).
    pub databases: Vec<PathBuf>,
    pub elapsed: Duration,
}

impl TuneReport {
    /// Every stored or measured choice of this model, by key text (what `kiln compile
    /// --tune` embeds in an artifact).
    pub fn entries(&self) -> BTreeMap<String, TuneEntry> {
        self.keys.iter().filter_map(|k| k.entry().map(|e| (k.key.clone(), e))).collect()
    }

    /// Keys with a choice after this run (tuned now or before).
    pub fn tuned(&self) -> usize {
        self.keys.iter().filter(|k| matches!(k.status, KeyStatus::Tuned | KeyStatus::AlreadyTuned)).count()
    }
}
