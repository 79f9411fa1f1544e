//! A backend-independent conformance suite for [`LightningStore`] implementations.
//!
//! Responsible for checking the observable behaviour of §4 of the protocol reference (and the
//! deviations documented in [`crate::lifecycle`]) through the trait only, so the in-memory,
//! SQLite and HTTP-client backends can all run the same checks. Not responsible for creating
//! stores: every case expects a **fresh, empty store whose watchdog scan debounce is 0**.
//! Cases sleep for a few hundred milliseconds in total (real time) to let timeouts expire.
//!
//! Compiled with `cfg(test)` or the `conformance` feature. Cases return `Err(message)` instead
//! of panicking, so callers decide how to report (`run_all(...).await.unwrap()` in a test).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agl_core::semconv::AGL_ANNOTATION;
use agl_core::{
    AttemptStatus, Attributes, EnqueueRolloutRequest, NamedResources, Resource, RolloutConfig,
    RolloutMode, RolloutStatus, Span, WorkerStatus, find_final_reward, reward_attributes,
};
use serde_json::{Map, Value, json};

use crate::error::{EntityKind, StoreError};
use crate::query::RolloutQuery;
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate};

/// Outcome of one case: `Err` carries a message naming the failed expectation.
pub type CaseResult = Result<(), String>;

type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// A conformance case: an async function over a fresh store.
pub type CaseFn = for<'a> fn(&'a dyn LightningStore) -> CaseFuture<'a>;

trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for Result<T, StoreError> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: unexpected error: {e}"))
    }
}

impl<T> Ctx<T> for Option<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.ok_or_else(|| format!("{what}: got None"))
    }
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {{
        let ok: bool = $cond;
        if !ok {
            return Err(format!("line {}: {}", line!(), format!($($arg)+)));
        }
    }};
}

macro_rules! ensure_eq {
    ($actual:expr, $expected:expr, $what:expr) => {{
        let (actual, expected) = (&$actual, &$expected);
        if actual != expected {
            return Err(format!(
                "line {}: {}: expected {:?}, got {:?}",
                line!(),
                $what,
                expected,
                actual
            ));
        }
    }};
}

fn status(s: AttemptStatus) -> AttemptUpdate {
    AttemptUpdate {
        status: Some(s),
        ..AttemptUpdate::default()
    }
}

fn with_config(input: Value, config: RolloutConfig) -> EnqueueRolloutRequest {
    EnqueueRolloutRequest {
        config: Some(config),
        ..EnqueueRolloutRequest::new(input)
    }
}

fn retry(max_attempts: u32, on: &[AttemptStatus]) -> RolloutConfig {
    RolloutConfig {
        max_attempts,
        retry_condition: on.to_vec(),
        ..RolloutConfig::default()
    }
}

fn plain_span(rollout_id: &str, attempt_id: &str, sequence_id: i64, name: &str) -> Span {
    Span::new(rollout_id, attempt_id, sequence_id, name, Attributes::new())
}

async fn worker_status(
    store: &dyn LightningStore,
    worker_id: &str,
) -> Result<WorkerStatus, String> {
    let workers = store.list_workers().await.ctx("query_workers")?;
    workers
        .iter()
        .find(|w| w.worker_id == worker_id)
        .map(|w| w.status)
        .ok_or_else(|| format!("worker {worker_id} not listed"))
}

/// Names and functions of every case, in a stable order.
pub const CASES: &[(&str, CaseFn)] = &[
    ("happy_path", |s| Box::pin(happy_path(s))),
    ("retry_then_fail", |s| Box::pin(retry_then_fail(s))),
    ("timeout_watchdog", |s| Box::pin(timeout_watchdog(s))),
    ("unresponsive_recovers", |s| {
        Box::pin(unresponsive_recovers(s))
    }),
    ("wait_resolves_watchdog_timeouts", |s| {
        Box::pin(wait_resolves_watchdog_timeouts(s))
    }),
    ("duplicate_spans_dropped", |s| {
        Box::pin(duplicate_spans_dropped(s))
    }),
    ("sequence_ids", |s| Box::pin(sequence_ids(s))),
    ("span_for_unknown_target", |s| {
        Box::pin(span_for_unknown_target(s))
    }),
    ("resources_versions_and_latest", |s| {
        Box::pin(resources_versions_and_latest(s))
    }),
    ("wait_wakes_when_finished", |s| {
        Box::pin(wait_wakes_when_finished(s))
    }),
    ("wait_returns_at_timeout", |s| {
        Box::pin(wait_returns_at_timeout(s))
    }),
    ("workers_idle_busy", |s| Box::pin(workers_idle_busy(s))),
    ("update_rollout_requeues_and_end_time", |s| {
        Box::pin(update_rollout_requeues_and_end_time(s))
    }),
    ("start_rollout_and_start_attempt", |s| {
        Box::pin(start_rollout_and_start_attempt(s))
    }),
    ("terminal_rollouts_protected", |s| {
        Box::pin(terminal_rollouts_protected(s))
    }),
    ("query_spans_order_and_latest", |s| {
        Box::pin(query_spans_order_and_latest(s))
    }),
    ("query_rollouts_filters", |s| {
        Box::pin(query_rollouts_filters(s))
    }),
    ("stale_queue_entries_skipped", |s| {
        Box::pin(stale_queue_entries_skipped(s))
    }),
    ("older_attempt_does_not_propagate", |s| {
        Box::pin(older_attempt_does_not_propagate(s))
    }),
    ("statistics_counts", |s| Box::pin(statistics_counts(s))),
    ("invalid_inputs_rejected", |s| {
        Box::pin(invalid_inputs_rejected(s))
    }),
];

