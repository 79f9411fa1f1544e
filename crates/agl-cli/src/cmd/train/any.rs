//! `agl train --algorithm grpo --train-dataset FILE`: LoRA GRPO for the agent a user brings,
//! in any framework and language, with no change to its code (Agent Lightning's
//! `Trainer.fit(agent, train_dataset, val_dataset=…)`, with agl as the algorithm side).
//!
//! # What runs where
//! This process holds the built-in engine (dense f32 weights, the policy being trained), the
//! governed LLM gateway over it, and the learner. The rollouts go through a store:
//! - without `--store-url`, the store of `--store` (memory, SQLite, PostgreSQL), served over
//!   HTTP with the gateway on `--host`/`--port` (a free port by default; the address is
//!   printed), so runners of other processes can serve it;
//! - with `--store-url URL` (a running `agl store`), that store through its HTTP client; this
//!   process serves only the gateway on `--host`/`--port`, writing the calls' spans through the
//!   client (as `agl llm serve --store-url` does).
//!
//! Agents reach the gateway at `--advertise-url` (default: the address it listens on), which
//! is the `endpoint` of the `proxy_llm` resource each step publishes under `--llm-resource`
//! (`main_llm`): `{"resource_type": "proxy_llm", "endpoint": "<advertise-url>/v1", "model":
//! "policy-vN", "sampling_parameters": {"temperature", "max_tokens"}}`. Agent Lightning's
//! `ProxyLLM.get_base_url(rollout_id, attempt_id)` turns it into the attempt's route, and the
//! gateway answers with the attempt's adapter version whatever model name the agent sends.
//!
//! Who runs the rollouts (`--runner`):
//! - `none` (default): runners of other processes — Agent Lightning's own runner (a `@rollout`
//!   agent under `Trainer(store=LightningStoreClient(url))` in the runner role), `agl runner
//!   --store-url URL --exec 'COMMAND'`, or any program serving the store's queue. A batch
//!   waits for them and warns when nothing is dequeued or finished for 60 s;
//! - `exec:COMMAND`: `--workers` exec workers in this process, each running `sh -c COMMAND`
//!   once per rollout (the task on standard input, the gateway and ids in its environment, the
//!   reward on its last stdout line; `agl_train::exec_runner`).
//!
//! # The loop
//! [`agl_train::LlmLoop`] over the train tasks (`--limit` first, then shuffled once with
//! `--seed` unless `--keep-order`):
//! per step `--tasks-per-step` tasks, each enqueued `--group-size` times as `train` rollouts;
//! each rollout is judged by what its attempt recorded ([`agl_train::Judged::shaped`]: the
//! final reward span, `None` when the attempt failed or timed out or reported no reward — left
//! out of the update and counted — and the violations the gateway recorded on it, which the
//! seed's `PolicyReward` turns into penalties on the algorithm side under `enforce`); triplets of
//! the calls of `--train-roles` agents (every call by default); group-relative advantages; one
//! LoRA GRPO update; the next adapter version published. Checkpoints go to `--checkpoint-dir`
//! (default `runs/agent`): `step-N/` every `--checkpoint-every` steps and `final/`, PEFT's
//! layout plus `trainer_state.json`; `--resume DIR` continues one.
//!
//! # Validation
//! With `--val-dataset`, its first `--eval-limit` tasks are run once each as `test` rollouts
//! (temperature 0) before the first step and after the last: the mean final reward (a task
//! without one counts 0) with a 95% interval (mean ± 1.96·s/√n, the normal approximation),
//! and how many tasks had no reward, failed, or had a violation.
//!
//! Responsible for the flags of this path, the wiring and the table, report and plot; not for
//! the loop, the exec runner or the dataset format (`agl-train`), the gateway (`agl-server`)
//! or the engine (`agl-llm`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::{AttributeValue, RolloutConfig, RolloutMode, semconv};
use agl_gov::{BuildEnv, PolicyFile};
use agl_spider::CurvePoint;
use agl_store::LightningStore;
use agl_train::{
    BatchPlan, ExternalRunners, FinishedRollout, Judged, Learner, LlmLoop, LlmLoopConfig,
    LoopObserver, PolicyReward, PolicyServing, RewardConfig, RunnerPool, StepOutcome, TokenSample,
    TracerTraceToTriplet, TrainerState, TrainingMode,
};
use anyhow::{Context, bail};
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use super::llm::{
    LlmTrainArgs, SharedArgs, checked, engine_spec, initial_adapter, learner, loop_config,
    resume_state, rollouts_to_run, trainer_state,
};
use crate::llm_stage::EngineServing;
use crate::out::progress::progress_bar;

/// The training algorithm of `--algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algorithm {
    /// GRPO on a LoRA adapter of the served model (group-relative advantages over
    /// --group-size rollouts of each task).
    Grpo,
    /// Supervised fine-tuning of a LoRA adapter: on the best --sft-top-fraction of each step's
    /// rollouts by reward (Agent Lightning's Unsloth example), or on --demonstrations.
    Sft,
    /// Automatic prompt optimisation (Agent Lightning's APO): a beam search over the agent's
    /// prompt template, an LLM critiquing its rollouts and rewriting it; no weights change.
    Apo,
}

impl Algorithm {
    /// The name in reports and checkpoints.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Grpo => "grpo",
            Algorithm::Sft => "sft",
            Algorithm::Apo => "apo",
        }
    }
}

/// What the learner trains on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Rollouts of these tasks (`--train-dataset`).
    Tasks(PathBuf),
    /// These demonstrations (`--demonstrations`, SFT only): no training rollouts.
    Demonstrations(PathBuf),
}

impl Source {
    fn path(&self) -> &std::path::Path {
        match self {
            Source::Tasks(p) | Source::Demonstrations(p) => p,
        }
    }
}

/// The learner of a run.
enum Trainee {
    Grpo(agl_train::LlmGrpo),
    Sft(agl_train::LlmSft),
}

impl Trainee {
    fn learner(&mut self) -> &mut dyn Learner {
        match self {
            Trainee::Grpo(g) => g,
            Trainee::Sft(s) => s,
        }
    }
}

