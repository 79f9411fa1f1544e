//! Conformance: `GovernedRunner` (reference Part B2, spec §3, §13, §14, §16, §19.1), plus the
//! store-backed `iter` and cross-worker statistics the tutorial (§7.6) promises.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agl_core::{EnqueueRolloutRequest, RolloutMode, RolloutStatus, semconv};
use agl_gov::{
    Action, Effect, FlightRecorder, GovernanceMode, Kernel, PolicyOptions, Severity, SqlPolicy,
    SqlPolicyConfig,
};
use agl_store::{InMemoryLightningStore, LightningStore};
use agl_train::{
    Agent, AgentError, GovernedRunner, PolicyReward, PolicyViolationType, RewardConfig,
    StepContext, TrainError,
};
use tokio_util::sync::CancellationToken;

use crate::common::{sql, sql_kernel, trigger_kernel, with_trigger};

/// Checks its input as one SQL statement and "runs" it (returns its text).
struct SqlAgent;

#[async_trait::async_trait]
impl Agent for SqlAgent {
    type Input = String;
    type Output = String;
    async fn run(&self, input: &String, ctx: &mut StepContext) -> Result<String, AgentError> {
        let approved = ctx.check(sql(input))?;
        match approved.action.kind {
            agl_gov::ActionKind::Sql { sql, .. } => Ok(format!("ran {sql}")),
            _ => Err("not SQL".into()),
        }
    }
}

/// Checks each `;;`-separated part of its input in turn and carries on after a block.
struct StubbornAgent;

#[async_trait::async_trait]
impl Agent for StubbornAgent {
    type Input = String;
    type Output = usize;
    async fn run(&self, input: &String, ctx: &mut StepContext) -> Result<usize, AgentError> {
        let mut ran = 0;
        for part in input.split(";;") {
            match ctx.check(sql(part)) {
                Ok(_) => ran += 1,
                Err(TrainError::Blocked(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(ran)
    }
}

fn runner(kernel: Arc<Kernel>) -> GovernedRunner<SqlAgent> {
    let mut r = GovernedRunner::new(kernel).log_violations(false);
    r.init(SqlAgent);
    r
}

/// Kernel: PolicyA blocks `A!` (high), PolicyB warns on `B!` (medium), PolicyW warns on `W!`
/// (low), SQLPolicy is the real sql_safety (DROP is critical).
fn mixed_kernel() -> Kernel {
    let k = Kernel::new(GovernanceMode::Enforce).with_policy_options(
        SqlPolicy::new(SqlPolicyConfig::default()),
        PolicyOptions {
            name: Some("SQLPolicy".into()),
            ..PolicyOptions::default()
        },
    );
    let k = with_trigger(k, "PolicyA", "A!", Severity::High, Effect::Block);
    let k = with_trigger(k, "PolicyB", "B!", Severity::Medium, Effect::Warn);
    with_trigger(k, "PolicyW", "W!", Severity::Low, Effect::Warn)
}

#[test]
fn constructor_defaults_match_the_seed() {
    let kernel = sql_kernel();
    let r: GovernedRunner<SqlAgent> = GovernedRunner::new(kernel.clone());
    assert!(!r.fails_on_violation());
    assert!(r.logs_violations());
    assert!(!r.has_violation_callback());
    assert!(Arc::ptr_eq(r.kernel(), &kernel));
    assert_eq!(r.worker_id(), None);
}

#[tokio::test]
async fn fresh_runner_stats_are_zero() {
    let s = runner(sql_kernel()).stats().await.unwrap();
    assert_eq!(
        (s.total_rollouts, s.total_violations, s.violation_rate),
        (0, 0, 0.0)
    );
}

#[tokio::test]
async fn violation_rate_is_violations_per_rollout() {
    let r = runner(Arc::new(mixed_kernel()));
    for i in 0..10 {
        let q = if i < 3 { "SELECT 'W!'" } else { "SELECT 1" };
        r.step(q.to_string(), None).await.unwrap();
    }
    let s = r.stats().await.unwrap();
    assert_eq!((s.total_rollouts, s.total_violations), (10, 3));
    assert_eq!(s.violation_rate, 0.3);
    assert_eq!(s.violating_rollout_fraction, 0.3);
}

#[tokio::test]
async fn a_blocked_verdict_gives_a_blocked_violation_and_a_warning_a_warned_one() {
    let r = runner(Arc::new(mixed_kernel()));
    let blocked = r.step("SELECT 'A!'".into(), None).await.unwrap();
    assert_eq!(
        blocked.violations[0].violation_type,
        PolicyViolationType::Blocked
    );
    assert!(blocked.violations[0].action_blocked);
    let warned = r.step("SELECT 'B!'".into(), None).await.unwrap();
    assert_eq!(
        warned.violations[0].violation_type,
        PolicyViolationType::Warned
    );
    assert!(!warned.violations[0].action_blocked);
    assert!(warned.success);
}

#[tokio::test]
async fn differs_a_modify_verdict_gives_a_modified_violation() {
    // Python never produces MODIFIED (D15a). max_rows makes sql_safety add a LIMIT.
    let config = SqlPolicyConfig {
        max_rows: Some(10),
        ..SqlPolicyConfig::default()
    };
    let kernel = Arc::new(Kernel::new(GovernanceMode::Enforce).with_policy(SqlPolicy::new(config)));
    let r = runner(kernel);
    let out = r.step("SELECT * FROM t".into(), None).await.unwrap();
    assert_eq!(
        out.violations[0].violation_type,
        PolicyViolationType::Modified
    );
    assert!(out.success);
    assert!(
        out.task_output.unwrap().contains("LIMIT 10"),
        "the rewritten statement ran"
    );
}

#[tokio::test]
async fn every_violation_is_counted_five_in_one_step_count_five() {
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel())).log_violations(false);
    r.init(StubbornAgent);
    let out = r.step(["SELECT 'W!'"; 5].join(";;"), None).await.unwrap();
    assert_eq!(out.violations.len(), 5);
    assert_eq!(r.stats().await.unwrap().total_violations, 5);
}

#[tokio::test]
async fn the_violation_callback_is_called_once_per_violation() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel()))
        .log_violations(false)
        .violation_callback(move |v| s.lock().unwrap().push(v.policy_name.clone()));
    r.init(SqlAgent);
    assert!(r.has_violation_callback());
    r.step("SELECT 'B!'".into(), None).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["PolicyB"]);
}

