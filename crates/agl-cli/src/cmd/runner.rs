//! `agl runner --store-url URL --workers N`: a runner process that serves a remote `agl
//! store`'s rollouts, with the built-in Spider task or, with `--exec 'COMMAND'`, with any
//! program.
//!
//! Without `--exec` the process needs only the store URL and the Spider data: what to run
//! comes from each rollout's resources, where `agl train` publishes its [`RunSpec`]
//! (governance mode, policy, reward shaping, candidate settings). The runner prepares the task
//! once per distinct spec, builds the kernels, and runs `N` workers (dequeue → governance
//! check → execute → spans → attempt status) until SIGTERM or Ctrl-C. Worker ids are
//! `Worker-<pid>-<i>`.
//!
//! With `--exec 'COMMAND'` no Spider data is read: `N` exec workers ([`agl_train::exec_runner`],
//! ids `Exec-<pid>-<i>`) run `sh -c COMMAND` once per rollout, in a process group of its own,
//! with the task as JSON on stdin, the LLM resource's per-attempt endpoint in
//! `OPENAI_BASE_URL`, and the reward read from the last stdout line `{"reward": r}`;
//! `--timeout` bounds each rollout (the process group is killed, status `timeout`). The
//! command also gets `AGL_STORE_URL` (the first `--store-url`) and, when a token is given,
//! `AGL_STORE_TOKEN`. SIGTERM or Ctrl-C kills the running commands' process groups, fails
//! their attempts (the store retries them as their config says) and stops the process; so does
//! losing the store for good (exit status 1 when every worker stopped on an error).
//!
//! A runner that dies mid-rollout leaves its attempt without heartbeat; with the
//! `unresponsive_seconds` that `agl train` sets on remote rollouts, the store marks it
//! `unresponsive` and requeues the rollout for another runner.
//!
//! Responsible for the command line and the wiring; not for the runner loops
//! (`agl_spider`, `agl_train`) or the HTTP client ([`crate::remote`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agl_core::AttemptedRollout;
use agl_gov::{FlightRecorder, PolicyFile};
use agl_spider::{
    Assignment, RunSpec, RunnerResolver, SpiderRunner, SpiderTask, TaskConfig, WorkerOptions,
    run_worker,
};
use agl_spider::{ExecutorConfig, SpiderDataset, SpiderError};
use agl_store::LightningStore;
use agl_train::TrainingMode;
#[cfg(unix)]
use agl_train::{CancellationToken, ExecConfig, ExecReport, ExecRunners, WhenIdle};
use anyhow::Context;
use clap::Args;

/// Arguments of `agl runner`.
#[derive(Debug, Args)]
pub struct RunnerArgs {
    /// The store server, e.g. http://127.0.0.1:4747 (`agl store`), or several servers of one
    /// PostgreSQL store separated by commas (the next takes over when one stops answering).
    #[arg(long, value_name = "URL")]
    store_url: String,
    /// Worker threads in this process.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Spider data directory [default: as `agl train`].
    #[arg(long, value_name = "DIR", conflicts_with = "exec")]
    data: Option<PathBuf>,
    /// Serve every rollout by running `sh -c CMD` (an agent in any language) instead of the
    /// built-in Spider task: the task JSON on stdin, the LLM endpoint in OPENAI_BASE_URL, the
    /// reward as the last stdout line {"reward": R} (docs/training.md, "Any agent").
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// With --exec: seconds one rollout may run before its process group is killed (status
    /// `timeout`).
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    timeout: f64,
    /// With --exec: the LLM resource given to the command [default: `main_llm`, else the first
    /// `llm`/`proxy_llm` resource].
    #[arg(long, value_name = "NAME", requires = "exec")]
    llm_resource: Option<String>,
    #[command(flatten)]
    token: crate::args::store::TokenArg,
    /// Record this process's governance checks in a flight-recorder database.
    #[arg(long, value_name = "FILE.db", conflicts_with = "exec")]
    audit_log: Option<PathBuf>,
    /// Longest sleep between two polls of an empty queue, milliseconds.
    #[arg(long, default_value_t = 50)]
    max_idle_ms: u64,
    /// How long to wait for the store server to answer its health check, seconds.
    #[arg(long, default_value_t = 30.0)]
    connect_timeout: f64,
}

/// Serves rollouts by the [`RunSpec`] of their resources.
struct ResourceRunners {
    data: PathBuf,
    threads: usize,
    recorder: Option<Arc<FlightRecorder>>,
    dataset: Mutex<Option<Arc<SpiderDataset>>>,
    tasks: Mutex<HashMap<String, Arc<SpiderTask>>>,
    /// Runners per spec JSON.
    runners: Mutex<HashMap<String, RunnerPair>>,
}

/// The runner of a spec's `train` rollouts and the (enforcing) runner of the others.
type RunnerPair = (Arc<SpiderRunner>, Arc<SpiderRunner>);

fn runner_error(rollout: &AttemptedRollout, message: String) -> SpiderError {
    SpiderError::Rollout {
        rollout_id: rollout.rollout.rollout_id.clone(),
        message,
    }
}

