//! The SQLite side of the flight recorder: schema, opening (read-write and read-only), the
//! `meta` table, reading rows back, queries with a cursor, and the summary.
//!
//! Responsible for SQL. Not responsible for computing hashes (see `entry`), for the order of
//! appends (see the recorder's writer) or for judging a chain (see `verify`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params, params_from_iter};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::entry::{ChainHasher, RecordEntry, Row};
use super::verify::{self, VerifyOptions, VerifyReport};
use crate::error::GovError;
use crate::types::{Severity, Verdict};

/// Value of `meta.format_version` written by this version.
pub const FORMAT_VERSION: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    seq         INTEGER PRIMARY KEY,
    time        REAL NOT NULL,
    agent_id    TEXT,
    rollout_id  TEXT,
    attempt_id  TEXT,
    step        INTEGER,
    action_type TEXT NOT NULL,
    action      TEXT NOT NULL,
    verdict     TEXT NOT NULL,
    mode        TEXT NOT NULL,
    severity    TEXT,
    policies    TEXT NOT NULL,
    violations  TEXT NOT NULL,
    rewritten   TEXT,
    signals     TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_rollout_id ON entries(rollout_id);
CREATE INDEX IF NOT EXISTS entries_verdict ON entries(verdict);
CREATE INDEX IF NOT EXISTS entries_time ON entries(time);
";

/// Columns in table order; every query reads them in this order.
pub(crate) const COLUMNS: &str = "seq, time, agent_id, rollout_id, attempt_id, step, action_type, \
     action, verdict, mode, severity, policies, violations, rewritten, signals, prev_hash, hash";

const INSERT: &str = "INSERT INTO entries (seq, time, agent_id, rollout_id, attempt_id, step, \
     action_type, action, verdict, mode, severity, policies, violations, rewritten, signals, \
     prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
     ?16, ?17)";

/// A [`GovError::Recorder`] for `path`.
pub(crate) fn rec_err(path: &Path, message: impl Into<String>) -> GovError {
    GovError::Recorder {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// SQLite error → [`GovError::Recorder`], saying "not a SQLite database" where that is the cause.
pub(crate) fn sql_err(path: &Path, doing: &str, e: &rusqlite::Error) -> GovError {
    let not_db = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase)
    );
    if not_db {
        rec_err(path, format!("not a SQLite database ({e})"))
    } else {
        rec_err(path, format!("{doing}: {e}"))
    }
}

/// What the `meta` table says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    /// `hmac` is `sha256`.
    pub keyed: bool,
    /// `key_check`, when keyed.
    pub key_check: Option<String>,
}

fn table_exists(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Checks that `conn` holds the recorder schema and reads its meta table.
pub(crate) fn read_meta(conn: &Connection, path: &Path) -> Result<Meta, GovError> {
    for table in ["entries", "meta"] {
        if !table_exists(conn, table).map_err(|e| sql_err(path, "reading the schema", &e))? {
            return Err(rec_err(
                path,
                format!("not a flight-recorder database: table `{table}` is missing"),
            ));
        }
    }
    let get = |key: &str| -> Result<Option<String>, GovError> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
            r.get::<_, String>(0)
        })
        .optional()
        .map_err(|e| sql_err(path, &format!("reading meta `{key}`"), &e))
    };
    match get("format_version")?.as_deref() {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(rec_err(
                path,
                format!(
                    "unsupported flight-recorder format version `{other}` (this build reads {FORMAT_VERSION})"
                ),
            ));
        }
        None => {
            return Err(rec_err(
                path,
                "not a flight-recorder database: meta `format_version` is missing",
            ));
        }
    }
    let keyed = match get("hmac")?.as_deref() {
        Some("sha256") => true,
        Some("none") => false,
        Some(other) => {
            return Err(rec_err(
                path,
                format!("meta `hmac` is `{other}`, expected `sha256` or `none`"),
            ));
        }
        None => return Err(rec_err(path, "meta `hmac` is missing")),
    };
    Ok(Meta {
        keyed,
        key_check: get("key_check")?,
    })
}

/// Checks that the key setup given (`hasher`) fits the database's meta.
pub(crate) fn check_key(meta: &Meta, hasher: &ChainHasher, path: &Path) -> Result<(), GovError> {
    match (meta.keyed, hasher.keyed()) {
        (true, false) => Err(rec_err(
            path,
            "this chain is keyed (HMAC-SHA-256): an HMAC key is needed to verify or extend it \
             (--key-file FILE or AGL_AUDIT_KEY_FILE)",
        )),
        (false, true) => Err(rec_err(
            path,
            "an HMAC key was given but this chain is not keyed (meta hmac = none); refusing, \
             since a keyed chain downgraded to an unkeyed one looks exactly like this",
        )),
        (true, true) if meta.key_check != hasher.key_check() => Err(rec_err(
            path,
            "wrong HMAC key: it does not match the key this chain was written with",
        )),
        _ => Ok(()),
    }
}

