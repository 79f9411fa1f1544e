//! Live updates: one background loop per dashboard, started by a page view, polls the
//! store once a second (the [`Follower`] for newly finished rollouts, and the store's
//! statistics for anything else: new rollouts, status changes, spans, resources, workers) and
//! bumps a counter when something changed. `GET /dashboard/events` streams that counter as
//! server-sent events (`event: change`, `data: <counter>`); the page script
//! (`dashboard.js`) then fetches the page again and swaps its `<main>`.
//!
//! The loop stops when nobody has watched for [`IDLE_SECONDS`] (no open event stream, no
//! page view), so an idle server does not poll its store; the next view starts it again. The
//! loop and every event stream end when the server shuts down, so a graceful shutdown never
//! waits on an open page.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use agl_store::{LightningStore, StoreStatistics};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use tokio::sync::watch;

use super::tally::Follower;

/// Time between two polls of the store.
pub(crate) const EVERY: Duration = Duration::from_secs(1);
/// Seconds without a page view or an open event stream after which the loop stops (the next
/// page view starts it again, and the tally goes on from where it was).
pub(crate) const IDLE_SECONDS: u64 = 60;
/// Rollouts one poll counts at most (catching up a full store, a page sees progress about
/// every second or two).
const BUDGET: u64 = 2_000;

/// The loop's state and its change counter.
pub(crate) struct Live {
    pub(crate) follower: Follower,
    changes: watch::Sender<u64>,
    started: AtomicBool,
    /// When a page was last viewed (seconds since `epoch`).
    last_view: AtomicU64,
    epoch: Instant,
    shutting_down: watch::Receiver<bool>,
}

/// What the statistics say changed (uptime excluded).
fn fingerprint(s: &StoreStatistics) -> StoreStatistics {
    StoreStatistics {
        uptime: 0.0,
        ..s.clone()
    }
}

impl Live {
    pub(crate) fn new(
        store: Arc<dyn LightningStore>,
        shutting_down: watch::Receiver<bool>,
    ) -> Live {
        Live {
            follower: Follower::new(store),
            changes: watch::channel(0).0,
            started: AtomicBool::new(false),
            last_view: AtomicU64::new(0),
            epoch: Instant::now(),
            shutting_down,
        }
    }

    /// Starts the loop unless it runs (called by every page view and event stream).
    pub(crate) fn ensure_started(self: &Arc<Self>) {
        self.last_view
            .store(self.epoch.elapsed().as_secs(), Ordering::Release);
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(Arc::clone(self).run());
        }
    }

    /// Whether nobody watches: no open event stream and no page view for [`IDLE_SECONDS`].
    fn idle(&self) -> bool {
        let since = self
            .epoch
            .elapsed()
            .as_secs()
            .saturating_sub(self.last_view.load(Ordering::Acquire));
        self.changes.receiver_count() == 0 && since >= IDLE_SECONDS
    }

    /// Polls until the server shuts down or nobody watches (see [`Live::idle`]).
    async fn run(self: Arc<Self>) {
        let mut stop = self.shutting_down.clone();
        let mut last: Option<StoreStatistics> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            if self.idle() {
                self.started.store(false, Ordering::Release);
                // A view that came in meanwhile found the loop running: keep it running.
                if !self.idle() && !self.started.swap(true, Ordering::AcqRel) {
                    continue;
                }
                return;
            }
            let (counted, more, stats) = match self.follower.poll(BUDGET).await {
                Ok(p) => (p.counted, p.more, Some(fingerprint(&p.stats))),
                Err(e) => {
                    self.follower.failed(&e);
                    (0, false, None)
                }
            };
            let moved = stats.is_some() && stats != last;
            if stats.is_some() {
                last = stats;
            }
            if counted > 0 || moved {
                self.changes.send_modify(|n| *n += 1);
            }
            if more {
                // Catching up: go on at once (the pages were told of the progress).
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(EVERY) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// The event stream of one page: a `change` event per bump, until shutdown.
    pub(crate) fn events(
        self: &Arc<Self>,
    ) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
        self.ensure_started();
        let changes = self.changes.subscribe();
        let stop = self.shutting_down.clone();
        let stream =
            futures_util::stream::unfold((changes, stop), |(mut changes, mut stop)| async move {
                if *stop.borrow() {
                    return None;
                }
                tokio::select! {
                    r = changes.changed() => {
                        r.ok()?;
                        let n = *changes.borrow_and_update();
                        let event = Event::default().event("change").data(n.to_string());
                        Some((Ok(event), (changes, stop)))
                    }
                    _ = stop.changed() => None,
                }
            });
        Sse::new(stream).keep_alive(KeepAlive::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_store::InMemoryLightningStore;

    #[tokio::test(start_paused = true)]
    async fn the_loop_stops_when_nobody_watches_and_a_view_restarts_it() {
        let (_stop_tx, stop) = watch::channel(false);
        let live = Arc::new(Live::new(Arc::new(InMemoryLightningStore::new()), stop));
        live.ensure_started();
        assert!(live.started.load(Ordering::Acquire));
        // An open event stream keeps it running past the idle time.
        let stream = live.changes.subscribe();
        tokio::time::sleep(Duration::from_secs(IDLE_SECONDS * 2)).await;
        assert!(live.started.load(Ordering::Acquire));
        drop(stream);
        tokio::time::sleep(Duration::from_secs(IDLE_SECONDS + 5)).await;
        assert!(
            !live.started.load(Ordering::Acquire),
            "the idle loop stopped"
        );
        live.ensure_started();
        assert!(live.started.load(Ordering::Acquire));
    }
}
