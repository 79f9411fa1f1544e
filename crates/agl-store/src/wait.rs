//! The `wait_for_rollouts` loop every backend shares.
//!
//! Responsible for waiting until listed rollouts are finished or a timeout passes, without
//! busy polling: a backend provides a *snapshot* of some ids (the finished rollouts among them,
//! whether all are finished, and the earliest watchdog deadline among the unfinished) and a
//! `tokio::sync::watch` channel bumped after every change that finished a rollout; this loop
//! sleeps until that channel moves, the next watchdog deadline, an optional periodic re-check
//! (for writers in other processes), or the timeout. Only the ids not yet seen finished are
//! re-checked on each wake-up (O(pending), not O(n)); the answer always comes from one
//! snapshot of every id, so it reflects the states when the wait returns, in request order.
//! Not responsible for reading the store (the backends' snapshots do).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agl_core::{Rollout, now_seconds};
use tokio::sync::watch;

use crate::error::StoreError;

/// What a backend reports for a list of ids: the finished rollouts among them (request order,
/// unknown ids omitted), whether every id is a finished rollout, and the earliest Unix time
/// (seconds) at which the watchdog may finish one of the others.
pub type WaitSnapshot = (Vec<Rollout>, bool, Option<f64>);

/// The ids of `ids` that are not among `done`, in order.
fn not_in(ids: &[String], done: &[Rollout]) -> Arc<[String]> {
    let done: HashSet<&str> = done.iter().map(|r| r.rollout_id.as_str()).collect();
    ids.iter()
        .filter(|id| !done.contains(id.as_str()))
        .cloned()
        .collect()
}

/// Waits for `rollout_ids` as `LightningStore::wait_for_rollouts` documents. `recheck` bounds
/// every sleep (`None`: only the channel, the watchdog deadline and the timeout wake it).
pub async fn wait_for_rollouts<F, Fut>(
    mut finished: watch::Receiver<u64>,
    rollout_ids: &[String],
    timeout: Option<Duration>,
    recheck: Option<Duration>,
    mut snapshot: F,
) -> Result<Vec<Rollout>, StoreError>
where
    F: FnMut(Arc<[String]>) -> Fut,
    Fut: Future<Output = Result<WaitSnapshot, StoreError>>,
{
    // A timeout too large to represent means "no limit".
    let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
    let all_ids: Arc<[String]> = rollout_ids.into();
    let mut pending = Arc::clone(&all_ids);
    loop {
        // Mark the current version as seen *before* looking, so no finish is missed.
        finished.borrow_and_update();
        let (done, _, watchdog_at) = snapshot(Arc::clone(&pending)).await?;
        if !done.is_empty() {
            pending = not_in(&pending, &done);
        }
        let timed_out = deadline.is_some_and(|d| d <= tokio::time::Instant::now());
        if pending.is_empty() || timed_out {
            let (done, all, _) = snapshot(Arc::clone(&all_ids)).await?;
            if all || timed_out {
                return Ok(done);
            }
            // A rollout left its finished status meanwhile (re-enqueued): keep waiting.
            pending = not_in(&all_ids, &done);
        }
        let tokio_now = tokio::time::Instant::now();
        let now = now_seconds();
        // Wake for the next watchdog deadline too, so timeouts resolve while we wait.
        let watchdog_wake = watchdog_at.map(|at| {
            let secs = ((at - now).max(0.0) + 0.001).min(3600.0);
            tokio_now + Duration::try_from_secs_f64(secs).unwrap_or(Duration::from_millis(1))
        });
        let wake = [deadline, watchdog_wake, recheck.map(|r| tokio_now + r)]
            .into_iter()
            .flatten()
            .min();
        match wake {
            // Ok = a rollout finished; Err = the wake time passed. Both re-check.
            Some(at) => {
                if let Ok(Err(_)) = tokio::time::timeout_at(at, finished.changed()).await {
                    return Err(StoreError::Closed);
                }
            }
            None => {
                if finished.changed().await.is_err() {
                    return Err(StoreError::Closed);
                }
            }
        }
    }
}
