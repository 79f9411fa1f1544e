//! [`PostgresLightningStore`]: the store kept in PostgreSQL, shared by any number of
//! `agl store` servers.
//!
//! Responsible for the connection pool, one transaction per operation (run again on a
//! deadlock, serialization failure or unique-violation race, up to [`MAX_RETRIES`] times), the
//! lazy and background watchdog scans, and waking `wait_for_rollouts` when a rollout finishes
//! on this server or any other (`LISTEN`/`NOTIFY` on a channel named after the partition's
//! schema, plus a re-check every second should a notification be lost). Not responsible for
//! the operations' rules (sibling `ops` module, which calls [`crate::lifecycle`]) nor for the
//! schema (sibling `schema` module).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker, now_seconds,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde_json::Value;
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, IsolationLevel, NoTls};

use super::ops::Tx;
use super::rows::describe;
use super::url::PostgresUrl;
use crate::error::StoreError;
use crate::lifecycle::{self, ScanDebounce};
use crate::query::{
    self, AttemptQuery, Paginated, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery,
};
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate, StoreStatistics};
use crate::sweeper::{self, Sweeper};
use crate::wait;

/// Times an operation is run again after a retryable failure before the failure is returned.
pub const MAX_RETRIES: u32 = 8;

/// Longest a `wait_for_rollouts` waiter sleeps before re-reading the database (a lost
/// notification, or a listener reconnecting, delays a wake-up by at most this).
const WAIT_RECHECK: Duration = Duration::from_secs(1);

/// Time before a lost listener connection is opened again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// The connect timeout when the URL sets none (`connect_timeout`), so an unreachable server
/// is an error rather than a hang.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of [`PostgresLightningStore::open`].
#[derive(Debug, Clone, PartialEq)]
pub struct PostgresOptions {
    /// Debounce of the lazy watchdog scan, in seconds, per server (`0` = before every listed
    /// operation). Default [`lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS`] (10 s).
    pub scan_debounce_seconds: f64,
    /// Time between two background watchdog scans of this server; `None` = no background
    /// sweeper. Default [`sweeper::DEFAULT_SWEEP_INTERVAL`] (500 ms).
    pub sweep_interval: Option<Duration>,
    /// Most connections this server opens (operations beyond it wait for a free one).
    /// Default 16.
    pub pool_size: usize,
    /// Create the store when the partition has none (the default). `false` refuses an absent
    /// or empty partition and creates nothing, for looking at a store (`agl store inspect`);
    /// a store of an older schema version is still migrated (there is only version 1 so far).
    pub create_missing: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            scan_debounce_seconds: lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS,
            sweep_interval: Some(sweeper::DEFAULT_SWEEP_INTERVAL),
            pool_size: 16,
            create_missing: true,
        }
    }
}

/// The PostgreSQL [`LightningStore`]. Every server that opens the same URL (database and
/// partition) sees the same store; nothing that must stay consistent lives in the process
/// (see the `ops` module for how servers stay out of each other's way).
pub struct PostgresLightningStore {
    inner: Arc<Inner>,
    listener: tokio::task::JoinHandle<()>,
    _sweeper: Sweeper,
}

impl std::fmt::Debug for PostgresLightningStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLightningStore")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

impl Drop for PostgresLightningStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

struct Inner {
    pool: Pool,
    /// The partition's schema, also the notification channel.
    schema: String,
    /// `host:port/dbname`, for messages.
    target: String,
    debounce: std::sync::Mutex<ScanDebounce>,
    finished: watch::Sender<u64>,
    closed: AtomicBool,
    started: Instant,
}

/// Which transaction an operation runs in.
#[derive(Clone, Copy)]
enum Kind {
    /// `READ COMMITTED` with row locks (every operation that may write).
    Write,
    /// `REPEATABLE READ READ ONLY`: several statements read one snapshot.
    Read,
}

