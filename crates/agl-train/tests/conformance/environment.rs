//! Conformance: `GovernedEnvironment`, `EnvironmentConfig`, `create_governed_env` (reference
//! Part B6, A11, A14 environment rows, spec §19.5).

use std::sync::{Arc, Mutex};

use agl_gov::{
    Action, ContentPolicy, ContentPolicyConfig, Effect, GovernanceMode, Kernel, PiiAction,
    PolicyOptions, RateLimitConfig, RateLimitPolicy, Severity,
};
use agl_train::{
    ActionTask, EnvTask, Environment, EnvironmentConfig, EnvironmentState, GovernedEnvironment,
    TrainError, create_governed_env,
};
use serde_json::{Value, json};

use crate::common::{Trigger, sql, sql_kernel, trigger_kernel};

type Env = GovernedEnvironment<ActionTask<String>>;

fn env_with(kernel: Arc<Kernel>, config: EnvironmentConfig) -> Env {
    GovernedEnvironment::new(kernel, ActionTask::new(), config).unwrap()
}

fn plain_kernel() -> Arc<Kernel> {
    Arc::new(Kernel::new(GovernanceMode::Enforce))
}

/// One reset and one step of `action`: `(reward, terminated, info)`.
fn one_step(
    kernel: Arc<Kernel>,
    config: EnvironmentConfig,
    action: Action,
) -> (f64, bool, agl_train::StepInfo) {
    let mut env = env_with(kernel, config);
    env.reset(None).unwrap();
    let (_, reward, terminated, _, info) = env.step(action).unwrap();
    (reward, terminated, info)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(k: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

#[test]
fn environment_config_defaults_are_100_minus_10_true_minus_0_1_10_true() {
    let c = EnvironmentConfig::default();
    assert_eq!(c.max_steps, 100);
    assert_eq!(c.violation_penalty, -10.0);
    assert!(c.terminate_on_critical);
    assert_eq!(c.step_penalty, -0.1);
    assert_eq!(c.success_bonus, 10.0);
    assert!(c.reset_kernel_state);
    assert!(!c.python_compat);
}

#[test]
fn environment_config_max_steps_200_violation_penalty_minus_20_is_stored_as_given() {
    let c: EnvironmentConfig =
        serde_json::from_value(json!({"max_steps": 200, "violation_penalty": -20.0})).unwrap();
    assert_eq!(c.max_steps, 200);
    assert_eq!(c.violation_penalty, -20.0);
    assert_eq!(c.step_penalty, -0.1, "unset fields keep their defaults");
    let env = env_with(plain_kernel(), c.clone());
    assert_eq!(env.config(), &c);
}

#[test]
fn environment_state_defaults_are_zero_steps_zero_reward_no_violations_flags_false() {
    let s = EnvironmentState::default();
    assert_eq!(s.step_count, 0);
    assert_eq!(s.total_reward, 0.0);
    assert!(s.violations.is_empty());
    assert!(!s.terminated && !s.truncated && !s.succeeded);
}

#[test]
fn reset_without_generator_gives_none_and_episode_increases_by_one() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    let (obs, info) = env.reset(None).unwrap();
    assert_eq!(obs, None);
    assert_eq!(info.episode, 1);
    assert_eq!(info.kernel_policies, vec!["SQLPolicy".to_string()]);
    let (_, info) = env.reset(None).unwrap();
    assert_eq!(info.episode, 2);
}

/// A kernel whose rate limit (one action per agent per hour) remembers `agent-1`.
fn rate_limited_kernel() -> Arc<Kernel> {
    let policy = RateLimitPolicy::new(RateLimitConfig {
        max_actions: 1,
        window_seconds: 3600.0,
        kinds: Vec::new(),
    })
    .unwrap();
    Arc::new(Kernel::new(GovernanceMode::Enforce).with_policy(policy))
}

#[test]
fn reset_calls_kernel_reset_so_policy_state_is_forgotten() {
    let act = || Action::output("hello").with_agent_id("agent-1");
    let mut env = env_with(rate_limited_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    let (_, _, _, _, info) = env.step(act()).unwrap();
    assert!(info.success && info.violations.is_empty());
    let (_, _, _, _, info) = env.step(act()).unwrap();
    assert!(
        !info.success && info.violations.len() == 1,
        "rate limit hit"
    );
    env.reset(None).unwrap();
    let (_, _, _, _, info) = env.step(act()).unwrap();
    assert!(info.success, "kernel reset forgot the rate-limit window");

    let keep = EnvironmentConfig {
        reset_kernel_state: false,
        ..EnvironmentConfig::default()
    };
    let mut env = env_with(rate_limited_kernel(), keep);
    env.reset(None).unwrap();
    env.step(act()).unwrap();
    env.reset(None).unwrap();
    let (_, _, _, _, info) = env.step(act()).unwrap();
    assert!(!info.success, "reset_kernel_state=false keeps policy state");
}

#[test]
fn reset_with_a_task_generator_returns_task_1_then_task_2() {
    let mut n = 0;
    let task = ActionTask::new().with_generator(move |_| {
        n += 1;
        format!("task-{n}")
    });
    let mut env =
        GovernedEnvironment::new(plain_kernel(), task, EnvironmentConfig::default()).unwrap();
    assert_eq!(env.reset(None).unwrap().0.as_deref(), Some("task-1"));
    assert_eq!(env.reset(None).unwrap().0.as_deref(), Some("task-2"));
}

#[test]
fn differs_reset_passes_the_seed_so_the_same_seed_gives_the_same_state() {
    let task = ActionTask::new().with_generator(|seed: Option<u64>| seed.map(|s| s * 7));
    let mut env =
        GovernedEnvironment::new(plain_kernel(), task, EnvironmentConfig::default()).unwrap();
    let a = env.reset(Some(3)).unwrap().0;
    let b = env.reset(Some(3)).unwrap().0;
    assert_eq!(a, Some(Some(21)));
    assert_eq!(a, b);
}

#[test]
fn step_valid_returns_the_5_tuple_success_not_terminated_and_step_count_grows() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    let (obs, reward, terminated, truncated, info) = env.step(sql("SELECT 1")).unwrap();
    assert_eq!(obs, None);
    assert!(reward.is_finite());
    assert!(!terminated && !truncated);
    assert!(info.success);
    assert_eq!(info.step, 1);
    assert_eq!(env.state().step_count, 1);
    env.step(sql("SELECT 2")).unwrap();
    assert_eq!(env.state().step_count, 2);
}

#[test]
fn critical_violation_terminates_the_episode() {
    let (_, terminated, info) = one_step(
        sql_kernel(),
        EnvironmentConfig::default(),
        sql("DROP TABLE users"),
    );
    assert!(terminated);
    assert_eq!(info.violations.len(), 1);
    assert_eq!(info.violations[0].severity, Severity::Critical);
}

#[test]
fn critical_violation_does_not_terminate_when_terminate_on_critical_is_off() {
    let config = EnvironmentConfig {
        terminate_on_critical: false,
        ..EnvironmentConfig::default()
    };
    let (_, terminated, _) = one_step(sql_kernel(), config, sql("DROP TABLE users"));
    assert!(!terminated);
}

#[test]
fn max_steps_2_second_step_is_truncated() {
    let config = EnvironmentConfig {
        max_steps: 2,
        ..EnvironmentConfig::default()
    };
    let mut env = env_with(plain_kernel(), config);
    env.reset(None).unwrap();
    let (_, _, _, truncated, _) = env.step(sql("SELECT 1")).unwrap();
    assert!(!truncated);
    let (_, _, terminated, truncated, _) = env.step(sql("SELECT 1")).unwrap();
    assert!(truncated && !terminated);
    assert!(env.state().truncated);
}

#[test]
fn clean_step_reward_is_10_9() {
    let (reward, _, _) = one_step(
        plain_kernel(),
        EnvironmentConfig::default(),
        sql("SELECT 1"),
    );
    assert!(close(reward, 10.9), "{reward}");
}

#[test]
fn one_high_violation_reward_is_minus_49_1() {
    let kernel = trigger_kernel("CostPolicy", "EXPENSIVE", Severity::High, Effect::Warn);
    let (reward, terminated, info) = one_step(
        kernel,
        EnvironmentConfig::default(),
        sql("SELECT EXPENSIVE"),
    );
    assert!(close(reward, 1.0 - 0.1 - 50.0), "{reward}");
    assert!(!terminated);
    assert_eq!(info.violations[0].policy, "CostPolicy");
    assert_eq!(info.violations[0].severity, Severity::High);
    assert!(!info.violations[0].blocked, "a warning does not block");
}

#[test]
fn differs_one_low_violation_costs_minus_1_ours_minus_10_python_compat() {
    let kernel = || trigger_kernel("StylePolicy", "MEH", Severity::Low, Effect::Warn);
    let (ours, _, _) = one_step(kernel(), EnvironmentConfig::default(), sql("SELECT MEH"));
    assert!(close(ours, 1.0 - 0.1 - 1.0), "ours {ours}");
    let (python, _, _) = one_step(kernel(), EnvironmentConfig::python(), sql("SELECT MEH"));
    assert!(close(python, -9.1), "python_compat {python}");
}

#[test]
fn one_critical_blocked_reward_is_minus_100_1_terminated_and_recorded_in_info() {
    // Spec §19.5: critical, violation_penalty −10 → terminated, reward includes −100, the
    // record appears in info["violations"].
    let (reward, terminated, info) = one_step(
        sql_kernel(),
        EnvironmentConfig::default(),
        sql("DROP TABLE users"),
    );
    assert!(close(reward, 0.0 - 0.1 - 100.0), "{reward}");
    assert!(terminated);
    assert!(!info.success);
    let r = &info.violations[0];
    assert_eq!(r.policy, "SQLPolicy");
    assert!(r.blocked);
    assert_eq!(r.step, 1);
}

#[test]
fn severity_scaling_table_critical_100_high_50_medium_10_low_1() {
    let table = [
        (Severity::Critical, -100.0),
        (Severity::High, -50.0),
        (Severity::Medium, -10.0),
        (Severity::Low, -1.0),
    ];
    for (severity, penalty) in table {
        let kernel = trigger_kernel("P", "X", severity, Effect::Warn);
        let config = EnvironmentConfig {
            terminate_on_critical: false,
            ..EnvironmentConfig::default()
        };
        let (reward, _, _) = one_step(kernel, config, sql("SELECT X"));
        assert!(close(reward, 1.0 - 0.1 + penalty), "{severity}: {reward}");
    }
}

#[test]
fn differs_severity_scaling_python_compat_low_is_minus_10() {
    let table = [
        (Severity::Critical, -100.0),
        (Severity::High, -50.0),
        (Severity::Medium, -10.0),
        (Severity::Low, -10.0),
    ];
    for (severity, penalty) in table {
        let kernel = trigger_kernel("P", "X", severity, Effect::Warn);
        let (reward, _, _) = one_step(kernel, EnvironmentConfig::python(), sql("SELECT X"));
        assert!(close(reward, 1.0 - 0.1 + penalty), "{severity}: {reward}");
    }
}

#[test]
fn differs_explicit_policy_penalty_is_honoured_python_compat_ignores_it() {
    let kernel = || {
        Arc::new(Kernel::new(GovernanceMode::Enforce).with_policy_options(
            Trigger {
                trigger: "X",
                severity: Severity::Low,
                effect: Effect::Warn,
            },
            PolicyOptions {
                name: Some("P".into()),
                penalty: Some(30.0),
                ..PolicyOptions::default()
            },
        ))
    };
    let (ours, _, _) = one_step(kernel(), EnvironmentConfig::default(), sql("SELECT X"));
    assert!(close(ours, 1.0 - 0.1 - 30.0), "ours {ours}");
    let (python, _, _) = one_step(kernel(), EnvironmentConfig::python(), sql("SELECT X"));
    assert!(close(python, 1.0 - 0.1 - 10.0), "python_compat {python}");
}

#[test]
fn custom_reward_fn_returning_42_gives_51_9_on_a_clean_step() {
    let task = ActionTask::<()>::new().with_reward_fn(|_, _, _| 42.0);
    let mut env =
        GovernedEnvironment::new(plain_kernel(), task, EnvironmentConfig::default()).unwrap();
    env.reset(None).unwrap();
    let (_, reward, _, _, _) = env.step(sql("SELECT 1")).unwrap();
    assert!(close(reward, 51.9), "{reward}");
}

#[test]
fn reward_fn_sees_the_state_the_action_and_none_when_blocked() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = ActionTask::new()
        .with_generator(|_| "state".to_string())
        .with_reward_fn(move |state, _action, result| {
            log.lock().unwrap().push((state.clone(), result.is_some()));
            0.0
        });
    let config = EnvironmentConfig {
        terminate_on_critical: false,
        ..EnvironmentConfig::default()
    };
    let mut env = GovernedEnvironment::new(sql_kernel(), task, config).unwrap();
    env.reset(None).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    env.step(sql("DROP TABLE t")).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0], (Some("state".to_string()), true));
    assert_eq!(seen[1], (Some("state".to_string()), false));
}

