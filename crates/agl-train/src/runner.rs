//! `GovernedRunner`: runs an [`Agent`] on tasks with every action checked by the governance
//! kernel, and reports [`GovernedRollout`]s.
//!
//! The seed API of agentmesh-lightning 5.0.0 (`GovernedRunner`, spec "Agent Lightning
//! Fast-Path 1.0" §3, §13, §14), in Rust:
//! - construction: [`GovernedRunner::new`] with a kernel, then [`fail_on_violation`]
//!   (default false), [`log_violations`] (default true: one `WARN` event per violation through
//!   `tracing`, message `Policy violation: <policy> - <description> (severity=<s>,
//!   blocked=<b>)`) and an optional [`violation_callback`];
//! - lifecycle: [`init`] (the agent), [`init_worker`] (worker id and LightningStore),
//!   [`teardown_worker`], [`teardown`] (logs the totals at `INFO`);
//! - [`step`] runs one task and returns its rollout; [`iter`] serves a store's queue;
//! - [`stats`] (`total_rollouts`, `total_violations`, `violation_rate`) summed over every
//!   worker of the store, [`local_stats`] for this runner alone.
//!
//! # How governance reaches the agent
//! The agent receives a [`StepContext`] and asks it to [`StepContext::check`] each action
//! before running it. The kernel returns its verdict for that action, so a step's violations
//! are the ones its own checks produced: concurrent steps cannot mix them, whatever threads
//! they run on (Python binds ambient callbacks to context variables and loses violations
//! reported from another thread, reference D7). A blocked action returns
//! [`TrainError::Blocked`] (carrying the [`PolicyViolationError`]) and never runs.
//!
//! # Deliberate differences from Python
//! - there is no ungoverned fallback: a runner always has a kernel, and `step` before `init`
//!   is an error (Python silently runs the agent without governance, or fails every step and
//!   rewards it with the clean bonus);
//! - a step with a blocked action is never a success (`success == false`), whether or not the
//!   agent recovered; with `fail_on_violation` the first block also refuses every later action
//!   of the step ([`TrainError::Aborted`]) and drops the output. No exception is raised inside
//!   the kernel;
//! - every check is recorded in a flight recorder: the kernel's, or, when the kernel has none,
//!   an in-memory one the runner owns ([`GovernedRunner::recorder`]); audit is always on
//!   (spec §1.4, which the Python code does not do);
//! - `mode` is recorded on the rollout and given to the agent ([`StepContext::mode`]);
//! - `iter` works with a real LightningStore: dequeue → step → spans → `update_attempt`, and
//!   stops when the queue is empty or the stop token is cancelled (Python calls
//!   `get_task`/`submit_rollout`, which no LightningStore has, and ends at once);
//! - statistics are shared through the store (each worker publishes its counters in its
//!   heartbeat), as the tutorial (§7.6) promises and the Python code does not do.
//!
//! # Resources and LLM endpoints
//! [`GovernedRunner::iter`] fetches the resources each rollout names (`resources_id`; the
//! store's latest resources when it names none) and hands them to the agent:
//! [`StepContext::resources`], and [`StepContext::llm_base_url`] for the base URL, model and
//! sampling parameters of an `llm` or `proxy_llm` resource. A `proxy_llm` endpoint is rewritten
//! for the attempt ([`LlmResource::base_url_for_attempt`]: `<endpoint>/rollout/{rid}/attempt/
//! {aid}/v1`), so the LLM gateway knows which rollout each model call belongs to, as Agent
//! Lightning's `ProxyLLM.get_base_url` does.
//!
//! # Agent Lightning's instrumentation
//! [`StepContext`] has Agent Lightning's emitters ([`crate::instrument`]):
//! [`StepContext::emit_reward`] / [`StepContext::emit_rewards`], [`StepContext::emit_message`],
//! [`StepContext::emit_object`], [`StepContext::emit_exception`], and operations
//! ([`StepContext::start_operation`] … [`StepContext::end_operation`]) whose `agent.name` lets a
//! triplet adapter's `agent_match` select the LLM calls made inside them. Like
//! [`StepContext::annotate`], they are stored by [`GovernedRunner::iter`]. Without a
//! [`PolicyReward`] the agent's last emitted reward is the rollout's reward; with one, the
//! shaped reward is (it is stored last).
//!
//! # Violations of the model's output (the LLM gateway)
//! The gateway (`agl_server::gateway`) checks every model answer with the kernel and writes each
//! violation as an `agentlightning.annotation` span of the attempt with
//! `agent_os.violation.policy`, `.severity`, `.reason`, `.blocked` (and `.effect`, optional
//! `.penalty`) and `agl.source = "gateway"`. When a step ran for a store attempt, the runner
//! reads those spans after the agent returns and adds one [`PolicyViolation`] per span to the
//! step's violations ([`gateway_violations`]): type `blocked` when `.blocked` is true,
//! `modified` when `.effect` is `modify`, else `warned`; severity parsed case-insensitively (an
//! unknown severity counts as [`agl_gov::FAIL_CLOSED_SEVERITY`]). So a rollout's penalty
//! ([`PolicyReward`]), its violation count, the governance annotation span, the attempt's
//! metadata and the runner's statistics include what the model said, not only what the agent
//! did. A blocked answer makes the step unsuccessful, like a blocked action. Only spans stored
//! by the time the agent returns are read (the gateway stores them before it answers).
//!
//! [`fail_on_violation`]: GovernedRunner::fail_on_violation
//! [`log_violations`]: GovernedRunner::log_violations
//! [`violation_callback`]: GovernedRunner::violation_callback
//! [`init`]: GovernedRunner::init
//! [`init_worker`]: GovernedRunner::init_worker
//! [`teardown_worker`]: GovernedRunner::teardown_worker
//! [`teardown`]: GovernedRunner::teardown
//! [`step`]: GovernedRunner::step
//! [`iter`]: GovernedRunner::iter
//! [`stats`]: GovernedRunner::stats
//! [`local_stats`]: GovernedRunner::local_stats

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use agl_core::{
    AttemptStatus, AttributeValue, Attributes, LlmResource, NamedResources, Resource, RolloutMode,
    Span, semconv,
};
use agl_gov::{Action, Decision, FlightRecorder, Kernel, Severity, Signal, Verdict};
use agl_store::{AttemptUpdate, LightningStore, SpanQuery};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
/// The stop token of [`GovernedRunner::iter`] (re-exported so callers need not depend on
/// `tokio-util`).
pub use tokio_util::sync::CancellationToken;

use crate::error::TrainError;
use crate::reward::PolicyReward;
use crate::violation::{
    GovernedRollout, PolicyViolation, PolicyViolationError, PolicyViolationType,
};

/// The error type an agent returns: any error (`?` converts [`TrainError`], I/O, SQL, …).
pub type AgentError = Box<dyn std::error::Error + Send + Sync>;

