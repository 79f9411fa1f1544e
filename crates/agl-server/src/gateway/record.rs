//! What one model call was: the request the agent sent, what the upstream answered (text,
//! tool calls, token ids, log-probabilities, usage), and the spans that record it.
//!
//! Responsible for reading OpenAI / vLLM response JSON (whole, or chunk by chunk from a
//! stream) into a [`CallRecord`], and for writing that record as the call's span and its
//! violations as annotation spans. Not responsible for transport or for deciding what the
//! agent may see (see [`super::govern`]).
//!
//! # The call span
//! Name `openai.chat.completion` (chat) or `openai.completion` (legacy completions), so that
//! Agent Lightning's `TracerTraceToTriplet` default (`llm_call_match = openai\.chat\.completion`)
//! finds chat calls. Attributes (AgentOps / OpenLLMetry names where they exist):
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `gen_ai.system` | str | `openai` |
//! | `gen_ai.request.model`, `.temperature`, `.top_p`, `.max_tokens`, `.seed`, `.stream` | | the agent's request (`model` as sent upstream: the attempt's model when the gateway rewrote it) |
//! | `agl.gateway.model_requested` | str | the `model` the agent sent, only when the gateway rewrote it to the attempt's model |
//! | `gen_ai.request.functions.<k>.name`, `.description`, `.parameters` | str | the request's tools (`tools[k].function`, then legacy `functions`); `.parameters` is the JSON schema as JSON text (`null` when the tool has none; a string is kept as sent) |
//! | `gen_ai.prompt.<i>.role`, `gen_ai.prompt.<i>.content` | str | the request's messages (content parts as JSON); completions: `gen_ai.prompt.0.content` is the prompt |
//! | `gen_ai.prompt.<i>.tool_calls.<j>.id`, `.name`, `.arguments` | str | the tool calls of an (assistant) message of the request (`""` for a missing field; arguments that are not a string as JSON text) |
//! | `gen_ai.prompt.<i>.tool_call_id` | str | the call a `tool` message answers |
//! | `gen_ai.completion.<i>.role`, `.content`, `.finish_reason` | str | each choice as the model produced it (before any redaction) |
//! | `gen_ai.completion.<i>.tool_calls.<j>.id`, `.name`, `.arguments` | str | tool calls the upstream parsed (whole, or put together from streamed `delta.tool_calls` by their `index`) |
//! | `gen_ai.response.id`, `gen_ai.response.model` | str | the answer's id and the model or adapter that answered |
//! | `gen_ai.usage.prompt_tokens`, `gen_ai.usage.completion_tokens`, `llm.usage.total_tokens` | int | tokens |
//! | `prompt_token_ids` | int array | the prompt as the model saw it (vLLM `prompt_token_ids`) |
//! | `response_token_ids` | int array | choice 0's generated ids (vLLM `token_ids`); `agl.response.<i>.token_ids` for choices ≥ 1 |
//! | `logprobs.content` | str (JSON) | choice 0's OpenAI `logprobs.content` list (chat) |
//! | `agl.response.logprobs` | float array | choice 0's log-probability per generated token (natural log), aligned with `response_token_ids` |
//! | `agl.response.forced_positions` | int array | choice 0's positions (0-based, ascending) in `response_token_ids` whose token a constraint left as the only choice (the engine's `forced_token_positions`; absent when none); `agl.response.<i>.forced_positions` for choices ≥ 1 |
//! | `agl.token_ids.missing` | bool | the upstream returned no token ids: the call is not trainable and is never re-tokenized |
//! | `agl.adapter` | str | the model or LoRA adapter version that answered (`model` of the answer) |
//! | `agl.upstream` | str | `engine` or the upstream's URL |
//! | `agl.latency_s`, `agl.ttft_s` | float | seconds from the request to the end, and to the first streamed token |
//! | `agl.gateway.verdict`, `agl.gateway.blocked` | str, bool | what governance decided for the agent (absent when nothing was checked: no kernel, or a failed call) |
//! | `agl.gateway.redacted` | bool | the agent got a rewritten (redacted) answer |
//! | `agl.gateway.refused` | bool | the agent got a 200 answer with the blocked part replaced by a refusal (`on_block: refuse`; absent when nothing was checked) |
//! | `http.status_code` | int | the upstream's status; `agl.error` its error message |
//!
//! The `gen_ai.request.functions.*`, `gen_ai.prompt.<i>.tool_calls.*` and `.tool_call_id` names
//! are the ones Agent Lightning's `TraceToMessages` (`AL:adapter/messages.py`) reads back into
//! OpenAI messages and tool definitions; `TracerTraceToTriplet` keeps them in the triplet's
//! `prompt.raw_content` and `metadata.request.functions`. (`TraceToMessages` takes the answer's
//! own tool calls from child spans with `tool.name` / `tool.parameters` / `tool.call.id`
//! attributes, which the gateway does not write; the triplet's `response.raw_content` carries
//! them from `gen_ai.completion.<i>.tool_calls`.)
//!
//! Violations are `agentlightning.annotation` child spans of the call span with
//! `agent_os.violation.policy`, `.severity`, `.reason`, `.blocked`, `.effect`,
//! `agent_os.action_type` and `agl.source = "gateway"` (the shape of the runner's SQL
//! violations, so reward shaping counts them the same way).

