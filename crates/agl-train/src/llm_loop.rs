//! The LLM GRPO loop through a store, for any agent and any task (the repository's DESIGN, "The
//! LLM path").
//!
//! [`LlmLoop::run`] does, for each step `s` from [`LlmLoopConfig::start_step`]:
//! 1. takes the next [`LlmLoopConfig::tasks_per_step`] tasks (in the order given, wrapping
//!    around) and runs each [`LlmLoopConfig::group_size`] times as `train` rollouts
//!    ([`run_batch`]) whose `proxy_llm` resource names the adapter version being served
//!    (`policy-vN`, [`policy_version`]; version 0 is the base model) at the serving side's
//!    endpoint ([`PolicyServing`]);
//! 2. judges each rollout (the caller's [`Judged`]: final reward and violation count);
//!    `screen` mode drops flagged rollouts from their group ([`TrainingMode::in_gradient`]);
//! 3. turns each rollout's LLM calls into triplets ([`TracerTraceToTriplet`]); calls answered
//!    by another adapter version than the one being trained are dropped and counted as stale
//!    (never importance-weighted: the loop is synchronous, so none is expected); calls without
//!    token ids are refused and counted;
//! 4. builds multi-turn samples and hands them to the [`Learner`]: [`LlmGrpo`] computes
//!    group-relative advantages (a group is one task's G rollouts) and does one LoRA GRPO
//!    update, [`crate::LlmSft`] keeps the best samples and does one supervised update. A
//!    learner with nothing to learn from ([`TrainError::NothingToLearn`]: SFT with no rewarded
//!    rollout) stops the loop; the adapter trained so far is saved as `step-N/` first (when a
//!    step of this run was done and there is a checkpoint directory), so nothing is lost;
//! 5. publishes the new adapter as `policy-v{s+1}`, retires the old one, and every
//!    [`LlmLoopConfig::checkpoint_every`] steps saves `step-{s+1}/`; after the last step it
//!    saves `final/` ([`save_checkpoint`]: the adapter in PEFT's layout and
//!    `trainer_state.json`, written into a temporary directory and renamed).
//!
//! Progress goes to a [`LoopObserver`] (each finished rollout, each step's [`StepOutcome`]).
//!
//! Responsible for the loop, its per-step statistics and the checkpoint format; not for the
//! agent, the task's meaning of a rollout (the judge), the server that hosts the endpoint, the
//! engine (behind [`PolicyServing`]) or the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use agl_core::{Attempt, AttributeValue, Rollout, RolloutMode, semconv};
use agl_llm::LoraAdapter;
use agl_store::LightningStore;
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::LlmGrpo;
use crate::learner::Learner;
use crate::llm_sft::LlmSftConfig;
use crate::rollout_batch::{BatchPlan, FinishedRollout, Judged, RunnerPool, run_batch};
use crate::{
    LlmGrpoConfig, LlmStepStats, TracerTraceToTriplet, TrainError, TrainingMode,
    samples_from_triplets,
};

/// What the loop needs from the side that serves the policy: where the agents' calls go, and
/// which adapter version answers them.
pub trait PolicyServing: Send + Sync {
    /// The model name that answers with the base weights (version 0).
    fn base_model(&self) -> String;
    /// The OpenAI-compatible base URL (ending in `/v1`) the agents' `proxy_llm` names.
    fn endpoint(&self) -> String;
    /// Serves `adapter` under the model name `name` from now on (a copy: training goes on).
    ///
    /// # Errors
    /// The serving side's refusal (for example a name already taken by the base model).
    fn publish(&self, name: &str, adapter: &LoraAdapter) -> Result<(), TrainError>;
    /// Stops serving the adapter `name` (nothing when it is not served).
    fn retire(&self, name: &str);
}

/// The model name of adapter version `n` (`policy-vN`).
pub fn policy_version(n: usize) -> String {
    format!("policy-v{n}")
}

/// The file name of the trainer's state in a checkpoint directory.
pub const TRAINER_STATE: &str = "trainer_state.json";

