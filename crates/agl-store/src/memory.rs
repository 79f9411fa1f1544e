//! The in-memory `LightningStore` backend.
//!
//! Responsible for holding rollouts, attempts, spans, resources and workers in process memory
//! behind one mutex, with O(1) amortised dequeue (a `VecDeque` of rollout slots), spans indexed
//! by rollout, an index of the rollouts the watchdog must look at, and a `tokio::sync::watch`
//! channel that wakes `wait_for_rollouts` when a rollout finishes. Every rule is delegated to
//! [`crate::lifecycle`]; queries finish through [`crate::query`]. The watchdog runs lazily
//! before the operations of [`crate::lifecycle::WATCHDOG_OPERATIONS`] and in a background
//! [`Sweeper`] (when built inside a tokio runtime). Not responsible for persistence
//! (everything is lost on drop; see the SQLite backend) or span eviction.
//!
//! Costs at scale: dequeue O(1) amortised, add span O(1) (hash lookup of the rollout and a
//! per-rollout duplicate set), spans of one rollout O(k log k) for its k spans, independent
//! of the total number of spans.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker, new_attempt_id, new_resources_id, new_rollout_id, now_seconds,
};
use serde_json::Value;
use tokio::sync::watch;

use crate::error::StoreError;
use crate::lifecycle::{self, RolloutChange, ScanDebounce};
use crate::query::{
    self, AttemptQuery, FilterLogic, Matches, Paginated, ResourcesQuery, RolloutQuery, SpanQuery,
    WorkerQuery,
};
use crate::store::{AttemptUpdate, LightningStore, RolloutUpdate, StoreStatistics};
use crate::sweeper::{self, Sweeper};
use crate::wait::{self, WaitSnapshot};

/// One rollout with everything that hangs off it.
struct Entry {
    rollout: Rollout,
    /// Ordered by `sequence_id`; the last one is the latest.
    attempts: Vec<Attempt>,
    /// Insertion order.
    spans: Vec<Span>,
    /// `(attempt_id, span_id)` of the stored spans, for duplicate detection.
    span_keys: HashSet<(String, String)>,
    /// Span sequence counter of this rollout.
    sequence: i64,
    /// Whether the rollout currently has an entry in the queue.
    in_queue: bool,
}

struct State {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    queue: VecDeque<usize>,
    /// Entries the watchdog must look at (see `lifecycle::is_watched`), in creation order.
    watched: BTreeSet<usize>,
    /// Sequence counters of rollout ids that do not exist (Q10).
    orphan_sequences: HashMap<String, i64>,
    resources: Vec<ResourcesUpdate>,
    resources_index: HashMap<String, usize>,
    latest_resources: Option<usize>,
    workers: Vec<Worker>,
    workers_index: HashMap<String, usize>,
    total_attempts: u64,
    total_spans: u64,
    debounce: ScanDebounce,
    /// Bumped whenever a rollout becomes finished.
    finished: watch::Sender<u64>,
}

impl State {
    fn entry_idx(&self, rollout_id: &str) -> Result<usize, StoreError> {
        self.index
            .get(rollout_id)
            .copied()
            .ok_or_else(|| StoreError::rollout_not_found(rollout_id))
    }

    fn fresh_rollout_id(&self) -> String {
        loop {
            let id = new_rollout_id();
            if !self.index.contains_key(&id) {
                return id;
            }
        }
    }

    fn latest_resources_id(&self) -> Option<&str> {
        self.latest_resources
            .and_then(|i| self.resources.get(i))
            .map(|r| r.resources_id.as_str())
    }

    fn worker_mut(&mut self, worker_id: &str) -> &mut Worker {
        let idx = match self.workers_index.get(worker_id) {
            Some(i) => *i,
            None => {
                self.workers.push(Worker::new(worker_id));
                let i = self.workers.len() - 1;
                self.workers_index.insert(worker_id.to_string(), i);
                i
            }
        };
        &mut self.workers[idx]
    }