/// Runs every case, each on a fresh store from `make_store` (debounce 0), and reports the
/// first failure as `"<case>: <message>"`.
pub async fn run_all<F>(mut make_store: F) -> CaseResult
where
    F: FnMut() -> Box<dyn LightningStore>,
{
    for (name, case) in CASES {
        let store = make_store();
        case(store.as_ref())
            .await
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// enqueue → dequeue → span → running → succeeded (§4.1, §4.2, §4.4).
pub async fn happy_path(store: &dyn LightningStore) -> CaseResult {
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!({"q": 1})))
        .await
        .ctx("enqueue")?;
    ensure_eq!(r.status, RolloutStatus::Queuing, "enqueued status");
    ensure!(
        r.rollout_id.starts_with("ro-"),
        "rollout id {}",
        r.rollout_id
    );
    ensure_eq!(r.metadata, Some(Map::new()), "null metadata stored as {{}}");
    ensure_eq!(r.end_time, None, "end_time");
    let rid = r.rollout_id.clone();
    ensure!(
        store
            .get_latest_attempt(&rid)
            .await
            .ctx("latest")?
            .is_none(),
        "enqueue must not create an attempt"
    );

    let d = store
        .dequeue_rollout(Some("w1"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    ensure_eq!(d.rollout.rollout_id, rid, "dequeued rollout");
    ensure_eq!(
        d.rollout.status,
        RolloutStatus::Preparing,
        "rollout after dequeue"
    );
    ensure_eq!(d.attempt.sequence_id, 1, "attempt sequence");
    ensure_eq!(d.attempt.status, AttemptStatus::Preparing, "attempt status");
    ensure_eq!(d.attempt.worker_id.as_deref(), Some("w1"), "attempt worker");
    ensure!(
        d.attempt.attempt_id.starts_with("at-"),
        "attempt id {}",
        d.attempt.attempt_id
    );
    ensure_eq!(
        worker_status(store, "w1").await?,
        WorkerStatus::Busy,
        "worker after dequeue"
    );
    let aid = d.attempt.attempt_id.clone();

    let seq = store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .ctx("next seq")?;
    ensure_eq!(seq, 1, "first sequence id");
    let span = Span::new(
        &rid,
        &aid,
        seq,
        AGL_ANNOTATION,
        reward_attributes(&[("primary", 1.0)]),
    );
    let stored = store.add_span(span.clone()).await.ctx("add_span")?;
    ensure_eq!(stored, Some(span.clone()), "stored span echoed");

    let attempt = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        attempt.status,
        AttemptStatus::Running,
        "attempt after first span"
    );
    ensure!(
        attempt.last_heartbeat_time.is_some(),
        "span must record a heartbeat"
    );
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Running,
        "rollout after first span"
    );

    let done = store
        .update_attempt(&rid, &aid, status(AttemptStatus::Succeeded))
        .await
        .ctx("update_attempt")?;
    ensure_eq!(done.status, AttemptStatus::Succeeded, "attempt status");
    ensure!(done.end_time.is_some(), "succeeded attempt needs end_time");
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(rollout.status, RolloutStatus::Succeeded, "rollout status");
    ensure!(
        rollout.end_time.is_some(),
        "succeeded rollout needs end_time"
    );
    ensure_eq!(
        worker_status(store, "w1").await?,
        WorkerStatus::Idle,
        "worker after success"
    );

    let finished = store
        .wait_for_rollouts(std::slice::from_ref(&rid), Some(Duration::ZERO))
        .await
        .ctx("wait")?;
    ensure_eq!(finished, vec![rollout], "wait result");
    let spans = store
        .list_spans(&rid, Some("latest"))
        .await
        .ctx("query_spans")?;
    ensure_eq!(spans, vec![span], "spans of the latest attempt");
    ensure_eq!(find_final_reward(&spans), Some(1.0), "final reward");
    ensure!(
        store
            .dequeue_rollout(Some("w1"))
            .await
            .ctx("dequeue")?
            .is_none(),
        "queue must be empty"
    );
    Ok(())
}

/// max_attempts 2, retry_condition [failed]: failed → requeuing → attempt 2 → failed (§4.3).
pub async fn retry_then_fail(store: &dyn LightningStore) -> CaseResult {
    let r = store
        .enqueue_rollout(with_config(json!("t"), retry(2, &[AttemptStatus::Failed])))
        .await
        .ctx("enqueue")?;
    let rid = r.rollout_id;
    let first = store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue 1")?;
    store
        .update_attempt(
            &rid,
            &first.attempt.attempt_id,
            status(AttemptStatus::Failed),
        )
        .await
        .ctx("fail 1")?;
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Requeuing,
        "after first failure"
    );
    ensure_eq!(rollout.end_time, None, "requeuing has no end_time");

    let second = store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue 2")?;
    ensure_eq!(
        second.rollout.rollout_id,
        rid,
        "requeued rollout dequeued again"
    );
    ensure_eq!(second.attempt.sequence_id, 2, "second attempt sequence");
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Failed))
        .await
        .ctx("fail 2")?;
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Failed,
        "after second failure"
    );
    ensure!(rollout.end_time.is_some(), "failed rollout needs end_time");
    ensure_eq!(
        store.list_attempts(&rid).await.ctx("attempts")?.len(),
        2,
        "attempt count"
    );
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "a failed rollout is not requeued"
    );
    Ok(())
}

