//! The flight recorder: a durable, tamper-evident, append-only SQLite log with one entry per
//! kernel decision, whose entries form a (optionally HMAC-keyed) SHA-256 hash chain anchored by
//! a head file; plus verification, queries, a summary and a JSON Lines view.
//!
//! Responsible for recording decisions in call order without blocking the check path for long
//! (a background writer commits batches), for [`verify`], and for reads ([`Query`],
//! [`Summary`]). Not responsible for deciding anything, for rotating databases, for exporting to
//! OTLP (the CLI does, from [`RecordEntry`]s), or for keeping the key secret (the caller
//! manages the key file).
//!
//! # Storage
//! A SQLite database (bundled SQLite, WAL journal, `synchronous=NORMAL`) with two tables:
//! * `entries(seq INTEGER PRIMARY KEY, time REAL NOT NULL, agent_id TEXT, rollout_id TEXT,
//!   attempt_id TEXT, step INTEGER, action_type TEXT NOT NULL, action TEXT NOT NULL,
//!   verdict TEXT NOT NULL, mode TEXT NOT NULL, severity TEXT, policies TEXT NOT NULL,
//!   violations TEXT NOT NULL, rewritten TEXT, signals TEXT NOT NULL, prev_hash TEXT NOT NULL,
//!   hash TEXT NOT NULL)`, indexed on `rollout_id`, `verdict`, `time`. `time` is unix seconds
//!   with microsecond resolution; `action`, `policies`, `violations`, `rewritten` and `signals`
//!   hold canonical JSON (see below); `verdict`, `mode`, `severity` the lowercase names.
//! * `meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)`: `format_version` = `1`, `hmac` =
//!   `sha256` (keyed) or `none`, `key_check` = hex HMAC-SHA-256 of a fixed text under the key
//!   (keyed only; lets a wrong key be reported as such — the key itself is never stored),
//!   `policies_query` = `json1`.
//!
//! Policies are queried with SQLite's JSON1 functions on the `policies` column
//! (`EXISTS (SELECT 1 FROM json_each(entries.policies) WHERE value = ?)`); there is no side
//! table, so there is nothing derived to keep consistent or to tamper with.
//!
//! # Hash chain
//! `hash = hex(H(prev_hash ‖ canonical JSON of the entry without "hash"))`. H is SHA-256, or
//! HMAC-SHA-256 under the configured key. `prev_hash` enters as its 64 ASCII hex characters;
//! the first entry's `prev_hash` is [`GENESIS_HASH`] (64 zeros). Canonical JSON is the
//! [`RecordEntry`] JSON object (every column, denormalised ones included) with keys sorted
//! bytewise at every level and no whitespace. `seq` is 1, 2, 3, … without gaps.
//!
//! # Head anchor
//! After every committed batch the writer replaces `<db path>.head` (temp file + rename) with
//! `{"seq": N, "hash": "<hex>", "count": N, "mac": "<hex>" | null}`, `mac` =
//! `hex(HMAC-SHA-256(key, "N|<hash>"))` when keyed. [`verify`] compares the last entry with it.
//!
//! # What verification detects, and what it cannot
//! Detected, with the seq where the chain broke: a changed value in any column (hash, and the
//! JSON columns must be byte-for-byte canonical; denormalised columns must equal the JSON), a
//! deleted row (seq gap), an inserted row (bad link or hash), swapped or reordered rows (link
//! and hash mismatch), a truncated tail (head mismatch), a missing head file, a keyed chain
//! verified without its key, or with a wrong key.
//!
//! Not detected:
//! * **Unkeyed chains:** whoever can write the database can recompute every hash after an
//!   edit and rewrite the sidecar head; only a copy of the head kept elsewhere
//!   ([`HeadSource::Explicit`]) exposes that (the recomputed hash differs from the anchored
//!   one). Without a key, the chain proves integrity against accidents and careless edits,
//!   not against an informed attacker.
//! * **Keyed chains:** deleting the last k rows and putting back an older head file (from the
//!   same run) is indistinguishable from a run that stopped earlier; keep the final head
//!   elsewhere to detect it. Entries appended after the sidecar was last written (a crash
//!   between commit and head write) verify but are reported as
//!   [`VerifyReport::beyond_head`].
//! * Deleting the whole database and its head file together.
//! * With `synchronous=NORMAL`, a power failure can lose the last committed batches; the head
//!   file can then be ahead of the database and verification reports a truncated tail.

