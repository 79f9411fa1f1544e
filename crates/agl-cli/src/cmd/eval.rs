//! `agl eval`: evaluate an agent on a fixed subset of a Spider split under governance, print a
//! short table and write the report.
//!
//! Two agents:
//! - `--agent llm`: the SQL-writing LLM agent ([`agl_spider::LlmSqlAgent`]: write → execute →
//!   check → rewrite, at most `--max-turns` queries). The model runs in the built-in engine in
//!   this process (`--model`, optionally a LoRA `--adapter DIR`), or any OpenAI-compatible
//!   server (`--llm-upstream URL`). An in-memory store and its HTTP server with the LLM gateway
//!   start on 127.0.0.1 (a free port); the gateway records every model call as a span (tokens)
//!   and checks the model's output with the same kernel that checks the agent's SQL. One `test`
//!   rollout per question; `--workers` runners serve them concurrently (so the engine batches).
//! - `--agent scorer`: the built-in candidate-choosing policy (the scorer `agl train` trains),
//!   evaluated as `agl train` evaluates it (greedy choice, kernel enforcing): untrained,
//!   initialised from `--seed`, or with `--checkpoint DIR` the parameters `agl train
//!   --checkpoint-dir` saved (`agl_spider::scorer::checkpoint`), on the candidate sets of the
//!   checkpoint's run (its seed, candidates, distractors). A missing or malformed checkpoint is
//!   refused before any data is loaded.
//!
//! The report has the shape of `agl train`'s (`seed`, `config`, `data`, the split's
//! [`EvalStats`] under its name, `seconds`) plus `agent`, `violations` (per policy, in the
//! agent's SQL and in the model's output), `llm` (turns, calls, tokens, tokens/s; `null` for
//! the scorer) and, with `--rows`, one row per question.
//!
//! Responsible for the command line, choosing the questions, wiring and printing; not for the
//! agents, their rewards and metrics or the scorer's evaluation (`agl-spider`:
//! [`agl_spider::scorer::evaluate_subset`]), the batch (`agl-train`), the gateway
//! (`agl-server`), the engine (`agl-llm`) or the stage it shares with `agl train --agent llm`
//! ([`crate::llm_stage`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::RolloutMode;
use agl_gov::{BuildEnv, GovernanceMode, Kernel, PolicyFile};
use agl_spider::scorer::{ScorerEval, ScorerRow, SubsetEval, evaluate_subset};
use agl_spider::{
    CheckMode, EvalStats, ExecutorConfig, LlmSqlAgent, PolicyCounts, Question, SpiderDataset,
    Split, SqlAgentConfig, SqlEvalRow, SqlEvalSummary, SqlTaskReward, sql_agent_reward,
};
use agl_train::RewardConfig;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::args::engine::{DeviceArg, ModelArg, Weights};
use crate::llm_stage::LlmStage;
use crate::out::files::write_file;
use crate::out::progress::progress_bar;
use agl_train::BatchPlan;

/// Which agent `agl eval` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentKind {
    /// An LLM writes, checks and rewrites SQL (through the LLM gateway).
    Llm,
    /// The built-in candidate-choosing policy (untrained, seeded by --seed, or a --checkpoint).
    Scorer,
}

impl AgentKind {
    fn name(self) -> &'static str {
        match self {
            AgentKind::Llm => "llm",
            AgentKind::Scorer => "scorer",
        }
    }
}

