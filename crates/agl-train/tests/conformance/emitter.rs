//! Conformance: `FlightRecorderEmitter` and `LightningSpan` (Part B7, spec §19.6, D13).
//!
//! Entries come from a real [`Kernel`] with an in-memory [`FlightRecorder`]: one entry per
//! `check`.

use std::sync::Arc;
use std::time::Duration;

use agl_gov::{
    Action, Effect, FlightRecorder, GovernanceMode, Kernel, PolicyOptions, Severity, Signal,
    SqlPolicy, SqlPolicyConfig,
};
use agl_store::{InMemoryLightningStore, LightningStore};
use agl_train::{
    EmitterConfig, EmitterStats, FlightRecorderEmitter, LightningSpan, TrainError, create_emitter,
};
use chrono::{TimeZone, Utc};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::{Trigger, sql};

/// An enforcing kernel with the real `sql_safety` policy named `SQLPolicy` and an in-memory
/// recorder (DROP is blocked as critical, SELECT is clean).
fn recorded_sql_kernel() -> Kernel {
    Kernel::new(GovernanceMode::Enforce)
        .with_policy_options(
            SqlPolicy::new(SqlPolicyConfig::default()),
            PolicyOptions {
                name: Some("SQLPolicy".into()),
                ..PolicyOptions::default()
            },
        )
        .with_recorder(FlightRecorder::in_memory())
}

/// A kernel whose `RateLimit` trigger policy blocks `"burst"` and sends `SIGSTOP`.
fn recorded_signal_kernel() -> Kernel {
    Kernel::new(GovernanceMode::Enforce)
        .with_policy_options(
            Trigger {
                trigger: "burst",
                severity: Severity::Medium,
                effect: Effect::Block,
            },
            PolicyOptions {
                name: Some("RateLimit".into()),
                signal: Some(Signal::Sigstop),
                ..PolicyOptions::default()
            },
        )
        .with_recorder(FlightRecorder::in_memory())
}

fn emitter(kernel: &Kernel, config: EmitterConfig) -> FlightRecorderEmitter {
    FlightRecorderEmitter::new(kernel.shared_recorder().unwrap(), config)
}

fn check_n(kernel: &Kernel, n: usize) {
    for i in 0..n {
        kernel.check(&sql(&format!("SELECT {i}"))).unwrap();
    }
}