/// A callback told about every violation as the kernel reports it.
pub type ViolationCallback = Arc<dyn Fn(&PolicyViolation) + Send + Sync>;

/// The key under which a runner publishes its counters in its worker's `heartbeat_stats`.
pub const HEARTBEAT_KEY: &str = semconv::agl::GOVERNANCE;

pub use agl_core::semconv::{SOURCE_ATTR, SOURCE_GATEWAY};

/// An OpenAI-compatible endpoint an agent should call, from an `llm` or `proxy_llm` resource
/// ([`StepContext::llm_base_url`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LlmEndpoint {
    /// The resource's name in the resources set.
    pub name: String,
    /// Base URL of the OpenAI-compatible API (ends in `/v1` when the resource's endpoint does);
    /// for `proxy_llm`, already rewritten for the step's rollout and attempt.
    pub base_url: String,
    /// The model (or adapter) name to send as `model`.
    pub model: String,
    /// The API key, if the resource has one.
    pub api_key: Option<String>,
    /// The resource's sampling parameters (`temperature`, `top_p`, `max_tokens`, `seed`, …), not
    /// interpreted here.
    pub sampling_parameters: serde_json::Map<String, Value>,
    /// Whether the resource is a `proxy_llm` (calls go through the LLM gateway).
    pub proxied: bool,
}

/// An agent: given a task input, does the task, asking the [`StepContext`] to check every
/// action before running it.
#[async_trait::async_trait]
pub trait Agent: Send + Sync {
    /// The task input (for [`GovernedRunner::iter`], the rollout's `input` JSON).
    type Input: Send + Sync;
    /// What the agent returns.
    type Output: Send;

    /// Does the task. Return the error of a blocked check (with `?`) when the task cannot be
    /// done without that action.
    async fn run(
        &self,
        input: &Self::Input,
        ctx: &mut StepContext,
    ) -> Result<Self::Output, AgentError>;
}

/// An action the kernel let run: the action to execute (the rewrite of a `modify` verdict,
/// else the action as given, with its context filled in) and the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Approved {
    /// What to execute.
    pub action: Action,
    /// The kernel's decision (`allow`, `warn` or `modify`).
    pub decision: Decision,
}

/// A span an agent asks the runner to store with its rollout ([`StepContext::annotate`],
/// [`StepContext::annotate_span`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// Span name, e.g. `agentlightning.operation`.
    pub name: String,
    /// Span attributes.
    pub attributes: Attributes,
    /// Start time, Unix seconds; `None`: the time the runner writes the span.
    pub start_time: Option<f64>,
    /// End time, Unix seconds; `None`: the time the runner writes the span.
    pub end_time: Option<f64>,
    /// Span status; `None`: `OK` (what [`Span::new`] gives).
    pub status: Option<agl_core::SpanStatus>,
}

#[derive(Clone)]
struct Settings {
    fail_on_violation: bool,
    log_violations: bool,
    callback: Option<ViolationCallback>,
}

#[derive(Default)]
struct Counters {
    rollouts: AtomicU64,
    violations: AtomicU64,
    violating_rollouts: AtomicU64,
}

/// The per-step governance handle an [`Agent`] checks its actions through.
///
/// Every violation of the step is recorded here, in order, and nowhere else: steps running
/// concurrently each have their own context.
pub struct StepContext {
    kernel: Arc<Kernel>,
    audit: Option<Arc<FlightRecorder>>,
    settings: Arc<Settings>,
    counters: Arc<Counters>,
    context: agl_gov::Context,
    next_step: u64,
    mode: Option<RolloutMode>,
    violations: Vec<PolicyViolation>,
    signals: Vec<Signal>,
    blocked: Option<PolicyViolationError>,
    kernel_error: Option<String>,
    annotations: Vec<Annotation>,
    resources: Option<Arc<NamedResources>>,
}

impl fmt::Debug for StepContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("context", &self.context)
            .field("mode", &self.mode)
            .field("violations", &self.violations)
            .field("signals", &self.signals)
            .finish()
    }
}

impl StepContext {
    /// Checks `action` with the kernel before it runs.
    ///
    /// The action's context gets the step's agent, rollout and attempt ids where it has none,
    /// and the index of this check within the step (0, 1, …). Every violation is recorded in
    /// the step, counted, logged (if `log_violations`) and passed to the violation callback.
    ///
    /// # Errors
    /// - [`TrainError::Blocked`]: the kernel blocked the action; do not run it.
    /// - [`TrainError::Aborted`]: an earlier action of this step was blocked and the runner
    ///   has `fail_on_violation`; the action was not checked and must not run.
    /// - [`TrainError::Gov`]: the kernel or the flight recorder failed; the action must not
    ///   run (fail closed), and the step will return this error.
    pub fn check(&mut self, action: Action) -> Result<Approved, TrainError> {
        if self.settings.fail_on_violation
            && let Some(first) = &self.blocked
        {
            return Err(TrainError::Aborted(first.clone()));
        }
        let mut action = action;
        let c = &mut action.context;
        if c.agent_id.is_none() {
            c.agent_id.clone_from(&self.context.agent_id);
        }
        if c.rollout_id.is_none() {
            c.rollout_id.clone_from(&self.context.rollout_id);
        }
        if c.attempt_id.is_none() {
            c.attempt_id.clone_from(&self.context.attempt_id);
        }
        if c.step.is_none() {
            c.step = Some(self.next_step);
        }
        self.next_step += 1;
        let decision = match self.kernel.check(&action) {
            Ok(d) => d,
            Err(e) => {
                self.kernel_error.get_or_insert_with(|| e.to_string());
                return Err(e.into());
            }
        };
        if let Some(rec) = &self.audit
            && let Err(e) = rec.append(&action, &decision)
        {
            self.kernel_error.get_or_insert_with(|| e.to_string());
            return Err(e.into());
        }
        let mut first_block = None;
        for v in &decision.violations {
            let pv = PolicyViolation::from_kernel(v, decision.verdict);
            self.counters.violations.fetch_add(1, Ordering::Relaxed);
            announce(&self.settings, &pv);
            if first_block.is_none() && pv.action_blocked {
                first_block = Some(pv.clone());
            }
            self.violations.push(pv);
        }
        self.signals.extend(decision.signals.iter().copied());
        let kind = decision.effective_kind(&action.kind).cloned();
        match (decision.verdict, kind) {
            (Verdict::Block, _) | (_, None) => {
                let violation = first_block.unwrap_or_else(|| {
                    PolicyViolation::new(
                        crate::PolicyViolationType::Blocked,
                        "kernel",
                        "the kernel blocked the action",
                        agl_gov::FAIL_CLOSED_SEVERITY,
                    )
                });
                let err = PolicyViolationError { violation };
                self.blocked.get_or_insert_with(|| err.clone());
                Err(TrainError::Blocked(err))
            }
            (_, Some(kind)) => Ok(Approved {
                action: Action {
                    context: action.context,
                    kind,
                },
                decision,
            }),
        }
    }

