//! The training loop: GRPO over governed rollouts that travel through a LightningStore.
//!
//! Responsible for one run (a governance mode, a seed): start runner workers, then per batch
//! sample G candidates per question from the current policy, enqueue the rollouts, wait for them,
//! read their spans back as triplets, update the policy, publish the new resources version; and
//! evaluate on the dev split (greedy choice, kernel enforcing). Not responsible for printing or
//! files (the CLI does that).
//!
//! Checkpoints ([`RunOptions`], `checkpoint`): with a [`CheckpointPlan`] the run saves the
//! policy as `step-N` every N GRPO updates and as `final` after the last update (before the dev
//! evaluation); a run resumed at step N skips the updates already done and goes on counting.
//!
//! Determinism: the trainer samples every action with a ChaCha8 generator seeded by `seed`, and
//! results are read back in enqueue order, so the same seed gives the same policy, curves and
//! metrics whatever the number of workers (timings aside).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::Split;
use agl_core::{
    EnqueueRolloutRequest, LlmResource, NamedResources, Resource, ResourcesUpdate, RolloutConfig,
    RolloutMode, RolloutStatus,
};
use agl_gov::{BuildEnv, DEFAULT_PRESET, FlightRecorder, GovernanceMode, Kernel, PolicyFile};
use agl_store::{InMemoryLightningStore, LightningStore};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;
use crate::scorer::adapter::{RolloutResult, rollout_result};
use crate::scorer::checkpoint::{self, CheckpointPlan, TrainingState};
use crate::scorer::grpo::{Grpo, GrpoConfig, greedy};
use crate::scorer::model::{FeatureBatch, PolicyModel, Scorer};
use crate::scorer::runner::{
    FixedRunners, RunnerResolver, SpiderRunner, SqlTaskInput, WorkerOptions, run_worker,
};
use crate::task::SpiderTask;
use agl_core::semconv;
use agl_train::reward::RewardConfig;
use agl_train::training_mode::TrainingMode;

/// Everything that defines a run besides the data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Passes over the train questions (default 2).
    pub epochs: usize,
    /// Runner workers (default 2).
    pub workers: usize,
    /// Seed of the policy initialisation, the question order and the action sampling.
    pub seed: u64,
    /// GRPO hyper-parameters.
    pub grpo: GrpoConfig,
    /// Reward shaping of the `enforce` training mode.
    pub reward: RewardConfig,
    /// The policy file (path) or preset name (`strict`, `standard`, `permissive`) that declares
    /// the kernel (default `standard`).
    pub policy: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 2,
            workers: 2,
            seed: 0,
            grpo: GrpoConfig::default(),
            reward: RewardConfig::default(),
            policy: DEFAULT_PRESET.to_string(),
        }
    }
}

impl TrainConfig {
    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), SpiderError> {
        self.grpo.validate()
    }
}

/// Training metrics of a run (JSON keys as in the report).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainStats {
    /// Rollouts run.
    pub rollouts: u64,
    /// Share of rollouts whose action violated at least one policy.
    pub violation_rate: f64,
    /// Mean final reward.
    pub mean_reward: f64,
    /// Share of rollouts whose action ran and matched the gold result.
    pub accuracy: f64,
    /// Statements that changed data or schema and ran (always rolled back, but counted).
    pub destructive_executed: u64,
    /// Flagged rollouts dropped from the policy gradient (`screen` mode; 0 otherwise).
    #[serde(default)]
    pub screened: u64,
    /// Rollouts per second of wall time, updates included.
    pub rollouts_per_second: f64,
}

/// Evaluation metrics on a split (greedy choice, kernel enforcing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalStats {
    /// Questions evaluated.
    pub questions: usize,
    /// Share of questions whose choice was allowed, ran and matched the gold result.
    pub accuracy: f64,
    /// Share of questions whose choice violated a policy: the policy's own greedy choices,
    /// checked by the kernel (what it would do were the kernel gone).
    pub violation_rate: f64,
    /// Mean probability the policy puts on the unsafe candidates of a question (the task's
    /// unsafe kinds: stacked writes, drops, deletes, updates without `WHERE`, cartesian
    /// guards), whatever it chooses greedily. `None` where the policy has no candidate set
    /// (the LLM agent).
    #[serde(default)]
    pub unsafe_probability: Option<f64>,
}

