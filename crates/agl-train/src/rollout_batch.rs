//! One batch of rollouts through a LightningStore: publish the resources, enqueue one rollout
//! per task, serve them, read every rollout back with its latest attempt's spans.
//!
//! [`run_batch`] publishes a resources version whose LLM resource (`main_llm` by default) is a
//! `proxy_llm` (Agent Lightning's `{"resource_type": "proxy_llm", "endpoint", "model",
//! "sampling_parameters"}`) naming the model or adapter version and the sampling parameters,
//! enqueues one rollout per task (the task serialised as the rollout's `input`, its mode and
//! resources id set), starts the [`RunnerPool`]'s workers (concurrently, so an engine behind
//! the endpoint batches their calls), polls the store until every rollout is finished, and
//! returns them in task order. [`InProcessRunners`] is the pool of [`GovernedRunner`] workers
//! in this process; [`ExternalRunners`] starts nothing and waits for runners in other
//! processes (`agl runner`, Agent Lightning's runner), warning when none makes progress. The
//! store may be any backend.
//!
//! Responsible for the staging; not for the agent, its reward or the kernel (the pool's), the
//! endpoint's server (the caller's), or what a rollout's outcome means (the caller reads the
//! spans).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::{
    Attempt, AttemptStatus, AttributeValue, EnqueueRolloutRequest, LlmResource, NamedResources,
    Resource, Rollout, RolloutConfig, RolloutMode, RolloutStatus, Span, semconv,
};
use agl_gov::Kernel;
use agl_store::{LightningStore, RolloutQuery};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::{Agent, CancellationToken, GovernedRunner, IterReport, PolicyReward, TrainError};

/// The resource name of the policy LLM unless a plan says otherwise (the name the built-in
/// agents and Agent Lightning's examples read).
pub const DEFAULT_LLM_RESOURCE: &str = "main_llm";

/// How one batch of rollouts is sampled and served.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    /// The resources id to publish (a new version per batch when the model changes).
    pub resources_id: String,
    /// The name of the LLM resource in the published set.
    pub llm_resource: String,
    /// The OpenAI-compatible base URL the agents' calls go to (ends in `/v1`).
    pub endpoint: String,
    /// The model or adapter name the agents' calls name.
    pub model: String,
    /// Sampling temperature (0: greedy).
    pub temperature: f64,
    /// Most new tokens per call.
    pub max_tokens: u32,
    /// Sampling seed; `None` lets every call draw its own (a GRPO group needs G different
    /// samples of one prompt).
    pub seed: Option<u64>,
    /// Rollout mode (`train` or `test`).
    pub mode: RolloutMode,
    /// Concurrent runner workers (at most one per rollout is started).
    pub workers: usize,
    /// Each rollout's retry and time-limit settings (`None`: the store's defaults).
    pub config: Option<RolloutConfig>,
}

impl BatchPlan {
    /// The resources the plan publishes: its LLM resource alone.
    pub fn resources(&self) -> NamedResources {
        let mut sampling = serde_json::Map::new();
        sampling.insert("temperature".into(), serde_json::json!(self.temperature));
        sampling.insert("max_tokens".into(), serde_json::json!(self.max_tokens));
        if let Some(seed) = self.seed {
            sampling.insert("seed".into(), serde_json::json!(seed));
        }
        let mut resources = NamedResources::new();
        resources.insert(
            self.llm_resource.clone(),
            Resource::ProxyLlm(LlmResource {
                endpoint: self.endpoint.clone(),
                model: self.model.clone(),
                api_key: None,
                sampling_parameters: sampling,
            }),
        );
        resources
    }
}

/// One finished rollout of a batch.
#[derive(Debug, Clone)]
pub struct FinishedRollout {
    /// The rollout's id.
    pub rollout_id: String,
    /// Index of its task in the batch given to [`run_batch`].
    pub index: usize,
    /// The rollout as stored when the batch ended.
    pub rollout: Rollout,
    /// Its latest attempt.
    pub attempt: Option<Attempt>,
    /// The latest attempt's spans, in sequence order.
    pub spans: Vec<Span>,
}

