//! The background watchdog sweeper every backend runs.
//!
//! Responsible for detecting timed-out and unresponsive attempts when no request arrives
//! (deviation Q26 of the protocol reference: upstream only scanned lazily, so an idle store
//! never noticed a dead runner). A backend keeps its state in an `Arc` and hands the sweeper a
//! `Weak` reference and a scan function; the task wakes every `interval`, scans, and ends by
//! itself when the state is dropped or the [`Sweeper`] handle is dropped. Not responsible for
//! the watchdog rules ([`crate::lifecycle::watchdog_verdict`]) nor the lazy scan before
//! operations (the backends keep that too, so a request never sees a stale status).

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

/// Default time between two background scans, in seconds.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_millis(500);

/// Handle of a running sweeper task; dropping it stops the task.
#[derive(Debug)]
pub struct Sweeper {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sweeper {
    /// A sweeper that does nothing (no tokio runtime was available, or sweeping is off).
    pub fn disabled() -> Self {
        Sweeper { task: None }
    }

    /// Spawns the sweeper on the current tokio runtime, or returns a disabled one when there
    /// is none (the lazy scan before operations still runs). `scan` runs on the blocking pool
    /// so a backend may do I/O in it.
    pub fn spawn<T>(state: Weak<T>, interval: Duration, scan: fn(&T)) -> Self
    where
        T: Send + Sync + 'static,
    {
        Self::every(interval, move || {
            let state = state.clone();
            async move {
                tokio::task::spawn_blocking(move || match state.upgrade() {
                    Some(state) => {
                        scan(&state);
                        true
                    }
                    None => false,
                })
                .await
                .unwrap_or(false)
            }
        })
    }

    /// Like [`Sweeper::spawn`] for a backend whose scan is async (it runs on the runtime, not
    /// the blocking pool).
    pub fn spawn_async<T>(
        state: Weak<T>,
        interval: Duration,
        scan: for<'a> fn(&'a T) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    ) -> Self
    where
        T: Send + Sync + 'static,
    {
        Self::every(interval, move || {
            let state = state.upgrade();
            async move {
                match state {
                    Some(state) => {
                        scan(&state).await;
                        true
                    }
                    None => false,
                }
            }
        })
    }

    /// Runs `tick` every `interval` (the first after one interval; a late tick delays the
    /// next) on the current runtime until it answers `false` (the store is gone); disabled
    /// without a runtime.
    fn every<F, Fut>(interval: Duration, mut tick: F) -> Self
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = bool> + Send,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Sweeper::disabled();
        };
        let task = handle.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                if !tick().await {
                    break;
                }
            }
        });
        Sweeper { task: Some(task) }
    }

    /// Whether a background task is running.
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
