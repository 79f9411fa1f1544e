//! `agl triplets` against an in-process store server: the JSON it prints for a gateway-style
//! attempt, with and without `--for-training`, as chat conversations (`--messages`), and its
//! one-line errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};
use std::sync::Arc;

use agl_core::{AttributeValue, Attributes, EnqueueRolloutRequest, Span, reward_attributes};
use agl_server::{RunningServer, ServerConfig};
use agl_store::{InMemoryLightningStore, LightningStore};
use serde_json::{Value, json};

fn agl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .env_remove("AGL_STORE_TOKEN")
        .output()
        .expect("run agl")
}

fn stdout_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "agl failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn assert_one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(
        lines[0].contains(needle),
        "{err:?} should mention {needle:?}"
    );
    assert!(o.stdout.is_empty());
}

/// A span of the attempt with explicit id, parent and times.
fn span(
    ids: (&str, &str),
    seq: i64,
    span_id: &str,
    name: &str,
    times: (f64, f64),
    attributes: Attributes,
) -> Span {
    let mut s = Span::new(ids.0, ids.1, seq, name, attributes);
    s.span_id = span_id.to_string();
    s.context = Some(agl_core::SpanContext::new(s.trace_id.clone(), span_id));
    s.start_time = Some(times.0);
    s.end_time = Some(times.1);
    s
}

