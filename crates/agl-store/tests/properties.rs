#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Model-based property tests of the store lifecycle, run on every backend through the
//! `LightningStore` trait, and the background sweeper of the in-memory backend.
//!
//! Responsible for checking, after **every** operation of a random sequence, that no rollout is
//! lost, attempts are numbered without gaps, `end_time` follows the status, the statistics agree
//! with the queries, and that each operation did exactly what `agl_store::lifecycle` says (the
//! pure rule functions are the oracle, applied to the state read before the operation). A
//! second property drains a queue of always-failing rollouts and checks that each ends in
//! exactly one terminal state once its attempts run out. Not responsible for query semantics
//! or wire compatibility (the conformance suite covers those).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agl_core::{
    AnyRollout, Attempt, AttemptStatus, Attributes, EnqueueRolloutRequest, Rollout, RolloutConfig,
    RolloutStatus, Span, Worker, WorkerStatus,
};
use agl_store::{
    AttemptUpdate, EntityKind, InMemoryLightningStore, LightningStore, RolloutQuery, RolloutUpdate,
    SqliteLightningStore, SqliteOptions, StoreError, StoreStatistics, lifecycle,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// The generated part of a `RolloutConfig`. Timeouts are either absent or `0.0`: a zero
/// timeout falls due at the next watchdog scan, so no test sleeps.
#[derive(Debug, Clone)]
struct Config {
    max_attempts: u32,
    retry_condition: Vec<AttemptStatus>,
    timeout_seconds: Option<f64>,
    unresponsive_seconds: Option<f64>,
}

impl Config {
    fn request(&self, input: usize) -> EnqueueRolloutRequest {
        EnqueueRolloutRequest {
            config: Some(RolloutConfig {
                timeout_seconds: self.timeout_seconds,
                unresponsive_seconds: self.unresponsive_seconds,
                max_attempts: self.max_attempts,
                retry_condition: self.retry_condition.clone(),
            }),
            ..EnqueueRolloutRequest::new(json!(input))
        }
    }
}

/// One store operation. `usize` fields pick a known rollout / attempt modulo the number known
/// (an operation on an empty store targets an unknown id and must fail with `NotFound`).
#[derive(Debug, Clone)]
enum Op {
    Enqueue(Config),
    Start(Config, Option<u8>),
    Dequeue(Option<u8>),
    DequeueMany(usize, Option<u8>),
    StartAttempt(usize, Option<u8>),
    /// Rollout, attempt, span id (a small range, so duplicates happen).
    AddSpan(usize, usize, u8),
    /// Rollout, attempt (`None` = `"latest"`), new status.
    UpdateAttempt(usize, Option<usize>, AttemptStatus),
    UpdateRollout(usize, RolloutStatus),
    Watchdog,
}

fn config() -> impl Strategy<Value = Config> {
    let timeout = prop_oneof![6 => Just(None), 1 => Just(Some(0.0))];
    let unresponsive = prop_oneof![6 => Just(None), 1 => Just(Some(0.0))];
    (
        1u32..=3,
        proptest::sample::subsequence(
            vec![
                AttemptStatus::Failed,
                AttemptStatus::Timeout,
                AttemptStatus::Unresponsive,
            ],
            0..=3,
        ),
        timeout,
        unresponsive,
    )
        .prop_map(
            |(max_attempts, retry_condition, timeout_seconds, unresponsive_seconds)| Config {
                max_attempts,
                retry_condition,
                timeout_seconds,
                unresponsive_seconds,
            },
        )
}

fn worker() -> impl Strategy<Value = Option<u8>> {
    proptest::option::of(0u8..3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => config().prop_map(Op::Enqueue),
        1 => (config(), worker()).prop_map(|(c, w)| Op::Start(c, w)),
        3 => worker().prop_map(Op::Dequeue),
        1 => (1usize..4, worker()).prop_map(|(n, w)| Op::DequeueMany(n, w)),
        1 => (any::<usize>(), worker()).prop_map(|(r, w)| Op::StartAttempt(r, w)),
        3 => (any::<usize>(), any::<usize>(), 0u8..4).prop_map(|(r, a, s)| Op::AddSpan(r, a, s)),
        4 => (
            any::<usize>(),
            proptest::option::of(any::<usize>()),
            proptest::sample::select(AttemptStatus::ALL),
        )
            .prop_map(|(r, a, s)| Op::UpdateAttempt(r, a, s)),
        2 => (any::<usize>(), proptest::sample::select(RolloutStatus::ALL))
            .prop_map(|(r, s)| Op::UpdateRollout(r, s)),
        1 => Just(Op::Watchdog),
    ]
}

fn worker_name(w: u8) -> String {
    format!("w{w}")
}

// ---------------------------------------------------------------------------------------------
// Model and snapshots
// ---------------------------------------------------------------------------------------------

/// What the test knows from the answers it got: ids created, in order.
#[derive(Debug, Default)]
struct Model {
    rollouts: Vec<String>,
    attempts: HashMap<String, Vec<String>>,
    /// `(rollout_id, attempt_id, span_id)` of every span the store accepted.
    spans: BTreeSet<(String, String, String)>,
    workers: BTreeSet<String>,
}

impl Model {
    fn pick(&self, i: usize) -> Option<String> {
        (!self.rollouts.is_empty()).then(|| self.rollouts[i % self.rollouts.len()].clone())
    }

    fn attempt_ids(&self, rollout_id: &str) -> &[String] {
        self.attempts.get(rollout_id).map_or(&[], Vec::as_slice)
    }
}

/// A consistent read of the whole store (see [`snapshot`]).
#[derive(Debug, Default)]
struct Snapshot {
    /// `query_rollouts(all)`, creation order.
    rollouts: Vec<AnyRollout>,
    total: u64,
    attempts: HashMap<String, Vec<Attempt>>,
    spans: HashMap<String, Vec<Span>>,
    workers: Vec<Worker>,
    stats: StoreStatistics,
}

impl Snapshot {
    fn rollout(&self, id: &str) -> Option<&Rollout> {
        self.rollouts
            .iter()
            .map(AnyRollout::rollout)
            .find(|r| r.rollout_id == id)
    }

    fn attempts_of(&self, id: &str) -> &[Attempt] {
        self.attempts.get(id).map_or(&[], Vec::as_slice)
    }

    /// Whether the watchdog may change this rollout behind the test's back (it has a timeout
    /// configured); exact predictions are only made for the others.
    fn watched(&self, id: &str) -> bool {
        self.rollout(id).is_some_and(|r| {
            r.config.timeout_seconds.is_some() || r.config.unresponsive_seconds.is_some()
        })
    }

    fn dispatchable(&self) -> BTreeSet<String> {
        self.rollouts
            .iter()
            .map(AnyRollout::rollout)
            .filter(|r| r.status.is_queuing())
            .map(|r| r.rollout_id.clone())
            .collect()
    }
}

fn ok<T>(result: Result<T, StoreError>, what: &str) -> Result<T, TestCaseError> {
    result.map_err(|e| TestCaseError::fail(format!("{what}: unexpected error {e}")))
}

fn same_counts(a: &StoreStatistics, b: &StoreStatistics) -> bool {
    (
        a.total_rollouts,
        a.total_attempts,
        a.total_spans,
        a.total_workers,
        &a.rollouts_by_status,
        &a.attempts_by_status,
    ) == (
        b.total_rollouts,
        b.total_attempts,
        b.total_spans,
        b.total_workers,
        &b.rollouts_by_status,
        &b.attempts_by_status,
    )
}

/// Reads everything. The reads that run the lazy watchdog may change statuses mid-read, so
/// the read is retried until `statistics()` (which never scans) is the same before and after:
/// every watchdog change moves one attempt and one rollout between status buckets, so equal
/// counts mean nothing changed while reading.
async fn snapshot(store: &dyn LightningStore) -> Result<Snapshot, TestCaseError> {
    for _ in 0..20 {
        let before = ok(store.statistics().await, "statistics")?;
        let page = ok(store.query_rollouts(RolloutQuery::all()).await, "query")?;
        let mut attempts = HashMap::new();
        let mut spans = HashMap::new();
        for item in &page.items {
            let id = &item.rollout().rollout_id;
            attempts.insert(id.clone(), ok(store.list_attempts(id).await, "attempts")?);
            spans.insert(id.clone(), ok(store.list_spans(id, None).await, "spans")?);
        }
        let workers = ok(store.list_workers().await, "workers")?;
        let stats = ok(store.statistics().await, "statistics")?;
        if same_counts(&before, &stats) {
            return Ok(Snapshot {
                total: page.total,
                rollouts: page.items,
                attempts,
                spans,
                workers,
                stats,
            });
        }
    }
    Err(TestCaseError::fail(
        "the store never stayed still for one full read",
    ))
}

/// The invariants that hold after every operation, whatever happened.
fn check_invariants(snap: &Snapshot, model: &Model) -> Result<(), TestCaseError> {
    // No rollout lost (nor invented): every successful enqueue/start, in creation order.
    let ids: Vec<&String> = snap
        .rollouts
        .iter()
        .map(|r| &r.rollout().rollout_id)
        .collect();
    let expected: Vec<&String> = model.rollouts.iter().collect();
    prop_assert_eq!(ids, expected, "rollouts listed");
    prop_assert_eq!(snap.total, model.rollouts.len() as u64, "total");

    let mut rollouts_by_status: BTreeMap<RolloutStatus, u64> =
        RolloutStatus::ALL.iter().map(|s| (*s, 0)).collect();
    let mut attempts_by_status: BTreeMap<AttemptStatus, u64> =
        AttemptStatus::ALL.iter().map(|s| (*s, 0)).collect();
    let mut total_attempts = 0;
    let mut stored_spans = BTreeSet::new();
    for item in &snap.rollouts {
        let r = item.rollout();
        let id = &r.rollout_id;
        *rollouts_by_status.entry(r.status).or_default() += 1;
        // end_time is set iff the rollout is finished (Q7).
        prop_assert_eq!(
            r.end_time.is_some(),
            r.status.is_finished(),
            "rollout {} {} end_time {:?}",
            id,
            r.status,
            r.end_time
        );
        // Attempts are numbered 1..=n without gap, in the order the store created them.
        let attempts = snap.attempts_of(id);
        let attempt_ids: Vec<&String> = attempts.iter().map(|a| &a.attempt_id).collect();
        let known: Vec<&String> = model.attempt_ids(id).iter().collect();
        prop_assert_eq!(attempt_ids, known, "attempts of {}", id);
        for (i, a) in attempts.iter().enumerate() {
            prop_assert_eq!(
                a.sequence_id as usize,
                i + 1,
                "sequence of {}",
                a.attempt_id
            );
            prop_assert_eq!(&a.rollout_id, id, "owner of {}", a.attempt_id);
            // end_time is set iff the attempt is succeeded/failed/timeout (Q8).
            prop_assert_eq!(
                a.end_time.is_some(),
                a.status.is_finished(),
                "attempt {} {} end_time {:?}",
                a.attempt_id,
                a.status,
                a.end_time
            );
            *attempts_by_status.entry(a.status).or_default() += 1;
            total_attempts += 1;
        }
        // The rollout is listed with its latest attempt iff it has one.
        prop_assert_eq!(
            item.attempt().map(|a| (&a.attempt_id, a.status)),
            attempts.last().map(|a| (&a.attempt_id, a.status)),
            "latest attempt carried by {}",
            id
        );
        // A `preparing`/`running` rollout has an attempt in progress. What the lifecycle
        // guarantees is exactly this: its latest attempt is `preparing` or `running` (never
        // `unresponsive`: an attempt becoming unresponsive propagates the rollout to
        // `requeuing`/`failed`, and a span that revives it makes it `running` again).
        if r.status.is_running() {
            let latest = attempts.last();
            prop_assert!(
                latest.is_some_and(|a| a.status.is_running()),
                "rollout {} is {} but its latest attempt is {:?}",
                id,
                r.status,
                latest.map(|a| a.status)
            );
        }
        for s in snap.spans.get(id).map_or(&[][..], Vec::as_slice) {
            prop_assert!(
                attempts.iter().any(|a| a.attempt_id == s.attempt_id),
                "span {} of unknown attempt {}",
                s.span_id,
                s.attempt_id
            );
            prop_assert!(
                stored_spans.insert((id.clone(), s.attempt_id.clone(), s.span_id.clone())),
                "span {} stored twice",
                s.span_id
            );
        }
    }
    prop_assert_eq!(&stored_spans, &model.spans, "stored spans");

    let worker_ids: BTreeSet<String> = snap.workers.iter().map(|w| w.worker_id.clone()).collect();
    prop_assert_eq!(&worker_ids, &model.workers, "workers");
    for w in &snap.workers {
        let busy = w.status == WorkerStatus::Busy;
        prop_assert_eq!(
            (
                w.current_rollout_id.is_some(),
                w.current_attempt_id.is_some()
            ),
            (busy, busy),
            "worker {} is {} with current ids {:?} {:?}",
            &w.worker_id,
            w.status,
            &w.current_rollout_id,
            &w.current_attempt_id
        );
    }

    // statistics() agrees with the queries.
    let stats = &snap.stats;
    prop_assert_eq!(stats.total_rollouts, snap.total, "total_rollouts");
    prop_assert_eq!(stats.total_attempts, total_attempts, "total_attempts");
    prop_assert_eq!(stats.total_spans, stored_spans.len() as u64, "total_spans");
    prop_assert_eq!(
        stats.total_workers,
        snap.workers.len() as u64,
        "total_workers"
    );
    prop_assert_eq!(
        &stats.rollouts_by_status,
        &rollouts_by_status,
        "rollouts_by_status"
    );
    prop_assert_eq!(
        &stats.attempts_by_status,
        &attempts_by_status,
        "attempts_by_status"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Running one operation
// ---------------------------------------------------------------------------------------------

/// A prediction about the state after an operation, checked on the next snapshot.
#[derive(Debug)]
enum Expect {
    RolloutStatus(String, RolloutStatus),
    AttemptStatus(String, String, AttemptStatus),
    Heartbeat(String, String),
    /// The rollout and its attempts are exactly as before.
    Unchanged(String),
    /// The attempts of the rollout are exactly as before.
    AttemptsUnchanged(String),
}

#[derive(Debug, Default)]
struct Effects {
    /// Rollouts the operation may have changed; every other rollout that the watchdog does
    /// not watch must be unchanged.
    touched: BTreeSet<String>,
    expect: Vec<Expect>,
}

fn is_not_found(result: &Result<impl std::fmt::Debug, StoreError>, kind: EntityKind) -> bool {
    matches!(result, Err(StoreError::NotFound { kind: k, .. }) if *k == kind)
}

/// Records one dispatched attempt (dequeue, dequeue_many) and checks it.
fn dispatched(
    a: &agl_core::AttemptedRollout,
    worker: Option<&str>,
    prev: &Snapshot,
    model: &mut Model,
    fx: &mut Effects,
) -> Result<(), TestCaseError> {
    let rid = a.rollout.rollout_id.clone();
    prop_assert!(
        model.attempts.contains_key(&rid),
        "dispatched unknown {}",
        rid
    );
    let prev_status = prev.rollout(&rid).map(|r| r.status);
    // Dispatchable before, or watched: the lazy scan before the dequeue may have requeued it.
    let requeued_by_scan = prev.watched(&rid)
        && (prev_status.is_some_and(|s| s.is_running()) || fx.touched.contains(&rid));
    prop_assert!(
        prev_status.is_some_and(|s| s.is_queuing()) || requeued_by_scan,
        "dispatched {} which was {:?}",
        rid,
        prev_status
    );
    prop_assert_eq!(
        a.rollout.status,
        RolloutStatus::Preparing,
        "dispatched rollout"
    );
    prop_assert_eq!(
        a.attempt.status,
        AttemptStatus::Preparing,
        "dispatched attempt"
    );
    prop_assert_eq!(a.attempt.worker_id.as_deref(), worker, "attempt worker");
    let known = model.attempts.entry(rid.clone()).or_default();
    prop_assert_eq!(
        a.attempt.sequence_id as usize,
        known.len() + 1,
        "next sequence"
    );
    known.push(a.attempt.attempt_id.clone());
    if !prev.watched(&rid) {
        fx.expect
            .push(Expect::RolloutStatus(rid.clone(), RolloutStatus::Preparing));
        fx.expect.push(Expect::AttemptStatus(
            rid.clone(),
            a.attempt.attempt_id.clone(),
            AttemptStatus::Preparing,
        ));
    }
    fx.touched.insert(rid);
    Ok(())
}

async fn apply(
    store: &dyn LightningStore,
    op: &Op,
    model: &mut Model,
    prev: &Snapshot,
) -> Result<Effects, TestCaseError> {
    let mut fx = Effects::default();
    match op {
        Op::Enqueue(cfg) => {
            let r = ok(
                store
                    .enqueue_rollout(cfg.request(model.rollouts.len()))
                    .await,
                "enqueue",
            )?;
            prop_assert_eq!(r.status, RolloutStatus::Queuing, "enqueued");
            prop_assert_eq!(r.end_time, None, "enqueued end_time");
            prop_assert_eq!(r.config.max_attempts, cfg.max_attempts, "config kept");
            model.attempts.insert(r.rollout_id.clone(), Vec::new());
            model.rollouts.push(r.rollout_id);
        }
        Op::Start(cfg, w) => {
            let worker = w.map(worker_name);
            let a = ok(
                store
                    .start_rollout(cfg.request(model.rollouts.len()), worker.clone())
                    .await,
                "start_rollout",
            )?;
            prop_assert_eq!(a.rollout.status, RolloutStatus::Preparing, "started");
            prop_assert_eq!(a.attempt.sequence_id, 1, "first attempt");
            prop_assert_eq!(&a.attempt.worker_id, &worker, "attempt worker");
            model.workers.extend(worker);
            model.attempts.insert(
                a.rollout.rollout_id.clone(),
                vec![a.attempt.attempt_id.clone()],
            );
            model.rollouts.push(a.rollout.rollout_id);
        }
        Op::Dequeue(w) | Op::DequeueMany(_, w) => {
            let limit = match op {
                Op::DequeueMany(n, _) => *n,
                _ => 1,
            };
            let worker = w.map(worker_name);
            let got = match op {
                Op::DequeueMany(..) => ok(
                    store.dequeue_many(limit, worker.as_deref()).await,
                    "dequeue_many",
                )?,
                _ => ok(store.dequeue_rollout(worker.as_deref()).await, "dequeue")?
                    .into_iter()
                    .collect(),
            };
            model.workers.extend(worker.clone());
            prop_assert!(
                got.len() <= limit,
                "{} dispatched for limit {}",
                got.len(),
                limit
            );
            for a in &got {
                dispatched(a, worker.as_deref(), prev, model, &mut fx)?;
            }
            if got.len() < limit {
                // The queue ran dry: every rollout dispatchable before was dispatched now (the
                // watchdog never touches a queued rollout, so nothing else removed it).
                let missed: Vec<String> = prev
                    .dispatchable()
                    .into_iter()
                    .filter(|id| !fx.touched.contains(id))
                    .collect();
                prop_assert!(
                    missed.is_empty(),
                    "queued but never dispatched: {:?}",
                    missed
                );
            }
        }
        Op::StartAttempt(i, w) => {
            let worker = w.map(worker_name);
            let Some(rid) = model.pick(*i) else {
                let res = store.start_attempt("ro-missing", worker.as_deref()).await;
                prop_assert!(is_not_found(&res, EntityKind::Rollout), "{:?}", res);
                return Ok(fx);
            };
            let a = ok(
                store.start_attempt(&rid, worker.as_deref()).await,
                "start_attempt",
            )?;
            model.workers.extend(worker);
            let known = model.attempts.entry(rid.clone()).or_default();
            prop_assert_eq!(a.attempt.sequence_id as usize, known.len() + 1, "sequence");
            prop_assert_eq!(a.rollout.status, RolloutStatus::Preparing, "restarted");
            prop_assert_eq!(a.rollout.end_time, None, "end_time cleared");
            known.push(a.attempt.attempt_id);
            if !prev.watched(&rid) {
                fx.expect
                    .push(Expect::RolloutStatus(rid.clone(), RolloutStatus::Preparing));
            }
            fx.touched.insert(rid);
        }
        Op::AddSpan(i, j, k) => {
            let Some(rid) = model.pick(*i) else {
                let span = Span::new("ro-missing", "at-missing", 1, "op", Attributes::new());
                let res = store.add_span(span).await;
                prop_assert!(is_not_found(&res, EntityKind::Rollout), "{:?}", res);
                return Ok(fx);
            };
            let ids = model.attempt_ids(&rid).to_vec();
            if ids.is_empty() {
                let span = Span::new(&rid, "at-missing", 1, "op", Attributes::new());
                let res = store.add_span(span).await;
                prop_assert!(is_not_found(&res, EntityKind::Attempt), "{:?}", res);
                fx.expect.push(Expect::Unchanged(rid));
                return Ok(fx);
            }
            let pos = j % ids.len();
            let aid = ids[pos].clone();
            let seq = ok(
                store.get_next_span_sequence_id(&rid, &aid).await,
                "next seq",
            )?;
            let mut span = Span::new(&rid, &aid, seq, "op", Attributes::new());
            span.span_id = format!("{k:016x}");
            let key = (rid.clone(), aid.clone(), span.span_id.clone());
            let is_new = !model.spans.contains(&key);
            let stored = ok(store.add_span(span).await, "add_span")?;
            prop_assert_eq!(stored.is_some(), is_new, "stored iff not a duplicate");
            model.spans.insert(key);
            fx.touched.insert(rid.clone());
            if prev.watched(&rid) {
                if is_new {
                    fx.expect.push(Expect::Heartbeat(rid, aid));
                }
            } else if is_new {
                let (mut r, mut a) = prev_pair(prev, &rid, pos)?;
                lifecycle::record_span(&mut r, &mut a, pos + 1 == ids.len(), 0.0);
                fx.expect.push(Expect::RolloutStatus(rid.clone(), r.status));
                fx.expect
                    .push(Expect::AttemptStatus(rid.clone(), aid.clone(), a.status));
                fx.expect.push(Expect::Heartbeat(rid, aid));
            } else {
                fx.expect.push(Expect::Unchanged(rid));
            }
        }
        Op::UpdateAttempt(i, j, status) => {
            let update = AttemptUpdate {
                status: Some(*status),
                ..AttemptUpdate::default()
            };
            let Some(rid) = model.pick(*i) else {
                let res = store.update_attempt("ro-missing", "latest", update).await;
                prop_assert!(is_not_found(&res, EntityKind::Rollout), "{:?}", res);
                return Ok(fx);
            };
            let ids = model.attempt_ids(&rid).to_vec();
            if ids.is_empty() {
                let selector = if j.is_some() { "at-missing" } else { "latest" };
                let res = store.update_attempt(&rid, selector, update).await;
                prop_assert!(is_not_found(&res, EntityKind::Attempt), "{:?}", res);
                fx.expect.push(Expect::Unchanged(rid));
                return Ok(fx);
            }
            let pos = j.map_or(ids.len() - 1, |j| j % ids.len());
            let selector = if j.is_some() {
                ids[pos].as_str()
            } else {
                "latest"
            };
            let res = store.update_attempt(&rid, selector, update.clone()).await;
            fx.touched.insert(rid.clone());
            if prev.watched(&rid) {
                match &res {
                    Ok(a) => prop_assert_eq!(a.status, *status, "updated attempt"),
                    Err(StoreError::InvalidTransition { to, .. }) => {
                        prop_assert_eq!(to.as_str(), status.as_str(), "refused target");
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("update_attempt: {e}"))),
                }
                return Ok(fx);
            }
            let (mut r, mut a) = prev_pair(prev, &rid, pos)?;
            let oracle =
                lifecycle::apply_attempt_update(&mut r, &mut a, pos + 1 == ids.len(), &update, 0.0);
            match (res, oracle) {
                (Ok(got), Ok(_)) => {
                    prop_assert_eq!(got.status, a.status, "updated attempt");
                    fx.expect.push(Expect::RolloutStatus(rid.clone(), r.status));
                    fx.expect
                        .push(Expect::AttemptStatus(rid, ids[pos].clone(), a.status));
                }
                (Err(got), Err(want)) => {
                    prop_assert_eq!(got, want, "refusal");
                    fx.expect.push(Expect::Unchanged(rid));
                }
                (got, want) => {
                    return Err(TestCaseError::fail(format!(
                        "update_attempt {rid} {selector} → {status}: store {got:?}, rule {want:?}"
                    )));
                }
            }
        }
        Op::UpdateRollout(i, status) => {
            let update = RolloutUpdate {
                status: Some(*status),
                ..RolloutUpdate::default()
            };
            let Some(rid) = model.pick(*i) else {
                let res = store.update_rollout("ro-missing", update).await;
                prop_assert!(is_not_found(&res, EntityKind::Rollout), "{:?}", res);
                return Ok(fx);
            };
            let res = store.update_rollout(&rid, update.clone()).await;
            fx.touched.insert(rid.clone());
            fx.expect.push(Expect::AttemptsUnchanged(rid.clone()));
            if prev.watched(&rid) {
                match &res {
                    Ok(r) => prop_assert_eq!(r.status, *status, "updated rollout"),
                    Err(StoreError::InvalidTransition { to, .. }) => {
                        prop_assert_eq!(to.as_str(), status.as_str(), "refused target");
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("update_rollout: {e}"))),
                }
                return Ok(fx);
            }
            let mut r = prev
                .rollout(&rid)
                .cloned()
                .ok_or_else(|| TestCaseError::fail(format!("{rid} missing before")))?;
            let oracle = lifecycle::apply_rollout_update(&mut r, update, 0.0);
            match (res, oracle) {
                (Ok(got), Ok(_)) => {
                    prop_assert_eq!(got.status, r.status, "updated rollout");
                    fx.expect.push(Expect::RolloutStatus(rid, r.status));
                }
                (Err(got), Err(want)) => {
                    prop_assert_eq!(got, want, "refusal");
                    fx.expect.push(Expect::Unchanged(rid));
                }
                (got, want) => {
                    return Err(TestCaseError::fail(format!(
                        "update_rollout {rid} → {status}: store {got:?}, rule {want:?}"
                    )));
                }
            }
        }
        Op::Watchdog => {
            let changed = ok(store.run_watchdog().await, "run_watchdog")?;
            // At most one verdict per watched rollout in progress.
            let candidates = prev
                .rollouts
                .iter()
                .map(AnyRollout::rollout)
                .filter(|r| r.status.is_running() && prev.watched(&r.rollout_id))
                .count();
            prop_assert!(
                changed <= candidates,
                "run_watchdog changed {} attempts, {} candidates",
                changed,
                candidates
            );
        }
    }
    Ok(fx)
}

/// The rollout and its attempt at `pos` as they were before the operation.
fn prev_pair(prev: &Snapshot, rid: &str, pos: usize) -> Result<(Rollout, Attempt), TestCaseError> {
    let r = prev.rollout(rid).cloned();
    let a = prev.attempts_of(rid).get(pos).cloned();
    match (r, a) {
        (Some(r), Some(a)) => Ok((r, a)),
        _ => Err(TestCaseError::fail(format!(
            "{rid} attempt #{pos} missing before the operation"
        ))),
    }
}

fn check_effects(prev: &Snapshot, now: &Snapshot, fx: &Effects) -> Result<(), TestCaseError> {
    for e in &fx.expect {
        match e {
            Expect::RolloutStatus(rid, status) => {
                let got = now.rollout(rid).map(|r| r.status);
                prop_assert_eq!(got, Some(*status), "status of {}", rid);
            }
            Expect::AttemptStatus(rid, aid, status) => {
                let got = now
                    .attempts_of(rid)
                    .iter()
                    .find(|a| &a.attempt_id == aid)
                    .map(|a| a.status);
                prop_assert_eq!(got, Some(*status), "status of {}", aid);
            }
            Expect::Heartbeat(rid, aid) => {
                let got = now
                    .attempts_of(rid)
                    .iter()
                    .find(|a| &a.attempt_id == aid)
                    .and_then(|a| a.last_heartbeat_time);
                prop_assert!(got.is_some(), "a stored span sets the heartbeat of {}", aid);
            }
            Expect::Unchanged(rid) => {
                prop_assert_eq!(now.rollout(rid), prev.rollout(rid), "{} unchanged", rid);
                prop_assert_eq!(
                    now.attempts_of(rid),
                    prev.attempts_of(rid),
                    "attempts of {} unchanged",
                    rid
                );
            }
            Expect::AttemptsUnchanged(rid) => {
                prop_assert_eq!(
                    now.attempts_of(rid),
                    prev.attempts_of(rid),
                    "attempts of {} unchanged",
                    rid
                );
            }
        }
    }
    // No action at a distance: rollouts the operation did not target and the watchdog does
    // not watch are exactly as before.
    for item in &prev.rollouts {
        let rid = &item.rollout().rollout_id;
        if fx.touched.contains(rid) || prev.watched(rid) {
            continue;
        }
        prop_assert_eq!(
            now.rollout(rid),
            Some(item.rollout()),
            "{} changed by an operation on another rollout",
            rid
        );
        prop_assert_eq!(
            now.attempts_of(rid),
            prev.attempts_of(rid),
            "attempts of {} changed by an operation on another rollout",
            rid
        );
    }
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime, TestCaseError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestCaseError::fail(format!("tokio runtime: {e}")))
}