/// timeout_seconds tiny: attempt 1 → timeout, requeuing, attempt 2 → timeout, failed (§4.5).
pub async fn timeout_watchdog(store: &dyn LightningStore) -> CaseResult {
    let config = RolloutConfig {
        timeout_seconds: Some(0.05),
        ..retry(2, &[AttemptStatus::Timeout, AttemptStatus::Failed])
    };
    let r = store
        .enqueue_rollout(with_config(json!("slow"), config))
        .await
        .ctx("enqueue")?;
    let rid = r.rollout_id;
    store
        .dequeue_rollout(Some("w1"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue 1")?;
    tokio::time::sleep(Duration::from_millis(150)).await;

    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Requeuing,
        "after first timeout"
    );
    let a1 = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(a1.status, AttemptStatus::Timeout, "attempt 1");
    ensure!(a1.end_time.is_some(), "timeout is final and sets end_time");
    ensure_eq!(
        worker_status(store, "w1").await?,
        WorkerStatus::Unknown,
        "worker after timeout"
    );

    let second = store
        .dequeue_rollout(Some("w2"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue 2")?;
    ensure_eq!(second.attempt.sequence_id, 2, "second attempt");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Failed,
        "after second timeout"
    );
    ensure!(rollout.end_time.is_some(), "failed rollout needs end_time");
    Ok(())
}

/// unresponsive_seconds tiny: attempt → unresponsive, rollout requeuing; a late span revives
/// both (Q5 recovery) and the stale queue entry is skipped.
pub async fn unresponsive_recovers(store: &dyn LightningStore) -> CaseResult {
    let config = RolloutConfig {
        unresponsive_seconds: Some(0.05),
        ..retry(2, &[AttemptStatus::Unresponsive])
    };
    let r = store
        .enqueue_rollout(with_config(json!("quiet"), config))
        .await
        .ctx("enqueue")?;
    let rid = r.rollout_id;
    let d = store
        .dequeue_rollout(Some("w1"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let aid = d.attempt.attempt_id;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        rollout.status,
        RolloutStatus::Requeuing,
        "after unresponsive"
    );
    let a = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(a.status, AttemptStatus::Unresponsive, "attempt");
    ensure_eq!(a.end_time, None, "unresponsive keeps end_time null");

    store
        .add_span(plain_span(&rid, &aid, 1, "late"))
        .await
        .ctx("add_span")?
        .ctx("late span stored")?;
    let a = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(a.status, AttemptStatus::Running, "revived attempt");
    let rollout = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(rollout.status, RolloutStatus::Running, "recovered rollout");
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "the recovered rollout must not be dispatched again"
    );
    Ok(())
}

/// A timeout that falls due while `wait_for_rollouts` waits is detected without other calls.
pub async fn wait_resolves_watchdog_timeouts(store: &dyn LightningStore) -> CaseResult {
    let config = RolloutConfig {
        timeout_seconds: Some(0.05),
        ..RolloutConfig::default()
    };
    let started = store
        .start_rollout(with_config(json!("x"), config), None)
        .await
        .ctx("start_rollout")?;
    let rid = started.rollout.rollout_id;
    let done = store
        .wait_for_rollouts(std::slice::from_ref(&rid), Some(Duration::from_secs(20)))
        .await
        .ctx("wait")?;
    ensure_eq!(done.len(), 1, "timed-out rollout returned by the wait");
    ensure_eq!(
        done[0].status,
        RolloutStatus::Failed,
        "status after timeout"
    );
    Ok(())
}

/// Duplicates by (rollout, attempt, span_id) are dropped; the issued id stays consumed (§4.8).
pub async fn duplicate_spans_dropped(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let seq = store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .ctx("seq")?;
    let span = plain_span(&rid, &aid, seq, "a");
    ensure!(
        store.add_span(span.clone()).await.ctx("add")?.is_some(),
        "first copy stored"
    );
    let seq2 = store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .ctx("seq")?;
    let mut dup = span.clone();
    dup.sequence_id = seq2;
    dup.name = "changed".into();
    ensure_eq!(
        store.add_span(dup).await.ctx("add dup")?,
        None,
        "duplicate result"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        seq2 + 1,
        "issued id of the dropped span stays consumed"
    );
    let spans = store.list_spans(&rid, None).await.ctx("query")?;
    ensure_eq!(spans, vec![span.clone()], "only the first copy is kept");

    // The same span_id under another attempt is a different span.
    let second = store.start_attempt(&rid, None).await.ctx("start_attempt")?;
    let mut other = span.clone();
    other.attempt_id = second.attempt.attempt_id.clone();
    ensure!(
        store.add_span(other).await.ctx("add")?.is_some(),
        "other attempt stored"
    );
    let batch = store
        .add_spans(vec![span.clone(), plain_span(&rid, &aid, 9, "b"), span])
        .await
        .ctx("add_spans")?;
    ensure_eq!(batch.len(), 1, "add_spans stores only the new span");
    ensure_eq!(
        store.statistics().await.ctx("stats")?.total_spans,
        3,
        "total_spans"
    );
    Ok(())
}

/// Sequence ids are per rollout: 1, 2, 3, raised by client-supplied ids, issued for unknown
/// rollouts too (§4.7, Q10).
pub async fn sequence_ids(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let mut issued = Vec::new();
    for _ in 0..3 {
        issued.push(
            store
                .get_next_span_sequence_id(&rid, &aid)
                .await
                .ctx("seq")?,
        );
    }
    ensure_eq!(issued, vec![1, 2, 3], "issued ids");
    store
        .add_span(plain_span(&rid, &aid, 10, "client-numbered"))
        .await
        .ctx("add")?;
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        11,
        "counter raised to the supplied id"
    );
    // Attempts share the rollout's counter.
    let second = store.start_attempt(&rid, None).await.ctx("start_attempt")?;
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &second.attempt.attempt_id)
            .await
            .ctx("seq")?,
        12,
        "counter is per rollout, not per attempt"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-unknown", "at-x")
            .await
            .ctx("seq")?,
        1,
        "unknown rollout"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-unknown", "at-x")
            .await
            .ctx("seq")?,
        2,
        "unknown rollout"
    );
    // The counter is raised before the existence check.
    let missing = store
        .add_span(plain_span("ro-missing", "at-x", 5, "x"))
        .await;
    ensure!(missing.is_err(), "span for a missing rollout must fail");
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-missing", "at-x")
            .await
            .ctx("seq")?,
        6,
        "counter raised even though the span was refused"
    );
    Ok(())
}

