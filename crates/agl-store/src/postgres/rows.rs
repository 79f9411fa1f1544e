//! PostgreSQL rows ⇄ agl-core types.
//!
//! Responsible for the column lists of the `SELECT`s, for decoding a `tokio_postgres::Row` into
//! a `Rollout`, `Attempt`, `Span`, `Worker` or `ResourcesUpdate`, and for describing a driver
//! error. JSON-valued fields are `TEXT` written by `serde_json` (as in the SQLite backend:
//! clients read object keys back in the order they wrote them, which `jsonb` would not keep);
//! statuses and modes are their wire strings. A row that cannot be decoded is
//! [`StoreError::Backend`] naming the table, the row's id and the column. Not responsible for
//! which rows are read or written (see the sibling `ops` module).

use std::fmt::Display;
use std::str::FromStr;

use agl_core::{Attempt, ResourcesUpdate, Rollout, Span, Worker};
use serde::de::DeserializeOwned;
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use crate::error::StoreError;
pub(crate) use crate::sql::RolloutRow;

/// The SQLSTATEs after which an operation is run again from the start in a new transaction:
/// a deadlock between two servers' transactions, a serialization failure, and a unique
/// violation from two servers inserting the same new key at once (the retry sees the row).
pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::UNIQUE_VIOLATION
    })
}

/// A driver error as one line: the server's message and SQLSTATE when it sent one, the
/// driver's description (and its cause) otherwise.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Reads the columns of one row, naming table, id and column when a value is unusable.
struct Cols<'a> {
    row: &'a Row,
    table: &'static str,
    id: &'a str,
    /// Index of the table's first column in the row.
    base: usize,
}

impl<'a> Cols<'a> {
    fn bad(&self, column: &str, e: impl Display) -> StoreError {
        StoreError::Backend(format!(
            "postgres table `{}`, row `{}`: column `{column}` cannot be decoded: {e}",
            self.table, self.id
        ))
    }

    fn get<T: FromSql<'a>>(&self, i: usize, column: &str) -> Result<T, StoreError> {
        self.row
            .try_get(self.base + i)
            .map_err(|e| self.bad(column, e))
    }

    fn u32(&self, i: usize, column: &str) -> Result<u32, StoreError> {
        u32::try_from(self.get::<i64>(i, column)?).map_err(|e| self.bad(column, e))
    }

    fn parse<T: FromStr>(&self, i: usize, column: &str) -> Result<T, StoreError>
    where
        T::Err: Display,
    {
        self.get::<&str>(i, column)?
            .parse()
            .map_err(|e| self.bad(column, e))
    }

    fn opt_parse<T: FromStr>(&self, i: usize, column: &str) -> Result<Option<T>, StoreError>
    where
        T::Err: Display,
    {
        self.get::<Option<&str>>(i, column)?
            .map(|s| s.parse().map_err(|e| self.bad(column, e)))
            .transpose()
    }

    fn json<T: DeserializeOwned>(&self, i: usize, column: &str) -> Result<T, StoreError> {
        serde_json::from_str(self.get::<&str>(i, column)?).map_err(|e| self.bad(column, e))
    }

    fn opt_json<T: DeserializeOwned>(
        &self,
        i: usize,
        column: &str,
    ) -> Result<Option<T>, StoreError> {
        self.get::<Option<&str>>(i, column)?
            .map(|s| serde_json::from_str(s).map_err(|e| self.bad(column, e)))
            .transpose()
    }
}

fn row_id(row: &Row, i: usize, table: &str) -> Result<String, StoreError> {
    row.try_get(i)
        .map_err(|e| StoreError::Backend(format!("postgres table `{table}`: bad id column: {e}")))
}

fn row_seq(row: &Row, table: &str) -> Result<i64, StoreError> {
    row.try_get(0)
        .map_err(|e| StoreError::Backend(format!("postgres table `{table}`: bad seq column: {e}")))
}

/// The columns of `rollouts` decoded by [`decode_rollout`].
pub(crate) const ROLLOUT_COLUMNS: &str = "seq, rollout_id, input, start_time, end_time, mode, \
     resources_id, status, config, metadata, attempt_count, span_sequence";

/// How many columns [`ROLLOUT_COLUMNS`] names.
pub(crate) const ROLLOUT_COLUMN_COUNT: usize = 12;

/// Decodes a row of [`ROLLOUT_COLUMNS`].
pub(crate) fn decode_rollout(row: &Row) -> Result<RolloutRow, StoreError> {
    let seq = row_seq(row, "rollouts")?;
    let rollout_id = row_id(row, 1, "rollouts")?;
    let c = Cols {
        row,
        table: "rollouts",
        id: &rollout_id,
        base: 0,
    };
    let rollout = Rollout {
        input: c.json(2, "input")?,
        start_time: c.get(3, "start_time")?,
        end_time: c.get(4, "end_time")?,
        mode: c.opt_parse(5, "mode")?,
        resources_id: c.get::<Option<String>>(6, "resources_id")?,
        status: c.parse(7, "status")?,
        config: c.json(8, "config")?,
        metadata: c.opt_json(9, "metadata")?,
        rollout_id: rollout_id.clone(),
    };
    Ok(RolloutRow {
        seq,
        attempts: c.u32(10, "attempt_count")?,
        span_sequence: c.get(11, "span_sequence")?,
        rollout,
    })
}