mod entry;
mod store;
mod verify;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

use crate::action::Action;
use crate::error::GovError;
use crate::types::Decision;

use entry::{ChainHasher, Row, RowBody};
pub use entry::{GENESIS_HASH, RecordEntry};
pub use store::{Page, Query, RecorderReader, Summary, query_db, summary_db};
use store::{rec_err, sql_err};
pub use verify::{
    BrokenEntry, Head, HeadSource, VerifyOptions, VerifyReport, verify, verify_lines,
};

/// Environment variable naming the HMAC key file the CLI reads when `--key-file` is not given.
pub const AUDIT_KEY_FILE_ENV: &str = "AGL_AUDIT_KEY_FILE";

/// Minimum HMAC key length in bytes.
pub const MIN_KEY_BYTES: usize = 16;

/// Reads an HMAC key: the file's bytes, as they are (at least [`MIN_KEY_BYTES`] bytes).
///
/// # Errors
/// [`GovError::AuditKey`] naming the file when it cannot be read or is too short.
pub fn hmac_key_from_file(path: &Path) -> Result<Vec<u8>, GovError> {
    let key = std::fs::read(path).map_err(|e| GovError::AuditKey {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if key.len() < MIN_KEY_BYTES {
        return Err(GovError::AuditKey {
            path: path.to_path_buf(),
            message: format!(
                "the key is {} bytes; at least {MIN_KEY_BYTES} are required",
                key.len()
            ),
        });
    }
    Ok(key)
}

/// How a [`FlightRecorder`] hashes and writes.
#[derive(Clone, PartialEq, Eq)]
pub struct RecorderConfig {
    /// HMAC-SHA-256 key for the chain; `None` (default) for plain SHA-256. At least
    /// [`MIN_KEY_BYTES`] bytes are recommended ([`hmac_key_from_file`] enforces it).
    pub hmac_key: Option<Vec<u8>>,
    /// Most rows committed in one transaction (default 256; 0 is treated as 1).
    pub batch_size: usize,
    /// Longest time an appended row waits before its batch is committed (default 200 ms).
    pub flush_interval: Duration,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            hmac_key: None,
            batch_size: 256,
            flush_interval: Duration::from_millis(200),
        }
    }
}

impl fmt::Debug for RecorderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecorderConfig")
            .field("hmac_key", &self.hmac_key.as_ref().map(|_| "<redacted>"))
            .field("batch_size", &self.batch_size)
            .field("flush_interval", &self.flush_interval)
            .finish()
    }
}

/// Rows waiting for the writer. Appends push here (in chain order, under the chain lock) and
/// wake the writer only when a batch is full or a flush is requested, so the check path pays
/// no system call per entry.
#[derive(Default)]
struct Queue {
    rows: Vec<Row>,
    /// When the oldest queued row was pushed.
    oldest: Option<Instant>,
    /// Flush tickets handed out so far.
    flush_requested: u64,
    /// Flush tickets whose rows are committed.
    flush_done: u64,
    /// No more rows will come: commit what is queued and stop.
    closed: bool,
    /// The writer has stopped.
    stopped: bool,
}

