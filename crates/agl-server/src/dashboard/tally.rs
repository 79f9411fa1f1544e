//! The dashboard's tally: what the training and governance pages plot, aggregated from the
//! store's finished rollouts and their spans by one background follower.
//!
//! A page view never scans the store: the [`Follower`] reads each rollout once, after it
//! finishes (status `succeeded`, `failed` or `cancelled`), in `end_time` order, together with
//! the spans of its latest attempt, and folds them into a [`Tally`]. Each poll asks only for
//! rollouts that ended at or after the last end time it saw, minus [`SLACK`] seconds (a
//! rollout whose end is committed later than one that ended up to that long after it is still
//! counted; ids already counted are skipped). A new dashboard over a full store catches up in
//! the background; the pages say how far it got.
//!
//! What one rollout contributes (the span attributes agl's runners, trainers and gateway
//! write, see `agl_core::semconv`):
//! * to its **resources version** (`resources_id`, and the rollout's mode): its final reward
//!   (`agentlightning.reward.0.value`, the last span that has one), whether it was correct
//!   (`agl.correct` on any span; the last one wins), and whether any span reported a violation
//!   (`agent_os.violation.policy`);
//! * to **governance**: each violation, by policy and severity, in buckets of the span's start
//!   time (1 s wide, doubled whenever more than [`MAX_BUCKETS`] would be kept); and each blocked action (`agl.verdict` or `agl.gateway.verdict` =
//!   `block`), by its text (`agl.sql`, else `agent_os.action_type`, else the span name).
//!
//! A resources id of the form `PREFIX` + `v` + digits (`policy-v12`,
//! `agl-train-llm-enforce-v3`) is step 12 (3) of the series `PREFIX`; any other id is a series
//! of its own, placed by the order it first appeared.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use agl_core::semconv;
use agl_core::{AttributeValue, Rollout, RolloutStatus, Span, get_reward_value};
use agl_store::{
    LightningStore, RolloutQuery, Sort, SpanQuery, StoreError, StoreStatistics, Window,
};

/// Seconds of end times re-read on every poll (see the module docs).
pub(crate) const SLACK: f64 = 2.0;
/// Violation buckets kept at most: past it, the bucket width doubles (1 s, 2 s, 4 s, …), so
/// a run of any length keeps a bounded, evenly spaced history.
const MAX_BUCKETS: usize = 4_096;
/// Rollouts read per store query.
const BATCH: u64 = 256;
/// Spans read per rollout at most.
const MAX_SPANS: u64 = 2_000;
/// Distinct blocked actions kept; past it the least frequent half is dropped.
const MAX_ACTIONS: usize = 4_096;

const FINISHED: [RolloutStatus; 3] = [
    RolloutStatus::Succeeded,
    RolloutStatus::Failed,
    RolloutStatus::Cancelled,
];

/// One violation a rollout's spans report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finding {
    pub(crate) policy: String,
    pub(crate) severity: String,
    /// Start of the span that reported it (else the rollout's end), Unix seconds.
    pub(crate) time: f64,
}

/// What one finished rollout contributes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RolloutFacts {
    pub(crate) resources_id: Option<String>,
    pub(crate) mode: String,
    pub(crate) end_time: f64,
    pub(crate) reward: Option<f64>,
    pub(crate) correct: Option<bool>,
    pub(crate) findings: Vec<Finding>,
    pub(crate) blocked: Vec<String>,
}

fn text(v: &AttributeValue) -> Option<String> {
    match v {
        AttributeValue::Str(s) => Some(s.clone()),
        _ => None,
    }
}

