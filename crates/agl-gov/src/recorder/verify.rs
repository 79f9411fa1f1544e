//! Verification of a flight-recorder chain: every row's hash recomputed from its columns, the
//! links, the sequence numbers, the denormalised columns, and the head anchor.
//!
//! Responsible for [`verify`], [`verify_lines`] and the [`Head`] anchor file. Not responsible
//! for writing entries or for deciding what to do about a broken chain (the caller decides; the
//! recorder refuses to append to one).

use std::fmt;
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::entry::{ChainHasher, GENESIS_HASH, RecordEntry, canonical_string};
use super::store::{self, COLUMNS, RawRow, rec_err, sql_err};
use crate::error::GovError;

/// The head anchor: the last committed entry of a chain. The recorder writes it as JSON to
/// `<database path>.head` after every committed batch (temp file + rename); keep a copy
/// elsewhere to detect deleting the tail together with the sidecar.
///
/// JSON: `{"seq": 42, "hash": "<64 hex>", "count": 42, "mac": "<64 hex>" | null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// `seq` of the last entry.
    pub seq: u64,
    /// `hash` of the last entry.
    pub hash: String,
    /// Number of entries (equals `seq`, since seq starts at 1 without gaps).
    pub count: u64,
    /// `hex(HMAC-SHA-256(key, "<seq>|<hash>"))` for a keyed chain, `null` otherwise.
    pub mac: Option<String>,
}

impl Head {
    /// The sidecar file of the database at `db`: the same path with `.head` appended
    /// (`runs/audit.db` → `runs/audit.db.head`).
    pub fn sidecar_path(db: &Path) -> PathBuf {
        let mut s = db.as_os_str().to_os_string();
        s.push(".head");
        PathBuf::from(s)
    }

    /// Reads a head file (JSON, see [`Head`]).
    ///
    /// # Errors
    /// [`GovError::Io`] when it cannot be read, [`GovError::Recorder`] when it is not a head.
    pub fn read(path: &Path) -> Result<Head, GovError> {
        let bytes = std::fs::read(path).map_err(|source| GovError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| rec_err(path, format!("not a flight-recorder head file: {e}")))
    }

    /// Writes this head to `path` atomically (`<path>.tmp`, then rename).
    ///
    /// # Errors
    /// [`GovError::Io`] naming the file that could not be written or renamed.
    pub fn write_atomic(&self, path: &Path) -> Result<(), GovError> {
        let mut tmp = path.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let json = serde_json::to_vec(self).map_err(|e| rec_err(path, e.to_string()))?;
        std::fs::write(&tmp, json).map_err(|source| GovError::Io {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, path).map_err(|source| GovError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Where [`verify`] gets the head anchor from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HeadSource {
    /// `<database path>.head`, written by the recorder. A missing sidecar on a non-empty
    /// database is reported as broken (a truncated tail could not be ruled out).
    #[default]
    Sidecar,
    /// A head stored elsewhere by the caller (e.g. copied at the end of a run).
    Explicit(Head),
    /// No anchor: tail truncation is not checked.
    None,
}

/// Options of [`verify`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct VerifyOptions {
    /// The HMAC key of a keyed chain (required for one; refused for an unkeyed chain).
    pub hmac_key: Option<Vec<u8>>,
    /// Where the head anchor comes from.
    pub head: HeadSource,
}

impl fmt::Debug for VerifyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("hmac_key", &self.hmac_key.as_ref().map(|_| "<redacted>"))
            .field("head", &self.head)
            .finish()
    }
}

/// The first entry at which a chain stops verifying.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenEntry {
    /// The entry that is broken: the changed or reordered row, the first missing seq of a gap
    /// or of a truncated tail.
    pub seq: u64,
    /// What is wrong, e.g. "hash mismatch: a column of this entry was changed".
    pub reason: String,
}

/// Result of verifying a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Entries that verified before the first broken one (all of them when ok).
    pub entries: u64,
    /// Head of the verified entries (seq, hash, count, mac when keyed); `None` when none
    /// verified.
    pub head: Option<Head>,
    /// Whether the chain is keyed (HMAC-SHA-256).
    pub keyed: bool,
    /// Entries after the head anchor's seq (committed but not yet anchored, e.g. the process
    /// died between a commit and the head write). They verify as a chain but are not anchored.
    pub beyond_head: u64,
    /// The first broken entry, if any.
    pub first_broken: Option<BrokenEntry>,
}

impl VerifyReport {
    /// True when the chain verified completely, head anchor included.
    pub fn ok(&self) -> bool {
        self.first_broken.is_none()
    }

    /// Same as [`VerifyReport::ok`].
    pub fn is_ok(&self) -> bool {
        self.ok()
    }
}

