//! `agl train --agent llm`: GRPO with LoRA on the Spider SQL agent, through the store, the
//! gateway and the kernel (the loop of the repository's DESIGN, "The LLM path").
//!
//! One process holds every part: the built-in engine (dense f32 weights: the sampler's
//! log-probabilities must be the ones training recomputes), an in-memory store whose HTTP
//! server mounts the governed gateway over the engine, runner workers running
//! [`agl_spider::LlmSqlAgent`], and the learner ([`agl_train::LlmGrpo`]). The steps are
//! [`agl_train::LlmLoop`]'s (see [`agl_train::llm_loop`]): `--tasks-per-step` train questions,
//! each enqueued `--group-size` times as `train` rollouts naming the current adapter version
//! (`policy-vN`; version 0 is the base model) in a `proxy_llm`; the gateway records every call
//! with its token ids and log-probabilities, the kernel checks the agent's SQL and the model's
//! output, and `PolicyReward` shapes the reward (enforce) or the task reward stands alone
//! (audit); triplets of the `--train-roles` calls, group-relative advantages, one LoRA GRPO
//! update; the new adapter goes to the engine as `policy-v{N+1}` ([`EngineServing`]).
//!
//! Before the first step and after the last, the greedy agent (temperature 0, kernel
//! enforcing) is evaluated on a fixed dev subset: `--eval-limit N` questions spread evenly over
//! the dev split ([`agl_spider::dev_questions`]), the same for every run and seed. Train
//! questions follow `--curriculum` and `--limit`, shuffled once with `--seed`
//! ([`agl_spider::train_questions`]).
//!
//! **Checkpoints.** `--checkpoint-dir DIR` (default `runs/llm`) receives `step-N/` every
//! `--checkpoint-every` steps and `final/` (with `--compare`, under `DIR/audit/` and
//! `DIR/enforce/`): the adapter in PEFT's layout (`adapter_config.json`,
//! `adapter_model.safetensors`: `agl llm serve --adapter`, `agl eval --adapter`, PEFT and vLLM
//! load it) and `trainer_state.json` ([`agl_train::TrainerState`]: step, seed, governance,
//! model, LoRA and GRPO settings). Each is written into a temporary directory and renamed.
//! `--resume DIR` continues from one: the adapter's factors become the trainable variables
//! again and the step count goes on; AdamW's moment estimates are not saved (they restart at
//! zero).
//!
//! Responsible for the `--agent llm` flags, wiring the engine, stages, loop and task, the
//! per-step lines and the table (the flags it shares with the scorer are read by [`super`]);
//! not for the loop (`agl_train::llm_loop`), the task's curriculum, judgement and report types
//! (`agl_spider::llm_train`), the agent (`agl_spider::sql_agent`), the gateway (`agl-server`)
//! or the stage it shares with `agl eval` ([`crate::llm_stage`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::RolloutMode;
use agl_gov::{BuildEnv, GovernanceMode, Kernel, PolicyFile};
use agl_llm::{LoraAdapter, LoraConfig, Target};
use agl_spider::sql_agent::ROLES;
use agl_spider::{
    CheckMode, Curriculum, CurvePoint, DevPaired, ExecutorConfig, LlmCurvePoint, LlmDataReport,
    LlmReport, LlmReportConfig, LlmRun, LlmSqlAgent, LlmUntrained, Question, RunReport,
    SpiderDataset, SqlAgentConfig, SqlEvalRow, SqlEvalSummary, SqlStep, SqlTaskReward, TrainStats,
    sql_agent_reward,
};
use agl_train::{
    BatchPlan, LlmGrpo, LlmGrpoConfig, LlmLoop, LlmLoopConfig, LoopObserver, Paired, PolicyServing,
    RewardConfig, StepOutcome, TRAINER_STATE, TracerTraceToTriplet, TrainerState, TrainingMode,
};
use anyhow::{Context, bail};
use clap::Args;
use indicatif::ProgressBar;

