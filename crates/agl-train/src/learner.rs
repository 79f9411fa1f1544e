//! The policy update of the LLM loop: what a learner does with one step's training samples.
//!
//! [`crate::LlmLoop`] rolls out, judges and turns each rewarded rollout's calls into
//! [`TokenSample`]s (each carrying its reward: the reward matched to its last call, else the
//! rollout's final reward); the [`Learner`] decides what to train on and how:
//! - [`crate::LlmGrpo`]: group-relative advantages over each task's rollouts
//!   ([`assign_advantages`]) and one clipped policy-gradient update;
//! - [`crate::LlmSft`]: the top fraction of the samples by reward and one supervised
//!   (negative log-likelihood) update on their response tokens.
//!
//! Responsible for that seam only; not for rolling out, judging or serving.

use std::collections::HashMap;

use agl_llm::LoraAdapter;

use crate::{LlmGrpo, LlmStepStats, TokenSample, TrainError, assign_advantages};

/// A LoRA learner the loop can drive.
pub trait Learner: Send {
    /// The algorithm's name in reports and checkpoints (`grpo`, `sft`).
    fn algorithm(&self) -> &'static str;
    /// The adapter being trained (hand the engine a [`LoraAdapter::snapshot`]).
    fn adapter(&self) -> &LoraAdapter;
    /// The fewest rollouts per task the algorithm can learn from (GRPO compares rollouts of
    /// one task, so 2; SFT needs 1).
    fn min_group_size(&self) -> usize;
    /// One update on a step's samples; `rollout_rewards` maps each rewarded rollout to its
    /// final reward.
    ///
    /// # Errors
    /// The algorithm's: tensor errors, samples the model cannot take, or (SFT) nothing to
    /// select.
    fn update(
        &mut self,
        samples: Vec<TokenSample>,
        rollout_rewards: &HashMap<String, f64>,
    ) -> Result<LlmStepStats, TrainError>;
}

impl Learner for LlmGrpo {
    fn algorithm(&self) -> &'static str {
        "grpo"
    }

    fn adapter(&self) -> &LoraAdapter {
        LlmGrpo::adapter(self)
    }

    fn min_group_size(&self) -> usize {
        2
    }

    fn update(
        &mut self,
        mut samples: Vec<TokenSample>,
        rollout_rewards: &HashMap<String, f64>,
    ) -> Result<LlmStepStats, TrainError> {
        assign_advantages(&mut samples, rollout_rewards);
        self.step(&samples)
    }
}
