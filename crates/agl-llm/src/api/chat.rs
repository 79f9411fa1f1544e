//! `POST /v1/chat/completions`: OpenAI's Chat Completions over the engine.
//!
//! The messages are rendered with the model's chat template (the assistant's header appended
//! unless `add_generation_prompt` is false) and tokenized without adding special tokens (the
//! template writes them), as vLLM does; a `null` content renders as empty text and tool-call
//! arguments as objects (see `normalize_messages`). Tools, `tool_choice` and `response_format`
//! follow [`super::tools`]: tools reach the template (or agl's hermes fallback when the
//! template ignores them), a forced tool choice or a JSON format constrains sampling, and the
//! answer's tool calls are parsed into `tool_calls`. A request without `max_tokens` /
//! `max_completion_tokens` may generate until the context is full (vLLM's default), or at most
//! the server's `default_max_tokens` (`agl llm serve --max-tokens-default`).
//!
//! Streaming with tool parsing on: text that may still become a tool call is held back (from
//! `<tool_call>` on, and an answer that starts like a json-style call: `{`, `[` or a code
//! fence around one; `ToolCallFormat::settled_content`); at the end
//! each parsed call is sent whole as one `delta.tool_calls` chunk (id, type, name and all of its
//! arguments), then the chunk with `finish_reason`. Text that parses as no call is sent as
//! content then. So a stream and a plain answer to the same request carry the same calls.

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
use super::tools::{ChatPlan, ToolCallFormat, check_schemas, fallback};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob, Delta, ToolCall, TopLogprob, Usage,
};
use super::{AppState, from_value, parse_body};
use crate::chat::ProblemKind;
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
            crate::chat::prepare_message(i, &mut m).map_err(|p| match p.kind {
                ProblemKind::NotAnObject => {
                    ApiError::bad_request("invalid_type", Some(&p.param), p.message)
                }
                ProblemKind::Invalid => ApiError::invalid(&p.param, p.message),
                ProblemKind::Unsupported => ApiError::unsupported(&p.param, p.message),
            })?;
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
    let engine = state.engine.clone();
    let template = engine.chat_template().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template: use /v1/completions with a prompt",
        )
    })?;
    let format = state.tool_call_parser.resolve(template);
    let plan = ChatPlan::read(&value, format)?;
    if !plan.tools.is_empty() {
        // Compiling a hostile schema can take seconds: not on the async runtime's threads.
        let (tools, engine) = (plan.tools.clone(), engine.clone());
        tokio::task::spawn_blocking(move || check_schemas(&tools, &engine))
            .await
            .map_err(|e| ApiError::internal(format!("checking the tools' schemas: {e}")))??;
    }
    let mut messages = normalize_messages(std::mem::take(&mut req.messages))?;
    let tools = Value::Array(plan.tools_raw.clone());
    let template_tools = if template.supports_tools() {
        (!plan.tools_raw.is_empty()).then_some(&tools)
    } else {
        messages = fallback::rewrite(
            messages,
            Some(&plan.tools_raw),
            format.unwrap_or(ToolCallFormat::Hermes),
        );
        None
    };
    let text = template
        .render(
            &messages,
            template_tools,
            req.add_generation_prompt.unwrap_or(true),
        )
        .map_err(|e| ApiError::from_llm(e, "messages"))?;
    params.constraint = plan.constraint.as_ref().map(|(c, _)| c.clone());
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
    )
    .map_err(|mut e| {
        // The engine names a grammar that does not compile `constraint`: name the request
        // field it came from.
        if e.param.as_deref() == Some("constraint")
            && let Some((_, field)) = &plan.constraint
        {
            e.message = e.message.replace("`constraint`", &format!("`{field}`"));
            e.param = Some(field.clone());
        }
        e
    })?;
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
            plan,
            texts: vec![String::new(); params.n],
            sent: vec![0; params.n],
            generated: vec![0; params.n],
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
        .map(|(index, c)| {
            let forced_token_positions = if return_ids {
                forced_positions(&c.logprobs)
            } else {
                Vec::new()
            };
            let outcome = plan.finish(c.text, c.finish_reason);
            ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant",
                    content: outcome.content,
                    tool_calls: outcome.tool_calls,
                },
                logprobs: logprobs.map(|_| ChatLogprobs {
                    content: c
                        .logprobs
                        .iter()
                        .map(|lp| chat_logprob(&engine, lp))
                        .collect(),
                }),
                finish_reason: outcome.finish_reason,
                stop_reason: stop_reason_json(&c.stop_reason),
                token_ids: return_ids.then_some(c.token_ids),
                forced_token_positions,
            }
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

