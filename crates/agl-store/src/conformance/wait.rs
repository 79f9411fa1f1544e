//! Conformance cases for `wait_for_rollouts`: waking when a rollout finishes, reporting the
//! states current when it returns, and returning at the timeout.
//!
//! Not covered here: the watchdog timeouts a wait resolves (`watchdog`).

use std::time::Duration;

use agl_core::{AttemptStatus, EnqueueRolloutRequest, RolloutStatus};
use serde_json::json;

use crate::store::{LightningStore, RolloutUpdate};

use super::{CaseResult, Ctx, status};

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