/// Arguments of `agl eval`.
#[derive(Debug, Args)]
#[command(
    mut_arg("model", |a| a.help(
        "The model (llm agent): a known name (`agl model pull NAME`), a .gguf file or a Hugging \
         Face model directory; with --llm-upstream, the model name that server knows",
    )),
    mut_arg("device", |a| a.help(
        "Where the built-in engine runs: cpu, cuda, cuda:N (a build with `--features cuda`), or \
         auto",
    )),
)]
pub struct EvalArgs {
    /// The agent: `llm` (an LLM writes SQL, checks and rewrites it) or `scorer` (the built-in
    /// candidate-choosing policy, untrained or a --checkpoint, as `agl train` evaluates it).
    #[arg(long, value_enum)]
    agent: AgentKind,
    #[command(flatten)]
    model: ModelArg,
    /// A PEFT LoRA adapter directory to evaluate on top of --model (llm agent, built-in
    /// engine); the agent's calls name the adapter.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// The Spider split: dev (unseen databases) or train.
    #[arg(long, default_value = "dev", value_parser = crate::args::data::parse_split, value_name = "dev|train")]
    split: Split,
    /// Evaluate at most N questions (of those --offset or --every select).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Skip the first K questions of the split (file order): questions K, K+1, ….
    #[arg(long, value_name = "K", default_value_t = 0, conflicts_with = "every")]
    offset: usize,
    /// Take every K-th question of the split (file order): questions 0, K, 2K, …; a fixed
    /// subset spread over the whole split, the same for every run and seed.
    #[arg(long, value_name = "K")]
    every: Option<usize>,
    /// Write the JSON report here.
    #[arg(long, value_name = "FILE.json")]
    report: Option<PathBuf>,
    /// Include one row per question in the report.
    #[arg(long)]
    rows: bool,
    /// Policy file (YAML) or preset name (strict, standard, permissive) declaring the kernel
    /// that checks the agent's SQL and the model's output (enforce mode).
    #[arg(long, default_value = agl_gov::DEFAULT_PRESET, value_name = "FILE")]
    policy: String,
    /// Concurrent agents (llm: so the engine batches their calls) or runner workers (scorer).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Sampling temperature of the model (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Most queries the llm agent writes per question (the write plus rewrites).
    #[arg(long, default_value_t = 3)]
    max_turns: usize,
    /// What decides a rewrite (llm agent, with --max-turns above 1): `model` (the model reviews
    /// each query and its result, Agent Lightning's checker) or `execution` (no review call: a
    /// query that ran is final, one that failed is rewritten with the database's error).
    #[arg(long, value_name = "model|execution", default_value = "model")]
    check: CheckMode,
    /// Most new tokens per model call.
    #[arg(long, default_value_t = 512)]
    max_tokens: u32,
    /// Seed: sampling of the model (with --temperature > 0), the scorer's initialisation and
    /// candidate sets.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    upstream: crate::args::gateway::UpstreamArgs,
    #[command(flatten)]
    device: DeviceArg,
    /// How the built-in engine holds the linear weights: dense (f32), q8 (faster decoding) or
    /// hybrid (prompts prefill dense, decoding reads q8: fastest here, at the memory of both).
    #[arg(long, value_enum, default_value = "dense")]
    weights: Weights,
    /// The llm agent's write prompt: its user message as a Python `str.format` template with
    /// the fields {question} and {schema} (e.g. `agl train --algorithm apo`'s best_prompt.txt),
    /// published as the `prompt_template` resource [default: the agent's own].
    #[arg(long, value_name = "FILE")]
    prompt_template: Option<PathBuf>,
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Statement time limit in seconds.
    #[arg(long, default_value_t = 2.0)]
    sql_timeout: f64,
    /// Time limit of one model call in seconds.
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// A scorer checkpoint directory (`agl train --checkpoint-dir`'s `step-N` or `final`) to
    /// evaluate instead of the untrained scorer (scorer agent). The candidate sets are the
    /// checkpoint's (its seed, candidates and distractors), as `agl train` evaluated it, so
    /// --seed is not accepted with it.
    #[arg(long, value_name = "DIR", conflicts_with = "seed")]
    checkpoint: Option<PathBuf>,
}

/// Positions (in the split's file order) that `--offset`/`--every` and `--limit` select, out
/// of `total` questions.
fn select(
    total: usize,
    offset: usize,
    every: Option<usize>,
    limit: Option<usize>,
) -> anyhow::Result<Vec<usize>> {
    let picked: Vec<usize> = match every {
        Some(0) => bail!("--every must be at least 1"),
        Some(k) => (0..total).step_by(k).collect(),
        None => (offset.min(total)..total).collect(),
    };
    let picked: Vec<usize> = picked
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    if picked.is_empty() {
        bail!(
            "no questions selected: the split has {total}, --offset {offset}, --limit {}",
            limit.map_or("none".to_string(), |l| l.to_string())
        );
    }
    Ok(picked)
}