/// Runs `$body` (an expression using `$tx: &mut Tx` and `$now`) in one transaction of `$kind`:
/// commits on success (and when the operation asked to keep its writes despite failing),
/// rolls back otherwise, and runs it again in a new transaction when the failure is
/// retryable. `$body` must therefore be re-runnable (it clones what it consumes).
macro_rules! transact {
    ($inner:expr, $kind:expr, |$tx:ident, $now:ident| $body:expr) => {{
        let inner: &Inner = $inner;
        let mut tries = 0u32;
        loop {
            let mut client = inner.client().await?;
            let begun = match $kind {
                Kind::Write => client.transaction().await,
                Kind::Read => {
                    client
                        .build_transaction()
                        .isolation_level(IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .await
                }
            };
            #[allow(unused_mut)]
            let mut $tx = Tx::new(begun.map_err(|e| inner.failed("begin", &e))?);
            let $now = now_seconds();
            let result = $body;
            match result {
                Ok(value) => {
                    let finished = $tx.finished;
                    $tx.commit(&inner.schema).await?;
                    if finished {
                        inner.finished.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    break Ok(value);
                }
                Err(e) if $tx.keep_on_error => {
                    $tx.commit(&inner.schema).await?;
                    break Err(e);
                }
                Err(e) => {
                    let retry = $tx.retryable() && tries < MAX_RETRIES;
                    $tx.rollback().await;
                    if !retry {
                        break Err(e);
                    }
                    tries += 1;
                    // Spread the retries of servers that collided.
                    let jitter = u64::from(now_seconds().fract().to_bits() as u16 % 8);
                    tokio::time::sleep(Duration::from_millis(u64::from(tries) * 2 + jitter)).await;
                }
            }
        }
    }};
}

impl Inner {
    fn failed(&self, what: &str, e: &tokio_postgres::Error) -> StoreError {
        StoreError::Backend(format!(
            "postgres store {} (schema `{}`): {what}: {}",
            self.target,
            self.schema,
            describe(e)
        ))
    }

    /// A pooled connection (its `search_path` is the partition's schema).
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Closed => StoreError::Closed,
            deadpool_postgres::PoolError::Backend(e) => self.failed("connecting", &e),
            other => StoreError::Backend(format!(
                "postgres store {} (schema `{}`): connecting: {other}",
                self.target, self.schema
            )),
        })
    }

    /// The watchdog scan now, in its own transaction.
    async fn scan(&self) -> Result<usize, StoreError> {
        transact!(self, Kind::Write, |tx, now| tx.scan_now(now).await)
    }

    /// The debounced lazy scan before the operations of [`lifecycle::WATCHDOG_OPERATIONS`].
    async fn lazy_scan(&self) -> Result<(), StoreError> {
        let due = match self.debounce.lock() {
            Ok(mut d) => d.should_scan(now_seconds()),
            Err(poisoned) => poisoned.into_inner().should_scan(now_seconds()),
        };
        if due {
            self.scan().await?;
        }
        Ok(())
    }

    fn next_scan_at(&self) -> f64 {
        match self.debounce.lock() {
            Ok(d) => d.next_scan_at(),
            Err(poisoned) => poisoned.into_inner().next_scan_at(),
        }
    }
}

/// `host:port/dbname` of a connection config, for messages (never the password).
fn target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

/// Keeps one connection listening on `channel` and bumps `finished` on every notification
/// (and after each (re)connect, since notifications sent meanwhile were missed).
async fn listen(config: tokio_postgres::Config, channel: String, inner: std::sync::Weak<Inner>) {
    loop {
        match inner.upgrade() {
            Some(i) if !i.closed.load(Ordering::Acquire) => {}
            _ => return,
        }
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            let command = format!("LISTEN {channel}");
            let mut subscribe = std::pin::pin!(client.batch_execute(&command));
            let mut listening = false;
            loop {
                tokio::select! {
                    done = &mut subscribe, if !listening => {
                        if done.is_err() {
                            break;
                        }
                        listening = true;
                        let Some(i) = inner.upgrade() else { return };
                        i.finished.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    message = std::future::poll_fn(|cx| connection.poll_message(cx)) => {
                        match message {
                            Some(Ok(AsyncMessage::Notification(_))) => {
                                let Some(i) = inner.upgrade() else { return };
                                i.finished.send_modify(|n| *n = n.wrapping_add(1));
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => break,
                        }
                    }
                }
            }
        }
        tokio::time::sleep(LISTEN_RETRY).await;
    }
}

impl PostgresLightningStore {
    /// Opens the store at `url` (see [`PostgresUrl`]): connects, creates or migrates the
    /// partition's schema (refusing, untouched, one that is not an agl store), and starts the
    /// listener and the background sweeper on the current tokio runtime.
    ///
    /// # Errors
    /// [`StoreError::Backend`] naming the server when it cannot be reached or refuses the
    /// login, and the schema's problem when it is not a store this build can use.
    pub async fn open(url: &PostgresUrl, options: PostgresOptions) -> Result<Self, StoreError> {
        let schema = url.schema.clone();
        let mut config = url.config.clone();
        let search_path = format!("-c search_path={schema}");
        let merged = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {search_path}"),
            _ => search_path,
        };
        config.options(&merged);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("agl-store");
        }
        let target = target(&config);
        let (mut client, connection) = config.connect(NoTls).await.map_err(|e| {
            StoreError::Backend(format!(
                "cannot connect to PostgreSQL at {target}: {}",
                describe(&e)
            ))
        })?;
        let driver = tokio::spawn(connection);
        let prepared = async {
            if !options.create_missing {
                super::schema::require_store(&client, &schema).await?;
            }
            super::schema::prepare(&mut client, &schema).await
        }
        .await;
        drop(client);
        let _ = driver.await;
        prepared?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .create_timeout(config.get_connect_timeout().copied())
            .build()
            .map_err(|e| StoreError::Backend(format!("postgres store {target}: pool: {e}")))?;
        let (finished, _) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            pool,
            schema: schema.clone(),
            target,
            debounce: std::sync::Mutex::new(ScanDebounce::new(options.scan_debounce_seconds)),
            finished,
            closed: AtomicBool::new(false),
            started: Instant::now(),
        });
        let listener = tokio::spawn(listen(config, schema, Arc::downgrade(&inner)));
        let sweeper = match options.sweep_interval {
            Some(interval) => Sweeper::spawn_async(Arc::downgrade(&inner), interval, |inner| {
                Box::pin(async move {
                    // A failed background scan is retried at the next tick; the lazy scan
                    // before operations reports failures to callers.
                    let _ = inner.scan().await;
                })
            }),
            None => Sweeper::disabled(),
        };
        Ok(PostgresLightningStore {
            inner,
            listener,
            _sweeper: sweeper,
        })
    }

    /// The PostgreSQL schema this store lives in (`agl_` + the partition).
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }
}

