#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Flight recorder (SQLite): round trip, restart, every tamper the module docs claim to detect
//! reported at the right seq (and what an unkeyed chain cannot detect), keys, batching from
//! several threads, queries with cursors, summary, and clear errors for files that are not
//! recorder databases.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agl_gov::{
    Action, Decision, Effect, FlightRecorder, GENESIS_HASH, GovError, GovernanceMode, Head,
    HeadSource, Kernel, Query, RecorderConfig, RecorderReader, Severity, Signal, SqlPolicy,
    Verdict, VerifyOptions, VerifyReport, Violation, hmac_key_from_file, query_db, summary_db,
    verify, verify_lines,
};
use rusqlite::Connection;
use sha2::{Digest, Sha256};

const KEY: &[u8] = b"0123456789abcdef-test-key";

fn violation(policy: &str, severity: Severity, effect: Effect) -> Violation {
    Violation {
        policy: policy.to_string(),
        severity,
        reason: format!("{policy} says no"),
        effect,
        penalty: None,
        signal: None,
    }
}

/// Entry `i` (0-based) of the standard test log: a deterministic mix of verdicts, policies,
/// severities and rollouts.
fn sample(i: usize) -> (Action, Decision) {
    let rollout = format!("r-{}", i % 4);
    let (sql, verdict, violations) = match i % 5 {
        0 => ("SELECT name FROM singer", Verdict::Allow, vec![]),
        1 => (
            "DROP TABLE singer",
            Verdict::Block,
            vec![violation("sql_safety", Severity::Critical, Effect::Block)],
        ),
        2 => (
            "SELECT * FROM singer",
            Verdict::Warn,
            vec![violation("cost_control", Severity::Medium, Effect::Warn)],
        ),
        3 => (
            "DELETE FROM singer",
            Verdict::Block,
            vec![
                violation("sql_safety", Severity::Critical, Effect::Block),
                violation("cost_control", Severity::High, Effect::Block),
                violation("sql_safety", Severity::High, Effect::Block),
            ],
        ),
        _ => (
            "SELECT 'it''s \"quoted\" é' FROM singer",
            Verdict::Allow,
            vec![],
        ),
    };
    let action = Action::sql("concert_singer", sql)
        .with_rollout_id(rollout)
        .with_attempt_id(format!("a-{i}"))
        .with_agent_id("agent-1")
        .with_step(i as u64);
    let signals = if verdict == Verdict::Block {
        vec![Signal::Sigstop]
    } else {
        vec![]
    };
    (
        action,
        Decision {
            verdict,
            mode: GovernanceMode::Enforce,
            violations,
            rewritten: None,
            signals,
        },
    )
}

/// Writes `n` sample entries to `<dir>/nested/audit.db` and closes the recorder.
fn write_db(dir: &Path, n: usize, key: Option<&[u8]>) -> PathBuf {
    let path = dir.join("nested").join("audit.db");
    let rec = FlightRecorder::open(&path, config(key)).unwrap();
    for i in 0..n {
        let (a, d) = sample(i);
        assert_eq!(rec.append(&a, &d).unwrap(), i as u64 + 1);
    }
    rec.flush().unwrap();
    path
}

fn config(key: Option<&[u8]>) -> RecorderConfig {
    RecorderConfig {
        hmac_key: key.map(<[u8]>::to_vec),
        ..RecorderConfig::default()
    }
}

fn opts(key: Option<&[u8]>) -> VerifyOptions {
    VerifyOptions {
        hmac_key: key.map(<[u8]>::to_vec),
        head: HeadSource::Sidecar,
    }
}

fn sql(path: &Path, statements: &str) {
    Connection::open(path)
        .unwrap()
        .execute_batch(statements)
        .unwrap();
}

fn broken_at(r: &VerifyReport) -> (u64, String) {
    let b = r
        .first_broken
        .clone()
        .unwrap_or_else(|| panic!("tamper not detected: {r:?}"));
    (b.seq, b.reason)
}

const COLS: &str = "time, agent_id, rollout_id, attempt_id, step, action_type, action, verdict, \
                    mode, severity, policies, violations, rewritten, signals, prev_hash, hash";