#[test]
fn terminated_property_is_false_then_true_after_termination_or_truncation() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    assert!(!env.terminated());
    env.step(sql("DROP TABLE users")).unwrap();
    assert!(env.terminated() && env.state().terminated);

    let config = EnvironmentConfig {
        max_steps: 1,
        ..EnvironmentConfig::default()
    };
    let mut env = env_with(plain_kernel(), config);
    env.reset(None).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    assert!(env.terminated() && !env.state().terminated && env.state().truncated);
    env.reset(None).unwrap();
    assert!(!env.terminated(), "reset starts a fresh state");
}

#[test]
fn metrics_have_the_seven_keys_plus_successful_steps() {
    let env = env_with(plain_kernel(), EnvironmentConfig::default());
    let m = serde_json::to_value(env.metrics()).unwrap();
    assert_eq!(
        keys(&m),
        sorted(&[
            "total_episodes",
            "total_steps",
            "total_violations",
            "successful_episodes",
            "success_rate",
            "violations_per_episode",
            "steps_per_episode",
            "successful_steps",
        ])
    );
}

#[test]
fn metrics_after_one_reset_and_two_steps_count_1_episode_2_steps() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    env.step(sql("DELETE FROM t")).unwrap();
    let m = env.metrics();
    assert_eq!(m.total_episodes, 1);
    assert_eq!(m.total_steps, 2);
    assert_eq!(m.total_violations, 1);
    assert_eq!(m.steps_per_episode, 2.0);
    assert_eq!(m.violations_per_episode, 1.0);
}