fn types(spans: &[LightningSpan]) -> Vec<String> {
    spans
        .iter()
        .map(|s| {
            s.attributes["agent_os.entry_type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn jan_first() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
}

// ---- LightningSpan -------------------------------------------------------------------------

#[test]
fn lightning_span_to_dict_has_exactly_seven_keys() {
    let d = LightningSpan::new("s1", "t1", "test", jan_first()).to_dict();
    let mut keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "attributes",
            "end_time",
            "events",
            "name",
            "span_id",
            "start_time",
            "trace_id"
        ]
    );
}

#[test]
fn lightning_span_start_time_is_iso_8601_like_python() {
    let d = LightningSpan::new("s1", "t1", "test", jan_first()).to_dict();
    let start = d["start_time"].as_str().unwrap();
    assert!(start.contains("2024-01-01"));
    assert_eq!(start, "2024-01-01T00:00:00+00:00");
}

#[test]
fn lightning_span_end_time_is_null_when_unset() {
    let mut span = LightningSpan::new("s1", "t1", "test", jan_first());
    assert_eq!(span.to_dict()["end_time"], Value::Null);
    span.end_time = Some(jan_first());
    assert_eq!(span.to_dict()["end_time"], "2024-01-01T00:00:00+00:00");
}

#[test]
fn lightning_span_default_attributes_and_events_are_empty() {
    let d = LightningSpan::new("s1", "t1", "test", jan_first()).to_dict();
    assert_eq!(d["attributes"], json!({}));
    assert_eq!(d["events"], json!([]));
}

#[test]
fn lightning_span_to_json_parses_back() {
    let span = LightningSpan::new("s1", "t1", "test", jan_first());
    let parsed: Value = serde_json::from_str(&span.to_json()).unwrap();
    assert_eq!(parsed["span_id"], "s1");
    assert_eq!(parsed["trace_id"], "t1");
    let back: LightningSpan = serde_json::from_str(&span.to_json()).unwrap();
    assert_eq!(back, span);
}

// ---- Constructor and conversion ------------------------------------------------------------

#[test]
fn emitter_defaults_match_python() {
    let kernel = recorded_sql_kernel();
    let e = create_emitter(kernel.shared_recorder().unwrap(), EmitterConfig::default());
    let c = e.config();
    assert!(c.include_policy_checks && c.include_signals && c.include_tool_calls);
    assert_eq!(c.trace_id_prefix, "agentos");
    assert_eq!(c.poll_interval, Duration::from_millis(100));
    assert_eq!(
        e.stats(),
        EmitterStats {
            emitted_count: 0,
            last_position: 0
        }
    );
    assert_eq!(
        serde_json::to_value(e.stats()).unwrap(),
        json!({"emitted_count": 0, "last_position": 0})
    );
}

#[test]
fn policy_check_entry_converts_to_a_policy_check_span() {
    let kernel = recorded_sql_kernel();
    kernel
        .check(&sql("DROP TABLE singer").with_agent_id("agent-1"))
        .unwrap();
    let spans = emitter(&kernel, EmitterConfig::default()).spans().unwrap();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(s.attributes["agent_os.entry_type"], "policy_check");
    assert_eq!(s.name, "agent_os.policy_check");
    assert_eq!(s.span_id, "1");
    assert_eq!(s.trace_id, "agentos-agent-1");
    assert_eq!(s.attributes["agent_os.agent_id"], "agent-1");
    assert_eq!(s.attributes["agent_os.policy_name"], "SQLPolicy");
    assert_eq!(s.attributes["agent_os.policy_result"], "block");
    assert_eq!(s.attributes["agent_os.policy_violated"], true);
    assert_eq!(s.attributes["agent_os.severity"], "critical");
    assert_eq!(s.end_time, Some(s.start_time));
}

#[test]
fn include_policy_checks_false_drops_policy_check_spans() {
    let kernel = recorded_sql_kernel();
    kernel
        .check(&Action::tool_call("search", json!({"q": "x"})))
        .unwrap();
    let all = emitter(&kernel, EmitterConfig::default()).spans().unwrap();
    assert_eq!(types(&all), ["policy_check", "tool_call"]);
    let cfg = EmitterConfig {
        include_policy_checks: false,
        ..EmitterConfig::default()
    };
    assert_eq!(
        types(&emitter(&kernel, cfg).spans().unwrap()),
        ["tool_call"]
    );
}

#[test]
fn include_tool_calls_false_drops_tool_call_spans() {
    let kernel = recorded_sql_kernel();
    kernel
        .check(&Action::tool_call("search", json!({"q": "x"})))
        .unwrap();
    let all = emitter(&kernel, EmitterConfig::default()).spans().unwrap();
    let tool = all.iter().find(|s| s.name == "agent_os.tool_call").unwrap();
    assert_eq!(tool.span_id, "1.tool");
    assert_eq!(tool.attributes["agent_os.tool_name"], "search");
    assert_eq!(tool.attributes["agent_os.tool_args"], r#"{"q":"x"}"#);
    let cfg = EmitterConfig {
        include_tool_calls: false,
        ..EmitterConfig::default()
    };
    assert_eq!(
        types(&emitter(&kernel, cfg).spans().unwrap()),
        ["policy_check"]
    );
}

#[test]
fn include_signals_false_drops_signal_spans() {
    let kernel = recorded_signal_kernel();
    let d = kernel
        .check(&Action::output("burst").with_agent_id("agent-7"))
        .unwrap();
    assert_eq!(d.signals, vec![Signal::Sigstop]);
    let all = emitter(&kernel, EmitterConfig::default()).spans().unwrap();
    assert_eq!(types(&all), ["policy_check", "signal"]);
    let signal = &all[1];
    assert_eq!(signal.name, "agent_os.signal");
    assert_eq!(signal.span_id, "1.signal.0");
    assert_eq!(signal.attributes["agent_os.signal_type"], "SIGSTOP");
    assert_eq!(signal.attributes["agent_os.signal_target"], "agent-7");
    let cfg = EmitterConfig {
        include_signals: false,
        ..EmitterConfig::default()
    };
    assert_eq!(
        types(&emitter(&kernel, cfg).spans().unwrap()),
        ["policy_check"]
    );
}

#[test]
fn policy_violated_reflects_the_decision_and_cannot_be_overridden() {
    // Python writes free entry metadata last, so metadata {"policy_violated": False} hides a
    // violation (D13). Our entries have no free metadata and the standard attributes are
    // written last: the attribute is the decision's.
    let kernel = recorded_sql_kernel();
    kernel.check(&sql("SELECT name FROM singer")).unwrap();
    kernel.check(&sql("DROP TABLE singer")).unwrap();
    let spans = emitter(&kernel, EmitterConfig::default()).spans().unwrap();
    assert_eq!(spans[0].attributes["agent_os.policy_violated"], false);
    assert_eq!(spans[0].attributes["agent_os.policy_result"], "allow");
    assert_eq!(spans[0].attributes["agent_os.policy_name"], "");
    assert_eq!(spans[1].attributes["agent_os.policy_violated"], true);
    assert_eq!(spans[1].attributes["agent_os.policy_result"], "block");
}

// ---- emit_to_store -------------------------------------------------------------------------

#[tokio::test]
async fn emit_to_store_stores_two_spans_for_two_entries_of_a_started_rollout() {
    let store = InMemoryLightningStore::new();
    let started = store
        .start_rollout(agl_core::EnqueueRolloutRequest::new(json!(null)), None)
        .await
        .unwrap();
    let rid = started.rollout.rollout_id.clone();
    let aid = started.attempt.attempt_id.clone();
    let kernel = recorded_sql_kernel();
    kernel
        .check(&sql("SELECT 1").with_rollout_id(&rid).with_attempt_id(&aid))
        .unwrap();
    // No attempt id: bound to the rollout's latest attempt.
    kernel
        .check(&sql("DROP TABLE t").with_rollout_id(&rid))
        .unwrap();
    let e = emitter(&kernel, EmitterConfig::default());

    assert_eq!(e.emit_to_store(&store).await.unwrap(), 2);
    let spans = store.list_spans(&rid, Some(&aid)).await.unwrap();
    assert_eq!(spans.len(), 2);
    for s in &spans {
        assert_eq!(s.name, "agentlightning.annotation");
        assert_eq!(s.trace_id.len(), 32);
        assert_eq!(s.span_id.len(), 16);
    }
    let results: Vec<_> = spans
        .iter()
        .map(|s| s.attributes["agent_os.policy_result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["allow", "block"]);
    assert_eq!(
        spans[1].attributes["agent_os.policy_violated"],
        agl_core::AttributeValue::Bool(true)
    );
    // Deterministic ids: emitting again stores nothing new.
    assert_eq!(e.emit_to_store(&store).await.unwrap(), 0);
    assert_eq!(store.list_spans(&rid, None).await.unwrap().len(), 2);
    // store_entries (what the Python emitter writes into an Agent Lightning store) describes
    // exactly these spans: the same ids, time and attributes, the attempt only when named.
    let entries = e.store_entries().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].attempt_id.as_deref(), Some(aid.as_str()));
    assert_eq!(entries[1].attempt_id, None);
    for (entry, stored) in entries.iter().zip(&spans) {
        assert_eq!(entry.rollout_id, rid);
        assert_eq!(entry.trace_id, stored.trace_id);
        assert_eq!(entry.spans.len(), 1);
        assert_eq!(entry.spans[0].span_id, stored.span_id);
        assert_eq!(entry.spans[0].attributes, stored.attributes);
        assert_eq!(Some(entry.time), stored.start_time);
    }
}

#[tokio::test]
async fn emit_to_store_differs_entries_without_a_known_rollout_are_not_stored_or_counted() {
    // Python returns the number of spans produced (3 here) even when none were stored.
    let store = InMemoryLightningStore::new();
    let started = store
        .start_rollout(agl_core::EnqueueRolloutRequest::new(json!(null)), None)
        .await
        .unwrap();
    let rid = started.rollout.rollout_id.clone();
    let kernel = recorded_sql_kernel();
    kernel.check(&sql("SELECT 1")).unwrap();
    kernel
        .check(&sql("SELECT 2").with_rollout_id("ro-unknown"))
        .unwrap();
    kernel
        .check(
            &sql("SELECT 3")
                .with_rollout_id(&rid)
                .with_attempt_id("at-unknown"),
        )
        .unwrap();
    kernel
        .check(&sql("SELECT 4").with_rollout_id(&rid))
        .unwrap();
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.spans().unwrap().len(), 4);
    assert_eq!(e.emit_to_store(&store).await.unwrap(), 1);
    assert_eq!(store.list_spans(&rid, None).await.unwrap().len(), 1);
    assert!(
        store
            .list_spans("ro-unknown", None)
            .await
            .unwrap()
            .is_empty()
    );
}

// ---- export_to_file ------------------------------------------------------------------------

#[test]
fn export_to_file_differs_writes_a_one_element_array_whose_span_id_is_the_seq() {
    // Python's test uses an entry id "e1"; our span ids are entry sequence numbers.
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("training_audit.json");
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.export_to_file(&path).unwrap(), 1);
    let text = std::fs::read_to_string(&path).unwrap();
    let data: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(data.as_array().unwrap().len(), 1);
    assert_eq!(data[0]["span_id"], "1");
    assert!(text.contains("\n  {\n    \"span_id\""), "indent 2: {text}");
}

