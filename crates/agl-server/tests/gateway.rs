//! The LLM gateway (`agl_server::gateway`) against a scripted OpenAI-compatible upstream:
//! routing and attempt checks, the call span and its token ids, stripping what the agent did
//! not ask for, governance of the model's output (block, redact, tool and token-budget
//! policies; plain and streamed; these policies say `on_block: error`, the refusals of the
//! default `on_block: refuse` are in `gateway_refuse.rs`), and upstream failures (502, 504).
//!
//! The scripted upstream answers the last user message: `email` → a sentence with an e-mail
//! address, `tool` → a `shell` tool call, anything else → `SELECT name FROM singer ;`. With
//! `return_token_ids` it gives token ids 1000 + i for the i-th word; `noids` in the message
//! makes it never return ids; `slow` makes it sleep 2 s; `forced` marks the tokens at odd
//! positions as forced by a constraint (the engine's `forced_token_positions`). The real engine is exercised in
//! `gateway_engine.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use agl_core::{AttemptStatus, AttributeValue, EnqueueRolloutRequest, Span};
use agl_gov::{BuildEnv, FlightRecorder, Kernel, PolicyFile, Query};
use agl_server::gateway::{GatewayConfig, Upstream};
use agl_store::{AttemptUpdate, InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tower::ServiceExt;

fn words(prompt: &str) -> Vec<String> {
    let text = if prompt.contains("email") {
        "Please contact alice.smith@example.com for the details of the singer table ."
    } else if prompt.contains("tool") {
        ""
    } else {
        "SELECT name FROM singer ;"
    };
    text.split(' ')
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

async fn scripted(body: axum::body::Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap();
    let prompt = req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    if prompt.contains("slow") {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ids = req["return_token_ids"].as_bool() == Some(true) && !prompt.contains("noids");
    let logprobs = req["logprobs"].as_bool() == Some(true);
    let forced = ids && prompt.contains("forced");
    let words = words(&prompt);
    let token_ids: Vec<i64> = (0..words.len() as i64).map(|i| 1000 + i).collect();
    let prompt_ids = json!([1, 2, 3, 4]);
    let tool_calls = prompt.contains("tool").then(|| {
        json!([{"id": "call_1", "type": "function",
                "function": {"name": "shell", "arguments": "{\"cmd\": \"rm -rf /\"}"}}])
    });
    if req["stream"].as_bool() == Some(true) {
        let mut out = String::new();
        for (i, w) in words.iter().enumerate() {
            let text = if i == 0 { w.clone() } else { format!(" {w}") };
            let mut choice = json!({"index": 0, "delta": {"content": text}, "finish_reason": null,
                                    "logprobs": if logprobs {json!({"content": [{"token": w, "logprob": -0.5, "bytes": [], "top_logprobs": []}]})} else {Value::Null}});
            if ids {
                choice["token_ids"] = json!([1000 + i as i64]);
            }
            if forced && i % 2 == 1 {
                choice["forced_token_positions"] = json!([i]);
            }
            let mut chunk = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                                   "model": "scripted", "choices": [choice]});
            if ids && i == 0 {
                chunk["prompt_token_ids"] = prompt_ids.clone();
            }
            out.push_str(&format!("data: {chunk}\n\n"));
        }
        if let Some(tc) = &tool_calls {
            let mut delta_calls = tc.clone();
            delta_calls[0]["index"] = json!(0);
            let mut choice = json!({"index": 0, "delta": {"tool_calls": delta_calls}, "finish_reason": null, "logprobs": null});
            if ids {
                choice["token_ids"] = json!([1500]);
            }
            let mut chunk = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "scripted", "choices": [choice]});
            if ids {
                chunk["prompt_token_ids"] = prompt_ids.clone();
            }
            out.push_str(&format!("data: {chunk}\n\n"));
        }
        let fin = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "scripted",
                         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": null}]});
        out.push_str(&format!("data: {fin}\n\n"));
        if req["stream_options"]["include_usage"].as_bool() == Some(true) {
            let usage = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "scripted",
                               "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": words.len(), "total_tokens": 4 + words.len()}});
            out.push_str(&format!("data: {usage}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        return ([(header::CONTENT_TYPE, "text/event-stream")], out).into_response();
    }
    let mut message = json!({"role": "assistant", "content": words.join(" ")});
    if let Some(tc) = tool_calls {
        message["tool_calls"] = tc;
    }
    let mut choice = json!({"index": 0, "message": message, "finish_reason": "stop",
        "logprobs": if logprobs {json!({"content": words.iter().map(|w| json!({"token": w, "logprob": -0.5, "bytes": [], "top_logprobs": []})).collect::<Vec<_>>()})} else {Value::Null}});
    let mut answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "scripted",
        "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": words.len(), "total_tokens": 4 + words.len()}});
    if ids {
        choice["token_ids"] = json!(token_ids);
        answer["prompt_token_ids"] = prompt_ids;
    }
    if forced {
        let odd: Vec<usize> = (1..words.len()).step_by(2).collect();
        choice["forced_token_positions"] = json!(odd);
    }
    answer["choices"] = json!([choice]);
    axum::Json(answer).into_response()
}