use crate::args::engine::{DeviceArg, ModelArg};
use crate::llm_stage::{EngineServing, LlmStage};
use crate::out::progress::progress_bar;

/// The flags of `agl train` that only `--agent llm` reads.
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("model", |a| a.help(
        "The model (--agent llm): a known name (`agl model pull NAME`), a .gguf file or a Hugging \
         Face model directory. Trained with dense f32 weights",
    )),
    mut_arg("device", |a| a.help(
        "Where the engine and the training run (--agent llm): cpu, cuda, cuda:N (a build with \
         `--features cuda`), or auto",
    )),
)]
pub struct LlmTrainArgs {
    #[command(flatten)]
    pub model: ModelArg,
    #[command(flatten)]
    pub device: DeviceArg,
    /// GRPO updates (--agent llm).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Train questions per update (--agent llm); each is sampled --group-size times.
    #[arg(long, default_value_t = 2)]
    pub tasks_per_step: usize,
    /// DAPO's dynamic sampling (GRPO): sample up to N batches of --tasks-per-step questions in
    /// a step, stopping once --tasks-per-step of its groups have rewards that differ (a group
    /// whose answers all earn the same carries no gradient); 1 samples one batch.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub dynamic_sampling: usize,
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
    /// What decides a rewrite (--agent llm, with --max-turns above 1): `model` (the model
    /// reviews each query and its result, Agent Lightning's checker) or `execution` (no review
    /// call: a query that ran is final, one that failed is rewritten with the database's error).
    #[arg(long, value_name = "model|execution", default_value = "model")]
    pub check: CheckMode,
    /// Most new tokens per model call (--agent llm).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Dev questions evaluated before and after training (--agent llm), spread evenly over
    /// the dev split.
    #[arg(long, default_value_t = 100)]
    pub eval_limit: usize,
    /// Agents whose LLM calls are trained, comma-separated (Agent Lightning's agent_match):
    /// for --agent llm its roles among write, check, rewrite [default: write,rewrite]; for
    /// --algorithm, the agent names of the spans enclosing the calls [default: every call].
    #[arg(long, value_name = "NAMES")]
    pub train_roles: Option<String>,
    /// Most answers per forward/backward pass (--agent llm); answers to one prompt share it.
    #[arg(long, default_value_t = 8)]
    pub micro_batch: usize,
    /// Most attention cells per forward/backward pass (--agent llm): prompt² + answers ×
    /// answer length × (prompt + answer length); bounds memory (an answer over budget alone
    /// goes alone).
    #[arg(long, default_value_t = 2_500_000)]
    pub micro_batch_cells: usize,
    /// Train questions used (--agent llm): easy (single-table SELECT gold queries) or all.
    #[arg(long, default_value = "easy", value_parser = curriculum_parser())]
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
    /// Start from this adapter (PEFT layout) instead of a fresh one.
    pub init_adapter: Option<PathBuf>,
    /// Statement time limit, seconds.
    pub sql_timeout: f64,
    /// First N train questions (after the curriculum filter).
    pub limit: Option<usize>,
}

/// `--curriculum`'s values, with the help each had as a clap `ValueEnum`.
fn curriculum_parser() -> impl clap::builder::TypedValueParser<Value = Curriculum> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("easy").help(
            "Gold query is one SELECT over one table, without JOIN, subquery, set operation or \
             GROUP BY",
        ),
        PossibleValue::new("all").help("Every train question"),
    ])
    .map(|s| {
        if s == "all" {
            Curriculum::All
        } else {
            Curriculum::Easy
        }
    })
}

pub(super) fn parse_targets(s: &str) -> anyhow::Result<Vec<Target>> {
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

/// `--train-roles`' default for `--agent llm`.
const DEFAULT_ROLES: &str = "write,rewrite";

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
    if !path.is_file() {
        bail!(
            "--resume {}: cannot read {TRAINER_STATE} (expected a step-N or final directory of \
             `agl train --agent llm --checkpoint-dir`)",
            dir.display()
        );
    }
    TrainerState::read(dir).map_err(|e| anyhow::anyhow!("--resume {}: {e}", dir.display()))
}