#[tokio::test]
async fn fail_on_violation_ends_the_step_at_a_block_but_not_at_a_warning() {
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel()))
        .log_violations(false)
        .fail_on_violation(true);
    r.init(StubbornAgent);
    // Blocked first part: the later clean part is refused, the output dropped (spec §16.1).
    let out = r.step("SELECT 'A!';;SELECT 1".into(), None).await.unwrap();
    assert!(!out.success);
    assert_eq!(out.task_output, None);
    assert_eq!(out.violations.len(), 1);
    assert_eq!(out.violations[0].policy_name, "PolicyA");
    // A warning does not end the step.
    let out = r.step("SELECT 'B!';;SELECT 1".into(), None).await.unwrap();
    assert!(out.success);
    assert_eq!(out.task_output, Some(2));
}

#[tokio::test]
async fn without_fail_on_violation_a_block_never_errors_and_later_actions_still_run() {
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel())).log_violations(false);
    r.init(StubbornAgent);
    let out = r.step("SELECT 'A!';;SELECT 1".into(), None).await.unwrap();
    // The agent recovered and returned, but a blocked action means the task was not done.
    assert_eq!(out.task_output, Some(1));
    assert!(!out.success);
}

#[tokio::test]
async fn a_safe_step_succeeds_and_echoes_its_input() {
    let out = runner(sql_kernel())
        .step(
            "SELECT name FROM users WHERE id = 42".into(),
            Some(RolloutMode::Train),
        )
        .await
        .unwrap();
    assert!(out.success);
    assert_eq!(out.task_input, "SELECT name FROM users WHERE id = 42");
    assert!(out.violations.is_empty());
    assert_eq!(out.mode, Some(RolloutMode::Train));
    assert!(out.execution_time_ms >= 0.0);
}

