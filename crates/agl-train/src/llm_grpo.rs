//! GRPO for token sequences: the update that trains an LLM's LoRA adapter from triplets.
//!
//! # Samples from triplets
//! [`samples_from_triplets`] turns one rollout's triplets (from [`crate::TracerTraceToTriplet`],
//! in call order, with prompt and response token ids and the sampler's log-probabilities) into
//! [`TokenSample`]s, as Agent Lightning's trajectory builder does for multi-turn agents:
//! consecutive calls are merged into one sample when the next prompt starts with the previous
//! prompt and response tokens; the tokens in between (tool results, new user turns) are context
//! with loss mask 0. Otherwise each call is its own sample. A sample's reward is the reward the
//! adapter matched to its last call (an intermediate reward span attached to that call), else
//! the nearest reward matched to a later call, else the rollout's final reward: rewards are
//! carried backwards over a rollout's calls, as Agent Lightning's Unsloth SFT example does.
//!
//! # Forced tokens
//! A response token that a constraint (JSON schema, grammar) left as the only choice was not
//! chosen by the policy. The engine reports such positions (`forced_token_positions`), the
//! gateway records them (`agl.response.forced_positions`) and the adapter puts them in the
//! triplet (`response.forced_positions`, 0-based into `response.token_ids`; absent means none).
//! Here they get loss mask 0, like context: no policy-gradient term, no KL term, and they count
//! neither in the token-mean's denominator nor in the clip fraction or the first ratio's
//! deviation. Why: the trainer's forward applies no constraint mask, and the engine records
//! the raw (unmasked) log-probability of every token, so a forced token's ratio starts at 1
//! like any other and nothing would break if it stayed in; but the policy would then be
//! credited (or blamed) with the advantage for a token the grammar chose, and the update would
//! push a probability that the constraint overrides anyway (a closing brace after a complete
//! JSON object, say) and dilute the token mean with tokens that carry no decision.
//! [`TokenSample::forced_tokens`] and [`LlmStepStats::forced_tokens`] count them.
//!
//! # Advantages
//! [`assign_advantages`]: group-relative, as DeepSeekMath's GRPO (Shao et al. 2024,
//! arXiv:2402.03300, §4.1): a group is every rollout of one task in one step; `A = (r − mean) /
//! (std + 1e-6)` with the mean and (population) standard deviation of the group's rollout
//! rewards, zero when they are all equal.
//!
//! # The loss
//! [`LlmGrpo::step`]: the token-level clipped surrogate with DAPO's decoupled clip range (Yu et
//! al. 2025, arXiv:2503.14476: ε_low 0.2, ε_high 0.28), plus β times the k3 estimator of the KL
//! to the base model (`exp(ref − new) − (ref − new) − 1`, per token; the reference forward is
//! skipped when β = 0, DAPO's and TRL's default), averaged over every loss token of the batch
//! (DAPO's token-mean: long responses weigh by their length). Samples with advantage 0 carry
//! no policy gradient and are skipped (DAPO's dynamic-sampling filter), which also saves their
//! forward and backward. Samples that share a prompt (a group's G answers) share a forward
//! pass: the prompt runs once and its keys and values serve every answer, differentiably
//! ([`agl_llm::LlamaModel::prefixed_logprobs`]), so an update costs `P + G·S` positions per
//! group instead of `G·(P + S)`. Each pass is checkpointed
//! ([`agl_llm::LlamaModel::prefixed_logprobs_backward`]): layers are recomputed from their saved
//! inputs during the backward pass, attention runs in query blocks and the LM head in chunks
//! of response positions, so memory stays near the model's own size. Gradients are accumulated over micro-batches bounded by
//! [`LlmGrpoConfig::micro_batch`] rows and [`LlmGrpoConfig::micro_batch_cells`] attention cells
//! (memory stays bounded), clipped to a global L2 norm and applied with AdamW (candle-nn's). Only the LoRA factors are variables; the base weights
//! are plain tensors and stay frozen.
//!
//! Log-probabilities are at temperature 1 on both sides: the old ones are what the engine
//! reported for the sampled tokens (`agl.response.logprobs`, the raw model distribution even
//! when sampling used another temperature), the new ones what the same model definition
//! recomputes, so the ratio of the first inner step is 1 up to the kernels' rounding (tested).
//!
//! Responsible for samples, advantages and one update; not for sampling, running agents or the
//! loop (see `agl train --agent llm`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use agl_core::Triplet;
use agl_llm::{LlamaModel, LogprobGradients, LoraAdapter};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::TrainError;
use crate::grpo::clip_grad_norm;

