//! Every store operation as one function over the writer's connection.
//!
//! Responsible for the operations themselves ([`Ctx`] methods named like the
//! [`crate::LightningStore`] methods): which rows to read, calling the [`crate::lifecycle`]
//! function on the decoded agl-core values, and writing back what changed. Each method runs
//! inside the writer's transaction (see the sibling `writer` module): it never begins or
//! commits. Every method checks its input before it writes, so a refused request has written
//! nothing (the writer relies on this for atomicity). Not responsible for any rule (all in
//! `lifecycle`), for query semantics (`crate::query`: candidates are pre-selected with SQL,
//! then [`Matches`] and [`query::finish`] produce the page), or for row encoding (sibling
//! `rows` module).

use std::collections::HashMap;
use std::path::PathBuf;

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker, new_attempt_id, new_resources_id, new_rollout_id,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use serde_json::Value;

use super::rows::{
    RolloutRow, SqlContext, decode_attempt, decode_resources, decode_rollout, decode_span,
    decode_worker, is_unique_violation, opt_json, select_attempts, select_resources,
    select_rollouts, select_workers, to_json,
};
use super::select::{self, Page};
use crate::error::StoreError;
use crate::lifecycle::{self, RolloutChange, ScanDebounce};
use crate::query::{
    self, AttemptQuery, FilterLogic, Matches, Paginated, ResourcesQuery, RolloutQuery, SpanQuery,
    Window, WorkerQuery,
};
use crate::sql::{ByRollout, ID_ATTEMPTS};
use crate::store::{AttemptUpdate, RolloutUpdate, StoreStatistics};

/// The `LIMIT` and `OFFSET` of a window, as bound after a page statement's parameters (`-1`:
/// no limit).
fn window(w: Window) -> [SqlValue; 2] {
    [
        SqlValue::Integer(w.limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))),
        SqlValue::Integer(i64::try_from(w.offset).unwrap_or(i64::MAX)),
    ]
}

/// Collects decoded rows.
fn collect<T>(
    rows: rusqlite::Result<Vec<Result<T, StoreError>>>,
    what: &str,
) -> Result<Vec<T>, StoreError> {
    rows.at(what)?.into_iter().collect()
}

/// A rollout loaded for `add_spans`, with the attempts its spans name.
struct SpanTarget {
    row: RolloutRow,
    before: Rollout,
    /// `(row seq, before, current)` by attempt id.
    attempts: HashMap<String, (i64, Attempt, Attempt)>,
}

/// The span sequence counter named by a span's `rollout_id` (§4.7).
struct Counter {
    rollout_id: String,
    /// The rollout's row, or `None` for an unknown id (`orphan_sequences`, Q10).
    target: Option<usize>,
    before: i64,
    value: i64,
}

/// The writer's connection and the in-process state that may live outside the database: the
/// lazy-scan debounce and the flags of the running transaction.
pub(crate) struct Ctx {
    conn: Connection,
    path: PathBuf,
    debounce: ScanDebounce,
    /// A rollout became finished in the running transaction (waiters must be woken).
    pub(crate) finished: bool,
    /// The running operation asked for its writes to be kept even though it fails.
    pub(crate) keep_on_error: bool,
    /// An operation failed after writing: the transaction must be rolled back.
    pub(crate) poisoned: Option<StoreError>,
}

impl Ctx {
    /// Wraps an opened, migrated connection.
    pub(crate) fn new(conn: Connection, path: PathBuf, scan_debounce_seconds: f64) -> Self {
        Ctx {
            conn,
            path,
            debounce: ScanDebounce::new(scan_debounce_seconds),
            finished: false,
            keep_on_error: false,
            poisoned: None,
        }
    }

    /// Runs a statement without parameters or result (transaction control).
    pub(crate) fn exec(&self, sql: &str) -> Result<(), StoreError> {
        self.conn.prepare_cached(sql).at(sql)?.execute([]).at(sql)?;
        Ok(())
    }

    /// Rows changed by this connection since it was opened (tells whether an operation wrote).
    pub(crate) fn total_changes(&self) -> u64 {
        self.conn.total_changes()
    }

    /// Whether no transaction is open.
    pub(crate) fn is_autocommit(&self) -> bool {
        self.conn.is_autocommit()
    }

