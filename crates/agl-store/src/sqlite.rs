//! The durable SQLite `LightningStore` backend (the default of `agl store` and
//! `agl train --store PATH`).
//!
//! Responsible for keeping rollouts, attempts, spans, the queue, sequence counters, resources
//! and workers in one SQLite file (WAL mode), so that a store survives its process. Every rule
//! is delegated to [`crate::lifecycle`] (rows are loaded into the agl-core types, the lifecycle
//! function runs, the changed rows are written back) and every query finishes through
//! [`crate::query`], so results are identical to [`crate::InMemoryLightningStore`]. Not
//! responsible for the HTTP server, span eviction, or sharing a file between hosts (SQLite
//! over a network file system is not supported).
//!
//! # Layout
//!
//! * `schema` — tables, indexes, `PRAGMA`s, migrations ([`SCHEMA_VERSION`] in
//!   `PRAGMA user_version`, `PRAGMA application_id` = `"AGL1"`), the checks made at open.
//! * `rows` — rows ⇄ agl-core types (JSON columns as TEXT via `serde_json`).
//! * `select` — `query_rollouts` as SQL (conditions, order, window, the count of `total`).
//! * `db` — each operation as a function over the connection, calling `lifecycle`.
//! * `writer` — the thread that owns the connection and commits operations in groups, and the
//!   background checkpointer.
//!
//! # Transactions and concurrency
//!
//! One store instance owns one connection on a dedicated writer thread. Operations (reads
//! too, so they see every write of this instance) are sent to it; it runs every waiting
//! operation inside one `BEGIN IMMEDIATE` transaction, and before committing also runs the
//! operations that arrived meanwhile (up to 256 in all), commits once, and only then answers
//! (group commit: concurrent callers share one commit). A commit writes one WAL frame (a
//! header and a 4 KiB page, two `pwrite`s) per page it dirtied and takes about six `fcntl`
//! locks; on the development machine that is about 3 µs plus 4–5 µs per page
//! (`examples/commit_cost.rs`). In `agl bench server`'s cycle with 8 clients a commit holds
//! about five operations and dirties about eleven pages, one or two per B-tree the operations
//! touch (spans and their unique index, rollouts and their status and end-time indexes,
//! attempts, workers, the queue, page 1 when the file grows), so fewer, larger commits and
//! fewer B-trees per operation are what make the store fast under load.
//! Each operation is atomic: operations check their input before writing, so a refused one
//! (not found, invalid, illegal transition) has written nothing; one that fails *after*
//! writing (a database failure) rolls the whole transaction back, and the operations that
//! shared it get an error saying so (nothing of theirs was committed either). Dequeue is
//! therefore atomic: two dequeues, from this process or another one on the same file
//! (SQLite's write lock, waited for up to [`BUSY_TIMEOUT_MS`] ms), never return the same
//! rollout. Nothing that must stay consistent is cached in the process: the queue, the
//! sequence counters, statuses and the latest resources live in tables. The process keeps only
//! the lazy-scan debounce, the start time for `uptime`, and a `tokio::sync::watch` channel that
//! wakes `wait_for_rollouts` when a commit of this instance finished a rollout (waiters also
//! re-check every second, for writers in other processes, and at the next watchdog deadline).
//! A second thread with its own connection checkpoints the WAL every 100 ms
//! (`wal_checkpoint(PASSIVE)`), so the writer rarely pays for checkpoints; the writer's own
//! `wal_autocheckpoint` (8192 pages) bounds the WAL if it falls behind.
//!
//! Costs: enqueue, dequeue, update and add span are O(log n) index operations (a span batch
//! costs one statement per span); the spans of one rollout are read through
//! the unique `spans(rollout_seq, attempt_id, span_id)` index and sorted by rowid (insertion
//! order), so they cost O(k log n) for its k spans whatever the total. A
//! page of `query_rollouts` decodes only its own rows: SQL walks an index in the requested
//! order (creation order, `start_time`, `end_time`, `rollout_id`, `status`, and the mode
//! filter followed by `start_time`), skips `offset` index entries, and counts `total` through
//! the indexes (the dashboard's pages take under a millisecond at 100,000 rollouts, a deep
//! `offset` a few). A substring filter on the id (`rollout_id_contains`) reads the whole id
//! index to count its matches, and sorting by `input`, `config` or `metadata` decodes every
//! match.
//! Throughput is measured by `agl bench store` and `benches/store.rs` (figures in the
//! README): one caller is bound by one commit per operation; concurrent callers share commits.
//!
//! # Durability
//!
//! Settings: `journal_mode=WAL`, `synchronous=NORMAL` (or `FULL` with
//! [`SqliteOptions::synchronous_full`]), `foreign_keys=ON`, `busy_timeout=5000` ms.
//!
//! * **Process crash** (panic, `SIGKILL`, OOM kill): nothing acknowledged is lost. An operation
//!   is answered only after its `COMMIT`, which has written the WAL to the operating system;
//!   the next open replays it. Attempts whose runner died are detected by the watchdog from
//!   the persisted times (`timeout_seconds`, `unresponsive_seconds`) and requeued or failed by
//!   the rules of §4.5 — nothing special happens at open.
//! * **Power loss or kernel crash**: with `synchronous=NORMAL` the last transactions before the
//!   loss may be rolled back (the database stays consistent). Use `synchronous_full` to fsync
//!   the WAL on every commit, at a cost in throughput.
//! * [`LightningStore::close`] checkpoints the WAL into the database file
//!   (`PRAGMA wal_checkpoint(TRUNCATE)`) and refuses later operations with
//!   [`StoreError::Closed`].
//!
//! The watchdog runs lazily before the operations of [`lifecycle::WATCHDOG_OPERATIONS`]
//! (debounced by [`SqliteOptions::scan_debounce_seconds`]) and in a background [`Sweeper`]
//! every [`SqliteOptions::sweep_interval`] when the store is opened inside a tokio runtime.

