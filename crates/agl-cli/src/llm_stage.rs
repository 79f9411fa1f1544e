//! Rollouts of the Spider LLM agent through an in-process store and gateway: what `agl eval
//! --agent llm` and `agl train --agent llm` share.
//!
//! [`LlmStage`] starts the built-in engine's router (or takes an HTTP upstream), an in-memory
//! store and its HTTP server with the governed gateway on 127.0.0.1 (a free port);
//! [`LlmStage::run`] publishes a resources version whose `main_llm` is a `proxy_llm` naming
//! the model (or adapter) and sampling parameters, enqueues one rollout per question, serves
//! them with governed runner workers (concurrently, so the engine batches their calls) and
//! reads every rollout back with its attempt's spans.
//!
//! Responsible for wiring and moving the progress bar; not for the bar itself
//! ([`crate::out::progress`]), the agent and its reward (`agl-train`), the gateway
//! (`agl-server`) or the commands' flags. It stays in the binary until it moves to a library.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::{EnqueueRolloutRequest, LlmResource, NamedResources, Resource, RolloutMode, Span};
use agl_gov::Kernel;
use agl_spider::Question;
use agl_spider::{LlmSqlAgent, SqlAgentOutput, SqlEvalRow, sql_eval_row};
use agl_store::{InMemoryLightningStore, LightningStore};
use agl_train::{CancellationToken, GovernedRunner, PolicyReward};
use anyhow::{Context, bail};
use indicatif::ProgressBar;

/// One finished rollout: its id, the question's position in the batch, its row and spans.
#[derive(Debug)]
pub struct Finished {
    /// The rollout's id.
    pub rollout_id: String,
    /// Index of its question in the batch given to [`LlmStage::run`].
    pub index: usize,
    /// The metrics row ([`sql_eval_row`]).
    pub row: SqlEvalRow,
    /// The latest attempt's spans, in sequence order.
    pub spans: Vec<Span>,
}

/// How one batch of rollouts is sampled and served.
#[derive(Debug, Clone)]
pub struct BatchPlan {
    /// The resources id to publish (a new version per batch when the model changes).
    pub resources_id: String,
    /// The model or adapter name the agent's calls name.
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
    /// Concurrent runner workers.
    pub workers: usize,
}

/// The store, its server with the gateway, the agent, the kernel and the reward.
pub struct LlmStage {
    /// The in-memory store.
    pub store: Arc<dyn LightningStore>,
    server: agl_server::RunningServer,
    kernel: Arc<Kernel>,
    agent: Arc<LlmSqlAgent>,
    reward: Arc<PolicyReward<Question, SqlAgentOutput>>,
}

impl LlmStage {
    /// Starts the store server with the gateway over `upstream`, checking the model's output
    /// with `kernel`.
    pub async fn start(
        upstream: agl_server::Upstream,
        kernel: Arc<Kernel>,
        agent: Arc<LlmSqlAgent>,
        reward: Arc<PolicyReward<Question, SqlAgentOutput>>,
        request_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let gateway = agl_server::GatewayConfig {
            upstream,
            kernel: Some(kernel.clone()),
            request_timeout,
        };
        let config = agl_server::ServerConfig {
            port: 0,
            ..agl_server::ServerConfig::default()
        };
        let server = agl_server::start_with_gateway(store.clone(), config, Some(gateway))
            .await
            .context("starting the store server with the LLM gateway")?;
        Ok(Self {
            store,
            server,
            kernel,
            agent,
            reward,
        })
    }

    /// Stops the server.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.server.shutdown().await?;
        Ok(())
    }

    /// Runs one rollout per question (see the module docs) and returns them in question
    /// order, with the seconds the rollouts took. `on_done` is told each finished row.
    pub async fn run(
        &self,
        plan: &BatchPlan,
        questions: &[Question],
        bar: &ProgressBar,
        mut on_done: impl FnMut(&SqlEvalRow),
    ) -> anyhow::Result<(Vec<Finished>, f64)> {
        let store = &self.store;
        let mut sampling = serde_json::Map::new();
        sampling.insert("temperature".into(), serde_json::json!(plan.temperature));
        sampling.insert("max_tokens".into(), serde_json::json!(plan.max_tokens));
        if let Some(seed) = plan.seed {
            sampling.insert("seed".into(), serde_json::json!(seed));
        }
        let mut resources = NamedResources::new();
        resources.insert(
            "main_llm".into(),
            Resource::ProxyLlm(LlmResource {
                endpoint: format!("{}/v1", self.server.url()),
                model: plan.model.clone(),
                api_key: None,
                sampling_parameters: sampling,
            }),
        );
        store
            .update_resources(&plan.resources_id, resources)
            .await?;
        let requests = questions
            .iter()
            .map(|q| {
                let mut r = EnqueueRolloutRequest::new(serde_json::to_value(q)?);
                r.mode = Some(plan.mode);
                r.resources_id = Some(plan.resources_id.clone());
                Ok(r)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ids: Vec<String> = store
            .enqueue_many(requests)
            .await?
            .into_iter()
            .map(|r| r.rollout_id)
            .collect();

        let started = Instant::now();
        let stop = CancellationToken::new();
        let pid = std::process::id();
        let mut workers = Vec::new();
        for i in 0..plan.workers.min(ids.len()) {
            let mut runner = GovernedRunner::new(self.kernel.clone())
                .log_violations(false)
                .with_reward(self.reward.clone());
            runner.init_shared(self.agent.clone());
            runner.init_worker(format!("Agent-{pid}-{i}"), store.clone());
            let stop = stop.clone();
            workers.push(tokio::spawn(async move { runner.iter(&stop).await }));
        }
        let mut seen: HashSet<String> = HashSet::new();
        let mut failure = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            for r in store.wait_for_rollouts(&ids, Some(Duration::ZERO)).await? {
                if !seen.insert(r.rollout_id.clone()) {
                    continue;
                }
                let attempt = store.get_latest_attempt(&r.rollout_id).await?;
                on_done(&sql_eval_row(&r, attempt.as_ref(), &[]));
                bar.inc(1);
            }
            if let Some(i) = workers.iter().position(|w| w.is_finished()) {
                let w = workers.swap_remove(i);
                match w.await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => failure = Some(format!("a runner worker failed: {e}")),
                    Err(e) => failure = Some(format!("a runner worker stopped: {e}")),
                }
                if failure.is_some() {
                    stop.cancel();
                    break;
                }
            }
            // A worker returns once the queue is empty, after reporting its last rollout: when
            // none is left, every rollout is finished.
            if workers.is_empty() || seen.len() == ids.len() {
                break;
            }
        }
        for w in workers {
            match w.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    failure.get_or_insert(format!("a runner worker failed: {e}"));
                }
                Err(e) => {
                    failure.get_or_insert(format!("a runner worker stopped: {e}"));
                }
            }
        }
        if let Some(f) = failure {
            bail!(f);
        }
        let seconds = started.elapsed().as_secs_f64();
        let mut out = Vec::with_capacity(ids.len());
        for (index, id) in ids.iter().enumerate() {
            let rollout = store
                .get_rollout_by_id(id)
                .await?
                .with_context(|| format!("rollout {id} disappeared from the store"))?;
            let attempt = store.get_latest_attempt(id).await?;
            let spans = store.list_spans(id, Some("latest")).await?;
            out.push(Finished {
                rollout_id: id.clone(),
                index,
                row: sql_eval_row(&rollout, attempt.as_ref(), &spans),
                spans,
            });
        }
        Ok((out, seconds))
    }
}
