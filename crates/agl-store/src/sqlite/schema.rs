//! The SQLite schema of the store, its migrations and the checks made when a file is opened.
//!
//! Responsible for deciding whether a file may be used as a store (an empty file or an agl
//! store of a version this build knows), for the connection settings (`PRAGMA`s) and for
//! bringing an older agl schema up to [`SCHEMA_VERSION`] inside one transaction. Not
//! responsible for reading or writing entities (see the sibling `db` module).
//!
//! A store is recognised by `PRAGMA application_id` = [`APPLICATION_ID`]; its schema version
//! is `PRAGMA user_version`. A file is **never modified** when it is refused: the checks only
//! read the header and `sqlite_master` before anything is written.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::error::StoreError;

/// `PRAGMA application_id` of an agl store: the ASCII bytes `"AGL1"`.
pub const APPLICATION_ID: i64 = 0x4147_4C31;

/// How long a write waits for another connection's write lock before failing, in
/// milliseconds (`PRAGMA busy_timeout`).
pub const BUSY_TIMEOUT_MS: u64 = 5_000;

/// WAL size, in pages, at which the writer checkpoints by itself (`PRAGMA
/// wal_autocheckpoint`). Normally the background checkpointer keeps the WAL far smaller; this
/// bounds it (about 32 MiB with 4 KiB pages) when the checkpointer falls behind.
pub const WAL_AUTOCHECKPOINT_PAGES: u32 = 8192;