mod db;
mod rows;
mod schema;
mod select;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker,
};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use self::db::Ctx;
use self::writer::{Call, Checkpointer, Msg};
use crate::error::StoreError;
use crate::lifecycle;
use crate::query::{
    self, AttemptQuery, Paginated, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery,
};
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate, StoreStatistics};
use crate::sweeper::{self, Sweeper};
use crate::wait;

pub use self::schema::{APPLICATION_ID, BUSY_TIMEOUT_MS, SCHEMA_VERSION};

/// Longest a `wait_for_rollouts` waiter sleeps before re-reading the database, so rollouts
/// finished by another process are noticed.
const WAIT_RECHECK: Duration = Duration::from_secs(1);

/// Options of [`SqliteLightningStore::open_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteOptions {
    /// Debounce of the lazy watchdog scan, in seconds (`0` = before every listed operation,
    /// `f64::INFINITY` = never, for read-only inspection). Default
    /// [`lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS`] (10 s).
    pub scan_debounce_seconds: f64,
    /// Time between two background watchdog scans; `None` = no background sweeper. Default
    /// [`sweeper::DEFAULT_SWEEP_INTERVAL`] (500 ms).
    pub sweep_interval: Option<Duration>,
    /// `synchronous=FULL` (fsync on every commit: survives power loss) instead of the default
    /// `synchronous=NORMAL` (survives process crashes).
    pub synchronous_full: bool,
    /// Bring an agl store of an older schema version up to [`SCHEMA_VERSION`] at open (the
    /// default). `false` opens it as it is, for looking at a store without changing it (e.g.
    /// serving it read-only): every operation works on an older schema, queries only lack the
    /// indexes later versions added (on a version 1 store SQLite sorts the matches of a page
    /// instead of walking an index). A new file still gets the current schema.
    pub upgrade_schema: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            scan_debounce_seconds: lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS,
            sweep_interval: Some(sweeper::DEFAULT_SWEEP_INTERVAL),
            synchronous_full: false,
            upgrade_schema: true,
        }
    }
}

/// The SQLite [`LightningStore`]: durable, safe to share between tasks (`Arc`) and between
/// processes opening the same file. See the [module documentation](self) for the durability
/// guarantees.
pub struct SqliteLightningStore {
    inner: Arc<Inner>,
    path: PathBuf,
    schema_version: u32,
    _sweeper: Sweeper,
}

impl std::fmt::Debug for SqliteLightningStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLightningStore")
            .field("path", &self.path)
            .field("schema_version", &self.schema_version)
            .finish_non_exhaustive()
    }
}

struct Inner {
    sender: mpsc::Sender<Msg>,
    closed: AtomicBool,
    finished: watch::Receiver<u64>,
    started: Instant,
}

