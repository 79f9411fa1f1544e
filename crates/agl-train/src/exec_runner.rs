//! Exec runners: serve a LightningStore's queue by running a shell command per rollout, so an
//! agent written in any language is trained without changing its code (Agent Lightning's
//! "train ANY agent with ZERO code modification").
//!
//! [`ExecRunners`] is a [`RunnerPool`] (workers `Exec-<pid>-<i>`, one tokio task each);
//! [`run_exec_worker`] is one worker loop over any [`LightningStore`], returning when the queue
//! is empty ([`WhenIdle::Return`], as a batch needs) or polling it until a stop token fires
//! ([`WhenIdle::Poll`], as `agl runner --exec` does).
//!
//! # One rollout
//! 1. Dequeue an attempt; fetch the rollout's resources (`resources_id`, else the store's
//!    latest); mark the attempt `running`.
//! 2. Start `sh -c COMMAND` in a process group of its own, with the rollout's `input` as one
//!    line of JSON on stdin (then stdin is closed) and the environment below added to this
//!    process's.
//! 3. While it runs, heartbeat the attempt (`last_heartbeat_time`, what the store's
//!    `unresponsive_seconds` watchdog reads) and the worker, every third of the rollout's
//!    `unresponsive_seconds` (between 0.2 s and 5 s; 5 s when it has none).
//! 4. When the command exits, whatever it left running in its process group is killed. The
//!    attempt's status and metadata are then written (below). The worker never re-runs a
//!    rollout: retries are the store's (the rollout's `max_attempts` and `retry_condition`).
//!
//! # Environment
//! | name | value |
//! |---|---|
//! | `OPENAI_BASE_URL`, `OPENAI_API_BASE` | the LLM resource's base URL: for a `proxy_llm`, the per-attempt gateway URL ([`LlmResource::base_url_for_attempt`], `<endpoint>/rollout/{rid}/attempt/{aid}/v1`); for an `llm`, its endpoint |
//! | `OPENAI_API_KEY` | the resource's `api_key`, else `agl` (clients refuse an empty key) |
//! | `OPENAI_MODEL` | the resource's `model` |
//! | `AGL_ROLLOUT_ID`, `AGL_ATTEMPT_ID` | the rollout and attempt ids |
//! | `AGL_ROLLOUT_MODE` | `train`, `val` or `test` (absent when the rollout has no mode) |
//! | `AGL_RESOURCES` | the rollout's resources as JSON, the wire shape `{"main_llm": {"resource_type": "proxy_llm", "endpoint": …, "model": …, …}}` (`{}` when it has none) |
//! | `AGL_STORE_URL` | [`ExecConfig::store_url`] (absent when `None`) |
//! | extra | [`ExecConfig::env`], set last (they win) |
//!
//! The LLM resource is [`ExecConfig::llm_resource`] when set (a rollout whose resources have
//! no `llm`/`proxy_llm` of that name fails), else `main_llm` when it is one, else the first
//! `llm`/`proxy_llm` by name. With no LLM resource the four `OPENAI_*` variables are removed
//! from the command's environment (not inherited from this process), so a rollout never talks
//! to a model it was not given; likewise `AGL_STORE_URL` when unknown.
//!
//! # stdout, stderr and the reward
//! stdout is read to the end; its last 1 MiB ([`STDOUT_KEEP_BYTES`]) is kept. The reward is
//! the **last non-empty line** when it is a JSON object with a numeric `"reward"`, e.g.
//! `{"reward": 0.75, "answer": "…"}` (the object is stored as the attempt's `output`). A bare
//! number is **not** a reward: a program that ends by printing a count must not be rewarded
//! with it by accident. stderr's last 64 KiB ([`STDERR_TAIL_BYTES`]) is kept.
//!
//! # Outcomes (Agent Lightning's attempt statuses)
//! | outcome | status | metadata besides the common keys |
//! |---|---|---|
//! | exit 0, reward line | `succeeded`, one `agentlightning.annotation` reward span (`agentlightning.reward.0.name = "primary"`, `.0.value = r`) | `reward`, `reward_source: "stdout"`, `output` |
//! | exit 0, no reward line, the program wrote reward spans itself | `succeeded` | `reward` (the last one, [`semconv::find_final_reward`]), `reward_source: "spans"` |
//! | exit 0, no reward at all | `succeeded` | `reward: null`, `no_reward: true` (a trainer leaves it out of the update and counts it) |
//! | non-zero exit or killed by a signal | `failed` | `error` |
//! | still running after [`ExecConfig::timeout`] | `timeout` (the whole process group got `SIGKILL`) | `error` |
//! | the command cannot be started | `failed` | `error` |
//! | the worker is stopped mid-rollout | `failed` (the process group got `SIGKILL`) | `error`, `cancelled: true` |
//! | the rollout's named LLM resource is missing | `failed` | `error` |
//!
//! Common keys: `exit_code` (int or null), `signal` (int or null), `seconds` (wall time of the
//! command, float), `reward` (float or null), `stderr_tail` (string), `stderr_bytes` (all bytes
//! written to stderr), `stdout_last_line` (at most 1 KiB of it), `worker_id`.
//!
//! Responsible for running the command and reporting its attempt; not for what the command
//! does, the LLM gateway behind the endpoint, or training on the result (the caller reads
//! the spans). Unix only (process groups).

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agl_core::{
    AttemptStatus, AttemptedRollout, LlmResource, NamedResources, Resource, Span, now_seconds,
    semconv,
};
use agl_store::{AttemptUpdate, LightningStore, StoreError};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::rollout_batch::{DEFAULT_LLM_RESOURCE, RunnerPool};
use crate::{CancellationToken, IterReport, TrainError};

