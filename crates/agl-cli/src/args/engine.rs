//! The built-in engine's flags: which model, how its weights are held, where it runs, which
//! adapters it serves (`agl llm serve`, `agl bench gateway`), and the `--weights` values every
//! command that loads a model accepts; and [`start_engine`], which starts the engine such flags
//! describe and prints its progress lines.
//!
//! `--model` ([`ModelArg`]) and `--device` ([`DeviceArg`]) are defined here once; every command
//! that loads a model flattens them, and one whose help says something of its own (`agl eval`,
//! `agl train --agent llm`, `agl bench llm`) rewords it with clap's `mut_arg`.
//!
//! Not for the start-up itself (`agl_llm::startup`).

use agl_llm::WeightFormat;
use agl_llm::startup::{EngineSpec, StartedEngine, StartupEvent};
use clap::Args;

/// How linear weights are held in memory (`agl_llm::WeightFormat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Weights {
    /// f32: exact, the numbers training sees.
    Dense,
    /// GGML Q8_0 blocks: faster decoding, serving only.
    Q8,
    /// Both: prompts prefill through the dense weights, decoding reads the Q8_0 blocks
    /// (fastest on a CPU, at the memory of both); serving only.
    Hybrid,
}

impl Weights {
    /// The loader's format.
    pub fn format(self) -> WeightFormat {
        match self {
            Weights::Dense => WeightFormat::Dense,
            Weights::Q8 => WeightFormat::Q8,
            Weights::Hybrid => WeightFormat::Hybrid,
        }
    }

    /// The flag's value (`dense`, `q8`, `hybrid`).
    pub fn as_str(self) -> &'static str {
        match self {
            Weights::Dense => "dense",
            Weights::Q8 => "q8",
            Weights::Hybrid => "hybrid",
        }
    }
}

/// `--model`: the model a command loads.
#[derive(Debug, Clone, Args)]
pub struct ModelArg {
    /// The model: a known name (see `agl model list`; fetch it with `agl model pull`), a .gguf
    /// file, or a Hugging Face model directory.
    #[arg(long, value_name = "NAME|PATH", default_value = agl_llm::hub::DEFAULT_MODEL)]
    pub model: String,
}

/// `--device`: where a command runs its model.
#[derive(Debug, Clone, Args)]
pub struct DeviceArg {
    /// Where the model runs: cpu, cuda, cuda:N (a build with `--features cuda`), or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

/// The flag's value reads as the string it holds.
macro_rules! reads_as_str {
    ($t:ty, $field:ident) => {
        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.$field
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.$field)
            }
        }
    };
}
reads_as_str!(ModelArg, model);
reads_as_str!(DeviceArg, device);

/// Which model the built-in engine serves, and how (shared by `agl llm serve` and `agl bench
/// gateway`).
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// How to hold the linear weights: `dense` (f32: exact, what training recomputes), `q8`
    /// (GGML Q8_0 blocks: faster decoding, serving only; output follows llama.cpp's) or
    /// `hybrid` (both: prompts prefill dense, decoding reads Q8_0; serving only).
    #[arg(long, value_enum, default_value = "dense")]
    pub weights: Weights,
    #[command(flatten)]
    pub device: DeviceArg,
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
    /// Budget of the prefix cache in prompt positions over all kept prompts (0: off): a
    /// request reuses the keys and values of the longest prefix it shares with a recently
    /// prefilled prompt (vLLM's automatic prefix caching).
    #[arg(long, value_name = "N", default_value_t = agl_llm::DEFAULT_PREFIX_CACHE_TOKENS)]
    pub prefix_cache_tokens: usize,
}

impl EngineArgs {
    /// The engine these flags describe.
    pub fn spec(&self) -> EngineSpec {
        EngineSpec {
            model: self.model.model.clone(),
            weights: self.weights.format(),
            device: self.device.device.clone(),
            adapters: self.adapters.clone(),
            served_model_name: self.served_model_name.clone(),
            max_batch_rows: self.max_batch_rows,
            prefix_cache_tokens: self.prefix_cache_tokens,
        }
    }
}

/// Loads the model and its adapters and starts the engine; `who` prefixes the progress lines
/// on stderr (`{who}: loaded SOURCE as `NAME` in S s`, `{who}: adapter `NAME` from DIR`).
pub fn start_engine(spec: &EngineSpec, who: &str) -> anyhow::Result<StartedEngine> {
    let started = agl_llm::start_engine(spec, |event| match event {
        StartupEvent::Loaded {
            source,
            name,
            seconds,
        } => eprintln!("{who}: loaded {source} as `{name}` in {seconds:.1} s"),
        StartupEvent::Adapter { name, dir } => {
            eprintln!("{who}: adapter `{name}` from {}", dir.display())
        }
    })?;
    Ok(started)
}