fn two_clean_steps(config: EnvironmentConfig) -> Env {
    let mut env = env_with(plain_kernel(), config);
    env.reset(None).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    env.step(sql("SELECT 2")).unwrap();
    env
}

#[test]
fn differs_success_rate_counts_episodes_1_0_python_compat_counts_steps_2_0() {
    let ours = two_clean_steps(EnvironmentConfig::default()).metrics();
    assert_eq!(ours.successful_episodes, 1);
    assert_eq!(ours.success_rate, 1.0);
    assert_eq!(ours.successful_steps, 2);
    let python = two_clean_steps(EnvironmentConfig::python()).metrics();
    assert_eq!(python.successful_episodes, 2);
    assert_eq!(python.success_rate, 2.0);
}

#[test]
fn differs_total_reward_includes_the_success_bonus_python_compat_excludes_it() {
    let mut env = env_with(plain_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    let (_, r1, _, _, _) = env.step(sql("SELECT 1")).unwrap();
    let (_, r2, _, _, info) = env.step(sql("SELECT 2")).unwrap();
    assert!(close(info.total_reward, r1 + r2) && close(info.total_reward, 21.8));
    assert!(close(env.state().total_reward, 21.8));
    let python = two_clean_steps(EnvironmentConfig::python());
    assert!(close(python.state().total_reward, 1.8), "2 × (1 − 0.1)");
}

#[test]
fn differs_stepping_after_the_episode_ended_is_an_error_python_compat_steps_on() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    env.step(sql("DROP TABLE users")).unwrap();
    let err = env.step(sql("SELECT 1")).unwrap_err();
    assert!(matches!(err, TrainError::Runner(_)), "{err:?}");
    assert!(err.to_string().contains("reset()"), "{err}");
    assert_eq!(env.state().step_count, 1, "the refused step is not counted");
    env.reset(None).unwrap();
    assert!(
        env.step(sql("SELECT 1")).is_ok(),
        "a reset starts a new episode"
    );

    let mut compat = env_with(sql_kernel(), EnvironmentConfig::python());
    compat.reset(None).unwrap();
    compat.step(sql("DROP TABLE users")).unwrap();
    let (_, _, terminated, _, _) = compat.step(sql("SELECT 1")).unwrap();
    assert!(!terminated);
    assert_eq!(compat.state().step_count, 2);
}

