//! `POST /v1/chat/completions`: OpenAI's Chat Completions over the engine.
//!
//! The messages are rendered with the model's chat template (`tools` passed to it, the
//! assistant's header appended unless `add_generation_prompt` is false) and tokenized without
//! adding special tokens (the template writes them), as vLLM does; a `null` content renders as
//! empty text and tool-call arguments as objects (see `normalize_messages`). A request without
//! `max_tokens` / `max_completion_tokens` may generate until the context is full (vLLM's
//! default), or at most the server's `default_max_tokens` (`agl llm serve
//! --max-tokens-default`). Not responsible for
//! sampling (the engine) or tool-call parsing (`content` is the raw generated text).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;
use super::generate::{
    self, ChunkFormat, Merged, Timing, finite_logprob, sse_data, stop_reason_json,
};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob, Delta, TopLogprob, Usage,
};
use super::{AppState, from_value, parse_body};
use crate::engine::{Engine, FinishReason, StopReason, TokenLogprob};

const ENDPOINT: &str = "/v1/chat/completions";

/// The handler.
pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match chat(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Every template sees `content` as a string, as vLLM renders it: a list of parts becomes one
/// string (text parts joined by newlines), and a `null` or missing `content` (an assistant turn
/// that only calls tools, as LangChain and the OpenAI Agents SDK send it) becomes `""`. An
/// assistant's `tool_calls[].function.arguments` given as a JSON string (OpenAI's shape) is
/// parsed into the object it encodes, so a template's `tojson` does not encode it twice;
/// arguments that are not valid JSON are a 400 naming the field.
fn normalize_messages(messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            let Some(obj) = m.as_object_mut() else {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    Some(&format!("messages[{i}]")),
                    format!("invalid type for `messages[{i}]`: a message must be an object"),
                ));
            };
            if !obj.get("role").is_some_and(Value::is_string) {
                return Err(ApiError::invalid(&format!("messages[{i}].role"), format!("`messages[{i}].role` must be a string")));
            }
            if obj.get("content").is_none_or(Value::is_null) {
                obj.insert("content".into(), Value::String(String::new()));
            }
            if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
                for (j, call) in calls.iter_mut().enumerate() {
                    let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments"))
                    else {
                        continue;
                    };
                    if let Value::String(text) = args {
                        let parsed: Value = serde_json::from_str(text).map_err(|e| {
                            ApiError::invalid(
                                &format!("messages[{i}].tool_calls[{j}].function.arguments"),
                                format!(
                                    "`messages[{i}].tool_calls[{j}].function.arguments` is not \
                                     valid JSON: {e}"
                                ),
                            )
                        })?;
                        *args = parsed;
                    }
                }
            }
            if let Some(Value::Array(parts)) = obj.get("content") {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, part) in parts.iter().enumerate() {
                    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => texts.push(t.to_string()),
                        _ => {
                            return Err(ApiError::unsupported(
                                &format!("messages[{i}].content[{j}]"),
                                "only text content parts (`{\"type\": \"text\", \"text\": …}`) are supported",
                            ));
                        }
                    }
                }
                obj.insert("content".into(), Value::String(texts.join("\n")));
            }
            Ok(m)
        })
        .collect()
}

/// One chat `logprobs.content` entry.
pub(crate) fn chat_logprob(engine: &Engine, lp: &TokenLogprob) -> ChatTokenLogprob {
    let tok = engine.tokenizer();
    ChatTokenLogprob {
        token: tok.token_text(lp.token_id),
        logprob: finite_logprob(lp.logprob),
        bytes: tok.token_bytes(lp.token_id),
        top_logprobs: lp
            .top
            .iter()
            .map(|&(id, l)| TopLogprob {
                token: tok.token_text(id),
                logprob: finite_logprob(l),
                bytes: tok.token_bytes(id),
            })
            .collect(),
    }
}

