//! LoRA GRPO on the real SmolLM2-135M-Instruct (pulled into the cache on first use, as CI does
//! before the tests): the first ratio is 1 (the engine's recorded log-probabilities are what
//! the trainer recomputes), an update moves the policy toward positive advantages and away from
//! negative ones, a trained adapter survives the PEFT round trip and resumes as variables, and
//! tokens a constraint forced stay out of the loss.
#![cfg(feature = "llm")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::engine;

use std::collections::HashMap;
use std::sync::Arc;

use agl_core::Triplet;
use agl_llm::{Engine, GenerateRequest, LlamaModel, LoraAdapter, LoraConfig, SamplingParams};
use agl_train::{LlmGrpo, LlmGrpoConfig, TokenSample, assign_advantages, samples_from_triplets};
use candle_core::{Device, Tensor};
use serde_json::json;

/// G sampled answers to one question, as the adapter's triplets would carry them.
fn sampled_triplets(engine: &Engine, g: usize) -> Vec<Triplet> {
    let messages = [
        json!({"role": "system", "content": "You write SQLite queries. Answer with one SQL statement."}),
        json!({"role": "user", "content": "Table singer: singer_id, name, age. How many singers are there?"}),
    ];
    let text = engine
        .chat_template()
        .unwrap()
        .render(&messages, None, true)
        .unwrap();
    let prompt = engine.tokenizer().encode(&text, false).unwrap();
    let generation = engine
        .generate_blocking(GenerateRequest {
            model: None,
            prompt,
            params: SamplingParams {
                temperature: 1.0,
                n: g,
                seed: Some(7),
                max_tokens: Some(12),
                logprobs: Some(0),
                ..Default::default()
            },
        })
        .unwrap();
    generation
        .completions
        .iter()
        .map(|c| Triplet {
            prompt: json!({"token_ids": generation.prompt_token_ids}),
            response: json!({
                "token_ids": c.token_ids,
                "logprobs_values": c.logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
            }),
            reward: None,
            metadata: serde_json::Map::new(),
        })
        .collect()
}

/// Sum of the response's log-probabilities under `adapter`.
fn response_logprob(model: &LlamaModel, s: &TokenSample, adapter: &LoraAdapter) -> f32 {
    let ids = Tensor::new(s.tokens.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    model
        .token_logprobs_from(&ids, s.prompt_len, Some(adapter))
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn the_first_ratio_is_one_and_an_update_follows_the_advantages() {
    let Some(engine) = engine() else { return };
    let model: Arc<LlamaModel> = engine.model().clone();
    let triplets = sampled_triplets(&engine, 4);
    // Rollouts 0 and 1 succeed, 2 and 3 fail.
    let mut samples = Vec::new();
    let mut rewards = HashMap::new();
    for (i, t) in triplets.iter().enumerate() {
        let rid = format!("ro-{i}");
        let r = if i < 2 { 1.0 } else { 0.0 };
        rewards.insert(rid.clone(), r);
        samples.extend(samples_from_triplets(&rid, "q", std::slice::from_ref(t), r).unwrap());
    }
    assign_advantages(&mut samples, &rewards);
    assert!(samples[0].advantage > 0.0 && samples[3].advantage < 0.0);

    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), model.config(), &Device::Cpu, 0).unwrap();
    let before: Vec<f32> = samples
        .iter()
        .map(|s| response_logprob(&model, s, &adapter))
        .collect();
    let mut grpo = LlmGrpo::new(
        model.clone(),
        adapter,
        vars,
        LlmGrpoConfig {
            learning_rate: 1e-3,
            micro_batch: 3,
            ..LlmGrpoConfig::default()
        },
    )
    .unwrap();
    let stats = grpo.step(&samples).unwrap();
    eprintln!("first update: {stats:?}");
    assert_eq!(stats.trained_samples, 4);
    assert!(
        stats.first_ratio_max_dev < 5e-3,
        "the sampler's and the trainer's log-probabilities differ: max |ratio - 1| = {}",
        stats.first_ratio_max_dev
    );
    assert_eq!(stats.clip_fraction, 0.0, "nothing is clipped at ratio 1");
    assert!(stats.grad_norm > 0.0);
    let after: Vec<f32> = samples
        .iter()
        .map(|s| response_logprob(&model, s, grpo.adapter()))
        .collect();
    eprintln!("response log-probabilities before {before:?} after {after:?}");
    for i in 0..2 {
        assert!(
            after[i] > before[i],
            "sample {i} (advantage +) lost probability"
        );
    }
    for i in 2..4 {
        assert!(
            after[i] < before[i],
            "sample {i} (advantage -) gained probability"
        );
    }

    // The trained adapter survives the PEFT round trip and resumes as variables.
    let dir = tempfile::tempdir().unwrap();
    grpo.adapter().save(dir.path()).unwrap();
    let loaded = LoraAdapter::load(dir.path(), model.config(), &Device::Cpu).unwrap();
    let (resumed, vars) = loaded.into_trainable().unwrap();
    assert_eq!(vars.len(), 2 * 4 * model.config().num_hidden_layers);
    let again = response_logprob(&model, &samples[0], &resumed);
    assert!((again - after[0]).abs() < 1e-4, "{again} vs {}", after[0]);
    // A snapshot does not follow later in-place updates of the trained factors.
    let snap = grpo.adapter().snapshot().unwrap();
    grpo.step(&samples).unwrap();
    let snap_lp = response_logprob(&model, &samples[0], &snap);
    assert!((snap_lp - after[0]).abs() < 1e-4);
    engine.shutdown();
}