/// Opens (creating if needed) a database for appending: WAL, synchronous=NORMAL, schema.
pub(crate) fn open_rw(path: &Path, hasher: &ChainHasher) -> Result<(Connection, Meta), GovError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| GovError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let conn = Connection::open(path).map_err(|e| sql_err(path, "cannot open", &e))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| sql_err(path, "setting WAL journal mode", &e))?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| sql_err(path, "setting synchronous=NORMAL", &e))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| sql_err(path, "setting the busy timeout", &e))?;
    let meta = init_schema(&conn, path, hasher)?;
    Ok((conn, meta))
}

/// Creates the schema in an empty database, or checks it in an existing one.
pub(crate) fn init_schema(
    conn: &Connection,
    path: &Path,
    hasher: &ChainHasher,
) -> Result<Meta, GovError> {
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| sql_err(path, "reading the schema", &e))?;
    if tables == 0 {
        conn.execute_batch(SCHEMA)
            .map_err(|e| sql_err(path, "creating the schema", &e))?;
        let mut rows: Vec<(&str, String)> = vec![
            ("format_version", FORMAT_VERSION.to_string()),
            ("hmac", hasher.meta_name().to_string()),
            ("policies_query", "json1".to_string()),
        ];
        if let Some(check) = hasher.key_check() {
            rows.push(("key_check", check));
        }
        for (k, v) in rows {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                params![k, v],
            )
            .map_err(|e| sql_err(path, "writing meta", &e))?;
        }
    }
    let meta = read_meta(conn, path)?;
    check_key(&meta, hasher, path)?;
    Ok(meta)
}

/// Opens an existing database read-only (never creates one).
pub(crate) fn open_ro(path: &Path) -> Result<Connection, GovError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(rec_err(path, "not a regular file")),
        Err(source) => {
            return Err(GovError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql_err(path, "cannot open", &e))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| sql_err(path, "setting the busy timeout", &e))?;
    Ok(conn)
}

/// Inserts `rows` in one transaction.
pub(crate) fn insert_rows(tx: &Transaction<'_>, rows: &[Row]) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(INSERT)?;
    for r in rows {
        stmt.execute(params![
            to_i64(r.seq),
            r.time,
            r.agent_id,
            r.rollout_id,
            r.attempt_id,
            r.step.map(to_i64),
            r.action_type,
            r.action,
            r.verdict.as_str(),
            r.mode.as_str(),
            r.severity.map(Severity::as_str),
            r.policies,
            r.violations,
            r.rewritten,
            r.signals,
            r.prev_hash,
            r.hash,
        ])?;
    }
    Ok(())
}

/// u64 → i64 for SQLite INTEGER columns, saturating (seq and step never get near 2^63).
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One row as stored, every column with its stored type checked.
#[derive(Debug, Clone)]
pub(crate) struct RawRow {
    pub seq: i64,
    pub time: f64,
    pub agent_id: Option<String>,
    pub rollout_id: Option<String>,
    pub attempt_id: Option<String>,
    pub step: Option<i64>,
    pub action_type: String,
    pub action: String,
    pub verdict: String,
    pub mode: String,
    pub severity: Option<String>,
    pub policies: String,
    pub violations: String,
    pub rewritten: Option<String>,
    pub signals: String,
    pub prev_hash: String,
    pub hash: String,
}

const COLUMN_NAMES: [&str; 17] = [
    "seq",
    "time",
    "agent_id",
    "rollout_id",
    "attempt_id",
    "step",
    "action_type",
    "action",
    "verdict",
    "mode",
    "severity",
    "policies",
    "violations",
    "rewritten",
    "signals",
    "prev_hash",
    "hash",
];

fn text(v: &SqlValue, col: usize) -> Result<String, String> {
    match v {
        SqlValue::Text(s) => Ok(s.clone()),
        other => Err(wrong_type(col, other, "TEXT")),
    }
}

fn opt_text(v: &SqlValue, col: usize) -> Result<Option<String>, String> {
    match v {
        SqlValue::Null => Ok(None),
        other => text(other, col).map(Some),
    }
}