use agl_core::{AttributeValue, Attributes, Span, SpanStatus, StatusCode, semconv};
use agl_gov::Violation;
use serde_json::{Map, Value};

/// Which OpenAI endpoint a call used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `chat/completions`.
    Chat,
    /// `completions` (legacy).
    Completions,
}

impl Endpoint {
    /// The path under `/v1/`.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat/completions",
            Endpoint::Completions => "completions",
        }
    }

    /// The call span's name.
    pub fn span_name(self) -> &'static str {
        match self {
            Endpoint::Chat => semconv::OPENAI_CHAT_COMPLETION,
            Endpoint::Completions => OPENAI_COMPLETION,
        }
    }
}

/// Span name of legacy completions calls.
pub const OPENAI_COMPLETION: &str = "openai.completion";

pub use agl_core::semconv::{SOURCE_ATTR, SOURCE_GATEWAY};

/// One tool call of a choice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCall {
    /// `id`.
    pub id: String,
    /// `function.name`.
    pub name: String,
    /// `function.arguments` (a JSON string, as OpenAI sends it).
    pub arguments: String,
}

/// One choice as the model produced it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    /// The text.
    pub text: String,
    /// Generated token ids, if the upstream returned them.
    pub token_ids: Option<Vec<i64>>,
    /// Log-probability of each generated token, if returned.
    pub logprobs: Option<Vec<f64>>,
    /// Chat `logprobs.content` entries, if returned.
    pub logprobs_content: Vec<Value>,
    /// `finish_reason`.
    pub finish_reason: Option<String>,
    /// Tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// Positions into `token_ids` of the tokens a constraint forced (the engine's
    /// `forced_token_positions`, absolute also when streamed), as received: entries that are
    /// not integers are skipped; sorted and de-duplicated when written.
    pub forced_positions: Vec<i64>,
}

/// Everything recorded about one call.
#[derive(Debug, Clone, Default)]
pub struct CallRecord {
    /// The answer's `id`.
    pub response_id: Option<String>,
    /// The answer's `model`.
    pub response_model: Option<String>,
    /// The prompt's token ids, if returned.
    pub prompt_token_ids: Option<Vec<i64>>,
    /// Choices by index.
    pub choices: Vec<Choice>,
    /// `(prompt_tokens, completion_tokens)`.
    pub usage: Option<(i64, i64)>,
    /// Seconds to the first streamed token.
    pub ttft_s: Option<f64>,
}

fn ids(v: Option<&Value>) -> Option<Vec<i64>> {
    v?.as_array()?.iter().map(Value::as_i64).collect()
}

impl CallRecord {
    fn choice_mut(&mut self, index: usize) -> &mut Choice {
        if self.choices.len() <= index {
            self.choices.resize_with(index + 1, Choice::default);
        }
        &mut self.choices[index]
    }

