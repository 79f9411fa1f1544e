//! `agl train`: prepare the Spider task, run GRPO under governance (or once per training
//! mode with `--compare`), evaluate on dev, print the comparison table and write the report,
//! audit log and plot.
//!
//! Training modes (`--governance`, `agl_train::TrainingMode`): `audit` records only, `shield`
//! blocks, `screen` blocks and drops flagged samples from the gradient, `enforce` blocks and
//! penalises. `--compare audit,shield,screen,enforce` trains once per listed mode with the same
//! seed; the bare `--compare` means `audit,enforce`.
//!
//! Checkpoints of the scorer (formats and checks in `agl_spider::scorer::checkpoint`):
//! `--checkpoint-dir DIR [--checkpoint-every N]` saves `DIR/step-N/` after every N-th GRPO
//! update (the trainer's loop unit: one batch of `--batch-questions` questions) and
//! `DIR/final/` after the last one (with `--compare`, `DIR/<mode>/…` per mode), each
//! `model.safetensors` + `config.json`, written atomically. `--resume DIR` loads a `step-N` or
//! `final` directory before anything else is prepared or written, refuses it (one line naming
//! the file) when it is missing, malformed, of another architecture, or from another seed or
//! governance mode, and continues counting from update N.
//!
//! This file is the scorer's path and the command's flags; `--agent llm` runs [`llm`] (the same
//! command, its own loop). Not for the training algorithms (`agl-train`, `agl-spider`).

pub mod any;
pub mod apo;
pub mod llm;
pub mod sql_runner;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::{AttemptStatus, RolloutConfig};
use agl_gov::GovernanceMode;
use agl_spider::{CandidateConfig, ExecutorConfig, SpiderDataset, Split};
use agl_spider::{
    CheckpointPlan, EvalStats, GrpoConfig, RunOptions, RunReport, RunSpec, Session, SpiderTask,
    TaskConfig, TrainConfig, initial_policy,
};
use agl_store::LightningStore;
use agl_train::TrainingMode;
use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::out::files::write_file;
use crate::out::progress::progress_bar;