/// Verifies the recorder database at `path` (opened read-only): recomputes every hash from the
/// row's columns, checks links and seq, that denormalised columns equal the action / decision
/// JSON, and that the head anchor matches the last entry.
///
/// # Errors
/// [`GovError::Io`] when the file does not exist; [`GovError::Recorder`] when it is not a
/// SQLite database, lacks the schema, is keyed and no key was given, is unkeyed and a key was
/// given, or the key is wrong. A database that reads but does not verify is an `Ok` report
/// with [`VerifyReport::first_broken`] set.
pub fn verify(path: &Path, options: &VerifyOptions) -> Result<VerifyReport, GovError> {
    let conn = store::open_ro(path)?;
    verify_conn(&conn, path, options)
}

fn broken(seq: u64, reason: impl Into<String>) -> Option<BrokenEntry> {
    Some(BrokenEntry {
        seq,
        reason: reason.into(),
    })
}

/// The head to check against: `Ok(Some)`, `Ok(None)` (no anchor wanted), or `Err(reason)` for
/// a missing / unreadable sidecar.
fn expected_head(path: &Path, source: &HeadSource) -> Result<Option<Head>, String> {
    match source {
        HeadSource::None => Ok(None),
        HeadSource::Explicit(h) => Ok(Some(h.clone())),
        HeadSource::Sidecar => {
            let side = Head::sidecar_path(path);
            if !side.exists() {
                return Err(format!(
                    "head file `{}` is missing: a truncated tail cannot be ruled out",
                    side.display()
                ));
            }
            Head::read(&side).map(Some).map_err(|e| e.to_string())
        }
    }
}

/// Consistency of the denormalised columns with the action and violations JSON.
fn check_denormalised(e: &RecordEntry) -> Result<(), String> {
    let ctx = &e.action.context;
    let mismatch =
        |col: &str, with: &str| Err(format!("column `{col}` does not match {with} (edited)"));
    if e.agent_id != ctx.agent_id {
        return mismatch("agent_id", "action.context.agent_id");
    }
    if e.rollout_id != ctx.rollout_id {
        return mismatch("rollout_id", "action.context.rollout_id");
    }
    if e.attempt_id != ctx.attempt_id {
        return mismatch("attempt_id", "action.context.attempt_id");
    }
    if e.step != ctx.step {
        return mismatch("step", "action.context.step");
    }
    if e.action_type != e.action.kind.type_name() {
        return mismatch("action_type", "action.kind.type");
    }
    let mut policies: Vec<&str> = Vec::new();
    for v in &e.violations {
        if !policies.contains(&v.policy.as_str()) {
            policies.push(v.policy.as_str());
        }
    }
    if e.policies
        .iter()
        .map(String::as_str)
        .ne(policies.iter().copied())
    {
        return mismatch("policies", "the policies of `violations`");
    }
    if e.severity != e.violations.iter().map(|v| v.severity).max() {
        return mismatch("severity", "the highest severity of `violations`");
    }
    Ok(())
}