    /// `PRAGMA wal_checkpoint(TRUNCATE)`.
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        super::schema::checkpoint(&self.conn, &self.path)
    }

    /// Whether the debounced lazy scan is due at `now` (records the scan when it is).
    pub(crate) fn scan_due(&mut self, now: f64) -> bool {
        self.debounce.should_scan(now)
    }

    // -----------------------------------------------------------------------------------------
    // Rollouts
    // -----------------------------------------------------------------------------------------

    fn rollout_by_id(&self, rollout_id: &str) -> Result<Option<RolloutRow>, StoreError> {
        const SQL: &str = concat!(select_rollouts!(), " WHERE rollout_id = ?1");
        self.conn
            .prepare_cached(SQL)
            .at("select rollout")?
            .query_row([rollout_id], |row| Ok(decode_rollout(row)))
            .optional()
            .at("select rollout")?
            .transpose()
    }

    fn rollout_by_seq(&self, seq: i64) -> Result<RolloutRow, StoreError> {
        const SQL: &str = concat!(select_rollouts!(), " WHERE seq = ?1");
        self.conn
            .prepare_cached(SQL)
            .at("select rollout")?
            .query_row([seq], |row| Ok(decode_rollout(row)))
            .at("select rollout")?
    }

    fn require_rollout(&self, rollout_id: &str) -> Result<RolloutRow, StoreError> {
        self.rollout_by_id(rollout_id)?
            .ok_or_else(|| StoreError::rollout_not_found(rollout_id))
    }

    fn rollouts_where(
        &self,
        sql: &str,
        params: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<RolloutRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).at("select rollouts")?;
        let rows = stmt
            .query_map(params, |row| Ok(decode_rollout(row)))
            .and_then(Iterator::collect);
        collect(rows, "select rollouts")
    }

    /// Inserts a new rollout; on an id collision (`UNIQUE(rollout_id)`) it draws a new id.
    fn insert_rollout(&self, rollout: &mut Rollout) -> Result<i64, StoreError> {
        const SQL: &str = "INSERT INTO rollouts (rollout_id, input, start_time, end_time, mode, \
                           resources_id, status, config, metadata, watched) \
                           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
        let input = to_json(&rollout.input, "rollout input")?;
        let config = to_json(&rollout.config, "rollout config")?;
        let metadata = opt_json(rollout.metadata.as_ref(), "rollout metadata")?;
        let mut stmt = self.conn.prepare_cached(SQL).at("insert rollout")?;
        for _ in 0..ID_ATTEMPTS {
            let inserted = stmt.insert(params![
                rollout.rollout_id,
                input,
                rollout.start_time,
                rollout.end_time,
                rollout.mode.map(|m| m.as_str()),
                rollout.resources_id,
                rollout.status.as_str(),
                config,
                metadata,
                lifecycle::is_watched(rollout),
            ]);
            match inserted {
                Ok(seq) => return Ok(seq),
                Err(e) if is_unique_violation(&e) => rollout.rollout_id = new_rollout_id(),
                Err(e) => return Err(e).at("insert rollout"),
            }
        }
        Err(StoreError::Backend(format!(
            "sqlite: insert rollout: {ID_ATTEMPTS} fresh rollout ids all collided"
        )))
    }

    /// Writes back the columns of a rollout that differ from `before`; `attempts` also sets
    /// `attempt_count`.
    fn save_rollout(
        &self,
        seq: i64,
        before: &Rollout,
        after: &Rollout,
        attempts: Option<u32>,
    ) -> Result<(), StoreError> {
        if before == after && attempts.is_none() {
            return Ok(());
        }
        let watched = lifecycle::is_watched(after);
        let only_status = before.input == after.input
            && before.mode == after.mode
            && before.resources_id == after.resources_id
            && before.config == after.config
            && before.metadata == after.metadata;
        if only_status && before.end_time == after.end_time {
            // `end_time` is not assigned, so its index is left alone (most status changes).
            const SQL: &str = "UPDATE rollouts SET status = ?2, watched = ?3, \
                               attempt_count = coalesce(?4, attempt_count) WHERE seq = ?1";
            self.conn
                .prepare_cached(SQL)
                .at("update rollout")?
                .execute(params![seq, after.status.as_str(), watched, attempts])
                .at("update rollout")?;
            return Ok(());
        }
        if only_status {
            const SQL: &str = "UPDATE rollouts SET status = ?2, end_time = ?3, watched = ?4, \
                               attempt_count = coalesce(?5, attempt_count) WHERE seq = ?1";
            self.conn
                .prepare_cached(SQL)
                .at("update rollout")?
                .execute(params![
                    seq,
                    after.status.as_str(),
                    after.end_time,
                    watched,
                    attempts
                ])
                .at("update rollout")?;
            return Ok(());
        }
        const SQL: &str = "UPDATE rollouts SET input = ?2, end_time = ?3, mode = ?4, \
                           resources_id = ?5, status = ?6, config = ?7, metadata = ?8, \
                           watched = ?9, attempt_count = coalesce(?10, attempt_count) \
                           WHERE seq = ?1";
        self.conn
            .prepare_cached(SQL)
            .at("update rollout")?
            .execute(params![
                seq,
                to_json(&after.input, "rollout input")?,
                after.end_time,
                after.mode.map(|m| m.as_str()),
                after.resources_id,
                after.status.as_str(),
                to_json(&after.config, "rollout config")?,
                opt_json(after.metadata.as_ref(), "rollout metadata")?,
                watched,
                attempts,
            ])
            .at("update rollout")?;
        Ok(())
    }

    /// Book-keeping after a change of the rollout in row `seq`: requeue (unless already
    /// queued) and note that waiters must be woken.
    fn after_change(&mut self, seq: i64, change: RolloutChange) -> Result<(), StoreError> {
        if change.requeue {
            self.push_queue(seq)?;
        }
        if change.became_finished() {
            self.finished = true;
        }
        Ok(())
    }

    /// Appends to the queue unless the rollout already has an entry (§4.9).
    fn push_queue(&self, seq: i64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO queue (rollout_seq) VALUES (?1)")
            .at("insert into queue")?
            .execute([seq])
            .at("insert into queue")?;
        Ok(())
    }

    /// Takes the head of the queue (the rollout's row seq), or `None` when it is empty.
    fn pop_queue(&self) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "DELETE FROM queue WHERE pos = (SELECT min(pos) FROM queue) \
                           RETURNING rollout_seq";
        self.conn
            .prepare_cached(SQL)
            .at("pop queue")?
            .query_row([], |row| row.get(0))
            .optional()
            .at("pop queue")
    }

    fn latest_resources_id(&self) -> Result<Option<String>, StoreError> {
        const SQL: &str = "SELECT r.resources_id FROM meta m JOIN resources r ON r.seq = m.value \
                           WHERE m.key = 'latest_resources_seq'";
        self.conn
            .prepare_cached(SQL)
            .at("select latest resources")?
            .query_row([], |row| row.get(0))
            .optional()
            .at("select latest resources")
    }

    /// A rollout as `GET /rollouts` returns it: with its latest attempt when it has one.
    fn any_rollout(&self, row: RolloutRow) -> Result<AnyRollout, StoreError> {
        Ok(match self.latest_attempt(&row)? {
            Some((_, attempt)) => AnyRollout::Attempted(AttemptedRollout {
                rollout: row.rollout,
                attempt,
            }),
            None => AnyRollout::Plain(row.rollout),
        })
    }

    // -----------------------------------------------------------------------------------------
    // Attempts
    // -----------------------------------------------------------------------------------------

    fn attempt_by_sequence(
        &self,
        rollout_seq: i64,
        sequence_id: u32,
    ) -> Result<Option<(i64, Attempt)>, StoreError> {
        const SQL: &str = concat!(
            select_attempts!(),
            " WHERE rollout_seq = ?1 AND sequence_id = ?2"
        );
        self.conn
            .prepare_cached(SQL)
            .at("select attempt")?
            .query_row(params![rollout_seq, sequence_id], |row| {
                Ok(decode_attempt(row))
            })
            .optional()
            .at("select attempt")?
            .transpose()
    }

    /// The attempt with the highest `sequence_id` (`attempt_count`), if any.
    fn latest_attempt(&self, row: &RolloutRow) -> Result<Option<(i64, Attempt)>, StoreError> {
        if row.attempts == 0 {
            return Ok(None);
        }
        self.attempt_by_sequence(row.seq, row.attempts)
    }

    fn attempt_by_id(
        &self,
        rollout_seq: i64,
        attempt_id: &str,
    ) -> Result<Option<(i64, Attempt)>, StoreError> {
        const SQL: &str = concat!(
            select_attempts!(),
            " WHERE rollout_seq = ?1 AND attempt_id = ?2"
        );
        self.conn
            .prepare_cached(SQL)
            .at("select attempt")?
            .query_row(params![rollout_seq, attempt_id], |row| {
                Ok(decode_attempt(row))
            })
            .optional()
            .at("select attempt")?
            .transpose()
    }

    fn attempts_of(&self, rollout_seq: i64) -> Result<Vec<Attempt>, StoreError> {
        const SQL: &str = concat!(
            select_attempts!(),
            " WHERE rollout_seq = ?1 ORDER BY sequence_id"
        );
        let mut stmt = self.conn.prepare_cached(SQL).at("select attempts")?;
        let rows = stmt
            .query_map([rollout_seq], |row| Ok(decode_attempt(row).map(|(_, a)| a)))
            .and_then(Iterator::collect);
        collect(rows, "select attempts")
    }

    /// Inserts a new attempt; on an id collision within the rollout
    /// (`UNIQUE(rollout_seq, attempt_id)`) it draws a new id.
    fn insert_attempt(&self, rollout_seq: i64, a: &mut Attempt) -> Result<i64, StoreError> {
        const SQL: &str = "INSERT INTO attempts (rollout_seq, rollout_id, attempt_id, \
                           sequence_id, start_time, end_time, status, worker_id, \
                           last_heartbeat_time, metadata) \
                           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
        let metadata = opt_json(a.metadata.as_ref(), "attempt metadata")?;
        let mut stmt = self.conn.prepare_cached(SQL).at("insert attempt")?;
        for _ in 0..ID_ATTEMPTS {
            let inserted = stmt.insert(params![
                rollout_seq,
                a.rollout_id,
                a.attempt_id,
                a.sequence_id,
                a.start_time,
                a.end_time,
                a.status.as_str(),
                a.worker_id,
                a.last_heartbeat_time,
                metadata,
            ]);
            match inserted {
                Ok(seq) => return Ok(seq),
                Err(e) if is_unique_violation(&e) => a.attempt_id = new_attempt_id(),
                Err(e) => return Err(e).at("insert attempt"),
            }
        }
        Err(StoreError::Backend(format!(
            "sqlite: insert attempt #{} of rollout `{}`: {ID_ATTEMPTS} fresh attempt ids all \
             collided (or `attempts` disagrees with `rollouts.attempt_count`)",
            a.sequence_id, a.rollout_id
        )))
    }

    /// Writes back an attempt that differs from `before` (`metadata` only when it changed).
    fn save_attempt(&self, seq: i64, before: &Attempt, after: &Attempt) -> Result<(), StoreError> {
        if before == after {
            return Ok(());
        }
        if before.metadata == after.metadata {
            const SQL: &str = "UPDATE attempts SET end_time = ?2, status = ?3, worker_id = ?4, \
                               last_heartbeat_time = ?5 WHERE seq = ?1";
            self.conn
                .prepare_cached(SQL)
                .at("update attempt")?
                .execute(params![
                    seq,
                    after.end_time,
                    after.status.as_str(),
                    after.worker_id,
                    after.last_heartbeat_time,
                ])
                .at("update attempt")?;
            return Ok(());
        }
        const SQL: &str = "UPDATE attempts SET end_time = ?2, status = ?3, worker_id = ?4, \
                           last_heartbeat_time = ?5, metadata = ?6 WHERE seq = ?1";
        self.conn
            .prepare_cached(SQL)
            .at("update attempt")?
            .execute(params![
                seq,
                after.end_time,
                after.status.as_str(),
                after.worker_id,
                after.last_heartbeat_time,
                opt_json(after.metadata.as_ref(), "attempt metadata")?,
            ])
            .at("update attempt")?;
        Ok(())
    }

    /// Creates the next attempt of a rollout and binds the worker (§4.1, §4.4); `dequeued`
    /// also records the worker's dequeue time.
    fn begin_attempt(
        &mut self,
        row: RolloutRow,
        worker_id: Option<&str>,
        dequeued: bool,
        now: f64,
    ) -> Result<AttemptedRollout, StoreError> {
        let RolloutRow {
            seq,
            mut rollout,
            attempts,
            ..
        } = row;
        let before = rollout.clone();
        let (mut attempt, change) = lifecycle::begin_attempt(
            &mut rollout,
            attempts,
            new_attempt_id(),
            worker_id.map(str::to_string),
            now,
        );
        self.insert_attempt(seq, &mut attempt)?;
        self.save_rollout(seq, &before, &rollout, Some(attempt.sequence_id))?;
        if let Some(w) = &attempt.worker_id {
            let mut worker = self.worker_or_new(w)?;
            lifecycle::sync_worker(&mut worker, &attempt, now);
            if dequeued {
                lifecycle::worker_dequeued(&mut worker, now);
            }
            self.save_worker(&worker)?;
        }
        self.after_change(seq, change)?;
        Ok(AttemptedRollout { rollout, attempt })
    }

    // -----------------------------------------------------------------------------------------
    // Workers
    // -----------------------------------------------------------------------------------------

    fn worker(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        const SQL: &str = concat!(select_workers!(), " WHERE worker_id = ?1");
        self.conn
            .prepare_cached(SQL)
            .at("select worker")?
            .query_row([worker_id], |row| Ok(decode_worker(row)))
            .optional()
            .at("select worker")?
            .transpose()
    }

    fn worker_or_new(&self, worker_id: &str) -> Result<Worker, StoreError> {
        Ok(self
            .worker(worker_id)?
            .unwrap_or_else(|| Worker::new(worker_id)))
    }

    /// Upserts a worker; a new worker row keeps its first-seen position.
    fn save_worker(&self, w: &Worker) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO workers (worker_id, status, heartbeat_stats, \
                           last_heartbeat_time, last_dequeue_time, last_busy_time, \
                           last_idle_time, current_rollout_id, current_attempt_id) \
                           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                           ON CONFLICT (worker_id) DO UPDATE SET status = excluded.status, \
                           heartbeat_stats = excluded.heartbeat_stats, \
                           last_heartbeat_time = excluded.last_heartbeat_time, \
                           last_dequeue_time = excluded.last_dequeue_time, \
                           last_busy_time = excluded.last_busy_time, \
                           last_idle_time = excluded.last_idle_time, \
                           current_rollout_id = excluded.current_rollout_id, \
                           current_attempt_id = excluded.current_attempt_id";
        self.conn
            .prepare_cached(SQL)
            .at("upsert worker")?
            .execute(params![
                w.worker_id,
                w.status.as_str(),
                opt_json(w.heartbeat_stats.as_ref(), "worker heartbeat_stats")?,
                w.last_heartbeat_time,
                w.last_dequeue_time,
                w.last_busy_time,
                w.last_idle_time,
                w.current_rollout_id,
                w.current_attempt_id,
            ])
            .at("upsert worker")?;
        Ok(())
    }

    fn sync_worker_for(&self, attempt: &Attempt, now: f64) -> Result<(), StoreError> {
        if let Some(worker_id) = &attempt.worker_id {
            let mut worker = self.worker_or_new(worker_id)?;
            lifecycle::sync_worker(&mut worker, attempt, now);
            self.save_worker(&worker)?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Watchdog
    // -----------------------------------------------------------------------------------------

    /// The watchdog scan without debounce (§4.5); returns how many attempts it changed. Only
    /// rollouts with `watched = 1` (see [`lifecycle::is_watched`]) are read; the changes are
    /// written in one savepoint, so a failing scan changes nothing.
    pub(crate) fn scan_now(&mut self, now: f64) -> Result<usize, StoreError> {
        const SQL: &str = concat!(select_rollouts!(), " WHERE watched = 1 ORDER BY seq");
        let candidates = self.rollouts_where(SQL, &[])?;
        let mut verdicts = Vec::new();
        for row in candidates {
            let Some((aseq, attempt)) = self.latest_attempt(&row)? else {
                continue;
            };
            if lifecycle::watchdog_verdict(&row.rollout, &attempt, now).is_some() {
                verdicts.push((row, aseq, attempt));
            }
        }
        if verdicts.is_empty() {
            return Ok(0);
        }
        self.exec("SAVEPOINT watchdog")?;
        let result = self.apply_verdicts(verdicts, now);
        if result.is_err() {
            let _ = self.exec("ROLLBACK TO watchdog");
        }
        self.exec("RELEASE watchdog")?;
        result
    }

    fn apply_verdicts(
        &mut self,
        verdicts: Vec<(RolloutRow, i64, Attempt)>,
        now: f64,
    ) -> Result<usize, StoreError> {
        let mut changed = 0;
        for (row, aseq, mut attempt) in verdicts {
            let mut rollout = row.rollout.clone();
            let attempt_before = attempt.clone();
            let Some(change) = lifecycle::apply_watchdog(&mut rollout, &mut attempt, now) else {
                continue;
            };
            changed += 1;
            self.save_attempt(aseq, &attempt_before, &attempt)?;
            self.save_rollout(row.seq, &row.rollout, &rollout, None)?;
            if change.sync_worker {
                self.sync_worker_for(&attempt, now)?;
            }
            self.after_change(row.seq, change.rollout)?;
        }
        Ok(changed)
    }

    // -----------------------------------------------------------------------------------------
    // Rollout operations
    // -----------------------------------------------------------------------------------------

    fn create_rollout(
        &mut self,
        request: EnqueueRolloutRequest,
        now: f64,
    ) -> Result<RolloutRow, StoreError> {
        let latest = self.latest_resources_id()?;
        let mut rollout =
            lifecycle::new_rollout(request, new_rollout_id(), latest.as_deref(), now)?;
        let seq = self.insert_rollout(&mut rollout)?;
        Ok(RolloutRow {
            seq,
            rollout,
            attempts: 0,
            span_sequence: 0,
        })
    }

    /// `enqueue_rollout`.
    pub(crate) fn enqueue(
        &mut self,
        request: EnqueueRolloutRequest,
        now: f64,
    ) -> Result<Rollout, StoreError> {
        let row = self.create_rollout(request, now)?;
        self.push_queue(row.seq)?;
        Ok(row.rollout)
    }

    /// `start_rollout`.
    pub(crate) fn start_rollout(
        &mut self,
        request: EnqueueRolloutRequest,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<AttemptedRollout, StoreError> {
        let row = self.create_rollout(request, now)?;
        self.begin_attempt(row, worker_id, false, now)
    }

    /// `dequeue_rollout`: pops queue entries until a dispatchable rollout is found (stale
    /// entries are consumed, §4.9); with nothing to dispatch the worker becomes idle.
    pub(crate) fn dequeue(
        &mut self,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        while let Some(seq) = self.pop_queue()? {
            let row = self.rollout_by_seq(seq)?;
            if lifecycle::is_dispatchable(&row.rollout) {
                return self.begin_attempt(row, worker_id, true, now).map(Some);
            }
        }
        if let Some(w) = worker_id {
            let mut worker = self.worker_or_new(w)?;
            lifecycle::worker_found_nothing(&mut worker, now);
            self.save_worker(&worker)?;
        }
        Ok(None)
    }

    /// `start_attempt`.
    pub(crate) fn start_attempt(
        &mut self,
        rollout_id: &str,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<AttemptedRollout, StoreError> {
        let row = self.require_rollout(rollout_id)?;
        self.begin_attempt(row, worker_id, false, now)
    }

    /// `update_attempt`.
    pub(crate) fn update_attempt(
        &mut self,
        rollout_id: &str,
        attempt_id: &str,
        update: &AttemptUpdate,
        now: f64,
    ) -> Result<Attempt, StoreError> {
        let row = self.require_rollout(rollout_id)?;
        let target = if lifecycle::is_latest_selector(attempt_id) {
            self.latest_attempt(&row)?
        } else {
            self.attempt_by_id(row.seq, attempt_id)?
        };
        let (aseq, mut attempt) =
            target.ok_or_else(|| StoreError::attempt_not_found(attempt_id))?;
        let is_latest = attempt.sequence_id == row.attempts;
        let mut rollout = row.rollout.clone();
        let attempt_before = attempt.clone();
        let change =
            lifecycle::apply_attempt_update(&mut rollout, &mut attempt, is_latest, update, now)?;
        self.save_attempt(aseq, &attempt_before, &attempt)?;
        self.save_rollout(row.seq, &row.rollout, &rollout, None)?;
        if change.sync_worker {
            self.sync_worker_for(&attempt, now)?;
        }
        self.after_change(row.seq, change.rollout)?;
        Ok(attempt)
    }

    /// `update_rollout`.
    pub(crate) fn update_rollout(
        &mut self,
        rollout_id: &str,
        update: RolloutUpdate,
        now: f64,
    ) -> Result<Rollout, StoreError> {
        let row = self.require_rollout(rollout_id)?;
        let mut rollout = row.rollout.clone();
        let change = lifecycle::apply_rollout_update(&mut rollout, update, now)?;
        self.save_rollout(row.seq, &row.rollout, &rollout, None)?;
        self.after_change(row.seq, change)?;
        Ok(rollout)
    }

    /// `get_rollout_by_id`.
    pub(crate) fn get_rollout(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        Ok(self.rollout_by_id(rollout_id)?.map(|row| row.rollout))
    }

    /// `get_latest_attempt`.
    pub(crate) fn get_latest_attempt(
        &self,
        rollout_id: &str,
    ) -> Result<Option<Attempt>, StoreError> {
        match self.rollout_by_id(rollout_id)? {
            Some(row) => Ok(self.latest_attempt(&row)?.map(|(_, a)| a)),
            None => Ok(None),
        }
    }

    /// `query_rollouts`: the page's row ids and `total` from SQL (sibling `select` module:
    /// an index delivers the order, the window skips index entries, `total` is counted
    /// through the indexes), then only the page's rows are decoded, with their latest
    /// attempts. Sorts by a JSON field go through [`Self::query_rollouts_decoded`].
    pub(crate) fn query_rollouts(
        &self,
        q: &RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        query::validate_sort::<Rollout>(&q.sort)?;
        let Some(sql) = select::plan(q) else {
            return self.query_rollouts_decoded(q);
        };
        let (total, seqs) = match &sql.page {
            Page::ByStatusDesc { groups, segment } => {
                self.status_groups(&sql.params, groups, segment, q.window)?
            }
            Page::One(page) => {
                let total = self.count_with(&sql.count, &sql.params)?;
                (total, self.seqs(page, &sql.params, &window(q.window))?)
            }
            Page::Choose { sorted, walk } => {
                let total = self.count_with(&sql.count, &sql.params)?;
                let all = self.count(select::COUNT_ALL)?;
                let page = if select::walk_order(total, all, q.window.offset, q.window.limit) {
                    walk
                } else {
                    sorted
                };
                (total, self.seqs(page, &sql.params, &window(q.window))?)
            }
        };
        let items = seqs
            .into_iter()
            .map(|seq| self.any_rollout(self.rollout_by_seq(seq)?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Paginated {
            items,
            limit: q.window.wire_limit(),
            offset: q.window.offset,
            total,
        })
    }

    /// The count of `sql` with `params`.
    fn count_with(&self, sql: &str, params: &[SqlValue]) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .prepare_cached(sql)
            .at(sql)?
            .query_row(params_from_iter(params), |row| row.get(0))
            .at(sql)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The row ids `sql` selects with `params` then `more`.
    fn seqs(
        &self,
        sql: &str,
        params: &[SqlValue],
        more: &[SqlValue],
    ) -> Result<Vec<i64>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).at("select rollouts")?;
        stmt.query_map(params_from_iter(params.iter().chain(more)), |row| {
            row.get(0)
        })
        .and_then(Iterator::collect)
        .at("select rollouts")
    }

    /// A page sorted by `status` descending ([`Page::ByStatusDesc`]): the matches per status,
    /// then the window read from the groups in descending status order (ties in creation
    /// order), skipping whole groups that lie before the offset. Returns `total` and the ids.
    fn status_groups(
        &self,
        params: &[SqlValue],
        groups: &str,
        segment: &str,
        window: Window,
    ) -> Result<(u64, Vec<i64>), StoreError> {
        let mut stmt = self.conn.prepare_cached(groups).at("count rollouts")?;
        let mut counts: Vec<(String, u64)> = stmt
            .query_map(params_from_iter(params), |row| {
                let n: i64 = row.get(1)?;
                Ok((row.get(0)?, u64::try_from(n).unwrap_or(0)))
            })
            .and_then(Iterator::collect)
            .at("count rollouts")?;
        // Byte order, as SQLite's BINARY collation and `str::cmp`.
        counts.sort_by(|a, b| b.0.cmp(&a.0));
        let total = counts.iter().map(|(_, n)| n).sum();
        let mut skip = window.offset;
        let mut left = window.limit;
        let mut seqs = Vec::new();
        for (status, n) in counts {
            if left == Some(0) {
                break;
            }
            if skip >= n {
                skip -= n;
                continue;
            }
            let [limit, offset] = self::window(Window {
                limit: left,
                offset: skip,
            });
            let more = [SqlValue::Text(status), limit, offset];
            let got = self.seqs(segment, params, &more)?;
            if let Some(l) = left.as_mut() {
                *l = l.saturating_sub(got.len() as u64);
            }
            skip = 0;
            seqs.extend(got);
        }
        Ok((total, seqs))
    }

    /// `query_rollouts` over decoded rows: candidates pre-selected through the indexes by
    /// `rollout_id_in` or `status_in` (AND logic only, where they must hold), then
    /// [`Matches`] and [`query::finish`]. Used for the sorts SQL cannot reproduce (`input`,
    /// `config`, `metadata`); reads every candidate.
    fn query_rollouts_decoded(
        &self,
        q: &RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        let and = q.filter_logic == FilterLogic::And;
        let candidates: Vec<RolloutRow> = match (&q.rollout_id_in, &q.status_in) {
            (Some(ids), _) if and => {
                let mut found = Vec::new();
                for id in ids {
                    if let Some(row) = self.rollout_by_id(id)? {
                        found.push(row);
                    }
                }
                found.sort_by_key(|row| row.seq);
                found.dedup_by_key(|row| row.seq);
                found
            }
            (None, Some(statuses)) if and => {
                const SQL: &str = concat!(select_rollouts!(), " WHERE status = ?1");
                let mut wanted: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
                wanted.sort_unstable();
                wanted.dedup();
                let mut found = Vec::new();
                for status in wanted {
                    found.extend(self.rollouts_where(SQL, &[&status])?);
                }
                found.sort_by_key(|row| row.seq);
                found
            }
            _ => self.rollouts_where(concat!(select_rollouts!(), " ORDER BY seq"), &[])?,
        };
        let matches: Vec<ByRollout> = candidates
            .into_iter()
            .filter(|row| q.matches(&row.rollout))
            .map(ByRollout)
            .collect();
        let page = query::finish(matches, &q.sort, q.window)?;
        let items = page
            .items
            .into_iter()
            .map(|ByRollout(row)| self.any_rollout(row))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Paginated {
            items,
            limit: page.limit,
            offset: page.offset,
            total: page.total,
        })
    }

    /// `query_attempts` (an unknown rollout gives an empty page).
    pub(crate) fn query_attempts(
        &self,
        rollout_id: &str,
        q: &AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        let attempts = match self.rollout_by_id(rollout_id)? {
            Some(row) => self.attempts_of(row.seq)?,
            None => Vec::new(),
        };
        query::finish(attempts, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Spans
    // -----------------------------------------------------------------------------------------

    fn orphan_counter(&self, rollout_id: &str) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM orphan_sequences WHERE rollout_id = ?1")
            .at("select orphan sequence")?
            .query_row([rollout_id], |row| row.get(0))
            .optional()
            .at("select orphan sequence")?
            .unwrap_or(0))
    }

    fn save_counter(
        &self,
        rollout_id: &str,
        rollout_seq: Option<i64>,
        value: i64,
    ) -> Result<(), StoreError> {
        match rollout_seq {
            Some(seq) => {
                self.conn
                    .prepare_cached("UPDATE rollouts SET span_sequence = ?2 WHERE seq = ?1")
                    .at("update span sequence")?
                    .execute(params![seq, value])
                    .at("update span sequence")?;
            }
            None => {
                self.conn
                    .prepare_cached(
                        "INSERT INTO orphan_sequences (rollout_id, value) VALUES (?1, ?2) \
                         ON CONFLICT (rollout_id) DO UPDATE SET value = excluded.value",
                    )
                    .at("upsert orphan sequence")?
                    .execute(params![rollout_id, value])
                    .at("upsert orphan sequence")?;
            }
        }
        Ok(())
    }

    /// `get_next_span_sequence_id` (unknown rollout ids count too, Q10).
    pub(crate) fn next_sequence_id(&self, rollout_id: &str) -> Result<i64, StoreError> {
        self.next_sequence_ids(rollout_id, 1)
    }

    /// `get_next_span_sequence_ids`: a block of `count` ids, the first returned.
    pub(crate) fn next_sequence_ids(
        &self,
        rollout_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        let found: Option<(i64, i64)> = self
            .conn
            .prepare_cached("SELECT seq, span_sequence FROM rollouts WHERE rollout_id = ?1")
            .at("select span sequence")?
            .query_row([rollout_id], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()
            .at("select span sequence")?;
        let (seq, mut value) = match found {
            Some((seq, value)) => (Some(seq), value),
            None => (None, self.orphan_counter(rollout_id)?),
        };
        let issued = lifecycle::issue_sequence_ids(&mut value, count);
        self.save_counter(rollout_id, seq, value)?;
        Ok(issued)
    }

    /// `add_spans_with_fresh_ids`: one block per rollout ([`Ctx::next_sequence_ids`]), the
    /// spans numbered, then [`Ctx::add_spans`]. The blocks stay issued when the spans are
    /// refused, as with the two calls.
    pub(crate) fn add_spans_with_fresh_ids(
        &mut self,
        spans: Vec<(Span, bool)>,
        bodies: Vec<Option<String>>,
        now: f64,
    ) -> Result<Vec<Span>, StoreError> {
        let blocks = lifecycle::fresh_id_blocks(&spans);
        for b in &blocks {
            lifecycle::check_sequence_block(b.count)?;
        }
        let mut firsts = Vec::with_capacity(blocks.len());
        for b in &blocks {
            firsts.push(self.next_sequence_ids(&b.rollout_id, b.count)?);
        }
        // Numbering cannot fail after the blocks; should it, the blocks stay issued.
        self.keep_on_error = true;
        let encoded = crate::sql::numbered_spans(spans, bodies, &blocks, &firsts)?;
        self.keep_on_error = false;
        if encoded.is_empty() {
            return Ok(Vec::new());
        }
        self.add_spans(encoded, now)
    }

    /// `add_span(s)`: raises the sequence counters (kept even if the call fails, §4.7), checks
    /// every target, then inserts with one cached statement (`INSERT OR IGNORE` drops
    /// duplicates, `UNIQUE(rollout_seq, attempt_id, span_id)`) and applies
    /// [`lifecycle::record_span`] to each stored span in order. Each rollout and attempt is
    /// read and written once per call. `spans` come with their JSON bodies.
    pub(crate) fn add_spans(
        &mut self,
        spans: Vec<(Span, String)>,
        now: f64,
    ) -> Result<Vec<Span>, StoreError> {
        // 1. The rollouts the spans name, with their counters, raised in span order.
        let mut counters: Vec<Counter> = Vec::new();
        let mut targets: Vec<SpanTarget> = Vec::new();
        let mut counter_of = Vec::with_capacity(spans.len());
        for (span, _) in &spans {
            let idx = match counters
                .iter()
                .position(|c| c.rollout_id == span.rollout_id)
            {
                Some(i) => i,
                None => {
                    let (target, value) = match self.rollout_by_id(&span.rollout_id)? {
                        Some(row) => {
                            let value = row.span_sequence;
                            targets.push(SpanTarget {
                                before: row.rollout.clone(),
                                row,
                                attempts: HashMap::new(),
                            });
                            (Some(targets.len() - 1), value)
                        }
                        None => (None, self.orphan_counter(&span.rollout_id)?),
                    };
                    counters.push(Counter {
                        rollout_id: span.rollout_id.clone(),
                        target,
                        before: value,
                        value,
                    });
                    counters.len() - 1
                }
            };
            lifecycle::observe_sequence_id(&mut counters[idx].value, span.sequence_id);
            counter_of.push(idx);
        }
        for c in &counters {
            if c.value != c.before {
                let seq = c.target.and_then(|t| targets.get(t)).map(|t| t.row.seq);
                self.save_counter(&c.rollout_id, seq, c.value)?;
            }
        }
        // 2. Every target exists; a failure keeps only the counters written above.
        self.keep_on_error = true;
        let mut target_of = Vec::with_capacity(spans.len());
        for ((span, _), &c) in spans.iter().zip(&counter_of) {
            let idx = counters.get(c).and_then(|c| c.target);
            let attempt_found = match idx.and_then(|i| targets.get_mut(i)) {
                Some(t) if t.attempts.contains_key(&span.attempt_id) => true,
                Some(t) => match self.attempt_by_id(t.row.seq, &span.attempt_id)? {
                    Some((aseq, a)) => {
                        t.attempts
                            .insert(span.attempt_id.clone(), (aseq, a.clone(), a));
                        true
                    }
                    None => false,
                },
                None => false,
            };
            lifecycle::require_span_target(span, idx.is_some(), attempt_found)?;
            target_of.push(idx.unwrap_or(0));
        }
        self.keep_on_error = false;
        // 3. Insert; duplicates (stored before or earlier in this call) are dropped.
        let mut stored = Vec::with_capacity(spans.len());
        let mut changes = Vec::new();
        {
            let mut insert = self
                .conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO spans (rollout_seq, attempt_id, span_id, body) \
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .at("insert span")?;
            for ((span, body), idx) in spans.into_iter().zip(target_of) {
                let Some(t) = targets.get_mut(idx) else {
                    continue;
                };
                let inserted = insert
                    .execute(params![t.row.seq, span.attempt_id, span.span_id, body])
                    .at("insert span")?;
                if inserted == 0 {
                    continue;
                }
                let Some((_, _, attempt)) = t.attempts.get_mut(&span.attempt_id) else {
                    continue;
                };
                let is_latest = attempt.sequence_id == t.row.attempts;
                let effect = lifecycle::record_span(&mut t.row.rollout, attempt, is_latest, now);
                changes.push((t.row.seq, effect.rollout));
                stored.push(span);
            }
        }
        // 4. Write back what the spans did to their attempts and rollouts.
        for t in &targets {
            for (aseq, before, after) in t.attempts.values() {
                self.save_attempt(*aseq, before, after)?;
            }
            self.save_rollout(t.row.seq, &t.before, &t.row.rollout, None)?;
        }
        for (seq, change) in changes {
            self.after_change(seq, change)?;
        }
        Ok(stored)
    }

    /// `query_spans`: the rollout's spans in insertion order (optionally of one attempt),
    /// then [`Matches`] and [`query::finish`].
    pub(crate) fn query_spans(&self, q: &SpanQuery) -> Result<Paginated<Span>, StoreError> {
        let empty = || query::finish(Vec::<Span>::new(), &q.sort, q.window);
        let Some(row) = self.rollout_by_id(&q.rollout_id)? else {
            return empty();
        };
        let wanted: Option<String> = match q.attempt_id.as_deref() {
            None => None,
            Some(a) if lifecycle::is_latest_selector(a) => match self.latest_attempt(&row)? {
                Some((_, latest)) => Some(latest.attempt_id),
                None => return empty(),
            },
            Some(a) => Some(a.to_string()),
        };
        let spans = match &wanted {
            None => {
                const SQL: &str = "SELECT seq, body FROM spans WHERE rollout_seq = ?1 ORDER BY seq";
                let mut stmt = self.conn.prepare_cached(SQL).at("select spans")?;
                let rows = stmt
                    .query_map([row.seq], |r| Ok(decode_span(r)))
                    .and_then(Iterator::collect);
                collect(rows, "select spans")?
            }
            Some(attempt_id) => {
                const SQL: &str = "SELECT seq, body FROM spans WHERE rollout_seq = ?1 \
                                   AND attempt_id = ?2 ORDER BY seq";
                let mut stmt = self.conn.prepare_cached(SQL).at("select spans")?;
                let rows = stmt
                    .query_map(params![row.seq, attempt_id], |r| Ok(decode_span(r)))
                    .and_then(Iterator::collect);
                collect(rows, "select spans")?
            }
        };
        let matches: Vec<Span> = spans.into_iter().filter(|s| q.matches(s)).collect();
        query::finish(matches, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Resources
    // -----------------------------------------------------------------------------------------

    fn resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<(i64, ResourcesUpdate)>, StoreError> {
        const SQL: &str = concat!(select_resources!(), " WHERE resources_id = ?1");
        self.conn
            .prepare_cached(SQL)
            .at("select resources")?
            .query_row([resources_id], |row| Ok(decode_resources(row)))
            .optional()
            .at("select resources")?
            .transpose()
    }

    fn insert_resources(&self, r: &ResourcesUpdate) -> Result<i64, StoreError> {
        const SQL: &str = "INSERT INTO resources (resources_id, create_time, update_time, \
                           version, resources) VALUES (?1, ?2, ?3, ?4, ?5)";
        self.conn
            .prepare_cached(SQL)
            .at("insert resources")?
            .insert(params![
                r.resources_id,
                r.create_time,
                r.update_time,
                i64::try_from(r.version).unwrap_or(i64::MAX),
                to_json(&r.resources, "resources")?,
            ])
            .at("insert resources")
    }

    fn set_latest_resources(&self, seq: i64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('latest_resources_seq', ?1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .at("update latest resources")?
            .execute([seq])
            .at("update latest resources")?;
        Ok(())
    }

    /// `add_resources`.
    pub(crate) fn add_resources(
        &self,
        resources: NamedResources,
        now: f64,
    ) -> Result<ResourcesUpdate, StoreError> {
        let id = loop {
            let id = new_resources_id();
            if self.resources_by_id(&id)?.is_none() {
                break id;
            }
        };
        let update = lifecycle::new_resources(id, resources, now);
        let seq = self.insert_resources(&update)?;
        self.set_latest_resources(seq)?;
        Ok(update)
    }

    /// `update_resources` (an upsert, Q24).
    pub(crate) fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
        now: f64,
    ) -> Result<ResourcesUpdate, StoreError> {
        let (seq, update) = match self.resources_by_id(resources_id)? {
            Some((seq, mut existing)) => {
                lifecycle::replace_resources(&mut existing, resources, now);
                const SQL: &str = "UPDATE resources SET update_time = ?2, version = ?3, \
                                   resources = ?4 WHERE seq = ?1";
                self.conn
                    .prepare_cached(SQL)
                    .at("update resources")?
                    .execute(params![
                        seq,
                        existing.update_time,
                        i64::try_from(existing.version).unwrap_or(i64::MAX),
                        to_json(&existing.resources, "resources")?,
                    ])
                    .at("update resources")?;
                (seq, existing)
            }
            None => {
                let update = lifecycle::new_resources(resources_id.to_string(), resources, now);
                (self.insert_resources(&update)?, update)
            }
        };
        self.set_latest_resources(seq)?;
        Ok(update)
    }

    /// `get_resources_by_id`.
    pub(crate) fn get_resources(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        Ok(self.resources_by_id(resources_id)?.map(|(_, r)| r))
    }

    /// `get_latest_resources`.
    pub(crate) fn latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        match self.latest_resources_id()? {
            Some(id) => self.get_resources(&id),
            None => Ok(None),
        }
    }

    /// `query_resources` (`resources_id` pre-selects through the unique index).
    pub(crate) fn query_resources(
        &self,
        q: &ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        let all: Vec<ResourcesUpdate> = match &q.resources_id {
            Some(id) => self.get_resources(id)?.into_iter().collect(),
            None => {
                const SQL: &str = concat!(select_resources!(), " ORDER BY seq");
                let mut stmt = self.conn.prepare_cached(SQL).at("select resources")?;
                let rows = stmt
                    .query_map([], |row| Ok(decode_resources(row).map(|(_, r)| r)))
                    .and_then(Iterator::collect);
                collect(rows, "select resources")?
            }
        };
        let matches: Vec<ResourcesUpdate> = all.into_iter().filter(|r| q.matches(r)).collect();
        query::finish(matches, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Workers, waits, statistics
    // -----------------------------------------------------------------------------------------

    /// `update_worker` (validated before the upsert, so a refused call creates no worker).
    pub(crate) fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
        now: f64,
    ) -> Result<Worker, StoreError> {
        lifecycle::validate_heartbeat_stats(heartbeat_stats.as_ref())?;
        let mut worker = self.worker_or_new(worker_id)?;
        lifecycle::worker_heartbeat(&mut worker, heartbeat_stats, now)?;
        self.save_worker(&worker)?;
        Ok(worker)
    }

    /// `query_workers`.
    pub(crate) fn query_workers(&self, q: &WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        const SQL: &str = concat!(select_workers!(), " ORDER BY seq");
        let mut stmt = self.conn.prepare_cached(SQL).at("select workers")?;
        let rows = stmt
            .query_map([], |row| Ok(decode_worker(row)))
            .and_then(Iterator::collect);
        let all = collect(rows, "select workers")?;
        let matches: Vec<Worker> = all.into_iter().filter(|w| q.matches(w)).collect();
        query::finish(matches, &q.sort, q.window)
    }

    /// `get_worker_by_id`.
    pub(crate) fn get_worker(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        self.worker(worker_id)
    }

    /// For `wait_for_rollouts`: the finished rollouts among `ids` (request order, unknown
    /// omitted), the unfinished ones, and the earliest Unix time at which the watchdog may
    /// change one of them.
    pub(crate) fn wait_snapshot(
        &self,
        ids: &[String],
    ) -> Result<crate::wait::WaitSnapshot, StoreError> {
        let mut snap = crate::wait::WaitSnapshot::default();
        for id in ids {
            let Some(row) = self.rollout_by_id(id)? else {
                continue;
            };
            if row.rollout.status.is_finished() {
                snap.done.push(row.rollout);
                continue;
            }
            let at = self
                .latest_attempt(&row)?
                .and_then(|(_, a)| lifecycle::watchdog_deadline(&row.rollout, &a))
                .map(|deadline| deadline.max(self.debounce.next_scan_at()));
            snap.push_unfinished(id, at);
        }
        Ok(snap)
    }

    fn count(&self, sql: &str) -> Result<u64, StoreError> {
        self.count_with(sql, &[])
    }

    fn count_by_status(&self, sql: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).at(sql)?;
        let rows = stmt
            .query_map([], |row| {
                let status: String = row.get(0)?;
                let n: i64 = row.get(1)?;
                Ok((status, u64::try_from(n).unwrap_or(0)))
            })
            .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>);
        rows.at(sql)
    }

    /// `statistics` (without `uptime`, which belongs to the process): counts with `GROUP BY
    /// status`; `total_spans` counts the stored spans.
    pub(crate) fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        let mut stats = StoreStatistics::zeroed();
        for (status, n) in
            self.count_by_status("SELECT status, count(*) FROM rollouts GROUP BY status")?
        {
            let status = status.parse().map_err(|e| {
                StoreError::Backend(format!("sqlite table `rollouts`: column `status`: {e}"))
            })?;
            stats.rollouts_by_status.insert(status, n);
        }
        for (status, n) in
            self.count_by_status("SELECT status, count(*) FROM attempts GROUP BY status")?
        {
            let status = status.parse().map_err(|e| {
                StoreError::Backend(format!("sqlite table `attempts`: column `status`: {e}"))
            })?;
            stats.attempts_by_status.insert(status, n);
        }
        stats.total_rollouts = stats.rollouts_by_status.values().sum();
        stats.total_attempts = stats.attempts_by_status.values().sum();
        stats.total_spans = self.count("SELECT count(*) FROM spans")?;
        stats.total_resources = self.count("SELECT count(*) FROM resources")?;
        stats.total_workers = self.count("SELECT count(*) FROM workers")?;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx(dir: &tempfile::TempDir) -> Ctx {
        let path = dir.path().join("d.db");
        let (conn, _) = super::super::schema::open(&path, false, true).unwrap();
        Ctx::new(conn, path, 0.0)
    }

    #[test]
    fn colliding_ids_are_redrawn() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = ctx(&dir);
        let first = ctx
            .enqueue(EnqueueRolloutRequest::new(json!(1)), 1.0)
            .unwrap();
        let mut twin = first.clone();
        let seq = ctx.insert_rollout(&mut twin).unwrap();
        assert_ne!(twin.rollout_id, first.rollout_id, "a new id was drawn");
        assert!(twin.rollout_id.starts_with("ro-"));
        let row = ctx.rollout_by_seq(seq).unwrap();
        assert_eq!(row.rollout, twin);

        let a = ctx.start_attempt(&first.rollout_id, None, 2.0).unwrap();
        let rollout_seq = ctx.rollout_by_id(&first.rollout_id).unwrap().unwrap().seq;
        let mut clash = a.attempt.clone();
        clash.sequence_id = 2;
        ctx.insert_attempt(rollout_seq, &mut clash).unwrap();
        assert_ne!(clash.attempt_id, a.attempt.attempt_id, "a new id was drawn");
        let stored = ctx.attempt_by_id(rollout_seq, &clash.attempt_id).unwrap();
        assert_eq!(stored.map(|(_, a)| a), Some(clash));
    }

    #[test]
    fn rows_round_trip_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = ctx(&dir);
        let request = EnqueueRolloutRequest {
            mode: Some(agl_core::RolloutMode::Test),
            resources_id: Some("rs-x".into()),
            config: Some(agl_core::RolloutConfig {
                timeout_seconds: Some(1.5),
                unresponsive_seconds: None,
                max_attempts: 3,
                retry_condition: vec![agl_core::AttemptStatus::Timeout],
            }),
            metadata: Some(json!({"k": [1, "two", null]}).as_object().unwrap().clone()),
            ..EnqueueRolloutRequest::new(json!({"q": "ünïcode", "n": 1.25}))
        };
        let r = ctx.enqueue(request, 3.0).unwrap();
        let row = ctx.rollout_by_id(&r.rollout_id).unwrap().unwrap();
        assert_eq!(row.rollout, r);
        assert_eq!((row.attempts, row.span_sequence), (0, 0));
        let a = ctx.dequeue(Some("w"), 4.0).unwrap().unwrap();
        let row = ctx.rollout_by_id(&r.rollout_id).unwrap().unwrap();
        assert_eq!(row.attempts, 1);
        assert_eq!(row.rollout, a.rollout);
        assert_eq!(ctx.latest_attempt(&row).unwrap().unwrap().1, a.attempt);
        assert!(lifecycle::is_watched(&row.rollout), "timeout configured");
    }
}
