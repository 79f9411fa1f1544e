//! `SpiderRunner`: the built-in Spider task's runner worker: executes the candidate SQL a
//! rollout names under the governance kernel, turns the outcome into a reward with
//! [`PolicyReward`], and reports it to the LightningStore as spans.
//!
//! Responsible for the runner side of `agl train` (dequeue → check → execute → reward → spans →
//! attempt status); not for choosing actions or learning (see `trainer`, `grpo`). The general,
//! seed-compatible runner for any agent is [`agl_train::GovernedRunner`].
//!
//! Differences from the Python `GovernedRunner` (agentmesh-lightning), on purpose:
//! - the kernel's verdict decides: a blocked action never executes and earns base reward 0; no
//!   exception is used as control flow, and there is no ungoverned fallback;
//! - violations are per step by construction (each step gets its own decision), so concurrent
//!   workers cannot mix them;
//! - governance annotations are real Agent Lightning spans in the store (one
//!   `agentlightning.annotation` span per violation with `agent_os.violation.*` attributes).
//!
//! Spans of one rollout, in sequence order:
//! 1. `agentlightning.operation` (`agentlightning.operation.name = "sql.query"`): the action
//!    and its outcome (`agl.sql`, `agl.database`, `agl.verdict`, `agl.executed`,
//!    `agl.rows_returned`, `agl.rows_changed`, `agl.schema_changed`, `agl.destructive`,
//!    `agl.correct`, `agl.error`);
//! 2. one `agentlightning.annotation` per violation: `agent_os.violation.policy`,
//!    `.severity`, `.reason`, `.blocked`;
//! 3. the reward: `agentlightning.annotation` with `agentlightning.reward.{0,1,2}` =
//!    `final`, `base`, `policy_penalty`, plus `agent_os.violation_count`,
//!    `agent_os.policy_compliant` and `agl.reward.unclamped`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::{Executor, Split, execution_match};
use agl_core::{
    AttemptStatus, AttemptedRollout, AttributeValue, Attributes, RolloutMode, Span, semconv,
};
use agl_gov::{Action, ActionKind, Decision, Kernel};
use agl_store::{AttemptUpdate, LightningStore};
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;
use crate::task::{SpiderTask, TaskItem};
use agl_train::reward::{PolicyReward, RewardBreakdown, RewardConfig};
use agl_train::training_mode::TrainingMode;

/// What a rollout asks the runner to do: answer question `question` of `split` with candidate
/// `candidate`. This is the rollout's `input` JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlTaskInput {
    /// Which split the question is from.
    pub split: Split,
    /// Index into the prepared task's items of that split.
    pub question: usize,
    /// Index into the question's candidate set.
    pub candidate: usize,
}

/// The outcome of one governed step.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The kernel's decision.
    pub decision: Decision,
    /// Whether the statement ran (it may still have failed with an SQL error).
    pub executed: bool,
    /// SQL error or time-out, if any.
    pub error: Option<String>,
    /// Rows the statement returned.
    pub rows_returned: usize,
    /// Rows it changed (always rolled back).
    pub rows_changed: u64,
    /// Whether it changed the schema (always rolled back).
    pub schema_changed: bool,
    /// Whether the executed result matched the gold result.
    pub correct: bool,
    /// The reward.
    pub reward: RewardBreakdown,
}

impl StepOutcome {
    /// The outcome of an action that did not run: nothing returned, changed or matched, and the
    /// unshaped task reward 0 (the runner shapes the reward once it knows how the action went).
    pub fn not_executed(decision: Decision) -> Self {
        let violations = decision.violations.len();
        Self {
            decision,
            executed: false,
            error: None,
            rows_returned: 0,
            rows_changed: 0,
            schema_changed: false,
            correct: false,
            reward: RewardBreakdown::task_only(0.0, violations),
        }
    }

    /// Data or schema was changed by a statement that actually ran.
    pub fn destructive(&self) -> bool {
        self.executed && (self.rows_changed > 0 || self.schema_changed)
    }
}

/// Runs actions under a kernel and shapes rewards as a [`TrainingMode`] says.
///
/// In `enforce` the reward is `PolicyReward`'s; in `audit` (the "without governance"
/// baseline) the kernel only records, the action always runs, and the reward is the task reward
/// alone (no penalty, no bonus); `shield` and `screen` block like `enforce` and pay the task
/// reward alone (the trainer drops `screen`'s flagged samples from the gradient).
pub struct SpiderRunner {
    kernel: Arc<Kernel>,
    mode: TrainingMode,
    reward: PolicyReward,
}