#[test]
fn round_trip_through_the_kernel_verifies_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k").join("audit.db");
    let k = Kernel::new(GovernanceMode::Enforce)
        .with_policy(SqlPolicy::default())
        .with_recorder(FlightRecorder::create(&path).unwrap());
    let sqls = ["SELECT name FROM singer", "DROP TABLE singer", "garbage in"];
    for (i, s) in sqls.iter().cycle().take(12).enumerate() {
        k.check(&Action::sql("concert_singer", *s).with_rollout_id(format!("r-{i}")))
            .unwrap();
    }
    let rec = k.recorder().unwrap();
    rec.flush().unwrap();
    let report = verify(&path, &opts(None)).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.entries, 12);
    let head = Head::read(&Head::sidecar_path(&path)).unwrap();
    assert_eq!(head.seq, 12);
    assert_eq!(head.count, 12);
    assert_eq!(head.mac, None);
    assert_eq!(Some(head.clone()), report.head);
    assert_eq!(head.hash, rec.head_hash());

    let page = query_db(&path, &Query::default()).unwrap();
    assert_eq!(page.entries.len(), 12);
    let drop = &page.entries[1];
    assert_eq!(drop.verdict, Verdict::Block);
    assert_eq!(drop.rollout_id.as_deref(), Some("r-1"));
    assert_eq!(drop.action_type, "sql");
    assert!(drop.policies.contains(&"sql_safety".to_string()));
    assert_eq!(page.entries[0].verdict, Verdict::Allow);
}

#[test]
fn hash_follows_the_documented_formula_and_jsonl_lines_verify() {
    let rec = FlightRecorder::in_memory();
    for i in 0..5 {
        let (a, d) = sample(i);
        rec.append(&a, &d).unwrap();
    }
    let entries = rec.query(&Query::default()).unwrap().entries;
    let mut prev = GENESIS_HASH.to_string();
    for e in &entries {
        assert_eq!(e.prev_hash, prev);
        let mut h = Sha256::new();
        h.update(prev.as_bytes());
        h.update(e.canonical_json().unwrap().as_bytes());
        assert_eq!(hex::encode(h.finalize()), e.hash, "entry {}", e.seq);
        prev = e.hash.clone();
    }
    let canonical = entries[0].canonical_json().unwrap();
    assert!(
        canonical.starts_with("{\"action\":{\"context\":"),
        "{canonical}"
    );
    assert!(!canonical.contains("\"hash\""));

    let lines = rec.lines();
    assert_eq!(lines.len(), 5);
    assert!(verify_lines(&lines).ok());
    let mut edited = lines.clone();
    edited[2] = edited[2].replace("\"verdict\":\"warn\"", "\"verdict\":\"allow\"");
    assert_ne!(edited, lines);
    assert_eq!(broken_at(&verify_lines(&edited)).0, 3);
    let mut swapped = lines;
    swapped.swap(1, 3);
    assert_eq!(broken_at(&verify_lines(&swapped)).0, 2);
}

#[test]
fn restart_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 5, None);
    let head5 = verify(&path, &opts(None)).unwrap().head.unwrap();
    {
        let rec = FlightRecorder::create(&path).unwrap();
        assert_eq!(rec.entries(), 5);
        assert_eq!(rec.head_hash(), head5.hash);
        for i in 5..8 {
            let (a, d) = sample(i);
            assert_eq!(rec.append(&a, &d).unwrap(), i as u64 + 1);
        }
        // Dropping flushes.
    }
    let report = verify(&path, &opts(None)).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.entries, 8);
    let e6 = query_db(
        &path,
        &Query {
            after_seq: Some(5),
            limit: 1,
            ..Query::default()
        },
    )
    .unwrap();
    assert_eq!(e6.entries[0].seq, 6);
    assert_eq!(e6.entries[0].prev_hash, head5.hash);
    // The earlier head, kept elsewhere, still anchors a prefix: ok, 3 entries beyond it.
    let r = verify(
        &path,
        &VerifyOptions {
            hmac_key: None,
            head: HeadSource::Explicit(head5),
        },
    )
    .unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.beyond_head, 3);
}

/// Builds a 20-entry database (keyed or not), applies `tamper`, returns the report.
fn tampered(key: Option<&[u8]>, tamper: &str) -> VerifyReport {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 20, key);
    assert!(verify(&path, &opts(key)).unwrap().ok());
    sql(&path, tamper);
    verify(&path, &opts(key)).unwrap()
}

