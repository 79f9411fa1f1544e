//! Sampling parameters and the choice of one next token from one row of logits: greedy at
//! temperature 0, otherwise temperature, top-k and top-p (nucleus, Holtzman et al. 2019)
//! truncation, with OpenAI's presence and frequency penalties.
//!
//! The log-probability reported for a token is always that of the **raw** model distribution
//! (`log_softmax(logits)`, temperature 1, no truncation, no penalties), as vLLM reports by
//! default (`logprobs_mode = raw_logprobs`): it is exactly what a teacher-forced training
//! forward recomputes, so a PPO/GRPO ratio starts at 1. With temperature 1 and no truncation it
//! is also the behaviour policy's probability.
//!
//! [`sample_masked`] is the same choice restricted to the tokens a constraint allows
//! ([`crate::structured`]); it reports the same raw log-probability.
//!
//! Not responsible for batching, stop strings or decoding text ([`crate::engine`]), or for
//! computing a constraint's mask ([`crate::structured`]).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{LlmError, Result};

/// Most alternatives per position that `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How to sample, per request. Field names and ranges follow OpenAI's API (and vLLM's
/// extensions `top_k`, `stop_token_ids`, `ignore_eos`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, `0..=2`; 0 is greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]`; 1 disables it.
    pub top_p: f32,
    /// Keep only the `k` most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Most new tokens per completion; `None` fills the context.
    pub max_tokens: Option<usize>,
    /// Strings that end a completion; the text stops before them (OpenAI), the token ids
    /// include the token that completed them.
    pub stop: Vec<String>,
    /// Token ids that end a completion (vLLM); included in the ids.
    pub stop_token_ids: Vec<u32>,
    /// Completions of this prompt, sampled together as one group.
    pub n: usize,
    /// Seed: the same seed, prompt and parameters give the same tokens. Completion `i` uses
    /// its own stream derived from `(seed, i)`.
    pub seed: Option<u64>,
    /// Report the log-probability of each sampled token, with this many most likely
    /// alternatives (0..=20); `None` reports none.
    pub logprobs: Option<usize>,
    /// Keep sampling after the end-of-sequence token (vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// OpenAI's presence penalty, `-2..=2`: subtracted once from tokens already generated.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, `-2..=2`: subtracted per previous occurrence.
    pub frequency_penalty: f32,
    /// Leave special tokens (`<|im_end|>`, …) out of the text (vLLM's `skip_special_tokens`,
    /// default true). The token ids always include them.
    pub skip_special_tokens: bool,
    /// A grammar every completion must follow (structured outputs); `None`: unconstrained.
    pub constraint: Option<crate::structured::Constraint>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            n: 1,
            seed: None,
            logprobs: None,
            ignore_eos: false,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the error names the parameter as OpenAI's API does.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=2.0).contains(&self.temperature) || self.temperature.is_nan() {
            return Err(LlmError::invalid(
                "temperature",
                format!("{} is not in [0, 2]", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(LlmError::invalid(
                "top_p",
                format!("{} is not in (0, 1]", self.top_p),
            ));
        }
        if self.n == 0 || self.n > 128 {
            return Err(LlmError::invalid(
                "n",
                format!("{} is not in [1, 128]", self.n),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(LlmError::invalid("max_tokens", "must be at least 1"));
        }
        if let Some(k) = self.logprobs
            && k > MAX_TOP_LOGPROBS
        {
            return Err(LlmError::invalid(
                "top_logprobs",
                format!("{k} is more than {MAX_TOP_LOGPROBS}"),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) || v.is_nan() {
                return Err(LlmError::invalid(name, format!("{v} is not in [-2, 2]")));
            }
        }
        if self.stop.len() > 16 || self.stop.iter().any(|s| s.is_empty()) {
            return Err(LlmError::invalid(
                "stop",
                "give at most 16 non-empty stop strings",
            ));
        }
        Ok(())
    }

    /// The random stream of completion `index`.
    pub fn rng(&self, index: usize) -> ChaCha8Rng {
        match self.seed {
            Some(seed) => {
                let mut r = ChaCha8Rng::seed_from_u64(seed);
                r.set_stream(index as u64);
                r
            }
            None => ChaCha8Rng::from_rng(&mut rand::rng()),
        }
    }
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Its raw log-probability (natural log).
    pub logprob: f32,
    /// The most likely tokens and their raw log-probabilities, best first (as many as asked).
    pub top: Vec<(u32, f32)>,
}

/// Chooses the next token from `logits` (`[vocab]`, raw). `counts[t]` is how often token `t`
/// was generated so far in this completion (for the penalties; may be empty when both
/// penalties are 0).
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    counts: &[u32],
    rng: &mut ChaCha8Rng,
) -> Result<Sampled> {
    if logits.is_empty() {
        return Err(LlmError::invalid("logits", "empty"));
    }
    // Raw log-softmax normaliser.
    let lse = log_sum_exp(logits);

    let penalised = params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
    let adjusted: std::borrow::Cow<'_, [f32]> = if penalised && !counts.is_empty() {
        let mut v = logits.to_vec();
        for (t, &c) in counts.iter().enumerate() {
            if c > 0
                && let Some(x) = v.get_mut(t)
            {
                *x -= params.presence_penalty + params.frequency_penalty * c as f32;
            }
        }
        std::borrow::Cow::Owned(v)
    } else {
        std::borrow::Cow::Borrowed(logits)
    };

    let token = if params.temperature == 0.0 {
        argmax(&adjusted)
    } else {
        draw(&adjusted, params, rng)
    };
    Ok(raw_report(logits, lse, token, params.logprobs))
}

/// Chooses the next token among `allowed` (ascending token ids, as a constraint's mask gives
/// them; ids past `logits` are ignored) with the same temperature, top-k, top-p and penalty
/// rules as [`sample`], applied to the allowed tokens only (the others have probability 0, as
/// vLLM applies a grammar's bitmask before its sampler). The reported log-probability and
/// alternatives stay those of the **raw**, unmasked distribution, as [`sample`] reports them.
///
/// The unconstrained path ([`sample`]) does not go through here and pays nothing for it.
///
/// # Errors
/// [`LlmError::Generation`] when no allowed id lies inside `logits`.
pub fn sample_masked(
    logits: &[f32],
    allowed: &[u32],
    params: &SamplingParams,
    counts: &[u32],
    rng: &mut ChaCha8Rng,
) -> Result<Sampled> {
    let ids: Vec<usize> = allowed
        .iter()
        .map(|&t| t as usize)
        .filter(|&t| t < logits.len())
        .collect();
    if ids.is_empty() {
        return Err(LlmError::Generation(
            "the constraint allows no token of the vocabulary".into(),
        ));
    }
    let penalised =
        (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0) && !counts.is_empty();
    // The allowed tokens' (penalised) logits, compacted: draw and argmax index into `ids`.
    let values: Vec<f32> = ids
        .iter()
        .map(|&t| match counts.get(t) {
            Some(&c) if penalised && c > 0 => {
                logits[t] - (params.presence_penalty + params.frequency_penalty * c as f32)
            }
            _ => logits[t],
        })
        .collect();
    let pick = if ids.len() == 1 {
        0
    } else if params.temperature == 0.0 {
        argmax(&values)
    } else {
        draw(&values, params, rng)
    };
    let token = ids[pick];
    let lse = log_sum_exp(logits);
    Ok(raw_report(logits, lse, token, params.logprobs))
}

/// `log(sum(exp(logits)))`, the raw log-softmax normaliser.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln()
}

