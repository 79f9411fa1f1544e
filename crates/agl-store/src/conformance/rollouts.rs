//! Conformance cases for the rollout and attempt lifecycle: the happy path from enqueue to
//! success, `update_rollout`, `start_rollout`/`start_attempt`, terminal rollouts that late
//! reports must not revive, and updates of an older attempt (§4.1 to §4.4, §5.6, Q6, Q7).
//!
//! Not covered here: retries and the watchdog (`watchdog`), the queue and workers (`queue`),
//! the state machine's full tables (`transitions`) and queries (`rollout_queries`, `queries`).

use std::time::Duration;

use agl_core::semconv::AGL_ANNOTATION;
use agl_core::{
    AttemptStatus, EnqueueRolloutRequest, RolloutMode, RolloutStatus, Span, WorkerStatus,
    find_final_reward, reward_attributes,
};
use serde_json::{Map, Value, json};

use crate::error::{EntityKind, StoreError};
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate};

use super::{CaseResult, Ctx, plain_span, retry, status, with_config, worker_status};

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