/// Spans for unknown rollouts or attempts → NotFound; a failing batch stores nothing.
pub async fn span_for_unknown_target(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    match store.add_span(plain_span("ro-nope", &aid, 1, "x")).await {
        Err(StoreError::NotFound {
            kind: EntityKind::Rollout,
            id,
        }) => ensure_eq!(id, "ro-nope".to_string(), "missing rollout id"),
        other => return Err(format!("unknown rollout: expected NotFound, got {other:?}")),
    }
    match store.add_span(plain_span(&rid, "at-nope", 1, "x")).await {
        Err(StoreError::NotFound {
            kind: EntityKind::Attempt,
            id,
        }) => ensure!(id.contains("at-nope"), "error names the attempt: {id}"),
        other => return Err(format!("unknown attempt: expected NotFound, got {other:?}")),
    }
    let batch = store
        .add_spans(vec![
            plain_span(&rid, &aid, 1, "good"),
            plain_span(&rid, "at-nope", 2, "bad"),
        ])
        .await;
    ensure!(batch.is_err(), "batch with an unknown attempt must fail");
    ensure!(
        store.list_spans(&rid, None).await.ctx("query")?.is_empty(),
        "a failed batch stores nothing"
    );
    let a = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        a.status,
        AttemptStatus::Preparing,
        "a failed batch changes nothing"
    );
    Ok(())
}

fn llm(endpoint: &str) -> NamedResources {
    let resource: Resource = match serde_json::from_value(json!({
        "resource_type": "llm", "endpoint": endpoint, "model": "m"
    })) {
        Ok(r) => r,
        Err(_) => return NamedResources::new(),
    };
    NamedResources::from([("main_llm".to_string(), resource)])
}

/// Resources: add → version 1 and latest; upsert by id → +1; unknown id created; enqueue
/// resolves `resources_id: null` to the latest (§4.1, Q24, Q25, Q33).
pub async fn resources_versions_and_latest(store: &dyn LightningStore) -> CaseResult {
    ensure!(
        store.get_latest_resources().await.ctx("latest")?.is_none(),
        "fresh store has no resources"
    );
    let first = store.add_resources(llm("http://a/v1")).await.ctx("add")?;
    ensure!(
        first.resources_id.starts_with("rs-"),
        "id {}",
        first.resources_id
    );
    ensure_eq!(first.version, 1, "first version");
    ensure_eq!(
        first.create_time,
        first.update_time,
        "create == update on creation"
    );
    let latest = store.get_latest_resources().await.ctx("latest")?;
    ensure_eq!(latest, Some(first.clone()), "latest after add");

    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    ensure_eq!(
        r.resources_id.as_deref(),
        Some(first.resources_id.as_str()),
        "null resources_id resolves to the latest"
    );

    let updated = store
        .update_resources(&first.resources_id, llm("http://b/v1"))
        .await
        .ctx("update")?;
    ensure_eq!(updated.version, 2, "version after update");
    ensure_eq!(updated.create_time, first.create_time, "create_time kept");
    ensure_eq!(updated.resources, llm("http://b/v1"), "resources replaced");

    let v0 = store
        .update_resources("v0", llm("http://c/v1"))
        .await
        .ctx("upsert")?;
    ensure_eq!(v0.version, 1, "upserted id starts at version 1");
    let latest = store
        .get_latest_resources()
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        latest.resources_id,
        "v0".to_string(),
        "last written is latest"
    );
    let by_id = store
        .get_resources_by_id(&first.resources_id)
        .await
        .ctx("by id")?;
    ensure_eq!(by_id, Some(updated), "get by id");
    ensure!(
        store
            .get_resources_by_id("nope")
            .await
            .ctx("by id")?
            .is_none(),
        "unknown id → None"
    );
    let explicit = store
        .enqueue_rollout(EnqueueRolloutRequest {
            resources_id: Some("pinned".into()),
            ..EnqueueRolloutRequest::new(json!(2))
        })
        .await
        .ctx("enqueue")?;
    ensure_eq!(
        explicit.resources_id.as_deref(),
        Some("pinned"),
        "explicit id kept"
    );
    ensure!(
        matches!(
            store.update_resources("latest", llm("x")).await,
            Err(StoreError::Invalid(_))
        ),
        "the reserved id `latest` is refused"
    );
    Ok(())
}

