//! The store rules of the Agent Lightning v0.3 protocol, as pure functions over the data.
//!
//! Responsible for §4.1–4.5 and §4.7–4.9 of the protocol reference: rollout and attempt
//! transitions, attempt → rollout propagation with retries, worker status synchronisation,
//! the watchdog verdict and its debounce, span sequence counters, what a stored span does to
//! its attempt and rollout, and the resources versioning rules. Every backend calls these
//! functions; no rule is written anywhere else. Not responsible for storage, locking, the
//! queue data structure or id uniqueness (backends own those), and performs no I/O: the
//! current time is always passed in as `now` (Unix seconds).
//!
//! # Deliberate deviations from v0.3.0 (§12 of the reference)
//!
//! * **Q5** – a span promotes a `requeuing` rollout to `running` only when it actually moved
//!   the latest attempt to `running` (it was `preparing`/`unresponsive`); a late span from a
//!   `failed`/`timeout` attempt only records the heartbeat. A `preparing` rollout is promoted by
//!   any span of its latest attempt; a `queuing` one never (Q4, compat).
//! * **Q6** – propagation runs only from the latest attempt and only when its **status
//!   changed** (a metadata-only update never touches the rollout); a `cancelled` rollout is
//!   never changed by propagation; a finished rollout (`failed`/`succeeded`) may move only to
//!   another finished status by propagation. So the late success `failed` → `succeeded` is
//!   **kept** (the algorithm may use it), but a late report can never revive a terminal
//!   rollout to `queuing`/`requeuing`/`preparing`/`running`. Reviving a terminal rollout stays
//!   possible through the explicit operations `start_attempt` and `update_rollout`.
//! * **Q7** – `end_time` of a rollout is cleared whenever it leaves a finished status.
//! * **Q8** – an attempt that becomes `timeout` gets `end_time = now` (`timeout` is final);
//!   `unresponsive` keeps `end_time = null` (it is reversible). An attempt moved back to a
//!   non-final status has its `end_time` cleared.
//! * The watchdog only judges attempts that are not finished (`preparing`, `running`,
//!   `unresponsive`), so a `succeeded` latest attempt of a rollout that was manually set back
//!   to `running` is never rewritten to `timeout`.
//! * Resources ids `""` and `"latest"` are refused on upsert (Q33): `latest` could never be
//!   fetched by id.
//! * Explicit status changes are checked against one state machine
//!   ([`check_attempt_transition`], [`check_rollout_transition`]); v0.3.0 accepted any value.
//!   A refused change is [`StoreError::InvalidTransition`] naming both statuses and the rule.

use agl_core::{
    Attempt, AttemptStatus, EnqueueRolloutRequest, LATEST, NamedResources, ResourcesUpdate,
    Rollout, RolloutConfig, RolloutStatus, Span, Worker, WorkerStatus,
};
use serde_json::{Map, Value};

use crate::error::{EntityKind, StoreError};
use crate::store::{AttemptUpdate, RolloutUpdate};

/// Default debounce of the lazy watchdog scan, in seconds (`scan_debounce_seconds`).
pub const DEFAULT_SCAN_DEBOUNCE_SECONDS: f64 = 10.0;

/// The store operations that run the (debounced) watchdog scan first (§4.5). `add_span(s)`,
/// `add_resources`, `get_next_span_sequence_id`, `update_worker`, `statistics` and the
/// resources getters do not.
pub const WATCHDOG_OPERATIONS: &[&str] = &[
    "start_rollout",
    "enqueue_rollout",
    "enqueue_many",
    "dequeue_rollout",
    "start_attempt",
    "query_rollouts",
    "get_rollout_by_id",
    "query_attempts",
    "get_latest_attempt",
    "update_resources",
    "wait_for_rollouts",
    "query_spans",
    "update_rollout",
    "update_attempt",
    "query_workers",
];

// ---------------------------------------------------------------------------------------------
// Creation (§4.1)
// ---------------------------------------------------------------------------------------------

/// Checks every request of `enqueue_many` before any is created; an invalid one is named by
/// its index (`rollouts[i]: …`, the JSON path of the HTTP body).
pub fn validate_requests(requests: &[EnqueueRolloutRequest]) -> Result<(), StoreError> {
    for (i, request) in requests.iter().enumerate() {
        validate_request(request).map_err(|e| match e {
            StoreError::Invalid(msg) => StoreError::Invalid(format!("rollouts[{i}]: {msg}")),
            other => other,
        })?;
    }
    Ok(())
}

/// Checks an enqueue / start request (`config.max_attempts >= 1`).
pub fn validate_request(request: &EnqueueRolloutRequest) -> Result<(), StoreError> {
    if let Some(config) = &request.config {
        config
            .validate()
            .map_err(|e| StoreError::Invalid(format!("rollout config: {e}")))?;
    }
    Ok(())
}

/// Builds a new `queuing` rollout from a request: `start_time = now`, `metadata: null` → `{}`,
/// `config: null` → default, `resources_id: null` → `latest_resources_id`.
pub fn new_rollout(
    request: EnqueueRolloutRequest,
    rollout_id: String,
    latest_resources_id: Option<&str>,
    now: f64,
) -> Result<Rollout, StoreError> {
    validate_request(&request)?;
    Ok(Rollout {
        rollout_id,
        input: request.input,
        start_time: now,
        end_time: None,
        mode: request.mode,
        resources_id: request
            .resources_id
            .or_else(|| latest_resources_id.map(str::to_string)),
        status: RolloutStatus::Queuing,
        config: request.config.unwrap_or_default(),
        metadata: Some(request.metadata.unwrap_or_default()),
    })
}

/// Whether a queue entry for this rollout may be dispatched (`queuing`/`requeuing`); other
/// entries are stale and are skipped and consumed by dequeue (§4.9).
pub fn is_dispatchable(rollout: &Rollout) -> bool {
    rollout.status.is_queuing()
}