/// Bytes of stderr kept on the attempt (`stderr_tail`): the last 64 KiB.
pub const STDERR_TAIL_BYTES: usize = 64 * 1024;
/// Bytes of stdout kept to find the reward line: the last 1 MiB.
pub const STDOUT_KEEP_BYTES: usize = 1024 * 1024;
/// Bytes of the last stdout line stored as `stdout_last_line`.
const LAST_LINE_BYTES: usize = 1024;
/// The per-rollout timeout of [`ExecConfig::new`], seconds.
pub const DEFAULT_EXEC_TIMEOUT_SECONDS: u64 = 600;
/// `OPENAI_API_KEY` when the LLM resource has no key (OpenAI clients refuse an empty one).
pub const PLACEHOLDER_API_KEY: &str = "agl";
/// The variables describing the LLM resource; removed when a rollout has none.
const LLM_VARS: [&str; 4] = [
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
];
/// How long the stdout/stderr readers may still run after the process group is gone (a
/// process that left the group may hold the pipes open).
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Consecutive store failures after which a worker gives up (about 30 s of back-off).
const STORE_FAILURE_LIMIT: u32 = 40;

/// What an exec worker runs and how (see the module docs for the contract).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    /// The command, run as `sh -c COMMAND`; must not be blank.
    pub command: String,
    /// Wall-clock limit per rollout; must be above zero. Past it the process group is killed
    /// and the attempt is `timeout`.
    pub timeout: Duration,
    /// The LLM resource to expose; `None`: `main_llm` when it is an `llm`/`proxy_llm`, else
    /// the first one by name.
    pub llm_resource: Option<String>,
    /// The store's URL, given to the command as `AGL_STORE_URL` (so it can write its own
    /// spans); `None`: the variable is absent.
    pub store_url: Option<String>,
    /// Extra environment variables, set after agl's own (they win).
    pub env: Vec<(String, String)>,
}

impl ExecConfig {
    /// `command` with the default timeout ([`DEFAULT_EXEC_TIMEOUT_SECONDS`]), the default LLM
    /// resource, no store URL and no extra variables.
    pub fn new(command: impl Into<String>) -> Self {
        ExecConfig {
            command: command.into(),
            timeout: Duration::from_secs(DEFAULT_EXEC_TIMEOUT_SECONDS),
            llm_resource: None,
            store_url: None,
            env: Vec::new(),
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the field: a blank command, a zero timeout, an empty
    /// `llm_resource`, or an extra variable whose name is empty or contains `=` or NUL.
    pub fn validate(&self) -> Result<(), TrainError> {
        if self.command.trim().is_empty() {
            return Err(TrainError::Config(
                "exec command: empty; give the shell command that runs one rollout".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(TrainError::Config(
                "exec timeout: must be above zero seconds".into(),
            ));
        }
        if self.llm_resource.as_deref().is_some_and(str::is_empty) {
            return Err(TrainError::Config(
                "exec llm_resource: empty; name a resource or leave it unset".into(),
            ));
        }
        for (k, _) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(TrainError::Config(format!(
                    "exec env: `{k}` is not a variable name"
                )));
            }
        }
        Ok(())
    }
}

/// What an exec worker does when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenIdle {
    /// Return (a batch: every rollout was enqueued before the workers started).
    Return,
    /// Sleep and poll again, 1 ms doubling up to `max_sleep` while the queue stays empty,
    /// until the stop token fires (a long-lived runner process).
    Poll {
        /// Longest sleep between two empty dequeues.
        max_sleep: Duration,
    },
}

/// What one exec worker did (counts of attempts it reported, by outcome).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecReport {
    /// `succeeded` with a reward (from the stdout line or the program's own spans).
    pub rewarded: u64,
    /// `succeeded` without any reward (`no_reward: true`).
    pub no_reward: u64,
    /// `failed`: non-zero exit, signal, spawn error, missing LLM resource or stopped.
    pub failed: u64,
    /// `timeout`: killed after [`ExecConfig::timeout`].
    pub timed_out: u64,
}

impl ExecReport {
    /// Attempts reported, whatever their status.
    pub fn total(&self) -> u64 {
        self.rewarded + self.no_reward + self.failed + self.timed_out
    }
}

impl From<ExecReport> for IterReport {
    /// `rollouts`: every attempt reported; `unsuccessful`: those not `succeeded`;
    /// `violations` and `malformed`: 0 (the command's input is never parsed here).
    fn from(r: ExecReport) -> IterReport {
        IterReport {
            rollouts: r.total(),
            violations: 0,
            unsuccessful: r.failed + r.timed_out,
            malformed: 0,
        }
    }
}

/// Exec workers in this process (see the module docs); worker ids `Exec-<pid>-<i>`.
#[derive(Debug, Clone)]
pub struct ExecRunners {
    config: Arc<ExecConfig>,
}

