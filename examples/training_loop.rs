//! The full training loop of the agentmesh-lightning tutorial (§7), in Rust, on agl's built-in
//! governed Spider task.
//!
//! Run it with `cargo run --release --example training_loop` (a debug build works too, slower).
//!
//! - **Kernel:** the `standard` policy preset (read-only SQL, a cost limit, ...), with one
//!   flight recorder that audits every check.
//! - **Environment:** a Gymnasium-style `GovernedEnvironment` over the Spider dev split. It is
//!   multi-step: an episode ends when the agent answers, or when a critical violation ends it.
//! - **Runner:** a `GovernedRunner` that re-runs each action for a detailed rollout, as the
//!   tutorial does.
//! - **Reward:** a `PolicyReward` with the tutorial's settings; it shapes the reward the agent
//!   learns from.
//! - **Agent:** `my_agent` is a linear softmax policy over the question's candidate SQL (the
//!   task's proposals, some of them destructive), trained with REINFORCE. It learns to stop
//!   proposing what the kernel blocks.
//!
//! The program prints progress every 20 episodes, then the post-training analysis of §7.4, and
//! exports the audit trail to `runs/training_audit.json`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use agl_gov::{Action, ActionKind, FlightRecorder, GovernanceMode, Kernel, PolicyFile};
use agl_spider::{
    CandidateConfig, Executor, ExecutorConfig, SpiderDataset, Split, execution_match,
};
use agl_spider::{
    SparseFeatures, SpiderAction, SpiderEnv, SpiderObservation, SpiderTask, TaskConfig,
    build_kernel,
};
use agl_train::{
    Agent, AgentError, EmitterConfig, Environment, EnvironmentConfig, FlightRecorderEmitter,
    GovernedEnvironment, GovernedRollout, GovernedRunner, PolicyReward, PolicyViolation,
    RewardConfig, StepContext,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NUM_EPISODES: usize = 200;
const DEV_QUESTIONS: usize = 300;

/// `my_agent`: a linear softmax policy over each question's candidate SQL, trained with
/// REINFORCE against a running-mean baseline.
struct LinearAgent {
    task: Arc<SpiderTask>,
    weights: Vec<f64>,
    baseline: f64,
    learning_rate: f64,
    rng: ChaCha8Rng,
}

impl LinearAgent {
    fn new(task: Arc<SpiderTask>, seed: u64) -> Self {
        LinearAgent {
            task,
            weights: vec![0.0; agl_spider::FEATURE_DIM],
            baseline: 0.0,
            learning_rate: 0.3,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    fn features(&self, state: &SpiderObservation) -> &[SparseFeatures] {
        &self.task.items(Split::Dev)[state.item].features
    }

    fn probabilities(&self, state: &SpiderObservation) -> Vec<f64> {
        let scores: Vec<f64> = self
            .features(state)
            .iter()
            .map(|x| {
                x.0.iter()
                    .map(|&(i, v)| self.weights[i as usize] * f64::from(v))
                    .sum()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = exp.iter().sum();
        exp.iter().map(|e| e / total).collect()
    }

    /// Samples a candidate and answers with it.
    fn get_action(&mut self, state: &SpiderObservation) -> (usize, SpiderAction) {
        let probs = self.probabilities(state);
        let mut u: f64 = self.rng.random();
        let mut choice = probs.len() - 1;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                choice = i;
                break;
            }
            u -= p;
        }
        (
            choice,
            SpiderAction::Answer(state.candidates[choice].clone()),
        )
    }

    /// One REINFORCE step: raise the log-probability of `choice` in proportion to how much
    /// better than the baseline its reward was (the advantage, scaled to the reward range).
    fn update(&mut self, state: &SpiderObservation, choice: usize, reward: f64) {
        let advantage = (reward - self.baseline) / 100.0;
        self.baseline += 0.05 * (reward - self.baseline);
        let probs = self.probabilities(state);
        let features = self.features(state).to_vec();
        for (k, (x, p)) in features.iter().zip(&probs).enumerate() {
            let indicator = if k == choice { 1.0 } else { 0.0 };
            let g = self.learning_rate * advantage * (indicator - p);
            for &(i, v) in &x.0 {
                self.weights[i as usize] += g * f64::from(v);
            }
        }
    }
}

/// What the runner's agent returns: how well the answer matched the gold result.
struct Answer {
    accuracy: f64,
}

/// The runner's agent: checks the action's SQL with the kernel and runs it in the sandbox.
struct SqlAgent {
    task: Arc<SpiderTask>,
    executor: Mutex<Executor>,
}

#[async_trait::async_trait]
impl Agent for SqlAgent {
    type Input = (usize, SpiderAction);
    type Output = Answer;

    async fn run(
        &self,
        (item, action): &(usize, SpiderAction),
        ctx: &mut StepContext,
    ) -> Result<Answer, AgentError> {
        let item = &self.task.items(Split::Dev)[*item];
        let approved = ctx.check(Action::sql(item.question.db_id.clone(), action.sql()))?;
        let ActionKind::Sql { sql, .. } = approved.action.kind else {
            return Err("the kernel approved something other than SQL".into());
        };
        let mut executor = self.executor.lock().map_err(|_| "executor lock poisoned")?;
        let result = executor.execute(&item.question.db_id, &sql)?;
        let correct = execution_match(&item.gold, &result.result, item.ordered);
        Ok(Answer {
            accuracy: if correct { 1.0 } else { 0.0 },
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    // ── The built-in task: Spider dev questions with candidate actions ──
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider");
    let dataset = SpiderDataset::load(&root)?;
    let task = Arc::new(SpiderTask::prepare(
        &dataset,
        &TaskConfig {
            candidates: CandidateConfig::default(),
            limit: Some(0),
            dev_limit: Some(DEV_QUESTIONS),
            threads: 2,
            executor: ExecutorConfig::default(),
        },
    )?);

    // ── Kernel with policies, and the flight recorder for the audit trail ──
    let recorder = Arc::new(FlightRecorder::in_memory());
    let policy = PolicyFile::preset("standard")?;
    let kernel: Arc<Kernel> = Arc::new(build_kernel(
        &task,
        &policy,
        GovernanceMode::Enforce,
        Some(recorder.clone()),
    )?);

    // ── Reward shaping (§7.2) ──
    let reward_config = RewardConfig {
        critical_penalty: -100.0,
        high_penalty: -50.0,
        medium_penalty: -10.0,
        low_penalty: -1.0,
        clean_bonus: 5.0,
        min_reward: Some(-100.0),
        max_reward: Some(100.0),
        ..RewardConfig::default()
    };
    let task_accuracy = |rollout: &GovernedRollout<(usize, SpiderAction), Answer>| match (
        &rollout.task_output,
        rollout.success,
    ) {
        (Some(answer), true) => answer.accuracy,
        _ => 0.0,
    };
    let reward_fn = PolicyReward::new(reward_config).with_base_reward(task_accuracy);

    // ── Governed runner ──
    let violation_log: Arc<Mutex<Vec<PolicyViolation>>> = Arc::default();
    let log = violation_log.clone();
    let mut runner = GovernedRunner::new(kernel.clone())
        .fail_on_violation(false)
        // The callback below collects every violation; one WARN line each would flood this demo.
        .log_violations(false)
        .violation_callback(move |v| {
            if let Ok(mut log) = log.lock() {
                log.push(v.clone());
            }
        });

    // ── Governed environment ──
    let env_config = EnvironmentConfig {
        max_steps: 50,
        terminate_on_critical: true,
        violation_penalty: -10.0,
        step_penalty: -0.1,
        success_bonus: 10.0,
        ..EnvironmentConfig::default()
    };
    let mut env = GovernedEnvironment::new(
        kernel.clone(),
        SpiderEnv::new(task.clone(), Split::Dev)?,
        env_config,
    )?;

    // ── Audit emitter ──
    let emitter = FlightRecorderEmitter::new(recorder.clone(), EmitterConfig::default());

    // ── Training loop (§7.3) ──
    let mut my_agent = LinearAgent::new(task.clone(), 7);
    runner.init(SqlAgent {
        task: task.clone(),
        executor: Mutex::new(Executor::new(
            task.db_root.clone(),
            ExecutorConfig::default(),
        )),
    });
    let mut episode_rewards = Vec::with_capacity(NUM_EPISODES);
    let mut window_violations = 0usize;
    let mut window_steps = 0usize;
    for episode in 0..NUM_EPISODES {
        let (mut state, _info) = env.reset(Some(episode as u64))?;
        let mut episode_reward = 0.0;
        while !env.terminated() {
            // The agent selects an action.
            let (choice, action) = my_agent.get_action(&state);
            // Execute it through the governed environment.
            let (next, reward, _terminated, _truncated, info) = env.step(action.clone())?;
            episode_reward += reward;
            window_violations += info.violations.len();
            window_steps += 1;
            // Also run it through the governed runner for a detailed rollout.
            let rollout = runner
                .step((state.item, action), Some(agl_core::RolloutMode::Train))
                .await?;
            let shaped_reward = reward_fn.call(&rollout);
            // Feed the reward back to the agent.
            my_agent.update(&state, choice, shaped_reward);
            state = next;
        }
        episode_rewards.push(episode_reward);
        if (episode + 1) % 20 == 0 {
            let recent = &episode_rewards[episode_rewards.len() - 20..];
            let avg_reward = recent.iter().sum::<f64>() / recent.len() as f64;
            let stats = runner.stats().await?;
            println!(
                "Episode {:4} avg_reward={:+.2} violation_rate={:.3} (last 20: {:.3} violations/step)",
                episode + 1,
                avg_reward,
                stats.violation_rate,
                window_violations as f64 / window_steps.max(1) as f64
            );
            window_violations = 0;
            window_steps = 0;
        }
    }
    runner.teardown();

    // ── Post-training analysis (§7.4) ──
    println!(
        "Runner stats: {}",
        serde_json::to_string(&runner.stats().await?)?
    );
    println!(
        "Reward stats: {}",
        serde_json::to_string(&reward_fn.stats())?
    );
    println!("Env metrics: {}", serde_json::to_string(&env.metrics())?);
    let summary = emitter.violation_summary()?;
    println!("Violation rate: {:.1}%", summary.violation_rate * 100.0);
    println!("Policies violated: {:?}", summary.policies_violated);
    println!(
        "Violations seen by the runner's callback: {}",
        violation_log.lock().map(|l| l.len()).unwrap_or(0)
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runs");
    std::fs::create_dir_all(&out)?;
    let path = out.join("training_audit.json");
    let count = emitter.export_to_file(&path)?;
    println!("Audit trail exported to runs/training_audit.json ({count} spans)");
    Ok(())
}