#[cfg(unix)]
#[test]
fn export_to_file_differs_refuses_a_symlink() {
    // Spec §17.5 MUST NOT follow symlinks; Python follows them.
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 1);
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("victim.txt");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.path().join("audit.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = emitter(&kernel, EmitterConfig::default());
    let err = e.export_to_file(&link).unwrap_err();
    assert!(matches!(err, TrainError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("audit.json"), "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

// ---- Violation summary ---------------------------------------------------------------------

#[test]
fn violation_summary_two_entries_one_violated() {
    let kernel = recorded_sql_kernel();
    kernel.check(&sql("SELECT 1")).unwrap();
    kernel.check(&sql("DROP TABLE singer")).unwrap();
    let s = emitter(&kernel, EmitterConfig::default())
        .violation_summary()
        .unwrap();
    assert_eq!(s.total_entries, 2);
    assert_eq!(s.total_violations, 1);
    assert_eq!(s.violation_rate, 0.5);
    assert!(s.policies_violated.contains_key("SQLPolicy"));
    assert_eq!(s.policies_violated["SQLPolicy"], 1);
    let v = serde_json::to_value(&s).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "policies_violated",
            "total_entries",
            "total_violations",
            "violation_rate"
        ]
    );
}

#[test]
fn violation_summary_empty_is_zero() {
    let kernel = recorded_sql_kernel();
    let s = emitter(&kernel, EmitterConfig::default())
        .violation_summary()
        .unwrap();
    assert_eq!((s.total_entries, s.total_violations), (0, 0));
    assert_eq!(s.violation_rate, 0.0);
    assert!(s.policies_violated.is_empty());
}

#[test]
fn violation_summary_differs_changes_neither_emitted_count_nor_cursor() {
    // Python's get_violation_summary calls get_spans and so increments emitted_count (D13).
    let kernel = recorded_sql_kernel();
    kernel.check(&sql("DROP TABLE singer")).unwrap();
    let e = emitter(&kernel, EmitterConfig::default());
    e.violation_summary().unwrap();
    assert_eq!(e.stats(), EmitterStats::default());
}

// ---- Cursor --------------------------------------------------------------------------------

#[test]
fn new_spans_twice_over_two_entries_gives_two_then_zero() {
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 2);
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.new_spans().unwrap().len(), 2);
    assert_eq!(e.new_spans().unwrap().len(), 0);
}

