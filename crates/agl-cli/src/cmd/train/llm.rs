//! `agl train --agent llm`: GRPO with LoRA on the Spider SQL agent, through the store, the
//! gateway and the kernel (the loop of the repository's DESIGN, "The LLM path").
//!
//! One process holds every part: the built-in engine (dense f32 weights: the sampler's
//! log-probabilities must be the ones training recomputes), an in-memory store whose HTTP
//! server mounts the governed gateway over the engine, runner workers running
//! [`agl_spider::LlmSqlAgent`], and the learner ([`agl_train::LlmGrpo`]). Each step:
//! 1. takes `--tasks-per-step` train questions (see "Tasks") and enqueues each `--group-size`
//!    times as `train` rollouts whose resources name the current adapter version
//!    (`policy-vN`; version 0 is the base model) in a `proxy_llm`;
//! 2. runners serve them concurrently (the engine batches the calls); the gateway records every
//!    call with its token ids and log-probabilities, the kernel checks the agent's SQL and the
//!    model's output, and `PolicyReward` shapes the reward (enforce) or the task reward stands
//!    alone (audit: no penalty, no bonus, nothing blocked);
//! 3. the span→triplet adapter (`TracerTraceToTriplet`, `agent_match` from `--train-roles`)
//!    turns each rollout's calls into triplets; calls answered by another adapter version than
//!    the one being trained are dropped and counted (never importance-weighted: the loop is
//!    synchronous, so none is expected); calls without token ids are refused and counted;
//! 4. multi-turn samples, group-relative advantages and one LoRA GRPO update
//!    ([`agl_train::llm_grpo`]);
//! 5. the new adapter is handed to the engine as `policy-v{N+1}` and, every
//!    `--checkpoint-every` steps, saved.
//!
//! Before the first step and after the last, the greedy agent (temperature 0, kernel
//! enforcing) is evaluated on a fixed dev subset: `--eval-limit N` questions spread evenly over
//! the dev split (positions `⌊i · 972 / N⌋`), the same for every run and seed.
//!
//! **Tasks.** `--curriculum easy` (default) keeps train questions whose gold query is one
//! SELECT over one table (no JOIN, no subquery, no set operation, no GROUP BY): the easier
//! questions a 135M model can sometimes answer, so groups see some reward; `all` keeps every
//! train question. `--limit N` keeps the first N of those. They are shuffled once with
//! `--seed` and taken in order, `--tasks-per-step` per step, wrapping around.
//!
//! **Checkpoints.** `--checkpoint-dir DIR` (default `runs/llm`) receives `step-N/` every
//! `--checkpoint-every` steps and `final/` (with `--compare`, under `DIR/audit/` and
//! `DIR/enforce/`): the adapter in PEFT's layout (`adapter_config.json`,
//! `adapter_model.safetensors`: `agl llm serve --adapter`, `agl eval --adapter`, PEFT and vLLM
//! load it) and `trainer_state.json` (step, seed, governance, model, LoRA and GRPO settings).
//! Each is written into a temporary directory and renamed. `--resume DIR` continues from one:
//! the adapter's factors become the trainable variables again and the step count goes on;
//! AdamW's moment estimates are not saved (they restart at zero).
//!
//! Responsible for the `--agent llm` flags, the loop and the report (the flags it shares with
//! the scorer are read by [`super`]); not for the algorithm (`agl_train::llm_grpo`), the agent
//! (`agl_spider::sql_agent`), the gateway (`agl-server`) or the rollout staging it shares with
//! `agl eval` ([`crate::llm_stage`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::RolloutMode;
use agl_gov::{BuildEnv, GovernanceMode, Kernel, PolicyFile};
use agl_llm::{LoraAdapter, LoraConfig, Target};
use agl_spider::sql_agent::{QUERY_OPERATION, ROLES};
use agl_spider::{
    CurvePoint, EvalStats, LlmSqlAgent, RunReport, SqlAgentConfig, SqlEvalRow, SqlEvalSummary,
    SqlTaskReward, TrainStats, sql_agent_reward,
};
use agl_spider::{ExecutorConfig, Question, SpiderDataset, Split};
use agl_train::{
    LlmGrpo, LlmGrpoConfig, LlmStepStats, RewardConfig, TracerTraceToTriplet, TrainingMode,
    assign_advantages, samples_from_triplets,
};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::llm_stage::{BatchPlan, Finished, LlmStage};
use crate::out::progress::progress_bar;
use agl_core::semconv;

/// Which train questions the LLM trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Curriculum {
    /// Gold query is one SELECT over one table, without JOIN, subquery, set operation or
    /// GROUP BY.
    Easy,
    /// Every train question.
    All,
}

