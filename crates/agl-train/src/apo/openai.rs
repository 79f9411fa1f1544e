//! The optimiser over any OpenAI-compatible server (`/v1/chat/completions`, `/v1/models`), with
//! the `async-openai` client: agl's built-in engine (`agl llm serve`), vLLM, Ollama, OpenAI.
//!
//! Responsible for one chat completion and the start-up check that the server answers and
//! serves the named models; not for what is asked.

use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest,
};

use super::{ChatTurn, Completion, TextModel};

/// An OpenAI-compatible chat model.
#[derive(Clone)]
pub struct OpenAiTextModel {
    client: Client<OpenAIConfig>,
    base_url: String,
    timeout: Duration,
}

impl std::fmt::Debug for OpenAiTextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiTextModel")
            .field("base_url", &self.base_url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiTextModel {
    /// A client of `base_url` (ending in `/v1`), with `api_key` (`EMPTY` when `None`) and a
    /// time limit per request.
    pub fn new(base_url: &str, api_key: Option<String>, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let base_url = base_url.trim_end_matches('/').to_string();
        let config = OpenAIConfig::new()
            .with_api_base(&base_url)
            .with_api_key(api_key.unwrap_or_else(|| "EMPTY".into()));
        Ok(Self {
            client: Client::build(http, config),
            base_url,
            timeout,
        })
    }

    /// The server's address.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Checks that the server answers `GET /models` and lists every one of `models`; the error
    /// is one line naming the server, or the missing model and what is served.
    pub async fn check(&self, models: &[&str]) -> Result<(), String> {
        let listed = self.client.models().list().await.map_err(|e| {
            format!(
                "the optimizer at {} is not reachable: {}",
                self.base_url,
                describe(&e, self.timeout)
            )
        })?;
        let served: Vec<String> = listed.data.into_iter().map(|m| m.id).collect();
        for m in models {
            if !served.iter().any(|s| s == m) {
                return Err(format!(
                    "the optimizer at {} does not serve the model `{m}` (it serves: {})",
                    self.base_url,
                    if served.is_empty() {
                        "nothing".to_string()
                    } else {
                        served.join(", ")
                    }
                ));
            }
        }
        Ok(())
    }
}

fn describe(e: &OpenAIError, timeout: Duration) -> String {
    match e {
        OpenAIError::ApiError(e) => format!("HTTP {}: {}", e.status_code.as_u16(), e.api_error),
        OpenAIError::Reqwest(r) if r.is_timeout() => {
            format!("no answer within {:.0} s", timeout.as_secs_f64())
        }
        OpenAIError::Reqwest(r) if r.is_connect() => format!("cannot connect ({r})"),
        e => e.to_string(),
    }
}

#[async_trait::async_trait]
impl TextModel for OpenAiTextModel {
    async fn complete(
        &self,
        model: &str,
        messages: &[ChatTurn],
        temperature: f64,
        max_tokens: u32,
    ) -> Result<Completion, String> {
        let messages: Vec<ChatCompletionRequestMessage> = messages
            .iter()
            .map(|m| match m.role {
                "system" => ChatCompletionRequestSystemMessage::from(m.content.as_str()).into(),
                _ => ChatCompletionRequestUserMessage::from(m.content.as_str()).into(),
            })
            .collect();
        let req = CreateChatCompletionRequest {
            model: model.to_string(),
            messages,
            temperature: Some(temperature as f32),
            max_completion_tokens: Some(max_tokens),
            ..CreateChatCompletionRequest::default()
        };
        let resp = self
            .client
            .chat()
            .create(req)
            .await
            .map_err(|e| describe(&e, self.timeout))?;
        let (prompt_tokens, completion_tokens) = resp.usage.as_ref().map_or((0, 0), |u| {
            (u64::from(u.prompt_tokens), u64::from(u.completion_tokens))
        });
        let text = resp
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .unwrap_or_default();
        Ok(Completion {
            text,
            prompt_tokens,
            completion_tokens,
        })
    }
}