impl RolloutFacts {
    /// Reads `r` and the spans of its latest attempt (any order; sorted here by sequence id).
    pub(crate) fn of(r: &Rollout, spans: &[Span]) -> RolloutFacts {
        let mut ordered: Vec<&Span> = spans.iter().collect();
        ordered.sort_by_key(|s| s.sequence_id);
        let end_time = r.end_time.unwrap_or(r.start_time);
        let reward = ordered.iter().rev().find_map(|s| get_reward_value(s));
        let mut correct = None;
        let mut findings = Vec::new();
        let mut blocked = Vec::new();
        for s in ordered {
            let a = &s.attributes;
            if let Some(AttributeValue::Bool(c)) = a.get(semconv::agl::CORRECT) {
                correct = Some(*c);
            }
            if let Some(policy) = a.get(semconv::agent_os::VIOLATION_POLICY).and_then(text) {
                findings.push(Finding {
                    policy,
                    severity: a
                        .get(semconv::agent_os::VIOLATION_SEVERITY)
                        .and_then(text)
                        .unwrap_or_else(|| "–".into()),
                    time: s.start_time.unwrap_or(end_time),
                });
            }
            let verdict = a
                .get(semconv::agl::VERDICT)
                .or_else(|| a.get(semconv::agl::GATEWAY_VERDICT))
                .and_then(text);
            if verdict.as_deref() == Some("block") {
                blocked.push(
                    a.get(semconv::agl::SQL)
                        .or_else(|| a.get(semconv::agent_os::ACTION_TYPE))
                        .and_then(text)
                        .unwrap_or_else(|| s.name.clone()),
                );
            }
        }
        RolloutFacts {
            resources_id: r.resources_id.clone(),
            mode: r.mode.map_or("–", |m| m.as_str()).to_string(),
            end_time,
            reward,
            correct,
            findings,
            blocked,
        }
    }
}

/// Splits `policy-v12` into (`policy-`, 12); other ids are their own series without a step.
pub(crate) fn series_of(resources_id: &str) -> (String, Option<u64>) {
    let digits = resources_id
        .bytes()
        .rev()
        .take_while(u8::is_ascii_digit)
        .count();
    let (head, tail) = resources_id.split_at(resources_id.len() - digits);
    match (head.strip_suffix('v'), tail.parse::<u64>()) {
        (Some(prefix), Ok(step)) if digits > 0 => (prefix.to_string(), Some(step)),
        _ => (resources_id.to_string(), None),
    }
}

/// The rollouts of one resources version in one mode.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct VersionStats {
    pub(crate) rollouts: u64,
    /// Rollouts with a reward, and their sum.
    pub(crate) rewarded: u64,
    pub(crate) reward_sum: f64,
    /// Rollouts with `agl.correct`, and how many were correct.
    pub(crate) judged: u64,
    pub(crate) correct: u64,
    /// Rollouts with at least one violation.
    pub(crate) violating: u64,
    /// When its first rollout ended (orders versions without a step).
    pub(crate) first_end: f64,
    pub(crate) last_end: f64,
}

impl VersionStats {
    pub(crate) fn mean_reward(&self) -> Option<f64> {
        (self.rewarded > 0).then(|| self.reward_sum / self.rewarded as f64)
    }
    pub(crate) fn accuracy(&self) -> Option<f64> {
        (self.judged > 0).then(|| self.correct as f64 / self.judged as f64)
    }
    pub(crate) fn violation_rate(&self) -> Option<f64> {
        (self.rollouts > 0).then(|| self.violating as f64 / self.rollouts as f64)
    }
}

/// Key of a version: (resources id or `–`, mode).
pub(crate) type VersionKey = (String, String);

/// Everything the follower has counted.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    /// Finished rollouts counted.
    pub(crate) rollouts: u64,
    pub(crate) versions: HashMap<VersionKey, VersionStats>,
    /// Violations per bucket (bucket start, Unix seconds) and (policy, severity).
    pub(crate) violations: BTreeMap<i64, BTreeMap<(String, String), u64>>,
    /// Width of a bucket of [`Tally::violations`], seconds (0 = 1 s, before the first one).
    pub(crate) bucket_seconds: i64,
    /// Violations per (policy, severity), all time.
    pub(crate) by_policy: BTreeMap<(String, String), u64>,
    /// Blocked actions by text (see [`MAX_ACTIONS`]).
    pub(crate) blocked: HashMap<String, u64>,
    /// Blocked actions in all (exact, unlike the per-action counts once pruned).
    pub(crate) blocked_total: u64,
    /// Whether [`Tally::blocked`] was ever pruned (its counts are then lower bounds).
    pub(crate) blocked_pruned: bool,
}