/// State shared by the recorder and its writer thread.
struct Shared {
    /// `:memory:` or the database file, for error messages.
    label: PathBuf,
    /// The head sidecar (file databases only).
    head_path: Option<PathBuf>,
    conn: Mutex<Option<Connection>>,
    /// First write error; once set, every later append and flush returns it.
    failure: Mutex<Option<String>>,
    /// Head of the committed entries.
    committed: Mutex<Option<verify::Head>>,
    hasher: ChainHasher,
    queue: Mutex<Queue>,
    /// Wakes the writer (batch full, flush requested, closed).
    wake_writer: Condvar,
    /// Wakes flushers and appenders waiting for room (after every commit).
    wake_callers: Condvar,
    batch_size: usize,
    /// Appends wait while this many rows are queued (backpressure).
    max_queued: usize,
    flush_interval: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover the state if it ever happened.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn failed(&self) -> Option<GovError> {
        lock(&self.failure).as_ref().map(|m| {
            rec_err(
                &self.label,
                format!("an earlier write failed, the recorder stopped: {m}"),
            )
        })
    }

    fn fail(&self, message: String) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(message);
        }
    }

    /// Commits `rows` in one transaction, then writes the head.
    fn commit(&self, rows: &mut Vec<Row>) {
        if rows.is_empty() {
            return;
        }
        if lock(&self.failure).is_some() {
            // Never write after a lost batch: the database stays a valid prefix of the chain.
            rows.clear();
            return;
        }
        let result = (|| -> Result<(), String> {
            let mut guard = lock(&self.conn);
            let conn = guard
                .as_mut()
                .ok_or_else(|| "the database is not open".to_string())?;
            let tx = conn.transaction().map_err(|e| e.to_string())?;
            store::insert_rows(&tx, rows).map_err(|e| format!("inserting entries: {e}"))?;
            tx.commit()
                .map_err(|e| format!("committing entries: {e}"))?;
            Ok(())
        })();
        let last = rows.last().map(|r| (r.seq, r.hash.clone()));
        rows.clear();
        if let Err(m) = result {
            self.fail(m);
            return;
        }
        if let Some((seq, hash)) = last {
            let head = verify::Head {
                seq,
                mac: self.hasher.head_mac(seq, &hash),
                hash,
                count: seq,
            };
            if let Some(p) = &self.head_path
                && let Err(e) = head.write_atomic(p)
            {
                self.fail(format!("writing the head file: {e}"));
            }
            *lock(&self.committed) = Some(head);
        }
    }
}