    fn sync_worker_for(&mut self, attempt: &Attempt, now: f64) {
        if let Some(worker_id) = &attempt.worker_id {
            lifecycle::sync_worker(self.worker_mut(worker_id), attempt, now);
        }
    }

    /// Book-keeping after any change to entry `idx`: requeue, watchdog index, waking waiters.
    fn after_change(&mut self, idx: usize, change: RolloutChange) {
        let entry = &mut self.entries[idx];
        if change.requeue && !entry.in_queue {
            entry.in_queue = true;
            self.queue.push_back(idx);
        }
        if lifecycle::is_watched(&entry.rollout) {
            self.watched.insert(idx);
        } else {
            self.watched.remove(&idx);
        }
        if change.became_finished() {
            self.finished.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The lazy, debounced watchdog scan (§4.5).
    fn scan(&mut self, now: f64) {
        if self.debounce.should_scan(now) {
            self.scan_now(now);
        }
    }

    /// The watchdog scan without debounce; returns how many attempts it changed.
    fn scan_now(&mut self, now: f64) -> usize {
        let mut changed = 0;
        let candidates: Vec<usize> = self.watched.iter().copied().collect();
        for idx in candidates {
            let entry = &mut self.entries[idx];
            let Some(attempt) = entry.attempts.last_mut() else {
                continue;
            };
            if let Some(change) = lifecycle::apply_watchdog(&mut entry.rollout, attempt, now) {
                changed += 1;
                let attempt = attempt.clone();
                if change.sync_worker {
                    self.sync_worker_for(&attempt, now);
                }
                self.after_change(idx, change.rollout);
            }
        }
        changed
    }

    /// An entry as `GET /rollouts` returns it: with its latest attempt when it has one.
    fn any_rollout(&self, idx: usize) -> AnyRollout {
        let entry = &self.entries[idx];
        match entry.attempts.last() {
            Some(attempt) => AnyRollout::Attempted(AttemptedRollout {
                rollout: entry.rollout.clone(),
                attempt: attempt.clone(),
            }),
            None => AnyRollout::Plain(entry.rollout.clone()),
        }
    }

    fn insert_rollout(&mut self, rollout: Rollout) -> usize {
        let idx = self.entries.len();
        self.index.insert(rollout.rollout_id.clone(), idx);
        self.entries.push(Entry {
            rollout,
            attempts: Vec::new(),
            spans: Vec::new(),
            span_keys: HashSet::new(),
            sequence: 0,
            in_queue: false,
        });
        idx
    }

    fn enqueue(&mut self, request: EnqueueRolloutRequest, now: f64) -> Result<Rollout, StoreError> {
        let id = self.fresh_rollout_id();
        let rollout = lifecycle::new_rollout(request, id, self.latest_resources_id(), now)?;
        let idx = self.insert_rollout(rollout);
        self.entries[idx].in_queue = true;
        self.queue.push_back(idx);
        Ok(self.entries[idx].rollout.clone())
    }

    /// Creates the next attempt of entry `idx` and binds the worker.
    fn begin_attempt(&mut self, idx: usize, worker_id: Option<&str>, now: f64) -> AttemptedRollout {
        let entry = &mut self.entries[idx];
        let existing = u32::try_from(entry.attempts.len()).unwrap_or(u32::MAX);
        let attempt_id = loop {
            let id = new_attempt_id();
            if !entry.attempts.iter().any(|a| a.attempt_id == id) {
                break id;
            }
        };
        let (attempt, change) = lifecycle::begin_attempt(
            &mut entry.rollout,
            existing,
            attempt_id,
            worker_id.map(str::to_string),
            now,
        );
        entry.attempts.push(attempt.clone());
        let rollout = entry.rollout.clone();
        self.total_attempts += 1;
        self.sync_worker_for(&attempt, now);
        self.after_change(idx, change);
        AttemptedRollout { rollout, attempt }
    }

    fn sequence_counter(&mut self, rollout_id: &str) -> &mut i64 {
        match self.index.get(rollout_id) {
            Some(&idx) => &mut self.entries[idx].sequence,
            None => self
                .orphan_sequences
                .entry(rollout_id.to_string())
                .or_insert(0),
        }
    }

    fn check_span_target(&self, span: &Span) -> Result<usize, StoreError> {
        let idx = self.index.get(&span.rollout_id).copied();
        let attempt_found = idx.is_some_and(|i| {
            self.entries[i]
                .attempts
                .iter()
                .any(|a| a.attempt_id == span.attempt_id)
        });
        lifecycle::require_span_target(span, idx.is_some(), attempt_found)?;
        idx.ok_or_else(|| StoreError::rollout_not_found(&span.rollout_id))
    }

    /// Stores a span whose target was checked; `None` for a duplicate.
    fn store_span(&mut self, idx: usize, span: Span, now: f64) -> Option<Span> {
        let entry = &mut self.entries[idx];
        let key = (span.attempt_id.clone(), span.span_id.clone());
        if entry.span_keys.contains(&key) {
            return None;
        }
        let last = entry.attempts.len().saturating_sub(1);
        let pos = entry
            .attempts
            .iter()
            .position(|a| a.attempt_id == span.attempt_id)?;
        let effect = lifecycle::record_span(
            &mut entry.rollout,
            &mut entry.attempts[pos],
            pos == last,
            now,
        );
        entry.span_keys.insert(key);
        entry.spans.push(span.clone());
        self.total_spans += 1;
        self.after_change(idx, effect.rollout);
        Some(span)
    }

    /// `add_spans`: counters raised to the supplied ids, every target checked, then the spans
    /// stored (duplicates dropped); returns the stored ones.
    fn add_spans(&mut self, spans: Vec<Span>, now: f64) -> Result<Vec<Span>, StoreError> {
        for span in &spans {
            lifecycle::observe_sequence_id(
                self.sequence_counter(&span.rollout_id),
                span.sequence_id,
            );
        }
        let mut targets = Vec::with_capacity(spans.len());
        for span in &spans {
            targets.push(self.check_span_target(span)?);
        }
        Ok(spans
            .into_iter()
            .zip(targets)
            .filter_map(|(span, idx)| self.store_span(idx, span, now))
            .collect())
    }

    /// Finished rollouts among `ids` (request order, unknown omitted), the unfinished ones,
    /// and the earliest Unix time at which the watchdog may change one of them.
    fn wait_snapshot(&self, ids: &[String]) -> WaitSnapshot {
        let mut snap = WaitSnapshot::default();
        for id in ids {
            let Some(&idx) = self.index.get(id) else {
                continue;
            };
            let entry = &self.entries[idx];
            if entry.rollout.status.is_finished() {
                snap.done.push(entry.rollout.clone());
                continue;
            }
            let at = entry
                .attempts
                .last()
                .and_then(|a| lifecycle::watchdog_deadline(&entry.rollout, a))
                .map(|deadline| deadline.max(self.debounce.next_scan_at()));
            snap.push_unfinished(id, at);
        }
        snap
    }
}

/// The in-memory [`LightningStore`] (the default backend of `agl store`).
///
/// All state sits behind one `std::sync::Mutex` that is never held across an `.await`.
/// Dequeue is O(1) amortised, spans are indexed by rollout, and the watchdog only visits
/// `preparing`/`running` rollouts that have a timeout configured.
pub struct InMemoryLightningStore {
    inner: Arc<Inner>,
    _sweeper: Sweeper,
}

struct Inner {
    state: Mutex<State>,
    finished: watch::Receiver<u64>,
    started: Instant,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere mid-update; the state is still the best we
        // have, so keep serving it rather than panicking in turn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sweep(&self) {
        self.lock().scan_now(now_seconds());
    }
}

impl Default for InMemoryLightningStore {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryLightningStore {
    /// An empty store with the default watchdog debounce of 10 seconds.
    pub fn new() -> Self {
        Self::with_scan_debounce_seconds(lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS)
    }