impl ExecRunners {
    /// Workers running `config`'s command. The config is checked when a worker starts (an
    /// invalid one makes every worker return [`TrainError::Config`]); call
    /// [`ExecConfig::validate`] first for an early error.
    pub fn new(config: ExecConfig) -> Self {
        ExecRunners {
            config: Arc::new(config),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ExecConfig {
        &self.config
    }

    /// Starts `count` workers serving `store` until `stop` fires (or the queue is empty with
    /// [`WhenIdle::Return`]), as tokio tasks.
    pub fn spawn_workers(
        &self,
        store: &Arc<dyn LightningStore>,
        count: usize,
        stop: &CancellationToken,
        when_idle: WhenIdle,
    ) -> Vec<JoinHandle<Result<ExecReport, TrainError>>> {
        self.workers(store, count, stop, when_idle, |r| r)
    }

    fn workers<T: Send + 'static>(
        &self,
        store: &Arc<dyn LightningStore>,
        count: usize,
        stop: &CancellationToken,
        when_idle: WhenIdle,
        report: fn(ExecReport) -> T,
    ) -> Vec<JoinHandle<Result<T, TrainError>>> {
        let pid = std::process::id();
        (0..count)
            .map(|i| {
                let (config, store, stop) = (self.config.clone(), store.clone(), stop.clone());
                let id = format!("Exec-{pid}-{i}");
                tokio::spawn(async move {
                    run_exec_worker(config, store, id, stop, when_idle)
                        .await
                        .map(report)
                })
            })
            .collect()
    }
}

impl RunnerPool for ExecRunners {
    fn spawn(
        &self,
        store: &Arc<dyn LightningStore>,
        count: usize,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<Result<IterReport, TrainError>>> {
        self.workers(store, count, stop, WhenIdle::Return, IterReport::from)
    }
}

/// One exec worker: dequeues rollouts as `worker_id` and runs each (module docs) until `stop`
/// fires or, with [`WhenIdle::Return`], the queue has nothing to dispatch. A stop while a
/// command runs kills its process group and fails its attempt.
///
/// A store error is logged and retried with a back-off (doubling up to 1 s); the attempt of
/// a rollout whose report could not be written is left to the store's watchdog.
///
/// # Errors
/// [`TrainError::Config`] for an invalid config (before dequeuing anything);
/// [`TrainError::Store`] when the store is closed or failed 40 times in a row.
pub async fn run_exec_worker(
    config: Arc<ExecConfig>,
    store: Arc<dyn LightningStore>,
    worker_id: String,
    stop: CancellationToken,
    when_idle: WhenIdle,
) -> Result<ExecReport, TrainError> {
    config.validate()?;
    let mut report = ExecReport::default();
    let mut idle = Duration::from_millis(1);
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        let step = async {
            let Some(attempted) = store.dequeue_rollout(Some(&worker_id)).await? else {
                return Ok(None);
            };
            run_one(&config, store.as_ref(), &worker_id, &attempted, &stop)
                .await
                .map(Some)
        };
        match step.await {
            Ok(Some(outcome)) => {
                failures = 0;
                idle = Duration::from_millis(1);
                match outcome {
                    Outcome::Rewarded => report.rewarded += 1,
                    Outcome::NoReward => report.no_reward += 1,
                    Outcome::Failed => report.failed += 1,
                    Outcome::TimedOut => report.timed_out += 1,
                }
            }
            Ok(None) => {
                failures = 0;
                let WhenIdle::Poll { max_sleep } = when_idle else {
                    break;
                };
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(idle) => {}
                }
                idle = (idle * 2).min(max_sleep.max(Duration::from_millis(1)));
            }
            Err(e) => {
                failures += 1;
                if matches!(e, StoreError::Closed) || failures >= STORE_FAILURE_LIMIT {
                    return Err(e.into());
                }
                tracing::warn!(worker_id = %worker_id, error = %e, "exec runner: store error, retrying");
                let backoff =
                    Duration::from_millis(25u64 << failures.min(6)).min(Duration::from_secs(1));
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
    Ok(report)
}

/// How a reported attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Rewarded,
    NoReward,
    Failed,
    TimedOut,
}

/// Runs one dequeued attempt and reports it; store errors are returned.
async fn run_one(
    config: &ExecConfig,
    store: &dyn LightningStore,
    worker_id: &str,
    attempted: &AttemptedRollout,
    stop: &CancellationToken,
) -> Result<Outcome, StoreError> {
    let rid = attempted.rollout.rollout_id.as_str();
    let aid = attempted.attempt.attempt_id.as_str();
    let resources = match &attempted.rollout.resources_id {
        Some(id) => {
            let found = store.get_resources_by_id(id).await?;
            if found.is_none() {
                tracing::warn!(rollout_id = %rid, resources_id = %id, "the rollout's resources do not exist; the command gets none");
            }
            found
        }
        None => store.get_latest_resources().await?,
    }
    .map(|r| r.resources)
    .unwrap_or_default();
    store
        .update_attempt(
            rid,
            aid,
            AttemptUpdate {
                status: Some(AttemptStatus::Running),
                last_heartbeat_time: Some(now_seconds()),
                ..AttemptUpdate::default()
            },
        )
        .await?;
    let mut meta = Map::new();
    meta.insert("worker_id".into(), json!(worker_id));
    let env = match command_env(config, attempted, &resources) {
        Ok(env) => env,
        Err(message) => {
            meta.insert("error".into(), json!(message));
            return finish(
                store,
                rid,
                aid,
                AttemptStatus::Failed,
                meta,
                Outcome::Failed,
            )
            .await;
        }
    };
    let mut input = serde_json::to_vec(&attempted.rollout.input).unwrap_or_default();
    input.push(b'\n');
    let heartbeat = heartbeat_interval(attempted.rollout.config.unresponsive_seconds);
    let beat = || async {
        let update = AttemptUpdate {
            last_heartbeat_time: Some(now_seconds()),
            ..AttemptUpdate::default()
        };
        if let Err(e) = store.update_attempt(rid, aid, update).await {
            tracing::warn!(rollout_id = %rid, error = %e, "exec runner: attempt heartbeat failed");
        }
        if let Err(e) = store.update_worker(worker_id, None).await {
            tracing::warn!(worker_id = %worker_id, error = %e, "exec runner: worker heartbeat failed");
        }
    };
    let run = run_command(config, env, input, heartbeat, beat, stop).await;

    meta.insert("seconds".into(), json!(run.seconds));
    let (code, signal) = match &run.ended {
        Ended::Exited(s) => (s.code(), s.signal()),
        _ => (None, None),
    };
    meta.insert("exit_code".into(), json!(code));
    meta.insert("signal".into(), json!(signal));
    meta.insert("stderr_tail".into(), json!(run.stderr.text()));
    meta.insert("stderr_bytes".into(), json!(run.stderr.total));
    let last_line = last_line(&run.stdout.text());
    meta.insert(
        "stdout_last_line".into(),
        json!(truncate(&last_line, LAST_LINE_BYTES)),
    );
    meta.insert("reward".into(), Value::Null);
    let (status, outcome) = match run.ended {
        Ended::Exited(s) if s.success() => {
            if let Some((reward, output)) = parse_reward_line(&last_line) {
                let seq = store.get_next_span_sequence_id(rid, aid).await?;
                let span = Span::new(
                    rid,
                    aid,
                    seq,
                    semconv::AGL_ANNOTATION,
                    semconv::reward_attributes(&[("primary", reward)]),
                );
                store.add_span(span).await?;
                meta.insert("reward".into(), json!(reward));
                meta.insert("reward_source".into(), json!("stdout"));
                meta.insert("output".into(), output);
                (AttemptStatus::Succeeded, Outcome::Rewarded)
            } else {
                let spans = store.list_spans(rid, Some(aid)).await?;
                match semconv::find_final_reward(&spans) {
                    Some(reward) => {
                        meta.insert("reward".into(), json!(reward));
                        meta.insert("reward_source".into(), json!("spans"));
                        (AttemptStatus::Succeeded, Outcome::Rewarded)
                    }
                    None => {
                        meta.insert("no_reward".into(), json!(true));
                        (AttemptStatus::Succeeded, Outcome::NoReward)
                    }
                }
            }
        }
        Ended::Exited(s) => {
            let error = match (s.code(), s.signal()) {
                (Some(c), _) => format!("the command exited with code {c}"),
                (None, Some(sig)) => format!("the command was killed by signal {sig}"),
                (None, None) => format!("the command ended with {s}"),
            };
            meta.insert("error".into(), json!(error));
            (AttemptStatus::Failed, Outcome::Failed)
        }
        Ended::TimedOut => {
            meta.insert(
                "error".into(),
                json!(format!(
                    "the command ran past its timeout of {} s; its process group was killed",
                    config.timeout.as_secs_f64()
                )),
            );
            (AttemptStatus::Timeout, Outcome::TimedOut)
        }
        Ended::Stopped => {
            meta.insert(
                "error".into(),
                json!("the runner stopped while the command ran; its process group was killed"),
            );
            meta.insert("cancelled".into(), json!(true));
            (AttemptStatus::Failed, Outcome::Failed)
        }
        Ended::Error(message) => {
            meta.insert("error".into(), json!(message));
            (AttemptStatus::Failed, Outcome::Failed)
        }
    };
    finish(store, rid, aid, status, meta, outcome).await
}

/// Writes the attempt's final status and metadata.
async fn finish(
    store: &dyn LightningStore,
    rid: &str,
    aid: &str,
    status: AttemptStatus,
    meta: Map<String, Value>,
    outcome: Outcome,
) -> Result<Outcome, StoreError> {
    let update = AttemptUpdate {
        status: Some(status),
        metadata: Some(Value::Object(meta)),
        ..AttemptUpdate::default()
    };
    match store.update_attempt(rid, aid, update).await {
        Ok(_) => Ok(outcome),
        // The store finished the attempt in the meantime (e.g. its own `timeout_seconds`
        // watchdog, then a late report it refuses): the store's verdict stands.
        Err(e @ StoreError::InvalidTransition { .. }) => {
            tracing::warn!(rollout_id = %rid, attempt_id = %aid, error = %e, "exec runner: the store refused the attempt's report");
            Ok(outcome)
        }
        Err(e) => Err(e),
    }
}

/// The heartbeat period: a third of `unresponsive_seconds`, within 0.2 s – 5 s.
fn heartbeat_interval(unresponsive_seconds: Option<f64>) -> Duration {
    let seconds = match unresponsive_seconds {
        Some(u) if u.is_finite() && u > 0.0 => (u / 3.0).clamp(0.2, 5.0),
        _ => 5.0,
    };
    Duration::from_secs_f64(seconds)
}

/// The LLM resource a rollout's command gets (module docs), or why there is none when one was
/// named.
fn pick_llm<'a>(
    resources: &'a NamedResources,
    named: Option<&str>,
) -> Result<Option<(&'a str, &'a Resource, &'a LlmResource)>, String> {
    let as_llm = |(name, r): (&'a String, &'a Resource)| match r {
        Resource::Llm(l) | Resource::ProxyLlm(l) => Some((name.as_str(), r, l)),
        Resource::PromptTemplate(_) => None,
    };
    match named {
        Some(n) => resources
            .get_key_value(n)
            .and_then(as_llm)
            .map(Some)
            .ok_or_else(|| {
                format!("the rollout's resources have no `llm`/`proxy_llm` resource named `{n}`")
            }),
        None => Ok(resources
            .get_key_value(DEFAULT_LLM_RESOURCE)
            .and_then(as_llm)
            .or_else(|| resources.iter().find_map(as_llm))),
    }
}

/// Variables to set (`Some`) or remove (`None`) for one attempt's command, in order.
type EnvPlan = Vec<(String, Option<String>)>;

fn command_env(
    config: &ExecConfig,
    attempted: &AttemptedRollout,
    resources: &NamedResources,
) -> Result<EnvPlan, String> {
    let rid = &attempted.rollout.rollout_id;
    let aid = &attempted.attempt.attempt_id;
    let mut env: EnvPlan = Vec::new();
    let mut set = |k: &str, v: Option<String>| env.push((k.to_string(), v));
    match pick_llm(resources, config.llm_resource.as_deref())? {
        Some((_, resource, llm)) => {
            let url = match resource {
                Resource::ProxyLlm(_) => llm.base_url_for_attempt(rid, aid),
                _ => llm.endpoint.clone(),
            };
            set("OPENAI_BASE_URL", Some(url.clone()));
            set("OPENAI_API_BASE", Some(url));
            let key = llm.api_key.clone().filter(|k| !k.is_empty());
            set(
                "OPENAI_API_KEY",
                Some(key.unwrap_or_else(|| PLACEHOLDER_API_KEY.into())),
            );
            set("OPENAI_MODEL", Some(llm.model.clone()));
        }
        None => LLM_VARS.iter().for_each(|k| set(k, None)),
    }
    set("AGL_ROLLOUT_ID", Some(rid.clone()));
    set("AGL_ATTEMPT_ID", Some(aid.clone()));
    set(
        "AGL_ROLLOUT_MODE",
        attempted.rollout.mode.map(|m| m.as_str().to_string()),
    );
    let json = serde_json::to_string(resources).unwrap_or_else(|_| "{}".into());
    set("AGL_RESOURCES", Some(json));
    set("AGL_STORE_URL", config.store_url.clone());
    for (k, v) in &config.env {
        set(k, Some(v.clone()));
    }
    Ok(env)
}

/// The last bytes of a stream, and how many it had in all.
#[derive(Debug, Default)]
struct TailBuf {
    cap: usize,
    buf: VecDeque<u8>,
    total: u64,
}

impl TailBuf {
    fn new(cap: usize) -> Self {
        TailBuf {
            cap,
            buf: VecDeque::new(),
            total: 0,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let chunk = &chunk[chunk.len().saturating_sub(self.cap)..];
        self.buf.extend(chunk);
        let excess = self.buf.len().saturating_sub(self.cap);
        self.buf.drain(..excess);
    }

    /// The kept bytes as text (invalid UTF-8, e.g. a character cut at the start, is
    /// replaced).
    fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Reads `stream` to its end into a shared tail buffer (shared so that what was read is kept
/// even when the reader is abandoned).
fn read_tail(
    mut stream: impl AsyncRead + Unpin + Send + 'static,
    tail: Arc<Mutex<TailBuf>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut t) = tail.lock() {
                        t.push(&chunk[..n]);
                    }
                }
            }
        }
    })
}