#[test]
fn each_tamper_is_detected_at_the_right_entry() {
    let swap = format!(
        "CREATE TEMP TABLE t AS SELECT seq, {COLS} FROM entries WHERE seq IN (4, 9);
         UPDATE entries SET ({COLS}) = (SELECT {COLS} FROM t WHERE t.seq = 9) WHERE seq = 4;
         UPDATE entries SET ({COLS}) = (SELECT {COLS} FROM t WHERE t.seq = 4) WHERE seq = 9;"
    );
    let cases: Vec<(&str, String, u64, &str)> = vec![
        (
            "edit a decision's verdict",
            "UPDATE entries SET verdict = 'allow' WHERE seq = 7".into(),
            7,
            "hash mismatch",
        ),
        (
            "edit the action JSON",
            "UPDATE entries SET action = replace(action, 'DROP TABLE', 'SELECT * FROM') WHERE seq = 2"
                .into(),
            2,
            "hash mismatch",
        ),
        (
            "re-format a JSON column without changing its meaning",
            "UPDATE entries SET violations = replace(violations, ',', ', ') WHERE seq = 4".into(),
            4,
            "canonical",
        ),
        (
            "edit a denormalised column",
            "UPDATE entries SET rollout_id = 'r-x' WHERE seq = 11".into(),
            11,
            "hash mismatch",
        ),
        (
            "edit the time",
            "UPDATE entries SET time = time + 1 WHERE seq = 15".into(),
            15,
            "hash mismatch",
        ),
        (
            "store a wrong type (a BLOB spelling `allow`)",
            "UPDATE entries SET verdict = x'616c6c6f77' WHERE seq = 12".into(),
            12,
            "column `verdict`",
        ),
        (
            "delete a middle row",
            "DELETE FROM entries WHERE seq = 10".into(),
            10,
            "entry 10 is missing",
        ),
        (
            "delete the last row",
            "DELETE FROM entries WHERE seq = 20".into(),
            20,
            "truncated tail: head says seq 20",
        ),
        (
            "delete the last three rows",
            "DELETE FROM entries WHERE seq > 17".into(),
            18,
            "database ends at seq 17",
        ),
        (
            "insert a forged row in the middle (renumbering the rest)",
            "UPDATE entries SET seq = seq + 1000 WHERE seq > 5;
             UPDATE entries SET seq = seq - 999 WHERE seq > 1000;
             INSERT INTO entries (seq, time, agent_id, rollout_id, attempt_id, step, action_type,
               action, verdict, mode, severity, policies, violations, rewritten, signals,
               prev_hash, hash)
             SELECT 6, time, agent_id, rollout_id, attempt_id, step, action_type, action,
               verdict, mode, severity, policies, violations, rewritten, signals, hash,
               'ffff' FROM entries WHERE seq = 5;"
                .into(),
            6,
            "hash mismatch",
        ),
        ("swap two rows' contents", swap, 4, "prev_hash does not link"),
    ];
    for key in [None, Some(KEY)] {
        for (what, tamper, seq, needle) in &cases {
            let (at, reason) = broken_at(&tampered(key, tamper));
            assert_eq!(at, *seq, "{what} (keyed: {}): {reason}", key.is_some());
            assert!(
                reason.contains(needle),
                "{what}: {reason:?} lacks {needle:?}"
            );
        }
    }
}

#[test]
fn forged_appended_row_is_detected_when_keyed() {
    // The attacker appends a row after 20 whose hash is computed with plain SHA-256.
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 20, Some(KEY));
    let last = query_db(
        &path,
        &Query {
            after_seq: Some(19),
            ..Query::default()
        },
    )
    .unwrap()
    .entries
    .remove(0);
    let mut forged = last.clone();
    forged.seq = 21;
    forged.prev_hash = last.hash.clone();
    let mut h = Sha256::new();
    h.update(forged.prev_hash.as_bytes());
    h.update(forged.canonical_json().unwrap().as_bytes());
    forged.hash = hex::encode(h.finalize());
    let c = Connection::open(&path).unwrap();
    c.execute(
        &format!("INSERT INTO entries (seq, {COLS}) SELECT 21, time, agent_id, rollout_id, attempt_id, step, action_type, action, verdict, mode, severity, policies, violations, rewritten, signals, ?1, ?2 FROM entries WHERE seq = 20"),
        [&forged.prev_hash, &forged.hash],
    )
    .unwrap();
    drop(c);
    let (at, reason) = broken_at(&verify(&path, &opts(Some(KEY))).unwrap());
    assert_eq!(at, 21, "{reason}");
    assert!(reason.contains("hash mismatch"), "{reason}");
}

