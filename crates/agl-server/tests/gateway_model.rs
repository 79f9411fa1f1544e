//! The gateway answers an attempt with the model its rollout's resources name, whatever model
//! name the agent sends (`agl_server::gateway`, "One call" step 2).
//!
//! The echo upstream records the `model` of every request it gets and answers with it (as vLLM
//! answers with the model or adapter that served the call), plain or streamed, chat or legacy
//! completions, always with token ids.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use agl_core::{
    AttributeValue, EnqueueRolloutRequest, LlmResource, NamedResources, PromptEngine,
    PromptTemplate, Resource, Span,
};
use agl_server::gateway::{GatewayConfig, Upstream};
use agl_store::{InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tower::ServiceExt;

type Seen = Arc<Mutex<Vec<Value>>>;

async fn echo(State(seen): State<Seen>, body: axum::body::Bytes) -> Response {
    let req: Value = serde_json::from_slice(&body).unwrap();
    seen.lock().unwrap().push(req["model"].clone());
    let model = req["model"].clone();
    let chat = req.get("messages").is_some();
    if req["stream"].as_bool() == Some(true) {
        let delta = json!({"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop", "token_ids": [7]});
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                           "model": model, "choices": [delta], "prompt_token_ids": [1, 2]});
        let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
                           "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}});
        let out = format!("data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n");
        return ([(header::CONTENT_TYPE, "text/event-stream")], out).into_response();
    }
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": "ok"},
               "finish_reason": "stop", "token_ids": [7]})
    } else {
        json!({"index": 0, "text": "ok", "finish_reason": "stop", "token_ids": [7]})
    };
    axum::Json(json!({
        "id": "x", "object": if chat { "chat.completion" } else { "text_completion" },
        "created": 1, "model": model, "choices": [choice], "prompt_token_ids": [1, 2],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }))
    .into_response()
}

fn llm(kind: &str, model: &str) -> Resource {
    let l = LlmResource {
        endpoint: "http://127.0.0.1:4747/v1".into(),
        model: model.into(),
        api_key: None,
        sampling_parameters: Default::default(),
    };
    match kind {
        "llm" => Resource::Llm(l),
        _ => Resource::ProxyLlm(l),
    }
}

fn resources(items: &[(&str, Resource)]) -> NamedResources {
    items
        .iter()
        .map(|(k, r)| ((*k).to_string(), r.clone()))
        .collect()
}

struct Setup {
    store: Arc<dyn LightningStore>,
    app: Router,
    seen: Seen,
    rid: String,
    aid: String,
}

/// A store holding `before` (as `rs-1`) when the rollout starts, then `after` (as `rs-2`,
/// the latest) once it runs, and a gateway over it.
async fn setup(before: Option<NamedResources>, after: Option<NamedResources>) -> Setup {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    if let Some(r) = before {
        store.update_resources("rs-1", r).await.unwrap();
    }
    let started = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"q": 1})), None)
        .await
        .unwrap();
    if let Some(r) = after {
        store.update_resources("rs-2", r).await.unwrap();
    }
    let seen: Seen = Arc::default();
    let upstream = Router::new()
        .route("/v1/chat/completions", post(echo))
        .route("/v1/completions", post(echo))
        .with_state(seen.clone());
    let app = agl_server::gateway::router(
        store.clone(),
        GatewayConfig::new(Upstream::InProcess(upstream)),
    )
    .unwrap();
    Setup {
        store,
        app,
        seen,
        rid: started.rollout.rollout_id,
        aid: started.attempt.attempt_id,
    }
}