/// Runs `ops` on a fresh store from `make`, checking every invariant after every operation.
fn check_sequence<S: LightningStore>(
    make: impl AsyncFn() -> S,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    runtime()?.block_on(async {
        let store = make().await;
        let mut model = Model::default();
        let mut prev = snapshot(&store).await?;
        check_invariants(&prev, &model)?;
        for (step, op) in ops.iter().enumerate() {
            let fx = apply(&store, op, &mut model, &prev)
                .await
                .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
            let now = snapshot(&store).await?;
            check_invariants(&now, &model)
                .and_then(|()| check_effects(&prev, &now, &fx))
                .map_err(|e| TestCaseError::fail(format!("after step {step} {op:?}: {e}")))?;
            prev = now;
        }
        ok(store.close().await, "close")
    })
}

// ---------------------------------------------------------------------------------------------
// Drain: every rollout ends failed once its attempts run out
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    /// Worker `w` dequeues.
    Dequeue(u8),
    /// The holder of an open attempt (picked modulo the number open) reports `failed`.
    Fail(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..4).prop_map(Step::Dequeue),
        any::<usize>().prop_map(Step::Fail),
    ]
}

/// What the drain has seen: attempts made per rollout and the attempts still open.
struct Drain {
    m: u32,
    made: HashMap<String, u32>,
    open: Vec<(String, String)>,
    dispatches: usize,
}

