//! Conformance: `PolicyViolationType`, `PolicyViolation`, `GovernedRollout`,
//! `PolicyViolationError` (reference Part B1, spec §4–§5, §16).

use agl_gov::Severity;
use agl_train::{
    GovernedRollout, PolicyViolation, PolicyViolationError, PolicyViolationType,
    SEVERITY_PENALTIES, severity_from_python,
};
use chrono::Utc;

fn violation(severity: Severity) -> PolicyViolation {
    PolicyViolation::new(PolicyViolationType::Warned, "P", "d", severity)
}

#[test]
fn violation_type_has_exactly_the_four_python_values() {
    let values: Vec<&str> = PolicyViolationType::ALL
        .iter()
        .map(|t| t.as_str())
        .collect();
    assert_eq!(values, ["blocked", "modified", "warned", "signal_sent"]);
    let json = serde_json::to_value(PolicyViolationType::SignalSent).unwrap();
    assert_eq!(json, "signal_sent");
}

#[test]
fn severity_penalties_table_is_critical_100_high_50_medium_10_low_1() {
    assert_eq!(
        SEVERITY_PENALTIES,
        [
            (Severity::Critical, 100.0),
            (Severity::High, 50.0),
            (Severity::Medium, 10.0),
            (Severity::Low, 1.0)
        ]
    );
}

#[test]
fn penalty_is_derived_from_severity_when_not_given() {
    for (severity, expected) in SEVERITY_PENALTIES {
        assert_eq!(violation(severity).penalty(), expected, "{severity}");
    }
}

#[test]
fn differs_unknown_severity_is_rejected_where_python_scores_it_as_medium() {
    assert!("unknown".parse::<Severity>().is_err());
    assert!("unknown_level".parse::<Severity>().is_err());
    // Python's mapping, kept for ported data: anything unknown is medium, penalty 10.
    for s in ["unknown", "unknown_level", "CRITICAL"] {
        assert_eq!(violation(severity_from_python(s)).penalty(), 10.0, "{s}");
    }
    // Ours is case-insensitive: "CRITICAL" is critical.
    assert_eq!(
        violation("CRITICAL".parse().unwrap()).penalty(),
        100.0,
        "upper-case critical"
    );
}

#[test]
fn explicit_penalty_is_kept_including_zero() {
    for p in [999.0, 42.0, 0.0] {
        let v = violation(Severity::Critical).with_penalty(p);
        assert_eq!(v.penalty(), p);
    }
}

#[test]
fn timestamp_is_utc_and_not_in_the_future() {
    let before = Utc::now();
    let v = violation(Severity::Low);
    assert!(v.timestamp >= before && v.timestamp <= Utc::now());
    let json = serde_json::to_value(&v).unwrap();
    let text = json["timestamp"].as_str().unwrap();
    assert!(text.ends_with('Z') || text.ends_with("+00:00"), "{text}");
}

#[test]
fn action_blocked_defaults_to_false_for_a_warning() {
    assert!(!violation(Severity::High).action_blocked);
}

#[test]
fn differs_action_blocked_follows_a_blocked_type() {
    // Python leaves the flag false unless told; a blocked violation is a blocked action.
    let v = PolicyViolation::new(PolicyViolationType::Blocked, "P", "d", Severity::High);
    assert!(v.action_blocked);
}

#[test]
fn rollout_total_penalty_is_the_sum_of_violation_penalties() {
    let mut r: GovernedRollout<&str, ()> = GovernedRollout::new("t");
    assert_eq!(r.total_penalty(), 0.0);
    r.violations = vec![violation(Severity::High)];
    assert_eq!(r.total_penalty(), 50.0);
    r.violations = vec![violation(Severity::Critical), violation(Severity::Low)];
    assert_eq!(r.total_penalty(), 101.0);
}

#[test]
fn differs_total_penalty_follows_later_changes_to_violations() {
    // Python computes total_penalty once, at construction (D15i).
    let mut r: GovernedRollout<&str, ()> = GovernedRollout::new("t");
    r.violations.push(violation(Severity::Medium));
    assert_eq!(r.total_penalty(), 10.0);
    r.violations.clear();
    assert_eq!(r.total_penalty(), 0.0);
}

#[test]
fn rollout_defaults_are_empty_and_zero() {
    let r: GovernedRollout<&str, ()> = GovernedRollout::new("t");
    assert!(r.violations.is_empty());
    assert!(r.signals_sent.is_empty());
    assert_eq!(r.execution_time_ms, 0.0);
    assert_eq!(r.task_output, None);
}

#[test]
fn policy_violation_error_carries_the_violation_and_formats_its_message() {
    let v = PolicyViolation::new(
        PolicyViolationType::Blocked,
        "SQLPolicy",
        "DROP denied",
        Severity::Critical,
    );
    let e = PolicyViolationError {
        violation: v.clone(),
    };
    let as_error: &dyn std::error::Error = &e;
    assert_eq!(as_error.to_string(), "Policy violation: DROP denied");
    assert_eq!(e.violation, v);
}
