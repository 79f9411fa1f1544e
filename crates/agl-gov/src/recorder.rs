//! The flight recorder: a tamper-evident, append-only JSON Lines audit log whose entries form
//! a SHA-256 hash chain, and the verifier that recomputes that chain.
//!
//! Responsible for writing one line per kernel decision (thread-safe, flushed per line) and for
//! [`verify`] / [`verify_lines`]. Not responsible for deciding anything, for rotating or
//! compressing logs, or for anchoring the head hash somewhere external.
//!
//! # Line format
//! Each line is one [`RecordEntry`] serialized by `serde_json` with the fields in this order:
//! `seq` (u64, from 1), `time` (f64 unix seconds, microsecond resolution), `rollout_id`
//! (string or null), `action` ([`Action`] JSON), `verdict`, `mode`, `policies` (violated policy
//! names, deduplicated), `severity` (highest severity or null), `violations`, `prev_hash`
//! (64 lowercase hex digits; 64 zeros for the first entry), `hash`.
//!
//! # Hash
//! `hash = hex(SHA-256(prev_hash as ASCII hex text ‖ canonical JSON of the entry without its
//! "hash" field))`, where canonical JSON is `serde_json`'s compact serialization of the entry as
//! a JSON object with all object keys sorted bytewise (recursively) and no whitespace. The
//! recorder sorts keys itself, so the result does not depend on serde_json's `preserve_order`
//! feature.
//!
//! # What verification detects
//! [`verify`] re-reads every line, re-computes every hash, checks that `prev_hash` links to the
//! previous entry's `hash` and that `seq` goes 1, 2, 3, … It also checks that each line is
//! byte-for-byte the recorder's own serialization of the entry it contains, so even edits that
//! keep the JSON meaning (e.g. changing the case of a `\u00e9` escape) are caught. It reports the
//! FIRST broken line: a changed byte breaks that line; a deleted entry breaks the line after the
//! hole (seq gap); two swapped entries break the first of them.
//!
//! Truncating the tail (removing the last k entries) leaves a valid shorter chain and is NOT
//! detectable from the file alone. [`VerifyReport::head_hash`] is returned so a caller can anchor
//! the head hash externally (e.g. print it at the end of a run, store it in a results file) and
//! compare it later.

use std::fmt;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::action::Action;
use crate::error::GovError;
use crate::types::{Decision, GovernanceMode, Severity, Verdict, Violation};

/// The `prev_hash` of the first entry: 64 ASCII zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One line of the flight recorder. Field order is fixed (it is the serialization order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordEntry {
    /// Sequence number, 1 for the first entry, +1 per entry.
    pub seq: u64,
    /// When the decision was recorded, unix seconds (microsecond resolution).
    pub time: f64,
    /// The action's rollout id, copied for easy filtering.
    pub rollout_id: Option<String>,
    /// The action that was checked.
    pub action: Action,
    /// The kernel's verdict.
    pub verdict: Verdict,
    /// The kernel's mode.
    pub mode: GovernanceMode,
    /// Names of violated policies, in order, deduplicated ([`Decision::policies`]).
    pub policies: Vec<String>,
    /// Highest violation severity, if any ([`Decision::max_severity`]).
    pub severity: Option<Severity>,
    /// All violations of the decision.
    pub violations: Vec<Violation>,
    /// `hash` of the previous entry, or [`GENESIS_HASH`] for the first.
    pub prev_hash: String,
    /// Hex SHA-256 of `prev_hash` text followed by the canonical JSON of this entry without
    /// `hash` (see the module docs).
    pub hash: String,
}

impl RecordEntry {
    /// Recomputes this entry's hash from its other fields (ignores the current `hash` value).
    ///
    /// # Errors
    /// [`GovError::Serialize`] if the entry cannot be turned into JSON (does not happen for
    /// entries built by the recorder).
    pub fn compute_hash(&self) -> Result<String, GovError> {
        let value = serde_json::to_value(self).map_err(|source| GovError::Serialize {
            seq: self.seq,
            source,
        })?;
        hash_of_value(&self.prev_hash, value).map_err(|source| GovError::Serialize {
            seq: self.seq,
            source,
        })
    }
}

/// Canonical form: objects rebuilt with keys inserted in sorted order, recursively.
fn canonicalize(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k, canonicalize(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonicalize).collect()),
        other => other,
    }
}