/// Hyper-parameters of the LLM GRPO update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmGrpoConfig {
    /// AdamW learning rate (default 1e-4: LoRA on a small model, short CPU runs).
    pub learning_rate: f64,
    /// AdamW weight decay (default 0.0).
    pub weight_decay: f64,
    /// Lower clip range ε_low: the ratio is clipped below at `1 − ε_low` (default 0.2).
    pub clip_low: f64,
    /// Upper clip range ε_high: the ratio is clipped above at `1 + ε_high` (default 0.28,
    /// DAPO's clip-higher).
    pub clip_high: f64,
    /// KL coefficient β to the base model (k3 estimator; default 0.0: no reference forward).
    pub kl_beta: f64,
    /// Global L2 norm that gradients are clipped to (default 1.0).
    pub max_grad_norm: f64,
    /// Most samples per forward/backward pass (default 8: a GRPO group). Only samples with
    /// the same prompt share a pass; the prompt runs once and its keys and values serve every
    /// row ([`agl_llm::LlamaModel::prefixed_logprobs`]).
    pub micro_batch: usize,
    /// Most attention cells per pass (default 2,500,000): `P² + rows · S · (P + S)` for a
    /// prompt of `P` tokens and `rows` continuations padded to `S`; a row that alone exceeds it
    /// goes alone. The default puts a group of 8 answers of 128 tokens to a prompt of up to
    /// 1,000 tokens in one pass. The update is checkpointed
    /// ([`agl_llm::LlamaModel::prefixed_logprobs_backward`]: one layer's graph alive at a time,
    /// attention in query blocks, the LM head in chunks), so a pass's memory grows with its
    /// tokens (`layers · (P + rows · S) · hidden` floats saved), not with these cells; the
    /// budget keeps a pass's size, and so its memory, predictable. Splitting a group costs
    /// time: each pass runs the prompt again (the old default of 300,000, set when the whole
    /// graph was held, split a group of 128-token answers into three passes).
    pub micro_batch_cells: usize,
    /// Optimizer steps per batch of samples (μ, default 1: on-policy).
    pub inner_steps: usize,
}

impl Default for LlmGrpoConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-4,
            weight_decay: 0.0,
            clip_low: 0.2,
            clip_high: 0.28,
            kl_beta: 0.0,
            max_grad_norm: 1.0,
            micro_batch: 8,
            micro_batch_cells: 2_500_000,
            inner_steps: 1,
        }
    }
}

impl LlmGrpoConfig {
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
        if !(self.clip_low > 0.0 && self.clip_low < 1.0) {
            return bad("clip_low", "must be in (0, 1)");
        }
        if !(self.clip_high > 0.0 && self.clip_high.is_finite()) {
            return bad("clip_high", "must be positive");
        }
        if !(self.kl_beta >= 0.0 && self.kl_beta.is_finite()) {
            return bad("kl_beta", "must be ≥ 0");
        }
        if self.inner_steps == 0 {
            return bad("inner_steps", "must be at least 1");
        }
        Ok(())
    }
}

/// The ranges every LoRA update shares (GRPO's and SFT's): a positive learning rate, a
/// weight decay ≥ 0, a positive clipping norm, and micro-batch budgets of at least 1.
///
/// # Errors
/// [`TrainError::Config`] naming the first bad field.
pub(crate) fn check_update_settings(
    learning_rate: f64,
    weight_decay: f64,
    max_grad_norm: f64,
    micro_batch: usize,
    micro_batch_cells: usize,
) -> Result<(), TrainError> {
    let bad = |f: &str, why: &str| Err(TrainError::Config(format!("{f} {why}")));
    if !(learning_rate > 0.0 && learning_rate.is_finite()) {
        return bad("learning_rate", "must be a positive number");
    }
    if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
        return bad("weight_decay", "must be ≥ 0");
    }
    if max_grad_norm.is_nan() || max_grad_norm <= 0.0 {
        return bad("max_grad_norm", "must be positive");
    }
    if micro_batch == 0 {
        return bad("micro_batch", "must be at least 1");
    }
    if micro_batch_cells == 0 {
        return bad("micro_batch_cells", "must be at least 1");
    }
    Ok(())
}

/// One training sequence: a prompt, then one or more responses (merged calls) with the context
/// between them. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenSample {
    /// The rollout it came from.
    pub rollout_id: String,
    /// The GRPO group (the task) it belongs to.
    pub group: String,
    /// Every token: the first prompt, then responses and the context between them.
    pub tokens: Vec<u32>,
    /// Tokens before the first response token (the first call's prompt).
    pub prompt_len: usize,
    /// Per token after the prompt (`tokens.len() − prompt_len` entries): trained (a response
    /// token the policy chose) or not (loss mask 0: context, or a response token a constraint
    /// forced).
    pub loss_mask: Vec<bool>,
    /// Per token after the prompt: the sampler's log-probability of a response token (0.0
    /// for context tokens).
    pub old_logprobs: Vec<f32>,
    /// The reward this sample is trained on.
    pub reward: f64,
    /// Its group-relative advantage (set by [`assign_advantages`]).
    pub advantage: f64,
    /// The agent role of each merged call (the triplet's `agent_name`), in order.
    pub roles: Vec<String>,
    /// The model or adapter that answered each merged call (`agl.adapter`), in order.
    pub adapters: Vec<Option<String>>,
    /// Response tokens a constraint forced (`response.forced_positions`), masked out of the
    /// loss (see the module docs); 0 in samples written before it existed.
    #[serde(default)]
    pub forced_tokens: usize,
}

impl TokenSample {
    /// Response tokens trained on.
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }
}

fn malformed(rollout_id: &str, message: String) -> TrainError {
    TrainError::Rollout {
        rollout_id: rollout_id.to_string(),
        message,
    }
}

fn token_array(v: Option<&Value>, rollout_id: &str, what: &str) -> Result<Vec<u32>, TrainError> {
    let arr = v
        .and_then(Value::as_array)
        .ok_or_else(|| malformed(rollout_id, format!("{what} is not an array of token ids")))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| malformed(rollout_id, format!("{what} holds {x}, not a token id")))
        })
        .collect()
}

