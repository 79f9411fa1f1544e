//! Supervised fine-tuning on the real SmolLM2-135M-Instruct (pulled into the cache on first use,
//! as CI does before the tests): demonstrations are tokenised with the model's own chat
//! template with only the assistant's tokens trained, SFT updates lower the demonstrations'
//! negative log-likelihood, and a step with nothing to select trains nothing.
#![cfg(feature = "llm")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::engine;

use std::collections::HashMap;

use agl_llm::{Engine, LoraAdapter, LoraConfig, Target};
use agl_train::{Demonstration, Learner, LlmSft, LlmSftConfig, TrainError, demonstration_samples};
use serde_json::json;

fn demo(position: usize, messages: serde_json::Value) -> Demonstration {
    Demonstration {
        position,
        messages: serde_json::from_value(messages).unwrap(),
        tools: None,
    }
}

fn sft(engine: &Engine, learning_rate: f64) -> LlmSft {
    let cfg = LoraConfig {
        r: 8,
        alpha: 16.0,
        target_modules: vec![Target::Q, Target::V],
        use_rslora: false,
        base_model: None,
    };
    let (adapter, vars) =
        LoraAdapter::new_trainable(cfg, engine.model().config(), engine.model().device(), 7)
            .unwrap();
    LlmSft::new(
        engine.model().clone(),
        adapter,
        vars,
        LlmSftConfig {
            learning_rate,
            ..LlmSftConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn demonstrations_train_only_the_assistant_and_sft_learns_them() {
    let Some(engine) = engine() else { return };
    let template = engine.chat_template().unwrap();
    let tok = engine.tokenizer();
    let demos = vec![
        demo(
            1,
            json!([
                {"role": "system", "content": "You write SQLite."},
                {"role": "user", "content": "How many singers are there?"},
                {"role": "assistant", "content": "```sql\nSELECT count(*) FROM singer\n```"}
            ]),
        ),
        demo(
            2,
            json!([
                {"role": "user", "content": "Name the stadiums."},
                {"role": "assistant", "content": "```sql\nSELECT name FROM stadium\n```"},
                {"role": "user", "content": "Only the big ones."},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "run_sql", "arguments": "{\"query\": \"SELECT 1\"}"}}]}
            ]),
        ),
    ];
    let samples =
        demonstration_samples(&demos, template, tok, "demos.jsonl", engine.max_context()).unwrap();
    assert_eq!(samples.len(), 2);
    let trained = |i: usize| {
        let s = &samples[i];
        let ids: Vec<u32> = s.tokens[s.prompt_len..]
            .iter()
            .zip(&s.loss_mask)
            .filter(|(_, m)| **m)
            .map(|(t, _)| *t)
            .collect();
        tok.decode(&ids, false).unwrap()
    };
    // Exactly the assistant's answer and its end-of-turn token: no header, no user turn.
    assert_eq!(
        trained(0),
        "```sql\nSELECT count(*) FROM singer\n```<|im_end|>"
    );
    let prompt = tok
        .decode(&samples[0].tokens[..samples[0].prompt_len], false)
        .unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    assert!(prompt.contains("How many singers are there?"));
    // Two assistant turns in one sample; the user turn between them is context.
    assert!(trained(1).starts_with("```sql\nSELECT name FROM stadium\n```<|im_end|>"));
    assert!(!trained(1).contains("Only the big ones."));

    // A few updates on the demonstrations lower their loss.
    let mut learner = sft(&engine, 2e-3);
    let first = learner.step(&samples).unwrap();
    assert_eq!(first.trained_samples, 2);
    assert!(first.loss > 0.0 && first.grad_norm > 0.0, "{first:?}");
    let mut last = first;
    for _ in 0..3 {
        last = learner.step(&samples).unwrap();
    }
    assert!(
        last.loss < 0.9 * first.loss,
        "the loss went from {} to {}",
        first.loss,
        last.loss
    );

    // Nothing rewarded: nothing to select, nothing trained.
    let before = learner.adapter().snapshot().unwrap();
    let e = learner
        .update(samples.clone(), &HashMap::new())
        .unwrap_err();
    assert!(matches!(e, TrainError::NothingToLearn(_)), "{e}");
    assert!(e.to_string().contains("no rollout"), "{e}");
    let after = learner.adapter();
    let (a, b) = (
        before.get(0, Target::Q).unwrap().b.flatten_all().unwrap(),
        after.get(0, Target::Q).unwrap().b.flatten_all().unwrap(),
    );
    let diff: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(diff, 0.0);
    // With rewards, the top half is trained.
    let rewards: HashMap<String, f64> = samples
        .iter()
        .map(|s| (s.rollout_id.clone(), 1.0))
        .collect();
    let stats = learner.update(samples, &rewards).unwrap();
    assert_eq!((stats.samples, stats.trained_samples), (2, 1));
}
