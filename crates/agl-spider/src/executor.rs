//! The sandboxed SQL executor: runs any SQL text against an in-memory copy of a Spider
//! database inside a transaction that is always rolled back.
//!
//! Responsible for the safety contract (the files under `data/` are only ever opened
//! read-only; nothing a statement does survives the call), the time limit, and reporting what
//! the SQL did (rows returned, rows changed, schema changed). Not responsible for judging
//! whether a result is correct (see [`crate::execution_match`]) or whether SQL is allowed by a
//! policy (that is governance's job).
//!
//! Sandbox details, beyond `BEGIN` / `ROLLBACK`:
//! - an authorizer denies, while the input runs, transaction control (`BEGIN`, `COMMIT`, `END`,
//!   `ROLLBACK`, so the input cannot leave the sandbox transaction), `ATTACH` / `DETACH` (no
//!   other file can be opened or created), and `PRAGMA`s that set a value (connection
//!   settings such as `reverse_unordered_selects` would otherwise outlive the rollback); denied
//!   statements fail with [`SpiderError::Sql`] ("not authorized");
//! - a progress handler interrupts the input once the time limit has passed;
//! - results larger than [`MAX_RESULT_ROWS`] rows, or larger in memory than
//!   [`SqliteLimits::max_result_bytes`], fail with [`SpiderError::Sql`];
//! - SQLite's own per-connection limits are capped before every call ([`SqliteLimits`]: the
//!   largest string or blob, the longest SQL text, the most terms of a compound SELECT), so a
//!   statement that asks for a huge value (`randomblob(1e9)`, `hex(zeroblob(5e8))`, which
//!   governance blocks but a policy could miss) fails at once with SQLite's "string or blob too
//!   big" (`printf('%.*c', 1e9, 'x')` returns NULL) instead of allocating the gigabyte SQLite's
//!   default limit allows;
//! - foreign keys are not enforced (`PRAGMA foreign_keys = OFF`, SQLite's and Python's
//!   `sqlite3` default, which the Spider evaluation scripts use; the bundled SQLite would
//!   otherwise enforce them);
//! - if the transaction could not be rolled back cleanly, the cached copy is discarded and the
//!   next call copies the file again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rusqlite::backup::Backup;
use rusqlite::fallible_iterator::FallibleIterator;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::{Batch, Connection, ErrorCode};
use serde::{Deserialize, Serialize};

use crate::data::{db_file, is_plain_db_id};
use crate::error::SpiderError;
use crate::schema::{open_read_only, sql_error};

/// Most rows (rows) one statement may return; larger results fail with [`SpiderError::Sql`]
/// so that a runaway query cannot exhaust memory before its time limit.
pub const MAX_RESULT_ROWS: usize = 1_000_000;

/// Virtual-machine instructions between two time-limit checks.
const PROGRESS_OPS: i32 = 1_000;

/// `PRAGMA`s that take an argument but only read (schema introspection); every other `PRAGMA`
/// with an argument is denied inside the sandbox.
const READ_ONLY_PRAGMAS_WITH_ARG: &[&str] = &[
    "foreign_key_check",
    "foreign_key_list",
    "index_info",
    "index_list",
    "index_xinfo",
    "integrity_check",
    "quick_check",
    "table_info",
    "table_list",
    "table_xinfo",
];

/// One SQLite value, mapped directly from SQLite's storage classes. JSON (serde): `"null"`,
/// `{"integer": 1}`, `{"real": 1.5}`, `{"text": "a"}`, `{"blob": [1, 2]}`.
///
/// The derived `PartialEq` is structural (`Integer(1) != Real(1.0)`); the evaluator's
/// [`crate::execution_match`] uses numeric equality instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A 64-bit signed integer.
    Integer(i64),
    /// A 64-bit float.
    Real(f64),
    /// Text (invalid UTF-8 is replaced by U+FFFD).
    Text(String),
    /// A blob.
    Blob(Vec<u8>),
}

impl From<ValueRef<'_>> for Value {
    fn from(v: ValueRef<'_>) -> Self {
        match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        }
    }
}

