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
    AnyRollout, Attempt, AttemptStatus, Attributes, EnqueueRolloutRequest, NamedResources,
    Resource, Rollout, RolloutConfig, RolloutMode, RolloutStatus, Span, WorkerStatus,
    find_final_reward, reward_attributes,
};
use serde_json::{Map, Value, json};

use crate::error::{EntityKind, StoreError};
use crate::query::{
    AttemptQuery, FilterLogic, ResourcesQuery, RolloutQuery, Sort, SpanQuery, Window, WorkerQuery,
};
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
    ("sequence_id_blocks", |s| Box::pin(sequence_id_blocks(s))),
    ("fresh_ids_with_spans", |s| {
        Box::pin(fresh_ids_with_spans(s))
    }),
    ("span_for_unknown_target", |s| {
        Box::pin(span_for_unknown_target(s))
    }),
    ("resources_versions_and_latest", |s| {
        Box::pin(resources_versions_and_latest(s))
    }),
    ("wait_wakes_when_finished", |s| {
        Box::pin(wait_wakes_when_finished(s))
    }),
    ("wait_reports_current_states", |s| {
        Box::pin(wait_reports_current_states(s))
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
    ("query_rollouts_conditions", |s| {
        Box::pin(query_rollouts_conditions(s))
    }),
    ("query_rollouts_sorting", |s| {
        Box::pin(query_rollouts_sorting(s))
    }),
    ("query_rollouts_window", |s| {
        Box::pin(query_rollouts_window(s))
    }),
    ("query_attempts_paging", |s| {
        Box::pin(query_attempts_paging(s))
    }),
    ("query_spans_filters", |s| Box::pin(query_spans_filters(s))),
    ("query_resources_filters", |s| {
        Box::pin(query_resources_filters(s))
    }),
    ("query_workers_filters", |s| {
        Box::pin(query_workers_filters(s))
    }),
    ("dequeue_many_batches", |s| {
        Box::pin(dequeue_many_batches(s))
    }),
    ("statistics_by_status", |s| {
        Box::pin(statistics_by_status(s))
    }),
    ("illegal_transitions_refused", |s| {
        Box::pin(illegal_transitions_refused(s))
    }),
    ("allowed_transitions_apply", |s| {
        Box::pin(allowed_transitions_apply(s))
    }),
    ("run_watchdog_detects_timeouts", |s| {
        Box::pin(run_watchdog_detects_timeouts(s))
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
    // 0.25 s: the checks after the revival must run before the revived attempt goes quiet
    // again, on a loaded machine and over a network database too.
    let config = RolloutConfig {
        unresponsive_seconds: Some(0.25),
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
    tokio::time::sleep(Duration::from_millis(450)).await;
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

/// `add_spans_with_fresh_ids` does what `get_next_span_sequence_ids` then `add_spans` do:
/// the spans asking for an id take one block per rollout, in span order, before the supplied
/// ids of the same call raise the counter; duplicates are dropped and a refused call (unknown
/// attempt) still consumes its block (§4.7, §6.2).
pub async fn fresh_ids_with_spans(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    store
        .add_span(plain_span(&rid, &aid, 5, "supplied"))
        .await
        .ctx("add")?;
    let names_and_ids = |spans: &[Span]| -> Vec<(String, i64)> {
        spans
            .iter()
            .map(|s| (s.name.clone(), s.sequence_id))
            .collect()
    };
    let a = plain_span(&rid, &aid, 0, "a");
    let stored = store
        .add_spans_with_fresh_ids(vec![
            (a.clone(), true),
            (plain_span(&rid, &aid, 9, "b"), false),
            (plain_span(&rid, &aid, 0, "c"), true),
        ])
        .await
        .ctx("add_spans_with_fresh_ids")?;
    ensure_eq!(
        names_and_ids(&stored),
        vec![
            ("a".to_string(), 6),
            ("b".to_string(), 9),
            ("c".to_string(), 7)
        ],
        "fresh ids 6 and 7 in span order, the supplied 9 kept"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        10,
        "the supplied 9 raised the counter"
    );
    let again = store
        .add_spans_with_fresh_ids(vec![(a, true)])
        .await
        .ctx("duplicate")?;
    ensure!(again.is_empty(), "a duplicate is dropped: {again:?}");
    let refused = store
        .add_spans_with_fresh_ids(vec![(plain_span(&rid, "at-missing", 0, "x"), true)])
        .await;
    ensure!(
        matches!(refused, Err(StoreError::NotFound { .. })),
        "unknown attempt: {refused:?}"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        13,
        "the dropped duplicate and the refused span consumed 11 and 12"
    );
    // An unknown rollout: refused, and its (orphan) counter keeps the block.
    let unknown = store
        .add_spans_with_fresh_ids(vec![
            (plain_span("ro-nowhere", "at-x", 0, "y"), true),
            (plain_span("ro-nowhere", "at-x", 0, "z"), true),
        ])
        .await;
    ensure!(
        matches!(unknown, Err(StoreError::NotFound { .. })),
        "unknown rollout: {unknown:?}"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-nowhere", "at-x")
            .await
            .ctx("seq")?,
        3,
        "the refused spans of an unknown rollout consumed 1 and 2"
    );
    // Two rollouts in one call: one block each.
    let t = store
        .start_rollout(EnqueueRolloutRequest::new(json!(2)), None)
        .await
        .ctx("start")?;
    let (rid2, aid2) = (t.rollout.rollout_id, t.attempt.attempt_id);
    let stored = store
        .add_spans_with_fresh_ids(vec![
            (plain_span(&rid, &aid, 0, "d"), true),
            (plain_span(&rid2, &aid2, 0, "e"), true),
            (plain_span(&rid, &aid, 0, "f"), true),
        ])
        .await
        .ctx("two rollouts")?;
    ensure_eq!(
        names_and_ids(&stored),
        vec![
            ("d".to_string(), 14),
            ("e".to_string(), 1),
            ("f".to_string(), 15)
        ],
        "one block per rollout"
    );
    ensure_eq!(
        store
            .add_spans_with_fresh_ids(Vec::new())
            .await
            .ctx("empty")?,
        Vec::<Span>::new(),
        "nothing to store"
    );
    let listed = store.list_spans(&rid, None).await.ctx("list")?;
    ensure_eq!(listed.len(), 6, "spans of the first rollout");
    Ok(())
}

/// Blocks of sequence ids continue the per-rollout counter, and later single ids and
/// client-supplied ids continue after the block; a block of zero is refused.
pub async fn sequence_id_blocks(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        1,
        "first single id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_ids(&rid, &aid, 3)
            .await
            .ctx("block")?,
        2,
        "a block of 3 starts after the single id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        5,
        "the block consumed 2, 3 and 4"
    );
    store
        .add_span(plain_span(&rid, &aid, 20, "client-numbered"))
        .await
        .ctx("add")?;
    ensure_eq!(
        store
            .get_next_span_sequence_ids(&rid, &aid, 2)
            .await
            .ctx("block")?,
        21,
        "a block after a supplied id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_ids("ro-unknown", "at-x", 4)
            .await
            .ctx("block")?,
        1,
        "unknown rollouts get blocks too (Q10)"
    );
    ensure!(
        matches!(
            store.get_next_span_sequence_ids(&rid, &aid, 0).await,
            Err(StoreError::Invalid(_))
        ),
        "a block of 0 is refused"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        23,
        "the refused block consumed nothing"
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

/// A rollout that finished and was re-enqueued during the wait is not reported as finished:
/// the answer reflects the states when the wait returns, in request order.
pub async fn wait_reports_current_states(store: &dyn LightningStore) -> CaseResult {
    let mut ids = Vec::new();
    for i in 0..2 {
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
            .await
            .ctx("enqueue")?;
        ids.push(r.rollout_id);
    }
    for _ in 0..2 {
        store
            .dequeue_rollout(None)
            .await
            .ctx("dequeue")?
            .ctx("dequeue")?;
    }
    let waiter = store.wait_for_rollouts(&ids, Some(Duration::from_millis(400)));
    let driver = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        store
            .update_attempt(&ids[0], "latest", status(AttemptStatus::Succeeded))
            .await
            .ctx("finish first")?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        store
            .update_rollout(
                &ids[0],
                RolloutUpdate {
                    status: Some(RolloutStatus::Queuing),
                    ..RolloutUpdate::default()
                },
            )
            .await
            .ctx("re-enqueue first")?;
        store
            .update_attempt(&ids[1], "latest", status(AttemptStatus::Failed))
            .await
            .ctx("fail second")?;
        Ok::<(), String>(())
    };
    let (waited, driven) = tokio::join!(waiter, driver);
    driven?;
    let rollouts = waited.ctx("wait")?;
    let got: Vec<(&str, RolloutStatus)> = rollouts
        .iter()
        .map(|r| (r.rollout_id.as_str(), r.status))
        .collect();
    ensure_eq!(
        got,
        vec![(ids[1].as_str(), RolloutStatus::Failed)],
        "only the rollout finished at the end of the wait"
    );
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

// ---------------------------------------------------------------------------------------------
// Queries, batch dequeue, per-status statistics, the state machine and the watchdog entry point
// (issue 5). Every case still needs only a fresh store with scan debounce 0.
// ---------------------------------------------------------------------------------------------

/// A short real-time pause so consecutive store timestamps differ (the suite compares times).
async fn pause() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

fn set_status(s: RolloutStatus) -> RolloutUpdate {
    RolloutUpdate {
        status: Some(s),
        ..RolloutUpdate::default()
    }
}

fn with_mode(input: i64, mode: Option<RolloutMode>) -> EnqueueRolloutRequest {
    EnqueueRolloutRequest {
        mode,
        ..EnqueueRolloutRequest::new(json!(input))
    }
}

async fn rollout_of(store: &dyn LightningStore, rollout_id: &str) -> Result<Rollout, String> {
    store
        .get_rollout_by_id(rollout_id)
        .await
        .ctx("get_rollout_by_id")?
        .ctx(&format!("rollout {rollout_id}"))
}

async fn latest_of(store: &dyn LightningStore, rollout_id: &str) -> Result<Attempt, String> {
    store
        .get_latest_attempt(rollout_id)
        .await
        .ctx("get_latest_attempt")?
        .ctx(&format!("latest attempt of {rollout_id}"))
}

/// The rollout ids of a `query_rollouts` answer, in the order returned.
async fn rollout_ids_of(
    store: &dyn LightningStore,
    query: RolloutQuery,
    what: &str,
) -> Result<Vec<String>, String> {
    Ok(store
        .query_rollouts(query)
        .await
        .ctx(what)?
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect())
}

/// `Ok(message)` when `result` is `StoreError::Invalid`, otherwise an error naming `what`.
fn invalid_message<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    what: &str,
) -> Result<String, String> {
    match result {
        Err(StoreError::Invalid(msg)) => Ok(msg),
        other => Err(format!(
            "{what}: expected StoreError::Invalid, got {other:?}"
        )),
    }
}

/// Checks that `result` is the `InvalidTransition` of `kind` `id` from `from` to `to`.
fn refused_transition<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    kind: EntityKind,
    id: &str,
    from: &str,
    to: &str,
) -> CaseResult {
    match &result {
        Err(
            err @ StoreError::InvalidTransition {
                kind: k,
                id: i,
                from: f,
                to: t,
                ..
            },
        ) => {
            ensure!(
                *k == kind && i == id && f == from && t == to,
                "{kind} {id} {from} → {to}: the error names {k} {i} {f} → {t}"
            );
            let text = err.to_string();
            ensure!(
                text.contains(&format!("from `{from}` to `{to}`")),
                "the message names both statuses: {text}"
            );
            Ok(())
        }
        other => Err(format!(
            "{kind} {id} {from} → {to}: expected InvalidTransition, got {other:?}"
        )),
    }
}

/// Rollout conditions (§5.4, Q15, Q19): `status_in`, `rollout_id_in`, `rollout_id_contains`,
/// `mode_in`, the four time bounds, `and`/`or` (no condition = everything under both), and
/// every item carries its latest attempt iff it has one.
pub async fn query_rollouts_conditions(store: &dyn LightningStore) -> CaseResult {
    let a = store
        .start_rollout(with_mode(0, Some(RolloutMode::Train)), None)
        .await
        .ctx("start a")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&a, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed a")?;
    pause().await;
    let b = store
        .enqueue_rollout(with_mode(1, Some(RolloutMode::Val)))
        .await
        .ctx("enqueue b")?
        .rollout_id;
    store
        .update_rollout(&b, set_status(RolloutStatus::Cancelled))
        .await
        .ctx("cancel b")?;
    pause().await;
    let c = store
        .enqueue_rollout(with_mode(2, None))
        .await
        .ctx("enqueue c")?
        .rollout_id;
    pause().await;
    let d = store
        .start_rollout(with_mode(3, Some(RolloutMode::Test)), None)
        .await
        .ctx("start d")?
        .rollout
        .rollout_id;
    let (ra, rb, rc, rd) = (
        rollout_of(store, &a).await?,
        rollout_of(store, &b).await?,
        rollout_of(store, &c).await?,
        rollout_of(store, &d).await?,
    );
    ensure!(
        ra.start_time < rb.start_time && rb.start_time < rc.start_time,
        "start times must increase: {} {} {}",
        ra.start_time,
        rb.start_time,
        rc.start_time
    );
    ensure!(rc.start_time < rd.start_time, "start times must increase");
    let (a_end, b_end) = (
        ra.end_time.ctx("a end_time")?,
        rb.end_time.ctx("b end_time")?,
    );
    ensure!(a_end < b_end, "a finished before b: {a_end} {b_end}");
    let all = [a.clone(), b.clone(), c.clone(), d.clone()];

    let cases: Vec<(&str, RolloutQuery, Vec<&String>)> = vec![
        (
            "status_in",
            RolloutQuery::with_status(&[RolloutStatus::Succeeded, RolloutStatus::Preparing]),
            vec![&a, &d],
        ),
        (
            "rollout_id_in (unknown ids omitted, creation order)",
            RolloutQuery::with_ids(&[d.clone(), "ro-nope".into(), a.clone()]),
            vec![&a, &d],
        ),
        (
            "rollout_id_contains the hex part of c",
            RolloutQuery {
                rollout_id_contains: Some(c.trim_start_matches("ro-").to_string()),
                ..RolloutQuery::default()
            },
            vec![&c],
        ),
        (
            "rollout_id_contains a common prefix",
            RolloutQuery {
                rollout_id_contains: Some("ro-".into()),
                ..RolloutQuery::default()
            },
            vec![&a, &b, &c, &d],
        ),
        (
            "mode_in (a null mode never matches)",
            RolloutQuery {
                mode_in: Some(vec![RolloutMode::Train, RolloutMode::Test]),
                ..RolloutQuery::default()
            },
            vec![&a, &d],
        ),
        (
            "start_time_gte",
            RolloutQuery {
                start_time_gte: Some(rb.start_time),
                ..RolloutQuery::default()
            },
            vec![&b, &c, &d],
        ),
        (
            "start_time_lt",
            RolloutQuery {
                start_time_lt: Some(rc.start_time),
                ..RolloutQuery::default()
            },
            vec![&a, &b],
        ),
        (
            "start_time range",
            RolloutQuery {
                start_time_gte: Some(rb.start_time),
                start_time_lt: Some(rd.start_time),
                ..RolloutQuery::default()
            },
            vec![&b, &c],
        ),
        (
            "end_time_gte (a null end_time never matches)",
            RolloutQuery {
                end_time_gte: Some(a_end),
                ..RolloutQuery::default()
            },
            vec![&a, &b],
        ),
        (
            "end_time_lt",
            RolloutQuery {
                end_time_lt: Some(b_end),
                ..RolloutQuery::default()
            },
            vec![&a],
        ),
        (
            "and",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Succeeded, RolloutStatus::Cancelled]),
                mode_in: Some(vec![RolloutMode::Val]),
                ..RolloutQuery::default()
            },
            vec![&b],
        ),
        (
            "or",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Cancelled]),
                rollout_id_in: Some(vec![c.clone()]),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&b, &c],
        ),
        (
            "or with an empty status list",
            RolloutQuery {
                status_in: Some(vec![]),
                mode_in: Some(vec![RolloutMode::Test]),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&d],
        ),
        (
            "or over time bounds",
            RolloutQuery {
                start_time_lt: Some(ra.start_time),
                end_time_gte: Some(b_end),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&b],
        ),
        (
            "and with no condition",
            RolloutQuery::default(),
            all.iter().collect(),
        ),
        (
            "or with no condition",
            RolloutQuery {
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            all.iter().collect(),
        ),
    ];
    for (what, query, expected) in cases {
        let got = rollout_ids_of(store, query, what).await?;
        let expected: Vec<String> = expected.into_iter().cloned().collect();
        ensure_eq!(got, expected, what);
    }

    let page = store
        .query_rollouts(RolloutQuery::all())
        .await
        .ctx("query all")?;
    ensure_eq!(page.total, 4, "total");
    for item in &page.items {
        let id = &item.rollout().rollout_id;
        let has_attempt = *id == a || *id == d;
        match item {
            AnyRollout::Attempted(ar) => {
                ensure!(has_attempt, "{id} has no attempt but came back with one");
                ensure_eq!(
                    ar.attempt,
                    latest_of(store, id).await?,
                    "the latest attempt"
                );
            }
            AnyRollout::Plain(_) => ensure!(!has_attempt, "{id} came back without its attempt"),
        }
    }
    Ok(())
}

