//! The [`PromptEvaluator`] of any agent behind a LightningStore: each candidate is published
//! as Agent Lightning publishes it and its rollouts run through the store like GRPO's.
//!
//! A candidate's resources, under its version as the resources id (upserted with
//! `update_resources`): the plan's LLM resource (`main_llm` by default, a `proxy_llm`) and
//! `{"resource_type": "prompt_template", "template": …, "engine": "f-string"}` under
//! [`StoreEvaluator::template_resource`] (`prompt_template` by default). Agents read it from
//! their resources: a Python `@rollout` agent's `resources["prompt_template"]`, an exec agent's
//! `AGL_RESOURCES`. One rollout per task in the mode asked (`train` for critiques, `val` for
//! scores), through [`run_batch_with`]; each finished rollout becomes an [`Experiment`]:
//! - `reward`: the caller's judge ([`Judged`]; for `agl train`, the training mode's reward);
//! - `status`: the latest attempt's status (`none` without an attempt);
//! - `violations`: the gateway's violation spans ([`gateway_violations`]: policy, severity,
//!   reason, blocked), else the policies an in-process runner's governance annotation names
//!   (severity and reason unknown there);
//! - `messages`: the rollout's LLM calls as chat messages ([`TraceToMessages`]); a call whose
//!   messages are all repeated at the start of the next call (a chat agent's growing history)
//!   is not repeated.
//!
//! Responsible for that mapping; not for the runners, the store or the search.

use std::sync::Arc;

use agl_core::{
    AttributeValue, NamedResources, PromptEngine, PromptTemplate, Resource, RolloutMode, semconv,
};
use agl_store::LightningStore;
use serde_json::Value;

use super::{Candidate, Experiment, PromptEvaluator, ViolationNote};
use crate::error::TrainError;
use crate::messages_adapter::TraceToMessages;
use crate::rollout_batch::Judged;
use crate::rollout_batch::{BatchPlan, FinishedRollout, RunnerPool, run_batch_with};
use crate::runner::gateway_violations;

/// The resource name of the prompt template unless configured otherwise (Agent Lightning's
/// examples read `prompt_template`).
pub const DEFAULT_TEMPLATE_RESOURCE: &str = "prompt_template";

/// A judge of finished rollouts.
pub type Judge<'a> = &'a (dyn Fn(&FinishedRollout) -> Judged + Send + Sync);

/// Candidates' rollouts through a store (module docs).
pub struct StoreEvaluator<'a> {
    /// The store.
    pub store: &'a Arc<dyn LightningStore>,
    /// Who serves its queue.
    pub runners: &'a dyn RunnerPool,
    /// The LLM resource, sampling and rollout settings; its `resources_id` and `mode` are
    /// replaced per evaluation.
    pub plan: BatchPlan,
    /// The prompt template's resource name.
    pub template_resource: String,
    /// The reward of a finished rollout.
    pub judge: Judge<'a>,
    /// Spans to messages.
    pub messages: TraceToMessages,
}

#[async_trait::async_trait]
impl PromptEvaluator for StoreEvaluator<'_> {
    async fn evaluate(
        &self,
        candidate: Candidate<'_>,
        tasks: &[Value],
        mode: RolloutMode,
    ) -> Result<Vec<Experiment>, TrainError> {
        let plan = BatchPlan {
            resources_id: candidate.version.to_string(),
            mode,
            ..self.plan.clone()
        };
        let mut extra = NamedResources::new();
        extra.insert(
            self.template_resource.clone(),
            Resource::PromptTemplate(PromptTemplate {
                template: candidate.template.to_string(),
                engine: PromptEngine::FString,
            }),
        );
        let (finished, _) =
            run_batch_with(self.store, self.runners, &plan, extra, tasks, |_, _| {}).await?;
        Ok(finished.iter().map(|f| self.experiment(f)).collect())
    }
}