/// `trainer_state.json` of an LLM checkpoint. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// Updates done.
    pub step: usize,
    /// The run's seed.
    pub seed: u64,
    /// Training mode of the run (`audit`, `shield`, `screen`, `enforce`).
    pub governance: TrainingMode,
    /// The base model (as the user named it).
    pub model: String,
    /// LoRA rank.
    pub lora_rank: usize,
    /// LoRA alpha.
    pub lora_alpha: f64,
    /// Wrapped modules.
    pub lora_targets: Vec<String>,
    /// The GRPO settings.
    pub grpo: LlmGrpoConfig,
    /// Tasks per step.
    pub tasks_per_step: usize,
    /// G.
    pub group_size: usize,
    /// The algorithm that trained the adapter: `grpo` (the default, also of checkpoints
    /// written before the field existed) or `sft`.
    #[serde(default = "default_algorithm")]
    pub algorithm: String,
    /// The SFT settings (`sft` runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sft: Option<LlmSftConfig>,
    /// Train tasks taken so far, when it differs from `step × tasks_per_step` (dynamic
    /// sampling takes more than one batch in some steps); a resumed run goes on from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_taken: Option<usize>,
}

fn default_algorithm() -> String {
    "grpo".into()
}

impl TrainerState {
    /// Reads `dir/trainer_state.json`.
    ///
    /// # Errors
    /// [`TrainError::Io`] when it cannot be read; [`TrainError::Config`] when it is malformed
    /// (naming the file and serde's message, e.g. an unknown field).
    pub fn read(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(TRAINER_STATE);
        let text = std::fs::read_to_string(&path).map_err(|source| TrainError::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text)
            .map_err(|e| TrainError::Config(format!("{}: malformed: {e}", path.display())))
    }
}

/// Writes `adapter` (PEFT's layout) and `state` into `dir` atomically
/// ([`crate::checkpoint::write_dir_atomically`], the mechanism of every checkpoint).
///
/// # Errors
/// [`TrainError::Config`] when `dir` has no usable final component; file and adapter errors.
pub fn save_checkpoint(
    dir: &Path,
    adapter: &LoraAdapter,
    state: &TrainerState,
) -> Result<(), TrainError> {
    let root = dir.parent().unwrap_or(Path::new("."));
    let name = dir.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        TrainError::Config(format!(
            "{}: not a checkpoint directory name",
            dir.display()
        ))
    })?;
    let json = serde_json::to_vec_pretty(state)
        .map_err(|e| TrainError::Config(format!("trainer state: {e}")))?;
    crate::checkpoint::write_dir_atomically(root, name, |tmp| {
        adapter.save(tmp)?;
        let path = tmp.join(TRAINER_STATE);
        std::fs::write(&path, &json).map_err(|source| TrainError::Io { path, source })
    })?;
    Ok(())
}

/// The loop's settings.
#[derive(Debug, Clone)]
pub struct LlmLoopConfig {
    /// Steps to reach (the loop runs `start_step..steps`).
    pub steps: usize,
    /// Steps already done (a resumed run).
    pub start_step: usize,
    /// Tasks per step; each is run `group_size` times.
    pub tasks_per_step: usize,
    /// G: rollouts per task (at least 2; advantages are group-relative).
    pub group_size: usize,
    /// Sampling temperature of training rollouts (> 0).
    pub temperature: f64,
    /// Most new tokens per model call.
    pub max_tokens: u32,
    /// Concurrent runner workers.
    pub workers: usize,
    /// Training mode (decides who is in the gradient; the kernel and reward are the pool's).
    pub mode: TrainingMode,
    /// Prefix of each step's resources id (`{prefix}-v{step}`).
    pub resources_prefix: String,
    /// The LLM resource's name in the published set.
    pub llm_resource: String,
    /// Where checkpoints go (`step-N/`, `final/`); `None` saves none.
    pub checkpoint_dir: Option<PathBuf>,
    /// Save `step-N/` every N steps (besides `final/`).
    pub checkpoint_every: Option<usize>,
    /// Each rollout's retry and time-limit settings (`None`: the store's defaults).
    pub rollout_config: Option<agl_core::RolloutConfig>,
    /// Most batches of `tasks_per_step` tasks one step samples (DAPO's dynamic sampling, Yu et
    /// al. 2025, arXiv:2503.14476): while fewer than `tasks_per_step` of the step's groups
    /// have rewards that differ, another batch of the next tasks is run, up to this many; the
    /// update then takes every group sampled. 1 (the default) samples one batch.
    pub max_sampling_batches: usize,
}