/// Sorting rollouts by every scalar field, both directions, with the null rules of Q13 (null
/// `mode` first ascending, null `end_time` last ascending); `config` and mixed `input` types
/// are `Invalid`, an unknown field gives the exact §5.5 message.
pub async fn query_rollouts_sorting(store: &dyn LightningStore) -> CaseResult {
    let a = store
        .start_rollout(
            EnqueueRolloutRequest {
                mode: Some(RolloutMode::Train),
                resources_id: Some("rs-2".into()),
                ..EnqueueRolloutRequest::new(json!("b"))
            },
            None,
        )
        .await
        .ctx("start a")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&a, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed a")?;
    pause().await;
    let b = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("c")))
        .await
        .ctx("enqueue b")?
        .rollout_id;
    pause().await;
    let c = store
        .enqueue_rollout(EnqueueRolloutRequest {
            mode: Some(RolloutMode::Val),
            resources_id: Some("rs-1".into()),
            ..EnqueueRolloutRequest::new(json!("a"))
        })
        .await
        .ctx("enqueue c")?
        .rollout_id;
    store
        .update_rollout(&c, set_status(RolloutStatus::Cancelled))
        .await
        .ctx("cancel c")?;
    let mut by_id = vec![a.clone(), b.clone(), c.clone()];
    by_id.sort();
    let ascending: Vec<(&str, Vec<String>)> = vec![
        ("rollout_id", by_id),
        ("input", vec![c.clone(), a.clone(), b.clone()]),
        ("start_time", vec![a.clone(), b.clone(), c.clone()]),
        ("end_time", vec![a.clone(), c.clone(), b.clone()]),
        ("mode", vec![b.clone(), a.clone(), c.clone()]),
        ("resources_id", vec![b.clone(), c.clone(), a.clone()]),
        ("status", vec![c.clone(), b.clone(), a.clone()]),
    ];
    for (field, expected) in ascending {
        let asc = RolloutQuery {
            sort: Sort::asc(field),
            ..RolloutQuery::default()
        };
        let got = rollout_ids_of(store, asc, field).await?;
        ensure_eq!(got, expected, format!("sort_by {field} asc"));
        let desc = RolloutQuery {
            sort: Sort::desc(field),
            ..RolloutQuery::default()
        };
        let got = rollout_ids_of(store, desc, field).await?;
        let reversed: Vec<String> = expected.into_iter().rev().collect();
        ensure_eq!(got, reversed, format!("sort_by {field} desc"));
    }
    for field in ["config", "metadata"] {
        let msg = invalid_message(
            store
                .query_rollouts(RolloutQuery {
                    sort: Sort::asc(field),
                    ..RolloutQuery::default()
                })
                .await,
            field,
        )?;
        ensure!(msg.contains(field), "the message names {field}: {msg}");
    }
    let msg = invalid_message(
        store
            .query_rollouts(RolloutQuery {
                sort: Sort::desc("attempt"),
                ..RolloutQuery::default()
            })
            .await,
        "sort_by attempt",
    )?;
    ensure_eq!(
        msg,
        "Invalid sort_by: attempt, allowed fields are: rollout_id, input, start_time, end_time, \
         mode, resources_id, status, config, metadata",
        "§5.5 message"
    );
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!({"q": 1})))
        .await
        .ctx("enqueue object input")?;
    invalid_message(
        store
            .query_rollouts(RolloutQuery {
                sort: Sort::asc("input"),
                ..RolloutQuery::default()
            })
            .await,
        "sort by input holding strings and an object",
    )?;
    Ok(())
}

