//! The error type of `agl-train`.
//!
//! Responsible for naming what went wrong in training, evaluation and the runner loop; the
//! lower crates' errors are wrapped, not re-described.

/// Everything that can fail while building a task, running rollouts or updating the policy.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The task's own code failed (for example the built-in Spider task's data or executor);
    /// its error keeps its message.
    #[error(transparent)]
    Task(Box<dyn std::error::Error + Send + Sync>),
    /// The governance kernel failed (for example the flight recorder could not write).
    #[error(transparent)]
    Gov(#[from] agl_gov::GovError),
    /// The LightningStore refused an operation.
    #[error(transparent)]
    Store(#[from] agl_store::StoreError),
    /// A tensor operation of the policy model failed.
    #[cfg(feature = "llm")]
    #[error("policy model: {0}")]
    Model(#[from] candle_core::Error),
    /// The LLM engine or model failed (a forward pass, an adapter file).
    #[cfg(feature = "llm")]
    #[error(transparent)]
    Llm(#[from] agl_llm::LlmError),
    /// A configuration value is out of range; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A rollout's input or spans did not have the expected shape.
    #[error("malformed rollout {rollout_id}: {message}")]
    Rollout {
        /// The rollout whose input or spans were malformed.
        rollout_id: String,
        /// What was wrong.
        message: String,
    },
    /// The kernel blocked an action; it did not run ([`crate::StepContext::check`]).
    #[error(transparent)]
    Blocked(crate::PolicyViolationError),
    /// An earlier action of the step was blocked and the runner has `fail_on_violation`: this
    /// action was refused without a check.
    #[error("refused: the step already had a blocked action and fail_on_violation is set ({0})")]
    Aborted(crate::PolicyViolationError),
    /// The runner or environment was used out of order (for example `step` before `init`), or
    /// the kernel failed during a step.
    #[error("{0}")]
    Runner(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A span→triplet adapter pattern (`llm_call_match`, `agent_match`, or the CLI flag named)
    /// is not a valid regular expression.
    #[error("{field}: invalid regular expression: {source}")]
    InvalidPattern {
        /// The setting or flag.
        field: String,
        /// The regex parser's message.
        #[source]
        source: regex::Error,
    },
    /// An Agent Lightning emitter of [`crate::StepContext`] was given something it cannot
    /// record (a reward that is not a finite number, no reward dimension, an object that does
    /// not serialise to JSON); nothing was recorded.
    #[error("cannot emit: {0}")]
    Emit(String),
    /// An update had nothing to learn from (SFT: no rollout with a reward, nothing selected;
    /// no demonstration); nothing was trained.
    #[error("nothing to learn: {0}")]
    NothingToLearn(String),
    /// The span→triplet adapter was given no spans (Agent Lightning raises `ValueError`).
    #[error("no spans to adapt: the trace is empty")]
    EmptyTrace,
    /// A span attribute the adapter reads has the wrong shape; names the span.
    #[error("span {span_id}: {message}")]
    MalformedSpan {
        /// The span.
        span_id: String,
        /// What was wrong, naming the attribute.
        message: String,
    },
}
