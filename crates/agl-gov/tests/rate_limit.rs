#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Rate-limit policy with a fake clock (no sleeps, no timing assertions): the sliding window,
//! per-agent keys, counted kinds, executed-only counting, SIGSTOP then the kernel's SIGCONT,
//! pruning of idle keys, configuration errors, a snapshot of verdicts and a no-panic property.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agl_gov::policies::{ANONYMOUS_KEY, RateLimitConfig, RateLimitPolicy};
use agl_gov::{
    Action, Effect, Finding, GovError, GovernanceMode, Kernel, Policy, Severity, Signal, Subject,
    Verdict,
};
use proptest::prelude::*;
use serde::Serialize;

/// A settable clock (seconds, stored as f64 bits).
#[derive(Clone, Default)]
struct FakeClock(Arc<AtomicU64>);

impl FakeClock {
    fn set(&self, t: f64) {
        self.0.store(t.to_bits(), Ordering::SeqCst);
    }
    fn clock(&self) -> Arc<dyn Fn() -> f64 + Send + Sync> {
        let inner = Arc::clone(&self.0);
        Arc::new(move || f64::from_bits(inner.load(Ordering::SeqCst)))
    }
}

fn policy(max_actions: u32, window_seconds: f64, kinds: &[&str]) -> (RateLimitPolicy, FakeClock) {
    let clock = FakeClock::default();
    let p = RateLimitPolicy::with_clock(
        RateLimitConfig {
            max_actions,
            window_seconds,
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
        },
        clock.clock(),
    )
    .unwrap();
    (p, clock)
}

fn check(p: &RateLimitPolicy, a: &Action) -> Vec<Finding> {
    p.check(&Subject::new(a)).unwrap()
}

fn execute(p: &RateLimitPolicy, a: &Action) {
    p.record_outcome(&Subject::new(a), true);
}

fn out(agent: &str) -> Action {
    Action::output("hi").with_agent_id(agent)
}

#[test]
fn defaults_are_60_actions_per_60_seconds_for_all_kinds() {
    let c = RateLimitConfig::default();
    assert_eq!((c.max_actions, c.window_seconds), (60, 60.0));
    assert!(c.kinds.is_empty());
    let c: RateLimitConfig = serde_json::from_str(r#"{"max_actions": 5}"#).unwrap();
    assert_eq!((c.max_actions, c.window_seconds), (5, 60.0));
    assert!(serde_json::from_str::<RateLimitConfig>(r#"{"window": 5}"#).is_err());
}

#[test]
fn the_action_after_max_actions_in_the_window_is_stopped() {
    let (p, clock) = policy(3, 10.0, &[]);
    let a = out("agent-1");
    for t in [0.0, 1.0, 2.0] {
        clock.set(t);
        assert!(check(&p, &a).is_empty(), "at {t}");
        execute(&p, &a);
    }
    clock.set(5.0);
    let v = check(&p, &a);
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].severity, v[0].effect, v[0].signal),
        (Severity::Medium, Effect::Block, Some(Signal::Sigstop))
    );
    assert_eq!(
        v[0].reason,
        "rate limit: `agent-1` made 3 actions in the last 10 s (max 3); paused until the window frees in 5.000 s"
    );
    // the first action (t = 0) leaves the window at t = 10
    clock.set(9.999);
    assert_eq!(check(&p, &a).len(), 1);
    clock.set(10.0);
    assert!(check(&p, &a).is_empty());
    assert_eq!(p.actions_in_window("agent-1"), 2);
}

#[test]
fn only_executed_actions_count() {
    let (p, _clock) = policy(1, 10.0, &[]);
    let a = out("g");
    p.record_outcome(&Subject::new(&a), false);
    assert!(check(&p, &a).is_empty());
    execute(&p, &a);
    assert_eq!(check(&p, &a).len(), 1);
}