    /// The mode the step runs in (`train`, `val`, `test`), if given.
    pub fn mode(&self) -> Option<RolloutMode> {
        self.mode
    }

    /// The rollout id the step's actions are checked under.
    pub fn rollout_id(&self) -> Option<&str> {
        self.context.rollout_id.as_deref()
    }

    /// The store attempt the step runs for ([`GovernedRunner::iter`]); `None` for
    /// [`GovernedRunner::step`].
    pub fn attempt_id(&self) -> Option<&str> {
        self.context.attempt_id.as_deref()
    }

    /// The resources of the rollout ([`GovernedRunner::iter`] fetches the set the rollout
    /// names, else the store's latest); `None` when there are none, and for
    /// [`GovernedRunner::step`].
    pub fn resources(&self) -> Option<&NamedResources> {
        self.resources.as_deref()
    }

    /// The LLM endpoint to call: the resource named `name`, or with `None` the first `llm` or
    /// `proxy_llm` resource in name order. A `proxy_llm` endpoint is rewritten for this step's
    /// rollout and attempt with [`LlmResource::base_url_for_attempt`] (used as it is when the
    /// step has no attempt). `None` when there are no resources, no such resource, or the
    /// named resource is not an LLM.
    pub fn llm_base_url(&self, name: Option<&str>) -> Option<LlmEndpoint> {
        let resources = self.resources.as_deref()?;
        let is_llm = |r: &Resource| matches!(r, Resource::Llm(_) | Resource::ProxyLlm(_));
        let (key, resource) = match name {
            Some(n) => resources.get_key_value(n)?,
            None => resources.iter().find(|(_, r)| is_llm(r))?,
        };
        let (llm, proxied): (&LlmResource, bool) = match resource {
            Resource::Llm(l) => (l, false),
            Resource::ProxyLlm(l) => (l, true),
            Resource::PromptTemplate(_) => return None,
        };
        let base_url = match (proxied, self.rollout_id(), self.attempt_id()) {
            (true, Some(rid), Some(aid)) => llm.base_url_for_attempt(rid, aid),
            _ => llm.endpoint.clone(),
        };
        Some(LlmEndpoint {
            name: key.clone(),
            base_url,
            model: llm.model.clone(),
            api_key: llm.api_key.clone(),
            sampling_parameters: llm.sampling_parameters.clone(),
            proxied,
        })
    }

    /// The violations recorded so far in this step.
    pub fn violations(&self) -> &[PolicyViolation] {
        &self.violations
    }

    /// The signals the kernel sent so far in this step.
    pub fn signals(&self) -> &[Signal] {
        &self.signals
    }

    /// Whether an action of this step was blocked.
    pub fn blocked(&self) -> bool {
        self.blocked.is_some()
    }

    /// Asks the runner to store a span named `name` with `attributes` with the rollout (only
    /// [`GovernedRunner::iter`] stores them; [`GovernedRunner::step`] has no store and drops
    /// them). Its start and end time are the time the runner writes it, after the step.
    pub fn annotate(&mut self, name: impl Into<String>, attributes: Attributes) {
        self.annotations.push(Annotation {
            name: name.into(),
            attributes,
            start_time: None,
            end_time: None,
            status: None,
        });
    }

    /// [`StepContext::annotate`] for a span that covers a stretch of the step: it starts at
    /// `start` and ends at `end` (Unix seconds, as [`agl_core::now_seconds`]; an `end` before
    /// `start` is raised to `start`). Spans of other tracers (the LLM gateway's call spans) that
    /// lie inside that interval are nested under it by the span → triplet adapter's hierarchy
    /// repair ([`crate::TracerTraceToTriplet`]), which is how an agent span names the agent of
    /// the LLM calls it encloses.
    pub fn annotate_span(
        &mut self,
        name: impl Into<String>,
        attributes: Attributes,
        start: f64,
        end: f64,
    ) {
        self.annotations.push(Annotation {
            name: name.into(),
            attributes,
            start_time: Some(start),
            end_time: Some(end.max(start)),
            status: None,
        });
    }

    /// Adds a span the agent asked for (the emitters of [`crate::instrument`]).
    pub(crate) fn push_annotation(&mut self, annotation: Annotation) {
        self.annotations.push(annotation);
    }
}

/// Logs `pv` (when `log_violations`) and passes it to the violation callback.
fn announce(settings: &Settings, pv: &PolicyViolation) {
    if settings.log_violations {
        tracing::warn!(
            policy = %pv.policy_name,
            severity = %pv.severity,
            blocked = pv.action_blocked,
            "Policy violation: {} - {} (severity={}, blocked={})",
            pv.policy_name,
            pv.description,
            pv.severity,
            pv.action_blocked
        );
    }
    if let Some(cb) = &settings.callback {
        cb(pv);
    }
}

/// The violations the LLM gateway recorded in `spans` (see the module docs): one
/// [`PolicyViolation`] per `agentlightning.annotation` span with [`SOURCE_ATTR`] =
/// [`SOURCE_GATEWAY`] and a string `agent_os.violation.policy`, in span order. Reads
/// `agent_os.violation.severity` (case-insensitive; missing or unknown: [`FAIL_CLOSED_SEVERITY`]),
/// `.reason` (the description), `.blocked` (bool), `.effect` (`modify` → type `modified`) and
/// an optional numeric `.penalty` (explicit magnitude). Other spans are ignored.
///
/// [`FAIL_CLOSED_SEVERITY`]: agl_gov::FAIL_CLOSED_SEVERITY
pub fn gateway_violations(spans: &[Span]) -> Vec<PolicyViolation> {
    let mut out = Vec::new();
    for span in spans {
        let a = &span.attributes;
        if span.name != semconv::AGL_ANNOTATION
            || a.get(SOURCE_ATTR).and_then(AttributeValue::as_str) != Some(SOURCE_GATEWAY)
        {
            continue;
        }
        let Some(policy) = a
            .get(semconv::agent_os::VIOLATION_POLICY)
            .and_then(AttributeValue::as_str)
        else {
            continue;
        };
        let text = |k: &str| {
            a.get(k)
                .and_then(AttributeValue::as_str)
                .unwrap_or_default()
        };
        let severity = text(semconv::agent_os::VIOLATION_SEVERITY)
            .parse::<Severity>()
            .unwrap_or(agl_gov::FAIL_CLOSED_SEVERITY);
        let blocked = matches!(
            a.get(semconv::agent_os::VIOLATION_BLOCKED),
            Some(AttributeValue::Bool(true))
        );
        let kind = if blocked {
            PolicyViolationType::Blocked
        } else if text(semconv::agent_os::VIOLATION_EFFECT).eq_ignore_ascii_case("modify") {
            PolicyViolationType::Modified
        } else {
            PolicyViolationType::Warned
        };
        let mut v = PolicyViolation::new(
            kind,
            policy,
            text(semconv::agent_os::VIOLATION_REASON),
            severity,
        )
        .with_action_blocked(blocked);
        if let Some(p) = a
            .get(semconv::agent_os::VIOLATION_PENALTY)
            .and_then(AttributeValue::as_f64)
            .filter(|p| p.is_finite())
        {
            v = v.with_penalty(p.abs());
        }
        out.push(v);
    }
    out
}