/// The flags of `agl train` that only `--agent llm` reads.
#[derive(Debug, Clone, Args)]
pub struct LlmTrainArgs {
    /// The model (--agent llm): a known name (`agl model pull NAME`), a .gguf file or a
    /// Hugging Face model directory. Trained with dense f32 weights.
    #[arg(long, value_name = "NAME|PATH", default_value = agl_llm::hub::DEFAULT_MODEL)]
    pub model: String,
    /// Where the engine and the training run (--agent llm): cpu, cuda, cuda:N (a build with
    /// `--features cuda`), or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// GRPO updates (--agent llm).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Train questions per update (--agent llm); each is sampled --group-size times.
    #[arg(long, default_value_t = 2)]
    pub tasks_per_step: usize,
    /// LoRA rank r (--agent llm).
    #[arg(long, default_value_t = 8)]
    pub lora_rank: usize,
    /// LoRA alpha (--agent llm) [default: 2 × rank].
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// Modules LoRA wraps (--agent llm), comma-separated: q, k, v, o, gate, up, down.
    #[arg(long, default_value = "q,k,v,o")]
    pub lora_targets: String,
    /// Sampling temperature of training rollouts (--agent llm; evaluation is greedy).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f64,
    /// Task reward of training rollouts (--agent llm), before governance shapes it:
    /// `execution` (1 for a right answer, else 0) or `partial` (a query that ran but answered
    /// wrong also earns half its schema-linking similarity to the gold query).
    #[arg(long, default_value = "execution", value_parser = parse_task_reward)]
    pub task_reward: SqlTaskReward,
    /// Most queries the agent writes per question (--agent llm): 1 is write only; more adds a
    /// check and a rewrite per extra turn.
    #[arg(long, default_value_t = 1)]
    pub max_turns: usize,
    /// Most new tokens per model call (--agent llm).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Dev questions evaluated before and after training (--agent llm), spread evenly over
    /// the dev split.
    #[arg(long, default_value_t = 100)]
    pub eval_limit: usize,
    /// Agent roles whose calls are trained (--agent llm), comma-separated among write, check,
    /// rewrite (Agent Lightning's agent_match).
    #[arg(long, default_value = "write,rewrite")]
    pub train_roles: String,
    /// Most answers per forward/backward pass (--agent llm); answers to one prompt share it.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: usize,
    /// Most attention cells per forward/backward pass (--agent llm): prompt² + answers ×
    /// answer length × (prompt + answer length); bounds memory (an answer over budget alone
    /// goes alone).
    #[arg(long, default_value_t = 300_000)]
    pub micro_batch_cells: usize,
    /// Train questions used (--agent llm): easy (single-table SELECT gold queries) or all.
    #[arg(long, value_enum, default_value = "easy")]
    pub curriculum: Curriculum,
    /// Time limit of one model call in seconds (--agent llm).
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
}

/// The flags `--agent llm` shares with the scorer, resolved to their values.
#[derive(Debug, Clone)]
pub struct SharedArgs {
    /// Spider data directory.
    pub data: PathBuf,
    /// Seed of the task order and the adapter's initialisation.
    pub seed: u64,
    /// G.
    pub group_size: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// KL coefficient.
    pub kl_beta: f64,
    /// Concurrent agents.
    pub workers: usize,
    /// Policy file or preset.
    pub policy: String,
    /// Training modes, one run each, in order (`--governance`, or `--compare`'s list).
    pub modes: Vec<TrainingMode>,
    /// Whether `--compare` was given (checkpoints go under `DIR/<mode>/`).
    pub compare: bool,
    /// JSON report path.
    pub report: Option<PathBuf>,
    /// SVG plot path.
    pub plot: Option<PathBuf>,
    /// Checkpoint directory.
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every N steps.
    pub checkpoint_every: Option<usize>,
    /// Resume from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Statement time limit, seconds.
    pub sql_timeout: f64,
    /// First N train questions (after the curriculum filter).
    pub limit: Option<usize>,
}

/// `trainer_state.json` of an LLM checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// Updates done.
    pub step: usize,
    /// The run's seed.
    pub seed: u64,
    /// Training mode of the run (`audit`, `shield`, `screen`, `enforce`).
    pub governance: TrainingMode,
    /// The base model (`--model`).
    pub model: String,
    /// LoRA rank.
    pub lora_rank: usize,
    /// LoRA alpha.
    pub lora_alpha: f64,
    /// Wrapped modules.
    pub lora_targets: Vec<String>,
    /// The GRPO settings.
    pub grpo: LlmGrpoConfig,
    /// Questions per step and G.
    pub tasks_per_step: usize,
    /// G.
    pub group_size: usize,
}

/// The file name of the trainer's state in a checkpoint directory.
pub const TRAINER_STATE: &str = "trainer_state.json";

/// One point of the LLM learning curve (one update). JSON fields as named; seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCurvePoint {
    /// Update number, from 1.
    pub step: usize,
    /// Rollouts run so far in this run.
    pub rollouts: u64,
    /// Mean final reward of the step's rollouts.
    pub reward: f64,
    /// Share of the step's rollouts with a violation.
    pub violation_rate: f64,
    /// Share of the step's rollouts whose final query matched the gold result.
    pub accuracy: f64,
    /// Share of the step's rollouts whose final query ran.
    #[serde(default)]
    pub executed_rate: f64,
    /// Mean schema linking of the step's final queries (0 for one that did not run).
    #[serde(default)]
    pub schema_linking: f64,
    /// Completion tokens sampled in the step.
    pub completion_tokens: u64,
    /// Completion tokens per second of the rollout phase.
    pub tokens_per_second: f64,
    /// Seconds of the rollout phase (generation, gateway, kernel, execution).
    pub rollout_seconds: f64,
    /// Seconds the engine spent answering the step's calls, summed over calls
    /// (`agl.latency_s` of the gateway spans; concurrent calls overlap).
    pub llm_call_seconds: f64,
    /// Seconds of the agent's statements, summed over statements: the kernel's check and the
    /// sandboxed execution (the duration of the `sql.query` operation spans).
    #[serde(default)]
    pub sql_seconds: f64,
    /// Seconds of forward, backward and optimizer.
    pub update_seconds: f64,
    /// Seconds of the whole step.
    pub step_seconds: f64,
    /// Groups whose rewards were not all equal (they carry gradient).
    pub informative_groups: usize,
    /// Calls refused for training (no token ids or log-probabilities).
    pub refused_calls: usize,
    /// Calls dropped because another adapter version answered them.
    pub stale_calls: usize,
    /// Flagged rollouts dropped from the gradient (`screen` mode; 0 otherwise).
    #[serde(default)]
    pub screened: usize,
    /// What the update did.
    pub update: LlmStepStats,
}