/// Version 1: every table and index of the store.
///
/// Creation order is the `INTEGER PRIMARY KEY` (rowid) of each table; rows of `rollouts`,
/// `attempts`, `spans`, `workers` and `resources` are never deleted, so rowid order is
/// creation order (and equals the natural order of the in-memory backend). The queue is the
/// `queue` table ordered by `pos`; a rollout has at most one entry (`UNIQUE(rollout_seq)`).
/// Besides the wire fields, a rollout row holds `watched` ([`crate::lifecycle::is_watched`],
/// indexed for the watchdog scan), `attempt_count` (= the `sequence_id` of its latest attempt)
/// and `span_sequence` (its span sequence counter, §4.7); counters of unknown rollout ids live
/// in `orphan_sequences`, the latest resources in `meta` (`latest_resources_seq`).
///
/// Indexes: queue order (`queue.pos`), rollouts by id and by status, watched rollouts,
/// attempts by `(rollout_seq, sequence_id)` and `(rollout_seq, attempt_id)`, spans by
/// `(rollout_seq, seq)` (insertion order; dropped by version 3) and the unique
/// `(rollout_seq, attempt_id, span_id)`,
/// workers by id, resources by id.
const V1: &str = r#"
CREATE TABLE rollouts (
    seq            INTEGER PRIMARY KEY,
    rollout_id     TEXT    NOT NULL UNIQUE,
    input          TEXT    NOT NULL,
    start_time     REAL    NOT NULL,
    end_time       REAL,
    mode           TEXT,
    resources_id   TEXT,
    status         TEXT    NOT NULL,
    config         TEXT    NOT NULL,
    metadata       TEXT,
    watched        INTEGER NOT NULL DEFAULT 0,
    attempt_count  INTEGER NOT NULL DEFAULT 0,
    span_sequence  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX rollouts_by_status ON rollouts(status);
CREATE INDEX rollouts_watched ON rollouts(watched) WHERE watched = 1;

CREATE TABLE attempts (
    seq                 INTEGER PRIMARY KEY,
    rollout_seq         INTEGER NOT NULL REFERENCES rollouts(seq),
    rollout_id          TEXT    NOT NULL,
    attempt_id          TEXT    NOT NULL,
    sequence_id         INTEGER NOT NULL,
    start_time          REAL    NOT NULL,
    end_time            REAL,
    status              TEXT    NOT NULL,
    worker_id           TEXT,
    last_heartbeat_time REAL,
    metadata            TEXT,
    UNIQUE (rollout_seq, sequence_id),
    UNIQUE (rollout_seq, attempt_id)
);

CREATE TABLE spans (
    seq          INTEGER PRIMARY KEY,
    rollout_seq  INTEGER NOT NULL REFERENCES rollouts(seq),
    attempt_id   TEXT    NOT NULL,
    span_id      TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    UNIQUE (rollout_seq, attempt_id, span_id)
);
CREATE INDEX spans_by_rollout ON spans(rollout_seq, seq);

CREATE TABLE queue (
    pos          INTEGER PRIMARY KEY,
    rollout_seq  INTEGER NOT NULL UNIQUE REFERENCES rollouts(seq)
);

CREATE TABLE workers (
    seq                 INTEGER PRIMARY KEY,
    worker_id           TEXT NOT NULL UNIQUE,
    status              TEXT NOT NULL,
    heartbeat_stats     TEXT,
    last_heartbeat_time REAL,
    last_dequeue_time   REAL,
    last_busy_time      REAL,
    last_idle_time      REAL,
    current_rollout_id  TEXT,
    current_attempt_id  TEXT
);

CREATE TABLE resources (
    seq           INTEGER PRIMARY KEY,
    resources_id  TEXT    NOT NULL UNIQUE,
    create_time   REAL    NOT NULL,
    update_time   REAL    NOT NULL,
    version       INTEGER NOT NULL,
    resources     TEXT    NOT NULL
);

CREATE TABLE orphan_sequences (
    rollout_id  TEXT PRIMARY KEY,
    value       INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE meta (
    key    TEXT PRIMARY KEY,
    value
) WITHOUT ROWID;
"#;

/// Version 2: indexes that let a page of rollouts (`query_rollouts` with a window, the
/// dashboard's rollouts page) be read without decoding every rollout at 100,000 rollouts and
/// more (see the sibling `select` module for how each query uses them).
///
/// Ties keep creation order (`seq` ascending) in **both** directions, which the implicit
/// `rowid` of an index gives when the index is walked forwards, so the orders the dashboard
/// shows first (newest first) have `DESC` indexes: `start_time DESC`, and `end_time` with
/// nulls first (a null `end_time` sorts as +∞, §5.4); ascending orders walk them backwards and
/// sort only within groups of equal keys. `(mode, start_time DESC)` serves the mode filter.
/// `rollout_id` and `status` (ascending) already have indexes, and a status filter walks the
/// order's index. Few indexes on purpose: each one is written by the operations of the
/// rollout cycle, and every index page a commit dirties is written to the WAL. `start_time`
/// and `mode` are written when a rollout is created, `end_time` when it is created and when it
/// finishes or restarts (status changes that keep `end_time` leave it alone); an index on
/// `status` would be rewritten by every status change.
const V2: &str = r#"
CREATE INDEX rollouts_by_start ON rollouts(start_time DESC);
CREATE INDEX rollouts_by_end ON rollouts(end_time IS NULL DESC, end_time DESC);
CREATE INDEX rollouts_by_mode_start ON rollouts(mode, start_time DESC);
"#;

/// Version 3: drops `spans_by_rollout`, the index of spans in insertion order per rollout.
///
/// Reading a rollout's spans needs no index of its own: the unique
/// `(rollout_seq, attempt_id, span_id)` index already finds them (and those of one attempt),
/// and the rowid it carries is their insertion order, so SQLite sorts the rollout's k rowids
/// (O(k log k)) instead of walking a second index. The index cost every span insert one more
/// B-tree write, about one WAL frame (4 KiB) per commit in the runner's cycle (measured: 12.3
/// frames per commit with it; see the `sqlite` module documentation).
const V3: &str = r#"
DROP INDEX spans_by_rollout;
"#;

/// The migrations, in order: `MIGRATIONS[i]` brings a database from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3];

/// The schema version this build writes (`PRAGMA user_version` of an up-to-date store).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

fn at(path: &Path, what: &str) -> impl Fn(rusqlite::Error) -> StoreError {
    let path = path.display().to_string();
    let what = what.to_string();
    move |e| StoreError::Backend(format!("sqlite store `{path}`: {what}: {e}"))
}

/// What the header of a file says before anything is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    application_id: i64,
    user_version: i64,
    schema_objects: i64,
}

fn read_header(conn: &Connection) -> rusqlite::Result<Header> {
    Ok(Header {
        application_id: conn.query_row("PRAGMA application_id", [], |r| r.get(0))?,
        user_version: conn.query_row("PRAGMA user_version", [], |r| r.get(0))?,
        schema_objects: conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?,
    })
}

/// Refuses files that are not an agl store this build can use; `Ok(true)` for a fresh file.
fn check_header(path: &Path, header: Header) -> Result<bool, StoreError> {
    let shown = path.display();
    if header.application_id == APPLICATION_ID {
        let known = i64::from(SCHEMA_VERSION);
        if header.user_version > known {
            return Err(StoreError::Backend(format!(
                "sqlite store `{shown}` has schema version {}, newer than version {known} that \
                 this build of agl knows; upgrade agl to open it",
                header.user_version
            )));
        }
        if header.user_version < 0 {
            return Err(StoreError::Backend(format!(
                "sqlite store `{shown}` has an invalid schema version {}",
                header.user_version
            )));
        }
        return Ok(false);
    }
    if header.application_id == 0 && header.user_version == 0 && header.schema_objects == 0 {
        return Ok(true);
    }
    Err(StoreError::Backend(format!(
        "`{shown}` is a SQLite database but not an agl store (application_id {}, \
         user_version {}, {} schema objects); refusing to use it",
        header.application_id, header.user_version, header.schema_objects
    )))
}

/// Settings of the connection; `synchronous_full` selects `synchronous=FULL` (durable across
/// power loss) instead of `NORMAL` (durable across process crashes).
fn configure(conn: &Connection, path: &Path, synchronous_full: bool) -> Result<(), StoreError> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(at(path, "PRAGMA journal_mode = WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "sqlite store `{}`: could not switch to WAL mode (journal_mode is `{mode}`)",
            path.display()
        )));
    }
    let sync = if synchronous_full { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync};
         PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -32768;
         PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES};"
    ))
    .map_err(at(path, "PRAGMA settings"))?;
    Ok(())
}