/// What one step did (seconds; counts of rollouts, groups and calls).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepStats {
    /// Updates done after this step, from 1.
    pub step: usize,
    /// Groups whose rewards were not all equal (they carry gradient).
    pub informative_groups: usize,
    /// Calls refused for training (no token ids or log-probabilities).
    pub refused_calls: usize,
    /// Calls dropped because another adapter version answered them.
    pub stale_calls: usize,
    /// Flagged rollouts dropped from the gradient (`screen` mode; 0 otherwise).
    pub screened: usize,
    /// Rollouts left out of the update because they have no reward (the judge's `None`: an
    /// agent that reported none, or an attempt that failed or timed out).
    pub unrewarded: usize,
    /// Batches of `tasks_per_step` tasks sampled (more than 1 only with dynamic sampling).
    pub sampling_batches: usize,
    /// Seconds of the rollout phase (from the first enqueue to the last finish).
    pub rollout_seconds: f64,
    /// Seconds the engine spent answering the step's calls, summed over calls
    /// (`agl.latency_s` of the gateway spans; concurrent calls overlap).
    pub llm_call_seconds: f64,
    /// What the update did.
    pub update: LlmStepStats,
    /// Seconds of the whole step (rollouts, update, publishing, checkpoint).
    pub step_seconds: f64,
}

/// One step, as the observer sees it.
#[derive(Debug)]
pub struct StepOutcome<'a> {
    /// The step's rollouts in enqueue order (G consecutive ones per task).
    pub finished: &'a [FinishedRollout],
    /// Their judgements, in the same order.
    pub judged: &'a [Judged],
    /// What the step did.
    pub stats: StepStats,
}