/// The rows of one statement. JSON fields: `columns`, `rows`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResultSet {
    /// Number of columns of the statement (each row has this many values).
    pub columns: usize,
    /// The rows, in the order SQLite returned them.
    pub rows: Vec<Vec<Value>>,
}

/// What one [`Executor::execute`] call did. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    /// Rows of the LAST statement that returned columns (empty, 0 columns, if none did).
    pub result: ResultSet,
    /// `result.rows.len()` (rows).
    pub rows_returned: usize,
    /// Rows inserted, updated or deleted by all statements (rows; SQLite `total_changes`
    /// difference, so trigger and `RETURNING` changes count too). Rolled back afterwards.
    pub rows_changed: u64,
    /// Whether `PRAGMA schema_version` of `main` or `temp` changed (tables, indexes, views or
    /// triggers created, altered or dropped). Rolled back afterwards.
    pub schema_changed: bool,
    /// Number of statements run (a stacked input `a; b` has 2).
    pub statements: usize,
    /// Wall time of the statements, in seconds (excludes copying the database into memory).
    pub elapsed_seconds: f64,
}

impl Execution {
    /// Whether the SQL would have modified the database had it been committed:
    /// `rows_changed > 0 || schema_changed`.
    pub fn destructive(&self) -> bool {
        self.rows_changed > 0 || self.schema_changed
    }
}

/// Executor settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Wall-clock limit per [`Executor::execute`] call (default 2 seconds).
    pub timeout: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
        }
    }
}

/// Caps on what one [`Executor::execute`] call may allocate, so that SQL a policy missed
/// fails inside SQLite (or with [`SpiderError::Sql`]) instead of exhausting memory. The first
/// three are SQLite's own per-connection limits (`sqlite3_limit`), set on the in-memory copy
/// before every call; values above `i32::MAX` mean `i32::MAX` (SQLite then applies its
/// compile-time maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteLimits {
    /// Largest string, blob or table row a statement may create, in bytes
    /// (`SQLITE_LIMIT_LENGTH`; default 10,000,000, above every value of the Spider databases,
    /// whose largest file is under 4 MB). A statement that exceeds it fails with SQLite's
    /// "string or blob too big" ([`SpiderError::Sql`]) without allocating the value.
    pub max_value_bytes: u32,
    /// Longest SQL text, in bytes (`SQLITE_LIMIT_SQL_LENGTH`; default 1,000,000). Longer text
    /// fails with [`SpiderError::Sql`].
    pub max_sql_bytes: u32,
    /// Most SELECTs in one compound SELECT (`UNION`, `INTERSECT`, `EXCEPT`)
    /// (`SQLITE_LIMIT_COMPOUND_SELECT`; default 500, SQLite's own default, pinned here).
    pub max_compound_selects: u32,
    /// Largest result one statement may hold in memory, in bytes (default 100,000,000):
    /// `size_of::<Value>()` per value plus the bytes of each text and blob, plus
    /// `size_of::<Vec<Value>>()` per row. A larger result fails with [`SpiderError::Sql`].
    pub max_result_bytes: usize,
}

impl Default for SqliteLimits {
    fn default() -> Self {
        Self {
            max_value_bytes: 10_000_000,
            max_sql_bytes: 1_000_000,
            max_compound_selects: 500,
            max_result_bytes: 100_000_000,
        }
    }
}

/// Sets SQLite's per-connection limits of `limits` on `conn`.
fn apply_limits(conn: &Connection, limits: &SqliteLimits) -> rusqlite::Result<()> {
    let clamp = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, clamp(limits.max_value_bytes))?;
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, clamp(limits.max_sql_bytes))?;
    conn.set_limit(
        Limit::SQLITE_LIMIT_COMPOUND_SELECT,
        clamp(limits.max_compound_selects),
    )?;
    Ok(())
}