impl Drain {
    fn in_progress(&self, rid: &str) -> bool {
        self.open.iter().any(|(r, _)| r == rid)
    }

    fn exhausted(&self, rid: &str) -> bool {
        self.made.get(rid) == Some(&self.m)
    }

    /// Records a dequeue answer; `false` when nothing was dispatched.
    fn dispatched(
        &mut self,
        got: Option<agl_core::AttemptedRollout>,
    ) -> Result<bool, TestCaseError> {
        let Some(a) = got else { return Ok(false) };
        let rid = a.rollout.rollout_id.clone();
        prop_assert!(
            !self.in_progress(&rid),
            "{} dispatched while its attempt is open",
            rid
        );
        let n = self
            .made
            .get_mut(&rid)
            .ok_or_else(|| TestCaseError::fail(format!("unknown {rid}")))?;
        *n += 1;
        prop_assert!(*n <= self.m, "{} got attempt {} of {}", rid, *n, self.m);
        prop_assert_eq!(a.attempt.sequence_id, *n, "sequence of {}", rid);
        self.dispatches += 1;
        self.open.push((rid, a.attempt.attempt_id));
        Ok(true)
    }
}

/// Enqueues `k` rollouts with `max_attempts = m`, `retry_condition = [failed]`; workers
/// dequeue and fail every attempt in the interleaving `steps` gives, then drain the rest.
fn check_drain<S: LightningStore>(
    make: impl AsyncFn() -> S,
    k: usize,
    m: u32,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    runtime()?.block_on(async {
        let store = make().await;
        let config = RolloutConfig {
            max_attempts: m,
            retry_condition: vec![AttemptStatus::Failed],
            ..RolloutConfig::default()
        };
        let requests = (0..k)
            .map(|i| EnqueueRolloutRequest {
                config: Some(config.clone()),
                ..EnqueueRolloutRequest::new(json!(i))
            })
            .collect();
        let ids: Vec<String> = ok(store.enqueue_many(requests).await, "enqueue_many")?
            .into_iter()
            .map(|r| r.rollout_id)
            .collect();
        let mut state = Drain {
            m,
            made: ids.iter().map(|id| (id.clone(), 0)).collect(),
            open: Vec::new(),
            dispatches: 0,
        };
        let dequeue = |w: u8| {
            let worker = worker_name(w);
            let store = &store;
            async move { ok(store.dequeue_rollout(Some(&worker)).await, "dequeue") }
        };

        for s in steps {
            match s {
                Step::Dequeue(w) => {
                    let got = dequeue(*w).await?;
                    if !state.dispatched(got)? {
                        // Nothing dispatchable: every rollout is in progress or used up.
                        for id in &ids {
                            prop_assert!(
                                state.in_progress(id) || state.exhausted(id),
                                "{} neither in progress nor exhausted yet not dispatched",
                                id
                            );
                        }
                    }
                }
                Step::Fail(i) => {
                    if state.open.is_empty() {
                        continue;
                    }
                    let (rid, aid) = state.open.remove(i % state.open.len());
                    fail_attempt(&store, &rid, &aid, state.exhausted(&rid)).await?;
                }
            }
        }
        // Drain what is left.
        let limit = k * m as usize + k + 2;
        let mut rounds = 0;
        loop {
            while let Some((rid, aid)) = state.open.pop() {
                fail_attempt(&store, &rid, &aid, state.exhausted(&rid)).await?;
            }
            if !state.dispatched(dequeue(0).await?)? {
                break;
            }
            rounds += 1;
            prop_assert!(rounds <= limit, "the queue never ran dry");
        }

        let dispatches = state.dispatches;
        prop_assert_eq!(dispatches, k * m as usize, "attempts dispatched in total");
        for id in &ids {
            let r = ok(store.get_rollout_by_id(id).await, "get")?
                .ok_or_else(|| TestCaseError::fail(format!("{id} lost")))?;
            prop_assert_eq!(r.status, RolloutStatus::Failed, "final status of {}", id);
            prop_assert!(r.end_time.is_some(), "end_time of {}", id);
            let attempts = ok(store.list_attempts(id).await, "attempts")?;
            let seqs: Vec<u32> = attempts.iter().map(|a| a.sequence_id).collect();
            prop_assert_eq!(seqs, (1..=m).collect::<Vec<_>>(), "attempts of {}", id);
            for a in &attempts {
                prop_assert_eq!(a.status, AttemptStatus::Failed, "attempt {}", &a.attempt_id);
                prop_assert!(a.end_time.is_some(), "end_time of {}", &a.attempt_id);
            }
        }
        // Exactly one terminal state each, seen the same way by every read.
        let stats = ok(store.statistics().await, "statistics")?;
        for (status, n) in &stats.rollouts_by_status {
            let want = if *status == RolloutStatus::Failed {
                k
            } else {
                0
            };
            prop_assert_eq!(*n, want as u64, "rollouts {}", status);
        }
        for (status, n) in &stats.attempts_by_status {
            let want = if *status == AttemptStatus::Failed {
                k * m as usize
            } else {
                0
            };
            prop_assert_eq!(*n, want as u64, "attempts {}", status);
        }
        let failed = ok(
            store
                .query_rollouts(RolloutQuery::with_status(&[RolloutStatus::Failed]))
                .await,
            "query",
        )?;
        prop_assert_eq!(failed.total, k as u64, "failed rollouts");
        let done = ok(
            store.wait_for_rollouts(&ids, Some(Duration::ZERO)).await,
            "wait",
        )?;
        prop_assert_eq!(done.len(), k, "every rollout finished");
        for w in 0..4 {
            prop_assert!(dequeue(w).await?.is_none(), "dispatched after the drain");
        }
        prop_assert!(
            ok(store.dequeue_many(3, None).await, "dequeue_many")?.is_empty(),
            "dispatched after the drain"
        );
        for w in ok(store.list_workers().await, "workers")? {
            prop_assert_eq!(w.status, WorkerStatus::Idle, "worker {}", &w.worker_id);
            prop_assert_eq!(w.current_attempt_id, None, "worker {}", &w.worker_id);
        }
        ok(store.close().await, "close")
    })
}