#[test]
fn ten_entries_polled_then_one_added_second_poll_converts_exactly_one() {
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 10);
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.new_spans().unwrap().len(), 10);
    assert_eq!(e.stats().emitted_count, 10);
    kernel.check(&sql("SELECT 'late'")).unwrap();
    let second = e.new_spans().unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].span_id, "11");
    assert_eq!(e.stats().emitted_count, 11, "exactly one more conversion");
}

#[test]
fn spec_19_6_five_then_three_gives_five_cursor_5_then_three_cursor_8() {
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 5);
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.new_spans().unwrap().len(), 5);
    assert_eq!(e.stats().last_position, 5);
    check_n(&kernel, 3);
    assert_eq!(e.new_spans().unwrap().len(), 3);
    assert_eq!(e.stats().last_position, 8);
}

#[test]
fn one_spans_call_over_one_entry_counts_emitted_count_one() {
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 1);
    let e = emitter(&kernel, EmitterConfig::default());
    assert_eq!(e.spans().unwrap().len(), 1);
    assert_eq!(e.stats().emitted_count, 1);
    assert_eq!(
        e.stats().last_position,
        0,
        "spans() does not move the cursor"
    );
}

// ---- stream --------------------------------------------------------------------------------

#[tokio::test]
async fn stream_stopped_after_two_spans_yields_two_and_ends() {
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 2);
    let e = emitter(
        &kernel,
        EmitterConfig {
            poll_interval: Duration::from_millis(5),
            ..EmitterConfig::default()
        },
    );
    let stop = CancellationToken::new();
    let mut stream = std::pin::pin!(e.stream(stop.clone()));
    let mut got = Vec::new();
    while let Some(span) = stream.next().await {
        got.push(span.unwrap());
        if got.len() == 2 {
            stop.cancel();
        }
    }
    assert_eq!(got.len(), 2);
    assert_eq!(e.stats().last_position, 2);
}