/// Runner statistics. JSON keys `total_rollouts`, `total_violations`, `violation_rate` are
/// Python's `get_stats()`; the rest are unambiguous additions (reference D6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunnerStats {
    /// Steps run.
    pub total_rollouts: u64,
    /// Violations reported by the kernel during those steps.
    pub total_violations: u64,
    /// Python's meaning: violations per rollout (`total_violations / total_rollouts`, 0 when
    /// there are no rollouts); can exceed 1.
    pub violation_rate: f64,
    /// Steps with at least one violation.
    pub violating_rollouts: u64,
    /// `violating_rollouts / total_rollouts` (0 when none): the fraction most people mean by
    /// "violation rate".
    pub violating_rollout_fraction: f64,
}

impl RunnerStats {
    fn from_counts(rollouts: u64, violations: u64, violating: u64) -> Self {
        let per = |x: u64| {
            if rollouts == 0 {
                0.0
            } else {
                x as f64 / rollouts as f64
            }
        };
        RunnerStats {
            total_rollouts: rollouts,
            total_violations: violations,
            violation_rate: per(violations),
            violating_rollouts: violating,
            violating_rollout_fraction: per(violating),
        }
    }
}

/// What one [`GovernedRunner::iter`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterReport {
    /// Rollouts stepped and reported (attempt `succeeded`).
    pub rollouts: u64,
    /// Violations in those rollouts.
    pub violations: u64,
    /// Rollouts whose task failed (`success == false`: agent error or blocked action).
    pub unsuccessful: u64,
    /// Rollouts whose input could not be read; their attempt was marked `failed`.
    pub malformed: u64,
}

struct WorkerBinding {
    worker_id: String,
    store: Arc<dyn LightningStore>,
}

/// Runs an [`Agent`] under a governance kernel (see the module docs).
pub struct GovernedRunner<A: Agent> {
    kernel: Arc<Kernel>,
    recorder: Arc<FlightRecorder>,
    owns_recorder: bool,
    settings: Arc<Settings>,
    counters: Arc<Counters>,
    agent: Option<Arc<A>>,
    worker: Option<WorkerBinding>,
    reward: Option<Arc<PolicyReward<A::Input, A::Output>>>,
}

impl<A: Agent> fmt::Debug for GovernedRunner<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GovernedRunner")
            .field("kernel", &self.kernel)
            .field("fail_on_violation", &self.settings.fail_on_violation)
            .field("log_violations", &self.settings.log_violations)
            .field("violation_callback", &self.settings.callback.is_some())
            .field("initialised", &self.agent.is_some())
            .field(
                "worker_id",
                &self.worker.as_ref().map(|w| w.worker_id.as_str()),
            )
            .finish()
    }
}

impl<A: Agent> GovernedRunner<A> {
    /// A runner over `kernel` with the seed defaults: `fail_on_violation` false,
    /// `log_violations` true, no callback. If the kernel has no flight recorder, the runner
    /// records every check in an in-memory one of its own (see [`GovernedRunner::recorder`]).
    pub fn new(kernel: Arc<Kernel>) -> Self {
        let (recorder, owns_recorder) = match kernel.shared_recorder() {
            Some(r) => (r, false),
            None => (Arc::new(FlightRecorder::in_memory()), true),
        };
        GovernedRunner {
            kernel,
            recorder,
            owns_recorder,
            settings: Arc::new(Settings {
                fail_on_violation: false,
                log_violations: true,
                callback: None,
            }),
            counters: Arc::new(Counters::default()),
            agent: None,
            worker: None,
            reward: None,
        }
    }

    fn settings_mut(&mut self) -> &mut Settings {
        // Shared only with live step contexts; a builder call copies if any is alive.
        Arc::make_mut(&mut self.settings)
    }

    /// End the step at the first blocked action: later actions are refused and the output
    /// is dropped (default false).
    pub fn fail_on_violation(mut self, on: bool) -> Self {
        self.settings_mut().fail_on_violation = on;
        self
    }

    /// Log one `WARN` per violation through `tracing` (default true).
    pub fn log_violations(mut self, on: bool) -> Self {
        self.settings_mut().log_violations = on;
        self
    }

    /// Call `f` with every violation as the kernel reports it (default none).
    pub fn violation_callback(
        mut self,
        f: impl Fn(&PolicyViolation) + Send + Sync + 'static,
    ) -> Self {
        self.settings_mut().callback = Some(Arc::new(f));
        self
    }

    /// Score every rollout [`GovernedRunner::iter`] reports with `reward`, and store the
    /// reward as an `agentlightning.annotation` span (`agentlightning.reward.0` = `final`).
    pub fn with_reward(mut self, reward: Arc<PolicyReward<A::Input, A::Output>>) -> Self {
        self.reward = Some(reward);
        self
    }

    /// The kernel.
    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// Whether the first blocked action ends the step.
    pub fn fails_on_violation(&self) -> bool {
        self.settings.fail_on_violation
    }

    /// Whether violations are logged.
    pub fn logs_violations(&self) -> bool {
        self.settings.log_violations
    }

    /// Whether a violation callback is set.
    pub fn has_violation_callback(&self) -> bool {
        self.settings.callback.is_some()
    }

    /// The flight recorder that receives every check of this runner's steps: the kernel's,
    /// or the runner's own in-memory one when the kernel has none.
    pub fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// The worker id given to [`GovernedRunner::init_worker`].
    pub fn worker_id(&self) -> Option<&str> {
        self.worker.as_ref().map(|w| w.worker_id.as_str())
    }

    /// The store given to [`GovernedRunner::init_worker`].
    pub fn store(&self) -> Option<&Arc<dyn LightningStore>> {
        self.worker.as_ref().map(|w| &w.store)
    }

    /// Sets the agent (Python `init(agent)`). Calling it again replaces the agent; nothing is
    /// registered twice.
    pub fn init(&mut self, agent: A) {
        self.init_shared(Arc::new(agent));
    }

    /// Sets an agent shared with other runners (one runner per worker, one agent).
    pub fn init_shared(&mut self, agent: Arc<A>) {
        tracing::info!(policies = ?self.kernel.policy_names(), "GovernedRunner initialised");
        self.agent = Some(agent);
    }