/// `wait_for_rollouts` without a timeout returns as soon as the rollout finishes.
pub async fn wait_wakes_when_finished(store: &dyn LightningStore) -> CaseResult {
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    let rid = r.rollout_id;
    store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let ids = vec![rid.clone()];
    let waiter = tokio::time::timeout(Duration::from_secs(20), store.wait_for_rollouts(&ids, None));
    let finisher = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        store
            .update_attempt(&rid, "latest", status(AttemptStatus::Succeeded))
            .await
    };
    let (waited, finished) = tokio::join!(waiter, finisher);
    finished.ctx("finish")?;
    let waited = waited.map_err(|_| "wait_for_rollouts never woke up".to_string())?;
    let rollouts = waited.ctx("wait")?;
    ensure_eq!(rollouts.len(), 1, "one finished rollout");
    ensure_eq!(rollouts[0].status, RolloutStatus::Succeeded, "status");
    Ok(())
}

/// At the timeout, only the finished rollouts are returned (request order, unknown omitted).
pub async fn wait_returns_at_timeout(store: &dyn LightningStore) -> CaseResult {
    let pending = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    let done = store
        .start_rollout(EnqueueRolloutRequest::new(json!(2)), None)
        .await
        .ctx("start")?;
    store
        .update_attempt(
            &done.rollout.rollout_id,
            "latest",
            status(AttemptStatus::Succeeded),
        )
        .await
        .ctx("succeed")?;
    let ids = vec![
        pending.rollout_id.clone(),
        "ro-unknown".to_string(),
        done.rollout.rollout_id.clone(),
    ];
    for timeout in [Duration::ZERO, Duration::from_millis(50)] {
        let got = store
            .wait_for_rollouts(&ids, Some(timeout))
            .await
            .ctx("wait")?;
        let got_ids: Vec<_> = got.iter().map(|r| r.rollout_id.clone()).collect();
        ensure_eq!(
            got_ids,
            vec![done.rollout.rollout_id.clone()],
            "finished subset"
        );
    }
    let nothing = store
        .wait_for_rollouts(&[], Some(Duration::from_secs(20)))
        .await
        .ctx("wait")?;
    ensure!(nothing.is_empty(), "waiting for nothing returns nothing");
    let unbounded = store
        .wait_for_rollouts(
            std::slice::from_ref(&done.rollout.rollout_id),
            Some(Duration::MAX),
        )
        .await
        .ctx("wait")?;
    ensure_eq!(unbounded.len(), 1, "a huge timeout behaves like no limit");
    Ok(())
}

