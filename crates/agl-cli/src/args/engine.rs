//! The built-in engine's flags: which model, how its weights are held, where it runs, which
//! adapters it serves (`agl llm serve`, `agl bench gateway`), and the `--weights` values every
//! command that loads a model accepts.
//!
//! Not for starting the engine (the engine start-up) or for the commands whose `--model` help
//! says something of their own (`agl eval`, `agl train --agent llm`, `agl bench llm` keep their
//! field, so that their `--help` stays as it is).

use agl_llm::WeightFormat;
use clap::Args;

/// How linear weights are held in memory (`agl_llm::WeightFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Weights {
    /// f32: exact, the numbers training sees.
    Dense,
    /// GGML Q8_0 blocks: faster decoding, serving only.
    Q8,
}

impl Weights {
    /// The loader's format.
    pub fn format(self) -> WeightFormat {
        match self {
            Weights::Dense => WeightFormat::Dense,
            Weights::Q8 => WeightFormat::Q8,
        }
    }
}

/// Which model the built-in engine serves, and how (shared by `agl llm serve`, `agl store
/// --llm` and `agl eval`).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// The model: a known name (see `agl model list`; fetch it with `agl model pull`), a .gguf
    /// file, or a Hugging Face model directory.
    #[arg(long, value_name = "NAME|PATH", default_value = agl_llm::hub::DEFAULT_MODEL)]
    pub model: String,
    /// How to hold the linear weights: `dense` (f32: exact, what training recomputes) or `q8`
    /// (GGML Q8_0 blocks: faster decoding, serving only; output follows llama.cpp's).
    #[arg(long, value_enum, default_value = "dense")]
    pub weights: Weights,
    /// Where the model runs: cpu, cuda, cuda:N (a build with `--features cuda`), or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Serve a PEFT LoRA adapter directory under NAME (repeatable).
    #[arg(long = "adapter", value_name = "NAME=DIR")]
    pub adapters: Vec<String>,
    /// The base model's name in the API (`model` of requests); default: `--model` when it is
    /// a name, else the file's or directory's name.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Most completions decoded in one batch step; more requests wait in a queue.
    #[arg(long, default_value_t = 64)]
    pub max_batch_rows: usize,
}