#[test]
fn spec_19_1_drop_table_is_blocked_with_one_critical_violation() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let out = rt
        .block_on(runner(sql_kernel()).step("DROP TABLE users".into(), None))
        .unwrap();
    assert!(!out.success);
    assert_eq!(out.task_output, None);
    assert_eq!(out.violations.len(), 1);
    let v = &out.violations[0];
    assert_eq!(v.violation_type, PolicyViolationType::Blocked);
    assert_eq!(v.policy_name, "SQLPolicy");
    assert_eq!(v.severity, Severity::Critical);
    assert!(v.action_blocked);
    assert_eq!(v.penalty(), 100.0);
    assert_eq!(out.total_penalty(), 100.0);
}

#[tokio::test]
async fn differs_a_blocked_drop_scores_minus_100_where_the_python_mock_scores_minus_99() {
    // Python's example kernel lets the step "succeed" (base 1) and subtracts 100: −99. The DROP
    // did not run, so ours has base 0: −100.
    let out = runner(sql_kernel())
        .step("DROP TABLE users".into(), None)
        .await
        .unwrap();
    let reward: PolicyReward<String, String> = PolicyReward::new(RewardConfig::default());
    assert_eq!(reward.call(&out), -100.0);
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct FailingAgent;

#[async_trait::async_trait]
impl Agent for FailingAgent {
    type Input = ();
    type Output = ();
    async fn run(&self, _: &(), _: &mut StepContext) -> Result<(), AgentError> {
        Err("tool crashed".into())
    }
}

fn captured_logs(f: impl FnOnce()) -> String {
    let buffer = Buffer::default();
    let b = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || b.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
}

#[test]
fn a_failing_agent_gives_an_unsuccessful_rollout_and_logs_execution_failed() {
    let logs = captured_logs(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = GovernedRunner::new(sql_kernel());
        r.init(FailingAgent);
        let out = rt.block_on(r.step((), None)).unwrap();
        assert!(!out.success);
        assert_eq!(out.task_output, None);
    });
    assert!(logs.contains("ERROR"), "{logs}");
    assert!(logs.contains("Execution failed: tool crashed"), "{logs}");
}

#[test]
fn log_violations_writes_one_warning_per_violation() {
    let logs = captured_logs(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut r = GovernedRunner::new(Arc::new(mixed_kernel()));
        r.init(SqlAgent);
        rt.block_on(r.step("DROP TABLE users".into(), None))
            .unwrap();
    });
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(
        warnings[0].contains("Policy violation: SQLPolicy - ")
            && warnings[0].contains("(severity=critical, blocked=true)"),
        "{logs}"
    );
    assert!(logs.contains("Execution blocked by policy: "), "{logs}");
}

struct PanickingAgent;

#[async_trait::async_trait]
impl Agent for PanickingAgent {
    type Input = ();
    type Output = ();
    #[allow(clippy::panic)]
    async fn run(&self, _: &(), _: &mut StepContext) -> Result<(), AgentError> {
        panic!("agent bug")
    }
}

#[tokio::test]
async fn a_panicking_agent_does_not_propagate_to_the_trainer() {
    let mut r = GovernedRunner::new(sql_kernel());
    r.init(PanickingAgent);
    let out = r.step((), None).await.unwrap();
    assert!(!out.success);
    assert_eq!(r.local_stats().total_rollouts, 1);
}

/// Checks its `trigger`, then waits at the barrier, then checks a clean action: two of these
/// interleave on one runner.
struct InterleavingAgent;

#[async_trait::async_trait]
impl Agent for InterleavingAgent {
    type Input = (String, bool, Arc<tokio::sync::Barrier>);
    type Output = ();
    async fn run(
        &self,
        (trigger, first, barrier): &Self::Input,
        ctx: &mut StepContext,
    ) -> Result<(), AgentError> {
        if *first {
            let _ = ctx.check(sql(trigger));
            barrier.wait().await;
        } else {
            barrier.wait().await;
            let _ = ctx.check(sql(trigger));
        }
        ctx.check(sql("SELECT 1"))?;
        Ok(())
    }
}

#[tokio::test]
async fn concurrent_steps_never_mix_their_violations() {
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel())).log_violations(false);
    r.init(InterleavingAgent);
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let (a, b) = tokio::join!(
        r.step(("SELECT 'A!'".into(), true, barrier.clone()), None),
        r.step(("SELECT 'B!'".into(), false, barrier.clone()), None),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.policies_violated(), ["PolicyA"]);
    assert_eq!(a.violations[0].description, "A! found");
    assert_eq!(b.policies_violated(), ["PolicyB"]);
    assert_eq!(b.violations[0].description, "B! found");
}