    fn header(&mut self, body: &Value) {
        if self.response_id.is_none() {
            self.response_id = body.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if self.response_model.is_none() {
            self.response_model = body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(u) = body.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u.get(k).and_then(Value::as_i64).unwrap_or(0);
            self.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        if self.prompt_token_ids.is_none() {
            self.prompt_token_ids = ids(body.get("prompt_token_ids"));
        }
    }

    /// Reads a whole (non-streamed) response.
    pub fn from_response(endpoint: Endpoint, body: &Value) -> Self {
        let mut rec = CallRecord::default();
        rec.header(body);
        for (k, c) in choices(body) {
            rec.add_choice_part(endpoint, k, c, false);
        }
        rec
    }

    /// Adds one streamed chunk.
    pub fn add_chunk(&mut self, endpoint: Endpoint, chunk: &Value) {
        self.header(chunk);
        for (k, c) in choices(chunk) {
            self.add_choice_part(endpoint, k, c, true);
        }
    }

    fn add_choice_part(&mut self, endpoint: Endpoint, index: usize, c: &Value, delta: bool) {
        if self.prompt_token_ids.is_none() {
            self.prompt_token_ids = ids(c.get("prompt_token_ids"));
        }
        let ch = self.choice_mut(index);
        let message = match endpoint {
            Endpoint::Chat => c.get(if delta { "delta" } else { "message" }),
            Endpoint::Completions => Some(c),
        };
        let text_key = if endpoint == Endpoint::Chat {
            "content"
        } else {
            "text"
        };
        if let Some(t) = message
            .and_then(|m| m.get(text_key))
            .and_then(Value::as_str)
        {
            ch.text.push_str(t);
        }
        if let Some(calls) = message
            .and_then(|m| m.get("tool_calls"))
            .and_then(Value::as_array)
        {
            for (j, call) in calls.iter().enumerate() {
                let at = if delta {
                    call.get("index")
                        .and_then(Value::as_u64)
                        .map_or(j, |i| i as usize)
                } else {
                    j
                };
                if ch.tool_calls.len() <= at {
                    ch.tool_calls.resize_with(at + 1, ToolCall::default);
                }
                let tc = &mut ch.tool_calls[at];
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    tc.id = id.to_string();
                }
                let f = call.get("function");
                if let Some(n) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                    tc.name.push_str(n);
                }
                if let Some(a) = f.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                    tc.arguments.push_str(a);
                }
            }
        }
        if let Some(t) = ids(c.get("token_ids")) {
            ch.token_ids.get_or_insert_with(Vec::new).extend(t);
        }
        if let Some(p) = c.get("forced_token_positions").and_then(Value::as_array) {
            ch.forced_positions
                .extend(p.iter().filter_map(Value::as_i64));
        }
        if let Some(lp) = c.get("logprobs").filter(|l| l.is_object()) {
            let values: Vec<f64> = match endpoint {
                Endpoint::Chat => {
                    let content = lp.get("content").and_then(Value::as_array);
                    if let Some(content) = content {
                        ch.logprobs_content.extend(content.iter().cloned());
                    }
                    content
                        .map(|c| {
                            c.iter()
                                .filter_map(|e| e.get("logprob").and_then(Value::as_f64))
                                .collect()
                        })
                        .unwrap_or_default()
                }
                Endpoint::Completions => lp
                    .get("token_logprobs")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default(),
            };
            ch.logprobs.get_or_insert_with(Vec::new).extend(values);
        }
        if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
            ch.finish_reason = Some(f.to_string());
        }
    }

    /// Whether the upstream returned token ids for the prompt and every choice.
    pub fn has_token_ids(&self) -> bool {
        self.prompt_token_ids.is_some()
            && !self.choices.is_empty()
            && self.choices.iter().all(|c| c.token_ids.is_some())
    }

    /// Total tokens of the call (usage, else the counted ids).
    pub fn total_tokens(&self) -> u64 {
        match self.usage {
            Some((p, c)) => (p + c).max(0) as u64,
            None => {
                let p = self.prompt_token_ids.as_ref().map_or(0, Vec::len);
                let c: usize = self
                    .choices
                    .iter()
                    .map(|c| c.token_ids.as_ref().map_or(0, Vec::len))
                    .sum();
                (p + c) as u64
            }
        }
    }
}