/// One point of the learning curve (one GRPO update).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Update number, from 1.
    pub step: usize,
    /// Rollouts run so far.
    pub rollouts: u64,
    /// Mean reward of the batch.
    pub reward: f64,
    /// Violation rate of the batch.
    pub violation_rate: f64,
    /// Accuracy of the batch.
    pub accuracy: f64,
}

/// The result of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Train metrics.
    pub train: TrainStats,
    /// Dev metrics after training.
    pub dev: EvalStats,
    /// Learning curve.
    pub curve: Vec<CurvePoint>,
    /// The training kernel's checks over the run: count, share answered from the check
    /// cache, time per check. Filled by whoever holds the kernel (`agl train` does); `None`
    /// when it ran in other processes.
    #[serde(default)]
    pub kernel: Option<agl_gov::KernelStats>,
}

/// A progress notification.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Rollouts finished in this phase.
    pub done: u64,
    /// Rollouts this phase will run.
    pub total: u64,
    /// Mean reward so far.
    pub mean_reward: f64,
    /// Violation rate so far.
    pub violation_rate: f64,
    /// Rollouts per second so far.
    pub rollouts_per_second: f64,
}

/// The key under which the trainer publishes its [`RunSpec`] in the `policy` resource's
/// `sampling_parameters`.
pub const RUN_SPEC_KEY: &str = semconv::agl::RUN;

/// What a runner process needs to serve a run's rollouts, published by the trainer in every
/// resources version it writes (`resources["policy"].sampling_parameters["agl.run"]`), so
/// `agl runner` processes need no configuration of their own beyond the data directory.
///
/// JSON fields as named; `sql_timeout_seconds` in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Training mode of `train` rollouts (evaluation rollouts always enforce).
    pub governance: TrainingMode,
    /// Policy file path or preset name declaring the kernel.
    pub policy: String,
    /// Reward shaping of the `enforce` training mode.
    pub reward: RewardConfig,
    /// Candidate set composition (must match the trainer's, since inputs index candidates).
    pub candidates: crate::CandidateConfig,
    /// The trainer's `--limit` (first N train questions).
    pub limit: Option<usize>,
    /// The trainer's `--dev-limit`.
    pub dev_limit: Option<usize>,
    /// Statement time limit, seconds.
    pub sql_timeout_seconds: f64,
}

impl RunSpec {
    /// The part of the spec that determines the prepared task (runners cache tasks by it).
    pub fn task_key(&self) -> String {
        serde_json::json!({
            "candidates": self.candidates,
            "limit": self.limit,
            "dev_limit": self.dev_limit,
            "sql_timeout_seconds": self.sql_timeout_seconds,
        })
        .to_string()
    }

    /// Reads the spec from a resources update; `Ok(None)` when it carries none.
    ///
    /// # Errors
    /// [`SpiderError::Config`] when the entry exists but is malformed (names the resources id).
    pub fn from_resources(update: &ResourcesUpdate) -> Result<Option<RunSpec>, SpiderError> {
        let Some(Resource::Llm(llm)) = update.resources.get("policy") else {
            return Ok(None);
        };
        let Some(value) = llm.sampling_parameters.get(RUN_SPEC_KEY) else {
            return Ok(None);
        };
        serde_json::from_value(value.clone()).map(Some).map_err(|e| {
            SpiderError::Config(format!(
                "resources `{}`: `policy.sampling_parameters.{RUN_SPEC_KEY}` is not a run spec: {e}",
                update.resources_id
            ))
        })
    }
}

/// Builds the kernel `policy` declares, in `mode` (overriding the file's mode), with the
/// task's table statistics for the cost policy and the task's check cache, recording into
/// `recorder` when given.
///
/// # Errors
/// [`SpiderError::Gov`] when a policy of the file rejects its configuration.
pub fn build_kernel(
    task: &SpiderTask,
    policy: &PolicyFile,
    mode: GovernanceMode,
    recorder: Option<Arc<FlightRecorder>>,
) -> Result<Kernel, SpiderError> {
    let env = BuildEnv {
        table_stats: task.table_stats.clone(),
        mode: Some(mode),
        check_cache: Some(task.check_cache.clone()),
    };
    let mut kernel = policy.build(&env)?;
    if let Some(r) = recorder {
        kernel = kernel.with_shared_recorder(r);
    }
    Ok(kernel)
}

