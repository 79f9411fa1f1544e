//! Vocabulary of the governance kernel: [`Severity`], [`Verdict`], [`GovernanceMode`],
//! [`Action`], [`Violation`] and [`Decision`].
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

/// What the kernel decided for one action. JSON form: `"allow"`, `"warn"`, `"block"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No policy found anything; the action executes.
    Allow,
    /// At least one finding, none blocking in effect; the action executes.
    Warn,
    /// A blocking finding in enforce mode; the action must not execute.
    Block,
}

impl Verdict {
    /// The lowercase name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Warn => "warn",
            Verdict::Block => "block",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// One action an agent wants to execute, checked by the kernel before it runs.
///
/// JSON form: `{"rollout_id": "r-1" | null, "kind": {"type": "sql", "database": "...", "sql": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// The rollout (episode) this action belongs to, if any; copied into the flight recorder.
    pub rollout_id: Option<String>,
    /// What the action does.
    pub kind: ActionKind,
}

impl Action {
    /// A SQL action against `database` (a database id such as a Spider `db_id`) with no
    /// rollout id.
    pub fn sql(database: impl Into<String>, sql: impl Into<String>) -> Self {
        Action {
            rollout_id: None,
            kind: ActionKind::Sql {
                database: database.into(),
                sql: sql.into(),
            },
        }
    }

    /// The same action tagged with `rollout_id`.
    pub fn with_rollout_id(mut self, rollout_id: impl Into<String>) -> Self {
        self.rollout_id = Some(rollout_id.into());
        self
    }
}

/// The kinds of action the kernel understands. JSON: internally tagged by `"type"`
/// (snake_case variant name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ActionKind {
    /// Execute SQL text (`sql`, possibly several `;`-separated statements) against the
    /// database whose id is `database`.
    Sql {
        /// Database id, e.g. a Spider `db_id` such as `concert_singer`.
        database: String,
        /// The SQL text exactly as the agent produced it.
        sql: String,
    },
}

/// One finding of one policy about one action.
///
/// JSON form: `{"policy": "sql_safety", "severity": "critical", "reason": "...", "blocked": true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Name of the policy that produced the finding (e.g. `sql_safety`, `cost_control`).
    pub policy: String,
    /// How serious the finding is.
    pub severity: Severity,
    /// A short human sentence naming what was wrong, e.g. "DELETE without WHERE on table `singer`".
    pub reason: String,
    /// Whether the policy wants the action blocked (honoured in enforce mode only; kept as
    /// found in audit mode).
    pub blocked: bool,
}

/// The kernel's decision about one action.
///
/// JSON form: `{"verdict": "block", "mode": "enforce", "violations": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, warn or block.
    pub verdict: Verdict,
    /// The mode the kernel was in when it decided.
    pub mode: GovernanceMode,
    /// Every finding of every policy, in policy order.
    pub violations: Vec<Violation>,
}

impl Decision {
    /// Whether the action may execute: every verdict except [`Verdict::Block`].
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(policy: &str, severity: Severity) -> Violation {
        Violation {
            policy: policy.to_string(),
            severity,
            reason: "r".to_string(),
            blocked: true,
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
        let action = Action::sql("concert_singer", "SELECT 1").with_rollout_id("r-7");
        let json = serde_json::to_value(&action).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"rollout_id": "r-7", "kind": {"type": "sql", "database": "concert_singer", "sql": "SELECT 1"}})
        );
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
        };
        assert!(d.executes());
        assert!(d.is_violation());
        assert_eq!(d.max_severity(), Some(Severity::Critical));
        assert_eq!(d.policies(), vec!["sql_safety", "cost_control"]);

        let clean = Decision {
            verdict: Verdict::Block,
            mode: GovernanceMode::Enforce,
            violations: vec![],
        };
        assert!(!clean.executes());
        assert!(!clean.is_violation());
        assert_eq!(clean.max_severity(), None);
        assert!(clean.policies().is_empty());
    }
}
