//! Conformance: `RewardConfig`, `PolicyReward`, `policy_penalty`, `CompositeReward`
//! (reference Part B3–B5, A14, spec §19.2–19.4 and §19.7).

use std::sync::Arc;

use agl_gov::Severity;
use agl_train::{
    BaseRewardFn, CompositeReward, GovernedRollout, PolicyReward, PolicyViolation,
    PolicyViolationType, RewardConfig, create_policy_reward, policy_penalty, severity_from_python,
};

type Rollout = GovernedRollout<&'static str, f64>;

fn v(severity: Severity) -> PolicyViolation {
    PolicyViolation::new(PolicyViolationType::Warned, "P", "d", severity)
}

fn rollout(success: bool, violations: Vec<PolicyViolation>) -> Rollout {
    let mut r = GovernedRollout::new("task");
    r.success = success;
    r.task_output = success.then_some(1.0);
    r.violations = violations;
    r
}

fn reward(config: RewardConfig) -> PolicyReward<&'static str, f64> {
    PolicyReward::new(config)
}

fn default_reward(r: &Rollout) -> f64 {
    reward(RewardConfig::default()).call(r)
}

#[test]
fn clean_successful_rollout_scores_6() {
    assert_eq!(default_reward(&rollout(true, vec![])), 6.0);
}

#[test]
fn one_violation_scores_base_plus_its_severity_penalty() {
    for (severity, expected) in [
        (Severity::High, -49.0),
        (Severity::Critical, -99.0),
        (Severity::Medium, -9.0),
        (Severity::Low, 0.0),
    ] {
        assert_eq!(
            default_reward(&rollout(true, vec![v(severity)])),
            expected,
            "{severity}"
        );
    }
}

#[test]
fn clean_bonus_20_gives_21_clean_and_no_bonus_with_a_violation() {
    let config = RewardConfig {
        clean_bonus: 20.0,
        ..RewardConfig::default()
    };
    assert_eq!(reward(config.clone()).call(&rollout(true, vec![])), 21.0);
    assert_eq!(
        reward(config).call(&rollout(true, vec![v(Severity::Low)])),
        0.0
    );
}

#[test]
fn multiplicative_mode_scales_the_base_when_there_is_a_violation() {
    let config = RewardConfig {
        multiplicative: true,
        multiplicative_factor: 0.5,
        ..RewardConfig::default()
    };
    let r = reward(config);
    assert_eq!(r.call(&rollout(true, vec![v(Severity::Low)])), 0.5);
    assert_eq!(r.call(&rollout(true, vec![])), 6.0);
    // §19.3 / A14: base 10, one low → 5.0; base 10, one critical → 5.0 (severity ignored).
    let base10 = reward(RewardConfig {
        multiplicative: true,
        ..RewardConfig::default()
    })
    .with_base_reward(|_| 10.0);
    assert_eq!(base10.call(&rollout(true, vec![v(Severity::Low)])), 5.0);
    assert_eq!(
        base10.call(&rollout(true, vec![v(Severity::Critical)])),
        5.0
    );
}

#[test]
fn differs_multiplicative_mode_never_raises_a_negative_base() {
    let config = RewardConfig {
        multiplicative: true,
        ..RewardConfig::default()
    };
    let ours = reward(config.clone()).with_base_reward(|_| -4.0);
    // Ours: a base ≤ 0 gets the additive penalty: −4 − 1.
    assert_eq!(ours.call(&rollout(true, vec![v(Severity::Low)])), -5.0);
    let python = reward(RewardConfig {
        python_compat: true,
        ..config
    })
    .with_base_reward(|_| -4.0);
    assert_eq!(python.call(&rollout(true, vec![v(Severity::Low)])), -2.0);
}

#[test]
fn unbounded_without_bonus_a_clean_rollout_scores_its_base() {
    let config = RewardConfig {
        clean_bonus: 0.0,
        min_reward: None,
        max_reward: None,
        ..RewardConfig::default()
    };
    assert_eq!(reward(config).call(&rollout(true, vec![])), 1.0);
}

#[test]
fn min_and_max_reward_clamp() {
    let floor = reward(RewardConfig {
        min_reward: Some(-50.0),
        ..RewardConfig::default()
    });
    assert!(floor.call(&rollout(true, vec![v(Severity::Critical)])) >= -50.0);
    let ceiling = reward(RewardConfig {
        max_reward: Some(3.0),
        ..RewardConfig::default()
    });
    assert!(ceiling.call(&rollout(true, vec![])) <= 3.0);
    // A14: three criticals clamp to −100; base 99 clean clamps to 100.
    assert_eq!(
        default_reward(&rollout(true, vec![v(Severity::Critical); 3])),
        -100.0
    );
    let rich = reward(RewardConfig::default()).with_base_reward(|_| 99.0);
    assert_eq!(rich.call(&rollout(true, vec![])), 100.0);
}

