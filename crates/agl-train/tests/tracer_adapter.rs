//! Recorded traces through `TracerTraceToTriplet`: the fixtures under
//! `tests/fixtures/traces/` are one attempt's spans each, in the v0.3 span JSON a store returns
//! (`sequence_id` order), written as AgentOps and agl's gateway record them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use agl_core::{AttributeValue, Span, Triplet};
use agl_train::{RefusalReason, RewardMatchPolicy, TracerTraceToTriplet, TrainError};
use serde_json::{Value, json};

fn load(name: &str) -> Vec<Span> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn with_agent(pattern: &str) -> TracerTraceToTriplet {
    TracerTraceToTriplet::new(agl_train::DEFAULT_LLM_CALL_MATCH, Some(pattern)).unwrap()
}

/// `(span_id, agent_name, reward)` per triplet.
fn summary(triplets: &[Triplet]) -> Vec<(String, String, Option<f64>)> {
    triplets
        .iter()
        .map(|t| {
            (
                t.metadata["span_id"].as_str().unwrap().to_string(),
                t.metadata["agent_name"].as_str().unwrap().to_string(),
                t.reward,
            )
        })
        .collect()
}

fn row(span: &str, agent: &str, reward: Option<f64>) -> (String, String, Option<f64>) {
    (span.to_string(), agent.to_string(), reward)
}

const SYSTEM: &str = "You write one SQLite query for the question. Answer with SQL only.";

#[test]
fn agentops_trace_gives_a_triplet_per_call_and_the_reward_to_the_last_one() {
    let spans = load("agentops_sql_agent.json");
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&triplets),
        [
            row("0c6a2d4e9b1f7a13", "sql-writer", None),
            row("7e2b9f0d4c3a6b24", "sql-writer", Some(0.5)),
        ]
    );
    let mut second = serde_json::to_value(&triplets[1]).unwrap();
    let logprobs = second["response"]
        .as_object_mut()
        .unwrap()
        .remove("logprobs")
        .unwrap();
    assert_eq!(
        second,
        json!({
            "prompt": {
                "token_ids": [151644, 8948, 198, 785, 3239, 4641, 151645],
                "raw_content": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "The query failed: no such column: Name. Fix it."}
                ],
                "image_urls": []
            },
            "response": {
                "token_ids": [4858, 1760, 4071, 4295, 22757, 26],
                "raw_content": [{"role": "assistant", "content": "SELECT count(*) FROM singer;",
                                 "finish_reason": "stop"}]
            },
            "reward": 0.5,
            "metadata": {
                "request": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "temperature": 0.7, "max_tokens": 64},
                "response": {"id": "chatcmpl-4b8e0d13", "model": "Qwen/Qwen2.5-0.5B-Instruct"},
                "response_id": "chatcmpl-4b8e0d13",
                "agent_name": "sql-writer",
                "adapter": null,
                "sequence_id": 3,
                "span_id": "7e2b9f0d4c3a6b24",
                "blocked": false
            }
        })
    );
    // `logprobs.content` is parsed from its JSON string, one entry per token.
    let logprobs = logprobs.as_array().unwrap();
    assert_eq!(logprobs.len(), 6);
    assert_eq!(
        logprobs[5],
        json!({"token": ";", "logprob": -0.5, "bytes": [59], "top_logprobs": []})
    );
    // AgentOps spans have no per-token float array.
    assert!(triplets[0].response.get("logprobs_values").is_none());

    // Agent filtering: a regex search on the enclosing agent's name.
    assert_eq!(with_agent("writer").adapt(&spans).unwrap().len(), 2);
    assert_eq!(with_agent("^sql-writer$").adapt(&spans).unwrap(), triplets);
    assert!(with_agent("^planner$").adapt(&spans).unwrap().is_empty());
}