/// `limit`/`offset` windows of `query_rollouts`: `total` counts every match, the request's
/// limit (`-1` = all) and offset are echoed, and the window applies after filter and sort.
pub async fn query_rollouts_window(store: &dyn LightningStore) -> CaseResult {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            store
                .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
                .await
                .ctx("enqueue")?
                .rollout_id,
        );
    }
    let window = |limit: Option<u64>, offset: u64| RolloutQuery {
        window: Window { limit, offset },
        ..RolloutQuery::default()
    };
    let page = store
        .query_rollouts(window(Some(2), 1))
        .await
        .ctx("query")?;
    let got: Vec<String> = page
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect();
    ensure_eq!(got, ids[1..3].to_vec(), "limit 2 offset 1");
    ensure_eq!(
        (page.limit, page.offset, page.total),
        (2, 1, 5),
        "limit, offset, total"
    );
    let page = store.query_rollouts(window(None, 3)).await.ctx("query")?;
    ensure_eq!(page.items.len(), 2, "no limit from offset 3");
    ensure_eq!((page.limit, page.total), (-1, 5), "limit -1 echoed");
    let page = store
        .query_rollouts(window(Some(3), 7))
        .await
        .ctx("query")?;
    ensure!(page.items.is_empty(), "offset past the end");
    ensure_eq!(page.total, 5, "total past the end");
    let page = store
        .query_rollouts(window(Some(50), 0))
        .await
        .ctx("query")?;
    ensure_eq!(page.items.len(), 5, "limit above the count");

    let mut by_id_desc = ids.clone();
    by_id_desc.sort();
    by_id_desc.reverse();
    let got = rollout_ids_of(
        store,
        RolloutQuery {
            sort: Sort::desc("rollout_id"),
            window: Window {
                limit: Some(2),
                offset: 2,
            },
            ..RolloutQuery::default()
        },
        "sorted window",
    )
    .await?;
    ensure_eq!(got, by_id_desc[2..4].to_vec(), "window after the sort");

    // Dequeue two (creation order), give the first a second attempt.
    for _ in 0..2 {
        store
            .dequeue_rollout(None)
            .await
            .ctx("dequeue")?
            .ctx("dequeue")?;
    }
    store
        .start_attempt(&ids[0], None)
        .await
        .ctx("start_attempt")?;
    let page = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![RolloutStatus::Queuing]),
            window: Window {
                limit: Some(2),
                offset: 1,
            },
            ..RolloutQuery::default()
        })
        .await
        .ctx("filtered window")?;
    let got: Vec<String> = page
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect();
    ensure_eq!(got, ids[3..5].to_vec(), "window over the matches");
    ensure_eq!(page.total, 3, "total counts the matches only");
    let page = store
        .query_rollouts(RolloutQuery::with_ids(&[ids[0].clone(), ids[2].clone()]))
        .await
        .ctx("query")?;
    let first = page.items.first().ctx("first item")?;
    let attempt = first
        .attempt()
        .ctx("a dequeued rollout carries its attempt")?;
    ensure_eq!(attempt.sequence_id, 2, "the latest attempt is carried");
    let second = page.items.get(1).ctx("second item")?;
    ensure!(
        second.attempt().is_none(),
        "a rollout without attempts is a plain rollout"
    );
    Ok(())
}