/// The LoRA and GRPO settings of a run, checked ([`checked`]).
pub(super) struct LearnerSettings {
    /// Wrapped modules.
    pub targets: Vec<Target>,
    /// LoRA alpha (`--lora-alpha`, else 2 × rank).
    pub lora_alpha: f64,
    /// The GRPO settings.
    pub grpo: LlmGrpoConfig,
}

/// Checks the flags every LLM training path shares (one line naming the flag) and resolves
/// the LoRA and GRPO settings; fails before anything is loaded.
///
/// `min_group_size` is the learner's ([`agl_train::Learner::min_group_size`]): 2 for GRPO,
/// 1 for SFT.
pub(super) fn checked(
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    min_group_size: usize,
) -> anyhow::Result<LearnerSettings> {
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    anyhow::ensure!(
        args.tasks_per_step > 0,
        "--tasks-per-step must be at least 1"
    );
    anyhow::ensure!(
        shared.group_size >= min_group_size,
        "--group-size must be at least {min_group_size} (GRPO's advantages are group-relative)"
    );
    if let Some(dir) = &shared.init_adapter {
        anyhow::ensure!(
            shared.resume.is_none(),
            "--init-adapter and --resume both name the adapter to start from; pass only one"
        );
        anyhow::ensure!(
            dir.join("adapter_config.json").is_file(),
            "--init-adapter {}: not a PEFT adapter directory (no adapter_config.json)",
            dir.display()
        );
    }
    anyhow::ensure!(args.max_turns > 0, "--max-turns must be at least 1");
    anyhow::ensure!(args.max_tokens > 0, "--max-tokens must be at least 1");
    anyhow::ensure!(args.eval_limit > 0, "--eval-limit must be at least 1");
    anyhow::ensure!(
        args.dynamic_sampling > 0,
        "--dynamic-sampling must be at least 1 (1 samples one batch per step)"
    );
    anyhow::ensure!(shared.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(args.lora_rank > 0, "--lora-rank must be at least 1");
    anyhow::ensure!(
        args.temperature.is_finite() && args.temperature > 0.0 && args.temperature <= 2.0,
        "--temperature must be in (0, 2] for training (GRPO needs different samples per group)"
    );
    anyhow::ensure!(
        args.request_timeout.is_finite() && args.request_timeout > 0.0,
        "--request-timeout must be a positive number of seconds"
    );
    if shared.checkpoint_every == Some(0) {
        bail!("--checkpoint-every must be at least 1");
    }
    let targets = parse_targets(&args.lora_targets)?;
    let lora_alpha = args.lora_alpha.unwrap_or(2.0 * args.lora_rank as f64);
    anyhow::ensure!(
        lora_alpha.is_finite() && lora_alpha > 0.0,
        "--lora-alpha must be positive"
    );
    let grpo = LlmGrpoConfig {
        learning_rate: shared.lr,
        kl_beta: shared.kl_beta,
        micro_batch: args.micro_batch,
        micro_batch_cells: args.micro_batch_cells,
        ..LlmGrpoConfig::default()
    };
    grpo.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    // Fail before loading anything when the model is unusable.
    agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())
        .with_context(|| format!("--model {}", args.model))?;
    Ok(LearnerSettings {
        targets,
        lora_alpha,
        grpo,
    })
}