fn take(tail: &Arc<Mutex<TailBuf>>) -> TailBuf {
    match tail.lock() {
        Ok(mut t) => std::mem::take(&mut *t),
        Err(_) => TailBuf::default(),
    }
}

/// How the command's run ended.
#[derive(Debug)]
enum Ended {
    Exited(ExitStatus),
    TimedOut,
    Stopped,
    /// Could not be started or waited for.
    Error(String),
}

#[derive(Debug)]
struct Run {
    ended: Ended,
    seconds: f64,
    stdout: TailBuf,
    stderr: TailBuf,
}

/// Kills process group `pgid` with `SIGKILL` (an empty or gone group is fine).
fn kill_group(pgid: i32) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Kills the process group when dropped (the run's future abandoned, e.g. its task aborted).
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Runs `sh -c COMMAND` (module docs) and calls `beat` every `heartbeat` while it runs.
async fn run_command<F, Fut>(
    config: &ExecConfig,
    env: EnvPlan,
    input: Vec<u8>,
    heartbeat: Duration,
    beat: F,
    stop: &CancellationToken,
) -> Run
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    let stdout = Arc::new(Mutex::new(TailBuf::new(STDOUT_KEEP_BYTES)));
    let stderr = Arc::new(Mutex::new(TailBuf::new(STDERR_TAIL_BYTES)));
    let done = |ended: Ended| Run {
        ended,
        seconds: started.elapsed().as_secs_f64(),
        stdout: take(&stdout),
        stderr: take(&stderr),
    };
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(&config.command)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return done(Ended::Error(format!(
                "cannot start `sh -c {}`: {e}",
                config.command
            )));
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let guard = GroupGuard(pgid);
    // A command that does not read its stdin must not block the run: the writer is a task of
    // its own, and a closed pipe is not an error.
    let writer = child.stdin.take().map(|mut w| {
        tokio::spawn(async move {
            let _ = w.write_all(&input).await;
            let _ = w.shutdown().await;
        })
    });
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(read_tail(out, stdout.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(read_tail(err, stderr.clone()));
    }
    let deadline = tokio::time::Instant::now()
        .checked_add(config.timeout)
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86_400));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = loop {
        tokio::select! {
            status = child.wait() => break match status {
                Ok(s) => Ended::Exited(s),
                Err(e) => Ended::Error(format!("waiting for the command failed: {e}")),
            },
            _ = tokio::time::sleep_until(deadline) => break Ended::TimedOut,
            _ = stop.cancelled() => break Ended::Stopped,
            _ = ticks.tick() => beat().await,
        }
    };
    // Whatever is left of the group goes: on a timeout or stop the command itself, after an
    // exit what it left behind (which would otherwise hold the pipes open).
    drop(guard);
    if !matches!(ended, Ended::Exited(_)) {
        let _ = child.wait().await;
    }
    if let Some(w) = writer {
        w.abort();
    }
    let drained = async {
        for r in &mut readers {
            let _ = r.await;
        }
    };
    if tokio::time::timeout(DRAIN_GRACE, drained).await.is_err() {
        readers.iter().for_each(JoinHandle::abort);
    }
    done(ended)
}

