//! The flight recorder on the governance pages (`agl store --audit-db FILE`): the chain's
//! status (`agl_gov::RecorderReader::verify`, the check `agl audit verify` runs), its summary
//! counts, and its entries one page at a time.
//!
//! Verifying rereads every entry (about a second per few hundred thousand), so a result is
//! kept and re-checked only when the database has new entries and the last check is older
//! than [`RECHECK`]; the page says when the shown result was computed and over how many
//! entries. The database is opened read-only for every read (the recorder of a running
//! training may be appending to it; readers see what it committed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agl_core::now_seconds;
use agl_gov::{HeadSource, Page, Query, RecorderReader, Summary, VerifyOptions, VerifyReport};
use serde::Serialize;
use tokio::sync::Mutex;

/// Least time between two verifications of a growing database.
pub(crate) const RECHECK: Duration = Duration::from_secs(30);

/// What the governance page shows of the chain.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChainStatus {
    pub(crate) path: String,
    /// `verified`, `broken`, `error`, or `waiting` (no file yet).
    pub(crate) state: &'static str,
    pub(crate) keyed: bool,
    pub(crate) entries: u64,
    pub(crate) beyond_head: u64,
    pub(crate) head_hash: Option<String>,
    /// The first broken entry, or the error.
    pub(crate) problem: Option<String>,
    /// When it was computed (UTC text) and how long it took, seconds.
    pub(crate) checked_at: String,
    pub(crate) seconds: f64,
    pub(crate) summary: Option<Summary>,
}

struct Checked {
    /// The last entry's seq when it was computed (0 = empty).
    last_seq: u64,
    at: Instant,
    status: ChainStatus,
}

/// A flight-recorder database shown by the dashboard.
pub(crate) struct AuditDb {
    path: PathBuf,
    key: Option<Vec<u8>>,
    checked: Mutex<Option<Checked>>,
}

/// The last committed entry's seq, walking from the head anchor (entries are seq 1..=n
/// without gaps; the walk reads only the entries past the anchor).
fn last_seq(reader: &RecorderReader) -> Result<u64, String> {
    let head = agl_gov::Head::read(&agl_gov::Head::sidecar_path(reader.path())).ok();
    let mut seq = head.map_or(0, |h| h.seq);
    loop {
        let page = reader
            .query(&Query {
                after_seq: Some(seq),
                limit: 10_000,
                ..Query::default()
            })
            .map_err(|e| e.to_string())?;
        match page.next_cursor {
            Some(next) if page.more => seq = next,
            Some(next) => return Ok(next),
            None => return Ok(seq),
        }
    }
}

impl ChainStatus {
    /// The status of a check of `path` that failed (`state` `error`) after `seconds`.
    fn failed(path: &Path, problem: String, seconds: f64) -> ChainStatus {
        ChainStatus {
            path: path.display().to_string(),
            state: "error",
            keyed: false,
            entries: 0,
            beyond_head: 0,
            head_hash: None,
            problem: Some(problem),
            checked_at: super::view::time(Some(now_seconds())),
            seconds,
            summary: None,
        }
    }
}

fn check(path: &Path, key: Option<&[u8]>) -> (u64, ChainStatus) {
    let started = Instant::now();
    let failed =
        |problem: String| ChainStatus::failed(path, problem, started.elapsed().as_secs_f64());
    if !path.exists() {
        return (
            0,
            ChainStatus {
                state: "waiting",
                ..failed(format!(
                    "no database at {} yet (`agl train --audit-log {}` creates it)",
                    path.display(),
                    path.display()
                ))
            },
        );
    }
    let reader = match RecorderReader::open(path) {
        Ok(r) => r,
        Err(e) => return (0, failed(e.to_string())),
    };
    let report: VerifyReport = match reader.verify(&VerifyOptions {
        hmac_key: key.map(<[u8]>::to_vec),
        head: HeadSource::Sidecar,
    }) {
        Ok(r) => r,
        Err(e) => return (0, failed(e.to_string())),
    };
    // A verified chain has seq 1..=entries; a broken one is walked.
    let seq = if report.ok() {
        report.entries
    } else {
        last_seq(&reader).unwrap_or(report.entries)
    };
    let summary = reader.summary().ok();
    let status = ChainStatus {
        path: path.display().to_string(),
        state: if report.ok() { "verified" } else { "broken" },
        keyed: report.keyed,
        entries: report.entries,
        beyond_head: report.beyond_head,
        head_hash: report.head.as_ref().map(|h| h.hash.clone()),
        problem: report
            .first_broken
            .as_ref()
            .map(|b| format!("entry {}: {}", b.seq, b.reason)),
        checked_at: super::view::time(Some(now_seconds())),
        seconds: started.elapsed().as_secs_f64(),
        summary,
    };
    (seq, status)
}

