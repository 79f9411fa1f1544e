//! The Spider LLM agent's rollouts through an in-process store and gateway: what `agl eval
//! --agent llm` and `agl train --agent llm` wire.
//!
//! [`LlmStage::start`] starts an in-memory store and its HTTP server with the governed gateway
//! on 127.0.0.1 (a free port) over the built-in engine's router (or an HTTP upstream), and
//! holds the pool of runner workers ([`agl_train::InProcessRunners`]) running
//! [`LlmSqlAgent`] under the stage's kernel and reward. [`LlmStage::run`] runs one batch
//! ([`agl_train::run_batch`]) and reads each rollout's row ([`agl_spider::sql_eval_row`]).
//! [`EngineServing`] is the serving side of `agl-train`'s LLM loop
//! ([`agl_train::PolicyServing`]): adapter versions go to the engine, calls to the gateway.
//!
//! Responsible for wiring and moving the progress bar; not for the bar itself
//! ([`crate::out::progress`]), the batch and the loop (`agl-train`), the agent and its reward
//! (`agl-spider`), the gateway (`agl-server`) or the commands' flags.

use std::sync::Arc;
use std::time::Duration;

use agl_core::NamedResources;
use agl_gov::Kernel;
use agl_llm::{Engine, LoraAdapter};
use agl_spider::{LlmSqlAgent, Question, SqlAgentOutput, SqlEvalRow, sql_eval_row};
use agl_store::{InMemoryLightningStore, LightningStore};
use agl_train::{
    BatchPlan, FinishedRollout, InProcessRunners, PolicyReward, PolicyServing, TrainError,
};
use anyhow::Context;
use indicatif::ProgressBar;

/// The store, its server with the gateway, and the runner pool.
pub struct LlmStage {
    /// The in-memory store.
    pub store: Arc<dyn LightningStore>,
    /// The runner workers' pool.
    pub runners: InProcessRunners<LlmSqlAgent>,
    server: agl_server::RunningServer,
}

impl LlmStage {
    /// Starts the store server with the gateway over `upstream`, checking the model's output
    /// with `kernel` (which also checks the agent's statements).
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
            runners: InProcessRunners::new(kernel, agent).with_reward(reward),
            server,
        })
    }

    /// The gateway's OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`).
    pub fn endpoint(&self) -> String {
        format!("{}/v1", self.server.url())
    }

    /// Stops the server.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.server.shutdown().await?;
        Ok(())
    }

    /// Runs one rollout per question through the gateway (the plan's endpoint is set to it)
    /// and returns them in question order with their rows, and the seconds the rollouts took.
    /// `on_done` is told each finished row (without spans) and the bar moves.
    pub async fn run(
        &self,
        plan: &BatchPlan,
        questions: &[Question],
        bar: &ProgressBar,
        on_done: impl FnMut(&SqlEvalRow),
    ) -> anyhow::Result<(Vec<(FinishedRollout, SqlEvalRow)>, f64)> {
        self.run_with(plan, NamedResources::new(), questions, bar, on_done)
            .await
    }

    /// [`LlmStage::run`] publishing `extra` resources beside the LLM (a `prompt_template`).
    pub async fn run_with(
        &self,
        plan: &BatchPlan,
        extra: NamedResources,
        questions: &[Question],
        bar: &ProgressBar,
        mut on_done: impl FnMut(&SqlEvalRow),
    ) -> anyhow::Result<(Vec<(FinishedRollout, SqlEvalRow)>, f64)> {
        let plan = BatchPlan {
            endpoint: self.endpoint(),
            ..plan.clone()
        };
        let (finished, seconds) = agl_train::run_batch_with(
            &self.store,
            &self.runners,
            &plan,
            extra,
            questions,
            |r, a| {
                on_done(&sql_eval_row(r, a, &[]));
                bar.inc(1);
            },
        )
        .await?;
        let rows = finished
            .into_iter()
            .map(|f| {
                let row = agl_spider::llm_train::row_of(&f);
                (f, row)
            })
            .collect();
        Ok((rows, seconds))
    }
}

/// The built-in engine as the LLM loop's serving side: versions are the engine's adapters,
/// calls go through a stage's gateway.
pub struct EngineServing {
    /// The engine.
    pub engine: Engine,
    /// The base model's served name.
    pub base: String,
    /// The gateway's base URL ([`LlmStage::endpoint`]).
    pub endpoint: String,
}

impl PolicyServing for EngineServing {
    fn base_model(&self) -> String {
        self.base.clone()
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    fn publish(&self, name: &str, adapter: &LoraAdapter) -> Result<(), TrainError> {
        self.engine.set_adapter(name, adapter.snapshot()?)?;
        Ok(())
    }

    fn retire(&self, name: &str) {
        self.engine.unload_adapter(name);
    }
}