impl StoreEvaluator<'_> {
    fn experiment(&self, f: &FinishedRollout) -> Experiment {
        let judged = (self.judge)(f);
        let status = f
            .attempt
            .as_ref()
            .map_or("none", |a| a.status.as_str())
            .to_string();
        let mut violations: Vec<ViolationNote> = gateway_violations(&f.spans)
            .into_iter()
            .map(|v| ViolationNote {
                policy: v.policy_name,
                severity: v.severity.as_str().to_string(),
                reason: v.description,
                blocked: v.action_blocked,
            })
            .collect();
        if violations.is_empty() {
            let named = f.spans.iter().rev().find_map(|sp| {
                match sp.attributes.get(semconv::agent_os::POLICIES_VIOLATED) {
                    Some(AttributeValue::StrArray(p)) => Some(p.clone()),
                    _ => None,
                }
            });
            violations = named
                .unwrap_or_default()
                .into_iter()
                .map(|policy| ViolationNote {
                    policy,
                    severity: "unknown".into(),
                    reason: String::new(),
                    blocked: false,
                })
                .collect();
        }
        // No spans (EmptyTrace) or unreadable ones: the critic reads no messages.
        let conversations = self
            .messages
            .adapt(&f.spans)
            .map(|r| r.conversations)
            .unwrap_or_default();
        let mut messages = Vec::new();
        for (i, c) in conversations.iter().enumerate() {
            let repeated = conversations
                .get(i + 1)
                .is_some_and(|next| next.messages.starts_with(&c.messages));
            if !repeated {
                messages.extend(c.messages.iter().cloned());
            }
        }
        Experiment {
            status,
            reward: judged.reward,
            violations,
            messages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout_batch::{DEFAULT_LLM_RESOURCE, InProcessRunners};
    use crate::{Agent, AgentError, StepContext};
    use agl_core::FStringTemplate;
    use agl_gov::Kernel;
    use agl_store::InMemoryLightningStore;
    use serde_json::json;

    /// Renders its resources' prompt template with the task's question; reward 1 when the
    /// prompt asks for SQL.
    struct Templated;

    #[async_trait::async_trait]
    impl Agent for Templated {
        type Input = Value;
        type Output = String;
        async fn run(&self, task: &Value, ctx: &mut StepContext) -> Result<String, AgentError> {
            let template = match ctx
                .resources()
                .and_then(|r| r.get(DEFAULT_TEMPLATE_RESOURCE))
            {
                Some(Resource::PromptTemplate(t)) => t.template.clone(),
                other => return Err(format!("no template: {other:?}").into()),
            };
            let question = task["question"].as_str().unwrap_or_default();
            let prompt = FStringTemplate::parse(&template)
                .and_then(|t| t.render(&[("question", question)]))
                .map_err(|e| e.to_string())?;
            ctx.emit_reward(if prompt.contains("SQL") { 1.0 } else { 0.0 })?;
            Ok(prompt)
        }
    }

    #[tokio::test]
    async fn candidates_are_published_with_their_template_and_scored_from_the_store() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let kernel = Arc::new(Kernel::new(agl_gov::GovernanceMode::Enforce));
        let pool = InProcessRunners::new(kernel, Arc::new(Templated));
        let judge = |f: &FinishedRollout| Judged::from_spans(f);
        let evaluator = StoreEvaluator {
            store: &store,
            runners: &pool,
            plan: BatchPlan {
                resources_id: String::new(),
                llm_resource: DEFAULT_LLM_RESOURCE.into(),
                endpoint: "http://127.0.0.1:9/v1".into(),
                model: "policy".into(),
                temperature: 0.0,
                max_tokens: 16,
                seed: None,
                mode: RolloutMode::Train,
                workers: 2,
                config: None,
            },
            template_resource: DEFAULT_TEMPLATE_RESOURCE.into(),
            judge: &judge,
            messages: TraceToMessages::default(),
        };
        let tasks = vec![json!({"question": "a?"}), json!({"question": "b?"})];
        let good = evaluator
            .evaluate(
                Candidate {
                    version: "run-v1",
                    template: "Write SQL for {question}",
                },
                &tasks,
                RolloutMode::Val,
            )
            .await
            .unwrap();
        let bad = evaluator
            .evaluate(
                Candidate {
                    version: "run-v2",
                    template: "Answer {question}",
                },
                &tasks,
                RolloutMode::Train,
            )
            .await
            .unwrap();
        assert_eq!(good.len(), 2);
        for e in &good {
            assert_eq!((e.status.as_str(), e.reward), ("succeeded", Some(1.0)));
            assert!(e.violations.is_empty());
        }
        assert!(bad.iter().all(|e| e.reward == Some(0.0)));
        let published = store.get_resources_by_id("run-v1").await.unwrap().unwrap();
        assert_eq!(
            published.resources.get(DEFAULT_TEMPLATE_RESOURCE),
            Some(&Resource::PromptTemplate(PromptTemplate {
                template: "Write SQL for {question}".into(),
                engine: PromptEngine::FString,
            }))
        );
        assert!(matches!(
            published.resources.get(DEFAULT_LLM_RESOURCE),
            Some(Resource::ProxyLlm(_))
        ));
        // The rollouts carry the candidate's version and the mode asked.
        let rollouts = store
            .query_rollouts(agl_store::RolloutQuery::default())
            .await
            .unwrap();
        let of = |v: &str| {
            rollouts
                .items
                .iter()
                .map(|r| r.rollout())
                .filter(|r| r.resources_id.as_deref() == Some(v))
                .map(|r| r.mode)
                .collect::<Vec<_>>()
        };
        assert_eq!(of("run-v1"), [Some(RolloutMode::Val); 2]);
        assert_eq!(of("run-v2"), [Some(RolloutMode::Train); 2]);
    }
}