/// `(index, choice)` pairs of a response or chunk.
fn choices(body: &Value) -> impl Iterator<Item = (usize, &Value)> {
    body.get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let k = c
                .get("index")
                .and_then(Value::as_u64)
                .map_or(i, |k| k as usize);
            (k, c)
        })
}

/// The span's facts that are not in the [`CallRecord`].
pub struct SpanFacts<'a> {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The request body as sent upstream (the agent's, its `model` possibly rewritten).
    pub request: &'a Map<String, Value>,
    /// The `model` the agent sent when the gateway rewrote it (`agl.gateway.model_requested`).
    pub model_requested: Option<&'a str>,
    /// `engine` or the upstream URL.
    pub upstream: &'a str,
    /// Unix seconds at the request and at the end.
    pub start: f64,
    /// Unix seconds at the end.
    pub end: f64,
    /// The upstream's HTTP status.
    pub status: u16,
    /// An error message (upstream error, broken stream).
    pub error: Option<String>,
    /// Governance's verdict for the agent (`allow`, `warn`, `modify`, `block`), if checked.
    pub verdict: Option<String>,
    /// Whether the agent got a rewritten answer.
    pub redacted: bool,
    /// Whether the agent got a refusal in place of the blocked part (`on_block: refuse`).
    pub refused: bool,
}

fn put(a: &mut Attributes, k: impl Into<String>, v: impl Into<AttributeValue>) {
    a.insert(k.into(), v.into());
}

fn scalar(v: &Value) -> Option<AttributeValue> {
    match v {
        Value::String(s) => Some(AttributeValue::Str(s.clone())),
        Value::Bool(b) => Some(AttributeValue::Bool(*b)),
        Value::Number(n) => n
            .as_i64()
            .map(AttributeValue::Int)
            .or_else(|| n.as_f64().map(AttributeValue::Float)),
        _ => None,
    }
}

/// The request's function definitions: `tools[].function` (tools of other types have none),
/// then legacy `functions[]`.
fn request_functions(request: &Map<String, Value>) -> impl Iterator<Item = &Map<String, Value>> {
    let tools = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("function"));
    let legacy = request
        .get("functions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    tools.chain(legacy).filter_map(Value::as_object)
}

/// A JSON value as span text: a string as it is, anything else as compact JSON.
fn json_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One request message's tool calls and the call it answers (see the module docs).
fn message_tool_attributes(a: &mut Attributes, i: usize, m: &Value) {
    let calls = m.get("tool_calls").and_then(Value::as_array);
    for (j, call) in calls.into_iter().flatten().enumerate() {
        let p = format!("gen_ai.prompt.{i}.tool_calls.{j}");
        let f = call.get("function");
        let text = |v: Option<&Value>| v.filter(|v| !v.is_null()).map(json_text);
        put(
            a,
            format!("{p}.id"),
            text(call.get("id")).unwrap_or_default(),
        );
        put(
            a,
            format!("{p}.name"),
            text(f.and_then(|f| f.get("name"))).unwrap_or_default(),
        );
        put(
            a,
            format!("{p}.arguments"),
            text(f.and_then(|f| f.get("arguments"))).unwrap_or_default(),
        );
    }
    if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
        put(a, format!("gen_ai.prompt.{i}.tool_call_id"), id);
    }
}

/// A choice's forced positions, ascending and without repeats; `None` when there are none.
fn forced_positions(c: &Choice) -> Option<Vec<i64>> {
    if c.forced_positions.is_empty() {
        return None;
    }
    let mut p = c.forced_positions.clone();
    p.sort_unstable();
    p.dedup();
    Some(p)
}