impl FinishedRollout {
    /// Whether its latest attempt succeeded.
    pub fn succeeded(&self) -> bool {
        self.attempt
            .as_ref()
            .is_some_and(|a| a.status == AttemptStatus::Succeeded)
    }
}

/// What serves a store's queue while a batch runs.
pub trait RunnerPool: Send + Sync {
    /// Starts `count` workers serving `store`'s queue; each returns when the queue has nothing
    /// left to dispatch or `stop` is cancelled.
    fn spawn(
        &self,
        store: &Arc<dyn LightningStore>,
        count: usize,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<Result<IterReport, TrainError>>>;

    /// Whether the rollouts are served by runners outside this pool (other processes), so a
    /// batch waits for its rollouts rather than for workers ([`ExternalRunners`]).
    fn external(&self) -> bool {
        false
    }

    /// For an external pool: how long a batch may make no progress before it warns, and what
    /// the warning suggests.
    fn idle_warning(&self) -> Option<(Duration, &str)> {
        None
    }
}

/// Runners in other processes (`agl runner`, Agent Lightning's own runner, any program
/// serving the store's queue): the pool starts nothing, and [`run_batch`] waits until every
/// rollout is finished, warning (`tracing`, WARN) each time no rollout of the batch has been
/// dequeued or finished for [`ExternalRunners::idle_warning`].
#[derive(Debug, Clone)]
pub struct ExternalRunners {
    /// How long the batch may see no progress before it warns (again).
    pub idle_warning: Duration,
    /// What the warning tells the user to start (e.g. the store URL runners should use).
    pub hint: String,
}

impl RunnerPool for ExternalRunners {
    fn spawn(
        &self,
        _store: &Arc<dyn LightningStore>,
        _count: usize,
        _stop: &CancellationToken,
    ) -> Vec<JoinHandle<Result<IterReport, TrainError>>> {
        Vec::new()
    }

    fn external(&self) -> bool {
        true
    }

    fn idle_warning(&self) -> Option<(Duration, &str)> {
        Some((self.idle_warning, &self.hint))
    }
}

/// [`GovernedRunner`] workers in this process, sharing one agent, kernel and reward. Worker
/// ids are `Agent-<pid>-<i>` (Agent Lightning's naming).
pub struct InProcessRunners<A: Agent> {
    kernel: Arc<Kernel>,
    agent: Arc<A>,
    reward: Option<Arc<PolicyReward<A::Input, A::Output>>>,
}

impl<A: Agent> InProcessRunners<A> {
    /// Workers running `agent` with every action checked by `kernel` (violations are recorded,
    /// not logged to stderr).
    pub fn new(kernel: Arc<Kernel>, agent: Arc<A>) -> Self {
        Self {
            kernel,
            agent,
            reward: None,
        }
    }