fn wrong_type(col: usize, v: &SqlValue, expected: &str) -> String {
    let got = match v {
        SqlValue::Null => "NULL",
        SqlValue::Integer(_) => "INTEGER",
        SqlValue::Real(_) => "REAL",
        SqlValue::Text(_) => "TEXT",
        SqlValue::Blob(_) => "BLOB",
    };
    let name = COLUMN_NAMES.get(col).copied().unwrap_or("?");
    format!("column `{name}` holds {got} where {expected} was expected")
}

impl RawRow {
    /// Reads one row selected with [`COLUMNS`]. `Ok(Err(reason))` when a column has the wrong
    /// type (the database was edited); `Err` only for SQLite errors.
    pub(crate) fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, Result<Self, String>)> {
        let mut vals: Vec<SqlValue> = Vec::with_capacity(17);
        for i in 0..17 {
            vals.push(row.get::<_, SqlValue>(i)?);
        }
        let seq = match vals.first() {
            Some(SqlValue::Integer(s)) => *s,
            _ => 0,
        };
        Ok((seq, Self::from_values(seq, &vals)))
    }

    fn from_values(seq: i64, v: &[SqlValue]) -> Result<Self, String> {
        let at = |i: usize| v.get(i).unwrap_or(&SqlValue::Null);
        let time = match at(1) {
            SqlValue::Real(t) => *t,
            SqlValue::Integer(t) => *t as f64,
            other => return Err(wrong_type(1, other, "REAL")),
        };
        let step = match at(5) {
            SqlValue::Null => None,
            SqlValue::Integer(s) => Some(*s),
            other => return Err(wrong_type(5, other, "INTEGER")),
        };
        Ok(RawRow {
            seq,
            time,
            agent_id: opt_text(at(2), 2)?,
            rollout_id: opt_text(at(3), 3)?,
            attempt_id: opt_text(at(4), 4)?,
            step,
            action_type: text(at(6), 6)?,
            action: text(at(7), 7)?,
            verdict: text(at(8), 8)?,
            mode: text(at(9), 9)?,
            severity: opt_text(at(10), 10)?,
            policies: text(at(11), 11)?,
            violations: text(at(12), 12)?,
            rewritten: opt_text(at(13), 13)?,
            signals: text(at(14), 14)?,
            prev_hash: text(at(15), 15)?,
            hash: text(at(16), 16)?,
        })
    }

    /// The entry's JSON object without `hash`, rebuilt from the columns. Errors name the
    /// column whose JSON does not parse or is not in canonical form.
    pub(crate) fn hash_input(&self) -> Result<Value, String> {
        let json = |name: &str, text: &str| -> Result<Value, String> {
            let v: Value = serde_json::from_str(text)
                .map_err(|e| format!("column `{name}` is not valid JSON: {e}"))?;
            let canonical =
                super::entry::canonical_string(&v).map_err(|e| format!("column `{name}`: {e}"))?;
            if canonical != text {
                return Err(format!(
                    "column `{name}` is not in the recorder's canonical JSON form (edited)"
                ));
            }
            Ok(v)
        };
        let opt = |s: &Option<String>| s.clone().map_or(Value::Null, Value::String);
        let time = serde_json::Number::from_f64(self.time)
            .map(Value::Number)
            .ok_or_else(|| "column `time` is not a finite number".to_string())?;
        let seq = u64::try_from(self.seq).map_err(|_| "negative seq".to_string())?;
        let step = match self.step {
            None => Value::Null,
            Some(s) => {
                Value::from(u64::try_from(s).map_err(|_| "column `step` is negative".to_string())?)
            }
        };
        let mut map = serde_json::Map::new();
        map.insert("seq".into(), Value::from(seq));
        map.insert("time".into(), time);
        map.insert("agent_id".into(), opt(&self.agent_id));
        map.insert("rollout_id".into(), opt(&self.rollout_id));
        map.insert("attempt_id".into(), opt(&self.attempt_id));
        map.insert("step".into(), step);
        map.insert(
            "action_type".into(),
            Value::String(self.action_type.clone()),
        );
        map.insert("action".into(), json("action", &self.action)?);
        map.insert("verdict".into(), Value::String(self.verdict.clone()));
        map.insert("mode".into(), Value::String(self.mode.clone()));
        map.insert("severity".into(), opt(&self.severity));
        map.insert("policies".into(), json("policies", &self.policies)?);
        map.insert("violations".into(), json("violations", &self.violations)?);
        map.insert(
            "rewritten".into(),
            match &self.rewritten {
                Some(t) => json("rewritten", t)?,
                None => Value::Null,
            },
        );
        map.insert("signals".into(), json("signals", &self.signals)?);
        map.insert("prev_hash".into(), Value::String(self.prev_hash.clone()));
        Ok(Value::Object(map))
    }

    /// The typed entry (fails when a column does not hold what the recorder writes there).
    pub(crate) fn to_entry(&self) -> Result<RecordEntry, String> {
        let mut value = self.hash_input()?;
        if let Value::Object(map) = &mut value {
            map.insert("hash".into(), Value::String(self.hash.clone()));
        }
        serde_json::from_value(value)
            .map_err(|e| format!("the row is not a flight-recorder entry: {e}"))
    }
}

