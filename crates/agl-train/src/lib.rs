//! agl training: the governed runner, reward shaping, the span→triplet adapter, GRPO and the
//! built-in candle policy model, wired into one loop over a LightningStore.
//!
//! # The seed API (agentmesh-lightning's names, in Rust)
//! * [`GovernedRunner`] runs an [`Agent`] whose actions are checked through a [`StepContext`],
//!   and returns [`GovernedRollout`]s with their [`PolicyViolation`]s; [`GovernedRunner::iter`]
//!   serves a LightningStore queue, and statistics are summed over the store's workers.
//! * [`PolicyReward`] / [`RewardConfig`] / [`policy_penalty`] / [`CompositeReward`] shape rewards.
//! * [`GovernedEnvironment`] / [`EnvironmentConfig`] is a Gymnasium-style [`Environment`] over
//!   any [`EnvTask`]; [`SpiderEnv`] is the multi-step Spider task; [`create_governed_env`].
//! * [`FlightRecorderEmitter`] turns flight-recorder entries into [`LightningSpan`]s or store
//!   spans.
//! * [`LlmSqlAgent`] is Agent Lightning's Spider SQL agent (write → execute → check → rewrite)
//!   over any OpenAI-compatible endpoint, every statement governed; violations of the model's
//!   output found by the LLM gateway reach [`PolicyReward`] through the runner.
//!
//! [`LlmGrpo`] trains an LLM's LoRA adapter with GRPO from the adapter's triplets
//! ([`samples_from_triplets`]: multi-turn merging with context masked; [`assign_advantages`]:
//! group-relative; a token-level clipped surrogate with DAPO's clip-higher).
//!
//! [`TracerTraceToTriplet`] is Agent Lightning's span→triplet adapter over LLM-call spans (one
//! triplet per call, token ids as recorded); `adapt_for_training` refuses calls without token ids
//! and reports them in a [`TripletReport`].
//!
//! One severity→penalty table ([`SEVERITY_PENALTIES`]) serves violations, rewards and the
//! environment. Each module's docs list where and why agl deliberately differs from the Python
//! original; `python_compat` switches reproduce the Python numbers.
//!
//! # The built-in training loop
//! The loop (see the repository's DESIGN): the trainer samples actions from the policy and
//! enqueues rollouts; runner workers dequeue them, ask the governance kernel, execute what is
//! allowed in a rolled-back sandbox, shape the reward with [`PolicyReward`], and report spans;
//! the trainer reads the spans back as triplets and updates the policy with [`Grpo`].
//! [`train_with`] saves the scorer's parameters as it goes and resumes from a saved step
//! ([`checkpoint`]: `model.safetensors` + `config.json` per checkpoint directory).

pub mod adapter;
pub mod checkpoint;
pub mod emitter;
pub mod environment;
pub mod error;
pub mod features;
pub mod grpo;
pub mod llm_grpo;
pub mod model;
pub mod reward;
pub mod runner;
pub mod spider_env;
pub mod spider_runner;
pub mod sql_agent;
pub mod task;
pub mod tracer_adapter;
pub mod trainer;
pub mod training_mode;
pub mod violation;

pub use adapter::{RolloutResult, rollout_result, to_triplet};
pub use checkpoint::{Checkpoint, CheckpointConfig, CheckpointPlan, ModelSpec, TrainingState};
pub use emitter::{
    EmitterConfig, EmitterStats, FlightRecorderEmitter, LightningSpan, ViolationSummary,
    create_emitter,
};
pub use environment::{
    ActionTask, Approval, EnvMetrics, EnvTask, Environment, EnvironmentConfig, EnvironmentState,
    GovernedEnvironment, ResetInfo, Space, StepInfo, StepResult, TaskGenerator, TaskOutcome,
    TaskRewardFn, ViolationRecord, create_governed_env,
};
pub use error::TrainError;
pub use features::{FEATURE_DIM, FEATURES_VERSION, SparseFeatures, featurize};
pub use grpo::{Grpo, GrpoConfig, StepStats, group_advantages};
pub use llm_grpo::{
    LlmGrpo, LlmGrpoConfig, LlmStepStats, TokenSample, assign_advantages, samples_from_triplets,
};
pub use model::{FeatureBatch, PolicyModel, Scorer};
pub use reward::{
    BaseRewardFn, CompositeReward, PolicyReward, RewardBreakdown, RewardComponent, RewardConfig,
    RewardStats, create_policy_reward, policy_penalty,
};
pub use runner::{
    Agent, AgentError, Annotation, Approved, CancellationToken, GovernedRunner, HEARTBEAT_KEY,
    IterReport, LlmEndpoint, RunnerStats, SOURCE_ATTR, SOURCE_GATEWAY, StepContext,
    ViolationCallback, gateway_violations, governance_attributes,
};
pub use spider_env::{PREVIEW_ROWS, QueryFeedback, SpiderAction, SpiderEnv, SpiderObservation};
pub use spider_runner::{
    Assignment, FixedRunners, RunnerResolver, SpiderRunner, SqlTaskInput, StepOutcome,
    WorkerOptions, outcome_spans, run_worker,
};
pub use sql_agent::{
    LlmSqlAgent, PolicyCounts, SqlAgentConfig, SqlAgentOutput, SqlEvalRow, SqlEvalSummary,
    SqlResult, SqlTaskReward, SqlTurn, StopReason, sql_agent_reward, sql_eval_row,
};
pub use task::{PreparationReport, SpiderTask, TaskConfig, TaskItem};
pub use tracer_adapter::{
    DEFAULT_LLM_CALL_MATCH, RefusalReason, RefusedLlmCall, RewardMatchPolicy, TracerTraceToTriplet,
    TripletReport,
};
pub use trainer::{
    CurvePoint, EvalStats, Progress, RUN_SPEC_KEY, RunOptions, RunReport, RunSpec, Session,
    TrainConfig, TrainStats, build_kernel, initial_policy, train, train_with,
};
pub use training_mode::{TrainingMode, parse_modes};
pub use violation::{
    GovernedRollout, Penalized, PolicyViolation, PolicyViolationError, PolicyViolationType,
    SEVERITY_PENALTIES, severity_from_python, severity_penalty,
};