/// Creates the next attempt of a rollout (start_rollout, dequeue, start_attempt):
/// `sequence_id = existing_attempts + 1`, status `preparing`, `start_time = now`. The rollout
/// becomes `preparing` (from any status) and its `end_time` is cleared (Q7).
pub fn begin_attempt(
    rollout: &mut Rollout,
    existing_attempts: u32,
    attempt_id: String,
    worker_id: Option<String>,
    now: f64,
) -> (Attempt, RolloutChange) {
    let attempt = Attempt {
        rollout_id: rollout.rollout_id.clone(),
        attempt_id,
        sequence_id: existing_attempts.saturating_add(1),
        start_time: now,
        end_time: None,
        status: AttemptStatus::Preparing,
        worker_id,
        last_heartbeat_time: None,
        metadata: None,
    };
    let change = set_rollout_status(rollout, RolloutStatus::Preparing, now);
    (attempt, change)
}

// ---------------------------------------------------------------------------------------------
// Status changes
// ---------------------------------------------------------------------------------------------

/// What happened to a rollout's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutChange {
    /// Status before the operation.
    pub previous: RolloutStatus,
    /// Status after the operation.
    pub current: RolloutStatus,
    /// The backend must append the rollout to the queue unless it is already there.
    pub requeue: bool,
}

impl RolloutChange {
    /// No change to a rollout in `status`.
    pub fn unchanged(status: RolloutStatus) -> Self {
        RolloutChange {
            previous: status,
            current: status,
            requeue: false,
        }
    }

    /// Whether the status changed.
    pub fn changed(&self) -> bool {
        self.previous != self.current
    }

    /// Whether the rollout just became finished (waiters must be woken).
    pub fn became_finished(&self) -> bool {
        self.current.is_finished() && !self.previous.is_finished()
    }
}

/// Sets a rollout's status. It is written only if it differs; becoming finished sets
/// `end_time = now`, leaving a finished status clears `end_time` (Q7); becoming
/// `queuing`/`requeuing` asks for a requeue.
pub fn set_rollout_status(rollout: &mut Rollout, status: RolloutStatus, now: f64) -> RolloutChange {
    let previous = rollout.status;
    if previous == status {
        return RolloutChange::unchanged(status);
    }
    rollout.status = status;
    if status.is_finished() {
        rollout.end_time = Some(now);
    } else if previous.is_finished() {
        rollout.end_time = None;
    }
    RolloutChange {
        previous,
        current: status,
        requeue: status.is_queuing(),
    }
}

/// Sets an attempt's status; returns whether it changed. `succeeded`/`failed`/`timeout` set
/// `end_time = now` (Q8); a non-final status clears `end_time`.
pub fn set_attempt_status(attempt: &mut Attempt, status: AttemptStatus, now: f64) -> bool {
    if attempt.status == status {
        return false;
    }
    attempt.status = status;
    attempt.end_time = if status.is_finished() {
        Some(now)
    } else {
        None
    };
    true
}

/// The propagation table of §4.3: the rollout status implied by its latest attempt.
///
/// `preparing`/`running`/`succeeded` map to themselves; `failed`/`timeout`/`unresponsive` map
/// to `requeuing` when the status is in `config.retry_condition` and
/// `attempt.sequence_id < config.max_attempts`, otherwise to `failed`.
pub fn rollout_status_for(config: &RolloutConfig, attempt: &Attempt) -> RolloutStatus {
    match attempt.status {
        AttemptStatus::Preparing => RolloutStatus::Preparing,
        AttemptStatus::Running => RolloutStatus::Running,
        AttemptStatus::Succeeded => RolloutStatus::Succeeded,
        AttemptStatus::Failed | AttemptStatus::Timeout | AttemptStatus::Unresponsive => {
            if config.retry_condition.contains(&attempt.status)
                && attempt.sequence_id < config.max_attempts
            {
                RolloutStatus::Requeuing
            } else {
                RolloutStatus::Failed
            }
        }
    }
}

/// Applies the propagation table to the rollout of a **latest** attempt whose status just
/// changed, with the protections of Q6 (see the module doc): `cancelled` is never changed and
/// a finished rollout only moves to another finished status.
pub fn propagate(rollout: &mut Rollout, attempt: &Attempt, now: f64) -> RolloutChange {
    let target = rollout_status_for(&rollout.config, attempt);
    let current = rollout.status;
    if current == RolloutStatus::Cancelled || (current.is_finished() && !target.is_finished()) {
        return RolloutChange::unchanged(current);
    }
    set_rollout_status(rollout, target, now)
}

/// Whether `update_attempt` may move an attempt from `from` to `to`. Same → same is always
/// allowed (an idempotent re-send). Otherwise:
///
/// * nothing moves **to** `preparing` (only a new attempt starts there);
/// * `preparing` → any other status; `running` → `succeeded`/`failed`/`timeout`/`unresponsive`;
/// * `unresponsive` → `running` (it came back), `succeeded`, `failed`, `timeout`;
/// * `timeout` and `failed` → `succeeded` only: the late success of §12 Q6, which the
///   algorithm may use; `timeout` → `failed` too (the worker's own late verdict);
/// * `succeeded` is final.
///
/// Agent Lightning v0.3.0 accepts every transition (§4.2, "any → X"); refusing the
/// nonsensical ones (a finished attempt back to `running`) keeps the rollout machine sound.
pub fn check_attempt_transition(attempt: &Attempt, to: AttemptStatus) -> Result<(), StoreError> {
    use AttemptStatus as A;
    let from = attempt.status;
    let allowed = from == to
        || match (from, to) {
            (_, A::Preparing) => false,
            (A::Preparing, _) => true,
            (A::Running, _) => true,
            (A::Unresponsive, _) => true,
            (A::Timeout, A::Succeeded | A::Failed) => true,
            (A::Failed, A::Succeeded) => true,
            _ => false,
        };
    if allowed {
        return Ok(());
    }
    let reason = match (from, to) {
        (_, A::Preparing) => "only a new attempt starts in `preparing`",
        (A::Succeeded, _) => "`succeeded` is final",
        _ => "a finished attempt may only report a late `succeeded` (or `failed` after `timeout`)",
    };
    Err(StoreError::InvalidTransition {
        kind: EntityKind::Attempt,
        id: attempt.attempt_id.clone(),
        from: from.to_string(),
        to: to.to_string(),
        reason: reason.to_string(),
    })
}

