//! `PolicyViolationType`, `PolicyViolation`, `PolicyViolationError` and `GovernedRollout`: the
//! records a [`crate::GovernedRunner`] step produces.
//!
//! Follows agentmesh-lightning 5.0.0 (`agent_lightning_gov/runner.py`, spec "Agent Lightning
//! Fast-Path 1.0" §4–§5) with these deliberate differences:
//! - **one penalty table.** A violation's penalty is its explicit penalty when the policy (or
//!   the policy file) set one, including 0, else [`severity_penalty`] of its severity:
//!   critical 100, high 50, medium 10, low 1 ([`SEVERITY_PENALTIES`], the same numbers as
//!   Python's `PolicyViolation.SEVERITY_PENALTIES`). The reward ([`crate::RewardConfig`]) and
//!   the environment ([`crate::EnvironmentConfig`]) derive their defaults from this table;
//!   Python has three tables that disagree (reference D1).
//! - **severities are a closed enum** ([`Severity`]), parsed case-insensitively; an unknown
//!   severity is an error at the boundary instead of silently scoring as medium (Python gives
//!   `"CRITICAL"` the medium penalty 10). [`severity_from_python`] reproduces Python's mapping
//!   for ported data.
//! - `action_blocked` follows the type: a `Blocked` violation is a blocked action. (Python
//!   leaves the flag `false` unless the caller sets it.)
//! - `GovernedRollout::total_penalty` is derived on every read, so it can never disagree with
//!   the violations (Python computes it once, at construction).
//! - `Modified` is produced (for a kernel `modify` verdict: the action ran rewritten); Python
//!   never produces it. Signals are recorded in `signals_sent`, not as violations: a signal
//!   accompanies a violation that already has its own record, and counting it twice would
//!   double the penalty. `SignalSent` exists for records built by users and ported data.

use std::fmt;
use std::time::Duration;

use agl_core::RolloutMode;
use agl_gov::{Effect, Severity, Signal, Verdict, Violation};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The penalty magnitude (reward units, non-negative) of one violation of each severity when
/// no explicit penalty is given: the single table used by violations, the reward and the
/// environment. Same numbers as Python's `PolicyViolation.SEVERITY_PENALTIES`.
pub const SEVERITY_PENALTIES: [(Severity, f64); 4] = [
    (Severity::Critical, 100.0),
    (Severity::High, 50.0),
    (Severity::Medium, 10.0),
    (Severity::Low, 1.0),
];

/// The entry of [`SEVERITY_PENALTIES`] for `severity` (equal to
/// [`Severity::default_penalty`]).
pub fn severity_penalty(severity: Severity) -> f64 {
    severity.default_penalty()
}

/// Python's severity mapping, for data ported from agentmesh-lightning: exactly `"critical"`,
/// `"high"`, `"medium"` or `"low"` (case-sensitive), anything else medium (so `"CRITICAL"`
/// and `"exotic"` are medium, penalty 10). New code should parse with
/// `str::parse::<Severity>()`, which is case-insensitive and rejects unknown values.
pub fn severity_from_python(severity: &str) -> Severity {
    match severity {
        "critical" => Severity::Critical,
        "high" => Severity::High,
        "low" => Severity::Low,
        _ => Severity::Medium,
    }
}

/// What happened to the action that violated a policy. JSON: `"blocked"`, `"modified"`,
/// `"warned"`, `"signal_sent"` (the values of Python's `PolicyViolationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyViolationType {
    /// The action was prevented (kernel verdict `block`).
    Blocked,
    /// The action ran in a rewritten form (kernel verdict `modify`).
    Modified,
    /// The action ran; the violation is recorded and penalised (kernel verdict `warn`, or any
    /// finding in audit mode).
    Warned,
    /// A kernel signal was sent (not produced by the runner, see the module docs).
    SignalSent,
}

impl PolicyViolationType {
    /// The four types, in Python's declaration order.
    pub const ALL: [PolicyViolationType; 4] = [
        PolicyViolationType::Blocked,
        PolicyViolationType::Modified,
        PolicyViolationType::Warned,
        PolicyViolationType::SignalSent,
    ];