/// Who runs the rollouts (`--runner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerSpec {
    /// Runners of other processes.
    None,
    /// Exec workers in this process running `sh -c COMMAND` per rollout.
    Exec(String),
    /// The built-in Spider SQL agent in this process ([`super::sql_runner`]).
    Sql,
}

impl RunnerSpec {
    /// The flag's value, for reports.
    pub fn label(&self) -> String {
        match self {
            RunnerSpec::None => "none".into(),
            RunnerSpec::Exec(c) => format!("exec:{c}"),
            RunnerSpec::Sql => "sql".into(),
        }
    }
}

/// clap value parser of `--runner`.
pub fn parse_runner(s: &str) -> Result<RunnerSpec, String> {
    match s {
        "none" => return Ok(RunnerSpec::None),
        "sql" => return Ok(RunnerSpec::Sql),
        _ => {}
    }
    match s.strip_prefix("exec:") {
        Some(cmd) if !cmd.trim().is_empty() => Ok(RunnerSpec::Exec(cmd.to_string())),
        Some(_) => Err("`exec:` needs a command, e.g. exec:'python agent.py'".into()),
        None => Err(format!(
            "`{s}` is not a runner: use none (runners of other processes), exec:COMMAND or sql \
             (the built-in Spider SQL agent)"
        )),
    }
}

/// The flags only this path reads, resolved.
#[derive(Debug, Clone)]
pub struct AnyArgs {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Train tasks, or demonstrations.
    pub source: Source,
    /// SFT's selection (`--sft-top-fraction`, `--sft-min-reward`); its optimiser settings
    /// come from the shared flags.
    pub sft: agl_train::LlmSftConfig,
    /// Validation tasks.
    pub val_dataset: Option<PathBuf>,
    /// Who runs the rollouts.
    pub runner: RunnerSpec,
    /// Time limit of one rollout, seconds.
    pub rollout_timeout: f64,
    /// Attempts per rollout (retries of failed, timed-out and unresponsive attempts).
    pub max_attempts: u32,
    /// The gateway's address as agents reach it.
    pub advertise_url: Option<String>,
    /// Interface to listen on.
    pub host: String,
    /// Port to listen on (0: a free one).
    pub port: u16,
    /// The LLM resource's name.
    pub llm_resource: String,
    /// Train tasks in file order (no shuffle).
    pub keep_order: bool,
    /// `--store`.
    pub store: String,
    /// `--store-url`.
    pub store_url: Option<String>,
    /// Bearer token of the store (and required of runners by this process's server).
    pub auth_token: Option<String>,
}

/// Validation of one adapter version on the validation tasks. JSON fields as named.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ValSummary {
    /// Tasks run.
    pub tasks: usize,
    /// Mean final reward (a task without one counts 0).
    pub mean_reward: f64,
    /// Half-width of the 95% interval of the mean (1.96·s/√n).
    pub ci95: f64,
    /// Tasks whose attempt succeeded without a reward.
    pub unrewarded: usize,
    /// Tasks whose attempt did not succeed (`failed`, `timeout`, …).
    pub failed: usize,
    /// Share of tasks with at least one violation.
    pub violation_rate: f64,
    /// Seconds the batch took.
    pub seconds: f64,
}

impl ValSummary {
    fn of(finished: &[FinishedRollout], seconds: f64) -> Self {
        let n = finished.len();
        let mut rewards = Vec::with_capacity(n);
        let (mut unrewarded, mut failed, mut violating) = (0, 0, 0);
        for f in finished {
            let j = Judged::from_spans(f);
            if j.reward.is_none() {
                if f.succeeded() {
                    unrewarded += 1;
                } else {
                    failed += 1;
                }
            }
            violating += usize::from(j.violations > 0);
            rewards.push(j.reward.unwrap_or(0.0));
        }
        let (mean, ci95) = mean_ci(&rewards);
        ValSummary {
            tasks: n,
            mean_reward: mean,
            ci95,
            unrewarded,
            failed,
            violation_rate: violating as f64 / n.max(1) as f64,
            seconds,
        }
    }
}

/// Mean and the half-width of its 95% interval (normal approximation; 0 for fewer than 2).
fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, 1.96 * (var / n as f64).sqrt())
}

/// One step of the curve. JSON fields as named; seconds; tokens.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AnyCurvePoint {
    /// Updates done, from 1.
    pub step: usize,
    /// Rollouts run so far.
    pub rollouts: u64,
    /// Mean final reward of the step's rewarded rollouts.
    pub reward: f64,
    /// Rollouts with a reward.
    pub rewarded: usize,
    /// Rollouts left out of the update: no reward, or the attempt failed or timed out.
    pub unrewarded: usize,
    /// Share of the step's rollouts with a violation.
    pub violation_rate: f64,
    /// Groups whose rewards differ (they carry gradient).
    pub informative_groups: usize,
    /// Flagged rollouts dropped (`screen`).
    pub screened: usize,
    /// Calls refused for training (no token ids).
    pub refused_calls: usize,
    /// Calls answered by another adapter version.
    pub stale_calls: usize,
    /// Completion tokens of the step's model calls.
    pub completion_tokens: u64,
    /// Completion tokens per second of the rollout phase.
    pub tokens_per_second: f64,
    /// Seconds of the rollout phase.
    pub rollout_seconds: f64,
    /// Seconds of the update.
    pub update_seconds: f64,
    /// Seconds of the whole step.
    pub step_seconds: f64,
    /// What the update did.
    pub update: agl_train::LlmStepStats,
}

/// The JSON report of `--report`.
#[derive(Debug, Serialize)]
struct AnyReport<'a> {
    algorithm: &'static str,
    seed: u64,
    config: AnyReportConfig<'a>,
    data: AnyData,
    before: Option<ValSummary>,
    after: Option<ValSummary>,
    curve: &'a [AnyCurvePoint],
    adapter: String,
    kernel: agl_gov::KernelStats,
    reward: agl_train::RewardStats,
    peak_rss_bytes: Option<u64>,
    seconds: f64,
}

