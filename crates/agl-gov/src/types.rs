//! Vocabulary of the governance kernel: [`Severity`], [`Verdict`], [`GovernanceMode`],
//! [`OnBlock`], [`Action`], [`Violation`] and [`Decision`].
//!
//! Responsible for the data types, their JSON forms (serde, lowercase names) and small derived
//! facts about a decision. Not responsible for deciding anything: policies live in
//! [`crate::policies`], the verdict rule lives in [`crate::Kernel`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::GovError;

/// How serious a policy finding is. Ordered: `Low < Medium < High < Critical`.
///
/// JSON form: `"low"`, `"medium"`, `"high"`, `"critical"`. The four levels follow the
/// severities of the Python agentmesh-lightning / Agent OS governance layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Style or hygiene issue; penalty 1.
    Low,
    /// Suspicious or unverifiable input (e.g. SQL that does not parse); penalty 10.
    Medium,
    /// Harmful action (data modification, over-budget query); penalty 50.
    High,
    /// Destructive action (DROP, DELETE without WHERE, ATTACH); penalty 100.
    Critical,
}

impl Severity {
    /// All severities, lowest first.
    pub const ALL: [Severity; 4] = [
        Severity::Low,
        Severity::Medium,
        Severity::High,
        Severity::Critical,
    ];

    /// Default reward-penalty magnitude for a violation of this severity (a non-negative
    /// number of reward units; the trainer subtracts it): critical 100, high 50, medium 10,
    /// low 1.
    pub fn default_penalty(self) -> f64 {
        match self {
            Severity::Low => 1.0,
            Severity::Medium => 10.0,
            Severity::High => 50.0,
            Severity::Critical => 100.0,
        }
    }

    /// The lowercase name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Severity {
    type Err = GovError;

    /// Parses `low` / `medium` / `high` / `critical`, case-insensitive, surrounding
    /// whitespace ignored; anything else is [`GovError::UnknownSeverity`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Severity::ALL
            .into_iter()
            .find(|sev| sev.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| GovError::UnknownSeverity(s.to_string()))
    }
}

/// What the kernel decided for one action. JSON form: `"allow"`, `"warn"`, `"modify"`,
/// `"block"`.
///
/// Conflicts between policies resolve by "block wins, then modify, then warn".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No policy found anything; the action executes as given.
    Allow,
    /// At least one finding, none blocking or rewriting in effect; the action executes as
    /// given, the findings are recorded and penalised.
    Warn,
    /// A policy rewrote the action (e.g. added a `LIMIT`, redacted PII); the rewritten action
    /// ([`Decision::rewritten`]) executes instead, and the finding is recorded.
    Modify,
    /// A blocking finding in enforce mode; the action must not execute.
    Block,
}

impl Verdict {
    /// All verdicts, mildest first.
    pub const ALL: [Verdict; 4] = [
        Verdict::Allow,
        Verdict::Warn,
        Verdict::Modify,
        Verdict::Block,
    ];

    /// The lowercase name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Warn => "warn",
            Verdict::Modify => "modify",
            Verdict::Block => "block",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Verdict {
    type Err = GovError;

    /// Parses `allow` / `warn` / `modify` / `block`, case-insensitive; anything else is
    /// [`GovError::UnknownVerdict`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| GovError::UnknownVerdict(s.to_string()))
    }
}

/// What a finding asks the kernel to do with the action. JSON form: `"warn"`, `"modify"`,
/// `"block"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// Let it execute; record and penalise.
    Warn,
    /// Execute a rewritten action instead (the rewrite travels in [`Finding::rewrite`]).
    Modify,
    /// Do not execute.
    Block,
}

