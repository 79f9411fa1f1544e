//! Table rows ⇄ agl-core types.
//!
//! Responsible for the column lists of the `SELECT`s and for decoding a row into a
//! `Rollout`, `Attempt`, `Span`, `Worker` or `ResourcesUpdate`, and for encoding JSON columns.
//! JSON-valued fields (`input`, `config`, `metadata`, span bodies, `heartbeat_stats`,
//! `resources`) are TEXT written by `serde_json`; statuses and modes are their wire strings. A
//! row that cannot be decoded is [`StoreError::Backend`] naming the table, the row's id and the
//! column. Not responsible for which rows are read or written (see the sibling `db` module).

use std::fmt::Display;
use std::str::FromStr;

use agl_core::{Attempt, ResourcesUpdate, Rollout, Span, Worker};
use rusqlite::Row;
use rusqlite::types::ValueRef;
use serde::de::DeserializeOwned;

use crate::error::StoreError;

/// Attaches what was being done to a SQLite error.
pub(crate) trait SqlContext<T> {
    /// `StoreError::Backend("sqlite: <what>: <error>")`.
    fn at(self, what: &str) -> Result<T, StoreError>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn at(self, what: &str) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Backend(format!("sqlite: {what}: {e}")))
    }
}

/// Whether an `INSERT` failed on a `UNIQUE` (or primary key) constraint.
pub(crate) fn is_unique_violation(e: &rusqlite::Error) -> bool {
    e.sqlite_error().is_some_and(|e| {
        e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
            || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    })
}

pub(crate) use crate::sql::{RolloutRow, opt_json, to_json};

/// Reads the columns of one row, naming table, id and column when a value is unusable.
struct Cols<'a, 'r> {
    row: &'a Row<'r>,
    table: &'static str,
    id: &'a str,
}

impl<'a> Cols<'a, '_> {
    fn bad(&self, column: &str, e: impl Display) -> StoreError {
        StoreError::Backend(format!(
            "sqlite table `{}`, row `{}`: column `{column}` cannot be decoded: {e}",
            self.table, self.id
        ))
    }

    fn value(&self, i: usize, column: &str) -> Result<ValueRef<'a>, StoreError> {
        self.row.get_ref(i).map_err(|e| self.bad(column, e))
    }

    fn opt_str(&self, i: usize, column: &str) -> Result<Option<&'a str>, StoreError> {
        self.value(i, column)?
            .as_str_or_null()
            .map_err(|e| self.bad(column, e))
    }

    fn str(&self, i: usize, column: &str) -> Result<&'a str, StoreError> {
        self.opt_str(i, column)?
            .ok_or_else(|| self.bad(column, "unexpected NULL"))
    }

    fn opt_f64(&self, i: usize, column: &str) -> Result<Option<f64>, StoreError> {
        match self.value(i, column)? {
            ValueRef::Null => Ok(None),
            ValueRef::Real(f) => Ok(Some(f)),
            // SQLite may hand back a REAL that holds an integral value as an INTEGER.
            #[allow(clippy::cast_precision_loss)]
            ValueRef::Integer(n) => Ok(Some(n as f64)),
            other => Err(self.bad(
                column,
                format!("expected a number, got {:?}", other.data_type()),
            )),
        }
    }

    fn f64(&self, i: usize, column: &str) -> Result<f64, StoreError> {
        self.opt_f64(i, column)?
            .ok_or_else(|| self.bad(column, "unexpected NULL"))
    }

    fn i64(&self, i: usize, column: &str) -> Result<i64, StoreError> {
        self.value(i, column)?
            .as_i64()
            .map_err(|e| self.bad(column, e))
    }

    fn u32(&self, i: usize, column: &str) -> Result<u32, StoreError> {
        u32::try_from(self.i64(i, column)?).map_err(|e| self.bad(column, e))
    }

    fn parse<T: FromStr>(&self, i: usize, column: &str) -> Result<T, StoreError>
    where
        T::Err: Display,
    {
        self.str(i, column)?
            .parse()
            .map_err(|e| self.bad(column, e))
    }

    fn opt_parse<T: FromStr>(&self, i: usize, column: &str) -> Result<Option<T>, StoreError>
    where
        T::Err: Display,
    {
        self.opt_str(i, column)?
            .map(|s| s.parse().map_err(|e| self.bad(column, e)))
            .transpose()
    }

    fn json<T: DeserializeOwned>(&self, i: usize, column: &str) -> Result<T, StoreError> {
        serde_json::from_str(self.str(i, column)?).map_err(|e| self.bad(column, e))
    }

    fn opt_json<T: DeserializeOwned>(
        &self,
        i: usize,
        column: &str,
    ) -> Result<Option<T>, StoreError> {
        self.opt_str(i, column)?
            .map(|s| serde_json::from_str(s).map_err(|e| self.bad(column, e)))
            .transpose()
    }
}

fn row_id(row: &Row<'_>, i: usize, table: &str) -> Result<String, StoreError> {
    row.get::<_, String>(i)
        .map_err(|e| StoreError::Backend(format!("sqlite table `{table}`: bad id column: {e}")))
}

fn row_seq(row: &Row<'_>, table: &str) -> Result<i64, StoreError> {
    row.get::<_, i64>(0)
        .map_err(|e| StoreError::Backend(format!("sqlite table `{table}`: bad seq column: {e}")))
}

/// The `SELECT … FROM rollouts` decoded by [`decode_rollout`]; append a `WHERE`.
macro_rules! select_rollouts {
    () => {
        "SELECT seq, rollout_id, input, start_time, end_time, mode, resources_id, status, \
         config, metadata, attempt_count, span_sequence FROM rollouts"
    };
}
pub(crate) use select_rollouts;