/// One call's token ids and log-probabilities, read from a triplet.
struct Call {
    prompt: Vec<u32>,
    response: Vec<u32>,
    logprobs: Vec<f32>,
    /// Per response token: forced by a constraint.
    forced: Vec<bool>,
    reward: Option<f64>,
    role: String,
    adapter: Option<String>,
}

impl Call {
    /// The loss mask of the response tokens: true where the policy chose the token.
    fn loss_mask(&self) -> impl Iterator<Item = bool> + '_ {
        self.forced.iter().map(|f| !f)
    }

    fn forced_tokens(&self) -> usize {
        self.forced.iter().filter(|f| **f).count()
    }
}

/// `response.forced_positions` as one flag per response token (absent or `null`: none
/// forced).
fn forced_flags(t: &Triplet, n: usize, rollout_id: &str) -> Result<Vec<bool>, TrainError> {
    let mut forced = vec![false; n];
    let Some(v) = t.response.get("forced_positions").filter(|v| !v.is_null()) else {
        return Ok(forced);
    };
    let positions = v.as_array().ok_or_else(|| {
        malformed(
            rollout_id,
            "response.forced_positions is not an array of positions".into(),
        )
    })?;
    for x in positions {
        let slot = x
            .as_u64()
            .and_then(|p| usize::try_from(p).ok())
            .and_then(|p| forced.get_mut(p))
            .ok_or_else(|| {
                malformed(
                    rollout_id,
                    format!(
                        "response.forced_positions holds {x}, not a position among {n} response tokens"
                    ),
                )
            })?;
        *slot = true;
    }
    Ok(forced)
}

fn read_call(t: &Triplet, rollout_id: &str) -> Result<Call, TrainError> {
    let prompt = token_array(t.prompt.get("token_ids"), rollout_id, "prompt.token_ids")?;
    let response = token_array(
        t.response.get("token_ids"),
        rollout_id,
        "response.token_ids",
    )?;
    if prompt.is_empty() || response.is_empty() {
        return Err(malformed(
            rollout_id,
            "a call without prompt or response token ids cannot be trained".into(),
        ));
    }
    let logprobs: Vec<f32> = t
        .response
        .get("logprobs_values")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            malformed(
                rollout_id,
                "response.logprobs_values is missing: the call has no recorded log-probabilities"
                    .into(),
            )
        })?
        .iter()
        .map(|x| {
            x.as_f64()
                .filter(|f| f.is_finite() && *f <= 1e-6)
                .map(|f| f.min(0.0) as f32)
                .ok_or_else(|| malformed(rollout_id, format!("log-probability {x} is invalid")))
        })
        .collect::<Result<_, _>>()?;
    if logprobs.len() != response.len() {
        return Err(malformed(
            rollout_id,
            format!(
                "{} log-probabilities for {} response tokens",
                logprobs.len(),
                response.len()
            ),
        ));
    }
    let forced = forced_flags(t, response.len(), rollout_id)?;
    let meta_str = |k: &str| {
        t.metadata
            .get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok(Call {
        prompt,
        response,
        logprobs,
        forced,
        reward: t.reward.filter(|r| r.is_finite()),
        role: meta_str("agent_name").unwrap_or_else(|| "*".into()),
        adapter: meta_str("adapter"),
    })
}

/// The training samples of one rollout (see the module docs): `triplets` in call order,
/// `group` the task key, `rollout_reward` the rollout's final reward.
///
/// # Errors
/// [`TrainError::Rollout`] when a triplet lacks token ids or log-probabilities (use
/// the adapter's `adapt_for_training`, which refuses such calls first).
pub fn samples_from_triplets(
    rollout_id: &str,
    group: &str,
    triplets: &[Triplet],
    rollout_reward: f64,
) -> Result<Vec<TokenSample>, TrainError> {
    let mut out: Vec<TokenSample> = Vec::new();
    let mut current: Option<(TokenSample, Option<f64>)> = None;
    // The nearest reward of a call after each call (carried backwards), else the rollout's.
    let mut later = vec![rollout_reward; triplets.len()];
    let mut next = rollout_reward;
    let mut fallback = rollout_reward;
    for (i, t) in triplets.iter().enumerate().rev() {
        later[i] = next;
        if let Some(r) = t.reward.filter(|r| r.is_finite()) {
            next = r;
        }
    }
    for (i, t) in triplets.iter().enumerate() {
        let call = read_call(t, rollout_id)?;
        let continues = current
            .as_ref()
            .is_some_and(|(s, _)| call.prompt.starts_with(&s.tokens));
        if continues && let Some((s, last_reward)) = current.as_mut() {
            let context = call.prompt.len() - s.tokens.len();
            s.tokens.extend_from_slice(&call.prompt[s.tokens.len()..]);
            s.loss_mask.extend(std::iter::repeat_n(false, context));
            s.old_logprobs.extend(std::iter::repeat_n(0.0, context));
            s.tokens.extend_from_slice(&call.response);
            s.loss_mask.extend(call.loss_mask());
            s.forced_tokens += call.forced_tokens();
            s.old_logprobs.extend_from_slice(&call.logprobs);
            s.roles.push(call.role);
            s.adapters.push(call.adapter);
            *last_reward = call.reward;
            fallback = later[i];
            continue;
        }
        if let Some((s, r)) = current.take() {
            out.push(finish(s, r, fallback));
        }
        fallback = later[i];
        let mut tokens = call.prompt.clone();
        tokens.extend_from_slice(&call.response);
        current = Some((
            TokenSample {
                rollout_id: rollout_id.to_string(),
                group: group.to_string(),
                prompt_len: call.prompt.len(),
                tokens,
                loss_mask: call.loss_mask().collect(),
                forced_tokens: call.forced_tokens(),
                old_logprobs: call.logprobs,
                reward: 0.0,
                advantage: 0.0,
                roles: vec![call.role],
                adapters: vec![call.adapter],
            },
            call.reward,
        ));
    }
    if let Some((s, r)) = current.take() {
        out.push(finish(s, r, fallback));
    }
    Ok(out)
}

