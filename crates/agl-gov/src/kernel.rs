//! The [`Policy`] trait and the [`Kernel`] that runs every policy on every action.
//!
//! Responsible for the verdict rule (enforce vs audit), for telling policies what happened
//! (`record_outcome`) and for appending one flight-recorder entry per decision. Not responsible
//! for executing actions (the caller does that when [`Decision::executes`] is true) nor for what
//! any individual policy checks.

use std::fmt;
use std::sync::Arc;

use crate::error::GovError;
use crate::recorder::FlightRecorder;
use crate::types::{Action, Decision, GovernanceMode, Verdict, Violation};

/// A governance rule. Implementations must be cheap to share between threads: the kernel is
/// used through an `Arc` by many worker threads at once.
pub trait Policy: Send + Sync {
    /// Stable snake_case name, copied into every [`Violation::policy`] it produces.
    fn name(&self) -> &str;

    /// Inspects an action before it runs. An empty vector means "no finding".
    /// Must never panic, whatever the input.
    fn check(&self, action: &Action) -> Vec<Violation>;

    /// Called by the kernel after deciding, on every policy, with whether the action will
    /// execute (`executed == decision.executes()`). Stateful policies (budgets, rate limits)
    /// update their state here. The default does nothing.
    fn record_outcome(&self, _action: &Action, _executed: bool) {}
}

/// The governance kernel: an ordered list of policies, a mode, and an optional flight recorder.
///
/// `Kernel` is `Send + Sync`; share one instance through an `Arc`.
pub struct Kernel {
    mode: GovernanceMode,
    policies: Vec<Box<dyn Policy>>,
    recorder: Option<Arc<FlightRecorder>>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("mode", &self.mode)
            .field("policies", &self.policy_names())
            .field("recorder", &self.recorder)
            .finish()
    }
}

impl Kernel {
    /// A kernel with no policies (every action is allowed) and no recorder.
    pub fn new(mode: GovernanceMode) -> Self {
        Kernel {
            mode,
            policies: Vec::new(),
            recorder: None,
        }
    }

    /// Adds a policy; policies run in the order they were added.
    pub fn with_policy(mut self, p: impl Policy + 'static) -> Self {
        self.policies.push(Box::new(p));
        self
    }

    /// Sets the flight recorder that receives one entry per [`Kernel::check`].
    pub fn with_recorder(self, r: FlightRecorder) -> Self {
        self.with_shared_recorder(Arc::new(r))
    }

    /// Sets a flight recorder shared with other kernels (for example the kernels of a training
    /// run and of its evaluation), so all their checks form one hash chain.
    pub fn with_shared_recorder(mut self, r: Arc<FlightRecorder>) -> Self {
        self.recorder = Some(r);
        self
    }

    /// The mode given at construction.
    pub fn mode(&self) -> GovernanceMode {
        self.mode
    }

    /// Names of the policies, in the order they run.
    pub fn policy_names(&self) -> Vec<String> {
        self.policies.iter().map(|p| p.name().to_string()).collect()
    }

    /// The flight recorder, if one was set.
    pub fn recorder(&self) -> Option<&FlightRecorder> {
        self.recorder.as_deref()
    }

