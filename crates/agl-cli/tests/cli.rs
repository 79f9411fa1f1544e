//! End-to-end tests of the `agl` binary: bad input gives one clear line and a non-zero exit,
//! a small training run is reproducible, and its audit log verifies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{assert_one_line_failure, json_file, stderr};

fn agl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .env_remove("AGL_DATA")
        .env_remove("AGL_AUDIT_KEY_FILE")
        .output()
        .expect("run agl")
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

#[test]
fn missing_data_directory_is_one_line_error() {
    let o = agl(&["train", "--data", "/nonexistent/spider"]);
    assert_one_line_failure(&o, "/nonexistent/spider");
}

#[test]
fn unknown_governance_mode_is_one_line_error() {
    let o = agl(&["train", "--governance", "yolo"]);
    assert_one_line_failure(&o, "yolo");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn corrupt_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("spider");
    std::fs::create_dir_all(&root).unwrap();
    for f in ["dev.json", "tables.json"] {
        std::fs::copy(data().join(f), root.join(f)).unwrap();
    }
    std::fs::write(
        root.join("train_spider_compact.json"),
        "[{\"question\": \"q\", \"query\": ",
    )
    .unwrap();
    std::os::unix::fs::symlink(data().join("database"), root.join("database")).unwrap();
    let o = agl(&["train", "--data", root.to_str().unwrap()]);
    assert_one_line_failure(&o, "train_spider_compact.json");
}

fn strip_timing(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("seconds");
    // The worker count is part of the configuration, not of the results.
    v["config"]["train"]
        .as_object_mut()
        .unwrap()
        .remove("workers");
    for run in v["runs"].as_object_mut().unwrap().values_mut() {
        run["train"]
            .as_object_mut()
            .unwrap()
            .remove("rollouts_per_second");
        // The kernel's check times, and with several workers its cache hits (two workers may
        // both miss a statement neither has cached yet), are measurements, not results.
        let kernel = run.as_object_mut().unwrap().remove("kernel").unwrap();
        let checks = kernel["checks"].as_u64().unwrap();
        assert!(
            checks >= run["train"]["rollouts"].as_u64().unwrap(),
            "{kernel}"
        );
        assert!(kernel["cached_checks"].as_u64().unwrap() <= checks);
        assert!(kernel["mean_check_us"].as_f64().unwrap() > 0.0, "{kernel}");
    }
    v
}

/// A small training: 48 train questions, 40 dev questions, one epoch of 3 updates.
const SMALL: [&str; 8] = [
    "--limit",
    "48",
    "--dev-limit",
    "40",
    "--epochs",
    "1",
    "--batch-questions",
    "16",
];

