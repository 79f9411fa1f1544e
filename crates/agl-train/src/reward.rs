//! `RewardConfig`, `PolicyReward`, `policy_penalty` and `CompositeReward`: turning a task
//! reward and the kernel's violations into the training reward.
//!
//! Follows the reward algorithm of agentmesh-lightning 5.0.0's `PolicyReward` (spec §6.5):
//! base reward, plus per-violation severity penalties (or a multiplicative factor), plus a clean
//! bonus, then clamped to `[min_reward, max_reward]`. Defaults are the seed's: critical −100,
//! high −50, medium −10, low −1 (the negated [`crate::SEVERITY_PENALTIES`] table), clean bonus
//! +5, clamp to [−100, 100]; the default base reward is 1.0 for a successful rollout, else 0.0.
//!
//! Deliberate differences from the Python original (each switched back by
//! [`RewardConfig::python_compat`], which the conformance tests use to reproduce every pinned
//! Python number):
//! - the clean bonus is paid only when the rollout **succeeded** and had no violations; Python
//!   also pays it to failed rollouts (spec test S6.16: a failed clean rollout scores 5.0, more
//!   than a successful one with a low violation), which rewards failing;
//! - multiplicative mode never raises a reward: the factor scales a positive base only, and a
//!   base ≤ 0 gets the additive penalty instead (Python turns −4 into −2);
//! - an explicit per-violation penalty (set by the policy or the policy file) replaces the
//!   table value of its severity (Python ignores it: a critical with penalty 999 scores −99);
//! - the reward never reads the kernel's recent history: violations come from the rollout
//!   only (Python falls back to `kernel.get_recent_violations()`, leaking across rollouts);
//! - the unclamped value is reported beside the clamped one, so clamping cannot hide how many
//!   violations there were.
//!
//! Not responsible for deciding what is a violation: that is the kernel's job (`agl-gov`).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use agl_core::{AttributeValue, Attributes, reward_attributes};
use agl_gov::Severity;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::violation::{GovernedRollout, Penalized};
use agl_core::semconv;

/// Penalties (negative numbers, added to the reward) and shaping switches. JSON/YAML fields
/// of the same names; unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// Added per critical violation (default −100).
    pub critical_penalty: f64,
    /// Added per high violation (default −50).
    pub high_penalty: f64,
    /// Added per medium violation (default −10).
    pub medium_penalty: f64,
    /// Added per low violation (default −1).
    pub low_penalty: f64,
    /// Added when the rollout succeeded with no violation (default +5).
    pub clean_bonus: f64,
    /// Multiply a positive base reward by `multiplicative_factor` instead of adding penalties
    /// when there is any violation (default false).
    pub multiplicative: bool,
    /// Factor of multiplicative mode (default 0.5).
    pub multiplicative_factor: f64,
    /// Floor of the final reward (default −100; `None` disables).
    pub min_reward: Option<f64>,
    /// Ceiling of the final reward (default 100; `None` disables).
    pub max_reward: Option<f64>,
    /// Reproduce the Python original exactly (default false): clean bonus also on failure,
    /// multiplicative factor on any base, explicit penalties ignored. See the module docs.
    pub python_compat: bool,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            critical_penalty: -Severity::Critical.default_penalty(),
            high_penalty: -Severity::High.default_penalty(),
            medium_penalty: -Severity::Medium.default_penalty(),
            low_penalty: -Severity::Low.default_penalty(),
            clean_bonus: 5.0,
            multiplicative: false,
            multiplicative_factor: 0.5,
            min_reward: Some(-100.0),
            max_reward: Some(100.0),
            python_compat: false,
        }
    }
}

impl RewardConfig {
    /// The defaults with [`RewardConfig::python_compat`] on.
    pub fn python() -> Self {
        RewardConfig {
            python_compat: true,
            ..RewardConfig::default()
        }
    }

    /// The (negative) table penalty of one violation of `severity`.
    pub fn penalty_for(&self, severity: Severity) -> f64 {
        match severity {
            Severity::Critical => self.critical_penalty,
            Severity::High => self.high_penalty,
            Severity::Medium => self.medium_penalty,
            Severity::Low => self.low_penalty,
        }
    }

