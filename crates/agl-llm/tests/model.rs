//! The model's promises to training, checked on the real SmolLM2-135M-Instruct:
//! * the log-probabilities the engine reports for sampled tokens are what a teacher-forced,
//!   differentiable forward pass recomputes (the PPO ratio starts at 1);
//! * every LoRA factor receives a non-zero gradient;
//! * a LoRA adapter with `B = 0` is the base model; merged and unmerged adapters agree; the
//!   PEFT layout round-trips;
//! * the checkpointed backward (layers recomputed, attention in blocks, the head in chunks)
//!   gives the gradients of the plain one;
//! * an adapter applied unmerged on the q8 serving weights (what `agl eval --weights q8
//!   --adapter DIR` runs) decodes like the dense model with the same adapter.
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
    max_abs(&(a - b).unwrap())
}

/// The largest absolute element of `t`.
fn max_abs(t: &Tensor) -> f32 {
    t.abs()
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
            let recomputed = common::teacher_forced_logprobs(lm, prompt, &c.token_ids);
            for (j, lp) in c.logprobs.iter().enumerate() {
                let d = (recomputed[j] - lp.logprob).abs();
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

#[test]
fn broken_model_files_are_named_with_their_problem() {
    let Some(path) = common::model_path() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A download cut off half-way.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = agl_llm::load(
        &agl_llm::ModelFiles::Gguf(cut.clone()),
        &Device::Cpu,
        agl_llm::WeightFormat::Dense,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("cut.gguf") && e.contains("truncated"), "{e}");
    // Not a GGUF file at all.
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let e = agl_llm::load(
        &agl_llm::ModelFiles::Gguf(junk),
        &Device::Cpu,
        agl_llm::WeightFormat::Dense,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("junk.gguf"), "{e}");
    // A Hugging Face directory without its tokenizer, and one of an unsupported architecture.
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(
        hf.join("config.json"),
        r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2}"#,
    )
    .unwrap();
    let e = agl_llm::load(
        &agl_llm::ModelFiles::HfDir(hf.clone()),
        &Device::Cpu,
        agl_llm::WeightFormat::Dense,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::write(hf.join("config.json"), r#"{"model_type":"mamba"}"#).unwrap();
    let e = agl_llm::load(
        &agl_llm::ModelFiles::HfDir(hf),
        &Device::Cpu,
        agl_llm::WeightFormat::Dense,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("config.json") && e.contains("unsupported architecture `mamba`"),
        "{e}"
    );
}

#[test]
fn a_hugging_face_directory_of_the_same_weights_gives_the_same_logits() {
    let Some(lm) = common::loaded() else { return };
    let c = lm.model.config();
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": true,
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    lm.tokenizer
        .save_json(&dir.path().join("tokenizer.json"))
        .unwrap();
    let template = lm.chat_template.as_ref().unwrap().source().to_string();
    let tok_cfg = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"});
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        tok_cfg.to_string(),
    )
    .unwrap();
    // Stored as bf16 would lose precision; f16/bf16 files are converted at load like f32 ones.
    let weights: HashMap<String, Tensor> = lm.model.weights().unwrap().into_iter().collect();
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();

    let hf = agl_llm::load(
        &agl_llm::ModelFiles::HfDir(dir.path().to_path_buf()),
        &Device::Cpu,
        agl_llm::WeightFormat::Dense,
    )
    .unwrap();
    assert_eq!(
        hf.model.config().architecture,
        agl_llm::config::Architecture::Llama
    );
    let prompt = common::chat_prompt(lm, QUESTIONS[2]);
    assert_eq!(
        common::chat_prompt(&hf, QUESTIONS[2]),
        prompt,
        "same tokenizer and template"
    );
    let ids = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let a = lm.model.forward_logits(&ids, None).unwrap();
    let b = hf.model.forward_logits(&ids, None).unwrap();
    assert_eq!(max_abs_diff(&a, &b), 0.0);
}

#[test]
fn the_q8_serving_weights_track_the_dense_model() {
    let (Some(path), Some(lm)) = (common::model_path(), common::loaded()) else {
        return;
    };
    let q8 = load_q8(path);
    assert!(lm.model.is_dense() && !q8.model.is_dense());
    let mc = lm.model.config();
    let (adapter, _) =
        LoraAdapter::new_trainable(LoraConfig::default(), mc, &Device::Cpu, 1).unwrap();
    let e = q8.model.merge_adapter(&adapter).unwrap_err().to_string();
    assert!(e.contains("dense"), "{e}");
    // Next-token distributions after each of three chat prompts: the dense model's choice is
    // among the quantized model's five most likely tokens.
    for q in QUESTIONS {
        let prompt = common::chat_prompt(lm, q);
        let logits = |m: &agl_llm::LlamaModel| {
            let mut cache = agl_llm::KvCache::new(mc, 1, prompt.len() + 1, &Device::Cpu).unwrap();
            m.prefill(&prompt, &mut cache, None)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let (dense, quant) = (logits(&lm.model), logits(&q8.model));
        let best = (0..dense.len())
            .max_by(|&a, &b| dense[a].total_cmp(&dense[b]))
            .unwrap();
        let mut order: Vec<usize> = (0..quant.len()).collect();
        order.sort_by(|&a, &b| quant[b].total_cmp(&quant[a]));
        assert!(
            order[..5].contains(&best),
            "dense top-1 {best} not in q8 top-5 {:?}",
            &order[..5]
        );
    }
}

#[test]
fn a_growing_cache_decodes_exactly_like_a_preallocated_one() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let prompt = common::chat_prompt(lm, QUESTIONS[0]);
    let run = |mut cache: agl_llm::KvCache| {
        let mut last = lm.model.prefill(&prompt, &mut cache, None).unwrap();
        let mut rows = Vec::new();
        for _ in 0..12 {
            let v = last.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let next = (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32;
            rows.push((next, v));
            let tokens = [next];
            let mut groups = [agl_llm::model::DecodeGroup {
                tokens: &tokens,
                cache: &mut cache,
            }];
            last = lm.model.decode(&mut groups, None).unwrap();
        }
        (rows, cache.capacity())
    };
    let limit = prompt.len() + 16;
    let (grown, grown_cap) =
        run(agl_llm::KvCache::with_limit(mc, 1, prompt.len() + 1, limit, &Device::Cpu).unwrap());
    let (fixed, _) = run(agl_llm::KvCache::new(mc, 1, limit, &Device::Cpu).unwrap());
    assert!(
        grown_cap > prompt.len() + 1 && grown_cap <= limit,
        "the cache grew within its limit"
    );
    for ((ta, la), (tb, lb)) in grown.iter().zip(&fixed) {
        assert_eq!(ta, tb);
        assert_eq!(la, lb);
    }
    // Past the limit: an error, not a panic.
    let mut cache = agl_llm::KvCache::with_limit(mc, 1, 4, prompt.len(), &Device::Cpu).unwrap();
    lm.model.prefill(&prompt, &mut cache, None).unwrap();
    let tokens = [1u32];
    let mut groups = [agl_llm::model::DecodeGroup {
        tokens: &tokens,
        cache: &mut cache,
    }];
    assert!(lm.model.decode(&mut groups, None).is_err());
}

#[test]
fn dropping_the_last_engine_stops_its_worker_and_frees_the_model() {
    let Some(lm) = common::loaded() else { return };
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let model = std::sync::Arc::downgrade(engine.model());
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(2),
        ..Default::default()
    };
    let prompt = common::chat_prompt(lm, QUESTIONS[0]);
    let clone = engine.clone();
    clone
        .generate_blocking(GenerateRequest {
            model: None,
            prompt,
            params,
        })
        .unwrap();
    drop(engine);
    assert!(model.upgrade().is_some(), "a clone still serves");
    drop(clone);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while model.upgrade().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker kept the model alive"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_shared_prefix_gives_each_rows_logprobs_and_gradients() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), mc, &Device::Cpu, 5).unwrap();
    // B = 0 would leave A without gradient; move B as after a first update.
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&Tensor::randn(0f32, 0.01, v.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    let prompt = common::chat_prompt(lm, QUESTIONS[2]);
    let (p, s) = (prompt.len() - 9, 6);
    let prefix = &prompt[..p];
    // three continuations of the same length: the real next tokens and two shifted windows
    let rows: Vec<Vec<u32>> = (0..3).map(|i| prompt[p + i..p + i + s].to_vec()).collect();
    let flat: Vec<u32> = rows.concat();
    let prefix_t = Tensor::new(prefix, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let suffixes = Tensor::from_vec(flat, (3, s), &Device::Cpu).unwrap();
    let shared = lm
        .model
        .prefixed_logprobs(&prefix_t, &suffixes, Some(&adapter))
        .unwrap();
    assert_eq!(shared.dims(), &[3, s]);
    let grads_shared = shared.sum_all().unwrap().backward().unwrap();
    let mut separate_total: Option<Tensor> = None;
    for (i, row) in rows.iter().enumerate() {
        let mut all = prefix.to_vec();
        all.extend(row);
        let ids = Tensor::new(all.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let one = lm
            .model
            .token_logprobs_from(&ids, p, Some(&adapter))
            .unwrap();
        let d = max_abs_diff(&one.squeeze(0).unwrap(), &shared.get(i).unwrap());
        assert!(
            d < 1e-4,
            "row {i}: shared and separate log-probabilities differ by {d}"
        );
        separate_total = Some(match separate_total {
            None => one.sum_all().unwrap(),
            Some(t) => (t + one.sum_all().unwrap()).unwrap(),
        });
    }
    let grads_separate = separate_total.unwrap().backward().unwrap();
    let mut worst = 0f32;
    for v in &vars {
        let a = grads_shared.get(v).unwrap();
        let b = grads_separate.get(v).unwrap();
        let scale = max_abs(b);
        worst = worst.max(max_abs_diff(a, b) / scale.max(1e-6));
    }
    eprintln!("largest relative gradient difference, shared vs separate prefix: {worst:e}");
    assert!(worst < 1e-2, "gradients differ by {worst} (relative)");
}

/// ‖a − b‖ / ‖b‖ over all elements.
fn relative_l2(a: &Tensor, b: &Tensor) -> f64 {
    let norm = |t: &Tensor| {
        f64::from(
            t.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
        )
        .sqrt()
    };
    norm(&(a - b).unwrap()) / norm(b).max(1e-30)
}

/// A GRPO-like loss of `[g, S]` log-probabilities: `−Σ exp(lp − old) · adv · mask / n`, with
/// the padding of the shorter rows masked out.
fn surrogate_loss(
    lp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    let ratio = (lp - old)?.exp()?;
    let n = mask.sum_all()?.to_scalar::<f32>()? as f64;
    (ratio.broadcast_mul(adv)? * mask)?.sum_all()?.neg()? / n
}

/// A tensor of `dims` drawn uniformly from `[-scale, scale)` with a fixed seed.
fn seeded(dims: &[usize], scale: f32, seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

#[test]
fn checkpointed_and_plain_backward_give_the_same_gradients() {
    let Some(lm) = common::loaded() else { return };
    let mc = lm.model.config();
    let cfg = LoraConfig {
        target_modules: Target::ALL.to_vec(),
        ..Default::default()
    };
    let (adapter, vars) = LoraAdapter::new_trainable(cfg, mc, &Device::Cpu, 11).unwrap();
    // B = 0 would leave A without gradient; move B as after a first update. Seeded, so that
    // the comparison is the same on every run.
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&seeded(v.dims(), 0.02, 3)).unwrap();
    }
    // A prefix of more than one query block (128) and, in the second case, continuations of
    // more than one block, so that every blocked path is crossed.
    let mut prefix = common::chat_prompt(lm, QUESTIONS[0]);
    prefix.extend(common::chat_prompt(lm, QUESTIONS[1]));
    prefix.extend(common::chat_prompt(lm, QUESTIONS[2]));
    assert!(prefix.len() > 128, "prefix of {} tokens", prefix.len());
    let source = common::chat_prompt(lm, &QUESTIONS.concat());
    for (g, s) in [(3usize, 12usize), (2, 130)] {
        let mut rows = Vec::new();
        for i in 0..g {
            rows.extend((0..s).map(|j| source[(i * 7 + j) % source.len()]));
        }
        let prefix_t = Tensor::new(prefix.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let suffixes = Tensor::from_vec(rows, (g, s), &Device::Cpu).unwrap();
        let old = (seeded(&[g, s], 0.5, 4) - 2.0).unwrap();
        let adv = seeded(&[g, 1], 1.0, 5);
        // The last row is shorter: its last three positions are padding.
        let mut m = vec![1f32; g * s];
        for x in &mut m[g * s - 3..] {
            *x = 0.0;
        }
        let mask = Tensor::from_vec(m, (g, s), &Device::Cpu).unwrap();

        let plain_lp = lm
            .model
            .prefixed_logprobs(&prefix_t, &suffixes, Some(&adapter))
            .unwrap();
        let plain_loss = surrogate_loss(&plain_lp, &old, &adv, &mask).unwrap();
        let plain = plain_loss.backward().unwrap();
        let ours = lm
            .model
            .prefixed_logprobs_backward(&prefix_t, &suffixes, &adapter, |lp| {
                surrogate_loss(lp, &old, &adv, &mask)
            })
            .unwrap();
        let d = max_abs_diff(&ours.logprobs, &plain_lp);
        assert!(d < 1e-4, "log-probabilities differ by {d}");
        let (l1, l2) = (
            ours.loss.to_scalar::<f32>().unwrap(),
            plain_loss.to_scalar::<f32>().unwrap(),
        );
        assert!(
            (l1 - l2).abs() <= 1e-4 * l2.abs().max(1e-3),
            "losses {l1} and {l2} differ"
        );
        let detached = lm
            .model
            .prefixed_logprobs_detached(&prefix_t, &suffixes, Some(&adapter))
            .unwrap();
        assert!(max_abs_diff(&detached, &plain_lp) < 1e-4);
        let mut errors = Vec::new();
        for (i, v) in vars.iter().enumerate() {
            let b = plain.get(v).expect("every factor has a plain gradient");
            let a = ours
                .grads
                .get(v)
                .unwrap_or_else(|| panic!("factor {i} has no checkpointed gradient"));
            errors.push((relative_l2(a, b), i));
        }
        errors.sort_by(|x, y| y.0.total_cmp(&x.0));
        let worst = errors[0].0;
        // (error, index): factors are ordered by layer, then target, A before B.
        eprintln!(
            "g={g} S={s}: largest ‖Δg‖/‖g‖ over {} factors: {:?}",
            vars.len(),
            &errors[..3]
        );
        assert!(
            worst <= 1e-4,
            "g={g} S={s}: gradients differ by {worst:e} (relative L2)"
        );
    }
}

/// The model file with q8 serving weights.
fn load_q8(path: std::path::PathBuf) -> agl_llm::LoadedModel {
    agl_llm::load(
        &agl_llm::ModelFiles::Gguf(path),
        &Device::Cpu,
        agl_llm::WeightFormat::Q8,
    )
    .unwrap()
}

/// Hybrid weights are the dense model while a prompt prefills and the q8 model while it
/// decodes, to the bit: prefill logits equal the dense model's, and a decoding step from the
/// same cache equals the q8 model's step, with and without an unmerged adapter. Neither
/// trainable nor mergeable.
#[test]
fn hybrid_weights_prefill_as_dense_and_decode_as_q8() {
    let (Some(path), Some(lm)) = (common::model_path(), common::loaded()) else {
        return;
    };
    let q8 = load_q8(path.clone());
    let hybrid = agl_llm::load(
        &agl_llm::ModelFiles::Gguf(path),
        &Device::Cpu,
        agl_llm::WeightFormat::Hybrid,
    )
    .unwrap();
    let mc = lm.model.config();
    assert!(!hybrid.model.is_dense());
    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), mc, &Device::Cpu, 3).unwrap();
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&seeded(v.dims(), 0.03, 11)).unwrap();
    }
    let e = hybrid
        .model
        .merge_adapter(&adapter)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dense"), "{e}");
    for (q, a) in [(QUESTIONS[0], None), (QUESTIONS[1], Some(&adapter))] {
        let prompt = common::chat_prompt(lm, q);
        let prefill = |m: &agl_llm::LlamaModel| {
            let mut cache = agl_llm::KvCache::new(mc, 1, prompt.len() + 2, &Device::Cpu).unwrap();
            let logits = m.prefill(&prompt, &mut cache, a).unwrap();
            (logits, cache)
        };
        let (dense_logits, cache) = prefill(&lm.model);
        let (hybrid_logits, _) = prefill(&hybrid.model);
        assert_eq!(
            max_abs_diff(&dense_logits, &hybrid_logits),
            0.0,
            "{q}: prefill"
        );
        let step = |m: &agl_llm::LlamaModel| {
            let mut copy = agl_llm::KvCache::new(mc, 1, prompt.len() + 2, &Device::Cpu).unwrap();
            copy.fill_prefix(&cache, prompt.len()).unwrap();
            let mut cache = copy;
            let mut groups = [agl_llm::model::DecodeGroup {
                tokens: &[42],
                cache: &mut cache,
            }];
            m.decode(&mut groups, a).unwrap()
        };
        let (q8_step, hybrid_step, dense_step) =
            (step(&q8.model), step(&hybrid.model), step(&lm.model));
        assert_eq!(max_abs_diff(&q8_step, &hybrid_step), 0.0, "{q}: decode");
        // Not the dense step: the decode really read the Q8_0 blocks.
        assert!(max_abs_diff(&dense_step, &hybrid_step) > 0.0, "{q}: decode");
    }
}

#[test]
fn a_lora_adapter_unmerged_on_q8_weights_tracks_the_dense_adapted_model() {
    let (Some(path), Some(lm)) = (common::model_path(), common::loaded()) else {
        return;
    };
    let q8 = load_q8(path);
    let mc = lm.model.config();
    let (adapter, vars) =
        LoraAdapter::new_trainable(LoraConfig::default(), mc, &Device::Cpu, 2).unwrap();
    // A trained adapter's B is not zero; a seeded one stands in for it (it moves the logits by
    // a few percent).
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&seeded(v.dims(), 0.03, 7)).unwrap();
    }
    for q in QUESTIONS {
        let prompt = common::chat_prompt(lm, q);
        let logits = |m: &agl_llm::LlamaModel, a: Option<&LoraAdapter>| {
            let mut cache = agl_llm::KvCache::new(mc, 1, prompt.len() + 1, &Device::Cpu).unwrap();
            m.prefill(&prompt, &mut cache, a).unwrap()
        };
        let dense = logits(&lm.model, None);
        let dense_a = logits(&lm.model, Some(&adapter));
        let quant = logits(&q8.model, None);
        let quant_a = logits(&q8.model, Some(&adapter));
        let effect_dense = relative_l2(&dense_a, &dense);
        let effect_q8 = relative_l2(&quant_a, &quant);
        let base_gap = relative_l2(&quant, &dense);
        let adapted_gap = relative_l2(&quant_a, &dense_a);
        eprintln!(
            "{q}: adapter moves the logits by {effect_dense:.4} (dense) and {effect_q8:.4} (q8); q8 vs dense {base_gap:.4} without it, {adapted_gap:.4} with it"
        );
        // The adapter is applied on the quantized weights (not dropped) …
        assert!(
            effect_q8 > 0.5 * effect_dense,
            "{q}: the adapter barely moves the q8 model"
        );
        // … and the adapted models stay about as close as the base ones. Measured (relative L2
        // of the logits, without → with the adapter): 0.012 → 0.030, 0.016 → 0.018, 0.014 →
        // 0.013 (q8 also quantizes the activations the adapter moved); the bound guards
        // against a regression beyond that.
        assert!(
            adapted_gap < 4.0 * base_gap,
            "{q}: q8+adapter drifts from dense+adapter"
        );
        // The dense choice stays among the quantized model's five most likely tokens.
        let d = dense_a.to_vec1::<f32>().unwrap();
        let qv = quant_a.to_vec1::<f32>().unwrap();
        let best = (0..d.len()).max_by(|&a, &b| d[a].total_cmp(&d[b])).unwrap();
        let mut order: Vec<usize> = (0..qv.len()).collect();
        order.sort_by(|&a, &b| qv[b].total_cmp(&qv[a]));
        assert!(
            order[..5].contains(&best),
            "{q}: dense+adapter top-1 not in q8+adapter top-5"
        );
    }
}

