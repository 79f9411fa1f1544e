//! `FlightRecorder` and `verify`: agl's tamper-evident flight recorder (`agl_gov::FlightRecorder`)
//! for Python.
//!
//! A recorder is an append-only SQLite database whose entries (one per checked action: the
//! action and the kernel's decision) form a SHA-256 hash chain, HMAC-SHA-256 keyed when a key
//! file is given, anchored by `<path>.head`. A kernel built with `recorder=` appends to it;
//! `verify` recomputes the chain (the same check as `agl audit verify`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agl_gov::{HeadSource, RecorderConfig, VerifyOptions, hmac_key_from_file};
use pyo3::prelude::*;
use pythonize::pythonize;

use crate::error;

/// A tamper-evident, append-only log of every check (hash-chained SQLite).
#[pyclass(module = "agl_rl", frozen)]
pub struct FlightRecorder {
    inner: Arc<agl_gov::FlightRecorder>,
    path: Option<PathBuf>,
}

impl FlightRecorder {
    /// The Rust recorder, shared.
    pub fn shared(&self) -> Arc<agl_gov::FlightRecorder> {
        self.inner.clone()
    }
}

fn key(key_file: Option<&Path>) -> PyResult<Option<Vec<u8>>> {
    key_file
        .map(hmac_key_from_file)
        .transpose()
        .map_err(error::gov)
}

#[pymethods]
impl FlightRecorder {
    /// `FlightRecorder(path=None, *, key_file=None)`: opens (or creates, with its parent
    /// directories) the recorder database at `path`; `None` keeps it in memory. An existing
    /// database continues its chain after it verifies; a broken one is refused. `key_file`:
    /// the HMAC key (at least 16 bytes) of a keyed chain. Raises `RecorderError`.
    #[new]
    #[pyo3(signature = (path = None, *, key_file = None))]
    fn new(py: Python<'_>, path: Option<PathBuf>, key_file: Option<PathBuf>) -> PyResult<Self> {
        let config = RecorderConfig {
            hmac_key: key(key_file.as_deref())?,
            ..RecorderConfig::default()
        };
        let inner = match &path {
            Some(p) => {
                let p = p.clone();
                py.detach(move || agl_gov::FlightRecorder::open(&p, config))
                    .map_err(error::gov)?
            }
            None => agl_gov::FlightRecorder::in_memory_with(config),
        };
        Ok(FlightRecorder {
            inner: Arc::new(inner),
            path,
        })
    }

    /// The database path, or `None` in memory.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    /// Whether the chain is HMAC-keyed.
    #[getter]
    fn keyed(&self) -> bool {
        self.inner.keyed()
    }

    /// Entries appended so far (committed or queued).
    #[getter]
    fn entries(&self) -> u64 {
        self.inner.entries()
    }

    /// The hash of the last entry (64 hex digits; the genesis hash when empty).
    #[getter]
    fn head_hash(&self) -> String {
        self.inner.head_hash()
    }

    /// Commits every appended entry (and the head file). Raises `RecorderError`.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.flush()).map_err(error::gov)
    }

    /// Counts over the whole database: `entries`, `violations` (entries with one),
    /// `violation_rate`, `by_verdict`, `by_policy`, `by_severity`.
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let summary = py.detach(move || inner.summary()).map_err(error::gov)?;
        Ok(pythonize(py, &summary)?)
    }

    /// Verifies this recorder's chain against the head it committed last; see `verify`.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let report = py
            .detach(move || inner.verify_chain())
            .map_err(error::gov)?;
        report_dict(py, &report)
    }

    /// Every entry (`seq`, `hash`, `prev_hash`, `timestamp`, the `action` and the `decision`),
    /// oldest first, as dicts.
    fn entries_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let lines = py.detach(move || inner.lines());
        let values: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l))
            .collect::<Result<_, _>>()
            .map_err(|e| error::invalid(format!("flight recorder entry: {e}")))?;
        Ok(pythonize(py, &values)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "FlightRecorder(path={:?}, entries={}, keyed={})",
            self.path.as_ref().map(|p| p.display().to_string()),
            self.inner.entries(),
            self.inner.keyed()
        )
    }
}

/// `verify(path, *, key_file=None, head=True)`: verifies the recorder database at `path`
/// (read-only), as `agl audit verify` does: every entry's hash recomputed from its columns, the
/// links, the sequence, and (with `head`) the `<path>.head` anchor, so a truncated tail shows.
/// Returns `{"ok", "entries", "keyed", "beyond_head", "head", "first_broken": {"seq",
/// "reason"} | None}`; a chain that does not verify is a report with `ok` false, not an
/// exception. Raises `RecorderError` when the file is missing or not a recorder, or the key
/// does not match.
#[pyfunction]
#[pyo3(signature = (path, *, key_file = None, head = true))]
pub fn verify<'py>(
    py: Python<'py>,
    path: PathBuf,
    key_file: Option<PathBuf>,
    head: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let options = VerifyOptions {
        hmac_key: key(key_file.as_deref())?,
        head: if head {
            HeadSource::Sidecar
        } else {
            HeadSource::None
        },
    };
    let report = py
        .detach(move || agl_gov::verify(&path, &options))
        .map_err(error::gov)?;
    report_dict(py, &report)
}

fn report_dict<'py>(
    py: Python<'py>,
    report: &agl_gov::VerifyReport,
) -> PyResult<Bound<'py, PyAny>> {
    let mut value =
        serde_json::to_value(report).map_err(|e| error::invalid(format!("report: {e}")))?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert("ok".into(), report.ok().into());
    }
    Ok(pythonize(py, &value)?)
}