/// Applies the missing migrations inside one `BEGIN IMMEDIATE` transaction, re-reading the
/// version under the write lock (another process may have migrated meanwhile). Without
/// `upgrade` an agl store of an older version is left as it is (a new file still gets every
/// migration). Returns the version the database has afterwards.
fn migrate(conn: &Connection, path: &Path, upgrade: bool) -> Result<u32, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(at(path, "BEGIN IMMEDIATE for the schema migration"))?;
    let result = (|| {
        let header = read_header(conn).map_err(at(path, "reading the schema version"))?;
        check_header(path, header)?;
        let from = u32::try_from(header.user_version).unwrap_or(0);
        if from == 0 {
            conn.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}"))
                .map_err(at(path, "PRAGMA application_id"))?;
        } else if !upgrade {
            return Ok(from);
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            let to = i + 1;
            conn.execute_batch(sql)
                .map_err(at(path, &format!("migration to schema version {to}")))?;
            conn.execute_batch(&format!("PRAGMA user_version = {to}"))
                .map_err(at(path, "PRAGMA user_version"))?;
        }
        Ok(SCHEMA_VERSION)
    })();
    match result {
        Ok(v) => {
            conn.execute_batch("COMMIT")
                .map_err(at(path, "COMMIT of the schema migration"))?;
            Ok(v)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Opens (creating when missing) the store at `path`: checks the file, sets the `PRAGMA`s and
/// migrates the schema (an older store only with `upgrade`). Returns the connection and the
/// schema version.
pub fn open(
    path: &Path,
    synchronous_full: bool,
    upgrade: bool,
) -> Result<(Connection, u32), StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(at(path, "cannot open"))?;
    conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(at(path, "busy_timeout"))?;
    let header = read_header(&conn).map_err(|e| match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Backend(format!(
            "`{}` is not a SQLite database ({e}); refusing to use it",
            path.display()
        )),
        _ => at(path, "reading the header")(e),
    })?;
    check_header(path, header)?;
    configure(&conn, path, synchronous_full)?;
    let version = migrate(&conn, path, upgrade)?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok((conn, version))
}