/// Greedy decoding as `agl eval --weights q8 --adapter DIR` runs it: the adapter saved in
/// PEFT's layout and loaded by name into a q8 engine (applied unmerged, per call). Each greedy
/// token of q8+adapter is scored by the dense model with the same adapter, teacher-forced: its
/// log-probability there against the one q8 reported, and whether it is the dense argmax. The
/// same is measured for q8 and dense without the adapter, for reference.
#[test]
fn greedy_decoding_with_an_adapter_on_q8_weights_agrees_with_the_dense_model() {
    let (Some(path), Some(lm)) = (common::model_path(), common::loaded()) else {
        return;
    };
    let q8 = load_q8(path);
    let mc = lm.model.config();
    // A seeded adapter on all seven projections stands in for a trained one (B ≠ 0).
    let cfg = LoraConfig {
        target_modules: Target::ALL.to_vec(),
        ..Default::default()
    };
    let (adapter, vars) = LoraAdapter::new_trainable(cfg, mc, &Device::Cpu, 3).unwrap();
    for (i, v) in vars.iter().enumerate().skip(1).step_by(2) {
        v.set(&seeded(v.dims(), ADAPTER_B_SCALE, 100 + i as u64))
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    adapter.save(dir.path()).unwrap();
    let loaded = LoraAdapter::load(dir.path(), mc, &Device::Cpu).unwrap();
    let dense_engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let q8_engine = Engine::start(q8, EngineConfig::default()).unwrap();
    for e in [&dense_engine, &q8_engine] {
        e.load_adapter("sql", dir.path()).unwrap();
    }
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(24),
        logprobs: Some(0),
        ..Default::default()
    };
    let run = |e: &Engine, model: Option<&str>, prompt: &[u32]| {
        e.generate_blocking(GenerateRequest {
            model: model.map(str::to_string),
            prompt: prompt.to_vec(),
            params: greedy.clone(),
        })
        .unwrap()
        .completions
        .remove(0)
    };
    // The dense model's (with or without the adapter) teacher-forced log-probability of each
    // generated token, and its argmax at that position.
    let forced = |prompt: &[u32], tokens: &[u32], a: Option<&LoraAdapter>| {
        let all: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
        let ids = Tensor::new(all.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = lm
            .model
            .forward_logits(&ids, a)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let logp = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        tokens
            .iter()
            .enumerate()
            .map(|(j, &t)| {
                let row = &logp[prompt.len() - 1 + j];
                let best = (0..row.len())
                    .max_by(|&x, &y| row[x].total_cmp(&row[y]))
                    .unwrap();
                (row[t as usize], best as u32)
            })
            .collect::<Vec<_>>()
    };
    let (mut with, mut without) = (Agreement::default(), Agreement::default());
    let (mut effect, mut changed) = (0f64, 0usize);
    for q in QUESTIONS {
        let prompt = common::chat_prompt(lm, q);
        let q8_a = run(&q8_engine, Some("sql"), &prompt);
        let q8_base = run(&q8_engine, None, &prompt);
        let dense_a = run(&dense_engine, Some("sql"), &prompt);
        let adapted = forced(&prompt, &q8_a.token_ids, Some(&loaded));
        with.add(&q8_a.logprobs, &adapted);
        without.add(
            &q8_base.logprobs,
            &forced(&prompt, &q8_base.token_ids, None),
        );
        let unadapted = forced(&prompt, &q8_a.token_ids, None);
        for (a, b) in adapted.iter().zip(&unadapted) {
            effect += f64::from((a.0 - b.0).abs());
        }
        changed += usize::from(q8_a.token_ids != q8_base.token_ids);
        let same = q8_a
            .token_ids
            .iter()
            .zip(&dense_a.token_ids)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "{q}\n  q8+adapter    {:?}\n  dense+adapter {:?}\n  q8 alone      {:?}\n  same first {same} of {} greedy tokens",
            q8_a.text,
            dense_a.text,
            q8_base.text,
            q8_a.token_ids.len()
        );
    }
    let effect = effect / with.tokens as f64;
    eprintln!(
        "with the adapter: {}; without: {}; the adapter moves the dense log-probabilities of q8+adapter's tokens by {effect:.4} on average and changed q8's greedy output on {changed} of {} prompts",
        with.summary(),
        without.summary(),
        QUESTIONS.len()
    );
    // The adapter is applied on the q8 weights: it changes every answer, and moves the
    // log-probabilities well beyond the q8 error, so the agreement below is not the base models
    // agreeing.
    assert_eq!(
        changed,
        QUESTIONS.len(),
        "the adapter must change q8's output"
    );
    assert!(
        effect > 2.0 * with.mean(),
        "adapter effect {effect} vs q8 error {}",
        with.mean()
    );
    // Measured on SmolLM2-135M (docs/llm.md › The model): argmax agreement 47/47, mean gap
    // 0.034, largest 0.18 (without the adapter: 70/72, 0.042, 0.36).
    assert!(
        with.agree * 100 >= with.tokens * 95,
        "greedy agreement {}",
        with.summary()
    );
    assert!(with.mean() < 0.06, "mean gap: {}", with.summary());
    assert!(with.worst < 0.5, "largest gap: {}", with.summary());
    for e in [dense_engine, q8_engine] {
        e.shutdown();
    }
}

