//! The `LightningStore` trait and the value types of its operations.
//!
//! Responsible for the backend-independent contract of the store (what each operation takes
//! and returns, present-versus-absent update semantics, filters, statistics). Not responsible
//! for the lifecycle rules themselves (see [`crate::lifecycle`]) nor for any storage (see
//! [`crate::memory`] and later backends).

use std::collections::BTreeMap;
use std::time::Duration;

use agl_core::{
    AnyRollout, Attempt, AttemptStatus, AttemptedRollout, EnqueueRolloutRequest, NamedResources,
    ResourcesUpdate, Rollout, RolloutConfig, RolloutMode, RolloutStatus, Span, Worker,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;
use crate::query::{AttemptQuery, Paginated, ResourcesQuery, RolloutQuery, SpanQuery, WorkerQuery};

/// Fields to change on an attempt (`POST /rollouts/{rid}/attempts/{aid}`). `None` = absent =
/// unchanged. A present `status` or `worker_id` also synchronises the worker (§4.4).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptUpdate {
    /// New status.
    pub status: Option<AttemptStatus>,
    /// New worker id.
    pub worker_id: Option<String>,
    /// New attempt heartbeat, Unix seconds.
    pub last_heartbeat_time: Option<f64>,
    /// New metadata; must be a JSON object (`null` is refused, as the Python server does).
    pub metadata: Option<Value>,
}

/// Fields to change on a rollout (`POST /rollouts/{rid}`). The outer `None` = absent =
/// unchanged; for the nullable fields the inner value may be `None`/`Value::Null` to clear.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutUpdate {
    /// New status (any value; `queuing`/`requeuing` re-enqueue, terminal ones set `end_time`).
    pub status: Option<RolloutStatus>,
    /// New mode, `Some(None)` clears it.
    pub mode: Option<Option<RolloutMode>>,
    /// New resources id, `Some(None)` clears it.
    pub resources_id: Option<Option<String>>,
    /// Replaces the whole config.
    pub config: Option<RolloutConfig>,
    /// New metadata: a JSON object, or `Value::Null` to set `metadata: null`.
    pub metadata: Option<Value>,
    /// New input (any JSON, `Value::Null` included).
    pub input: Option<Value>,
}

/// Counts reported by `GET /statistics` (JSON keys of the same names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreStatistics {
    /// Number of rollouts.
    pub total_rollouts: u64,
    /// Number of attempts.
    pub total_attempts: u64,
    /// Number of stored spans (duplicates excluded).
    pub total_spans: u64,
    /// Number of resources ids.
    pub total_resources: u64,
    /// Number of workers.
    pub total_workers: u64,
    /// Seconds since the store was opened (this process).
    pub uptime: f64,
    /// Rollouts per status (agl extension; every status present, zeros included).
    pub rollouts_by_status: BTreeMap<RolloutStatus, u64>,
    /// Attempts per status (agl extension; every status present, zeros included).
    pub attempts_by_status: BTreeMap<AttemptStatus, u64>,
}

impl StoreStatistics {
    /// Zero counts for every rollout and attempt status.
    pub fn zeroed() -> Self {
        StoreStatistics {
            rollouts_by_status: RolloutStatus::ALL.iter().map(|s| (*s, 0)).collect(),
            attempts_by_status: AttemptStatus::ALL.iter().map(|s| (*s, 0)).collect(),
            ..Self::default()
        }
    }
}

/// The control plane of Agent Lightning: rollouts, attempts, spans, resources and workers.
///
/// Every backend follows the rules of [`crate::lifecycle`]; the conformance suite
/// (`agl_store::conformance`, feature `conformance`) checks them against any implementation.
/// Times are Unix seconds from the store's clock.
#[async_trait::async_trait]
pub trait LightningStore: Send + Sync {
    /// Creates a `queuing` rollout at the tail of the queue (no attempt yet).
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError>;

