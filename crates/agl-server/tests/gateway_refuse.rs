//! `on_block: refuse` (the default) in the LLM gateway: a blocked part of the model's answer is
//! replaced by a refusal the agent can read, in a normal 200 answer (plain and streamed, chat
//! and legacy completions), while the call span keeps the model's real output and the
//! violations are recorded as before; `on_block: error` keeps the 403; audit mode passes.
//!
//! The scripted upstream answers the last user message: `two` → two tool calls, `lookup`
//! (allowed) then `run_sql` with a `DROP` in its `query` argument (blocked by `sql_safety`
//! through the policy's `sql_arguments`); `drop` → the `run_sql` call alone; `email` → a
//! sentence with an e-mail address; anything else → a plain sentence. Token ids 1000 + i.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use agl_core::{AttributeValue, EnqueueRolloutRequest, Span};
use agl_gov::{BuildEnv, FlightRecorder, Kernel, PolicyFile, Query, Verdict};
use agl_server::gateway::{GatewayConfig, Upstream};
use agl_store::{InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tower::ServiceExt;

const LOOKUP: (&str, &str) = ("lookup", r#"{"q": "singers"}"#);
const DROP: (&str, &str) = (
    "run_sql",
    r#"{"query": "DROP TABLE singer", "db_id": "concert_singer"}"#,
);

fn script(prompt: &str) -> (String, Vec<(&'static str, &'static str)>) {
    if prompt.contains("two") {
        (String::new(), vec![LOOKUP, DROP])
    } else if prompt.contains("drop") {
        ("I will drop it .".into(), vec![DROP])
    } else if prompt.contains("email") {
        (
            "Please write to alice.smith@example.com about the singer table .".into(),
            vec![],
        )
    } else {
        ("The singer table has six rows .".into(), vec![])
    }
}

fn prompt_of(req: &Value) -> String {
    req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .or_else(|| req["prompt"].as_str())
        .unwrap_or("")
        .to_string()
}

fn tool_calls(calls: &[(&str, &str)], with_index: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(j, (name, args))| {
            let mut c = json!({"id": format!("call_{j}"), "type": "function",
                               "function": {"name": name, "arguments": args}});
            if with_index {
                c["index"] = json!(j);
            }
            c
        })
        .collect()
}

async fn chat(body: axum::body::Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap();
    let (text, calls) = script(&prompt_of(&req));
    let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
    let n = words.len().max(1) + calls.len();
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let usage = json!({"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n});
    if req["stream"].as_bool() == Some(true) {
        let mut out = String::new();
        let chunk = |choice: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "scripted",
                   "choices": [choice]})
        };
        for (i, w) in words.iter().enumerate() {
            let t = if i == 0 {
                (*w).to_string()
            } else {
                format!(" {w}")
            };
            let c = chunk(
                json!({"index": 0, "delta": {"content": t}, "finish_reason": null,
                                 "token_ids": [1000 + i]}),
            );
            out.push_str(&format!("data: {c}\n\n"));
        }
        if !calls.is_empty() {
            let c = chunk(
                json!({"index": 0, "delta": {"tool_calls": tool_calls(&calls, true)},
                                 "finish_reason": null, "token_ids": [1500]}),
            );
            out.push_str(&format!("data: {c}\n\n"));
        }
        let fin = chunk(json!({"index": 0, "delta": {}, "finish_reason": finish}));
        out.push_str(&format!("data: {fin}\n\n"));
        let u = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "scripted",
                       "choices": [], "usage": usage});
        out.push_str(&format!("data: {u}\n\ndata: [DONE]\n\n"));
        return ([(header::CONTENT_TYPE, "text/event-stream")], out).into_response();
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = tool_calls(&calls, false);
    }
    let ids: Vec<usize> = (0..n).map(|i| 1000 + i).collect();
    axum::Json(
        json!({"id": "c", "object": "chat.completion", "created": 1, "model": "scripted",
        "prompt_token_ids": [1, 2, 3, 4],
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null,
                     "token_ids": ids}],
        "usage": usage}),
    )
    .into_response()
}

async fn completions(body: axum::body::Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap();
    let (text, _) = script(&prompt_of(&req));
    axum::Json(
        json!({"id": "c", "object": "text_completion", "created": 1, "model": "scripted",
        "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": null,
                     "token_ids": [1000, 1001]}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}),
    )
    .into_response()
}

fn upstream() -> Upstream {
    Upstream::InProcess(
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions)),
    )
}

const POLICY: &str = r#"
version: 1
mode: enforce
sql_arguments:
  - tool: run_sql
    argument: query
    database_argument: db_id
policies:
  - type: sql_safety
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
    kernel: Arc<Kernel>,
    rid: String,
    aid: String,
}