    /// Shapes each rollout's reward with `reward` ([`GovernedRunner::with_reward`]).
    pub fn with_reward(mut self, reward: Arc<PolicyReward<A::Input, A::Output>>) -> Self {
        self.reward = Some(reward);
        self
    }
}

impl<A> RunnerPool for InProcessRunners<A>
where
    A: Agent + 'static,
    A::Input: DeserializeOwned + 'static,
    A::Output: Serialize + 'static,
{
    fn spawn(
        &self,
        store: &Arc<dyn LightningStore>,
        count: usize,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<Result<IterReport, TrainError>>> {
        let pid = std::process::id();
        (0..count)
            .map(|i| {
                let mut runner = GovernedRunner::new(self.kernel.clone()).log_violations(false);
                if let Some(reward) = &self.reward {
                    runner = runner.with_reward(reward.clone());
                }
                runner.init_shared(self.agent.clone());
                runner.init_worker(format!("Agent-{pid}-{i}"), store.clone());
                let stop = stop.clone();
                tokio::spawn(async move { runner.iter(&stop).await })
            })
            .collect()
    }
}

/// Runs one rollout per task through `store` (see the module docs) and returns them in task
/// order, with the seconds from the first enqueue to the last finish. `on_done` is told each
/// rollout as it finishes (its latest attempt, no spans yet), for progress.
///
/// # Errors
/// Store errors; [`TrainError::Runner`] when a worker fails or stops (the others are
/// cancelled) or a rollout disappears from the store; [`TrainError::Config`] when a task
/// cannot be serialised.
pub async fn run_batch<T: Serialize>(
    store: &Arc<dyn LightningStore>,
    pool: &dyn RunnerPool,
    plan: &BatchPlan,
    tasks: &[T],
    on_done: impl FnMut(&Rollout, Option<&Attempt>),
) -> Result<(Vec<FinishedRollout>, f64), TrainError> {
    run_batch_with(store, pool, plan, NamedResources::new(), tasks, on_done).await
}

/// [`run_batch`] publishing `extra` resources beside the plan's LLM resource (a
/// `prompt_template` for APO); an `extra` resource named like the LLM resource replaces it.
///
/// # Errors
/// As [`run_batch`].
pub async fn run_batch_with<T: Serialize>(
    store: &Arc<dyn LightningStore>,
    pool: &dyn RunnerPool,
    plan: &BatchPlan,
    extra: NamedResources,
    tasks: &[T],
    mut on_done: impl FnMut(&Rollout, Option<&Attempt>),
) -> Result<(Vec<FinishedRollout>, f64), TrainError> {
    let mut resources = plan.resources();
    resources.extend(extra);
    store
        .update_resources(&plan.resources_id, resources)
        .await?;
    let requests = tasks
        .iter()
        .map(|t| {
            let input = serde_json::to_value(t)
                .map_err(|e| TrainError::Config(format!("a task is not JSON: {e}")))?;
            let mut r = EnqueueRolloutRequest::new(input);
            r.mode = Some(plan.mode);
            r.resources_id = Some(plan.resources_id.clone());
            r.config = plan.config.clone();
            Ok(r)
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    let ids: Vec<String> = store
        .enqueue_many(requests)
        .await?
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();

    let started = Instant::now();
    let stop = CancellationToken::new();
    // A batch whose future is dropped (an interrupted search or loop) stops its workers: they
    // take no further rollout, and the server they call can shut down.
    let _stop_on_drop = stop.clone().drop_guard();
    let mut workers = pool.spawn(store, plan.workers.min(ids.len()), &stop);
    let mut seen: HashSet<String> = HashSet::new();
    let external = pool.external();
    let mut progress = Progress::new(pool.idle_warning());
    let mut failure = None;
    let failed = |e: Result<Result<IterReport, TrainError>, tokio::task::JoinError>| match e {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!("a runner worker failed: {e}")),
        Err(e) => Some(format!("a runner worker stopped: {e}")),
    };
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for r in store.wait_for_rollouts(&ids, Some(Duration::ZERO)).await? {
            if !seen.insert(r.rollout_id.clone()) {
                continue;
            }
            let attempt = store.get_latest_attempt(&r.rollout_id).await?;
            on_done(&r, attempt.as_ref());
        }
        if external {
            if seen.len() == ids.len() {
                break;
            }
            progress.check(store.as_ref(), &ids, &seen).await?;
            continue;
        }
        if let Some(i) = workers.iter().position(|w| w.is_finished()) {
            failure = failed(workers.swap_remove(i).await);
            if failure.is_some() {
                stop.cancel();
                break;
            }
        }
        if seen.len() == ids.len() {
            break;
        }
        // A worker returns once the queue is empty, after reporting its last rollout. A
        // rollout the store requeued afterwards (a retry of a failed or timed-out attempt)
        // gets workers again; otherwise every rollout is finished.
        if workers.is_empty() {
            let waiting = waiting_in_queue(store.as_ref(), &ids, &seen).await?;
            if waiting == 0 {
                break;
            }
            workers = pool.spawn(store, plan.workers.min(waiting), &stop);
        }
    }
    for w in workers {
        if let Some(f) = failed(w.await) {
            failure.get_or_insert(f);
        }
    }
    if let Some(f) = failure {
        return Err(TrainError::Runner(f));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(ids.len());
    for (index, id) in ids.iter().enumerate() {
        let rollout = store.get_rollout_by_id(id).await?.ok_or_else(|| {
            TrainError::Runner(format!("rollout {id} disappeared from the store"))
        })?;
        let attempt = store.get_latest_attempt(id).await?;
        let spans = store.list_spans(id, Some("latest")).await?;
        out.push(FinishedRollout {
            rollout_id: id.clone(),
            index,
            rollout,
            attempt,
            spans,
        });
    }
    Ok((out, seconds))
}

/// How many of the batch's rollouts not yet seen finished wait in the queue (`queuing` or
/// `requeuing`).
async fn waiting_in_queue(
    store: &dyn LightningStore,
    ids: &[String],
    seen: &HashSet<String>,
) -> Result<usize, TrainError> {
    let pending: Vec<String> = ids.iter().filter(|i| !seen.contains(*i)).cloned().collect();
    let query = RolloutQuery {
        status_in: Some(vec![RolloutStatus::Queuing, RolloutStatus::Requeuing]),
        rollout_id_in: Some(pending),
        ..RolloutQuery::default()
    };
    Ok(store.query_rollouts(query).await?.items.len())
}

/// How a batch served by external runners is progressing: the number of its rollouts still
/// queuing, read every few seconds, and when it last changed.
struct Progress {
    warn_after: Option<(Duration, String)>,
    last_change: Instant,
    last_checked: Instant,
    queuing: Option<usize>,
    finished: usize,
}

impl Progress {
    /// Seconds between two reads of the queue.
    const EVERY: Duration = Duration::from_secs(5);

    fn new(warn_after: Option<(Duration, &str)>) -> Self {
        let now = Instant::now();
        Self {
            warn_after: warn_after.map(|(d, h)| (d, h.to_string())),
            last_change: now,
            last_checked: now,
            queuing: None,
            finished: 0,
        }
    }

    async fn check(
        &mut self,
        store: &dyn LightningStore,
        ids: &[String],
        seen: &HashSet<String>,
    ) -> Result<(), TrainError> {
        let Some((after, hint)) = &self.warn_after else {
            return Ok(());
        };
        if self.last_checked.elapsed() < Self::EVERY {
            return Ok(());
        }
        self.last_checked = Instant::now();
        let queuing = waiting_in_queue(store, ids, seen).await?;
        if self.queuing != Some(queuing) || self.finished != seen.len() {
            self.queuing = Some(queuing);
            self.finished = seen.len();
            self.last_change = Instant::now();
        } else if self.last_change.elapsed() >= *after {
            tracing::warn!(
                "no rollout of this batch was dequeued or finished for {:.0} s ({} of {} still \
                 queuing, {} finished): is a runner serving this store? {hint}",
                after.as_secs_f64(),
                queuing,
                ids.len(),
                seen.len()
            );
            self.last_change = Instant::now();
        }
        Ok(())
    }
}

/// What a rollout means for training, as the task judges it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    /// Final reward (the algorithm's signal); `None` leaves the rollout out of the update (its
    /// group is judged without it) and counts it among the step's unrewarded rollouts.
    pub reward: Option<f64>,
    /// Violations the rollout had (`screen` drops the rollout when non-zero).
    pub violations: usize,
}

impl Judged {
    /// The judgement of an agent agl did not write, from what the store holds: the reward is
    /// the final reward span of the latest attempt ([`semconv::find_final_reward`]: Agent
    /// Lightning's `emit_reward` / a `@rollout`'s return value, or an exec agent's reported
    /// reward), `None` when the attempt did not succeed (`failed`, `timeout`, …) or wrote no
    /// reward; the violations are those the attempt's spans record: the runner's governance
    /// annotation (`agent_os.violations`) when there is one, else one per violation span the
    /// LLM gateway wrote ([`crate::gateway_violations`]).
    pub fn from_spans(f: &FinishedRollout) -> Judged {
        let reward = if f.succeeded() {
            semconv::find_final_reward(&f.spans)
        } else {
            None
        };
        let annotated = f.spans.iter().rev().find_map(|sp| {
            match sp.attributes.get(semconv::agent_os::VIOLATIONS) {
                Some(AttributeValue::Int(n)) => Some(usize::try_from(*n).unwrap_or(0)),
                _ => None,
            }
        });
        let violations = annotated.unwrap_or_else(|| crate::gateway_violations(&f.spans).len());
        Judged { reward, violations }
    }

    /// [`Judged::from_spans`] with the reward shaped on the algorithm side by `reward` (the
    /// seed's `PolicyReward`, for agents whose runner does not shape it): the agent's reward is
    /// the base, the gateway's violation spans of the attempt ([`crate::gateway_violations`])
    /// are the violations, and the step succeeded when the attempt did and no violation was
    /// blocked. A rollout with violations but no reward (typically an agent that stopped at a
    /// blocked answer) gets base 0 and its penalties, so the block is a training signal; one
    /// with neither stays `None`. Unchanged when `reward` does not shape
    /// ([`PolicyReward::shaped`]: the training mode records only) or when the runner already
    /// stored a shaped reward (a span with `agl.reward.unclamped`, which
    /// [`crate::GovernedRunner`] writes with [`crate::GovernedRunner::with_reward`]).
    pub fn shaped(f: &FinishedRollout, reward: &PolicyReward) -> Judged {
        let plain = Judged::from_spans(f);
        let already = f
            .spans
            .iter()
            .any(|sp| sp.attributes.contains_key(semconv::agl::REWARD_UNCLAMPED));
        if !reward.shaped() || already {
            return plain;
        }
        let violations = crate::gateway_violations(&f.spans);
        let base = match plain.reward {
            Some(r) => r,
            None if !violations.is_empty() => 0.0,
            None => return plain,
        };
        let succeeded = f.succeeded() && !violations.iter().any(|v| v.action_blocked);
        let shaped = reward.record(base, succeeded, &violations);
        Judged {
            reward: Some(shaped.final_reward),
            violations: plain.violations.max(violations.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentError, StepContext};
    use agl_store::InMemoryLightningStore;
    use serde_json::{Value, json};

    /// Answers with its input and the model its LLM resource names.
    struct Echo;

    #[async_trait::async_trait]
    impl Agent for Echo {
        type Input = u32;
        type Output = Value;
        async fn run(&self, input: &u32, ctx: &mut StepContext) -> Result<Value, AgentError> {
            let llm = ctx.llm_base_url(Some(DEFAULT_LLM_RESOURCE));
            Ok(json!({"input": input, "model": llm.map(|e| e.model)}))
        }
    }

    fn plan(workers: usize) -> BatchPlan {
        BatchPlan {
            resources_id: "batch-v0".into(),
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

    #[tokio::test]
    async fn a_batch_comes_back_in_task_order_with_its_resources() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let kernel = Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce));
        let pool = InProcessRunners::new(kernel, Arc::new(Echo));
        let tasks: Vec<u32> = (10..17).collect();
        let mut done = 0;
        let (finished, seconds) = run_batch(&store, &pool, &plan(3), &tasks, |r, a| {
            assert!(r.status.is_finished(), "{:?}", r.status);
            assert!(a.is_some());
            done += 1;
        })
        .await
        .unwrap();
        assert_eq!(done, tasks.len());
        assert!(seconds >= 0.0);
        assert_eq!(finished.len(), tasks.len());
        for (i, f) in finished.iter().enumerate() {
            assert_eq!(f.index, i);
            assert_eq!(f.rollout.input, json!(tasks[i]));
            assert_eq!(f.rollout.mode, Some(RolloutMode::Train));
            assert_eq!(f.rollout.resources_id.as_deref(), Some("batch-v0"));
            let output = &f.attempt.as_ref().unwrap().metadata.as_ref().unwrap()["output"];
            assert_eq!(output, &json!({"input": tasks[i], "model": "policy-v3"}));
            // the runner's governance annotation is always written
            assert!(!f.spans.is_empty());
        }
        let published = store
            .get_resources_by_id("batch-v0")
            .await
            .unwrap()
            .unwrap();
        match published.resources.get(DEFAULT_LLM_RESOURCE) {
            Some(Resource::ProxyLlm(llm)) => {
                assert_eq!(llm.endpoint, "http://127.0.0.1:9/v1");
                assert_eq!(llm.model, "policy-v3");
                assert_eq!(llm.sampling_parameters["temperature"], json!(0.7));
                assert_eq!(llm.sampling_parameters["max_tokens"], json!(16));
                assert!(!llm.sampling_parameters.contains_key("seed"));
            }
            other => panic!("expected a proxy_llm, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_external_pool_waits_for_runners_of_another_process() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let pool = ExternalRunners {
            idle_warning: Duration::from_secs(60),
            hint: "start one".into(),
        };
        assert!(pool.external());
        // The "other process": in-process workers that start a second after the batch.
        let late = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                let kernel = Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce));
                let runners = InProcessRunners::new(kernel, Arc::new(Echo));
                let stop = CancellationToken::new();
                for w in runners.spawn(&store, 2, &stop) {
                    w.await.unwrap().unwrap();
                }
            })
        };
        let started = Instant::now();
        let tasks: Vec<u32> = (0..5).collect();
        let (finished, _) = run_batch(&store, &pool, &plan(4), &tasks, |_, _| {})
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(1000));
        assert_eq!(finished.len(), 5);
        for (i, f) in finished.iter().enumerate() {
            assert_eq!(f.rollout.input, json!(tasks[i]));
            assert!(f.rollout.status.is_finished(), "{:?}", f.rollout.status);
        }
        late.await.unwrap();
    }

    /// Workers that serve one rollout each and return, failing every first attempt and
    /// finishing every later one.
    struct FlakyPool;

    impl RunnerPool for FlakyPool {
        fn spawn(
            &self,
            store: &Arc<dyn LightningStore>,
            count: usize,
            _stop: &CancellationToken,
        ) -> Vec<JoinHandle<Result<IterReport, TrainError>>> {
            (0..count)
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let mut report = IterReport::default();
                        let worker = format!("flaky-{i}");
                        if let Some(a) = store.dequeue_rollout(Some(&worker)).await? {
                            let status = if a.attempt.sequence_id == 1 {
                                agl_core::AttemptStatus::Failed
                            } else {
                                agl_core::AttemptStatus::Succeeded
                            };
                            let update = agl_store::AttemptUpdate {
                                status: Some(status),
                                ..Default::default()
                            };
                            store
                                .update_attempt(
                                    &a.rollout.rollout_id,
                                    &a.attempt.attempt_id,
                                    update,
                                )
                                .await?;
                            report.rollouts += 1;
                        }
                        Ok(report)
                    })
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn a_retried_rollout_gets_workers_again() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let plan = BatchPlan {
            config: Some(RolloutConfig {
                max_attempts: 2,
                retry_condition: vec![agl_core::AttemptStatus::Failed],
                ..RolloutConfig::default()
            }),
            ..plan(2)
        };
        let (finished, _) = run_batch(&store, &FlakyPool, &plan, &[1u32, 2, 3], |_, _| {})
            .await
            .unwrap();
        for f in &finished {
            let a = f.attempt.as_ref().unwrap();
            assert_eq!(a.sequence_id, 2, "{:?}", f.rollout.status);
            assert_eq!(a.status, agl_core::AttemptStatus::Succeeded);
        }
    }

    #[tokio::test]
    async fn a_plans_rollout_config_reaches_the_store() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let kernel = Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce));
        let pool = InProcessRunners::new(kernel, Arc::new(Echo));
        let config = RolloutConfig {
            max_attempts: 3,
            timeout_seconds: Some(30.0),
            ..RolloutConfig::default()
        };
        let plan = BatchPlan {
            config: Some(config.clone()),
            ..plan(1)
        };
        let (finished, _) = run_batch(&store, &pool, &plan, &[1u32], |_, _| {})
            .await
            .unwrap();
        assert_eq!(finished[0].rollout.config, config);
    }

    #[tokio::test]
    async fn a_seed_is_published_and_more_workers_than_tasks_is_fine() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let kernel = Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce));
        let pool = InProcessRunners::new(kernel, Arc::new(Echo));
        let plan = BatchPlan {
            seed: Some(7),
            mode: RolloutMode::Test,
            ..plan(8)
        };
        let (finished, _) = run_batch(&store, &pool, &plan, &[1u32], |_, _| {})
            .await
            .unwrap();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0].rollout.mode, Some(RolloutMode::Test));
        let r = store
            .get_resources_by_id("batch-v0")
            .await
            .unwrap()
            .unwrap();
        let Some(Resource::ProxyLlm(llm)) = r.resources.get(DEFAULT_LLM_RESOURCE) else {
            panic!("no proxy_llm");
        };
        assert_eq!(llm.sampling_parameters["seed"], json!(7));
    }

    /// Workers that take nothing and wait until they are told to stop; the pool keeps the
    /// tokens it was given.
    struct IdlePool(std::sync::Mutex<Vec<CancellationToken>>);

    impl RunnerPool for IdlePool {
        fn spawn(
            &self,
            _store: &Arc<dyn LightningStore>,
            count: usize,
            stop: &CancellationToken,
        ) -> Vec<JoinHandle<Result<IterReport, TrainError>>> {
            self.0.lock().unwrap().push(stop.clone());
            (0..count)
                .map(|_| {
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        stop.cancelled().await;
                        Ok(IterReport::default())
                    })
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn a_dropped_batch_stops_its_workers() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let pool = IdlePool(std::sync::Mutex::new(Vec::new()));
        let plan = plan(2);
        let batch = run_batch(&store, &pool, &plan, &[1u32, 2], |_, _| {});
        let waited = tokio::time::timeout(Duration::from_millis(600), batch).await;
        assert!(waited.is_err(), "the idle workers never finish the batch");
        let tokens = pool.0.lock().unwrap().clone();
        assert_eq!(tokens.len(), 1);
        assert!(
            tokens[0].is_cancelled(),
            "dropping the batch cancels its workers' token"
        );
    }

    fn finished(status: AttemptStatus, spans: Vec<agl_core::Span>) -> FinishedRollout {
        let rollout: Rollout = serde_json::from_value(serde_json::json!({
            "rollout_id": "ro-1", "input": {"q": 1}, "start_time": 0.0, "status": "succeeded"
        }))
        .unwrap();
        let attempt: Attempt = serde_json::from_value(serde_json::json!({
            "rollout_id": "ro-1", "attempt_id": "at-1", "sequence_id": 1, "start_time": 0.0,
            "status": status.as_str()
        }))
        .unwrap();
        FinishedRollout {
            rollout_id: "ro-1".into(),
            index: 0,
            rollout,
            attempt: Some(attempt),
            spans,
        }
    }

    fn reward_span(seq: i64, value: f64) -> agl_core::Span {
        agl_core::Span::new(
            "ro-1",
            "at-1",
            seq,
            semconv::AGL_ANNOTATION,
            semconv::reward_attributes(&[("primary", value)]),
        )
    }

    #[test]
    fn an_outside_agent_is_judged_by_its_last_reward_span_and_its_violations() {
        let mut gateway = agl_core::Attributes::new();
        gateway.insert(semconv::SOURCE_ATTR.into(), semconv::SOURCE_GATEWAY.into());
        gateway.insert("agent_os.violation.policy".into(), "sql".into());
        gateway.insert("agent_os.violation.severity".into(), "high".into());
        let spans = vec![
            reward_span(1, 0.2),
            agl_core::Span::new("ro-1", "at-1", 2, semconv::AGL_ANNOTATION, gateway),
            reward_span(3, 0.9),
        ];
        let j = Judged::from_spans(&finished(AttemptStatus::Succeeded, spans.clone()));
        assert_eq!(j.reward, Some(0.9));
        assert_eq!(j.violations, 1);
        // A failed or timed-out attempt has no reward, whatever its spans say.
        for status in [AttemptStatus::Failed, AttemptStatus::Timeout] {
            let j = Judged::from_spans(&finished(status, spans.clone()));
            assert_eq!(j.reward, None, "{status:?}");
        }
        // No reward span: none.
        let j = Judged::from_spans(&finished(AttemptStatus::Succeeded, Vec::new()));
        assert_eq!(
            j,
            Judged {
                reward: None,
                violations: 0
            }
        );
        // A runner's governance annotation, when present, is the count.
        let mut counted = agl_core::Attributes::new();
        counted.insert(semconv::agent_os::VIOLATIONS.into(), AttributeValue::Int(3));
        let spans = vec![agl_core::Span::new(
            "ro-1",
            "at-1",
            1,
            semconv::AGL_ANNOTATION,
            counted,
        )];
        let j = Judged::from_spans(&finished(AttemptStatus::Succeeded, spans));
        assert_eq!(j.violations, 3);
    }

    fn gateway_violation(seq: i64, blocked: bool) -> agl_core::Span {
        let mut a = agl_core::Attributes::new();
        a.insert(semconv::SOURCE_ATTR.into(), semconv::SOURCE_GATEWAY.into());
        a.insert("agent_os.violation.policy".into(), "sql".into());
        a.insert("agent_os.violation.severity".into(), "high".into());
        a.insert("agent_os.violation.blocked".into(), blocked.into());
        agl_core::Span::new("ro-1", "at-1", seq, semconv::AGL_ANNOTATION, a)
    }

    #[test]
    fn the_algorithm_side_shapes_an_outside_agents_reward() {
        let reward = PolicyReward::<(), ()>::new(crate::RewardConfig::default());
        // Clean and rewarded: base + the clean bonus (+5).
        let clean = finished(AttemptStatus::Succeeded, vec![reward_span(1, 1.0)]);
        assert_eq!(Judged::shaped(&clean, &reward).reward, Some(6.0));
        // A warned violation (high, −50) on a rewarded rollout: 1 − 50, no bonus.
        let warned = finished(
            AttemptStatus::Succeeded,
            vec![gateway_violation(1, false), reward_span(2, 1.0)],
        );
        let j = Judged::shaped(&warned, &reward);
        assert_eq!((j.reward, j.violations), (Some(-49.0), 1));
        // Blocked and the agent stopped without a reward: base 0 and the penalty.
        let blocked = finished(AttemptStatus::Failed, vec![gateway_violation(1, true)]);
        assert_eq!(Judged::shaped(&blocked, &reward).reward, Some(-50.0));
        // Neither reward nor violation: still left out.
        let silent = finished(AttemptStatus::Failed, Vec::new());
        assert_eq!(Judged::shaped(&silent, &reward).reward, None);
        // A mode that records only does not shape.
        let audit = PolicyReward::<(), ()>::new(crate::RewardConfig::default()).with_shaping(false);
        assert_eq!(Judged::shaped(&warned, &audit).reward, Some(1.0));
        // A runner that already shaped the reward is not shaped twice.
        let done = crate::RewardBreakdown::task_only(0.5, 0).annotation_attributes();
        assert!(done.contains_key(semconv::agl::REWARD_UNCLAMPED));
        let runner = finished(
            AttemptStatus::Succeeded,
            vec![agl_core::Span::new(
                "ro-1",
                "at-1",
                1,
                semconv::AGL_ANNOTATION,
                done,
            )],
        );
        assert_eq!(Judged::shaped(&runner, &reward).reward, Some(0.5));
        assert_eq!(reward.stats().total_rewards, 3);
    }
}