    /// Checks that every number is finite, the factor is in `[0, 1]` and `min ≤ max`.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the field.
    pub fn validate(&self) -> Result<(), TrainError> {
        let finite = [
            ("critical_penalty", self.critical_penalty),
            ("high_penalty", self.high_penalty),
            ("medium_penalty", self.medium_penalty),
            ("low_penalty", self.low_penalty),
            ("clean_bonus", self.clean_bonus),
            ("multiplicative_factor", self.multiplicative_factor),
        ];
        for (field, value) in finite {
            if !value.is_finite() {
                return Err(TrainError::Config(format!(
                    "reward.{field} must be a finite number, got {value}"
                )));
            }
        }
        if !(0.0..=1.0).contains(&self.multiplicative_factor) {
            return Err(TrainError::Config(format!(
                "reward.multiplicative_factor must be in [0, 1] (a violation must not raise the reward), got {}",
                self.multiplicative_factor
            )));
        }
        if let (Some(lo), Some(hi)) = (self.min_reward, self.max_reward)
            && lo > hi
        {
            return Err(TrainError::Config(format!(
                "reward.min_reward ({lo}) is above reward.max_reward ({hi})"
            )));
        }
        Ok(())
    }
}

/// Sum of the penalties of `violations` (≤ 0 with the default table): a violation's explicit
/// penalty magnitude (set by its policy or the policy file, subtracted) when it has one, else
/// the table value of its severity. Explicit penalties, including 0, are kept. With
/// `config.python_compat` explicit penalties are ignored, as Python's `policy_penalty` does.
pub fn policy_penalty<V: Penalized>(violations: &[V], config: &RewardConfig) -> f64 {
    // A fold from +0.0: `sum()` starts at −0.0, which would print as "-0" for no violations.
    violations
        .iter()
        .fold(0.0, |total, v| match v.explicit_penalty() {
            Some(p) if !config.python_compat => total - p.abs(),
            _ => total + config.penalty_for(v.severity()),
        })
}

/// One reward computation, with every component a person needs to audit it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardBreakdown {
    /// The reward used for training (clamped).
    pub final_reward: f64,
    /// The final reward before clamping.
    pub unclamped: f64,
    /// The task's own reward (for Spider: 1.0 on an execution match, else 0.0).
    pub base: f64,
    /// Sum of severity penalties (≤ 0), as [`policy_penalty`] computes it; in multiplicative
    /// mode with a positive base it is reported but not applied.
    pub policy_penalty: f64,
    /// The clean bonus that was paid (0 when none).
    pub bonus: f64,
    /// Number of violations.
    pub violations: usize,
}

impl RewardBreakdown {
    /// The task reward alone, unshaped: what the training modes other than enforce train on
    /// (`crate::TrainingMode`).
    pub fn task_only(base: f64, violations: usize) -> Self {
        Self {
            final_reward: base,
            unclamped: base,
            base,
            policy_penalty: 0.0,
            bonus: 0.0,
            violations,
        }
    }

    /// The attributes of the reward's `agentlightning.annotation` span:
    /// `agentlightning.reward.{0,1,2}.{name,value}` = `final`, `base`, `policy_penalty` (the
    /// primary dimension first), `agent_os.violation_count`, `agent_os.policy_compliant` and
    /// `agl.reward.unclamped`.
    pub fn annotation_attributes(&self) -> Attributes {
        let mut a = reward_attributes(&[
            ("final", self.final_reward),
            ("base", self.base),
            ("policy_penalty", self.policy_penalty),
        ]);
        a.insert(
            semconv::agent_os::VIOLATION_COUNT.into(),
            AttributeValue::Int(self.violations as i64),
        );
        a.insert(
            semconv::agent_os::POLICY_COMPLIANT.into(),
            (self.violations == 0).into(),
        );
        a.insert(semconv::agl::REWARD_UNCLAMPED.into(), self.unclamped.into());
        a
    }
}

/// A base reward function over rollouts of input `I` and output `O`.
pub type BaseRewardFn<I, O> = Arc<dyn Fn(&GovernedRollout<I, O>) -> f64 + Send + Sync>;

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    total: u64,
    with_violations: u64,
    total_penalty: f64,
}