fn finish(mut s: TokenSample, call_reward: Option<f64>, carried: f64) -> TokenSample {
    s.reward = call_reward.unwrap_or(carried);
    s
}

/// Sets every sample's advantage from its group's rollout rewards (see the module docs).
/// `rollout_rewards` maps each rollout id to its final reward; a group's mean and standard
/// deviation are taken over its rollouts (one value each), whatever number of samples each
/// rollout produced.
pub fn assign_advantages(samples: &mut [TokenSample], rollout_rewards: &HashMap<String, f64>) {
    let mut groups: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for s in samples.iter() {
        if seen.insert(s.rollout_id.as_str())
            && let Some(r) = rollout_rewards.get(&s.rollout_id)
        {
            groups.entry(s.group.as_str()).or_default().push(*r);
        }
    }
    let stats: HashMap<String, (f64, f64)> = groups
        .into_iter()
        .map(|(g, rs)| {
            let n = rs.len().max(1) as f64;
            let mean = rs.iter().sum::<f64>() / n;
            let var = rs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
            (g.to_string(), (mean, var.sqrt()))
        })
        .collect();
    for s in samples.iter_mut() {
        s.advantage = match stats.get(&s.group) {
            Some(&(mean, std)) if std >= 1e-8 => (s.reward - mean) / (std + 1e-6),
            _ => 0.0,
        };
    }
}

/// What one update did. JSON fields as named.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LlmStepStats {
    /// Samples given.
    pub samples: usize,
    /// Samples trained on (non-zero advantage).
    pub trained_samples: usize,
    /// Loss tokens trained on.
    pub loss_tokens: usize,
    /// Forced response tokens of the trained samples, left out of the loss (not in
    /// `loss_tokens`; see the module docs).
    #[serde(default)]
    pub forced_tokens: usize,
    /// Loss of the last inner step (token mean).
    pub loss: f64,
    /// Mean per-token k3 KL to the base model (0 when β = 0: not computed).
    pub kl: f64,
    /// Global gradient norm before clipping (last inner step).
    pub grad_norm: f64,
    /// Share of loss tokens whose ratio was clipped (last inner step).
    pub clip_fraction: f64,
    /// Largest `|ratio − 1|` over the loss tokens of the first inner step: how far the
    /// trainer's recomputed log-probabilities are from the sampler's.
    pub first_ratio_max_dev: f64,
    /// Seconds of the forward passes and the loss (all inner steps).
    #[serde(default)]
    pub forward_seconds: f64,
    /// Seconds of the backward passes and the gradient accumulation.
    #[serde(default)]
    pub backward_seconds: f64,
    /// Seconds spent in forward and backward passes and the optimizer (the whole update,
    /// micro-batch assembly, clipping and AdamW included).
    pub seconds: f64,
}

/// The LoRA GRPO learner: the frozen base model, the trainable adapter and AdamW.
pub struct LlmGrpo {
    config: LlmGrpoConfig,
    lora: LoraParams,
}

impl std::fmt::Debug for LlmGrpo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmGrpo")
            .field("config", &self.config)
            .field("parameters", &self.lora.adapter.num_parameters())
            .finish_non_exhaustive()
    }
}

/// One forward/backward pass: a shared prompt and the continuations of the samples that
/// share it, right-padded to the same length.
pub(crate) struct MicroBatch {
    /// `[1, P]`.
    pub(crate) prefix: Tensor,
    /// `[g, S]`.
    pub(crate) suffixes: Tensor,
    /// `[g, S]`: the sampler's log-probabilities (0 where masked).
    pub(crate) old: Tensor,
    /// `[g, S]`: 1 for trained tokens.
    pub(crate) mask: Tensor,
    /// `[g, 1]`.
    pub(crate) adv: Tensor,
}

/// The continuation of a sample: its tokens after the prompt.
fn continuation(s: &TokenSample) -> usize {
    s.tokens.len() - s.prompt_len
}

/// Samples grouped by identical prompt (a GRPO group's G answers share one), in first-seen
/// order; each group's samples by ascending continuation length, cut into runs of at most
/// `max_rows` samples and `max_cells` attention cells (`P² + rows · S · (P + S)`; a sample
/// over budget on its own goes alone).
pub(crate) fn chunk_by_prompt<'a>(
    samples: &[&'a TokenSample],
    max_rows: usize,
    max_cells: usize,
) -> Vec<Vec<&'a TokenSample>> {
    let mut groups: Vec<Vec<&'a TokenSample>> = Vec::new();
    let mut index: HashMap<&'a [u32], usize> = HashMap::new();
    for &s in samples {
        let key = &s.tokens[..s.prompt_len];
        let i = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(s);
    }
    let mut out = Vec::new();
    for mut g in groups {
        g.sort_by_key(|s| continuation(s));
        let mut run: Vec<&'a TokenSample> = Vec::new();
        for s in g {
            let rows = run.len() + 1;
            let (p, n) = (s.prompt_len, continuation(s));
            let cells = p * p + rows * n * (p + n);
            if !run.is_empty() && (rows > max_rows || cells > max_cells) {
                out.push(std::mem::take(&mut run));
            }
            run.push(s);
        }
        if !run.is_empty() {
            out.push(run);
        }
    }
    out
}

