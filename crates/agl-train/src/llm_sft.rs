//! Supervised fine-tuning of an LLM's LoRA adapter on selected token sequences: Agent
//! Lightning's other training route (its Unsloth example: roll out, keep the best rollouts,
//! fine-tune a LoRA on them, serve it, repeat).
//!
//! # Selection
//! [`select_top_fraction`] over one step's samples (from [`crate::samples_from_triplets`]: the
//! engine's own token ids, no re-tokenising; each sample's reward is the reward matched to its
//! last call, else its rollout's final reward, so a rollout's reward is carried backwards over
//! its calls): samples without response tokens are dropped, then (with
//! [`LlmSftConfig::min_reward`]) those whose reward is not above it, then the rest are sorted by
//! reward, highest first (ties keep rollout order), and the first `ceil(top_fraction · n)` are
//! kept, at least one. The Unsloth example keeps the top half the same way (default
//! [`DEFAULT_TOP_FRACTION`]).
//!
//! # The loss
//! [`LlmSft::step`]: the negative log-likelihood of the trained tokens (loss mask 1: response
//! tokens the policy chose; context and forced tokens are 0), averaged over every trained token
//! of the batch (token mean, as TRL's `SFTTrainer` with `assistant_only_loss`). Micro-batching
//! (samples sharing a prompt share its forward pass), gradient accumulation, global-norm
//! clipping and AdamW are those of [`crate::LlmGrpo`]; only the LoRA factors are variables.
//!
//! # Demonstrations
//! [`crate::demonstrations`] turns OpenAI chat-format examples into the same samples
//! (tokenised with the model's chat template), for SFT without rollouts.
//!
//! Responsible for selection and one supervised update; not for the loop or sampling.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use agl_llm::{LlamaModel, LoraAdapter};
use candle_core::Var;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::learner::Learner;
use crate::llm_grpo::{LoraParams, check_update_settings, chunk_by_prompt, micro_batch};
use crate::{LlmStepStats, TokenSample};

/// Share of a step's samples kept for fine-tuning by default (the Unsloth example's top half).
pub const DEFAULT_TOP_FRACTION: f64 = 0.5;

/// Hyper-parameters of the SFT update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSftConfig {
    /// AdamW learning rate (default 1e-4).
    pub learning_rate: f64,
    /// AdamW weight decay (default 0.0).
    pub weight_decay: f64,
    /// Global L2 norm gradients are clipped to (default 1.0).
    pub max_grad_norm: f64,
    /// Most samples per forward/backward pass (default 8).
    pub micro_batch: usize,
    /// Most attention cells per pass (default 2,500,000; see
    /// [`crate::LlmGrpoConfig::micro_batch_cells`]).
    pub micro_batch_cells: usize,
    /// Share of a step's samples kept, in (0, 1] (default 0.5).
    pub top_fraction: f64,
    /// Keep only samples whose reward is above this (default: none).
    #[serde(default)]
    pub min_reward: Option<f64>,
}

impl Default for LlmSftConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-4,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            micro_batch: 8,
            micro_batch_cells: 2_500_000,
            top_fraction: DEFAULT_TOP_FRACTION,
            min_reward: None,
        }
    }
}

impl LlmSftConfig {
    /// Checks ranges; the error names the field.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |f: &str, why: &str| Err(TrainError::Config(format!("{f} {why}")));
        check_update_settings(
            self.learning_rate,
            self.weight_decay,
            self.max_grad_norm,
            self.micro_batch,
            self.micro_batch_cells,
        )?;
        if !(self.top_fraction > 0.0 && self.top_fraction <= 1.0) {
            return bad("top_fraction", "must be in (0, 1]");
        }
        if self.min_reward.is_some_and(|r| !r.is_finite()) {
            return bad("min_reward", "must be a finite number");
        }
        Ok(())
    }
}

/// The samples SFT trains on (see the module docs), highest reward first.
pub fn select_top_fraction(
    samples: Vec<TokenSample>,
    top_fraction: f64,
    min_reward: Option<f64>,
) -> Vec<TokenSample> {
    let mut kept: Vec<TokenSample> = samples
        .into_iter()
        .filter(|s| s.loss_tokens() > 0)
        .filter(|s| min_reward.is_none_or(|m| s.reward > m))
        .collect();
    if kept.is_empty() {
        return kept;
    }
    kept.sort_by(|a, b| b.reward.total_cmp(&a.reward));
    let n = ((top_fraction * kept.len() as f64).ceil() as usize).clamp(1, kept.len());
    kept.truncate(n);
    kept
}

/// The LoRA SFT learner: the frozen base model, the trainable adapter and AdamW.
pub struct LlmSft {
    config: LlmSftConfig,
    lora: LoraParams,
}

impl std::fmt::Debug for LlmSft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSft")
            .field("config", &self.config)
            .field("parameters", &self.lora.adapter.num_parameters())
            .finish_non_exhaustive()
    }
}

impl LlmSft {
    /// A learner for `adapter` (its variables `vars`) on `model`, which must be dense.
    ///
    /// # Errors
    /// [`TrainError::Config`] for a bad configuration or a quantized model.
    pub fn new(
        model: Arc<LlamaModel>,
        adapter: LoraAdapter,
        vars: Vec<Var>,
        config: LlmSftConfig,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        let lora = LoraParams::new(
            model,
            adapter,
            vars,
            config.learning_rate,
            config.weight_decay,
        )?;
        Ok(Self { config, lora })
    }

    /// The configuration.
    pub fn config(&self) -> &LlmSftConfig {
        &self.config
    }

    /// The adapter being trained.
    pub fn adapter(&self) -> &LoraAdapter {
        &self.lora.adapter
    }