#[test]
fn differs_step_before_any_reset_is_an_error() {
    let mut env = env_with(plain_kernel(), EnvironmentConfig::python());
    let err = env.step(sql("SELECT 1")).unwrap_err();
    assert!(err.to_string().contains("reset()"), "{err}");
}

#[test]
fn create_governed_env_max_steps_50_sets_the_config() {
    let env = create_governed_env(sql_kernel(), json!({"max_steps": 50})).unwrap();
    assert_eq!(env.config().max_steps, 50);
    assert_eq!(env.config().violation_penalty, -10.0);
    let env = create_governed_env(sql_kernel(), Value::Null).unwrap();
    assert_eq!(env.config(), &EnvironmentConfig::default());
}

#[test]
fn differs_create_governed_env_unknown_key_or_wrong_type_is_an_error_naming_the_key() {
    let err = create_governed_env(sql_kernel(), json!({"max_step": 50})).unwrap_err();
    assert!(matches!(err, TrainError::Config(_)));
    assert!(err.to_string().contains("max_step"), "{err}");
    let err = create_governed_env(sql_kernel(), json!({"task_generator": "f"})).unwrap_err();
    assert!(err.to_string().contains("task_generator"), "{err}");
    let err = create_governed_env(sql_kernel(), json!({"step_penalty": "cheap"})).unwrap_err();
    assert!(err.to_string().contains("step_penalty"), "{err}");
    let err = create_governed_env(sql_kernel(), json!({"max_steps": 0})).unwrap_err();
    assert!(err.to_string().contains("max_steps"), "{err}");
}