/// The call span's attributes (see the module docs).
pub fn call_attributes(rec: &CallRecord, facts: &SpanFacts<'_>) -> Attributes {
    let mut a = Attributes::new();
    put(&mut a, semconv::gen_ai::SYSTEM, "openai");
    for key in [
        "model",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "n",
        "stream",
    ] {
        if let Some(v) = facts.request.get(key).and_then(scalar) {
            a.insert(format!("gen_ai.request.{key}"), v);
        }
    }
    for (k, f) in request_functions(facts.request).enumerate() {
        let p = format!("{}.{k}", semconv::gen_ai::REQUEST_FUNCTIONS);
        if let Some(n) = f.get("name").and_then(Value::as_str) {
            put(&mut a, format!("{p}.name"), n);
        }
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            put(&mut a, format!("{p}.description"), d);
        }
        let parameters = f.get("parameters").map_or_else(|| "null".into(), json_text);
        put(&mut a, format!("{p}.parameters"), parameters);
    }
    match facts.endpoint {
        Endpoint::Chat => {
            let messages = facts.request.get("messages").and_then(Value::as_array);
            for (i, m) in messages.into_iter().flatten().enumerate() {
                if let Some(r) = m.get("role").and_then(Value::as_str) {
                    put(&mut a, format!("gen_ai.prompt.{i}.role"), r);
                }
                match m.get("content") {
                    Some(Value::String(s)) => {
                        put(&mut a, format!("gen_ai.prompt.{i}.content"), s.as_str())
                    }
                    Some(Value::Null) | None => {}
                    Some(other) => put(
                        &mut a,
                        format!("gen_ai.prompt.{i}.content"),
                        other.to_string(),
                    ),
                }
                message_tool_attributes(&mut a, i, m);
            }
        }
        Endpoint::Completions => match facts.request.get("prompt") {
            Some(Value::String(s)) => put(&mut a, "gen_ai.prompt.0.content", s.as_str()),
            Some(other) => put(&mut a, "gen_ai.prompt.0.content", other.to_string()),
            None => {}
        },
    }
    for (i, c) in rec.choices.iter().enumerate() {
        put(&mut a, format!("gen_ai.completion.{i}.role"), "assistant");
        put(
            &mut a,
            format!("gen_ai.completion.{i}.content"),
            c.text.as_str(),
        );
        if let Some(f) = &c.finish_reason {
            put(
                &mut a,
                format!("gen_ai.completion.{i}.finish_reason"),
                f.as_str(),
            );
        }
        for (j, t) in c.tool_calls.iter().enumerate() {
            let p = format!("gen_ai.completion.{i}.tool_calls.{j}");
            put(&mut a, format!("{p}.id"), t.id.as_str());
            put(&mut a, format!("{p}.name"), t.name.as_str());
            put(&mut a, format!("{p}.arguments"), t.arguments.as_str());
        }
        if i > 0
            && let Some(t) = &c.token_ids
        {
            put(
                &mut a,
                format!("agl.response.{i}.token_ids"),
                AttributeValue::IntArray(t.clone()),
            );
        }
        if let Some(p) = forced_positions(c) {
            let key = if i == 0 {
                semconv::agl::RESPONSE_FORCED_POSITIONS.to_string()
            } else {
                format!("agl.response.{i}.forced_positions")
            };
            put(&mut a, key, AttributeValue::IntArray(p));
        }
    }
    if let Some(id) = &rec.response_id {
        put(&mut a, semconv::gen_ai::RESPONSE_ID, id.as_str());
    }
    if let Some(m) = &rec.response_model {
        put(&mut a, semconv::gen_ai::RESPONSE_MODEL, m.as_str());
        put(&mut a, semconv::agl::ADAPTER, m.as_str());
    }
    if let Some((p, c)) = rec.usage {
        put(&mut a, semconv::gen_ai::USAGE_PROMPT_TOKENS, p);
        put(&mut a, semconv::gen_ai::USAGE_COMPLETION_TOKENS, c);
        put(&mut a, "llm.usage.total_tokens", p + c);
    }
    let first = rec.choices.first();
    match (
        &rec.prompt_token_ids,
        first.and_then(|c| c.token_ids.as_ref()),
    ) {
        (Some(p), Some(r)) if rec.has_token_ids() => {
            put(
                &mut a,
                "prompt_token_ids",
                AttributeValue::IntArray(p.clone()),
            );
            put(
                &mut a,
                "response_token_ids",
                AttributeValue::IntArray(r.clone()),
            );
            put(&mut a, semconv::agl::TOKEN_IDS_MISSING, false);
        }
        _ => put(&mut a, semconv::agl::TOKEN_IDS_MISSING, true),
    }
    if let Some(c) = first {
        if !c.logprobs_content.is_empty() {
            put(
                &mut a,
                "logprobs.content",
                Value::Array(c.logprobs_content.clone()).to_string(),
            );
        }
        if let Some(lp) = &c.logprobs {
            put(
                &mut a,
                semconv::agl::RESPONSE_LOGPROBS,
                AttributeValue::FloatArray(lp.clone()),
            );
        }
    }
    put(&mut a, semconv::agl::UPSTREAM, facts.upstream);
    put(
        &mut a,
        semconv::agl::LATENCY_S,
        (facts.end - facts.start).max(0.0),
    );
    if let Some(t) = rec.ttft_s {
        put(&mut a, semconv::agl::TTFT_S, t);
    }
    if let Some(v) = &facts.verdict {
        put(&mut a, semconv::agl::GATEWAY_VERDICT, v.as_str());
        put(&mut a, semconv::agl::GATEWAY_BLOCKED, v == "block");
    }
    put(&mut a, semconv::agl::GATEWAY_REDACTED, facts.redacted);
    if facts.verdict.is_some() {
        put(&mut a, semconv::agl::GATEWAY_REFUSED, facts.refused);
    }
    if let Some(m) = facts.model_requested {
        put(&mut a, semconv::agl::GATEWAY_MODEL_REQUESTED, m);
    }
    put(&mut a, "http.status_code", i64::from(facts.status));
    if let Some(e) = &facts.error {
        put(&mut a, semconv::agl::ERROR, e.as_str());
    }
    put(&mut a, SOURCE_ATTR, SOURCE_GATEWAY);
    a
}