/// Whether `update_rollout` may set a rollout's status from `from` to `to`. Same → same is
/// always allowed. Otherwise:
///
/// * `preparing`/`running` are reachable only from `preparing`/`running`: an attempt must
///   exist, and only dequeue, `start_rollout` and `start_attempt` create attempts;
/// * a finished rollout (`succeeded`/`failed`/`cancelled`) may only be re-enqueued
///   (`queuing`/`requeuing`, an explicit retry); its result is never rewritten by hand;
/// * an unfinished rollout may move to any other status allowed above (cancel, fail, …).
///
/// Agent Lightning v0.3.0 accepts every value here (§4.1, "any → X").
pub fn check_rollout_transition(rollout: &Rollout, to: RolloutStatus) -> Result<(), StoreError> {
    let from = rollout.status;
    if from == to {
        return Ok(());
    }
    let refusal = if to.is_running() && !from.is_running() {
        Some("`preparing`/`running` need an attempt: use dequeue or start_attempt")
    } else if from.is_finished() && !to.is_queuing() {
        Some("a finished rollout can only be re-enqueued (`queuing`/`requeuing`)")
    } else {
        None
    };
    match refusal {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidTransition {
            kind: EntityKind::Rollout,
            id: rollout.rollout_id.clone(),
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_string(),
        }),
    }
}

/// What an attempt update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptChange {
    /// The attempt's status changed.
    pub status_changed: bool,
    /// What happened to the rollout.
    pub rollout: RolloutChange,
    /// The backend must run [`sync_worker`] for the attempt's worker (if it has one).
    pub sync_worker: bool,
}

fn object_or_invalid(field: &str, value: &Value) -> Result<Map<String, Value>, StoreError> {
    match value {
        Value::Object(map) => Ok(map.clone()),
        Value::Null => Err(StoreError::Invalid(format!(
            "{field} is invalid; it cannot be a null value."
        ))),
        other => Err(StoreError::Invalid(format!(
            "{field} must be a JSON object, got {other}"
        ))),
    }
}

/// Applies `update_attempt` (§4.2, §4.3): present fields are written; a present status goes
/// through [`set_attempt_status`] and, if the attempt is the latest and its status changed,
/// through [`propagate`]. A present `status` or `worker_id` asks for a worker sync. Nothing is
/// modified when the update is invalid (`metadata` not an object).
pub fn apply_attempt_update(
    rollout: &mut Rollout,
    attempt: &mut Attempt,
    is_latest: bool,
    update: &AttemptUpdate,
    now: f64,
) -> Result<AttemptChange, StoreError> {
    let metadata = match &update.metadata {
        Some(v) => Some(object_or_invalid("metadata", v)?),
        None => None,
    };
    if let Some(status) = update.status {
        check_attempt_transition(attempt, status)?;
    }
    if let Some(worker_id) = &update.worker_id {
        attempt.worker_id = Some(worker_id.clone());
    }
    if let Some(t) = update.last_heartbeat_time {
        attempt.last_heartbeat_time = Some(t);
    }
    if metadata.is_some() {
        attempt.metadata = metadata;
    }
    let status_changed = match update.status {
        Some(status) => set_attempt_status(attempt, status, now),
        None => false,
    };
    let rollout_change = if is_latest && status_changed {
        propagate(rollout, attempt, now)
    } else {
        RolloutChange::unchanged(rollout.status)
    };
    Ok(AttemptChange {
        status_changed,
        rollout: rollout_change,
        sync_worker: update.status.is_some() || update.worker_id.is_some(),
    })
}

/// Applies `update_rollout` (§4.1 last row, §5.6): present fields are written (`metadata:
/// null` clears, `config` replaces the whole config); a present `status` goes through
/// [`set_rollout_status`] and `queuing`/`requeuing` always asks for a requeue (the backend
/// skips it when the rollout is already in the queue). Nothing is modified when the update is
/// invalid.
pub fn apply_rollout_update(
    rollout: &mut Rollout,
    update: RolloutUpdate,
    now: f64,
) -> Result<RolloutChange, StoreError> {
    if let Some(config) = &update.config {
        config
            .validate()
            .map_err(|e| StoreError::Invalid(format!("rollout config: {e}")))?;
    }
    let metadata = match &update.metadata {
        Some(Value::Null) => Some(None),
        Some(v) => Some(Some(object_or_invalid("metadata", v)?)),
        None => None,
    };
    if let Some(status) = update.status {
        check_rollout_transition(rollout, status)?;
    }
    if let Some(input) = update.input {
        rollout.input = input;
    }
    if let Some(mode) = update.mode {
        rollout.mode = mode;
    }
    if let Some(resources_id) = update.resources_id {
        rollout.resources_id = resources_id;
    }
    if let Some(config) = update.config {
        rollout.config = config;
    }
    if let Some(metadata) = metadata {
        rollout.metadata = metadata;
    }
    Ok(match update.status {
        Some(status) => {
            let mut change = set_rollout_status(rollout, status, now);
            change.requeue = status.is_queuing();
            change
        }
        None => RolloutChange::unchanged(rollout.status),
    })
}