/// `query_attempts`: `sequence_id` order by default, any scalar sort (null `end_time` last
/// ascending, first descending, ties in natural order), windows with `total`, unknown rollout
/// → empty page, non-scalar or unknown `sort_by` → `Invalid`.
pub async fn query_attempts_paging(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), Some("w-c".into()))
        .await
        .ctx("start")?;
    let rid = s.rollout.rollout_id;
    store
        .start_attempt(&rid, Some("w-a"))
        .await
        .ctx("attempt 2")?;
    store
        .start_attempt(&rid, Some("w-b"))
        .await
        .ctx("attempt 3")?;
    // Finishing attempt 1 (not the latest) gives it an end_time and touches nothing else.
    store
        .update_attempt(&rid, &s.attempt.attempt_id, status(AttemptStatus::Failed))
        .await
        .ctx("fail attempt 1")?;
    let rid_ref = rid.as_str();
    let seqs = |query: AttemptQuery| async move {
        store
            .query_attempts(rid_ref, query)
            .await
            .map(|p| {
                (
                    p.items.iter().map(|a| a.sequence_id).collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_attempts")
    };
    let q = |sort: Sort, window: Window| AttemptQuery { sort, window };
    let cases = [
        ("default", AttemptQuery::default(), vec![1, 2, 3], 3),
        (
            "sequence_id desc",
            q(Sort::desc("sequence_id"), Window::ALL),
            vec![3, 2, 1],
            3,
        ),
        (
            "worker_id asc",
            q(Sort::asc("worker_id"), Window::ALL),
            vec![2, 3, 1],
            3,
        ),
        (
            "end_time asc (null last)",
            q(Sort::asc("end_time"), Window::ALL),
            vec![1, 2, 3],
            3,
        ),
        (
            "end_time desc (null first, ties in natural order)",
            q(Sort::desc("end_time"), Window::ALL),
            vec![2, 3, 1],
            3,
        ),
        (
            "window",
            q(
                Sort::asc("sequence_id"),
                Window {
                    limit: Some(1),
                    offset: 1,
                },
            ),
            vec![2],
            3,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = seqs(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    let unknown = store
        .query_attempts("ro-nope", AttemptQuery::default())
        .await
        .ctx("unknown rollout")?;
    ensure!(
        unknown.items.is_empty() && unknown.total == 0,
        "unknown rollout → empty page"
    );
    invalid_message(
        store
            .query_attempts(&rid, q(Sort::asc("metadata"), Window::ALL))
            .await,
        "sort by metadata",
    )?;
    let msg = invalid_message(
        store
            .query_attempts(&rid, q(Sort::asc("nope"), Window::ALL))
            .await,
        "sort by nope",
    )?;
    ensure_eq!(
        msg,
        "Invalid sort_by: nope, allowed fields are: rollout_id, attempt_id, sequence_id, \
         start_time, end_time, status, worker_id, last_heartbeat_time, metadata",
        "§5.5 message"
    );
    Ok(())
}

fn named_span(
    rollout_id: &str,
    attempt_id: &str,
    sequence_id: i64,
    ids: (&str, &str, Option<&str>),
    name: &str,
) -> Span {
    let mut span = plain_span(rollout_id, attempt_id, sequence_id, name);
    span.trace_id = ids.0.to_string();
    span.span_id = ids.1.to_string();
    span.parent_id = ids.2.map(str::to_string);
    span
}

/// `query_spans` conditions: `trace_id`, `span_id`, `parent_id`, `name`, each exact and
/// contains, combined with `and`/`or` (no condition = everything, deviation Q15), the
/// `latest` attempt, descending sort, windows; non-scalar or unknown `sort_by` → `Invalid`.
pub async fn query_spans_filters(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, a1) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let spans = [
        named_span(&rid, &a1, 1, ("t-aaa", "s-001", None), "llm.call"),
        named_span(&rid, &a1, 2, ("t-aaa", "s-002", Some("s-001")), "tool.exec"),
        named_span(&rid, &a1, 3, ("t-bbb", "s-003", Some("s-001")), "llm.reply"),
    ];
    for span in &spans {
        store
            .add_span(span.clone())
            .await
            .ctx("add")?
            .ctx("stored")?;
    }
    let a2 = store
        .start_attempt(&rid, None)
        .await
        .ctx("start_attempt")?
        .attempt
        .attempt_id;
    store
        .add_span(named_span(
            &rid,
            &a2,
            4,
            ("t-bbb", "s-004", Some("s-003")),
            "reward",
        ))
        .await
        .ctx("add")?
        .ctx("stored")?;
    let base = || SpanQuery::of(&rid, None);
    let cases: Vec<(&str, SpanQuery, Vec<&str>)> = vec![
        (
            "trace_id",
            SpanQuery {
                trace_id: Some("t-aaa".into()),
                ..base()
            },
            vec!["s-001", "s-002"],
        ),
        (
            "trace_id_contains",
            SpanQuery {
                trace_id_contains: Some("bb".into()),
                ..base()
            },
            vec!["s-003", "s-004"],
        ),
        (
            "span_id",
            SpanQuery {
                span_id: Some("s-003".into()),
                ..base()
            },
            vec!["s-003"],
        ),
        (
            "span_id_contains",
            SpanQuery {
                span_id_contains: Some("-00".into()),
                ..base()
            },
            vec!["s-001", "s-002", "s-003", "s-004"],
        ),
        (
            "parent_id",
            SpanQuery {
                parent_id: Some("s-001".into()),
                ..base()
            },
            vec!["s-002", "s-003"],
        ),
        (
            "parent_id_contains (a null parent never matches)",
            SpanQuery {
                parent_id_contains: Some("s-".into()),
                ..base()
            },
            vec!["s-002", "s-003", "s-004"],
        ),
        (
            "name",
            SpanQuery {
                name: Some("reward".into()),
                ..base()
            },
            vec!["s-004"],
        ),
        (
            "name_contains",
            SpanQuery {
                name_contains: Some("llm".into()),
                ..base()
            },
            vec!["s-001", "s-003"],
        ),
        (
            "and",
            SpanQuery {
                trace_id: Some("t-aaa".into()),
                name_contains: Some("tool".into()),
                ..base()
            },
            vec!["s-002"],
        ),
        (
            "or",
            SpanQuery {
                name: Some("reward".into()),
                span_id: Some("s-001".into()),
                filter_logic: FilterLogic::Or,
                ..base()
            },
            vec!["s-001", "s-004"],
        ),
        (
            "or with no condition (Q15)",
            SpanQuery {
                filter_logic: FilterLogic::Or,
                ..base()
            },
            vec!["s-001", "s-002", "s-003", "s-004"],
        ),
        (
            "latest attempt and a condition",
            SpanQuery {
                name_contains: Some("llm".into()),
                ..SpanQuery::of(&rid, Some("latest"))
            },
            vec![],
        ),
        (
            "one attempt and a condition",
            SpanQuery {
                parent_id: Some("s-001".into()),
                ..SpanQuery::of(&rid, Some(&a1))
            },
            vec!["s-002", "s-003"],
        ),
        (
            "sequence_id desc",
            SpanQuery {
                sort: Sort::desc("sequence_id"),
                ..base()
            },
            vec!["s-004", "s-003", "s-002", "s-001"],
        ),
        (
            "name asc",
            SpanQuery {
                sort: Sort::asc("name"),
                ..base()
            },
            vec!["s-001", "s-003", "s-004", "s-002"],
        ),
    ];
    for (what, query, expected) in cases {
        let page = store.query_spans(query).await.ctx(what)?;
        let got: Vec<&str> = page.items.iter().map(|s| s.span_id.as_str()).collect();
        ensure_eq!(got, expected, what);
        ensure_eq!(page.total, expected.len() as u64, what);
    }
    let page = store
        .query_spans(SpanQuery {
            window: Window {
                limit: Some(2),
                offset: 1,
            },
            ..base()
        })
        .await
        .ctx("window")?;
    let got: Vec<&str> = page.items.iter().map(|s| s.span_id.as_str()).collect();
    ensure_eq!(got, vec!["s-002", "s-003"], "window");
    ensure_eq!(
        (page.limit, page.offset, page.total),
        (2, 1, 4),
        "window echo"
    );
    invalid_message(
        store
            .query_spans(SpanQuery {
                sort: Sort::asc("attributes"),
                ..base()
            })
            .await,
        "sort by attributes",
    )?;
    let msg = invalid_message(
        store
            .query_spans(SpanQuery {
                sort: Sort::asc("nope"),
                ..base()
            })
            .await,
        "sort by nope",
    )?;
    ensure!(
        msg.starts_with("Invalid sort_by: nope, allowed fields are: rollout_id, attempt_id"),
        "§5.5 message: {msg}"
    );
    Ok(())
}

/// `query_resources`: `resources_id` exact and contains (always ANDed), first-write order
/// kept across updates, windows, sort by `version`; non-scalar `sort_by` → `Invalid`.
pub async fn query_resources_filters(store: &dyn LightningStore) -> CaseResult {
    let first = store
        .add_resources(llm("http://a/v1"))
        .await
        .ctx("add")?
        .resources_id;
    for id in ["alpha-1", "alpha-2", "beta"] {
        store
            .update_resources(id, llm("http://b/v1"))
            .await
            .ctx("upsert")?;
    }
    let updated = store
        .update_resources("alpha-1", llm("http://c/v1"))
        .await
        .ctx("update")?;
    ensure_eq!(updated.version, 2, "version after the second write");
    let ids = |query: ResourcesQuery| async move {
        store
            .query_resources(query)
            .await
            .map(|p| {
                (
                    p.items
                        .into_iter()
                        .map(|r| r.resources_id)
                        .collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_resources")
    };
    let cases: Vec<(&str, ResourcesQuery, Vec<&str>, u64)> = vec![
        (
            "all, first-write order",
            ResourcesQuery::default(),
            vec![first.as_str(), "alpha-1", "alpha-2", "beta"],
            4,
        ),
        (
            "exact",
            ResourcesQuery {
                resources_id: Some("beta".into()),
                ..ResourcesQuery::default()
            },
            vec!["beta"],
            1,
        ),
        (
            "contains",
            ResourcesQuery {
                resources_id_contains: Some("alpha".into()),
                ..ResourcesQuery::default()
            },
            vec!["alpha-1", "alpha-2"],
            2,
        ),
        (
            "exact and contains are ANDed",
            ResourcesQuery {
                resources_id: Some("alpha-1".into()),
                resources_id_contains: Some("beta".into()),
                ..ResourcesQuery::default()
            },
            vec![],
            0,
        ),
        (
            "window",
            ResourcesQuery {
                resources_id_contains: Some("alpha".into()),
                window: Window {
                    limit: Some(1),
                    offset: 1,
                },
                ..ResourcesQuery::default()
            },
            vec!["alpha-2"],
            2,
        ),
        (
            "version desc",
            ResourcesQuery {
                sort: Sort::desc("version"),
                ..ResourcesQuery::default()
            },
            vec!["alpha-1", first.as_str(), "alpha-2", "beta"],
            4,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = ids(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    invalid_message(
        store
            .query_resources(ResourcesQuery {
                sort: Sort::asc("resources"),
                ..ResourcesQuery::default()
            })
            .await,
        "sort by resources",
    )?;
    Ok(())
}

/// `query_workers` (`status_in`, `worker_id_contains`, `and`/`or`, sort, window) and
/// `get_worker_by_id` (`None` for an unknown id).
pub async fn query_workers_filters(store: &dyn LightningStore) -> CaseResult {
    ensure!(
        store
            .dequeue_rollout(Some("w-idle"))
            .await
            .ctx("dequeue")?
            .is_none(),
        "empty queue"
    );
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    store
        .dequeue_rollout(Some("w-busy"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    store
        .update_worker("x-unknown", None)
        .await
        .ctx("update_worker")?;
    let ids = |query: WorkerQuery| async move {
        store
            .query_workers(query)
            .await
            .map(|p| {
                (
                    p.items.into_iter().map(|w| w.worker_id).collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_workers")
    };
    let cases: Vec<(&str, WorkerQuery, Vec<&str>, u64)> = vec![
        (
            "status_in",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Busy]),
                ..WorkerQuery::default()
            },
            vec!["w-busy"],
            1,
        ),
        (
            "worker_id_contains",
            WorkerQuery {
                worker_id_contains: Some("w-".into()),
                ..WorkerQuery::default()
            },
            vec!["w-idle", "w-busy"],
            2,
        ),
        (
            "and",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Idle]),
                worker_id_contains: Some("busy".into()),
                ..WorkerQuery::default()
            },
            vec![],
            0,
        ),
        (
            "or",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Unknown]),
                worker_id_contains: Some("idle".into()),
                filter_logic: FilterLogic::Or,
                ..WorkerQuery::default()
            },
            vec!["w-idle", "x-unknown"],
            2,
        ),
        (
            "or with no condition",
            WorkerQuery {
                filter_logic: FilterLogic::Or,
                ..WorkerQuery::default()
            },
            vec!["w-idle", "w-busy", "x-unknown"],
            3,
        ),
        (
            "empty status list",
            WorkerQuery {
                status_in: Some(vec![]),
                ..WorkerQuery::default()
            },
            vec![],
            0,
        ),
        (
            "sorted window",
            WorkerQuery {
                sort: Sort::desc("worker_id"),
                window: Window {
                    limit: Some(2),
                    offset: 0,
                },
                ..WorkerQuery::default()
            },
            vec!["x-unknown", "w-idle"],
            3,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = ids(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    invalid_message(
        store
            .query_workers(WorkerQuery {
                sort: Sort::asc("heartbeat_stats"),
                ..WorkerQuery::default()
            })
            .await,
        "sort by heartbeat_stats",
    )?;
    let busy = store
        .get_worker_by_id("w-busy")
        .await
        .ctx("get_worker_by_id")?
        .ctx("w-busy")?;
    let listed = store
        .list_workers()
        .await
        .ctx("list_workers")?
        .into_iter()
        .find(|w| w.worker_id == "w-busy")
        .ctx("w-busy listed")?;
    ensure_eq!(busy, listed, "get_worker_by_id matches the listing");
    ensure_eq!(busy.status, WorkerStatus::Busy, "status");
    ensure!(
        store
            .get_worker_by_id("w-nope")
            .await
            .ctx("get_worker_by_id")?
            .is_none(),
        "unknown worker → None"
    );
    Ok(())
}

/// `dequeue_many`: up to `limit` in queue order, each a new `preparing` attempt; the worker
/// ends bound to the last one (Q29); `limit` 0 and an empty queue give `[]`.
pub async fn dequeue_many_batches(store: &dyn LightningStore) -> CaseResult {
    let ids: Vec<String> = store
        .enqueue_many(
            (0..4)
                .map(|i| EnqueueRolloutRequest::new(json!(i)))
                .collect(),
        )
        .await
        .ctx("enqueue_many")?
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();
    ensure!(
        store
            .dequeue_many(0, Some("w"))
            .await
            .ctx("dequeue_many 0")?
            .is_empty(),
        "limit 0 → []"
    );
    let got = store
        .dequeue_many(3, Some("w"))
        .await
        .ctx("dequeue_many 3")?;
    let got_ids: Vec<String> = got.iter().map(|a| a.rollout.rollout_id.clone()).collect();
    ensure_eq!(got_ids, ids[..3].to_vec(), "queue order, up to the limit");
    for a in &got {
        ensure_eq!(a.rollout.status, RolloutStatus::Preparing, "rollout status");
        ensure_eq!(a.attempt.status, AttemptStatus::Preparing, "attempt status");
        ensure_eq!(a.attempt.sequence_id, 1, "attempt sequence");
        ensure_eq!(a.attempt.rollout_id, a.rollout.rollout_id, "attempt owner");
    }
    let last = got.last().ctx("last dequeued")?;
    let worker = store
        .get_worker_by_id("w")
        .await
        .ctx("get_worker_by_id")?
        .ctx("worker w")?;
    ensure_eq!(worker.status, WorkerStatus::Busy, "worker status");
    ensure_eq!(
        worker.current_rollout_id.as_deref(),
        Some(last.rollout.rollout_id.as_str()),
        "the worker is bound to the last rollout (Q29)"
    );
    ensure_eq!(
        worker.current_attempt_id.as_deref(),
        Some(last.attempt.attempt_id.as_str()),
        "the worker is bound to the last attempt (Q29)"
    );
    let rest = store
        .dequeue_many(5, Some("w2"))
        .await
        .ctx("dequeue_many 5")?;
    let rest_ids: Vec<String> = rest.iter().map(|a| a.rollout.rollout_id.clone()).collect();
    ensure_eq!(rest_ids, ids[3..].to_vec(), "the remainder");
    ensure!(
        store
            .dequeue_many(2, None)
            .await
            .ctx("dequeue_many")?
            .is_empty(),
        "empty queue → []"
    );
    let preparing = store
        .query_rollouts(RolloutQuery::with_status(&[RolloutStatus::Preparing]))
        .await
        .ctx("query")?;
    ensure_eq!(preparing.total, 4, "every rollout dequeued exactly once");
    Ok(())
}

/// `statistics`: `rollouts_by_status` and `attempts_by_status` count every status (zeros
/// included) after a scenario that reaches each of them.
pub async fn statistics_by_status(store: &dyn LightningStore) -> CaseResult {
    use AttemptStatus as A;
    use RolloutStatus as R;
    let start = |config: RolloutConfig| store.start_rollout(with_config(json!(0), config), None);
    // queuing (no attempt)
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    // preparing
    start(RolloutConfig::default()).await.ctx("start")?;
    // running
    let r = start(RolloutConfig::default()).await.ctx("start")?;
    store
        .add_span(plain_span(
            &r.rollout.rollout_id,
            &r.attempt.attempt_id,
            1,
            "x",
        ))
        .await
        .ctx("span")?;
    // succeeded, failed, timeout → failed, failed → requeuing, unresponsive → requeuing
    for (config, attempt_status) in [
        (RolloutConfig::default(), A::Succeeded),
        (RolloutConfig::default(), A::Failed),
        (RolloutConfig::default(), A::Timeout),
        (retry(2, &[A::Failed]), A::Failed),
        (retry(2, &[A::Unresponsive]), A::Unresponsive),
    ] {
        let s = start(config).await.ctx("start")?;
        store
            .update_attempt(&s.rollout.rollout_id, "latest", status(attempt_status))
            .await
            .ctx("update_attempt")?;
    }
    // cancelled (no attempt)
    let c = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(2)))
        .await
        .ctx("enqueue")?;
    store
        .update_rollout(&c.rollout_id, set_status(R::Cancelled))
        .await
        .ctx("cancel")?;

    let stats = store.statistics().await.ctx("statistics")?;
    let rollouts: Vec<(RolloutStatus, u64)> = stats.rollouts_by_status.into_iter().collect();
    let mut expected_rollouts = vec![
        (R::Queuing, 1),
        (R::Preparing, 1),
        (R::Running, 1),
        (R::Failed, 2),
        (R::Succeeded, 1),
        (R::Cancelled, 1),
        (R::Requeuing, 2),
    ];
    expected_rollouts.sort();
    ensure_eq!(rollouts, expected_rollouts, "rollouts_by_status");
    let attempts: Vec<(AttemptStatus, u64)> = stats.attempts_by_status.into_iter().collect();
    let mut expected_attempts = vec![
        (A::Preparing, 1),
        (A::Running, 1),
        (A::Failed, 2),
        (A::Succeeded, 1),
        (A::Unresponsive, 1),
        (A::Timeout, 1),
    ];
    expected_attempts.sort();
    ensure_eq!(attempts, expected_attempts, "attempts_by_status");
    ensure_eq!(
        (stats.total_rollouts, stats.total_attempts),
        (9, 7),
        "totals"
    );
    Ok(())
}

/// Refused transitions (`lifecycle::check_attempt_transition`,
/// `lifecycle::check_rollout_transition`) are `InvalidTransition` errors naming both statuses
/// and change nothing: not the other fields of the update, not the rollout, worker or queue.
pub async fn illegal_transitions_refused(store: &dyn LightningStore) -> CaseResult {
    use AttemptStatus as A;
    use RolloutStatus as R;
    // Attempts.
    let succeeded = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), Some("w1".into()))
        .await
        .ctx("start")?;
    let failed = store
        .start_rollout(EnqueueRolloutRequest::new(json!(2)), None)
        .await
        .ctx("start")?;
    let timed_out = store
        .start_rollout(EnqueueRolloutRequest::new(json!(3)), None)
        .await
        .ctx("start")?;
    let running = store
        .start_rollout(EnqueueRolloutRequest::new(json!(4)), None)
        .await
        .ctx("start")?;
    for (s, to) in [
        (&succeeded, A::Succeeded),
        (&failed, A::Failed),
        (&timed_out, A::Timeout),
    ] {
        store
            .update_attempt(&s.rollout.rollout_id, "latest", status(to))
            .await
            .ctx("finish attempt")?;
    }
    store
        .add_span(plain_span(
            &running.rollout.rollout_id,
            &running.attempt.attempt_id,
            1,
            "x",
        ))
        .await
        .ctx("span")?;
    let refused_attempts = [
        (
            &succeeded,
            "succeeded",
            vec![
                A::Running,
                A::Preparing,
                A::Failed,
                A::Timeout,
                A::Unresponsive,
            ],
        ),
        (
            &failed,
            "failed",
            vec![A::Running, A::Preparing, A::Timeout, A::Unresponsive],
        ),
        (
            &timed_out,
            "timeout",
            vec![A::Running, A::Preparing, A::Unresponsive],
        ),
        (&running, "running", vec![A::Preparing]),
    ];
    for (s, from, targets) in refused_attempts {
        let (rid, aid) = (&s.rollout.rollout_id, &s.attempt.attempt_id);
        let rollout_before = rollout_of(store, rid).await?;
        let attempt_before = latest_of(store, rid).await?;
        for to in targets {
            let update = AttemptUpdate {
                status: Some(to),
                worker_id: Some("w-other".into()),
                last_heartbeat_time: Some(1.0),
                metadata: Some(json!({"late": true})),
            };
            refused_transition(
                store.update_attempt(rid, aid, update).await,
                EntityKind::Attempt,
                aid,
                from,
                to.as_str(),
            )?;
        }
        ensure_eq!(
            latest_of(store, rid).await?,
            attempt_before,
            format!("a refused update leaves the {from} attempt unchanged")
        );
        ensure_eq!(
            rollout_of(store, rid).await?,
            rollout_before,
            format!("a refused update leaves the rollout of the {from} attempt unchanged")
        );
    }
    ensure!(
        store
            .get_worker_by_id("w-other")
            .await
            .ctx("get_worker_by_id")?
            .is_none(),
        "a refused update binds no worker"
    );
    ensure_eq!(
        worker_status(store, "w1").await?,
        WorkerStatus::Idle,
        "the worker of the succeeded attempt stays idle"
    );

    // Rollouts.
    let queued = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(5)))
        .await
        .ctx("enqueue")?
        .rollout_id;
    let requeued = store
        .start_rollout(with_config(json!(6), retry(2, &[A::Failed])), None)
        .await
        .ctx("start")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&requeued, "latest", status(A::Failed))
        .await
        .ctx("fail")?;
    let cancelled = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(7)))
        .await
        .ctx("enqueue")?
        .rollout_id;
    store
        .update_rollout(&cancelled, set_status(R::Cancelled))
        .await
        .ctx("cancel")?;
    let refused_rollouts = [
        (&queued, "queuing", vec![R::Preparing, R::Running]),
        (&requeued, "requeuing", vec![R::Preparing, R::Running]),
        (
            &succeeded.rollout.rollout_id,
            "succeeded",
            vec![R::Failed, R::Cancelled, R::Preparing, R::Running],
        ),
        (
            &failed.rollout.rollout_id,
            "failed",
            vec![R::Succeeded, R::Cancelled, R::Running],
        ),
        (
            &cancelled,
            "cancelled",
            vec![R::Succeeded, R::Failed, R::Preparing],
        ),
    ];
    for (rid, from, targets) in refused_rollouts {
        let before = rollout_of(store, rid).await?;
        ensure_eq!(before.status.as_str(), from, "status before");
        for to in targets {
            let update = RolloutUpdate {
                status: Some(to),
                metadata: Some(json!({"changed": true})),
                mode: Some(Some(RolloutMode::Test)),
                ..RolloutUpdate::default()
            };
            refused_transition(
                store.update_rollout(rid, update).await,
                EntityKind::Rollout,
                rid,
                from,
                to.as_str(),
            )?;
        }
        ensure_eq!(
            rollout_of(store, rid).await?,
            before,
            format!("refused updates leave the {from} rollout unchanged")
        );
    }
    // The refusals neither added nor removed queue entries.
    let mut dispatched: Vec<String> = Vec::new();
    while let Some(a) = store.dequeue_rollout(None).await.ctx("dequeue")? {
        dispatched.push(a.rollout.rollout_id);
        ensure!(dispatched.len() <= 2, "too many dispatches: {dispatched:?}");
    }
    dispatched.sort();
    let mut expected = vec![queued, requeued];
    expected.sort();
    ensure_eq!(dispatched, expected, "queued rollouts dispatched once each");
    Ok(())
}