    /// An empty store whose lazy watchdog scan runs at most once per `seconds` (`0` = before
    /// every listed operation, as the upstream tests use). The background sweeper scans every
    /// [`sweeper::DEFAULT_SWEEP_INTERVAL`] when a tokio runtime is running.
    pub fn with_scan_debounce_seconds(seconds: f64) -> Self {
        Self::with_options(seconds, Some(sweeper::DEFAULT_SWEEP_INTERVAL))
    }

    /// An empty store with a lazy-scan debounce of `debounce_seconds` (`f64::INFINITY` = no
    /// lazy scan) and a background sweep
    /// every `sweep_interval` (`None` = no background sweeper; the lazy scan still runs).
    pub fn with_options(debounce_seconds: f64, sweep_interval: Option<Duration>) -> Self {
        let seconds = debounce_seconds;
        let (tx, rx) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                entries: Vec::new(),
                index: HashMap::new(),
                queue: VecDeque::new(),
                watched: BTreeSet::new(),
                orphan_sequences: HashMap::new(),
                resources: Vec::new(),
                resources_index: HashMap::new(),
                latest_resources: None,
                workers: Vec::new(),
                workers_index: HashMap::new(),
                total_attempts: 0,
                total_spans: 0,
                debounce: ScanDebounce::new(seconds),
                finished: tx,
            }),
            finished: rx,
            started: Instant::now(),
        });
        let sweeper = match sweep_interval {
            Some(interval) => Sweeper::spawn(Arc::downgrade(&inner), interval, Inner::sweep),
            None => Sweeper::disabled(),
        };
        InMemoryLightningStore {
            inner,
            _sweeper: sweeper,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// Locks the state and runs the debounced watchdog scan first.
    fn lock_scanned(&self, now: f64) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        state.scan(now);
        state
    }
}