fn writer_loop(shared: &Shared) {
    loop {
        let mut q = lock(&shared.queue);
        loop {
            if q.closed || q.flush_requested > q.flush_done || q.rows.len() >= shared.batch_size {
                break;
            }
            match q.oldest {
                None => {
                    q = shared
                        .wake_writer
                        .wait(q)
                        .unwrap_or_else(|e| e.into_inner())
                }
                Some(t) => {
                    let left =
                        (t + shared.flush_interval).saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    q = shared
                        .wake_writer
                        .wait_timeout(q, left)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
        let mut rows = std::mem::take(&mut q.rows);
        q.oldest = None;
        let ticket = q.flush_requested;
        let closed = q.closed;
        drop(q);
        shared.wake_callers.notify_all();
        shared.commit(&mut rows);
        let mut q = lock(&shared.queue);
        q.flush_done = q.flush_done.max(ticket);
        if closed && q.rows.is_empty() {
            q.stopped = true;
        }
        let stop = q.stopped;
        drop(q);
        shared.wake_callers.notify_all();
        if stop {
            return;
        }
    }
}

/// The chain position, advanced under a short lock so that the chain order is the call order.
struct Chain {
    /// `seq` of the last appended entry (0 before the first).
    seq: u64,
    /// `hash` of the last appended entry ([`GENESIS_HASH`] before the first).
    hash: String,
}

/// Durable, tamper-evident audit log in SQLite (see the module docs). Thread-safe; share it
/// through an `Arc`. Dropping it flushes pending entries.
pub struct FlightRecorder {
    path: Option<PathBuf>,
    shared: Arc<Shared>,
    chain: Mutex<Chain>,
    writer: Mutex<Option<JoinHandle<()>>>,
    hmac_key: Option<Vec<u8>>,
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("path", &self.path)
            .field("entries", &self.entries())
            .field("keyed", &self.shared.hasher.keyed())
            .finish()
    }
}

fn now_unix_seconds() -> f64 {
    // Microsecond resolution: the value round-trips exactly through JSON text and REAL.
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    micros as f64 / 1e6
}

impl FlightRecorder {
    /// Opens the recorder database at `path`, creating it (and its parent directories) when
    /// it does not exist. An existing database continues its chain after being verified
    /// against its head sidecar; a database that does not verify is refused (never append to
    /// a broken chain).
    ///
    /// # Errors
    /// [`GovError::Io`] when a directory cannot be created; [`GovError::Recorder`] when the
    /// file is not a SQLite database or not a recorder database, the key setup does not match
    /// the database's (keyed vs unkeyed, wrong key), or the existing chain does not verify.
    pub fn open(path: &Path, config: RecorderConfig) -> Result<Self, GovError> {
        let hasher = ChainHasher::new(config.hmac_key.as_deref());
        let (conn, _meta) = store::open_rw(path, &hasher)?;
        let report = verify::verify_conn(
            &conn,
            path,
            &VerifyOptions {
                hmac_key: config.hmac_key.clone(),
                head: HeadSource::Sidecar,
            },
        )?;
        if let Some(b) = &report.first_broken {
            return Err(rec_err(
                path,
                format!(
                    "the existing chain does not verify (broken at entry {}: {}); refusing to append to it",
                    b.seq, b.reason
                ),
            ));
        }
        Ok(Self::start(
            Some(path.to_path_buf()),
            Ok(conn),
            hasher,
            report.head,
            config,
        ))
    }

    /// Same as [`FlightRecorder::open`] with the default [`RecorderConfig`] (unkeyed).
    ///
    /// # Errors
    /// As [`FlightRecorder::open`].
    pub fn create(path: &Path) -> Result<Self, GovError> {
        Self::open(path, RecorderConfig::default())
    }

    /// A recorder on a SQLite in-memory database (same code path as a file, no head file).
    /// Infallible: if SQLite cannot open an in-memory database, the first append returns the
    /// error.
    pub fn in_memory() -> Self {
        Self::in_memory_with(RecorderConfig::default())
    }

    /// An in-memory recorder with `config` (e.g. a key).
    pub fn in_memory_with(config: RecorderConfig) -> Self {
        let label = Path::new(":memory:");
        let hasher = ChainHasher::new(config.hmac_key.as_deref());
        let conn = Connection::open_in_memory()
            .map_err(|e| sql_err(label, "cannot open", &e))
            .and_then(|c| store::init_schema(&c, label, &hasher).map(|_| c));
        Self::start(None, conn, hasher, None, config)
    }

    fn start(
        path: Option<PathBuf>,
        conn: Result<Connection, GovError>,
        hasher: ChainHasher,
        head: Option<verify::Head>,
        config: RecorderConfig,
    ) -> Self {
        let (conn, failure) = match conn {
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let ok = conn.is_some();
        let batch_size = config.batch_size.max(1);
        let shared = Arc::new(Shared {
            label: path.clone().unwrap_or_else(|| PathBuf::from(":memory:")),
            head_path: path.as_deref().map(verify::Head::sidecar_path),
            conn: Mutex::new(conn),
            failure: Mutex::new(failure),
            committed: Mutex::new(head.clone()),
            hasher,
            queue: Mutex::new(Queue::default()),
            wake_writer: Condvar::new(),
            wake_callers: Condvar::new(),
            batch_size,
            max_queued: batch_size.saturating_mul(64).max(4096),
            flush_interval: config.flush_interval,
        });
        let mut writer = None;
        if ok {
            let s = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("agl-flight-recorder".into())
                .spawn(move || writer_loop(&s));
            match spawned {
                Ok(h) => writer = Some(h),
                Err(e) => shared.fail(format!("cannot start the writer thread: {e}")),
            }
        }
        if writer.is_none() {
            lock(&shared.queue).stopped = true;
        }
        let (seq, hash) = match head {
            Some(h) => (h.seq, h.hash),
            None => (0, GENESIS_HASH.to_string()),
        };
        FlightRecorder {
            path,
            shared,
            chain: Mutex::new(Chain { seq, hash }),
            writer: Mutex::new(writer),
            hmac_key: config.hmac_key,
        }
    }

    /// The database file, `None` for an in-memory recorder.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the chain is keyed (HMAC-SHA-256).
    pub fn keyed(&self) -> bool {
        self.shared.hasher.keyed()
    }

    /// Number of entries appended so far (the `seq` of the last one), committed or not.
    pub fn entries(&self) -> u64 {
        lock(&self.chain).seq
    }

    /// Hash of the last appended entry ([`GENESIS_HASH`] before the first).
    pub fn head_hash(&self) -> String {
        lock(&self.chain).hash.clone()
    }

    /// Appends one entry for `decision` about `action` and returns its `seq`. The seq and hash
    /// are assigned under a short lock (chain order = call order); the row is committed by the
    /// background writer within `flush_interval` or when a batch fills. Thread-safe.
    ///
    /// # Errors
    /// [`GovError::Recorder`] when an earlier write failed (the error is remembered, never
    /// lost) or the writer has stopped; [`GovError::Serialize`] when the entry cannot be
    /// serialized.
    pub fn append(&self, action: &Action, decision: &Decision) -> Result<u64, GovError> {
        if let Some(e) = self.shared.failed() {
            return Err(e);
        }
        let mut chain = lock(&self.chain);
        let seq = chain.seq + 1;
        let body =
            RowBody::new(action, decision).map_err(|source| GovError::Serialize { seq, source })?;
        let row = body
            .into_row(
                seq,
                now_unix_seconds(),
                chain.hash.clone(),
                &self.shared.hasher,
            )
            .map_err(|source| GovError::Serialize { seq, source })?;
        let hash = row.hash.clone();
        let shared = &*self.shared;
        let mut q = lock(&shared.queue);
        while q.rows.len() >= shared.max_queued && !q.stopped {
            q = shared
                .wake_callers
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
        if q.stopped || q.closed {
            drop(q);
            return Err(shared
                .failed()
                .unwrap_or_else(|| rec_err(&shared.label, "the recorder's writer has stopped")));
        }
        if q.rows.is_empty() {
            q.oldest = Some(Instant::now());
        }
        q.rows.push(row);
        // Wake the writer for the first row of a batch (so it starts the flush_interval timer)
        // and for a full batch; rows in between cost no system call.
        let wake = q.rows.len() == 1 || q.rows.len() == shared.batch_size;
        drop(q);
        if wake {
            shared.wake_writer.notify_one();
        }
        chain.seq = seq;
        chain.hash = hash;
        Ok(seq)
    }

    /// Blocks until every entry appended so far is committed and the head file written.
    ///
    /// # Errors
    /// [`GovError::Recorder`] when a write failed.
    pub fn flush(&self) -> Result<(), GovError> {
        let shared = &*self.shared;
        let mut q = lock(&shared.queue);
        q.flush_requested += 1;
        let ticket = q.flush_requested;
        shared.wake_writer.notify_one();
        while q.flush_done < ticket && !q.stopped {
            q = shared
                .wake_callers
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(q);
        match self.shared.failed() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The head of the committed chain after a flush (`None` when empty). Store a copy
    /// elsewhere and pass it as [`HeadSource::Explicit`] to detect tail truncation even if
    /// the sidecar is rewritten.
    ///
    /// # Errors
    /// As [`FlightRecorder::flush`].
    pub fn head(&self) -> Result<Option<Head>, GovError> {
        self.flush()?;
        Ok(lock(&self.shared.committed).clone())
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, GovError>,
    ) -> Result<T, GovError> {
        self.flush()?;
        let guard = lock(&self.shared.conn);
        match guard.as_ref() {
            Some(c) => f(c),
            None => Err(rec_err(&self.shared.label, "the database is not open")),
        }
    }

    /// Entries matching `q`, one page (flushes first, so every appended entry is visible).
    ///
    /// # Errors
    /// [`GovError::Recorder`] on SQLite errors or an earlier write failure.
    pub fn query(&self, q: &Query) -> Result<Page, GovError> {
        self.with_conn(|c| store::query(c, &self.shared.label, q))
    }

    /// Aggregate counts (flushes first).
    ///
    /// # Errors
    /// [`GovError::Recorder`] on SQLite errors or an earlier write failure.
    pub fn summary(&self) -> Result<Summary, GovError> {
        self.with_conn(|c| store::summary(c, &self.shared.label))
    }

    /// Verifies this recorder's chain through its own connection (flushes first), against the
    /// head it committed last. Works for in-memory recorders too.
    ///
    /// # Errors
    /// As [`verify`].
    pub fn verify_chain(&self) -> Result<VerifyReport, GovError> {
        let head = self.head()?;
        let options = VerifyOptions {
            hmac_key: self.hmac_key.clone(),
            head: head.map_or(HeadSource::None, HeadSource::Explicit),
        };
        self.with_conn(|c| verify::verify_conn(c, &self.shared.label, &options))
    }

    /// Every entry as a JSON Lines line (the `jsonl` export format, without newlines), read
    /// back after a flush. Meant for tests and small in-memory recorders; an empty vector if
    /// the database cannot be read (use [`FlightRecorder::query`] to see the error).
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut q = Query::default();
        loop {
            let Ok(page) = self.query(&q) else {
                return Vec::new();
            };
            for e in &page.entries {
                match serde_json::to_string(e) {
                    Ok(l) => out.push(l),
                    Err(_) => return Vec::new(),
                }
            }
            if !page.more {
                return out;
            }
            q.after_seq = page.next_cursor;
        }
    }
}

impl Drop for FlightRecorder {
    /// Closes the queue and waits for the writer to commit what is pending. A write error
    /// at this point cannot be returned; call [`FlightRecorder::flush`] before dropping to see
    /// it.
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.wake_writer.notify_one();
        if let Some(h) = lock(&self.writer).take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{GovernanceMode, Verdict};

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
    fn in_memory_round_trip_links_to_genesis_and_verifies() {
        let rec = FlightRecorder::in_memory();
        assert_eq!(
            rec.append(&Action::sql("db", "SELECT 1"), &decision(Verdict::Allow))
                .unwrap(),
            1
        );
        assert_eq!(
            rec.append(
                &Action::sql("db", "DROP TABLE t"),
                &decision(Verdict::Block)
            )
            .unwrap(),
            2
        );
        let page = rec.query(&Query::default()).unwrap();
        assert_eq!(page.entries.len(), 2);
        assert_eq!(page.entries[0].prev_hash, GENESIS_HASH);
        assert_eq!(page.entries[1].prev_hash, page.entries[0].hash);
        assert_eq!(rec.head_hash(), page.entries[1].hash);
        let report = rec.verify_chain().unwrap();
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.entries, 2);
        assert!(verify_lines(rec.lines()).ok());
    }

    #[test]
    fn unwritable_path_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let err = FlightRecorder::create(&blocker.join("sub").join("audit.db")).unwrap_err();
        assert!(matches!(err, GovError::Io { .. }), "{err}");
        assert!(err.to_string().contains("file"));
    }

    #[test]
    fn write_failure_is_remembered_and_returned() {
        let rec = FlightRecorder::in_memory();
        rec.append(&Action::output("a"), &decision(Verdict::Allow))
            .unwrap();
        rec.flush().unwrap();
        // Break the database under the writer: the next batch cannot be inserted.
        lock(&rec.shared.conn)
            .as_ref()
            .unwrap()
            .execute_batch("DROP TABLE entries")
            .unwrap();
        rec.append(&Action::output("b"), &decision(Verdict::Allow))
            .unwrap();
        let err = rec.flush().unwrap_err().to_string();
        assert!(err.contains("earlier write failed"), "{err}");
        assert!(
            rec.append(&Action::output("c"), &decision(Verdict::Allow))
                .is_err()
        );
    }
}