/// Filters of a [`query`](super::FlightRecorder::query). All given filters must hold (AND).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Query {
    /// Only entries of this rollout (`rollout_id` column).
    pub rollout_id: Option<String>,
    /// Only entries that violated this policy (name as recorded in `policies`).
    pub policy: Option<String>,
    /// Only entries with this verdict.
    pub verdict: Option<Verdict>,
    /// Only entries whose highest violation severity is exactly this.
    pub severity: Option<Severity>,
    /// Only entries with `time >= since` (unix seconds).
    pub since: Option<f64>,
    /// Only entries with `time < until` (unix seconds).
    pub until: Option<f64>,
    /// Cursor: only entries with `seq > after_seq` (exclusive); `None` starts at the first.
    pub after_seq: Option<u64>,
    /// Page size in entries (default 1000; 0 is treated as 1).
    pub limit: usize,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            rollout_id: None,
            policy: None,
            verdict: None,
            severity: None,
            since: None,
            until: None,
            after_seq: None,
            limit: 1000,
        }
    }
}

/// One page of query results, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page {
    /// The matching entries, in `seq` order.
    pub entries: Vec<RecordEntry>,
    /// `seq` of the last entry of this page, to pass as the next [`Query::after_seq`]; `None`
    /// when the page is empty (an incremental reader keeps its previous cursor and polls again).
    pub next_cursor: Option<u64>,
    /// Whether more matching entries exist after this page right now.
    pub more: bool,
}

/// Aggregate counts over a whole recorder database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of entries (decisions).
    pub entries: u64,
    /// Entries with at least one violation.
    pub violations: u64,
    /// `violations / entries` (0 when there are no entries): the fraction of decisions with a
    /// violation.
    pub violation_rate: f64,
    /// Entries per verdict name (`allow`, `warn`, `modify`, `block`).
    pub by_verdict: BTreeMap<String, u64>,
    /// Number of violations (findings, not entries) per policy name.
    pub by_policy: BTreeMap<String, u64>,
    /// Number of violations (findings) per severity name.
    pub by_severity: BTreeMap<String, u64>,
}

/// Runs `q` on `conn`.
pub(crate) fn query(conn: &Connection, path: &Path, q: &Query) -> Result<Page, GovError> {
    let mut sql = format!("SELECT {COLUMNS} FROM entries WHERE seq > ?");
    let mut args: Vec<SqlValue> = vec![SqlValue::Integer(to_i64(q.after_seq.unwrap_or(0)))];
    if let Some(r) = &q.rollout_id {
        sql.push_str(" AND rollout_id = ?");
        args.push(SqlValue::Text(r.clone()));
    }
    if let Some(p) = &q.policy {
        sql.push_str(
            " AND EXISTS (SELECT 1 FROM json_each(entries.policies) AS p WHERE p.value = ?)",
        );
        args.push(SqlValue::Text(p.clone()));
    }
    if let Some(v) = q.verdict {
        sql.push_str(" AND verdict = ?");
        args.push(SqlValue::Text(v.as_str().to_string()));
    }
    if let Some(s) = q.severity {
        sql.push_str(" AND severity = ?");
        args.push(SqlValue::Text(s.as_str().to_string()));
    }
    if let Some(t) = q.since {
        sql.push_str(" AND time >= ?");
        args.push(SqlValue::Real(t));
    }
    if let Some(t) = q.until {
        sql.push_str(" AND time < ?");
        args.push(SqlValue::Real(t));
    }
    let limit = q.limit.max(1);
    sql.push_str(" ORDER BY seq LIMIT ?");
    args.push(SqlValue::Integer(
        i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
    ));
    let err = |e: rusqlite::Error| sql_err(path, "querying entries", &e);
    let mut stmt = conn.prepare(&sql).map_err(err)?;
    let mut rows = stmt.query(params_from_iter(args)).map_err(err)?;
    let mut entries = Vec::new();
    let mut more = false;
    while let Some(row) = rows.next().map_err(err)? {
        if entries.len() == limit {
            more = true;
            break;
        }
        let (seq, raw) = RawRow::read(row).map_err(err)?;
        let entry = raw
            .and_then(|r| r.to_entry())
            .map_err(|m| rec_err(path, format!("entry {seq}: {m}")))?;
        entries.push(entry);
    }
    Ok(Page {
        next_cursor: entries.last().map(|e| e.seq),
        entries,
        more,
    })
}

