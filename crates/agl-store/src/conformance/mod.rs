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
//!
//! The cases live in one private module per area and are re-exported here, so every case keeps
//! its path `agl_store::conformance::<case>`: the rollout and attempt lifecycle (`rollouts`),
//! retries and the watchdog (`watchdog`), the queue and workers (`queue`), spans and sequence
//! ids (`spans`), resources (`resources`), `wait_for_rollouts` (`wait`), rollout queries
//! (`rollout_queries`), the other queries (`queries`), statistics (`statistics`) and refused or
//! allowed requests and transitions (`transitions`). This file holds the entry points
//! ([`CASES`], [`run_all`]) and the helpers several areas share.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use agl_core::{
    Attempt, AttemptStatus, Attributes, EnqueueRolloutRequest, NamedResources, Resource, Rollout,
    RolloutConfig, RolloutStatus, Span, WorkerStatus,
};
use serde_json::{Value, json};

use crate::error::StoreError;
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

// The areas. Declared after `ensure!` and `ensure_eq!`, which they use.
mod queries;
mod queue;
mod resources;
mod rollout_queries;
mod rollouts;
mod spans;
mod statistics;
mod transitions;
mod wait;
mod watchdog;

pub use self::queries::{
    query_attempts_paging, query_resources_filters, query_spans_filters,
    query_spans_order_and_latest, query_workers_filters,
};
pub use self::queue::{dequeue_many_batches, stale_queue_entries_skipped, workers_idle_busy};
pub use self::resources::resources_versions_and_latest;
pub use self::rollout_queries::{
    query_rollouts_conditions, query_rollouts_filters, query_rollouts_sorting,
    query_rollouts_window,
};
pub use self::rollouts::{
    happy_path, older_attempt_does_not_propagate, start_rollout_and_start_attempt,
    terminal_rollouts_protected, update_rollout_requeues_and_end_time,
};
pub use self::spans::{
    duplicate_spans_dropped, fresh_ids_with_spans, sequence_id_blocks, sequence_ids,
    span_for_unknown_target,
};
pub use self::statistics::{statistics_by_status, statistics_counts};
pub use self::transitions::{
    allowed_transitions_apply, illegal_transitions_refused, invalid_inputs_rejected,
};
pub use self::wait::{
    wait_reports_current_states, wait_returns_at_timeout, wait_running_waits_for_timeout,
    wait_unknown_ids_return_at_once, wait_wakes_when_finished,
};
pub use self::watchdog::{
    retry_then_fail, run_watchdog_detects_timeouts, timeout_watchdog, unresponsive_recovers,
    wait_resolves_watchdog_timeouts,
};

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

fn llm(endpoint: &str) -> NamedResources {
    let resource: Resource = match serde_json::from_value(json!({
        "resource_type": "llm", "endpoint": endpoint, "model": "m"
    })) {
        Ok(r) => r,
        Err(_) => return NamedResources::new(),
    };
    NamedResources::from([("main_llm".to_string(), resource)])
}

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
    ("wait_unknown_ids_return_at_once", |s| {
        Box::pin(wait_unknown_ids_return_at_once(s))
    }),
    ("wait_running_waits_for_timeout", |s| {
        Box::pin(wait_running_waits_for_timeout(s))
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