fn upstream() -> Upstream {
    Upstream::InProcess(Router::new().route("/v1/chat/completions", post(scripted)))
}

const POLICY: &str = r#"
version: 1
mode: enforce
on_block: error
policies:
  - type: content_safety
    config: {detectors: [email], on_pii: block}
  - type: tool_policy
    config: {deny: [shell]}
"#;

fn kernel(yaml: &str) -> Arc<Kernel> {
    let file = PolicyFile::parse(yaml, "test", None).unwrap();
    Arc::new(
        file.build(&BuildEnv::default())
            .unwrap()
            .with_recorder(FlightRecorder::in_memory()),
    )
}

struct Setup {
    store: Arc<dyn LightningStore>,
    app: Router,
    rid: String,
    aid: String,
}

async fn setup(config: GatewayConfig) -> Setup {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let started = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"q": 1})), None)
        .await
        .unwrap();
    let app = agl_server::gateway::router(store.clone(), config).unwrap();
    Setup {
        store,
        app,
        rid: started.rollout.rollout_id,
        aid: started.attempt.attempt_id,
    }
}

impl Setup {
    fn url(&self) -> String {
        format!(
            "/rollout/{}/attempt/{}/v1/chat/completions",
            self.rid, self.aid
        )
    }

    async fn post(&self, uri: &str, body: Value) -> (StatusCode, String) {
        let req = Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    async fn chat(&self, content: &str, extra: Value) -> (StatusCode, String) {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        self.post(&self.url(), body).await
    }

    async fn spans(&self) -> Vec<Span> {
        self.store
            .list_spans(&self.rid, Some(&self.aid))
            .await
            .unwrap()
    }

    async fn call_span(&self) -> Span {
        let spans = self.spans().await;
        let calls: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "openai.chat.completion")
            .collect();
        assert_eq!(calls.len(), 1, "{spans:#?}");
        calls[0].clone()
    }
}