impl Setup {
    async fn post(&self, route: &str, body: Value) -> (StatusCode, String) {
        let uri = format!("/rollout/{}/attempt/{}/v1/{route}", self.rid, self.aid);
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

    /// A plain chat call naming `model`; the answer's JSON.
    async fn chat(&self, model: &str) -> Value {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let (status, text) = self.post("chat/completions", body).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    async fn call_span(&self) -> Span {
        let spans = self
            .store
            .list_spans(&self.rid, Some(&self.aid))
            .await
            .unwrap();
        assert_eq!(spans.len(), 1, "{spans:#?}");
        spans[0].clone()
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AttributeValue> {
    span.attributes.get(key)
}

#[tokio::test]
async fn a_hard_coded_model_name_is_answered_by_the_attempts_version() {
    // The rollout started under rs-1 (policy-v1); the trainer has since published policy-v2.
    let s = setup(
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v1"))])),
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v2"))])),
    )
    .await;
    let answer = s.chat("gpt-4o-mini").await;
    assert_eq!(s.seen(), vec![json!("policy-v1")]);
    assert_eq!(answer["model"], "policy-v1");
    let span = s.call_span().await;
    assert_eq!(
        attr(&span, "gen_ai.request.model"),
        Some(&"policy-v1".into())
    );
    assert_eq!(
        attr(&span, "agl.gateway.model_requested"),
        Some(&"gpt-4o-mini".into())
    );
    assert_eq!(attr(&span, "agl.adapter"), Some(&"policy-v1".into()));
}

#[tokio::test]
async fn a_matching_name_is_forwarded_unchanged() {
    let s = setup(
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v1"))])),
        None,
    )
    .await;
    s.chat("policy-v1").await;
    assert_eq!(s.seen(), vec![json!("policy-v1")]);
    let span = s.call_span().await;
    assert_eq!(attr(&span, "agl.gateway.model_requested"), None);
}

#[tokio::test]
async fn several_models_and_no_match_forward_unchanged_but_a_match_is_kept() {
    let two = resources(&[
        ("main_llm", llm("proxy_llm", "policy-v1")),
        ("judge", llm("llm", "judge-model")),
        (
            "prompt",
            Resource::PromptTemplate(PromptTemplate {
                template: "{q}".into(),
                engine: PromptEngine::FString,
            }),
        ),
    ]);
    let s = setup(Some(two), None).await;
    s.chat("gpt-4o-mini").await;
    s.chat("judge-model").await;
    assert_eq!(s.seen(), vec![json!("gpt-4o-mini"), json!("judge-model")]);
}

#[tokio::test]
async fn two_resources_naming_one_model_still_rewrite() {
    let s = setup(
        Some(resources(&[
            ("main_llm", llm("proxy_llm", "policy-v1")),
            ("direct", llm("llm", "policy-v1")),
        ])),
        None,
    )
    .await;
    s.chat("gpt-4o-mini").await;
    assert_eq!(s.seen(), vec![json!("policy-v1")]);
}

#[tokio::test]
async fn a_rollout_without_resources_is_forwarded_unchanged() {
    let s = setup(None, None).await;
    let answer = s.chat("gpt-4o-mini").await;
    assert_eq!(s.seen(), vec![json!("gpt-4o-mini")]);
    assert_eq!(answer["model"], "gpt-4o-mini");
    let span = s.call_span().await;
    assert_eq!(attr(&span, "agl.gateway.model_requested"), None);
}

#[tokio::test]
async fn a_rollout_that_names_no_resources_gets_the_latest() {
    // Started before any resources existed (`resources_id: null`), called after rs-2.
    let s = setup(
        None,
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v2"))])),
    )
    .await;
    s.chat("gpt-4o-mini").await;
    assert_eq!(s.seen(), vec![json!("policy-v2")]);
}

#[tokio::test]
async fn streamed_chat_and_legacy_completions_are_rewritten_too() {
    let s = setup(
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v1"))])),
        None,
    )
    .await;
    let (status, text) = s
        .post(
            "chat/completions",
            json!({"model": "gpt-4o-mini", "stream": true,
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains(r#""model":"policy-v1""#), "{text}");
    let (status, text) = s
        .post(
            "completions",
            json!({"model": "gpt-3.5-turbo-instruct", "prompt": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(s.seen(), vec![json!("policy-v1"), json!("policy-v1")]);
    let spans = s.store.list_spans(&s.rid, Some(&s.aid)).await.unwrap();
    let requested: Vec<_> = spans
        .iter()
        .map(|sp| attr(sp, "agl.gateway.model_requested").cloned())
        .collect();
    assert_eq!(
        requested,
        vec![
            Some("gpt-4o-mini".into()),
            Some("gpt-3.5-turbo-instruct".into())
        ]
    );
}

/// The extra store read per call (the rollout's resources) next to the reads the gateway
/// already made; run with `--ignored --nocapture` to see the numbers.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn measure_the_resources_read() {
    let s = setup(
        Some(resources(&[("main_llm", llm("proxy_llm", "policy-v1"))])),
        None,
    )
    .await;
    let n = 2000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        s.store.get_resources_by_id("rs-1").await.unwrap();
    }
    let read = t.elapsed().as_secs_f64() / f64::from(n);
    let t = std::time::Instant::now();
    for _ in 0..n {
        s.store.get_rollout_by_id(&s.rid).await.unwrap();
    }
    let rollout = t.elapsed().as_secs_f64() / f64::from(n);
    let t = std::time::Instant::now();
    for _ in 0..200 {
        s.chat("gpt-4o-mini").await;
    }
    let call = t.elapsed().as_secs_f64() / 200.0;
    println!(
        "in-memory store: resources read {:.2} µs, rollout read {:.2} µs, whole gateway call (in-process upstream) {:.1} µs",
        read * 1e6,
        rollout * 1e6,
        call * 1e6
    );
}