// ---------------------------------------------------------------------------------------------
// Spans (§4.2 span row, §4.7, §4.8)
// ---------------------------------------------------------------------------------------------

/// Issues the next sequence id from a per-rollout counter (the first issued value is 1).
pub fn issue_sequence_id(counter: &mut i64) -> i64 {
    *counter = counter.saturating_add(1);
    *counter
}

/// Refuses a block of zero sequence ids ([`StoreError::Invalid`]).
pub fn check_sequence_block(count: u32) -> Result<(), StoreError> {
    if count == 0 {
        return Err(StoreError::Invalid(
            "count of sequence ids must be at least 1".into(),
        ));
    }
    Ok(())
}

/// Issues `count` consecutive ids from a per-rollout counter at once and returns the first
/// (`count` ≥ 1; the ids are `first .. first + count`). Same result as `count` calls of
/// [`issue_sequence_id`].
pub fn issue_sequence_ids(counter: &mut i64, count: u32) -> i64 {
    let first = counter.saturating_add(1);
    *counter = counter.saturating_add(i64::from(count.max(1)));
    first
}

/// One block of fresh sequence ids asked for by [`fresh_id_blocks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreshIdBlock {
    /// The rollout whose counter issues the block.
    pub rollout_id: String,
    /// The attempt of the first span asking for an id (what `get_next_span_sequence_ids` is
    /// given).
    pub attempt_id: String,
    /// Ids wanted (≥ 1).
    pub count: u32,
}

/// The blocks [`crate::LightningStore::add_spans_with_fresh_ids`] issues: one per rollout that
/// has spans asking for a fresh id (`true`), in order of first appearance, as OTLP ingest asks
/// for them (one block per rollout, §6.2).
pub fn fresh_id_blocks(spans: &[(Span, bool)]) -> Vec<FreshIdBlock> {
    let mut blocks: Vec<FreshIdBlock> = Vec::new();
    for (span, _) in spans.iter().filter(|(_, fresh)| *fresh) {
        match blocks.iter_mut().find(|b| b.rollout_id == span.rollout_id) {
            Some(b) => b.count = b.count.saturating_add(1),
            None => blocks.push(FreshIdBlock {
                rollout_id: span.rollout_id.clone(),
                attempt_id: span.attempt_id.clone(),
                count: 1,
            }),
        }
    }
    blocks
}

/// Gives every span asking for a fresh id (`true`) the next id of its rollout's block, in span
/// order (`firsts[i]` is the first id of `blocks[i]`); the other spans keep theirs.
pub fn number_fresh_spans(
    spans: Vec<(Span, bool)>,
    blocks: &[FreshIdBlock],
    firsts: &[i64],
) -> Result<Vec<Span>, StoreError> {
    let mut next: Vec<i64> = firsts.to_vec();
    spans
        .into_iter()
        .map(|(mut span, fresh)| {
            if fresh {
                let slot = blocks
                    .iter()
                    .position(|b| b.rollout_id == span.rollout_id)
                    .and_then(|i| next.get_mut(i))
                    .ok_or_else(|| {
                        StoreError::Backend(format!(
                            "no block of sequence ids was issued for rollout `{}`",
                            span.rollout_id
                        ))
                    })?;
                span.sequence_id = *slot;
                *slot = slot.saturating_add(1);
            }
            Ok(span)
        })
        .collect()
}

/// Raises a per-rollout counter to a client-supplied sequence id (`max(counter, supplied)`).
/// Backends call this **before** the existence and duplicate checks of the span.
pub fn observe_sequence_id(counter: &mut i64, supplied: i64) {
    if supplied > *counter {
        *counter = supplied;
    }
}

/// Checks that a span's rollout and attempt exist (§4.8), naming the missing one.
pub fn require_span_target(
    span: &Span,
    rollout_found: bool,
    attempt_found: bool,
) -> Result<(), StoreError> {
    if !rollout_found {
        return Err(StoreError::rollout_not_found(&span.rollout_id));
    }
    if !attempt_found {
        return Err(StoreError::attempt_not_found(&span.attempt_id));
    }
    Ok(())
}

/// What storing a span did to its attempt and rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanEffect {
    /// The attempt moved from `preparing`/`unresponsive` to `running`.
    pub attempt_revived: bool,
    /// What happened to the rollout.
    pub rollout: RolloutChange,
}

/// Applies a newly stored (non-duplicate) span to its attempt and rollout: the attempt
/// heartbeat is set to `now` whatever its status; a `preparing`/`unresponsive` attempt becomes
/// `running`; if it is the latest attempt, a `preparing` rollout becomes `running`, and a
/// `requeuing` one too but only when the attempt was just revived (Q5).
pub fn record_span(
    rollout: &mut Rollout,
    attempt: &mut Attempt,
    is_latest: bool,
    now: f64,
) -> SpanEffect {
    attempt.last_heartbeat_time = Some(now);
    let attempt_revived = matches!(
        attempt.status,
        AttemptStatus::Preparing | AttemptStatus::Unresponsive
    ) && set_attempt_status(attempt, AttemptStatus::Running, now);
    let promote = is_latest
        && (rollout.status == RolloutStatus::Preparing
            || (rollout.status == RolloutStatus::Requeuing && attempt_revived));
    let rollout_change = if promote {
        set_rollout_status(rollout, RolloutStatus::Running, now)
    } else {
        RolloutChange::unchanged(rollout.status)
    };
    SpanEffect {
        attempt_revived,
        rollout: rollout_change,
    }
}

/// Whether an `attempt_id` argument selects the latest attempt (`"latest"`).
pub fn is_latest_selector(attempt_id: &str) -> bool {
    attempt_id == LATEST
}

// ---------------------------------------------------------------------------------------------
// Workers (§4.4)
// ---------------------------------------------------------------------------------------------