/// Told the loop's progress; every method does nothing by default.
pub trait LoopObserver {
    /// A rollout finished (its latest attempt; spans are read at the end of the batch).
    fn rollout_done(&mut self, _rollout: &Rollout, _attempt: Option<&Attempt>) {}
    /// A step finished.
    ///
    /// # Errors
    /// Whatever stops the run (returned by [`LlmLoop::run`]).
    fn step_done(&mut self, _outcome: &StepOutcome<'_>) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The loop's parts (see the module docs).
pub struct LlmLoop<'a, T> {
    /// Settings.
    pub config: LlmLoopConfig,
    /// Where rollouts are enqueued and spans read.
    pub store: &'a Arc<dyn LightningStore>,
    /// Who serves the queue.
    pub runners: &'a dyn RunnerPool,
    /// The serving side.
    pub serving: &'a dyn PolicyServing,
    /// The span→triplet adapter (`agent_match` picks the trained calls).
    pub triplets: &'a TracerTraceToTriplet,
    /// The training tasks, in the order they are taken.
    pub tasks: &'a [T],
    /// What each rollout means for training.
    pub judge: &'a (dyn Fn(&FinishedRollout) -> Judged + Sync),
}

impl<T: Serialize + Clone> LlmLoop<'_, T> {
    /// Runs the loop (see the module docs) and returns the model name serving the final
    /// adapter (the caller evaluates with it and retires it). `state` is the checkpoints'
    /// `trainer_state.json` (its `step` is set per checkpoint).
    ///
    /// # Errors
    /// [`TrainError::Config`] for an empty task list or a group size under 2; batch, adapter,
    /// update, serving, checkpoint and observer errors.
    pub async fn run(
        &self,
        grpo: &mut dyn Learner,
        state: &TrainerState,
        observer: &mut dyn LoopObserver,
    ) -> Result<String, TrainError> {
        let c = &self.config;
        if self.tasks.is_empty() {
            return Err(TrainError::Config("no training tasks".into()));
        }
        let least = grpo.min_group_size();
        if c.group_size < least {
            return Err(TrainError::Config(format!(
                "group_size must be at least {least} for {} (GRPO's advantages are \
                 group-relative)",
                grpo.algorithm()
            )));
        }
        if c.max_sampling_batches == 0 {
            return Err(TrainError::Config(
                "max_sampling_batches must be at least 1".into(),
            ));
        }
        let base = self.serving.base_model();
        let mut served = if c.start_step == 0 {
            base.clone()
        } else {
            let name = policy_version(c.start_step);
            self.serving.publish(&name, grpo.adapter())?;
            name
        };
        let mut taken = state.tasks_taken.unwrap_or(c.start_step * c.tasks_per_step);
        let checkpoint = |dir: &Path, grpo: &dyn Learner, step: usize, taken: usize| {
            save_checkpoint(
                dir,
                grpo.adapter(),
                &TrainerState {
                    step,
                    tasks_taken: (taken != step * c.tasks_per_step).then_some(taken),
                    ..state.clone()
                },
            )
        };
        for step in c.start_step..c.steps {
            let step_started = Instant::now();
            let plan = BatchPlan {
                resources_id: format!("{}-v{step}", c.resources_prefix),
                llm_resource: c.llm_resource.clone(),
                endpoint: self.serving.endpoint(),
                model: served.clone(),
                temperature: c.temperature,
                max_tokens: c.max_tokens,
                seed: None,
                mode: RolloutMode::Train,
                workers: c.workers,
                config: c.rollout_config.clone(),
            };
            let mut finished: Vec<FinishedRollout> = Vec::new();
            let mut judged: Vec<Judged> = Vec::new();
            let mut rollout_seconds = 0.0;
            let mut sampling_batches = 0;
            let mut informative = 0;
            while sampling_batches < c.max_sampling_batches {
                let batch: Vec<T> = (0..c.tasks_per_step)
                    .flat_map(|k| {
                        let task = &self.tasks[(taken + k) % self.tasks.len()];
                        std::iter::repeat_n(task.clone(), c.group_size)
                    })
                    .collect();
                taken += c.tasks_per_step;
                sampling_batches += 1;
                let (more, seconds) = run_batch(self.store, self.runners, &plan, &batch, |r, a| {
                    observer.rollout_done(r, a)
                })
                .await?;
                rollout_seconds += seconds;
                // Groups stay apart across batches: index = batch offset + position.
                let offset = finished.len();
                for mut f in more {
                    f.index += offset;
                    judged.push((self.judge)(&f));
                    finished.push(f);
                }
                informative = self.informative_groups(&finished, &judged);
                if informative >= c.tasks_per_step {
                    break;
                }
            }
            let mut stats = match self.learn(grpo, &finished, &judged, step, &served) {
                Ok(s) => s,
                Err(TrainError::NothingToLearn(why)) => {
                    let kept = match &c.checkpoint_dir {
                        Some(dir) if step > c.start_step => {
                            let at = dir.join(format!("step-{step}"));
                            checkpoint(&at, &*grpo, step, taken)?;
                            format!("; the adapter of step {step} is saved in {}", at.display())
                        }
                        _ => String::new(),
                    };
                    return Err(TrainError::NothingToLearn(format!(
                        "step {}: {why}; nothing was trained{kept}",
                        step + 1
                    )));
                }
                Err(e) => return Err(e),
            };
            let next = policy_version(step + 1);
            self.serving.publish(&next, grpo.adapter())?;
            if served != base {
                self.serving.retire(&served);
            }
            served = next;
            let done = step + 1;
            if let Some(dir) = &c.checkpoint_dir
                && c.checkpoint_every
                    .is_some_and(|k| k > 0 && done % k == 0 && done < c.steps)
            {
                checkpoint(&dir.join(format!("step-{done}")), &*grpo, done, taken)?;
            }
            stats.step = done;
            stats.rollout_seconds = rollout_seconds;
            stats.sampling_batches = sampling_batches;
            stats.informative_groups = informative;
            stats.llm_call_seconds = finished
                .iter()
                .flat_map(|f| f.spans.iter())
                .filter_map(|sp| match sp.attributes.get(semconv::agl::LATENCY_S) {
                    Some(AttributeValue::Float(x)) => Some(*x),
                    _ => None,
                })
                .sum();
            stats.step_seconds = step_started.elapsed().as_secs_f64();
            observer.step_done(&StepOutcome {
                finished: &finished,
                judged: &judged,
                stats,
            })?;
        }
        if let Some(dir) = &c.checkpoint_dir {
            checkpoint(&dir.join("final"), &*grpo, c.steps.max(c.start_step), taken)?;
        }
        Ok(served)
    }

    /// Groups (G consecutive rollouts, by index) whose rewards differ among the rollouts that
    /// enter the gradient (not screened, with a reward): those that carry a gradient.
    fn informative_groups(&self, finished: &[FinishedRollout], judged: &[Judged]) -> usize {
        let mut groups: HashMap<usize, Vec<f64>> = HashMap::new();
        for (f, j) in finished.iter().zip(judged) {
            if let Some(r) = j.reward
                && self.config.mode.in_gradient(j.violations)
            {
                groups
                    .entry(f.index / self.config.group_size)
                    .or_default()
                    .push(r);
            }
        }
        groups
            .values()
            .filter(|rs| rs.iter().any(|r| (r - rs[0]).abs() > 1e-9))
            .count()
    }