impl Tally {
    /// Folds one rollout in.
    pub(crate) fn add(&mut self, f: &RolloutFacts) {
        self.rollouts += 1;
        let key = (
            f.resources_id.clone().unwrap_or_else(|| "–".into()),
            f.mode.clone(),
        );
        let v = self.versions.entry(key).or_insert_with(|| VersionStats {
            first_end: f.end_time,
            last_end: f.end_time,
            ..VersionStats::default()
        });
        v.rollouts += 1;
        v.first_end = v.first_end.min(f.end_time);
        v.last_end = v.last_end.max(f.end_time);
        if let Some(r) = f.reward.filter(|r| r.is_finite()) {
            v.rewarded += 1;
            v.reward_sum += r;
        }
        if let Some(c) = f.correct {
            v.judged += 1;
            v.correct += u64::from(c);
        }
        v.violating += u64::from(!f.findings.is_empty());
        self.bucket_seconds = self.bucket_seconds.max(1);
        for x in &f.findings {
            let width = self.bucket_seconds;
            let bucket = ((x.time.floor() as i64).div_euclid(width)) * width;
            let key = (x.policy.clone(), x.severity.clone());
            *self
                .violations
                .entry(bucket)
                .or_default()
                .entry(key.clone())
                .or_default() += 1;
            *self.by_policy.entry(key).or_default() += 1;
        }
        for action in &f.blocked {
            self.blocked_total += 1;
            *self.blocked.entry(action.clone()).or_default() += 1;
        }
        if self.blocked.len() > MAX_ACTIONS {
            self.prune_blocked();
        }
        while self.violations.len() > MAX_BUCKETS {
            self.widen_buckets();
        }
    }

    /// Doubles the bucket width, merging pairs of buckets.
    fn widen_buckets(&mut self) {
        let width = self.bucket_seconds * 2;
        let mut merged: BTreeMap<i64, BTreeMap<(String, String), u64>> = BTreeMap::new();
        for (bucket, counts) in std::mem::take(&mut self.violations) {
            let slot = merged.entry(bucket.div_euclid(width) * width).or_default();
            for (k, n) in counts {
                *slot.entry(k).or_default() += n;
            }
        }
        self.violations = merged;
        self.bucket_seconds = width;
    }

    /// Keeps the most frequent half of the blocked actions.
    fn prune_blocked(&mut self) {
        let mut counts: Vec<u64> = self.blocked.values().copied().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let floor = counts.get(MAX_ACTIONS / 2).copied().unwrap_or(0);
        self.blocked.retain(|_, n| *n > floor);
        self.blocked_pruned = true;
    }