/// Synchronises a worker with the attempt it executes: `succeeded`/`failed` → `idle`;
/// `timeout`/`unresponsive` → `unknown` (both set `last_idle_time = now` and clear the current
/// ids); anything else → `busy` with `last_busy_time = now` and the current ids set.
pub fn sync_worker(worker: &mut Worker, attempt: &Attempt, now: f64) {
    match attempt.status {
        AttemptStatus::Succeeded | AttemptStatus::Failed => {
            worker.status = WorkerStatus::Idle;
            worker.last_idle_time = Some(now);
            worker.current_rollout_id = None;
            worker.current_attempt_id = None;
        }
        AttemptStatus::Timeout | AttemptStatus::Unresponsive => {
            worker.status = WorkerStatus::Unknown;
            worker.last_idle_time = Some(now);
            worker.current_rollout_id = None;
            worker.current_attempt_id = None;
        }
        AttemptStatus::Preparing | AttemptStatus::Running => {
            worker.status = WorkerStatus::Busy;
            worker.last_busy_time = Some(now);
            worker.current_rollout_id = Some(attempt.rollout_id.clone());
            worker.current_attempt_id = Some(attempt.attempt_id.clone());
        }
    }
}

/// A dequeue by this worker returned an attempt: `last_dequeue_time = now` (call together with
/// [`sync_worker`]).
pub fn worker_dequeued(worker: &mut Worker, now: f64) {
    worker.last_dequeue_time = Some(now);
}

/// A dequeue by this worker found nothing: the worker becomes `idle` (setting
/// `last_idle_time` and clearing its current ids) unless it already is; `last_dequeue_time =
/// now` in every case.
pub fn worker_found_nothing(worker: &mut Worker, now: f64) {
    if worker.status != WorkerStatus::Idle {
        worker.status = WorkerStatus::Idle;
        worker.last_idle_time = Some(now);
        worker.current_rollout_id = None;
        worker.current_attempt_id = None;
    }
    worker.last_dequeue_time = Some(now);
}

/// Checks `heartbeat_stats` of `update_worker`: when present it must be a JSON object.
pub fn validate_heartbeat_stats(heartbeat_stats: Option<&Value>) -> Result<(), StoreError> {
    if let Some(stats) = heartbeat_stats {
        object_or_invalid("heartbeat_stats", stats)?;
    }
    Ok(())
}