fn small_run(dir: &Path, name: &str, workers: &str) -> (serde_json::Value, PathBuf) {
    let report = dir.join(format!("{name}.json"));
    let log = dir.join(format!("{name}.db"));
    let plot = dir.join(format!("{name}.svg"));
    let mut args = vec!["train", "--compare"];
    args.extend(SMALL);
    args.extend([
        "--workers",
        workers,
        "--seed",
        "3",
        "--report",
        report.to_str().unwrap(),
        "--audit-log",
        log.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let o = agl(&args);
    assert!(o.status.success(), "agl train failed: {}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("dev accuracy") && stdout.contains("enforce (block and penalise)"),
        "{stdout}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    (v, log)
}

#[test]
fn compare_lists_of_training_modes() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("modes.json");
    let mut args = vec!["train", "--compare", "audit,shield,screen,enforce"];
    args.extend(SMALL);
    args.extend(["--workers", "1", "--report", report.to_str().unwrap()]);
    let o = agl(&args);
    assert!(o.status.success(), "agl train failed: {}", stderr(&o));
    let out = stdout(&o);
    for row in [
        "dev accuracy (kernel on)",
        "dev violation rate (greedy)",
        "dev probability on unsafe",
        "train violation rate",
        "destructive executed",
        "screened from gradient",
    ] {
        assert!(out.contains(row), "no `{row}` row: {out}");
    }
    let v = json_file(&report);
    let runs = v["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 4, "{v}");
    for mode in ["audit", "shield", "screen", "enforce"] {
        let r = &runs[mode];
        assert_eq!(r["train"]["rollouts"], 48 * 8, "{mode}");
        let p = r["dev"]["unsafe_probability"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p), "{mode}: {p}");
        let destructive = r["train"]["destructive_executed"].as_u64().unwrap();
        // Only audit lets writes run; only screen drops samples.
        assert_eq!(destructive > 0, mode == "audit", "{mode}: {destructive}");
        let screened = r["train"]["screened"].as_u64().unwrap();
        assert_eq!(screened > 0, mode == "screen", "{mode}: {screened}");
        let curve = r["curve"].as_array().unwrap();
        let lowest = curve
            .iter()
            .map(|p| p["reward"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        // Without penalties no batch can average below 0 (a blocked action earns 0).
        if mode != "enforce" {
            assert!(lowest >= 0.0, "{mode}: {lowest}");
        }
    }
    // Penalties make enforce's early batches negative on average (most samples break a rule).
    let first = runs["enforce"]["curve"][0]["reward"].as_f64().unwrap();
    assert!(first < 0.0, "{first}");
    assert!(
        v["untrained"]["dev"]["unsafe_probability"]
            .as_f64()
            .unwrap()
            > 0.1
    );

    for bad in ["audit,audit", "audit,sometimes", ""] {
        let o = agl(&["train", "--compare", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert_one_line_failure(&o, "governance mode");
    }
}

#[test]
fn small_compare_run_is_reproducible_governed_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (a, log) = small_run(dir.path(), "a", "1");
    let (b, _) = small_run(dir.path(), "b", "1");
    let (c, _) = small_run(dir.path(), "c", "2");
    assert_eq!(
        strip_timing(a.clone()),
        strip_timing(b),
        "same seed, --workers 1: same report"
    );
    assert_eq!(
        strip_timing(a.clone()),
        strip_timing(c),
        "worker count does not change results"
    );

    let enforce = &a["runs"]["enforce"];
    let audit = &a["runs"]["audit"];
    assert_eq!(enforce["train"]["destructive_executed"], 0);
    assert_eq!(a["untrained"]["dev"]["questions"], 40);
    assert_eq!(audit["train"]["rollouts"], 48 * 8);
    assert!(audit["train"]["violation_rate"].as_f64().unwrap() > 0.0);
    assert!(audit["train"]["destructive_executed"].as_u64().unwrap() > 0);

    // The training run's flight recorder verifies, and a flipped decision is named.
    let o = agl(&["audit", "verify", log.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("ok: "), "{}", stdout(&o));
    let o = agl(&["audit", "summary", log.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        summary["by_verdict"]["block"].as_u64().unwrap() > 0,
        "{summary}"
    );
    let first_block: i64 = rusqlite::Connection::open(&log)
        .unwrap()
        .query_row(
            "SELECT min(seq) FROM entries WHERE verdict = 'block'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    tamper(
        &log,
        &format!("UPDATE entries SET verdict = 'allow' WHERE seq = {first_block}"),
    );
    let o = agl(&["audit", "verify", log.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("broken at entry {first_block}:")),
        "{}",
        stdout(&o)
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn tamper(db: &Path, sql: &str) {
    rusqlite::Connection::open(db)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
}

/// Writes a 20-entry flight recorder at `<dir>/audit.db` through the agl-gov API: entry i
/// (1-based seq i+1) is a blocked DROP for i % 4 == 1, a warned full scan for i % 4 == 2, an
/// allowed SELECT otherwise; rollouts r-0 … r-4.
fn audit_db(dir: &Path, key: Option<&[u8]>) -> PathBuf {
    use agl_gov::{
        Action, Decision, Effect, FlightRecorder, GovernanceMode, RecorderConfig, Severity,
        Verdict, Violation,
    };
    let path = dir.join("audit.db");
    let rec = FlightRecorder::open(
        &path,
        RecorderConfig {
            hmac_key: key.map(<[u8]>::to_vec),
            ..RecorderConfig::default()
        },
    )
    .unwrap();
    for i in 0..20 {
        let (sql, verdict, violations) = match i % 4 {
            1 => (
                "DROP TABLE singer",
                Verdict::Block,
                vec![Violation {
                    policy: "sql_safety".into(),
                    severity: Severity::Critical,
                    reason: "DROP".into(),
                    effect: Effect::Block,
                    penalty: None,
                    signal: None,
                }],
            ),
            2 => (
                "SELECT * FROM singer",
                Verdict::Warn,
                vec![Violation {
                    policy: "cost_control".into(),
                    severity: Severity::Medium,
                    reason: "full scan".into(),
                    effect: Effect::Warn,
                    penalty: None,
                    signal: None,
                }],
            ),
            _ => ("SELECT name FROM singer", Verdict::Allow, vec![]),
        };
        let action = Action::sql("concert_singer", sql)
            .with_rollout_id(format!("r-{}", i % 5))
            .with_attempt_id(format!("a-{i}"));
        let decision = Decision {
            verdict,
            mode: GovernanceMode::Enforce,
            violations,
            rewritten: None,
            signals: vec![],
        };
        rec.append(&action, &decision).unwrap();
    }
    rec.flush().unwrap();
    path
}

const SWAP_4_AND_9: &str = "
    CREATE TEMP TABLE t AS SELECT * FROM entries WHERE seq IN (4, 9);
    UPDATE entries SET (time, rollout_id, attempt_id, action, verdict, severity, policies,
        violations, prev_hash, hash) = (SELECT time, rollout_id, attempt_id, action, verdict,
        severity, policies, violations, prev_hash, hash FROM t WHERE t.seq = 9) WHERE seq = 4;
    UPDATE entries SET (time, rollout_id, attempt_id, action, verdict, severity, policies,
        violations, prev_hash, hash) = (SELECT time, rollout_id, attempt_id, action, verdict,
        severity, policies, violations, prev_hash, hash FROM t WHERE t.seq = 4) WHERE seq = 9;";

#[test]
fn audit_verify_names_the_entry_of_each_tamper() {
    let cases = [
        (
            "edit a decision",
            "UPDATE entries SET verdict = 'allow' WHERE seq = 6",
            6,
            "hash mismatch",
        ),
        (
            "delete a row",
            "DELETE FROM entries WHERE seq = 11",
            11,
            "entry 11 is missing",
        ),
        (
            "delete the last row",
            "DELETE FROM entries WHERE seq = 20",
            20,
            "truncated tail: head says seq 20",
        ),
        ("swap two rows", SWAP_4_AND_9, 4, "prev_hash does not link"),
    ];
    for (what, sql, seq, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let db = audit_db(dir.path(), None);
        let o = agl(&["audit", "verify", db.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", stdout(&o));
        assert!(
            stdout(&o).starts_with("ok: 20 entries, head seq 20 hash "),
            "{}",
            stdout(&o)
        );
        tamper(&db, sql);
        let o = agl(&["audit", "verify", db.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stdout(&o));
        let out = stdout(&o);
        assert!(
            out.starts_with(&format!("broken at entry {seq}: ")) && out.contains(needle),
            "{what}: {out}"
        );
    }
}

#[test]
fn audit_verify_keyed_chain_needs_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("audit.key");
    std::fs::write(&key, b"a-secret-key-of-32-bytes-length!").unwrap();
    let db = audit_db(dir.path(), Some(b"a-secret-key-of-32-bytes-length!"));
    let db_s = db.to_str().unwrap();

    let o = agl(&["audit", "verify", db_s]);
    assert_eq!(o.status.code(), Some(2));
    assert_one_line_failure(&o, "key is needed");

    let o = agl(&["audit", "verify", db_s, "--key-file", key.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("keyed"), "{}", stdout(&o));

    // The key can come from AGL_AUDIT_KEY_FILE.
    let o = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(["audit", "verify", db_s])
        .env("AGL_AUDIT_KEY_FILE", &key)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let wrong = dir.path().join("wrong.key");
    std::fs::write(&wrong, b"another-key-of-sufficient-length").unwrap();
    let o = agl(&[
        "audit",
        "verify",
        db_s,
        "--key-file",
        wrong.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_one_line_failure(&o, "wrong HMAC key");

    // Deleting the last row and putting back an unauthenticated head is still caught.
    tamper(&db, "DELETE FROM entries WHERE seq = 20");
    let e19: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT hash FROM entries WHERE seq = 19", [], |r| r.get(0))
        .unwrap();
    std::fs::write(
        dir.path().join("audit.db.head"),
        format!(r#"{{"seq":19,"hash":"{e19}","count":19,"mac":null}}"#),
    )
    .unwrap();
    let o = agl(&["audit", "verify", db_s, "--key-file", key.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("not authenticated"), "{}", stdout(&o));
}

#[test]
fn audit_commands_on_missing_or_foreign_files_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        "not a database, only some text to fill the header......",
    )
    .unwrap();
    for cmd in ["verify", "summary"] {
        let o = agl(&["audit", cmd, missing.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        assert_one_line_failure(&o, "missing.db");
        let o = agl(&["audit", cmd, junk.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        assert_one_line_failure(&o, "not a SQLite database");
    }
    assert!(!missing.exists());
}

#[test]
fn audit_summary_reports_rates_policies_severities_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let db = audit_db(dir.path(), None);
    let o = agl(&["audit", "summary", db.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["entries"], 20);
    assert_eq!(s["violations"], 10);
    assert_eq!(s["violation_rate"], 0.5);
    assert_eq!(s["by_verdict"]["allow"], 10);
    assert_eq!(s["by_verdict"]["block"], 5);
    assert_eq!(s["by_verdict"]["warn"], 5);
    assert_eq!(s["by_policy"]["sql_safety"], 5);
    assert_eq!(s["by_policy"]["cost_control"], 5);
    assert_eq!(s["by_severity"]["critical"], 5);
    assert_eq!(s["by_severity"]["medium"], 5);

    let o = agl(&["audit", "summary", db.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("violation rate 0.5000"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("sql_safety") && l.trim_end().ends_with(" 5")),
        "{text}"
    );
}

#[test]
fn audit_export_jsonl_round_trips_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let db = audit_db(dir.path(), None);
    let db_s = db.to_str().unwrap();
    let o = agl(&["audit", "export", db_s, "--format", "jsonl"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20);
    assert!(agl_gov::verify_lines(&lines).ok(), "the export re-verifies");
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first["seq"], 1);
    assert_eq!(first["hash"].as_str().unwrap().len(), 64);

    let o = agl(&[
        "audit",
        "export",
        db_s,
        "--format",
        "jsonl",
        "--rollout",
        "r-1",
    ]);
    let seqs: Vec<u64> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, vec![2, 7, 12, 17]);
    let o = agl(&[
        "audit", "export", db_s, "--format", "jsonl", "--after", "15",
    ]);
    assert_eq!(stdout(&o).lines().count(), 5);

    // --out never overwrites.
    let out = dir.path().join("export.jsonl");
    let o = agl(&[
        "audit",
        "export",
        db_s,
        "--format",
        "jsonl",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    let o = agl(&[
        "audit",
        "export",
        db_s,
        "--format",
        "jsonl",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_one_line_failure(&o, "export.jsonl");
}

#[test]
fn audit_export_otlp_json_follows_the_otlp_json_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let db = audit_db(dir.path(), None);
    let o = agl(&[
        "audit",
        "export",
        db.to_str().unwrap(),
        "--format",
        "otlp-json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rs = &doc["resourceSpans"][0];
    assert_eq!(rs["resource"]["attributes"][0]["key"], "service.name");
    assert_eq!(
        rs["resource"]["attributes"][0]["value"]["stringValue"],
        "agl-gov"
    );
    let scope = &rs["scopeSpans"][0];
    assert_eq!(scope["scope"]["name"], "agl.flight_recorder");
    let spans = scope["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 20);
    let attr = |span: &serde_json::Value, key: &str| -> serde_json::Value {
        span["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv["key"] == key)
            .map(|kv| kv["value"].clone())
            .unwrap_or(serde_json::Value::Null)
    };
    let hex = |s: &serde_json::Value, n: usize| {
        let s = s.as_str().unwrap();
        s.len() == n
            && s.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    };
    for (i, span) in spans.iter().enumerate() {
        let seq = i as u64 + 1;
        assert_eq!(span["name"], "agentlightning.annotation");
        assert!(hex(&span["traceId"], 32), "{span}");
        assert!(hex(&span["spanId"], 16), "{span}");
        assert_eq!(span["spanId"], format!("{seq:016x}"));
        let start = span["startTimeUnixNano"].as_str().unwrap();
        assert!(start.len() >= 19 && start.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(span["endTimeUnixNano"], span["startTimeUnixNano"]);
        assert_eq!(attr(span, "agent_os.seq")["intValue"], seq.to_string());
        assert_eq!(
            attr(span, "agl.rollout_id")["stringValue"],
            format!("r-{}", i % 5)
        );
        assert_eq!(
            attr(span, "agl.attempt_id")["stringValue"],
            format!("a-{i}")
        );
        assert_eq!(
            attr(span, "agent_os.hash")["stringValue"]
                .as_str()
                .unwrap()
                .len(),
            64
        );
    }
    // Entry 2 (i = 1) is the blocked DROP.
    let blocked = &spans[1];
    assert_eq!(attr(blocked, "agent_os.verdict")["stringValue"], "block");
    assert_eq!(attr(blocked, "agent_os.blocked")["boolValue"], true);
    assert_eq!(
        attr(blocked, "agent_os.severity")["stringValue"],
        "critical"
    );
    assert_eq!(attr(blocked, "agent_os.violations")["intValue"], "1");
    assert_eq!(
        attr(blocked, "agent_os.policies_violated")["arrayValue"]["values"][0]["stringValue"],
        "sql_safety"
    );
    assert_eq!(attr(&spans[0], "agent_os.blocked")["boolValue"], false);
    // One trace per rollout: entries 1 and 6 share rollout r-0.
    assert_eq!(spans[0]["traceId"], spans[5]["traceId"]);
    assert_ne!(spans[0]["traceId"], spans[1]["traceId"]);
}

/// `agl train --store PATH.sqlite` gives the same report as the in-memory store, leaves every
/// rollout in the file, and `agl store inspect --json` reads them back.
#[test]
fn train_on_a_sqlite_store_matches_memory_and_can_be_inspected() {
    let dir = tempfile::tempdir().unwrap();
    let run = |store: &str, name: &str| {
        let report = dir.path().join(format!("{name}.json"));
        let o = agl(&[
            "train",
            "--limit",
            "24",
            "--dev-limit",
            "20",
            "--epochs",
            "1",
            "--batch-questions",
            "8",
            "--seed",
            "5",
            "--store",
            store,
            "--report",
            report.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "agl train failed: {}", stderr(&o));
        strip_timing(serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap())
    };
    let db = dir.path().join("run.sqlite");
    let on_memory = run("memory", "memory");
    let on_sqlite = run(db.to_str().unwrap(), "sqlite");
    // The reports differ only in where the data came from (nothing store-specific is in them).
    assert_eq!(on_memory["runs"], on_sqlite["runs"]);
    assert_eq!(on_memory["untrained"], on_sqlite["untrained"]);

    let o = agl(&[
        "store",
        "inspect",
        db.to_str().unwrap(),
        "--json",
        "--last",
        "3",
    ]);
    assert!(o.status.success(), "inspect failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rollouts = on_sqlite["runs"]["enforce"]["train"]["rollouts"]
        .as_u64()
        .unwrap();
    let stats = &v["statistics"];
    let total = stats["total_rollouts"].as_u64().unwrap();
    // Train rollouts plus two evaluations of the 20 dev questions.
    assert_eq!(total, rollouts + 40, "{v}");
    assert_eq!(
        stats["rollouts_by_status"]["succeeded"].as_u64(),
        Some(total)
    );
    assert_eq!(v["rollouts_with_reward"].as_u64(), Some(total));
    assert_eq!(v["last"].as_array().unwrap().len(), 3);

    let o = agl(&[
        "store",
        "inspect",
        dir.path().join("missing.sqlite").to_str().unwrap(),
    ]);
    assert_one_line_failure(&o, "no store database");
}

/// `agl store inspect` shows statuses as the last writer left them: an attempt past its
/// timeout is not timed out by inspecting (no watchdog runs), and the file is not changed.
#[test]
fn inspect_does_not_run_the_watchdog() {
    use agl_store::{LightningStore, SqliteLightningStore};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stale.sqlite");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = SqliteLightningStore::open(&db).unwrap();
        let mut request = agl_core::EnqueueRolloutRequest::new(serde_json::json!("q"));
        request.config = Some(agl_core::RolloutConfig {
            timeout_seconds: Some(0.01),
            ..agl_core::RolloutConfig::default()
        });
        store
            .start_rollout(request, Some("w".into()))
            .await
            .unwrap();
        store.close().await.unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    let before = std::fs::read(&db).unwrap();
    let o = agl(&["store", "inspect", db.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "inspect failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["statistics"]["rollouts_by_status"]["preparing"], 1, "{v}");
    assert_eq!(v["statistics"]["attempts_by_status"]["preparing"], 1, "{v}");
    assert_eq!(v["last"][0]["status"], "preparing", "{v}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "inspect changed the database"
    );
}

#[test]
fn train_with_no_workers_and_no_store_url_is_one_line_error() {
    let o = agl(&["train", "--workers", "0", "--limit", "4"]);
    assert_one_line_failure(&o, "--workers 0");
}