#[test]
fn clamping_keeps_the_unclamped_value_visible() {
    let r = reward(RewardConfig::default());
    let out = r.score(&rollout(true, vec![v(Severity::Critical); 3]));
    assert_eq!(out.final_reward, -100.0);
    assert_eq!(out.unclamped, -299.0);
}

#[test]
fn custom_base_reward_10_clean_scores_15() {
    let r = reward(RewardConfig::default()).with_base_reward(|_| 10.0);
    assert_eq!(r.call(&rollout(true, vec![])), 15.0);
}

#[test]
fn default_base_reward_is_1_on_success_and_0_on_failure() {
    let r = reward(RewardConfig::default());
    assert_eq!(r.base_reward(&rollout(true, vec![])), 1.0);
    assert_eq!(r.base_reward(&rollout(false, vec![])), 0.0);
}

#[test]
fn differs_a_failed_clean_rollout_gets_no_clean_bonus() {
    // Spec test S6.16 pins 5.0: Python pays the bonus to failures, which rewards failing (D3).
    assert_eq!(default_reward(&rollout(false, vec![])), 0.0);
    assert_eq!(
        reward(RewardConfig::python()).call(&rollout(false, vec![])),
        5.0
    );
}

#[test]
fn one_critical_on_a_failed_rollout_scores_minus_100() {
    assert_eq!(
        default_reward(&rollout(false, vec![v(Severity::Critical)])),
        -100.0
    );
}

#[test]
fn high_plus_low_scores_minus_50() {
    assert_eq!(
        default_reward(&rollout(true, vec![v(Severity::High), v(Severity::Low)])),
        -50.0
    );
}

#[test]
fn differs_upper_case_critical_is_critical_not_medium() {
    let ours = v("CRITICAL".parse().unwrap());
    assert_eq!(default_reward(&rollout(true, vec![ours])), -99.0);
    let python = v(severity_from_python("CRITICAL"));
    assert_eq!(default_reward(&rollout(true, vec![python])), -9.0);
}

#[test]
fn differs_an_explicit_penalty_replaces_the_severity_table() {
    let explicit = v(Severity::Critical).with_penalty(999.0);
    // Ours: 1 − 999, clamped to −100; Python ignores the 999 and scores −99.
    let r = reward(RewardConfig::default());
    let out = r.score(&rollout(true, vec![explicit.clone()]));
    assert_eq!((out.final_reward, out.unclamped), (-100.0, -998.0));
    assert_eq!(
        reward(RewardConfig::python()).call(&rollout(true, vec![explicit])),
        -99.0
    );
}

#[test]
fn stats_count_clean_and_violating_calls_and_reset() {
    let r = reward(RewardConfig::default());
    r.call(&rollout(true, vec![]));
    r.call(&rollout(true, vec![v(Severity::Medium)]));
    let s = r.stats();
    assert_eq!(s.total_rewards, 2);
    assert_eq!(s.clean_rate, 0.5);
    assert_eq!(s.violation_rate, 0.5);
    assert_eq!(s.total_penalties, -10.0);
    assert_eq!(s.avg_penalty, -5.0);
    r.reset_stats();
    let s = r.stats();
    assert_eq!(
        (
            s.total_rewards,
            s.total_penalties,
            s.clean_rate,
            s.violation_rate
        ),
        (0, 0.0, 0.0, 0.0)
    );
}

#[test]
fn reward_config_defaults_are_the_seed_values() {
    let c = RewardConfig::default();
    assert_eq!(
        (
            c.critical_penalty,
            c.high_penalty,
            c.medium_penalty,
            c.low_penalty
        ),
        (-100.0, -50.0, -10.0, -1.0)
    );
    assert_eq!(c.clean_bonus, 5.0);
    assert!(!c.multiplicative);
    assert_eq!(c.multiplicative_factor, 0.5);
    assert_eq!((c.min_reward, c.max_reward), (Some(-100.0), Some(100.0)));
    assert!(!c.python_compat);
}