async fn setup(yaml: &str) -> Setup {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let started = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"q": 1})), None)
        .await
        .unwrap();
    let kernel = kernel(yaml);
    let config = GatewayConfig::new(upstream()).with_kernel(kernel.clone());
    let app = agl_server::gateway::router(store.clone(), config).unwrap();
    Setup {
        store,
        app,
        kernel,
        rid: started.rollout.rollout_id,
        aid: started.attempt.attempt_id,
    }
}

impl Setup {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, String) {
        let uri = format!("/rollout/{}/attempt/{}/v1/{path}", self.rid, self.aid);
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

    async fn chat(&self, content: &str, stream: bool) -> (StatusCode, String) {
        let body = json!({"model": "m", "stream": stream,
                          "messages": [{"role": "user", "content": content}]});
        self.post("chat/completions", body).await
    }

    async fn spans(&self) -> Vec<Span> {
        self.store
            .list_spans(&self.rid, Some(&self.aid))
            .await
            .unwrap()
    }

    /// The last call span and the violation spans under it.
    async fn last_call(&self) -> (Span, Vec<Span>) {
        let spans = self.spans().await;
        let call = spans
            .iter()
            .rfind(|s| s.name.starts_with("openai."))
            .cloned()
            .expect("a call span");
        let violations = spans
            .iter()
            .filter(|s| s.parent_id.as_deref() == Some(call.span_id.as_str()))
            .cloned()
            .collect();
        (call, violations)
    }

    fn recorded(&self) -> Vec<(String, Verdict)> {
        let page = self
            .kernel
            .recorder()
            .unwrap()
            .query(&Query::default())
            .unwrap();
        page.entries
            .iter()
            .map(|e| (e.action_type.clone(), e.verdict))
            .collect()
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> &'a AttributeValue {
    span.attributes
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {:?}", span.attributes))
}

/// A streamed body put back together: content, tool calls (by index), finish reason, and
/// whether an `error` event came.
struct Streamed {
    content: String,
    tool_calls: Vec<Value>,
    finish_reason: Option<String>,
    error: Option<Value>,
    done: bool,
}

fn streamed(body: &str) -> Streamed {
    let mut s = Streamed {
        content: String::new(),
        tool_calls: Vec::new(),
        finish_reason: None,
        error: None,
        done: false,
    };
    for data in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            s.done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            s.error = Some(v);
            continue;
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["delta"]["content"].as_str() {
                s.content.push_str(t);
            }
            for t in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                s.tool_calls.push(t.clone());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                s.finish_reason = Some(f.to_string());
            }
        }
    }
    s
}

const TOOL_REFUSAL: &str =
    "agl governance blocked the call to tool `run_sql` (policy `sql_safety`, critical severity): ";

