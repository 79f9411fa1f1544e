//! `agl train --algorithm apo`: Agent Lightning's APO (automatic prompt optimisation: beam
//! search over prompt templates with textual gradients, [`agl_train::apo`]) for the agent a
//! user brings, over the same store, runners and datasets as `--algorithm grpo`.
//!
//! # What runs where
//! This process holds the built-in engine serving `--model` (`--weights q8` by default: APO
//! trains no weights), the governed LLM gateway the agents call (as for GRPO: the `proxy_llm`
//! resource under `--llm-resource`, calls checked by the training mode's kernel), the store
//! (or `--store-url`) and the search. The agents run where `--runner` says: runners of other
//! processes (`none`), `exec:COMMAND` workers, or `sql`, the built-in Spider SQL agent.
//!
//! Each candidate is published as a resources version `<run>-v<N>` holding the LLM resource and
//! `{"resource_type": "prompt_template", "template", "engine": "f-string"}` under
//! `--template-resource` (`prompt_template`); an agent reads it from its resources.
//!
//! # The optimiser
//! The critic (`--gradient-model`) and the editor (`--edit-model`; `--optimizer-model` sets
//! both) are any OpenAI-compatible server at `--optimizer-base-url` (checked at start: it must
//! answer `GET /models` and list both models). Without one, the built-in engine is the
//! optimiser, over plain `/v1` on a private local port (not as a governed attempt), and both
//! models default to the served model's name.
//!
//! # Scores, files and interruption
//! A candidate's score is the mean of its rollouts' rewards as the training mode judges them
//! (`Judged::shaped`: the seed's `PolicyReward` penalties in `enforce`), a rollout without a
//! reward counting 0. The agent samples greedily (temperature 0), so scores differ by prompt,
//! not by luck. After the seed's validation and after every round, the best prompt is written
//! to `--checkpoint-dir` (default `runs/apo`) as `best_prompt.txt` and the report so far to
//! `--report`; Ctrl-C ends the search at the next rollout batch or optimiser call and writes
//! both. `--plot` draws the leader's and the best prompt's validation score per round.
//!
//! Responsible for the flags of this path, the wiring, the table, the files; not for the search
//! (`agl_train::apo`), the runners or the gateway.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agl_core::{FStringTemplate, RolloutMode};
use agl_gov::PolicyFile;
use agl_train::apo::{
    Apo, ApoConfig, ApoObserver, ApoReport, CandidateRecord, OpenAiTextModel, OptimizerPrompt,
    OptimizerPrompts, PromptKind, StoreEvaluator,
};
use agl_train::{
    BatchPlan, CancellationToken, Judged, PolicyReward, RewardConfig, TraceToMessages,
    TracerTraceToTriplet, TrainingMode,
};
use anyhow::{Context, bail};
use indicatif::ProgressBar;
use serde::Serialize;

use super::any::{self, AnyArgs, RunnerSpec, Server, Source};
use super::llm::{LlmTrainArgs, SharedArgs, engine_spec};
use crate::args::engine::Weights;
use crate::out::progress::progress_bar;

/// Where the initial template comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedTemplate {
    /// `--prompt-template FILE`.
    File(PathBuf),
    /// `--prompt-template-text TEXT`.
    Text(String),
    /// Neither: the built-in SQL agent's write template (`--runner sql` only).
    Default,
}

/// The flags only APO reads, resolved.
#[derive(Debug, Clone)]
pub struct ApoArgs {
    /// The initial template.
    pub seed: SeedTemplate,
    /// The template's resource name.
    pub template_resource: String,
    /// The optimiser's server (`None`: the built-in engine).
    pub base_url: Option<String>,
    /// Its API key.
    pub api_key: Option<String>,
    /// The critic's model (`None`: `--optimizer-model`, else the served model).
    pub gradient_model: Option<String>,
    /// The editor's model.
    pub edit_model: Option<String>,
    /// The search's settings (models and seed filled in here).
    pub config: ApoConfig,
    /// Critique prompt files (empty: the built-in ones).
    pub critique_prompts: Vec<PathBuf>,
    /// Edit prompt files.
    pub edit_prompts: Vec<PathBuf>,
    /// How the engine holds its weights.
    pub weights: Weights,
}