fn attrs(pairs: &[(&str, AttributeValue)]) -> Attributes {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// A gateway LLM-call span's attributes; `ids = None` is a call whose upstream returned none.
fn call(response_id: &str, ids: Option<(Vec<i64>, Vec<i64>)>) -> Attributes {
    let mut a = attrs(&[
        ("gen_ai.request.model", "sql-lora".into()),
        ("gen_ai.prompt.0.role", "user".into()),
        ("gen_ai.prompt.0.content", "How many singers?".into()),
        ("gen_ai.completion.0.role", "assistant".into()),
        (
            "gen_ai.completion.0.content",
            "SELECT count(*) FROM singer".into(),
        ),
        ("gen_ai.response.id", response_id.into()),
        ("agl.adapter", "sql-lora-v2".into()),
        ("agl.gateway.blocked", false.into()),
    ]);
    match ids {
        Some((prompt, response)) => {
            let logprobs = vec![-0.25; response.len()];
            a.insert("prompt_token_ids".into(), AttributeValue::IntArray(prompt));
            a.insert(
                "response_token_ids".into(),
                AttributeValue::IntArray(response),
            );
            a.insert(
                "agl.response.logprobs".into(),
                AttributeValue::FloatArray(logprobs),
            );
            a.insert("agl.token_ids.missing".into(), false.into());
        }
        None => {
            a.insert("agl.token_ids.missing".into(), true.into());
        }
    }
    a
}

/// A server over an in-memory store holding one rollout with two attempts; the latest has an
/// agent span, two gateway calls (the second without token ids) and a reward.
async fn server_with_spans() -> (RunningServer, String, String, String) {
    let store = Arc::new(InMemoryLightningStore::new());
    let first = store
        .start_rollout(EnqueueRolloutRequest::new(json!("q")), None)
        .await
        .unwrap();
    let rid = first.rollout.rollout_id.clone();
    let old_aid = first.attempt.attempt_id.clone();
    let latest = store.start_attempt(&rid, None).await.unwrap();
    let aid = latest.attempt.attempt_id.clone();
    let ids = (rid.as_str(), aid.as_str());
    let t = 1735000100.0;
    let spans = vec![
        span(
            ids,
            1,
            "a000000000000001",
            "agent.run",
            (t, t + 10.0),
            attrs(&[("agent.name", "sql-writer".into())]),
        ),
        span(
            ids,
            2,
            "b000000000000002",
            "openai.chat.completion",
            (t + 1.0, t + 2.0),
            call("chatcmpl-1", Some((vec![1, 2, 3], vec![7, 8]))),
        ),
        span(
            ids,
            3,
            "c000000000000003",
            "openai.chat.completion",
            (t + 3.0, t + 4.0),
            call("chatcmpl-2", None),
        ),
        span(
            ids,
            4,
            "d000000000000004",
            "agentlightning.annotation",
            (t + 5.0, t + 5.0),
            reward_attributes(&[("primary", 1.0)]),
        ),
    ];
    store.add_spans(spans).await.unwrap();
    // The earlier attempt has one call of its own.
    store
        .add_span(span(
            (&rid, &old_aid),
            5,
            "e000000000000005",
            "openai.chat.completion",
            (t, t + 1.0),
            call("chatcmpl-old", Some((vec![4], vec![5]))),
        ))
        .await
        .unwrap();
    let config = ServerConfig {
        port: 0,
        ..ServerConfig::default()
    };
    let server = agl_server::start(store, config).await.unwrap();
    (server, rid, aid, old_aid)
}

#[test]
fn triplets_prints_the_latest_attempts_triplets_and_refuses_for_training() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, rid, aid, old_aid) = rt.block_on(server_with_spans());
    let url = server.url();

    // Agent Lightning's behaviour: every call is a triplet; the reward goes to the last call.
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
    ]));
    assert_eq!(v["rollout_id"], json!(rid));
    assert_eq!(v["attempt_id"], json!(aid));
    assert_eq!(v["for_training"], json!(false));
    assert_eq!(v["llm_calls"], json!(2));
    assert_eq!(v["refused_missing_token_ids"], json!(0));
    let triplets = v["triplets"].as_array().unwrap();
    assert_eq!(triplets.len(), 2);
    assert_eq!(
        triplets[0],
        json!({
            "prompt": {
                "token_ids": [1, 2, 3],
                "raw_content": [{"role": "user", "content": "How many singers?"}],
                "image_urls": []
            },
            "response": {
                "token_ids": [7, 8],
                "raw_content": [{"role": "assistant", "content": "SELECT count(*) FROM singer"}],
                "logprobs_values": [-0.25, -0.25]
            },
            "reward": null,
            "metadata": {
                "request": {"model": "sql-lora"},
                "response": {"id": "chatcmpl-1"},
                "response_id": "chatcmpl-1",
                "agent_name": "sql-writer",
                "adapter": "sql-lora-v2",
                "sequence_id": 2,
                "span_id": "b000000000000002",
                "blocked": false
            }
        })
    );
    assert_eq!(triplets[1]["prompt"]["token_ids"], json!([]));
    assert_eq!(triplets[1]["reward"], json!(1.0));

    // For training: the call without token ids is refused, and the reward moves to the kept one.
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
        "--attempt-id",
        "latest",
        "--for-training",
    ]));
    assert_eq!(v["for_training"], json!(true));
    assert_eq!(v["llm_calls"], json!(2));
    assert_eq!(v["refused_missing_token_ids"], json!(1));
    assert_eq!(v["refused_empty_token_ids"], json!(0));
    assert_eq!(
        v["refused"],
        json!([{"span_id": "c000000000000003", "sequence_id": 3,
                "response_id": "chatcmpl-2", "reason": "missing_token_ids"}])
    );
    let triplets = v["triplets"].as_array().unwrap();
    assert_eq!(triplets.len(), 1);
    assert_eq!(
        triplets[0]["metadata"]["span_id"],
        json!("b000000000000002")
    );
    assert_eq!(triplets[0]["reward"], json!(1.0));

    // As OpenAI chat conversations: one per call, the answer last.
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
        "--messages",
    ]));
    let conversation = json!({"messages": [
        {"role": "user", "content": "How many singers?"},
        {"role": "assistant", "content": "SELECT count(*) FROM singer"}
    ], "tools": null});
    assert_eq!(
        v,
        json!({"rollout_id": rid, "attempt_id": aid, "dropped_messages": 0,
               "conversations": [conversation.clone(), conversation]})
    );

    // An explicit earlier attempt, and filters.
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
        "--attempt-id",
        &old_aid,
    ]));
    assert_eq!(v["attempt_id"], json!(old_aid));
    let triplets = v["triplets"].as_array().unwrap();
    assert_eq!(triplets.len(), 1);
    assert_eq!(
        triplets[0]["metadata"]["response_id"],
        json!("chatcmpl-old")
    );
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
        "--agent-match",
        "^judge$",
    ]));
    assert_eq!(v["llm_calls"], json!(0));
    assert_eq!(v["triplets"], json!([]));
    let v = stdout_json(&agl(&[
        "triplets",
        "--store-url",
        &url,
        "--rollout-id",
        &rid,
        "--llm-call-match",
        "^agent\\.run$",
    ]));
    assert_eq!(v["llm_calls"], json!(1));
    assert_eq!(
        v["triplets"][0]["metadata"]["span_id"],
        json!("a000000000000001")
    );

    // One-line errors.
    assert_one_line_error(
        &agl(&[
            "triplets",
            "--store-url",
            &url,
            "--rollout-id",
            "ro-missing",
        ]),
        "rollout ro-missing not found",
    );
    assert_one_line_error(
        &agl(&[
            "triplets",
            "--store-url",
            &url,
            "--rollout-id",
            &rid,
            "--attempt-id",
            "at-nope",
        ]),
        "attempt at-nope of rollout",
    );
    assert_one_line_error(
        &agl(&[
            "triplets",
            "--store-url",
            &url,
            "--rollout-id",
            &rid,
            "--agent-match",
            "(",
        ]),
        "--agent-match: invalid regular expression",
    );
    rt.block_on(server.shutdown()).unwrap();
}

#[test]
fn triplets_with_an_unreachable_store_is_one_line_error() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let o = agl(&["triplets", "--store-url", &url, "--rollout-id", "ro-x"]);
    assert_one_line_error(&o, "unreachable");
}

#[test]
fn triplets_with_a_rollout_without_spans_is_one_line_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, rid) = rt.block_on(async {
        let store = Arc::new(InMemoryLightningStore::new());
        let started = store
            .start_rollout(EnqueueRolloutRequest::new(json!("q")), None)
            .await
            .unwrap();
        let config = ServerConfig {
            port: 0,
            ..ServerConfig::default()
        };
        let server = agl_server::start(store, config).await.unwrap();
        (server, started.rollout.rollout_id)
    });
    let o = agl(&[
        "triplets",
        "--store-url",
        &server.url(),
        "--rollout-id",
        &rid,
    ]);
    assert_one_line_error(&o, "has no spans");
    rt.block_on(server.shutdown()).unwrap();
}