#[test]
fn deleting_the_tail_and_rewriting_the_sidecar_is_caught_by_the_key() {
    for key in [None, Some(KEY)] {
        let dir = tempfile::tempdir().unwrap();
        let path = write_db(dir.path(), 20, key);
        let final_head = verify(&path, &opts(key)).unwrap().head.unwrap();
        sql(&path, "DELETE FROM entries WHERE seq = 20");
        // The attacker, without the key, writes a head for entry 19 (MAC unknown).
        let e19 = query_db(
            &path,
            &Query {
                after_seq: Some(18),
                ..Query::default()
            },
        )
        .unwrap()
        .entries
        .remove(0);
        let forged = Head {
            seq: 19,
            hash: e19.hash,
            count: 19,
            mac: None,
        };
        forged.write_atomic(&Head::sidecar_path(&path)).unwrap();
        let r = verify(&path, &opts(key)).unwrap();
        match key {
            Some(_) => {
                let (at, reason) = broken_at(&r);
                assert_eq!(at, 19);
                assert!(reason.contains("not authenticated"), "{reason}");
            }
            // Documented limitation: without a key the rewritten sidecar is believed...
            None => assert!(r.ok(), "{r:?}"),
        }
        // ...but a head kept elsewhere still exposes the truncation.
        let r = verify(
            &path,
            &VerifyOptions {
                hmac_key: key.map(<[u8]>::to_vec),
                head: HeadSource::Explicit(final_head),
            },
        )
        .unwrap();
        let (at, reason) = broken_at(&r);
        assert_eq!(at, 20);
        assert!(reason.contains("truncated tail"), "{reason}");
    }
}

/// Recomputes the unkeyed chain from entry `from` on, as an informed attacker would.
fn recompute_unkeyed(path: &Path, from: u64) -> Head {
    let entries = query_db(path, &Query::default()).unwrap().entries;
    let c = Connection::open(path).unwrap();
    let mut prev = entries[(from - 2) as usize].hash.clone();
    for mut e in entries.into_iter().skip((from - 1) as usize) {
        e.prev_hash = prev.clone();
        let mut h = Sha256::new();
        h.update(prev.as_bytes());
        h.update(e.canonical_json().unwrap().as_bytes());
        e.hash = hex::encode(h.finalize());
        c.execute(
            "UPDATE entries SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![e.prev_hash, e.hash, e.seq as i64],
        )
        .unwrap();
        prev = e.hash;
    }
    let head = Head {
        seq: 20,
        hash: prev,
        count: 20,
        mac: None,
    };
    head.write_atomic(&Head::sidecar_path(path)).unwrap();
    head
}

#[test]
fn recomputed_unkeyed_chain_is_only_caught_by_an_external_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 20, None);
    let kept = verify(&path, &opts(None)).unwrap().head.unwrap();
    sql(&path, "UPDATE entries SET verdict = 'allow' WHERE seq = 7");
    recompute_unkeyed(&path, 7);
    // What an unkeyed chain cannot detect: a full recomputation plus a rewritten sidecar.
    let r = verify(&path, &opts(None)).unwrap();
    assert!(r.ok(), "{r:?}");
    // The head stored elsewhere before the edit exposes it.
    let r = verify(
        &path,
        &VerifyOptions {
            hmac_key: None,
            head: HeadSource::Explicit(kept),
        },
    )
    .unwrap();
    let (at, reason) = broken_at(&r);
    assert_eq!(at, 20);
    assert!(reason.contains("chain was rewritten"), "{reason}");
}

#[test]
fn recomputing_a_keyed_chain_without_the_key_fails_at_the_edit() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 20, Some(KEY));
    sql(&path, "UPDATE entries SET verdict = 'allow' WHERE seq = 7");
    recompute_unkeyed(&path, 7);
    let (at, reason) = broken_at(&verify(&path, &opts(Some(KEY))).unwrap());
    assert_eq!(at, 7);
    assert!(reason.contains("hash mismatch"), "{reason}");
}