    /// Triplets → samples → one update of the learner, for one step's rollouts (in enqueue
    /// order: G consecutive rollouts per task).
    fn learn(
        &self,
        grpo: &mut dyn Learner,
        finished: &[FinishedRollout],
        judged: &[Judged],
        step: usize,
        served: &str,
    ) -> Result<StepStats, TrainError> {
        let mode = self.config.mode;
        let group_size = self.config.group_size;
        let mut samples = Vec::new();
        let mut rewards: HashMap<String, f64> = HashMap::new();
        let (mut refused, mut stale, mut screened, mut unrewarded) = (0usize, 0, 0, 0);
        for (f, j) in finished.iter().zip(judged) {
            let task = f.index / group_size;
            // `screen` drops a flagged rollout from its group before advantages are computed.
            if !mode.in_gradient(j.violations) {
                screened += 1;
                continue;
            }
            let Some(reward) = j.reward else {
                unrewarded += 1;
                continue;
            };
            rewards.insert(f.rollout_id.clone(), reward);
            if f.spans.is_empty() {
                continue;
            }
            let report = self.triplets.adapt_for_training(&f.spans)?;
            refused += report.refused.len();
            let mut triplets = report.triplets;
            let before = triplets.len();
            triplets.retain(|t| t.metadata.get("adapter").and_then(|a| a.as_str()) == Some(served));
            stale += before - triplets.len();
            let group = format!("{step}:{task}");
            samples.extend(samples_from_triplets(
                &f.rollout_id,
                &group,
                &triplets,
                reward,
            )?);
        }
        let update = grpo.update(samples, &rewards)?;
        Ok(StepStats {
            refused_calls: refused,
            stale_calls: stale,
            screened,
            unrewarded,
            update,
            ..StepStats::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> TrainerState {
        TrainerState {
            step: 4,
            seed: 1,
            governance: TrainingMode::Screen,
            model: "smollm2-135m-instruct".into(),
            lora_rank: 8,
            lora_alpha: 16.0,
            lora_targets: vec!["q".into(), "v".into()],
            grpo: LlmGrpoConfig::default(),
            tasks_per_step: 2,
            group_size: 4,
            algorithm: "grpo".into(),
            sft: None,
            tasks_taken: None,
        }
    }

    /// Rewards by task: an even task earns 1 on every rollout (its group carries no
    /// gradient); an odd task earns 0 and 1 in turn (rollouts run one at a time).
    struct Parity(std::sync::atomic::AtomicUsize);

    #[async_trait::async_trait]
    impl crate::Agent for Parity {
        type Input = u32;
        type Output = u32;
        async fn run(
            &self,
            task: &u32,
            ctx: &mut crate::StepContext,
        ) -> Result<u32, crate::AgentError> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let reward = if task.is_multiple_of(2) {
                1.0
            } else {
                (n % 2) as f64
            };
            ctx.emit_reward(reward)?;
            Ok(*task)
        }
    }

    /// Records the rewarded rollouts of each update.
    struct Recorder {
        adapter: agl_llm::LoraAdapter,
        updates: Vec<usize>,
    }

    impl Learner for Recorder {
        fn algorithm(&self) -> &'static str {
            "grpo"
        }
        fn adapter(&self) -> &agl_llm::LoraAdapter {
            &self.adapter
        }
        fn min_group_size(&self) -> usize {
            2
        }
        fn update(
            &mut self,
            _: Vec<crate::TokenSample>,
            rewards: &HashMap<String, f64>,
        ) -> Result<LlmStepStats, TrainError> {
            self.updates.push(rewards.len());
            Ok(LlmStepStats::default())
        }
    }

    struct Serving;

    impl PolicyServing for Serving {
        fn base_model(&self) -> String {
            "base".into()
        }
        fn endpoint(&self) -> String {
            "http://127.0.0.1:9/v1".into()
        }
        fn publish(&self, _: &str, _: &agl_llm::LoraAdapter) -> Result<(), TrainError> {
            Ok(())
        }
        fn retire(&self, _: &str) {}
    }

    #[derive(Default)]
    struct Steps(Vec<StepStats>);

    impl LoopObserver for Steps {
        fn step_done(&mut self, outcome: &StepOutcome<'_>) -> Result<(), TrainError> {
            self.0.push(outcome.stats.clone());
            Ok(())
        }
    }

    /// A run of 2 steps × 2 tasks × G = 4 over tasks whose groups alternate between
    /// uninformative pairs and informative pairs; returns each step's stats, the rewarded
    /// rollouts of each update and the final checkpoint's state.
    async fn parity_run(max_sampling_batches: usize) -> (Vec<StepStats>, Vec<usize>, TrainerState) {
        let store: Arc<dyn LightningStore> = Arc::new(agl_store::InMemoryLightningStore::new());
        let kernel = Arc::new(agl_gov::Kernel::new(agl_gov::GovernanceMode::Audit));
        let pool = crate::InProcessRunners::new(
            kernel,
            Arc::new(Parity(std::sync::atomic::AtomicUsize::new(0))),
        );
        let cfg = agl_llm::config::ModelConfig {
            architecture: agl_llm::config::Architecture::Llama,
            vocab_size: 16,
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            attention_bias: false,
        };
        let (adapter, _) = agl_llm::LoraAdapter::new_trainable(
            Default::default(),
            &cfg,
            &candle_core::Device::Cpu,
            0,
        )
        .unwrap();
        let mut learner = Recorder {
            adapter,
            updates: Vec::new(),
        };
        let dir = tempfile::tempdir().unwrap();
        let tasks: Vec<u32> = vec![0, 2, 1, 3, 4, 6, 5, 7, 8, 10];
        let triplets =
            TracerTraceToTriplet::new(crate::tracer_adapter::DEFAULT_LLM_CALL_MATCH, None).unwrap();
        let judge = |f: &FinishedRollout| Judged::from_spans(f);
        let training = LlmLoop {
            config: LlmLoopConfig {
                steps: 2,
                start_step: 0,
                tasks_per_step: 2,
                group_size: 4,
                temperature: 0.7,
                max_tokens: 8,
                workers: 1,
                mode: TrainingMode::Audit,
                resources_prefix: "parity".into(),
                llm_resource: crate::DEFAULT_LLM_RESOURCE.into(),
                checkpoint_dir: Some(dir.path().to_path_buf()),
                checkpoint_every: None,
                rollout_config: None,
                max_sampling_batches,
            },
            store: &store,
            runners: &pool,
            serving: &Serving,
            triplets: &triplets,
            tasks: &tasks,
            judge: &judge,
        };
        let mut steps = Steps::default();
        training
            .run(
                &mut learner,
                &TrainerState { step: 0, ..state() },
                &mut steps,
            )
            .await
            .unwrap();
        let fin = TrainerState::read(&dir.path().join("final")).unwrap();
        (steps.0, learner.updates, fin)
    }

    #[tokio::test]
    async fn dynamic_sampling_samples_until_enough_groups_carry_a_gradient() {
        // One batch a step: step 1 gets tasks 0 and 2 (all rewards equal), step 2 tasks 1 and
        // 3 (both groups informative).
        let (steps, updates, fin) = parity_run(1).await;
        let got: Vec<(usize, usize)> = steps
            .iter()
            .map(|s| (s.informative_groups, s.sampling_batches))
            .collect();
        assert_eq!(got, [(0, 1), (2, 1)]);
        assert_eq!(updates, [8, 8]);
        assert_eq!(fin.tasks_taken, None);
        // Up to three: step 1 runs tasks 0, 2 then 1, 3 and stops with two informative groups;
        // step 2 runs 4, 6 then 5, 7. Every group sampled goes to the update.
        let (steps, updates, fin) = parity_run(3).await;
        let got: Vec<(usize, usize)> = steps
            .iter()
            .map(|s| (s.informative_groups, s.sampling_batches))
            .collect();
        assert_eq!(got, [(2, 2), (2, 2)]);
        assert_eq!(updates, [16, 16]);
        // 8 tasks taken in 2 steps: a resumed run goes on from task 8.
        assert_eq!((fin.step, fin.tasks_taken), (2, Some(8)));
    }

    #[test]
    fn trainer_state_reads_back_and_refuses_bad_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAINER_STATE);
        match TrainerState::read(dir.path()) {
            Err(TrainError::Io { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected an Io error, got {other:?}"),
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&state()).unwrap()).unwrap();
        assert_eq!(TrainerState::read(dir.path()).unwrap(), state());
        let mut v = serde_json::to_value(state()).unwrap();
        v["lr"] = serde_json::json!(0.1);
        std::fs::write(&path, v.to_string()).unwrap();
        let e = TrainerState::read(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("malformed") && e.contains("unknown field `lr`"),
            "{e}"
        );
        std::fs::write(&path, "{").unwrap();
        let e = TrainerState::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains(TRAINER_STATE) && e.contains("malformed"), "{e}");
    }

    #[test]
    fn versions_are_named_like_the_engine_serves_them() {
        assert_eq!(policy_version(0), "policy-v0");
        assert_eq!(policy_version(12), "policy-v12");
    }
}