#[test]
fn samples_with_zero_advantage_cost_nothing() {
    let Some(engine) = engine() else { return };
    let model = engine.model().clone();
    let triplets = sampled_triplets(&engine, 2);
    let mut samples = Vec::new();
    let mut rewards = HashMap::new();
    for (i, t) in triplets.iter().enumerate() {
        let rid = format!("ro-{i}");
        rewards.insert(rid.clone(), 1.0);
        samples.extend(samples_from_triplets(&rid, "q", std::slice::from_ref(t), 1.0).unwrap());
    }
    assign_advantages(&mut samples, &rewards);
    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), model.config(), &Device::Cpu, 0).unwrap();
    let mut grpo = LlmGrpo::new(model, adapter, vars, LlmGrpoConfig::default()).unwrap();
    let stats = grpo.step(&samples).unwrap();
    assert_eq!((stats.samples, stats.trained_samples), (2, 0));
    assert_eq!(stats.grad_norm, 0.0);
    engine.shutdown();
}

/// A learner with a fresh adapter (seed 0: every call starts from the same factors).
fn learner(model: &Arc<LlamaModel>) -> LlmGrpo {
    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), model.config(), &Device::Cpu, 0).unwrap();
    LlmGrpo::new(
        model.clone(),
        adapter,
        vars,
        LlmGrpoConfig {
            learning_rate: 1e-3,
            ..LlmGrpoConfig::default()
        },
    )
    .unwrap()
}

/// `t` with `response.forced_positions = positions`; with `corrupt`, the recorded
/// log-probabilities at those positions are replaced by −20 (a ratio of e^20 if they counted).
fn forced(t: &Triplet, positions: &[usize], corrupt: bool) -> Triplet {
    let mut t = t.clone();
    t.response["forced_positions"] = json!(positions);
    if corrupt {
        for &p in positions {
            t.response["logprobs_values"][p] = json!(-20.0);
        }
    }
    t
}

/// One sample per triplet, rollout `ro-<i>` rewarded 1 for even `i` and 0 for odd `i`.
fn samples(triplets: &[Triplet]) -> Vec<TokenSample> {
    let mut out = Vec::new();
    let mut rewards = HashMap::new();
    for (i, t) in triplets.iter().enumerate() {
        let rid = format!("ro-{i}");
        let r = if i % 2 == 0 { 1.0 } else { 0.0 };
        rewards.insert(rid.clone(), r);
        out.extend(samples_from_triplets(&rid, "q", std::slice::from_ref(t), r).unwrap());
    }
    assign_advantages(&mut out, &rewards);
    out
}

