//! Conformance cases for what the store refuses and allows: invalid requests, the refused
//! transitions of [`crate::lifecycle`] (`InvalidTransition`, nothing changed) and the allowed
//! ones, including late success and idempotent same-status updates.
//!
//! Not covered here: the watchdog's own transitions (`watchdog`) and the lifecycle scenarios
//! (`rollouts`).

use agl_core::{AttemptStatus, EnqueueRolloutRequest, RolloutMode, RolloutStatus, WorkerStatus};
use serde_json::{Value, json};

use crate::error::{EntityKind, StoreError};
use crate::query::RolloutQuery;
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate};

use super::{
    CaseResult, Ctx, latest_of, pause, plain_span, retry, rollout_of, set_status, status,
    with_config, worker_status,
};

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
