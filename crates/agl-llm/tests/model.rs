//! The model's promises to training, checked on the real SmolLM2-135M-Instruct:
//! * the log-probabilities the engine reports for sampled tokens are what a teacher-forced,
//!   differentiable forward pass recomputes (the PPO ratio starts at 1);
//! * every LoRA factor receives a non-zero gradient;
//! * a LoRA adapter with `B = 0` is the base model; merged and unmerged adapters agree; the
//!   PEFT layout round-trips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use agl_llm::lora::LoraPair;
use agl_llm::{
    Engine, EngineConfig, GenerateRequest, LoraAdapter, LoraConfig, SamplingParams, Target,
};
use candle_core::{DType, Device, Tensor};

const QUESTIONS: [&str; 3] = [
    "Schema: singer(singer_id, name, country, age). How many singers do we have?",
    "Schema: stadium(stadium_id, name, capacity). What is the average capacity of the stadiums?",
    "Schema: concert(concert_id, concert_name, year). List the names of concerts held in 2014.",
];

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn reported_logprobs_match_the_teacher_forced_forward() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let mut worst = 0f32;
    let mut checked = 0;
    // Two prompts decode concurrently (batched rows of different groups), each as a group of 4.
    let streams: Vec<_> = QUESTIONS[..2]
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let prompt = common::chat_prompt(lm, q);
            let params = SamplingParams {
                temperature: 1.0,
                n: 4,
                seed: Some(i as u64),
                max_tokens: Some(24),
                logprobs: Some(0),
                ..Default::default()
            };
            engine
                .submit(GenerateRequest {
                    model: None,
                    prompt,
                    params,
                })
                .unwrap()
        })
        .collect();
    for s in streams {
        let generation = s.collect_blocking().unwrap();
        let prompt = &generation.prompt_token_ids;
        for c in &generation.completions {
            assert_eq!(c.token_ids.len(), c.logprobs.len());
            let mut all = prompt.clone();
            all.extend(&c.token_ids);
            let ids = Tensor::new(all.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let recomputed = lm
                .model
                .token_logprobs(&ids, None)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for (j, lp) in c.logprobs.iter().enumerate() {
                let d = (recomputed[prompt.len() - 1 + j] - lp.logprob).abs();
                worst = worst.max(d);
                checked += 1;
            }
        }
    }
    eprintln!(
        "largest |reported - recomputed| log-probability over {checked} sampled tokens: {worst:e}"
    );
    assert!(checked >= 8);
    assert!(worst < 1e-3, "log-probabilities differ by {worst}");
    engine.shutdown();
}

#[test]
fn same_seed_same_tokens_and_batching_does_not_change_greedy_output() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let req = |q: &str, params: SamplingParams| GenerateRequest {
        model: None,
        prompt: common::chat_prompt(lm, q),
        params,
    };
    let sampled = SamplingParams {
        seed: Some(42),
        max_tokens: Some(16),
        n: 2,
        ..Default::default()
    };
    let a = engine
        .generate_blocking(req(QUESTIONS[0], sampled.clone()))
        .unwrap();
    let b = engine
        .generate_blocking(req(QUESTIONS[0], sampled))
        .unwrap();
    for (x, y) in a.completions.iter().zip(&b.completions) {
        assert_eq!(x.token_ids, y.token_ids);
    }
    // Greedy alone vs greedy while two other requests decode in the same steps.
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(16),
        ..Default::default()
    };
    let alone: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| {
            engine
                .generate_blocking(req(q, greedy.clone()))
                .unwrap()
                .completions[0]
                .token_ids
                .clone()
        })
        .collect();
    let streams: Vec<_> = QUESTIONS
        .iter()
        .map(|q| engine.submit(req(q, greedy.clone())).unwrap())
        .collect();
    let together: Vec<Vec<u32>> = streams
        .into_iter()
        .map(|s| {
            s.collect_blocking().unwrap().completions[0]
                .token_ids
                .clone()
        })
        .collect();
    assert_eq!(alone, together);
    engine.shutdown();
}

fn random_pairs(
    lm: &agl_llm::LoadedModel,
    cfg: &LoraConfig,
    std: f32,
) -> HashMap<(usize, Target), LoraPair> {
    let mc = lm.model.config();
    let mut pairs = HashMap::new();
    for layer in 0..mc.num_hidden_layers {
        for &t in &cfg.target_modules {
            let (fan_in, fan_out) = t.dims(mc);
            let a = Tensor::randn(0f32, std, (cfg.r, fan_in), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, std, (fan_out, cfg.r), &Device::Cpu).unwrap();
            pairs.insert((layer, t), LoraPair { a, b });
        }
    }
    pairs
}