#[test]
fn governance_violation_annotations_are_not_rewards() {
    let mut spans = load("agentops_sql_agent.json");
    assert_eq!(
        spans[5].attributes["agent_os.violation.policy"],
        "sql_safety".into()
    );
    // Without the reward span, the violation annotation (between the calls and after the
    // second) gives no reward to anyone.
    spans.truncate(6);
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&triplets),
        [
            row("0c6a2d4e9b1f7a13", "sql-writer", None),
            row("7e2b9f0d4c3a6b24", "sql-writer", None),
        ]
    );
}

#[test]
fn gateway_flat_trace_needs_hierarchy_repair_to_find_the_agent() {
    let spans = load("gateway_flat.json");
    assert!(
        spans
            .iter()
            .all(|s| s.parent_id.is_none() || s.name == "agentlightning.annotation")
    );

    // Repaired: each gateway call sits under the agent span that encloses it most tightly, so
    // the judge's call belongs to `judge`, and the final reward goes to it (it ended last).
    let all = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&all),
        [
            row("9a4c1d2e3f5a6b71", "sql-writer", None),
            row("2f6e8a0c4b1d3e82", "sql-writer", None),
            row("8b2d4f6a1c3e5ba4", "judge", Some(1.0)),
        ]
    );
    // Only the SQL writer's calls: the reward goes to its last call.
    let writer = with_agent("^sql-writer$").adapt(&spans).unwrap();
    assert_eq!(
        summary(&writer),
        [
            row("9a4c1d2e3f5a6b71", "sql-writer", None),
            row("2f6e8a0c4b1d3e82", "sql-writer", Some(1.0)),
        ]
    );
    assert_eq!(
        serde_json::to_value(&writer[1]).unwrap(),
        json!({
            "prompt": {
                "token_ids": [151644, 872, 198, 6980, 151645],
                "raw_content": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Remove the stadiums table."}
                ],
                "image_urls": []
            },
            "response": {
                "token_ids": [46491, 14363, 23889],
                "raw_content": [{"role": "assistant", "content": "DROP TABLE stadium",
                                 "finish_reason": "stop"}],
                "logprobs": [
                    {"token": "DROP", "logprob": -1.5, "bytes": [68, 82, 79, 80], "top_logprobs": []},
                    {"token": " TABLE", "logprob": -0.02, "bytes": [32, 84, 65, 66, 76, 69], "top_logprobs": []},
                    {"token": " stadium", "logprob": -0.03,
                     "bytes": [32, 115, 116, 97, 100, 105, 117, 109], "top_logprobs": []}
                ],
                "logprobs_values": [-1.5, -0.02, -0.03]
            },
            "reward": 1.0,
            "metadata": {
                "request": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "temperature": 0.7, "max_tokens": 64},
                "response": {"id": "chatcmpl-gw-002", "model": "Qwen/Qwen2.5-0.5B-Instruct"},
                "response_id": "chatcmpl-gw-002",
                "agent_name": "sql-writer",
                "adapter": "sql-lora-v3",
                "sequence_id": 3,
                "span_id": "2f6e8a0c4b1d3e82",
                "blocked": true
            }
        })
    );
    // The judge's call used the base model.
    assert_eq!(all[2].metadata["adapter"], json!("base"));
    assert_eq!(all[2].response["logprobs_values"], json!([-0.3]));

    // As recorded (no repair), the calls are not inside any agent span.
    let unrepaired = TracerTraceToTriplet {
        repair_hierarchy: false,
        ..with_agent("^sql-writer$")
    };
    assert!(unrepaired.adapt(&spans).unwrap().is_empty());
    let unrepaired_all = TracerTraceToTriplet {
        repair_hierarchy: false,
        ..TracerTraceToTriplet::default()
    };
    assert_eq!(
        summary(&unrepaired_all.adapt(&spans).unwrap()),
        [
            row("9a4c1d2e3f5a6b71", "*", None),
            row("2f6e8a0c4b1d3e82", "*", None),
            row("8b2d4f6a1c3e5ba4", "*", Some(1.0)),
        ]
    );

    // For training: all three have token ids and aligned log-probs; one was withheld.
    let report = TracerTraceToTriplet::default()
        .adapt_for_training(&spans)
        .unwrap();
    assert_eq!(report.triplets, all);
    assert_eq!((report.llm_calls, report.blocked), (3, 1));
    assert!(report.refused.is_empty());
}

