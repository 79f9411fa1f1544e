//! Governance as a training intervention: what a training run does with a flagged action.
//!
//! One value of `agl train --governance` ([`TrainingMode`]) decides three things, for the
//! built-in scorer and for the LLM agent alike (both trainers ask this type, nothing else):
//!
//! | mode      | kernel ([`TrainingMode::kernel_mode`]) | reward                          | policy gradient              |
//! |-----------|----------------------------------------|---------------------------------|------------------------------|
//! | `audit`   | audit: records, everything executes    | task reward alone               | every sample                 |
//! | `shield`  | enforce: blocking findings do not run  | task reward alone (0 if blocked)| every sample                 |
//! | `screen`  | enforce                                | task reward alone               | flagged samples dropped      |
//! | `enforce` | enforce                                | task reward + `PolicyReward`'s penalties and clean bonus | every sample |
//!
//! A sample is *flagged* when its rollout drew at least one violation (blocked or warned).
//!
//! The four are the interventions the literature compares: `shield` is classical safe-RL
//! shielding (Alshiekh et al. 2018), which a toy study ("Perfect Shields Create Unsafe
//! Policies", 2026) argues leaves the policy unsafe once the shield is gone; `screen` is the
//! "monitor + screening" arm of reward-hacking mitigation studies (flagged samples neither help
//! nor hurt: they are removed from their group before advantages are computed, as if never
//! sampled); `enforce` is agentmesh-lightning's block + penalty; `audit` is the "without
//! governance" baseline. JSON and command-line names are the lowercase variant names; `audit`
//! and `enforce` are the names [`GovernanceMode`] has always serialised to, so checkpoints and
//! run specs written before the other two existed still read.

use std::fmt;
use std::str::FromStr;

use agl_gov::GovernanceMode;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::reward::{PolicyReward, RewardConfig};

/// What a training run does with actions the kernel flags (see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TrainingMode {
    /// Record only: every action executes, the reward is the task's alone.
    Audit,
    /// Block violating actions; no penalty (a blocked action earns the task reward of an
    /// action that did not run: 0 on Spider).
    Shield,
    /// Block, and drop flagged samples from the policy gradient.
    Screen,
    /// Block and penalise (`PolicyReward`).
    #[default]
    Enforce,
}

impl TrainingMode {
    /// Every mode, in the order a comparison prints them.
    pub const ALL: [TrainingMode; 4] = [
        TrainingMode::Audit,
        TrainingMode::Shield,
        TrainingMode::Screen,
        TrainingMode::Enforce,
    ];

    /// What a bare `--compare` runs: audit, then enforce.
    pub const DEFAULT_COMPARISON: [TrainingMode; 2] = [TrainingMode::Audit, TrainingMode::Enforce];

    /// The lowercase name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            TrainingMode::Audit => "audit",
            TrainingMode::Shield => "shield",
            TrainingMode::Screen => "screen",
            TrainingMode::Enforce => "enforce",
        }
    }

    /// The kernel's mode for training rollouts: audit for `audit`, enforce for the others.
    pub fn kernel_mode(self) -> GovernanceMode {
        match self {
            TrainingMode::Audit => GovernanceMode::Audit,
            TrainingMode::Shield | TrainingMode::Screen | TrainingMode::Enforce => {
                GovernanceMode::Enforce
            }
        }
    }

    /// Whether violations shape the reward (penalties, clean bonus): only in `enforce`.
    pub fn shapes_reward(self) -> bool {
        self == TrainingMode::Enforce
    }

    /// Whether a sample whose rollout drew `violations` violations enters the policy gradient:
    /// always, except a flagged one (`violations > 0`) in `screen`.
    pub fn in_gradient(self, violations: usize) -> bool {
        !(self == TrainingMode::Screen && violations > 0)
    }

    /// The reward of this mode's training rollouts: `config`'s shaping in `enforce`, the task
    /// reward alone otherwise (explicit per-policy penalties included: none is applied).
    pub fn policy_reward<I, O>(self, config: RewardConfig) -> PolicyReward<I, O> {
        PolicyReward::new(config).with_shaping(self.shapes_reward())
    }

    /// A short description of the mode, for tables and plots.
    pub fn title(self) -> &'static str {
        match self {
            TrainingMode::Audit => "audit (record only)",
            TrainingMode::Shield => "shield (block)",
            TrainingMode::Screen => "screen (block, drop flagged)",
            TrainingMode::Enforce => "enforce (block and penalise)",
        }
    }
}

impl fmt::Display for TrainingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TrainingMode {
    type Err = TrainError;