/// Positions of the tokens a constraint forced.
fn forced_positions(logprobs: &[TokenLogprob]) -> Vec<usize> {
    logprobs
        .iter()
        .enumerate()
        .filter_map(|(i, lp)| lp.forced.then_some(i))
        .collect()
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
    /// The request's tools and format: whether text is parsed for tool calls.
    plan: ChatPlan,
    /// Per choice: the text generated so far.
    texts: Vec<String>,
    /// Per choice: how many bytes of it were sent as content.
    sent: Vec<usize>,
    /// Per choice: tokens generated so far (the next token's position).
    generated: Vec<usize>,
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

impl ChatChunks {
    /// Adds `text` to choice `index` and returns what may be sent as content now: all of it
    /// without tool parsing, else only what can no longer become a tool call.
    fn settle(&mut self, index: usize, text: String) -> String {
        let Some(format) = self.plan.parse else {
            return text;
        };
        let (Some(full), Some(sent)) = (self.texts.get_mut(index), self.sent.get_mut(index)) else {
            return text;
        };
        full.push_str(&text);
        let settled = format.settled_content(full);
        if settled <= *sent {
            return String::new();
        }
        let out = full.get(*sent..settled).unwrap_or("").to_string();
        *sent = settled;
        out
    }

    /// A chunk of choice `index` with new content or tool-call deltas only.
    fn delta_chunk(
        &self,
        index: usize,
        content: Option<String>,
        tool_calls: Option<Vec<ToolCall>>,
    ) -> Bytes {
        let choice = ChatChunkChoice {
            index,
            delta: Delta {
                role: None,
                content,
                tool_calls,
            },
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
            token_ids: None,
            forced_token_positions: Vec::new(),
        };
        self.chunk(choice, None)
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
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
                token_ids: None,
                forced_token_positions: Vec::new(),
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
        let position = self.generated.get(index).copied().unwrap_or(0);
        if let Some(g) = self.generated.get_mut(index) {
            *g += 1;
        }
        let text = self.settle(index, text);
        if text.is_empty() && !self.logprobs && !with_ids {
            return;
        }
        let choice = ChatChunkChoice {
            index,
            delta: Delta {
                role: None,
                content: Some(text),
                tool_calls: None,
            },
            logprobs: self.logprobs.then(|| ChatLogprobs {
                content: vec![chat_logprob(&self.engine, &logprob)],
            }),
            finish_reason: None,
            stop_reason: None,
            token_ids: with_ids.then(|| vec![logprob.token_id]),
            forced_token_positions: if with_ids && logprob.forced {
                vec![position]
            } else {
                Vec::new()
            },
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
        let (content, tool_calls, finish_reason) = match self.texts.get_mut(index) {
            Some(full) if self.plan.parse.is_some() => {
                full.push_str(&text);
                let sent = self.sent.get(index).copied().unwrap_or(0);
                let outcome = self.plan.finish(std::mem::take(full), reason);
                let content = outcome
                    .content
                    .as_deref()
                    .and_then(|c| c.get(sent..))
                    .unwrap_or("")
                    .to_string();
                (content, outcome.tool_calls, outcome.finish_reason)
            }
            _ => (text, Vec::new(), reason.as_str()),
        };
        if !content.is_empty() {
            out.push_back(self.delta_chunk(index, Some(content), None));
        }
        for (j, call) in tool_calls.into_iter().enumerate() {
            let delta = ToolCall {
                index: Some(j),
                ..call
            };
            out.push_back(self.delta_chunk(index, None, Some(vec![delta])));
        }
        let choice = ChatChunkChoice {
            index,
            delta: Delta::default(),
            logprobs: None,
            finish_reason: Some(finish_reason),
            stop_reason: stop_reason_json(&stop),
            token_ids: self.prompt_token_ids.is_some().then(Vec::new),
            forced_token_positions: Vec::new(),
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