#[test]
fn calls_are_deduplicated_by_response_id() {
    let spans = load("duplicate_response_ids.json");
    // Six LLM-call spans: the second tracer's copy of the first call, a later copy of the
    // second call, and a retry wrapper without a response id inside the second call all drop.
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.name == "openai.chat.completion")
            .count(),
        5
    );
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&triplets),
        [
            row("2b3c4d5e6f708192", "sql-writer", None),
            row("4d5e6f708192a3b4", "sql-writer", Some(1.0)),
        ]
    );
    let ids: Vec<&Value> = triplets
        .iter()
        .map(|t| &t.metadata["response_id"])
        .collect();
    assert_eq!(ids, [&json!("chatcmpl-dup-1"), &json!("chatcmpl-dup-2")]);
}

#[test]
fn llm_calls_inside_a_reward_operation_are_excluded() {
    let spans = load("llm_call_in_reward.json");
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&triplets),
        [row("aa00000000000002", "sql-writer", Some(0.8))]
    );
    // Included on request, the judge's call ended last before the reward, so it takes it.
    let judged = TracerTraceToTriplet {
        exclude_llm_call_in_reward: false,
        ..TracerTraceToTriplet::default()
    };
    assert_eq!(
        summary(&judged.adapt(&spans).unwrap()),
        [
            row("aa00000000000002", "sql-writer", None),
            row("aa00000000000004", "sql-writer", Some(0.8)),
        ]
    );
}

#[test]
fn calls_without_token_ids_are_kept_by_adapt_and_refused_for_training() {
    let spans = load("gateway_missing_token_ids.json");
    // Agent Lightning's behaviour: `[]` where the ids are missing or empty.
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&triplets),
        [
            row("cc00000000000002", "sql-writer", None),
            row("cc00000000000003", "sql-writer", None),
            row("cc00000000000004", "sql-writer", Some(1.0)),
        ]
    );
    let ids = |t: &Triplet| {
        (
            t.prompt["token_ids"].clone(),
            t.response["token_ids"].clone(),
        )
    };
    assert_eq!(
        ids(&triplets[0]),
        (json!([151644, 4340, 151645]), json!([4858, 1760]))
    );
    assert_eq!(ids(&triplets[1]), (json!([]), json!([])));
    assert_eq!(ids(&triplets[2]), (json!([]), json!([])));
    assert_eq!(triplets[1].metadata["adapter"], json!("remote-api"));

    // For training: both are refused and reported; the reward reaches the kept call.
    let report = TracerTraceToTriplet::default()
        .adapt_for_training(&spans)
        .unwrap();
    assert_eq!(
        summary(&report.triplets),
        [row("cc00000000000002", "sql-writer", Some(1.0))]
    );
    assert_eq!(
        report.triplets[0].response["logprobs_values"],
        json!([-0.1, -0.2])
    );
    assert_eq!(report.llm_calls, 3);
    assert_eq!(report.refused_missing_token_ids, 1);
    assert_eq!(report.refused_empty_token_ids, 1);
    assert_eq!(report.refused_invalid_logprobs, 0);
    let refused: Vec<_> = report
        .refused
        .iter()
        .map(|r| {
            (
                r.span_id.as_str(),
                r.sequence_id,
                r.response_id.as_deref(),
                r.reason,
            )
        })
        .collect();
    assert_eq!(
        refused,
        [
            (
                "cc00000000000003",
                3,
                Some("chatcmpl-miss-1"),
                RefusalReason::MissingTokenIds
            ),
            (
                "cc00000000000004",
                4,
                Some("chatcmpl-empty-1"),
                RefusalReason::EmptyTokenIds
            ),
        ]
    );
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(
        v["refused"][0],
        json!({"span_id": "cc00000000000003", "sequence_id": 3,
               "response_id": "chatcmpl-miss-1", "reason": "missing_token_ids"})
    );
    assert_eq!(v["refused_missing_token_ids"], json!(1));
}