impl Effect {
    /// The lowercase name used in JSON and YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Warn => "warn",
            Effect::Modify => "modify",
            Effect::Block => "block",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A control signal the kernel sends about the agent, named as the Agent OS kernel names them.
/// JSON and YAML form: `"SIGSTOP"`, `"SIGKILL"`, `"SIGCONT"`.
///
/// The receiver (e.g. the governed runner) acts on it: `SIGSTOP` pauses the agent (no further
/// actions until a `SIGCONT`), `SIGKILL` ends the rollout, `SIGCONT` resumes a paused agent. The
/// kernel sends `SIGCONT` by itself on the first non-blocked decision for an agent it had
/// stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Signal {
    /// Pause the agent.
    #[serde(rename = "SIGSTOP", alias = "sigstop")]
    Sigstop,
    /// End the rollout.
    #[serde(rename = "SIGKILL", alias = "sigkill")]
    Sigkill,
    /// Resume a paused agent.
    #[serde(rename = "SIGCONT", alias = "sigcont")]
    Sigcont,
}

impl Signal {
    /// The upper-case name: `SIGSTOP`, `SIGKILL`, `SIGCONT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Sigstop => "SIGSTOP",
            Signal::Sigkill => "SIGKILL",
            Signal::Sigcont => "SIGCONT",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Signal {
    type Err = GovError;

    /// Parses `SIGSTOP` / `SIGKILL` / `SIGCONT`, case-insensitive; anything else is
    /// [`GovError::UnknownSignal`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        [Signal::Sigstop, Signal::Sigkill, Signal::Sigcont]
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| GovError::UnknownSignal(s.to_string()))
    }
}

/// One finding of a policy, before the kernel attaches the policy's name and configured
/// overrides. Built by policies; see [`crate::Policy::check`].
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// How serious it is.
    pub severity: Severity,
    /// A short human sentence naming what was wrong.
    pub reason: String,
    /// What the policy asks for.
    pub effect: Effect,
    /// For [`Effect::Modify`]: the rewritten action kind to execute instead. A `Modify` finding
    /// without a rewrite is treated as [`Effect::Warn`].
    pub rewrite: Option<crate::ActionKind>,
    /// Explicit reward penalty (positive magnitude); `None` means the severity's default.
    pub penalty: Option<f64>,
    /// A signal to send about the agent.
    pub signal: Option<Signal>,
}

impl Finding {
    /// A blocking finding.
    pub fn block(severity: Severity, reason: impl Into<String>) -> Self {
        Finding {
            severity,
            reason: reason.into(),
            effect: Effect::Block,
            rewrite: None,
            penalty: None,
            signal: None,
        }
    }

    /// A warning finding.
    pub fn warn(severity: Severity, reason: impl Into<String>) -> Self {
        Finding {
            effect: Effect::Warn,
            ..Finding::block(severity, reason)
        }
    }

    /// A finding that rewrites the action into `rewrite`.
    pub fn modify(
        severity: Severity,
        reason: impl Into<String>,
        rewrite: crate::ActionKind,
    ) -> Self {
        Finding {
            effect: Effect::Modify,
            rewrite: Some(rewrite),
            ..Finding::block(severity, reason)
        }
    }

    /// The same finding with effect `effect` (a policy's configured "warn or block" choice).
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// The same finding with a signal attached.
    pub fn with_signal(mut self, signal: Signal) -> Self {
        self.signal = Some(signal);
        self
    }
}

/// Whether the kernel enforces blocking findings. JSON form: `"enforce"`, `"audit"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GovernanceMode {
    /// Blocking findings produce [`Verdict::Block`]; the action does not execute.
    #[default]
    Enforce,
    /// The "without governance" baseline: findings are recorded exactly as found (including
    /// their `blocked` flags) but the verdict is at most [`Verdict::Warn`], so every action
    /// executes.
    Audit,
}

impl GovernanceMode {
    /// The lowercase name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            GovernanceMode::Enforce => "enforce",
            GovernanceMode::Audit => "audit",
        }
    }
}

impl fmt::Display for GovernanceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GovernanceMode {
    type Err = GovError;

    /// Parses `enforce` / `audit`, case-insensitive, surrounding whitespace ignored; anything
    /// else is [`GovError::UnknownMode`], whose message lists the valid values.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        [GovernanceMode::Enforce, GovernanceMode::Audit]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| GovError::UnknownMode(s.to_string()))
    }
}