/// The tensors of one pass over `samples` (which share their prompt: [`chunk_by_prompt`]).
///
/// # Errors
/// [`TrainError::Config`] for an empty run or a sample without prompt or response tokens.
pub(crate) fn micro_batch(
    device: &candle_core::Device,
    samples: &[&TokenSample],
) -> Result<MicroBatch, TrainError> {
    let Some(first) = samples.first() else {
        return Err(TrainError::Config("an empty micro-batch".into()));
    };
    let p = first.prompt_len;
    let n = samples.iter().map(|s| continuation(s)).max().unwrap_or(0);
    if p == 0 || n == 0 {
        return Err(TrainError::Config(
            "a sample needs prompt tokens and response tokens after them".into(),
        ));
    }
    let g = samples.len();
    let mut suffixes = vec![0u32; g * n];
    let mut old = vec![0f32; g * n];
    let mut mask = vec![0f32; g * n];
    let mut adv = vec![0f32; g];
    for (i, s) in samples.iter().enumerate() {
        let cont = &s.tokens[s.prompt_len..];
        suffixes[i * n..i * n + cont.len()].copy_from_slice(cont);
        // Right padding repeats the last token; the causal mask keeps it from touching the
        // positions that count, and its positions have mask 0.
        if let Some(&last) = cont.last() {
            for x in &mut suffixes[i * n + cont.len()..(i + 1) * n] {
                *x = last;
            }
        }
        for (k, (&m, &lp)) in s.loss_mask.iter().zip(&s.old_logprobs).enumerate() {
            mask[i * n + k] = if m { 1.0 } else { 0.0 };
            old[i * n + k] = lp;
        }
        adv[i] = s.advantage as f32;
    }
    Ok(MicroBatch {
        prefix: Tensor::new(&first.tokens[..p], device)?.unsqueeze(0)?,
        suffixes: Tensor::from_vec(suffixes, (g, n), device)?,
        old: Tensor::from_vec(old, (g, n), device)?,
        mask: Tensor::from_vec(mask, (g, n), device)?,
        adv: Tensor::from_vec(adv, (g, 1), device)?,
    })
}

/// What every LoRA learner (GRPO's, SFT's) updates: the frozen dense base model, the adapter
/// whose factors are the variables, and AdamW over them.
pub(crate) struct LoraParams {
    /// The base model (dense).
    pub(crate) model: Arc<LlamaModel>,
    /// The adapter being trained (its factors change in place at each update).
    pub(crate) adapter: LoraAdapter,
    vars: Vec<Var>,
    optimizer: AdamW,
}

impl LoraParams {
    /// AdamW over `adapter`'s variables `vars` on `model`, which must be dense.
    ///
    /// # Errors
    /// [`TrainError::Config`] for a quantized model (no gradient flows through quantized
    /// weights, and the sampler's log-probabilities would not be the ones training
    /// recomputes); candle's.
    pub(crate) fn new(
        model: Arc<LlamaModel>,
        adapter: LoraAdapter,
        vars: Vec<Var>,
        learning_rate: f64,
        weight_decay: f64,
    ) -> Result<Self, TrainError> {
        if !model.is_dense() {
            return Err(TrainError::Config(
                "training needs the dense (f32) weights: start the engine with --weights dense"
                    .into(),
            ));
        }
        let optimizer = AdamW::new(
            vars.clone(),
            ParamsAdamW {
                lr: learning_rate,
                weight_decay,
                ..ParamsAdamW::default()
            },
        )?;
        Ok(Self {
            model,
            adapter,
            vars,
            optimizer,
        })
    }

    /// The adapted model's log-probabilities of `mb`'s continuations (`[g, S]`, detached),
    /// `loss` of them, and its gradient in the adapter's factors, computed with activation
    /// checkpointing ([`LlamaModel::prefixed_logprobs_backward`]): memory bounded by one
    /// layer's pieces, not by the whole graph.
    ///
    /// # Errors
    /// The closure's and tensor errors.
    pub(crate) fn backward(
        &self,
        mb: &MicroBatch,
        loss: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<LogprobGradients, TrainError> {
        Ok(self
            .model
            .prefixed_logprobs_backward(&mb.prefix, &mb.suffixes, &self.adapter, loss)?)
    }

    /// Adds `grads` into `acc` for every variable (the sum over micro-batches).
    ///
    /// # Errors
    /// Tensor errors.
    pub(crate) fn accumulate(
        &self,
        acc: Option<GradStore>,
        grads: GradStore,
    ) -> Result<GradStore, TrainError> {
        let Some(mut a) = acc else {
            return Ok(grads);
        };
        for v in &self.vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                let sum = match a.get(v.as_tensor()) {
                    Some(prev) => (prev + g)?,
                    None => g.clone(),
                };
                a.insert(v.as_tensor(), sum);
            }
        }
        Ok(a)
    }

    /// Clips `grads` to the global L2 norm `max_norm` and takes one AdamW step; returns the
    /// norm before clipping.
    ///
    /// # Errors
    /// [`TrainError::Config`] when the norm is not finite (the update is not applied);
    /// tensor errors.
    pub(crate) fn apply(&mut self, mut grads: GradStore, max_norm: f64) -> Result<f64, TrainError> {
        let norm = clip_grad_norm(&mut grads, &self.vars, max_norm)?;
        if !norm.is_finite() {
            return Err(TrainError::Config(format!(
                "the gradient norm is {norm}: the update was not applied"
            )));
        }
        self.optimizer.step(&grads)?;
        Ok(norm)
    }
}