/// One training run (one governance mode). JSON fields as named.
#[derive(Debug, Clone, Serialize)]
pub struct LlmRun {
    /// Train metrics over every rollout of the run.
    pub train: TrainStats,
    /// Dev metrics of the greedy agent after training (kernel enforcing).
    pub dev: EvalStats,
    /// Dev details after training.
    pub dev_llm: SqlEvalSummary,
    /// Per-step curve.
    pub curve: Vec<LlmCurvePoint>,
    /// The final adapter directory.
    pub adapter: String,
    /// Peak resident memory of the process so far, bytes (Linux `VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// The training kernel's checks over the run (count, cache hit rate, time per check).
    pub kernel: agl_gov::KernelStats,
    /// Seconds of the run (training and the final evaluation).
    pub seconds: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    agent: &'static str,
    seed: u64,
    config: ReportConfig<'a>,
    data: DataReport,
    untrained: Untrained,
    runs: BTreeMap<TrainingMode, LlmRun>,
    seconds: f64,
}

#[derive(Serialize)]
struct ReportConfig<'a> {
    model: &'a str,
    steps: usize,
    tasks_per_step: usize,
    group_size: usize,
    lora_rank: usize,
    lora_alpha: f64,
    lora_targets: Vec<String>,
    grpo: &'a LlmGrpoConfig,
    temperature: f64,
    task_reward: SqlTaskReward,
    max_turns: usize,
    max_tokens: u32,
    train_roles: Vec<String>,
    curriculum: Curriculum,
    policy: &'a str,
    workers: usize,
    resume: Option<String>,
    data_dir: String,
}

#[derive(Serialize)]
struct DataReport {
    train_questions: usize,
    dev_questions: usize,
    dev_selection: String,
}

#[derive(Serialize)]
struct Untrained {
    dev: EvalStats,
    dev_llm: SqlEvalSummary,
}

/// Whether `gold` is an "easy" query (see [`Curriculum::Easy`]).
pub fn is_easy(gold: &str) -> bool {
    let up = format!(" {} ", gold.to_ascii_uppercase().replace(['(', ')'], " "));
    let selects = up.matches(" SELECT ").count();
    selects == 1
        && ![" JOIN ", " INTERSECT ", " UNION ", " EXCEPT ", " GROUP BY "]
            .iter()
            .any(|k| up.contains(k))
        && !up.split(" FROM ").nth(1).is_some_and(|from| {
            [" WHERE ", " ORDER BY ", " LIMIT "]
                .iter()
                .fold(from, |rest, k| rest.split(k).next().unwrap_or(rest))
                .contains(',')
        })
}

/// Positions `⌊i · total / n⌋` for `i < n` (all of them when `n ≥ total`).
pub fn spread(total: usize, n: usize) -> Vec<usize> {
    if n >= total {
        return (0..total).collect();
    }
    (0..n).map(|i| i * total / n).collect()
}

fn parse_targets(s: &str) -> anyhow::Result<Vec<Target>> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let t = Target::parse(name).with_context(|| {
            format!("--lora-targets: unknown module `{name}` (expected q, k, v, o, gate, up, down)")
        })?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    if out.is_empty() {
        bail!("--lora-targets: name at least one module");
    }
    Ok(out)
}

fn parse_roles(s: &str) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for r in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !ROLES.contains(&r) {
            bail!(
                "--train-roles: unknown role `{r}` (expected {})",
                ROLES.join(", ")
            );
        }
        if !out.iter().any(|o| o == r) {
            out.push(r.to_string());
        }
    }
    if out.is_empty() {
        bail!("--train-roles: name at least one role");
    }
    Ok(out)
}