/// Uniform range of the seeded adapter's `B` factors: strong enough to change every greedy
/// answer of the test prompts, weak enough to keep them fluent.
const ADAPTER_B_SCALE: f32 = 0.1;

/// How q8's greedy tokens and reported log-probabilities agree with the dense model's
/// teacher-forced ones.
#[derive(Default)]
struct Agreement {
    tokens: usize,
    /// Tokens that are also the dense argmax.
    agree: usize,
    sum: f64,
    /// Largest |q8 − dense| log-probability.
    worst: f32,
}

impl Agreement {
    fn add(&mut self, q8: &[agl_llm::TokenLogprob], dense: &[(f32, u32)]) {
        assert_eq!(q8.len(), dense.len());
        for (lp, (dense_lp, best)) in q8.iter().zip(dense) {
            let d = (lp.logprob - dense_lp).abs();
            self.worst = self.worst.max(d);
            self.sum += f64::from(d);
            self.tokens += 1;
            self.agree += usize::from(lp.token_id == *best);
        }
    }

    /// Mean |q8 − dense| log-probability.
    fn mean(&self) -> f64 {
        self.sum / self.tokens.max(1) as f64
    }

    fn summary(&self) -> String {
        format!(
            "{}/{} tokens are the dense argmax, |q8 − dense| log-probability mean {:.4}, largest {:.4}",
            self.agree,
            self.tokens,
            self.mean(),
            self.worst
        )
    }
}