/// Fails an open attempt and checks the retry decision: `requeuing` while attempts remain,
/// `failed` (with `end_time`) on the last one.
async fn fail_attempt(
    store: &dyn LightningStore,
    rid: &str,
    aid: &str,
    last: bool,
) -> Result<(), TestCaseError> {
    let update = AttemptUpdate {
        status: Some(AttemptStatus::Failed),
        ..AttemptUpdate::default()
    };
    let a = ok(store.update_attempt(rid, aid, update).await, "fail")?;
    prop_assert_eq!(a.status, AttemptStatus::Failed, "attempt {}", aid);
    let r = ok(store.get_rollout_by_id(rid).await, "get")?
        .ok_or_else(|| TestCaseError::fail(format!("{rid} lost")))?;
    let want = if last {
        RolloutStatus::Failed
    } else {
        RolloutStatus::Requeuing
    };
    prop_assert_eq!(r.status, want, "{} after a failed attempt", rid);
    prop_assert_eq!(r.end_time.is_some(), last, "end_time of {}", rid);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

fn memory() -> InMemoryLightningStore {
    InMemoryLightningStore::with_options(0.0, None)
}

/// Fresh SQLite stores, one file each, in a directory removed when the factory is dropped.
struct SqliteFactory {
    dir: tempfile::TempDir,
    next: AtomicUsize,
}

impl SqliteFactory {
    fn new() -> Self {
        SqliteFactory {
            dir: tempfile::tempdir().expect("temp dir"),
            next: AtomicUsize::new(0),
        }
    }

    fn make(&self) -> SqliteLightningStore {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        open_sqlite(&self.dir.path().join(format!("store-{n}.db")))
    }
}

fn open_sqlite(path: &Path) -> SqliteLightningStore {
    SqliteLightningStore::open_with(
        path,
        SqliteOptions {
            scan_debounce_seconds: 0.0,
            sweep_interval: None,
            ..SqliteOptions::default()
        },
    )
    .expect("open sqlite store")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn memory_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..=60)) {
        check_sequence(async || memory(), &ops)?;
    }

    #[test]
    fn memory_drain_ends_every_rollout_failed(
        k in 1usize..=6,
        m in 1u32..=4,
        steps in proptest::collection::vec(step(), 0..80),
    ) {
        check_drain(async || memory(), k, m, &steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn sqlite_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..=60)) {
        let factory = SqliteFactory::new();
        check_sequence(async || factory.make(), &ops)?;
    }

    #[test]
    fn sqlite_drain_ends_every_rollout_failed(
        k in 1usize..=6,
        m in 1u32..=4,
        steps in proptest::collection::vec(step(), 0..80),
    ) {
        let factory = SqliteFactory::new();
        check_drain(async || factory.make(), k, m, &steps)?;
    }
}