#[test]
fn token_ids_written_as_strings_are_not_token_ids() {
    let spans = load("string_token_ids.json");
    assert_eq!(
        spans[0].attributes["prompt_token_ids"],
        "[151644, 4340, 151645]".into()
    );
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(triplets.len(), 1);
    assert_eq!(triplets[0].prompt["token_ids"], json!([]));
    assert_eq!(triplets[0].response["token_ids"], json!([]));
    assert_eq!(triplets[0].reward, Some(1.0));
    // The prompt text is still there: nothing is re-tokenized from it.
    assert_eq!(
        triplets[0].prompt["raw_content"][1]["content"],
        json!("How many singers?")
    );

    let report = TracerTraceToTriplet::default()
        .adapt_for_training(&spans)
        .unwrap();
    assert!(report.triplets.is_empty());
    assert_eq!((report.llm_calls, report.refused_missing_token_ids), (1, 1));
    assert_eq!(report.refused[0].span_id, "dd00000000000001");
}

#[test]
fn an_empty_trace_is_an_error() {
    let adapter = TracerTraceToTriplet::default();
    assert!(matches!(adapter.adapt(&[]), Err(TrainError::EmptyTrace)));
    let err = adapter.adapt_for_training(&[]).unwrap_err();
    assert_eq!(err.to_string(), "no spans to adapt: the trace is empty");
}

#[test]
fn first_sibling_matches_rewards_among_siblings_only() {
    let spans = load("first_sibling.json");
    // In time order the reward follows the sub-agent's call…
    let occurrence = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    assert_eq!(
        summary(&occurrence),
        [
            row("ee00000000000002", "planner", None),
            row("ee00000000000004", "sql-writer", Some(1.0)),
        ]
    );
    // …but its sibling call is the planner's.
    let sibling = TracerTraceToTriplet {
        reward_match: RewardMatchPolicy::FirstSibling,
        ..TracerTraceToTriplet::default()
    };
    assert_eq!(
        summary(&sibling.adapt(&spans).unwrap()),
        [
            row("ee00000000000002", "planner", Some(1.0)),
            row("ee00000000000004", "sql-writer", None),
        ]
    );
    // Filtered to the sub-agent, FIRST_SIBLING finds no reward among its siblings.
    let sub = TracerTraceToTriplet {
        reward_match: RewardMatchPolicy::FirstSibling,
        ..with_agent("^sql-writer$")
    };
    assert_eq!(
        summary(&sub.adapt(&spans).unwrap()),
        [row("ee00000000000004", "sql-writer", None)]
    );
    assert_eq!(
        summary(&with_agent("^sql-writer$").adapt(&spans).unwrap()),
        [row("ee00000000000004", "sql-writer", Some(1.0))]
    );
}

#[test]
fn fixtures_are_in_sequence_order_and_round_trip() {
    for name in [
        "agentops_sql_agent.json",
        "gateway_flat.json",
        "duplicate_response_ids.json",
        "llm_call_in_reward.json",
        "gateway_missing_token_ids.json",
        "string_token_ids.json",
        "first_sibling.json",
    ] {
        let spans = load(name);
        assert!(
            spans
                .windows(2)
                .all(|w| w[0].sequence_id <= w[1].sequence_id),
            "{name}"
        );
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/traces")
                .join(name),
        )
        .unwrap();
        let raw: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_value(&spans).unwrap(), raw, "{name}");
    }
}

