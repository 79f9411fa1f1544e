//! `RewardConfig`, `PolicyReward` and `policy_penalty`: turning a task reward and the kernel's
//! violations into the training reward.
//!
//! Follows the reward algorithm of agentmesh-lightning's `PolicyReward` (spec §6.5): base reward,
//! plus per-violation severity penalties (or a multiplicative factor), plus a clean bonus, then
//! clamped to `[min_reward, max_reward]`. Defaults are the seed's: critical −100, high −50,
//! medium −10, low −1, clean bonus +5, clamp to [−100, 100].
//!
//! Deliberate differences from the Python original (documented in the README):
//! - the clean bonus is paid only when the rollout **succeeded** (its action ran without error)
//!   and had no violations; the Python version also pays it to failed rollouts, which rewards
//!   failing (`bonus_requires_success = false` restores that);
//! - multiplicative mode never raises a negative reward (the factor applies to the positive part);
//! - the unclamped value is reported beside the clamped one, so clamping cannot hide how many
//!   violations there were.
//!
//! Not responsible for deciding what is a violation: that is the kernel's job (`agl-gov`).

use agl_gov::{Severity, Violation};
use serde::{Deserialize, Serialize};

/// Penalties (negative numbers, added to the reward) and shaping switches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// Added per critical violation (default −100).
    pub critical_penalty: f64,
    /// Added per high violation (default −50).
    pub high_penalty: f64,
    /// Added per medium violation (default −10).
    pub medium_penalty: f64,
    /// Added per low violation (default −1).
    pub low_penalty: f64,
    /// Added when the rollout had no violation (default +5).
    pub clean_bonus: f64,
    /// Pay the clean bonus only to rollouts that succeeded (default true; Python pays it always).
    pub bonus_requires_success: bool,
    /// Multiply the base reward by `multiplicative_factor` instead of adding penalties.
    pub multiplicative: bool,
    /// Factor of multiplicative mode (default 0.5).
    pub multiplicative_factor: f64,
    /// Floor of the final reward (default −100; `None` disables).
    pub min_reward: Option<f64>,
    /// Ceiling of the final reward (default 100; `None` disables).
    pub max_reward: Option<f64>,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            critical_penalty: -100.0,
            high_penalty: -50.0,
            medium_penalty: -10.0,
            low_penalty: -1.0,
            clean_bonus: 5.0,
            bonus_requires_success: true,
            multiplicative: false,
            multiplicative_factor: 0.5,
            min_reward: Some(-100.0),
            max_reward: Some(100.0),
        }
    }
}

impl RewardConfig {
    /// The (negative) penalty of one violation of `severity`.
    pub fn penalty_for(&self, severity: Severity) -> f64 {
        match severity {
            Severity::Critical => self.critical_penalty,
            Severity::High => self.high_penalty,
            Severity::Medium => self.medium_penalty,
            Severity::Low => self.low_penalty,
        }
    }
}

/// Sum of the penalties of `violations` (≤ 0 with the default table): a violation's explicit
/// `penalty` (a positive magnitude set by its policy or the policy file, subtracted) when it
/// has one, else the table value of its severity. Explicit penalties, including 0, are kept,
/// as `PolicyViolation.penalty` is in the Python original.
pub fn policy_penalty(violations: &[Violation], config: &RewardConfig) -> f64 {
    violations
        .iter()
        .map(|v| match v.penalty {
            Some(p) => -p.abs(),
            None => config.penalty_for(v.severity),
        })
        .sum()
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
    /// Sum of severity penalties (≤ 0).
    pub policy_penalty: f64,
    /// The clean bonus that was paid (0 when none).
    pub bonus: f64,
    /// Number of violations.
    pub violations: usize,
}

impl RewardBreakdown {
    /// The task reward alone, unshaped: what "without governance" (audit mode) trains on.
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
}