/// The JSON report of `--report`. Seconds; tokens.
#[derive(Debug, Serialize)]
struct ApoRunReport<'a> {
    algorithm: &'static str,
    governance: TrainingMode,
    policy: &'a str,
    model: &'a str,
    runner: String,
    template_resource: &'a str,
    optimizer: OptimizerInfo<'a>,
    data: ApoData,
    best_prompt_file: String,
    search: &'a ApoReport,
    kernel: agl_gov::KernelStats,
    reward: agl_train::RewardStats,
    peak_rss_bytes: Option<u64>,
    seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
struct OptimizerInfo<'a> {
    /// `builtin` or the server's address.
    base_url: &'a str,
    gradient_model: &'a str,
    edit_model: &'a str,
}

#[derive(Debug, Clone, Serialize)]
struct ApoData {
    train_dataset: String,
    train_tasks: usize,
    val_dataset: String,
    val_tasks: usize,
}

/// The seed template's text, checked (errors name the flag and the position).
fn seed_template(apo: &ApoArgs, runner: &RunnerSpec) -> anyhow::Result<String> {
    let (text, origin) = match &apo.seed {
        SeedTemplate::File(p) => (
            std::fs::read_to_string(p)
                .with_context(|| format!("--prompt-template: reading {}", p.display()))?,
            format!("--prompt-template {}", p.display()),
        ),
        SeedTemplate::Text(t) => (t.clone(), "--prompt-template-text".to_string()),
        SeedTemplate::Default if *runner == RunnerSpec::Sql => (
            agl_spider::prompts::WRITE_USER_TEMPLATE.to_string(),
            "the SQL agent's write template".to_string(),
        ),
        SeedTemplate::Default => bail!(
            "--algorithm apo needs the initial prompt template: --prompt-template FILE or \
             --prompt-template-text TEXT (Python str.format fields, e.g. {{question}})"
        ),
    };
    if *runner == RunnerSpec::Sql {
        agl_spider::prompts::parse_write_template(&text)
            .map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    } else {
        FStringTemplate::parse(&text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    }
    Ok(text)
}

/// The critique and edit prompts of `--critique-prompt` and `--edit-prompt`.
fn optimizer_prompts(apo: &ApoArgs) -> anyhow::Result<OptimizerPrompts> {
    let load = |kind: PromptKind, flag: &str, paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| OptimizerPrompt::load(kind, p).map_err(|e| anyhow::anyhow!("{flag}: {e}")))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    Ok(OptimizerPrompts::with(
        load(
            PromptKind::Critique,
            "--critique-prompt",
            &apo.critique_prompts,
        )?,
        load(PromptKind::Edit, "--edit-prompt", &apo.edit_prompts)?,
    )?)
}