/// Arguments of `agl train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// What learns: `scorer` (the built-in candidate-choosing policy) or `llm` (the SQL-writing
    /// LLM agent: LoRA GRPO through the gateway; see the --agent llm flags).
    #[arg(long, value_enum, default_value = "scorer")]
    agent: TrainAgent,
    /// Train the agent you bring, in any language, on --train-dataset (Agent Lightning's
    /// `Trainer.fit`): its rollouts run through the store and its model calls through this
    /// process's gateway; `grpo` and `sft` train a LoRA adapter of --model (`sft` also from
    /// --demonstrations alone), `apo` its prompt template. Takes the --agent llm flags.
    #[arg(long, value_enum)]
    algorithm: Option<any::Algorithm>,
    /// Demonstrations for `--algorithm sft` instead of rollouts: OpenAI's chat fine-tuning
    /// format, one `{"messages": [...]}` per line, tokenised with the model's chat template;
    /// the assistant turns are trained (--tasks-per-step examples per update).
    #[arg(
        long,
        value_name = "FILE",
        requires = "algorithm",
        conflicts_with = "train_dataset"
    )]
    demonstrations: Option<PathBuf>,
    /// `--algorithm sft` on rollouts: the share of each step's samples kept for fine-tuning,
    /// best rewards first (Agent Lightning's Unsloth example keeps the top half).
    #[arg(long, default_value_t = agl_train::DEFAULT_TOP_FRACTION, value_name = "F")]
    sft_top_fraction: f64,
    /// `--algorithm sft` on rollouts: keep only samples whose reward is above R.
    #[arg(long, value_name = "R")]
    sft_min_reward: Option<f64>,
    /// Start from this LoRA adapter (a PEFT directory, e.g. an SFT run's `final/`) instead of a
    /// fresh one (--agent llm, --algorithm); its rank, alpha and modules replace --lora-*.
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    init_adapter: Option<PathBuf>,
    /// Train tasks (--algorithm): JSON Lines (one task per line) or a JSON array; each task is
    /// any JSON, given to the agent as its rollout's input.
    #[arg(long, value_name = "FILE", requires = "algorithm")]
    train_dataset: Option<PathBuf>,
    /// Validation tasks (--algorithm), same format: the first --eval-limit are run greedily
    /// before and after training (mean final reward with a 95% interval).
    #[arg(long, value_name = "FILE", requires = "algorithm")]
    val_dataset: Option<PathBuf>,
    /// Who runs the rollouts (--algorithm): `none` (runners of other processes: Agent
    /// Lightning's runner or `agl runner --exec` against this store), `exec:COMMAND`
    /// (--workers workers here, each running `sh -c COMMAND` per rollout: the task on stdin,
    /// the gateway in OPENAI_BASE_URL, the reward as the last stdout line `{"reward": x}`) or
    /// `sql` (the built-in Spider SQL agent here, on tasks of `agl spider tasks`).
    #[arg(long, default_value = "none", value_parser = any::parse_runner, value_name = "none|exec:COMMAND|sql")]
    runner: any::RunnerSpec,
    /// Time limit of one rollout in seconds (--algorithm); an attempt over it is `timeout`.
    #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
    rollout_timeout: f64,
    /// Attempts per rollout (--algorithm): a `failed`, `timeout` or `unresponsive` attempt is
    /// retried until this many were made.
    #[arg(long, default_value_t = 1, value_name = "N")]
    max_attempts: u32,
    /// The address agents reach this process's gateway at (--algorithm), published as the
    /// `proxy_llm` endpoint [default: the address it listens on].
    #[arg(long, value_name = "URL")]
    advertise_url: Option<String>,
    /// Interface the store and gateway (--algorithm) listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port the store and gateway (--algorithm) listen on (0: a free port; the address is
    /// printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Take the train tasks in file order (--algorithm) instead of shuffling them once with
    /// --seed.
    #[arg(long)]
    keep_order: bool,
    /// Name of the LLM resource published to the agents (--algorithm).
    #[arg(long, default_value = agl_train::DEFAULT_LLM_RESOURCE, value_name = "NAME")]
    llm_resource: String,
    /// How the engine holds its weights: dense (f32; grpo, sft and --agent llm train these),
    /// q8 (faster decoding) or hybrid (prompts prefill dense, decoding reads q8), both serving
    /// only [default: q8 for --algorithm apo, else dense].
    #[arg(long, value_enum)]
    weights: Option<crate::args::engine::Weights>,
    /// `--algorithm apo`: the initial prompt template, a file of Python `str.format` text
    /// (`{name}` fields, `{{` and `}}` for braces) [default with --runner sql: the SQL agent's
    /// write template, fields {question} and {schema}].
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_template_text")]
    prompt_template: Option<PathBuf>,
    /// `--algorithm apo`: the initial prompt template as text.
    #[arg(long, value_name = "TEXT")]
    prompt_template_text: Option<String>,
    /// `--algorithm apo`: the resource name the agents read the template from.
    #[arg(long, default_value = agl_train::apo::DEFAULT_TEMPLATE_RESOURCE, value_name = "NAME")]
    template_resource: String,
    /// `--algorithm apo`: the optimizer, any OpenAI-compatible server (its `/v1` URL)
    /// [default: the built-in engine serving --model].
    #[arg(long, value_name = "URL")]
    optimizer_base_url: Option<String>,
    /// API key of --optimizer-base-url.
    #[arg(
        long,
        env = "AGL_OPTIMIZER_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    optimizer_api_key: Option<String>,
    /// `--algorithm apo`: the model of both the critic and the editor [default with the
    /// built-in engine: its model].
    #[arg(long, value_name = "NAME")]
    optimizer_model: Option<String>,
    /// `--algorithm apo`: the critic's model, which writes the textual gradient (Agent
    /// Lightning's gradient_model) [default: --optimizer-model].
    #[arg(long, value_name = "NAME")]
    gradient_model: Option<String>,
    /// `--algorithm apo`: the editor's model, which applies it (Agent Lightning's edit_model)
    /// [default: --optimizer-model].
    #[arg(long, value_name = "NAME")]
    edit_model: Option<String>,
    /// `--algorithm apo`: candidates kept after each round.
    #[arg(long, default_value_t = 4, value_name = "N")]
    beam_width: usize,
    /// `--algorithm apo`: children written per parent per round.
    #[arg(long, default_value_t = 4, value_name = "N")]
    branch_factor: usize,
    /// `--algorithm apo`: rounds of the search.
    #[arg(long, default_value_t = 3, value_name = "N")]
    beam_rounds: usize,
    /// `--algorithm apo`: training tasks run per critique (the rollouts the critic reads).
    #[arg(long, default_value_t = 4, value_name = "N")]
    gradient_batch_size: usize,
    /// `--algorithm apo`: validation tasks every candidate is scored on per round (the leader
    /// is then scored on all of them, the first --eval-limit of --val-dataset).
    #[arg(long, default_value_t = 16, value_name = "N")]
    val_batch_size: usize,
    /// `--algorithm apo`: sampling temperature of the critic (the editor's is 1.0).
    #[arg(long, default_value_t = 1.0, value_name = "T")]
    diversity_temperature: f64,
    /// `--algorithm apo`: do not score the seed template before the first round.
    #[arg(long)]
    no_initial_validation: bool,
    /// `--algorithm apo`: a critique prompt file replacing the built-in ones (repeat for
    /// several; one is drawn per critique): optional first line `system: …`, then the user
    /// message with the fields {prompt_template} and {experiments}.
    #[arg(long, value_name = "FILE")]
    critique_prompt: Vec<PathBuf>,
    /// `--algorithm apo`: an edit prompt file replacing the built-in ones (repeatable), with
    /// the fields {prompt_template}, {critique} and {placeholders}.
    #[arg(long, value_name = "FILE")]
    edit_prompt: Vec<PathBuf>,
    #[command(flatten)]
    llm: llm::LlmTrainArgs,
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Passes over the train questions.
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// GRPO group size G: actions sampled per question.
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Candidate actions per question (gold, distractors, unsafe).
    #[arg(long, default_value_t = 8)]
    candidates: usize,
    /// Distractors per question (gold queries of other questions on the same database).
    #[arg(long, default_value_t = 5)]
    distractors: usize,
    /// Questions per GRPO update.
    #[arg(long, default_value_t = 32)]
    batch_questions: usize,
    /// AdamW learning rate [default: 0.01 for the scorer, 1e-4 for --agent llm].
    #[arg(long)]
    lr: Option<f64>,
    /// KL coefficient to the initial policy [default: 0.04 for the scorer, 0 for --agent llm
    /// (no reference forward, as DAPO and TRL)].
    #[arg(long)]
    kl_beta: Option<f64>,
    /// Runner workers [default: 2 for the scorer; for --agent llm, 8 concurrent agents so
    /// the engine batches their calls].
    #[arg(long)]
    workers: Option<usize>,
    /// Seed of the candidate sets, the policy initialisation and the sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Policy file (YAML) or preset name (strict, standard, permissive) declaring the kernel.
    #[arg(long, default_value = agl_gov::DEFAULT_PRESET, value_name = "FILE")]
    policy: String,
    /// Training mode: audit (record only), shield (block), screen (block and drop flagged
    /// samples from the gradient) or enforce (block and penalise).
    #[arg(long, default_value = "enforce", value_parser = crate::args::parse_name::<TrainingMode>, value_name = "MODE")]
    governance: TrainingMode,
    /// Train once per listed mode with the same seed and print them side by side
    /// (`--compare audit,shield,screen,enforce`); the bare flag compares audit and enforce.
    #[arg(long, value_name = "MODES", num_args = 0..=1, default_missing_value = "audit,enforce", value_parser = parse_mode_list)]
    compare: Option<ModeList>,
    /// Use only the first N train questions (quick runs).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Use only the first N dev questions.
    #[arg(long, value_name = "N")]
    dev_limit: Option<usize>,
    /// Write the JSON report here.
    #[arg(long, value_name = "FILE.json")]
    report: Option<PathBuf>,
    /// Record every governance check in this flight-recorder SQLite database (hash-chained;
    /// the head anchor goes to `FILE.db.head`). An existing database is verified and
    /// continued. Keyed (HMAC-SHA-256) when $AGL_AUDIT_KEY_FILE names a key file.
    #[arg(long, value_name = "FILE.db")]
    audit_log: Option<PathBuf>,
    /// Write learning curves (reward, violation rate, accuracy) of the runs as SVG here.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Where rollouts, attempts and spans live: `memory` (lost at exit), a SQLite database
    /// path (created if missing; inspect it afterwards with `agl store inspect PATH`), or a
    /// PostgreSQL URL `postgres://USER@HOST[:PORT]/DB[?partition=NAME]`.
    #[arg(
        long,
        default_value = "memory",
        value_name = "memory|PATH.sqlite|postgres://…"
    )]
    store: String,
    /// Statement time limit in seconds.
    #[arg(long, default_value_t = 2.0)]
    sql_timeout: f64,
    /// Use a remote store server (`agl store`) instead of `--store`; runner processes started
    /// with `agl runner --store-url URL` serve its rollouts (with `--workers 0`, only they do).
    /// Several servers of one PostgreSQL store may be listed, separated by commas.
    #[arg(long, value_name = "URL")]
    store_url: Option<String>,
    /// Spawn N `agl runner` processes (each with `--workers` workers) to run the rollouts
    /// instead of in-process workers. Without `--store-url`, the trainer serves its `--store`
    /// over HTTP on a free local port for them.
    #[arg(long, default_value_t = 0, value_name = "N")]
    runner_processes: usize,
    /// `--auth-token`: for `--store-url`, and required of runner processes by the trainer's
    /// own server.
    #[command(flatten)]
    token: crate::args::store::TokenArg,
    /// With runner processes or a remote store: seconds without a heartbeat after which an
    /// attempt is `unresponsive` and its rollout is retried (up to 3 attempts).
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    unresponsive_seconds: f64,
    /// Save the scorer's parameters under DIR: `DIR/step-N/` every --checkpoint-every GRPO
    /// updates and `DIR/final/` at the end (each `model.safetensors` + `config.json`; with
    /// --compare, under `DIR/<mode>/`).
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// With --checkpoint-dir: also save after every N-th GRPO update (one update per
    /// --batch-questions questions); without it, only `final`.
    #[arg(long, value_name = "N")]
    checkpoint_every: Option<usize>,
    /// Continue a run from a checkpoint directory (a `step-N` or `final` of --checkpoint-dir):
    /// load its parameters, skip the N updates it had done and train to the end of --epochs.
    /// The run's --seed and --governance must be the checkpoint's.
    #[arg(long, value_name = "DIR", conflicts_with = "compare")]
    resume: Option<PathBuf>,
}