/// Verifies the chain in `conn` (see [`verify`]).
pub(crate) fn verify_conn(
    conn: &Connection,
    path: &Path,
    options: &VerifyOptions,
) -> Result<VerifyReport, GovError> {
    let meta = store::read_meta(conn, path)?;
    let hasher = ChainHasher::new(options.hmac_key.as_deref());
    store::check_key(&meta, &hasher, path)?;
    let head = expected_head(path, &options.head);

    let err = |e: rusqlite::Error| sql_err(path, "reading entries", &e);
    let mut stmt = conn
        .prepare(&format!("SELECT {COLUMNS} FROM entries ORDER BY seq"))
        .map_err(err)?;
    let mut rows = stmt.query([]).map_err(err)?;
    let mut verified: u64 = 0;
    let mut prev = GENESIS_HASH.to_string();
    let anchor_seq = head.as_ref().ok().and_then(|h| h.as_ref().map(|h| h.seq));
    let mut hash_at_anchor: Option<String> = (anchor_seq == Some(0)).then(|| prev.clone());
    let mut first_broken = None;
    while let Some(row) = rows.next().map_err(err)? {
        let expected = verified + 1;
        let (seq, raw) = RawRow::read(row).map_err(err)?;
        let expected_i = i64::try_from(expected).unwrap_or(i64::MAX);
        if seq < expected_i {
            first_broken = broken(
                expected,
                format!("stored seq {seq} is out of range (seq starts at 1): a forged row"),
            );
            break;
        }
        if seq > expected_i {
            first_broken = broken(
                expected,
                format!(
                    "entry {expected} is missing: the next stored entry is {seq} (rows were deleted)"
                ),
            );
            break;
        }
        let raw = match raw {
            Ok(r) => r,
            Err(m) => {
                first_broken = broken(expected, m);
                break;
            }
        };
        if raw.prev_hash != prev {
            let what = if expected == 1 {
                "the genesis hash".to_string()
            } else {
                format!("the hash of entry {}", expected - 1)
            };
            first_broken = broken(
                expected,
                format!(
                    "prev_hash does not link to {what} (an entry was inserted, replaced or reordered)"
                ),
            );
            break;
        }
        let canonical = match raw
            .hash_input()
            .and_then(|v| canonical_string(&v).map_err(|e| e.to_string()))
        {
            Ok(c) => c,
            Err(m) => {
                first_broken = broken(expected, m);
                break;
            }
        };
        if hasher.entry_hash(&raw.prev_hash, &canonical) != raw.hash {
            first_broken = broken(
                expected,
                "hash mismatch: a column of this entry was changed",
            );
            break;
        }
        if let Err(m) = raw.to_entry().and_then(|e| check_denormalised(&e)) {
            first_broken = broken(expected, m);
            break;
        }
        verified = expected;
        prev = raw.hash;
        if anchor_seq == Some(verified) {
            hash_at_anchor = Some(prev.clone());
        }
    }
    drop(rows);

    let mut beyond_head = 0;
    if first_broken.is_none() {
        match head {
            Err(reason) => {
                if verified > 0 {
                    first_broken = broken(verified, reason);
                }
            }
            Ok(None) => {}
            Ok(Some(h)) => {
                if hasher.keyed() && h.mac != hasher.head_mac(h.seq, &h.hash) {
                    first_broken = broken(
                        h.seq,
                        "head anchor is not authenticated: its MAC does not match the key \
                         (the head was rewritten without the key)",
                    );
                } else if h.count != h.seq {
                    first_broken = broken(
                        h.seq,
                        format!(
                            "head anchor is inconsistent: count {} != seq {}",
                            h.count, h.seq
                        ),
                    );
                } else if h.seq > verified {
                    first_broken = broken(
                        verified + 1,
                        format!(
                            "truncated tail: head says seq {} / hash {}, database ends at seq {verified}",
                            h.seq, h.hash
                        ),
                    );
                } else if hash_at_anchor.as_deref() != Some(h.hash.as_str()) {
                    first_broken = broken(
                        h.seq,
                        format!(
                            "entry {} does not have the head's hash {} (the chain was rewritten)",
                            h.seq, h.hash
                        ),
                    );
                } else {
                    beyond_head = verified - h.seq;
                }
            }
        }
    }
    Ok(VerifyReport {
        entries: verified,
        head: (verified > 0).then(|| Head {
            seq: verified,
            mac: hasher.head_mac(verified, &prev),
            hash: prev,
            count: verified,
        }),
        keyed: hasher.keyed(),
        beyond_head,
        first_broken,
    })
}

/// Verifies a JSON Lines export of an unkeyed chain that starts at entry 1 (lines without
/// trailing newlines, e.g. `agl audit export --format jsonl` output or
/// [`FlightRecorder::lines`](super::FlightRecorder::lines)). No head anchor is checked. Use
/// [`verify`] on the database for keyed chains.
pub fn verify_lines<I, S>(lines: I) -> VerifyReport
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let hasher = ChainHasher::Plain;
    let mut verified = 0u64;
    let mut prev = GENESIS_HASH.to_string();
    let mut first_broken = None;
    for line in lines {
        let expected = verified + 1;
        if let Err(reason) = check_line(line.as_ref(), expected, &prev, &hasher) {
            first_broken = broken(expected, reason);
            break;
        }
        if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line.as_ref())
            && let Some(Value::String(h)) = m.get("hash")
        {
            prev = h.clone();
        }
        verified = expected;
    }
    VerifyReport {
        entries: verified,
        head: (verified > 0).then_some(Head {
            seq: verified,
            hash: prev,
            count: verified,
            mac: None,
        }),
        keyed: false,
        beyond_head: 0,
        first_broken,
    }
}

fn check_line(line: &str, expected: u64, prev: &str, hasher: &ChainHasher) -> Result<(), String> {
    let mut value: Value =
        serde_json::from_str(line).map_err(|e| format!("line is not valid JSON: {e}"))?;
    let entry: RecordEntry = serde_json::from_value(value.clone())
        .map_err(|e| format!("line is not a flight-recorder entry: {e}"))?;
    if entry.seq != expected {
        return Err(format!(
            "seq {} where {expected} was expected (an entry was deleted, duplicated or reordered)",
            entry.seq
        ));
    }
    if entry.prev_hash != prev {
        return Err("prev_hash does not link to the previous entry's hash".to_string());
    }
    if let Value::Object(map) = &mut value {
        map.remove("hash");
    }
    let canonical = canonical_string(&value).map_err(|e| e.to_string())?;
    if hasher.entry_hash(prev, &canonical) != entry.hash {
        return Err("hash mismatch: the entry's content was changed".to_string());
    }
    check_denormalised(&entry)
}