impl LlmGrpo {
    /// A learner for `adapter` (its variables `vars`, as [`LoraAdapter::new_trainable`] or
    /// [`LoraAdapter::into_trainable`] return them) on `model`, which must be dense.
    ///
    /// # Errors
    /// [`TrainError::Config`] for a bad configuration or a quantized model (no gradient flows
    /// through quantized weights, and the sampler's log-probabilities would not be the ones
    /// training recomputes).
    pub fn new(
        model: Arc<LlamaModel>,
        adapter: LoraAdapter,
        vars: Vec<Var>,
        config: LlmGrpoConfig,
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
    pub fn config(&self) -> &LlmGrpoConfig {
        &self.config
    }

    /// The adapter being trained (its factors change in place at each step; hand the engine
    /// a [`LoraAdapter::snapshot`]).
    pub fn adapter(&self) -> &LoraAdapter {
        &self.lora.adapter
    }

    /// One update on `samples` (advantages set; see the module docs).
    ///
    /// # Errors
    /// Tensor errors and [`TrainError::Config`] for samples the model cannot take.
    pub fn step(&mut self, samples: &[TokenSample]) -> Result<LlmStepStats, TrainError> {
        let started = Instant::now();
        let kept: Vec<&TokenSample> = samples
            .iter()
            .filter(|s| s.advantage != 0.0 && s.loss_tokens() > 0)
            .collect();
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
        let batches: Vec<MicroBatch> = chunk_by_prompt(
            &kept,
            self.config.micro_batch,
            self.config.micro_batch_cells,
        )
        .iter()
        .map(|c| micro_batch(self.lora.model.device(), c))
        .collect::<Result<_, _>>()?;
        let denom = total_tokens as f64;
        let (lo, hi) = (1.0 - self.config.clip_low, 1.0 + self.config.clip_high);
        let beta = self.config.kl_beta;
        for inner in 0..self.config.inner_steps {
            let mut acc: Option<GradStore> = None;
            let (mut loss_sum, mut kl_sum, mut clipped, mut max_dev) = (0f64, 0f64, 0f64, 0f64);
            for mb in &batches {
                let reference = if beta > 0.0 {
                    let started = Instant::now();
                    let r = self.lora.model.prefixed_logprobs_detached(
                        &mb.prefix,
                        &mb.suffixes,
                        None,
                    )?;
                    stats.forward_seconds += started.elapsed().as_secs_f64();
                    Some(r)
                } else {
                    None
                };
                let out = self.lora.backward(mb, |new| {
                    let ratio = (new - &mb.old)?.exp()?;
                    let surr1 = ratio.broadcast_mul(&mb.adv)?;
                    let surr2 = ratio.clamp(lo, hi)?.broadcast_mul(&mb.adv)?;
                    let mut per_token = surr1.minimum(&surr2)?.neg()?;
                    if let Some(reference) = &reference {
                        per_token = (per_token + (k3(reference, new)? * beta)?)?;
                    }
                    (per_token * &mb.mask)?.sum_all()? / denom
                })?;
                stats.forward_seconds += out.forward_seconds;
                stats.backward_seconds += out.backward_seconds;
                loss_sum += f64::from(out.loss.to_scalar::<f32>()?);
                if let Some(reference) = &reference {
                    let k = k3(reference, &out.logprobs)?;
                    kl_sum += f64::from((k * &mb.mask)?.sum_all()?.to_scalar::<f32>()?);
                }
                let r = (&out.logprobs - &mb.old)?.exp()?;
                let outside =
                    (r.lt(lo)?.to_dtype(DType::F32)? + r.gt(hi)?.to_dtype(DType::F32)?)?;
                clipped += f64::from((outside * &mb.mask)?.sum_all()?.to_scalar::<f32>()?);
                if inner == 0 {
                    let dev = ((r - 1.0)?.abs()? * &mb.mask)?
                        .flatten_all()?
                        .max(0)?
                        .to_scalar::<f32>()?;
                    max_dev = max_dev.max(f64::from(dev));
                }
                acc = Some(self.lora.accumulate(acc, out.grads)?);
            }
            let Some(grads) = acc else { break };
            let norm = self.lora.apply(grads, self.config.max_grad_norm)?;
            stats.loss = loss_sum;
            stats.kl = kl_sum / denom;
            stats.grad_norm = norm;
            stats.clip_fraction = clipped / denom;
            if inner == 0 {
                stats.first_ratio_max_dev = max_dev;
            }
        }
        stats.seconds = started.elapsed().as_secs_f64();
        Ok(stats)
    }
}

/// The k3 estimator of KL(new ‖ reference) per token: `exp(ref − new) − (ref − new) − 1`
/// (Schulman 2020), `[g, S]`.
fn k3(reference: &Tensor, new: &Tensor) -> candle_core::Result<Tensor> {
    let d = (reference - new)?;
    (d.exp()? - &d)? - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn triplet(prompt: &[u32], response: &[u32], reward: Option<f64>, role: &str) -> Triplet {
        let lps: Vec<f64> = response.iter().map(|&t| -0.1 * f64::from(t)).collect();
        let mut metadata = serde_json::Map::new();
        metadata.insert("agent_name".into(), json!(role));
        metadata.insert("adapter".into(), json!("policy-v0"));
        Triplet {
            prompt: json!({"token_ids": prompt}),
            response: json!({"token_ids": response, "logprobs_values": lps}),
            reward,
            metadata,
        }
    }

    #[test]
    fn a_continuing_prompt_merges_calls_and_masks_the_context() {
        // call 1: prompt [1 2 3], response [4 5]; call 2's prompt repeats both, adds [6 7]
        // (a tool result), response [8].
        let ts = vec![
            triplet(&[1, 2, 3], &[4, 5], None, "write"),
            triplet(&[1, 2, 3, 4, 5, 6, 7], &[8], Some(0.5), "rewrite"),
        ];
        let s = samples_from_triplets("ro-1", "q1", &ts, 1.0).unwrap();
        assert_eq!(s.len(), 1);
        let s = &s[0];
        assert_eq!(s.tokens, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(s.prompt_len, 3);
        assert_eq!(s.loss_mask, vec![true, true, false, false, true]);
        assert_eq!(s.old_logprobs, vec![-0.4, -0.5, 0.0, 0.0, -0.8]);
        assert_eq!(s.roles, vec!["write", "rewrite"]);
        // the reward matched to the last merged call wins over the rollout's
        assert_eq!(s.reward, 0.5);
        assert_eq!(s.loss_tokens(), 3);
    }

    #[test]
    fn a_fresh_prompt_starts_a_new_sample_with_the_rollout_reward() {
        let ts = vec![
            triplet(&[1, 2, 3], &[4, 5], Some(0.25), "write"),
            triplet(&[9, 9], &[6], None, "check"),
            triplet(&[1, 2], &[3], None, "rewrite"),
        ];
        let s = samples_from_triplets("ro-1", "q1", &ts, 1.0).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].reward, 0.25, "an intermediate reward goes to its call");
        assert_eq!(s[1].reward, 1.0);
        assert_eq!(s[2].tokens, vec![1, 2, 3]);
        assert_eq!(s[2].roles, vec!["rewrite"]);
        // A call without a reward gets the nearest later one, carried backwards.
        let ts = vec![
            triplet(&[1], &[2], None, "write"),
            triplet(&[7], &[8], Some(0.25), "check"),
            triplet(&[9], &[6], None, "rewrite"),
        ];
        let s = samples_from_triplets("ro-1", "q1", &ts, 1.0).unwrap();
        let r: Vec<f64> = s.iter().map(|x| x.reward).collect();
        assert_eq!(r, [0.25, 0.25, 1.0]);
    }