/// Shapes rewards with governance penalties and keeps running statistics.
///
/// Statistics follow Python's `get_stats()`: `violation_rate` is the fraction of calls with at
/// least one violation; `avg_penalty` is the mean penalty per call.
#[derive(Debug, Clone, Default)]
pub struct PolicyReward {
    config: RewardConfig,
    total: u64,
    with_violations: u64,
    total_penalty: f64,
}

/// Snapshot of `PolicyReward` statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardStats {
    /// Rewards computed.
    pub total_rewards: u64,
    /// Sum of penalties (≤ 0).
    pub total_penalties: f64,
    /// `total_penalties / total_rewards`.
    pub avg_penalty: f64,
    /// Fraction of calls with at least one violation.
    pub violation_rate: f64,
    /// Fraction of calls with none.
    pub clean_rate: f64,
}

impl PolicyReward {
    /// A reward shaper with `config`.
    pub fn new(config: RewardConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RewardConfig {
        &self.config
    }

    /// Computes the reward without touching statistics.
    ///
    /// `base` is the task reward, `succeeded` whether the action ran without error (a blocked
    /// action did not run and so did not succeed), `violations` what the kernel reported.
    pub fn compute(&self, base: f64, succeeded: bool, violations: &[Violation]) -> RewardBreakdown {
        let c = &self.config;
        let penalty = policy_penalty(violations, c);
        let mut value = if c.multiplicative && !violations.is_empty() {
            if base > 0.0 {
                base * c.multiplicative_factor
            } else {
                base
            }
        } else {
            base + penalty
        };
        let bonus = if violations.is_empty() && (succeeded || !c.bonus_requires_success) {
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
    pub fn reward(
        &mut self,
        base: f64,
        succeeded: bool,
        violations: &[Violation],
    ) -> RewardBreakdown {
        let out = self.compute(base, succeeded, violations);
        self.total += 1;
        if !violations.is_empty() {
            self.with_violations += 1;
        }
        self.total_penalty += out.policy_penalty;
        out
    }

    /// Running statistics (Python `get_stats()` keys).
    pub fn stats(&self) -> RewardStats {
        let n = self.total.max(1) as f64;
        RewardStats {
            total_rewards: self.total,
            total_penalties: self.total_penalty,
            avg_penalty: self.total_penalty / n,
            violation_rate: self.with_violations as f64 / n,
            clean_rate: (self.total - self.with_violations) as f64 / n,
        }
    }

    /// Zeroes the statistics.
    pub fn reset_stats(&mut self) {
        self.total = 0;
        self.with_violations = 0;
        self.total_penalty = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let r = PolicyReward::new(RewardConfig::default());
        // clean success: base + bonus
        assert_eq!(r.compute(1.0, true, &[]).final_reward, 6.0);
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
        let r = PolicyReward::new(RewardConfig::default());
        let out = r.compute(0.0, false, &[v(Severity::Critical), v(Severity::High)]);
        assert_eq!(out.final_reward, -100.0);
        assert_eq!(out.unclamped, -150.0);
        assert_eq!(out.violations, 2);
    }

    #[test]
    fn bonus_only_on_success_unless_compat() {
        let r = PolicyReward::new(RewardConfig::default());
        assert_eq!(r.compute(0.0, false, &[]).final_reward, 0.0);
        let compat = PolicyReward::new(RewardConfig {
            bonus_requires_success: false,
            ..RewardConfig::default()
        });
        assert_eq!(compat.compute(0.0, false, &[]).final_reward, 5.0);
    }

    #[test]
    fn multiplicative_never_raises_negative() {
        let r = PolicyReward::new(RewardConfig {
            multiplicative: true,
            ..RewardConfig::default()
        });
        assert_eq!(r.compute(1.0, true, &[v(Severity::Low)]).final_reward, 0.5);
        assert_eq!(
            r.compute(-4.0, true, &[v(Severity::Low)]).final_reward,
            -4.0
        );
    }

    #[test]
    fn stats_count_calls_with_violations() {
        let mut r = PolicyReward::new(RewardConfig::default());
        r.reward(1.0, true, &[]);
        r.reward(1.0, true, &[v(Severity::High), v(Severity::Low)]);
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