    /// The JSON value: `blocked`, `modified`, `warned` or `signal_sent`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyViolationType::Blocked => "blocked",
            PolicyViolationType::Modified => "modified",
            PolicyViolationType::Warned => "warned",
            PolicyViolationType::SignalSent => "signal_sent",
        }
    }

    /// The type of a kernel violation under the decision's verdict: `Blocked` if the
    /// violation blocks and the verdict is `block`; `Modified` if it rewrote the action and the
    /// verdict is `modify`; otherwise `Warned` (a warning, or any violation of a decision that
    /// let the action run unchanged, as in audit mode).
    pub fn of(violation: &Violation, verdict: Verdict) -> Self {
        match (verdict, violation.effect) {
            (Verdict::Block, Effect::Block) => PolicyViolationType::Blocked,
            (Verdict::Modify, Effect::Modify) => PolicyViolationType::Modified,
            _ => PolicyViolationType::Warned,
        }
    }
}

impl fmt::Display for PolicyViolationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One policy violation observed during a step. JSON fields: `violation_type`,
/// `policy_name`, `description`, `severity`, `timestamp` (RFC 3339, UTC), `action_blocked`,
/// `penalty` (explicit magnitude or `null` for the table value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyViolation {
    /// What happened to the action.
    pub violation_type: PolicyViolationType,
    /// The policy that reported it (as the kernel names it).
    pub policy_name: String,
    /// Why (the policy's reason).
    pub description: String,
    /// Severity.
    pub severity: Severity,
    /// When it was observed (UTC).
    pub timestamp: DateTime<Utc>,
    /// Whether the action was prevented.
    pub action_blocked: bool,
    /// Explicit penalty magnitude (reward units, ≥ 0), if the policy set one; `None` means the
    /// [`SEVERITY_PENALTIES`] value. Read it through [`PolicyViolation::penalty`].
    #[serde(rename = "penalty")]
    pub explicit_penalty: Option<f64>,
}

impl PolicyViolation {
    /// A violation observed now, with the table penalty of `severity` and `action_blocked`
    /// true exactly when `violation_type` is `Blocked`.
    pub fn new(
        violation_type: PolicyViolationType,
        policy_name: impl Into<String>,
        description: impl Into<String>,
        severity: Severity,
    ) -> Self {
        PolicyViolation {
            violation_type,
            policy_name: policy_name.into(),
            description: description.into(),
            severity,
            timestamp: Utc::now(),
            action_blocked: violation_type == PolicyViolationType::Blocked,
            explicit_penalty: None,
        }
    }

    /// The record of a kernel violation under the decision's `verdict` (see
    /// [`PolicyViolationType::of`]), keeping the violation's explicit penalty if any.
    pub fn from_kernel(violation: &Violation, verdict: Verdict) -> Self {
        let mut v = PolicyViolation::new(
            PolicyViolationType::of(violation, verdict),
            violation.policy.clone(),
            violation.reason.clone(),
            violation.severity,
        );
        v.explicit_penalty = violation.penalty;
        v
    }

    /// The same violation with an explicit penalty magnitude (kept as given, 0 included).
    pub fn with_penalty(mut self, penalty: f64) -> Self {
        self.explicit_penalty = Some(penalty);
        self
    }

    /// The same violation with another `action_blocked` flag.
    pub fn with_action_blocked(mut self, blocked: bool) -> Self {
        self.action_blocked = blocked;
        self
    }

    /// The same violation with another timestamp.
    pub fn with_timestamp(mut self, timestamp: DateTime<Utc>) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// The penalty magnitude (≥ 0 for table values): the explicit penalty if set, else
    /// [`severity_penalty`] of the severity.
    pub fn penalty(&self) -> f64 {
        self.explicit_penalty
            .unwrap_or_else(|| severity_penalty(self.severity))
    }
}