/// Fresh PostgreSQL stores, one partition each, on the server of `AGL_TEST_POSTGRES_URL`
/// (`scripts/ci/postgres.sh` runs these tests with `--features postgres-tests`; without the variable
/// they fail, so a run that asked for PostgreSQL never silently tests nothing).
#[cfg(feature = "postgres-tests")]
async fn postgres() -> agl_store::postgres::PostgresLightningStore {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let base = std::env::var("AGL_TEST_POSTGRES_URL")
        .expect("AGL_TEST_POSTGRES_URL is not set: run through scripts/ci/postgres.sh");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let partition = format!(
        "prop_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let url = format!("{base}?partition={partition}")
        .parse()
        .expect("store URL");
    agl_store::postgres::PostgresLightningStore::open(
        &url,
        agl_store::postgres::PostgresOptions {
            scan_debounce_seconds: 0.0,
            sweep_interval: None,
            ..Default::default()
        },
    )
    .await
    .expect("open postgres store")
}

#[cfg(feature = "postgres-tests")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn postgres_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..=60)) {
        check_sequence(postgres, &ops)?;
    }

    #[test]
    fn postgres_drain_ends_every_rollout_failed(
        k in 1usize..=6,
        m in 1u32..=4,
        steps in proptest::collection::vec(step(), 0..80),
    ) {
        check_drain(postgres, k, m, &steps)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Background sweeper
// ---------------------------------------------------------------------------------------------

/// With a 10 s lazy-scan debounce and no calls at all, only the background sweeper can notice
/// a 0.2 s timeout; the same store without a sweeper does not notice it.
#[tokio::test]
async fn background_sweeper_times_out_attempts_without_any_call() {
    let swept = InMemoryLightningStore::with_options(10.0, Some(Duration::from_millis(50)));
    let lazy = InMemoryLightningStore::with_options(10.0, None);
    let request = || EnqueueRolloutRequest {
        config: Some(RolloutConfig {
            timeout_seconds: Some(0.2),
            ..RolloutConfig::default()
        }),
        ..EnqueueRolloutRequest::new(json!("slow"))
    };
    // The first call of each store runs its lazy scan (nothing is due yet); the next lazy scan
    // could only run 10 s later.
    swept.start_rollout(request(), None).await.unwrap();
    lazy.start_rollout(request(), None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // statistics() never runs the lazy scan.
    let stats = swept.statistics().await.unwrap();
    assert_eq!(stats.attempts_by_status[&AttemptStatus::Timeout], 1);
    assert_eq!(stats.attempts_by_status[&AttemptStatus::Preparing], 0);
    assert_eq!(stats.rollouts_by_status[&RolloutStatus::Failed], 1);
    let stats = lazy.statistics().await.unwrap();
    assert_eq!(stats.attempts_by_status[&AttemptStatus::Preparing], 1);
    assert_eq!(stats.attempts_by_status[&AttemptStatus::Timeout], 0);
}
