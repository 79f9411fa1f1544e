//! Tool calls and structured outputs of the chat API against the real SmolLM2-135M-Instruct
//! (whose chat template ignores `tools`, so agl's hermes fallback is what it sees): forced tool
//! calls parse the same streamed and not, finish reasons are OpenAI's, JSON answers validate,
//! forced tokens are reported, and bad schemas are 400s naming the field.
//!
//! Skipped (with a message) only when the model cannot be obtained.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use axum::http::StatusCode;
use serde_json::{Value, json};

mod common;

use common::http::{app, engine, post_json, send, sse_events};

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "add", "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    ])
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": weather_tools(),
        "temperature": 0,
        "max_tokens": 64,
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    body
}

/// `(name, arguments as JSON)` of each call of a message.
fn calls(message: &Value) -> Vec<(String, Value)> {
    message["tool_calls"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|c| {
                    assert_eq!(c["type"], "function", "{c}");
                    assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
                    let args = c["function"]["arguments"].as_str().unwrap();
                    (
                        c["function"]["name"].as_str().unwrap().to_string(),
                        serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args}")),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_template_without_tools_gets_them_in_the_system_message() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let body = json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
        ],
        "tools": weather_tools(), "tool_choice": "none", "max_tokens": 2, "temperature": 0,
        "return_token_ids": true,
    });
    let (status, out) = post_json(&app, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let ids: Vec<u32> = out["prompt_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let prompt = engine.tokenizer().decode(&ids, false).unwrap();
    assert!(prompt.contains("# Tools"), "{prompt}");
    assert!(
        prompt
            .contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
        "{prompt}"
    );
    assert!(
        prompt.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        "{prompt}"
    );
    assert!(
        prompt.contains("<|im_start|>user\n<tool_response>\n18 C\n</tool_response>"),
        "{prompt}"
    );
}

#[tokio::test]
async fn required_gives_the_same_tool_call_streamed_and_not() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let body = ask(json!({"tool_choice": "required", "parallel_tool_calls": false}));
    let (status, out) = post_json(&app, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{out}");
    let plain = calls(&choice["message"]);
    assert_eq!(plain.len(), 1, "{out}");
    assert!(
        ["get_weather", "add"].contains(&plain[0].0.as_str()),
        "{out}"
    );
    assert!(plain[0].1.is_object(), "{out}");
    if plain[0].0 == "get_weather" {
        assert!(plain[0].1["city"].is_string(), "{out}");
    }

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, text) = send(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(&streamed.to_string()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let mut names: Vec<String> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    let mut finish = None;
    for event in sse_events(&text) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let c = &chunk["choices"][0];
        if let Some(deltas) = c["delta"]["tool_calls"].as_array() {
            for d in deltas {
                let i = d["index"].as_u64().unwrap() as usize;
                if names.len() <= i {
                    names.resize(i + 1, String::new());
                    args.resize(i + 1, String::new());
                }
                if let Some(n) = d["function"]["name"].as_str() {
                    names[i].push_str(n);
                }
                args[i].push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"), "{text}");
    assert_eq!(names, vec![plain[0].0.clone()], "{text}");
    let streamed_args: Value = serde_json::from_str(&args[0]).unwrap();
    assert_eq!(streamed_args, plain[0].1, "{text}");
}

#[tokio::test]
async fn a_named_function_finishes_with_stop_and_reports_forced_tokens() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let body = ask(json!({
        "tool_choice": {"type": "function", "function": {"name": "add"}},
        "messages": [{"role": "user", "content": "What is 2 plus 3?"}],
        "return_token_ids": true,
    }));
    let (status, out) = post_json(&app, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{out}");
    let got = calls(&choice["message"]);
    assert_eq!(got.len(), 1, "{out}");
    assert_eq!(got[0].0, "add", "{out}");
    assert!(got[0].1["a"].is_i64() && got[0].1["b"].is_i64(), "{out}");
    let n = choice["token_ids"].as_array().unwrap().len();
    let forced: Vec<usize> = choice["forced_token_positions"]
        .as_array()
        .unwrap_or_else(|| panic!("no forced_token_positions: {out}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    // `<tool_call>\n{"name": "add", "arguments": ` is fixed text: several forced tokens, but not
    // the argument values.
    assert!(forced.len() >= 3 && forced.len() < n, "{forced:?} of {n}");
    assert!(forced.windows(2).all(|w| w[0] < w[1]) && forced.iter().all(|&p| p < n));
    // Without return_token_ids the field is not sent.
    let mut plain = body.clone();
    plain["return_token_ids"] = json!(false);
    let (_, out) = post_json(&app, "/v1/chat/completions", &plain).await;
    assert!(
        out["choices"][0].get("forced_token_positions").is_none(),
        "{out}"
    );
}

#[tokio::test]
async fn json_response_formats_parse_and_validate() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"], "additionalProperties": false});
    for (format, seed) in [
        (
            json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}),
            1,
        ),
        (json!({"type": "json_object"}), 2),
    ] {
        let body = json!({
            "messages": [{"role": "user", "content": "Alice is 30 years old. Give her name and age as JSON."}],
            "response_format": format, "temperature": 1, "seed": seed, "n": 3, "max_tokens": 96,
        });
        let (status, out) = post_json(&app, "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        for choice in out["choices"].as_array().unwrap() {
            assert_eq!(choice["finish_reason"], "stop", "{out}");
            let text = choice["message"]["content"].as_str().unwrap();
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v.is_object(), "{text}");
            if format["type"] == "json_schema" {
                assert!(v["name"].is_string(), "{text}");
                let age = v["age"].as_i64().unwrap_or_else(|| panic!("{text}"));
                assert!((0..=150).contains(&age), "{text}");
                assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
            }
        }
    }
}

#[tokio::test]
async fn bad_schemas_are_400s_naming_the_field_and_the_server_keeps_serving() {
    let Some(engine) = engine() else { return };
    let app = app(&engine);
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}, "tools": null}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 3}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 3}}}], "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
    ];
    for (extra, param) in cases {
        let (status, out) = post_json(&app, "/v1/chat/completions", &ask(extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {out}");
        assert_eq!(out["error"]["param"], param, "{extra}: {out}");
        assert_eq!(out["error"]["type"], "invalid_request_error", "{out}");
    }
    let (status, out) =
        post_json(&app, "/v1/chat/completions", &ask(json!({"max_tokens": 4}))).await;
    assert_eq!(status, StatusCode::OK, "{out}");
}