    #[test]
    fn the_identical_prompt_twice_is_two_samples() {
        // The same prompt again (a retry) is not a continuation: it does not hold the first
        // response.
        let ts = vec![
            triplet(&[1, 2], &[3], None, "write"),
            triplet(&[1, 2], &[4], None, "write"),
        ];
        let s = samples_from_triplets("ro-1", "q1", &ts, 0.0).unwrap();
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn calls_without_ids_or_logprobs_are_refused_by_name() {
        let mut t = triplet(&[1], &[2], None, "write");
        t.response = json!({"token_ids": [2]});
        let e = samples_from_triplets("ro-9", "q", &[t], 0.0).unwrap_err();
        assert!(e.to_string().contains("logprobs_values"), "{e}");
        assert!(e.to_string().contains("ro-9"), "{e}");
        let mut t = triplet(&[1], &[2], None, "write");
        t.prompt = json!({"token_ids": ["a"]});
        let e = samples_from_triplets("ro-9", "q", &[t], 0.0).unwrap_err();
        assert!(e.to_string().contains("prompt.token_ids"), "{e}");
        let mut t = triplet(&[1], &[2, 3], None, "write");
        t.response = json!({"token_ids": [2, 3], "logprobs_values": [-0.1]});
        let e = samples_from_triplets("ro-9", "q", &[t], 0.0).unwrap_err();
        assert!(e.to_string().contains("1 log-probabilities for 2"), "{e}");
    }

    #[test]
    fn forced_positions_get_loss_mask_zero_and_nothing_else_changes() {
        // call 1: prompt [1 2 3], response [4 5 6] with 5 forced; call 2 continues with a tool
        // result [7] and response [8 9] with 9 forced (positions count from each response).
        let forced = |mut t: Triplet, p: Value| {
            t.response["forced_positions"] = p;
            t
        };
        let plain = vec![
            triplet(&[1, 2, 3], &[4, 5, 6], None, "write"),
            triplet(&[1, 2, 3, 4, 5, 6, 7], &[8, 9], None, "write"),
        ];
        let constrained = vec![
            forced(plain[0].clone(), json!([1])),
            forced(plain[1].clone(), json!([1])),
        ];
        let a = &samples_from_triplets("ro-1", "q", &plain, 1.0).unwrap()[0];
        let b = &samples_from_triplets("ro-1", "q", &constrained, 1.0).unwrap()[0];
        assert_eq!(a.loss_mask, vec![true, true, true, false, true, true]);
        assert_eq!(b.loss_mask, vec![true, false, true, false, true, false]);
        assert_eq!((a.forced_tokens, b.forced_tokens), (0, 2));
        assert_eq!((a.loss_tokens(), b.loss_tokens()), (5, 3));
        // Tokens and recorded log-probabilities are untouched: only the mask differs.
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.old_logprobs, b.old_logprobs);
        let differ: Vec<usize> = (0..a.loss_mask.len())
            .filter(|&k| a.loss_mask[k] != b.loss_mask[k])
            .collect();
        assert_eq!(differ, vec![1, 5]);
        // `null` and an empty list are no positions; so is a triplet written before the field.
        let none = forced(plain[0].clone(), Value::Null);
        let empty = forced(plain[0].clone(), json!([]));
        for t in [none, empty] {
            let s = samples_from_triplets("ro-1", "q", &[t], 1.0).unwrap();
            assert_eq!(s[0].loss_mask, vec![true; 3]);
        }
        // A sample serialized before `forced_tokens` existed still loads.
        let mut old = serde_json::to_value(a).unwrap();
        old.as_object_mut().unwrap().remove("forced_tokens");
        let back: TokenSample = serde_json::from_value(old).unwrap();
        assert_eq!(back.forced_tokens, 0);
    }