#[derive(Debug, Serialize)]
struct AnyReportConfig<'a> {
    model: &'a str,
    governance: TrainingMode,
    policy: &'a str,
    runner: String,
    steps: usize,
    tasks_per_step: usize,
    group_size: usize,
    temperature: f64,
    max_tokens: u32,
    lora_rank: usize,
    lora_alpha: f64,
    lora_targets: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpo: Option<&'a agl_train::LlmGrpoConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sft: Option<agl_train::LlmSftConfig>,
    train_roles: Option<Vec<String>>,
    llm_resource: &'a str,
    keep_order: bool,
    workers: usize,
    rollout_timeout_seconds: f64,
    max_attempts: u32,
    resume: Option<String>,
    init_adapter: Option<String>,
}

#[derive(Debug, Serialize)]
struct AnyData {
    train_dataset: Option<String>,
    train_tasks: usize,
    demonstrations: Option<String>,
    demonstration_examples: usize,
    val_dataset: Option<String>,
    val_tasks: usize,
}

/// The runners of `--runner` for one training mode: the hint of `none` names `store_url`;
/// `sql` needs the Spider data ([`super::sql_runner::prepare`]) and the tasks it will run.
pub(super) fn runner_pool(
    any: &AnyArgs,
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    mode: TrainingMode,
    store_url: &str,
    sql_data: Option<&agl_spider::SpiderDataset>,
    tasks: &[&[serde_json::Value]],
) -> anyhow::Result<Box<dyn RunnerPool>> {
    Ok(match &any.runner {
        RunnerSpec::None => Box::new(ExternalRunners {
            idle_warning: Duration::from_secs(60),
            hint: format!(
                "start `agl runner --store-url {store_url} --exec COMMAND` or your agent's Agent \
                 Lightning runner against {store_url}"
            ),
        }),
        RunnerSpec::Exec(command) => exec_pool(command, any, store_url)?,
        RunnerSpec::Sql => match sql_data {
            Some(dataset) => {
                super::sql_runner::pool(shared, args, &any.llm_resource, mode, dataset, tasks)?
            }
            None => bail!("--runner sql: the Spider data was not loaded"),
        },
    })
}

/// Each rollout's time limit and retries (`--rollout-timeout`, `--max-attempts`): a failed,
/// timed-out or unresponsive attempt is retried.
pub(super) fn rollout_config(any: &AnyArgs) -> RolloutConfig {
    RolloutConfig {
        timeout_seconds: Some(any.rollout_timeout),
        max_attempts: any.max_attempts,
        retry_condition: vec![
            agl_core::AttemptStatus::Failed,
            agl_core::AttemptStatus::Timeout,
            agl_core::AttemptStatus::Unresponsive,
        ],
        ..RolloutConfig::default()
    }
}

/// The gateway's kernel for one training mode, from the resolved `--policy` (named `flag` in
/// errors).
pub(super) fn gateway_kernel(
    policy: &PolicyFile,
    flag: &str,
    mode: TrainingMode,
) -> anyhow::Result<Arc<agl_gov::Kernel>> {
    Ok(Arc::new(
        crate::kernel::build_kernel(
            policy,
            &BuildEnv {
                mode: Some(mode.kernel_mode()),
                ..BuildEnv::default()
            },
            None,
        )
        .with_context(|| format!("--policy {flag}"))?,
    ))
}

/// The checks of the serving flags (`--rollout-timeout`, `--max-attempts`, `--store` and
/// `--store-url`, `--advertise-url`), before anything is loaded.
pub(super) fn check_serving(any: &AnyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        any.rollout_timeout.is_finite() && any.rollout_timeout > 0.0,
        "--rollout-timeout must be a positive number of seconds"
    );
    anyhow::ensure!(any.max_attempts >= 1, "--max-attempts must be at least 1");
    anyhow::ensure!(
        any.store_url.is_none() || any.store == "memory",
        "--store {} and --store-url {} both name a store; pass only one",
        any.store,
        any.store_url.as_deref().unwrap_or_default()
    );
    if let Some(url) = &any.advertise_url {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        anyhow::ensure!(
            rest.is_some_and(|r| !r.is_empty() && !r.contains(char::is_whitespace)),
            "--advertise-url {url}: expected an http:// or https:// URL"
        );
    }
    Ok(())
}

/// The store of `--store` or `--store-url` (waiting up to 30 s for a server to answer).
pub(super) fn open_store(
    any: &AnyArgs,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Arc<dyn LightningStore>> {
    Ok(match &any.store_url {
        Some(url) => {
            let client = crate::remote::client(url, any.auth_token.clone())?;
            rt.block_on(crate::remote::wait_for_server(
                &client,
                Duration::from_secs(30),
            ))
            .with_context(|| format!("reaching the store at --store-url {url}"))?;
            Arc::new(client)
        }
        None => rt
            .block_on(agl_store::address::open(&any.store))
            .with_context(|| format!("--store {}", any.store))?,
    })
}

/// `--train-roles` as an `agent_match` pattern (`^(a|b)$`, names escaped); `None`: every call.
pub(super) fn agent_match(roles: Option<&str>) -> anyhow::Result<Option<(Vec<String>, String)>> {
    let Some(s) = roles else {
        return Ok(None);
    };
    let mut names: Vec<String> = Vec::new();
    for n in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !names.iter().any(|o| o == n) {
            names.push(n.to_string());
        }
    }
    if names.is_empty() {
        bail!("--train-roles: name at least one agent");
    }
    let pattern = format!(
        "^({})$",
        names
            .iter()
            .map(|n| regex::escape(n))
            .collect::<Vec<_>>()
            .join("|")
    );
    Ok(Some((names, pattern)))
}