/// The attributes of the annotation span of one violation found on an action of type
/// `action_type`: `agent_os.violation.{policy,severity,reason,blocked,effect}`,
/// `agent_os.action_type` and `agl.source = "gateway"` (what `agl_train::gateway_violations`
/// reads back).
pub fn violation_attributes(action_type: &str, v: &Violation) -> Attributes {
    let mut a = Attributes::new();
    put(
        &mut a,
        semconv::agent_os::VIOLATION_POLICY,
        v.policy.as_str(),
    );
    put(
        &mut a,
        semconv::agent_os::VIOLATION_SEVERITY,
        v.severity.to_string(),
    );
    put(
        &mut a,
        semconv::agent_os::VIOLATION_REASON,
        v.reason.as_str(),
    );
    put(&mut a, semconv::agent_os::VIOLATION_BLOCKED, v.blocked());
    put(
        &mut a,
        semconv::agent_os::VIOLATION_EFFECT,
        v.effect.as_str(),
    );
    put(&mut a, semconv::agent_os::ACTION_TYPE, action_type);
    put(&mut a, SOURCE_ATTR, SOURCE_GATEWAY);
    a
}

/// The call span plus one child annotation span per violation, all with `sequence_id`.
pub fn spans(
    rollout_id: &str,
    attempt_id: &str,
    sequence_id: i64,
    rec: &CallRecord,
    facts: &SpanFacts<'_>,
    violations: &[(&'static str, Violation)],
) -> Vec<Span> {
    let mut call = Span::new(
        rollout_id,
        attempt_id,
        sequence_id,
        facts.endpoint.span_name(),
        call_attributes(rec, facts),
    );
    call.start_time = Some(facts.start);
    call.end_time = Some(facts.end);
    if let Some(e) = &facts.error {
        call.status = SpanStatus {
            description: Some(e.clone()),
            ..SpanStatus::new(StatusCode::Error)
        };
    }
    let mut out = Vec::with_capacity(1 + violations.len());
    for (action_type, v) in violations {
        let mut s = Span::new(
            rollout_id,
            attempt_id,
            sequence_id,
            semconv::AGL_ANNOTATION,
            violation_attributes(action_type, v),
        );
        s.trace_id.clone_from(&call.trace_id);
        s.parent_id = Some(call.span_id.clone());
        s.parent = call.context.clone();
        if let Some(c) = s.context.as_mut() {
            c.trace_id.clone_from(&call.trace_id);
        }
        s.start_time = Some(facts.end);
        s.end_time = Some(facts.end);
        out.push(s);
    }
    out.insert(0, call);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Map<String, Value> {
        let v = json!({
            "model": "m",
            "tools": [
                {"type": "function", "function": {
                    "name": "get_weather", "description": "Weather of a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "now"}}
            ],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon"}
            ]
        });
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn attributes(rec: &CallRecord, request: &Map<String, Value>) -> Attributes {
        call_attributes(
            rec,
            &SpanFacts {
                endpoint: Endpoint::Chat,
                request,
                model_requested: None,
                upstream: "engine",
                start: 0.0,
                end: 1.0,
                status: 200,
                error: None,
                verdict: None,
                redacted: false,
                refused: false,
            },
        )
    }

    fn s(a: &Attributes, k: &str) -> String {
        match a.get(k) {
            Some(AttributeValue::Str(s)) => s.clone(),
            other => panic!("{k}: {other:?}"),
        }
    }

    fn ints(a: &Attributes, k: &str) -> Vec<i64> {
        match a.get(k) {
            Some(AttributeValue::IntArray(v)) => v.clone(),
            other => panic!("{k}: {other:?}"),
        }
    }

    #[test]
    fn tools_tool_calls_and_tool_results_of_the_request_are_recorded() {
        let req = request();
        let a = attributes(&CallRecord::default(), &req);
        assert_eq!(s(&a, "gen_ai.request.functions.0.name"), "get_weather");
        assert_eq!(
            s(&a, "gen_ai.request.functions.0.description"),
            "Weather of a city"
        );
        let schema: Value =
            serde_json::from_str(&s(&a, "gen_ai.request.functions.0.parameters")).unwrap();
        assert_eq!(schema["properties"]["city"]["type"], "string");
        assert_eq!(s(&a, "gen_ai.request.functions.1.name"), "now");
        assert!(!a.contains_key("gen_ai.request.functions.1.description"));
        assert_eq!(s(&a, "gen_ai.request.functions.1.parameters"), "null");
        assert!(!a.contains_key("gen_ai.request.tools"));

        assert_eq!(s(&a, "gen_ai.prompt.1.role"), "assistant");
        assert!(!a.contains_key("gen_ai.prompt.1.content"));
        assert_eq!(s(&a, "gen_ai.prompt.1.tool_calls.0.id"), "call_1");
        assert_eq!(s(&a, "gen_ai.prompt.1.tool_calls.0.name"), "get_weather");
        assert_eq!(
            s(&a, "gen_ai.prompt.1.tool_calls.0.arguments"),
            r#"{"city":"Paris"}"#
        );
        assert_eq!(s(&a, "gen_ai.prompt.1.tool_calls.1.name"), "now");
        assert_eq!(s(&a, "gen_ai.prompt.2.role"), "tool");
        assert_eq!(s(&a, "gen_ai.prompt.2.tool_call_id"), "call_1");
        assert_eq!(s(&a, "gen_ai.prompt.2.content"), "18 C");
        assert_eq!(s(&a, "gen_ai.prompt.3.tool_call_id"), "call_2");
        assert!(!a.contains_key("gen_ai.prompt.0.tool_call_id"));
    }

    #[test]
    fn legacy_functions_are_recorded_after_tools() {
        let mut req = request();
        req.insert(
            "functions".into(),
            json!([{"name": "old", "parameters": "{\"type\":\"object\"}"}]),
        );
        let a = attributes(&CallRecord::default(), &req);
        assert_eq!(s(&a, "gen_ai.request.functions.2.name"), "old");
        assert_eq!(
            s(&a, "gen_ai.request.functions.2.parameters"),
            r#"{"type":"object"}"#
        );
    }

    #[test]
    fn a_whole_answer_gives_tool_calls_and_forced_positions_per_choice() {
        let body = json!({
            "id": "chatcmpl-1", "model": "m", "prompt_token_ids": [1, 2],
            "choices": [
                {"index": 0, "finish_reason": "tool_calls", "token_ids": [10, 11, 12, 13],
                 "forced_token_positions": [3, 0, 3],
                 "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]}},
                {"index": 1, "finish_reason": "stop", "token_ids": [20, 21],
                 "forced_token_positions": [1],
                 "message": {"role": "assistant", "content": "hi"}},
                {"index": 2, "finish_reason": "stop", "token_ids": [30],
                 "message": {"role": "assistant", "content": "yo"}}
            ]
        });
        let rec = CallRecord::from_response(Endpoint::Chat, &body);
        let a = attributes(&rec, &request());
        assert_eq!(s(&a, "gen_ai.completion.0.tool_calls.0.id"), "call_9");
        assert_eq!(
            s(&a, "gen_ai.completion.0.tool_calls.0.arguments"),
            r#"{"city":"Rome"}"#
        );
        assert_eq!(ints(&a, "response_token_ids"), [10, 11, 12, 13]);
        assert_eq!(ints(&a, semconv::agl::RESPONSE_FORCED_POSITIONS), [0, 3]);
        assert_eq!(ints(&a, "agl.response.1.forced_positions"), [1]);
        assert!(!a.contains_key("agl.response.2.forced_positions"));
        assert!(!a.contains_key("agl.response.0.forced_positions"));
    }

    #[test]
    fn streamed_deltas_give_the_same_tool_calls_and_absolute_forced_positions() {
        // Two parallel tool calls, their arguments in pieces, interleaved by `index`; forced
        // positions are absolute (counted from the completion's first token) in each chunk.
        let chunk = |choice: Value| json!({"id": "chatcmpl-s", "model": "m", "choices": [choice]});
        let chunks = [
            json!({"id": "chatcmpl-s", "model": "m", "prompt_token_ids": [1, 2],
                   "choices": [{"index": 0, "delta": {"role": "assistant"}, "token_ids": [10, 11],
                                "forced_token_positions": [0, 1]}]}),
            chunk(
                json!({"index": 0, "token_ids": [12], "delta": {"tool_calls": [
                {"index": 0, "id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": ""}}]}}),
            ),
            chunk(
                json!({"index": 0, "token_ids": [13, 14], "forced_token_positions": [4],
                         "delta": {"tool_calls": [
                {"index": 1, "id": "call_b", "type": "function",
                 "function": {"name": "now", "arguments": "{"}},
                {"index": 0, "function": {"arguments": "{\"city\":"}}]}}),
            ),
            chunk(
                json!({"index": 0, "token_ids": [15], "forced_token_positions": ["x", 5],
                         "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "\"Oslo\"}"}},
                {"index": 1, "function": {"arguments": "}"}}]}}),
            ),
            chunk(json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"})),
        ];
        let mut rec = CallRecord::default();
        for c in &chunks {
            rec.add_chunk(Endpoint::Chat, c);
        }
        let a = attributes(&rec, &request());
        assert_eq!(s(&a, "gen_ai.completion.0.finish_reason"), "tool_calls");
        assert_eq!(s(&a, "gen_ai.completion.0.tool_calls.0.id"), "call_a");
        assert_eq!(
            s(&a, "gen_ai.completion.0.tool_calls.0.name"),
            "get_weather"
        );
        assert_eq!(
            s(&a, "gen_ai.completion.0.tool_calls.0.arguments"),
            r#"{"city":"Oslo"}"#
        );
        assert_eq!(s(&a, "gen_ai.completion.0.tool_calls.1.id"), "call_b");
        assert_eq!(s(&a, "gen_ai.completion.0.tool_calls.1.name"), "now");
        assert_eq!(s(&a, "gen_ai.completion.0.tool_calls.1.arguments"), "{}");
        assert_eq!(ints(&a, "response_token_ids"), [10, 11, 12, 13, 14, 15]);
        assert_eq!(
            ints(&a, semconv::agl::RESPONSE_FORCED_POSITIONS),
            [0, 1, 4, 5]
        );
    }

    #[test]
    fn no_forced_positions_no_attribute() {
        let body = json!({"id": "x", "prompt_token_ids": [1], "choices": [
            {"index": 0, "token_ids": [5], "forced_token_positions": [],
             "message": {"role": "assistant", "content": "a"}}]});
        let a = attributes(
            &CallRecord::from_response(Endpoint::Chat, &body),
            &Map::new(),
        );
        assert!(!a.contains_key(semconv::agl::RESPONSE_FORCED_POSITIONS));
        assert!(!a.keys().any(|k| k.starts_with("gen_ai.request.functions")));
    }
}
