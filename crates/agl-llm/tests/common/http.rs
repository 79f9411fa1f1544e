//! HTTP helpers of the API tests: one engine over the real model per test binary, the API's
//! router over it, and requests through `tower::ServiceExt::oneshot` (no sockets).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use agl_llm::api::{self, ApiOptions};
use agl_llm::{Engine, EngineConfig};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use tower::ServiceExt;

use super::MODEL;

/// The shared engine, or `None` (with the reason printed) when the model cannot be obtained.
pub fn engine() -> Option<Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let loaded = super::loaded()?.clone();
            let config = EngineConfig {
                model_name: MODEL.into(),
                max_batch_rows: 64,
                ..EngineConfig::default()
            };
            Some(Engine::start(loaded, config).expect("start the engine"))
        })
        .clone()
}

pub fn app(engine: &Engine) -> Router {
    api::router(engine.clone(), ApiOptions::default())
}

/// Sends one request; returns the status, the content type and the body.
pub async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<&str>,
    auth: Option<&str>,
) -> (StatusCode, String, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(key) = auth {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, ctype, String::from_utf8(bytes.to_vec()).unwrap())
}

pub async fn post_json(app: &Router, uri: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, text) = send(app, "POST", uri, Some(&body.to_string()), None).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

/// The `data:` payloads of a server-sent-event body, in order.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {e:?}"))
                .to_string()
        })
        .collect()
}

pub fn assert_openai_error(body: &Value, code: &str) {
    let err = &body["error"];
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(err["type"].is_string(), "{body}");
    assert!(err.get("param").is_some(), "{body}");
    assert_eq!(err["code"], code, "{body}");
}