fn parse_task_reward(s: &str) -> Result<SqlTaskReward, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}` is not a task reward: use execution or partial"))
}

/// Reads and checks a checkpoint directory for `--resume`.
fn read_state(dir: &Path) -> anyhow::Result<TrainerState> {
    let path = dir.join(TRAINER_STATE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "--resume {}: cannot read {TRAINER_STATE} (expected a step-N or final directory of \
             `agl train --agent llm --checkpoint-dir`)",
            dir.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{}: malformed", path.display()))
}

/// Writes `adapter` and `state` into `dir` atomically
/// ([`agl_train::checkpoint::write_dir_atomically`], the mechanism of every checkpoint).
fn save_checkpoint(dir: &Path, adapter: &LoraAdapter, state: &TrainerState) -> anyhow::Result<()> {
    let root = dir.parent().unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a checkpoint directory name", dir.display()))?;
    let json = serde_json::to_vec_pretty(state)?;
    agl_train::checkpoint::write_dir_atomically(root, name, |tmp| {
        adapter.save(tmp)?;
        let path = tmp.join(TRAINER_STATE);
        std::fs::write(&path, &json).map_err(|source| agl_train::TrainError::Io { path, source })
    })
    .with_context(|| format!("saving the checkpoint {}", dir.display()))?;
    Ok(())
}

/// Runs `agl train --agent llm`.
pub fn run(shared: SharedArgs, args: LlmTrainArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    anyhow::ensure!(
        args.tasks_per_step > 0,
        "--tasks-per-step must be at least 1"
    );
    anyhow::ensure!(
        shared.group_size >= 2,
        "--group-size must be at least 2 (advantages are group-relative)"
    );
    anyhow::ensure!(args.max_turns > 0, "--max-turns must be at least 1");
    anyhow::ensure!(args.max_tokens > 0, "--max-tokens must be at least 1");
    anyhow::ensure!(args.eval_limit > 0, "--eval-limit must be at least 1");
    anyhow::ensure!(shared.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(args.lora_rank > 0, "--lora-rank must be at least 1");
    anyhow::ensure!(
        args.temperature.is_finite() && args.temperature > 0.0 && args.temperature <= 2.0,
        "--temperature must be in (0, 2] for training (GRPO needs different samples per group)"
    );
    if shared.checkpoint_every == Some(0) {
        bail!("--checkpoint-every must be at least 1");
    }
    let targets = parse_targets(&args.lora_targets)?;
    let roles = parse_roles(&args.train_roles)?;
    let lora_alpha = args.lora_alpha.unwrap_or(2.0 * args.lora_rank as f64);
    anyhow::ensure!(
        lora_alpha.is_finite() && lora_alpha > 0.0,
        "--lora-alpha must be positive"
    );
    let grpo_config = LlmGrpoConfig {
        learning_rate: shared.lr,
        kl_beta: shared.kl_beta,
        micro_batch: args.micro_batch,
        micro_batch_cells: args.micro_batch_cells,
        ..LlmGrpoConfig::default()
    };
    grpo_config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    // Fail before loading anything when the model or the checkpoint is unusable.
    agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())
        .with_context(|| format!("--model {}", args.model))?;
    let resume = match &shared.resume {
        Some(dir) => {
            let state = read_state(dir)?;
            if state.model != args.model {
                bail!(
                    "--resume {}: the checkpoint trained --model {}, not {}",
                    dir.display(),
                    state.model,
                    args.model
                );
            }
            if shared.compare || shared.modes != [state.governance] {
                bail!(
                    "--resume {}: the checkpoint was trained with --governance {} (without \
                     --compare); resume it the same way",
                    dir.display(),
                    state.governance.as_str()
                );
            }
            Some((dir.clone(), state))
        }
        None => None,
    };
    let policy = PolicyFile::resolve(&shared.policy)
        .with_context(|| format!("--policy {}", shared.policy))?;
    if !shared.data.is_dir() {
        bail!(
            "data directory {} does not exist (pass --data DIR)",
            shared.data.display()
        );
    }
    let dataset = SpiderDataset::load(&shared.data)
        .with_context(|| format!("loading Spider data from {}", shared.data.display()))?;
    let mut train: Vec<&Question> = dataset
        .questions(Split::Train)
        .iter()
        .filter(|q| args.curriculum == Curriculum::All || is_easy(&q.gold_sql))
        .take(shared.limit.unwrap_or(usize::MAX))
        .collect();
    if train.is_empty() {
        bail!("no train questions selected (--curriculum, --limit)");
    }
    train.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(shared.seed));
    let dev_all = dataset.questions(Split::Dev);
    let dev_positions = spread(dev_all.len(), args.eval_limit);
    let dev: Vec<Question> = dev_positions.iter().map(|&i| dev_all[i].clone()).collect();
    let dev_selection = format!(
        "{} of {} dev questions at positions floor(i * {} / {}) (file order)",
        dev.len(),
        dev_all.len(),
        dev_all.len(),
        args.eval_limit.min(dev_all.len())
    );
    let mut all_q: Vec<&Question> = train.clone();
    all_q.extend(dev.iter());
    let stats = crate::kernel::table_stats(&dataset, all_q.iter().copied())?;
    // One check cache for every kernel of the run (the agent's statements recur).
    let check_cache = Arc::new(agl_gov::CheckCache::default());
    let kernel_for = |mode: GovernanceMode| -> anyhow::Result<Arc<Kernel>> {
        let env = BuildEnv {
            table_stats: stats.clone(),
            mode: Some(mode),
            check_cache: Some(check_cache.clone()),
        };
        Ok(Arc::new(
            crate::kernel::build_kernel(&policy, &env, None)
                .with_context(|| format!("--policy {}", shared.policy))?,
        ))
    };

    let spec = agl_llm::EngineSpec {
        model: args.model.clone(),
        weights: agl_llm::WeightFormat::Dense,
        device: args.device.clone(),
        adapters: Vec::new(),
        served_model_name: None,
        max_batch_rows: (shared.workers * args.max_turns.max(1)).clamp(8, 64),
    };
    let started_engine = crate::args::engine::start_engine(&spec, "agl train")?;
    let engine = started_engine.engine.clone();
    let base_name = started_engine.name.clone();
    let upstream = || agl_server::Upstream::InProcess(started_engine.router());
    let agent = Arc::new(LlmSqlAgent::new(
        dataset.root.join(agl_spider::DATABASE_DIR),
        SqlAgentConfig {
            max_turns: args.max_turns,
            max_tokens: args.max_tokens,
            temperature: 0.0,
            request_timeout: Duration::from_secs_f64(args.request_timeout),
            llm_resource: Some("main_llm".into()),
            executor: ExecutorConfig {
                timeout: Duration::from_secs_f64(shared.sql_timeout),
            },
        },
    )?);
    let adapter_pattern = format!("^({})$", roles.join("|"));
    let triplet_adapter =
        TracerTraceToTriplet::new(agl_train::DEFAULT_LLM_CALL_MATCH, Some(&adapter_pattern))?;
    let modes = shared.modes.clone();
    let checkpoint_root = shared
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs/llm"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let request_timeout = Duration::from_secs_f64(args.request_timeout);
    let eval_kernel = kernel_for(GovernanceMode::Enforce)?;
    let eval_plan = |model: &str, id: &str| BatchPlan {
        resources_id: id.to_string(),
        model: model.to_string(),
        temperature: 0.0,
        max_tokens: args.max_tokens,
        seed: Some(shared.seed),
        mode: RolloutMode::Test,
        workers: shared.workers,
    };
    let result = rt.block_on(async {
        let eval_stage = LlmStage::start(
            upstream(),
            eval_kernel.clone(),
            agent.clone(),
            Arc::new(sql_agent_reward(
                RewardConfig::default(),
                SqlTaskReward::Execution,
            )),
            request_timeout,
        )
        .await?;
        let evaluate = |model: String, id: String| {
            let stage = &eval_stage;
            let dev = &dev;
            let plan = eval_plan(&model, &id);
            async move {
                let bar = progress_bar("eval", dev.len() as u64, 5);
                let (rows, seconds) = stage.run(&plan, dev, &bar, |_| {}).await?;
                bar.finish_and_clear();
                let rows: Vec<SqlEvalRow> = rows.into_iter().map(|f| f.row).collect();
                Ok::<_, anyhow::Error>(SqlEvalSummary::from_rows(&rows, seconds))
            }
        };
        let before_model = match &resume {
            Some((dir, state)) => {
                let name = format!("policy-v{}", state.step);
                engine.load_adapter(&name, dir)?;
                name
            }
            None => base_name.clone(),
        };
        eprintln!(
            "evaluating the {} agent on {} dev questions (greedy, kernel enforcing)",
            if resume.is_some() {
                "resumed"
            } else {
                "untrained"
            },
            dev.len()
        );
        let before = evaluate(before_model, "agl-train-llm-eval-before".into()).await?;
        eprintln!(
            "before training: dev accuracy {:.3}, violation rate {:.3} ({} questions, {:.0} s)",
            before.accuracy, before.violation_rate, before.questions, before.seconds
        );
        let mut runs = BTreeMap::new();
        for &mode in &modes {
            let run_started = Instant::now();
            let kernel = kernel_for(mode.kernel_mode())?;
            let train_kernel = kernel.clone();
            let reward = sql_agent_reward(RewardConfig::default(), args.task_reward)
                .with_shaping(mode.shapes_reward());
            let stage = LlmStage::start(
                upstream(),
                kernel,
                agent.clone(),
                Arc::new(reward),
                request_timeout,
            )
            .await?;
            let dir = if shared.compare {
                checkpoint_root.join(mode.as_str())
            } else {
                checkpoint_root.clone()
            };
            let (adapter, vars, start_step) = match &resume {
                Some((rdir, state)) => {
                    let a = LoraAdapter::load(rdir, engine.model().config(), engine.model().device())?;
                    let (a, v) = a.into_trainable()?;
                    (a, v, state.step)
                }
                None => {
                    let cfg = LoraConfig {
                        r: args.lora_rank,
                        alpha: lora_alpha,
                        target_modules: targets.clone(),
                        use_rslora: false,
                        base_model: Some(args.model.clone()),
                    };
                    let (a, v) = LoraAdapter::new_trainable(
                        cfg,
                        engine.model().config(),
                        engine.model().device(),
                        shared.seed,
                    )?;
                    (a, v, 0)
                }
            };
            let mut grpo = LlmGrpo::new(engine.model().clone(), adapter, vars, grpo_config.clone())?;
            let state = |step: usize| TrainerState {
                step,
                seed: shared.seed,
                governance: mode,
                model: args.model.clone(),
                lora_rank: args.lora_rank,
                lora_alpha,
                lora_targets: targets.iter().map(|t| t.name().to_string()).collect(),
                grpo: grpo_config.clone(),
                tasks_per_step: args.tasks_per_step,
                group_size: shared.group_size,
            };
            let mut served = if start_step == 0 {
                base_name.clone()
            } else {
                let name = format!("policy-v{start_step}");
                engine.set_adapter(&name, grpo.adapter().snapshot()?)?;
                name
            };
            let total = (args.steps.saturating_sub(start_step)
                * args.tasks_per_step
                * shared.group_size) as u64;
            let bar = progress_bar(mode.as_str(), total, 5);
            let mut curve: Vec<LlmCurvePoint> = Vec::new();
            let mut all_rows: Vec<SqlEvalRow> = Vec::new();
            let mut rollouts = 0u64;
            let mut rollout_seconds_total = 0.0;
            let mut destructive = 0u64;
            for step in start_step..args.steps {
                let step_started = Instant::now();
                let tasks: Vec<&Question> = (0..args.tasks_per_step)
                    .map(|k| train[(step * args.tasks_per_step + k) % train.len()])
                    .collect();
                let batch: Vec<Question> = tasks
                    .iter()
                    .flat_map(|q| std::iter::repeat_n((*q).clone(), shared.group_size))
                    .collect();
                let plan = BatchPlan {
                    resources_id: format!("agl-train-llm-{}-v{step}", mode.as_str()),
                    model: served.clone(),
                    temperature: args.temperature,
                    max_tokens: args.max_tokens,
                    seed: None,
                    mode: RolloutMode::Train,
                    workers: shared.workers,
                };
                let (finished, rollout_seconds) = stage.run(&plan, &batch, &bar, |_| {}).await?;
                rollout_seconds_total += rollout_seconds;
                let point = learn(
                    mode,
                    &mut grpo,
                    &triplet_adapter,
                    &finished,
                    shared.group_size,
                    step,
                    &served,
                )?;
                rollouts += finished.len() as u64;
                let rows: Vec<SqlEvalRow> = finished.iter().map(|f| f.row.clone()).collect();
                let s = SqlEvalSummary::from_rows(&rows, rollout_seconds);
                all_rows.extend(rows);
                // Hand the engine the new version, retire the old one.
                let next = format!("policy-v{}", step + 1);
                engine.set_adapter(&next, grpo.adapter().snapshot()?)?;
                if served != base_name {
                    engine.unload_adapter(&served);
                }
                served = next;
                let done = step + 1;
                if shared
                    .checkpoint_every
                    .is_some_and(|k| done % k == 0 && done < args.steps)
                {
                    save_checkpoint(&dir.join(format!("step-{done}")), grpo.adapter(), &state(done))?;
                }
                let llm_call_seconds: f64 = finished
                    .iter()
                    .flat_map(|f| f.spans.iter())
                    .filter_map(|sp| match sp.attributes.get(semconv::agl::LATENCY_S) {
                        Some(agl_core::AttributeValue::Float(x)) => Some(*x),
                        _ => None,
                    })
                    .sum();
                // Statements that changed data or schema and ran (rolled back, but counted).
                destructive += finished
                    .iter()
                    .flat_map(|f| f.spans.iter())
                    .filter(|sp| {
                        sp.name == agl_core::semconv::AGL_OPERATION
                            && sp.attributes.get(semconv::agl::DESTRUCTIVE)
                                == Some(&agl_core::AttributeValue::Bool(true))
                    })
                    .count() as u64;
                let sql_seconds: f64 = finished
                    .iter()
                    .flat_map(|f| f.spans.iter())
                    .filter(|sp| {
                        sp.name == agl_core::semconv::AGL_OPERATION
                            && sp.attributes.get(agl_core::semconv::OPERATION_NAME)
                                == Some(&QUERY_OPERATION.into())
                    })
                    .filter_map(|sp| Some(sp.end_time? - sp.start_time?))
                    .sum();
                let point = LlmCurvePoint {
                    step: done,
                    rollouts,
                    reward: s.mean_reward,
                    violation_rate: s.violation_rate,
                    accuracy: s.accuracy,
                    executed_rate: s.executed_rate,
                    schema_linking: s.mean_schema_linking,
                    completion_tokens: s.completion_tokens,
                    tokens_per_second: s.completion_tokens_per_second,
                    rollout_seconds,
                    llm_call_seconds,
                    sql_seconds,
                    step_seconds: step_started.elapsed().as_secs_f64(),
                    ..point
                };
                bar.set_message(format!(
                    "step {done}/{}: reward {:>6.2}  violations {:>5.1}%  accuracy {:.2}  {:>5.1} tok/s  {:>4.0} s/step (update {:.0} s)",
                    args.steps,
                    point.reward,
                    100.0 * point.violation_rate,
                    point.accuracy,
                    point.tokens_per_second,
                    point.step_seconds,
                    point.update_seconds,
                ));
                let line = format!(
                    "[{}] step {done}: reward {:.2}, violations {:.2}, accuracy {:.2}, ran {:.2}, linking {:.2}, {} informative groups, {} of {} samples trained ({} stale, {} refused calls), {:.1} tok/s, rollouts {:.0} s, update {:.0} s",
                    mode.as_str(),
                    point.reward,
                    point.violation_rate,
                    point.accuracy,
                    point.executed_rate,
                    point.schema_linking,
                    point.informative_groups,
                    point.update.trained_samples,
                    point.update.samples,
                    point.stale_calls,
                    point.refused_calls,
                    point.tokens_per_second,
                    point.rollout_seconds,
                    point.update_seconds
                );
                bar.suspend(|| eprintln!("{line}"));
                curve.push(point);
            }
            bar.finish_and_clear();
            let final_dir = dir.join("final");
            save_checkpoint(&final_dir, grpo.adapter(), &state(args.steps.max(start_step)))?;
            stage.shutdown().await?;
            eprintln!("[{}] evaluating the trained adapter on dev", mode.as_str());
            let after = evaluate(served.clone(), format!("agl-train-llm-eval-after-{mode}")).await?;
            if served != base_name {
                engine.unload_adapter(&served);
            }
            let train_summary = SqlEvalSummary::from_rows(&all_rows, rollout_seconds_total);
            let train_stats = TrainStats {
                rollouts,
                violation_rate: train_summary.violation_rate,
                mean_reward: train_summary.mean_reward,
                accuracy: train_summary.accuracy,
                destructive_executed: destructive,
                screened: curve.iter().map(|p| p.screened as u64).sum(),
                rollouts_per_second: rollouts as f64 / run_started.elapsed().as_secs_f64().max(1e-9),
            };
            runs.insert(
                mode,
                LlmRun {
                    train: train_stats,
                    dev: after.eval_stats(),
                    dev_llm: after,
                    curve,
                    adapter: final_dir.display().to_string(),
                    peak_rss_bytes: crate::out::rss::peak_rss_bytes(),
                    kernel: train_kernel.stats(),
                    seconds: run_started.elapsed().as_secs_f64(),
                },
            );
        }
        eval_stage.shutdown().await?;
        Ok::<_, anyhow::Error>((before, runs))
    });
    engine.shutdown();
    let (before, runs) = result?;
    let seconds = started.elapsed().as_secs_f64();
    print_table(&before, &runs, seconds);
    if let Some(path) = &shared.plot {
        let reports: Vec<(&str, RunReport)> = runs
            .iter()
            .map(|(mode, r)| {
                (
                    mode.title(),
                    RunReport {
                        train: r.train.clone(),
                        dev: r.dev.clone(),
                        curve: r
                            .curve
                            .iter()
                            .map(|p| CurvePoint {
                                step: p.step,
                                rollouts: p.rollouts,
                                reward: p.reward,
                                violation_rate: p.violation_rate,
                                accuracy: p.accuracy,
                            })
                            .collect(),
                        kernel: Some(r.kernel),
                    },
                )
            })
            .collect();
        let refs: Vec<(&str, &RunReport)> = reports.iter().map(|(n, r)| (*n, r)).collect();
        let svg = crate::out::plot::learning_curves(&refs)?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &shared.report {
        let report = Report {
            agent: "llm",
            seed: shared.seed,
            config: ReportConfig {
                model: &args.model,
                steps: args.steps,
                tasks_per_step: args.tasks_per_step,
                group_size: shared.group_size,
                lora_rank: args.lora_rank,
                lora_alpha,
                lora_targets: targets.iter().map(|t| t.name().to_string()).collect(),
                grpo: &grpo_config,
                temperature: args.temperature,
                task_reward: args.task_reward,
                max_turns: args.max_turns,
                max_tokens: args.max_tokens,
                train_roles: roles.clone(),
                curriculum: args.curriculum,
                policy: &shared.policy,
                workers: shared.workers,
                resume: shared.resume.as_ref().map(|p| p.display().to_string()),
                data_dir: shared.data.display().to_string(),
            },
            data: DataReport {
                train_questions: train.len(),
                dev_questions: dev.len(),
                dev_selection,
            },
            untrained: Untrained {
                dev: before.eval_stats(),
                dev_llm: before.clone(),
            },
            runs,
            seconds,
        };
        let json = serde_json::to_vec_pretty(&report)?;
        crate::out::files::write_file(path, &json, None)?;
        eprintln!("report written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Triplets → samples → advantages → one update, for one step's rollouts (`finished`, in
/// enqueue order: G consecutive rollouts per task).
fn learn(
    mode: TrainingMode,
    grpo: &mut LlmGrpo,
    adapter: &TracerTraceToTriplet,
    finished: &[Finished],
    group_size: usize,
    step: usize,
    served: &str,
) -> anyhow::Result<LlmCurvePoint> {
    let mut samples = Vec::new();
    let mut rewards: HashMap<String, f64> = HashMap::new();
    let mut group_rewards: HashMap<usize, Vec<f64>> = HashMap::new();
    let (mut refused, mut stale, mut screened) = (0usize, 0usize, 0usize);
    for f in finished {
        let task = f.index / group_size;
        let reward = f.row.reward.unwrap_or(0.0);
        // `screen` drops a flagged rollout from its group before advantages are computed.
        if !mode.in_gradient(f.row.sql_violations.len() + f.row.llm_violations.len()) {
            screened += 1;
            continue;
        }
        rewards.insert(f.rollout_id.clone(), reward);
        group_rewards.entry(task).or_default().push(reward);
        if f.spans.is_empty() {
            continue;
        }
        let report = adapter.adapt_for_training(&f.spans)?;
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
    assign_advantages(&mut samples, &rewards);
    let informative_groups = group_rewards
        .values()
        .filter(|rs| rs.iter().any(|r| (r - rs[0]).abs() > 1e-9))
        .count();
    let update = grpo.step(&samples)?;
    Ok(LlmCurvePoint {
        informative_groups,
        refused_calls: refused,
        stale_calls: stale,
        screened,
        update_seconds: update.seconds,
        update,
        ..LlmCurvePoint::default()
    })
}

fn print_table(before: &SqlEvalSummary, runs: &BTreeMap<TrainingMode, LlmRun>, seconds: f64) {
    let n = before.questions as f64;
    let ci = |p: f64| 1.96 * (p * (1.0 - p) / n.max(1.0)).sqrt();
    println!();
    println!(
        "{:<34} {:>12}{}",
        "",
        "untrained",
        runs.keys()
            .map(|k| format!(" {:>14}", format!("trained ({k})")))
            .collect::<String>()
    );
    let row = |name: &str, b: String, f: &dyn Fn(&LlmRun) -> String| {
        println!(
            "{name:<34} {b:>12}{}",
            runs.values()
                .map(|r| format!(" {:>14}", f(r)))
                .collect::<String>()
        );
    };
    row(
        "dev execution accuracy",
        format!("{:.3}", before.accuracy),
        &|r| format!("{:.3}", r.dev.accuracy),
    );
    row(
        "  95% interval (normal approx.)",
        format!("±{:.3}", ci(before.accuracy)),
        &|r| format!("±{:.3}", ci(r.dev.accuracy)),
    );
    row(
        "dev violation rate",
        format!("{:.3}", before.violation_rate),
        &|r| format!("{:.3}", r.dev.violation_rate),
    );
    row("dev questions", before.questions.to_string(), &|r| {
        r.dev.questions.to_string()
    });
    row("train rollouts", "-".into(), &|r| {
        r.train.rollouts.to_string()
    });
    row("train mean reward", "-".into(), &|r| {
        format!("{:.2}", r.train.mean_reward)
    });
    row("train violation rate", "-".into(), &|r| {
        format!("{:.3}", r.train.violation_rate)
    });
    row("train accuracy", "-".into(), &|r| {
        format!("{:.3}", r.train.accuracy)
    });
    row("destructive executed", "-".into(), &|r| {
        r.train.destructive_executed.to_string()
    });
    row("screened from gradient", "-".into(), &|r| {
        r.train.screened.to_string()
    });
    row("kernel µs per check, mean", "-".into(), &|r| {
        format!("{:.2}", r.kernel.mean_check_us)
    });
    row("kernel cache hit rate", "-".into(), &|r| {
        format!("{:.3}", r.kernel.hit_rate)
    });
    let mean = |r: &LlmRun, f: fn(&LlmCurvePoint) -> f64| {
        let n = r.curve.len().max(1) as f64;
        format!("{:.1}", r.curve.iter().map(f).sum::<f64>() / n)
    };
    row("mean seconds per step", "-".into(), &|r| {
        mean(r, |p| p.step_seconds)
    });
    row("  rollouts (wall)", "-".into(), &|r| {
        mean(r, |p| p.rollout_seconds)
    });
    row("    model calls (summed)", "-".into(), &|r| {
        mean(r, |p| p.llm_call_seconds)
    });
    row("    SQL check + execution (summed)", "-".into(), &|r| {
        let n = r.curve.len().max(1) as f64;
        format!(
            "{:.3}",
            r.curve.iter().map(|p| p.sql_seconds).sum::<f64>() / n
        )
    });
    row("  update", "-".into(), &|r| mean(r, |p| p.update_seconds));
    row("    forward", "-".into(), &|r| {
        mean(r, |p| p.update.forward_seconds)
    });
    row("    backward", "-".into(), &|r| {
        mean(r, |p| p.update.backward_seconds)
    });
    row("rollout tokens/s", "-".into(), &|r| {
        let toks: u64 = r.curve.iter().map(|p| p.completion_tokens).sum();
        let secs: f64 = r.curve.iter().map(|p| p.rollout_seconds).sum();
        format!("{:.1}", toks as f64 / secs.max(1e-9))
    });
    row("peak RSS (GiB)", "-".into(), &|r| {
        r.peak_rss_bytes.map_or("-".into(), |b| {
            format!("{:.2}", b as f64 / (1u64 << 30) as f64)
        })
    });
    for (name, r) in runs {
        println!("adapter ({name}): {}", r.adapter);
    }
    println!("wall time: {seconds:.1} s");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn easy_means_one_select_over_one_table() {
        assert!(is_easy("SELECT count(*) FROM singer"));
        assert!(is_easy(
            "SELECT name FROM head WHERE age > 56 ORDER BY name"
        ));
        assert!(!is_easy(
            "SELECT T1.name FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id"
        ));
        assert!(!is_easy(
            "SELECT name FROM a WHERE id IN (SELECT id FROM b)"
        ));
        assert!(!is_easy("SELECT name FROM a UNION SELECT name FROM b"));
        assert!(!is_easy(
            "SELECT country, count(*) FROM singer GROUP BY country"
        ));
        assert!(!is_easy("SELECT a.x FROM a, b WHERE a.id = b.id"));
        assert!(is_easy(
            "SELECT name, age FROM singer ORDER BY age, name LIMIT 3"
        ));
    }

    #[test]
    fn spread_is_even_and_fixed() {
        assert_eq!(spread(10, 4), vec![0, 2, 5, 7]);
        assert_eq!(spread(3, 10), vec![0, 1, 2]);
        assert_eq!(spread(972, 100).len(), 100);
    }

    #[test]
    fn roles_and_targets_are_checked() {
        assert_eq!(
            parse_roles("write, rewrite,write").unwrap(),
            vec!["write", "rewrite"]
        );
        assert!(
            parse_roles("writer")
                .unwrap_err()
                .to_string()
                .contains("unknown role")
        );
        assert!(
            parse_targets("q,x")
                .unwrap_err()
                .to_string()
                .contains("`x`")
        );
        assert_eq!(parse_targets("q,v").unwrap(), vec![Target::Q, Target::V]);
    }
}
