//! agl training: the governed runner, reward shaping, the span→triplet adapter, GRPO and the
//! built-in candle policy model, wired into one loop over a LightningStore.
//!
//! The loop (see the repository's DESIGN): the trainer samples actions from the policy and
//! enqueues rollouts; runner workers dequeue them, ask the governance kernel, execute what is
//! allowed in a rolled-back sandbox, shape the reward with [`PolicyReward`], and report spans;
//! the trainer reads the spans back as triplets and updates the policy with [`Grpo`].

pub mod adapter;
pub mod error;
pub mod features;
pub mod grpo;
pub mod model;
pub mod reward;
pub mod runner;
pub mod spider_runner;
pub mod task;
pub mod trainer;
pub mod violation;

pub use adapter::{RolloutResult, rollout_result, to_triplet};
pub use error::TrainError;
pub use features::{FEATURE_DIM, SparseFeatures, featurize};
pub use grpo::{Grpo, GrpoConfig, StepStats, group_advantages};
pub use model::{FeatureBatch, PolicyModel, Scorer};
pub use reward::{
    BaseRewardFn, CompositeReward, PolicyReward, RewardBreakdown, RewardComponent, RewardConfig,
    RewardStats, create_policy_reward, policy_penalty,
};
pub use runner::{
    Agent, AgentError, Annotation, Approved, GovernedRunner, HEARTBEAT_KEY, IterReport,
    RunnerStats, StepContext, ViolationCallback, governance_attributes,
};
pub use spider_runner::{SpiderRunner, SqlTaskInput, StepOutcome, outcome_spans, run_worker};
pub use task::{PreparationReport, SpiderTask, TaskConfig, TaskItem};
pub use trainer::{
    CurvePoint, EvalStats, Progress, RunReport, Session, TrainConfig, TrainStats, build_kernel,
    initial_policy, train,
};
pub use violation::{
    GovernedRollout, Penalized, PolicyViolation, PolicyViolationError, PolicyViolationType,
    SEVERITY_PENALTIES, severity_from_python, severity_penalty,
};