    /// The `n` most blocked actions, most frequent first (ties by text).
    pub(crate) fn top_blocked(&self, n: usize) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> =
            self.blocked.iter().map(|(a, n)| (a.clone(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }
}

/// Where the follower is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// Finished rollouts in the store at the last poll.
    pub(crate) finished_in_store: u64,
    /// Whether the last poll read everything that had finished when it started.
    pub(crate) caught_up: bool,
    /// The last poll's error, if it failed.
    pub(crate) error: Option<String>,
}

impl Progress {
    /// What `progress.html` shows: rollouts counted of those finished, and the last error.
    pub(crate) fn context(&self, tally: &Tally) -> minijinja::Value {
        minijinja::context! {
            counted => tally.rollouts,
            finished => self.finished_in_store,
            caught_up => self.caught_up,
            error => self.error.clone(),
        }
    }
}

/// What one [`Follower::poll`] did.
#[derive(Debug)]
pub(crate) struct Polled {
    /// Rollouts counted.
    pub(crate) counted: u64,
    /// Whether it stopped at its budget with more to read.
    pub(crate) more: bool,
    /// The store's statistics, read when the poll started.
    pub(crate) stats: StoreStatistics,
}

/// The follower's state: what it counted and where it is.
#[derive(Debug, Default)]
struct State {
    tally: Tally,
    progress: Progress,
    /// Ids counted whose end time is within [`SLACK`] of the watermark (older ones are
    /// pruned: no query returns them again).
    recent: HashMap<String, f64>,
    /// The latest end time counted.
    watermark: Option<f64>,
}

/// Follows the store's finished rollouts into a [`Tally`] (see the module docs).
pub(crate) struct Follower {
    store: Arc<dyn LightningStore>,
    state: RwLock<State>,
}

impl Follower {
    pub(crate) fn new(store: Arc<dyn LightningStore>) -> Follower {
        Follower {
            store,
            state: RwLock::new(State::default()),
        }
    }