#[test]
fn keys_are_agent_then_rollout_then_anonymous() {
    let (p, _clock) = policy(1, 10.0, &[]);
    execute(&p, &out("a1"));
    assert_eq!(check(&p, &out("a1")).len(), 1);
    assert!(
        check(&p, &out("a2")).is_empty(),
        "another agent has its own window"
    );
    // agent id wins over rollout id
    let a2_in_r = Action::output("x").with_agent_id("a2").with_rollout_id("r");
    assert!(check(&p, &a2_in_r).is_empty());
    execute(&p, &Action::output("x").with_rollout_id("r"));
    assert!(check(&p, &a2_in_r).is_empty());
    assert_eq!(
        check(&p, &Action::output("x").with_rollout_id("r")).len(),
        1
    );
    // neither: anonymous
    execute(&p, &Action::output("x"));
    assert_eq!(p.actions_in_window(ANONYMOUS_KEY), 1);
    assert!(
        check(&p, &Action::output("y"))
            .last()
            .unwrap()
            .reason
            .contains("`anonymous`")
    );
}

#[test]
fn only_configured_kinds_are_counted_and_checked() {
    let (p, _clock) = policy(1, 10.0, &["tool_call"]);
    let tool = Action::tool_call("search", serde_json::json!({})).with_agent_id("g");
    let sql = Action::sql("db", "SELECT 1").with_agent_id("g");
    execute(&p, &sql);
    execute(&p, &sql);
    assert!(check(&p, &tool).is_empty(), "SQL is not counted");
    execute(&p, &tool);
    assert_eq!(check(&p, &tool).len(), 1);
    assert!(check(&p, &sql).is_empty(), "SQL is not checked");
}

#[test]
fn idle_keys_are_pruned() {
    let (p, clock) = policy(5, 1.0, &[]);
    for i in 0..200 {
        execute(&p, &out(&format!("agent-{i}")));
    }
    assert_eq!(p.tracked_keys(), 200);
    clock.set(100.0);
    // checking a key whose window emptied removes it; recording sweeps the rest
    assert!(check(&p, &out("agent-0")).is_empty());
    assert_eq!(p.tracked_keys(), 199);
    for _ in 0..200 {
        execute(&p, &out("busy"));
        clock.set(clock_now(&clock) + 0.1);
    }
    assert!(p.tracked_keys() <= 2, "{} keys left", p.tracked_keys());
}

fn clock_now(c: &FakeClock) -> f64 {
    (c.clock())()
}

#[test]
fn kernel_sends_sigstop_then_sigcont_once_the_window_frees() {
    let (p, clock) = policy(2, 10.0, &[]);
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let a = Action::sql("db", "SELECT 1").with_agent_id("agent-7");
    clock.set(0.0);
    assert_eq!(k.check(&a).unwrap().verdict, Verdict::Allow);
    clock.set(1.0);
    assert_eq!(k.check(&a).unwrap().verdict, Verdict::Allow);
    clock.set(2.0);
    let d = k.check(&a).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.signals, vec![Signal::Sigstop]);
    assert_eq!(d.policies(), vec!["rate_limit"]);
    clock.set(9.0);
    let d = k.check(&a).unwrap();
    assert_eq!(
        (d.verdict, d.signals.clone()),
        (Verdict::Block, vec![Signal::Sigstop])
    );
    // past the first action's window: allowed again, and the kernel resumes the agent
    clock.set(10.5);
    let d = k.check(&a).unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.signals, vec![Signal::Sigcont]);
    clock.set(10.6);
    let d = k.check(&a).unwrap();
    assert_eq!(
        d.verdict,
        Verdict::Block,
        "t=1 and t=10.5 fill the window again"
    );
}

#[test]
fn audit_mode_counts_every_action_because_they_all_execute() {
    let (p, _clock) = policy(1, 10.0, &[]);
    let k = Kernel::new(GovernanceMode::Audit).with_policy(p);
    let a = out("g");
    let verdicts: Vec<Verdict> = (0..3).map(|_| k.check(&a).unwrap().verdict).collect();
    assert_eq!(verdicts, vec![Verdict::Allow, Verdict::Warn, Verdict::Warn]);
}

