//! `agl bench server` end to end: the JSON report has one row per backend and client count,
//! every cycle completed, and every endpoint of the cycle was called as often as the cycle
//! says; `--rest-batch` and `--url` change what is sent and where; bad input is one line. The
//! PostgreSQL rows run under `scripts/ci/postgres.sh` (feature `postgres-tests`).
//! No timing assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Output;

use serde_json::Value;

mod common;
use common::{agl_command as agl, start_store};

fn bench(args: &[&str]) -> Output {
    agl()
        .args(["bench", "server"])
        .args(args)
        .output()
        .expect("run agl bench server")
}

fn json_report(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "agl bench server failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// `endpoint name → calls` of one row.
fn calls(row: &Value) -> Vec<(String, u64)> {
    row["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            for key in ["request", "mean_us", "p50_us", "p99_us"] {
                assert!(e.get(key).is_some(), "endpoint entry lacks `{key}`: {e}");
            }
            assert!(e["p50_us"].as_f64().unwrap() <= e["p99_us"].as_f64().unwrap());
            (
                e["endpoint"].as_str().unwrap().to_string(),
                e["calls"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

#[test]
fn both_backends_complete_every_cycle_and_report_each_endpoint() {
    let o = bench(&[
        "--rollouts",
        "200",
        "--clients",
        "2",
        "--backend",
        "both",
        "--json",
    ]);
    let report = json_report(&o);
    let command = report["command"].as_str().unwrap();
    assert!(command.starts_with("agl bench server"), "{command}");
    for part in [
        "--backend both",
        "--clients 2",
        "--rollouts 200",
        "--spans 10",
    ] {
        assert!(command.contains(part), "{command} lacks {part}");
    }
    assert_eq!(report["otlp_spans_per_rollout"], 5);
    assert_eq!(report["rest_spans_per_rollout"], 5);
    assert_eq!(report["rest_batch"], false);
    assert!(report["client_threads"].as_u64().unwrap() >= 1);
    assert_eq!(report["server_worker_threads"], 2);
    let rows = report["rows"].as_array().unwrap();
    let backends: Vec<&str> = rows
        .iter()
        .map(|r| r["backend"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["memory", "sqlite"]);
    let expected = owned(&[
        ("enqueue", 200),
        ("dequeue", 200),
        ("spans_next", 200),
        ("add_span", 1000),
        ("otlp_traces", 200),
        ("finish", 200),
        ("query_spans", 200),
    ]);
    for row in rows {
        assert_eq!(row["clients"], 2);
        assert_eq!(row["rollouts"], 200, "{row}");
        assert_eq!(row["spans_per_rollout"], 10);
        assert_eq!(row["requests"], 2200, "11 requests per cycle: {row}");
        assert_eq!(calls(row), expected, "{row}");
        for key in [
            "seconds",
            "rollouts_per_second",
            "spans_per_second",
            "requests_per_second",
        ] {
            assert!(row[key].as_f64().unwrap() > 0.0, "{key} in {row}");
        }
    }
}

#[test]
fn rest_batch_sends_one_batch_per_rollout_and_odd_spans_split() {
    let o = bench(&[
        "--backend",
        "memory",
        "--rollouts",
        "30",
        "--clients",
        "3,1",
        "--spans",
        "7",
        "--rest-batch",
        "--json",
    ]);
    let report = json_report(&o);
    assert!(report["command"].as_str().unwrap().contains("--rest-batch"));
    assert_eq!(report["otlp_spans_per_rollout"], 3);
    assert_eq!(report["rest_spans_per_rollout"], 4);
    let rows = report["rows"].as_array().unwrap();
    let clients: Vec<u64> = rows
        .iter()
        .map(|r| r["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [3, 1]);
    for row in rows {
        assert_eq!(row["rollouts"], 30);
        assert_eq!(
            calls(row),
            owned(&[
                ("enqueue", 30),
                ("dequeue", 30),
                ("spans_next", 30),
                ("add_spans_batch", 30),
                ("otlp_traces", 30),
                ("finish", 30),
                ("query_spans", 30),
            ])
        );
    }
}

#[test]
fn url_mode_drives_a_running_agl_store() {
    let (server, url) = start_store(&[]);
    let o = bench(&[
        "--url",
        &url,
        "--rollouts",
        "40",
        "--clients",
        "4",
        "--json",
    ]);
    drop(server);
    let report = json_report(&o);
    assert!(report["command"].as_str().unwrap().contains(&url));
    assert_eq!(report["server_worker_threads"], Value::Null);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["backend"], "url");
    assert_eq!(rows[0]["rollouts"], 40);
}

#[test]
fn unreachable_url_and_zero_clients_are_one_line_errors() {
    for (args, needle) in [
        (
            vec![
                "--url",
                "http://127.0.0.1:9",
                "--rollouts",
                "5",
                "--clients",
                "1",
                "--json",
            ],
            "127.0.0.1:9",
        ),
        (vec!["--clients", "0", "--rollouts", "5"], "--clients"),
    ] {
        let o = bench(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {err}");
        assert!(lines[0].contains(needle), "{err:?} should mention {needle}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// PostgreSQL behind one and two servers, against the cluster of `scripts/ci/postgres.sh`
/// (which runs it with `--features postgres-tests`; it fails without AGL_TEST_POSTGRES_URL).
#[cfg(feature = "postgres-tests")]
#[test]
fn postgres_rows_with_one_and_two_servers_complete_every_cycle() {
    let url = std::env::var("AGL_TEST_POSTGRES_URL")
        .expect("AGL_TEST_POSTGRES_URL is not set: run through scripts/ci/postgres.sh");
    let o = bench(&[
        "--backend",
        "postgres,postgres-2",
        "--postgres-url",
        &url,
        "--rollouts",
        "60",
        "--clients",
        "4",
        "--json",
    ]);
    let report = json_report(&o);
    let command = report["command"].as_str().unwrap();
    assert!(
        command.contains("--backend postgres,postgres-2 --postgres-url postgres://"),
        "{command}"
    );
    let rows = report["rows"].as_array().unwrap();
    let shape: Vec<(&str, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["backend"].as_str().unwrap(),
                r["label"].as_str().unwrap(),
                r["servers"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("postgres", "postgres", 1),
            ("postgres-2", "postgres ×2", 2)
        ]
    );
    for row in rows {
        assert_eq!(row["rollouts"], 60, "{row}");
        assert_eq!(row["requests"], 660, "{row}");
    }
}

#[test]
fn rows_without_their_settings_are_one_line_errors() {
    for (args, needle) in [
        (vec!["--backend", "memory,postgres"], "--postgres-url"),
        (
            vec!["--backend", "agentlightning"],
            "--agentlightning-python",
        ),
        (
            vec![
                "--backend",
                "agentlightning",
                "--agentlightning-python",
                "/nonexistent/python",
            ],
            "/nonexistent/python",
        ),
    ] {
        let o = agl()
            .args(["bench", "server", "--rollouts", "5", "--clients", "1"])
            .args(&args)
            .env_remove("AGL_BENCH_POSTGRES_URL")
            .env_remove("AGL_BENCH_AGENTLIGHTNING_PYTHON")
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {err}");
        assert!(lines[0].contains(needle), "{err:?} should mention {needle}");
    }
}
