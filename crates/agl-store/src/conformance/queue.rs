//! Conformance cases for the queue and the workers: stale queue entries, `dequeue_many`, and
//! the worker status that follows its attempts (§4.4, §4.9, Q29).
//!
//! Not covered here: querying workers (`queries`) and the rollout lifecycle around dequeuing
//! (`rollouts`).

use agl_core::{AttemptStatus, EnqueueRolloutRequest, RolloutStatus, WorkerStatus};
use serde_json::json;

use crate::error::StoreError;
use crate::query::RolloutQuery;
use crate::store::{LightningStore, RolloutUpdate};

use super::{CaseResult, Ctx, status};

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