    /// Binds this runner to a worker of a LightningStore (Python `init_worker(worker_id,
    /// store)`): [`GovernedRunner::iter`] serves that store's queue as this worker, and the
    /// runner's counters are published in the worker's heartbeat so that
    /// [`GovernedRunner::stats`] sums every worker.
    pub fn init_worker(&mut self, worker_id: impl Into<String>, store: Arc<dyn LightningStore>) {
        let worker_id = worker_id.into();
        tracing::debug!(%worker_id, "GovernedRunner worker initialised");
        self.worker = Some(WorkerBinding { worker_id, store });
    }

    /// Ends this worker (logs at `DEBUG`); the store stays bound so that statistics can still
    /// be read.
    pub fn teardown_worker(&mut self, worker_id: &str) {
        tracing::debug!(%worker_id, "GovernedRunner worker torn down");
    }

    /// Ends the runner: logs the totals at `INFO`.
    pub fn teardown(&self) {
        let s = self.local_stats();
        tracing::info!(
            total_rollouts = s.total_rollouts,
            total_violations = s.total_violations,
            "GovernedRunner teardown: {} rollouts, {} violations",
            s.total_rollouts,
            s.total_violations
        );
    }

    /// This runner's own counters.
    pub fn local_stats(&self) -> RunnerStats {
        RunnerStats::from_counts(
            self.counters.rollouts.load(Ordering::Relaxed),
            self.counters.violations.load(Ordering::Relaxed),
            self.counters.violating_rollouts.load(Ordering::Relaxed),
        )
    }

    /// Statistics of every worker of the bound store (the sum of the counters each worker's
    /// runner published in its heartbeat under [`HEARTBEAT_KEY`]); this runner's own counters
    /// when no store is bound.
    ///
    /// # Errors
    /// [`TrainError::Store`] if the store cannot list its workers.
    pub async fn stats(&self) -> Result<RunnerStats, TrainError> {
        let Some(w) = &self.worker else {
            return Ok(self.local_stats());
        };
        let (mut r, mut v, mut x) = (0, 0, 0);
        for worker in w.store.list_workers().await? {
            let Some(g) = worker
                .heartbeat_stats
                .as_ref()
                .and_then(|s| s.get(HEARTBEAT_KEY))
            else {
                continue;
            };
            let n = |k: &str| g.get(k).and_then(Value::as_u64).unwrap_or(0);
            r += n("total_rollouts");
            v += n("total_violations");
            x += n("violating_rollouts");
        }
        Ok(RunnerStats::from_counts(r, v, x))
    }

    /// Runs one task (Python `step(input, mode=...)`): a fresh [`StepContext`] under a new
    /// rollout id (`ro-step-<uuid>`), the agent, then the rollout. Per-rollout policy state is
    /// dropped afterwards ([`Kernel::end_rollout`]).
    ///
    /// Agent errors, blocked actions and agent panics do not make this fail: they give a
    /// rollout with `success == false` (logged at `ERROR`: `Execution blocked by policy: …` or
    /// `Execution failed: …`).
    ///
    /// # Errors
    /// - [`TrainError::Runner`] if [`GovernedRunner::init`] was not called;
    /// - [`TrainError::Runner`] naming the failure if the kernel or the flight recorder failed
    ///   during the step (audit must not be lost silently; the agent saw [`TrainError::Gov`]);
    /// - [`TrainError::Store`] if publishing the counters to the bound store failed.
    pub async fn step(
        &self,
        input: A::Input,
        mode: Option<RolloutMode>,
    ) -> Result<GovernedRollout<A::Input, A::Output>, TrainError> {
        let rollout_id = format!("ro-step-{}", uuid::Uuid::new_v4().simple());
        let (rollout, _) = self.step_in(input, mode, rollout_id, None, None).await?;
        Ok(rollout)
    }

