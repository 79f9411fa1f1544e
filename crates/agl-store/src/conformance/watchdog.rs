//! Conformance cases for retries and the watchdog: `retry_condition`/`max_attempts`,
//! `timeout_seconds` and `unresponsive_seconds`, recovery by a late span, and the watchdog run
//! by `wait_for_rollouts` and by `run_watchdog` (§4.3, §4.5).
//!
//! Not covered here: `wait_for_rollouts` without timeouts (`wait`) and the transitions a
//! client asks for (`transitions`).

use std::time::Duration;

use agl_core::{AttemptStatus, RolloutConfig, RolloutStatus, WorkerStatus};
use serde_json::json;

use crate::store::LightningStore;

use super::{CaseResult, Ctx, plain_span, retry, status, with_config, worker_status};

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