/// Worker status follows its attempts; heartbeats never change it (§4.4).
pub async fn workers_idle_busy(store: &dyn LightningStore) -> CaseResult {
    ensure!(
        store
            .dequeue_rollout(Some("w-idle"))
            .await
            .ctx("dequeue")?
            .is_none(),
        "empty queue"
    );
    let idle = store.list_workers().await.ctx("workers")?;
    ensure_eq!(idle.len(), 1, "worker upserted by an empty dequeue");
    ensure_eq!(
        idle[0].status,
        WorkerStatus::Idle,
        "empty dequeue marks idle"
    );
    ensure!(idle[0].last_dequeue_time.is_some(), "last_dequeue_time set");

    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    let d = store
        .dequeue_rollout(Some("w-busy"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let workers = store.list_workers().await.ctx("workers")?;
    let busy = workers
        .iter()
        .find(|w| w.worker_id == "w-busy")
        .ctx("w-busy")?;
    ensure_eq!(busy.status, WorkerStatus::Busy, "busy after dequeue");
    ensure_eq!(
        busy.current_rollout_id.as_deref(),
        Some(r.rollout_id.as_str()),
        "current rollout"
    );
    ensure_eq!(
        busy.current_attempt_id.as_deref(),
        Some(d.attempt.attempt_id.as_str()),
        "current attempt"
    );
    ensure!(busy.last_busy_time.is_some(), "last_busy_time");

    let hb = store
        .update_worker("w-busy", Some(json!({"cpu_usage_pct": 12.5})))
        .await
        .ctx("heartbeat")?;
    ensure_eq!(hb.status, WorkerStatus::Busy, "heartbeat keeps the status");
    ensure!(hb.last_heartbeat_time.is_some(), "heartbeat time");
    ensure_eq!(
        hb.heartbeat_stats,
        Some(json!({"cpu_usage_pct": 12.5})),
        "stats"
    );
    let hb = store.update_worker("w-busy", None).await.ctx("heartbeat")?;
    ensure_eq!(
        hb.heartbeat_stats,
        Some(json!({"cpu_usage_pct": 12.5})),
        "stats kept"
    );

    store
        .update_attempt(&r.rollout_id, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed")?;
    let workers = store.list_workers().await.ctx("workers")?;
    let done = workers
        .iter()
        .find(|w| w.worker_id == "w-busy")
        .ctx("w-busy")?;
    ensure_eq!(done.status, WorkerStatus::Idle, "idle after success");
    ensure_eq!(done.current_rollout_id, None, "current rollout cleared");

    let fresh = store.update_worker("w-new", None).await.ctx("upsert")?;
    ensure_eq!(fresh.status, WorkerStatus::Unknown, "new worker status");
    let order: Vec<_> = store
        .list_workers()
        .await
        .ctx("workers")?
        .into_iter()
        .map(|w| w.worker_id)
        .collect();
    ensure_eq!(
        order,
        vec!["w-idle", "w-busy", "w-new"],
        "workers in first-seen order"
    );
    ensure!(
        matches!(
            store.update_worker("w-bad", Some(json!(1))).await,
            Err(StoreError::Invalid(_))
        ),
        "non-object heartbeat_stats refused"
    );
    ensure_eq!(
        store.list_workers().await.ctx("workers")?.len(),
        3,
        "refused call creates no worker"
    );
    Ok(())
}

/// `update_rollout`: terminal status sets end_time, queuing re-enqueues and clears it (Q7),
/// nullable fields can be cleared (§5.6).
pub async fn update_rollout_requeues_and_end_time(store: &dyn LightningStore) -> CaseResult {
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest {
            mode: Some(RolloutMode::Train),
            ..EnqueueRolloutRequest::new(json!({"q": 1}))
        })
        .await
        .ctx("enqueue")?;
    let rid = r.rollout_id;
    store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let cancelled = store
        .update_rollout(
            &rid,
            RolloutUpdate {
                status: Some(RolloutStatus::Cancelled),
                metadata: Some(json!({"why": "operator"})),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("cancel")?;
    ensure_eq!(cancelled.status, RolloutStatus::Cancelled, "status");
    ensure!(cancelled.end_time.is_some(), "cancelled sets end_time");
    ensure_eq!(
        cancelled.metadata,
        json!({"why": "operator"}).as_object().cloned(),
        "metadata"
    );
    let waited = store
        .wait_for_rollouts(std::slice::from_ref(&rid), Some(Duration::ZERO))
        .await
        .ctx("wait")?;
    ensure_eq!(waited.len(), 1, "cancelled counts as finished");

    let requeued = store
        .update_rollout(
            &rid,
            RolloutUpdate {
                status: Some(RolloutStatus::Queuing),
                mode: Some(None),
                input: Some(Value::Null),
                metadata: Some(Value::Null),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("requeue")?;
    ensure_eq!(
        requeued.end_time,
        None,
        "leaving a terminal status clears end_time"
    );
    ensure_eq!(requeued.mode, None, "mode cleared");
    ensure_eq!(requeued.input, Value::Null, "input set to null");
    ensure_eq!(requeued.metadata, None, "metadata set to null");
    let again = store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue again")?;
    ensure_eq!(again.rollout.rollout_id, rid, "re-enqueued rollout");
    ensure_eq!(again.attempt.sequence_id, 2, "new attempt");
    ensure!(
        matches!(
            store
                .update_rollout("ro-nope", RolloutUpdate::default())
                .await,
            Err(StoreError::NotFound {
                kind: EntityKind::Rollout,
                ..
            })
        ),
        "unknown rollout → NotFound"
    );
    Ok(())
}

/// start_rollout bypasses the queue; start_attempt revives a finished rollout (§4.1, Q7).
pub async fn start_rollout_and_start_attempt(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), Some("w1".into()))
        .await
        .ctx("start_rollout")?;
    ensure_eq!(s.rollout.status, RolloutStatus::Preparing, "rollout");
    ensure_eq!(s.attempt.sequence_id, 1, "attempt sequence");
    ensure_eq!(s.attempt.rollout_id, s.rollout.rollout_id, "attempt owner");
    ensure_eq!(
        worker_status(store, "w1").await?,
        WorkerStatus::Busy,
        "worker"
    );
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "start_rollout bypasses the queue"
    );
    let rid = s.rollout.rollout_id;
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Failed))
        .await
        .ctx("fail")?;
    let failed = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        failed.status,
        RolloutStatus::Failed,
        "max_attempts 1 → failed"
    );

    let revived = store
        .start_attempt(&rid, Some("w2"))
        .await
        .ctx("start_attempt")?;
    ensure_eq!(revived.rollout.status, RolloutStatus::Preparing, "revived");
    ensure_eq!(
        revived.rollout.end_time,
        None,
        "end_time cleared on revival"
    );
    ensure_eq!(revived.attempt.sequence_id, 2, "second attempt");
    ensure_eq!(revived.attempt.worker_id.as_deref(), Some("w2"), "worker");
    ensure!(
        matches!(
            store.start_attempt("ro-nope", None).await,
            Err(StoreError::NotFound { .. })
        ),
        "unknown rollout → NotFound"
    );
    Ok(())
}