/// The allowed transitions of the state machine: late success (`failed`/`timeout` →
/// `succeeded`), `timeout` → `failed`, `unresponsive` → `running` (by span and by update),
/// `running` → `cancelled`, a finished rollout re-enqueued by `queuing`/`requeuing`,
/// `preparing` ↔ `running`, and same → same as an idempotent no-op.
pub async fn allowed_transitions_apply(store: &dyn LightningStore) -> CaseResult {
    use AttemptStatus as A;
    use RolloutStatus as R;
    // failed → succeeded.
    let late = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&late, "latest", status(A::Failed))
        .await
        .ctx("fail")?;
    ensure_eq!(rollout_of(store, &late).await?.status, R::Failed, "failed");
    let a = store
        .update_attempt(&late, "latest", status(A::Succeeded))
        .await
        .ctx("late success")?;
    ensure_eq!(a.status, A::Succeeded, "attempt after the late success");
    ensure!(a.end_time.is_some(), "succeeded attempt has an end_time");
    let r = rollout_of(store, &late).await?;
    ensure_eq!(r.status, R::Succeeded, "the late success is kept");
    ensure!(r.end_time.is_some(), "end_time");

    // timeout → succeeded, and timeout → failed → succeeded.
    for via_failed in [false, true] {
        let rid = store
            .start_rollout(EnqueueRolloutRequest::new(json!(2)), None)
            .await
            .ctx("start")?
            .rollout
            .rollout_id;
        let a = store
            .update_attempt(&rid, "latest", status(A::Timeout))
            .await
            .ctx("timeout")?;
        ensure!(a.end_time.is_some(), "timeout is final (Q8)");
        ensure_eq!(rollout_of(store, &rid).await?.status, R::Failed, "failed");
        if via_failed {
            let a = store
                .update_attempt(&rid, "latest", status(A::Failed))
                .await
                .ctx("timeout → failed")?;
            ensure_eq!(a.status, A::Failed, "timeout → failed");
            ensure_eq!(rollout_of(store, &rid).await?.status, R::Failed, "failed");
        }
        store
            .update_attempt(&rid, "latest", status(A::Succeeded))
            .await
            .ctx("late success")?;
        ensure_eq!(
            rollout_of(store, &rid).await?.status,
            R::Succeeded,
            "late success after a timeout"
        );
    }

    // unresponsive → running, by a span and by an update.
    let s = store
        .start_rollout(
            with_config(json!(3), retry(2, &[A::Unresponsive])),
            Some("w1".into()),
        )
        .await
        .ctx("start")?;
    let (quiet, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let a = store
        .update_attempt(&quiet, &aid, status(A::Unresponsive))
        .await
        .ctx("unresponsive")?;
    ensure_eq!(a.end_time, None, "unresponsive keeps end_time null (Q8)");
    ensure_eq!(
        rollout_of(store, &quiet).await?.status,
        R::Requeuing,
        "retryable unresponsive → requeuing"
    );
    store
        .add_span(plain_span(&quiet, &aid, 1, "back"))
        .await
        .ctx("span")?
        .ctx("span stored")?;
    ensure_eq!(
        latest_of(store, &quiet).await?.status,
        A::Running,
        "a span revives the attempt"
    );
    ensure_eq!(
        rollout_of(store, &quiet).await?.status,
        R::Running,
        "and its rollout"
    );
    store
        .update_attempt(&quiet, &aid, status(A::Unresponsive))
        .await
        .ctx("unresponsive again")?;
    let a = store
        .update_attempt(&quiet, &aid, status(A::Running))
        .await
        .ctx("unresponsive → running")?;
    ensure_eq!(a.status, A::Running, "attempt revived by an update");
    ensure_eq!(
        rollout_of(store, &quiet).await?.status,
        R::Running,
        "rollout follows"
    );
    ensure!(
        store.dequeue_rollout(None).await.ctx("dequeue")?.is_none(),
        "the stale requeuing entries are skipped"
    );

    // running → cancelled, then cancelled → requeuing re-enqueues.
    let r = store
        .update_rollout(&quiet, set_status(R::Cancelled))
        .await
        .ctx("cancel")?;
    ensure_eq!(r.status, R::Cancelled, "cancelled");
    ensure!(r.end_time.is_some(), "cancelled sets end_time");
    ensure_eq!(
        latest_of(store, &quiet).await?.status,
        A::Running,
        "cancelling the rollout leaves its attempt alone"
    );
    let r = store
        .update_rollout(&quiet, set_status(R::Requeuing))
        .await
        .ctx("requeue")?;
    ensure_eq!(
        (r.status, r.end_time),
        (R::Requeuing, None),
        "requeued, end_time cleared"
    );

    // succeeded → queuing re-enqueues too; both come back in order with a new attempt.
    let r = store
        .update_rollout(&late, set_status(R::Queuing))
        .await
        .ctx("re-enqueue")?;
    ensure_eq!((r.status, r.end_time), (R::Queuing, None), "re-enqueued");
    for (rid, attempts) in [(&quiet, 2), (&late, 2)] {
        let d = store
            .dequeue_rollout(None)
            .await
            .ctx("dequeue")?
            .ctx("re-enqueued rollout dispatched")?;
        ensure_eq!(&d.rollout.rollout_id, rid, "queue order");
        ensure_eq!(d.attempt.sequence_id, attempts, "new attempt");
    }

    // preparing ↔ running by hand.
    let r = store
        .update_rollout(&late, set_status(R::Running))
        .await
        .ctx("preparing → running")?;
    ensure_eq!(r.status, R::Running, "running");
    let r = store
        .update_rollout(&late, set_status(R::Preparing))
        .await
        .ctx("running → preparing")?;
    ensure_eq!(r.status, R::Preparing, "preparing");

    // same → same changes nothing.
    let done = store
        .start_rollout(EnqueueRolloutRequest::new(json!(4)), None)
        .await
        .ctx("start")?
        .rollout
        .rollout_id;
    let first = store
        .update_attempt(&done, "latest", status(A::Succeeded))
        .await
        .ctx("succeed")?;
    let before = rollout_of(store, &done).await?;
    pause().await;
    let again = store
        .update_attempt(&done, "latest", status(A::Succeeded))
        .await
        .ctx("succeed again")?;
    ensure_eq!(again, first, "succeeded → succeeded is a no-op");
    let r = store
        .update_rollout(&done, set_status(R::Succeeded))
        .await
        .ctx("succeeded again")?;
    ensure_eq!(r, before, "succeeded → succeeded keeps end_time");
    Ok(())
}