    async fn step_in(
        &self,
        input: A::Input,
        mode: Option<RolloutMode>,
        rollout_id: String,
        attempt_id: Option<String>,
        resources: Option<NamedResources>,
    ) -> Result<(GovernedRollout<A::Input, A::Output>, Vec<Annotation>), TrainError> {
        let agent = self.agent.as_ref().ok_or_else(|| {
            TrainError::Runner("GovernedRunner: call init(agent) before step".into())
        })?;
        let mut ctx = StepContext {
            kernel: self.kernel.clone(),
            audit: self.owns_recorder.then(|| self.recorder.clone()),
            settings: self.settings.clone(),
            counters: self.counters.clone(),
            context: agl_gov::Context {
                agent_id: self.worker_id().map(str::to_string),
                rollout_id: Some(rollout_id.clone()),
                attempt_id: attempt_id.clone(),
                ..agl_gov::Context::default()
            },
            next_step: 0,
            mode,
            violations: Vec::new(),
            signals: Vec::new(),
            blocked: None,
            kernel_error: None,
            annotations: Vec::new(),
            resources: resources.map(Arc::new),
        };
        let started = Instant::now();
        let result = AssertUnwindSafe(agent.run(&input, &mut ctx))
            .catch_unwind()
            .await;
        let execution_time_ms = started.elapsed().as_secs_f64() * 1000.0;
        self.kernel.end_rollout(&rollout_id);
        let output = match result {
            Ok(Ok(output)) if !(self.settings.fail_on_violation && ctx.blocked.is_some()) => {
                Some(output)
            }
            Ok(Ok(_)) => {
                if let Some(b) = &ctx.blocked {
                    tracing::error!("Execution blocked by policy: {}", b.violation.description);
                }
                None
            }
            Ok(Err(e)) => {
                match e.downcast_ref::<TrainError>() {
                    Some(TrainError::Blocked(b) | TrainError::Aborted(b)) => {
                        tracing::error!("Execution blocked by policy: {}", b.violation.description)
                    }
                    _ => tracing::error!(error = %e, "Execution failed: {e}"),
                }
                None
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                tracing::error!("Execution failed: the agent panicked: {msg}");
                None
            }
        };
        // The model's output, checked by the LLM gateway: its violations count as the step's.
        let mut gateway_blocked = false;
        if let (Some(w), Some(aid)) = (&self.worker, &attempt_id) {
            let mut query = SpanQuery::of(&rollout_id, Some(aid));
            query.name = Some(semconv::AGL_ANNOTATION.to_string());
            let spans = match w.store.query_spans(query).await {
                Ok(page) => page.items,
                Err(e) => {
                    self.counters.rollouts.fetch_add(1, Ordering::Relaxed);
                    return Err(e.into());
                }
            };
            for pv in gateway_violations(&spans) {
                self.counters.violations.fetch_add(1, Ordering::Relaxed);
                announce(&self.settings, &pv);
                gateway_blocked |= pv.action_blocked;
                ctx.violations.push(pv);
            }
        }
        self.counters.rollouts.fetch_add(1, Ordering::Relaxed);
        if !ctx.violations.is_empty() {
            self.counters
                .violating_rollouts
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Some(msg) = ctx.kernel_error.take() {
            self.publish().await?;
            return Err(TrainError::Runner(format!(
                "governance kernel failed during rollout {rollout_id}: {msg}"
            )));
        }
        let rollout = GovernedRollout {
            success: output.is_some() && ctx.blocked.is_none() && !gateway_blocked,
            task_input: input,
            task_output: output,
            violations: ctx.violations,
            signals_sent: ctx.signals,
            execution_time_ms,
            mode,
            rollout_id: Some(rollout_id),
            attempt_id,
        };
        self.publish().await?;
        Ok((rollout, ctx.annotations))
    }

    /// Writes this runner's counters into its worker's heartbeat (no-op without a store).
    async fn publish(&self) -> Result<(), TrainError> {
        let Some(w) = &self.worker else {
            return Ok(());
        };
        let s = self.local_stats();
        let stats = json!({ HEARTBEAT_KEY: {
            "total_rollouts": s.total_rollouts,
            "total_violations": s.total_violations,
            "violating_rollouts": s.violating_rollouts,
        }});
        w.store.update_worker(&w.worker_id, Some(stats)).await?;
        Ok(())
    }
}

impl<A> GovernedRunner<A>
where
    A: Agent,
    A::Input: DeserializeOwned,
    A::Output: Serialize,
{
    /// Serves the bound store's queue (Python `iter(event=...)`): until `stop` is cancelled or
    /// the queue has nothing to dispatch, dequeue a rollout as this worker, read its `input`
    /// as `A::Input`, fetch its resources (the set its `resources_id` names, else the store's
    /// latest: [`StepContext::resources`]), step it under the rollout's id, mode and attempt,
    /// add the LLM gateway's violations of the attempt to the step's (see the module docs), and
    /// report it.
    ///
    /// Reporting a rollout stores, in order: the agent's [`StepContext::annotate`] and
    /// [`StepContext::annotate_span`] spans (in the order asked, with their own times); one
    /// governance `agentlightning.annotation` span (`agent_os.violations` count,
    /// `agent_os.total_penalty`, `agent_os.violation_types`, `agent_os.policies_violated`,
    /// `agent_os.signals`, `agl.success`; always written, even with no violation, so every
    /// rollout's count is in the store); the reward span if a reward is set
    /// ([`GovernedRunner::with_reward`]). So the rollout's reward (`find_final_reward`, the last
    /// reward span) is the [`PolicyReward`]'s shaped reward when the runner has one, else the
    /// last reward the agent emitted ([`StepContext::emit_reward`]), else none. The attempt is
    /// then `succeeded`, with metadata
    /// `{"success", "violations", "total_penalty", "output"}`: the step ran and was reported,
    /// whatever the task's outcome (a blocked rollout's penalty is a training signal, so it
    /// must not be discarded as a failed attempt). An input that cannot be read fails the
    /// attempt (metadata `{"error"}`) and the loop goes on.
    ///
    /// # Errors
    /// [`TrainError::Runner`] without [`GovernedRunner::init_worker`] or
    /// [`GovernedRunner::init`]; store errors; kernel failures (the attempt is marked
    /// `failed` first).
    pub async fn iter(&self, stop: &CancellationToken) -> Result<IterReport, TrainError> {
        let Some(w) = &self.worker else {
            return Err(TrainError::Runner(
                "GovernedRunner: call init_worker(worker_id, store) before iter".into(),
            ));
        };
        if self.agent.is_none() {
            return Err(TrainError::Runner(
                "GovernedRunner: call init(agent) before iter".into(),
            ));
        }
        let store = w.store.as_ref();
        let mut report = IterReport::default();
        while !stop.is_cancelled() {
            let Some(attempted) = store.dequeue_rollout(Some(&w.worker_id)).await? else {
                break;
            };
            let rid = attempted.rollout.rollout_id.clone();
            let aid = attempted.attempt.attempt_id.clone();
            let fail = |message: String| AttemptUpdate {
                status: Some(AttemptStatus::Failed),
                metadata: Some(json!({ "error": message })),
                ..AttemptUpdate::default()
            };
            let input: A::Input = match serde_json::from_value(attempted.rollout.input.clone()) {
                Ok(input) => input,
                Err(e) => {
                    let msg = format!("rollout {rid}: input is not a task input: {e}");
                    tracing::error!("{msg}");
                    store.update_attempt(&rid, &aid, fail(msg)).await?;
                    report.malformed += 1;
                    continue;
                }
            };
            let resources = match &attempted.rollout.resources_id {
                Some(id) => {
                    let found = store.get_resources_by_id(id).await?;
                    if found.is_none() {
                        tracing::warn!(rollout_id = %rid, resources_id = %id, "the rollout's resources do not exist; the agent gets none");
                    }
                    found
                }
                None => store.get_latest_resources().await?,
            };
            let stepped = self
                .step_in(
                    input,
                    attempted.rollout.mode,
                    rid.clone(),
                    Some(aid.clone()),
                    resources.map(|r| r.resources),
                )
                .await;
            let (rollout, annotations) = match stepped {
                Ok(x) => x,
                Err(e) => {
                    store
                        .update_attempt(&rid, &aid, fail(e.to_string()))
                        .await?;
                    return Err(e);
                }
            };
            let mut spans = Vec::with_capacity(annotations.len() + 2);
            for a in annotations {
                let seq = store.get_next_span_sequence_id(&rid, &aid).await?;
                let mut span = Span::new(&rid, &aid, seq, &a.name, a.attributes);
                if a.start_time.is_some() {
                    span.start_time = a.start_time;
                }
                if a.end_time.is_some() {
                    span.end_time = a.end_time;
                }
                if let Some(status) = a.status {
                    span.status = status;
                }
                spans.push(span);
            }
            let seq = store.get_next_span_sequence_id(&rid, &aid).await?;
            spans.push(Span::new(
                &rid,
                &aid,
                seq,
                semconv::AGL_ANNOTATION,
                governance_attributes(&rollout),
            ));
            if let Some(reward) = &self.reward {
                let breakdown = reward.score(&rollout);
                let seq = store.get_next_span_sequence_id(&rid, &aid).await?;
                spans.push(Span::new(
                    &rid,
                    &aid,
                    seq,
                    semconv::AGL_ANNOTATION,
                    breakdown.annotation_attributes(),
                ));
            }
            store.add_spans(spans).await?;
            let output = serde_json::to_value(&rollout.task_output).unwrap_or(Value::Null);
            let update = AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                metadata: Some(json!({
                    "success": rollout.success,
                    "violations": rollout.violations.len(),
                    "total_penalty": rollout.total_penalty(),
                    "output": output,
                })),
                ..AttemptUpdate::default()
            };
            store.update_attempt(&rid, &aid, update).await?;
            report.rollouts += 1;
            report.violations += rollout.violations.len() as u64;
            if !rollout.success {
                report.unsuccessful += 1;
            }
        }
        Ok(report)
    }
}