impl ResourceRunners {
    fn task(&self, spec: &RunSpec) -> Result<Arc<SpiderTask>, SpiderError> {
        let key = spec.task_key();
        let mut tasks = self.tasks.lock().map_err(|_| poisoned())?;
        if let Some(t) = tasks.get(&key) {
            return Ok(t.clone());
        }
        let dataset = {
            let mut slot = self.dataset.lock().map_err(|_| poisoned())?;
            match &*slot {
                Some(d) => d.clone(),
                None => {
                    let d = Arc::new(SpiderDataset::load(&self.data)?);
                    *slot = Some(d.clone());
                    d
                }
            }
        };
        let config = TaskConfig {
            candidates: spec.candidates,
            limit: spec.limit,
            dev_limit: spec.dev_limit,
            threads: self.threads,
            executor: ExecutorConfig {
                timeout: Duration::from_secs_f64(spec.sql_timeout_seconds.max(0.001)),
            },
        };
        let started = Instant::now();
        let task = Arc::new(SpiderTask::prepare(&dataset, &config)?);
        eprintln!(
            "agl runner: prepared the task ({} train, {} dev questions) in {:.1} s",
            task.train.len(),
            task.dev.len(),
            started.elapsed().as_secs_f64()
        );
        tasks.insert(key, task.clone());
        Ok(task)
    }
}

fn poisoned() -> SpiderError {
    SpiderError::Worker("a runner lock was poisoned by a panicking worker".into())
}

impl RunnerResolver for ResourceRunners {
    fn resolve(
        &self,
        handle: &tokio::runtime::Handle,
        store: &dyn LightningStore,
        rollout: &AttemptedRollout,
    ) -> Result<Assignment, SpiderError> {
        let Some(rid) = rollout.rollout.resources_id.as_deref() else {
            return Err(runner_error(
                rollout,
                "the rollout names no resources; `agl runner` serves rollouts enqueued by \
                 `agl train`, which publishes its run spec as resources"
                    .into(),
            ));
        };
        // Fetched for every rollout: ids such as `policy-v1` are reused by later runs with
        // another spec, so a cache by id could serve a rollout with the wrong kernel.
        let update = handle
            .block_on(store.get_resources_by_id(rid))?
            .ok_or_else(|| runner_error(rollout, format!("resources `{rid}` do not exist")))?;
        let spec = RunSpec::from_resources(&update)?.ok_or_else(|| {
            runner_error(
                rollout,
                format!("resources `{rid}` carry no `agl.run` spec (not published by `agl train`)"),
            )
        })?;
        let task = self.task(&spec)?;
        let key = serde_json::to_string(&spec).unwrap_or_default();
        let (train, eval) = {
            let mut runners = self.runners.lock().map_err(|_| poisoned())?;
            match runners.get(&key) {
                Some(pair) => pair.clone(),
                None => {
                    let policy = PolicyFile::resolve(&spec.policy)?;
                    let runner = |mode: TrainingMode| -> Result<Arc<SpiderRunner>, SpiderError> {
                        let k = agl_spider::build_kernel(
                            &task,
                            &policy,
                            mode.kernel_mode(),
                            self.recorder.clone(),
                        )?;
                        Ok(Arc::new(SpiderRunner::new(
                            Arc::new(k),
                            mode,
                            spec.reward.clone(),
                        )?))
                    };
                    let pair = (runner(spec.governance)?, runner(TrainingMode::Enforce)?);
                    runners.insert(key, pair.clone());
                    pair
                }
            }
        };
        Ok(Assignment::by_mode(rollout, &train, &eval, task))
    }
}