/// A second connection to an already opened and migrated store, for the background
/// checkpointer: no `CREATE`, no schema work, the same busy timeout.
pub fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(at(path, "cannot open the checkpointer connection"))?;
    conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))
        .map_err(at(path, "busy_timeout"))?;
    Ok(conn)
}

/// Copies what it can of the WAL into the database file without blocking writers
/// (`PRAGMA wal_checkpoint(PASSIVE)`).
pub fn checkpoint_passive(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
        .map_err(at(path, "PRAGMA wal_checkpoint(PASSIVE)"))?;
    Ok(())
}

/// Writes the WAL back into the database file and truncates it (`close`).
pub fn checkpoint(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    // The first column is 1 when another connection kept the WAL busy; the WAL then stays,
    // and every committed write is still durable in it.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(at(path, "PRAGMA wal_checkpoint(TRUNCATE)"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(conn: &Connection) -> Header {
        read_header(conn).unwrap()
    }

    #[test]
    fn fresh_file_gets_every_migration_and_the_agl_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let (conn, version) = open(&path, false, true).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let h = header(&conn);
        assert_eq!(h.application_id, APPLICATION_ID);
        assert_eq!(h.user_version, i64::from(SCHEMA_VERSION));
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
        drop(conn);
        // Reopening an up-to-date store migrates nothing and keeps the version.
        let (_conn, version) = open(&path, true, true).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn version_1_database_migrates_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            // A store as version 1 of this crate wrote it.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1;"
            ))
            .unwrap();
            for (i, (status, mode)) in [
                ("succeeded", Some("train")),
                ("succeeded", Some("train")),
                ("queuing", None),
                ("failed", Some("val")),
            ]
            .iter()
            .enumerate()
            {
                conn.execute(
                    "INSERT INTO rollouts (rollout_id, input, start_time, status, config, mode) \
                     VALUES (?1, '{}', ?2, ?3, '{}', ?4)",
                    rusqlite::params![format!("ro-{i}"), i as f64, status, mode],
                )
                .unwrap();
            }
            conn.execute("INSERT INTO queue (rollout_seq) VALUES (3)", [])
                .unwrap();
        }
        let (conn, version) = open(&path, false, true).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        assert_eq!(header(&conn).user_version, i64::from(SCHEMA_VERSION));
        let ids: Vec<String> = conn
            .prepare("SELECT rollout_id FROM rollouts ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(ids, ["ro-0", "ro-1", "ro-2", "ro-3"], "rows kept");
        let queued: i64 = conn
            .query_row("SELECT rollout_seq FROM queue", [], |r| r.get(0))
            .unwrap();
        assert_eq!(queued, 3);
        for index in [
            "rollouts_by_start",
            "rollouts_by_end",
            "rollouts_by_mode_start",
        ] {
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?1",
                    [index],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "{index}");
        }
        // The new indexes are consistent with the rows they were built from.
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let newest: String = conn
            .query_row(
                "SELECT rollout_id FROM rollouts INDEXED BY rollouts_by_start \
                 ORDER BY start_time DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(newest, "ro-3");
        drop(conn);
        // Reopening an up-to-date store runs no migration again.
        let (_conn, version) = open(&path, false, true).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn header_checks_name_the_problem() {
        let p = Path::new("/tmp/x.db");
        let fresh = Header {
            application_id: 0,
            user_version: 0,
            schema_objects: 0,
        };
        assert!(check_header(p, fresh).unwrap());
        let newer = Header {
            application_id: APPLICATION_ID,
            user_version: i64::from(SCHEMA_VERSION) + 1,
            schema_objects: 10,
        };
        let msg = check_header(p, newer).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("version {SCHEMA_VERSION} that")),
            "{msg}"
        );
        let foreign = Header {
            application_id: 0,
            user_version: 0,
            schema_objects: 1,
        };
        let msg = check_header(p, foreign).unwrap_err().to_string();
        assert!(
            msg.contains("not an agl store") && msg.contains("/tmp/x.db"),
            "{msg}"
        );
    }
}