/// `token` with its raw log-probability and, when asked, the `k` most likely alternatives.
fn raw_report(logits: &[f32], lse: f32, token: usize, logprobs: Option<usize>) -> Sampled {
    let top = match logprobs {
        Some(k) if k > 0 => top_k_indices(logits, k)
            .into_iter()
            .map(|i| (i as u32, logits[i] - lse))
            .collect(),
        _ => Vec::new(),
    };
    Sampled {
        token: token as u32,
        logprob: logits[token] - lse,
        top,
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Indices of the `k` largest values, largest first.
fn top_k_indices(v: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(v.len());
    let mut idx: Vec<usize> = (0..v.len()).collect();
    if k < v.len() {
        idx.select_nth_unstable_by(k, |&a, &b| v[b].total_cmp(&v[a]));
        idx.truncate(k);
    }
    idx.sort_unstable_by(|&a, &b| v[b].total_cmp(&v[a]));
    idx
}

fn draw(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> usize {
    let inv_t = 1.0 / params.temperature;
    // Candidates: all tokens, or the top k.
    let candidates: Vec<usize> = if params.top_k > 0 && params.top_k < logits.len() {
        top_k_indices(logits, params.top_k)
    } else if params.top_p < 1.0 {
        let mut all: Vec<usize> = (0..logits.len()).collect();
        all.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        all
    } else {
        Vec::new()
    };
    let full = candidates.is_empty();
    let count = if full { logits.len() } else { candidates.len() };
    let at = |j: usize| if full { j } else { candidates[j] };
    let max = (0..count)
        .map(|j| logits[at(j)])
        .fold(f32::NEG_INFINITY, f32::max);
    let mut weights: Vec<f32> = (0..count)
        .map(|j| ((logits[at(j)] - max) * inv_t).exp())
        .collect();
    let total: f32 = weights.iter().sum();
    let mut keep = count;
    if params.top_p < 1.0 && !full {
        // Candidates are sorted best first: keep the smallest prefix whose mass reaches top_p.
        let mut acc = 0.0;
        for (j, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= params.top_p {
                keep = j + 1;
                break;
            }
        }
        weights.truncate(keep);
    }
    let mass: f32 = weights.iter().sum();
    let mut u = rng.random::<f32>() * mass;
    for (j, w) in weights.iter().enumerate() {
        if u < *w {
            return at(j);
        }
        u -= w;
    }
    at(keep - 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_and_reports_raw_logprob() {
        let logits = [0.0f32, 2.0, 1.0];
        let p = SamplingParams {
            temperature: 0.0,
            logprobs: Some(2),
            ..Default::default()
        };
        let s = sample(&logits, &p, &[], &mut p.rng(0)).unwrap();
        assert_eq!(s.token, 1);
        let lse = (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((s.logprob - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn same_seed_same_tokens_and_streams_differ_per_index() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            seed: Some(7),
            ..Default::default()
        };
        let run = |index| {
            let mut rng = p.rng(index);
            (0..50)
                .map(|_| sample(&logits, &p, &[], &mut rng).unwrap().token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1));
    }

    #[test]
    fn top_k_and_top_p_never_sample_outside_the_nucleus() {
        let logits = [5.0f32, 4.9, 0.0, -1.0, -2.0];
        let p = SamplingParams {
            top_k: 2,
            seed: Some(1),
            ..Default::default()
        };
        let mut rng = p.rng(0);
        for _ in 0..200 {
            assert!(sample(&logits, &p, &[], &mut rng).unwrap().token < 2);
        }
        let p = SamplingParams {
            top_p: 0.5,
            seed: Some(1),
            ..Default::default()
        };
        let mut rng = p.rng(0);
        for _ in 0..200 {
            assert_eq!(sample(&logits, &p, &[], &mut rng).unwrap().token, 0);
        }
    }

    #[test]
    fn penalties_change_the_choice_not_the_reported_logprob() {
        let logits = [1.0f32, 0.9];
        let p = SamplingParams {
            temperature: 0.0,
            frequency_penalty: 1.0,
            ..Default::default()
        };
        let s = sample(&logits, &p, &[1, 0], &mut p.rng(0)).unwrap();
        assert_eq!(s.token, 1);
        let lse = (1f32.exp() + 0.9f32.exp()).ln();
        assert!((s.logprob - (0.9 - lse)).abs() < 1e-6);
    }

    #[test]
    fn a_mask_limits_the_choice_not_the_reported_logprob() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let lse = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        let greedy = SamplingParams {
            temperature: 0.0,
            logprobs: Some(2),
            ..Default::default()
        };
        let s = sample_masked(&logits, &[1, 3], &greedy, &[], &mut greedy.rng(0)).unwrap();
        assert_eq!(s.token, 1);
        assert!((s.logprob - (2.0 - lse)).abs() < 1e-6);
        // Alternatives come from the raw distribution, masked tokens included.
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1]);
        for p in [
            SamplingParams {
                seed: Some(3),
                ..Default::default()
            },
            SamplingParams {
                seed: Some(3),
                top_k: 1,
                ..Default::default()
            },
            SamplingParams {
                seed: Some(3),
                top_p: 0.3,
                presence_penalty: 2.0,
                ..Default::default()
            },
        ] {
            let mut rng = p.rng(0);
            let mut seen = [0usize; 4];
            for _ in 0..300 {
                let s = sample_masked(&logits, &[2, 3], &p, &[0, 0, 0, 1], &mut rng).unwrap();
                seen[s.token as usize] += 1;
                assert!((s.logprob - (logits[s.token as usize] - lse)).abs() < 1e-6);
            }
            assert_eq!(seen[0] + seen[1], 0, "{p:?}");
            if p.top_k == 0 && p.top_p == 1.0 {
                // Both allowed tokens come up at temperature 1.
                assert!(seen[2] > 0 && seen[3] > 0, "{seen:?}");
            } else {
                // top-k 1 keeps the better allowed token; the penalty makes 3 worse than 2.
                assert_eq!(seen[3], 0, "{p:?} {seen:?}");
            }
        }
        assert!(sample_masked(&logits, &[7], &greedy, &[], &mut greedy.rng(0)).is_err());
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = SamplingParams {
            logprobs: Some(21),
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("top_logprobs")
        );
    }
}