/// Records a worker heartbeat (`update_worker`): `last_heartbeat_time = now` and, when given,
/// replaces `heartbeat_stats` (checked by [`validate_heartbeat_stats`]). Never changes the
/// status.
pub fn worker_heartbeat(
    worker: &mut Worker,
    heartbeat_stats: Option<Value>,
    now: f64,
) -> Result<(), StoreError> {
    validate_heartbeat_stats(heartbeat_stats.as_ref())?;
    worker.last_heartbeat_time = Some(now);
    if heartbeat_stats.is_some() {
        worker.heartbeat_stats = heartbeat_stats;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Watchdog (§4.5)
// ---------------------------------------------------------------------------------------------

/// Whether the watchdog must look at this rollout at all: it is `preparing`/`running` and has
/// `timeout_seconds` or `unresponsive_seconds` configured. Backends may index such rollouts.
pub fn is_watched(rollout: &Rollout) -> bool {
    rollout.status.is_running()
        && (rollout.config.timeout_seconds.is_some()
            || rollout.config.unresponsive_seconds.is_some())
}

/// The watchdog verdict for a rollout and its **latest** attempt, first matching rule wins:
/// 1. `timeout_seconds` set and `now − attempt.start_time > timeout_seconds` → `timeout`;
/// 2. `unresponsive_seconds` set, a heartbeat, and `now − last_heartbeat_time >
///    unresponsive_seconds` → `unresponsive`;
/// 3. `unresponsive_seconds` set, no heartbeat, and `now − attempt.start_time >
///    unresponsive_seconds` → `unresponsive`.
///
/// `None` when the rollout is not `preparing`/`running`, the attempt is finished, or the
/// verdict equals the attempt's current status.
pub fn watchdog_verdict(rollout: &Rollout, attempt: &Attempt, now: f64) -> Option<AttemptStatus> {
    if !rollout.status.is_running() || attempt.status.is_finished() {
        return None;
    }
    let config = &rollout.config;
    let verdict = if config
        .timeout_seconds
        .is_some_and(|t| now - attempt.start_time > t)
    {
        Some(AttemptStatus::Timeout)
    } else if let Some(u) = config.unresponsive_seconds {
        let since = attempt.last_heartbeat_time.unwrap_or(attempt.start_time);
        (now - since > u).then_some(AttemptStatus::Unresponsive)
    } else {
        None
    };
    verdict.filter(|v| *v != attempt.status)
}

/// The earliest Unix time at which [`watchdog_verdict`] could return a verdict for this
/// rollout and attempt if nothing else happens, or `None` if it never will. Backends use it
/// to wake waiters when a timeout falls due.
pub fn watchdog_deadline(rollout: &Rollout, attempt: &Attempt) -> Option<f64> {
    if !rollout.status.is_running() || attempt.status.is_finished() {
        return None;
    }
    let config = &rollout.config;
    let timeout = config.timeout_seconds.map(|t| attempt.start_time + t);
    let unresponsive = if attempt.status == AttemptStatus::Unresponsive {
        None
    } else {
        config
            .unresponsive_seconds
            .map(|u| attempt.last_heartbeat_time.unwrap_or(attempt.start_time) + u)
    };
    match (timeout, unresponsive) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs the watchdog on a rollout and its latest attempt: on a verdict the attempt status is
/// set ([`set_attempt_status`]), the rollout is propagated ([`propagate`]) and the backend
/// must sync the worker (it becomes `unknown`). `None` when there is no verdict.
pub fn apply_watchdog(
    rollout: &mut Rollout,
    attempt: &mut Attempt,
    now: f64,
) -> Option<AttemptChange> {
    let verdict = watchdog_verdict(rollout, attempt, now)?;
    let status_changed = set_attempt_status(attempt, verdict, now);
    let rollout_change = propagate(rollout, attempt, now);
    Some(AttemptChange {
        status_changed,
        rollout: rollout_change,
        sync_worker: true,
    })
}

/// Debounce of the lazy watchdog scan: the first call scans, later calls scan only when
/// `debounce_seconds` have passed since the last scan (`0` = every call).
#[derive(Debug, Clone, PartialEq)]
pub struct ScanDebounce {
    debounce_seconds: f64,
    last_scan: Option<f64>,
}

impl ScanDebounce {
    /// A debounce of `debounce_seconds` (negative values count as 0; `f64::INFINITY` turns the
    /// lazy scan off entirely, for read-only inspection of a store).
    pub fn new(debounce_seconds: f64) -> Self {
        ScanDebounce {
            debounce_seconds: debounce_seconds.max(0.0),
            last_scan: None,
        }
    }

    /// The configured debounce, in seconds.
    pub fn debounce_seconds(&self) -> f64 {
        self.debounce_seconds
    }

    /// Whether a scan is due at `now`; if so, records `now` as the last scan.
    pub fn should_scan(&mut self, now: f64) -> bool {
        if self.debounce_seconds.is_infinite() {
            return false;
        }
        let due = match self.last_scan {
            None => true,
            Some(last) => now - last >= self.debounce_seconds,
        };
        if due {
            self.last_scan = Some(now);
        }
        due
    }

    /// The earliest Unix time at which the next scan may run.
    pub fn next_scan_at(&self) -> f64 {
        if self.debounce_seconds.is_infinite() {
            return f64::INFINITY;
        }
        match self.last_scan {
            None => f64::NEG_INFINITY,
            Some(last) => last + self.debounce_seconds,
        }
    }
}

impl Default for ScanDebounce {
    fn default() -> Self {
        ScanDebounce::new(DEFAULT_SCAN_DEBOUNCE_SECONDS)
    }
}

// ---------------------------------------------------------------------------------------------
// Resources (§5.2 #20, #22; Q24, Q25, Q33)
// ---------------------------------------------------------------------------------------------

/// Checks a client-chosen resources id: it must be non-empty and not the reserved `"latest"`.
pub fn validate_resources_id(resources_id: &str) -> Result<(), StoreError> {
    if resources_id.is_empty() {
        return Err(StoreError::Invalid(
            "resources_id must not be empty".to_string(),
        ));
    }
    if resources_id == LATEST {
        return Err(StoreError::Invalid(
            "resources_id `latest` is reserved (GET /resources/latest)".to_string(),
        ));
    }
    Ok(())
}

/// A new resources set: `version = 1`, `create_time = update_time = now`.
pub fn new_resources(resources_id: String, resources: NamedResources, now: f64) -> ResourcesUpdate {
    ResourcesUpdate {
        resources_id,
        create_time: now,
        update_time: now,
        version: 1,
        resources,
    }
}

/// Replaces the resources of an existing id: `version + 1`, `update_time = now`.
pub fn replace_resources(existing: &mut ResourcesUpdate, resources: NamedResources, now: f64) {
    existing.resources = resources;
    existing.version = existing.version.saturating_add(1);
    existing.update_time = now;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rollout(config: RolloutConfig) -> Rollout {
        let req = EnqueueRolloutRequest {
            config: Some(config),
            ..EnqueueRolloutRequest::new(json!("task"))
        };
        new_rollout(req, "ro-1".into(), Some("rs-1"), 100.0).unwrap()
    }

    fn retrying(max_attempts: u32, on: &[AttemptStatus]) -> RolloutConfig {
        RolloutConfig {
            max_attempts,
            retry_condition: on.to_vec(),
            ..RolloutConfig::default()
        }
    }

    #[test]
    fn new_rollout_applies_defaults() {
        let r = rollout(RolloutConfig::default());
        assert_eq!(r.status, RolloutStatus::Queuing);
        assert_eq!(r.metadata, Some(Map::new()));
        assert_eq!(r.resources_id.as_deref(), Some("rs-1"));
        assert_eq!(r.start_time, 100.0);
        let bad = EnqueueRolloutRequest {
            config: Some(retrying(0, &[])),
            ..EnqueueRolloutRequest::new(json!(1))
        };
        let err = new_rollout(bad, "ro-2".into(), None, 1.0).unwrap_err();
        assert!(err.to_string().contains("max_attempts"), "{err}");
    }

    #[test]
    fn propagation_table_with_retries() {
        let cfg = retrying(2, &[AttemptStatus::Failed, AttemptStatus::Timeout]);
        let mut r = rollout(cfg.clone());
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 101.0);
        for (status, expected) in [
            (AttemptStatus::Running, RolloutStatus::Running),
            (AttemptStatus::Succeeded, RolloutStatus::Succeeded),
            (AttemptStatus::Failed, RolloutStatus::Requeuing),
            (AttemptStatus::Timeout, RolloutStatus::Requeuing),
            (AttemptStatus::Unresponsive, RolloutStatus::Failed),
        ] {
            a.status = status;
            assert_eq!(rollout_status_for(&cfg, &a), expected, "{status}");
        }
        a.sequence_id = 2;
        a.status = AttemptStatus::Failed;
        assert_eq!(rollout_status_for(&cfg, &a), RolloutStatus::Failed);
    }

    #[test]
    fn attempt_update_propagates_only_on_status_change_of_latest() {
        let mut r = rollout(retrying(2, &[AttemptStatus::Failed]));
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), Some("w".into()), 101.0);
        let fail = AttemptUpdate {
            status: Some(AttemptStatus::Failed),
            ..AttemptUpdate::default()
        };
        // Not the latest attempt: no propagation.
        let c = apply_attempt_update(&mut r, &mut a, false, &fail, 102.0).unwrap();
        assert!(c.status_changed && !c.rollout.changed());
        assert_eq!(r.status, RolloutStatus::Preparing);
        assert_eq!(a.end_time, Some(102.0));

        a.status = AttemptStatus::Running;
        let c = apply_attempt_update(&mut r, &mut a, true, &fail, 103.0).unwrap();
        assert_eq!(r.status, RolloutStatus::Requeuing);
        assert!(c.rollout.requeue && c.sync_worker);

        // Same status again: nothing propagates.
        r.status = RolloutStatus::Running;
        let c = apply_attempt_update(&mut r, &mut a, true, &fail, 104.0).unwrap();
        assert!(!c.status_changed);
        assert_eq!(r.status, RolloutStatus::Running);
    }

    #[test]
    fn terminal_rollouts_are_protected_from_propagation() {
        let mut r = rollout(retrying(3, &[AttemptStatus::Failed]));
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 1.0);
        // Cancelled is never changed by propagation, metadata-only or not.
        r.status = RolloutStatus::Cancelled;
        let meta = AttemptUpdate {
            metadata: Some(json!({"k": 1})),
            ..AttemptUpdate::default()
        };
        apply_attempt_update(&mut r, &mut a, true, &meta, 2.0).unwrap();
        let ok = AttemptUpdate {
            status: Some(AttemptStatus::Succeeded),
            ..AttemptUpdate::default()
        };
        apply_attempt_update(&mut r, &mut a, true, &ok, 2.0).unwrap();
        assert_eq!(r.status, RolloutStatus::Cancelled);
        assert_eq!(
            a.metadata,
            Some(json!({"k": 1}).as_object().unwrap().clone())
        );

        // A succeeded attempt is final: the transition is refused and nothing changes.
        let running = AttemptUpdate {
            status: Some(AttemptStatus::Running),
            ..AttemptUpdate::default()
        };
        let err = apply_attempt_update(&mut r, &mut a, true, &running, 3.0).unwrap_err();
        assert!(
            err.to_string().contains("from `succeeded` to `running`"),
            "{err}"
        );
        assert_eq!(a.status, AttemptStatus::Succeeded);

        // A finished rollout is not revived by a late non-final status …
        let (mut a, _) = begin_attempt(&mut r, 1, "at-2".into(), None, 3.0);
        r.status = RolloutStatus::Failed;
        r.end_time = Some(3.0);
        apply_attempt_update(&mut r, &mut a, true, &running, 4.0).unwrap();
        assert_eq!(r.status, RolloutStatus::Failed);
        // … nor requeued by a late retryable failure …
        let failed = AttemptUpdate {
            status: Some(AttemptStatus::Failed),
            ..AttemptUpdate::default()
        };
        apply_attempt_update(&mut r, &mut a, true, &failed, 5.0).unwrap();
        assert_eq!(r.status, RolloutStatus::Failed);
        // … but a late success is kept.
        apply_attempt_update(&mut r, &mut a, true, &ok, 6.0).unwrap();
        assert_eq!(r.status, RolloutStatus::Succeeded);
        assert_eq!(r.end_time, Some(6.0));
    }

    #[test]
    fn invalid_attempt_update_changes_nothing() {
        let mut r = rollout(RolloutConfig::default());
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 1.0);
        let before = a.clone();
        for bad in [json!(null), json!([1])] {
            let u = AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                metadata: Some(bad),
                ..AttemptUpdate::default()
            };
            let err = apply_attempt_update(&mut r, &mut a, true, &u, 2.0).unwrap_err();
            assert!(err.to_string().contains("metadata"), "{err}");
        }
        assert_eq!(a, before);
        assert_eq!(r.status, RolloutStatus::Preparing);
    }

    #[test]
    fn rollout_update_end_time_and_requeue() {
        let mut r = rollout(RolloutConfig::default());
        let c = apply_rollout_update(
            &mut r,
            RolloutUpdate {
                status: Some(RolloutStatus::Cancelled),
                metadata: Some(Value::Null),
                mode: Some(None),
                ..RolloutUpdate::default()
            },
            5.0,
        )
        .unwrap();
        assert!(c.became_finished());
        assert_eq!(r.end_time, Some(5.0));
        assert_eq!(r.metadata, None);
        let c = apply_rollout_update(
            &mut r,
            RolloutUpdate {
                status: Some(RolloutStatus::Queuing),
                ..RolloutUpdate::default()
            },
            6.0,
        )
        .unwrap();
        assert!(c.requeue);
        assert_eq!(
            r.end_time, None,
            "leaving a terminal status clears end_time (Q7)"
        );
        let err = apply_rollout_update(
            &mut r,
            RolloutUpdate {
                config: Some(retrying(0, &[])),
                status: Some(RolloutStatus::Failed),
                ..RolloutUpdate::default()
            },
            7.0,
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)));
        assert_eq!(r.status, RolloutStatus::Queuing);
    }

    #[test]
    fn spans_revive_attempts_and_promote_rollouts() {
        let mut r = rollout(RolloutConfig::default());
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 1.0);
        let e = record_span(&mut r, &mut a, true, 2.0);
        assert!(e.attempt_revived);
        assert_eq!(
            (a.status, r.status),
            (AttemptStatus::Running, RolloutStatus::Running)
        );
        assert_eq!(a.last_heartbeat_time, Some(2.0));

        // Q5: a late span of a failed attempt does not pull a requeuing rollout to running.
        a.status = AttemptStatus::Failed;
        r.status = RolloutStatus::Requeuing;
        let e = record_span(&mut r, &mut a, true, 3.0);
        assert!(!e.attempt_revived);
        assert_eq!(
            (a.status, r.status),
            (AttemptStatus::Failed, RolloutStatus::Requeuing)
        );
        assert_eq!(a.last_heartbeat_time, Some(3.0));

        // An unresponsive attempt that comes back recovers its rollout.
        a.status = AttemptStatus::Unresponsive;
        record_span(&mut r, &mut a, true, 4.0);
        assert_eq!(
            (a.status, r.status),
            (AttemptStatus::Running, RolloutStatus::Running)
        );

        // Q4: a queuing rollout is never promoted.
        r.status = RolloutStatus::Queuing;
        a.status = AttemptStatus::Preparing;
        record_span(&mut r, &mut a, true, 5.0);
        assert_eq!(r.status, RolloutStatus::Queuing);
    }

    #[test]
    fn watchdog_rules_in_order() {
        let cfg = RolloutConfig {
            timeout_seconds: Some(10.0),
            unresponsive_seconds: Some(3.0),
            ..RolloutConfig::default()
        };
        let mut r = rollout(cfg);
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 100.0);
        assert_eq!(watchdog_deadline(&r, &a), Some(103.0));
        assert_eq!(watchdog_verdict(&r, &a, 103.0), None);
        // Rule 3: no heartbeat since start.
        assert_eq!(
            watchdog_verdict(&r, &a, 103.5),
            Some(AttemptStatus::Unresponsive)
        );
        // Rule 2: measured from the heartbeat.
        a.last_heartbeat_time = Some(105.0);
        assert_eq!(watchdog_verdict(&r, &a, 107.0), None);
        assert_eq!(
            watchdog_verdict(&r, &a, 108.5),
            Some(AttemptStatus::Unresponsive)
        );
        // Rule 1 wins once the attempt is older than timeout_seconds, even with heartbeats.
        a.last_heartbeat_time = Some(110.0);
        assert_eq!(
            watchdog_verdict(&r, &a, 110.5),
            Some(AttemptStatus::Timeout)
        );
        let c = apply_watchdog(&mut r, &mut a, 110.5).unwrap();
        assert!(c.sync_worker && c.status_changed);
        assert_eq!(a.end_time, Some(110.5), "timeout is final (Q8)");
        assert_eq!(r.status, RolloutStatus::Failed);
        assert_eq!(watchdog_verdict(&r, &a, 200.0), None);
    }

    #[test]
    fn unresponsive_keeps_end_time_null() {
        let cfg = RolloutConfig {
            unresponsive_seconds: Some(1.0),
            ..RolloutConfig::default()
        };
        let mut r = rollout(cfg);
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), None, 0.0);
        apply_watchdog(&mut r, &mut a, 5.0).unwrap();
        assert_eq!(a.status, AttemptStatus::Unresponsive);
        assert_eq!(a.end_time, None);
        assert_eq!(r.status, RolloutStatus::Failed);
    }

    #[test]
    fn debounce() {
        let mut d = ScanDebounce::new(10.0);
        assert!(d.should_scan(0.0));
        assert!(!d.should_scan(5.0));
        assert_eq!(d.next_scan_at(), 10.0);
        assert!(d.should_scan(10.0));
        let mut zero = ScanDebounce::new(0.0);
        assert!(zero.should_scan(1.0) && zero.should_scan(1.0));
        let mut off = ScanDebounce::new(f64::INFINITY);
        assert!(
            !off.should_scan(0.0),
            "an infinite debounce never scans, not even first"
        );
        assert_eq!(off.next_scan_at(), f64::INFINITY);
    }

    #[test]
    fn workers_follow_their_attempts() {
        let mut r = rollout(RolloutConfig::default());
        let (mut a, _) = begin_attempt(&mut r, 0, "at-1".into(), Some("w".into()), 1.0);
        let mut w = Worker::new("w");
        sync_worker(&mut w, &a, 2.0);
        assert_eq!(w.status, WorkerStatus::Busy);
        assert_eq!(w.current_attempt_id.as_deref(), Some("at-1"));
        a.status = AttemptStatus::Timeout;
        sync_worker(&mut w, &a, 3.0);
        assert_eq!(
            (w.status, w.last_idle_time),
            (WorkerStatus::Unknown, Some(3.0))
        );
        assert_eq!(w.current_rollout_id, None);
        worker_found_nothing(&mut w, 4.0);
        assert_eq!(w.status, WorkerStatus::Idle);
        worker_found_nothing(&mut w, 5.0);
        assert_eq!(
            (w.last_idle_time, w.last_dequeue_time),
            (Some(4.0), Some(5.0))
        );
        worker_heartbeat(&mut w, None, 6.0).unwrap();
        assert_eq!(
            (w.status, w.last_heartbeat_time),
            (WorkerStatus::Idle, Some(6.0))
        );
        assert!(worker_heartbeat(&mut w, Some(json!(3)), 7.0).is_err());
        assert_eq!(w.last_heartbeat_time, Some(6.0));
    }

    #[test]
    fn sequence_counter_and_resources() {
        let mut c = 0;
        assert_eq!(issue_sequence_id(&mut c), 1);
        observe_sequence_id(&mut c, 10);
        observe_sequence_id(&mut c, 4);
        assert_eq!(issue_sequence_id(&mut c), 11);

        assert!(validate_resources_id("latest").is_err());
        assert!(validate_resources_id("").is_err());
        assert!(validate_resources_id("v0").is_ok());
        let mut r = new_resources("v0".into(), NamedResources::new(), 1.0);
        replace_resources(&mut r, NamedResources::new(), 2.0);
        assert_eq!((r.version, r.create_time, r.update_time), (2, 1.0, 2.0));
    }
}