/// Runs `agl train --algorithm …`.
pub fn run(shared: SharedArgs, args: LlmTrainArgs, any: AnyArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    anyhow::ensure!(
        any.algorithm != Algorithm::Apo,
        "--algorithm apo runs its own search (cmd::train::apo)"
    );
    let min_group = match any.algorithm {
        Algorithm::Sft => 1,
        Algorithm::Grpo | Algorithm::Apo => 2,
    };
    let settings = checked(&shared, &args, min_group)?;
    if any.algorithm == Algorithm::Sft {
        anyhow::ensure!(
            any.sft.top_fraction > 0.0 && any.sft.top_fraction <= 1.0,
            "--sft-top-fraction must be in (0, 1]"
        );
        anyhow::ensure!(
            any.sft.min_reward.is_none_or(f64::is_finite),
            "--sft-min-reward must be a finite number"
        );
        anyhow::ensure!(
            shared.resume.is_none(),
            "--resume continues GRPO runs; start SFT from an adapter with --init-adapter DIR"
        );
    }
    if shared.compare && any.runner == RunnerSpec::None && any.store_url.is_none() {
        anyhow::ensure!(
            any.port != 0,
            "--compare serves the store again for each mode: give runners of other processes a \
             fixed --port N to find it at (or run the store apart and pass --store-url)"
        );
    }
    check_serving(&any)?;
    let resume = resume_state(&shared, &args)?;
    let roles = agent_match(args.train_roles.as_deref())?;
    let mut train = match &any.source {
        Source::Tasks(p) => {
            agl_train::load_dataset(p).map_err(|e| anyhow::anyhow!("--train-dataset: {e}"))?
        }
        Source::Demonstrations(_) => Vec::new(),
    };
    let mut demos = match &any.source {
        Source::Demonstrations(p) => agl_train::load_demonstrations(p)
            .map_err(|e| anyhow::anyhow!("--demonstrations: {e}"))?,
        Source::Tasks(_) => Vec::new(),
    };
    if let Some(n) = shared.limit {
        train.truncate(n);
        demos.truncate(n);
    }
    if !any.keep_order {
        train.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(shared.seed));
        demos.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(shared.seed));
    }
    let mut val = match &any.val_dataset {
        Some(p) => {
            let mut v =
                agl_train::load_dataset(p).map_err(|e| anyhow::anyhow!("--val-dataset: {e}"))?;
            v.truncate(args.eval_limit);
            v
        }
        None => Vec::new(),
    };
    let sql_data = super::sql_runner::prepare(&any.runner, &shared.data, &mut train, &mut val)?;
    let policy = PolicyFile::resolve(&shared.policy)
        .with_context(|| format!("--policy {}", shared.policy))?;
    let kernel_for = |mode: TrainingMode| gateway_kernel(&policy, &shared.policy, mode);
    // A policy file that does not build fails before the model is loaded.
    kernel_for(shared.modes[0])?;
    let triplets = TracerTraceToTriplet::new(
        agl_train::DEFAULT_LLM_CALL_MATCH,
        roles.as_ref().map(|(_, p)| p.as_str()),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // The store first: an unreachable server fails before the model is loaded.
    let store = open_store(&any, &rt)?;

    let spec = engine_spec(&args, shared.workers);
    let started_engine = crate::args::engine::start_engine(&spec, "agl train")?;
    let engine = started_engine.engine.clone();
    let base_name = started_engine.name.clone();
    let root = shared
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs/agent"));
    let mut runs: Vec<ModeRun> = Vec::with_capacity(shared.modes.len());
    for &mode in &shared.modes {
        let mode_started = Instant::now();
        if shared.compare {
            eprintln!("== training mode {mode} ({}) ==", mode.title());
        }
        let kernel = match kernel_for(mode) {
            Ok(k) => k,
            Err(e) => {
                engine.shutdown();
                return Err(e);
            }
        };
        let gateway = agl_server::GatewayConfig {
            upstream: agl_server::Upstream::InProcess(started_engine.router()),
            kernel: Some(kernel.clone()),
            request_timeout: Duration::from_secs_f64(args.request_timeout),
        };
        let checkpoint_root = if shared.compare {
            root.join(mode.as_str())
        } else {
            root.clone()
        };
        let result = rt.block_on(async {
            let server = Server::start(&any, store.clone(), gateway).await?;
            let (endpoint, store_hint) = server.announce(&any);
            let pool = runner_pool(
                &any,
                &shared,
                &args,
                mode,
                &store_hint,
                sql_data.as_ref(),
                &[&train, &val],
            )?;
            let rollout_config = rollout_config(&any);
            let serving = EngineServing {
                engine: engine.clone(),
                base: base_name.clone(),
                endpoint: endpoint.clone(),
            };
            // Resources ids of this run: one store may hold several runs (and modes).
            let run_id = format!(
                "agl-train-{}-{}-{mode}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            );
            let validate = |model: String, label: &'static str| {
                let plan = BatchPlan {
                    resources_id: format!("{run_id}-val-{label}"),
                    llm_resource: any.llm_resource.clone(),
                    endpoint: endpoint.clone(),
                    model,
                    temperature: 0.0,
                    max_tokens: args.max_tokens,
                    seed: Some(shared.seed),
                    mode: RolloutMode::Test,
                    workers: shared.workers,
                    config: Some(rollout_config.clone()),
                };
                let (store, pool, val) = (&store, pool.as_ref(), &val);
                async move {
                    if val.is_empty() {
                        return Ok::<_, anyhow::Error>(None);
                    }
                    let bar = progress_bar("val", val.len() as u64, 5);
                    let (finished, seconds) =
                        agl_train::run_batch(store, pool, &plan, val, |_, _| bar.inc(1)).await?;
                    bar.finish_and_clear();
                    let summary = ValSummary::of(&finished, seconds);
                    eprintln!(
                        "{label} training: validation reward {:.3} ± {:.3} ({} tasks, {} without \
                     reward, {} failed, violation rate {:.3}, {:.0} s)",
                        summary.mean_reward,
                        summary.ci95,
                        summary.tasks,
                        summary.unrewarded,
                        summary.failed,
                        summary.violation_rate,
                        summary.seconds
                    );
                    Ok(Some(summary))
                }
            };
            // The seed's PolicyReward, on the algorithm side: the agent's reward less the
            // penalties of the violations its attempt recorded (shaped in `enforce` only).
            let reward = PolicyReward::<(), ()>::new(RewardConfig::default())
                .with_shaping(mode.shapes_reward());
            let (mut trainee, state) = match any.algorithm {
                Algorithm::Grpo | Algorithm::Apo => {
                    let (g, st) =
                        learner(&engine, &shared, &args, &settings, mode, resume.as_ref())?;
                    (Trainee::Grpo(g), st)
                }
                Algorithm::Sft => {
                    let (adapter, vars, start) =
                        initial_adapter(&engine, &shared, &args, &settings, None)?;
                    let config = agl_train::LlmSftConfig {
                        learning_rate: shared.lr,
                        max_grad_norm: settings.grpo.max_grad_norm,
                        micro_batch: settings.grpo.micro_batch,
                        micro_batch_cells: settings.grpo.micro_batch_cells,
                        ..any.sft.clone()
                    };
                    let mut st =
                        trainer_state(&shared, &args, &settings, mode, start, adapter.config());
                    st.algorithm = "sft".into();
                    st.sft = Some(config.clone());
                    let sft =
                        agl_train::LlmSft::new(engine.model().clone(), adapter, vars, config)?;
                    (Trainee::Sft(sft), st)
                }
            };
            let demo_samples = match &any.source {
                Source::Demonstrations(p) => {
                    let template = engine.chat_template().ok_or_else(|| {
                        anyhow::anyhow!(
                            "--demonstrations: the model has no chat template to render them with"
                        )
                    })?;
                    agl_train::demonstration_samples(
                        &demos,
                        template,
                        engine.tokenizer(),
                        &p.display().to_string(),
                        engine.max_context(),
                    )
                    .map_err(|e| anyhow::anyhow!("--demonstrations: {e}"))?
                }
                Source::Tasks(_) => Vec::new(),
            };
            let start_step = state.step;
            let before_model = match &resume {
                Some((dir, st)) => {
                    let name = agl_train::policy_version(st.step);
                    engine.load_adapter(&name, dir)?;
                    name
                }
                None => base_name.clone(),
            };
            let before = validate(before_model.clone(), "before").await?;
            if before_model != base_name {
                serving.retire(&before_model);
            }
            let mut printer = AnyPrinter {
                bar: progress_bar(
                    mode.as_str(),
                    match any.source {
                        Source::Tasks(_) => rollouts_to_run(&shared, &args, start_step),
                        Source::Demonstrations(_) => (args.steps - start_step) as u64,
                    },
                    5,
                ),
                steps: args.steps,
                rollouts: 0,
                curve: Vec::new(),
            };
            let served = match (&mut trainee, &any.source) {
                (Trainee::Sft(sft), Source::Demonstrations(_)) => fit_demonstrations(
                    sft,
                    &demo_samples,
                    &state,
                    &args,
                    &checkpoint_root,
                    shared.checkpoint_every,
                    &serving,
                    &mut printer,
                )?,
                _ => {
                    let training = LlmLoop {
                        config: LlmLoopConfig {
                            resources_prefix: run_id.clone(),
                            llm_resource: any.llm_resource.clone(),
                            checkpoint_dir: Some(checkpoint_root.clone()),
                            rollout_config: Some(rollout_config.clone()),
                            ..loop_config(&shared, &args, mode, start_step)
                        },
                        store: &store,
                        runners: pool.as_ref(),
                        serving: &serving,
                        triplets: &triplets,
                        tasks: &train,
                        judge: &|f| Judged::shaped(f, &reward),
                    };
                    training
                        .run(trainee.learner(), &state, &mut printer)
                        .await?
                }
            };
            printer.bar.finish_and_clear();
            let after = validate(served.clone(), "after").await?;
            if served != base_name {
                serving.retire(&served);
            }
            server.shutdown().await?;
            Ok::<_, anyhow::Error>((before, after, printer.curve, reward.stats(), state.sft))
        });
        let (before, after, curve, reward_stats, sft_config) = match result {
            Ok(r) => r,
            Err(e) => {
                engine.shutdown();
                return Err(e);
            }
        };
        runs.push(ModeRun {
            mode,
            before,
            after,
            curve,
            reward: reward_stats,
            sft: sft_config,
            kernel: kernel.stats(),
            adapter: checkpoint_root.join("final"),
            seconds: mode_started.elapsed().as_secs_f64(),
        });
    }
    engine.shutdown();
    for r in &runs {
        if shared.compare {
            println!("\n== {} ==", r.mode);
        }
        print_table(r.before.as_ref(), r.after.as_ref(), &r.curve, r.seconds);
        println!("adapter: {}", r.adapter.display());
    }
    if shared.compare {
        print_comparison(&runs);
        println!("wall time: {:.1} s", started.elapsed().as_secs_f64());
    }
    if let (Some(_), Source::Demonstrations(_)) = (&shared.plot, &any.source) {
        eprintln!(
            "no plot: --demonstrations trains without rollouts, so there is no reward curve (the \
             report has the loss of each step)"
        );
    } else if let Some(path) = &shared.plot {
        let points: Vec<Vec<CurvePoint>> = runs
            .iter()
            .map(|r| {
                r.curve
                    .iter()
                    .map(|p| CurvePoint {
                        step: p.step,
                        rollouts: p.rollouts,
                        reward: p.reward,
                        violation_rate: p.violation_rate,
                        accuracy: 0.0,
                    })
                    .collect()
            })
            .collect();
        let series: Vec<(&str, &[CurvePoint])> = runs
            .iter()
            .zip(&points)
            .map(|(r, p)| (r.mode.title(), p.as_slice()))
            .collect();
        let svg = crate::out::plot::reward_curves(&series)?;
        crate::out::files::write_file(path, svg.as_bytes(), None)?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &shared.report {
        let reports: Vec<AnyReport<'_>> = runs
            .iter()
            .map(|r| AnyReport {
                algorithm: any.algorithm.as_str(),
                seed: shared.seed,
                config: AnyReportConfig {
                    model: &args.model,
                    governance: r.mode,
                    policy: &shared.policy,
                    runner: any.runner.label(),
                    steps: args.steps,
                    tasks_per_step: args.tasks_per_step,
                    group_size: shared.group_size,
                    temperature: args.temperature,
                    max_tokens: args.max_tokens,
                    lora_rank: args.lora_rank,
                    lora_alpha: settings.lora_alpha,
                    lora_targets: settings
                        .targets
                        .iter()
                        .map(|t| t.name().to_string())
                        .collect(),
                    grpo: (any.algorithm == Algorithm::Grpo).then_some(&settings.grpo),
                    sft: r.sft.clone(),
                    train_roles: roles.as_ref().map(|(names, _)| names.clone()),
                    llm_resource: &any.llm_resource,
                    keep_order: any.keep_order,
                    workers: shared.workers,
                    rollout_timeout_seconds: any.rollout_timeout,
                    max_attempts: any.max_attempts,
                    resume: shared.resume.as_ref().map(|p| p.display().to_string()),
                    init_adapter: shared
                        .init_adapter
                        .as_ref()
                        .map(|p| p.display().to_string()),
                },
                data: AnyData {
                    train_dataset: matches!(any.source, Source::Tasks(_))
                        .then(|| any.source.path().display().to_string()),
                    train_tasks: train.len(),
                    demonstrations: matches!(any.source, Source::Demonstrations(_))
                        .then(|| any.source.path().display().to_string()),
                    demonstration_examples: demos.len(),
                    val_dataset: any.val_dataset.as_ref().map(|p| p.display().to_string()),
                    val_tasks: val.len(),
                },
                before: r.before.clone(),
                after: r.after.clone(),
                curve: &r.curve,
                adapter: r.adapter.display().to_string(),
                kernel: r.kernel,
                reward: r.reward,
                peak_rss_bytes: crate::out::rss::peak_rss_bytes(),
                seconds: r.seconds,
            })
            .collect();
        let json = if shared.compare {
            let modes: Vec<&str> = runs.iter().map(|r| r.mode.as_str()).collect();
            serde_json::to_vec_pretty(&serde_json::json!({
                "algorithm": any.algorithm.as_str(),
                "compare": modes,
                "runs": reports,
                "seconds": started.elapsed().as_secs_f64(),
            }))?
        } else {
            serde_json::to_vec_pretty(&reports[0])?
        };
        crate::out::files::write_file(path, &json, None)?;
        eprintln!("report written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// SFT on demonstrations (no training rollouts): `--steps` updates of `--tasks-per-step`
/// examples each, taken in order and wrapping around; checkpoints as the rollout loop saves
/// them; the final adapter is published as `policy-v{steps}` for validation, and its name
/// returned.
#[allow(clippy::too_many_arguments)]
fn fit_demonstrations(
    sft: &mut agl_train::LlmSft,
    samples: &[TokenSample],
    state: &TrainerState,
    args: &LlmTrainArgs,
    root: &std::path::Path,
    every: Option<usize>,
    serving: &EngineServing,
    printer: &mut AnyPrinter,
) -> anyhow::Result<String> {
    let n = samples.len();
    anyhow::ensure!(n > 0, "--demonstrations: no demonstration");
    let save = |dir: &std::path::Path, sft: &agl_train::LlmSft, step: usize| {
        agl_train::save_checkpoint(
            dir,
            sft.adapter(),
            &TrainerState {
                step,
                ..state.clone()
            },
        )
    };
    for step in state.step..args.steps {
        let started = Instant::now();
        let batch: Vec<TokenSample> = (0..args.tasks_per_step)
            .map(|k| samples[(step * args.tasks_per_step + k) % n].clone())
            .collect();
        let update = sft.step(&batch)?;
        let done = step + 1;
        if every.is_some_and(|k| k > 0 && done % k == 0 && done < args.steps) {
            save(&root.join(format!("step-{done}")), sft, done)?;
        }
        let point = AnyCurvePoint {
            step: done,
            update_seconds: update.seconds,
            step_seconds: started.elapsed().as_secs_f64(),
            update,
            ..AnyCurvePoint::default()
        };
        printer.bar.inc(1);
        printer.bar.suspend(|| {
            eprintln!(
                "step {done}: sft loss {:.4} nats/token over {} tokens of {} demonstrations, \
                 grad norm {:.3}, {:.1} s",
                update.loss,
                update.loss_tokens,
                update.trained_samples,
                update.grad_norm,
                update.seconds
            );
        });
        printer.curve.push(point);
    }
    save(&root.join("final"), sft, args.steps)?;
    let name = agl_train::policy_version(args.steps);
    serving.publish(&name, sft.adapter())?;
    Ok(name)
}

/// One training mode's run, for the tables and the report.
struct ModeRun {
    mode: TrainingMode,
    before: Option<ValSummary>,
    after: Option<ValSummary>,
    curve: Vec<AnyCurvePoint>,
    reward: agl_train::RewardStats,
    sft: Option<agl_train::LlmSftConfig>,
    kernel: agl_gov::KernelStats,
    adapter: PathBuf,
    seconds: f64,
}

/// `--compare`: one column per mode (validation after training, its violation rate, the last
/// step's train reward and violation rate).
fn print_comparison(runs: &[ModeRun]) {
    let cols = crate::out::table::Columns {
        label: 34,
        first: 16,
        cell: 16,
        sep: " ",
    };
    let first = runs.first().map_or(String::new(), |r| r.mode.to_string());
    println!("\n== comparison ==");
    println!(
        "{}",
        cols.line("", &first, runs.iter().skip(1).map(|r| r.mode.to_string()))
    );
    let row = |name: &str, f: &dyn Fn(&ModeRun) -> String| {
        let cells: Vec<String> = runs.iter().map(f).collect();
        println!(
            "{}",
            cols.line(
                name,
                cells.first().map_or("", String::as_str),
                cells.iter().skip(1).cloned()
            )
        );
    };
    let val = |v: Option<&ValSummary>, f: &dyn Fn(&ValSummary) -> String| v.map_or("-".into(), f);
    row("validation reward before", &|r| {
        val(r.before.as_ref(), &|v| {
            format!("{:.3} ±{:.3}", v.mean_reward, v.ci95)
        })
    });
    row("validation reward after", &|r| {
        val(r.after.as_ref(), &|v| {
            format!("{:.3} ±{:.3}", v.mean_reward, v.ci95)
        })
    });
    row("validation violation rate after", &|r| {
        val(r.after.as_ref(), &|v| format!("{:.3}", v.violation_rate))
    });
    row("last step train reward", &|r| {
        r.curve
            .last()
            .map_or("-".into(), |p| format!("{:.3}", p.reward))
    });
    row("last step violation rate", &|r| {
        r.curve
            .last()
            .map_or("-".into(), |p| format!("{:.3}", p.violation_rate))
    });
}

/// The exec pool of `--runner exec:COMMAND`: `--workers` workers here, each running the command
/// once per rollout with the rollout's `--llm-resource` (`agl_train::exec_runner`).
#[cfg(unix)]
pub(super) fn exec_pool(
    command: &str,
    any: &AnyArgs,
    store_url: &str,
) -> anyhow::Result<Box<dyn RunnerPool>> {
    let config = agl_train::ExecConfig {
        command: command.to_string(),
        timeout: Duration::from_secs_f64(any.rollout_timeout),
        llm_resource: Some(any.llm_resource.clone()),
        store_url: Some(store_url.to_string()),
        env: Vec::new(),
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("--runner exec: {e}"))?;
    Ok(Box::new(agl_train::ExecRunners::new(config)))
}

#[cfg(not(unix))]
pub(super) fn exec_pool(_: &str, _: &AnyArgs, _: &str) -> anyhow::Result<Box<dyn RunnerPool>> {
    bail!("--runner exec: runs commands in process groups, which this platform does not have")
}

/// What this process serves: the store with the gateway, or the gateway alone.
pub(super) struct Server {
    pub(super) url: String,
    running: Running,
}

enum Running {
    Store(agl_server::RunningServer),
    Gateway {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    },
}

impl Server {
    pub(super) async fn start(
        any: &AnyArgs,
        store: Arc<dyn LightningStore>,
        gateway: agl_server::GatewayConfig,
    ) -> anyhow::Result<Self> {
        if any.store_url.is_none() {
            let config = agl_server::ServerConfig {
                host: any.host.clone(),
                port: any.port,
                auth_token: any.auth_token.clone().filter(|t| !t.is_empty()),
                ..agl_server::ServerConfig::default()
            };
            let server = agl_server::start_with_gateway(store, config, Some(gateway))
                .await
                .context("starting the store server with the LLM gateway")?;
            return Ok(Server {
                url: server.url(),
                running: Running::Store(server),
            });
        }
        let router = agl_server::gateway::router(store, gateway).map_err(anyhow::Error::msg)?;
        let addr = format!("{}:{}", any.host, any.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr} (--host, --port)"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Server {
            url: format!("http://{local}"),
            running: Running::Gateway { stop, task },
        })
    }

    /// Prints where it listens and where the store is; returns the gateway's `/v1` URL as
    /// agents reach it (`--advertise-url`, else this server) and the store URL runners use.
    pub(super) fn announce(&self, any: &AnyArgs) -> (String, String) {
        use std::io::Write;
        let advertised = any.advertise_url.as_deref().unwrap_or(&self.url);
        let endpoint = format!("{}/v1", advertised.trim_end_matches('/'));
        match &any.store_url {
            Some(url) => println!(
                "agl train: gateway listening on {} (advertised as {endpoint}), store {url}",
                self.url
            ),
            None => println!(
                "agl train: store and gateway listening on {} (advertised as {endpoint})",
                self.url
            ),
        }
        let _ = std::io::stdout().flush();
        let store = any.store_url.clone().unwrap_or_else(|| self.url.clone());
        (endpoint, store)
    }

    pub(super) async fn shutdown(self) -> anyhow::Result<()> {
        match self.running {
            Running::Store(s) => s.shutdown().await?,
            Running::Gateway { stop, task } => {
                let _ = stop.send(());
                task.await.context("the gateway server stopped")??;
            }
        }
        Ok(())
    }
}

/// The loop's observer: the bar, one line per step, the curve.
struct AnyPrinter {
    bar: ProgressBar,
    steps: usize,
    rollouts: u64,
    curve: Vec<AnyCurvePoint>,
}

impl LoopObserver for AnyPrinter {
    fn rollout_done(&mut self, _: &agl_core::Rollout, _: Option<&agl_core::Attempt>) {
        // Dynamic sampling may run more rollouts than planned.
        if self.bar.length().is_some_and(|n| self.bar.position() >= n) {
            self.bar.inc_length(1);
        }
        self.bar.inc(1);
    }

    fn step_done(&mut self, outcome: &StepOutcome<'_>) -> Result<(), agl_train::TrainError> {
        let n = outcome.finished.len();
        self.rollouts += n as u64;
        let rewards: Vec<f64> = outcome.judged.iter().filter_map(|j| j.reward).collect();
        let violating = outcome.judged.iter().filter(|j| j.violations > 0).count();
        let completion_tokens: u64 = outcome
            .finished
            .iter()
            .flat_map(|f| f.spans.iter())
            .filter_map(
                |sp| match sp.attributes.get(semconv::gen_ai::USAGE_COMPLETION_TOKENS) {
                    Some(AttributeValue::Int(t)) => u64::try_from(*t).ok(),
                    _ => None,
                },
            )
            .sum();
        let s = &outcome.stats;
        let point = AnyCurvePoint {
            step: s.step,
            rollouts: self.rollouts,
            reward: if rewards.is_empty() {
                0.0
            } else {
                rewards.iter().sum::<f64>() / rewards.len() as f64
            },
            rewarded: rewards.len(),
            unrewarded: n - rewards.len(),
            violation_rate: violating as f64 / n.max(1) as f64,
            informative_groups: s.informative_groups,
            screened: s.screened,
            refused_calls: s.refused_calls,
            stale_calls: s.stale_calls,
            completion_tokens,
            tokens_per_second: completion_tokens as f64 / s.rollout_seconds.max(1e-9),
            rollout_seconds: s.rollout_seconds,
            update_seconds: s.update.seconds,
            step_seconds: s.step_seconds,
            update: s.update,
        };
        self.bar.set_message(format!(
            "step {}/{}: reward {:.3}  violations {:.1}%  {:.1} tok/s  {:.0} s/step",
            point.step,
            self.steps,
            point.reward,
            100.0 * point.violation_rate,
            point.tokens_per_second,
            point.step_seconds
        ));
        let line = format!(
            "step {}: reward {:.3} over {} rewarded rollouts ({} without reward), violations \
             {:.2}, {} informative groups, {} of {} samples trained ({} stale, {} refused \
             calls), {:.1} tok/s, rollouts {:.0} s, update {:.0} s",
            point.step,
            point.reward,
            point.rewarded,
            point.unrewarded,
            point.violation_rate,
            point.informative_groups,
            point.update.trained_samples,
            point.update.samples,
            point.stale_calls,
            point.refused_calls,
            point.tokens_per_second,
            point.rollout_seconds,
            point.update_seconds
        );
        self.bar.suspend(|| {
            eprintln!("{line}");
            if point.rewarded == 0 {
                eprintln!(
                    "warning: no rollout of step {} reported a reward ({} failed or timed out): \
                     nothing was learned; see the runners' output and the attempts' metadata \
                     (`agl store inspect`, the dashboard)",
                    point.step,
                    outcome.finished.len()
                        - outcome.finished.iter().filter(|f| f.succeeded()).count()
                );
            }
        });
        self.curve.push(point);
        Ok(())
    }
}

fn print_table(
    before: Option<&ValSummary>,
    after: Option<&ValSummary>,
    curve: &[AnyCurvePoint],
    seconds: f64,
) {
    println!();
    if before.is_none() && after.is_none() {
        println!("validation: none (no --val-dataset)");
    } else {
        print_validation(before, after);
    }
    let n = curve.len().max(1) as f64;
    let rollouts: usize = curve.iter().map(|p| p.rewarded + p.unrewarded).sum();
    let unrewarded: usize = curve.iter().map(|p| p.unrewarded).sum();
    let tokens: u64 = curve.iter().map(|p| p.completion_tokens).sum();
    let rollout_s: f64 = curve.iter().map(|p| p.rollout_seconds).sum();
    println!("train rollouts: {rollouts} ({unrewarded} without reward, left out of the update)");
    println!(
        "train mean reward per step: {:.3}",
        curve.iter().map(|p| p.reward).sum::<f64>() / n
    );
    println!(
        "mean seconds per step: {:.1} (rollouts {:.1}, update {:.1}); rollout tokens/s {:.1}",
        curve.iter().map(|p| p.step_seconds).sum::<f64>() / n,
        rollout_s / n,
        curve.iter().map(|p| p.update_seconds).sum::<f64>() / n,
        tokens as f64 / rollout_s.max(1e-9)
    );
    if let Some(b) = crate::out::rss::peak_rss_bytes() {
        println!("peak RSS: {:.2} GiB", b as f64 / (1u64 << 30) as f64);
    }
    println!("wall time: {seconds:.1} s");
}

/// The validation rows, before and after training.
fn print_validation(before: Option<&ValSummary>, after: Option<&ValSummary>) {
    let cols = crate::out::table::Columns {
        label: 34,
        first: 16,
        cell: 16,
        sep: " ",
    };
    println!(
        "{}",
        cols.line("", "before", ["after".to_string()].into_iter())
    );
    let val = |v: Option<&ValSummary>, f: &dyn Fn(&ValSummary) -> String| v.map_or("-".into(), f);
    let row = |name: &str, f: &dyn Fn(&ValSummary) -> String| {
        println!(
            "{}",
            cols.line(name, &val(before, f), [val(after, f)].into_iter())
        );
    };
    row("validation mean reward", &|v| {
        format!("{:.3}", v.mean_reward)
    });
    row("  95% interval (normal approx.)", &|v| {
        format!("±{:.3}", v.ci95)
    });
    row("validation tasks", &|v| v.tasks.to_string());
    row("  without reward / failed", &|v| {
        format!("{} / {}", v.unrewarded, v.failed)
    });
    row("validation violation rate", &|v| {
        format!("{:.3}", v.violation_rate)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_parse_and_refuse_with_a_hint() {
        assert_eq!(parse_runner("none").unwrap(), RunnerSpec::None);
        assert_eq!(parse_runner("sql").unwrap(), RunnerSpec::Sql);
        assert_eq!(
            parse_runner("exec:python agent.py --x").unwrap(),
            RunnerSpec::Exec("python agent.py --x".into())
        );
        assert!(
            parse_runner("exec:  ")
                .unwrap_err()
                .contains("needs a command")
        );
        let e = parse_runner("python agent.py").unwrap_err();
        assert!(
            e.contains("not a runner") && e.contains("exec:COMMAND"),
            "{e}"
        );
    }

    #[test]
    fn train_roles_become_an_escaped_agent_match() {
        assert!(agent_match(None).unwrap().is_none());
        let (names, p) = agent_match(Some("write, sql.agent,write"))
            .unwrap()
            .unwrap();
        assert_eq!(names, vec!["write", "sql.agent"]);
        assert_eq!(p, r"^(write|sql\.agent)$");
        assert!(agent_match(Some(" , ")).is_err());
    }

    #[test]
    fn the_interval_is_the_normal_approximation() {
        assert_eq!(mean_ci(&[]), (0.0, 0.0));
        assert_eq!(mean_ci(&[0.5]), (0.5, 0.0));
        let (m, ci) = mean_ci(&[0.0, 1.0, 1.0, 0.0]);
        assert!((m - 0.5).abs() < 1e-12);
        // s = sqrt(1/3), n = 4
        assert!(
            (ci - 1.96 * (1.0f64 / 3.0 / 4.0).sqrt()).abs() < 1e-12,
            "{ci}"
        );
    }
}
