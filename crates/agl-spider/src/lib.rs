//! agl's built-in Spider task: answer a Spider 1.0 question by choosing ONE SQL statement from
//! a candidate set.
//!
//! This crate provides the data loader ([`SpiderDataset`]), database descriptions
//! ([`db_info`]), the sandboxed SQL executor ([`Executor`]: in-memory copies, every call
//! rolled back, time limit), the execution-accuracy evaluator ([`execution_match`],
//! [`gold_is_ordered`]), schema-linking similarity ([`schema_linking`], a partial-credit
//! signal), the candidate builder ([`CandidateBuilder`]: gold, hard-negative
//! distractors, unsafe variants) and the prompts of the SQL-writing LLM agent ([`prompts`]).
//!
//! On top of those it holds the task's agents, trained and evaluated through `agl-train`'s
//! task-agnostic runtime:
//! * the **scorer** ([`scorer`]): a small candle policy π(candidate | question) over sparse
//!   features ([`featurize`], [`Scorer`]), its GRPO learner ([`Grpo`]), its runner
//!   ([`SpiderRunner`]: kernel check, sandboxed execution, [`agl_train::PolicyReward`], spans),
//!   its span→result adapter ([`rollout_result`]), its training loop through a LightningStore
//!   ([`train_with`], progress through a callback) and its checkpoints ([`Checkpoint`]);
//! * the multi-step Gymnasium-style task [`SpiderEnv`] for [`agl_train::GovernedEnvironment`];
//! * the **SQL-writing LLM agent** ([`LlmSqlAgent`]): Agent Lightning's Spider agent (write →
//!   execute → check → rewrite) over any OpenAI-compatible endpoint, every statement governed,
//!   with its reward ([`sql_agent_reward`]) and evaluation rows ([`SqlEvalRow`]), and what it
//!   is as a GRPO task for `agl-train`'s LLM loop ([`llm_train`]: curriculum, dev subset,
//!   judgement, curve points and the run's report).
//!
//! Not for anything another task could use: runners, rewards, adapters, GRPO maths and the
//! LLM learner are `agl-train`'s; the governance kernel is `agl-gov`'s.
//!
//! Data: Spider 1.0 (Yu et al. 2018, "Spider: A Large-Scale Human-Labeled Dataset for Complex
//! and Cross-Domain Semantic Parsing and Text-to-SQL Task", EMNLP 2018, arXiv:1809.08887),
//! licensed CC BY-SA 4.0, vendored under `data/spider` (see its `SOURCE.md`). The crate only
//! reads those files; databases are opened read-only.

mod candidates;
mod data;
mod env;
mod error;
mod eval;
mod executor;
mod linking;
pub mod llm_train;
pub mod prompts;
mod schema;
pub mod scorer;
mod sql;
pub mod sql_agent;
mod task;

pub use candidates::{
    Candidate, CandidateBuilder, CandidateConfig, CandidateKind, MAX_GUARD_ALIASES,
};
pub use data::{DATABASE_DIR, DEV_FILE, Question, SkipReport, SpiderDataset, Split, TRAIN_FILE};
pub use env::{PREVIEW_ROWS, QueryFeedback, SpiderAction, SpiderEnv, SpiderObservation};
pub use error::SpiderError;
pub use eval::{execution_match, gold_is_ordered};
pub use executor::{
    Execution, Executor, ExecutorConfig, MAX_RESULT_ROWS, ResultSet, SqliteLimits, Value,
};
pub use linking::{schema_items, schema_linking, schema_names};
pub use llm_train::{
    Curriculum, DevPaired, LlmCurvePoint, LlmDataReport, LlmReport, LlmReportConfig, LlmRun,
    LlmUntrained, SqlStep, dev_questions, is_easy, train_questions,
};
pub use schema::{DbInfo, ForeignKey, TableInfo, db_info};
pub use scorer::{
    Assignment, Checkpoint, CheckpointConfig, CheckpointPlan, CurvePoint, EvalStats, FEATURE_DIM,
    FEATURES_VERSION, FeatureBatch, FixedRunners, Grpo, GrpoConfig, ModelSpec, PolicyModel,
    Progress, RUN_SPEC_KEY, RolloutResult, RunOptions, RunReport, RunSpec, RunnerResolver, Scorer,
    Session, SparseFeatures, SpiderRunner, SqlTaskInput, StepOutcome, StepStats, TrainConfig,
    TrainStats, TrainingState, WorkerOptions, build_kernel, featurize, initial_policy,
    outcome_spans, rollout_result, run_worker, to_triplet, train, train_with,
};
pub use sql_agent::{
    CheckMode, LlmSqlAgent, PolicyCounts, SqlAgentConfig, SqlAgentOutput, SqlEvalRow,
    SqlEvalSummary, SqlResult, SqlTaskReward, SqlTurn, StopReason, sql_agent_reward, sql_eval_row,
};
pub use task::{PreparationReport, SpiderTask, TaskConfig, TaskItem};
