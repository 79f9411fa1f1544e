//! Agent Lightning's `TraceToMessages`: the spans of one attempt → one OpenAI chat
//! conversation per LLM call, `{"messages": [...], "tools": [...] | null}`, the request's
//! messages followed by the model's answer.
//!
//! Built on [`TracerTraceToTriplet::adapt`] (the same call selection, order and agent filter):
//! each selected call's `prompt.raw_content` becomes the messages and the first choice of its
//! `response.raw_content` the final assistant message; the request's
//! `gen_ai.request.functions` become `tools`. Messages are in the OpenAI chat shape:
//! `{"role", "content"}`, an assistant's tool calls as `"tool_calls": [{"id", "type":
//! "function", "function": {"name", "arguments"}}]`, a tool result's `tool_call_id`; a tool's
//! `parameters` is parsed back from the JSON string the gateway records (kept as the string when
//! it is not JSON).
//!
//! # Where agl differs from the Python original
//! * A recorded message without a `role` (Agent Lightning raises `KeyError: 'role'` on such
//!   multi-turn traces, issue #425) is left out and counted in
//!   [`MessagesReport::dropped_messages`]; the rest of the conversation is kept.
//! * A call whose response was not recorded keeps its request messages (no final assistant
//!   message) instead of failing.
//!
//! Responsible for that conversion; not for selecting spans from a store or for what the
//! conversations are used for (APO's critique, `agl triplets --messages`).

use agl_core::Span;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::TrainError;
use crate::tracer_adapter::TracerTraceToTriplet;

/// One LLM call as an OpenAI chat conversation (Agent Lightning's `OpenAIMessages`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conversation {
    /// The request's messages, then the answer (`role` `assistant`) when it was recorded.
    pub messages: Vec<Value>,
    /// The request's tools in the OpenAI shape, `None` when it had none.
    pub tools: Option<Vec<Value>>,
}

/// The conversations of one trace and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MessagesReport {
    /// One per selected LLM call, in the triplet adapter's order.
    pub conversations: Vec<Conversation>,
    /// Recorded messages left out because they had no `role`.
    pub dropped_messages: usize,
}

/// The span → messages adapter, over a [`TracerTraceToTriplet`]'s call selection.
#[derive(Debug, Clone, Default)]
pub struct TraceToMessages {
    triplets: TracerTraceToTriplet,
}

impl TraceToMessages {
    /// An adapter selecting calls as `triplets` does.
    pub fn new(triplets: TracerTraceToTriplet) -> Self {
        Self { triplets }
    }

    /// The conversations of one attempt's spans (sequence order).
    ///
    /// # Errors
    /// As [`TracerTraceToTriplet::adapt`]: [`TrainError::EmptyTrace`] for no spans,
    /// [`TrainError::MalformedSpan`] for unreadable log-probabilities.
    pub fn adapt(&self, spans: &[Span]) -> Result<MessagesReport, TrainError> {
        let mut report = MessagesReport::default();
        for t in self.triplets.adapt(spans)? {
            let mut messages = Vec::new();
            if let Some(list) = t.prompt.get("raw_content").and_then(Value::as_array) {
                for m in list {
                    match openai_message(m, None) {
                        Some(m) => messages.push(m),
                        None => report.dropped_messages += 1,
                    }
                }
            }
            let answer = t
                .response
                .get("raw_content")
                .and_then(Value::as_array)
                .and_then(|choices| choices.first());
            if let Some(a) = answer {
                match openai_message(a, Some("assistant")) {
                    Some(m) => messages.push(m),
                    None => report.dropped_messages += 1,
                }
            }
            let tools = t
                .metadata
                .get("request")
                .and_then(|r| r.get("functions"))
                .and_then(Value::as_array)
                .filter(|f| !f.is_empty())
                .map(|functions| functions.iter().map(openai_tool).collect());
            report.conversations.push(Conversation { messages, tools });
        }
        Ok(report)
    }
}

/// A recorded message in the OpenAI shape; `None` when it has no role (and none is implied).
fn openai_message(m: &Value, implied_role: Option<&str>) -> Option<Value> {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .or(implied_role)?
        .to_string();
    let mut out = Map::new();
    out.insert("role".into(), Value::String(role));
    out.insert(
        "content".into(),
        m.get("content").cloned().unwrap_or(Value::Null),
    );
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": c.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": c.get("arguments").cloned().unwrap_or(Value::Null),
                    },
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    for key in ["tool_call_id", "name"] {
        if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    Some(Value::Object(out))
}

/// A recorded `{name, description, parameters}` as an OpenAI tool.
fn openai_tool(f: &Value) -> Value {
    let parameters = match f.get("parameters") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
        Some(v) => v.clone(),
        None => Value::Null,
    };
    let mut function = Map::new();
    function.insert("name".into(), f.get("name").cloned().unwrap_or(Value::Null));
    if let Some(d) = f.get("description") {
        function.insert("description".into(), d.clone());
    }
    function.insert("parameters".into(), parameters);
    json!({"type": "function", "function": function})
}