#[async_trait::async_trait]
impl LightningStore for PostgresLightningStore {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        lifecycle::validate_request(&request)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.enqueue(request.clone(), now).await
        })
    }

    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        lifecycle::validate_requests(&requests)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| tx
            .enqueue_many(&requests, now)
            .await)
    }

    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        lifecycle::validate_request(&request)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.start_rollout(request.clone(), worker_id.as_deref(), now)
                .await
        })
    }

    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| tx
            .dequeue(worker_id, now)
            .await)
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
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| tx
            .dequeue_many(limit, worker_id, now)
            .await)
    }

    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.start_attempt(rollout_id, worker_id, now).await
        })
    }

    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.update_attempt(rollout_id, attempt_id, &update, now)
                .await
        })
    }

    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.update_rollout(rollout_id, update.clone(), now).await
        })
    }

    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .get_rollout(rollout_id)
            .await)
    }

    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .get_latest_attempt(rollout_id)
            .await)
    }

    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        query::validate_sort::<Rollout>(&query.sort)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .query_rollouts(&query)
            .await)
    }

    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        query::validate_sort::<Attempt>(&query.sort)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .query_attempts(rollout_id, &query)
            .await)
    }

    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
    ) -> Result<i64, StoreError> {
        transact!(&self.inner, Kind::Write, |tx, _now| tx
            .next_sequence_ids(rollout_id, 1)
            .await)
    }

    async fn get_next_span_sequence_ids(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        lifecycle::check_sequence_block(count)?;
        transact!(&self.inner, Kind::Write, |tx, _now| tx
            .next_sequence_ids(rollout_id, count)
            .await)
    }

    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        Ok(self.add_spans(vec![span]).await?.into_iter().next())
    }

    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        let encoded = crate::sql::encode_spans(spans)?;
        transact!(&self.inner, Kind::Write, |tx, now| tx
            .add_spans(&encoded, now)
            .await)
    }

    /// One transaction: the blocks, then `add_spans`.
    async fn add_spans_with_fresh_ids(
        &self,
        spans: Vec<(Span, bool)>,
    ) -> Result<Vec<Span>, StoreError> {
        let bodies = crate::sql::encode_kept_spans(&spans)?;
        transact!(&self.inner, Kind::Write, |tx, now| tx
            .add_spans_with_fresh_ids(&spans, &bodies, now)
            .await)
    }

    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        query::validate_sort::<Span>(&query.sort)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .query_spans(&query)
            .await)
    }

    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.add_resources(resources.clone(), now).await
        })
    }

    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        lifecycle::validate_resources_id(resources_id)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.update_resources(resources_id, resources.clone(), now)
                .await
        })
    }

    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .get_resources(resources_id)
            .await)
    }

    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .latest_resources()
            .await)
    }

    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        query::validate_sort::<ResourcesUpdate>(&query.sort)?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .query_resources(&query)
            .await)
    }

    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        let inner = &*self.inner;
        wait::wait_for_rollouts(
            inner.finished.subscribe(),
            rollout_ids,
            timeout,
            Some(WAIT_RECHECK),
            |ids| async move {
                inner.lazy_scan().await?;
                let not_before = inner.next_scan_at();
                transact!(inner, Kind::Read, |tx, _now| tx
                    .wait_snapshot(&ids, not_before)
                    .await)
            },
        )
        .await
    }

    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        lifecycle::validate_heartbeat_stats(heartbeat_stats.as_ref())?;
        transact!(&self.inner, Kind::Write, |tx, now| {
            tx.update_worker(worker_id, heartbeat_stats.clone(), now)
                .await
        })
    }

    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        query::validate_sort::<Worker>(&query.sort)?;
        self.inner.lazy_scan().await?;
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .query_workers(&query)
            .await)
    }

    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        transact!(&self.inner, Kind::Read, |tx, _now| tx
            .get_worker(worker_id)
            .await)
    }

    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        let mut stats = transact!(&self.inner, Kind::Read, |tx, _now| tx.statistics().await)?;
        stats.uptime = self.inner.started.elapsed().as_secs_f64();
        Ok(stats)
    }

    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        self.inner.scan().await
    }

    async fn close(&self) -> Result<(), StoreError> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.listener.abort();
        self.inner.pool.close();
        Ok(())
    }
}
