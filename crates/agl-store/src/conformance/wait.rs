//! Conformance cases for `wait_for_rollouts`: waking when a rollout finishes, reporting the
//! states current when it returns, returning at the timeout, and never waiting for ids the
//! store does not hold.
//!
//! Not covered here: the watchdog timeouts a wait resolves (`watchdog`).

use std::time::{Duration, Instant};

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

/// An id the store does not hold never makes the call wait: alone or next to a finished
/// rollout, the answer comes at once (well within 100 ms) even with a 5 s timeout or none, and
/// the unknown id is simply absent from it.
pub async fn wait_unknown_ids_return_at_once(store: &dyn LightningStore) -> CaseResult {
    let unknown = vec!["ro-unknown".to_string()];
    for timeout in [Some(Duration::from_secs(5)), None] {
        let started = Instant::now();
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            store.wait_for_rollouts(&unknown, timeout),
        )
        .await
        .map_err(|_| format!("an unknown id with timeout {timeout:?} blocked for 10 s"))?
        .ctx("wait")?;
        let took = started.elapsed();
        ensure!(got.is_empty(), "an unknown id is absent from the answer");
        ensure!(
            took < Duration::from_millis(100),
            "an unknown id with timeout {timeout:?} answered after {took:?}"
        );
    }
    let done = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let done_id = done.rollout.rollout_id;
    store
        .update_attempt(&done_id, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed")?;
    let ids = vec![
        "ro-unknown-1".to_string(),
        done_id.clone(),
        "ro-unknown-2".to_string(),
    ];
    let started = Instant::now();
    let got = store
        .wait_for_rollouts(&ids, Some(Duration::from_secs(5)))
        .await
        .ctx("wait")?;
    let took = started.elapsed();
    let got_ids: Vec<&str> = got.iter().map(|r| r.rollout_id.as_str()).collect();
    ensure_eq!(got_ids, vec![done_id.as_str()], "the finished rollout only");
    ensure!(
        took < Duration::from_millis(100),
        "unknown and finished ids answered after {took:?}"
    );
    Ok(())
}

/// A rollout the store holds that is still running keeps the call waiting until the timeout
/// (about 1 s here), even next to an unknown id.
pub async fn wait_running_waits_for_timeout(store: &dyn LightningStore) -> CaseResult {
    let running = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let ids = vec![running.rollout.rollout_id, "ro-unknown".to_string()];
    let started = Instant::now();
    let got = store
        .wait_for_rollouts(&ids, Some(Duration::from_secs(1)))
        .await
        .ctx("wait")?;
    let took = started.elapsed();
    ensure!(got.is_empty(), "nothing finished: {got:?}");
    ensure!(
        took >= Duration::from_millis(900),
        "a running rollout with a 1 s timeout answered after only {took:?}"
    );
    ensure!(
        took < Duration::from_secs(5),
        "a running rollout with a 1 s timeout answered after {took:?}"
    );
    Ok(())
}