    /// Checks one action.
    ///
    /// 1. Runs every policy and collects all violations, in policy order.
    /// 2. Verdict — enforce mode: `Block` if any violation has `blocked == true`, else `Warn`
    ///    if there is any violation, else `Allow`. Audit mode: violations are kept exactly as
    ///    found (blocked flags included, to show what enforce would have done) but the verdict
    ///    is `Warn` if there is any violation, else `Allow`: the action executes anyway.
    /// 3. Calls [`Policy::record_outcome`]`(action, decision.executes())` on every policy.
    /// 4. Appends one entry to the flight recorder, if set.
    ///
    /// # Errors
    /// Only [`GovError::Io`] / [`GovError::Serialize`] when the recorder cannot write; the
    /// policies have already been told the outcome by then.
    pub fn check(&self, action: &Action) -> Result<Decision, GovError> {
        let violations: Vec<Violation> =
            self.policies.iter().flat_map(|p| p.check(action)).collect();
        let verdict = if violations.is_empty() {
            Verdict::Allow
        } else if self.mode == GovernanceMode::Enforce && violations.iter().any(|v| v.blocked) {
            Verdict::Block
        } else {
            Verdict::Warn
        };
        let decision = Decision {
            verdict,
            mode: self.mode,
            violations,
        };
        let executes = decision.executes();
        for p in &self.policies {
            p.record_outcome(action, executes);
        }
        if let Some(rec) = &self.recorder {
            rec.append(action, &decision)?;
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Severity;
    use std::sync::{Arc, Mutex};

    struct Fixed {
        name: &'static str,
        findings: Vec<(Severity, bool)>,
        outcomes: Mutex<Vec<bool>>,
    }

    impl Policy for Fixed {
        fn name(&self) -> &str {
            self.name
        }
        fn check(&self, _action: &Action) -> Vec<Violation> {
            self.findings
                .iter()
                .map(|&(severity, blocked)| Violation {
                    policy: self.name.to_string(),
                    severity,
                    reason: "fixed".to_string(),
                    blocked,
                })
                .collect()
        }
        fn record_outcome(&self, _action: &Action, executed: bool) {
            if let Ok(mut o) = self.outcomes.lock() {
                o.push(executed);
            }
        }
    }

    fn fixed(name: &'static str, findings: Vec<(Severity, bool)>) -> Fixed {
        Fixed {
            name,
            findings,
            outcomes: Mutex::new(Vec::new()),
        }
    }

    #[test]
    fn kernel_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Kernel>();
    }

    #[test]
    fn empty_kernel_allows_everything() {
        let k = Kernel::new(GovernanceMode::Enforce);
        let d = k.check(&Action::sql("db", "DROP TABLE x")).unwrap();
        assert_eq!(d.verdict, Verdict::Allow);
        assert!(k.policy_names().is_empty());
        assert!(k.recorder().is_none());
    }

    #[test]
    fn verdict_rule_for_each_mode() {
        let cases = [
            (vec![], Verdict::Allow, Verdict::Allow),
            (vec![(Severity::Low, false)], Verdict::Warn, Verdict::Warn),
            (
                vec![(Severity::Low, false), (Severity::High, true)],
                Verdict::Block,
                Verdict::Warn,
            ),
        ];
        for (findings, enforce, audit) in cases {
            for (mode, expected) in [
                (GovernanceMode::Enforce, enforce),
                (GovernanceMode::Audit, audit),
            ] {
                let k = Kernel::new(mode).with_policy(fixed("p", findings.clone()));
                let d = k.check(&Action::sql("db", "SELECT 1")).unwrap();
                assert_eq!(d.verdict, expected, "mode {mode} findings {findings:?}");
                assert_eq!(d.mode, mode);
                // blocked flags are kept as found in both modes
                let flags: Vec<bool> = d.violations.iter().map(|v| v.blocked).collect();
                let want: Vec<bool> = findings.iter().map(|f| f.1).collect();
                assert_eq!(flags, want);
            }
        }
    }

    struct Shared(Arc<Fixed>);

    impl Policy for Shared {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn check(&self, action: &Action) -> Vec<Violation> {
            self.0.check(action)
        }
        fn record_outcome(&self, action: &Action, executed: bool) {
            self.0.record_outcome(action, executed);
        }
    }

    #[test]
    fn every_policy_is_told_whether_the_action_executes() {
        for (mode, executed) in [
            (GovernanceMode::Enforce, false),
            (GovernanceMode::Audit, true),
        ] {
            let a = Arc::new(fixed("a", vec![]));
            let b = Arc::new(fixed("b", vec![(Severity::Critical, true)]));
            let k = Kernel::new(mode)
                .with_policy(Shared(Arc::clone(&a)))
                .with_policy(Shared(Arc::clone(&b)));
            assert_eq!(k.policy_names(), vec!["a", "b"]);
            let d = k.check(&Action::sql("db", "x")).unwrap();
            assert_eq!(d.executes(), executed);
            assert_eq!(*a.outcomes.lock().unwrap(), vec![executed]);
            assert_eq!(*b.outcomes.lock().unwrap(), vec![executed]);
        }
    }
}
