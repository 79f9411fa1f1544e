//! Conformance cases for `statistics`: totals of every entity kind and the counts by status.
//!
//! Not covered here: the other read paths (`queries`, `rollout_queries`).

use agl_core::{AttemptStatus, EnqueueRolloutRequest, RolloutConfig, RolloutStatus};
use serde_json::json;

use crate::store::LightningStore;

use super::{CaseResult, Ctx, llm, plain_span, retry, set_status, status, with_config};

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