/// Runs `agl train --algorithm apo`.
pub fn run(
    shared: SharedArgs,
    args: LlmTrainArgs,
    any: AnyArgs,
    apo: ApoArgs,
) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    anyhow::ensure!(
        !shared.compare,
        "--compare trains once per mode with grpo or sft; run apo once per --governance mode"
    );
    anyhow::ensure!(
        shared.resume.is_none() && shared.init_adapter.is_none(),
        "--resume and --init-adapter continue LoRA adapters; apo optimises the prompt, not weights"
    );
    any::check_serving(&any)?;
    let mode = shared.modes[0];
    let train_path = match &any.source {
        Source::Tasks(p) => p.clone(),
        Source::Demonstrations(_) => {
            bail!("--demonstrations trains with --algorithm sft; apo runs --train-dataset tasks")
        }
    };
    let Some(val_path) = any.val_dataset.clone() else {
        bail!("--algorithm apo needs --val-dataset FILE: candidates are scored on its tasks")
    };
    let mut train = agl_train::load_dataset(&train_path)
        .map_err(|e| anyhow::anyhow!("--train-dataset: {e}"))?;
    if let Some(n) = shared.limit {
        train.truncate(n);
    }
    let mut val =
        agl_train::load_dataset(&val_path).map_err(|e| anyhow::anyhow!("--val-dataset: {e}"))?;
    val.truncate(args.eval_limit);
    anyhow::ensure!(!train.is_empty(), "--train-dataset: no tasks (--limit)");
    anyhow::ensure!(!val.is_empty(), "--val-dataset: no tasks (--eval-limit)");
    let seed_text = seed_template(&apo, &any.runner)?;
    if any.runner == RunnerSpec::Sql {
        let name = agl_spider::sql_agent::WRITE_TEMPLATE_RESOURCE;
        anyhow::ensure!(
            apo.template_resource == name,
            "--runner sql: the SQL agent reads its template from the `{name}` resource, not \
             `{}` (--template-resource)",
            apo.template_resource
        );
    }
    let prompts = optimizer_prompts(&apo)?;
    let mut config = ApoConfig {
        seed: shared.seed,
        ..apo.config.clone()
    };
    let c = &apo.config;
    for (flag, v) in [
        ("--beam-width", c.beam_width),
        ("--branch-factor", c.branch_factor),
        ("--beam-rounds", c.beam_rounds),
        ("--gradient-batch-size", c.gradient_batch_size),
        ("--val-batch-size", c.val_batch_size),
    ] {
        anyhow::ensure!(v >= 1, "{flag} must be at least 1");
    }
    anyhow::ensure!(
        c.diversity_temperature.is_finite() && c.diversity_temperature >= 0.0,
        "--diversity-temperature must be a number ≥ 0"
    );
    // The models are checked against the server below; validate the rest first.
    config.gradient_model = "-".into();
    config.edit_model = "-".into();
    config.validate()?;
    let sql_data = super::sql_runner::prepare(&any.runner, &shared.data, &mut train, &mut val)?;
    // Fail before anything is started when the model is missing.
    agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())
        .with_context(|| format!("--model {}", args.model))?;
    let roles = any::agent_match(args.train_roles.as_deref())?;
    let triplets = TracerTraceToTriplet::new(
        agl_train::DEFAULT_LLM_CALL_MATCH,
        roles.as_ref().map(|(_, p)| p.as_str()),
    )?;
    let policy = PolicyFile::resolve(&shared.policy)
        .with_context(|| format!("--policy {}", shared.policy))?;
    let kernel = any::gateway_kernel(&policy, &shared.policy, mode)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let store = any::open_store(&any, &rt)?;
    let timeout = Duration::from_secs_f64(args.request_timeout);
    // An external optimiser is checked before the model is loaded.
    let external = match &apo.base_url {
        Some(url) => {
            let model = OpenAiTextModel::new(url, apo.api_key.clone(), timeout)
                .map_err(anyhow::Error::msg)?;
            let (g, e) = (
                apo.gradient_model.clone().unwrap_or_default(),
                apo.edit_model.clone().unwrap_or_default(),
            );
            anyhow::ensure!(
                !g.is_empty() && !e.is_empty(),
                "--optimizer-base-url {url}: name its model with --optimizer-model (or \
                 --gradient-model and --edit-model)"
            );
            rt.block_on(model.check(&[g.as_str(), e.as_str()]))
                .map_err(anyhow::Error::msg)?;
            Some(model)
        }
        None => None,
    };
    let spec = agl_llm::EngineSpec {
        weights: apo.weights.format(),
        ..engine_spec(&args, shared.workers * args.max_turns.max(1))
    };
    let started_engine = crate::args::engine::start_engine(&spec, "agl train")?;
    let base_name = started_engine.name.clone();
    config.gradient_model = apo
        .gradient_model
        .clone()
        .unwrap_or_else(|| base_name.clone());
    config.edit_model = apo.edit_model.clone().unwrap_or_else(|| base_name.clone());
    let dir = shared
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs/apo"));
    let best_file = dir.join("best_prompt.txt");
    let reward =
        PolicyReward::<(), ()>::new(RewardConfig::default()).with_shaping(mode.shapes_reward());
    let result = rt.block_on(async {
        let gateway = agl_server::GatewayConfig {
            upstream: agl_server::Upstream::InProcess(started_engine.router()),
            kernel: Some(kernel.clone()),
            request_timeout: timeout,
        };
        let server = Server::start(&any, store.clone(), gateway).await?;
        let (endpoint, store_hint) = server.announce(&any);
        let pool = any::runner_pool(
            &any,
            &shared,
            &args,
            mode,
            &store_hint,
            sql_data.as_ref(),
            &[&train, &val],
        )?;
        let optimizer_server;
        let (optimizer, optimizer_url) = match external {
            Some(m) => {
                let url = m.base_url().to_string();
                optimizer_server = None;
                (m, url)
            }
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .context("binding the built-in optimizer's port")?;
                let local = listener.local_addr().context("reading the bound address")?;
                let router = started_engine.router();
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    axum::serve(listener, router)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await
                });
                optimizer_server = Some((stop, task));
                let m = OpenAiTextModel::new(&format!("http://{local}/v1"), None, timeout)
                    .map_err(anyhow::Error::msg)?;
                m.check(&[config.gradient_model.as_str(), config.edit_model.as_str()])
                    .await
                    .map_err(anyhow::Error::msg)?;
                (m, "builtin".to_string())
            }
        };
        let run_id = format!(
            "agl-apo-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        );
        let judge = |f: &agl_train::FinishedRollout| Judged::shaped(f, &reward);
        let evaluator = StoreEvaluator {
            store: &store,
            runners: pool.as_ref(),
            plan: BatchPlan {
                resources_id: String::new(),
                llm_resource: any.llm_resource.clone(),
                endpoint: endpoint.clone(),
                model: base_name.clone(),
                temperature: 0.0,
                max_tokens: args.max_tokens,
                seed: Some(shared.seed),
                mode: RolloutMode::Train,
                workers: shared.workers,
                config: Some(any::rollout_config(&any)),
            },
            template_resource: apo.template_resource.clone(),
            judge: &judge,
            messages: TraceToMessages::new(triplets),
        };
        let stop = CancellationToken::new();
        let on_interrupt = stop.clone();
        let watcher = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: stopping the search; the best prompt so far is kept");
                on_interrupt.cancel();
            }
        });
        let search = Apo {
            config: config.clone(),
            version_prefix: run_id,
            seed_template: seed_text.clone(),
            train: &train,
            val: &val,
            evaluator: &evaluator,
            optimizer: &optimizer,
            prompts: &prompts,
            stop,
        };
        let write = |report: &ApoReport| -> anyhow::Result<()> {
            let best = report.best_candidate();
            crate::out::files::write_file(&best_file, best.template.as_bytes(), None)?;
            if let Some(path) = &shared.report {
                let full = ApoRunReport {
                    algorithm: "apo",
                    governance: mode,
                    policy: &shared.policy,
                    model: &args.model,
                    runner: any.runner.label(),
                    template_resource: &apo.template_resource,
                    optimizer: OptimizerInfo {
                        base_url: &optimizer_url,
                        gradient_model: &config.gradient_model,
                        edit_model: &config.edit_model,
                    },
                    data: ApoData {
                        train_dataset: train_path.display().to_string(),
                        train_tasks: train.len(),
                        val_dataset: val_path.display().to_string(),
                        val_tasks: val.len(),
                    },
                    best_prompt_file: best_file.display().to_string(),
                    search: report,
                    kernel: kernel.stats(),
                    reward: reward.stats(),
                    peak_rss_bytes: crate::out::rss::peak_rss_bytes(),
                    seconds: started.elapsed().as_secs_f64(),
                };
                let json = serde_json::to_vec_pretty(&full).context("serialising the report")?;
                crate::out::files::write_file(path, &json, Some("--report"))?;
            }
            Ok(())
        };
        let mut printer = Printer::new(&config, val.len(), &write);
        let report = search.run(&mut printer).await;
        printer.bar.finish_and_clear();
        watcher.abort();
        if let Some((stop, task)) = optimizer_server {
            let _ = stop.send(());
            let _ = task.await;
        }
        server.shutdown().await?;
        let report = report?;
        // The last write: the report's final seconds, and a failed write surfaces here.
        write(&report)?;
        if let Some(e) = printer.write_error {
            eprintln!("warning: an earlier write failed: {e:#}");
        }
        Ok::<_, anyhow::Error>(report)
    });
    started_engine.engine.shutdown();
    let report = result?;
    print_rounds(&report);
    let best = report.best_candidate();
    println!(
        "best prompt: {} (validation score {}), written to {}",
        best.version,
        report
            .best_score
            .map_or("not scored".into(), |s| format!("{s:.3}")),
        best_file.display()
    );
    println!(
        "optimizer tokens: {} prompt + {} completion; children skipped: {}; wall time {:.1} s{}",
        report.optimizer_tokens.prompt,
        report.optimizer_tokens.completion,
        report.skips.total(),
        started.elapsed().as_secs_f64(),
        if report.interrupted {
            " (interrupted)"
        } else {
            ""
        }
    );
    if let Some(path) = &shared.report {
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &shared.plot {
        let svg = crate::out::plot::apo_scores(&report)?;
        crate::out::files::write_file(path, svg.as_bytes(), Some("--plot"))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(if report.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// The search's observer: a bar per round, a line per child and per round, the files.
struct Printer<'a> {
    bar: ProgressBar,
    config: &'a ApoConfig,
    val_tasks: usize,
    write: &'a (dyn Fn(&ApoReport) -> anyhow::Result<()> + Send + Sync),
    write_error: Option<anyhow::Error>,
}

impl<'a> Printer<'a> {
    fn new(
        config: &'a ApoConfig,
        val_tasks: usize,
        write: &'a (dyn Fn(&ApoReport) -> anyhow::Result<()> + Send + Sync),
    ) -> Self {
        let first = if config.run_initial_validation {
            progress_bar("seed", val_tasks as u64, 5)
        } else {
            progress_bar("round 1", Self::round_rollouts(config, val_tasks), 5)
        };
        Self {
            bar: first,
            config,
            val_tasks,
            write,
            write_error: None,
        }
    }

    /// At most the rollouts of one round: the critiques' training batches, the beam and the
    /// children on the validation batch, the leader on the whole validation set.
    fn round_rollouts(c: &ApoConfig, val_tasks: usize) -> u64 {
        let children = c.beam_width * c.branch_factor;
        (children * c.gradient_batch_size
            + (c.beam_width + children) * c.val_batch_size.min(val_tasks)
            + val_tasks) as u64
    }
}

impl ApoObserver for Printer<'_> {
    fn rollouts_done(&mut self, _mode: RolloutMode, n: usize) {
        self.bar.inc(n as u64);
    }

    fn child(&mut self, round: usize, child: Option<&CandidateRecord>, _skip: Option<&str>) {
        // A skip is logged (WARN) by the search itself.
        if let Some(c) = child {
            let line = format!(
                "round {round}: {} from {} ({} + {} optimizer tokens)",
                short(&c.version),
                c.parent.as_deref().map_or("-", short),
                c.optimizer_tokens.prompt,
                c.optimizer_tokens.completion
            );
            if self.bar.is_hidden() {
                eprintln!("{line}");
            } else {
                self.bar.println(line);
            }
        }
    }

    fn round_finished(&mut self, report: &ApoReport) {
        self.bar.finish_and_clear();
        match report.rounds.last() {
            None => eprintln!(
                "seed {}: validation score {} on {} tasks",
                report.candidates[0].version,
                report.best_score.map_or("-".into(), |s| format!("{s:.3}")),
                self.val_tasks
            ),
            Some(r) => eprintln!(
                "round {}/{}: {} children, {} skipped; leader {} {:.3} on {} validation tasks; \
                 best {} {}; {:.0} s",
                r.round,
                self.config.beam_rounds,
                r.children.len(),
                r.skips.total(),
                r.beam.first().map_or("-", String::as_str),
                r.leader_score,
                self.val_tasks,
                r.best,
                r.best_score.map_or("-".into(), |s| format!("{s:.3}")),
                r.seconds
            ),
        }
        if let Err(e) = (self.write)(report) {
            eprintln!("warning: {e:#}");
            self.write_error = Some(e);
        }
        let next = report.rounds.len() + 1;
        if next <= self.config.beam_rounds {
            self.bar = progress_bar(
                &format!("round {next}"),
                Self::round_rollouts(self.config, self.val_tasks),
                5,
            );
        }
    }
}

/// The table of rounds.
fn print_rounds(report: &ApoReport) {
    let seed = &report.candidates[0];
    println!(
        "\n{:>5}  {:>8}  {:>7}  {:>8}  {:>6}  {:>8}  best",
        "round", "children", "skipped", "leader", "score", "seconds"
    );
    if let Some(s) = seed.val_full.first() {
        println!(
            "{:>5}  {:>8}  {:>7}  {:>8}  {:>6.3}  {:>8}  {}",
            0,
            "-",
            "-",
            short(&seed.version),
            s.score,
            "-",
            short(&seed.version)
        );
    }
    for r in &report.rounds {
        println!(
            "{:>5}  {:>8}  {:>7}  {:>8}  {:>6.3}  {:>8.0}  {}",
            r.round,
            r.children.len(),
            r.skips.total(),
            short(r.beam.first().map_or("-", String::as_str)),
            r.leader_score,
            r.seconds,
            short(&r.best)
        );
    }
}

/// `v3` of `<run>-v3`.
fn short(version: &str) -> &str {
    version.rsplit('-').next().unwrap_or(version)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(seed: SeedTemplate) -> ApoArgs {
        ApoArgs {
            seed,
            template_resource: "prompt_template".into(),
            base_url: None,
            api_key: None,
            gradient_model: None,
            edit_model: None,
            config: ApoConfig::default(),
            critique_prompts: Vec::new(),
            edit_prompts: Vec::new(),
            weights: Weights::Q8,
        }
    }

    #[test]
    fn the_seed_template_is_checked_before_anything_runs() {
        let sql = RunnerSpec::Sql;
        let t = seed_template(&args(SeedTemplate::Default), &sql).unwrap();
        assert_eq!(t, agl_spider::prompts::WRITE_USER_TEMPLATE);
        let e = seed_template(&args(SeedTemplate::Default), &RunnerSpec::None).unwrap_err();
        assert!(e.to_string().contains("--prompt-template FILE"), "{e}");
        let e = seed_template(&args(SeedTemplate::Text("Q: {question!r}".into())), &sql)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--prompt-template-text: ") && e.contains("column"),
            "{e}"
        );
        let e = seed_template(&args(SeedTemplate::Text("{question} {db}".into())), &sql)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the template has {db}"), "{e}");
        let other = seed_template(&args(SeedTemplate::Text("{db}".into())), &RunnerSpec::None);
        assert!(other.is_ok());
        let missing = PathBuf::from("/nonexistent/t.txt");
        let e = seed_template(&args(SeedTemplate::File(missing)), &sql).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent/t.txt"), "{e:#}");
    }

    #[test]
    fn a_round_is_bounded_and_versions_print_short() {
        let c = ApoConfig::default();
        // 16 children × 4 + 20 candidates × 16 + 30
        assert_eq!(Printer::round_rollouts(&c, 30), 64 + 320 + 30);
        assert_eq!(short("agl-apo-1-2-v12"), "v12");
    }
}