/// What an agent is told when governance blocks its model's output (the LLM gateway's
/// answer; the policy file's `on_block` key). YAML/JSON form: `"refuse"` (default),
/// `"error"`. Only enforce mode blocks, so it only matters there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBlock {
    /// A normal answer (HTTP 200) with the blocked part taken out and a refusal the agent can
    /// read in its place: the agent's loop goes on and the model learns from the refusal.
    #[default]
    Refuse,
    /// An error (HTTP 403 `policy_violation`; in a stream, an `error` event): the agent's
    /// client raises.
    Error,
}

impl OnBlock {
    /// The lowercase name used in YAML and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            OnBlock::Refuse => "refuse",
            OnBlock::Error => "error",
        }
    }
}

impl fmt::Display for OnBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding of one policy about one action, as recorded.
///
/// JSON form: `{"policy": "sql_safety", "severity": "critical", "reason": "...",
/// "effect": "block", "penalty": 100.0 | null, "signal": "SIGKILL" | null}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// Name of the policy that produced the finding (e.g. `sql_safety`, `cost_control`).
    pub policy: String,
    /// How serious the finding is.
    pub severity: Severity,
    /// A short human sentence naming what was wrong, e.g. "DELETE without WHERE on table `singer`".
    pub reason: String,
    /// What the policy asked for (honoured in enforce mode; kept as found in audit mode).
    pub effect: Effect,
    /// Explicit reward penalty (positive magnitude, reward units) from the policy or its
    /// configuration; `None` means the severity's default ([`Severity::default_penalty`], or
    /// the reward configuration's table).
    #[serde(default)]
    pub penalty: Option<f64>,
    /// Signal requested by the finding, if any.
    #[serde(default)]
    pub signal: Option<Signal>,
}

impl Violation {
    /// Whether the policy asked for the action to be blocked.
    pub fn blocked(&self) -> bool {
        self.effect == Effect::Block
    }

    /// A violation from a policy's `finding` (the rewrite, if any, is dropped: it lives in
    /// [`Decision::rewritten`]).
    pub fn from_finding(policy: impl Into<String>, finding: &Finding) -> Self {
        Violation {
            policy: policy.into(),
            severity: finding.severity,
            reason: finding.reason.clone(),
            effect: finding.effect,
            penalty: finding.penalty,
            signal: finding.signal,
        }
    }
}

/// The kernel's decision about one action.
///
/// JSON form: `{"verdict": "modify", "mode": "enforce", "violations": [...],
/// "rewritten": {"type": "sql", ...} | null, "signals": ["SIGSTOP"]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, warn, modify or block.
    pub verdict: Verdict,
    /// The mode the kernel was in when it decided.
    pub mode: GovernanceMode,
    /// Every finding of every policy that fired, in policy order.
    pub violations: Vec<Violation>,
    /// When the verdict is [`Verdict::Modify`]: the action kind to execute instead of the one
    /// submitted. `None` otherwise.
    #[serde(default)]
    pub rewritten: Option<crate::ActionKind>,
    /// Signals sent about the agent, in order, without duplicates (enforce mode only).
    #[serde(default)]
    pub signals: Vec<Signal>,
}

impl Decision {
    /// Whether the action (or its rewrite) may execute: every verdict except [`Verdict::Block`].
    pub fn executes(&self) -> bool {
        self.verdict != Verdict::Block
    }

    /// Whether any policy found anything (also true in audit mode, where the action still
    /// executes).
    pub fn is_violation(&self) -> bool {
        !self.violations.is_empty()
    }

    /// The highest severity among the violations; `None` when there are none.
    pub fn max_severity(&self) -> Option<Severity> {
        self.violations.iter().map(|v| v.severity).max()
    }

    /// Names of the violated policies, in order of first appearance, without duplicates.
    pub fn policies(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for v in &self.violations {
            if !names.contains(&v.policy.as_str()) {
                names.push(v.policy.as_str());
            }
        }
        names
    }