/// Anything the reward can score as a violation: a severity and maybe an explicit penalty.
/// Implemented by the kernel's [`Violation`] and by [`PolicyViolation`].
pub trait Penalized {
    /// The severity.
    fn severity(&self) -> Severity;
    /// The explicit penalty magnitude, if the policy set one.
    fn explicit_penalty(&self) -> Option<f64>;
}

impl Penalized for Violation {
    fn severity(&self) -> Severity {
        self.severity
    }
    fn explicit_penalty(&self) -> Option<f64> {
        self.penalty
    }
}

impl Penalized for PolicyViolation {
    fn severity(&self) -> Severity {
        self.severity
    }
    fn explicit_penalty(&self) -> Option<f64> {
        self.explicit_penalty
    }
}

/// The error an agent sees when the kernel blocks one of its actions
/// ([`crate::StepContext::check`]); a step that ends with it is a failed rollout. Its message
/// is exactly `Policy violation: <description>`, as in Python.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyViolationError {
    /// The blocking violation (the first blocking one of the decision).
    pub violation: PolicyViolation,
}

impl fmt::Display for PolicyViolationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Policy violation: {}", self.violation.description)
    }
}

impl std::error::Error for PolicyViolationError {}

/// The result of one governed step (`GovernedRunner::step`).
///
/// `I` is the task input, `O` the agent's output. JSON fields: `task_input`, `task_output`
/// (`null` when the agent failed), `success`, `violations`, `signals_sent`,
/// `execution_time_ms`, `mode`, `rollout_id`, `attempt_id`; `total_penalty` is a method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GovernedRollout<I, O> {
    /// The input the step was given.
    pub task_input: I,
    /// The agent's output; `None` when the agent returned an error (a blocked action included)
    /// or `fail_on_violation` ended the step.
    pub task_output: Option<O>,
    /// The agent returned an output and no action of the step was blocked. A blocked action
    /// did not run, so the task was not done as asked: its rollout is never a success,
    /// whether or not the agent recovered (Python counts it a success unless the kernel
    /// raised).
    pub success: bool,
    /// Every violation of the step, in the order the kernel reported them.
    pub violations: Vec<PolicyViolation>,
    /// Signals the kernel sent during the step, in order.
    pub signals_sent: Vec<Signal>,
    /// Wall time of the step, milliseconds.
    pub execution_time_ms: f64,
    /// The mode the step ran in (`train`, `val`, `test`), if given.
    pub mode: Option<RolloutMode>,
    /// The rollout id the step's actions were checked under.
    pub rollout_id: Option<String>,
    /// The attempt id, when the step ran for a store attempt.
    pub attempt_id: Option<String>,
}

impl<I, O> GovernedRollout<I, O> {
    /// A rollout of `task_input` with the Python defaults: no output, not a success, no
    /// violations or signals, 0 ms, no mode or ids.
    pub fn new(task_input: I) -> Self {
        GovernedRollout {
            task_input,
            task_output: None,
            success: false,
            violations: Vec::new(),
            signals_sent: Vec::new(),
            execution_time_ms: 0.0,
            mode: None,
            rollout_id: None,
            attempt_id: None,
        }
    }

    /// Sum of the violations' [`PolicyViolation::penalty`] (a non-negative magnitude with the
    /// table values), derived on every call.
    pub fn total_penalty(&self) -> f64 {
        self.violations
            .iter()
            .fold(0.0, |total, v| total + v.penalty())
    }

    /// Whether any action of the step was blocked.
    pub fn blocked(&self) -> bool {
        self.violations.iter().any(|v| v.action_blocked)
    }

    /// The distinct names of the violated policies, in order of first appearance.
    pub fn policies_violated(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for v in &self.violations {
            if !out.contains(&v.policy_name.as_str()) {
                out.push(&v.policy_name);
            }
        }
        out
    }

    /// `execution_time_ms` as a [`Duration`].
    pub fn execution_time(&self) -> Duration {
        Duration::from_secs_f64(self.execution_time_ms.max(0.0) / 1000.0)
    }
}