/// `run_watchdog()` alone detects a timed-out attempt (no other call in between) and reports
/// how many attempts it changed.
pub async fn run_watchdog_detects_timeouts(store: &dyn LightningStore) -> CaseResult {
    let config = RolloutConfig {
        timeout_seconds: Some(0.02),
        ..RolloutConfig::default()
    };
    // A background sweeper (if the backend has one) may get there first; then try again with
    // a new rollout. Three losses in a row mean run_watchdog is not what detects timeouts.
    for _ in 0..3 {
        store
            .start_rollout(with_config(json!("slow"), config.clone()), None)
            .await
            .ctx("start_rollout")?;
        tokio::time::sleep(Duration::from_millis(60)).await;
        let before = store.statistics().await.ctx("statistics")?;
        if before.attempts_by_status.get(&AttemptStatus::Preparing) != Some(&1) {
            continue;
        }
        let changed = store.run_watchdog().await.ctx("run_watchdog")?;
        ensure_eq!(changed, 1, "attempts changed by run_watchdog");
        let after = store.statistics().await.ctx("statistics")?;
        ensure_eq!(
            after.attempts_by_status.get(&AttemptStatus::Preparing),
            Some(&0),
            "no attempt left preparing"
        );
        ensure_eq!(
            after.rollouts_by_status.get(&RolloutStatus::Preparing),
            Some(&0),
            "no rollout left preparing"
        );
        let timeouts = after.attempts_by_status.get(&AttemptStatus::Timeout);
        let failed = after.rollouts_by_status.get(&RolloutStatus::Failed);
        ensure!(
            timeouts.is_some() && timeouts == failed,
            "every timed-out attempt failed its rollout: {timeouts:?} {failed:?}"
        );
        ensure_eq!(
            store.run_watchdog().await.ctx("run_watchdog")?,
            0,
            "a second scan finds nothing"
        );
        return Ok(());
    }
    Err("a background task always detected the timeout before run_watchdog() ran".into())
}
