#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Integration tests of the in-memory backend through the public API: concurrency, scale,
//! and the default watchdog debounce.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agl_core::{
    AttemptStatus, Attributes, EnqueueRolloutRequest, RolloutConfig, RolloutStatus, Span,
};
use agl_store::{AttemptUpdate, InMemoryLightningStore, LightningStore, RolloutQuery};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_workers_never_receive_the_same_rollout() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let requests = (0..2000)
        .map(|i| EnqueueRolloutRequest::new(json!(i)))
        .collect();
    let enqueued = store.enqueue_many(requests).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let worker = format!("Worker-{w}");
            let mut got = Vec::new();
            while let Some(a) = store.dequeue_rollout(Some(&worker)).await.unwrap() {
                store
                    .update_attempt(
                        &a.rollout.rollout_id,
                        &a.attempt.attempt_id,
                        AttemptUpdate {
                            status: Some(AttemptStatus::Succeeded),
                            ..AttemptUpdate::default()
                        },
                    )
                    .await
                    .unwrap();
                got.push(a.rollout.rollout_id);
            }
            got
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tasks {
        for id in t.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "rollout dispatched twice");
        }
    }
    assert_eq!(total, enqueued.len());
    let ids: Vec<String> = enqueued.into_iter().map(|r| r.rollout_id).collect();
    let done = store
        .wait_for_rollouts(&ids, Some(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(done.len(), ids.len());
    assert!(done.iter().all(|r| r.status == RolloutStatus::Succeeded));
}

#[tokio::test]
async fn handles_a_hundred_thousand_rollouts_and_three_hundred_thousand_spans() {
    let store = InMemoryLightningStore::new();
    let n = 100_000;
    let requests = (0..n)
        .map(|i| EnqueueRolloutRequest::new(json!(i)))
        .collect();
    let enqueued = store.enqueue_many(requests).await.unwrap();
    assert_eq!(enqueued.len(), n);
    let mut first = None;
    for expected in &enqueued {
        let a = store.dequeue_rollout(Some("w")).await.unwrap().unwrap();
        // FIFO: rollouts come out in enqueue order.
        assert_eq!(a.rollout.rollout_id, expected.rollout_id);
        let (rid, aid) = (a.rollout.rollout_id, a.attempt.attempt_id);
        let spans = (0..3)
            .map(|k| Span::new(rid.as_str(), aid.as_str(), k + 1, "step", Attributes::new()))
            .collect();
        assert_eq!(store.add_spans(spans).await.unwrap().len(), 3);
        if first.is_none() {
            first = Some(rid);
        }
    }
    assert!(store.dequeue_rollout(Some("w")).await.unwrap().is_none());
    let stats = store.statistics().await.unwrap();
    assert_eq!(stats.total_rollouts, n as u64);
    assert_eq!(stats.total_spans, 3 * n as u64);
    let spans = store.list_spans(&first.unwrap(), None).await.unwrap();
    assert_eq!(
        spans.iter().map(|s| s.sequence_id).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let running = store
        .query_rollouts(RolloutQuery::with_status(&[RolloutStatus::Running]))
        .await
        .unwrap();
    assert_eq!(running.items.len(), n);
    assert_eq!(running.total, n as u64);
}

#[tokio::test]
async fn default_debounce_delays_the_second_scan() {
    // Default debounce is 10 s: the first call scans, later calls within 10 s do not.
    let store = InMemoryLightningStore::new();
    let config = RolloutConfig {
        timeout_seconds: Some(0.01),
        ..RolloutConfig::default()
    };
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest {
            config: Some(config),
            ..EnqueueRolloutRequest::new(json!(1))
        })
        .await
        .unwrap();
    store.dequeue_rollout(None).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let still = store
        .get_rollout_by_id(&r.rollout_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(still.status, RolloutStatus::Preparing);

    // With debounce 0 the same sequence detects the timeout.
    let eager = InMemoryLightningStore::with_scan_debounce_seconds(0.0);
    let r = eager
        .enqueue_rollout(EnqueueRolloutRequest {
            config: Some(RolloutConfig {
                timeout_seconds: Some(0.01),
                ..RolloutConfig::default()
            }),
            ..EnqueueRolloutRequest::new(json!(1))
        })
        .await
        .unwrap();
    eager.dequeue_rollout(None).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let timed_out = eager
        .get_rollout_by_id(&r.rollout_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(timed_out.status, RolloutStatus::Failed);
}