#[test]
fn reward_config_stores_given_values_and_refuses_unknown_fields() {
    let c: RewardConfig = serde_json::from_value(serde_json::json!({
        "critical_penalty": -200.0, "clean_bonus": 10.0,
        "multiplicative": true, "multiplicative_factor": 0.3
    }))
    .unwrap();
    assert_eq!(c.critical_penalty, -200.0);
    assert_eq!(c.clean_bonus, 10.0);
    assert!(c.multiplicative);
    assert_eq!(c.multiplicative_factor, 0.3);
    let err = serde_json::from_value::<RewardConfig>(serde_json::json!({"clean_bonsu": 1.0}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("clean_bonsu"), "{err}");
}

#[test]
fn create_policy_reward_overrides_the_given_severities() {
    let r: PolicyReward<&str, f64> =
        create_policy_reward(&[(Severity::Critical, -500.0)], 5.0, false);
    assert_eq!(r.config().critical_penalty, -500.0);
    assert_eq!(r.config().high_penalty, -50.0);
}

#[test]
fn policy_penalty_sums_the_table_values() {
    let c = RewardConfig::default();
    assert_eq!(policy_penalty::<PolicyViolation>(&[], &c), 0.0);
    for (severity, expected) in [
        (Severity::Critical, -100.0),
        (Severity::High, -50.0),
        (Severity::Medium, -10.0),
        (Severity::Low, -1.0),
    ] {
        assert_eq!(policy_penalty(&[v(severity)], &c), expected);
    }
    assert_eq!(
        policy_penalty(&[v(Severity::Critical), v(Severity::Low)], &c),
        -101.0
    );
    let harsh = RewardConfig {
        critical_penalty: -200.0,
        ..RewardConfig::default()
    };
    assert_eq!(policy_penalty(&[v(Severity::Critical)], &harsh), -200.0);
}

#[test]
fn differs_policy_penalty_of_an_unknown_severity_needs_the_python_mapping() {
    // Unknown severities cannot be built in agl; Python's mapping makes them medium (−10).
    let c = RewardConfig::default();
    assert_eq!(
        policy_penalty(&[v(severity_from_python("exotic"))], &c),
        -10.0
    );
    // §19.7: [unknown_level, critical] → −110.
    assert_eq!(
        policy_penalty(
            &[
                v(severity_from_python("unknown_level")),
                v(Severity::Critical)
            ],
            &c
        ),
        -110.0
    );
}

#[test]
fn policy_penalty_is_never_positive_with_the_default_table() {
    let c = RewardConfig::default();
    let all: Vec<PolicyViolation> = Severity::ALL.into_iter().map(v).collect();
    assert!(policy_penalty(&all, &c) <= 0.0);
}

fn constant(x: f64) -> BaseRewardFn<&'static str, f64> {
    Arc::new(move |_| x)
}

fn composite(parts: &[(f64, f64)], normalize: bool) -> f64 {
    let components = parts.iter().map(|&(x, w)| (constant(x), w)).collect();
    CompositeReward::new(components, normalize)
        .unwrap()
        .call(&rollout(true, vec![]))
}

#[test]
fn composite_reward_is_the_weighted_sum() {
    assert_eq!(composite(&[(10.0, 0.5), (20.0, 0.5)], false), 15.0);
    assert_eq!(composite(&[(10.0, 1.0)], false), 10.0);
    assert_eq!(composite(&[(10.0, 1.0), (20.0, 0.5)], false), 20.0);
    assert_eq!(composite(&[(100.0, 0.0), (5.0, 1.0)], false), 5.0);
}

#[test]
fn composite_reward_normalises_weights_by_their_sum() {
    assert!((composite(&[(10.0, 2.0), (20.0, 8.0)], true) - 18.0).abs() < 1e-12);
    assert_eq!(composite(&[(10.0, 2.0), (20.0, 2.0)], true), 15.0);
}

#[test]
fn differs_composite_reward_refuses_to_normalise_zero_weights() {
    // Python raises ZeroDivisionError at construction (D15e); ours is a config error.
    let err = CompositeReward::new(vec![(constant(1.0), 0.0)], true).unwrap_err();
    assert!(err.to_string().contains("normalise"), "{err}");
}

#[test]
fn composite_reward_can_weigh_a_policy_reward() {
    let policy = Arc::new(reward(RewardConfig::default()));
    let p = policy.clone();
    let components: Vec<(BaseRewardFn<&'static str, f64>, f64)> =
        vec![(Arc::new(move |r| p.call(r)), 0.5), (constant(2.0), 0.5)];
    let c = CompositeReward::new(components, false).unwrap();
    assert_eq!(c.call(&rollout(true, vec![])), 0.5 * 6.0 + 0.5 * 2.0);
    assert_eq!(policy.stats().total_rewards, 1);
}