async fn chat(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let value = parse_body(body)?;
    let mut req: ChatCompletionRequest = from_value(&value)?;
    req.common = from_value(&value)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (Some(true), k) => Some(k.unwrap_or(0)),
        (_, Some(k)) if k > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        _ => None,
    };
    let max_tokens = req.max_completion_tokens.or(req.common.max_tokens);
    let mut params = generate::sampling(&req.common, max_tokens, logprobs)?;
    let messages = normalize_messages(std::mem::take(&mut req.messages))?;
    let engine = state.engine.clone();
    let template = engine.chat_template().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template: use /v1/completions with a prompt",
        )
    })?;
    let text = template
        .render(
            &messages,
            req.tools.as_ref(),
            req.add_generation_prompt.unwrap_or(true),
        )
        .map_err(|e| ApiError::from_llm(e, "messages"))?;
    let prompt = engine
        .tokenizer()
        .encode(&text, false)
        .map_err(|e| ApiError::from_llm(e, "messages"))?;
    // The server's default for a request that names no limit, within the room the prompt
    // leaves (a prompt that fills the context is refused by the engine, naming both).
    if max_tokens.is_none()
        && let Some(default) = state.default_max_tokens
    {
        let room = engine.max_context().saturating_sub(prompt.len());
        if room > 0 {
            params.max_tokens = Some(default.min(room));
        }
    }
    let streams = generate::submit_all(
        &state,
        req.common.model.as_deref(),
        vec![prompt],
        &params,
        "messages",
    )?;
    let model = streams.first().map(|s| s.model.clone()).unwrap_or_default();
    let return_ids = req.common.return_token_ids.unwrap_or(false);
    let (merged, mut prompts) = Merged::new(streams);
    let prompt_ids = prompts.pop().unwrap_or_default();
    let timing = Timing::new(Arc::clone(&state), ENDPOINT, start);
    let id = generate::response_id("chatcmpl-");
    let created = generate::unix_now();

    if req.common.stream.unwrap_or(false) {
        let include_usage = req
            .common
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let prompt_tokens = prompt_ids.len();
        let format = ChatChunks {
            engine,
            id,
            created,
            model,
            n: params.n,
            include_usage,
            logprobs: logprobs.is_some(),
            prompt_token_ids: return_ids.then_some(prompt_ids),
        };
        return Ok(generate::sse_response(
            format,
            merged,
            params.n,
            prompt_tokens,
            timing,
        ));
    }

    let mut gathered = generate::gather(merged, params.n, timing).await?;
    let choices = gathered.pop().unwrap_or_default();
    let completion_tokens: usize = choices.iter().map(|c| c.token_ids.len()).sum();
    let choices = choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| ChatChoice {
            index,
            message: AssistantMessage {
                role: "assistant",
                content: c.text,
            },
            logprobs: logprobs.map(|_| ChatLogprobs {
                content: c
                    .logprobs
                    .iter()
                    .map(|lp| chat_logprob(&engine, lp))
                    .collect(),
            }),
            finish_reason: c.finish_reason.as_str(),
            stop_reason: stop_reason_json(&c.stop_reason),
            token_ids: return_ids.then_some(c.token_ids),
        })
        .collect();
    let usage = Usage {
        prompt_tokens: prompt_ids.len(),
        completion_tokens,
        total_tokens: prompt_ids.len() + completion_tokens,
    };
    let response = ChatCompletionResponse {
        id,
        object: "chat.completion",
        created,
        model,
        choices,
        usage,
        prompt_token_ids: return_ids.then_some(prompt_ids),
    };
    Ok(axum::Json(response).into_response())
}

/// The chunks of a streamed chat completion.
struct ChatChunks {
    engine: Engine,
    id: String,
    created: u64,
    model: String,
    n: usize,
    include_usage: bool,
    logprobs: bool,
    /// `Some` with `return_token_ids`; sent on the first chunk.
    prompt_token_ids: Option<Vec<u32>>,
}

impl ChatChunks {
    fn chunk(&self, choice: ChatChunkChoice, prompt_token_ids: Option<Vec<u32>>) -> Bytes {
        sse_data(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![choice],
            usage: self.include_usage.then_some(None),
            prompt_token_ids,
        })
    }
}

impl ChunkFormat for ChatChunks {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        for index in 0..self.n {
            let choice = ChatChunkChoice {
                index,
                delta: Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
                token_ids: None,
            };
            let prompt_token_ids = if index == 0 {
                self.prompt_token_ids.clone()
            } else {
                None
            };
            out.push_back(self.chunk(choice, prompt_token_ids));
        }
    }

    fn token(
        &mut self,
        _prompt: usize,
        index: usize,
        logprob: TokenLogprob,
        text: String,
        out: &mut VecDeque<Bytes>,
    ) {
        let with_ids = self.prompt_token_ids.is_some();
        if text.is_empty() && !self.logprobs && !with_ids {
            return;
        }
        let choice = ChatChunkChoice {
            index,
            delta: Delta {
                role: None,
                content: Some(text),
            },
            logprobs: self.logprobs.then(|| ChatLogprobs {
                content: vec![chat_logprob(&self.engine, &logprob)],
            }),
            finish_reason: None,
            stop_reason: None,
            token_ids: with_ids.then(|| vec![logprob.token_id]),
        };
        out.push_back(self.chunk(choice, None));
    }

    fn finished(
        &mut self,
        _prompt: usize,
        index: usize,
        reason: FinishReason,
        stop: Option<StopReason>,
        text: String,
        out: &mut VecDeque<Bytes>,
    ) {
        let choice = ChatChunkChoice {
            index,
            delta: Delta {
                role: None,
                content: (!text.is_empty()).then_some(text),
            },
            logprobs: None,
            finish_reason: Some(reason.as_str()),
            stop_reason: stop_reason_json(&stop),
            token_ids: self.prompt_token_ids.is_some().then(Vec::new),
        };
        out.push_back(self.chunk(choice, None));
    }

    fn usage(&mut self, usage: Usage) -> Option<Bytes> {
        self.include_usage.then(|| {
            sse_data(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage: Some(Some(usage)),
                prompt_token_ids: None,
            })
        })
    }
}
