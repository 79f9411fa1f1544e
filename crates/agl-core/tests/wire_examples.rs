#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Wire-compatibility tests: the example bodies of the protocol reference (§3.3, §3.8, §7.4)
//! parse into the Rust types and serialize back to the same JSON.

use agl_core::{
    AnyRollout, AttemptStatus, AttemptedRollout, AttributeValue, Rollout, RolloutStatus, Span,
    find_final_reward, get_reward_value, reward_attributes, semconv,
};
use serde_json::{Value, json};

const DEQUEUE_EXAMPLE: &str = r#"{"rollout_id":"ro-c6e57c3ca2c7","input":"a","start_time":1795217241.29,"end_time":null,
 "mode":null,"resources_id":null,"status":"preparing",
 "config":{"timeout_seconds":null,"unresponsive_seconds":null,"max_attempts":1,"retry_condition":[]},
 "metadata":{},
 "attempt":{"rollout_id":"ro-c6e57c3ca2c7","attempt_id":"at-f041e3af","sequence_id":1,
            "start_time":1795217241.31,"end_time":null,"status":"preparing","worker_id":"w1",
            "last_heartbeat_time":null,"metadata":null}}"#;

const SPAN_EXAMPLE: &str = r#"{"rollout_id":"ro-…","attempt_id":"at-…","sequence_id":3,
 "trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","parent_id":null,
 "name":"agentlightning.annotation","status":{"status_code":"OK","description":null},
 "attributes":{"agentlightning.reward.0.name":"primary","agentlightning.reward.0.value":1.0},
 "events":[],"links":[],"start_time":1735000001.0,"end_time":1735000001.0,
 "context":{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7","is_remote":false,"trace_state":{}},
 "parent":null,"resource":{"attributes":{},"schema_url":""}}"#;

#[test]
fn attempted_rollout_example_round_trips_exactly() {
    let expected: Value = serde_json::from_str(DEQUEUE_EXAMPLE).unwrap();
    let parsed: AttemptedRollout = serde_json::from_str(DEQUEUE_EXAMPLE).unwrap();
    assert_eq!(parsed.rollout.status, RolloutStatus::Preparing);
    assert_eq!(parsed.attempt.status, AttemptStatus::Preparing);
    assert_eq!(parsed.attempt.worker_id.as_deref(), Some("w1"));
    assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);
    // Through text as well: timestamps survive bit-for-bit.
    let text = serde_json::to_string(&parsed).unwrap();
    let again: AttemptedRollout = serde_json::from_str(&text).unwrap();
    assert_eq!(again, parsed);
}

#[test]
fn rollout_never_has_an_attempt_key_and_attempted_rollout_requires_it() {
    let parsed: AttemptedRollout = serde_json::from_str(DEQUEUE_EXAMPLE).unwrap();
    let rollout: Rollout = parsed.clone().into();
    let v = serde_json::to_value(&rollout).unwrap();
    assert!(!v.as_object().unwrap().contains_key("attempt"));

    let mut expected: Value = serde_json::from_str(DEQUEUE_EXAMPLE).unwrap();
    expected.as_object_mut().unwrap().remove("attempt");
    assert_eq!(v, expected);

    // Without the key it is a Rollout, not an AttemptedRollout.
    assert!(serde_json::from_value::<AttemptedRollout>(expected.clone()).is_err());
    let any: AnyRollout = serde_json::from_value(expected).unwrap();
    assert!(matches!(any, AnyRollout::Plain(_)));
    let any: AnyRollout = serde_json::from_str(DEQUEUE_EXAMPLE).unwrap();
    assert!(matches!(any, AnyRollout::Attempted(_)));
}

#[test]
fn span_example_round_trips_exactly() {
    let expected: Value = serde_json::from_str(SPAN_EXAMPLE).unwrap();
    let span: Span = serde_json::from_str(SPAN_EXAMPLE).unwrap();
    assert_eq!(span.sequence_id, 3);
    assert_eq!(get_reward_value(&span), Some(1.0));
    assert_eq!(serde_json::to_value(&span).unwrap(), expected);
}

#[test]
fn span_extras_are_kept_at_every_level() {
    let mut body: Value = serde_json::from_str(SPAN_EXAMPLE).unwrap();
    body["kind"] = json!("SpanKind.INTERNAL");
    body["instrumentation_scope"] = json!({"name": "x", "version": null});
    body["status"]["code_hint"] = json!(2);
    body["context"]["flags"] = json!(1);
    body["events"] = json!([{"name": "e", "attributes": {"k": "v"}, "dropped": 0}]);
    body["links"] = json!([{"context": body["context"].clone(), "weight": 1}]);
    let span: Span = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(span.extra["kind"], json!("SpanKind.INTERNAL"));
    assert_eq!(span.events[0].timestamp, None);
    assert_eq!(span.links[0].attributes, None);
    let mut expected = body;
    // Defaults are written explicitly on output.
    expected["events"][0]["timestamp"] = Value::Null;
    expected["links"][0]["attributes"] = Value::Null;
    assert_eq!(serde_json::to_value(&span).unwrap(), expected);
}

#[test]
fn span_keys_are_required_even_when_null() {
    let full: Value = serde_json::from_str(SPAN_EXAMPLE).unwrap();
    for key in [
        "parent_id",
        "parent",
        "context",
        "start_time",
        "end_time",
        "events",
        "links",
        "resource",
        "status",
        "attributes",
        "sequence_id",
    ] {
        let mut body = full.clone();
        body.as_object_mut().unwrap().remove(key);
        let err = serde_json::from_value::<Span>(body).unwrap_err();
        assert!(err.to_string().contains(key), "missing {key}: {err}");
    }
    let mut bad = full.clone();
    bad["attributes"]["nested"] = json!({"a": 1});
    assert!(serde_json::from_value::<Span>(bad).is_err());
    let mut bad = full;
    bad["attributes"]["n"] = Value::Null;
    assert!(serde_json::from_value::<Span>(bad).is_err());
}

#[test]
fn multi_dimensional_reward_example() {
    // {"final": -99, "base": 1, "policy_penalty": -100} with primary_key "final".
    let attrs = reward_attributes(&[("final", -99.0), ("base", 1.0), ("policy_penalty", -100.0)]);
    let as_json = serde_json::to_value(&attrs).unwrap();
    assert_eq!(
        as_json,
        json!({
            "agentlightning.reward.0.name": "final", "agentlightning.reward.0.value": -99.0,
            "agentlightning.reward.1.name": "base", "agentlightning.reward.1.value": 1.0,
            "agentlightning.reward.2.name": "policy_penalty", "agentlightning.reward.2.value": -100.0,
        })
    );
    let mut span = Span::new("ro-1", "at-1", 1, semconv::AGL_ANNOTATION, attrs);
    span.attributes
        .insert("agent_os.violation_count".into(), AttributeValue::Int(1));
    assert_eq!(get_reward_value(&span), Some(-99.0));
    let dims = agl_core::get_rewards_from_span(&span).unwrap();
    let names: Vec<_> = dims.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["final", "base", "policy_penalty"]);
    assert_eq!(find_final_reward(&[span]), Some(-99.0));
}
