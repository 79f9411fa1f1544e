//! Every store operation as one function over a PostgreSQL transaction.
//!
//! Responsible for the operations themselves ([`Tx`] methods named like the
//! [`crate::LightningStore`] methods): which rows to read and lock, calling the
//! [`crate::lifecycle`] function on the decoded agl-core values, and writing back what changed.
//! The sibling `store` module begins the transaction, commits it, and runs the operation again
//! when PostgreSQL reports a deadlock, a serialization failure or a unique violation (see
//! [`super::rows::is_retryable`]): every method here may therefore run more than once, and
//! checks its input before it writes, so a refused request has written nothing. Not
//! responsible for any rule (all in `lifecycle`) nor for query semantics (`crate::query`:
//! candidates are pre-selected with SQL, then [`Matches`] and [`query::finish`] produce the
//! page).
//!
//! # Several servers on one database
//!
//! Transactions run at `READ COMMITTED`; what must not interleave is serialised by row locks:
//!
//! * Every operation that changes a rollout or its attempts first locks the rollout's row
//!   (`SELECT … FOR UPDATE`), then its attempts, then the worker's row: one order everywhere,
//!   so two operations wait for each other instead of deadlocking (`add_spans` locks its
//!   rollouts in `seq` order). Reads taken after the lock see the latest committed values.
//! * **Dequeue** deletes the head of the queue that no other transaction holds
//!   (`FOR UPDATE SKIP LOCKED`), so two servers never hand one queue entry to two workers and
//!   never wait on each other's claims.
//! * **Span sequence ids** are raised on the rollout's locked row (or the locked
//!   `orphan_sequences` row of an unknown id), so every id is issued once across servers.
//! * **The watchdog** reads its candidates without locks, then locks each one it would change
//!   with `FOR UPDATE SKIP LOCKED`, re-reads it and decides again under the lock. A row another
//!   server is sweeping (or an operation is changing) is skipped and judged at the next scan;
//!   a verdict is applied only to the state it was computed from, so two servers sweeping at
//!   once change each attempt at most once (sweeping is idempotent).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker, new_attempt_id, new_resources_id, new_rollout_id,
};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::rows::{
    ATTEMPT_COLUMNS, RESOURCES_COLUMNS, ROLLOUT_COLUMN_COUNT, ROLLOUT_COLUMNS, RolloutRow,
    WORKER_COLUMNS, decode_attempt, decode_attempt_at, decode_resources, decode_rollout,
    decode_span, decode_worker, describe, is_retryable,
};
use super::select;
use crate::error::StoreError;
use crate::lifecycle::{self, RolloutChange};
use crate::query::{
    self, AttemptQuery, FilterLogic, Matches, Paginated, ResourcesQuery, RolloutQuery, SpanQuery,
    WorkerQuery,
};
use crate::sql::{ByRollout, ID_ATTEMPTS, opt_json, to_json};
use crate::store::{AttemptUpdate, RolloutUpdate, StoreStatistics};

/// Statement parameters.
type Params<'a> = [&'a (dyn ToSql + Sync)];

/// `agl_meta` key of the latest resources' row seq.
const LATEST_RESOURCES: &str = "latest_resources_seq";

/// A rollout locked for `add_spans`, with the attempts its spans name.
struct SpanTarget {
    row: RolloutRow,
    before: Rollout,
    /// `(row seq, before, current)` by attempt id.
    attempts: HashMap<String, (i64, Attempt, Attempt)>,
}

/// One operation's transaction and what the store must do when it ends.
pub(crate) struct Tx<'c> {
    tx: deadpool_postgres::Transaction<'c>,
    /// A rollout became finished (waiters, here and on other servers, must be woken).
    pub(crate) finished: bool,
    /// The operation asked for its writes to be kept even though it fails.
    pub(crate) keep_on_error: bool,
    /// A statement failed in a way that running the operation again may cure.
    retry: AtomicBool,
}

impl<'c> Tx<'c> {
    /// Wraps a begun transaction.
    pub(crate) fn new(tx: deadpool_postgres::Transaction<'c>) -> Self {
        Tx {
            tx,
            finished: false,
            keep_on_error: false,
            retry: AtomicBool::new(false),
        }
    }

    /// Whether the failure of this transaction may go away when the operation runs again.
    pub(crate) fn retryable(&self) -> bool {
        self.retry.load(Ordering::Relaxed)
    }

    /// Commits (after notifying `channel` when a rollout finished).
    pub(crate) async fn commit(self, channel: &str) -> Result<(), StoreError> {
        if self.finished {
            self.tx
                .execute("SELECT pg_notify($1, '')", &[&channel])
                .await
                .map_err(|e| StoreError::Backend(format!("postgres: notify: {}", describe(&e))))?;
        }
        self.tx
            .commit()
            .await
            .map_err(|e| StoreError::Backend(format!("postgres: commit: {}", describe(&e))))
    }