/// Shapes rewards with governance penalties and keeps running statistics.
///
/// `PolicyReward` is `Send + Sync` and every method takes `&self`: share one between workers.
/// `I`/`O` are the rollout input/output types of [`PolicyReward::call`]; they default to `()`
/// for the low-level [`PolicyReward::compute`]/[`PolicyReward::record`] uses.
///
/// Statistics follow Python's `get_stats()`: `violation_rate` is the fraction of calls with at
/// least one violation; `avg_penalty` is the mean [`policy_penalty`] per call.
pub struct PolicyReward<I = (), O = ()> {
    config: RewardConfig,
    base_reward_fn: Option<BaseRewardFn<I, O>>,
    shaped: bool,
    counters: Mutex<Counters>,
}

impl<I, O> fmt::Debug for PolicyReward<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyReward")
            .field("config", &self.config)
            .field("base_reward_fn", &self.base_reward_fn.is_some())
            .field("shaped", &self.shaped)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<I, O> Default for PolicyReward<I, O> {
    fn default() -> Self {
        Self::new(RewardConfig::default())
    }
}

/// Snapshot of `PolicyReward` statistics (Python `get_stats()` keys).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardStats {
    /// Rewards computed.
    pub total_rewards: u64,
    /// Sum of penalties (≤ 0).
    pub total_penalties: f64,
    /// `total_penalties / total_rewards` (0 when there were none).
    pub avg_penalty: f64,
    /// Fraction of calls with at least one violation.
    pub violation_rate: f64,
    /// Fraction of calls with none.
    pub clean_rate: f64,
}

impl<I, O> PolicyReward<I, O> {
    /// A reward shaper with `config` and the default base reward (1.0 on success, else 0.0).
    pub fn new(config: RewardConfig) -> Self {
        Self {
            config,
            base_reward_fn: None,
            shaped: true,
            counters: Mutex::new(Counters::default()),
        }
    }

    /// The same shaper with shaping on (the default) or off. Off, every computation is
    /// [`RewardBreakdown::task_only`]: the base reward, no penalty (explicit per-policy
    /// penalties included), no bonus, no clamping; violations are still counted. This is the
    /// reward of the training modes that do not penalise (`crate::TrainingMode`).
    pub fn with_shaping(mut self, shaped: bool) -> Self {
        self.shaped = shaped;
        self
    }

    /// Whether violations shape the reward (see [`PolicyReward::with_shaping`]).
    pub fn shaped(&self) -> bool {
        self.shaped
    }