#[test]
fn a_prefix_served_from_the_cache_decodes_like_a_full_prefill() {
    let Some(lm) = common::loaded() else { return };
    use agl_llm::engine::PREFILL_CHUNK;
    use std::sync::atomic::Ordering;
    let off = Engine::start(
        lm.clone(),
        EngineConfig {
            prefix_cache_tokens: 0,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let on = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let run = |e: &Engine, prompt: &[u32], params: &SamplingParams| {
        e.generate_blocking(GenerateRequest {
            model: None,
            prompt: prompt.to_vec(),
            params: params.clone(),
        })
        .unwrap()
        .completions
        .remove(0)
    };
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(16),
        logprobs: Some(0),
        ..Default::default()
    };
    let seeded = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(16),
        logprobs: Some(0),
        ..Default::default()
    };
    // A system turn longer than two chunks (a schema, as the SQL agent sends), shared by two
    // questions; the same prompt again; a second turn extending the first with its answer.
    let system = format!(
        "You write SQLite queries. Answer with one SQL statement. The database: {}",
        QUESTIONS.join(" ")
    );
    let first = common::chat_prompt_with(lm, &system, QUESTIONS[0]);
    let answer = run(&off, &first, &greedy).token_ids;
    let mut second_turn = first.clone();
    second_turn.extend(&answer);
    second_turn.extend(common::chat_prompt(lm, QUESTIONS[2]).iter().skip(1));
    let prompts = [
        first.clone(),
        common::chat_prompt_with(lm, &system, QUESTIONS[1]),
        first.clone(),
        second_turn,
    ];
    // What the cache should reuse: the longest prefix shared with an earlier prompt, short of
    // the last token, in whole chunks.
    let mut expected = 0;
    for (i, p) in prompts.iter().enumerate() {
        let shared = prompts[..i]
            .iter()
            .map(|q| q.iter().zip(p).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0)
            .min(p.len() - 1);
        expected += shared / PREFILL_CHUNK * PREFILL_CHUNK;
    }
    assert!(
        expected >= 3 * PREFILL_CHUNK,
        "the prompts share too little: {expected}"
    );
    for p in &prompts {
        for params in [&greedy, &seeded] {
            let (a, b) = (run(&off, p, params), run(&on, p, params));
            // The same tokens and the same log-probabilities, to the last bit.
            assert_eq!(a.token_ids, b.token_ids);
            let bits = |c: &agl_llm::Completion| -> Vec<u32> {
                c.logprobs.iter().map(|l| l.logprob.to_bits()).collect()
            };
            assert_eq!(bits(&a), bits(&b));
        }
    }
    let hits = on.stats().prefix_cache_hit_tokens.load(Ordering::Relaxed) as usize;
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    eprintln!(
        "prefix cache: {hits} of {} prompt tokens reused",
        2 * prompt_tokens
    );
    // Each prompt runs twice (greedy, then seeded): the second run reuses all its whole chunks
    // short of the last token.
    let again: usize = prompts
        .iter()
        .map(|p| (p.len() - 1) / PREFILL_CHUNK * PREFILL_CHUNK)
        .sum();
    assert_eq!(hits, expected + again);
    assert_eq!(
        off.stats().prefix_cache_hit_tokens.load(Ordering::Relaxed),
        0
    );
    off.shutdown();
    on.shutdown();
}