#[test]
fn every_lora_factor_receives_a_gradient() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let cfg = LoraConfig {
        target_modules: Target::ALL.to_vec(),
        ..Default::default()
    };
    let (adapter, vars) = LoraAdapter::new_trainable(cfg, mc, &Device::Cpu, 0).unwrap();
    assert_eq!(vars.len(), 2 * 7 * mc.num_hidden_layers);
    // PEFT's initialisation (B = 0) makes A's gradient exactly zero until B moves; give B a
    // value, as after the first update, so that both factors must receive gradient.
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&Tensor::randn(0f32, 0.01, v.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    let prompt = common::chat_prompt(lm, QUESTIONS[0]);
    let ids = Tensor::new(&prompt[..24], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let loss = lm
        .model
        .token_logprobs(&ids, Some(&adapter))
        .unwrap()
        .mean_all()
        .unwrap()
        .neg()
        .unwrap();
    let grads = loss.backward().unwrap();
    let mut zero = Vec::new();
    for (i, v) in vars.iter().enumerate() {
        let g = grads.get(v).expect("every variable is in the graph");
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        if !(norm > 0.0 && norm.is_finite()) {
            zero.push(i);
        }
    }
    assert!(
        zero.is_empty(),
        "variables without gradient: {zero:?} of {}",
        vars.len()
    );
}

#[test]
fn zero_b_adapter_is_the_base_model_and_merging_agrees() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let prompt = common::chat_prompt(lm, QUESTIONS[1]);
    let ids = Tensor::new(&prompt[..32], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let base = lm.model.forward_logits(&ids, None).unwrap();

    let (fresh, _) =
        LoraAdapter::new_trainable(LoraConfig::default(), mc, &Device::Cpu, 3).unwrap();
    let with_zero_b = lm.model.forward_logits(&ids, Some(&fresh)).unwrap();
    assert_eq!(max_abs_diff(&base, &with_zero_b), 0.0);

    let cfg = LoraConfig {
        target_modules: vec![Target::Q, Target::V, Target::Up],
        r: 4,
        ..Default::default()
    };
    let adapter = LoraAdapter::from_pairs(cfg.clone(), mc, random_pairs(lm, &cfg, 0.05)).unwrap();
    let unmerged = lm.model.forward_logits(&ids, Some(&adapter)).unwrap();
    let merged = lm
        .model
        .merge_adapter(&adapter)
        .unwrap()
        .forward_logits(&ids, None)
        .unwrap();
    let moved = max_abs_diff(&base, &unmerged);
    let d = max_abs_diff(&merged, &unmerged);
    eprintln!("adapter moves logits by up to {moved}; merged vs unmerged differ by {d:e}");
    assert!(moved > 1e-2, "the test adapter must change the output");
    assert!(d < 1e-3, "merged and unmerged differ by {d}");

    // PEFT layout round trip, and the sampling path (prefill) agrees with training's.
    let dir = tempfile::tempdir().unwrap();
    adapter.save(dir.path()).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        assert!(dir.path().join(f).is_file(), "{f} written");
    }
    let names =
        candle_core::safetensors::load(dir.path().join("adapter_model.safetensors"), &Device::Cpu)
            .unwrap();
    assert!(names.contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    assert!(names.contains_key("base_model.model.model.layers.29.mlp.up_proj.lora_B.weight"));
    let loaded = LoraAdapter::load(dir.path(), mc, &Device::Cpu).unwrap();
    assert_eq!(loaded.config().r, 4);
    let again = lm.model.forward_logits(&ids, Some(&loaded)).unwrap();
    assert_eq!(max_abs_diff(&again, &unmerged), 0.0);

    let mut cache = agl_llm::KvCache::new(mc, 1, 64, &Device::Cpu).unwrap();
    let last = lm
        .model
        .prefill(&prompt[..32], &mut cache, Some(&loaded))
        .unwrap();
    let train_last = unmerged.squeeze(0).unwrap().get(31).unwrap();
    assert!(max_abs_diff(&last, &train_last) < 1e-3);
    let _ = DType::F32;
}

#[test]
fn adapter_errors_name_the_file() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let dir = tempfile::tempdir().unwrap();
    let e = LoraAdapter::load(dir.path(), mc, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
    // An adapter of another model's shape is refused with both shapes named.
    let cfg = LoraConfig {
        target_modules: vec![Target::Q],
        r: 2,
        ..Default::default()
    };
    let mut pairs = HashMap::new();
    pairs.insert(
        (0, Target::Q),
        LoraPair {
            a: Tensor::zeros((2, 100), DType::F32, &Device::Cpu).unwrap(),
            b: Tensor::zeros((576, 2), DType::F32, &Device::Cpu).unwrap(),
        },
    );
    let e = LoraAdapter::from_pairs(cfg, mc, pairs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 100]") && e.contains("[2, 576]"), "{e}");
}