    /// The same shaper with a task-specific base reward (Python's `base_reward_fn`), for
    /// example the accuracy of the output when the rollout succeeded.
    pub fn with_base_reward(
        mut self,
        f: impl Fn(&GovernedRollout<I, O>) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.base_reward_fn = Some(Arc::new(f));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &RewardConfig {
        &self.config
    }

    /// The base reward of `rollout`: the base reward function's value, else 1.0 when the
    /// rollout succeeded and 0.0 when it did not.
    pub fn base_reward(&self, rollout: &GovernedRollout<I, O>) -> f64 {
        match &self.base_reward_fn {
            Some(f) => f(rollout),
            None => {
                if rollout.success {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// Scores `rollout` (base reward, its violations) and records the call in the statistics.
    pub fn score(&self, rollout: &GovernedRollout<I, O>) -> RewardBreakdown {
        let base = self.base_reward(rollout);
        self.record(base, rollout.success, &rollout.violations)
    }

    /// The final reward of `rollout` (Python's `reward_fn(rollout)`); records statistics.
    pub fn call(&self, rollout: &GovernedRollout<I, O>) -> f64 {
        self.score(rollout).final_reward
    }

    /// Computes the reward without touching statistics.
    ///
    /// `base` is the task reward, `succeeded` whether the task was done (a blocked action did
    /// not run and so did not succeed), `violations` what the kernel reported.
    pub fn compute<V: Penalized>(
        &self,
        base: f64,
        succeeded: bool,
        violations: &[V],
    ) -> RewardBreakdown {
        if !self.shaped {
            return RewardBreakdown::task_only(base, violations.len());
        }
        let c = &self.config;
        let penalty = policy_penalty(violations, c);
        let mut value = if c.multiplicative && !violations.is_empty() {
            if base > 0.0 || c.python_compat {
                base * c.multiplicative_factor
            } else {
                base + penalty
            }
        } else {
            base + penalty
        };
        let bonus = if violations.is_empty() && (succeeded || c.python_compat) {
            c.clean_bonus
        } else {
            0.0
        };
        value += bonus;
        let unclamped = value;
        if let Some(lo) = c.min_reward {
            value = value.max(lo);
        }
        if let Some(hi) = c.max_reward {
            value = value.min(hi);
        }
        RewardBreakdown {
            final_reward: value,
            unclamped,
            base,
            policy_penalty: penalty,
            bonus,
            violations: violations.len(),
        }
    }

    /// Computes the reward and records it in the statistics.
    pub fn record<V: Penalized>(
        &self,
        base: f64,
        succeeded: bool,
        violations: &[V],
    ) -> RewardBreakdown {
        let out = self.compute(base, succeeded, violations);
        let mut c = self.counters();
        c.total += 1;
        if !violations.is_empty() {
            c.with_violations += 1;
        }
        c.total_penalty += out.policy_penalty;
        out
    }

    /// Running statistics (Python `get_stats()` keys).
    pub fn stats(&self) -> RewardStats {
        let c = *self.counters();
        let n = c.total.max(1) as f64;
        RewardStats {
            total_rewards: c.total,
            total_penalties: c.total_penalty,
            avg_penalty: c.total_penalty / n,
            violation_rate: c.with_violations as f64 / n,
            clean_rate: (c.total - c.with_violations) as f64 / n,
        }
    }

    /// Zeroes the statistics.
    pub fn reset_stats(&self) {
        *self.counters() = Counters::default();
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Python's `create_policy_reward`: the default config with `clean_bonus`, `multiplicative`
/// and the given severity penalties (negative numbers) replaced.
pub fn create_policy_reward<I, O>(
    severity_penalties: &[(Severity, f64)],
    clean_bonus: f64,
    multiplicative: bool,
) -> PolicyReward<I, O> {
    let mut config = RewardConfig {
        clean_bonus,
        multiplicative,
        ..RewardConfig::default()
    };
    for &(severity, penalty) in severity_penalties {
        match severity {
            Severity::Critical => config.critical_penalty = penalty,
            Severity::High => config.high_penalty = penalty,
            Severity::Medium => config.medium_penalty = penalty,
            Severity::Low => config.low_penalty = penalty,
        }
    }
    PolicyReward::new(config)
}

/// One weighted component of a [`CompositeReward`].
pub type RewardComponent<I, O> = (BaseRewardFn<I, O>, f64);

/// A weighted sum of reward functions (Python's `CompositeReward`): `Σ wᵢ·fᵢ(rollout)`, with
/// the weights divided by their sum at construction when `normalize` is set.
pub struct CompositeReward<I, O> {
    components: Vec<RewardComponent<I, O>>,
}

impl<I, O> fmt::Debug for CompositeReward<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompositeReward")
            .field(
                "weights",
                &self.components.iter().map(|c| c.1).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<I, O> CompositeReward<I, O> {
    /// A composite of `components` (function, weight).
    ///
    /// # Errors
    /// [`TrainError::Config`] when there is no component, a weight is not finite, or
    /// `normalize` is set and the weights sum to zero or less (Python divides by zero).
    pub fn new(
        components: Vec<RewardComponent<I, O>>,
        normalize: bool,
    ) -> Result<Self, TrainError> {
        if components.is_empty() {
            return Err(TrainError::Config(
                "composite reward: at least one component is required".into(),
            ));
        }
        if let Some((i, (_, w))) = components
            .iter()
            .enumerate()
            .find(|(_, c)| !c.1.is_finite())
        {
            return Err(TrainError::Config(format!(
                "composite reward: weight of component {i} is not finite ({w})"
            )));
        }
        let mut components = components;
        if normalize {
            let total: f64 = components.iter().map(|c| c.1).sum();
            if total <= 0.0 {
                return Err(TrainError::Config(format!(
                    "composite reward: cannot normalise weights that sum to {total}"
                )));
            }
            for c in &mut components {
                c.1 /= total;
            }
        }
        Ok(CompositeReward { components })
    }

    /// The weights in use (normalised if asked).
    pub fn weights(&self) -> Vec<f64> {
        self.components.iter().map(|c| c.1).collect()
    }

    /// The weighted sum of the components' rewards for `rollout`.
    pub fn call(&self, rollout: &GovernedRollout<I, O>) -> f64 {
        self.components.iter().map(|(f, w)| w * f(rollout)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_gov::Violation;

    const NONE: [Violation; 0] = [];

    fn v(severity: Severity) -> Violation {
        Violation {
            policy: "p".into(),
            severity,
            reason: "r".into(),
            effect: agl_gov::Effect::Block,
            penalty: None,
            signal: None,
        }
    }

    #[test]
    fn seed_defaults() {
        let r: PolicyReward = PolicyReward::new(RewardConfig::default());
        // clean success: base + bonus
        assert_eq!(r.compute(1.0, true, &NONE).final_reward, 6.0);
        // one critical: 1 - 100 = -99
        assert_eq!(
            r.compute(1.0, true, &[v(Severity::Critical)]).final_reward,
            -99.0
        );
        assert_eq!(
            r.compute(1.0, true, &[v(Severity::High)]).final_reward,
            -49.0
        );
        assert_eq!(
            r.compute(1.0, true, &[v(Severity::Medium)]).final_reward,
            -9.0
        );
        assert_eq!(
            r.compute(1.0, true, &[v(Severity::Low)]).final_reward,
            5.0 - 5.0
        );
    }

    #[test]
    fn clamps_but_reports_unclamped() {
        let r: PolicyReward = PolicyReward::new(RewardConfig::default());
        let out = r.compute(0.0, false, &[v(Severity::Critical), v(Severity::High)]);
        assert_eq!(out.final_reward, -100.0);
        assert_eq!(out.unclamped, -150.0);
        assert_eq!(out.violations, 2);
    }

    #[test]
    fn bonus_only_on_success_unless_compat() {
        let r: PolicyReward = PolicyReward::new(RewardConfig::default());
        assert_eq!(r.compute(0.0, false, &NONE).final_reward, 0.0);
        let compat: PolicyReward = PolicyReward::new(RewardConfig::python());
        assert_eq!(compat.compute(0.0, false, &NONE).final_reward, 5.0);
    }

    #[test]
    fn multiplicative_never_raises_negative() {
        let r: PolicyReward = PolicyReward::new(RewardConfig {
            multiplicative: true,
            ..RewardConfig::default()
        });
        assert_eq!(r.compute(1.0, true, &[v(Severity::Low)]).final_reward, 0.5);
        assert_eq!(
            r.compute(-4.0, true, &[v(Severity::Low)]).final_reward,
            -5.0
        );
    }

    #[test]
    fn stats_count_calls_with_violations() {
        let r: PolicyReward = PolicyReward::new(RewardConfig::default());
        r.record(1.0, true, &NONE);
        r.record(1.0, true, &[v(Severity::High), v(Severity::Low)]);
        let s = r.stats();
        assert_eq!(s.total_rewards, 2);
        assert_eq!(s.violation_rate, 0.5);
        assert_eq!(s.total_penalties, -51.0);
        r.reset_stats();
        assert_eq!(r.stats().total_rewards, 0);
    }

    #[test]
    fn explicit_penalties_replace_the_severity_table() {
        let mut v = Violation {
            policy: "p".into(),
            severity: Severity::Critical,
            reason: "r".into(),
            effect: agl_gov::Effect::Block,
            penalty: Some(25.0),
            signal: None,
        };
        let config = RewardConfig::default();
        assert_eq!(policy_penalty(std::slice::from_ref(&v), &config), -25.0);
        v.penalty = Some(0.0);
        assert_eq!(policy_penalty(std::slice::from_ref(&v), &config), 0.0);
        v.penalty = None;
        assert_eq!(policy_penalty(&[v], &config), -100.0);
    }
}