#[test]
fn configuration_errors_name_the_field() {
    let field = |c: RateLimitConfig| match RateLimitPolicy::new(c) {
        Err(GovError::InvalidConfig { policy, field, .. }) => {
            assert_eq!(policy, "rate_limit");
            field
        }
        other => panic!("{other:?}"),
    };
    let base = RateLimitConfig::default();
    for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            field(RateLimitConfig {
                window_seconds: w,
                ..base.clone()
            }),
            "window_seconds"
        );
    }
    assert_eq!(
        field(RateLimitConfig {
            max_actions: 0,
            ..base.clone()
        }),
        "max_actions"
    );
    assert_eq!(
        field(RateLimitConfig {
            kinds: vec!["sql".into(), "Output".into()],
            ..base
        }),
        "kinds[1]"
    );
}

#[derive(Serialize)]
struct Row {
    step: usize,
    time: f64,
    who: &'static str,
    kind: &'static str,
    verdict: Verdict,
    signals: Vec<Signal>,
    findings: Vec<String>,
}

/// A scripted session against max 3 actions per 10 s counting `sql` and `tool_call` only.
#[test]
fn snapshot_of_a_scripted_session() {
    let (p, clock) = policy(3, 10.0, &["sql", "tool_call"]);
    let k = Kernel::new(GovernanceMode::Enforce).with_policy(p);
    let act = |who: &str, kind: &str| {
        let a = match kind {
            "sql" => Action::sql("db", "SELECT 1"),
            "tool_call" => Action::tool_call("search", serde_json::json!({})),
            "output" => Action::output("answer"),
            _ => Action::spend(0.01, 10),
        };
        match who {
            "anon" => a,
            "rollout:r9" => a.with_rollout_id("r9"),
            agent => a.with_agent_id(agent),
        }
    };
    let script: &[(f64, &str, &str)] = &[
        (0.0, "a", "sql"),
        (0.5, "a", "sql"),
        (1.0, "a", "output"),
        (1.5, "a", "tool_call"),
        (2.0, "a", "sql"),
        (2.5, "a", "output"),
        (3.0, "a", "spend"),
        (3.5, "b", "sql"),
        (4.0, "b", "sql"),
        (4.5, "b", "sql"),
        (5.0, "b", "sql"),
        (6.0, "a", "tool_call"),
        (9.99, "a", "sql"),
        (10.0, "a", "sql"),
        (10.1, "a", "sql"),
        (10.5, "a", "sql"),
        (11.0, "a", "sql"),
        (11.5, "a", "sql"),
        (12.0, "anon", "sql"),
        (12.1, "anon", "sql"),
        (12.2, "anon", "sql"),
        (12.3, "anon", "sql"),
        (12.4, "rollout:r9", "sql"),
        (13.0, "b", "sql"),
        (14.0, "b", "sql"),
        (14.6, "b", "sql"),
        (20.0, "a", "sql"),
        (20.0, "b", "tool_call"),
        (30.0, "anon", "tool_call"),
        (40.0, "a", "output"),
    ];
    let rows: Vec<Row> = script
        .iter()
        .enumerate()
        .map(|(step, &(time, who, kind))| {
            clock.set(time);
            let d = k.check(&act(who, kind)).unwrap();
            Row {
                step,
                time,
                who,
                kind,
                verdict: d.verdict,
                signals: d.signals.clone(),
                findings: d
                    .violations
                    .iter()
                    .map(|v| format!("{} {}: {}", v.severity, v.effect, v.reason))
                    .collect(),
            }
        })
        .collect();
    insta::assert_json_snapshot!("rate_limit_session", rows);
}

proptest! {
    #[test]
    fn arbitrary_clocks_and_keys_never_panic(
        steps in prop::collection::vec((prop::num::f64::ANY, prop::option::of("[a-c]{0,2}"), any::<bool>()), 0..60),
        max in 1u32..5,
        window in 0.001f64..100.0,
    ) {
        let (p, clock) = policy(max, window, &[]);
        for (t, agent, executed) in steps {
            clock.set(t);
            let mut a = Action::output("x");
            if let Some(g) = agent {
                a = a.with_agent_id(g);
            }
            let v = check(&p, &a);
            prop_assert!(v.len() <= 1);
            p.record_outcome(&Subject::new(&a), executed);
        }
    }
}