/// The attributes of a rollout's governance annotation span (see [`GovernedRunner::iter`]).
pub fn governance_attributes<I, O>(rollout: &GovernedRollout<I, O>) -> Attributes {
    let mut a = Attributes::new();
    a.insert(
        semconv::agent_os::VIOLATIONS.into(),
        AttributeValue::Int(rollout.violations.len() as i64),
    );
    a.insert(
        semconv::agent_os::TOTAL_PENALTY.into(),
        rollout.total_penalty().into(),
    );
    a.insert(
        semconv::agent_os::VIOLATION_TYPES.into(),
        AttributeValue::StrArray(
            rollout
                .violations
                .iter()
                .map(|v| v.violation_type.as_str().to_string())
                .collect(),
        ),
    );
    a.insert(
        semconv::agent_os::POLICIES_VIOLATED.into(),
        AttributeValue::StrArray(
            rollout
                .policies_violated()
                .into_iter()
                .map(str::to_string)
                .collect(),
        ),
    );
    a.insert(
        semconv::agent_os::SIGNALS.into(),
        AttributeValue::StrArray(
            rollout
                .signals_sent
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
        ),
    );
    a.insert(semconv::agl::SUCCESS.into(), rollout.success.into());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::RewardConfig;
    use agl_core::{EnqueueRolloutRequest, PromptEngine, PromptTemplate, find_final_reward};
    use agl_gov::{SqlPolicy, SqlPolicyConfig};
    use agl_store::InMemoryLightningStore;

    fn kernel() -> Arc<Kernel> {
        Arc::new(
            Kernel::new(agl_gov::GovernanceMode::Enforce)
                .with_policy(SqlPolicy::new(SqlPolicyConfig::default())),
        )
    }

    fn llm(endpoint: &str, model: &str) -> LlmResource {
        let mut sampling = serde_json::Map::new();
        sampling.insert("temperature".into(), json!(0.5));
        LlmResource {
            endpoint: endpoint.into(),
            model: model.into(),
            api_key: None,
            sampling_parameters: sampling,
        }
    }

    /// Reports what its context saw: the attempt, the resources' names and the LLM endpoints.
    struct Probe;

    #[async_trait::async_trait]
    impl Agent for Probe {
        type Input = String;
        type Output = Value;
        async fn run(&self, _input: &String, ctx: &mut StepContext) -> Result<Value, AgentError> {
            let names: Vec<String> = ctx
                .resources()
                .map(|r| r.keys().cloned().collect())
                .unwrap_or_default();
            let first = ctx.llm_base_url(None);
            let named = ctx.llm_base_url(Some("judge"));
            Ok(json!({
                "rollout": ctx.rollout_id(),
                "attempt": ctx.attempt_id(),
                "names": names,
                "first": first.as_ref().map(|e| (&e.name, &e.base_url, &e.model, e.proxied)),
                "temperature": first.as_ref().and_then(|e| e.sampling_parameters.get("temperature").cloned()),
                "judge": named.map(|e| e.base_url),
                "template_is_not_an_llm": ctx.llm_base_url(Some("prompt")).is_none(),
            }))
        }
    }

    async fn output_of(store: &Arc<dyn LightningStore>, rid: &str) -> Value {
        let attempt = store.get_latest_attempt(rid).await.unwrap().unwrap();
        Value::Object(attempt.metadata.unwrap())["output"].clone()
    }

    #[tokio::test]
    async fn iter_hands_the_rollouts_resources_to_the_agent_with_a_per_attempt_proxy_url() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let mut first = NamedResources::new();
        first.insert(
            "main_llm".into(),
            Resource::ProxyLlm(llm("http://127.0.0.1:9/v1", "smol")),
        );
        first.insert(
            "judge".into(),
            Resource::Llm(llm("http://judge:8000/v1", "big")),
        );
        first.insert(
            "prompt".into(),
            Resource::PromptTemplate(PromptTemplate {
                template: "{q}".into(),
                engine: PromptEngine::FString,
            }),
        );
        let first = store.update_resources("v1", first).await.unwrap();
        let mut latest = NamedResources::new();
        latest.insert(
            "other".into(),
            Resource::Llm(llm("http://other/v1", "latest-model")),
        );
        store.add_resources(latest).await.unwrap();

        let mut named = EnqueueRolloutRequest::new(json!("q1"));
        named.resources_id = Some(first.resources_id.clone());
        let named = store.enqueue_rollout(named).await.unwrap();
        let unnamed = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!("q2")))
            .await
            .unwrap();

        let mut r = GovernedRunner::new(kernel()).log_violations(false);
        r.init(Probe);
        r.init_worker("w", store.clone());
        assert_eq!(r.iter(&CancellationToken::new()).await.unwrap().rollouts, 2);

        let out = output_of(&store, &named.rollout_id).await;
        let aid = out["attempt"].as_str().unwrap().to_string();
        assert!(aid.starts_with("at-"), "{out}");
        assert_eq!(out["names"], json!(["judge", "main_llm", "prompt"]));
        // `judge` is first in name order and a plain `llm`: its endpoint is used as it is.
        assert_eq!(
            out["first"],
            json!(["judge", "http://judge:8000/v1", "big", false])
        );
        assert_eq!(out["temperature"], json!(0.5));
        assert_eq!(out["judge"], json!("http://judge:8000/v1"));
        assert_eq!(out["template_is_not_an_llm"], json!(true));

        // No resources_id: the latest set.
        let out = output_of(&store, &unnamed.rollout_id).await;
        assert_eq!(out["names"], json!(["other"]));
        assert_eq!(out["first"][1], json!("http://other/v1"));
    }

    /// Asks for the proxy resource by name.
    struct ProxyProbe;

    #[async_trait::async_trait]
    impl Agent for ProxyProbe {
        type Input = String;
        type Output = Option<String>;
        async fn run(
            &self,
            _input: &String,
            ctx: &mut StepContext,
        ) -> Result<Option<String>, AgentError> {
            Ok(ctx.llm_base_url(Some("main_llm")).map(|e| e.base_url))
        }
    }

    #[tokio::test]
    async fn a_proxy_llm_is_rewritten_for_the_attempt_and_step_has_no_resources() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let mut res = NamedResources::new();
        res.insert(
            "main_llm".into(),
            Resource::ProxyLlm(llm("http://127.0.0.1:9/v1", "smol")),
        );
        store.update_resources("v1", res).await.unwrap();
        let ro = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!("q")))
            .await
            .unwrap();
        let mut r = GovernedRunner::new(kernel()).log_violations(false);
        r.init(ProxyProbe);
        r.init_worker("w", store.clone());
        r.iter(&CancellationToken::new()).await.unwrap();
        let attempt = store
            .get_latest_attempt(&ro.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            output_of(&store, &ro.rollout_id).await,
            json!(format!(
                "http://127.0.0.1:9/rollout/{}/attempt/{}/v1",
                ro.rollout_id, attempt.attempt_id
            ))
        );
        // `step` runs without a store attempt: no resources.
        let stepped = r.step("q".into(), None).await.unwrap();
        assert_eq!(stepped.task_output, Some(None));
    }

    /// Plays the LLM gateway: stores violation annotation spans for its own attempt, as the
    /// gateway does when it checks the model's answers.
    struct GatewayLike {
        store: Arc<dyn LightningStore>,
        /// (policy, severity, blocked, source)
        spans: Vec<(&'static str, &'static str, bool, Option<&'static str>)>,
    }

    #[async_trait::async_trait]
    impl Agent for GatewayLike {
        type Input = String;
        type Output = String;
        async fn run(&self, _input: &String, ctx: &mut StepContext) -> Result<String, AgentError> {
            let rid = ctx.rollout_id().ok_or("no rollout")?.to_string();
            let aid = ctx.attempt_id().ok_or("no attempt")?.to_string();
            ctx.check(Action::sql("db", "SELECT 1"))?;
            for (policy, severity, blocked, source) in &self.spans {
                let mut a = Attributes::new();
                a.insert("agent_os.violation.policy".into(), (*policy).into());
                a.insert("agent_os.violation.severity".into(), (*severity).into());
                a.insert("agent_os.violation.reason".into(), "said something".into());
                a.insert("agent_os.violation.blocked".into(), (*blocked).into());
                if let Some(s) = source {
                    a.insert(SOURCE_ATTR.into(), (*s).into());
                }
                let seq = self.store.get_next_span_sequence_id(&rid, &aid).await?;
                self.store
                    .add_span(Span::new(&rid, &aid, seq, semconv::AGL_ANNOTATION, a))
                    .await?;
            }
            Ok("done".into())
        }
    }

    async fn run_gateway_like(
        spans: Vec<(&'static str, &'static str, bool, Option<&'static str>)>,
    ) -> (Arc<dyn LightningStore>, String, RunnerStats, Vec<String>) {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let ro = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!("q")))
            .await
            .unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let mut r = GovernedRunner::new(kernel())
            .log_violations(false)
            .violation_callback(move |v| sink.lock().unwrap().push(v.policy_name.clone()))
            .with_reward(Arc::new(PolicyReward::new(RewardConfig::default())));
        r.init(GatewayLike {
            store: store.clone(),
            spans,
        });
        r.init_worker("w", store.clone());
        r.iter(&CancellationToken::new()).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        (store, ro.rollout_id, r.local_stats(), seen)
    }

    #[tokio::test]
    async fn gateway_violations_are_penalised_counted_and_reported() {
        let (store, rid, stats, seen) = run_gateway_like(vec![
            ("output_filter", "critical", true, Some("gateway")),
            ("pii", "LOW", false, Some("gateway")),
            // not the gateway's: ignored
            ("sql_safety", "critical", true, Some("runner")),
            ("sql_safety", "critical", true, None),
        ])
        .await;
        assert_eq!(seen, ["output_filter", "pii"]);
        assert_eq!(stats.total_violations, 2);
        assert_eq!(stats.violating_rollouts, 1);
        let attempt = store.get_latest_attempt(&rid).await.unwrap().unwrap();
        let meta = Value::Object(attempt.metadata.unwrap());
        assert_eq!(meta["violations"], json!(2));
        assert_eq!(meta["total_penalty"], json!(101.0));
        // The blocked answer makes the step unsuccessful: base 0, −100 −1, clamped to −100.
        assert_eq!(meta["success"], json!(false));
        let spans = store.list_spans(&rid, None).await.unwrap();
        assert_eq!(find_final_reward(&spans), Some(-100.0));
        let governance = spans
            .iter()
            .find(|s| s.attributes.contains_key("agent_os.policies_violated"))
            .unwrap();
        assert_eq!(
            governance.attributes["agent_os.policies_violated"],
            AttributeValue::StrArray(vec!["output_filter".into(), "pii".into()])
        );
        assert_eq!(
            governance.attributes["agent_os.violation_types"],
            AttributeValue::StrArray(vec!["blocked".into(), "warned".into()])
        );
    }

    #[tokio::test]
    async fn a_warned_answer_costs_its_penalty_and_the_clean_bonus_but_not_success() {
        let (store, rid, stats, _) =
            run_gateway_like(vec![("pii", "medium", false, Some("gateway"))]).await;
        assert_eq!(stats.total_violations, 1);
        let attempt = store.get_latest_attempt(&rid).await.unwrap().unwrap();
        let meta = Value::Object(attempt.metadata.unwrap());
        assert_eq!(meta["success"], json!(true));
        // base 1, medium −10, no clean bonus
        let spans = store.list_spans(&rid, None).await.unwrap();
        assert_eq!(find_final_reward(&spans), Some(-9.0));

        // Without gateway violations the same rollout earns base 1 + clean bonus 5.
        let (store, rid, stats, _) = run_gateway_like(vec![]).await;
        assert_eq!(stats.total_violations, 0);
        let spans = store.list_spans(&rid, None).await.unwrap();
        assert_eq!(find_final_reward(&spans), Some(6.0));
    }

    #[test]
    fn gateway_violation_spans_are_read_field_by_field() {
        let span = |attrs: Vec<(&str, AttributeValue)>| {
            let a: Attributes = attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            Span::new("ro-1", "at-1", 1, semconv::AGL_ANNOTATION, a)
        };
        let gw = || (SOURCE_ATTR, AttributeValue::from(SOURCE_GATEWAY));
        let spans = vec![
            span(vec![
                gw(),
                ("agent_os.violation.policy", "redact".into()),
                ("agent_os.violation.severity", "High".into()),
                ("agent_os.violation.effect", "modify".into()),
                ("agent_os.violation.penalty", AttributeValue::Float(-7.0)),
            ]),
            span(vec![
                gw(),
                ("agent_os.violation.policy", "weird".into()),
                ("agent_os.violation.severity", "catastrophic".into()),
            ]),
            // no policy: not a violation
            span(vec![gw(), ("agent_os.violation.severity", "low".into())]),
            // another span name
            Span::new(
                "ro-1",
                "at-1",
                1,
                semconv::OPENAI_CHAT_COMPLETION,
                [gw(), ("agent_os.violation.policy", "x".into())]
                    .into_iter()
                    .map(|(k, v): (&str, AttributeValue)| (k.to_string(), v))
                    .collect(),
            ),
        ];
        let vs = gateway_violations(&spans);
        assert_eq!(vs.len(), 2);
        assert_eq!(vs[0].policy_name, "redact");
        assert_eq!(vs[0].severity, Severity::High);
        assert_eq!(vs[0].violation_type, PolicyViolationType::Modified);
        assert!(!vs[0].action_blocked);
        assert_eq!(vs[0].penalty(), 7.0);
        assert_eq!(vs[1].severity, agl_gov::FAIL_CLOSED_SEVERITY);
        assert_eq!(vs[1].violation_type, PolicyViolationType::Warned);
        assert_eq!(vs[1].description, "");
    }
}
