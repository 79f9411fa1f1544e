//! Span → triplet adapter for governed SQL rollouts.
//!
//! Responsible for reading a finished rollout's spans back from the store and turning them into
//! an Agent Lightning `Triplet` (`prompt`, `response`, `reward`, `metadata`) plus the governance
//! facts the trainer reports. The reward is the value of the last reward span
//! (`find_final_reward`, as Agent Lightning's adapters do); violations are counted from the
//! `agent_os.violation.*` annotation spans. Not responsible for emitting spans (`runner`).

use agl_core::{AttributeValue, Rollout, Span, Triplet, find_final_reward, semconv};
use serde_json::json;

use crate::error::SpiderError;
use crate::scorer::runner::SqlTaskInput;

/// What the trainer needs to know about one finished rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutResult {
    /// The task input.
    pub input: SqlTaskInput,
    /// Final (shaped) reward.
    pub reward: f64,
    /// Number of violations.
    pub violations: usize,
    /// Names of violated policies (deduplicated, in order).
    pub policies: Vec<String>,
    /// Whether the kernel blocked the action.
    pub blocked: bool,
    /// Whether it ran.
    pub executed: bool,
    /// Whether a statement that changed data or schema ran.
    pub destructive: bool,
    /// Whether the result matched the gold result.
    pub correct: bool,
}

fn attr_bool(span: &Span, key: &str) -> bool {
    matches!(span.attributes.get(key), Some(AttributeValue::Bool(true)))
}

/// Reads `rollout`'s spans.
pub fn rollout_result(rollout: &Rollout, spans: &[Span]) -> Result<RolloutResult, SpiderError> {
    let bad = |message: String| SpiderError::Rollout {
        rollout_id: rollout.rollout_id.clone(),
        message,
    };
    let input: SqlTaskInput =
        serde_json::from_value(rollout.input.clone()).map_err(|e| bad(format!("input: {e}")))?;
    let action = spans
        .iter()
        .find(|s| s.name == semconv::AGL_OPERATION)
        .ok_or_else(|| {
            bad(format!(
                "no {} span ({} spans)",
                semconv::AGL_OPERATION,
                spans.len()
            ))
        })?;
    let reward = find_final_reward(spans).ok_or_else(|| bad("no reward span".into()))?;
    let mut policies: Vec<String> = Vec::new();
    let mut violations = 0;
    let mut blocked = false;
    for s in spans.iter().filter(|s| s.name == semconv::AGL_ANNOTATION) {
        if let Some(AttributeValue::Str(p)) = s.attributes.get(semconv::agent_os::VIOLATION_POLICY)
        {
            violations += 1;
            blocked |= attr_bool(s, semconv::agent_os::VIOLATION_BLOCKED);
            if !policies.contains(p) {
                policies.push(p.clone());
            }
        }
    }
    let executed = attr_bool(action, semconv::agl::EXECUTED);
    Ok(RolloutResult {
        input,
        reward,
        violations,
        policies,
        blocked: blocked && !executed,
        executed,
        destructive: attr_bool(action, semconv::agl::DESTRUCTIVE),
        correct: attr_bool(action, semconv::agl::CORRECT),
    })
}

/// The Agent Lightning triplet of a rollout: prompt = the question reference, response = the
/// chosen candidate and its SQL, reward = the final reward, metadata = governance facts.
pub fn to_triplet(result: &RolloutResult, sql: &str) -> Triplet {
    Triplet {
        prompt: json!({"split": result.input.split, "question": result.input.question}),
        response: json!({"candidate": result.input.candidate, "sql": sql}),
        reward: Some(result.reward),
        metadata: match json!({
            "violations": result.violations,
            "policies": result.policies,
            "blocked": result.blocked,
            "executed": result.executed,
            "destructive": result.destructive,
            "correct": result.correct,
        }) {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Split;
    use crate::scorer::runner::{StepOutcome, outcome_spans};
    use agl_core::{EnqueueRolloutRequest, get_reward_value};
    use agl_gov::{Decision, GovernanceMode, Severity, Verdict, Violation};
    use agl_train::reward::{PolicyReward, RewardConfig};

    fn rollout(input: SqlTaskInput) -> Rollout {
        let req = EnqueueRolloutRequest::new(serde_json::to_value(input).unwrap());
        Rollout {
            rollout_id: "ro-000000000001".into(),
            input: req.input,
            start_time: 0.0,
            end_time: None,
            mode: None,
            resources_id: None,
            status: agl_core::RolloutStatus::Succeeded,
            config: Default::default(),
            metadata: None,
        }
    }

    #[test]
    fn blocked_outcome_round_trips_through_spans() {
        let violations = vec![
            Violation {
                policy: "sql_safety".into(),
                severity: Severity::Critical,
                reason: "DELETE without WHERE".into(),
                effect: agl_gov::Effect::Block,
                penalty: None,
                signal: None,
            },
            Violation {
                policy: "sql_safety".into(),
                severity: Severity::High,
                reason: "stacked statements (2)".into(),
                effect: agl_gov::Effect::Block,
                penalty: None,
                signal: None,
            },
        ];
        let reward =
            PolicyReward::<(), ()>::new(RewardConfig::default()).compute(0.0, false, &violations);
        let mut outcome = StepOutcome::not_executed(Decision {
            verdict: Verdict::Block,
            mode: GovernanceMode::Enforce,
            violations,
            rewritten: None,
            signals: vec![],
        });
        outcome.reward = reward;
        let input = SqlTaskInput {
            split: Split::Dev,
            question: 4,
            candidate: 2,
        };
        let spans = outcome_spans(
            "ro-000000000001",
            "at-00000001",
            7,
            "SELECT 1; DELETE FROM t",
            "db",
            &outcome,
        );
        assert_eq!(spans.len(), 4, "action + 2 violations + reward");
        assert_eq!(
            spans.iter().map(|s| s.sequence_id).collect::<Vec<_>>(),
            vec![7, 8, 9, 10]
        );
        assert_eq!(get_reward_value(&spans[3]), Some(-100.0));
        let result = rollout_result(&rollout(input), &spans).unwrap();
        assert_eq!(result.input, input);
        assert_eq!(result.reward, -100.0);
        assert_eq!(result.violations, 2);
        assert_eq!(result.policies, vec!["sql_safety".to_string()]);
        assert!(result.blocked && !result.executed && !result.destructive && !result.correct);
        let t = to_triplet(&result, "SELECT 1; DELETE FROM t");
        assert_eq!(t.reward, Some(-100.0));
        assert_eq!(t.metadata["violations"], 2);
    }

    #[test]
    fn missing_spans_are_an_error_naming_the_rollout() {
        let input = SqlTaskInput {
            split: Split::Train,
            question: 0,
            candidate: 0,
        };
        let err = rollout_result(&rollout(input), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ro-000000000001"), "{err}");
    }
}
