//! The `wait_for_rollouts` loop every backend shares.
//!
//! Responsible for waiting until every listed rollout is finished *or unknown* (an id the store
//! does not hold settles at once, as in Agent Lightning v0.3.0, whose clients poll with unknown
//! ids and `timeout: 0`) or a timeout passes, without busy polling: a backend provides a
//! *snapshot* of some ids (the finished rollouts among them, the ids of the rollouts still
//! unfinished, and the earliest watchdog deadline among those) and a `tokio::sync::watch`
//! channel bumped after every change that finished a rollout; this loop sleeps until that
//! channel moves, the next watchdog deadline, an optional periodic re-check (for writers in
//! other processes), or the timeout. Only the ids still unfinished are re-checked on each
//! wake-up (O(pending), not O(n)); the answer always comes from one snapshot of every id, so it
//! reflects the states when the wait returns, in request order.
//! Not responsible for reading the store (the backends' snapshots do).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agl_core::{Rollout, now_seconds};
use tokio::sync::watch;

use crate::error::StoreError;

/// What a backend reports for a list of ids. Every id is in exactly one place: among `done`,
/// among `unfinished`, or nowhere (the store does not hold it).
#[derive(Debug, Default)]
pub struct WaitSnapshot {
    /// The finished rollouts among the ids, in request order.
    pub done: Vec<Rollout>,
    /// The ids of the rollouts the store holds that are not finished, in request order.
    pub unfinished: Vec<String>,
    /// The earliest Unix time (seconds) at which the watchdog may finish one of `unfinished`.
    pub watchdog_at: Option<f64>,
}

impl WaitSnapshot {
    /// Records an unfinished rollout and the time (if any) the watchdog may finish it.
    pub fn push_unfinished(&mut self, id: &str, watchdog_at: Option<f64>) {
        self.unfinished.push(id.to_string());
        if let Some(at) = watchdog_at {
            self.watchdog_at = Some(self.watchdog_at.map_or(at, |w| w.min(at)));
        }
    }
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
        let now_pending = snapshot(Arc::clone(&pending)).await?;
        let watchdog_at = now_pending.watchdog_at;
        // Finished and unknown ids are settled; only the unfinished ones are waited for.
        pending = now_pending.unfinished.into();
        let timed_out = deadline.is_some_and(|d| d <= tokio::time::Instant::now());
        if pending.is_empty() || timed_out {
            let all = snapshot(Arc::clone(&all_ids)).await?;
            if all.unfinished.is_empty() || timed_out {
                return Ok(all.done);
            }
            // A rollout left its finished status meanwhile (re-enqueued): keep waiting.
            pending = all.unfinished.into();
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