/// Q6: cancelled is never changed by attempt updates; finished rollouts are not revived by late
/// reports, but a late success still flips failed → succeeded.
pub async fn terminal_rollouts_protected(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let rid = s.rollout.rollout_id;
    store
        .add_span(plain_span(&rid, &s.attempt.attempt_id, 1, "x"))
        .await
        .ctx("span")?;
    store
        .update_rollout(
            &rid,
            RolloutUpdate {
                status: Some(RolloutStatus::Cancelled),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("cancel")?;
    store
        .update_attempt(
            &rid,
            "latest",
            AttemptUpdate {
                metadata: Some(json!({"note": "late"})),
                ..AttemptUpdate::default()
            },
        )
        .await
        .ctx("metadata")?;
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("late success")?;
    let r = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        r.status,
        RolloutStatus::Cancelled,
        "cancelled stays cancelled"
    );

    let config = retry(3, &[AttemptStatus::Failed, AttemptStatus::Timeout]);
    let s = store
        .start_rollout(with_config(json!(2), config), None)
        .await
        .ctx("start")?;
    let rid = s.rollout.rollout_id;
    store
        .update_rollout(
            &rid,
            RolloutUpdate {
                status: Some(RolloutStatus::Failed),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("fail rollout")?;
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Running))
        .await
        .ctx("late running")?;
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Timeout))
        .await
        .ctx("late timeout")?;
    let r = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        r.status,
        RolloutStatus::Failed,
        "finished rollout not revived"
    );
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "finished rollout not requeued"
    );
    store
        .update_attempt(&rid, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("late success")?;
    let r = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(r.status, RolloutStatus::Succeeded, "late success kept");
    ensure!(r.end_time.is_some(), "end_time");
    Ok(())
}

/// Spans come back by (sequence_id, insertion order); `latest` and attempt filters (Q12).
pub async fn query_spans_order_and_latest(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, a1) = (s.rollout.rollout_id, s.attempt.attempt_id);
    for (seq, name) in [(3, "c1"), (1, "a"), (3, "c2"), (2, "b")] {
        store
            .add_span(plain_span(&rid, &a1, seq, name))
            .await
            .ctx("add")?;
    }
    let names = |spans: Vec<Span>| spans.into_iter().map(|s| s.name).collect::<Vec<_>>();
    let all = store.list_spans(&rid, None).await.ctx("query")?;
    ensure_eq!(names(all), vec!["a", "b", "c1", "c2"], "order");

    let a2 = store
        .start_attempt(&rid, None)
        .await
        .ctx("start_attempt")?
        .attempt
        .attempt_id;
    store
        .add_span(plain_span(&rid, &a2, 4, "second"))
        .await
        .ctx("add")?;
    let latest = store.list_spans(&rid, Some("latest")).await.ctx("query")?;
    ensure_eq!(names(latest), vec!["second"], "latest attempt only");
    let first = store.list_spans(&rid, Some(&a1)).await.ctx("query")?;
    ensure_eq!(first.len(), 4, "first attempt only");
    ensure_eq!(
        store.list_spans(&rid, None).await.ctx("query")?.len(),
        5,
        "all attempts"
    );
    ensure!(
        store
            .list_spans("ro-nope", None)
            .await
            .ctx("query")?
            .is_empty(),
        "unknown rollout → empty"
    );
    let queued = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(2)))
        .await
        .ctx("enqueue")?;
    ensure!(
        store
            .list_spans(&queued.rollout_id, Some("latest"))
            .await
            .ctx("query")?
            .is_empty(),
        "latest of a rollout without attempts → empty"
    );
    Ok(())
}