/// hex(SHA-256(prev_hash ‖ canonical JSON of `entry` without its "hash" key)).
fn hash_of_value(prev_hash: &str, mut entry: Value) -> Result<String, serde_json::Error> {
    if let Value::Object(map) = &mut entry {
        map.remove("hash");
    }
    let canonical = serde_json::to_string(&canonicalize(entry))?;
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(canonical.as_bytes());
    Ok(hex::encode(hasher.finalize()))
}

enum Sink {
    File(BufWriter<File>),
    Memory(Vec<String>),
}

struct Inner {
    sink: Sink,
    /// Number of entries written so far (= seq of the last entry).
    written: u64,
    /// Hash of the last entry, or [`GENESIS_HASH`].
    head: String,
}

/// Tamper-evident append-only audit log (JSON Lines, SHA-256 hash chain). Thread-safe.
///
/// See the module documentation for the line format, the hash, and what verification detects.
pub struct FlightRecorder {
    path: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("path", &self.path)
            .field("entries", &self.entries())
            .finish()
    }
}

fn now_unix_seconds() -> f64 {
    // Microsecond resolution keeps the decimal form short enough (< 2^53 significand) to
    // round-trip exactly through JSON text.
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    micros as f64 / 1e6
}

impl FlightRecorder {
    /// Creates (or truncates) the JSON Lines file at `path`, creating its parent directory if
    /// needed.
    ///
    /// # Errors
    /// [`GovError::Io`] naming the directory or file that could not be created.
    pub fn create(path: &Path) -> Result<Self, GovError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|source| GovError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let file = File::create(path).map_err(|source| GovError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(FlightRecorder {
            path: Some(path.to_path_buf()),
            inner: Mutex::new(Inner {
                sink: Sink::File(BufWriter::new(file)),
                written: 0,
                head: GENESIS_HASH.to_string(),
            }),
        })
    }