struct ThreadAgent;

#[async_trait::async_trait]
impl Agent for ThreadAgent {
    type Input = String;
    type Output = ();
    async fn run(&self, input: &String, ctx: &mut StepContext) -> Result<(), AgentError> {
        // The check runs on another OS thread (Python loses such violations, D7).
        std::thread::scope(|s| s.spawn(|| ctx.check(sql(input)).map(|_| ())).join())
            .map_err(|_| "thread panicked")??;
        Ok(())
    }
}

#[tokio::test]
async fn differs_violations_reported_from_another_thread_stay_in_their_step() {
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel())).log_violations(false);
    r.init(ThreadAgent);
    let out = r.step("SELECT 'B!'".into(), None).await.unwrap();
    assert_eq!(out.policies_violated(), ["PolicyB"]);
}

#[tokio::test]
async fn differs_step_before_init_is_an_error_not_an_ungoverned_run() {
    let r: GovernedRunner<SqlAgent> = GovernedRunner::new(sql_kernel());
    let err = r.step("SELECT 1".into(), None).await.unwrap_err();
    assert!(err.to_string().contains("init(agent)"), "{err}");
}

#[tokio::test]
async fn init_worker_stores_the_worker_and_store_and_teardown_is_quiet() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let mut r = runner(sql_kernel());
    r.init_worker("42", store.clone());
    assert_eq!(r.worker_id(), Some("42"));
    assert!(Arc::ptr_eq(r.store().unwrap(), &store));
    r.teardown_worker("42");
    r.teardown();
}

#[tokio::test]
async fn differs_audit_is_always_on_every_check_reaches_a_flight_recorder() {
    // No recorder on the kernel: the runner keeps its own.
    let r = runner(sql_kernel());
    r.step("SELECT 1".into(), None).await.unwrap();
    r.step("DROP TABLE users".into(), None).await.unwrap();
    assert_eq!(r.recorder().entries(), 2);
    // A kernel with a recorder: that one receives the checks.
    let kernel = Arc::new(
        Kernel::new(GovernanceMode::Enforce)
            .with_policy(SqlPolicy::new(SqlPolicyConfig::default()))
            .with_recorder(FlightRecorder::in_memory()),
    );
    let r = runner(kernel.clone());
    r.step("SELECT 1".into(), None).await.unwrap();
    assert_eq!(kernel.recorder().unwrap().entries(), 1);
    assert!(Arc::ptr_eq(
        r.recorder(),
        &kernel.shared_recorder().unwrap()
    ));
}

#[tokio::test]
async fn iter_requires_init_worker() {
    let r = runner(sql_kernel());
    let err = r.iter(&CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("init_worker"), "{err}");
}

#[tokio::test]
async fn iter_stops_at_once_when_the_stop_token_is_cancelled() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    store
        .enqueue_rollout(EnqueueRolloutRequest::new("SELECT 1".into()))
        .await
        .unwrap();
    let mut r = runner(sql_kernel());
    r.init_worker("w", store.clone());
    let stop = CancellationToken::new();
    stop.cancel();
    assert_eq!(r.iter(&stop).await.unwrap().rollouts, 0);
    assert_eq!(r.iter(&CancellationToken::new()).await.unwrap().rollouts, 1);
}

