//! Group Relative Policy Optimisation (GRPO) for a candidate-choice policy.
//!
//! Follows Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), §4.1: for each question a group
//! of G actions is sampled from the current policy π_old; each action's advantage is its reward
//! normalised by the group's mean and standard deviation (`A = (r − mean) / (std + 1e-6)`, zero
//! when all rewards are equal); the loss is the PPO clipped surrogate (Schulman et al. 2017,
//! ε = 0.2) plus β times the unbiased KL estimator `exp(ref − new) − (ref − new) − 1` to the
//! initial (reference) policy, averaged over every sampled action. Updates use AdamW with global
//! L2-norm gradient clipping (written here: candle has none).
//!
//! Responsible for one update step from (features, sampled actions, rewards); not for sampling,
//! running rollouts or computing rewards (see `trainer` and `runner`).

use agl_train::grpo::{clip_grad_norm, group_advantages};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;
use crate::scorer::model::{FeatureBatch, PolicyModel};

/// Hyper-parameters of GRPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoConfig {
    /// Samples per question (G, default 8).
    pub group_size: usize,
    /// Questions per update (default 32).
    pub batch_questions: usize,
    /// AdamW learning rate (default 0.01).
    pub learning_rate: f64,
    /// AdamW weight decay (default 0.0).
    pub weight_decay: f64,
    /// PPO clip range ε (default 0.2).
    pub clip_epsilon: f64,
    /// KL coefficient β to the reference policy (default 0.04, as in DeepSeekMath).
    pub kl_beta: f64,
    /// Gradient steps per sampled batch (μ, default 2).
    pub inner_steps: usize,
    /// Global L2 norm that gradients are clipped to (default 1.0).
    pub max_grad_norm: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            group_size: 8,
            batch_questions: 32,
            learning_rate: 0.01,
            weight_decay: 0.0,
            clip_epsilon: 0.2,
            kl_beta: 0.04,
            inner_steps: 2,
            max_grad_norm: 1.0,
        }
    }
}

impl GrpoConfig {
    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), SpiderError> {
        let bad = |f: &str, why: &str| Err(SpiderError::Config(format!("grpo.{f} {why}")));
        if self.group_size < 2 {
            return bad(
                "group_size",
                "must be at least 2 (advantages are group-relative)",
            );
        }
        if self.batch_questions == 0 {
            return bad("batch_questions", "must be at least 1");
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad("learning_rate", "must be a positive number");
        }
        if !(self.clip_epsilon > 0.0 && self.clip_epsilon < 1.0) {
            return bad("clip_epsilon", "must be in (0, 1)");
        }
        if !(self.kl_beta >= 0.0 && self.kl_beta.is_finite()) {
            return bad("kl_beta", "must be ≥ 0");
        }
        if self.inner_steps == 0 {
            return bad("inner_steps", "must be at least 1");
        }
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return bad("max_grad_norm", "must be positive");
        }
        Ok(())
    }
}

/// What one update did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// Loss of the last inner step.
    pub loss: f64,
    /// Mean KL estimate to the reference policy.
    pub kl: f64,
    /// Global gradient norm before clipping (last inner step).
    pub grad_norm: f64,
    /// Share of sampled actions whose ratio was clipped (last inner step).
    pub clip_fraction: f64,
}

/// The GRPO learner: a policy, its frozen reference and the optimiser.
pub struct Grpo {
    config: GrpoConfig,
    policy: Box<dyn PolicyModel>,
    reference: Box<dyn PolicyModel>,
    optimizer: AdamW,
}

impl Grpo {
    /// Wraps `policy`; its current weights become the reference policy.
    pub fn new(policy: Box<dyn PolicyModel>, config: GrpoConfig) -> Result<Self, SpiderError> {
        let reference = policy.frozen_copy()?;
        Self::with_reference(policy, reference, config)
    }