/// The last non-empty line of `text`, trimmed.
fn last_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The reward of a stdout line: a JSON object with a numeric `"reward"` → the reward and the
/// object. Anything else (a bare number included) is no reward.
pub fn parse_reward_line(line: &str) -> Option<(f64, Value)> {
    let value: Value = serde_json::from_str(line.trim()).ok()?;
    let reward = value.as_object()?.get("reward")?.as_f64()?;
    reward.is_finite().then_some((reward, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchPlan, FinishedRollout, run_batch};
    use agl_core::{EnqueueRolloutRequest, RolloutConfig, RolloutMode};
    use agl_store::InMemoryLightningStore;

    fn plan(workers: usize) -> BatchPlan {
        BatchPlan {
            resources_id: "exec-v0".into(),
            llm_resource: DEFAULT_LLM_RESOURCE.into(),
            endpoint: "http://127.0.0.1:9/v1".into(),
            model: "policy-v3".into(),
            temperature: 0.7,
            max_tokens: 16,
            seed: None,
            mode: RolloutMode::Train,
            workers,
            config: None,
        }
    }

    fn config(command: &str) -> ExecConfig {
        ExecConfig {
            timeout: Duration::from_secs(20),
            ..ExecConfig::new(command)
        }
    }

    /// Serves `tasks` through a batch (published `proxy_llm` resources) with exec workers.
    async fn batch(config: ExecConfig, tasks: &[Value], workers: usize) -> Vec<FinishedRollout> {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let pool = ExecRunners::new(config);
        let (finished, _) = run_batch(&store, &pool, &plan(workers), tasks, |_, _| {})
            .await
            .unwrap();
        finished
    }

    fn meta(f: &FinishedRollout) -> &Map<String, Value> {
        f.attempt.as_ref().unwrap().metadata.as_ref().unwrap()
    }

    fn status(f: &FinishedRollout) -> AttemptStatus {
        f.attempt.as_ref().unwrap().status
    }

    /// Whether process `pid` is gone (or a zombie waiting for its new parent to reap it).
    fn dead(pid: i32) -> bool {
        if nix::sys::signal::kill(Pid::from_raw(pid), None).is_err() {
            return true;
        }
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    }

    #[tokio::test]
    async fn the_last_stdout_line_is_the_reward_and_becomes_a_reward_span() {
        // The reward is computed from the task on stdin; the rollout id comes from the env.
        let cmd = r#"read -r task; echo "thinking..."; n=$(printf '%s' "$task" | tr -cd 0-9); echo "{\"reward\": $n, \"rid\": \"$AGL_ROLLOUT_ID\"}"; echo"#;
        let finished = batch(config(cmd), &[json!({"x": 7}), json!({"x": 42})], 2).await;
        for (f, want) in finished.iter().zip([7.0, 42.0]) {
            assert_eq!(status(f), AttemptStatus::Succeeded, "{:?}", meta(f));
            let m = meta(f);
            assert_eq!(m["reward"], json!(want));
            assert_eq!(m["reward_source"], json!("stdout"));
            assert_eq!(m["exit_code"], json!(0));
            assert_eq!(m["output"]["rid"], json!(f.rollout_id));
            assert!(m["worker_id"].as_str().unwrap().starts_with("Exec-"));
            assert_eq!(f.spans.len(), 1);
            assert_eq!(f.spans[0].name, semconv::AGL_ANNOTATION);
            assert_eq!(semconv::find_final_reward(&f.spans), Some(want));
            assert_eq!(
                semconv::get_rewards_from_span(&f.spans[0]).unwrap()[0].name,
                "primary"
            );
        }
    }

    #[tokio::test]
    async fn the_command_sees_the_task_on_stdin_and_the_env_contract() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let cmd = format!(
            r#"cat > "{d}/stdin"; for v in OPENAI_BASE_URL OPENAI_API_BASE OPENAI_API_KEY OPENAI_MODEL AGL_ROLLOUT_ID AGL_ATTEMPT_ID AGL_ROLLOUT_MODE AGL_RESOURCES AGL_STORE_URL EXTRA; do printenv $v > "{d}/$v" || echo ABSENT > "{d}/$v"; done"#
        );
        let config = ExecConfig {
            store_url: Some("http://store.test:4747".into()),
            env: vec![("EXTRA".into(), "yes".into())],
            ..config(&cmd)
        };
        let task = json!({"question": "how many?", "db": "x"});
        let finished = batch(config, std::slice::from_ref(&task), 1).await;
        let f = &finished[0];
        let aid = &f.attempt.as_ref().unwrap().attempt_id;
        let var = |k: &str| {
            std::fs::read_to_string(dir.path().join(k))
                .unwrap()
                .trim_end()
                .to_string()
        };
        let stdin = std::fs::read_to_string(dir.path().join("stdin")).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&stdin).unwrap(), task);
        assert!(stdin.ends_with('\n'));
        let url = format!(
            "http://127.0.0.1:9/rollout/{}/attempt/{aid}/v1",
            f.rollout_id
        );
        assert_eq!(var("OPENAI_BASE_URL"), url);
        assert_eq!(var("OPENAI_API_BASE"), url);
        assert_eq!(var("OPENAI_API_KEY"), PLACEHOLDER_API_KEY);
        assert_eq!(var("OPENAI_MODEL"), "policy-v3");
        assert_eq!(var("AGL_ROLLOUT_ID"), f.rollout_id);
        assert_eq!(&var("AGL_ATTEMPT_ID"), aid);
        assert_eq!(var("AGL_ROLLOUT_MODE"), "train");
        assert_eq!(var("AGL_STORE_URL"), "http://store.test:4747");
        assert_eq!(var("EXTRA"), "yes");
        let resources: Value = serde_json::from_str(&var("AGL_RESOURCES")).unwrap();
        assert_eq!(resources["main_llm"]["resource_type"], json!("proxy_llm"));
        assert_eq!(
            resources["main_llm"]["endpoint"],
            json!("http://127.0.0.1:9/v1")
        );
        assert_eq!(resources["main_llm"]["model"], json!("policy-v3"));
        // No reward line: succeeded, reported as unrewarded.
        assert_eq!(status(f), AttemptStatus::Succeeded);
        assert_eq!(meta(f)["no_reward"], json!(true));
        assert_eq!(meta(f)["reward"], Value::Null);
        assert!(f.spans.is_empty());
    }

    #[tokio::test]
    async fn without_an_llm_resource_the_openai_variables_are_absent() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
            .await
            .unwrap();
        let cmd = r#"for v in OPENAI_BASE_URL OPENAI_API_BASE OPENAI_API_KEY OPENAI_MODEL AGL_STORE_URL AGL_ROLLOUT_MODE; do printenv $v && exit 1; done; printf '%s\n' "$AGL_RESOURCES" '{"reward": 1}'"#;
        let report = run_exec_worker(
            Arc::new(config(cmd)),
            store.clone(),
            "w".into(),
            CancellationToken::new(),
            WhenIdle::Return,
        )
        .await
        .unwrap();
        assert_eq!(report.rewarded, 1, "{report:?}");
        let a = store
            .get_latest_attempt(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.status, AttemptStatus::Succeeded);
        assert_eq!(a.metadata.unwrap()["reward"], json!(1.0));

        // A named LLM resource that the rollout lacks fails the attempt.
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(2)))
            .await
            .unwrap();
        let named = ExecConfig {
            llm_resource: Some("judge".into()),
            ..config("echo '{\"reward\": 1}'")
        };
        let report = run_exec_worker(
            Arc::new(named),
            store.clone(),
            "w".into(),
            CancellationToken::new(),
            WhenIdle::Return,
        )
        .await
        .unwrap();
        assert_eq!(report.failed, 1);
        let a = store
            .get_latest_attempt(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.status, AttemptStatus::Failed);
        let error = a.metadata.unwrap()["error"].as_str().unwrap().to_string();
        assert!(error.contains("`judge`"), "{error}");
    }

    #[tokio::test]
    async fn a_non_zero_exit_fails_the_attempt_with_its_code_and_stderr() {
        let cmd = r#"echo '{"reward": 1}'; echo "no database" >&2; exit 3"#;
        let finished = batch(config(cmd), &[json!(1)], 1).await;
        let f = &finished[0];
        assert_eq!(status(f), AttemptStatus::Failed);
        let m = meta(f);
        assert_eq!(m["exit_code"], json!(3));
        assert_eq!(m["signal"], Value::Null);
        assert_eq!(m["reward"], Value::Null);
        assert_eq!(m["stderr_tail"], json!("no database\n"));
        assert!(m["error"].as_str().unwrap().contains("code 3"));
        assert!(f.spans.is_empty(), "a failed command writes no reward span");
    }

    #[tokio::test]
    async fn a_command_killed_by_a_signal_fails_with_the_signal() {
        let finished = batch(config("kill -TERM $$"), &[json!(1)], 1).await;
        let m = meta(&finished[0]);
        assert_eq!(status(&finished[0]), AttemptStatus::Failed);
        assert_eq!(m["exit_code"], Value::Null);
        assert_eq!(m["signal"], json!(15));
    }

    #[tokio::test]
    async fn a_hung_command_times_out_and_its_whole_process_group_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let cmd = format!(r#"sleep 30 & echo $! > "{}"; wait"#, pidfile.display());
        let config = ExecConfig {
            timeout: Duration::from_secs(1),
            ..ExecConfig::new(cmd)
        };
        let started = Instant::now();
        let finished = batch(config, &[json!(1)], 1).await;
        assert!(started.elapsed() < Duration::from_secs(25));
        let f = &finished[0];
        assert_eq!(status(f), AttemptStatus::Timeout);
        assert!(meta(f)["error"].as_str().unwrap().contains("timeout"));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut gone = false;
        for _ in 0..100 {
            if dead(pid) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            gone,
            "the background `sleep 30` ({pid}) outlived the timeout"
        );
    }

    #[tokio::test]
    async fn no_reward_line_is_succeeded_with_no_reward_and_a_bare_number_is_not_a_reward() {
        let finished = batch(config("echo hello; echo 0.5"), &[json!(1)], 1).await;
        let f = &finished[0];
        assert_eq!(status(f), AttemptStatus::Succeeded);
        let m = meta(f);
        assert_eq!(m["no_reward"], json!(true));
        assert_eq!(m["reward"], Value::Null);
        assert_eq!(m["stdout_last_line"], json!("0.5"));
        assert!(f.spans.is_empty());
    }

    #[tokio::test]
    async fn the_programs_own_reward_span_counts_when_it_prints_none() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        // Waits until the "program" (the test, standing in for it) has written its span.
        let cmd = format!(
            r#"i=0; while [ ! -f "{}" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"#,
            go.display()
        );
        let worker = tokio::spawn(run_exec_worker(
            Arc::new(config(&cmd)),
            store.clone(),
            "w".into(),
            CancellationToken::new(),
            WhenIdle::Return,
        ));
        let aid = loop {
            match store.get_latest_attempt(&r.rollout_id).await.unwrap() {
                Some(a) if a.status == AttemptStatus::Running => break a.attempt_id,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let seq = store
            .get_next_span_sequence_id(&r.rollout_id, &aid)
            .await
            .unwrap();
        let attrs = semconv::reward_attributes(&[("primary", 0.25)]);
        store
            .add_span(Span::new(
                &r.rollout_id,
                &aid,
                seq,
                semconv::AGL_ANNOTATION,
                attrs,
            ))
            .await
            .unwrap();
        std::fs::write(&go, "").unwrap();
        let report = worker.await.unwrap().unwrap();
        assert_eq!(report.rewarded, 1);
        let a = store
            .get_latest_attempt(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.status, AttemptStatus::Succeeded);
        let m = a.metadata.unwrap();
        assert_eq!(m["reward"], json!(0.25));
        assert_eq!(m["reward_source"], json!("spans"));
        assert!(m.get("no_reward").is_none());
        // The runner wrote no second reward span.
        assert_eq!(
            store
                .list_spans(&r.rollout_id, Some(&aid))
                .await
                .unwrap()
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn the_stderr_tail_is_capped_at_64_kib() {
        let cmd =
            r#"head -c 204800 /dev/zero | tr '\0' a >&2; printf END >&2; echo '{"reward": 0}'"#;
        let finished = batch(config(cmd), &[json!(1)], 1).await;
        let f = &finished[0];
        assert_eq!(status(f), AttemptStatus::Succeeded);
        let m = meta(f);
        let tail = m["stderr_tail"].as_str().unwrap();
        assert_eq!(tail.len(), STDERR_TAIL_BYTES);
        assert!(tail.ends_with("aaaEND"));
        assert_eq!(m["stderr_bytes"], json!(204_803));
        assert_eq!(m["reward"], json!(0.0));
    }

    #[tokio::test]
    async fn workers_run_their_commands_concurrently() {
        // Each command waits (up to 10 s) until both rollouts' commands have started: with
        // one command at a time the first would never see the second and print no reward.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let cmd = format!(
            r#"touch "{d}/$AGL_ROLLOUT_ID"; i=0; while [ $(ls "{d}" | wc -l) -lt 2 ]; do [ $i -ge 200 ] && exit 0; sleep 0.05; i=$((i+1)); done; echo '{{"reward": 1}}'"#
        );
        let finished = batch(config(&cmd), &[json!(1), json!(2)], 2).await;
        let mut workers = std::collections::HashSet::new();
        for f in &finished {
            assert_eq!(meta(f)["reward"], json!(1.0), "{:?}", meta(f));
            workers.insert(meta(f)["worker_id"].as_str().unwrap().to_string());
        }
        assert_eq!(workers.len(), 2);
    }

    #[tokio::test]
    async fn heartbeats_keep_a_long_attempt_alive() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let mut request = EnqueueRolloutRequest::new(json!(1));
        request.config = Some(RolloutConfig {
            unresponsive_seconds: Some(0.6),
            ..RolloutConfig::default()
        });
        let r = store.enqueue_rollout(request).await.unwrap();
        run_exec_worker(
            Arc::new(config("sleep 1.5; echo '{\"reward\": 1}'")),
            store.clone(),
            "w".into(),
            CancellationToken::new(),
            WhenIdle::Return,
        )
        .await
        .unwrap();
        let a = store
            .get_latest_attempt(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.status, AttemptStatus::Succeeded);
        // Heartbeats every 0.2 s: the last one came well after the start.
        assert!(
            a.last_heartbeat_time.unwrap() - a.start_time >= 1.0,
            "{a:?}"
        );
        let rollout = store
            .get_rollout_by_id(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rollout.status, agl_core::RolloutStatus::Succeeded);
        assert_eq!(store.list_attempts(&r.rollout_id).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_stop_kills_the_running_command_and_fails_its_attempt() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let worker = tokio::spawn(run_exec_worker(
            Arc::new(config("sleep 30")),
            store.clone(),
            "w".into(),
            stop.clone(),
            WhenIdle::Poll {
                max_sleep: Duration::from_millis(20),
            },
        ));
        loop {
            match store.get_latest_attempt(&r.rollout_id).await.unwrap() {
                Some(a) if a.status == AttemptStatus::Running => break,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let started = Instant::now();
        stop.cancel();
        let report = worker.await.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(report.failed, 1);
        let a = store
            .get_latest_attempt(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.status, AttemptStatus::Failed);
        assert_eq!(a.metadata.unwrap()["cancelled"], json!(true));
    }

    #[tokio::test]
    async fn an_idle_polling_worker_serves_rollouts_enqueued_later_until_stopped() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let stop = CancellationToken::new();
        let pool = ExecRunners::new(config("echo '{\"reward\": 0.5}'"));
        let workers = pool.spawn_workers(
            &store,
            1,
            &stop,
            WhenIdle::Poll {
                max_sleep: Duration::from_millis(20),
            },
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
            .await
            .unwrap();
        let done = store
            .wait_for_rollouts(
                std::slice::from_ref(&r.rollout_id),
                Some(Duration::from_secs(20)),
            )
            .await
            .unwrap();
        assert_eq!(done.len(), 1);
        stop.cancel();
        for w in workers {
            assert_eq!(w.await.unwrap().unwrap().rewarded, 1);
        }
    }

    #[test]
    fn bad_configs_are_refused_with_the_field_named() {
        let e = ExecConfig::new("  ").validate().unwrap_err().to_string();
        assert!(e.contains("command"), "{e}");
        let zero = ExecConfig {
            timeout: Duration::ZERO,
            ..ExecConfig::new("true")
        };
        assert!(zero.validate().unwrap_err().to_string().contains("timeout"));
        let env = ExecConfig {
            env: vec![("A=B".into(), "x".into())],
            ..ExecConfig::new("true")
        };
        assert!(env.validate().is_err());
        assert!(ExecConfig::new("true").validate().is_ok());
    }

    #[test]
    fn reward_lines() {
        assert_eq!(
            parse_reward_line(r#"{"reward": 1}"#).map(|r| r.0),
            Some(1.0)
        );
        assert_eq!(
            parse_reward_line(r#" {"reward": -0.5, "x": [1]} "#).map(|r| r.0),
            Some(-0.5)
        );
        assert!(parse_reward_line("0.5").is_none());
        assert!(parse_reward_line(r#"{"reward": "1"}"#).is_none());
        assert!(parse_reward_line(r#"{"reward": null}"#).is_none());
        assert!(parse_reward_line(r#"{"score": 1}"#).is_none());
        assert!(parse_reward_line("reward: 1").is_none());
        assert_eq!(last_line("a\n{\"reward\": 2}\n\n  \n"), "{\"reward\": 2}");
    }

    #[test]
    fn the_tail_buffer_keeps_the_last_bytes() {
        let mut t = TailBuf::new(4);
        t.push(b"ab");
        t.push(b"cdef");
        assert_eq!(t.text(), "cdef");
        t.push(b"0123456789");
        assert_eq!(t.text(), "6789");
        assert_eq!(t.total, 16);
    }

    #[test]
    fn the_heartbeat_follows_unresponsive_seconds() {
        assert_eq!(heartbeat_interval(None), Duration::from_secs(5));
        assert_eq!(heartbeat_interval(Some(3.0)), Duration::from_secs(1));
        assert_eq!(heartbeat_interval(Some(0.1)), Duration::from_millis(200));
        assert_eq!(heartbeat_interval(Some(600.0)), Duration::from_secs(5));
    }
}