impl Inner {
    /// Queues `f(ctx, now)` on the writer thread (after the lazy scan when `scan`).
    fn submit<T, F>(
        &self,
        scan: bool,
        f: F,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx, f64) -> Result<T, StoreError> + Send + 'static,
    {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let (reply, rx) = oneshot::channel();
        self.sender
            .send(Msg::Job(Box::new(Call { scan, f, reply })))
            .map_err(|_| StoreError::Closed)?;
        Ok(rx)
    }

    async fn call<T, F>(&self, scan: bool, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx, f64) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(scan, f)?
            .await
            .map_err(|_| StoreError::Closed)?
    }

    /// The background sweep (runs on tokio's blocking pool).
    fn sweep(&self) {
        if let Ok(rx) = self.submit(false, |ctx, now| ctx.scan_now(now)) {
            let _ = rx.blocking_recv();
        }
    }
}

impl SqliteLightningStore {
    /// Opens the store at `path` with the default [`SqliteOptions`], creating the file when
    /// it does not exist.
    ///
    /// Refused, with the file left untouched: a file that is not SQLite, a SQLite database
    /// that is not an agl store, and an agl store with a schema newer than
    /// [`SCHEMA_VERSION`]. An older agl schema is migrated in one transaction.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens the store at `path` with `options` (see [`SqliteLightningStore::open`]).
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let (conn, schema_version) =
            schema::open(&path, options.synchronous_full, options.upgrade_schema)?;
        let ctx = Ctx::new(conn, path.clone(), options.scan_debounce_seconds);
        let (sender, receiver) = mpsc::channel();
        let (finished_tx, finished_rx) = watch::channel(0u64);
        let checkpointer = Checkpointer::spawn(&path)?;
        std::thread::Builder::new()
            .name("agl-sqlite-writer".to_string())
            .spawn(move || writer::run(ctx, receiver, finished_tx, checkpointer))
            .map_err(|e| {
                StoreError::Backend(format!(
                    "sqlite store `{}`: cannot start the writer thread: {e}",
                    path.display()
                ))
            })?;
        let inner = Arc::new(Inner {
            sender,
            closed: AtomicBool::new(false),
            finished: finished_rx,
            started: Instant::now(),
        });
        let sweeper = match options.sweep_interval {
            Some(interval) => Sweeper::spawn(Arc::downgrade(&inner), interval, Inner::sweep),
            None => Sweeper::disabled(),
        };
        Ok(SqliteLightningStore {
            inner,
            path,
            schema_version,
            _sweeper: sweeper,
        })
    }

    /// The database file this store was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the open database ([`SCHEMA_VERSION`] after open, unless
    /// [`SqliteOptions::upgrade_schema`] was `false`).
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

