//! The one error enum of `agl-llm`. Every variant names what was wrong and, where there is one,
//! the file; none of them is a panic. The HTTP layer maps them to OpenAI's error shape.

use std::path::PathBuf;

/// Everything that can go wrong while fetching, loading, tokenizing, sampling or serving.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A model file is malformed, truncated or lacks a tensor or key the model needs.
    #[error("{path}: {message}")]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The model's architecture is not one agl runs (llama-family: `llama`, `qwen2`).
    #[error("{path}: unsupported architecture `{architecture}` (agl runs llama and qwen2)")]
    UnsupportedArchitecture {
        /// The file that names the architecture.
        path: PathBuf,
        /// The architecture it names.
        architecture: String,
    },
    /// `--model` names neither a known model, a GGUF file nor a model directory.
    #[error(
        "model `{0}` not found: give a known name (see `agl model list`), a .gguf file or a Hugging Face model directory"
    )]
    ModelNotFound(String),
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// Fetching a model failed (pip missing, network, checksum); nothing was left behind.
    #[error("model pull: {0}")]
    Pull(String),
    /// A LoRA adapter directory is malformed or does not fit the model.
    #[error("adapter {path}: {message}")]
    Adapter {
        /// The adapter directory or file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The prompt plus at least one new token does not fit the model's context.
    #[error(
        "this model's maximum context length is {max_context} tokens; the prompt has {prompt_tokens} tokens"
    )]
    ContextLength {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The model's context length in tokens.
        max_context: usize,
    },
    /// A request parameter is out of range or inconsistent.
    #[error("invalid `{param}`: {message}")]
    InvalidRequest {
        /// The parameter, as named in OpenAI's API.
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// No model or adapter is served under this name.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// Generation failed inside the engine's worker (the message says why).
    #[error("generation failed: {0}")]
    Generation(String),
    /// The engine's worker has stopped (the server is shutting down).
    #[error("the engine has stopped")]
    EngineStopped,
    /// A field of an [`EngineSpec`](crate::startup::EngineSpec) is out of range or malformed;
    /// the message names the `agl` flag it comes from and what it expects.
    #[error("{0}")]
    InvalidSpec(String),
    /// A step of [`start_engine`](crate::startup::start_engine) failed: `step` says which
    /// (`resolving --model NAME`, `loading the model`, …), `source` why.
    #[error("{step}")]
    Startup {
        /// The step, as a person reads it.
        step: String,
        /// The step's error.
        #[source]
        source: Box<LlmError>,
    },
    /// A tensor operation failed.
    #[error("tensor: {0}")]
    Candle(#[from] candle_core::Error),
}

impl LlmError {
    /// An [`LlmError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// An [`LlmError::ModelFile`] for `path`.
    pub fn model_file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::ModelFile {
            path: path.into(),
            message: message.into(),
        }
    }

    /// An [`LlmError::InvalidRequest`].
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            param: param.into(),
            message: message.into(),
        }
    }
}

/// The result type of `agl-llm`.
pub type Result<T, E = LlmError> = std::result::Result<T, E>;