#[test]
fn keyed_chain_needs_the_right_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 6, Some(KEY));
    let r = verify(&path, &opts(Some(KEY))).unwrap();
    assert!(r.ok() && r.keyed, "{r:?}");
    assert!(r.head.unwrap().mac.is_some());

    let err = verify(&path, &opts(None)).unwrap_err().to_string();
    assert!(err.contains("key is needed"), "{err}");
    assert!(err.contains("audit.db"), "{err}");
    let err = verify(&path, &opts(Some(b"another key of 16+ bytes"))).unwrap_err();
    assert!(err.to_string().contains("wrong HMAC key"), "{err}");
    // Appending needs the key too.
    assert!(FlightRecorder::create(&path).is_err());
    let rec = FlightRecorder::open(&path, config(Some(KEY))).unwrap();
    assert_eq!(rec.entries(), 6);
    drop(rec);

    // A key given for an unkeyed chain is refused (it could be a downgraded keyed chain).
    let dir2 = tempfile::tempdir().unwrap();
    let plain = write_db(dir2.path(), 2, None);
    let err = verify(&plain, &opts(Some(KEY))).unwrap_err().to_string();
    assert!(err.contains("not keyed"), "{err}");
}

#[test]
fn missing_sidecar_is_reported_unless_no_head_is_requested() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 4, None);
    std::fs::remove_file(Head::sidecar_path(&path)).unwrap();
    let (at, reason) = broken_at(&verify(&path, &opts(None)).unwrap());
    assert_eq!(at, 4);
    assert!(reason.contains("head file"), "{reason}");
    let r = verify(
        &path,
        &VerifyOptions {
            hmac_key: None,
            head: HeadSource::None,
        },
    )
    .unwrap();
    assert!(r.ok());
    assert_eq!(r.entries, 4);
}

#[test]
fn reopening_a_broken_chain_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 5, None);
    sql(&path, "DELETE FROM entries WHERE seq = 3");
    let err = FlightRecorder::create(&path).unwrap_err().to_string();
    assert!(err.contains("refusing to append"), "{err}");
    assert!(err.contains("entry 3"), "{err}");
}