    /// `f` of the tally and the progress, under the read lock (a page takes what it shows,
    /// not a copy of the whole tally).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Tally, &Progress) -> T) -> T {
        match self.state.read() {
            Ok(s) => f(&s.tally, &s.progress),
            Err(poisoned) => {
                let s = poisoned.into_inner();
                f(&s.tally, &s.progress)
            }
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        match self.state.write() {
            Ok(mut s) => f(&mut s),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Reads what finished since the last poll, at most `budget` rollouts (a store read for
    /// the first time is caught up over several polls, so the pages see progress).
    ///
    /// # Errors
    /// The store's, as is (the tally keeps what was counted before the failing query).
    pub(crate) async fn poll(&self, budget: u64) -> Result<Polled, StoreError> {
        let stats = self.store.statistics().await?;
        let finished = FINISHED
            .iter()
            .map(|s| stats.rollouts_by_status.get(s).copied().unwrap_or(0))
            .sum::<u64>();
        self.with_state(|s| s.progress.finished_in_store = finished);
        let mut from = self.with_state(|s| s.watermark.map(|w| w - SLACK));
        let mut offset = 0;
        let mut counted = 0;
        let more = loop {
            let page = self
                .store
                .query_rollouts(RolloutQuery {
                    status_in: Some(FINISHED.to_vec()),
                    end_time_gte: from,
                    sort: Sort::asc("end_time"),
                    window: Window {
                        limit: Some(BATCH),
                        offset,
                    },
                    ..RolloutQuery::default()
                })
                .await?;
            let mut new_here = 0;
            for r in page.items.iter().map(|r| r.rollout()) {
                if self.with_state(|s| s.recent.contains_key(&r.rollout_id)) {
                    continue;
                }
                let spans = self
                    .store
                    .query_spans(SpanQuery {
                        window: Window {
                            limit: Some(MAX_SPANS),
                            offset: 0,
                        },
                        ..SpanQuery::of(&r.rollout_id, Some("latest"))
                    })
                    .await?;
                let facts = RolloutFacts::of(r, &spans.items);
                let end = facts.end_time;
                self.with_state(|s| {
                    s.tally.add(&facts);
                    s.recent.insert(r.rollout_id.clone(), end);
                    s.watermark = Some(s.watermark.map_or(end, |w| w.max(end)));
                });
                new_here += 1;
            }
            counted += new_here;
            let full = page.items.len() as u64 == BATCH;
            if !full {
                break false;
            }
            if counted >= budget {
                break true;
            }
            // Move the lower bound up to the page's last end time; when a whole full page
            // was counted before (more than a page of rollouts with one end time), page on.
            let last = page
                .items
                .last()
                .map(|r| r.rollout().end_time.unwrap_or(r.rollout().start_time));
            if new_here == 0 && last == from {
                offset += BATCH;
            } else {
                from = last;
                offset = 0;
            }
        };
        self.with_state(|s| {
            if let Some(w) = s.watermark {
                s.recent.retain(|_, end| *end >= w - SLACK);
            }
            s.progress = Progress {
                finished_in_store: finished.max(s.tally.rollouts),
                caught_up: !more,
                error: None,
            };
        });
        Ok(Polled {
            counted,
            more,
            stats,
        })
    }

    /// Keeps a failed poll's error for the pages (the next poll clears it).
    pub(crate) fn failed(&self, error: &StoreError) {
        let message = error.to_string();
        self.with_state(|s| s.progress.error = Some(message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_core::{Attributes, RolloutMode};

    fn rollout(id: &str, resources: Option<&str>, end: f64) -> Rollout {
        Rollout {
            rollout_id: id.into(),
            input: serde_json::json!({}),
            start_time: end - 1.0,
            end_time: Some(end),
            mode: Some(RolloutMode::Train),
            resources_id: resources.map(str::to_string),
            status: RolloutStatus::Succeeded,
            config: Default::default(),
            metadata: None,
        }
    }

    fn span(seq: i64, attrs: &[(&str, AttributeValue)]) -> Span {
        let mut a = Attributes::new();
        for (k, v) in attrs {
            a.insert((*k).to_string(), v.clone());
        }
        let mut s = Span::new("ro", "at", seq, "sql.query", a);
        s.start_time = Some(100.0 + seq as f64);
        s
    }

    #[test]
    fn series_split_trailing_versions() {
        assert_eq!(series_of("policy-v12"), ("policy-".into(), Some(12)));
        assert_eq!(
            series_of("agl-train-llm-enforce-v3"),
            ("agl-train-llm-enforce-".into(), Some(3))
        );
        assert_eq!(series_of("v7"), (String::new(), Some(7)));
        assert_eq!(series_of("res-1"), ("res-1".into(), None));
        assert_eq!(series_of("policy-v"), ("policy-v".into(), None));
        assert_eq!(series_of(""), (String::new(), None));
    }

    #[test]
    fn facts_read_reward_correctness_violations_and_blocks() {
        let r = rollout("ro-1", Some("policy-v2"), 200.0);
        let spans = vec![
            span(
                2,
                &[
                    ("agent_os.violation.policy", "sql_safety".into()),
                    ("agent_os.violation.severity", "critical".into()),
                ],
            ),
            span(
                1,
                &[
                    ("agl.sql", "DROP TABLE singer".into()),
                    ("agl.verdict", "block".into()),
                    ("agl.correct", AttributeValue::Bool(false)),
                ],
            ),
            span(
                3,
                &[
                    ("agentlightning.reward.0.name", "final".into()),
                    ("agentlightning.reward.0.value", (-5.0).into()),
                ],
            ),
            span(4, &[("agl.gateway.verdict", "allow".into())]),
        ];
        let f = RolloutFacts::of(&r, &spans);
        assert_eq!(f.reward, Some(-5.0));
        assert_eq!(f.correct, Some(false));
        assert_eq!(f.blocked, vec!["DROP TABLE singer".to_string()]);
        assert_eq!(
            f.findings,
            vec![Finding {
                policy: "sql_safety".into(),
                severity: "critical".into(),
                time: 102.0
            }]
        );
        assert_eq!(f.mode, "train");
    }

    #[test]
    fn tally_aggregates_per_version_and_bucket() {
        let mut t = Tally::default();
        let mut f = RolloutFacts::of(&rollout("a", Some("policy-v1"), 100.0), &[]);
        f.reward = Some(1.0);
        f.correct = Some(true);
        t.add(&f);
        f.reward = Some(0.0);
        f.correct = Some(false);
        f.findings = vec![Finding {
            policy: "sql_safety".into(),
            severity: "high".into(),
            time: 123.0,
        }];
        f.blocked = vec!["DELETE FROM t".into(), "DELETE FROM t".into()];
        t.add(&f);
        let v = &t.versions[&("policy-v1".to_string(), "train".to_string())];
        assert_eq!(v.rollouts, 2);
        assert_eq!(v.mean_reward(), Some(0.5));
        assert_eq!(v.accuracy(), Some(0.5));
        assert_eq!(v.violation_rate(), Some(0.5));
        assert_eq!(t.violations[&123].values().sum::<u64>(), 1);
        assert_eq!(t.bucket_seconds, 1);
        assert_eq!(t.top_blocked(5), vec![("DELETE FROM t".to_string(), 2)]);
        assert_eq!(t.blocked_total, 2);
    }

    #[test]
    fn long_histories_widen_their_buckets_and_keep_every_count() {
        let mut t = Tally::default();
        let mut f = RolloutFacts::of(&rollout("a", None, 1.0), &[]);
        let n = MAX_BUCKETS as i64 * 3;
        for i in 0..n {
            f.findings = vec![Finding {
                policy: "p".into(),
                severity: "low".into(),
                time: i as f64 + 0.5,
            }];
            t.add(&f);
        }
        assert!(t.violations.len() <= MAX_BUCKETS);
        assert_eq!(t.bucket_seconds, 4);
        let total: u64 = t.violations.values().flat_map(|c| c.values()).sum();
        assert_eq!(total, n as u64);
        assert!(t.violations.keys().all(|k| k % 4 == 0));
    }

    #[test]
    fn blocked_actions_are_pruned_to_the_frequent_ones() {
        let mut t = Tally::default();
        let mut f = RolloutFacts::of(&rollout("a", None, 1.0), &[]);
        f.blocked = vec!["frequent".into(); 10];
        t.add(&f);
        for i in 0..=MAX_ACTIONS {
            f.blocked = vec![format!("rare {i}")];
            t.add(&f);
        }
        assert!(t.blocked.len() <= MAX_ACTIONS);
        assert!(t.blocked_pruned);
        assert_eq!(t.top_blocked(1), vec![("frequent".to_string(), 10)]);
        assert_eq!(t.blocked_total, 10 + MAX_ACTIONS as u64 + 1);
    }

    #[tokio::test]
    async fn polls_count_each_finished_rollout_once_within_their_budget() {
        use agl_core::{AttemptStatus, EnqueueRolloutRequest};
        use agl_store::{AttemptUpdate, InMemoryLightningStore};
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let follower = Follower::new(store.clone());
        let finish = |n: usize| {
            let store = store.clone();
            async move {
                for _ in 0..n {
                    let r = EnqueueRolloutRequest::new(serde_json::json!({}));
                    let s = store.start_rollout(r, None).await.unwrap();
                    let update = AttemptUpdate {
                        status: Some(AttemptStatus::Succeeded),
                        ..AttemptUpdate::default()
                    };
                    store
                        .update_attempt(&s.rollout.rollout_id, &s.attempt.attempt_id, update)
                        .await
                        .unwrap();
                }
            }
        };
        finish(600).await;
        // A rollout that has not finished is not counted.
        let r = EnqueueRolloutRequest::new(serde_json::json!({}));
        store.start_rollout(r, None).await.unwrap();
        let first = follower.poll(300).await.unwrap();
        assert!(first.more && first.counted >= 300 && first.counted < 600);
        assert!(!follower.read(|_, p| p.caught_up));
        let second = follower.poll(300).await.unwrap();
        assert!(!second.more);
        assert_eq!(first.counted + second.counted, 600);
        let (counted, progress) = follower.read(|t, p| (t.rollouts, p.clone()));
        assert_eq!(counted, 600);
        assert!(progress.caught_up);
        assert_eq!(progress.finished_in_store, 600);
        assert_eq!(follower.poll(300).await.unwrap().counted, 0);
        finish(3).await;
        assert_eq!(follower.poll(300).await.unwrap().counted, 3);
        assert_eq!(follower.read(|t, _| t.rollouts), 603);
    }
}