#[test]
fn forced_tokens_carry_no_gradient_no_loss_and_no_ratio_statistics() {
    let Some(engine) = engine() else { return };
    let model: Arc<LlamaModel> = engine.model().clone();
    let plain = sampled_triplets(&engine, 2);
    let lens: Vec<usize> = plain
        .iter()
        .map(|t| t.response["token_ids"].as_array().unwrap().len())
        .collect();
    assert!(lens.iter().all(|&n| n >= 2), "{lens:?}");
    let even = |n: usize| (0..n).step_by(2).collect::<Vec<_>>();
    let all = |n: usize| (0..n).collect::<Vec<_>>();
    let logprobs = |grpo: &LlmGrpo, s: &[TokenSample]| -> Vec<f32> {
        s.iter()
            .map(|x| response_logprob(&model, x, grpo.adapter()))
            .collect()
    };
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    let base = samples(&plain);
    let untrained = logprobs(&learner(&model), &base);

    // Every token forced: the response is not trained on at all.
    let all_forced: Vec<Triplet> = plain
        .iter()
        .zip(&lens)
        .map(|(t, &n)| forced(t, &all(n), true))
        .collect();
    let mut grpo = learner(&model);
    let stats = grpo.step(&samples(&all_forced)).unwrap();
    assert_eq!((stats.samples, stats.trained_samples), (2, 0));
    assert_eq!(
        (stats.loss_tokens, stats.loss, stats.grad_norm),
        (0, 0.0, 0.0)
    );
    assert!(
        close(&logprobs(&grpo, &base), &untrained),
        "the policy moved"
    );

    // ... and beside a trained sample it changes nothing: the same update as without it.
    let mixed = samples(&[all_forced[0].clone(), plain[1].clone()]);
    let mut alone = learner(&model);
    let only = alone.step(&mixed[1..]).unwrap();
    let mut beside = learner(&model);
    let with = beside.step(&mixed).unwrap();
    assert_eq!(
        (with.trained_samples, with.loss_tokens),
        (1, only.loss_tokens)
    );
    assert!((with.loss - only.loss).abs() < 1e-7, "{with:?} vs {only:?}");
    assert!(close(&logprobs(&beside, &base), &logprobs(&alone, &base)));

    // Partly forced, with nonsense recorded at the forced positions: they stay out of the
    // token count, the clip fraction and the first ratio, and the update is the one with the
    // true log-probabilities there.
    let half = |corrupt: bool| -> Vec<Triplet> {
        plain
            .iter()
            .zip(&lens)
            .map(|(t, &n)| forced(t, &even(n), corrupt))
            .collect()
    };
    let n_forced: usize = lens.iter().map(|&n| even(n).len()).sum();
    let mut corrupt = learner(&model);
    let stats = corrupt.step(&samples(&half(true))).unwrap();
    eprintln!("partly forced: {stats:?}");
    assert_eq!(stats.trained_samples, 2);
    assert_eq!(stats.forced_tokens, n_forced);
    assert_eq!(stats.loss_tokens, lens.iter().sum::<usize>() - n_forced);
    assert!(stats.first_ratio_max_dev < 5e-3, "{stats:?}");
    assert_eq!(stats.clip_fraction, 0.0);
    let mut truthful = learner(&model);
    truthful.step(&samples(&half(false))).unwrap();
    let after_forced = logprobs(&corrupt, &base);
    assert!(close(&after_forced, &logprobs(&truthful, &base)));
    assert!(
        !close(&after_forced, &untrained),
        "the unforced tokens trained"
    );

    // Unforced, the same responses give another update: the forced positions are what differ.
    let mut unforced = learner(&model);
    let stats = unforced.step(&base).unwrap();
    assert_eq!(stats.loss_tokens, lens.iter().sum::<usize>());
    assert_eq!(stats.forced_tokens, 0);
    assert!(!close(&logprobs(&unforced, &base), &after_forced));
    engine.shutdown();
}