    #[test]
    fn bad_forced_positions_are_refused_by_name() {
        for bad in [
            json!([3]),
            json!([-1]),
            json!([0.5]),
            json!("0"),
            json!({"0": 1}),
        ] {
            let mut t = triplet(&[1], &[2, 3, 4], None, "write");
            t.response["forced_positions"] = bad.clone();
            let e = samples_from_triplets("ro-9", "q", &[t], 0.0).unwrap_err();
            assert!(e.to_string().contains("forced_positions"), "{bad}: {e}");
            assert!(e.to_string().contains("ro-9"), "{e}");
        }
    }

    #[test]
    fn advantages_are_group_relative_over_rollouts() {
        let mk = |ro: &str, g: &str, r: f64| TokenSample {
            rollout_id: ro.into(),
            group: g.into(),
            tokens: vec![1, 2],
            prompt_len: 1,
            loss_mask: vec![true],
            old_logprobs: vec![-1.0],
            reward: r,
            advantage: 9.0,
            roles: vec![],
            adapters: vec![],
            forced_tokens: 0,
        };
        // group a: rollouts with rewards 1 and 0 (rollout a1 has two samples); group b: all
        // equal.
        let mut s = vec![
            mk("a1", "a", 1.0),
            mk("a1", "a", 1.0),
            mk("a2", "a", 0.0),
            mk("b1", "b", 0.5),
            mk("b2", "b", 0.5),
        ];
        let rewards: HashMap<String, f64> = [("a1", 1.0), ("a2", 0.0), ("b1", 0.5), ("b2", 0.5)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assign_advantages(&mut s, &rewards);
        let adv: Vec<f64> = s.iter().map(|x| x.advantage).collect();
        // mean 0.5, std 0.5 over the two rollouts (not the three samples)
        assert!(
            (adv[0] - 1.0).abs() < 1e-5 && (adv[1] - 1.0).abs() < 1e-5,
            "{adv:?}"
        );
        assert!((adv[2] + 1.0).abs() < 1e-5, "{adv:?}");
        assert_eq!(&adv[3..], &[0.0, 0.0]);
    }

    #[test]
    fn micro_batches_share_a_prompt_and_respect_the_budgets() {
        let mk = |prompt: &[u32], n: usize| TokenSample {
            rollout_id: "r".into(),
            group: "g".into(),
            tokens: prompt
                .iter()
                .copied()
                .chain(std::iter::repeat_n(7, n))
                .collect(),
            prompt_len: prompt.len(),
            loss_mask: vec![true; n],
            old_logprobs: vec![0.0; n],
            reward: 0.0,
            advantage: 1.0,
            roles: vec![],
            adapters: vec![],
            forced_tokens: 0,
        };
        let (a, b) = ([1u32, 2, 3], [4u32, 5]);
        let samples = [
            mk(&a, 300),
            mk(&b, 10),
            mk(&a, 100),
            mk(&a, 250),
            mk(&a, 200),
            mk(&a, 900),
            mk(&a, 2000),
        ];
        let refs: Vec<&TokenSample> = samples.iter().collect();
        // cells with P = 3: 9 + rows · S · (3 + S)
        let runs = chunk_by_prompt(&refs, 8, 200_000);
        let shape: Vec<(usize, Vec<usize>)> = runs
            .iter()
            .map(|r| (r[0].prompt_len, r.iter().map(|s| continuation(s)).collect()))
            .collect();
        // prompt a first (first seen): 100, 200, 250 → 9 + 3·250·253 = 189,759; with 300:
        // 9 + 4·300·303 = 363,609 > 200,000; 900 and 2,000 are over budget alone; prompt b
        // apart.
        assert_eq!(
            shape,
            vec![
                (3, vec![100, 200, 250]),
                (3, vec![300]),
                (3, vec![900]),
                (3, vec![2000]),
                (2, vec![10]),
            ]
        );
        let runs = chunk_by_prompt(&refs[..3], 1, 100_000);
        assert_eq!(runs.len(), 3, "at most one row per pass");
    }

    #[test]
    fn config_ranges_are_checked_by_field() {
        let bad = LlmGrpoConfig {
            micro_batch: 0,
            ..LlmGrpoConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("micro_batch")
        );
        let bad = LlmGrpoConfig {
            clip_low: 1.5,
            ..LlmGrpoConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("clip_low"));
        assert!(LlmGrpoConfig::default().validate().is_ok());
    }
}