#[test]
fn ten_thousand_appends_from_four_threads_are_gapless_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.db");
    let rec = Arc::new(
        FlightRecorder::open(
            &path,
            RecorderConfig {
                batch_size: 256,
                ..config(Some(KEY))
            },
        )
        .unwrap(),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let rec = Arc::clone(&rec);
            std::thread::spawn(move || {
                for i in 0..2500 {
                    let (a, d) = sample(t * 2500 + i);
                    rec.append(&a, &d).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    rec.flush().unwrap();
    let n: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 10_000);
    let r = verify(&path, &opts(Some(KEY))).unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.entries, 10_000);
    assert_eq!(rec.head().unwrap().unwrap().seq, 10_000);
}

#[test]
fn queries_filter_and_page_with_a_cursor() {
    let rec = FlightRecorder::in_memory();
    for i in 0..40 {
        let (a, d) = sample(i);
        rec.append(&a, &d).unwrap();
    }
    let all = rec.query(&Query::default()).unwrap();
    assert_eq!(all.entries.len(), 40);
    assert!(!all.more);
    assert_eq!(all.next_cursor, Some(40));

    let count = |q: Query| rec.query(&q).unwrap().entries;
    let r1 = count(Query {
        rollout_id: Some("r-1".into()),
        ..Query::default()
    });
    assert_eq!(r1.len(), 10);
    assert!(r1.iter().all(|e| e.rollout_id.as_deref() == Some("r-1")));
    // sample i%5 == 1 or 3 violate sql_safety; i%5 in {2,3} violate cost_control.
    let sql = count(Query {
        policy: Some("sql_safety".into()),
        ..Query::default()
    });
    assert_eq!(sql.len(), 16);
    assert!(
        sql.iter()
            .all(|e| e.policies.contains(&"sql_safety".into()))
    );
    let cost = count(Query {
        policy: Some("cost_control".into()),
        ..Query::default()
    });
    assert_eq!(cost.len(), 16);
    let blocked = count(Query {
        verdict: Some(Verdict::Block),
        ..Query::default()
    });
    assert_eq!(blocked.len(), 16);
    let medium = count(Query {
        severity: Some(Severity::Medium),
        ..Query::default()
    });
    assert_eq!(medium.len(), 8);
    let both = count(Query {
        policy: Some("cost_control".into()),
        verdict: Some(Verdict::Block),
        rollout_id: Some("r-3".into()),
        ..Query::default()
    });
    assert!(
        both.iter()
            .all(|e| e.seq % 5 == 4 && e.rollout_id.as_deref() == Some("r-3"))
    );
    assert_eq!(both.len(), 2);

    // Time range [since, until): split at entry 21's time.
    let t = all.entries[20].time;
    let before = count(Query {
        until: Some(t),
        ..Query::default()
    });
    let after = count(Query {
        since: Some(t),
        ..Query::default()
    });
    assert_eq!(before.len() + after.len(), 40);
    assert!(after.iter().all(|e| e.time >= t) && before.iter().all(|e| e.time < t));

    // Paging with the cursor returns every entry once, in order.
    let mut seen = Vec::new();
    let mut q = Query {
        limit: 7,
        ..Query::default()
    };
    loop {
        let page = rec.query(&q).unwrap();
        assert!(page.entries.len() <= 7);
        seen.extend(page.entries.iter().map(|e| e.seq));
        if !page.more {
            break;
        }
        q.after_seq = page.next_cursor;
    }
    assert_eq!(seen, (1..=40).collect::<Vec<u64>>());

    // Incremental reader: poll with the last cursor, see only new entries.
    q.after_seq = Some(40);
    assert!(rec.query(&q).unwrap().entries.is_empty());
    let (a, d) = sample(40);
    rec.append(&a, &d).unwrap();
    let page = rec.query(&q).unwrap();
    assert_eq!(
        page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![41]
    );
}

#[test]
fn summary_counts_violations_per_policy_severity_and_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_db(dir.path(), 10, None);
    let s = summary_db(&path).unwrap();
    assert_eq!(s.entries, 10);
    assert_eq!(s.violations, 6);
    assert!((s.violation_rate - 0.6).abs() < 1e-12);
    assert_eq!(s.by_verdict["allow"], 4);
    assert_eq!(s.by_verdict["block"], 4);
    assert_eq!(s.by_verdict["warn"], 2);
    // Per violation (finding): i%5==1 → 1 sql_safety; i%5==3 → 2 sql_safety + 1 cost_control;
    // i%5==2 → 1 cost_control. Two of each in 10 entries.
    assert_eq!(s.by_policy["sql_safety"], 6);
    assert_eq!(s.by_policy["cost_control"], 4);
    assert_eq!(s.by_severity["critical"], 4);
    assert_eq!(s.by_severity["high"], 4);
    assert_eq!(s.by_severity["medium"], 2);
    assert!(!s.by_severity.contains_key("low"));
    let reader = RecorderReader::open(&path).unwrap();
    assert_eq!(reader.summary().unwrap(), s);
    assert!(!reader.keyed().unwrap());
}

#[test]
fn files_that_are_not_recorder_databases_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        b"this is not sqlite, just text that is long enough to matter....",
    )
    .unwrap();
    for err in [
        verify(&junk, &opts(None)).unwrap_err(),
        FlightRecorder::create(&junk).unwrap_err(),
        RecorderReader::open(&junk).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(
            msg.contains("junk.db") && msg.contains("not a SQLite database"),
            "{msg}"
        );
    }

    let other = dir.path().join("other.db");
    sql(&other, "CREATE TABLE users (id INTEGER)");
    for err in [
        verify(&other, &opts(None)).unwrap_err(),
        FlightRecorder::create(&other).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(
            msg.contains("other.db") && msg.contains("table `entries` is missing"),
            "{msg}"
        );
    }

    let missing = dir.path().join("missing.db");
    let err = verify(&missing, &opts(None)).unwrap_err();
    assert!(matches!(err, GovError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing.db"));
    assert!(!missing.exists(), "verify must not create a database");
}

#[test]
fn key_files_shorter_than_16_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.key");
    std::fs::write(&short, b"too short").unwrap();
    let err = hmac_key_from_file(&short).unwrap_err().to_string();
    assert!(err.contains("short.key") && err.contains("16"), "{err}");
    let good = dir.path().join("good.key");
    std::fs::write(&good, KEY).unwrap();
    assert_eq!(hmac_key_from_file(&good).unwrap(), KEY);
    assert!(hmac_key_from_file(&dir.path().join("none.key")).is_err());
}