fn selection_text(args: &EvalArgs, n: usize) -> String {
    match args.every {
        Some(k) => format!(
            "one question in {k} (positions 0, {k}, {}, …), {n} questions",
            2 * k
        ),
        None => format!("{n} questions from position {}", args.offset),
    }
}

#[derive(Serialize)]
struct ReportConfig<'a> {
    agent: &'static str,
    /// The scorer checkpoint evaluated (`--checkpoint`); absent for the untrained scorer.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint: Option<String>,
    model: Option<&'a str>,
    adapter: Option<String>,
    prompt_template: Option<String>,
    llm_upstream: Option<&'a str>,
    split: &'static str,
    limit: Option<usize>,
    offset: usize,
    every: Option<usize>,
    policy: &'a str,
    workers: usize,
    temperature: f64,
    max_turns: usize,
    check: CheckMode,
    max_tokens: u32,
    sql_timeout_seconds: f64,
    data_dir: String,
}

#[derive(Serialize)]
struct DataReport {
    split: &'static str,
    split_questions: usize,
    questions: usize,
    selection: String,
}

#[derive(Serialize)]
struct ViolationReport {
    /// Violations in total.
    total: usize,
    /// In the agent's SQL.
    sql: usize,
    /// In the model's output.
    llm_output: usize,
    by_policy: BTreeMap<String, PolicyCounts>,
}

#[derive(Serialize)]
struct LlmReport {
    model: String,
    upstream: String,
    mean_turns: f64,
    mean_llm_calls: f64,
    llm_errors: usize,
    failed_rollouts: usize,
    mean_reward: f64,
    prompt_tokens: u64,
    completion_tokens: u64,
    completion_tokens_per_second: f64,
    tokens_per_second: f64,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Rows {
    Llm(Vec<SqlEvalRow>),
    Scorer(Vec<ScorerRow>),
}

#[derive(Serialize)]
struct Report<'a> {
    agent: &'static str,
    seed: u64,
    config: ReportConfig<'a>,
    data: DataReport,
    /// The split's metrics under its name (`dev` or `train`), as in `agl train`'s report.
    #[serde(flatten)]
    split: BTreeMap<&'static str, EvalStats>,
    violations: ViolationReport,
    llm: Option<LlmReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    questions: Option<Rows>,
    seconds: f64,
}

/// What one agent's evaluation produced.
struct Outcome {
    stats: EvalStats,
    violations: ViolationReport,
    llm: Option<LlmReport>,
    rows: Rows,
}