#[tokio::test]
async fn iter_fails_the_attempt_of_a_malformed_input_and_goes_on() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let bad = store
        .enqueue_rollout(EnqueueRolloutRequest::new(
            serde_json::json!({"not": "sql"}),
        ))
        .await
        .unwrap();
    store
        .enqueue_rollout(EnqueueRolloutRequest::new("SELECT 1".into()))
        .await
        .unwrap();
    let mut r = runner(sql_kernel());
    r.init_worker("w", store.clone());
    let report = r.iter(&CancellationToken::new()).await.unwrap();
    assert_eq!((report.rollouts, report.malformed), (1, 1));
    let bad = store
        .get_rollout_by_id(&bad.rollout_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        bad.status,
        RolloutStatus::Failed | RolloutStatus::Requeuing
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_workers_aggregate_stats_through_the_store() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let inputs = [
        "SELECT 1",
        "DROP TABLE users",
        "SELECT 'B!'",
        "SELECT 'W!', 'B!'",
        "DELETE FROM t",
    ];
    let n = 200;
    let mut ids = Vec::new();
    for i in 0..n {
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(inputs[i % inputs.len()].into()))
            .await
            .unwrap();
        ids.push(r.rollout_id);
    }
    let kernel = Arc::new(mixed_kernel());
    let agent = Arc::new(SqlAgent);
    let reward = Arc::new(PolicyReward::new(RewardConfig::default()));
    let mut runners = Vec::new();
    for w in 0..8 {
        let mut r = GovernedRunner::new(kernel.clone())
            .log_violations(false)
            .with_reward(reward.clone());
        r.init_shared(agent.clone());
        r.init_worker(format!("Worker-{w}"), store.clone());
        runners.push(Arc::new(r));
    }
    let stop = CancellationToken::new();
    let tasks: Vec<_> = runners
        .iter()
        .map(|r| {
            let (r, stop) = (r.clone(), stop.clone());
            tokio::spawn(async move { r.iter(&stop).await })
        })
        .collect();
    let mut stepped = 0;
    let busy = AtomicUsize::new(0);
    for t in tasks {
        let report = t.await.unwrap().unwrap();
        stepped += report.rollouts;
        if report.rollouts > 0 {
            busy.fetch_add(1, Ordering::Relaxed);
        }
    }
    assert_eq!(stepped, n as u64);
    // Each rollout's own count, read back from its governance span in the store.
    let mut own_violations = 0;
    let mut violating = 0;
    for id in &ids {
        let spans = store.list_spans(id, None).await.unwrap();
        let gov: Vec<_> = spans
            .iter()
            .filter(|s| {
                s.name == semconv::AGL_ANNOTATION
                    && s.attributes.contains_key("agent_os.violations")
            })
            .collect();
        assert_eq!(gov.len(), 1, "one governance span per rollout {id}");
        let count = match gov[0].attributes["agent_os.violations"] {
            agl_core::AttributeValue::Int(c) => c as u64,
            ref other => panic!("count is {other:?}"),
        };
        own_violations += count;
        violating += u64::from(count > 0);
        let rollout = store.get_rollout_by_id(id).await.unwrap().unwrap();
        assert_eq!(rollout.status, RolloutStatus::Succeeded);
    }
    assert_eq!(own_violations, 40 + 40 + 80 + 40);
    for r in &runners {
        let s = r.stats().await.unwrap();
        assert_eq!(s.total_rollouts, n as u64);
        assert_eq!(s.total_violations, own_violations);
        assert_eq!(s.violating_rollouts, violating);
    }
    let local: u64 = runners.iter().map(|r| r.local_stats().total_rollouts).sum();
    assert_eq!(local, n as u64);
    assert!(busy.load(Ordering::Relaxed) > 1, "work was shared");
    assert_eq!(reward.stats().total_rewards, n as u64);
}

#[tokio::test]
async fn iter_stores_the_reference_governance_attributes() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let ro = store
        .enqueue_rollout(EnqueueRolloutRequest::new("SELECT 'B!', 'W!'".into()))
        .await
        .unwrap();
    let mut r = GovernedRunner::new(Arc::new(mixed_kernel())).log_violations(false);
    r.init(SqlAgent);
    r.init_worker("w", store.clone());
    r.iter(&CancellationToken::new()).await.unwrap();
    let spans = store.list_spans(&ro.rollout_id, None).await.unwrap();
    let a = &spans[0].attributes;
    use agl_core::AttributeValue as V;
    assert_eq!(a["agent_os.violations"], V::Int(2));
    assert_eq!(a["agent_os.total_penalty"], V::Float(11.0));
    assert_eq!(
        a["agent_os.violation_types"],
        V::StrArray(vec!["warned".into(), "warned".into()])
    );
    assert_eq!(
        a["agent_os.policies_violated"],
        V::StrArray(vec!["PolicyB".into(), "PolicyW".into()])
    );
    let _ = trigger_kernel;
    let _ = Action::output("");
}
