//! A Rust agent trained by `agl train --algorithm grpo`, served the way Agent Lightning's runner
//! serves a Python one: a [`GovernedRunner`] dequeues rollouts from a store server, runs the
//! agent on each task with the rollout's resources, and stores what it emitted.
//!
//! The agent answers a question with one model call through the LLM resource the trainer
//! published (`main_llm`, a `proxy_llm`: the call goes to the attempt's gateway route, which
//! records it with its token ids), inside an `answer` operation, and emits its reward: 1 when the
//! answer contains the task's `answer` (case-insensitive), else 0.
//!
//! ```text
//! printf '%s\n' '{"question": "What is the capital of France?", "answer": "Paris"}' > tasks.jsonl
//! agl train --algorithm grpo --train-dataset tasks.jsonl --runner none --port 4750 --steps 1 &
//! cargo run --example rust_agent -- http://127.0.0.1:4750
//! ```
//!
//! It serves until Ctrl-C (an empty queue is polled every 200 ms). The kernel is in audit mode:
//! the agent takes no action of its own for it to check; the gateway judges the model's
//! answers with the trainer's kernel.

use std::sync::Arc;
use std::time::Duration;

use agl_gov::{GovernanceMode, Kernel};
use agl_train::{Agent, AgentError, CancellationToken, GovernedRunner, StepContext};
use serde_json::{Value, json};

/// One question, one model call, a reward by substring match.
struct Answerer {
    http: reqwest::Client,
}

#[async_trait::async_trait]
impl Agent for Answerer {
    type Input = Value;
    type Output = String;

    async fn run(&self, task: &Value, ctx: &mut StepContext) -> Result<String, AgentError> {
        let question = task["question"]
            .as_str()
            .ok_or("the task has no `question`")?;
        let llm = ctx
            .llm_base_url(None)
            .ok_or("the rollout's resources have no LLM")?;
        let sampling = &llm.sampling_parameters;
        let body = json!({
            "model": llm.model,
            "messages": [{"role": "user", "content": question}],
            "temperature": sampling.get("temperature").cloned().unwrap_or(json!(0.0)),
            "max_tokens": sampling.get("max_tokens").cloned().unwrap_or(json!(64)),
        });
        let op = ctx
            .start_operation("answer")
            .agent("answerer")
            .input("question", question);
        let response: Value = self
            .http
            .post(format!("{}/chat/completions", llm.base_url))
            .bearer_auth(llm.api_key.as_deref().unwrap_or("agl"))
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let text = response["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ctx.end_operation(op.output(&text));
        let expected = task["answer"].as_str().unwrap_or_default().to_lowercase();
        let right = !expected.is_empty() && text.to_lowercase().contains(&expected);
        ctx.emit_reward(if right { 1.0 } else { 0.0 })?;
        Ok(text)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: rust_agent STORE_URL (the address `agl train` or `agl store` prints)")?;
    let store = Arc::new(agl_server::StoreClient::new(&url)?);
    let mut runner =
        GovernedRunner::new(Arc::new(Kernel::new(GovernanceMode::Audit))).log_violations(false);
    runner.init(Answerer {
        http: reqwest::Client::new(),
    });
    runner.init_worker(format!("rust-agent-{}", std::process::id()), store);
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            stop.cancel();
        });
    }
    eprintln!("rust_agent: serving {url} (Ctrl-C stops)");
    while !stop.is_cancelled() {
        let report = runner.iter(&stop).await?;
        if report.rollouts > 0 {
            eprintln!("rust_agent: {} rollouts", report.rollouts);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