#[tokio::test]
async fn a_blocked_tool_call_is_refused_with_200_and_recorded() {
    let s = setup(POLICY).await;
    let (status, text) = s.chat("drop the table", false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choice = &v["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "{text}");
    assert_eq!(choice["finish_reason"], "stop");
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("I will drop it .\n"), "{content}");
    assert!(content.contains(TOOL_REFUSAL), "{content}");
    assert!(
        content.ends_with("It was not run; choose another action."),
        "{content}"
    );
    // The call span keeps the model's real output; it says a refusal was sent.
    let (call, violations) = s.last_call().await;
    assert_eq!(
        attr(&call, "agl.gateway.blocked"),
        &AttributeValue::Bool(true)
    );
    assert_eq!(
        attr(&call, "agl.gateway.refused"),
        &AttributeValue::Bool(true)
    );
    assert_eq!(
        attr(&call, "gen_ai.completion.0.tool_calls.0.name"),
        &"run_sql".into()
    );
    assert_eq!(
        attr(&call, "gen_ai.completion.0.content"),
        &"I will drop it .".into()
    );
    assert!(
        matches!(attr(&call, "response_token_ids"), AttributeValue::IntArray(ids) if ids.len() == 6)
    );
    assert!(!violations.is_empty());
    assert!(violations.iter().all(|v| {
        attr(v, "agent_os.violation.policy") == &"sql_safety".into()
            && attr(v, "agent_os.violation.blocked") == &AttributeValue::Bool(true)
    }));
    // The flight recorder: the tool call, the SQL it carries (blocked), the text, the spend.
    let rec = s.recorded();
    assert!(rec.contains(&("sql".into(), Verdict::Block)), "{rec:?}");
    assert!(
        s.kernel
            .recorder()
            .unwrap()
            .verify_chain()
            .unwrap()
            .first_broken
            .is_none()
    );
}

#[tokio::test]
async fn an_allowed_tool_call_next_to_a_blocked_one_stays() {
    let s = setup(POLICY).await;
    let (status, text) = s.chat("two calls", false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choice = &v["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["function"]["name"], "lookup");
    assert_eq!(choice["finish_reason"], "tool_calls");
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(content.starts_with(TOOL_REFUSAL), "{content}");

    let (status, body) = s.chat("two calls", true).await;
    assert_eq!(status, StatusCode::OK);
    let st = streamed(&body);
    assert!(st.error.is_none() && st.done, "{body}");
    assert_eq!(st.tool_calls.len(), 1, "{body}");
    assert_eq!(st.tool_calls[0]["function"]["name"], "lookup");
    assert_eq!(st.tool_calls[0]["index"], 0);
    assert_eq!(st.finish_reason.as_deref(), Some("tool_calls"));
    assert!(st.content.starts_with(TOOL_REFUSAL), "{}", st.content);
    assert!(!body.contains(r#""name":"run_sql""#), "{body}");
}

#[tokio::test]
async fn a_streamed_blocked_tool_call_is_refused_and_the_stream_ends_normally() {
    let s = setup(POLICY).await;
    let (status, body) = s.chat("drop the table", true).await;
    assert_eq!(status, StatusCode::OK);
    let st = streamed(&body);
    assert!(st.error.is_none(), "{body}");
    assert!(st.done, "{body}");
    assert!(st.tool_calls.is_empty(), "{body}");
    assert_eq!(st.finish_reason.as_deref(), Some("stop"));
    assert!(
        st.content.starts_with("I will drop it .\n"),
        "{}",
        st.content
    );
    assert!(st.content.contains(TOOL_REFUSAL), "{}", st.content);
    let (call, violations) = s.last_call().await;
    assert_eq!(
        attr(&call, "agl.gateway.refused"),
        &AttributeValue::Bool(true)
    );
    assert_eq!(
        attr(&call, "gen_ai.completion.0.tool_calls.0.name"),
        &"run_sql".into()
    );
    assert!(!violations.is_empty());
    assert!(s.recorded().contains(&("sql".into(), Verdict::Block)));
}

#[tokio::test]
async fn a_blocked_text_is_replaced_by_the_refusal_plain_streamed_and_legacy() {
    let s = setup(POLICY).await;
    let refusal = "agl governance blocked the model's answer (policy `content_safety`, ";
    let (status, text) = s.chat("email me", false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(!text.contains("alice"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with(refusal), "{content}");
    assert!(content.ends_with("It was not delivered; answer differently."));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let (_, body) = s.chat("email me", true).await;
    assert!(!body.contains("alice"), "{body}");
    let st = streamed(&body);
    assert!(st.error.is_none() && st.done, "{body}");
    // The text before the address was streamed; the refusal is the last content.
    assert!(st.content.starts_with("Please"), "{}", st.content);
    assert!(
        st.content.contains(&format!("\n{refusal}")),
        "{}",
        st.content
    );

    let (status, text) = s
        .post("completions", json!({"model": "m", "prompt": "email me"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(refusal),
        "{text}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn an_exhausted_token_budget_is_refused() {
    // 1 USD per token, 15 USD per rollout: the first call costs 11 tokens, the second (7)
    // would exceed it.
    let yaml = r#"
version: 1
policies:
  - type: cost_control
    config: {usd_per_million_tokens: 1000000, rollout_budget_usd: 15, max_cost_usd: 1000}
"#;
    let s = setup(yaml).await;
    assert_eq!(s.chat("hello", false).await.0, StatusCode::OK);
    let (status, text) = s.chat("two calls", false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choice = &v["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "{text}");
    assert_eq!(choice["finish_reason"], "stop");
    assert!(
        choice["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("agl governance blocked the model's answer (policy `cost_control`"),
        "{text}"
    );
}

#[tokio::test]
async fn on_block_error_keeps_the_403_and_the_error_event() {
    let s = setup(&POLICY.replace("mode: enforce", "mode: enforce\non_block: error")).await;
    let (status, text) = s.chat("drop the table", false).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "policy_violation");
    assert_eq!(v["error"]["code"], "sql_safety");
    let (call, _) = s.last_call().await;
    assert_eq!(
        attr(&call, "agl.gateway.refused"),
        &AttributeValue::Bool(false)
    );
    let (_, body) = s.chat("drop the table", true).await;
    let st = streamed(&body);
    assert_eq!(st.error.unwrap()["error"]["code"], "sql_safety");
    assert!(st.tool_calls.is_empty());
}

#[tokio::test]
async fn audit_mode_passes_the_answer_and_records() {
    let s = setup(&POLICY.replace("mode: enforce", "mode: audit")).await;
    let (status, text) = s.chat("drop the table", false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "run_sql"
    );
    assert_eq!(v["choices"][0]["message"]["content"], "I will drop it .");
    let (call, violations) = s.last_call().await;
    assert_eq!(
        attr(&call, "agl.gateway.refused"),
        &AttributeValue::Bool(false)
    );
    assert!(!violations.is_empty());
    assert!(s.recorded().contains(&("sql".into(), Verdict::Warn)));
}