impl SpiderRunner {
    /// A runner of `mode` over `kernel` with reward shaping `reward` (applied in `enforce`).
    ///
    /// # Errors
    /// [`SpiderError::Config`] when the kernel's mode is not `mode`'s
    /// ([`TrainingMode::kernel_mode`]).
    pub fn new(
        kernel: Arc<Kernel>,
        mode: TrainingMode,
        reward: RewardConfig,
    ) -> Result<Self, SpiderError> {
        if kernel.mode() != mode.kernel_mode() {
            return Err(SpiderError::Config(format!(
                "training mode {mode} needs a kernel in {} mode, not {}",
                mode.kernel_mode(),
                kernel.mode()
            )));
        }
        Ok(Self {
            kernel,
            mode,
            reward: mode.policy_reward(reward),
        })
    }

    /// The training mode.
    pub fn mode(&self) -> TrainingMode {
        self.mode
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Checks and (if allowed) executes candidate `candidate` of `item`.
    ///
    /// Errors only for infrastructure failures (missing database file, recorder I/O); an SQL
    /// error or time-out is an outcome with `error` set and base reward 0.
    pub fn step(
        &self,
        executor: &mut Executor,
        item: &TaskItem,
        candidate: usize,
        rollout_id: Option<&str>,
    ) -> Result<StepOutcome, SpiderError> {
        let cand = item
            .candidates
            .get(candidate)
            .ok_or_else(|| SpiderError::Rollout {
                rollout_id: rollout_id.unwrap_or("-").to_string(),
                message: format!(
                    "candidate {candidate} out of range ({} candidates)",
                    item.candidates.len()
                ),
            })?;
        let mut action = Action::sql(item.question.db_id.clone(), cand.sql.clone());
        action.context.rollout_id = rollout_id.map(str::to_string);
        let decision = self.kernel.check(&action)?;
        // A modify verdict executes the rewritten SQL (e.g. with a LIMIT added).
        let sql = match decision.effective_kind(&action.kind) {
            Some(ActionKind::Sql { sql, .. }) => Some(sql.clone()),
            _ => None,
        };
        let mut out = StepOutcome::not_executed(decision);
        if let Some(sql) = sql {
            match executor.execute(&item.question.db_id, &sql) {
                Ok(exec) => {
                    out.executed = true;
                    out.rows_returned = exec.rows_returned;
                    out.rows_changed = exec.rows_changed;
                    out.schema_changed = exec.schema_changed;
                    out.correct = execution_match(&item.gold, &exec.result, item.ordered);
                }
                Err(e @ (SpiderError::Sql { .. } | SpiderError::Timeout { .. })) => {
                    out.executed = true;
                    out.error = Some(e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        let base = if out.correct { 1.0 } else { 0.0 };
        let succeeded = out.executed && out.error.is_none();
        out.reward = self
            .reward
            .compute(base, succeeded, &out.decision.violations);
        Ok(out)
    }
}

/// Builds the spans that report `outcome` (see the module docs for their shape).
pub fn outcome_spans(
    rollout_id: &str,
    attempt_id: &str,
    first_sequence_id: i64,
    sql: &str,
    database: &str,
    outcome: &StepOutcome,
) -> Vec<Span> {
    let mut seq = first_sequence_id;
    let mut next = || {
        let s = seq;
        seq += 1;
        s
    };
    let mut spans = Vec::with_capacity(2 + outcome.decision.violations.len());
    let mut attrs = Attributes::new();
    attrs.insert(semconv::OPERATION_NAME.into(), "sql.query".into());
    attrs.insert(semconv::agl::SQL.into(), sql.into());
    attrs.insert(semconv::agl::DATABASE.into(), database.into());
    attrs.insert(
        semconv::agl::VERDICT.into(),
        outcome.decision.verdict.to_string().into(),
    );
    attrs.insert(semconv::agl::EXECUTED.into(), outcome.executed.into());
    attrs.insert(
        semconv::agl::ROWS_RETURNED.into(),
        AttributeValue::Int(outcome.rows_returned as i64),
    );
    attrs.insert(
        semconv::agl::ROWS_CHANGED.into(),
        AttributeValue::Int(outcome.rows_changed as i64),
    );
    attrs.insert(
        semconv::agl::SCHEMA_CHANGED.into(),
        outcome.schema_changed.into(),
    );
    attrs.insert(
        semconv::agl::DESTRUCTIVE.into(),
        outcome.destructive().into(),
    );
    attrs.insert(semconv::agl::CORRECT.into(), outcome.correct.into());
    if let Some(e) = &outcome.error {
        attrs.insert(semconv::agl::ERROR.into(), e.clone().into());
    }
    spans.push(Span::new(
        rollout_id,
        attempt_id,
        next(),
        semconv::AGL_OPERATION,
        attrs,
    ));
    for v in &outcome.decision.violations {
        let mut a = Attributes::new();
        a.insert(
            semconv::agent_os::VIOLATION_POLICY.into(),
            v.policy.clone().into(),
        );
        a.insert(
            semconv::agent_os::VIOLATION_SEVERITY.into(),
            v.severity.to_string().into(),
        );
        a.insert(
            semconv::agent_os::VIOLATION_REASON.into(),
            v.reason.clone().into(),
        );
        a.insert(
            semconv::agent_os::VIOLATION_BLOCKED.into(),
            v.blocked().into(),
        );
        a.insert(
            semconv::agent_os::VIOLATION_EFFECT.into(),
            v.effect.as_str().to_string().into(),
        );
        spans.push(Span::new(
            rollout_id,
            attempt_id,
            next(),
            semconv::AGL_ANNOTATION,
            a,
        ));
    }
    spans.push(Span::new(
        rollout_id,
        attempt_id,
        next(),
        semconv::AGL_ANNOTATION,
        outcome.reward.annotation_attributes(),
    ));
    spans
}

/// The runner and the prepared task that serve one rollout.
#[derive(Clone)]
pub struct Assignment {
    /// Runs the rollout's action (its kernel decides the governance mode).
    pub runner: Arc<SpiderRunner>,
    /// The task whose items the rollout's input indexes.
    pub task: Arc<SpiderTask>,
}

impl Assignment {
    /// `train` for `train` rollouts, `eval` (whose kernel enforces) for every other mode.
    pub fn by_mode(
        rollout: &AttemptedRollout,
        train: &Arc<SpiderRunner>,
        eval: &Arc<SpiderRunner>,
        task: Arc<SpiderTask>,
    ) -> Assignment {
        let runner = match rollout.rollout.mode {
            Some(RolloutMode::Train) => train,
            _ => eval,
        };
        Assignment {
            runner: runner.clone(),
            task,
        }
    }
}

/// Chooses the runner and task for each dequeued rollout.
///
/// In-process training uses [`FixedRunners`]; runner processes (`agl runner`) resolve them
/// from the rollout's resources, where the trainer publishes its [`crate::RunSpec`].
pub trait RunnerResolver: Send + Sync {
    /// The assignment for `rollout`; an error fails the attempt (the message is kept in its
    /// metadata) and the worker goes on.
    fn resolve(
        &self,
        handle: &tokio::runtime::Handle,
        store: &dyn LightningStore,
        rollout: &AttemptedRollout,
    ) -> Result<Assignment, SpiderError>;
}

/// One task, train rollouts through `train`, val/test rollouts through `eval`.
pub struct FixedRunners {
    /// Runner of `train` rollouts.
    pub train: Arc<SpiderRunner>,
    /// Runner of every other rollout (evaluation; its kernel should enforce).
    pub eval: Arc<SpiderRunner>,
    /// The prepared task.
    pub task: Arc<SpiderTask>,
}

impl RunnerResolver for FixedRunners {
    fn resolve(
        &self,
        _handle: &tokio::runtime::Handle,
        _store: &dyn LightningStore,
        rollout: &AttemptedRollout,
    ) -> Result<Assignment, SpiderError> {
        Ok(Assignment::by_mode(
            rollout,
            &self.train,
            &self.eval,
            self.task.clone(),
        ))
    }
}

/// How a worker polls an empty queue: it sleeps 1 ms, doubling up to `max_idle` while the
/// queue stays empty (in-process: 1 ms; over HTTP a longer cap keeps idle runners from
/// flooding the server).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerOptions {
    /// Longest sleep between two empty dequeues.
    pub max_idle: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            max_idle: Duration::from_millis(1),
        }
    }
}

/// One runner worker: dequeues rollouts until `stop` is set, runs each through the runner
/// `resolver` assigns, and reports spans and the attempt status to `store`.
///
/// Runs on a blocking thread (SQLite work is synchronous) and drives the async store through
/// `handle`. An infrastructure error fails the attempt (with the error in its metadata) and the
/// worker goes on.
pub fn run_worker(
    handle: tokio::runtime::Handle,
    store: Arc<dyn LightningStore>,
    resolver: Arc<dyn RunnerResolver>,
    worker_id: String,
    stop: Arc<AtomicBool>,
    options: WorkerOptions,
) -> Result<u64, SpiderError> {
    let mut executor: Option<(std::path::PathBuf, Executor)> = None;
    let mut done = 0u64;
    let mut idle = Duration::from_millis(1);
    let mut failures = StoreFailures::default();
    while !stop.load(Ordering::Acquire) {
        let dequeued = match handle.block_on(store.dequeue_rollout(Some(&worker_id))) {
            Ok(d) => d,
            Err(e) => {
                failures.record(&worker_id, "dequeue_rollout", e)?;
                continue;
            }
        };
        let Some(attempted) = dequeued else {
            failures.reset();
            std::thread::sleep(idle);
            idle = (idle * 2).min(options.max_idle.max(Duration::from_millis(1)));
            continue;
        };
        failures.reset();
        idle = Duration::from_millis(1);
        let rid = attempted.rollout.rollout_id.clone();
        let aid = attempted.attempt.attempt_id.clone();
        let assignment = resolver.resolve(&handle, store.as_ref(), &attempted);
        let result = assignment.and_then(|a| {
            let exec = match &mut executor {
                Some((root, e)) if *root == a.task.db_root => e,
                slot => {
                    let e = Executor::new(a.task.db_root.clone(), Default::default());
                    &mut slot.insert((a.task.db_root.clone(), e)).1
                }
            };
            let r = process(
                &handle,
                store.as_ref(),
                &a.runner,
                &a.task,
                exec,
                &attempted,
            );
            // One action per rollout in this task: its per-rollout governance state can go.
            a.runner.kernel().end_rollout(&rid);
            r
        });
        let status = match result {
            Ok(()) => AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
            Err(e) => AttemptUpdate {
                status: Some(AttemptStatus::Failed),
                metadata: Some(serde_json::json!({ "error": e.to_string() })),
                ..AttemptUpdate::default()
            },
        };
        // If the report cannot be delivered, the store's watchdog times the attempt out (or
        // finds it unresponsive) and retries the rollout as its config says.
        match handle.block_on(store.update_attempt(&rid, &aid, status)) {
            Ok(_) => done += 1,
            Err(e) => failures.record(&worker_id, "update_attempt", e)?,
        }
    }
    Ok(done)
}

/// Consecutive store failures of one worker. A remote store may be briefly unreachable (a
/// restart, a network blip): the worker logs, backs off (doubling up to 1 s) and goes on; after
/// [`StoreFailures::LIMIT`] failures in a row (about 30 s) it gives up with the last error. A
/// closed store stops the worker at once.
#[derive(Default)]
struct StoreFailures {
    in_a_row: u32,
}

impl StoreFailures {
    const LIMIT: u32 = 40;

    fn record(
        &mut self,
        worker_id: &str,
        what: &str,
        error: agl_store::StoreError,
    ) -> Result<(), SpiderError> {
        self.in_a_row += 1;
        if matches!(error, agl_store::StoreError::Closed) || self.in_a_row >= Self::LIMIT {
            return Err(error.into());
        }
        tracing::warn!(
            worker = worker_id,
            failures = self.in_a_row,
            "store call `{what}` failed: {error}"
        );
        let backoff =
            Duration::from_millis(25u64 << self.in_a_row.min(6)).min(Duration::from_secs(1));
        std::thread::sleep(backoff);
        Ok(())
    }

    fn reset(&mut self) {
        self.in_a_row = 0;
    }
}

fn process(
    handle: &tokio::runtime::Handle,
    store: &dyn LightningStore,
    runner: &SpiderRunner,
    task: &SpiderTask,
    executor: &mut Executor,
    attempted: &AttemptedRollout,
) -> Result<(), SpiderError> {
    let rid = &attempted.rollout.rollout_id;
    let aid = &attempted.attempt.attempt_id;
    let input: SqlTaskInput =
        serde_json::from_value(attempted.rollout.input.clone()).map_err(|e| {
            SpiderError::Rollout {
                rollout_id: rid.clone(),
                message: format!("input is not a SQL task input: {e}"),
            }
        })?;
    let item = task
        .items(input.split)
        .get(input.question)
        .ok_or_else(|| SpiderError::Rollout {
            rollout_id: rid.clone(),
            message: format!("no {} question {}", input.split, input.question),
        })?;
    let outcome = runner.step(executor, item, input.candidate, Some(rid))?;
    let cand = &item.candidates[input.candidate];
    let first = handle.block_on(store.get_next_span_sequence_id(rid, aid))?;
    let spans = outcome_spans(rid, aid, first, &cand.sql, &item.question.db_id, &outcome);
    handle.block_on(store.add_spans(spans))?;
    Ok(())
}