    /// The action kind that executes: the rewrite for [`Verdict::Modify`], else `original`;
    /// `None` when blocked.
    pub fn effective_kind<'a>(
        &'a self,
        original: &'a crate::ActionKind,
    ) -> Option<&'a crate::ActionKind> {
        match self.verdict {
            Verdict::Block => None,
            Verdict::Modify => Some(self.rewritten.as_ref().unwrap_or(original)),
            Verdict::Allow | Verdict::Warn => Some(original),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(policy: &str, severity: Severity) -> Violation {
        Violation {
            policy: policy.to_string(),
            severity,
            reason: "r".to_string(),
            effect: Effect::Block,
            penalty: None,
            signal: None,
        }
    }

    #[test]
    fn severity_orders_low_to_critical_and_parses_case_insensitively() {
        assert!(Severity::Low < Severity::Medium);
        assert!(Severity::High < Severity::Critical);
        assert_eq!("CrItIcAl".parse::<Severity>().unwrap(), Severity::Critical);
        assert_eq!(" low ".parse::<Severity>().unwrap(), Severity::Low);
        let err = "severe".parse::<Severity>().unwrap_err();
        assert!(matches!(err, GovError::UnknownSeverity(ref s) if s == "severe"));
        assert!(err.to_string().contains("critical"));
        assert_eq!(Severity::High.to_string(), "high");
    }

    #[test]
    fn default_penalties_are_the_documented_magnitudes() {
        let p: Vec<f64> = Severity::ALL.iter().map(|s| s.default_penalty()).collect();
        assert_eq!(p, vec![1.0, 10.0, 50.0, 100.0]);
    }

    #[test]
    fn mode_parses_and_lists_valid_values_on_error() {
        assert_eq!(
            "AUDIT".parse::<GovernanceMode>().unwrap(),
            GovernanceMode::Audit
        );
        assert_eq!(
            "enforce".parse::<GovernanceMode>().unwrap(),
            GovernanceMode::Enforce
        );
        let err = "strict".parse::<GovernanceMode>().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("strict") && msg.contains("enforce") && msg.contains("audit"));
    }

    #[test]
    fn json_forms_are_lowercase_and_tagged() {
        assert_eq!(
            serde_json::to_string(&Signal::Sigkill).unwrap(),
            "\"SIGKILL\""
        );
        assert_eq!(
            serde_json::from_str::<Signal>("\"sigstop\"").unwrap(),
            Signal::Sigstop
        );
        assert_eq!("sigcont".parse::<Signal>().unwrap(), Signal::Sigcont);
        assert_eq!("MODIFY".parse::<Verdict>().unwrap(), Verdict::Modify);
        assert!("stop".parse::<Signal>().is_err());
        assert_eq!(serde_json::to_string(&Verdict::Block).unwrap(), "\"block\"");
        assert_eq!(
            serde_json::to_string(&GovernanceMode::Audit).unwrap(),
            "\"audit\""
        );
        assert_eq!(
            serde_json::from_str::<Severity>("\"medium\"").unwrap(),
            Severity::Medium
        );
        assert_eq!(Verdict::Warn.to_string(), "warn");
    }

    #[test]
    fn decision_helpers_report_severity_and_dedup_policies() {
        let d = Decision {
            verdict: Verdict::Warn,
            mode: GovernanceMode::Audit,
            violations: vec![
                violation("sql_safety", Severity::High),
                violation("cost_control", Severity::Medium),
                violation("sql_safety", Severity::Critical),
            ],
            rewritten: None,
            signals: vec![],
        };
        assert!(d.executes());
        assert!(d.is_violation());
        assert_eq!(d.max_severity(), Some(Severity::Critical));
        assert_eq!(d.policies(), vec!["sql_safety", "cost_control"]);

        let clean = Decision {
            verdict: Verdict::Block,
            mode: GovernanceMode::Enforce,
            violations: vec![],
            rewritten: None,
            signals: vec![],
        };
        assert!(!clean.executes());
        assert!(!clean.is_violation());
        assert_eq!(clean.max_severity(), None);
        assert!(clean.policies().is_empty());
    }
}