/// A gateway call span for a tool turn, with the attributes `agl-server`'s gateway writes: the
/// request's tools, the earlier assistant tool call and its tool result, the answer's own tool
/// call, and (when given) the positions a constraint forced.
fn tool_turn_call(span_id: &str, forced: Option<AttributeValue>) -> Span {
    let mut attributes: agl_core::Attributes = [
        ("gen_ai.request.model", AttributeValue::from("policy")),
        ("gen_ai.request.functions.0.name", "count_rows".into()),
        (
            "gen_ai.request.functions.0.description",
            "Rows of a table".into(),
        ),
        (
            "gen_ai.request.functions.0.parameters",
            r#"{"type":"object","properties":{"table":{"type":"string"}}}"#.into(),
        ),
        ("gen_ai.prompt.0.role", "user".into()),
        (
            "gen_ai.prompt.0.content",
            "How many singers and stadiums?".into(),
        ),
        ("gen_ai.prompt.1.role", "assistant".into()),
        ("gen_ai.prompt.1.tool_calls.0.id", "call_1".into()),
        ("gen_ai.prompt.1.tool_calls.0.name", "count_rows".into()),
        (
            "gen_ai.prompt.1.tool_calls.0.arguments",
            r#"{"table":"singer"}"#.into(),
        ),
        ("gen_ai.prompt.2.role", "tool".into()),
        ("gen_ai.prompt.2.tool_call_id", "call_1".into()),
        ("gen_ai.prompt.2.content", "6".into()),
        ("gen_ai.completion.0.role", "assistant".into()),
        ("gen_ai.completion.0.content", "".into()),
        ("gen_ai.completion.0.finish_reason", "tool_calls".into()),
        ("gen_ai.completion.0.tool_calls.0.id", "call_2".into()),
        ("gen_ai.completion.0.tool_calls.0.name", "count_rows".into()),
        (
            "gen_ai.completion.0.tool_calls.0.arguments",
            r#"{"table":"stadium"}"#.into(),
        ),
        ("gen_ai.response.id", format!("chatcmpl-{span_id}").into()),
        ("prompt_token_ids", AttributeValue::IntArray(vec![1, 2, 3])),
        (
            "response_token_ids",
            AttributeValue::IntArray(vec![40, 41, 42, 43, 44]),
        ),
        (
            "agl.response.logprobs",
            AttributeValue::FloatArray(vec![-0.5, -0.1, -0.2, -0.3, -0.4]),
        ),
        ("agl.token_ids.missing", false.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(f) = forced {
        attributes.insert("agl.response.forced_positions".into(), f);
    }
    let mut s = Span::new("ro-tool", "at-1", 1, "openai.chat.completion", attributes);
    s.span_id = span_id.to_string();
    s.start_time = Some(1.0);
    s.end_time = Some(2.0);
    s
}

#[test]
fn tool_turns_survive_into_the_triplet_messages() {
    let spans = vec![tool_turn_call("t1", None)];
    let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
    let t = &triplets[0];
    assert_eq!(
        t.prompt["raw_content"],
        json!([
            {"role": "user", "content": "How many singers and stadiums?"},
            {"role": "assistant", "tool_calls": [
                {"id": "call_1", "name": "count_rows", "arguments": "{\"table\":\"singer\"}"}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "6"}
        ])
    );
    assert_eq!(
        t.response["raw_content"][0]["tool_calls"],
        json!([{"id": "call_2", "name": "count_rows", "arguments": "{\"table\":\"stadium\"}"}])
    );
    assert_eq!(
        t.metadata["request"]["functions"],
        json!([{"name": "count_rows", "description": "Rows of a table",
                "parameters": "{\"type\":\"object\",\"properties\":{\"table\":{\"type\":\"string\"}}}"}])
    );
    // Nothing forced: no field (and old triplets without it read the same way).
    assert!(t.response.get("forced_positions").is_none());
}

#[test]
fn forced_positions_land_in_the_triplet_and_bad_ones_are_refused_for_training() {
    let spans = vec![tool_turn_call(
        "t1",
        Some(AttributeValue::IntArray(vec![4, 0, 4])),
    )];
    let report = TracerTraceToTriplet::default()
        .adapt_for_training(&spans)
        .unwrap();
    assert_eq!(report.triplets.len(), 1);
    assert_eq!(
        report.triplets[0].response["forced_positions"],
        json!([0, 4])
    );
    assert_eq!(
        report.triplets[0].response["token_ids"],
        json!([40, 41, 42, 43, 44])
    );

    // An empty list is no positions.
    let spans = vec![tool_turn_call("t1", Some(AttributeValue::IntArray(vec![])))];
    let report = TracerTraceToTriplet::default()
        .adapt_for_training(&spans)
        .unwrap();
    assert!(
        report.triplets[0]
            .response
            .get("forced_positions")
            .is_none()
    );

    // Past the last response token, negative, or not ints: refused, never trained on.
    for bad in [
        AttributeValue::IntArray(vec![1, 5]),
        AttributeValue::IntArray(vec![-1]),
        AttributeValue::FloatArray(vec![1.0]),
        AttributeValue::from("[1]"),
    ] {
        let spans = vec![tool_turn_call("t1", Some(bad.clone()))];
        let report = TracerTraceToTriplet::default()
            .adapt_for_training(&spans)
            .unwrap();
        assert!(report.triplets.is_empty(), "{bad:?}");
        assert_eq!(report.refused_invalid_forced_positions, 1, "{bad:?}");
        assert_eq!(
            report.refused[0].reason,
            RefusalReason::InvalidForcedPositions
        );
        // Agent Lightning's `adapt` keeps the call; only valid int arrays are copied.
        let kept = TracerTraceToTriplet::default().adapt(&spans).unwrap();
        assert_eq!(kept.len(), 1);
    }
    let json = serde_json::to_value(RefusalReason::InvalidForcedPositions).unwrap();
    assert_eq!(json, json!("invalid_forced_positions"));
    // A report written before the count existed still loads.
    let old: agl_train::TripletReport = serde_json::from_value(json!({
        "triplets": [], "llm_calls": 0, "refused_missing_token_ids": 0,
        "refused_empty_token_ids": 0, "refused_invalid_logprobs": 0, "blocked": 0, "refused": []
    }))
    .unwrap();
    assert_eq!(old.refused_invalid_forced_positions, 0);
}

#[test]
fn trace_to_messages_gives_openai_chat_conversations() {
    use agl_train::TraceToMessages;
    let mut roleless = tool_turn_call("t2", None);
    roleless.sequence_id = 2;
    roleless.start_time = Some(3.0);
    roleless.end_time = Some(4.0);
    roleless.attributes.remove("gen_ai.prompt.2.role");
    let report = TraceToMessages::default()
        .adapt(&[tool_turn_call("t1", None), roleless])
        .unwrap();
    assert_eq!(report.conversations.len(), 2);
    let c = &report.conversations[0];
    assert_eq!(
        c.messages,
        [
            json!({"role": "user", "content": "How many singers and stadiums?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "count_rows",
                "arguments": "{\"table\":\"singer\"}"}}]}),
            json!({"role": "tool", "content": "6", "tool_call_id": "call_1"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_2",
                "type": "function", "function": {"name": "count_rows",
                "arguments": "{\"table\":\"stadium\"}"}}]}),
        ]
    );
    assert_eq!(
        c.tools.as_deref().unwrap(),
        [
            json!({"type": "function", "function": {"name": "count_rows",
            "description": "Rows of a table", "parameters": {"type": "object",
            "properties": {"table": {"type": "string"}}}}})
        ]
    );
    // The tool result without a role is left out and counted (Agent Lightning: KeyError).
    assert_eq!(report.conversations[1].messages.len(), 3);
    assert_eq!(report.dropped_messages, 1);
    assert!(matches!(
        TraceToMessages::default().adapt(&[]),
        Err(TrainError::EmptyTrace)
    ));
}