/// Runner workers and the store they serve, for one run.
pub struct Session {
    task: Arc<SpiderTask>,
    mode: TrainingMode,
    store: Arc<dyn LightningStore>,
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Result<u64, SpiderError>>>,
    spec: Option<RunSpec>,
    rollout_config: Option<RolloutConfig>,
}

impl Session {
    /// Starts `workers` runner workers on a fresh in-memory store. Train rollouts run in
    /// training mode `mode` under `train_kernel` (whose mode must be `mode.kernel_mode()`);
    /// val rollouts under `eval_kernel`, which must enforce.
    ///
    /// # Errors
    /// [`SpiderError::Config`] when a kernel's mode does not fit.
    pub fn start(
        task: Arc<SpiderTask>,
        config: &TrainConfig,
        mode: TrainingMode,
        train_kernel: Arc<Kernel>,
        eval_kernel: Arc<Kernel>,
    ) -> Result<Self, SpiderError> {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        Self::start_on(store, task, config, mode, train_kernel, eval_kernel)
    }

    /// Starts `workers` runner workers serving `store` (any backend: memory, SQLite, a
    /// remote `agl store` through `agl_server::StoreClient`). Rollouts already queued in the
    /// store are served too. `config.workers == 0` starts none: runner processes serve the
    /// store (`agl runner`), and [`Session::with_spec`] tells them how. Kernels as for
    /// [`Session::start`].
    ///
    /// # Errors
    /// [`SpiderError::Config`] when a kernel's mode does not fit.
    pub fn start_on(
        store: Arc<dyn LightningStore>,
        task: Arc<SpiderTask>,
        config: &TrainConfig,
        mode: TrainingMode,
        train_kernel: Arc<Kernel>,
        eval_kernel: Arc<Kernel>,
    ) -> Result<Self, SpiderError> {
        let resolver: Arc<dyn RunnerResolver> = Arc::new(FixedRunners {
            train: Arc::new(SpiderRunner::new(
                train_kernel,
                mode,
                config.reward.clone(),
            )?),
            eval: Arc::new(SpiderRunner::new(
                eval_kernel,
                TrainingMode::Enforce,
                config.reward.clone(),
            )?),
            task: task.clone(),
        });
        Ok(Self::start_with(
            store,
            task,
            mode,
            config.workers,
            resolver,
            WorkerOptions::default(),
        ))
    }

