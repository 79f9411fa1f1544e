//! Store workloads for benchmarks: the runner's rollout cycle and span queries at scale.
//!
//! Responsible for driving any [`LightningStore`] the way Agent Lightning's runners do and
//! timing every operation, so `benches/store.rs` (criterion) and `agl bench store` (tail
//! latency) measure the same thing. Not responsible for building stores or printing.
//!
//! **The cycle** (one rollout): `enqueue_rollout` → `dequeue_rollout` (creates the attempt) →
//! `update_attempt(status = running)` (the runner starts its attempt) → `add_spans` (a batch
//! of `spans_per_rollout` spans, as a runner flushes its tracer) → `update_attempt(status =
//! succeeded)`. `workers` tokio tasks run cycles concurrently against one shared store until
//! `rollouts` cycles are done; each task enqueues one rollout then dequeues the head of the
//! queue (not necessarily its own), as runners sharing a queue do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agl_core::{AttemptStatus, AttributeValue, Attributes, EnqueueRolloutRequest, Span};
use serde::Serialize;
use serde_json::json;

use crate::error::StoreError;
use crate::query::SpanQuery;
use crate::store::{AttemptUpdate, LightningStore};
use agl_core::semconv;

/// The operations of the cycle, in order.
pub const CYCLE_OPERATIONS: [&str; 5] = [
    "enqueue_rollout",
    "dequeue_rollout",
    "update_attempt(running)",
    "add_spans",
    "update_attempt(succeeded)",
];

/// Latency summary of one operation, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpLatency {
    /// Operation name (one of [`CYCLE_OPERATIONS`] or `query_spans`).
    pub operation: String,
    /// Calls timed.
    pub calls: usize,
    /// Mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
}

impl OpLatency {
    /// Summarises raw durations (nearest-rank percentiles).
    pub fn from_samples(operation: &str, mut samples: Vec<Duration>) -> OpLatency {
        samples.sort_unstable();
        let n = samples.len();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let rank = |p: f64| {
            if n == 0 {
                return 0.0;
            }
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            us(samples[i])
        };
        let mean = if n == 0 {
            0.0
        } else {
            samples.iter().map(|d| us(*d)).sum::<f64>() / n as f64
        };
        OpLatency {
            operation: operation.to_string(),
            calls: n,
            mean_us: mean,
            p50_us: rank(0.50),
            p99_us: rank(0.99),
        }
    }
}

/// Result of [`run_cycles`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CycleReport {
    /// Completed cycles.
    pub rollouts: usize,
    /// Concurrent worker tasks.
    pub workers: usize,
    /// Spans added per rollout.
    pub spans_per_rollout: usize,
    /// Wall time, seconds.
    pub seconds: f64,
    /// `rollouts / seconds`.
    pub rollouts_per_second: f64,
    /// One entry per operation of the cycle, in [`CYCLE_OPERATIONS`] order.
    pub latencies: Vec<OpLatency>,
}

/// `n` spans of one attempt, shaped like a runner's: an LLM call with token counts, tool calls
/// and a final reward annotation (`agentlightning.annotation`, reward `0.5`).
pub fn sample_spans(rollout_id: &str, attempt_id: &str, n: usize) -> Vec<Span> {
    (0..n)
        .map(|i| {
            let last = i + 1 == n;
            let mut attributes = Attributes::new();
            let name = if last {
                attributes.insert(
                    "agentlightning.reward.0.name".into(),
                    AttributeValue::from("primary"),
                );
                attributes.insert(
                    "agentlightning.reward.0.value".into(),
                    AttributeValue::from(0.5),
                );
                "agentlightning.annotation"
            } else if i % 2 == 0 {
                attributes.insert(semconv::gen_ai::REQUEST_MODEL.into(), "policy".into());
                attributes.insert(
                    semconv::gen_ai::USAGE_PROMPT_TOKENS.into(),
                    AttributeValue::from(412i64),
                );
                attributes.insert(
                    semconv::gen_ai::USAGE_COMPLETION_TOKENS.into(),
                    AttributeValue::from(37i64),
                );
                "openai.chat.completion"
            } else {
                attributes.insert("tool.name".into(), "sql.execute".into());
                attributes.insert("tool.rows".into(), AttributeValue::from(10i64));
                "tool.call"
            };
            let seq = i64::try_from(i + 1).unwrap_or(i64::MAX);
            Span::new(rollout_id, attempt_id, seq, name, attributes)
        })
        .collect()
}

fn status(s: AttemptStatus) -> AttemptUpdate {
    AttemptUpdate {
        status: Some(s),
        ..AttemptUpdate::default()
    }
}