/// Runs `agl eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    anyhow::ensure!(args.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(args.max_turns > 0, "--max-turns must be at least 1");
    anyhow::ensure!(args.max_tokens > 0, "--max-tokens must be at least 1");
    anyhow::ensure!(
        args.temperature.is_finite() && (0.0..=2.0).contains(&args.temperature),
        "--temperature must be in [0, 2] (got {})",
        args.temperature
    );
    anyhow::ensure!(
        args.sql_timeout.is_finite() && args.sql_timeout > 0.0,
        "--sql-timeout must be a positive number of seconds"
    );
    anyhow::ensure!(
        args.request_timeout.is_finite() && args.request_timeout > 0.0,
        "--request-timeout must be a positive number of seconds"
    );
    if args.agent == AgentKind::Llm
        && args.adapter.is_some()
        && args.upstream.llm_upstream.is_some()
    {
        bail!("--adapter loads into the built-in engine; with --llm-upstream, serve it there");
    }
    if let Some(dir) = &args.adapter
        && !dir.is_dir()
    {
        bail!(
            "--adapter {}: not a directory (expected a PEFT adapter directory)",
            dir.display()
        );
    }
    if args.agent == AgentKind::Llm && args.upstream.llm_upstream.is_none() {
        // Fail before loading any data when the model is missing.
        agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())
            .with_context(|| format!("--model {}", args.model))?;
    }
    if args.prompt_template.is_some() && args.agent != AgentKind::Llm {
        bail!("--prompt-template is the llm agent's write prompt (use it with --agent llm)");
    }
    // Fail before loading anything when the template is missing or not one the agent fills.
    let template = match &args.prompt_template {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("--prompt-template: reading {}", p.display()))?;
            agl_spider::prompts::parse_write_template(&text)
                .map_err(|e| anyhow::anyhow!("--prompt-template {}: {e}", p.display()))?;
            Some(text)
        }
        None => None,
    };
    if args.agent == AgentKind::Llm && args.checkpoint.is_some() {
        bail!("--checkpoint is a scorer checkpoint (use it with --agent scorer)");
    }
    // Fail before loading any data when the checkpoint is missing or malformed.
    let checkpoint = match &args.checkpoint {
        Some(dir) => Some(agl_spider::scorer::checkpoint::load(dir)?),
        None => None,
    };
    let seed = checkpoint
        .as_ref()
        .map_or(args.seed, |c| c.config.training.seed);
    let policy =
        PolicyFile::resolve(&args.policy).with_context(|| format!("--policy {}", args.policy))?;
    let data = crate::args::data::data_dir(args.data.clone());
    if !data.is_dir() {
        bail!(
            "data directory {} does not exist (pass --data DIR)",
            data.display()
        );
    }
    let dataset = SpiderDataset::load(&data)
        .with_context(|| format!("loading Spider data from {}", data.display()))?;
    let all = dataset.questions(args.split);
    let picked = select(all.len(), args.offset, args.every, args.limit)?;
    let questions: Vec<Question> = picked.iter().map(|&i| all[i].clone()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = match args.agent {
        AgentKind::Llm => run_llm(&args, &rt, &dataset, &policy, &questions, template)?,
        AgentKind::Scorer => {
            run_scorer(&args, &rt, &dataset, &policy, &picked, checkpoint.as_ref())?
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    print_table(&args, &outcome, seconds, checkpoint.as_ref());
    if let Some(path) = &args.report {
        let split = args.split.as_str();
        let report = Report {
            agent: args.agent.name(),
            seed,
            config: ReportConfig {
                checkpoint: args.checkpoint.as_ref().map(|p| p.display().to_string()),
                agent: args.agent.name(),
                model: (args.agent == AgentKind::Llm).then_some(&*args.model),
                adapter: args.adapter.as_ref().map(|p| p.display().to_string()),
                prompt_template: args
                    .prompt_template
                    .as_ref()
                    .map(|p| p.display().to_string()),
                llm_upstream: args.upstream.llm_upstream.as_deref(),
                split,
                limit: args.limit,
                offset: args.offset,
                every: args.every,
                policy: &args.policy,
                workers: args.workers,
                temperature: args.temperature,
                max_turns: args.max_turns,
                check: args.check,
                max_tokens: args.max_tokens,
                sql_timeout_seconds: args.sql_timeout,
                data_dir: data.display().to_string(),
            },
            data: DataReport {
                split,
                split_questions: all.len(),
                questions: outcome.stats.questions,
                selection: selection_text(&args, picked.len()),
            },
            split: BTreeMap::from([(split, outcome.stats.clone())]),
            violations: outcome.violations,
            llm: outcome.llm,
            questions: args.rows.then_some(outcome.rows),
            seconds,
        };
        write_file(path, &serde_json::to_vec_pretty(&report)?, Some("--report"))?;
        println!("report: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The built-in engine with `--model` (and `--adapter`, served under its directory's name), as
/// an in-process upstream; returns the engine, the upstream and the model name the agent must
/// send.
fn start_engine(
    args: &EvalArgs,
) -> anyhow::Result<(agl_llm::Engine, agl_server::Upstream, String)> {
    let adapter = args.adapter.as_ref().map(|dir| {
        let name = dir
            .file_name()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("adapter");
        (format!("{name}-adapter"), dir.display().to_string())
    });
    let spec = agl_llm::EngineSpec {
        model: args.model.to_string(),
        weights: args.weights.format(),
        device: args.device.to_string(),
        adapters: adapter
            .iter()
            .map(|(name, dir)| format!("{name}={dir}"))
            .collect(),
        served_model_name: None,
        max_batch_rows: args.workers.clamp(1, 64),
        prefix_cache_tokens: agl_llm::DEFAULT_PREFIX_CACHE_TOKENS,
    };
    let started = crate::args::engine::start_engine(&spec, "agl eval")?;
    let model = adapter.map_or_else(|| started.name.clone(), |(name, _)| name);
    let upstream = agl_server::Upstream::InProcess(started.router());
    Ok((started.engine, upstream, model))
}

fn run_llm(
    args: &EvalArgs,
    rt: &tokio::runtime::Runtime,
    dataset: &SpiderDataset,
    policy: &PolicyFile,
    questions: &[Question],
    template: Option<String>,
) -> anyhow::Result<Outcome> {
    let env = BuildEnv {
        table_stats: crate::kernel::table_stats(dataset, questions)?,
        mode: Some(GovernanceMode::Enforce),
        check_cache: Some(Arc::new(agl_gov::CheckCache::default())),
    };
    let kernel: Arc<Kernel> = Arc::new(
        crate::kernel::build_kernel(policy, &env, None)
            .with_context(|| format!("--policy {}", args.policy))?,
    );
    let (engine, upstream, model) = match args.upstream.http() {
        Some(upstream) => (None, upstream, args.model.to_string()),
        None => {
            let (engine, upstream, model) = start_engine(args)?;
            (Some(engine), upstream, model)
        }
    };
    let upstream_label = args
        .upstream
        .llm_upstream
        .clone()
        .unwrap_or_else(|| "built-in engine".to_string());
    let agent = Arc::new(LlmSqlAgent::new(
        dataset.root.join(agl_spider::DATABASE_DIR),
        SqlAgentConfig {
            max_turns: args.max_turns,
            check: args.check,
            max_tokens: args.max_tokens,
            temperature: args.temperature as f32,
            request_timeout: Duration::from_secs_f64(args.request_timeout),
            llm_resource: Some(agl_train::DEFAULT_LLM_RESOURCE.into()),
            executor: ExecutorConfig {
                timeout: Duration::from_secs_f64(args.sql_timeout),
            },
        },
    )?);
    let result = rt.block_on(async {
        let stage = LlmStage::start(
            upstream,
            kernel,
            agent,
            Arc::new(sql_agent_reward(
                RewardConfig::default(),
                SqlTaskReward::Execution,
            )),
            Duration::from_secs_f64(args.request_timeout),
        )
        .await?;
        let plan = BatchPlan {
            resources_id: "agl-eval".into(),
            llm_resource: agl_train::DEFAULT_LLM_RESOURCE.into(),
            endpoint: stage.endpoint(),
            model: model.clone(),
            temperature: args.temperature,
            max_tokens: args.max_tokens,
            seed: Some(args.seed),
            mode: RolloutMode::Test,
            workers: args.workers,
            config: None,
        };
        let bar = progress_bar("eval", questions.len() as u64, 5);
        let (mut correct, mut violating, mut done) = (0usize, 0usize, 0usize);
        let mut extra = agl_core::NamedResources::new();
        if let Some(template) = template {
            extra.insert(
                agl_spider::sql_agent::WRITE_TEMPLATE_RESOURCE.to_string(),
                agl_core::Resource::PromptTemplate(agl_core::PromptTemplate {
                    template,
                    engine: agl_core::PromptEngine::FString,
                }),
            );
        }
        let outcome = stage
            .run_with(&plan, extra, questions, &bar, |row| {
                done += 1;
                correct += usize::from(row.correct);
                violating += usize::from(!row.sql_violations.is_empty());
                bar.set_message(format!(
                    "accuracy {:.3}  violations {:>5.1}%",
                    correct as f64 / done as f64,
                    100.0 * violating as f64 / done as f64
                ));
            })
            .await;
        bar.finish_and_clear();
        stage.shutdown().await?;
        let (finished, seconds) = outcome?;
        let rows: Vec<SqlEvalRow> = finished.into_iter().map(|(_, row)| row).collect();
        Ok::<_, anyhow::Error>((rows, seconds))
    });
    if let Some(engine) = engine {
        engine.shutdown();
    }
    let (rows, seconds) = result?;
    let s = SqlEvalSummary::from_rows(&rows, seconds);
    Ok(Outcome {
        stats: s.eval_stats(),
        violations: ViolationReport {
            total: s.sql_violations + s.llm_output_violations,
            sql: s.sql_violations,
            llm_output: s.llm_output_violations,
            by_policy: s.violations_by_policy.clone(),
        },
        llm: Some(LlmReport {
            model,
            upstream: upstream_label,
            mean_turns: s.mean_turns,
            mean_llm_calls: s.mean_llm_calls,
            llm_errors: s.llm_errors,
            failed_rollouts: s.failed,
            mean_reward: s.mean_reward,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            completion_tokens_per_second: s.completion_tokens_per_second,
            tokens_per_second: s.tokens_per_second,
        }),
        rows: Rows::Llm(rows),
    })
}

fn run_scorer(
    args: &EvalArgs,
    rt: &tokio::runtime::Runtime,
    dataset: &SpiderDataset,
    policy: &PolicyFile,
    picked: &[usize],
    checkpoint: Option<&agl_spider::Checkpoint>,
) -> anyhow::Result<Outcome> {
    let bar = ProgressBar::new_spinner();
    bar.set_message(format!(
        "evaluating the scorer on {} {} questions",
        picked.len(),
        args.split
    ));
    bar.enable_steady_tick(Duration::from_millis(200));
    let eval = SubsetEval {
        split: args.split,
        picked,
        checkpoint,
        seed: args.seed,
        policy,
        policy_name: &args.policy,
        workers: args.workers,
        sql_timeout: Duration::from_secs_f64(args.sql_timeout),
    };
    let result = rt.block_on(evaluate_subset(dataset, &eval));
    bar.finish_and_clear();
    let ScorerEval {
        stats,
        rows,
        by_policy,
        violations,
    } = result?;
    Ok(Outcome {
        stats,
        violations: ViolationReport {
            total: violations,
            sql: violations,
            llm_output: 0,
            by_policy,
        },
        llm: None,
        rows: Rows::Scorer(rows),
    })
}

fn print_table(
    args: &EvalArgs,
    o: &Outcome,
    seconds: f64,
    checkpoint: Option<&agl_spider::Checkpoint>,
) {
    let who = match (&o.llm, checkpoint) {
        (Some(l), _) => format!("llm agent, model `{}` ({})", l.model, l.upstream),
        (None, Some(c)) => format!(
            "scorer agent (checkpoint {}, step {}, seed {})",
            c.dir.display(),
            c.config.training.step,
            c.config.training.seed
        ),
        (None, None) => format!("scorer agent (untrained, seed {})", args.seed),
    };
    println!(
        "\nagl eval: {who} on {} ({} questions)",
        args.split, o.stats.questions
    );
    let row = |label: &str, value: String| println!("{label:<30}{value:>14}");
    row("execution accuracy", format!("{:.3}", o.stats.accuracy));
    row("violation rate", format!("{:.3}", o.stats.violation_rate));
    row(
        "violations (sql / output)",
        format!("{} / {}", o.violations.sql, o.violations.llm_output),
    );
    if let Some(l) = &o.llm {
        row("mean turns", format!("{:.2}", l.mean_turns));
        row("mean LLM calls", format!("{:.2}", l.mean_llm_calls));
        row("failed LLM calls", l.llm_errors.to_string());
        row(
            "tokens (prompt / completion)",
            format!("{} / {}", l.prompt_tokens, l.completion_tokens),
        );
        row(
            "completion tokens/s",
            format!("{:.1}", l.completion_tokens_per_second),
        );
    }
    row("wall time", format!("{seconds:.1} s"));
    for (policy, c) in &o.violations.by_policy {
        println!(
            "  {policy}: {} in SQL, {} in model output",
            c.sql, c.llm_output
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_and_every_select_fixed_positions() {
        assert_eq!(select(10, 0, None, Some(3)).unwrap(), [0, 1, 2]);
        assert_eq!(select(10, 8, None, None).unwrap(), [8, 9]);
        assert_eq!(select(10, 0, Some(4), None).unwrap(), [0, 4, 8]);
        assert_eq!(select(10, 0, Some(3), Some(2)).unwrap(), [0, 3]);
        assert!(select(10, 10, None, None).is_err());
        assert!(select(10, 0, Some(0), None).is_err());
        assert!(select(10, 0, None, Some(0)).is_err());
    }
}