#[tokio::test]
async fn stream_differs_pre_cancelled_drains_pending_entries_then_ends() {
    // Spec §12.3 "drain then exit"; Python yields nothing when the stop event is already set.
    let kernel = recorded_sql_kernel();
    check_n(&kernel, 3);
    let e = emitter(&kernel, EmitterConfig::default());
    let stop = CancellationToken::new();
    stop.cancel();
    let spans: Vec<_> = e.stream(stop).collect().await;
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(Result::is_ok));
    assert_eq!(e.stats().emitted_count, 3);
}

#[tokio::test]
async fn stream_without_stop_yields_entries_recorded_after_it_started() {
    let kernel = Arc::new(recorded_sql_kernel());
    let e = emitter(
        &kernel,
        EmitterConfig {
            poll_interval: Duration::from_millis(5),
            ..EmitterConfig::default()
        },
    );
    let mut stream = std::pin::pin!(e.stream(CancellationToken::new()));
    let k = Arc::clone(&kernel);
    let writer = tokio::spawn(async move {
        tokio::task::yield_now().await;
        k.check(&sql("SELECT 'streamed'")).unwrap();
    });
    let first = stream.next().await.unwrap().unwrap();
    writer.await.unwrap();
    assert_eq!(first.span_id, "1");
    assert_eq!(first.attributes["agent_os.policy_result"], "allow");
}