/// The recorder query of `/governance/audit`'s parameters (empty ones are no filter); the
/// error names the bad one.
pub(crate) fn entry_query(
    rollout_id: &str,
    policy: &str,
    verdict: &str,
    severity: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Query, String> {
    let some = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    Ok(Query {
        rollout_id: some(rollout_id),
        policy: some(policy),
        verdict: match verdict.trim() {
            "" => None,
            v => Some(
                v.parse()
                    .map_err(|_| format!("`{v}` is not a verdict (allow, warn, modify, block)"))?,
            ),
        },
        severity: match severity.trim() {
            "" => None,
            v => {
                Some(v.parse().map_err(|_| {
                    format!("`{v}` is not a severity (low, medium, high, critical)")
                })?)
            }
        },
        after_seq: after,
        limit,
        ..Query::default()
    })
}

impl AuditDb {
    /// The database at `path`. One that exists is checked now, so that a file that is not a
    /// flight recorder, or a key that does not fit it, fails at start-up; a missing one is
    /// awaited (the training run that writes it may start after the server).
    ///
    /// # Errors
    /// The file is not a flight-recorder database, or the key does not fit it.
    pub(crate) fn open(path: &Path, key: Option<Vec<u8>>) -> Result<AuditDb, String> {
        let db = AuditDb {
            path: path.to_path_buf(),
            key,
            checked: Mutex::new(None),
        };
        if !path.exists() {
            return Ok(db);
        }
        let reader = RecorderReader::open(path)
            .map_err(|e| format!("--audit-db {}: {e}", path.display()))?;
        let keyed = reader
            .keyed()
            .map_err(|e| format!("--audit-db {}: {e}", path.display()))?;
        match (keyed, db.key.is_some()) {
            (false, true) => Err(format!(
                "--audit-db {}: the chain is not keyed, but a key was given",
                path.display()
            )),
            (true, false) => Err(format!(
                "--audit-db {}: the chain is keyed (HMAC-SHA-256): give its key with \
                 --audit-key-file (or ${})",
                path.display(),
                agl_gov::AUDIT_KEY_FILE_ENV
            )),
            _ => Ok(db),
        }
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The chain's status, recomputed when the database grew and the last result is older
    /// than [`RECHECK`].
    pub(crate) async fn status(&self) -> ChainStatus {
        let mut checked = self.checked.lock().await;
        // A database that did not exist is looked for again on every view, and checked as
        // soon as it exists (even before its first entry).
        if let Some(c) = checked.as_ref().filter(|c| c.status.state == "waiting")
            && !self.path.exists()
        {
            return c.status.clone();
        }
        if let Some(c) = checked.as_ref().filter(|c| c.status.state != "waiting") {
            if c.at.elapsed() < RECHECK {
                return c.status.clone();
            }
            let (path, from) = (self.path.clone(), c.last_seq);
            let grew = tokio::task::spawn_blocking(move || {
                RecorderReader::open(&path).and_then(|r| {
                    r.query(&Query {
                        after_seq: Some(from),
                        limit: 1,
                        ..Query::default()
                    })
                })
            })
            .await;
            if matches!(grew, Ok(Ok(Page { ref entries, .. })) if entries.is_empty())
                && let Some(c) = checked.as_mut()
            {
                c.at = Instant::now();
                return c.status.clone();
            }
        }
        let (path, key) = (self.path.clone(), self.key.clone());
        let (last_seq, status) =
            match tokio::task::spawn_blocking(move || check(&path, key.as_deref())).await {
                Ok(r) => r,
                Err(e) => (
                    0,
                    ChainStatus::failed(&self.path, format!("the check did not finish: {e}"), 0.0),
                ),
            };
        *checked = Some(Checked {
            last_seq,
            at: Instant::now(),
            status: status.clone(),
        });
        status
    }

    /// One page of entries matching `q`, oldest first.
    ///
    /// # Errors
    /// The database cannot be read, as text.
    pub(crate) async fn entries(&self, q: Query) -> Result<Page, String> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            RecorderReader::open(&path)
                .and_then(|r| r.query(&q))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("the query did not finish: {e}"))?
    }
}