/// Reads `--resume DIR` and checks it against this run (the model, and one governance mode
/// without `--compare`).
pub(super) fn resume_state(
    shared: &SharedArgs,
    args: &LlmTrainArgs,
) -> anyhow::Result<Option<(PathBuf, TrainerState)>> {
    let Some(dir) = &shared.resume else {
        return Ok(None);
    };
    let state = read_state(dir)?;
    if *state.model != *args.model {
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
    Ok(Some((dir.clone(), state)))
}

/// The learner of one run: a fresh LoRA adapter seeded with `--seed`, or the `--resume`
/// checkpoint's, and the trainer state its checkpoints carry.
pub(super) fn learner(
    engine: &agl_llm::Engine,
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    settings: &LearnerSettings,
    mode: TrainingMode,
    resume: Option<&(PathBuf, TrainerState)>,
) -> anyhow::Result<(LlmGrpo, TrainerState)> {
    let (adapter, vars, start_step) = initial_adapter(engine, shared, args, settings, resume)?;
    let mut state = trainer_state(shared, args, settings, mode, start_step, adapter.config());
    state.tasks_taken = resume.and_then(|(_, s)| s.tasks_taken);
    let grpo = LlmGrpo::new(engine.model().clone(), adapter, vars, settings.grpo.clone())?;
    Ok((grpo, state))
}

/// The adapter a run starts from, as trainable variables, and the steps already done: the
/// `--resume` checkpoint's, else `--init-adapter`'s (step 0), else a fresh one seeded with
/// `--seed` (its B factors zero: the base model's behaviour).
pub(super) fn initial_adapter(
    engine: &agl_llm::Engine,
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    settings: &LearnerSettings,
    resume: Option<&(PathBuf, TrainerState)>,
) -> anyhow::Result<(LoraAdapter, Vec<candle_core::Var>, usize)> {
    let load = |dir: &Path| {
        LoraAdapter::load(dir, engine.model().config(), engine.model().device())
            .and_then(LoraAdapter::into_trainable)
    };
    if let Some((rdir, state)) = resume {
        let (a, v) = load(rdir)?;
        return Ok((a, v, state.step));
    }
    if let Some(dir) = &shared.init_adapter {
        let (a, v) = load(dir).with_context(|| format!("--init-adapter {}", dir.display()))?;
        return Ok((a, v, 0));
    }
    let cfg = LoraConfig {
        r: args.lora_rank,
        alpha: settings.lora_alpha,
        target_modules: settings.targets.clone(),
        use_rslora: false,
        base_model: Some(args.model.to_string()),
    };
    let (a, v) = LoraAdapter::new_trainable(
        cfg,
        engine.model().config(),
        engine.model().device(),
        shared.seed,
    )?;
    Ok((a, v, 0))
}

/// The `trainer_state.json` of a run of `mode` from `start_step` (GRPO's; an SFT run sets
/// `algorithm` and `sft`); the LoRA shape is the adapter's (`--init-adapter`'s may differ from
/// the flags).
pub(super) fn trainer_state(
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    settings: &LearnerSettings,
    mode: TrainingMode,
    start_step: usize,
    lora: &LoraConfig,
) -> TrainerState {
    TrainerState {
        step: start_step,
        seed: shared.seed,
        governance: mode,
        model: args.model.to_string(),
        lora_rank: lora.r,
        lora_alpha: lora.alpha,
        lora_targets: lora
            .target_modules
            .iter()
            .map(|t| t.name().to_string())
            .collect(),
        grpo: settings.grpo.clone(),
        tasks_per_step: args.tasks_per_step,
        group_size: shared.group_size,
        algorithm: "grpo".into(),
        sft: None,
        tasks_taken: None,
    }
}

/// The loop's settings of a run of `mode` from `start_step`: the flags' values, resources ids
/// `agl-train-llm-<mode>-vN` of the default LLM resource, no checkpoint directory and the store's
/// rollout settings (callers override what differs).
pub(super) fn loop_config(
    shared: &SharedArgs,
    args: &LlmTrainArgs,
    mode: TrainingMode,
    start_step: usize,
) -> LlmLoopConfig {
    LlmLoopConfig {
        steps: args.steps,
        start_step,
        tasks_per_step: args.tasks_per_step,
        group_size: shared.group_size,
        temperature: args.temperature,
        max_tokens: args.max_tokens,
        workers: shared.workers,
        mode,
        resources_prefix: format!("agl-train-llm-{}", mode.as_str()),
        llm_resource: agl_train::DEFAULT_LLM_RESOURCE.into(),
        checkpoint_dir: None,
        checkpoint_every: shared.checkpoint_every,
        rollout_config: None,
        max_sampling_batches: args.dynamic_sampling,
    }
}

/// The engine of an LLM training run: `--model` on `--device` with dense f32 weights (the
/// sampler's log-probabilities must be the ones training recomputes), batching up to `rows`
/// rows (clamped to 8..=64).
pub(super) fn engine_spec(args: &LlmTrainArgs, rows: usize) -> agl_llm::EngineSpec {
    agl_llm::EngineSpec {
        model: args.model.to_string(),
        weights: agl_llm::WeightFormat::Dense,
        device: args.device.to_string(),
        adapters: Vec::new(),
        served_model_name: None,
        max_batch_rows: rows.clamp(8, 64),
        prefix_cache_tokens: agl_llm::DEFAULT_PREFIX_CACHE_TOKENS,
    }
}

/// Rollouts the steps from `start_step` run (for the progress bar).
pub(super) fn rollouts_to_run(shared: &SharedArgs, args: &LlmTrainArgs, start_step: usize) -> u64 {
    (args.steps.saturating_sub(start_step) * args.tasks_per_step * shared.group_size) as u64
}

/// Runs `agl train --agent llm`.
pub fn run(shared: SharedArgs, args: LlmTrainArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let settings = checked(&shared, &args, 2)?;
    let roles = parse_roles(args.train_roles.as_deref().unwrap_or(DEFAULT_ROLES))?;
    let (targets, lora_alpha, grpo_config) = (
        settings.targets.clone(),
        settings.lora_alpha,
        settings.grpo.clone(),
    );
    let resume = resume_state(&shared, &args)?;
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
    let train: Vec<Question> =
        agl_spider::train_questions(&dataset, args.curriculum, shared.limit, shared.seed)
            .into_iter()
            .cloned()
            .collect();
    if train.is_empty() {
        bail!("no train questions selected (--curriculum, --limit)");
    }
    let (dev, dev_selection) = agl_spider::dev_questions(&dataset, args.eval_limit);
    let stats = crate::kernel::table_stats(&dataset, train.iter().chain(dev.iter()))?;
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

    let spec = engine_spec(&args, shared.workers * args.max_turns.max(1));
    let started_engine = crate::args::engine::start_engine(&spec, "agl train")?;
    let engine = started_engine.engine.clone();
    let base_name = started_engine.name.clone();
    let upstream = || agl_server::Upstream::InProcess(started_engine.router());
    let agent = Arc::new(LlmSqlAgent::new(
        dataset.root.join(agl_spider::DATABASE_DIR),
        SqlAgentConfig {
            max_turns: args.max_turns,
            check: args.check,
            max_tokens: args.max_tokens,
            temperature: 0.0,
            request_timeout: Duration::from_secs_f64(args.request_timeout),
            llm_resource: Some(agl_train::DEFAULT_LLM_RESOURCE.into()),
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
        llm_resource: agl_train::DEFAULT_LLM_RESOURCE.into(),
        endpoint: String::new(),
        model: model.to_string(),
        temperature: 0.0,
        max_tokens: args.max_tokens,
        seed: Some(shared.seed),
        mode: RolloutMode::Test,
        workers: shared.workers,
        config: None,
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
                let rows: Vec<SqlEvalRow> = rows.into_iter().map(|(_, row)| row).collect();
                Ok::<_, anyhow::Error>((SqlEvalSummary::from_rows(&rows, seconds), rows))
            }
        };
        let before_model = match &resume {
            Some((dir, state)) => {
                let name = agl_train::policy_version(state.step);
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
        let (before, before_rows) =
            evaluate(before_model, "agl-train-llm-eval-before".into()).await?;
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
            let (mut grpo, state) =
                learner(&engine, &shared, &args, &settings, mode, resume.as_ref())?;
            let start_step = state.step;
            let serving = EngineServing {
                engine: engine.clone(),
                base: base_name.clone(),
                endpoint: stage.endpoint(),
            };
            let training = LlmLoop {
                config: LlmLoopConfig {
                    checkpoint_dir: Some(dir.clone()),
                    ..loop_config(&shared, &args, mode, start_step)
                },
                store: &stage.store,
                runners: &stage.runners,
                serving: &serving,
                triplets: &triplet_adapter,
                tasks: &train,
                judge: &agl_spider::llm_train::judge,
            };
            let mut progress = StepPrinter {
                bar: progress_bar(
                    mode.as_str(),
                    rollouts_to_run(&shared, &args, start_step),
                    5,
                ),
                mode,
                steps: args.steps,
                curve: Vec::new(),
                rows: Vec::new(),
                rollout_seconds: 0.0,
                destructive: 0,
            };
            let served = training.run(&mut grpo, &state, &mut progress).await?;
            progress.bar.finish_and_clear();
            stage.shutdown().await?;
            eprintln!("[{}] evaluating the trained adapter on dev", mode.as_str());
            let (after, after_rows) =
                evaluate(served.clone(), format!("agl-train-llm-eval-after-{mode}")).await?;
            let dev_paired = DevPaired::of(&before_rows, &after_rows, shared.seed);
            if served != base_name {
                serving.retire(&served);
            }
            let StepPrinter {
                curve,
                rows,
                rollout_seconds,
                destructive,
                ..
            } = progress;
            let rollouts = rows.len() as u64;
            let train_summary = SqlEvalSummary::from_rows(&rows, rollout_seconds);
            let train_stats = TrainStats {
                rollouts,
                violation_rate: train_summary.violation_rate,
                mean_reward: train_summary.mean_reward,
                accuracy: train_summary.accuracy,
                destructive_executed: destructive,
                screened: curve.iter().map(|p| p.screened as u64).sum(),
                rollouts_per_second: rollouts as f64
                    / run_started.elapsed().as_secs_f64().max(1e-9),
            };
            runs.insert(
                mode,
                LlmRun {
                    train: train_stats,
                    dev: after.eval_stats(),
                    dev_llm: after,
                    dev_paired,
                    curve,
                    adapter: dir.join("final").display().to_string(),
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
        crate::out::files::write_file(path, svg.as_bytes(), None)?;
        eprintln!("plot written to {}", path.display());
    }
    if let Some(path) = &shared.report {
        let report = LlmReport {
            agent: "llm",
            seed: shared.seed,
            config: LlmReportConfig {
                model: args.model.to_string(),
                steps: args.steps,
                tasks_per_step: args.tasks_per_step,
                group_size: shared.group_size,
                lora_rank: args.lora_rank,
                lora_alpha,
                lora_targets: targets.iter().map(|t| t.name().to_string()).collect(),
                grpo: grpo_config.clone(),
                temperature: args.temperature,
                task_reward: args.task_reward,
                max_turns: args.max_turns,
                check: args.check,
                max_tokens: args.max_tokens,
                train_roles: roles.clone(),
                curriculum: args.curriculum,
                policy: shared.policy.clone(),
                workers: shared.workers,
                resume: shared.resume.as_ref().map(|p| p.display().to_string()),
                data_dir: shared.data.display().to_string(),
            },
            data: LlmDataReport {
                train_questions: train.len(),
                dev_questions: dev.len(),
                dev_selection,
            },
            untrained: LlmUntrained {
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

/// The loop's observer: moves the bar, prints one line per step, keeps the curve and rows.
struct StepPrinter {
    bar: ProgressBar,
    mode: TrainingMode,
    steps: usize,
    curve: Vec<LlmCurvePoint>,
    rows: Vec<SqlEvalRow>,
    rollout_seconds: f64,
    destructive: u64,
}

impl LoopObserver for StepPrinter {
    fn rollout_done(&mut self, _: &agl_core::Rollout, _: Option<&agl_core::Attempt>) {
        // Dynamic sampling may run more rollouts than planned.
        if self.bar.length().is_some_and(|n| self.bar.position() >= n) {
            self.bar.inc_length(1);
        }
        self.bar.inc(1);
    }

    fn step_done(&mut self, outcome: &StepOutcome<'_>) -> Result<(), agl_train::TrainError> {
        let rollouts = (self.rows.len() + outcome.finished.len()) as u64;
        let SqlStep {
            point,
            rows,
            destructive,
        } = SqlStep::read(outcome, rollouts);
        self.rows.extend(rows);
        self.rollout_seconds += point.rollout_seconds;
        self.destructive += destructive;
        let done = point.step;
        self.bar.set_message(format!(
            "step {done}/{}: reward {:>6.2}  violations {:>5.1}%  accuracy {:.2}  {:>5.1} tok/s  {:>4.0} s/step (update {:.0} s)",
            self.steps,
            point.reward,
            100.0 * point.violation_rate,
            point.accuracy,
            point.tokens_per_second,
            point.step_seconds,
            point.update_seconds,
        ));
        let line = format!(
            "[{}] step {done}: reward {:.2}, violations {:.2}, accuracy {:.2}, ran {:.2}, linking {:.2}, {} informative groups{}, {} of {} samples trained ({} stale, {} refused calls), {:.1} tok/s, rollouts {:.0} s, update {:.0} s",
            self.mode.as_str(),
            point.reward,
            point.violation_rate,
            point.accuracy,
            point.executed_rate,
            point.schema_linking,
            point.informative_groups,
            if point.sampling_batches > 1 {
                format!(" in {} sampled batches", point.sampling_batches)
            } else {
                String::new()
            },
            point.update.trained_samples,
            point.update.samples,
            point.stale_calls,
            point.refused_calls,
            point.tokens_per_second,
            point.rollout_seconds,
            point.update_seconds
        );
        self.bar.suspend(|| eprintln!("{line}"));
        self.curve.push(point);
        Ok(())
    }
}

fn print_table(before: &SqlEvalSummary, runs: &BTreeMap<TrainingMode, LlmRun>, seconds: f64) {
    let cols = crate::out::table::Columns {
        label: 34,
        first: 12,
        cell: 14,
        sep: " ",
    };
    println!();
    println!(
        "{}",
        cols.line(
            "",
            "untrained",
            runs.keys().map(|k| format!("trained ({k})"))
        )
    );
    let row = |name: &str, b: String, f: &dyn Fn(&LlmRun) -> String| {
        println!("{}", cols.line(name, &b, runs.values().map(f)));
    };
    row(
        "dev execution accuracy",
        format!("{:.3}", before.accuracy),
        &|r| format!("{:.3}", r.dev.accuracy),
    );
    // Against the untrained agent on the same questions: the difference and its paired 95%
    // bootstrap interval, then McNemar's exact p.
    let paired = |f: fn(&DevPaired) -> Paired| {
        move |r: &LlmRun| match r.dev_paired.as_ref().map(f) {
            Some(p) => format!("{:+.3} [{:+.2},{:+.2}]", p.difference, p.low, p.high),
            None => "-".into(),
        }
    };
    let mcnemar = |f: fn(&DevPaired) -> Paired| {
        move |r: &LlmRun| match r.dev_paired.as_ref().map(f) {
            Some(p) => format!("{:.3}", p.mcnemar_p),
            None => "-".into(),
        }
    };
    row(
        "  change, paired 95% interval",
        "-".into(),
        &paired(|d| d.accuracy),
    );
    row("  McNemar p", "-".into(), &mcnemar(|d| d.accuracy));
    row(
        "dev violation rate",
        format!("{:.3}", before.violation_rate),
        &|r| format!("{:.3}", r.dev.violation_rate),
    );
    row(
        "  change, paired 95% interval",
        "-".into(),
        &paired(|d| d.violation_rate),
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