    /// A recorder that keeps its lines in memory (for tests, and when no audit-log file is
    /// configured). Read them back with [`FlightRecorder::lines`].
    pub fn in_memory() -> Self {
        FlightRecorder {
            path: None,
            inner: Mutex::new(Inner {
                sink: Sink::Memory(Vec::new()),
                written: 0,
                head: GENESIS_HASH.to_string(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; recover the state if it ever happened.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file this recorder writes, `None` for an in-memory recorder.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The lines written so far (without trailing newlines) for an in-memory recorder; an
    /// empty vector for a file recorder (read the file, or use [`verify`]).
    pub fn lines(&self) -> Vec<String> {
        match &self.lock().sink {
            Sink::Memory(lines) => lines.clone(),
            Sink::File(_) => Vec::new(),
        }
    }

    /// Number of entries appended so far (the `seq` of the last entry).
    pub fn entries(&self) -> u64 {
        self.lock().written
    }

    /// Hash of the last entry ([`GENESIS_HASH`] before the first append). Anchor this value
    /// externally to make tail truncation detectable.
    pub fn head_hash(&self) -> String {
        self.lock().head.clone()
    }

    /// Appends one entry for `decision` about `action`, writes it as one line and flushes it.
    /// Thread-safe: concurrent appends are serialized and get consecutive `seq` numbers.
    ///
    /// # Errors
    /// [`GovError::Io`] when the line cannot be written or flushed, [`GovError::Serialize`]
    /// when the entry cannot be serialized. On error the chain head does not advance.
    pub fn append(&self, action: &Action, decision: &Decision) -> Result<RecordEntry, GovError> {
        let mut inner = self.lock();
        let seq = inner.written + 1;
        let mut entry = RecordEntry {
            seq,
            time: now_unix_seconds(),
            rollout_id: action.context.rollout_id.clone(),
            action: action.clone(),
            verdict: decision.verdict,
            mode: decision.mode,
            policies: decision
                .policies()
                .into_iter()
                .map(str::to_string)
                .collect(),
            severity: decision.max_severity(),
            violations: decision.violations.clone(),
            prev_hash: inner.head.clone(),
            hash: String::new(),
        };
        entry.hash = entry.compute_hash()?;
        let line =
            serde_json::to_string(&entry).map_err(|source| GovError::Serialize { seq, source })?;
        match &mut inner.sink {
            Sink::File(w) => {
                let path = self.path.clone().unwrap_or_default();
                w.write_all(line.as_bytes())
                    .and_then(|()| w.write_all(b"\n"))
                    .and_then(|()| w.flush())
                    .map_err(|source| GovError::Io { path, source })?;
            }
            Sink::Memory(lines) => lines.push(line),
        }
        inner.written = seq;
        inner.head = entry.hash.clone();
        Ok(entry)
    }

    /// Same as the free function [`verify`].
    ///
    /// # Errors
    /// [`GovError::Io`] when the file cannot be read.
    pub fn verify(path: &Path) -> Result<VerifyReport, GovError> {
        verify(path)
    }

    /// Same as the free function [`verify_lines`].
    pub fn verify_lines<I, S>(lines: I) -> VerifyReport
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        verify_lines(lines)
    }
}

/// The first line at which a recorder log stops verifying.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenEntry {
    /// 1-based line number in the file (or position in the iterator).
    pub line: usize,
    /// The `seq` written on that line, when it could be read.
    pub seq: Option<u64>,
    /// What is wrong, e.g. "hash mismatch: the entry's content was changed".
    pub reason: String,
}

/// Result of verifying a recorder log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Number of entries that verified before the first broken line (all of them when ok).
    pub entries: u64,
    /// `hash` of the last entry that verified; `None` when none did (e.g. an empty log).
    /// Compare it with an externally anchored value to detect tail truncation.
    pub head_hash: Option<String>,
    /// The first broken line, if any.
    pub first_broken: Option<BrokenEntry>,
}

impl VerifyReport {
    /// True when every line verified.
    pub fn is_ok(&self) -> bool {
        self.first_broken.is_none()
    }
}

struct Verifier {
    entries: u64,
    prev: String,
}

impl Verifier {
    fn new() -> Self {
        Verifier {
            entries: 0,
            prev: GENESIS_HASH.to_string(),
        }
    }

    /// Checks one line; `Err((seq, reason))` when it is broken.
    fn feed(&mut self, line: &str) -> Result<(), (Option<u64>, String)> {
        let value: Value = serde_json::from_str(line)
            .map_err(|e| (None, format!("line is not valid JSON: {e}")))?;
        let seq = value.get("seq").and_then(Value::as_u64);
        let entry: RecordEntry = serde_json::from_value(value.clone())
            .map_err(|e| (seq, format!("line is not a flight-recorder entry: {e}")))?;
        let expected = self.entries + 1;
        if entry.seq != expected {
            return Err((
                seq,
                format!(
                    "seq {} where {expected} was expected (an entry was deleted, duplicated or reordered)",
                    entry.seq
                ),
            ));
        }
        if entry.prev_hash != self.prev {
            return Err((
                seq,
                "prev_hash does not match the hash of the previous entry".to_string(),
            ));
        }
        let recomputed = hash_of_value(&entry.prev_hash, value)
            .map_err(|e| (seq, format!("cannot canonicalize the entry: {e}")))?;
        if recomputed != entry.hash {
            return Err((
                seq,
                "hash mismatch: the entry's content was changed".to_string(),
            ));
        }
        let reserialized = serde_json::to_string(&entry)
            .map_err(|e| (seq, format!("cannot re-serialize the entry: {e}")))?;
        if reserialized != line {
            return Err((
                seq,
                "line bytes differ from the recorder's serialization of its content".to_string(),
            ));
        }
        self.entries = expected;
        self.prev = entry.hash;
        Ok(())
    }

    fn report(self, first_broken: Option<BrokenEntry>) -> VerifyReport {
        VerifyReport {
            entries: self.entries,
            head_hash: (self.entries > 0).then_some(self.prev),
            first_broken,
        }
    }
}

/// Verifies recorder lines (without trailing newlines), stopping at the first broken one.
/// An empty input verifies with `entries == 0` and no head hash.
pub fn verify_lines<I, S>(lines: I) -> VerifyReport
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut v = Verifier::new();
    for (i, line) in lines.into_iter().enumerate() {
        if let Err((seq, reason)) = v.feed(line.as_ref()) {
            return v.report(Some(BrokenEntry {
                line: i + 1,
                seq,
                reason,
            }));
        }
    }
    v.report(None)
}

/// Verifies the recorder file at `path` (see the module docs for what is detected). A final
/// newline is expected after the last entry; an empty file verifies with `entries == 0`.
///
/// # Errors
/// [`GovError::Io`] when the file cannot be read. A file that reads but does not verify is an
/// `Ok` report with [`VerifyReport::first_broken`] set.
pub fn verify(path: &Path) -> Result<VerifyReport, GovError> {
    let bytes = fs::read(path).map_err(|source| GovError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut v = Verifier::new();
    let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    if body.is_empty() {
        return Ok(v.report(None));
    }
    for (i, raw) in body.split(|&b| b == b'\n').enumerate() {
        let result = match std::str::from_utf8(raw) {
            Ok(line) => v.feed(line),
            Err(e) => Err((None, format!("line is not valid UTF-8: {e}"))),
        };
        if let Err((seq, reason)) = result {
            return Ok(v.report(Some(BrokenEntry {
                line: i + 1,
                seq,
                reason,
            })));
        }
    }
    Ok(v.report(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(verdict: Verdict) -> Decision {
        Decision {
            verdict,
            mode: GovernanceMode::Enforce,
            violations: vec![],
            rewritten: None,
            signals: vec![],
        }
    }

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let v = serde_json::json!({"b": 1, "a": {"z": [ {"y": 1, "x": 2} ], "c": null}});
        let s = serde_json::to_string(&canonicalize(v)).unwrap();
        assert_eq!(s, r#"{"a":{"c":null,"z":[{"x":2,"y":1}]},"b":1}"#);
    }

    #[test]
    fn first_entry_links_to_genesis_and_hash_matches_the_documented_formula() {
        let rec = FlightRecorder::in_memory();
        let e = rec
            .append(&Action::sql("db", "SELECT 1"), &decision(Verdict::Allow))
            .unwrap();
        assert_eq!(e.seq, 1);
        assert_eq!(e.prev_hash, GENESIS_HASH);
        assert_eq!(e.hash.len(), 64);
        // Independent recomputation: sorted-key compact JSON without "hash".
        let mut v: Value = serde_json::from_str(&rec.lines()[0]).unwrap();
        v.as_object_mut().unwrap().remove("hash");
        let canonical = serde_json::to_string(&canonicalize(v)).unwrap();
        let mut h = Sha256::new();
        h.update(GENESIS_HASH.as_bytes());
        h.update(canonical.as_bytes());
        assert_eq!(hex::encode(h.finalize()), e.hash);
        assert_eq!(rec.head_hash(), e.hash);
        assert_eq!(rec.entries(), 1);
    }

    #[test]
    fn line_field_order_is_fixed() {
        let rec = FlightRecorder::in_memory();
        rec.append(&Action::sql("db", "SELECT 1"), &decision(Verdict::Allow))
            .unwrap();
        let line = &rec.lines()[0];
        let keys = [
            "\"seq\"",
            "\"time\"",
            "\"rollout_id\"",
            "\"action\"",
            "\"verdict\"",
            "\"mode\"",
            "\"policies\"",
            "\"severity\"",
            "\"violations\"",
            "\"prev_hash\"",
            "\"hash\"",
        ];
        // Each top-level key appears after the previous one.
        let mut from = 0;
        for k in keys {
            let at = line[from..]
                .find(k)
                .unwrap_or_else(|| panic!("{k} missing or out of order in {line}"));
            from += at + k.len();
        }
        assert!(line.starts_with("{\"seq\":1,\"time\":"), "{line}");
    }

    #[test]
    fn empty_log_verifies_with_no_head() {
        let r = verify_lines(Vec::<String>::new());
        assert!(r.is_ok());
        assert_eq!(r.entries, 0);
        assert_eq!(r.head_hash, None);
    }

    #[test]
    fn equivalent_json_with_different_bytes_is_detected() {
        let rec = FlightRecorder::in_memory();
        rec.append(&Action::sql("db", "SELECT 'é'"), &decision(Verdict::Allow))
            .unwrap();
        let line = rec.lines()[0].replace('é', "\\u00e9");
        let r = verify_lines([line]);
        assert_eq!(r.first_broken.map(|b| b.line), Some(1));
    }

    #[test]
    fn unwritable_path_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let err = FlightRecorder::create(&blocker.join("sub").join("audit.jsonl")).unwrap_err();
        assert!(matches!(err, GovError::Io { .. }));
        assert!(err.to_string().contains("file"));
    }
}