/// The columns of `attempts` decoded by [`decode_attempt`].
pub(crate) const ATTEMPT_COLUMNS: &str = "seq, rollout_id, attempt_id, sequence_id, start_time, \
     end_time, status, worker_id, last_heartbeat_time, metadata";

/// Decodes a row of [`ATTEMPT_COLUMNS`] into `(row seq, attempt)`.
pub(crate) fn decode_attempt(row: &Row) -> Result<(i64, Attempt), StoreError> {
    decode_attempt_at(row, 0)
}

/// Decodes the [`ATTEMPT_COLUMNS`] that start at column `base` of a joined row.
pub(crate) fn decode_attempt_at(row: &Row, base: usize) -> Result<(i64, Attempt), StoreError> {
    let bad = |e: tokio_postgres::Error| {
        StoreError::Backend(format!("postgres table `attempts`: bad key column: {e}"))
    };
    let seq: i64 = row.try_get(base).map_err(bad)?;
    let rollout_id: String = row.try_get(base + 1).map_err(bad)?;
    let attempt_id: String = row.try_get(base + 2).map_err(bad)?;
    let shown = format!("{rollout_id}/{attempt_id}");
    let c = Cols {
        row,
        table: "attempts",
        id: &shown,
        base,
    };
    let attempt = Attempt {
        sequence_id: c.u32(3, "sequence_id")?,
        start_time: c.get(4, "start_time")?,
        end_time: c.get(5, "end_time")?,
        status: c.parse(6, "status")?,
        worker_id: c.get(7, "worker_id")?,
        last_heartbeat_time: c.get(8, "last_heartbeat_time")?,
        metadata: c.opt_json(9, "metadata")?,
        rollout_id,
        attempt_id,
    };
    Ok((seq, attempt))
}

/// The columns of `workers` decoded by [`decode_worker`].
pub(crate) const WORKER_COLUMNS: &str = "seq, worker_id, status, heartbeat_stats, \
     last_heartbeat_time, last_dequeue_time, last_busy_time, last_idle_time, \
     current_rollout_id, current_attempt_id";

/// Decodes a row of [`WORKER_COLUMNS`].
pub(crate) fn decode_worker(row: &Row) -> Result<Worker, StoreError> {
    let worker_id = row_id(row, 1, "workers")?;
    let c = Cols {
        row,
        table: "workers",
        id: &worker_id,
        base: 0,
    };
    Ok(Worker {
        status: c.parse(2, "status")?,
        heartbeat_stats: c.opt_json(3, "heartbeat_stats")?,
        last_heartbeat_time: c.get(4, "last_heartbeat_time")?,
        last_dequeue_time: c.get(5, "last_dequeue_time")?,
        last_busy_time: c.get(6, "last_busy_time")?,
        last_idle_time: c.get(7, "last_idle_time")?,
        current_rollout_id: c.get(8, "current_rollout_id")?,
        current_attempt_id: c.get(9, "current_attempt_id")?,
        worker_id: worker_id.clone(),
    })
}

/// The columns of `resources` decoded by [`decode_resources`].
pub(crate) const RESOURCES_COLUMNS: &str =
    "seq, resources_id, create_time, update_time, version, resources";

/// Decodes a row of [`RESOURCES_COLUMNS`] into `(row seq, resources)`.
pub(crate) fn decode_resources(row: &Row) -> Result<(i64, ResourcesUpdate), StoreError> {
    let seq = row_seq(row, "resources")?;
    let resources_id = row_id(row, 1, "resources")?;
    let c = Cols {
        row,
        table: "resources",
        id: &resources_id,
        base: 0,
    };
    let version = u64::try_from(c.get::<i64>(4, "version")?).map_err(|e| c.bad("version", e))?;
    Ok((
        seq,
        ResourcesUpdate {
            create_time: c.get(2, "create_time")?,
            update_time: c.get(3, "update_time")?,
            version,
            resources: c.json(5, "resources")?,
            resources_id: resources_id.clone(),
        },
    ))
}

/// Decodes `SELECT seq, body FROM spans …`.
pub(crate) fn decode_span(row: &Row) -> Result<Span, StoreError> {
    let seq = row_seq(row, "spans")?;
    let shown = format!("#{seq}");
    let c = Cols {
        row,
        table: "spans",
        id: &shown,
        base: 0,
    };
    c.json(1, "body")
}