fn counts(conn: &Connection, sql: &str) -> rusqlite::Result<BTreeMap<String, u64>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Option<String>>(0)?.unwrap_or_default(),
            r.get::<_, i64>(1)?,
        ))
    })?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (k, n) = row?;
        out.insert(k, u64::try_from(n).unwrap_or(0));
    }
    Ok(out)
}

/// Aggregates the whole database.
pub(crate) fn summary(conn: &Connection, path: &Path) -> Result<Summary, GovError> {
    let err = |e: rusqlite::Error| sql_err(path, "summarizing entries", &e);
    let (entries, violations): (i64, i64) = conn
        .query_row(
            "SELECT count(*), coalesce(sum(violations <> '[]'), 0) FROM entries",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(err)?;
    let entries = u64::try_from(entries).unwrap_or(0);
    let violations = u64::try_from(violations).unwrap_or(0);
    Ok(Summary {
        entries,
        violations,
        violation_rate: if entries == 0 {
            0.0
        } else {
            violations as f64 / entries as f64
        },
        by_verdict: counts(
            conn,
            "SELECT verdict, count(*) FROM entries GROUP BY verdict",
        )
        .map_err(err)?,
        by_policy: counts(
            conn,
            "SELECT json_extract(v.value, '$.policy'), count(*) \
             FROM entries, json_each(entries.violations) AS v GROUP BY 1",
        )
        .map_err(err)?,
        by_severity: counts(
            conn,
            "SELECT json_extract(v.value, '$.severity'), count(*) \
             FROM entries, json_each(entries.violations) AS v GROUP BY 1",
        )
        .map_err(err)?,
    })
}

/// A read-only view of a recorder database (for the CLI and other readers that must not
/// append). Reads what has been committed; a live recorder commits every batch.
#[derive(Debug)]
pub struct RecorderReader {
    path: PathBuf,
    conn: Connection,
}

impl RecorderReader {
    /// Opens the recorder database at `path` read-only and checks its schema.
    ///
    /// # Errors
    /// [`GovError::Io`] when the file does not exist; [`GovError::Recorder`] when it is not a
    /// SQLite database or lacks the recorder's tables.
    pub fn open(path: &Path) -> Result<Self, GovError> {
        let conn = open_ro(path)?;
        read_meta(&conn, path)?;
        Ok(RecorderReader {
            path: path.to_path_buf(),
            conn,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the chain is keyed (meta `hmac` = `sha256`).
    ///
    /// # Errors
    /// [`GovError::Recorder`] when the meta table cannot be read.
    pub fn keyed(&self) -> Result<bool, GovError> {
        Ok(read_meta(&self.conn, &self.path)?.keyed)
    }

    /// Entries matching `q`, one page (see [`Query`], [`Page`]).
    ///
    /// # Errors
    /// [`GovError::Recorder`] on SQLite errors or a row that is not a recorder entry.
    pub fn query(&self, q: &Query) -> Result<Page, GovError> {
        query(&self.conn, &self.path, q)
    }

    /// Aggregate counts (see [`Summary`]).
    ///
    /// # Errors
    /// [`GovError::Recorder`] on SQLite errors.
    pub fn summary(&self) -> Result<Summary, GovError> {
        summary(&self.conn, &self.path)
    }

    /// Verifies the chain (see [`verify`](super::verify)).
    ///
    /// # Errors
    /// As [`verify`](super::verify).
    pub fn verify(&self, options: &VerifyOptions) -> Result<VerifyReport, GovError> {
        verify::verify_conn(&self.conn, &self.path, options)
    }
}

/// One page of entries of the database at `path` (opened read-only).
///
/// # Errors
/// As [`RecorderReader::open`] and [`RecorderReader::query`].
pub fn query_db(path: &Path, q: &Query) -> Result<Page, GovError> {
    RecorderReader::open(path)?.query(q)
}

/// Aggregate counts of the database at `path` (opened read-only).
///
/// # Errors
/// As [`RecorderReader::open`] and [`RecorderReader::summary`].
pub fn summary_db(path: &Path) -> Result<Summary, GovError> {
    RecorderReader::open(path)?.summary()
}