    /// Enqueues several rollouts; all are validated before any is created. Returned in
    /// request order.
    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError>;

    /// Creates a rollout and its first attempt (`preparing`), bypassing the queue.
    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError>;

    /// Takes the first dispatchable rollout off the queue and creates its next attempt.
    /// Non-blocking: `None` when the queue holds nothing dispatchable.
    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError>;

    /// Dequeues up to `limit` rollouts (`POST /queues/rollouts/dequeue`), each as by
    /// [`LightningStore::dequeue_rollout`]; only the **last** one stays bound to the worker
    /// (compat Q29). `limit == 0` returns nothing.
    async fn dequeue_many(
        &self,
        limit: usize,
        worker_id: Option<&str>,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        let mut out = Vec::new();
        while out.len() < limit {
            match self.dequeue_rollout(worker_id).await? {
                Some(a) => out.push(a),
                None => break,
            }
        }
        Ok(out)
    }

    /// Creates a new attempt for an existing rollout (manual retry; ignores `max_attempts`).
    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError>;

    /// Updates an attempt (`attempt_id` may be `"latest"`) and propagates its status to the
    /// rollout when it is the latest attempt.
    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError>;

    /// Updates a rollout's fields and status.
    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError>;

    /// The rollout, or `None` if unknown.
    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError>;

    /// The attempt with the highest `sequence_id`, or `None` (unknown rollout or no attempt).
    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError>;

    /// Rollouts matching the query (see [`crate::query`]), each with its latest attempt when
    /// it has one (`AnyRollout::Attempted`), as `GET /rollouts` returns them.
    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError>;

    /// Attempts of one rollout (an unknown rollout gives an empty page).
    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError>;

    /// Every attempt of a rollout by `sequence_id` (empty for an unknown rollout).
    async fn list_attempts(&self, rollout_id: &str) -> Result<Vec<Attempt>, StoreError> {
        Ok(self
            .query_attempts(rollout_id, AttemptQuery::default())
            .await?
            .items)
    }

