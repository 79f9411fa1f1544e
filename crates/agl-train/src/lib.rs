//! agl training, task-agnostic: the seed API, runners, rewards, training modes, the
//! span→triplet adapters and the GRPO maths, for any agent and any task.
//!
//! Not for any one task: the built-in Spider task (its scorer, its SQL-writing LLM agent, their
//! rewards, reports and checkpoints) is `agl-spider`, which builds on this crate; nor for
//! serving (the store server and the LLM gateway are `agl-server`) or for the command line.
//!
//! # The seed API (agentmesh-lightning's names, in Rust)
//! * [`GovernedRunner`] runs an [`Agent`] whose actions are checked through a [`StepContext`],
//!   and returns [`GovernedRollout`]s with their [`PolicyViolation`]s; [`GovernedRunner::iter`]
//!   serves a LightningStore queue, and statistics are summed over the store's workers.
//! * [`PolicyReward`] / [`RewardConfig`] / [`policy_penalty`] / [`CompositeReward`] shape rewards.
//! * [`GovernedEnvironment`] / [`EnvironmentConfig`] is a Gymnasium-style [`Environment`] over
//!   any [`EnvTask`] (the Spider task's multi-step `SpiderEnv` is one); [`create_governed_env`].
//! * [`FlightRecorderEmitter`] turns flight-recorder entries into [`LightningSpan`]s or store
//!   spans.
//!
//! # Agent Lightning's instrumentation for Rust agents
//! An agent's [`StepContext`] has Agent Lightning's emitters ([`instrument`]): `emit_reward`,
//! `emit_rewards`, `emit_message`, `emit_object`, `emit_exception`, and operations that name
//! the agent of the LLM calls made inside them, so `TracerTraceToTriplet`'s `agent_match` can
//! train one role of a multi-agent system:
//!
//! ```
//! use agl_train::{Agent, AgentError, StepContext};
//!
//! struct Sql;
//!
//! #[async_trait::async_trait]
//! impl Agent for Sql {
//!     type Input = String;
//!     type Output = String;
//!     async fn run(&self, question: &String, ctx: &mut StepContext) -> Result<String, AgentError> {
//!         let op = ctx.start_operation("write").agent("write").input("question", question);
//!         let sql = String::from("SELECT count(*) FROM singer"); // the model's answer
//!         ctx.end_operation(op.output(&sql));
//!         ctx.emit_object(&serde_json::json!({"tables": ["singer"]}))?;
//!         ctx.emit_reward(1.0)?; // the rollout's reward unless the runner has a PolicyReward
//!         Ok(sql)
//!     }
//! }
//! ```
//!
//! [`LlmGrpo`] trains an LLM's LoRA adapter with GRPO from the adapter's triplets
//! ([`samples_from_triplets`]: multi-turn merging with context masked; [`assign_advantages`]:
//! group-relative; a token-level clipped surrogate with DAPO's clip-higher). [`group_advantages`]
//! and [`clip_grad_norm`] are the GRPO maths every learner shares; [`checkpoint`] writes a
//! checkpoint directory atomically.
//!
//! [`LlmSft`] trains the same adapter by supervised fine-tuning: the top fraction of a step's
//! samples by reward ([`select_top_fraction`], Agent Lightning's Unsloth example), or OpenAI
//! chat-format demonstrations tokenised with the model's template ([`demonstrations`]). Both
//! are [`Learner`]s.
//!
//! [`LlmLoop`] is the loop that drives a [`Learner`] through a store for any agent and task:
//! batches of rollouts ([`run_batch`] over a [`RunnerPool`], e.g. [`InProcessRunners`]),
//! triplets, one update per step, the next adapter version published through
//! [`PolicyServing`] (the serving side, implemented where the engine and gateway are wired),
//! checkpoints ([`save_checkpoint`], [`TrainerState`]) and progress ([`LoopObserver`]).
//!
//! [`ExecRunners`] (Unix) is a [`RunnerPool`] that runs a shell command per rollout, so an
//! agent in any language is served with no code change: the task on stdin, the LLM endpoint in
//! `OPENAI_BASE_URL`, the reward as the last stdout line `{"reward": r}` ([`exec_runner`]).
//!
//! [`TracerTraceToTriplet`] is Agent Lightning's span→triplet adapter over LLM-call spans (one
//! triplet per call, token ids as recorded); `adapt_for_training` refuses calls without token ids
//! and reports them in a [`TripletReport`].
//!
//! [`TraceToMessages`] is Agent Lightning's span→messages adapter: one OpenAI chat conversation
//! per LLM call. [`apo`] is Automatic Prompt Optimization (Agent Lightning's beam search with
//! textual gradients) over any [`apo::PromptEvaluator`] and OpenAI-compatible optimiser.
//!
//! [`paired()`] (module [`mod@paired`]) compares two evaluations of the same questions (a 95% paired bootstrap interval
//! of the difference, McNemar's exact test).
//!
//! One severity→penalty table ([`SEVERITY_PENALTIES`]) serves violations, rewards and the
//! environment. Each module's docs list where and why agl deliberately differs from the Python
//! original; `python_compat` switches reproduce the Python numbers.