fn ints(span: &Span, key: &str) -> Vec<i64> {
    match span.attributes.get(key) {
        Some(AttributeValue::IntArray(v)) => v.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> &'a AttributeValue {
    span.attributes
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {:?}", span.attributes))
}

/// SSE `data:` payloads of a streamed body.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn streamed_text(body: &str) -> String {
    events(body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test]
async fn unknown_rollout_or_attempt_is_404_and_a_finished_attempt_409() {
    let s = setup(GatewayConfig::new(upstream())).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = s
        .post(
            &format!("/rollout/ro-nope/attempt/{}/v1/chat/completions", s.aid),
            body.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "rollout_not_found");
    let (status, text) = s
        .post(
            &format!("/rollout/{}/attempt/at-nope/v1/chat/completions", s.rid),
            body.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(text.contains("attempt_not_found"), "{text}");
    let (status, text) = s.post(&s.url(), json!([1, 2])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("invalid_json"), "{text}");
    s.store
        .update_attempt(
            &s.rid,
            &s.aid,
            AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
        )
        .await
        .unwrap();
    let (status, text) = s.post(&s.url(), body).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(text.contains("attempt_finished"), "{text}");
    assert!(s.spans().await.is_empty(), "refused calls write no span");
}

#[tokio::test]
async fn a_call_is_one_span_with_token_ids_and_the_agent_sees_only_what_it_asked_for() {
    let s = setup(GatewayConfig::new(upstream())).await;
    let (status, text) = s.chat("how many singers?", json!({"temperature": 0})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "SELECT name FROM singer ;"
    );
    assert!(answer.get("prompt_token_ids").is_none(), "{answer}");
    assert!(answer["choices"][0].get("token_ids").is_none(), "{answer}");
    assert!(answer["choices"][0]["logprobs"].is_null(), "{answer}");
    let span = s.call_span().await;
    assert_eq!(ints(&span, "prompt_token_ids"), vec![1, 2, 3, 4]);
    assert_eq!(
        ints(&span, "response_token_ids"),
        vec![1000, 1001, 1002, 1003, 1004]
    );
    assert_eq!(
        attr(&span, "agl.response.logprobs"),
        &AttributeValue::FloatArray(vec![-0.5; 5])
    );
    assert_eq!(
        attr(&span, "agl.token_ids.missing"),
        &AttributeValue::Bool(false)
    );
    assert_eq!(
        attr(&span, "gen_ai.prompt.0.content"),
        &"how many singers?".into()
    );
    assert_eq!(
        attr(&span, "gen_ai.completion.0.content"),
        &"SELECT name FROM singer ;".into()
    );
    assert_eq!(
        attr(&span, "gen_ai.usage.prompt_tokens"),
        &AttributeValue::Int(4)
    );
    assert_eq!(attr(&span, "gen_ai.response.id"), &"chatcmpl-1".into());
    assert_eq!(attr(&span, "agl.adapter"), &"scripted".into());
    assert_eq!(
        attr(&span, "gen_ai.request.temperature"),
        &AttributeValue::Int(0)
    );
    assert!(span.sequence_id >= 1);

    // Asked for: token ids and logprobs pass through.
    let (_, text) = s
        .chat("again", json!({"return_token_ids": true, "logprobs": true}))
        .await;
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["prompt_token_ids"], json!([1, 2, 3, 4]));
    assert_eq!(
        answer["choices"][0]["token_ids"],
        json!([1000, 1001, 1002, 1003, 1004])
    );
    assert_eq!(
        answer["choices"][0]["logprobs"]["content"][0]["logprob"],
        -0.5
    );
}

#[tokio::test]
async fn an_upstream_without_token_ids_is_marked_not_retokenized() {
    let s = setup(GatewayConfig::new(upstream())).await;
    let (status, _) = s.chat("noids please", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let span = s.call_span().await;
    assert_eq!(
        attr(&span, "agl.token_ids.missing"),
        &AttributeValue::Bool(true)
    );
    assert!(!span.attributes.contains_key("prompt_token_ids"));
    assert!(!span.attributes.contains_key("response_token_ids"));
}

#[tokio::test]
async fn an_email_under_a_blocking_content_policy_never_reaches_the_agent() {
    let k = kernel(POLICY);
    let s = setup(GatewayConfig::new(upstream()).with_kernel(k.clone())).await;
    let (status, text) = s.chat("email me", json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(!text.contains("alice"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "policy_violation");
    assert_eq!(v["error"]["code"], "content_safety");
    // In the store: the call (with the model's real tokens) and the violation under it.
    let span = s.call_span().await;
    assert_eq!(
        attr(&span, "agl.gateway.blocked"),
        &AttributeValue::Bool(true)
    );
    assert_eq!(ints(&span, "response_token_ids").len(), 11);
    let spans = s.spans().await;
    let violation = spans
        .iter()
        .find(|x| x.attributes.contains_key("agent_os.violation.policy"))
        .expect("a violation span");
    assert_eq!(
        attr(violation, "agent_os.violation.policy"),
        &"content_safety".into()
    );
    assert_eq!(
        attr(violation, "agent_os.violation.blocked"),
        &AttributeValue::Bool(true)
    );
    assert_eq!(attr(violation, "agl.source"), &"gateway".into());
    assert_eq!(violation.parent_id.as_deref(), Some(span.span_id.as_str()));
    // In the flight recorder, with the rollout's id.
    let rec = k.recorder().unwrap();
    let page = rec.query(&Query::default()).unwrap();
    let blocked: Vec<_> = page
        .entries
        .iter()
        .filter(|e| e.verdict.to_string() == "block")
        .collect();
    assert_eq!(blocked.len(), 1, "{:?}", page.entries);
    assert_eq!(blocked[0].rollout_id.as_deref(), Some(s.rid.as_str()));
    assert!(rec.verify_chain().unwrap().first_broken.is_none());
}

#[tokio::test]
async fn a_streamed_email_is_never_sent_and_the_stream_ends_with_the_policy_error() {
    let k = kernel(POLICY);
    let s = setup(GatewayConfig::new(upstream()).with_kernel(k)).await;
    let (status, body) = s.chat("email me", json!({"stream": true})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains("alice"), "{body}");
    let last = events(&body).last().cloned().unwrap();
    let v: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["error"]["code"], "content_safety", "{body}");
    // Text before the address was streamed (real streaming, not buffered to the end).
    assert!(streamed_text(&body).starts_with("Please"), "{body}");
    let span = s.call_span().await;
    assert_eq!(ints(&span, "response_token_ids").len(), 11);
}

#[tokio::test]
async fn a_clean_stream_relays_every_word_and_records_all_token_ids() {
    let k = kernel(POLICY);
    let s = setup(GatewayConfig::new(upstream()).with_kernel(k)).await;
    let (status, body) = s.chat("count", json!({"stream": true})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(streamed_text(&body), "SELECT name FROM singer ;");
    assert_eq!(events(&body).last().map(String::as_str), Some("[DONE]"));
    assert!(!body.contains("token_ids"), "stripped: {body}");
    assert!(!body.contains("usage"), "not asked: {body}");
    let finish: Vec<Value> = events(&body)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v["choices"][0]["finish_reason"] == "stop")
        .collect();
    assert_eq!(finish.len(), 1, "{body}");
    let span = s.call_span().await;
    assert_eq!(ints(&span, "prompt_token_ids"), vec![1, 2, 3, 4]);
    assert_eq!(
        ints(&span, "response_token_ids"),
        vec![1000, 1001, 1002, 1003, 1004]
    );
    assert_eq!(
        attr(&span, "gen_ai.usage.completion_tokens"),
        &AttributeValue::Int(5)
    );
    assert!(span.attributes.contains_key("agl.ttft_s"));

    // Ungoverned, with usage asked for: chunks pass as they come, usage at the end.
    let s = setup(GatewayConfig::new(upstream())).await;
    let (_, body) = s
        .chat(
            "count",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(streamed_text(&body), "SELECT name FROM singer ;");
    assert!(body.contains("\"total_tokens\":9"), "{body}");
}

/// A chat request with tools, an earlier tool turn (the assistant's call and the tool's
/// result) and a last user message `last`.
fn tool_turn_request(last: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "m",
        "tools": [{"type": "function", "function": {
            "name": "count_rows", "description": "Rows of a table",
            "parameters": {"type": "object", "properties": {"table": {"type": "string"}},
                           "required": ["table"]}}}],
        "messages": [
            {"role": "user", "content": "How many singers?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
                "function": {"name": "count_rows", "arguments": "{\"table\":\"singer\"}"}}]},
            {"role": "tool", "tool_call_id": "call_7", "content": "6"},
            {"role": "user", "content": last}
        ]
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn assert_tool_turn_recorded(span: &Span) {
    assert_eq!(
        attr(span, "gen_ai.request.functions.0.name"),
        &"count_rows".into()
    );
    assert_eq!(
        attr(span, "gen_ai.request.functions.0.description"),
        &"Rows of a table".into()
    );
    let params = attr(span, "gen_ai.request.functions.0.parameters")
        .as_str()
        .unwrap();
    let params: Value = serde_json::from_str(params).unwrap();
    assert_eq!(params["required"], json!(["table"]));
    assert_eq!(
        attr(span, "gen_ai.prompt.1.tool_calls.0.id"),
        &"call_7".into()
    );
    assert_eq!(
        attr(span, "gen_ai.prompt.1.tool_calls.0.name"),
        &"count_rows".into()
    );
    assert_eq!(
        attr(span, "gen_ai.prompt.1.tool_calls.0.arguments"),
        &r#"{"table":"singer"}"#.into()
    );
    assert_eq!(attr(span, "gen_ai.prompt.2.role"), &"tool".into());
    assert_eq!(attr(span, "gen_ai.prompt.2.tool_call_id"), &"call_7".into());
    assert_eq!(attr(span, "gen_ai.prompt.2.content"), &"6".into());
}

#[tokio::test]
async fn tool_turns_and_forced_tokens_reach_the_call_span_plain_and_streamed() {
    // Plain: the agent did not ask for token ids, so it does not see the forced positions.
    let s = setup(GatewayConfig::new(upstream())).await;
    let (status, text) = s
        .post(&s.url(), tool_turn_request("forced: say it", json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(!text.contains("forced_token_positions"), "{text}");
    let span = s.call_span().await;
    assert_tool_turn_recorded(&span);
    assert_eq!(ints(&span, "response_token_ids").len(), 5);
    assert_eq!(ints(&span, "agl.response.forced_positions"), vec![1, 3]);
    // Asked for token ids: the positions pass through.
    let (_, text) = s
        .post(
            &s.url(),
            json!({"messages": [{"role": "user", "content": "forced"}], "return_token_ids": true}),
        )
        .await;
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        answer["choices"][0]["forced_token_positions"],
        json!([1, 3])
    );

    // Streamed, governed (chunks gated): the positions of every chunk are collected.
    let s = setup(GatewayConfig::new(upstream()).with_kernel(kernel(POLICY))).await;
    let (status, body) = s
        .post(
            &s.url(),
            tool_turn_request("forced: say it", json!({"stream": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(streamed_text(&body), "SELECT name FROM singer ;");
    assert!(!body.contains("forced_token_positions"), "{body}");
    let span = s.call_span().await;
    assert_tool_turn_recorded(&span);
    assert_eq!(ints(&span, "agl.response.forced_positions"), vec![1, 3]);

    // Without a constraint nothing is forced and the attribute is absent.
    let s = setup(GatewayConfig::new(upstream())).await;
    s.post(
        &s.url(),
        tool_turn_request("say it", json!({"stream": true})),
    )
    .await;
    let span = s.call_span().await;
    assert!(
        !span
            .attributes
            .contains_key("agl.response.forced_positions")
    );
    assert_tool_turn_recorded(&span);
}

#[tokio::test]
async fn a_streamed_tool_call_is_recorded_from_its_deltas() {
    let s = setup(GatewayConfig::new(upstream())).await;
    let (status, body) = s.chat("use a tool", json!({"stream": true})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let span = s.call_span().await;
    assert_eq!(
        attr(&span, "gen_ai.completion.0.tool_calls.0.id"),
        &"call_1".into()
    );
    assert_eq!(
        attr(&span, "gen_ai.completion.0.tool_calls.0.name"),
        &"shell".into()
    );
    assert_eq!(
        attr(&span, "gen_ai.completion.0.tool_calls.0.arguments"),
        &r#"{"cmd": "rm -rf /"}"#.into()
    );
}

#[tokio::test]
async fn redaction_passes_the_redacted_answer() {
    let yaml = POLICY.replace("on_pii: block", "on_pii: redact");
    let s = setup(GatewayConfig::new(upstream()).with_kernel(kernel(&yaml))).await;
    let (status, text) = s.chat("email me", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(!text.contains("alice"), "{text}");
    assert!(text.contains("[REDACTED:email]"), "{text}");
    let span = s.call_span().await;
    assert_eq!(attr(&span, "agl.gateway.verdict"), &"modify".into());
    assert_eq!(
        attr(&span, "agl.gateway.redacted"),
        &AttributeValue::Bool(true)
    );

    let (_, body) = s.chat("email me", json!({"stream": true})).await;
    assert!(!body.contains("alice"), "{body}");
    assert_eq!(
        streamed_text(&body),
        "Please contact [REDACTED:email] for the details of the singer table ."
    );
}

#[tokio::test]
async fn a_denied_tool_call_is_blocked_plain_and_streamed() {
    let s = setup(GatewayConfig::new(upstream()).with_kernel(kernel(POLICY))).await;
    let (status, text) = s.chat("tool", json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("tool_policy"), "{text}");
    let (_, body) = s.chat("tool", json!({"stream": true})).await;
    assert!(!body.contains("rm -rf"), "{body}");
    assert!(body.contains("tool_policy"), "{body}");
}

#[tokio::test]
async fn audit_mode_records_the_violation_and_changes_nothing() {
    let yaml = POLICY.replace("mode: enforce", "mode: audit");
    let s = setup(GatewayConfig::new(upstream()).with_kernel(kernel(&yaml))).await;
    let (status, text) = s.chat("email me", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("alice.smith@example.com"), "{text}");
    let spans = s.spans().await;
    assert!(
        spans
            .iter()
            .any(|x| x.attributes.contains_key("agent_os.violation.policy"))
    );
}

#[tokio::test]
async fn the_rollout_token_budget_blocks_the_call_that_exceeds_it() {
    // 1 USD per token, 20 USD per rollout: each call costs 9 tokens: two pass, the third would exceed it.
    let yaml = r#"
version: 1
mode: enforce
on_block: error
policies:
  - type: cost_control
    config: {usd_per_million_tokens: 1000000, rollout_budget_usd: 20, max_cost_usd: 1000}
"#;
    let s = setup(GatewayConfig::new(upstream()).with_kernel(kernel(yaml))).await;
    assert_eq!(s.chat("one", json!({})).await.0, StatusCode::OK);
    assert_eq!(s.chat("two", json!({})).await.0, StatusCode::OK);
    let (status, text) = s.chat("three", json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("cost_control"), "{text}");
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_a_slow_one_504() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let s = setup(GatewayConfig::new(Upstream::Http {
        base_url: format!("http://127.0.0.1:{port}"),
        api_key: None,
    }))
    .await;
    let (status, text) = s.chat("hi", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{text}");
    assert!(text.contains("upstream_unavailable"), "{text}");
    let span = s.call_span().await;
    assert_eq!(attr(&span, "http.status_code"), &AttributeValue::Int(502));
    assert!(span.attributes.contains_key("agl.error"));

    let mut config = GatewayConfig::new(upstream());
    config.request_timeout = Duration::from_millis(200);
    let s = setup(config).await;
    let (status, text) = s.chat("slow", json!({})).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{text}");
    assert!(text.contains("upstream_timeout"), "{text}");
}