#[async_trait::async_trait]
impl LightningStore for InMemoryLightningStore {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        let now = now_seconds();
        self.lock_scanned(now).enqueue(request, now)
    }

    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        lifecycle::validate_requests(&requests)?;
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        requests
            .into_iter()
            .map(|request| state.enqueue(request, now))
            .collect()
    }

    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        let id = state.fresh_rollout_id();
        let rollout = lifecycle::new_rollout(request, id, state.latest_resources_id(), now)?;
        let idx = state.insert_rollout(rollout);
        Ok(state.begin_attempt(idx, worker_id.as_deref(), now))
    }

    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        while let Some(idx) = state.queue.pop_front() {
            let entry = &mut state.entries[idx];
            entry.in_queue = false;
            if !lifecycle::is_dispatchable(&entry.rollout) {
                continue;
            }
            let attempted = state.begin_attempt(idx, worker_id, now);
            if let Some(w) = worker_id {
                lifecycle::worker_dequeued(state.worker_mut(w), now);
            }
            return Ok(Some(attempted));
        }
        if let Some(w) = worker_id {
            lifecycle::worker_found_nothing(state.worker_mut(w), now);
        }
        Ok(None)
    }

    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        let idx = state.entry_idx(rollout_id)?;
        Ok(state.begin_attempt(idx, worker_id, now))
    }

    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        let idx = state.entry_idx(rollout_id)?;
        let entry = &mut state.entries[idx];
        let last = entry.attempts.len().checked_sub(1);
        let pos = if lifecycle::is_latest_selector(attempt_id) {
            last
        } else {
            entry
                .attempts
                .iter()
                .position(|a| a.attempt_id == attempt_id)
        }
        .ok_or_else(|| StoreError::attempt_not_found(attempt_id))?;
        let change = lifecycle::apply_attempt_update(
            &mut entry.rollout,
            &mut entry.attempts[pos],
            Some(pos) == last,
            &update,
            now,
        )?;
        let attempt = entry.attempts[pos].clone();
        if change.sync_worker {
            state.sync_worker_for(&attempt, now);
        }
        state.after_change(idx, change.rollout);
        Ok(attempt)
    }

    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        let idx = state.entry_idx(rollout_id)?;
        let change = lifecycle::apply_rollout_update(&mut state.entries[idx].rollout, update, now)?;
        state.after_change(idx, change);
        Ok(state.entries[idx].rollout.clone())
    }

    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        let state = self.lock_scanned(now_seconds());
        Ok(state
            .index
            .get(rollout_id)
            .map(|&i| state.entries[i].rollout.clone()))
    }

    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        let state = self.lock_scanned(now_seconds());
        Ok(state
            .index
            .get(rollout_id)
            .and_then(|&i| state.entries[i].attempts.last().cloned()))
    }

    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        query::validate_sort::<Rollout>(&query.sort)?;
        let state = self.lock_scanned(now_seconds());
        // With AND logic an id list selects the candidates through the index.
        let candidates: Vec<usize> = match (&query.rollout_id_in, query.filter_logic) {
            (Some(ids), FilterLogic::And) => {
                let mut idxs: Vec<usize> = ids
                    .iter()
                    .filter_map(|id| state.index.get(id).copied())
                    .collect();
                idxs.sort_unstable();
                idxs.dedup();
                idxs
            }
            _ => (0..state.entries.len()).collect(),
        };
        let matches: Vec<usize> = candidates
            .into_iter()
            .filter(|&i| query.matches(&state.entries[i].rollout))
            .collect();
        let refs: Vec<&Rollout> = matches.iter().map(|&i| &state.entries[i].rollout).collect();
        let page = query::finish(refs, &query.sort, query.window)?;
        let page = page.map(|r| r.rollout_id.clone());
        Ok(page.map(|id| state.any_rollout(state.index[&id])))
    }

    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        query::validate_sort::<Attempt>(&query.sort)?;
        let state = self.lock_scanned(now_seconds());
        let refs: Vec<&Attempt> = state
            .index
            .get(rollout_id)
            .map(|&i| state.entries[i].attempts.iter().collect())
            .unwrap_or_default();
        Ok(query::finish(refs, &query.sort, query.window)?.map(Attempt::clone))
    }

    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
    ) -> Result<i64, StoreError> {
        let mut state = self.lock();
        Ok(lifecycle::issue_sequence_id(
            state.sequence_counter(rollout_id),
        ))
    }

    async fn get_next_span_sequence_ids(
        &self,
        rollout_id: &str,
        _attempt_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        lifecycle::check_sequence_block(count)?;
        let mut state = self.lock();
        Ok(lifecycle::issue_sequence_ids(
            state.sequence_counter(rollout_id),
            count,
        ))
    }

    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        let now = now_seconds();
        let mut state = self.lock();
        lifecycle::observe_sequence_id(state.sequence_counter(&span.rollout_id), span.sequence_id);
        let idx = state.check_span_target(&span)?;
        Ok(state.store_span(idx, span, now))
    }

    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        let now = now_seconds();
        self.lock().add_spans(spans, now)
    }

    /// Under one lock: the blocks, then `add_spans`.
    async fn add_spans_with_fresh_ids(
        &self,
        spans: Vec<(Span, bool)>,
    ) -> Result<Vec<Span>, StoreError> {
        let now = now_seconds();
        let mut state = self.lock();
        let blocks = lifecycle::fresh_id_blocks(&spans);
        let firsts: Vec<i64> = blocks
            .iter()
            .map(|b| lifecycle::issue_sequence_ids(state.sequence_counter(&b.rollout_id), b.count))
            .collect();
        let spans = lifecycle::number_fresh_spans(spans, &blocks, &firsts)?;
        state.add_spans(spans, now)
    }

    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        query::validate_sort::<Span>(&query.sort)?;
        let state = self.lock_scanned(now_seconds());
        let empty = || query::finish(Vec::<Span>::new(), &query.sort, query.window);
        let Some(&idx) = state.index.get(&query.rollout_id) else {
            return empty();
        };
        let entry = &state.entries[idx];
        let wanted: Option<&str> = match query.attempt_id.as_deref() {
            None => None,
            Some(a) if lifecycle::is_latest_selector(a) => match entry.attempts.last() {
                Some(latest) => Some(latest.attempt_id.as_str()),
                None => return empty(),
            },
            Some(a) => Some(a),
        };
        let refs: Vec<&Span> = entry
            .spans
            .iter()
            .filter(|s| wanted.is_none_or(|w| s.attempt_id == w) && query.matches(s))
            .collect();
        Ok(query::finish(refs, &query.sort, query.window)?.map(Span::clone))
    }

    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        let now = now_seconds();
        let mut state = self.lock();
        let id = loop {
            let id = new_resources_id();
            if !state.resources_index.contains_key(&id) {
                break id;
            }
        };
        let update = lifecycle::new_resources(id.clone(), resources, now);
        state.resources.push(update.clone());
        let idx = state.resources.len() - 1;
        state.resources_index.insert(id, idx);
        state.latest_resources = Some(idx);
        Ok(update)
    }

    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        lifecycle::validate_resources_id(resources_id)?;
        let now = now_seconds();
        let mut state = self.lock_scanned(now);
        let idx = match state.resources_index.get(resources_id) {
            Some(&idx) => {
                lifecycle::replace_resources(&mut state.resources[idx], resources, now);
                idx
            }
            None => {
                let update = lifecycle::new_resources(resources_id.to_string(), resources, now);
                state.resources.push(update);
                let idx = state.resources.len() - 1;
                state.resources_index.insert(resources_id.to_string(), idx);
                idx
            }
        };
        state.latest_resources = Some(idx);
        Ok(state.resources[idx].clone())
    }

    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        let state = self.lock();
        Ok(state
            .resources_index
            .get(resources_id)
            .map(|&i| state.resources[i].clone()))
    }

    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        let state = self.lock();
        Ok(state.latest_resources.map(|i| state.resources[i].clone()))
    }

    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        let state = self.lock();
        let refs: Vec<&ResourcesUpdate> = state
            .resources
            .iter()
            .filter(|r| query.matches(r))
            .collect();
        Ok(query::finish(refs, &query.sort, query.window)?.map(ResourcesUpdate::clone))
    }

    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        wait::wait_for_rollouts(
            self.inner.finished.clone(),
            rollout_ids,
            timeout,
            None,
            |ids| {
                let snapshot = self.lock_scanned(now_seconds()).wait_snapshot(&ids);
                std::future::ready(Ok(snapshot))
            },
        )
        .await
    }

    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        let now = now_seconds();
        let mut state = self.lock();
        // Validate before the upsert so a refused call creates no worker.
        lifecycle::validate_heartbeat_stats(heartbeat_stats.as_ref())?;
        let worker = state.worker_mut(worker_id);
        lifecycle::worker_heartbeat(worker, heartbeat_stats, now)?;
        Ok(worker.clone())
    }

    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        query::validate_sort::<Worker>(&query.sort)?;
        let state = self.lock_scanned(now_seconds());
        let refs: Vec<&Worker> = state.workers.iter().filter(|w| query.matches(w)).collect();
        Ok(query::finish(refs, &query.sort, query.window)?.map(Worker::clone))
    }

    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        let state = self.lock();
        Ok(state
            .workers_index
            .get(worker_id)
            .map(|&i| state.workers[i].clone()))
    }

    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        let state = self.lock();
        let mut stats = StoreStatistics::zeroed();
        for entry in &state.entries {
            *stats
                .rollouts_by_status
                .entry(entry.rollout.status)
                .or_default() += 1;
            for attempt in &entry.attempts {
                *stats.attempts_by_status.entry(attempt.status).or_default() += 1;
            }
        }
        stats.total_rollouts = state.entries.len() as u64;
        stats.total_attempts = state.total_attempts;
        stats.total_spans = state.total_spans;
        stats.total_resources = state.resources.len() as u64;
        stats.total_workers = state.workers.len() as u64;
        stats.uptime = self.inner.started.elapsed().as_secs_f64();
        Ok(stats)
    }

    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        Ok(self.lock().scan_now(now_seconds()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    fn store() -> InMemoryLightningStore {
        InMemoryLightningStore::with_scan_debounce_seconds(0.0)
    }

    macro_rules! conformance_tests {
        ($($name:ident),+ $(,)?) => {
            $(
                #[tokio::test]
                async fn $name() {
                    let s = store();
                    if let Err(e) = conformance::$name(&s).await {
                        panic!("{}: {e}", stringify!($name));
                    }
                }
            )+
        };
    }

    conformance_tests!(
        happy_path,
        retry_then_fail,
        timeout_watchdog,
        unresponsive_recovers,
        wait_resolves_watchdog_timeouts,
        duplicate_spans_dropped,
        sequence_ids,
        sequence_id_blocks,
        span_for_unknown_target,
        resources_versions_and_latest,
        wait_wakes_when_finished,
        wait_reports_current_states,
        wait_returns_at_timeout,
        wait_unknown_ids_return_at_once,
        wait_running_waits_for_timeout,
        workers_idle_busy,
        update_rollout_requeues_and_end_time,
        start_rollout_and_start_attempt,
        terminal_rollouts_protected,
        query_spans_order_and_latest,
        query_rollouts_filters,
        stale_queue_entries_skipped,
        older_attempt_does_not_propagate,
        statistics_counts,
        invalid_inputs_rejected,
        query_rollouts_conditions,
        query_rollouts_sorting,
        query_rollouts_window,
        query_attempts_paging,
        query_spans_filters,
        query_resources_filters,
        query_workers_filters,
        dequeue_many_batches,
        statistics_by_status,
        illegal_transitions_refused,
        allowed_transitions_apply,
        run_watchdog_detects_timeouts,
    );

    #[tokio::test]
    async fn run_all_covers_every_case() {
        let mut made = 0;
        conformance::run_all(|| {
            made += 1;
            Box::new(store())
        })
        .await
        .unwrap();
        assert_eq!(made, conformance::CASES.len());
    }

    #[tokio::test]
    async fn watchdog_only_visits_watched_rollouts() {
        let s = store();
        let plain = s
            .enqueue_rollout(EnqueueRolloutRequest::new(serde_json::json!(1)))
            .await
            .unwrap();
        s.dequeue_rollout(None).await.unwrap().unwrap();
        let timed = s
            .start_rollout(
                EnqueueRolloutRequest {
                    config: Some(agl_core::RolloutConfig {
                        timeout_seconds: Some(60.0),
                        ..Default::default()
                    }),
                    ..EnqueueRolloutRequest::new(serde_json::json!(2))
                },
                None,
            )
            .await
            .unwrap();
        let watched: Vec<usize> = s.lock().watched.iter().copied().collect();
        let timed_idx = s.lock().index[&timed.rollout.rollout_id];
        assert_eq!(watched, vec![timed_idx]);
        assert!(!s.lock().index.is_empty() && s.lock().index.contains_key(&plain.rollout_id));
        s.update_attempt(
            &timed.rollout.rollout_id,
            "latest",
            AttemptUpdate {
                status: Some(agl_core::AttemptStatus::Succeeded),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert!(
            s.lock().watched.is_empty(),
            "finished rollouts leave the index"
        );
    }
}