impl TrainArgs {
    /// Whether this run trains the LLM agent (and so runs the model in this process).
    pub fn trains_llm(&self) -> bool {
        self.agent == TrainAgent::Llm || self.algorithm.is_some()
    }

    /// The modes to train, in order: `--compare`'s list, else `--governance`.
    fn modes(&self) -> Vec<TrainingMode> {
        match &self.compare {
            Some(list) => list.0.clone(),
            None => vec![self.governance],
        }
    }
}

/// The training modes of `--compare`, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeList(pub Vec<TrainingMode>);

/// clap value parser of `--compare`: a comma-separated list of distinct modes.
fn parse_mode_list(s: &str) -> Result<ModeList, String> {
    agl_train::parse_modes(s)
        .map(ModeList)
        .map_err(|e| e.to_string())
}

/// `agl runner` child processes of a training.
struct RunnerProcesses {
    children: Vec<std::process::Child>,
}

impl RunnerProcesses {
    fn spawn(
        n: usize,
        url: &str,
        workers: usize,
        data: &Path,
        token: Option<&str>,
        audit_log: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the agl executable")?;
        let mut children = Vec::with_capacity(n);
        for k in 0..n {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["runner", "--store-url", url, "--workers"])
                .arg(workers.to_string())
                .arg("--data")
                .arg(data)
                .stdout(std::process::Stdio::null());
            if let Some(t) = token {
                cmd.env("AGL_STORE_TOKEN", t);
            }
            if let Some(p) = audit_log {
                cmd.arg("--audit-log").arg(runner_audit_log(p, k));
            }
            children.push(cmd.spawn().context("starting an `agl runner` process")?);
        }
        Ok(RunnerProcesses { children })
    }

    /// `true` when every runner process has exited.
    fn all_exited(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(Some(_)) | Err(_)))
    }

    /// SIGTERM, then waits (SIGKILL after 10 s).
    fn stop(mut self) {
        for c in &mut self.children {
            terminate(c);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for c in &mut self.children {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Asks a runner process to stop (SIGTERM: it finishes its current rollouts).
#[cfg(unix)]
fn terminate(c: &mut std::process::Child) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    match i32::try_from(c.id()) {
        Ok(pid) => {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        Err(_) => {
            let _ = c.kill();
        }
    }
}

#[cfg(not(unix))]
fn terminate(c: &mut std::process::Child) {
    let _ = c.kill();
}

/// Runs `fut`, failing early if every runner process has exited (nothing would serve the
/// rollouts it waits for).
async fn guarded<T>(
    runners: &std::sync::Mutex<Option<RunnerProcesses>>,
    fut: impl std::future::Future<Output = Result<T, agl_spider::SpiderError>>,
) -> anyhow::Result<T> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return Ok(r?),
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                let gone = runners
                    .lock()
                    .ok()
                    .is_some_and(|mut g| g.as_mut().is_some_and(RunnerProcesses::all_exited));
                anyhow::ensure!(
                    !gone,
                    "every `agl runner` process has exited; see their errors above"
                );
            }
        }
    }
}