/// Runs SQL against in-memory copies of the Spider databases. Create one per worker thread
/// (it is `Send`, not `Sync`); it caches one in-memory copy per `db_id`.
pub struct Executor {
    db_root: PathBuf,
    config: ExecutorConfig,
    limits: SqliteLimits,
    conns: HashMap<String, Connection>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("db_root", &self.db_root)
            .field("config", &self.config)
            .field("limits", &self.limits)
            .field("cached", &self.conns.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why running the statements stopped.
enum RunError {
    Sqlite(rusqlite::Error),
    TooManyRows,
    TooManyBytes(usize),
}

impl From<rusqlite::Error> for RunError {
    fn from(e: rusqlite::Error) -> Self {
        RunError::Sqlite(e)
    }
}

impl Executor {
    /// An executor over `db_root`, the `database/` directory holding
    /// `<db_id>/<db_id>.sqlite`, with the default [`SqliteLimits`].
    pub fn new(db_root: PathBuf, config: ExecutorConfig) -> Self {
        Self {
            db_root,
            config,
            limits: SqliteLimits::default(),
            conns: HashMap::new(),
        }
    }

    /// The same executor with other memory caps (they apply from the next
    /// [`Executor::execute`] call on).
    pub fn with_limits(mut self, limits: SqliteLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The configuration.
    pub fn config(&self) -> ExecutorConfig {
        self.config
    }

    /// The memory caps in use.
    pub fn limits(&self) -> SqliteLimits {
        self.limits
    }

    /// Runs every statement of `sql` in order against database `db_id`, inside `BEGIN` ...
    /// `ROLLBACK` on the in-memory copy, and reports what happened. The result rows are those
    /// of the last statement that returned columns (so `gold; DELETE FROM t` returns gold's
    /// rows).
    ///
    /// Errors: [`SpiderError::MissingDatabase`] (unknown `db_id` / missing file),
    /// [`SpiderError::Sql`] (any SQLite error — "string or blob too big" past
    /// [`SqliteLimits::max_value_bytes`] included —, a statement the sandbox denies, more than
    /// [`MAX_RESULT_ROWS`] rows or [`SqliteLimits::max_result_bytes`] bytes),
    /// [`SpiderError::Timeout`] (past `config.timeout`). In every case the copy is left as it
    /// was before the call.
    pub fn execute(&mut self, db_id: &str, sql: &str) -> Result<Execution, SpiderError> {
        self.ensure_loaded(db_id)?;
        let timeout = self.config.timeout;
        let conn = self
            .conns
            .get(db_id)
            .ok_or_else(|| SpiderError::MissingDatabase {
                db_id: db_id.to_string(),
                path: db_file(&self.db_root, db_id),
            })?;
        apply_limits(conn, &self.limits).map_err(|e| sql_error(db_id, &e))?;
        let (outcome, poisoned) = run_sandboxed(conn, db_id, sql, timeout, &self.limits);
        if poisoned {
            self.conns.remove(db_id);
        }
        outcome
    }

    /// Copies `db_id` into memory if it is not cached yet.
    fn ensure_loaded(&mut self, db_id: &str) -> Result<(), SpiderError> {
        if self.conns.contains_key(db_id) {
            return Ok(());
        }
        let path = db_file(&self.db_root, db_id);
        if !is_plain_db_id(db_id) {
            return Err(SpiderError::MissingDatabase {
                db_id: db_id.to_string(),
                path,
            });
        }
        let src = open_read_only(db_id, &path)?;
        let mem = copy_to_memory(&src).map_err(|e| sql_error(db_id, &e))?;
        self.conns.insert(db_id.to_string(), mem);
        Ok(())
    }
}

/// Copies `src` into a fresh in-memory database with the online backup API.
fn copy_to_memory(src: &Connection) -> rusqlite::Result<Connection> {
    let mut mem = Connection::open_in_memory()?;
    // The bundled SQLite enforces foreign keys by default; Spider's evaluation (Python's
    // sqlite3) does not. Match it, so that writes behave as they would there.
    mem.execute_batch("PRAGMA foreign_keys = OFF")?;
    let page_size: i64 = src.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    mem.execute_batch(&format!("PRAGMA page_size = {page_size}"))?;
    {
        let backup = Backup::new(src, &mut mem)?;
        backup.run_to_completion(1024, Duration::ZERO, None)?;
    }
    Ok(mem)
}

fn sandbox_authorizer(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Transaction { .. } | AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            Authorization::Deny
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value: Some(_),
        } if !READ_ONLY_PRAGMAS_WITH_ARG.contains(&pragma_name.to_ascii_lowercase().as_str()) => {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }
}

fn schema_versions(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    let main = conn.query_row("PRAGMA main.schema_version", [], |r| r.get(0))?;
    let temp = conn.query_row("PRAGMA temp.schema_version", [], |r| r.get(0))?;
    Ok((main, temp))
}

fn remove_hooks(conn: &Connection) {
    conn.progress_handler(0, None::<fn() -> bool>);
    conn.authorizer(None::<fn(AuthContext<'_>) -> Authorization>);
}

/// Runs `sql` in a rolled-back transaction. Returns the outcome and whether the cached copy
/// must be discarded (the rollback did not happen cleanly).
fn run_sandboxed(
    conn: &Connection,
    db_id: &str,
    sql: &str,
    timeout: Duration,
    limits: &SqliteLimits,
) -> (Result<Execution, SpiderError>, bool) {
    let sql_err = |e: &rusqlite::Error| sql_error(db_id, e);
    if !conn.is_autocommit() {
        // A transaction left open by an earlier call: never run on top of it.
        return (
            Err(SpiderError::Sql {
                db_id: db_id.to_string(),
                message: "sandbox copy was left inside a transaction; discarded".to_string(),
            }),
            true,
        );
    }
    if let Err(e) = conn.execute_batch("BEGIN") {
        return (Err(sql_err(&e)), false);
    }
    let before = match schema_versions(conn) {
        Ok(v) => v,
        Err(e) => {
            let clean = conn.execute_batch("ROLLBACK").is_ok();
            return (Err(sql_err(&e)), !clean);
        }
    };
    let changes_before = conn.total_changes();

    let start = Instant::now();
    let deadline = start + timeout;
    let timed_out = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&timed_out);
    conn.progress_handler(
        PROGRESS_OPS,
        Some(move || {
            if Instant::now() >= deadline {
                flag.store(true, Ordering::Relaxed);
                true
            } else {
                false
            }
        }),
    );
    conn.authorizer(Some(sandbox_authorizer));
    let run = run_statements(conn, sql, limits.max_result_bytes);
    remove_hooks(conn);
    let elapsed_seconds = start.elapsed().as_secs_f64();

    let still_in_txn = !conn.is_autocommit();
    let after = if still_in_txn {
        Some((schema_versions(conn), conn.total_changes()))
    } else {
        None
    };
    let rolled_back = !still_in_txn || conn.execute_batch("ROLLBACK").is_ok();
    // A transaction that ended without an error and without our ROLLBACK may have been
    // committed: discard the copy.
    let poisoned = !rolled_back || !conn.is_autocommit() || (run.is_ok() && !still_in_txn);

    let outcome = match run {
        Err(RunError::Sqlite(e)) => {
            let interrupted = e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted);
            if interrupted && timed_out.load(Ordering::Relaxed) {
                Err(SpiderError::Timeout {
                    db_id: db_id.to_string(),
                    seconds: timeout.as_secs_f64(),
                })
            } else {
                Err(sql_err(&e))
            }
        }
        Err(RunError::TooManyRows) => Err(SpiderError::Sql {
            db_id: db_id.to_string(),
            message: format!("result exceeds {MAX_RESULT_ROWS} rows"),
        }),
        Err(RunError::TooManyBytes(max)) => Err(SpiderError::Sql {
            db_id: db_id.to_string(),
            message: format!("result exceeds {max} bytes in memory"),
        }),
        Ok((result, statements)) => match after {
            // The statements succeeded but the transaction is gone: something ended it.
            None => Err(SpiderError::Sql {
                db_id: db_id.to_string(),
                message: "the SQL ended the sandbox transaction".to_string(),
            }),
            Some((Err(e), _)) => Err(sql_err(&e)),
            Some((Ok(after_versions), changes_after)) => Ok(Execution {
                rows_returned: result.rows.len(),
                result,
                rows_changed: changes_after.saturating_sub(changes_before),
                schema_changed: after_versions != before,
                statements,
                elapsed_seconds,
            }),
        },
    };
    (outcome, poisoned)
}

/// In-memory size of one result value, bytes (see [`SqliteLimits::max_result_bytes`]).
fn value_bytes(v: &Value) -> usize {
    let payload = match v {
        Value::Text(s) => s.len(),
        Value::Blob(b) => b.len(),
        Value::Null | Value::Integer(_) | Value::Real(_) => 0,
    };
    std::mem::size_of::<Value>() + payload
}

/// Runs each statement of `sql`; returns the rows of the last statement with columns and the
/// number of statements. A statement whose rows would hold more than `max_bytes` bytes stops
/// with [`RunError::TooManyBytes`].
fn run_statements(
    conn: &Connection,
    sql: &str,
    max_bytes: usize,
) -> Result<(ResultSet, usize), RunError> {
    let mut batch = Batch::new(conn, sql);
    let mut last = ResultSet::default();
    let mut statements = 0;
    while let Some(mut stmt) = batch.next()? {
        statements += 1;
        let columns = stmt.column_count();
        if columns == 0 {
            stmt.raw_execute()?;
            continue;
        }
        let mut rows_out = Vec::new();
        let mut bytes = 0usize;
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next()? {
            if rows_out.len() >= MAX_RESULT_ROWS {
                return Err(RunError::TooManyRows);
            }
            bytes = bytes.saturating_add(std::mem::size_of::<Vec<Value>>());
            let mut values = Vec::with_capacity(columns);
            for c in 0..columns {
                let v = Value::from(row.get_ref(c)?);
                bytes = bytes.saturating_add(value_bytes(&v));
                values.push(v);
            }
            if bytes > max_bytes {
                return Err(RunError::TooManyBytes(max_bytes));
            }
            rows_out.push(values);
        }
        last = ResultSet {
            columns,
            rows: rows_out,
        };
    }
    Ok((last, statements))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tempdir holding `database/toy/toy.sqlite` with `singer(id, name)` (3 rows).
    fn toy() -> (tempfile::TempDir, Executor) {
        let dir = tempfile::tempdir().unwrap();
        let db_dir = dir.path().join("database");
        std::fs::create_dir_all(db_dir.join("toy")).unwrap();
        let conn = Connection::open(db_dir.join("toy/toy.sqlite")).unwrap();
        conn.execute_batch(
            "CREATE TABLE singer(id INTEGER PRIMARY KEY, name TEXT, score REAL, pic BLOB);
             INSERT INTO singer VALUES (1, 'a', 1.5, x'00ff'), (2, 'b', NULL, NULL), (3, 'c', 2.0, NULL);",
        )
        .unwrap();
        drop(conn);
        let ex = Executor::new(db_dir, ExecutorConfig::default());
        (dir, ex)
    }

    fn count(ex: &mut Executor) -> Value {
        let e = ex.execute("toy", "SELECT count(*) FROM singer").unwrap();
        e.result.rows[0][0].clone()
    }

    #[test]
    fn select_maps_values_directly() {
        let (_d, mut ex) = toy();
        let e = ex
            .execute("toy", "SELECT id, name, score, pic FROM singer ORDER BY id")
            .unwrap();
        assert_eq!(e.result.columns, 4);
        assert_eq!(e.rows_returned, 3);
        assert_eq!(
            e.result.rows[0],
            vec![
                Value::Integer(1),
                Value::Text("a".into()),
                Value::Real(1.5),
                Value::Blob(vec![0, 255])
            ]
        );
        assert_eq!(e.result.rows[1][2], Value::Null);
        assert_eq!(e.statements, 1);
        assert!(!e.destructive());
    }

    #[test]
    fn drop_table_is_reported_and_rolled_back() {
        let (_d, mut ex) = toy();
        let e = ex.execute("toy", "DROP TABLE singer").unwrap();
        assert!(e.schema_changed);
        assert!(e.destructive());
        assert_eq!(e.result.columns, 0);
        assert_eq!(count(&mut ex), Value::Integer(3));
    }

    #[test]
    fn stacked_write_returns_first_rows_and_counts_changes() {
        let (_d, mut ex) = toy();
        let e = ex
            .execute(
                "toy",
                "SELECT name FROM singer ORDER BY id; DELETE FROM singer",
            )
            .unwrap();
        assert_eq!(e.statements, 2);
        assert_eq!(e.rows_returned, 3);
        assert_eq!(e.rows_changed, 3);
        assert!(!e.schema_changed);
        assert_eq!(count(&mut ex), Value::Integer(3));
    }

    #[test]
    fn last_statement_with_columns_wins() {
        let (_d, mut ex) = toy();
        let e = ex
            .execute(
                "toy",
                "SELECT 1; SELECT name FROM singer WHERE id = 2; UPDATE singer SET name = NULL",
            )
            .unwrap();
        assert_eq!(e.result.rows, vec![vec![Value::Text("b".into())]]);
        assert_eq!(e.rows_changed, 3);
    }

    #[test]
    fn error_mid_batch_rolls_back_earlier_writes() {
        let (_d, mut ex) = toy();
        let err = ex
            .execute("toy", "DELETE FROM singer; SELECT * FROM no_such_table")
            .unwrap_err();
        assert!(
            matches!(&err, SpiderError::Sql { message, .. } if message.contains("no_such_table")),
            "{err}"
        );
        assert_eq!(count(&mut ex), Value::Integer(3));
    }

    #[test]
    fn transaction_control_cannot_escape_the_sandbox() {
        let (_d, mut ex) = toy();
        for sql in [
            "DELETE FROM singer; COMMIT",
            "DELETE FROM singer; END",
            "ROLLBACK; DELETE FROM singer",
            "COMMIT; DELETE FROM singer",
            "BEGIN; DELETE FROM singer",
        ] {
            let err = ex.execute("toy", sql).unwrap_err();
            assert!(matches!(err, SpiderError::Sql { .. }), "{sql}: {err}");
            assert_eq!(count(&mut ex), Value::Integer(3), "{sql}");
        }
    }

    #[test]
    fn savepoints_stay_inside_the_transaction() {
        let (_d, mut ex) = toy();
        let e = ex
            .execute("toy", "SAVEPOINT s; DELETE FROM singer; RELEASE s")
            .unwrap();
        assert_eq!(e.rows_changed, 3);
        assert_eq!(count(&mut ex), Value::Integer(3));
    }

    #[test]
    fn setting_pragmas_is_denied_but_reading_is_allowed() {
        let (_d, mut ex) = toy();
        let err = ex
            .execute("toy", "PRAGMA reverse_unordered_selects = ON")
            .unwrap_err();
        assert!(matches!(err, SpiderError::Sql { .. }), "{err}");
        let e = ex
            .execute("toy", "PRAGMA reverse_unordered_selects")
            .unwrap();
        assert_eq!(e.result.rows, vec![vec![Value::Integer(0)]]);
        let e = ex.execute("toy", "PRAGMA table_info(singer)").unwrap();
        assert_eq!(e.rows_returned, 4);
    }

    #[test]
    fn attach_is_denied_and_creates_no_file() {
        let (d, mut ex) = toy();
        let target = d.path().join("x.db");
        let sql = format!("ATTACH DATABASE '{}' AS x", target.display());
        let err = ex.execute("toy", &sql).unwrap_err();
        assert!(matches!(err, SpiderError::Sql { .. }), "{err}");
        assert!(!target.exists());
    }

    #[test]
    fn timeout_interrupts_and_executor_stays_usable() {
        let (_d, mut ex) = toy();
        ex.config.timeout = Duration::from_millis(100);
        let err = ex
            .execute(
                "toy",
                "DELETE FROM singer; WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            )
            .unwrap_err();
        assert!(
            matches!(&err, SpiderError::Timeout { db_id, seconds } if db_id == "toy" && *seconds == 0.1),
            "{err}"
        );
        assert_eq!(count(&mut ex), Value::Integer(3));
    }

    #[test]
    fn runaway_result_is_cut_off() {
        let (_d, mut ex) = toy();
        ex.config.timeout = Duration::from_secs(60);
        let err = ex
            .execute(
                "toy",
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
            )
            .unwrap_err();
        assert!(
            matches!(&err, SpiderError::Sql { message, .. } if message.contains("rows")),
            "{err}"
        );
    }

    /// Statements that ask SQLite for gigabytes, run directly (no policy in front): each fails
    /// with "string or blob too big" (or, for `printf`, which SQLite turns into NULL past the
    /// cap, returns NULL) within a second, and the executor keeps working.
    #[test]
    fn huge_values_fail_fast_instead_of_allocating() {
        let (_d, mut ex) = toy();
        assert_eq!(ex.limits(), SqliteLimits::default());
        for sql in [
            "SELECT zeroblob(2000000000)",
            "SELECT length(zeroblob(2000000000))",
            "SELECT randomblob(1000000000)",
            "SELECT replace(hex(zeroblob(500000000)), '00', 'x')",
            "SELECT length(hex(randomblob(6000000)))",
            "SELECT printf('%.*c', 1000000000, 'x')",
            "SELECT printf('%1000000000d', 1)",
        ] {
            let start = Instant::now();
            match ex.execute("toy", sql) {
                Err(SpiderError::Sql { message, .. }) => {
                    assert!(message.contains("too big"), "{sql}: {message}")
                }
                Ok(e) if sql.starts_with("SELECT printf") => {
                    assert_eq!(e.result.rows, vec![vec![Value::Null]], "{sql}")
                }
                other => panic!("{sql}: {other:?}"),
            }
            let took = start.elapsed();
            assert!(took < Duration::from_secs(1), "{sql} took {took:?}");
        }
        assert_eq!(count(&mut ex), Value::Integer(3));
        let e = ex
            .execute(
                "toy",
                "SELECT length(zeroblob(16)), length(randomblob(9000000)), name FROM singer WHERE id = 1",
            )
            .unwrap();
        assert_eq!(
            e.result.rows,
            vec![vec![
                Value::Integer(16),
                Value::Integer(9_000_000),
                Value::Text("a".into())
            ]]
        );
    }

    #[test]
    fn limits_are_configurable() {
        let (_d, ex) = toy();
        let mut ex = ex.with_limits(SqliteLimits {
            max_value_bytes: 100,
            max_result_bytes: 10_000,
            ..SqliteLimits::default()
        });
        let err = ex.execute("toy", "SELECT zeroblob(101)").unwrap_err();
        assert!(err.to_string().contains("too big"), "{err}");
        assert!(ex.execute("toy", "SELECT zeroblob(100)").is_ok());
        let err = ex
            .execute(
                "toy",
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) SELECT x FROM c",
            )
            .unwrap_err();
        assert!(
            matches!(&err, SpiderError::Sql { message, .. } if message.contains("exceeds 10000 bytes")),
            "{err}"
        );
        let e = ex.execute("toy", "SELECT name FROM singer").unwrap();
        assert_eq!(e.rows_returned, 3);
    }

    #[test]
    fn unknown_and_path_like_db_ids_are_missing_databases() {
        let (_d, mut ex) = toy();
        for id in ["nope", "../toy", ""] {
            let err = ex.execute(id, "SELECT 1").unwrap_err();
            assert!(
                matches!(err, SpiderError::MissingDatabase { .. }),
                "{id}: {err}"
            );
        }
    }

    #[test]
    fn empty_input_runs_no_statement() {
        let (_d, mut ex) = toy();
        let e = ex.execute("toy", "  ;  -- nothing\n").unwrap();
        assert_eq!(e.statements, 0);
        assert_eq!(e.result, ResultSet::default());
    }

    #[test]
    fn foreign_keys_are_not_enforced_like_spider_eval() {
        let (d, mut ex) = toy();
        let conn = Connection::open(d.path().join("database/toy/toy.sqlite")).unwrap();
        conn.execute_batch(
            "CREATE TABLE fan(id INTEGER PRIMARY KEY, singer_id INTEGER REFERENCES singer(id));
             INSERT INTO fan VALUES (1, 1);",
        )
        .unwrap();
        drop(conn);
        let e = ex.execute("toy", "DELETE FROM singer").unwrap();
        assert_eq!(e.rows_changed, 3);
    }

    #[test]
    fn executor_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Executor>();
    }

    #[test]
    fn value_json_shape() {
        assert_eq!(
            serde_json::to_string(&Value::Integer(1)).unwrap(),
            r#"{"integer":1}"#
        );
        assert_eq!(serde_json::to_string(&Value::Null).unwrap(), r#""null""#);
    }
}