    /// Parses a mode name, case-insensitive, surrounding whitespace ignored; anything else is
    /// [`TrainError::Config`] listing the valid names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        TrainingMode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                TrainError::Config(format!(
                    "`{s}` is not a governance mode: use audit, shield, screen or enforce"
                ))
            })
    }
}

impl From<GovernanceMode> for TrainingMode {
    /// The training mode with the same name (`audit`, `enforce`).
    fn from(m: GovernanceMode) -> Self {
        match m {
            GovernanceMode::Audit => TrainingMode::Audit,
            GovernanceMode::Enforce => TrainingMode::Enforce,
        }
    }
}

/// Parses a comma-separated list of modes (`audit,shield,screen,enforce`), keeping the order
/// given; an empty list or a mode named twice is an error naming it.
pub fn parse_modes(list: &str) -> Result<Vec<TrainingMode>, TrainError> {
    let mut modes = Vec::new();
    for name in list.split(',') {
        let mode: TrainingMode = name.parse()?;
        if modes.contains(&mode) {
            return Err(TrainError::Config(format!(
                "governance mode `{mode}` is listed twice in `{list}`"
            )));
        }
        modes.push(mode);
    }
    Ok(modes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_gov::{Effect, Severity, Violation};

    fn violation(penalty: Option<f64>) -> Violation {
        Violation {
            policy: "sql_safety".into(),
            severity: Severity::Critical,
            reason: "DROP TABLE".into(),
            effect: Effect::Block,
            penalty,
            signal: None,
        }
    }

    #[test]
    fn names_round_trip_through_text_and_json() {
        for m in TrainingMode::ALL {
            assert_eq!(m.as_str().parse::<TrainingMode>().unwrap(), m);
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::String(m.as_str().into())
            );
            assert_eq!(
                serde_json::from_value::<TrainingMode>(m.as_str().into()).unwrap(),
                m
            );
        }
        assert_eq!(
            " Shield ".parse::<TrainingMode>().unwrap(),
            TrainingMode::Shield
        );
        let e = "sometimes".parse::<TrainingMode>().unwrap_err().to_string();
        assert!(e.contains("sometimes") && e.contains("screen"), "{e}");
        // The kernel's names read as the training modes of the same name.
        for g in [GovernanceMode::Audit, GovernanceMode::Enforce] {
            assert_eq!(TrainingMode::from(g).as_str(), g.as_str());
        }
    }

    #[test]
    fn only_audit_lets_everything_run() {
        assert_eq!(TrainingMode::Audit.kernel_mode(), GovernanceMode::Audit);
        for m in [
            TrainingMode::Shield,
            TrainingMode::Screen,
            TrainingMode::Enforce,
        ] {
            assert_eq!(m.kernel_mode(), GovernanceMode::Enforce, "{m}");
        }
    }

    #[test]
    fn only_enforce_shapes_the_reward() {
        let v = [violation(None)];
        let explicit = [violation(Some(30.0))];
        for m in TrainingMode::ALL {
            let r: PolicyReward = m.policy_reward(RewardConfig::default());
            let blocked = r.compute(0.0, false, &v);
            let explicit = r.compute(0.0, false, &explicit);
            let clean = r.compute(1.0, true, &[] as &[Violation]);
            if m == TrainingMode::Enforce {
                assert_eq!(blocked.final_reward, -100.0);
                assert_eq!(explicit.final_reward, -30.0);
                assert_eq!(clean.final_reward, 6.0);
            } else {
                assert_eq!(blocked.final_reward, 0.0, "{m}");
                assert_eq!(explicit.final_reward, 0.0, "{m}");
                assert_eq!(blocked.violations, 1, "{m}");
                assert_eq!(clean.final_reward, 1.0, "{m}");
            }
        }
    }

    #[test]
    fn only_screen_drops_flagged_samples() {
        for m in TrainingMode::ALL {
            assert!(m.in_gradient(0), "{m}");
            assert_eq!(m.in_gradient(2), m != TrainingMode::Screen, "{m}");
        }
    }

    #[test]
    fn lists_keep_their_order_and_refuse_repeats() {
        assert_eq!(
            parse_modes("audit,shield,screen,enforce").unwrap(),
            TrainingMode::ALL.to_vec()
        );
        assert_eq!(
            parse_modes("enforce,audit").unwrap(),
            vec![TrainingMode::Enforce, TrainingMode::Audit]
        );
        let e = parse_modes("audit,audit").unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let e = parse_modes("audit,").unwrap_err().to_string();
        assert!(e.contains("not a governance mode"), "{e}");
    }
}