    /// Wraps `policy` with an explicit reference policy, which the optimiser never updates (a
    /// resumed run keeps its initial policy as the reference). The optimiser starts fresh:
    /// AdamW moments are not checkpointed.
    pub fn with_reference(
        policy: Box<dyn PolicyModel>,
        reference: Box<dyn PolicyModel>,
        config: GrpoConfig,
    ) -> Result<Self, SpiderError> {
        config.validate()?;
        let optimizer = AdamW::new(
            policy.vars(),
            ParamsAdamW {
                lr: config.learning_rate,
                weight_decay: config.weight_decay,
                ..ParamsAdamW::default()
            },
        )?;
        Ok(Self {
            config,
            policy,
            reference,
            optimizer,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GrpoConfig {
        &self.config
    }

    /// The current policy.
    pub fn policy(&self) -> &dyn PolicyModel {
        self.policy.as_ref()
    }

    /// One GRPO update. `old_log_probs` (`[B, C]`) are the log-probabilities the actions were
    /// sampled from (π_old; `batch.log_probs(self.policy())` before this step), `actions[b]` the
    /// candidate indices sampled for question `b` and `rewards[b]` their rewards (same length,
    /// any G ≥ 1).
    pub fn step(
        &mut self,
        batch: &FeatureBatch,
        old_log_probs: &Tensor,
        actions: &[Vec<usize>],
        rewards: &[Vec<f64>],
    ) -> Result<StepStats, SpiderError> {
        let b = batch.questions;
        let c = batch.width;
        if actions.len() != b || rewards.len() != b {
            return Err(SpiderError::Config(format!(
                "grpo step: {b} questions but {} action groups and {} reward groups",
                actions.len(),
                rewards.len()
            )));
        }
        let g = actions.iter().map(Vec::len).max().unwrap_or(0);
        if g == 0 {
            return Err(SpiderError::Config("grpo step: empty groups".into()));
        }
        // one-hot [B, G, C] of sampled actions, a sample mask [B, G] and advantages [B, G]
        let mut onehot = vec![0f32; b * g * c];
        let mut sample_mask = vec![0f32; b * g];
        let mut adv = vec![0f32; b * g];
        for qi in 0..b {
            if actions[qi].len() != rewards[qi].len() {
                return Err(SpiderError::Config(format!(
                    "grpo step: question {qi} has {} actions but {} rewards",
                    actions[qi].len(),
                    rewards[qi].len()
                )));
            }
            let a = group_advantages(&rewards[qi]);
            for (si, &act) in actions[qi].iter().enumerate() {
                if act >= c {
                    return Err(SpiderError::Config(format!(
                        "grpo step: action {act} out of range for {c} candidates"
                    )));
                }
                onehot[(qi * g + si) * c + act] = 1.0;
                sample_mask[qi * g + si] = 1.0;
                adv[qi * g + si] = a[si] as f32;
            }
        }
        let dev = Device::Cpu;
        let onehot = Tensor::from_vec(onehot, (b, g, c), &dev)?;
        let sample_mask = Tensor::from_vec(sample_mask, (b, g), &dev)?;
        let n_samples = actions.iter().map(Vec::len).sum::<usize>() as f64;
        let adv = Tensor::from_vec(adv, (b, g), &dev)?;
        let pick = |lp: &Tensor| -> candle_core::Result<Tensor> {
            onehot.broadcast_mul(&lp.unsqueeze(1)?)?.sum(2)
        };
        if old_log_probs.dims() != [b, c] {
            return Err(SpiderError::Config(format!(
                "grpo step: old log-probs have shape {:?}, expected [{b}, {c}]",
                old_log_probs.dims()
            )));
        }
        let old = pick(&old_log_probs.detach())?;
        let reference = pick(&batch.log_probs(self.reference.as_ref())?.detach())?;
        let eps = self.config.clip_epsilon;
        let mut stats = StepStats {
            loss: 0.0,
            kl: 0.0,
            grad_norm: 0.0,
            clip_fraction: 0.0,
        };
        for _ in 0..self.config.inner_steps {
            let new = pick(&batch.log_probs(self.policy.as_ref())?)?;
            let ratio = (&new - &old)?.exp()?;
            let surr1 = (&ratio * &adv)?;
            let surr2 = (ratio.clamp(1.0 - eps, 1.0 + eps)? * &adv)?;
            let objective = surr1.minimum(&surr2)?;
            let log_ratio_ref = (&reference - &new)?;
            let kl = ((log_ratio_ref.exp()? - &log_ratio_ref)? - 1.0)?;
            let per_sample = ((objective * -1.0)? + (&kl * self.config.kl_beta)?)?;
            let loss = ((per_sample * &sample_mask)?.sum_all()? / n_samples)?;
            let mut grads = loss.backward()?;
            let norm = clip_grad_norm(&mut grads, &self.policy.vars(), self.config.max_grad_norm)?;
            self.optimizer.step(&grads)?;
            let clipped = ((ratio.ge(1.0 + eps)?.to_dtype(DType::F32)?
                + ratio.le(1.0 - eps)?.to_dtype(DType::F32)?)?
                * &sample_mask)?
                .sum_all()?
                .to_scalar::<f32>()?;
            stats = StepStats {
                loss: f64::from(loss.to_scalar::<f32>()?),
                kl: f64::from((kl * &sample_mask)?.sum_all()?.to_scalar::<f32>()?) / n_samples,
                grad_norm: norm,
                clip_fraction: f64::from(clipped) / n_samples,
            };
        }
        Ok(stats)
    }
}

/// Greedy choice per question from `log_probs` (`[B, C]`, as [`FeatureBatch::log_probs`]
/// gives for a model; lowest index on ties).
pub fn greedy(log_probs: &Tensor) -> Result<Vec<usize>, SpiderError> {
    let lp: Vec<Vec<f32>> = log_probs.to_vec2()?;
    Ok(lp
        .iter()
        .map(|row| {
            let mut best = 0;
            for (i, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = i;
                }
            }
            best
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scorer::features::featurize;
    use crate::scorer::model::Scorer;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn bandit() -> Vec<Vec<crate::scorer::features::SparseFeatures>> {
        // A synthetic contextual bandit: in each question exactly one candidate answers with
        // the number the question mentions.
        (0..16)
            .map(|i| {
                let q = format!("how many rows have value {i}");
                (0..4)
                    .map(|j| {
                        featurize(
                            &q,
                            &format!("SELECT count(*) FROM t WHERE v = {}", i + j * 100),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_parameter_receives_a_gradient() {
        let sets = bandit();
        let refs: Vec<&[_]> = sets.iter().map(Vec::as_slice).collect();
        let batch = FeatureBatch::new(&refs).unwrap();
        let model = Scorer::new(3).unwrap();
        let lp = batch.log_probs(&model).unwrap();
        let chosen = lp.narrow(1, 0, 1).unwrap().sum_all().unwrap();
        let grads = chosen.backward().unwrap();
        for (i, var) in model.vars().iter().enumerate() {
            let g = grads.get(var.as_tensor()).expect("gradient present");
            let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(norm > 0.0, "parameter {i} got a zero gradient");
        }
    }

    #[test]
    fn expected_reward_rises_on_a_synthetic_bandit() {
        let sets = bandit();
        let refs: Vec<&[_]> = sets.iter().map(Vec::as_slice).collect();
        let batch = FeatureBatch::new(&refs).unwrap();
        let mut grpo = Grpo::new(Box::new(Scorer::new(5).unwrap()), GrpoConfig::default()).unwrap();
        let expected = |grpo: &Grpo| -> f64 {
            let lp: Vec<Vec<f32>> = batch.log_probs(grpo.policy()).unwrap().to_vec2().unwrap();
            lp.iter().map(|row| f64::from(row[0].exp())).sum::<f64>() / lp.len() as f64
        };
        let before = expected(&grpo);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..30 {
            let old = batch.log_probs(grpo.policy()).unwrap();
            let lp: Vec<Vec<f32>> = old.to_vec2().unwrap();
            let mut actions = Vec::new();
            let mut rewards = Vec::new();
            for row in &lp {
                let probs: Vec<f64> = row.iter().map(|l| f64::from(l.exp())).collect();
                let (mut a, mut r) = (Vec::new(), Vec::new());
                for _ in 0..8 {
                    let u: f64 = rng.random();
                    let mut acc = 0.0;
                    let mut pick = probs.len() - 1;
                    for (k, p) in probs.iter().enumerate() {
                        acc += p;
                        if u < acc {
                            pick = k;
                            break;
                        }
                    }
                    a.push(pick);
                    r.push(if pick == 0 { 1.0 } else { 0.0 });
                }
                actions.push(a);
                rewards.push(r);
            }
            grpo.step(&batch, &old, &actions, &rewards).unwrap();
        }
        let after = expected(&grpo);
        assert!(
            before < 0.4,
            "untrained policy should be near uniform, got {before}"
        );
        assert!(after > before + 0.3, "expected reward {before} -> {after}");
    }

    #[test]
    fn rejects_mismatched_groups() {
        let sets = bandit();
        let refs: Vec<&[_]> = sets.iter().take(2).map(Vec::as_slice).collect();
        let batch = FeatureBatch::new(&refs).unwrap();
        let mut grpo = Grpo::new(Box::new(Scorer::new(5).unwrap()), GrpoConfig::default()).unwrap();
        let old = batch.log_probs(grpo.policy()).unwrap();
        assert!(grpo.step(&batch, &old, &[vec![0]], &[vec![1.0]]).is_err());
        let wrong_shape = old.narrow(0, 0, 1).unwrap();
        let err = grpo
            .step(
                &batch,
                &wrong_shape,
                &[vec![0], vec![1]],
                &[vec![1.0], vec![0.0]],
            )
            .unwrap_err();
        assert!(err.to_string().contains("old log-probs"), "{err}");
        assert!(
            grpo.step(&batch, &old, &[vec![9], vec![0]], &[vec![1.0], vec![0.0]])
                .is_err()
        );
    }
}