#[test]
fn differs_no_pull_mode_a_step_sees_only_its_own_violations() {
    // Python's pull mode reads kernel.get_recent_violations() after the step and can report
    // violations of other rollouts; here the kernel returns the verdict of the action being
    // checked, so a clean step has no violations whatever else the kernel saw.
    let kernel = sql_kernel();
    let mut env = env_with(kernel.clone(), EnvironmentConfig::default());
    let mut other = env_with(kernel.clone(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    other.reset(None).unwrap();
    let d = kernel
        .check(&sql("DROP TABLE users").with_rollout_id("another-rollout"))
        .unwrap();
    assert_eq!(d.violations.len(), 1);
    other.step(sql("DELETE FROM users")).unwrap();
    let (_, reward, terminated, _, info) = env.step(sql("SELECT 1")).unwrap();
    assert!(info.violations.is_empty());
    assert!(!terminated);
    assert!(close(reward, 10.9));
    assert_eq!(env.metrics().total_violations, 0);
}

#[test]
fn step_info_json_keys_are_violations_step_total_reward_success() {
    let (_, _, info) = one_step(
        sql_kernel(),
        EnvironmentConfig::default(),
        sql("DROP TABLE t"),
    );
    let v = serde_json::to_value(&info).unwrap();
    assert_eq!(
        keys(&v),
        sorted(&["violations", "step", "total_reward", "success"])
    );
    let record = &v["violations"][0];
    assert_eq!(
        keys(record),
        sorted(&[
            "policy",
            "description",
            "severity",
            "blocked",
            "step",
            "timestamp"
        ])
    );
    assert_eq!(record["severity"], "critical");
    assert_eq!(record["policy"], "SQLPolicy");
    assert_eq!(record["blocked"], true);
    let ts = record["timestamp"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(ts).is_ok(), "{ts}");
}

#[test]
fn reset_info_json_keys_are_episode_and_kernel_policies() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    let (_, info) = env.reset(None).unwrap();
    let v = serde_json::to_value(&info).unwrap();
    assert_eq!(v, json!({"episode": 1, "kernel_policies": ["SQLPolicy"]}));
}

#[test]
fn episode_state_accumulates_the_violations_of_every_step() {
    let config = EnvironmentConfig {
        terminate_on_critical: false,
        ..EnvironmentConfig::default()
    };
    let mut env = env_with(sql_kernel(), config);
    env.reset(None).unwrap();
    env.step(sql("DROP TABLE a")).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    let (_, _, _, _, info) = env.step(sql("DROP TABLE b")).unwrap();
    assert_eq!(info.violations.len(), 1, "per-step list");
    let steps: Vec<u32> = env.state().violations.iter().map(|v| v.step).collect();
    assert_eq!(steps, vec![1, 3], "per-episode list");
}

#[test]
fn modify_verdict_runs_the_rewritten_action() {
    let policy = ContentPolicy::new(ContentPolicyConfig {
        on_pii: PiiAction::Redact,
        ..ContentPolicyConfig::default()
    })
    .unwrap();
    let kernel = Arc::new(Kernel::new(GovernanceMode::Enforce).with_policy(policy));
    let ran = Arc::new(Mutex::new(None));
    let log = ran.clone();
    let task = ActionTask::<()>::new().with_reward_fn(move |_, _, result| {
        *log.lock().unwrap() = result.cloned();
        1.0
    });
    let mut env = GovernedEnvironment::new(kernel, task, EnvironmentConfig::default()).unwrap();
    env.reset(None).unwrap();
    let (_, _, _, _, info) = env
        .step(Action::output("write to alice@example.com"))
        .unwrap();
    assert_eq!(info.violations.len(), 1);
    assert!(!info.violations[0].blocked);
    let ran = ran.lock().unwrap().clone().unwrap();
    let agl_gov::ActionKind::Output { text } = ran.kind else {
        panic!("not an output: {ran:?}");
    };
    assert!(!text.contains("alice@example.com"), "{text}");
    assert_eq!(
        env.last_decision().unwrap().verdict,
        agl_gov::Verdict::Modify
    );
}

#[test]
fn every_check_is_recorded_even_when_the_kernel_has_no_recorder() {
    let mut env = env_with(sql_kernel(), EnvironmentConfig::default());
    env.reset(None).unwrap();
    env.step(sql("SELECT 1")).unwrap();
    env.step(sql("DROP TABLE t")).unwrap();
    assert_eq!(env.recorder().entries(), 2);
    let summary = env.recorder().summary().unwrap();
    assert_eq!(summary.entries, 2);
    assert_eq!(summary.violations, 1);
}

#[test]
fn action_task_spaces_are_described() {
    let env = env_with(plain_kernel(), EnvironmentConfig::default());
    let task: &ActionTask<String> = env.task();
    let space = serde_json::to_value(task.action_space()).unwrap();
    assert_eq!(space["type"], "json");
    assert_eq!(
        serde_json::to_value(env.observation_space()).unwrap()["type"],
        "json"
    );
}