    /// Rolls back (a failure to do so is the connection's end, which rolls back too).
    pub(crate) async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }

    fn pg(&self, what: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        move |e| {
            if is_retryable(&e) {
                self.retry.store(true, Ordering::Relaxed);
            }
            StoreError::Backend(format!("postgres: {what}: {}", describe(&e)))
        }
    }

    async fn rows(
        &self,
        sql: &str,
        params: &Params<'_>,
        what: &'static str,
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(self.pg(what))?;
        self.tx.query(&stmt, params).await.map_err(self.pg(what))
    }

    async fn row(
        &self,
        sql: &str,
        params: &Params<'_>,
        what: &'static str,
    ) -> Result<Option<Row>, StoreError> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(self.pg(what))?;
        self.tx
            .query_opt(&stmt, params)
            .await
            .map_err(self.pg(what))
    }

    async fn exec(
        &self,
        sql: &str,
        params: &Params<'_>,
        what: &'static str,
    ) -> Result<u64, StoreError> {
        let stmt = self.tx.prepare_cached(sql).await.map_err(self.pg(what))?;
        self.tx.execute(&stmt, params).await.map_err(self.pg(what))
    }

    async fn count(&self, sql: &str, what: &'static str) -> Result<u64, StoreError> {
        let row = self.row(sql, &[], what).await?;
        let n: i64 = match row {
            Some(r) => r.try_get(0).map_err(self.pg(what))?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    // -----------------------------------------------------------------------------------------
    // Rollouts
    // -----------------------------------------------------------------------------------------

    /// The rollout with this id; `lock` takes its row lock.
    async fn rollout_by_id(
        &self,
        rollout_id: &str,
        lock: bool,
    ) -> Result<Option<RolloutRow>, StoreError> {
        let sql = format!(
            "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = $1{}",
            for_update(lock)
        );
        self.row(&sql, &[&rollout_id], "select rollout")
            .await?
            .map(|r| decode_rollout(&r))
            .transpose()
    }

    async fn require_rollout(&self, rollout_id: &str) -> Result<RolloutRow, StoreError> {
        self.rollout_by_id(rollout_id, true)
            .await?
            .ok_or_else(|| StoreError::rollout_not_found(rollout_id))
    }

    /// The rollout in row `seq`, locked.
    async fn rollout_by_seq_locked(&self, seq: i64) -> Result<Option<RolloutRow>, StoreError> {
        let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE seq = $1 FOR UPDATE");
        self.row(&sql, &[&seq], "select rollout")
            .await?
            .map(|r| decode_rollout(&r))
            .transpose()
    }

    /// Inserts a new rollout; on an id collision it draws a new id.
    async fn insert_rollout(&self, rollout: &mut Rollout) -> Result<i64, StoreError> {
        const SQL: &str = "INSERT INTO rollouts (rollout_id, input, start_time, end_time, mode, \
                           resources_id, status, config, metadata, watched) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                           ON CONFLICT (rollout_id) DO NOTHING RETURNING seq";
        let input = to_json(&rollout.input, "rollout input")?;
        let config = to_json(&rollout.config, "rollout config")?;
        let metadata = opt_json(rollout.metadata.as_ref(), "rollout metadata")?;
        for _ in 0..ID_ATTEMPTS {
            let inserted = self
                .row(
                    SQL,
                    &[
                        &rollout.rollout_id,
                        &input,
                        &rollout.start_time,
                        &rollout.end_time,
                        &rollout.mode.map(|m| m.as_str()),
                        &rollout.resources_id,
                        &rollout.status.as_str(),
                        &config,
                        &metadata,
                        &lifecycle::is_watched(rollout),
                    ],
                    "insert rollout",
                )
                .await?;
            match inserted {
                Some(row) => return row.try_get(0).map_err(self.pg("insert rollout")),
                None => rollout.rollout_id = new_rollout_id(),
            }
        }
        Err(StoreError::Backend(format!(
            "postgres: insert rollout: {ID_ATTEMPTS} fresh rollout ids all collided"
        )))
    }

    /// Writes back the columns of a rollout that differ from `before`; `attempts` also sets
    /// `attempt_count`.
    async fn save_rollout(
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
        let attempts = attempts.map(i64::from);
        let only_status = before.input == after.input
            && before.mode == after.mode
            && before.resources_id == after.resources_id
            && before.config == after.config
            && before.metadata == after.metadata;
        if only_status {
            const SQL: &str = "UPDATE rollouts SET status = $2, end_time = $3, watched = $4, \
                               attempt_count = coalesce($5, attempt_count) WHERE seq = $1";
            self.exec(
                SQL,
                &[
                    &seq,
                    &after.status.as_str(),
                    &after.end_time,
                    &watched,
                    &attempts,
                ],
                "update rollout",
            )
            .await?;
            return Ok(());
        }
        const SQL: &str = "UPDATE rollouts SET input = $2, end_time = $3, mode = $4, \
                           resources_id = $5, status = $6, config = $7, metadata = $8, \
                           watched = $9, attempt_count = coalesce($10, attempt_count) \
                           WHERE seq = $1";
        self.exec(
            SQL,
            &[
                &seq,
                &to_json(&after.input, "rollout input")?,
                &after.end_time,
                &after.mode.map(|m| m.as_str()),
                &after.resources_id,
                &after.status.as_str(),
                &to_json(&after.config, "rollout config")?,
                &opt_json(after.metadata.as_ref(), "rollout metadata")?,
                &watched,
                &attempts,
            ],
            "update rollout",
        )
        .await?;
        Ok(())
    }

    /// Book-keeping after a change of the rollout in row `seq`: requeue (unless already
    /// queued) and note that waiters must be woken.
    async fn after_change(&mut self, seq: i64, change: RolloutChange) -> Result<(), StoreError> {
        if change.requeue {
            self.push_queue(seq).await?;
        }
        if change.became_finished() {
            self.finished = true;
        }
        Ok(())
    }

    /// Appends to the queue unless the rollout already has an entry (§4.9).
    async fn push_queue(&self, seq: i64) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO queue (rollout_seq) VALUES ($1) ON CONFLICT (rollout_seq) DO NOTHING",
            &[&seq],
            "insert into queue",
        )
        .await?;
        Ok(())
    }

    /// Takes the head of the queue that no other transaction holds (the rollout's row seq),
    /// or `None`.
    async fn pop_queue(&self) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "DELETE FROM queue WHERE pos = (SELECT pos FROM queue ORDER BY pos \
                           FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING rollout_seq";
        match self.row(SQL, &[], "pop queue").await? {
            Some(row) => Ok(Some(row.try_get(0).map_err(self.pg("pop queue"))?)),
            None => Ok(None),
        }
    }

    async fn latest_resources_id(&self) -> Result<Option<String>, StoreError> {
        const SQL: &str = "SELECT r.resources_id FROM agl_meta m \
                           JOIN resources r ON r.seq = m.value::bigint WHERE m.key = $1";
        match self
            .row(SQL, &[&LATEST_RESOURCES], "select latest resources")
            .await?
        {
            Some(row) => Ok(Some(
                row.try_get(0).map_err(self.pg("select latest resources"))?,
            )),
            None => Ok(None),
        }
    }

    /// A rollout as `GET /rollouts` returns it: with its latest attempt when it has one.
    async fn any_rollout(&self, row: RolloutRow) -> Result<AnyRollout, StoreError> {
        Ok(match self.latest_attempt(&row).await? {
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

    /// The attempt with the highest `sequence_id` (`attempt_count`), if any.
    async fn latest_attempt(&self, row: &RolloutRow) -> Result<Option<(i64, Attempt)>, StoreError> {
        if row.attempts == 0 {
            return Ok(None);
        }
        let sql = format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_seq = $1 AND sequence_id = $2"
        );
        self.row(
            &sql,
            &[&row.seq, &i64::from(row.attempts)],
            "select attempt",
        )
        .await?
        .map(|r| decode_attempt(&r))
        .transpose()
    }

    async fn attempt_by_id(
        &self,
        rollout_seq: i64,
        attempt_id: &str,
    ) -> Result<Option<(i64, Attempt)>, StoreError> {
        let sql = format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_seq = $1 AND attempt_id = $2"
        );
        self.row(&sql, &[&rollout_seq, &attempt_id], "select attempt")
            .await?
            .map(|r| decode_attempt(&r))
            .transpose()
    }

    /// Inserts a new attempt; on an id collision within the rollout it draws a new id.
    async fn insert_attempt(&self, rollout_seq: i64, a: &mut Attempt) -> Result<i64, StoreError> {
        const SQL: &str = "INSERT INTO attempts (rollout_seq, rollout_id, attempt_id, \
                           sequence_id, start_time, end_time, status, worker_id, \
                           last_heartbeat_time, metadata) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                           ON CONFLICT DO NOTHING RETURNING seq";
        let metadata = opt_json(a.metadata.as_ref(), "attempt metadata")?;
        for _ in 0..ID_ATTEMPTS {
            let inserted = self
                .row(
                    SQL,
                    &[
                        &rollout_seq,
                        &a.rollout_id,
                        &a.attempt_id,
                        &i64::from(a.sequence_id),
                        &a.start_time,
                        &a.end_time,
                        &a.status.as_str(),
                        &a.worker_id,
                        &a.last_heartbeat_time,
                        &metadata,
                    ],
                    "insert attempt",
                )
                .await?;
            match inserted {
                Some(row) => return row.try_get(0).map_err(self.pg("insert attempt")),
                None => a.attempt_id = new_attempt_id(),
            }
        }
        Err(StoreError::Backend(format!(
            "postgres: insert attempt #{} of rollout `{}`: {ID_ATTEMPTS} fresh attempt ids all \
             collided (or `attempts` disagrees with `rollouts.attempt_count`)",
            a.sequence_id, a.rollout_id
        )))
    }

    /// Writes back an attempt that differs from `before`.
    async fn save_attempt(
        &self,
        seq: i64,
        before: &Attempt,
        after: &Attempt,
    ) -> Result<(), StoreError> {
        if before == after {
            return Ok(());
        }
        if before.metadata == after.metadata {
            const SQL: &str = "UPDATE attempts SET end_time = $2, status = $3, worker_id = $4, \
                               last_heartbeat_time = $5 WHERE seq = $1";
            self.exec(
                SQL,
                &[
                    &seq,
                    &after.end_time,
                    &after.status.as_str(),
                    &after.worker_id,
                    &after.last_heartbeat_time,
                ],
                "update attempt",
            )
            .await?;
            return Ok(());
        }
        const SQL: &str = "UPDATE attempts SET end_time = $2, status = $3, worker_id = $4, \
                           last_heartbeat_time = $5, metadata = $6 WHERE seq = $1";
        self.exec(
            SQL,
            &[
                &seq,
                &after.end_time,
                &after.status.as_str(),
                &after.worker_id,
                &after.last_heartbeat_time,
                &opt_json(after.metadata.as_ref(), "attempt metadata")?,
            ],
            "update attempt",
        )
        .await?;
        Ok(())
    }

    /// Creates the next attempt of a locked rollout and binds the worker (§4.1, §4.4);
    /// `dequeued` also records the worker's dequeue time.
    async fn begin_attempt(
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
        self.insert_attempt(seq, &mut attempt).await?;
        self.save_rollout(seq, &before, &rollout, Some(attempt.sequence_id))
            .await?;
        if let Some(w) = &attempt.worker_id {
            let mut worker = self.worker_or_new(w, true).await?;
            lifecycle::sync_worker(&mut worker, &attempt, now);
            if dequeued {
                lifecycle::worker_dequeued(&mut worker, now);
            }
            self.save_worker(&worker).await?;
        }
        self.after_change(seq, change).await?;
        Ok(AttemptedRollout { rollout, attempt })
    }

    // -----------------------------------------------------------------------------------------
    // Workers
    // -----------------------------------------------------------------------------------------

    async fn worker(&self, worker_id: &str, lock: bool) -> Result<Option<Worker>, StoreError> {
        let sql = format!(
            "SELECT {WORKER_COLUMNS} FROM workers WHERE worker_id = $1{}",
            for_update(lock)
        );
        self.row(&sql, &[&worker_id], "select worker")
            .await?
            .map(|r| decode_worker(&r))
            .transpose()
    }

    async fn worker_or_new(&self, worker_id: &str, lock: bool) -> Result<Worker, StoreError> {
        Ok(self
            .worker(worker_id, lock)
            .await?
            .unwrap_or_else(|| Worker::new(worker_id)))
    }

    /// Upserts a worker; a new worker row keeps its first-seen position.
    async fn save_worker(&self, w: &Worker) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO workers (worker_id, status, heartbeat_stats, \
                           last_heartbeat_time, last_dequeue_time, last_busy_time, \
                           last_idle_time, current_rollout_id, current_attempt_id) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                           ON CONFLICT (worker_id) DO UPDATE SET status = excluded.status, \
                           heartbeat_stats = excluded.heartbeat_stats, \
                           last_heartbeat_time = excluded.last_heartbeat_time, \
                           last_dequeue_time = excluded.last_dequeue_time, \
                           last_busy_time = excluded.last_busy_time, \
                           last_idle_time = excluded.last_idle_time, \
                           current_rollout_id = excluded.current_rollout_id, \
                           current_attempt_id = excluded.current_attempt_id";
        self.exec(
            SQL,
            &[
                &w.worker_id,
                &w.status.as_str(),
                &opt_json(w.heartbeat_stats.as_ref(), "worker heartbeat_stats")?,
                &w.last_heartbeat_time,
                &w.last_dequeue_time,
                &w.last_busy_time,
                &w.last_idle_time,
                &w.current_rollout_id,
                &w.current_attempt_id,
            ],
            "upsert worker",
        )
        .await?;
        Ok(())
    }

    async fn sync_worker_for(&self, attempt: &Attempt, now: f64) -> Result<(), StoreError> {
        if let Some(worker_id) = &attempt.worker_id {
            let mut worker = self.worker_or_new(worker_id, true).await?;
            lifecycle::sync_worker(&mut worker, attempt, now);
            self.save_worker(&worker).await?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Watchdog
    // -----------------------------------------------------------------------------------------

    /// The watchdog scan (§4.5); returns how many attempts it changed. Candidates (rollouts
    /// with `watched`, with their latest attempts) are read without locks; each one with a
    /// verdict is locked with `SKIP LOCKED`, re-read and judged again (see the module docs).
    pub(crate) async fn scan_now(&mut self, now: f64) -> Result<usize, StoreError> {
        let sql = format!(
            "SELECT {}, {} FROM rollouts r JOIN attempts a ON a.rollout_seq = r.seq \
             AND a.sequence_id = r.attempt_count WHERE r.watched ORDER BY r.seq",
            prefixed("r", ROLLOUT_COLUMNS),
            prefixed("a", ATTEMPT_COLUMNS)
        );
        let mut due = Vec::new();
        for r in self.rows(&sql, &[], "select watched rollouts").await? {
            let row = decode_rollout(&r)?;
            let (_, attempt) = decode_attempt_at(&r, ROLLOUT_COLUMN_COUNT)?;
            if lifecycle::watchdog_verdict(&row.rollout, &attempt, now).is_some() {
                due.push(row.seq);
            }
        }
        let mut changed = 0;
        for seq in due {
            let sql = format!(
                "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE seq = $1 FOR UPDATE SKIP LOCKED"
            );
            let Some(row) = self.row(&sql, &[&seq], "lock watched rollout").await? else {
                continue;
            };
            let row = decode_rollout(&row)?;
            let Some((aseq, mut attempt)) = self.latest_attempt(&row).await? else {
                continue;
            };
            let mut rollout = row.rollout.clone();
            let attempt_before = attempt.clone();
            let Some(change) = lifecycle::apply_watchdog(&mut rollout, &mut attempt, now) else {
                continue;
            };
            changed += 1;
            self.save_attempt(aseq, &attempt_before, &attempt).await?;
            self.save_rollout(row.seq, &row.rollout, &rollout, None)
                .await?;
            if change.sync_worker {
                self.sync_worker_for(&attempt, now).await?;
            }
            self.after_change(row.seq, change.rollout).await?;
        }
        Ok(changed)
    }

    // -----------------------------------------------------------------------------------------
    // Rollout operations
    // -----------------------------------------------------------------------------------------

    async fn create_rollout(
        &self,
        request: EnqueueRolloutRequest,
        now: f64,
    ) -> Result<RolloutRow, StoreError> {
        let latest = self.latest_resources_id().await?;
        let mut rollout =
            lifecycle::new_rollout(request, new_rollout_id(), latest.as_deref(), now)?;
        let seq = self.insert_rollout(&mut rollout).await?;
        Ok(RolloutRow {
            seq,
            rollout,
            attempts: 0,
            span_sequence: 0,
        })
    }

    /// `enqueue_rollout`.
    pub(crate) async fn enqueue(
        &mut self,
        request: EnqueueRolloutRequest,
        now: f64,
    ) -> Result<Rollout, StoreError> {
        let row = self.create_rollout(request, now).await?;
        self.push_queue(row.seq).await?;
        Ok(row.rollout)
    }

    /// `enqueue_many` (the requests were validated by the caller).
    pub(crate) async fn enqueue_many(
        &mut self,
        requests: &[EnqueueRolloutRequest],
        now: f64,
    ) -> Result<Vec<Rollout>, StoreError> {
        let mut out = Vec::with_capacity(requests.len());
        for request in requests {
            out.push(self.enqueue(request.clone(), now).await?);
        }
        Ok(out)
    }

    /// `start_rollout`.
    pub(crate) async fn start_rollout(
        &mut self,
        request: EnqueueRolloutRequest,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<AttemptedRollout, StoreError> {
        let row = self.create_rollout(request, now).await?;
        self.begin_attempt(row, worker_id, false, now).await
    }

    /// `dequeue_rollout`: pops queue entries until a dispatchable rollout is found (stale
    /// entries are consumed, §4.9); with nothing to dispatch the worker becomes idle.
    pub(crate) async fn dequeue(
        &mut self,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        while let Some(seq) = self.pop_queue().await? {
            let Some(row) = self.rollout_by_seq_locked(seq).await? else {
                continue;
            };
            if lifecycle::is_dispatchable(&row.rollout) {
                return self
                    .begin_attempt(row, worker_id, true, now)
                    .await
                    .map(Some);
            }
        }
        if let Some(w) = worker_id {
            let mut worker = self.worker_or_new(w, true).await?;
            lifecycle::worker_found_nothing(&mut worker, now);
            self.save_worker(&worker).await?;
        }
        Ok(None)
    }

    /// `dequeue_many`: up to `limit` dequeues in this transaction.
    pub(crate) async fn dequeue_many(
        &mut self,
        limit: usize,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        let mut out = Vec::new();
        while out.len() < limit {
            match self.dequeue(worker_id, now).await? {
                Some(a) => out.push(a),
                None => break,
            }
        }
        Ok(out)
    }

    /// `start_attempt`.
    pub(crate) async fn start_attempt(
        &mut self,
        rollout_id: &str,
        worker_id: Option<&str>,
        now: f64,
    ) -> Result<AttemptedRollout, StoreError> {
        let row = self.require_rollout(rollout_id).await?;
        self.begin_attempt(row, worker_id, false, now).await
    }

    /// `update_attempt`.
    pub(crate) async fn update_attempt(
        &mut self,
        rollout_id: &str,
        attempt_id: &str,
        update: &AttemptUpdate,
        now: f64,
    ) -> Result<Attempt, StoreError> {
        let row = self.require_rollout(rollout_id).await?;
        let target = if lifecycle::is_latest_selector(attempt_id) {
            self.latest_attempt(&row).await?
        } else {
            self.attempt_by_id(row.seq, attempt_id).await?
        };
        let (aseq, mut attempt) =
            target.ok_or_else(|| StoreError::attempt_not_found(attempt_id))?;
        let is_latest = attempt.sequence_id == row.attempts;
        let mut rollout = row.rollout.clone();
        let attempt_before = attempt.clone();
        let change =
            lifecycle::apply_attempt_update(&mut rollout, &mut attempt, is_latest, update, now)?;
        self.save_attempt(aseq, &attempt_before, &attempt).await?;
        self.save_rollout(row.seq, &row.rollout, &rollout, None)
            .await?;
        if change.sync_worker {
            self.sync_worker_for(&attempt, now).await?;
        }
        self.after_change(row.seq, change.rollout).await?;
        Ok(attempt)
    }

    /// `update_rollout`.
    pub(crate) async fn update_rollout(
        &mut self,
        rollout_id: &str,
        update: RolloutUpdate,
        now: f64,
    ) -> Result<Rollout, StoreError> {
        let row = self.require_rollout(rollout_id).await?;
        let mut rollout = row.rollout.clone();
        let change = lifecycle::apply_rollout_update(&mut rollout, update, now)?;
        self.save_rollout(row.seq, &row.rollout, &rollout, None)
            .await?;
        self.after_change(row.seq, change).await?;
        Ok(rollout)
    }

    /// `get_rollout_by_id`.
    pub(crate) async fn get_rollout(
        &self,
        rollout_id: &str,
    ) -> Result<Option<Rollout>, StoreError> {
        Ok(self
            .rollout_by_id(rollout_id, false)
            .await?
            .map(|row| row.rollout))
    }

    /// `get_latest_attempt`.
    pub(crate) async fn get_latest_attempt(
        &self,
        rollout_id: &str,
    ) -> Result<Option<Attempt>, StoreError> {
        match self.rollout_by_id(rollout_id, false).await? {
            Some(row) => Ok(self.latest_attempt(&row).await?.map(|(_, a)| a)),
            None => Ok(None),
        }
    }

    /// `query_rollouts`: the page and `total` from SQL (sibling `select` module), the page's
    /// rows read with their latest attempts in one join. Sorts by a JSON field go through
    /// [`Self::query_rollouts_decoded`].
    pub(crate) async fn query_rollouts(
        &self,
        q: &RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        query::validate_sort::<Rollout>(&q.sort)?;
        let Some(plan) = select::plan(q) else {
            return self.query_rollouts_decoded(q).await;
        };
        let mut params: Vec<&(dyn ToSql + Sync)> =
            plan.params.iter().map(select::Param::as_sql).collect();
        let count_sql = format!("SELECT count(*) FROM rollouts r WHERE {}", plan.condition);
        let total: i64 = match self.row(&count_sql, &params, "count rollouts").await? {
            Some(r) => r.try_get(0).map_err(self.pg("count rollouts"))?,
            None => 0,
        };
        let limit: Option<i64> = q.window.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let offset = i64::try_from(q.window.offset).unwrap_or(i64::MAX);
        params.push(&limit);
        params.push(&offset);
        let n = plan.next_param();
        let page_sql = format!(
            "SELECT {}, {} FROM rollouts r LEFT JOIN attempts a ON a.rollout_seq = r.seq \
             AND a.sequence_id = r.attempt_count WHERE {} ORDER BY {} LIMIT ${n} OFFSET ${}",
            prefixed("r", ROLLOUT_COLUMNS),
            prefixed("a", ATTEMPT_COLUMNS),
            plan.condition,
            plan.order,
            n + 1
        );
        let mut items = Vec::new();
        for r in self.rows(&page_sql, &params, "select rollouts").await? {
            let row = decode_rollout(&r)?;
            let has_attempt = r
                .try_get::<_, Option<i64>>(ROLLOUT_COLUMN_COUNT)
                .map_err(self.pg("select rollouts"))?
                .is_some();
            items.push(if has_attempt {
                let (_, attempt) = decode_attempt_at(&r, ROLLOUT_COLUMN_COUNT)?;
                AnyRollout::Attempted(AttemptedRollout {
                    rollout: row.rollout,
                    attempt,
                })
            } else {
                AnyRollout::Plain(row.rollout)
            });
        }
        Ok(Paginated {
            items,
            limit: q.window.wire_limit(),
            offset: q.window.offset,
            total: u64::try_from(total).unwrap_or(0),
        })
    }

    /// `query_rollouts` over decoded rows, for the sorts SQL cannot reproduce (`input`,
    /// `config`, `metadata`): candidates pre-selected through the indexes by `rollout_id_in`
    /// or `status_in` (AND logic only, where they must hold), then [`Matches`] and
    /// [`query::finish`]; only the page's rows get their latest attempts.
    async fn query_rollouts_decoded(
        &self,
        q: &RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        let and = q.filter_logic == FilterLogic::And;
        let candidates: Vec<Row> = match (&q.rollout_id_in, &q.status_in) {
            (Some(ids), _) if and => {
                let sql = format!(
                    "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY($1) ORDER BY seq"
                );
                self.rows(&sql, &[ids], "select rollouts").await?
            }
            (None, Some(statuses)) if and => {
                let wanted: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
                let sql = format!(
                    "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE status = ANY($1) ORDER BY seq"
                );
                self.rows(&sql, &[&wanted], "select rollouts").await?
            }
            _ => {
                let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts ORDER BY seq");
                self.rows(&sql, &[], "select rollouts").await?
            }
        };
        let mut matches = Vec::new();
        for row in &candidates {
            let row = decode_rollout(row)?;
            if q.matches(&row.rollout) {
                matches.push(ByRollout(row));
            }
        }
        let page = query::finish(matches, &q.sort, q.window)?;
        let mut items = Vec::with_capacity(page.items.len());
        for ByRollout(row) in page.items {
            items.push(self.any_rollout(row).await?);
        }
        Ok(Paginated {
            items,
            limit: page.limit,
            offset: page.offset,
            total: page.total,
        })
    }

    /// `query_attempts` (an unknown rollout gives an empty page).
    pub(crate) async fn query_attempts(
        &self,
        rollout_id: &str,
        q: &AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        let mut attempts = Vec::new();
        if let Some(row) = self.rollout_by_id(rollout_id, false).await? {
            let sql = format!(
                "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_seq = $1 ORDER BY sequence_id"
            );
            for r in self.rows(&sql, &[&row.seq], "select attempts").await? {
                attempts.push(decode_attempt(&r)?.1);
            }
        }
        query::finish(attempts, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Spans
    // -----------------------------------------------------------------------------------------

    /// The counter of an id no rollout has (`orphan_sequences`, Q10), locked (created at 0).
    async fn orphan_counter(&self, rollout_id: &str) -> Result<i64, StoreError> {
        self.exec(
            "INSERT INTO orphan_sequences (rollout_id, value) VALUES ($1, 0) \
             ON CONFLICT (rollout_id) DO NOTHING",
            &[&rollout_id],
            "insert orphan sequence",
        )
        .await?;
        let row = self
            .row(
                "SELECT value FROM orphan_sequences WHERE rollout_id = $1 FOR UPDATE",
                &[&rollout_id],
                "select orphan sequence",
            )
            .await?;
        match row {
            Some(r) => r.try_get(0).map_err(self.pg("select orphan sequence")),
            None => Ok(0),
        }
    }

    async fn save_counter(
        &self,
        rollout_id: &str,
        rollout_seq: Option<i64>,
        value: i64,
    ) -> Result<(), StoreError> {
        match rollout_seq {
            Some(seq) => {
                self.exec(
                    "UPDATE rollouts SET span_sequence = $2 WHERE seq = $1",
                    &[&seq, &value],
                    "update span sequence",
                )
                .await?
            }
            None => {
                self.exec(
                    "UPDATE orphan_sequences SET value = $2 WHERE rollout_id = $1",
                    &[&rollout_id, &value],
                    "update orphan sequence",
                )
                .await?
            }
        };
        Ok(())
    }

    /// `get_next_span_sequence_ids`: a block of `count` ids of the rollout (locked), the
    /// first returned; unknown rollout ids count too (Q10).
    pub(crate) async fn next_sequence_ids(
        &self,
        rollout_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        let found = self
            .row(
                "SELECT seq, span_sequence FROM rollouts WHERE rollout_id = $1 FOR UPDATE",
                &[&rollout_id],
                "select span sequence",
            )
            .await?;
        let (seq, mut value) = match found {
            Some(r) => {
                let seq: i64 = r.try_get(0).map_err(self.pg("select span sequence"))?;
                let value: i64 = r.try_get(1).map_err(self.pg("select span sequence"))?;
                (Some(seq), value)
            }
            None => (None, self.orphan_counter(rollout_id).await?),
        };
        let issued = lifecycle::issue_sequence_ids(&mut value, count);
        self.save_counter(rollout_id, seq, value).await?;
        Ok(issued)
    }

    /// `add_spans_with_fresh_ids`: one block per rollout ([`Tx::next_sequence_ids`]), the
    /// spans numbered, then [`Tx::add_spans`]. With blocks of several rollouts their rows are
    /// locked first, in `seq` order (the order `add_spans` locks them in). The blocks stay
    /// issued when the spans are refused, as with the two calls.
    pub(crate) async fn add_spans_with_fresh_ids(
        &mut self,
        spans: &[(Span, bool)],
        bodies: &[Option<String>],
        now: f64,
    ) -> Result<Vec<Span>, StoreError> {
        let blocks = lifecycle::fresh_id_blocks(spans);
        if blocks.len() > 1 {
            let ids: Vec<&str> = blocks.iter().map(|b| b.rollout_id.as_str()).collect();
            self.rows(
                "SELECT seq FROM rollouts WHERE rollout_id = ANY($1) ORDER BY seq FOR UPDATE",
                &[&ids],
                "lock rollouts",
            )
            .await?;
        }
        for b in &blocks {
            lifecycle::check_sequence_block(b.count)?;
        }
        let mut firsts = Vec::with_capacity(blocks.len());
        for b in &blocks {
            firsts.push(self.next_sequence_ids(&b.rollout_id, b.count).await?);
        }
        // Numbering cannot fail after the blocks; should it, the blocks stay issued.
        self.keep_on_error = true;
        let encoded =
            crate::sql::numbered_spans(spans.to_vec(), bodies.to_vec(), &blocks, &firsts)?;
        self.keep_on_error = false;
        if encoded.is_empty() {
            return Ok(Vec::new());
        }
        self.add_spans(&encoded, now).await
    }

    /// `add_span(s)`: locks the rollouts the spans name (in `seq` order), raises their
    /// sequence counters (kept even if the call fails, §4.7), checks every target, then
    /// inserts (`ON CONFLICT DO NOTHING` drops duplicates) and applies
    /// [`lifecycle::record_span`] to each stored span in order. `spans` come with their JSON
    /// bodies.
    pub(crate) async fn add_spans(
        &mut self,
        spans: &[(Span, String)],
        now: f64,
    ) -> Result<Vec<Span>, StoreError> {
        // 1. The rollouts the spans name, locked in seq order, and their counters.
        let mut ids: Vec<&str> = spans.iter().map(|(s, _)| s.rollout_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let sql = format!(
            "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY($1) ORDER BY seq \
             FOR UPDATE"
        );
        let mut targets: Vec<SpanTarget> = Vec::new();
        for r in self.rows(&sql, &[&ids], "lock rollouts").await? {
            let row = decode_rollout(&r)?;
            targets.push(SpanTarget {
                before: row.rollout.clone(),
                row,
                attempts: HashMap::new(),
            });
        }
        let target_of: HashMap<String, usize> = targets
            .iter()
            .enumerate()
            .map(|(i, t)| (t.row.rollout.rollout_id.clone(), i))
            .collect();
        // Counters: (before, value) per rollout id, raised in span order.
        let mut counters: HashMap<&str, (i64, i64)> = HashMap::new();
        let mut orphans: Vec<&str> = Vec::new();
        for (span, _) in spans {
            let id = span.rollout_id.as_str();
            if !counters.contains_key(id) {
                let value = match target_of.get(id).and_then(|&i| targets.get(i)) {
                    Some(t) => t.row.span_sequence,
                    None => {
                        orphans.push(id);
                        self.orphan_counter(id).await?
                    }
                };
                counters.insert(id, (value, value));
            }
            if let Some((_, value)) = counters.get_mut(id) {
                lifecycle::observe_sequence_id(value, span.sequence_id);
            }
        }
        for (id, (before, value)) in &counters {
            if value != before {
                let seq = target_of
                    .get(*id)
                    .and_then(|&i| targets.get(i))
                    .map(|t| t.row.seq);
                self.save_counter(id, seq, *value).await?;
            }
        }
        // 2. Every target exists; a failure keeps only the counters written above.
        self.keep_on_error = true;
        for (span, _) in spans {
            let idx = target_of.get(span.rollout_id.as_str()).copied();
            let attempt_found = match idx.and_then(|i| targets.get_mut(i)) {
                Some(t) if t.attempts.contains_key(&span.attempt_id) => true,
                Some(t) => match self.attempt_by_id(t.row.seq, &span.attempt_id).await? {
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
        }
        self.keep_on_error = false;
        // 3. Insert; duplicates (stored before or earlier in this call) are dropped.
        let mut stored = Vec::with_capacity(spans.len());
        let mut changes = Vec::new();
        for (span, body) in spans {
            let Some(t) = target_of
                .get(span.rollout_id.as_str())
                .and_then(|&i| targets.get_mut(i))
            else {
                continue;
            };
            let inserted = self
                .exec(
                    "INSERT INTO spans (rollout_seq, attempt_id, span_id, body) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[&t.row.seq, &span.attempt_id, &span.span_id, body],
                    "insert span",
                )
                .await?;
            if inserted == 0 {
                continue;
            }
            let Some((_, _, attempt)) = t.attempts.get_mut(&span.attempt_id) else {
                continue;
            };
            let is_latest = attempt.sequence_id == t.row.attempts;
            let effect = lifecycle::record_span(&mut t.row.rollout, attempt, is_latest, now);
            changes.push((t.row.seq, effect.rollout));
            stored.push(span.clone());
        }
        // 4. Write back what the spans did to their attempts and rollouts.
        for t in &targets {
            for (aseq, before, after) in t.attempts.values() {
                self.save_attempt(*aseq, before, after).await?;
            }
            self.save_rollout(t.row.seq, &t.before, &t.row.rollout, None)
                .await?;
        }
        for (seq, change) in changes {
            self.after_change(seq, change).await?;
        }
        Ok(stored)
    }

    /// `query_spans`: the rollout's spans in insertion order (optionally of one attempt),
    /// then [`Matches`] and [`query::finish`].
    pub(crate) async fn query_spans(&self, q: &SpanQuery) -> Result<Paginated<Span>, StoreError> {
        let empty = || query::finish(Vec::<Span>::new(), &q.sort, q.window);
        let Some(row) = self.rollout_by_id(&q.rollout_id, false).await? else {
            return empty();
        };
        let wanted: Option<String> = match q.attempt_id.as_deref() {
            None => None,
            Some(a) if lifecycle::is_latest_selector(a) => match self.latest_attempt(&row).await? {
                Some((_, latest)) => Some(latest.attempt_id),
                None => return empty(),
            },
            Some(a) => Some(a.to_string()),
        };
        let rows = match &wanted {
            None => {
                self.rows(
                    "SELECT seq, body FROM spans WHERE rollout_seq = $1 ORDER BY seq",
                    &[&row.seq],
                    "select spans",
                )
                .await?
            }
            Some(attempt_id) => {
                self.rows(
                    "SELECT seq, body FROM spans WHERE rollout_seq = $1 AND attempt_id = $2 \
                     ORDER BY seq",
                    &[&row.seq, attempt_id],
                    "select spans",
                )
                .await?
            }
        };
        let mut matches = Vec::with_capacity(rows.len());
        for r in &rows {
            let span = decode_span(r)?;
            if q.matches(&span) {
                matches.push(span);
            }
        }
        query::finish(matches, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Resources
    // -----------------------------------------------------------------------------------------

    async fn resources_by_id(
        &self,
        resources_id: &str,
        lock: bool,
    ) -> Result<Option<(i64, ResourcesUpdate)>, StoreError> {
        let sql = format!(
            "SELECT {RESOURCES_COLUMNS} FROM resources WHERE resources_id = $1{}",
            for_update(lock)
        );
        self.row(&sql, &[&resources_id], "select resources")
            .await?
            .map(|r| decode_resources(&r))
            .transpose()
    }

    /// Inserts resources; `None` when the id is taken.
    async fn insert_resources(&self, r: &ResourcesUpdate) -> Result<Option<i64>, StoreError> {
        const SQL: &str = "INSERT INTO resources (resources_id, create_time, update_time, \
                           version, resources) VALUES ($1, $2, $3, $4, $5) \
                           ON CONFLICT (resources_id) DO NOTHING RETURNING seq";
        let row = self
            .row(
                SQL,
                &[
                    &r.resources_id,
                    &r.create_time,
                    &r.update_time,
                    &i64::try_from(r.version).unwrap_or(i64::MAX),
                    &to_json(&r.resources, "resources")?,
                ],
                "insert resources",
            )
            .await?;
        row.map(|r| r.try_get(0).map_err(self.pg("insert resources")))
            .transpose()
    }

    async fn set_latest_resources(&self, seq: i64) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO agl_meta (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&LATEST_RESOURCES, &seq.to_string()],
            "update latest resources",
        )
        .await?;
        Ok(())
    }

    /// `add_resources`.
    pub(crate) async fn add_resources(
        &self,
        resources: NamedResources,
        now: f64,
    ) -> Result<ResourcesUpdate, StoreError> {
        let mut update = lifecycle::new_resources(new_resources_id(), resources, now);
        for _ in 0..ID_ATTEMPTS {
            if let Some(seq) = self.insert_resources(&update).await? {
                self.set_latest_resources(seq).await?;
                return Ok(update);
            }
            update.resources_id = new_resources_id();
        }
        Err(StoreError::Backend(format!(
            "postgres: insert resources: {ID_ATTEMPTS} fresh resources ids all collided"
        )))
    }

    /// `update_resources` (an upsert, Q24). Two servers creating the same new id at once: one
    /// insert finds the id taken, the operation is run again and updates it.
    pub(crate) async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
        now: f64,
    ) -> Result<ResourcesUpdate, StoreError> {
        let (seq, update) = match self.resources_by_id(resources_id, true).await? {
            Some((seq, mut existing)) => {
                lifecycle::replace_resources(&mut existing, resources, now);
                self.exec(
                    "UPDATE resources SET update_time = $2, version = $3, resources = $4 \
                     WHERE seq = $1",
                    &[
                        &seq,
                        &existing.update_time,
                        &i64::try_from(existing.version).unwrap_or(i64::MAX),
                        &to_json(&existing.resources, "resources")?,
                    ],
                    "update resources",
                )
                .await?;
                (seq, existing)
            }
            None => {
                let update = lifecycle::new_resources(resources_id.to_string(), resources, now);
                match self.insert_resources(&update).await? {
                    Some(seq) => (seq, update),
                    None => {
                        self.retry.store(true, Ordering::Relaxed);
                        return Err(StoreError::Backend(format!(
                            "postgres: resources `{resources_id}` was created meanwhile by \
                             another server"
                        )));
                    }
                }
            }
        };
        self.set_latest_resources(seq).await?;
        Ok(update)
    }

    /// `get_resources_by_id`.
    pub(crate) async fn get_resources(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        Ok(self
            .resources_by_id(resources_id, false)
            .await?
            .map(|(_, r)| r))
    }

    /// `get_latest_resources`.
    pub(crate) async fn latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        match self.latest_resources_id().await? {
            Some(id) => self.get_resources(&id).await,
            None => Ok(None),
        }
    }

    /// `query_resources` (`resources_id` pre-selects through the unique index).
    pub(crate) async fn query_resources(
        &self,
        q: &ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        let all: Vec<ResourcesUpdate> = match &q.resources_id {
            Some(id) => self.get_resources(id).await?.into_iter().collect(),
            None => {
                let sql = format!("SELECT {RESOURCES_COLUMNS} FROM resources ORDER BY seq");
                let mut all = Vec::new();
                for r in self.rows(&sql, &[], "select resources").await? {
                    all.push(decode_resources(&r)?.1);
                }
                all
            }
        };
        let matches: Vec<ResourcesUpdate> = all.into_iter().filter(|r| q.matches(r)).collect();
        query::finish(matches, &q.sort, q.window)
    }

    // -----------------------------------------------------------------------------------------
    // Workers, waits, statistics
    // -----------------------------------------------------------------------------------------

    /// `update_worker` (validated before the upsert, so a refused call creates no worker).
    pub(crate) async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
        now: f64,
    ) -> Result<Worker, StoreError> {
        lifecycle::validate_heartbeat_stats(heartbeat_stats.as_ref())?;
        let mut worker = self.worker_or_new(worker_id, true).await?;
        lifecycle::worker_heartbeat(&mut worker, heartbeat_stats, now)?;
        self.save_worker(&worker).await?;
        Ok(worker)
    }

    /// `query_workers`.
    pub(crate) async fn query_workers(
        &self,
        q: &WorkerQuery,
    ) -> Result<Paginated<Worker>, StoreError> {
        let sql = format!("SELECT {WORKER_COLUMNS} FROM workers ORDER BY seq");
        let mut all = Vec::new();
        for r in self.rows(&sql, &[], "select workers").await? {
            let w = decode_worker(&r)?;
            if q.matches(&w) {
                all.push(w);
            }
        }
        query::finish(all, &q.sort, q.window)
    }

    /// `get_worker_by_id`.
    pub(crate) async fn get_worker(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        self.worker(worker_id, false).await
    }

    /// For `wait_for_rollouts`: the finished rollouts among `ids` (request order, unknown
    /// omitted), the unfinished ones, and the earliest Unix time at which the watchdog may
    /// change one of them (`not_before`: the next lazy scan of this process).
    pub(crate) async fn wait_snapshot(
        &self,
        ids: &[String],
        not_before: f64,
    ) -> Result<crate::wait::WaitSnapshot, StoreError> {
        let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY($1)");
        let mut found: HashMap<String, RolloutRow> = HashMap::new();
        for r in self.rows(&sql, &[&ids], "select rollouts").await? {
            let row = decode_rollout(&r)?;
            found.insert(row.rollout.rollout_id.clone(), row);
        }
        let mut snap = crate::wait::WaitSnapshot::default();
        for id in ids {
            let Some(row) = found.get(id) else {
                continue;
            };
            if row.rollout.status.is_finished() {
                snap.done.push(row.rollout.clone());
                continue;
            }
            let at = self
                .latest_attempt(row)
                .await?
                .and_then(|(_, a)| lifecycle::watchdog_deadline(&row.rollout, &a))
                .map(|deadline| deadline.max(not_before));
            snap.push_unfinished(id, at);
        }
        Ok(snap)
    }

    async fn count_by_status(&self, sql: &'static str) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for r in self.rows(sql, &[], "count by status").await? {
            let status: String = r.try_get(0).map_err(self.pg("count by status"))?;
            let n: i64 = r.try_get(1).map_err(self.pg("count by status"))?;
            out.push((status, u64::try_from(n).unwrap_or(0)));
        }
        Ok(out)
    }

    /// `statistics` (without `uptime`, which belongs to the process).
    pub(crate) async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        let mut stats = StoreStatistics::zeroed();
        for (status, n) in self
            .count_by_status("SELECT status, count(*) FROM rollouts GROUP BY status")
            .await?
        {
            let status = status.parse().map_err(|e| {
                StoreError::Backend(format!("postgres table `rollouts`: column `status`: {e}"))
            })?;
            stats.rollouts_by_status.insert(status, n);
        }
        for (status, n) in self
            .count_by_status("SELECT status, count(*) FROM attempts GROUP BY status")
            .await?
        {
            let status = status.parse().map_err(|e| {
                StoreError::Backend(format!("postgres table `attempts`: column `status`: {e}"))
            })?;
            stats.attempts_by_status.insert(status, n);
        }
        stats.total_rollouts = stats.rollouts_by_status.values().sum();
        stats.total_attempts = stats.attempts_by_status.values().sum();
        stats.total_spans = self
            .count("SELECT count(*) FROM spans", "count spans")
            .await?;
        stats.total_resources = self
            .count("SELECT count(*) FROM resources", "count resources")
            .await?;
        stats.total_workers = self
            .count("SELECT count(*) FROM workers", "count workers")
            .await?;
        Ok(stats)
    }
}

/// The row-lock clause of a `SELECT` that reads a row the operation will change.
fn for_update(lock: bool) -> &'static str {
    if lock { " FOR UPDATE" } else { "" }
}

/// `columns` with every name prefixed by `alias.`.
fn prefixed(alias: &str, columns: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}