    /// Issues the next span sequence id of the rollout (1, 2, …). Does not check that the
    /// rollout exists.
    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        attempt_id: &str,
    ) -> Result<i64, StoreError>;

    /// Issues `count` consecutive sequence ids of the rollout in one operation and returns the
    /// first (the block is `first .. first + count`); what OTLP ingest uses for the spans of a
    /// request that carry no id. `count == 0` is [`StoreError::Invalid`]. The default issues
    /// them one by one (not atomic: concurrent callers may interleave).
    async fn get_next_span_sequence_ids(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        crate::lifecycle::check_sequence_block(count)?;
        let first = self
            .get_next_span_sequence_id(rollout_id, attempt_id)
            .await?;
        for _ in 1..count {
            self.get_next_span_sequence_id(rollout_id, attempt_id)
                .await?;
        }
        Ok(first)
    }

    /// Stores a span; `Ok(None)` when a span with the same (rollout, attempt, span_id) exists
    /// (the duplicate is dropped). Unknown rollout or attempt → `NotFound`.
    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError>;

    /// Stores several spans (all targets checked first); returns the ones actually stored.
    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError>;

    /// Issues fresh sequence ids and stores spans in one operation: the spans marked `true`
    /// take, in span order, the ids of one block per rollout (as
    /// [`get_next_span_sequence_ids`](Self::get_next_span_sequence_ids) issues them, see
    /// [`lifecycle::fresh_id_blocks`](crate::lifecycle::fresh_id_blocks)), the others keep
    /// their `sequence_id`; then every span is stored as by [`add_spans`](Self::add_spans)
    /// (targets checked first, duplicates dropped, the stored ones returned). Issued ids stay
    /// consumed when the spans are then refused (`NotFound`), exactly as with the two calls.
    /// What OTLP ingest uses for a request whose spans belong to one attempt: one transaction
    /// instead of two. The default makes the two calls.
    async fn add_spans_with_fresh_ids(
        &self,
        spans: Vec<(Span, bool)>,
    ) -> Result<Vec<Span>, StoreError> {
        let spans = self.issue_span_sequence_ids(spans).await?;
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        self.add_spans(spans).await
    }

    /// Gives the spans marked `true` fresh sequence ids, one block per rollout with one
    /// [`get_next_span_sequence_ids`](Self::get_next_span_sequence_ids) call each (see
    /// [`lifecycle::fresh_id_blocks`](crate::lifecycle::fresh_id_blocks)), and returns every
    /// span in order, storing none: the first half of
    /// [`add_spans_with_fresh_ids`](Self::add_spans_with_fresh_ids), for callers that store
    /// the spans in several calls (OTLP ingest of an export that spans several attempts).
    async fn issue_span_sequence_ids(
        &self,
        spans: Vec<(Span, bool)>,
    ) -> Result<Vec<Span>, StoreError> {
        let blocks = crate::lifecycle::fresh_id_blocks(&spans);
        let mut firsts = Vec::with_capacity(blocks.len());
        for b in &blocks {
            firsts.push(
                self.get_next_span_sequence_ids(&b.rollout_id, &b.attempt_id, b.count)
                    .await?,
            );
        }
        crate::lifecycle::number_fresh_spans(spans, &blocks, &firsts)
    }

    /// Spans of one rollout matching the query; default order `(sequence_id, insertion
    /// order)` (Q12).
    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError>;

    /// Every span of a rollout ordered by `(sequence_id, insertion order)`. `attempt_id`:
    /// `None` = all attempts, `Some("latest")` = the latest attempt, `Some(id)` = that attempt.
    async fn list_spans(
        &self,
        rollout_id: &str,
        attempt_id: Option<&str>,
    ) -> Result<Vec<Span>, StoreError> {
        Ok(self
            .query_spans(SpanQuery::of(rollout_id, attempt_id))
            .await?
            .items)
    }

    /// Stores a new resources set under a fresh `rs-…` id (version 1); it becomes the latest.
    async fn add_resources(&self, resources: NamedResources)
    -> Result<ResourcesUpdate, StoreError>;

    /// Upserts the resources under a client-chosen id (version 1 if new, else +1); it becomes
    /// the latest.
    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError>;

    /// The resources with this id, or `None`.
    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError>;

    /// The last added or updated resources, or `None`.
    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError>;

    /// Resources matching the query, in the order first written.
    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError>;

    /// Waits until every listed rollout is finished (`succeeded`/`failed`/`cancelled`) or
    /// unknown, or the timeout elapses, then returns the finished ones in request order
    /// (unknown ids omitted). An id the store does not hold never makes the call wait (as in
    /// Agent Lightning v0.3.0): a list of unknown and finished ids answers at once.
    /// `Some(Duration::ZERO)` checks once; `None` waits without limit.
    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError>;

    /// Upserts a worker and records a worker heartbeat (never changes its status).
    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError>;

    /// Workers matching the query, in the order they were first seen.
    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError>;

    /// Every worker, in the order they were first seen.
    async fn list_workers(&self) -> Result<Vec<Worker>, StoreError> {
        Ok(self.query_workers(WorkerQuery::default()).await?.items)
    }

    /// The worker, or `None`.
    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError>;

    /// Entity counts (per status too) and uptime.
    async fn statistics(&self) -> Result<StoreStatistics, StoreError>;

    /// Runs the watchdog scan (§4.5) now, ignoring the debounce, and returns how many attempts
    /// it moved to `timeout`/`unresponsive`. The background sweeper runs the same scan.
    async fn run_watchdog(&self) -> Result<usize, StoreError>;

    /// Flushes and closes the backend; later operations fail with [`StoreError::Closed`]
    /// where the backend can tell. The default does nothing (nothing to flush).
    async fn close(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