#[async_trait::async_trait]
impl LightningStore for SqliteLightningStore {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        self.inner
            .call(true, move |ctx, now| ctx.enqueue(request, now))
            .await
    }

    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        lifecycle::validate_requests(&requests)?;
        self.inner
            .call(true, move |ctx, now| {
                requests
                    .into_iter()
                    .map(|request| ctx.enqueue(request, now))
                    .collect()
            })
            .await
    }

    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.inner
            .call(true, move |ctx, now| {
                ctx.start_rollout(request, worker_id.as_deref(), now)
            })
            .await
    }

    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        let worker_id = worker_id.map(str::to_string);
        self.inner
            .call(true, move |ctx, now| ctx.dequeue(worker_id.as_deref(), now))
            .await
    }

    /// One transaction for the whole batch; the same sequence of dequeues as the provided
    /// method (so, as in v0.3, only the last attempt stays bound to the worker, Q29).
    async fn dequeue_many(
        &self,
        limit: usize,
        worker_id: Option<&str>,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let worker_id = worker_id.map(str::to_string);
        self.inner
            .call(true, move |ctx, now| {
                let mut out = Vec::new();
                while out.len() < limit {
                    match ctx.dequeue(worker_id.as_deref(), now)? {
                        Some(a) => out.push(a),
                        None => break,
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        let rollout_id = rollout_id.to_string();
        let worker_id = worker_id.map(str::to_string);
        self.inner
            .call(true, move |ctx, now| {
                ctx.start_attempt(&rollout_id, worker_id.as_deref(), now)
            })
            .await
    }

    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        let rollout_id = rollout_id.to_string();
        let attempt_id = attempt_id.to_string();
        self.inner
            .call(true, move |ctx, now| {
                ctx.update_attempt(&rollout_id, &attempt_id, &update, now)
            })
            .await
    }

    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(true, move |ctx, now| {
                ctx.update_rollout(&rollout_id, update, now)
            })
            .await
    }

    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(true, move |ctx, _| ctx.get_rollout(&rollout_id))
            .await
    }

    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(true, move |ctx, _| ctx.get_latest_attempt(&rollout_id))
            .await
    }

    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        query::validate_sort::<Rollout>(&query.sort)?;
        self.inner
            .call(true, move |ctx, _| ctx.query_rollouts(&query))
            .await
    }

    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        query::validate_sort::<Attempt>(&query.sort)?;
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(true, move |ctx, _| ctx.query_attempts(&rollout_id, &query))
            .await
    }

    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
    ) -> Result<i64, StoreError> {
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(false, move |ctx, _| ctx.next_sequence_id(&rollout_id))
            .await
    }

    async fn get_next_span_sequence_ids(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        lifecycle::check_sequence_block(count)?;
        let rollout_id = rollout_id.to_string();
        self.inner
            .call(false, move |ctx, _| {
                ctx.next_sequence_ids(&rollout_id, count)
            })
            .await
    }

    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        Ok(self.add_spans(vec![span]).await?.into_iter().next())
    }

    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        // Encode on the caller's thread, so the writer thread only runs SQL.
        let encoded = crate::sql::encode_spans(spans)?;
        self.inner
            .call(false, move |ctx, now| ctx.add_spans(encoded, now))
            .await
    }

    /// One writer operation: the blocks, then `add_spans`. Spans that keep their id are
    /// encoded on the caller's thread; the numbered ones in the writer, once their id is known.
    async fn add_spans_with_fresh_ids(
        &self,
        spans: Vec<(Span, bool)>,
    ) -> Result<Vec<Span>, StoreError> {
        let bodies = crate::sql::encode_kept_spans(&spans)?;
        self.inner
            .call(false, move |ctx, now| {
                ctx.add_spans_with_fresh_ids(spans, bodies, now)
            })
            .await
    }

    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        query::validate_sort::<Span>(&query.sort)?;
        self.inner
            .call(true, move |ctx, _| ctx.query_spans(&query))
            .await
    }

    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.inner
            .call(false, move |ctx, now| ctx.add_resources(resources, now))
            .await
    }

    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        lifecycle::validate_resources_id(resources_id)?;
        let resources_id = resources_id.to_string();
        self.inner
            .call(true, move |ctx, now| {
                ctx.update_resources(&resources_id, resources, now)
            })
            .await
    }

    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        let resources_id = resources_id.to_string();
        self.inner
            .call(false, move |ctx, _| ctx.get_resources(&resources_id))
            .await
    }

    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.inner
            .call(false, |ctx, _| ctx.latest_resources())
            .await
    }

    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        query::validate_sort::<ResourcesUpdate>(&query.sort)?;
        self.inner
            .call(false, move |ctx, _| ctx.query_resources(&query))
            .await
    }

    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        let inner = &self.inner;
        wait::wait_for_rollouts(
            inner.finished.clone(),
            rollout_ids,
            timeout,
            Some(WAIT_RECHECK),
            |ids| inner.call(true, move |ctx, _| ctx.wait_snapshot(&ids)),
        )
        .await
    }

    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        let worker_id = worker_id.to_string();
        self.inner
            .call(false, move |ctx, now| {
                ctx.update_worker(&worker_id, heartbeat_stats, now)
            })
            .await
    }

    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        query::validate_sort::<Worker>(&query.sort)?;
        self.inner
            .call(true, move |ctx, _| ctx.query_workers(&query))
            .await
    }

    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        let worker_id = worker_id.to_string();
        self.inner
            .call(false, move |ctx, _| ctx.get_worker(&worker_id))
            .await
    }

    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        let mut stats = self.inner.call(false, |ctx, _| ctx.statistics()).await?;
        stats.uptime = self.inner.started.elapsed().as_secs_f64();
        Ok(stats)
    }

    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        self.inner.call(false, |ctx, now| ctx.scan_now(now)).await
    }

    async fn close(&self) -> Result<(), StoreError> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        self.inner
            .sender
            .send(Msg::Close(reply))
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}