    /// Starts `workers` workers that take their runner from `resolver` (what `agl runner`
    /// does), polling an empty queue as `options` says. `mode` is the training mode
    /// [`train_with`] applies to the gradient (the resolver's runners apply it to kernels and
    /// rewards).
    pub fn start_with(
        store: Arc<dyn LightningStore>,
        task: Arc<SpiderTask>,
        mode: TrainingMode,
        workers: usize,
        resolver: Arc<dyn RunnerResolver>,
        options: WorkerOptions,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = tokio::runtime::Handle::current();
        let pid = std::process::id();
        let workers = (0..workers)
            .map(|i| {
                let (h, st, r, s) = (
                    handle.clone(),
                    store.clone(),
                    resolver.clone(),
                    stop.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    run_worker(h, st, r, format!("Worker-{pid}-{i}"), s, options)
                })
            })
            .collect();
        Self {
            task,
            mode,
            store,
            stop,
            workers,
            spec: None,
            rollout_config: None,
        }
    }

    /// Publishes `spec` with every resources version this session writes, so runner processes
    /// can serve its rollouts.
    pub fn with_spec(mut self, spec: RunSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// Enqueues every rollout with `config` (timeouts and retries), e.g. so rollouts held by a
    /// runner process that died are retried by another (`unresponsive_seconds`,
    /// `retry_condition: [unresponsive]`).
    pub fn with_rollout_config(mut self, config: RolloutConfig) -> Self {
        self.rollout_config = Some(config);
        self
    }

    /// Evaluation rollouts' resources: with a spec, an `agl-eval` version that carries it.
    async fn eval_resources(&self) -> Result<Option<String>, SpiderError> {
        let Some(spec) = &self.spec else {
            return Ok(None);
        };
        let id = "agl-eval";
        self.store
            .update_resources(id, policy_resources(0, 0, Some(spec)))
            .await?;
        Ok(Some(id.to_string()))
    }

    /// The training mode of the session's train rollouts.
    pub fn mode(&self) -> TrainingMode {
        self.mode
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LightningStore> {
        &self.store
    }

    /// Stops the workers and waits for them; returns the rollouts each ran.
    pub async fn shutdown(mut self) -> Result<Vec<u64>, SpiderError> {
        self.stop.store(true, Ordering::Release);
        let mut counts = Vec::new();
        for w in self.workers.drain(..) {
            counts.push(w.await.map_err(|e| SpiderError::Worker(e.to_string()))??);
        }
        Ok(counts)
    }

    /// Enqueues one rollout per input, waits until all finished, and reads their results back
    /// from their spans, in input order.
    pub async fn run_rollouts(
        &self,
        inputs: &[SqlTaskInput],
        mode: RolloutMode,
        resources_id: Option<&str>,
    ) -> Result<Vec<RolloutResult>, SpiderError> {
        let requests = inputs
            .iter()
            .map(|inp| {
                let mut r =
                    EnqueueRolloutRequest::new(serde_json::to_value(inp).unwrap_or_default());
                r.mode = Some(mode);
                r.resources_id = resources_id.map(str::to_string);
                r.config = self.rollout_config.clone();
                r
            })
            .collect();
        let rollouts = self.store.enqueue_many(requests).await?;
        let ids: Vec<String> = rollouts.iter().map(|r| r.rollout_id.clone()).collect();
        let finished = self.store.wait_for_rollouts(&ids, None).await?;
        let by_id: HashMap<&str, _> = finished
            .iter()
            .map(|r| (r.rollout_id.as_str(), r))
            .collect();
        let mut results = Vec::with_capacity(ids.len());
        for id in &ids {
            let rollout = by_id.get(id.as_str()).ok_or_else(|| SpiderError::Rollout {
                rollout_id: id.clone(),
                message: "did not finish".into(),
            })?;
            if rollout.status != RolloutStatus::Succeeded {
                let why = self
                    .store
                    .get_latest_attempt(id)
                    .await?
                    .and_then(|a| a.metadata)
                    .map(|m| serde_json::Value::Object(m).to_string())
                    .unwrap_or_default();
                return Err(SpiderError::Rollout {
                    rollout_id: id.clone(),
                    message: format!("finished as {:?} {why}", rollout.status),
                });
            }
            let spans = self.store.list_spans(id, Some("latest")).await?;
            results.push(rollout_result(rollout, &spans)?);
        }
        Ok(results)
    }

    /// Greedy evaluation of `model` on `split` (val rollouts, so the eval kernel decides).
    pub async fn evaluate(
        &self,
        model: &dyn PolicyModel,
        split: Split,
    ) -> Result<EvalStats, SpiderError> {
        let items = self.task.items(split);
        let mut inputs = Vec::with_capacity(items.len());
        let mut unsafe_probability = 0.0;
        for (start, chunk) in items.chunks(128).enumerate().map(|(i, c)| (i * 128, c)) {
            let sets: Vec<&[_]> = chunk.iter().map(|it| it.features.as_slice()).collect();
            let batch = FeatureBatch::new(&sets)?;
            let log_probs = batch.log_probs(model)?;
            unsafe_probability += unsafe_mass(&log_probs, chunk)?;
            for (k, choice) in greedy(&log_probs)?.into_iter().enumerate() {
                inputs.push(SqlTaskInput {
                    split,
                    question: start + k,
                    candidate: choice,
                });
            }
        }
        let resources = self.eval_resources().await?;
        let results = self
            .run_rollouts(&inputs, RolloutMode::Val, resources.as_deref())
            .await?;
        let n = results.len().max(1) as f64;
        Ok(EvalStats {
            questions: results.len(),
            accuracy: results.iter().filter(|r| r.correct).count() as f64 / n,
            violation_rate: results.iter().filter(|r| r.violations > 0).count() as f64 / n,
            unsafe_probability: Some(unsafe_probability / items.len().max(1) as f64),
        })
    }
}

/// Sum over `items` of the probability `log_probs` (`[B, C]`, one row per item) puts on each
/// item's unsafe candidates.
fn unsafe_mass(log_probs: &Tensor, items: &[crate::task::TaskItem]) -> Result<f64, SpiderError> {
    let probs: Vec<Vec<f32>> = log_probs.exp()?.to_vec2()?;
    Ok(probs
        .iter()
        .zip(items)
        .map(|(row, item)| {
            row.iter()
                .zip(&item.candidates)
                .filter(|(_, c)| c.kind.is_unsafe())
                .map(|(p, _)| f64::from(*p))
                .sum::<f64>()
        })
        .sum())
}

/// The initial policy of a run with `seed`.
pub fn initial_policy(seed: u64) -> Result<Box<dyn PolicyModel>, SpiderError> {
    Ok(Box::new(Scorer::new(seed)?))
}

/// Trains one run in `session` and evaluates it on dev. `on_progress` is called after every
/// update. The same as [`train_with`] with default [`RunOptions`] (a fresh run, no
/// checkpoints).
pub async fn train(
    session: &Session,
    config: &TrainConfig,
    policy: Box<dyn PolicyModel>,
    on_progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<RunReport, SpiderError> {
    train_with(session, config, policy, RunOptions::default(), on_progress).await
}

/// Where a run starts and which checkpoints it writes ([`train_with`]).
///
/// The trainer's loop unit is the GRPO update (one batch of `batch_questions` questions, G
/// rollouts each); an epoch is `ceil(train questions / batch_questions)` updates, and updates
/// are numbered from 1 across epochs (the curve's `step`).
#[derive(Default)]
pub struct RunOptions {
    /// Updates already done (a run resumed from a checkpoint at this step; 0: a fresh run).
    /// The run's schedule is the same as a fresh run's: updates `1..=start_step` are skipped
    /// (their question order and sampling draws are replayed from the seed, without rollouts)
    /// and training continues with update `start_step + 1` until `epochs` epochs are complete.
    /// The optimiser's moments start fresh (they are not checkpointed).
    pub start_step: usize,
    /// The KL reference policy; `None`: the starting policy itself (right for a fresh run; a
    /// resumed run passes its seed's [`initial_policy`]).
    pub reference: Option<Box<dyn PolicyModel>>,
    /// The checkpoints to write (`step-N` every `every` updates, `final` before the dev
    /// evaluation); `None`: none.
    pub checkpoints: Option<CheckpointPlan>,
}

/// Trains one run in `session` from `policy` as `options` say (resume, checkpoints) and
/// evaluates it on dev. `on_progress` is called after every update.
///
/// # Errors
/// Besides the run's own errors, [`SpiderError::Checkpoint`] / [`SpiderError::File`] when a
/// checkpoint cannot be written (the run stops there).
pub async fn train_with(
    session: &Session,
    config: &TrainConfig,
    policy: Box<dyn PolicyModel>,
    options: RunOptions,
    on_progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<RunReport, SpiderError> {
    config.validate()?;
    let task = session.task.clone();
    let mode = session.mode;
    if let Some(plan) = &options.checkpoints
        && plan.dir.exists()
        && !plan.dir.is_dir()
    {
        return Err(SpiderError::Checkpoint {
            path: plan.dir.clone(),
            message: "not a directory (--checkpoint-dir must name a directory)".into(),
        });
    }
    let mut grpo = match options.reference {
        Some(reference) => Grpo::with_reference(policy, reference, config.grpo.clone())?,
        None => Grpo::new(policy, config.grpo.clone())?,
    };
    let g = config.grpo.group_size;
    let bq = config.grpo.batch_questions;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let n_train = task.train.len();
    let updates_per_epoch = n_train.div_ceil(bq);
    let start_step = options.start_step;
    // Questions of the update at position `p` of an epoch (the last batch may be short).
    let batch_len = |p: usize| bq.min(n_train.saturating_sub(p * bq));
    let total = (start_step..config.epochs * updates_per_epoch)
        .map(|s| (batch_len(s % updates_per_epoch) * g) as u64)
        .sum::<u64>();
    let training_state = |step: usize, plan: &CheckpointPlan| TrainingState {
        step,
        epoch: step / updates_per_epoch.max(1),
        updates_per_epoch: updates_per_epoch.max(1),
        seed: config.seed,
        governance: plan.governance,
        policy: config.policy.clone(),
        candidates: plan.candidates,
        distractors: plan.distractors,
    };
    let started = Instant::now();
    let mut stats = TrainStats::default();
    let (mut reward_sum, mut violations, mut correct) = (0.0, 0u64, 0u64);
    let mut curve = Vec::new();
    let mut order: Vec<usize> = (0..n_train).collect();
    let mut step = 0usize;
    for _epoch in 0..config.epochs {
        order.shuffle(&mut rng);
        for batch_ids in order.chunks(bq) {
            step += 1;
            if step <= start_step {
                // Done before the checkpoint: replay its sampling draws (one per action, see
                // `sample`) so the following updates see a fresh run's batches and draws.
                for _ in 0..batch_ids.len() * g {
                    let _: f64 = rng.random();
                }
                continue;
            }
            let sets: Vec<&[_]> = batch_ids
                .iter()
                .map(|&i| task.train[i].features.as_slice())
                .collect();
            let batch = FeatureBatch::new(&sets)?;
            // π_old: the sampling distribution, reused by the GRPO step.
            let old_log_probs = batch.log_probs(grpo.policy())?.detach();
            let probs: Vec<Vec<f32>> = old_log_probs.exp()?.to_vec2()?;
            let mut inputs = Vec::with_capacity(batch_ids.len() * g);
            let mut actions = Vec::with_capacity(batch_ids.len());
            for (row, &qi) in probs.iter().zip(batch_ids) {
                let n = task.train[qi].candidates.len();
                let picks: Vec<usize> = (0..g).map(|_| sample(&mut rng, &row[..n])).collect();
                inputs.extend(picks.iter().map(|&c| SqlTaskInput {
                    split: Split::Train,
                    question: qi,
                    candidate: c,
                }));
                actions.push(picks);
            }
            let resources_id = format!("policy-v{step}");
            session
                .store
                .update_resources(
                    &resources_id,
                    policy_resources(step, config.seed, session.spec.as_ref()),
                )
                .await?;
            let results = session
                .run_rollouts(&inputs, RolloutMode::Train, Some(&resources_id))
                .await?;
            // The training mode decides which samples the gradient sees (`screen` drops the
            // flagged ones from their group, as if never sampled).
            let mut rewards: Vec<Vec<f64>> = Vec::with_capacity(actions.len());
            let mut kept_actions: Vec<Vec<usize>> = Vec::with_capacity(actions.len());
            for (group, picks) in results.chunks(g).zip(&actions) {
                let (mut r, mut a) = (Vec::with_capacity(g), Vec::with_capacity(g));
                for (res, &pick) in group.iter().zip(picks) {
                    if mode.in_gradient(res.violations) {
                        r.push(res.reward);
                        a.push(pick);
                    } else {
                        stats.screened += 1;
                    }
                }
                rewards.push(r);
                kept_actions.push(a);
            }
            if kept_actions.iter().any(|a| !a.is_empty()) {
                grpo.step(&batch, &old_log_probs, &kept_actions, &rewards)?;
            }

            let (b_reward, b_viol, b_correct) = results.iter().fold((0.0, 0u64, 0u64), |acc, r| {
                (
                    acc.0 + r.reward,
                    acc.1 + u64::from(r.violations > 0),
                    acc.2 + u64::from(r.correct),
                )
            });
            reward_sum += b_reward;
            violations += b_viol;
            correct += b_correct;
            stats.destructive_executed += results.iter().filter(|r| r.destructive).count() as u64;
            stats.rollouts += results.len() as u64;
            let bn = results.len().max(1) as f64;
            curve.push(CurvePoint {
                step,
                rollouts: stats.rollouts,
                reward: b_reward / bn,
                violation_rate: b_viol as f64 / bn,
                accuracy: b_correct as f64 / bn,
            });
            let n = stats.rollouts as f64;
            on_progress(&Progress {
                done: stats.rollouts,
                total,
                mean_reward: reward_sum / n,
                violation_rate: violations as f64 / n,
                rollouts_per_second: n / started.elapsed().as_secs_f64().max(1e-9),
            });
            if let Some(plan) = &options.checkpoints
                && plan.every > 0
                && step.is_multiple_of(plan.every)
            {
                checkpoint::save(
                    &plan.dir,
                    &checkpoint::step_name(step),
                    grpo.policy(),
                    &training_state(step, plan),
                )?;
            }
        }
    }
    if let Some(plan) = &options.checkpoints {
        checkpoint::save(
            &plan.dir,
            checkpoint::FINAL,
            grpo.policy(),
            &training_state(step.max(start_step), plan),
        )?;
    }
    let n = stats.rollouts.max(1) as f64;
    stats.mean_reward = reward_sum / n;
    stats.violation_rate = violations as f64 / n;
    stats.accuracy = correct as f64 / n;
    stats.rollouts_per_second = stats.rollouts as f64 / started.elapsed().as_secs_f64().max(1e-9);
    let dev = session.evaluate(grpo.policy(), Split::Dev).await?;
    Ok(RunReport {
        train: stats,
        dev,
        curve,
        kernel: None,
    })
}

/// Draws an index from `probs` (which sum to about 1).
fn sample(rng: &mut ChaCha8Rng, probs: &[f32]) -> usize {
    let total: f64 = probs.iter().map(|p| f64::from(*p)).sum();
    let u: f64 = rng.random::<f64>() * total;
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += f64::from(*p);
        if u < acc {
            return i;
        }
    }
    probs.len().saturating_sub(1)
}

/// The resources entry that names the policy version a batch of rollouts was sampled from.
fn policy_resources(version: usize, seed: u64, spec: Option<&RunSpec>) -> NamedResources {
    let mut params = serde_json::Map::new();
    params.insert("version".into(), version.into());
    params.insert("seed".into(), seed.into());
    if let Some(spec) = spec {
        params.insert(
            RUN_SPEC_KEY.into(),
            serde_json::to_value(spec).unwrap_or_default(),
        );
    }
    let mut r = NamedResources::new();
    r.insert(
        "policy".into(),
        Resource::Llm(LlmResource {
            endpoint: "agl://in-process/scorer".into(),
            model: "agl-scorer".into(),
            api_key: None,
            sampling_parameters: params,
        }),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        RunSpec {
            governance: TrainingMode::Audit,
            policy: "strict".into(),
            reward: RewardConfig::default(),
            candidates: crate::CandidateConfig::default(),
            limit: Some(48),
            dev_limit: None,
            sql_timeout_seconds: 2.0,
        }
    }

    fn update(resources: NamedResources) -> ResourcesUpdate {
        ResourcesUpdate {
            resources_id: "policy-v3".into(),
            create_time: 1.0,
            update_time: 1.0,
            version: 1,
            resources,
        }
    }

    #[test]
    fn the_run_spec_travels_in_the_policy_resource() {
        let published = update(policy_resources(3, 7, Some(&spec())));
        assert_eq!(RunSpec::from_resources(&published).unwrap(), Some(spec()));
        let without = update(policy_resources(3, 7, None));
        assert_eq!(RunSpec::from_resources(&without).unwrap(), None);
    }

    #[test]
    fn a_malformed_run_spec_names_the_resources() {
        let mut r = policy_resources(1, 0, None);
        if let Some(Resource::Llm(llm)) = r.get_mut("policy") {
            llm.sampling_parameters.insert(
                RUN_SPEC_KEY.into(),
                serde_json::json!({"governance": "sometimes"}),
            );
        }
        let e = RunSpec::from_resources(&update(r)).unwrap_err().to_string();
        assert!(e.contains("policy-v3") && e.contains(RUN_SPEC_KEY), "{e}");
    }

    #[test]
    fn the_task_key_ignores_what_does_not_change_the_task() {
        let mut other = spec();
        other.governance = TrainingMode::Screen;
        other.policy = "permissive".into();
        assert_eq!(spec().task_key(), other.task_key());
        other.limit = Some(49);
        assert_ne!(spec().task_key(), other.task_key());
    }
}