/// Runs `rollouts` cycles with `workers` concurrent tasks on the current tokio runtime and
/// times every operation. The store should be empty (queued rollouts of others would be
/// dequeued too and counted).
pub async fn run_cycles(
    store: Arc<dyn LightningStore>,
    rollouts: usize,
    workers: usize,
    spans_per_rollout: usize,
) -> Result<CycleReport, StoreError> {
    let workers = workers.max(1);
    let remaining = Arc::new(AtomicUsize::new(rollouts));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let store = Arc::clone(&store);
        let remaining = Arc::clone(&remaining);
        tasks.push(tokio::spawn(async move {
            let worker = format!("bench-{w}");
            let mut samples: [Vec<Duration>; 5] = Default::default();
            let mut done = 0usize;
            while remaining
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                let t = Instant::now();
                store
                    .enqueue_rollout(EnqueueRolloutRequest::new(json!({"task": done})))
                    .await?;
                samples[0].push(t.elapsed());
                let t = Instant::now();
                let Some(attempted) = store.dequeue_rollout(Some(&worker)).await? else {
                    return Err(StoreError::Backend(
                        "benchmark: the queue was empty right after an enqueue".into(),
                    ));
                };
                samples[1].push(t.elapsed());
                let rid = attempted.rollout.rollout_id;
                let aid = attempted.attempt.attempt_id;
                let t = Instant::now();
                store
                    .update_attempt(&rid, &aid, status(AttemptStatus::Running))
                    .await?;
                samples[2].push(t.elapsed());
                let spans = sample_spans(&rid, &aid, spans_per_rollout);
                let t = Instant::now();
                if !spans.is_empty() {
                    store.add_spans(spans).await?;
                }
                samples[3].push(t.elapsed());
                let t = Instant::now();
                store
                    .update_attempt(&rid, &aid, status(AttemptStatus::Succeeded))
                    .await?;
                samples[4].push(t.elapsed());
                done += 1;
            }
            Ok::<_, StoreError>(samples)
        }));
    }
    let mut all: [Vec<Duration>; 5] = Default::default();
    for task in tasks {
        let samples = task
            .await
            .map_err(|e| StoreError::Backend(format!("benchmark worker: {e}")))??;
        for (acc, s) in all.iter_mut().zip(samples) {
            acc.extend(s);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(CycleReport {
        rollouts,
        workers,
        spans_per_rollout,
        seconds,
        rollouts_per_second: rollouts as f64 / seconds.max(f64::EPSILON),
        latencies: CYCLE_OPERATIONS
            .iter()
            .zip(all)
            .map(|(op, s)| OpLatency::from_samples(op, s))
            .collect(),
    })
}

/// Fills a store with `total_spans` spans spread over rollouts of `spans_per_rollout` spans
/// each (one attempt per rollout, spans added in batches of 1,000); returns the rollout ids.
pub async fn fill_spans(
    store: &dyn LightningStore,
    total_spans: usize,
    spans_per_rollout: usize,
) -> Result<Vec<String>, StoreError> {
    let per = spans_per_rollout.max(1);
    let mut ids = Vec::with_capacity(total_spans / per + 1);
    let mut batch = Vec::with_capacity(1000);
    let mut left = total_spans;
    while left > 0 {
        let n = left.min(per);
        let attempted = store
            .start_rollout(EnqueueRolloutRequest::new(json!(ids.len())), None)
            .await?;
        let (rid, aid) = (attempted.rollout.rollout_id, attempted.attempt.attempt_id);
        batch.extend(sample_spans(&rid, &aid, n));
        if batch.len() >= 1000 {
            store.add_spans(std::mem::take(&mut batch)).await?;
        }
        ids.push(rid);
        left -= n;
    }
    if !batch.is_empty() {
        store.add_spans(batch).await?;
    }
    Ok(ids)
}

/// Times `queries` span queries (all spans of one rollout, default order) over rollouts picked
/// round-robin with a stride from `ids`; checks each returns `expected` spans.
pub async fn query_spans_latency(
    store: &dyn LightningStore,
    ids: &[String],
    queries: usize,
    expected: usize,
) -> Result<OpLatency, StoreError> {
    let mut samples = Vec::with_capacity(queries);
    if ids.is_empty() {
        return Ok(OpLatency::from_samples("query_spans", samples));
    }
    for q in 0..queries {
        let id = &ids[(q * 7919) % ids.len()];
        let t = Instant::now();
        let page = store.query_spans(SpanQuery::of(id, None)).await?;
        samples.push(t.elapsed());
        if page.items.len() != expected {
            return Err(StoreError::Backend(format!(
                "benchmark: rollout {id} returned {} spans, expected {expected}",
                page.items.len()
            )));
        }
    }
    Ok(OpLatency::from_samples("query_spans", samples))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::InMemoryLightningStore;
    use agl_core::RolloutStatus;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cycles_finish_every_rollout_with_its_spans() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let report = run_cycles(Arc::clone(&store), 200, 4, 10).await.unwrap();
        assert_eq!(report.rollouts, 200);
        assert_eq!(report.latencies.len(), 5);
        assert!(report.latencies.iter().all(|l| l.calls == 200));
        let stats = store.statistics().await.unwrap();
        assert_eq!(stats.total_spans, 2000);
        assert_eq!(stats.rollouts_by_status[&RolloutStatus::Succeeded], 200);
    }

    #[tokio::test]
    async fn span_queries_find_every_span_of_the_rollout() {
        let store = InMemoryLightningStore::new();
        let ids = fill_spans(&store, 2500, 10).await.unwrap();
        assert_eq!(ids.len(), 250);
        let lat = query_spans_latency(&store, &ids, 50, 10).await.unwrap();
        assert_eq!(lat.calls, 50);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples = (1..=100).map(Duration::from_micros).collect();
        let l = OpLatency::from_samples("x", samples);
        assert_eq!(l.p50_us.round(), 50.0);
        assert_eq!(l.p99_us.round(), 99.0);
    }
}