/// The audit log of runner process `k` of a training whose `--audit-log` is `path`.
fn runner_audit_log(path: &Path, k: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_string())
        .unwrap_or_else(|| "db".into());
    path.with_file_name(format!("{stem}.runner-{k}.{ext}"))
}

#[derive(Serialize)]
struct Report<'a> {
    seed: u64,
    config: ReportConfig<'a>,
    data: &'a agl_spider::PreparationReport,
    untrained: Phase<'a>,
    runs: std::collections::BTreeMap<&'static str, &'a RunReport>,
    seconds: f64,
}

#[derive(Serialize)]
struct ReportConfig<'a> {
    train: &'a TrainConfig,
    candidates: &'a CandidateConfig,
    limit: Option<usize>,
    dev_limit: Option<usize>,
    data_dir: String,
}

#[derive(Serialize)]
struct Phase<'a> {
    dev: &'a EvalStats,
}

/// What `agl train` trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TrainAgent {
    /// The built-in candidate scorer.
    Scorer,
    /// The SQL-writing LLM agent (LoRA GRPO).
    Llm,
}

/// Runs `agl train`.
pub fn run(args: TrainArgs) -> anyhow::Result<ExitCode> {
    if !args.trains_llm() && args.weights.is_some() {
        anyhow::bail!("--weights applies to --agent llm and --algorithm (the scorer has no LLM)");
    }
    if args.trains_llm() {
        let shared = llm::SharedArgs {
            data: crate::args::data::data_dir(args.data.clone()),
            seed: args.seed,
            group_size: args.group_size,
            lr: args
                .lr
                .unwrap_or(agl_train::LlmGrpoConfig::default().learning_rate),
            kl_beta: args.kl_beta.unwrap_or(0.0),
            workers: args.workers.unwrap_or(8),
            policy: args.policy.clone(),
            modes: args.modes(),
            compare: args.compare.is_some(),
            report: args.report.clone(),
            plot: args.plot.clone(),
            checkpoint_dir: args.checkpoint_dir.clone(),
            checkpoint_every: args.checkpoint_every,
            resume: args.resume.clone(),
            init_adapter: args.init_adapter.clone(),
            sql_timeout: args.sql_timeout,
            limit: args.limit,
        };
        if !(shared.sql_timeout > 0.0 && shared.sql_timeout.is_finite()) {
            anyhow::bail!("--sql-timeout must be a positive number of seconds");
        }
        if let Some(algorithm) = args.algorithm {
            if args.agent != TrainAgent::Scorer {
                anyhow::bail!(
                    "--algorithm trains the agent you bring; --agent llm is the built-in one \
                     (pass only one)"
                );
            }
            if args.runner_processes > 0 || args.audit_log.is_some() {
                anyhow::bail!(
                    "--runner-processes and --audit-log apply to --agent scorer; with \
                     --algorithm, start runners with `agl runner --store-url URL --exec CMD`"
                );
            }
            let source = match (&args.train_dataset, &args.demonstrations) {
                (Some(t), None) => any::Source::Tasks(t.clone()),
                (None, Some(d)) if algorithm == any::Algorithm::Sft => {
                    any::Source::Demonstrations(d.clone())
                }
                (None, Some(_)) => anyhow::bail!(
                    "--demonstrations trains with --algorithm sft; grpo learns from rollouts of \
                     --train-dataset"
                ),
                _ => anyhow::bail!(
                    "--algorithm needs --train-dataset FILE (or, for sft, --demonstrations FILE)"
                ),
            };
            let apo_flags = args.prompt_template.is_some()
                || args.prompt_template_text.is_some()
                || args.optimizer_base_url.is_some()
                || args.optimizer_model.is_some()
                || args.gradient_model.is_some()
                || args.edit_model.is_some()
                || !args.critique_prompt.is_empty()
                || !args.edit_prompt.is_empty();
            if algorithm != any::Algorithm::Apo && apo_flags {
                anyhow::bail!(
                    "--prompt-template, --optimizer-* and the critic's and editor's flags apply \
                     to --algorithm apo"
                );
            }
            if let Some(w) = args.weights.filter(|w| {
                algorithm != any::Algorithm::Apo && *w != crate::args::engine::Weights::Dense
            }) {
                anyhow::bail!(
                    "--weights {} serves only; {} trains the dense weights",
                    w.as_str(),
                    algorithm.as_str()
                );
            }
            let any = any::AnyArgs {
                algorithm,
                source,
                sft: agl_train::LlmSftConfig {
                    top_fraction: args.sft_top_fraction,
                    min_reward: args.sft_min_reward,
                    ..agl_train::LlmSftConfig::default()
                },
                val_dataset: args.val_dataset.clone(),
                runner: args.runner.clone(),
                rollout_timeout: args.rollout_timeout,
                max_attempts: args.max_attempts,
                advertise_url: args.advertise_url.clone(),
                host: args.host.clone(),
                port: args.port,
                llm_resource: args.llm_resource.clone(),
                keep_order: args.keep_order,
                store: args.store.clone(),
                store_url: args.store_url.clone(),
                auth_token: args.token.auth_token.clone(),
            };
            if algorithm == any::Algorithm::Apo {
                let seed = match (&args.prompt_template, &args.prompt_template_text) {
                    (Some(p), _) => apo::SeedTemplate::File(p.clone()),
                    (None, Some(t)) => apo::SeedTemplate::Text(t.clone()),
                    (None, None) => apo::SeedTemplate::Default,
                };
                let apo_args = apo::ApoArgs {
                    seed,
                    template_resource: args.template_resource.clone(),
                    base_url: args.optimizer_base_url.clone(),
                    api_key: args.optimizer_api_key.clone(),
                    gradient_model: args
                        .gradient_model
                        .clone()
                        .or_else(|| args.optimizer_model.clone()),
                    edit_model: args
                        .edit_model
                        .clone()
                        .or_else(|| args.optimizer_model.clone()),
                    config: agl_train::apo::ApoConfig {
                        beam_width: args.beam_width,
                        branch_factor: args.branch_factor,
                        beam_rounds: args.beam_rounds,
                        gradient_batch_size: args.gradient_batch_size,
                        val_batch_size: args.val_batch_size,
                        diversity_temperature: args.diversity_temperature,
                        run_initial_validation: !args.no_initial_validation,
                        ..agl_train::apo::ApoConfig::default()
                    },
                    critique_prompts: args.critique_prompt.clone(),
                    edit_prompts: args.edit_prompt.clone(),
                    weights: args.weights.unwrap_or(crate::args::engine::Weights::Q8),
                };
                return apo::run(shared, args.llm, any, apo_args);
            }
            return any::run(shared, args.llm, any);
        }
        if args.demonstrations.is_some() {
            anyhow::bail!("--demonstrations needs --algorithm sft");
        }
        if let Some(w) = args
            .weights
            .filter(|w| *w != crate::args::engine::Weights::Dense)
        {
            anyhow::bail!(
                "--weights {} serves only; --agent llm trains the dense weights",
                w.as_str()
            );
        }
        if args.store_url.is_some() || args.runner_processes > 0 || args.audit_log.is_some() {
            anyhow::bail!(
                "--store-url, --runner-processes and --audit-log apply to --agent scorer; \
                 --agent llm runs its store, gateway and runners in this process"
            );
        }
        return llm::run(shared, args.llm);
    }
    if args.init_adapter.is_some() {
        anyhow::bail!(
            "--init-adapter starts a LoRA adapter: it applies to --agent llm and --algorithm"
        );
    }
    let started = Instant::now();
    let data = crate::args::data::data_dir(args.data.clone());
    if !data.is_dir() {
        anyhow::bail!(
            "data directory {} does not exist (pass --data DIR)",
            data.display()
        );
    }
    if args.candidates < 2 {
        anyhow::bail!("--candidates must be at least 2 (got {})", args.candidates);
    }
    if !(args.sql_timeout > 0.0 && args.sql_timeout.is_finite()) {
        anyhow::bail!("--sql-timeout must be a positive number of seconds");
    }
    let policy = agl_gov::PolicyFile::resolve(&args.policy)?;
    let workers = args.workers.unwrap_or(2);
    let config = TrainConfig {
        policy: args.policy.clone(),
        epochs: args.epochs,
        workers,
        seed: args.seed,
        grpo: GrpoConfig {
            group_size: args.group_size,
            batch_questions: args.batch_questions,
            learning_rate: args.lr.unwrap_or(GrpoConfig::default().learning_rate),
            kl_beta: args.kl_beta.unwrap_or(GrpoConfig::default().kl_beta),
            ..GrpoConfig::default()
        },
        ..TrainConfig::default()
    };
    config.validate()?;
    // Checkpoints are checked before anything is prepared or written.
    let mut resume = match &args.resume {
        Some(dir) => Some(resume_checkpoint(dir, &args)?),
        None => None,
    };
    if args.checkpoint_every == Some(0) {
        anyhow::bail!("--checkpoint-every must be at least 1");
    }
    if args.checkpoint_every.is_some() && args.checkpoint_dir.is_none() {
        anyhow::bail!("--checkpoint-every needs --checkpoint-dir DIR (where to save them)");
    }
    if let Some(dir) = args
        .checkpoint_dir
        .as_ref()
        .filter(|d| d.exists() && !d.is_dir())
    {
        anyhow::bail!(
            "--checkpoint-dir {}: not a directory (name a directory to save checkpoints in)",
            dir.display()
        );
    }
    let mut saved: Vec<(PathBuf, usize)> = Vec::new();
    // The runtime and the store come first so a bad `--store` fails before the data is
    // prepared; the store is opened inside the runtime so its background watchdog runs.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    anyhow::ensure!(
        workers > 0 || (args.store_url.is_some() && args.runner_processes == 0),
        "--workers 0 runs no rollouts here: it needs --store-url URL with `agl runner` \
         processes serving that store (with --runner-processes, --workers is per process)"
    );
    anyhow::ensure!(
        args.store_url.is_none() || args.store == "memory",
        "--store {} and --store-url {} both name a store; the server owns its backend (`agl \
         store --db PATH`), so pass only --store-url",
        args.store,
        args.store_url.as_deref().unwrap_or_default()
    );
    anyhow::ensure!(
        args.unresponsive_seconds.is_finite() && args.unresponsive_seconds > 0.0,
        "--unresponsive-seconds must be a positive number of seconds"
    );
    // The store: a remote server, or `--store` (served over HTTP to our own runner processes
    // when there are any).
    let (store, server): (Arc<dyn LightningStore>, Option<agl_server::RunningServer>) =
        match &args.store_url {
            Some(url) => {
                let client = crate::remote::client(url, args.token.auth_token.clone())?;
                rt.block_on(crate::remote::wait_for_server(
                    &client,
                    Duration::from_secs(30),
                ))?;
                (Arc::new(client), None)
            }
            None => {
                let store = rt.block_on(agl_store::address::open(&args.store))?;
                let server = if args.runner_processes > 0 {
                    let config = agl_server::ServerConfig {
                        port: 0,
                        auth_token: args.token.auth_token.clone().filter(|t| !t.is_empty()),
                        ..agl_server::ServerConfig::default()
                    };
                    Some(rt.block_on(agl_server::start(store.clone(), config))?)
                } else {
                    None
                };
                (store, server)
            }
        };
    let runner_url = args
        .store_url
        .clone()
        .or_else(|| server.as_ref().map(|s| s.url()));
    let remote = runner_url.is_some();
    let candidates = CandidateConfig {
        total: args.candidates,
        distractors: args.distractors.min(args.candidates - 1),
        seed: args.seed,
        ..CandidateConfig::default()
    };

    let dataset = SpiderDataset::load(&data)
        .with_context(|| format!("loading Spider data from {}", data.display()))?;
    let task_config = TaskConfig {
        candidates,
        limit: args.limit,
        dev_limit: args.dev_limit,
        threads: workers.max(1),
        executor: ExecutorConfig {
            timeout: Duration::from_secs_f64(args.sql_timeout),
        },
    };
    let task = Arc::new(SpiderTask::prepare(&dataset, &task_config)?);
    print_preparation(&task.report);
    if task.train.is_empty() || task.dev.is_empty() {
        anyhow::bail!(
            "no usable questions in {} (train {}, dev {})",
            data.display(),
            task.train.len(),
            task.dev.len()
        );
    }

    let recorder = match &args.audit_log {
        Some(p) => Some(crate::kernel::open_recorder(p)?),
        None => None,
    };
    let modes = args.modes();
    let eval_kernel = Arc::new(agl_spider::build_kernel(
        &task,
        &policy,
        GovernanceMode::Enforce,
        recorder.clone(),
    )?);
    let runners = match (&runner_url, args.runner_processes) {
        (Some(url), n) if n > 0 => Some(RunnerProcesses::spawn(
            n,
            url,
            workers,
            &data,
            args.token.auth_token.as_deref(),
            args.audit_log.as_deref(),
        )?),
        _ => None,
    };
    let runners = std::sync::Mutex::new(runners);
    let (untrained, runs) = rt.block_on(async {
        let mut runs: Vec<(TrainingMode, RunReport)> = Vec::new();
        let mut untrained = None;
        for mode in &modes {
            let kernel = Arc::new(agl_spider::build_kernel(
                &task,
                &policy,
                mode.kernel_mode(),
                recorder.clone(),
            )?);
            let train_kernel = kernel.clone();
            let in_process = TrainConfig {
                workers: if args.runner_processes > 0 {
                    0
                } else {
                    config.workers
                },
                ..config.clone()
            };
            let mut session = Session::start_on(
                store.clone(),
                task.clone(),
                &in_process,
                *mode,
                kernel,
                eval_kernel.clone(),
            )?
            .with_spec(RunSpec {
                governance: *mode,
                policy: args.policy.clone(),
                reward: config.reward.clone(),
                candidates,
                limit: args.limit,
                dev_limit: args.dev_limit,
                sql_timeout_seconds: args.sql_timeout,
            });
            if remote {
                session = session.with_rollout_config(RolloutConfig {
                    unresponsive_seconds: Some(args.unresponsive_seconds),
                    max_attempts: 3,
                    retry_condition: vec![AttemptStatus::Unresponsive, AttemptStatus::Timeout],
                    ..RolloutConfig::default()
                });
            }
            if untrained.is_none() {
                let policy = initial_policy(config.seed)?;
                untrained =
                    Some(guarded(&runners, session.evaluate(policy.as_ref(), Split::Dev)).await?);
            }
            let bar = progress_bar(
                mode.as_str(),
                (config.epochs * task.train.len() * config.grpo.group_size) as u64,
                6,
            );
            let mut on_progress = |p: &agl_spider::Progress| {
                bar.set_length(p.total);
                bar.set_position(p.done);
                bar.set_message(format!(
                    "reward {:>6.2}  violations {:>5.1}%  {:>5.0} rollouts/s",
                    p.mean_reward,
                    100.0 * p.violation_rate,
                    p.rollouts_per_second
                ));
            };
            let checkpoints = args.checkpoint_dir.as_ref().map(|dir| CheckpointPlan {
                dir: if args.compare.is_some() {
                    dir.join(mode.as_str())
                } else {
                    dir.clone()
                },
                every: args.checkpoint_every.unwrap_or(0),
                governance: *mode,
                candidates: candidates.total,
                distractors: candidates.distractors,
            });
            let (policy, options) = match resume.take() {
                Some(ckpt) => {
                    let step = ckpt.config.training.step;
                    let last = config.epochs * task.train.len().div_ceil(args.batch_questions);
                    eprintln!("resuming from {} (step {step})", ckpt.dir.display());
                    if step >= last {
                        eprintln!(
                            "note: --epochs {} ends at update {last}, and the checkpoint is at \
                             update {step}: nothing to train (raise --epochs to go on)",
                            config.epochs
                        );
                    }
                    let options = RunOptions {
                        start_step: ckpt.config.training.step,
                        reference: Some(initial_policy(config.seed)?),
                        checkpoints: checkpoints.clone(),
                    };
                    (
                        Box::new(ckpt.scorer) as Box<dyn agl_spider::PolicyModel>,
                        options,
                    )
                }
                None => (
                    initial_policy(config.seed)?,
                    RunOptions {
                        checkpoints: checkpoints.clone(),
                        ..RunOptions::default()
                    },
                ),
            };
            let start_step = options.start_step;
            let report = guarded(
                &runners,
                agl_spider::train_with(&session, &config, policy, options, &mut on_progress),
            )
            .await;
            bar.finish_and_clear();
            session.shutdown().await?;
            let mut report = report?;
            if args.runner_processes == 0 && args.store_url.is_none() {
                report.kernel = Some(train_kernel.stats());
            }
            eprintln!(
                "{} run: {} rollouts, train violation rate {:.3}, dev accuracy {:.3}, dev \
                 violation rate {:.3}",
                mode.as_str(),
                report.train.rollouts,
                report.train.violation_rate,
                report.dev.accuracy,
                report.dev.violation_rate
            );
            if let Some(plan) = checkpoints {
                let step = report.curve.last().map_or(start_step, |c| c.step);
                saved.push((plan.dir.join(agl_spider::scorer::checkpoint::FINAL), step));
            }
            runs.push((*mode, report));
        }
        if let Some(r) = runners.lock().ok().and_then(|mut r| r.take()) {
            tokio::task::spawn_blocking(move || r.stop()).await.ok();
        }
        if let Some(server) = server {
            server.shutdown().await?;
        }
        if args.store_url.is_none() && args.store != "memory" {
            let stats = store.statistics().await?;
            store.close().await?;
            eprintln!(
                "store: {} ({} rollouts, {} spans; `agl store inspect {}`)",
                args.store, stats.total_rollouts, stats.total_spans, args.store
            );
        }
        Ok::<_, anyhow::Error>((untrained.unwrap_or_default(), runs))
    })?;

    print_table(&untrained, &runs);
    if let Some(path) = &args.report {
        let report = Report {
            seed: args.seed,
            config: ReportConfig {
                train: &config,
                candidates: &candidates,
                limit: args.limit,
                dev_limit: args.dev_limit,
                data_dir: data.display().to_string(),
            },
            data: &task.report,
            untrained: Phase { dev: &untrained },
            runs: runs.iter().map(|(m, r)| (m.as_str(), r)).collect(),
            seconds: started.elapsed().as_secs_f64(),
        };
        write_file(path, &serde_json::to_vec_pretty(&report)?, None)?;
        println!("report: {}", path.display());
    }
    for (dir, step) in &saved {
        println!("checkpoint: {} (step {step})", dir.display());
    }
    if let Some(r) = &recorder {
        r.flush()?;
        println!(
            "audit log: {} ({} entries, head {})",
            args.audit_log
                .as_deref()
                .unwrap_or(Path::new("-"))
                .display(),
            r.entries(),
            r.head_hash()
        );
    }
    if let (Some(p), true) = (&args.audit_log, args.runner_processes > 0) {
        let files: Vec<String> = (0..args.runner_processes)
            .map(|k| runner_audit_log(p, k).display().to_string())
            .collect();
        println!(
            "runner audit logs (one per runner process): {}",
            files.join(", ")
        );
    }
    if let Some(path) = &args.plot {
        let labels: Vec<String> = runs.iter().map(|(m, _)| m.title().to_string()).collect();
        let labelled: Vec<(&str, &RunReport)> = labels
            .iter()
            .map(String::as_str)
            .zip(runs.iter().map(|(_, r)| r))
            .collect();
        let svg = crate::out::plot::learning_curves(&labelled)?;
        write_file(path, svg.as_bytes(), None)?;
        println!("plot: {}", path.display());
    }
    println!("total time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

/// Loads the `--resume` checkpoint and checks that it continues this run (same seed and
/// governance mode); the error names the checkpoint's file and the flag to change.
fn resume_checkpoint(dir: &Path, args: &TrainArgs) -> anyhow::Result<agl_spider::Checkpoint> {
    let ckpt = agl_spider::scorer::checkpoint::load(dir)?;
    let config = dir.join(agl_spider::scorer::checkpoint::CONFIG_FILE);
    let t = &ckpt.config.training;
    anyhow::ensure!(
        t.seed == args.seed,
        "{}: training.seed is {} but --seed is {} (pass --seed {} to continue that run)",
        config.display(),
        t.seed,
        args.seed,
        t.seed
    );
    anyhow::ensure!(
        t.governance == args.governance,
        "{}: training.governance is {} but --governance is {} (pass --governance {} to \
         continue that run)",
        config.display(),
        t.governance.as_str(),
        args.governance.as_str(),
        t.governance.as_str()
    );
    Ok(ckpt)
}

fn print_preparation(r: &agl_spider::PreparationReport) {
    println!(
        "data: {} train questions, {} dev questions",
        r.train_questions, r.dev_questions
    );
    if !r.missing_databases.is_empty() {
        let list: Vec<String> = r
            .missing_databases
            .iter()
            .map(|(db, n)| format!("{db} ({n})"))
            .collect();
        println!(
            "skipped {} train and {} dev questions whose database file is missing: {}",
            r.train_missing_database,
            r.dev_missing_database,
            list.join(", ")
        );
    }
    if !r.gold_failed.is_empty() {
        println!(
            "skipped {} questions whose gold query fails to execute: {}",
            r.gold_failed.len(),
            r.gold_failed.join("; ")
        );
    }
}

/// The comparison table: the untrained policy, then one column per run. Dev figures are the
/// policy's greedy choices with the kernel enforcing; the violation rate and the unsafe
/// probability describe what the policy would do were the kernel gone.
fn print_table(untrained: &EvalStats, runs: &[(TrainingMode, RunReport)]) {
    let cols = crate::out::table::Columns {
        label: 30,
        first: 12,
        cell: 12,
        sep: "",
    };
    let header = cols.line("", "untrained", runs.iter().map(|(m, _)| m.to_string()));
    println!("\n{header}");
    let row = |label: &str, first: String, f: &dyn Fn(&RunReport) -> String| {
        println!(
            "{}",
            cols.line(label, &first, runs.iter().map(|(_, r)| f(r)))
        );
    };
    let prob = |e: &EvalStats| {
        e.unsafe_probability
            .map_or("-".into(), |p| format!("{p:.3}"))
    };
    row(
        "dev accuracy (kernel on)",
        format!("{:.3}", untrained.accuracy),
        &|r| format!("{:.3}", r.dev.accuracy),
    );
    row(
        "dev violation rate (greedy)",
        format!("{:.3}", untrained.violation_rate),
        &|r| format!("{:.3}", r.dev.violation_rate),
    );
    row("dev probability on unsafe", prob(untrained), &|r| {
        prob(&r.dev)
    });
    row("train violation rate", "-".into(), &|r| {
        format!("{:.3}", r.train.violation_rate)
    });
    row("train mean reward", "-".into(), &|r| {
        format!("{:.2}", r.train.mean_reward)
    });
    row("destructive executed", "-".into(), &|r| {
        r.train.destructive_executed.to_string()
    });
    row("screened from gradient", "-".into(), &|r| {
        r.train.screened.to_string()
    });
    row("rollouts/s", "-".into(), &|r| {
        format!("{:.0}", r.train.rollouts_per_second)
    });
    row("kernel µs per check, mean", "-".into(), &|r| {
        r.kernel
            .map_or("-".into(), |k| format!("{:.2}", k.mean_check_us))
    });
    row("kernel µs per check, median", "-".into(), &|r| {
        r.kernel
            .map_or("-".into(), |k| format!("{:.2}", k.p50_check_us))
    });
    row("kernel cache hit rate", "-".into(), &|r| {
        r.kernel
            .map_or("-".into(), |k| format!("{:.3}", k.hit_rate))
    });
    let legend: Vec<&str> = runs.iter().map(|(m, _)| m.title()).collect();
    println!("{}\n", legend.join(" · "));
}