/// Decodes a row of [`select_rollouts!`].
pub(crate) fn decode_rollout(row: &Row<'_>) -> Result<RolloutRow, StoreError> {
    let seq = row_seq(row, "rollouts")?;
    let rollout_id = row_id(row, 1, "rollouts")?;
    let c = Cols {
        row,
        table: "rollouts",
        id: &rollout_id,
    };
    let input = c.json(2, "input")?;
    let start_time = c.f64(3, "start_time")?;
    let end_time = c.opt_f64(4, "end_time")?;
    let mode = c.opt_parse(5, "mode")?;
    let resources_id = c.opt_str(6, "resources_id")?.map(str::to_string);
    let status = c.parse(7, "status")?;
    let config = c.json(8, "config")?;
    let metadata = c.opt_json(9, "metadata")?;
    let attempts = c.u32(10, "attempt_count")?;
    let span_sequence = c.i64(11, "span_sequence")?;
    Ok(RolloutRow {
        seq,
        rollout: Rollout {
            rollout_id,
            input,
            start_time,
            end_time,
            mode,
            resources_id,
            status,
            config,
            metadata,
        },
        attempts,
        span_sequence,
    })
}

/// The `SELECT … FROM attempts` decoded by [`decode_attempt`]; append a `WHERE`.
macro_rules! select_attempts {
    () => {
        "SELECT seq, rollout_id, attempt_id, sequence_id, start_time, end_time, status, \
         worker_id, last_heartbeat_time, metadata FROM attempts"
    };
}
pub(crate) use select_attempts;

/// Decodes a row of [`select_attempts!`] into `(row seq, attempt)`.
pub(crate) fn decode_attempt(row: &Row<'_>) -> Result<(i64, Attempt), StoreError> {
    let seq = row_seq(row, "attempts")?;
    let rollout_id = row_id(row, 1, "attempts")?;
    let attempt_id = row_id(row, 2, "attempts")?;
    let shown = format!("{rollout_id}/{attempt_id}");
    let c = Cols {
        row,
        table: "attempts",
        id: &shown,
    };
    let sequence_id = c.u32(3, "sequence_id")?;
    let start_time = c.f64(4, "start_time")?;
    let end_time = c.opt_f64(5, "end_time")?;
    let status = c.parse(6, "status")?;
    let worker_id = c.opt_str(7, "worker_id")?.map(str::to_string);
    let last_heartbeat_time = c.opt_f64(8, "last_heartbeat_time")?;
    let metadata = c.opt_json(9, "metadata")?;
    Ok((
        seq,
        Attempt {
            rollout_id,
            attempt_id,
            sequence_id,
            start_time,
            end_time,
            status,
            worker_id,
            last_heartbeat_time,
            metadata,
        },
    ))
}

/// The `SELECT … FROM workers` decoded by [`decode_worker`]; append a `WHERE`.
macro_rules! select_workers {
    () => {
        "SELECT seq, worker_id, status, heartbeat_stats, last_heartbeat_time, \
         last_dequeue_time, last_busy_time, last_idle_time, current_rollout_id, \
         current_attempt_id FROM workers"
    };
}
pub(crate) use select_workers;

/// Decodes a row of [`select_workers!`].
pub(crate) fn decode_worker(row: &Row<'_>) -> Result<Worker, StoreError> {
    let worker_id = row_id(row, 1, "workers")?;
    let c = Cols {
        row,
        table: "workers",
        id: &worker_id,
    };
    let status = c.parse(2, "status")?;
    let heartbeat_stats = c.opt_json(3, "heartbeat_stats")?;
    let last_heartbeat_time = c.opt_f64(4, "last_heartbeat_time")?;
    let last_dequeue_time = c.opt_f64(5, "last_dequeue_time")?;
    let last_busy_time = c.opt_f64(6, "last_busy_time")?;
    let last_idle_time = c.opt_f64(7, "last_idle_time")?;
    let current_rollout_id = c.opt_str(8, "current_rollout_id")?.map(str::to_string);
    let current_attempt_id = c.opt_str(9, "current_attempt_id")?.map(str::to_string);
    Ok(Worker {
        worker_id,
        status,
        heartbeat_stats,
        last_heartbeat_time,
        last_dequeue_time,
        last_busy_time,
        last_idle_time,
        current_rollout_id,
        current_attempt_id,
    })
}

/// The `SELECT … FROM resources` decoded by [`decode_resources`]; append a `WHERE`.
macro_rules! select_resources {
    () => {
        "SELECT seq, resources_id, create_time, update_time, version, resources FROM resources"
    };
}
pub(crate) use select_resources;

/// Decodes a row of [`select_resources!`] into `(row seq, resources)`.
pub(crate) fn decode_resources(row: &Row<'_>) -> Result<(i64, ResourcesUpdate), StoreError> {
    let seq = row_seq(row, "resources")?;
    let resources_id = row_id(row, 1, "resources")?;
    let c = Cols {
        row,
        table: "resources",
        id: &resources_id,
    };
    let create_time = c.f64(2, "create_time")?;
    let update_time = c.f64(3, "update_time")?;
    let version = u64::try_from(c.i64(4, "version")?).map_err(|e| c.bad("version", e))?;
    let resources = c.json(5, "resources")?;
    Ok((
        seq,
        ResourcesUpdate {
            resources_id,
            create_time,
            update_time,
            version,
            resources,
        },
    ))
}

/// Decodes `SELECT seq, body FROM spans …`.
pub(crate) fn decode_span(row: &Row<'_>) -> Result<Span, StoreError> {
    let seq = row_seq(row, "spans")?;
    let shown = format!("#{seq}");
    let c = Cols {
        row,
        table: "spans",
        id: &shown,
    };
    c.json(1, "body")
}