/// Runs `agl runner`.
pub fn run(args: RunnerArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.workers >= 1, "--workers must be at least 1");
    anyhow::ensure!(
        args.connect_timeout.is_finite() && args.connect_timeout >= 0.0,
        "--connect-timeout must be a non-negative number of seconds"
    );
    if args.exec.is_some() {
        return run_exec(args);
    }
    let data = crate::args::data::data_dir(args.data.clone());
    anyhow::ensure!(
        data.is_dir(),
        "data directory {} does not exist (pass --data DIR)",
        data.display()
    );
    let recorder = match &args.audit_log {
        Some(p) => Some(crate::kernel::open_recorder(p)?),
        None => None,
    };
    let (rt, store) = connect(&args)?;
    let resolver: Arc<dyn RunnerResolver> = Arc::new(ResourceRunners {
        data,
        threads: args.workers,
        recorder: recorder.clone(),
        dataset: Mutex::new(None),
        tasks: Mutex::new(HashMap::new()),
        runners: Mutex::new(HashMap::new()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let options = WorkerOptions {
        max_idle: Duration::from_millis(args.max_idle_ms.max(1)),
    };
    let pid = std::process::id();
    let done = rt.block_on(async {
        let workers: Vec<_> = (0..args.workers)
            .map(|i| {
                let (h, s, r, st) = (
                    tokio::runtime::Handle::current(),
                    store.clone(),
                    resolver.clone(),
                    stop.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    run_worker(h, s, r, format!("Worker-{pid}-{i}"), st, options)
                })
            })
            .collect();
        let signals = agl_server::server::ShutdownSignals::install();
        println!(
            "agl runner {pid}: {} workers serving {}",
            args.workers, args.store_url
        );
        signals.recv().await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        let mut done = 0u64;
        for w in workers {
            match w.await {
                Ok(Ok(n)) => done += n,
                Ok(Err(e)) => eprintln!("agl runner {pid}: a worker stopped: {e}"),
                Err(e) => eprintln!("agl runner {pid}: a worker panicked: {e}"),
            }
        }
        done
    });
    if let Some(r) = &recorder {
        r.flush()?;
    }
    eprintln!("agl runner {pid}: stopped after {done} rollouts");
    Ok(ExitCode::SUCCESS)
}

/// The exec workers' settings from the command line.
#[cfg(unix)]
fn exec_config(args: &RunnerArgs) -> anyhow::Result<ExecConfig> {
    let command = args.exec.clone().unwrap_or_default();
    anyhow::ensure!(
        !command.trim().is_empty(),
        "--exec: the command is empty; give the shell command that runs one rollout, e.g. --exec 'python agent.py'"
    );
    anyhow::ensure!(
        args.timeout.is_finite() && args.timeout > 0.0,
        "--timeout must be a positive number of seconds (got {})",
        args.timeout
    );
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .map_err(|_| anyhow::anyhow!("--timeout {} is too large", args.timeout))?;
    if let Some(name) = &args.llm_resource {
        anyhow::ensure!(
            !name.is_empty(),
            "--llm-resource: empty; name the resource or leave the flag out"
        );
    }
    let store_url = args
        .store_url
        .split(',')
        .map(str::trim)
        .find(|u| !u.is_empty())
        .map(str::to_string);
    let env = match args.token.auth_token.as_deref() {
        Some(t) if !t.is_empty() => vec![("AGL_STORE_TOKEN".to_string(), t.to_string())],
        _ => Vec::new(),
    };
    let config = ExecConfig {
        command,
        timeout,
        llm_resource: args.llm_resource.clone(),
        store_url,
        env,
    };
    config.validate()?;
    Ok(config)
}

/// The runtime of a runner process and its store, once the server answers its health check
/// (within `--connect-timeout`).
fn connect(
    args: &RunnerArgs,
) -> anyhow::Result<(tokio::runtime::Runtime, Arc<dyn LightningStore>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client = crate::remote::client(&args.store_url, args.token.auth_token.clone())?;
    rt.block_on(crate::remote::wait_for_server(
        &client,
        Duration::from_secs_f64(args.connect_timeout),
    ))?;
    Ok((rt, Arc::new(client)))
}

/// Runs `agl runner --exec CMD`: exec workers until SIGTERM/Ctrl-C or until every worker
/// stopped on an error.
#[cfg(unix)]
fn run_exec(args: RunnerArgs) -> anyhow::Result<ExitCode> {
    let config = exec_config(&args)?;
    let (rt, store) = connect(&args)?;
    let pid = std::process::id();
    let (report, errors) = rt.block_on(async {
        let stop = CancellationToken::new();
        let signals = agl_server::server::ShutdownSignals::install();
        let mut workers: tokio::task::JoinSet<_> = ExecRunners::new(config)
            .spawn_workers(
                &store,
                args.workers,
                &stop,
                WhenIdle::Poll {
                    max_sleep: Duration::from_millis(args.max_idle_ms.max(1)),
                },
            )
            .into_iter()
            .collect();
        println!(
            "agl runner {pid}: {} exec workers serving {}",
            args.workers, args.store_url
        );
        let mut report = ExecReport::default();
        let mut errors = 0usize;
        let mut record = |r: Result<Result<Result<ExecReport, _>, _>, _>| match r {
            Ok(Ok(Ok(r))) => {
                report.rewarded += r.rewarded;
                report.no_reward += r.no_reward;
                report.failed += r.failed;
                report.timed_out += r.timed_out;
            }
            Ok(Ok(Err(e))) => {
                errors += 1;
                eprintln!("agl runner {pid}: a worker stopped: {e}");
            }
            Ok(Err(e)) | Err(e) => {
                errors += 1;
                eprintln!("agl runner {pid}: a worker panicked: {e}");
            }
        };
        let signal = signals.recv();
        tokio::pin!(signal);
        loop {
            tokio::select! {
                _ = &mut signal => break,
                next = workers.join_next() => match next {
                    Some(r) => record(r),
                    None => break,
                },
            }
        }
        // Kills the running commands' process groups and fails their attempts.
        stop.cancel();
        while let Some(r) = workers.join_next().await {
            record(r);
        }
        (report, errors)
    });
    eprintln!(
        "agl runner {pid}: stopped after {} rollouts ({} rewarded, {} without reward, {} failed, {} timed out)",
        report.total(),
        report.rewarded,
        report.no_reward,
        report.failed,
        report.timed_out
    );
    Ok(if errors > 0 && errors >= args.workers {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `--exec` needs process groups.
#[cfg(not(unix))]
fn run_exec(_args: RunnerArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("--exec needs a Unix system (it runs each rollout in a process group)")
}
