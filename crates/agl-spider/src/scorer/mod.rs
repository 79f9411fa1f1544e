//! The built-in scorer agent: a small candle policy that answers a Spider question by choosing
//! one statement from its candidate set, trained with GRPO through a LightningStore.
//!
//! Responsible for the scorer end to end: its features ([`features`]), model ([`model`]), GRPO
//! learner ([`grpo`], on `agl-train`'s shared maths), runner ([`runner`]), span→result adapter
//! ([`adapter`]), training loop ([`trainer`]), checkpoints ([`checkpoint`]) and its evaluation
//! on a chosen subset ([`eval`]). Not for the task-agnostic runtime (`agl-train`) nor for
//! printing or files (the CLI).
//!
//! # The loop
//! The trainer samples actions from the policy and enqueues rollouts; runner workers dequeue
//! them, ask the governance kernel, execute what is allowed in a rolled-back sandbox, shape the
//! reward with `PolicyReward`, and report spans; the trainer reads the spans back and updates
//! the policy with [`Grpo`]. [`train_with`] saves the scorer's parameters as it goes and resumes
//! from a saved step ([`checkpoint`]: `model.safetensors` + `config.json` per checkpoint
//! directory).

pub mod adapter;
pub mod checkpoint;
pub mod eval;
pub mod features;
pub mod grpo;
pub mod model;
pub mod runner;
pub mod trainer;

pub use adapter::{RolloutResult, rollout_result, to_triplet};
pub use checkpoint::{Checkpoint, CheckpointConfig, CheckpointPlan, ModelSpec, TrainingState};
pub use eval::{ScorerEval, ScorerRow, SubsetEval, evaluate_subset};
pub use features::{FEATURE_DIM, FEATURES_VERSION, SparseFeatures, featurize};
pub use grpo::{Grpo, GrpoConfig, StepStats};
pub use model::{FeatureBatch, PolicyModel, Scorer};
pub use runner::{
    Assignment, FixedRunners, RunnerResolver, SpiderRunner, SqlTaskInput, StepOutcome,
    WorkerOptions, outcome_spans, run_worker,
};
pub use trainer::{
    CurvePoint, EvalStats, Progress, RUN_SPEC_KEY, RunOptions, RunReport, RunSpec, Session,
    TrainConfig, TrainStats, build_kernel, initial_policy, train, train_with,
};