pub mod apo;
pub mod checkpoint;
pub mod dataset;
#[cfg(feature = "llm")]
pub mod demonstrations;
pub mod emitter;
pub mod environment;
pub mod error;
#[cfg(unix)]
pub mod exec_runner;
pub mod grpo;
pub mod instrument;
#[cfg(feature = "llm")]
pub mod learner;
#[cfg(feature = "llm")]
pub mod llm_grpo;
#[cfg(feature = "llm")]
pub mod llm_loop;
#[cfg(feature = "llm")]
pub mod llm_sft;
pub mod messages_adapter;
pub mod paired;
pub mod reward;
pub mod rollout_batch;
pub mod runner;
pub mod tracer_adapter;
pub mod training_mode;
pub mod violation;

pub use dataset::load_dataset;
#[cfg(feature = "llm")]
pub use demonstrations::{Demonstration, demonstration_samples, load_demonstrations};
pub use emitter::{
    EmitterConfig, EmitterStats, FlightRecorderEmitter, LightningSpan, StoreEntry, StoreSpan,
    ViolationSummary, create_emitter,
};
pub use environment::{
    ActionTask, Approval, EnvMetrics, EnvTask, Environment, EnvironmentConfig, EnvironmentState,
    GovernedEnvironment, ResetInfo, Space, StepInfo, StepResult, TaskGenerator, TaskOutcome,
    TaskRewardFn, ViolationRecord, create_governed_env,
};
pub use error::TrainError;
#[cfg(unix)]
pub use exec_runner::{
    DEFAULT_EXEC_TIMEOUT_SECONDS, ExecConfig, ExecReport, ExecRunners, STDERR_TAIL_BYTES,
    STDOUT_KEEP_BYTES, WhenIdle, parse_reward_line, run_exec_worker,
};
#[cfg(feature = "llm")]
pub use grpo::clip_grad_norm;
pub use grpo::group_advantages;
pub use instrument::{AGENT_NAME_ATTR, Operation};
#[cfg(feature = "llm")]
pub use learner::Learner;
#[cfg(feature = "llm")]
pub use llm_grpo::{
    LlmGrpo, LlmGrpoConfig, LlmStepStats, TokenSample, assign_advantages, samples_from_triplets,
};
#[cfg(feature = "llm")]
pub use llm_loop::{
    LlmLoop, LlmLoopConfig, LoopObserver, PolicyServing, StepOutcome, StepStats, TRAINER_STATE,
    TrainerState, policy_version, save_checkpoint,
};
#[cfg(feature = "llm")]
pub use llm_sft::{DEFAULT_TOP_FRACTION, LlmSft, LlmSftConfig, select_top_fraction};
pub use messages_adapter::{Conversation, MessagesReport, TraceToMessages};
pub use paired::{Paired, paired};
pub use reward::{
    BaseRewardFn, CompositeReward, PolicyReward, RewardBreakdown, RewardComponent, RewardConfig,
    RewardStats, create_policy_reward, policy_penalty,
};
pub use rollout_batch::{
    BatchPlan, DEFAULT_LLM_RESOURCE, ExternalRunners, FinishedRollout, InProcessRunners, Judged,
    RunnerPool, run_batch, run_batch_with,
};
pub use runner::{
    Agent, AgentError, Annotation, Approved, CancellationToken, GovernedRunner, HEARTBEAT_KEY,
    IterReport, LlmEndpoint, RunnerStats, SOURCE_ATTR, SOURCE_GATEWAY, StepContext,
    ViolationCallback, gateway_violations, governance_attributes,
};
pub use tracer_adapter::{
    DEFAULT_LLM_CALL_MATCH, RefusalReason, RefusedLlmCall, RewardMatchPolicy, TracerTraceToTriplet,
    TripletReport,
};
pub use training_mode::{TrainingMode, parse_modes};
pub use violation::{
    GovernedRollout, Penalized, PolicyViolation, PolicyViolationError, PolicyViolationType,
    SEVERITY_PENALTIES, severity_from_python, severity_penalty,
};