    /// One supervised update on every sample given (no selection; see the module docs).
    /// `loss` in the statistics is the token-mean negative log-likelihood (nats per token)
    /// before the update.
    ///
    /// # Errors
    /// Tensor errors, [`TrainError::Config`] for samples the model cannot take or a gradient
    /// that is not finite (the update is then not applied).
    pub fn step(&mut self, samples: &[TokenSample]) -> Result<LlmStepStats, TrainError> {
        let started = Instant::now();
        let kept: Vec<&TokenSample> = samples.iter().filter(|s| s.loss_tokens() > 0).collect();
        let total_tokens: usize = kept.iter().map(|s| s.loss_tokens()).sum();
        let mut stats = LlmStepStats {
            samples: samples.len(),
            trained_samples: kept.len(),
            loss_tokens: total_tokens,
            forced_tokens: kept.iter().map(|s| s.forced_tokens).sum(),
            ..LlmStepStats::default()
        };
        if kept.is_empty() {
            stats.seconds = started.elapsed().as_secs_f64();
            return Ok(stats);
        }
        let device = self.lora.model.device().clone();
        let denom = total_tokens as f64;
        let mut acc = None;
        let mut loss_sum = 0f64;
        for run in chunk_by_prompt(
            &kept,
            self.config.micro_batch,
            self.config.micro_batch_cells,
        ) {
            let mb = micro_batch(&device, &run)?;
            let out = self
                .lora
                .backward(&mb, |lp| (lp * &mb.mask)?.sum_all()?.neg()? / denom)?;
            loss_sum += f64::from(out.loss.to_scalar::<f32>()?);
            stats.forward_seconds += out.forward_seconds;
            stats.backward_seconds += out.backward_seconds;
            acc = Some(self.lora.accumulate(acc, out.grads)?);
        }
        if let Some(grads) = acc {
            stats.grad_norm = self.lora.apply(grads, self.config.max_grad_norm)?;
        }
        stats.loss = loss_sum;
        stats.seconds = started.elapsed().as_secs_f64();
        Ok(stats)
    }
}

impl Learner for LlmSft {
    fn algorithm(&self) -> &'static str {
        "sft"
    }

    fn adapter(&self) -> &LoraAdapter {
        &self.lora.adapter
    }

    fn min_group_size(&self) -> usize {
        1
    }

    fn update(
        &mut self,
        samples: Vec<TokenSample>,
        rollout_rewards: &HashMap<String, f64>,
    ) -> Result<LlmStepStats, TrainError> {
        let given = samples.len();
        if rollout_rewards.is_empty() {
            return Err(TrainError::NothingToLearn(
                "no rollout of the step reported a reward, so none could be selected for \
                 fine-tuning"
                    .into(),
            ));
        }
        let selected =
            select_top_fraction(samples, self.config.top_fraction, self.config.min_reward);
        if selected.is_empty() {
            return Err(TrainError::NothingToLearn(format!(
                "none of the step's {given} samples from {} rewarded rollouts could be selected \
                 (no trainable response tokens{})",
                rollout_rewards.len(),
                match self.config.min_reward {
                    Some(m) => format!(", or no reward above --sft-min-reward {m}"),
                    None => String::new(),
                }
            )));
        }
        let mut stats = self.step(&selected)?;
        stats.samples = given;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ro: &str, reward: f64, loss_tokens: usize) -> TokenSample {
        TokenSample {
            rollout_id: ro.into(),
            group: "g".into(),
            tokens: vec![1; 2 + loss_tokens],
            prompt_len: 2,
            loss_mask: vec![true; loss_tokens],
            old_logprobs: vec![0.0; loss_tokens],
            reward,
            advantage: 0.0,
            roles: vec![],
            adapters: vec![],
            forced_tokens: 0,
        }
    }

    fn ids(s: &[TokenSample]) -> Vec<&str> {
        s.iter().map(|x| x.rollout_id.as_str()).collect()
    }

    #[test]
    fn the_top_fraction_by_reward_is_kept_ties_in_order() {
        let s = vec![
            sample("a", 0.0, 3),
            sample("b", 1.0, 3),
            sample("c", 0.5, 3),
            sample("d", 1.0, 3),
            sample("e", 0.2, 0),
        ];
        // e has no response tokens; 4 candidates, half = 2: the two 1.0s in rollout order.
        assert_eq!(ids(&select_top_fraction(s.clone(), 0.5, None)), ["b", "d"]);
        // ceil(0.3 · 4) = 2; a fraction keeps at least one.
        assert_eq!(select_top_fraction(s.clone(), 0.3, None).len(), 2);
        assert_eq!(ids(&select_top_fraction(s.clone(), 0.01, None)), ["b"]);
        assert_eq!(
            ids(&select_top_fraction(s.clone(), 1.0, None)),
            ["b", "d", "c", "a"]
        );
        // A floor drops what is not above it.
        assert_eq!(
            ids(&select_top_fraction(s.clone(), 1.0, Some(0.5))),
            ["b", "d"]
        );
        assert!(select_top_fraction(s, 1.0, Some(1.0)).is_empty());
    }

    #[test]
    fn config_ranges_are_checked_by_field() {
        assert!(LlmSftConfig::default().validate().is_ok());
        for (cfg, field) in [
            (
                LlmSftConfig {
                    top_fraction: 0.0,
                    ..LlmSftConfig::default()
                },
                "top_fraction",
            ),
            (
                LlmSftConfig {
                    top_fraction: 1.5,
                    ..LlmSftConfig::default()
                },
                "top_fraction",
            ),
            (
                LlmSftConfig {
                    learning_rate: -1.0,
                    ..LlmSftConfig::default()
                },
                "learning_rate",
            ),
            (
                LlmSftConfig {
                    min_reward: Some(f64::NAN),
                    ..LlmSftConfig::default()
                },
                "min_reward",
            ),
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