/// Rollout filters: status and ids, ANDed, creation order; `Some([])` matches nothing.
pub async fn query_rollouts_filters(store: &dyn LightningStore) -> CaseResult {
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
            .await
            .ctx("enqueue")?;
        ids.push(r.rollout_id);
    }
    store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let got = |rs: crate::query::Paginated<agl_core::AnyRollout>| {
        rs.items
            .into_iter()
            .map(|r| r.rollout().rollout_id.clone())
            .collect::<Vec<_>>()
    };
    let all = store
        .query_rollouts(RolloutQuery::default())
        .await
        .ctx("query")?;
    ensure_eq!(got(all), ids.clone(), "all in creation order");
    let queuing = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![RolloutStatus::Queuing]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(got(queuing), ids[1..].to_vec(), "status filter");
    let by_id = store
        .query_rollouts(RolloutQuery {
            rollout_id_in: Some(vec![ids[2].clone(), "ro-nope".into(), ids[0].clone()]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(
        got(by_id),
        vec![ids[0].clone(), ids[2].clone()],
        "id filter"
    );
    let both = store
        .query_rollouts(RolloutQuery {
            rollout_id_in: Some(vec![ids[0].clone(), ids[1].clone()]),
            status_in: Some(vec![RolloutStatus::Preparing]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(got(both), vec![ids[0].clone()], "filters are ANDed");
    let none = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure!(none.items.is_empty(), "empty status list matches nothing");
    Ok(())
}

/// Queue entries whose rollout is no longer queuing are skipped and consumed (§4.9).
pub async fn stale_queue_entries_skipped(store: &dyn LightningStore) -> CaseResult {
    let r1 = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    let r2 = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(2)))
        .await
        .ctx("enqueue")?;
    store
        .update_rollout(
            &r1.rollout_id,
            RolloutUpdate {
                status: Some(RolloutStatus::Cancelled),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("cancel")?;
    // Re-setting queuing on a rollout already in the queue must not enqueue it twice.
    store
        .update_rollout(
            &r2.rollout_id,
            RolloutUpdate {
                status: Some(RolloutStatus::Queuing),
                ..RolloutUpdate::default()
            },
        )
        .await
        .ctx("requeue")?;
    let d = store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    ensure_eq!(
        d.rollout.rollout_id,
        r2.rollout_id,
        "cancelled entry skipped"
    );
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "no duplicate queue entry"
    );
    Ok(())
}

/// Updates of an older attempt never propagate to the rollout (§4.3).
pub async fn older_attempt_does_not_propagate(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(
            with_config(json!(1), retry(3, &[AttemptStatus::Failed])),
            None,
        )
        .await
        .ctx("start")?;
    let rid = s.rollout.rollout_id;
    let old = s.attempt.attempt_id;
    store.start_attempt(&rid, None).await.ctx("start_attempt")?;
    let updated = store
        .update_attempt(&rid, &old, status(AttemptStatus::Succeeded))
        .await
        .ctx("update old")?;
    ensure_eq!(
        updated.status,
        AttemptStatus::Succeeded,
        "old attempt updated"
    );
    let r = store.get_rollout_by_id(&rid).await.ctx("get")?.ctx("get")?;
    ensure_eq!(
        r.status,
        RolloutStatus::Preparing,
        "rollout follows the latest attempt only"
    );
    Ok(())
}

/// Statistics count every entity kind.
pub async fn statistics_counts(store: &dyn LightningStore) -> CaseResult {
    store
        .enqueue_many(vec![
            EnqueueRolloutRequest::new(json!(1)),
            EnqueueRolloutRequest::new(json!(2)),
        ])
        .await
        .ctx("enqueue_many")?;
    let d = store
        .dequeue_rollout(Some("w"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    store
        .add_span(plain_span(
            &d.rollout.rollout_id,
            &d.attempt.attempt_id,
            1,
            "x",
        ))
        .await
        .ctx("span")?;
    store
        .add_resources(llm("http://a/v1"))
        .await
        .ctx("resources")?;
    let stats = store.statistics().await.ctx("statistics")?;
    ensure_eq!(
        (
            stats.total_rollouts,
            stats.total_attempts,
            stats.total_spans,
            stats.total_resources,
            stats.total_workers
        ),
        (2, 1, 1, 1, 1),
        "counts"
    );
    ensure!(stats.uptime >= 0.0, "uptime {}", stats.uptime);
    Ok(())
}

/// Invalid requests are refused with a precise error and change nothing.
pub async fn invalid_inputs_rejected(store: &dyn LightningStore) -> CaseResult {
    let zero = retry(0, &[]);
    ensure!(
        matches!(
            store
                .enqueue_rollout(with_config(json!(1), zero.clone()))
                .await,
            Err(StoreError::Invalid(_))
        ),
        "max_attempts 0 refused"
    );
    let batch = store
        .enqueue_many(vec![
            EnqueueRolloutRequest::new(json!(1)),
            with_config(json!(2), zero),
        ])
        .await;
    match batch {
        Err(StoreError::Invalid(msg)) => {
            ensure!(
                msg.contains("rollouts[1]") && msg.contains("max_attempts"),
                "names the item and the field: {msg}"
            )
        }
        other => return Err(format!("bad batch: expected Invalid, got {other:?}")),
    }
    ensure!(
        store
            .query_rollouts(RolloutQuery::default())
            .await
            .ctx("query")?
            .items
            .is_empty(),
        "a refused batch creates nothing"
    );

    let queued = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    ensure!(
        matches!(
            store
                .update_attempt(&queued.rollout_id, "latest", status(AttemptStatus::Running))
                .await,
            Err(StoreError::NotFound {
                kind: EntityKind::Attempt,
                ..
            })
        ),
        "latest attempt of a rollout without attempts → NotFound"
    );
    ensure!(
        matches!(
            store
                .update_attempt("ro-nope", "latest", AttemptUpdate::default())
                .await,
            Err(StoreError::NotFound {
                kind: EntityKind::Rollout,
                ..
            })
        ),
        "unknown rollout → NotFound"
    );
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let null_meta = AttemptUpdate {
        status: Some(AttemptStatus::Succeeded),
        metadata: Some(Value::Null),
        ..AttemptUpdate::default()
    };
    ensure!(
        matches!(
            store
                .update_attempt(&s.rollout.rollout_id, "latest", null_meta)
                .await,
            Err(StoreError::Invalid(_))
        ),
        "metadata null refused on update_attempt"
    );
    let a = store
        .get_latest_attempt(&s.rollout.rollout_id)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        a.status,
        AttemptStatus::Preparing,
        "refused update changed nothing"
    );
    ensure!(
        matches!(
            store
                .update_rollout(
                    &s.rollout.rollout_id,
                    RolloutUpdate {
                        metadata: Some(json!([1])),
                        ..RolloutUpdate::default()
                    }
                )
                .await,
            Err(StoreError::Invalid(_))
        ),
        "non-object metadata refused on update_rollout"
    );
    Ok(())
}
