//! Shared fixtures: kernels whose policies report exactly the severities and verdicts a test
//! needs, the way the Python tests' mock kernels do, but through the real [`Kernel`].

use std::sync::Arc;

use agl_gov::{
    Action, ActionKind, Effect, Finding, GovError, GovernanceMode, Kernel, Policy, PolicyOptions,
    Severity, SqlPolicy, SqlPolicyConfig, Subject,
};

/// A policy named by its options that reports one finding when the action's text (SQL, tool
/// name or output text) contains `trigger`.
pub struct Trigger {
    pub trigger: &'static str,
    pub severity: Severity,
    pub effect: Effect,
}

impl Policy for Trigger {
    fn name(&self) -> &str {
        "trigger"
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let text = match &subject.action().kind {
            ActionKind::Sql { sql, .. } => sql.as_str(),
            ActionKind::ToolCall { name, .. } => name.as_str(),
            ActionKind::Output { text } => text.as_str(),
            ActionKind::Spend { .. } => "",
        };
        if !text.contains(self.trigger) {
            return Ok(Vec::new());
        }
        let reason = format!("{} found", self.trigger);
        Ok(vec![match self.effect {
            Effect::Block => Finding::block(self.severity, reason),
            _ => Finding::warn(self.severity, reason),
        }])
    }
}

/// Adds a [`Trigger`] policy named `name` to `kernel`.
pub fn with_trigger(
    kernel: Kernel,
    name: &str,
    trigger: &'static str,
    severity: Severity,
    effect: Effect,
) -> Kernel {
    kernel.with_policy_options(
        Trigger {
            trigger,
            severity,
            effect,
        },
        PolicyOptions {
            name: Some(name.to_string()),
            ..PolicyOptions::default()
        },
    )
}

/// An enforcing kernel with one trigger policy.
pub fn trigger_kernel(
    name: &str,
    trigger: &'static str,
    severity: Severity,
    effect: Effect,
) -> Arc<Kernel> {
    Arc::new(with_trigger(
        Kernel::new(GovernanceMode::Enforce),
        name,
        trigger,
        severity,
        effect,
    ))
}

/// An enforcing kernel with the real `sql_safety` policy named `SQLPolicy` (default config:
/// read-only, so DROP/DELETE are blocked as critical).
pub fn sql_kernel() -> Arc<Kernel> {
    Arc::new(Kernel::new(GovernanceMode::Enforce).with_policy_options(
        SqlPolicy::new(SqlPolicyConfig::default()),
        PolicyOptions {
            name: Some("SQLPolicy".into()),
            ..PolicyOptions::default()
        },
    ))
}

/// A SQL action on database `db`.
pub fn sql(text: &str) -> Action {
    Action::sql("db", text)
}
