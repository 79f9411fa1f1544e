//! Streaming calls: relays the upstream's server-sent events to the agent as they arrive,
//! accumulates the whole call (every token id) for its span, and gates text and tool calls
//! through governance when the kernel enforces.
//!
//! Responsible for SSE framing (`data: …` events separated by a blank line, ending with
//! `data: [DONE]`), per-chunk stripping of what the agent did not ask for, holding back the
//! end of each choice (finish reason, held text, tool calls) until the whole answer has been
//! checked, and what a block ends the stream with: under `on_block: refuse` the refusal as the
//! last content delta, the held tool calls without the blocked ones and a finish chunk
//! (`stop` when no tool call is left); under `on_block: error` an `error` event. Not
//! responsible for the checks themselves ([`super::govern`]) or the span's shape
//! ([`super::record`]).

use std::convert::Infallible;

use agl_core::now_seconds;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::govern::{self, TextGate};
use super::record::{CallRecord, Endpoint};
use super::upstream::BodyStream;
use super::{Call, GatewayError};

/// Starts relaying `body` and returns the agent's streaming response.
pub(crate) fn relay(call: Call, body: BodyStream) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(run(call, body, tx));
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Takes one complete event's `data` out of `buf`, if there is one.
fn take_event(buf: &mut Vec<u8>) -> Option<String> {
    let end = buf.windows(2).position(|w| w == b"\n\n")?;
    let raw: Vec<u8> = buf.drain(..end + 2).collect();
    let text = String::from_utf8_lossy(&raw[..end]);
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    Some(data.join("\n"))
}

/// The text field of a streamed choice.
fn text_pointer(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "/delta/content",
        Endpoint::Completions => "/text",
    }
}

struct Relay {
    call: Call,
    tx: mpsc::Sender<Bytes>,
    rec: CallRecord,
    gates: Vec<TextGate>,
    template: Option<Value>,
    usage_chunk: Option<Value>,
    client_gone: bool,
}

impl Relay {
    async fn send(&mut self, bytes: Bytes) {
        if !self.client_gone && self.tx.send(bytes).await.is_err() {
            self.client_gone = true;
        }
    }

    fn gate(&mut self, index: usize) -> &mut TextGate {
        if self.gates.len() <= index {
            self.gates.resize_with(index + 1, TextGate::default);
        }
        &mut self.gates[index]
    }

    /// One upstream chunk: record it, then send what the agent may see now.
    async fn chunk(&mut self, mut chunk: Value) {
        let endpoint = self.call.endpoint;
        if self.rec.ttft_s.is_none()
            && chunk
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(|c| !c.is_empty())
        {
            self.rec.ttft_s = Some(now_seconds() - self.call.start);
        }
        self.rec.add_chunk(endpoint, &chunk);
        if self.template.is_none() {
            self.template = Some(chunk.clone());
        }
        let no_choices = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if no_choices && chunk.get("usage").is_some_and(|u| !u.is_null()) {
            self.usage_chunk = Some(chunk);
            return;
        }
        if self.call.gw.gates() {
            let kernel = self.call.gw.kernel.clone();
            let ctx = govern::context(&self.call.rid, &self.call.aid);
            let n = chunk
                .get("choices")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            for k in 0..n {
                let Some(c) = chunk.pointer_mut(&format!("/choices/{k}")) else {
                    continue;
                };
                let index = c
                    .get("index")
                    .and_then(Value::as_u64)
                    .map_or(k, |i| i as usize);
                let delta = c
                    .pointer(text_pointer(endpoint))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if let Some(obj) = c.as_object_mut() {
                    obj.insert("finish_reason".into(), Value::Null);
                    obj.remove("stop_reason");
                }
                if let Some(d) = c.get_mut("delta").and_then(Value::as_object_mut) {
                    d.remove("tool_calls");
                }
                let released = match &kernel {
                    Some(kernel) if !delta.is_empty() => {
                        self.gate(index).push(kernel, &ctx, &delta)
                    }
                    _ => String::new(),
                };
                if let Some(slot) = c.pointer_mut(text_pointer(endpoint)) {
                    *slot = Value::String(released);
                }
            }
        }
        self.call.asked.strip(&mut chunk);
        if self.call.gw.gates() && !worth_sending(endpoint, &chunk, self.call.asked.logprobs) {
            return;
        }
        self.send(event(&chunk)).await;
    }

    /// After the upstream's last chunk: check the whole answer, send the rest (or the block),
    /// store the spans, end the stream.
    async fn finish(mut self, error: Option<String>) {
        let endpoint = self.call.endpoint;
        if let Some(message) = error {
            let outcome = govern::Outcome::default();
            let _ = self
                .call
                .record(
                    &self.rec,
                    StatusCode::BAD_GATEWAY.as_u16(),
                    Some(message.clone()),
                    &outcome,
                )
                .await;
            let err = GatewayError::bad_gateway(message);
            self.send(event(&err.body())).await;
            return;
        }
        let outcome = match self.call.govern(&self.rec) {
            Ok(o) => o,
            Err(e) => {
                let _ = self
                    .call
                    .record(
                        &self.rec,
                        200,
                        Some(e.message.clone()),
                        &govern::Outcome::default(),
                    )
                    .await;
                self.send(event(&e.body())).await;
                return;
            }
        };
        if let Err(e) = self.call.record(&self.rec, 200, None, &outcome).await {
            self.send(event(&e.body())).await;
            return;
        }
        if let Some(v) = &outcome.blocked_by
            && !self.call.gw.refuses()
        {
            self.send(event(&GatewayError::blocked(v).body())).await;
            return;
        }
        if self.call.gw.gates() {
            let template = self.template.clone().unwrap_or_else(|| json!({}));
            let choices = self.rec.choices.clone();
            for (i, c) in choices.iter().enumerate() {
                let final_text = outcome
                    .texts
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| c.text.clone());
                let refusal = outcome.refusal(i);
                let gate = self.gate(i);
                let mut rest = if outcome.keeps_text(i) {
                    gate.finish(&final_text)
                } else {
                    String::new()
                };
                if let Some(r) = &refusal {
                    let sent_any = !gate.sent().trim().is_empty() || !rest.trim().is_empty();
                    if sent_any {
                        rest.push('\n');
                    }
                    rest.push_str(r);
                }
                let rewrites = outcome.tool_arguments.get(i);
                let tool_calls: Vec<Value> = c
                    .tool_calls
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| outcome.keeps_tool_call(i, *j))
                    .enumerate()
                    .map(|(k, (j, t))| {
                        let args = rewrites
                            .and_then(|r| r.get(j))
                            .cloned()
                            .flatten()
                            .unwrap_or_else(|| t.arguments.clone());
                        json!({"index": k, "id": t.id, "type": "function",
                               "function": {"name": t.name, "arguments": args}})
                    })
                    .collect();
                let tool_calls_left = tool_calls.len();
                let mut choice = match endpoint {
                    Endpoint::Chat => {
                        let mut delta = json!({"content": rest});
                        if !tool_calls.is_empty() {
                            delta["tool_calls"] = Value::Array(tool_calls);
                        }
                        json!({"index": i, "delta": delta})
                    }
                    Endpoint::Completions => json!({"index": i, "text": rest}),
                };
                choice["logprobs"] = Value::Null;
                choice["finish_reason"] = if refusal.is_some() && tool_calls_left == 0 {
                    Value::String("stop".into())
                } else {
                    c.finish_reason.clone().map_or(Value::Null, Value::String)
                };
                let mut last = template.clone();
                last["choices"] = json!([choice]);
                if let Some(obj) = last.as_object_mut() {
                    obj.remove("usage");
                    obj.remove("prompt_token_ids");
                }
                self.call.asked.strip(&mut last);
                self.send(event(&last)).await;
            }
        }
        if self.call.asked.usage_in_stream
            && let Some(mut u) = self.usage_chunk.take()
        {
            self.call.asked.strip(&mut u);
            self.send(event(&u)).await;
        }
        self.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }
}

/// Whether a gated chunk still carries something for the agent.
fn worth_sending(endpoint: Endpoint, chunk: &Value, logprobs: bool) -> bool {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return true;
    };
    choices.iter().any(|c| {
        let text = c
            .pointer(text_pointer(endpoint))
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty());
        let role = c.pointer("/delta/role").is_some();
        let lp = logprobs && c.get("logprobs").is_some_and(|l| !l.is_null());
        let ids = c.get("token_ids").is_some();
        text || role || lp || ids
    }) || chunk.get("prompt_token_ids").is_some()
}

async fn run(call: Call, mut body: BodyStream, tx: mpsc::Sender<Bytes>) {
    let timeout = call.gw.timeout;
    let label = call.gw.upstream.label.clone();
    let mut relay = Relay {
        call,
        tx,
        rec: CallRecord::default(),
        gates: Vec::new(),
        template: None,
        usage_chunk: None,
        client_gone: false,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut error = None;
    'read: loop {
        let next = match tokio::time::timeout(timeout, body.next()).await {
            Err(_) => {
                error = Some(GatewayError::timeout(&label, timeout).message);
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                error = Some(format!("the upstream {label} broke off its stream: {e}"));
                break;
            }
            Ok(Some(Ok(bytes))) => bytes,
        };
        buf.extend(next.iter().copied().filter(|b| *b != b'\r'));
        while let Some(data) = take_event(&mut buf) {
            let data = data.trim();
            if data.is_empty() {
                continue;
            }
            if data == "[DONE]" {
                break 'read;
            }
            let chunk: Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => {
                    error = Some(format!(
                        "the upstream {label} sent an event that is not JSON: {e}"
                    ));
                    break 'read;
                }
            };
            if let Some(message) = chunk.pointer("/error/message").and_then(Value::as_str) {
                error = Some(format!("the upstream {label} failed mid-stream: {message}"));
                break 'read;
            }
            relay.chunk(chunk).await;
            if relay.client_gone {
                error = Some("the agent disconnected before the answer ended".into());
                break 'read;
            }
        }
    }
    drop(body);
    relay.finish(error).await;
}
