#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Durability of the SQLite backend under `SIGKILL`, ten rounds in a row on one database file.
//!
//! Each round the test re-runs its own binary as a child process (`child_writer`, selected
//! with `--exact`), which opens the store and works through rollouts — enqueue, dequeue, add
//! spans, finish some attempts, fail-and-retry others, leave others running — printing one
//! `ACK …` line (flushed) after every operation that returned. The parent kills the child with
//! `SIGKILL` after a varying number of acknowledgements, reopens the file and checks:
//! `PRAGMA integrity_check` is `ok`; every acknowledged enqueue, dequeue, span and status is
//! there; once the watchdog deadlines pass, `run_watchdog` leaves no attempt of the round
//! unfinished (`timeout` or `unresponsive` as configured) and rollouts `requeuing` (attempts
//! left) or `failed`; requeued rollouts are dequeued again with their attempt history.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agl_core::{
    Attempt, AttemptStatus, Attributes, EnqueueRolloutRequest, Rollout, RolloutConfig,
    RolloutStatus, Span, now_seconds,
};
use agl_store::lifecycle;
use agl_store::{AttemptUpdate, LightningStore, RolloutQuery, SqliteLightningStore, SqliteOptions};
use serde_json::json;

const DB_ENV: &str = "AGL_SQLITE_CRASH_DB";
const ROUND_ENV: &str = "AGL_SQLITE_CRASH_ROUND";
const ROUNDS: usize = 10;
const MAX_ATTEMPTS: u32 = 2;

/// Rollout `i` of a round: even groups of four time out, odd groups become unresponsive.
fn config(i: usize) -> RolloutConfig {
    let timeout = (i / 4).is_multiple_of(2);
    RolloutConfig {
        timeout_seconds: timeout.then_some(0.5),
        unresponsive_seconds: (!timeout).then_some(0.3),
        max_attempts: MAX_ATTEMPTS,
        retry_condition: vec![
            AttemptStatus::Failed,
            AttemptStatus::Timeout,
            AttemptStatus::Unresponsive,
        ],
    }
}

fn status(s: AttemptStatus) -> AttemptUpdate {
    AttemptUpdate {
        status: Some(s),
        ..AttemptUpdate::default()
    }
}

fn ack(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ACK {line}").unwrap();
    out.flush().unwrap();
}

async fn spans(store: &SqliteLightningStore, rid: &str, aid: &str, first_seq: i64) {
    let batch: Vec<Span> = (0..3)
        .map(|k| Span::new(rid, aid, first_seq + k, "step", Attributes::new()))
        .collect();
    let ids: Vec<String> = batch.iter().map(|s| s.span_id.clone()).collect();
    let stored = store.add_spans(batch).await.unwrap();
    assert_eq!(stored.len(), 3);
    ack(&format!("spans {rid} {aid} {}", ids.join(",")));
}

async fn dequeue(store: &SqliteLightningStore, rid: &str) -> String {
    let a = store.dequeue_rollout(Some("child")).await.unwrap().unwrap();
    assert_eq!(
        a.rollout.rollout_id, rid,
        "the child's queue holds only its rollout"
    );
    ack(&format!(
        "dequeue {rid} {} {}",
        a.attempt.attempt_id, a.attempt.sequence_id
    ));
    a.attempt.attempt_id
}

/// The child process: works until it is killed. Does nothing without the environment
/// variable (so a plain `cargo test --include-ignored` passes through it).
#[test]
#[ignore = "child process of sigkill_mid_run_loses_no_acknowledged_write"]
fn child_writer() {
    let Some(db) = std::env::var_os(DB_ENV) else {
        return;
    };
    let round: usize = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // No watchdog in the child: every unfinished attempt is left to the parent's rules.
        let store = SqliteLightningStore::open_with(
            &db,
            SqliteOptions {
                scan_debounce_seconds: 1e9,
                sweep_interval: None,
                synchronous_full: false,
                upgrade_schema: true,
            },
        )
        .unwrap();
        for i in 0..100_000usize {
            let r = store
                .enqueue_rollout(EnqueueRolloutRequest {
                    config: Some(config(i)),
                    ..EnqueueRolloutRequest::new(json!({"round": round, "i": i}))
                })
                .await
                .unwrap();
            let rid = r.rollout_id;
            ack(&format!("enqueue {rid} {i}"));
            let aid = dequeue(&store, &rid).await;
            match i % 4 {
                // Finished: succeeded.
                0 => {
                    spans(&store, &rid, &aid, 1).await;
                    store
                        .update_attempt(&rid, &aid, status(AttemptStatus::Succeeded))
                        .await
                        .unwrap();
                    ack(&format!("status {rid} {aid} succeeded"));
                }
                // Left running (spans arrived).
                1 => spans(&store, &rid, &aid, 1).await,
                // Left preparing (no span).
                2 => {}
                // Failed, retried, second attempt left running.
                _ => {
                    spans(&store, &rid, &aid, 1).await;
                    store
                        .update_attempt(&rid, &aid, status(AttemptStatus::Failed))
                        .await
                        .unwrap();
                    ack(&format!("status {rid} {aid} failed"));
                    let second = dequeue(&store, &rid).await;
                    spans(&store, &rid, &second, 4).await;
                }
            }
        }
    });
}

/// What the child acknowledged before it died.
#[derive(Debug, Default)]
struct Acks {
    /// rollout id → index `i` in the round.
    enqueued: BTreeMap<String, usize>,
    /// (rollout id, attempt id) → sequence id.
    dequeued: BTreeMap<(String, String), u32>,
    /// (rollout id, attempt id) → span ids.
    spans: BTreeMap<(String, String), BTreeSet<String>>,
    /// (rollout id, attempt id) → reported status.
    statuses: BTreeMap<(String, String), AttemptStatus>,
    lines: usize,
}

impl Acks {
    fn record(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let key = |p: &[&str]| (p[2].to_string(), p[3].to_string());
        match parts.get(1).copied() {
            Some("enqueue") => {
                self.enqueued
                    .insert(parts[2].to_string(), parts[3].parse().unwrap());
            }
            Some("dequeue") => {
                self.dequeued.insert(key(&parts), parts[4].parse().unwrap());
            }
            Some("spans") => {
                self.spans
                    .entry(key(&parts))
                    .or_default()
                    .extend(parts[4].split(',').map(str::to_string));
            }
            Some("status") => {
                self.statuses.insert(key(&parts), parts[4].parse().unwrap());
            }
            other => panic!("unknown ack {other:?} in {line:?}"),
        }
        self.lines += 1;
    }
}

/// Runs one child until it has acknowledged `kill_after` operations, kills it with SIGKILL and
/// returns every acknowledgement it printed.
fn run_child_and_kill(db: &Path, round: usize, kill_after: usize) -> Acks {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--nocapture",
            "--include-ignored",
        ])
        .env(DB_ENV, db)
        .env(ROUND_ENV, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut acks = Acks::default();
    let mut line = String::new();
    let mut killed = false;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        if n == 0 {
            break;
        }
        // Only complete lines count: a line cut by the kill was not acknowledged.
        if line.ends_with('\n') && line.starts_with("ACK ") {
            acks.record(line.trim_end());
        }
        if !killed && acks.lines >= kill_after {
            // Let the child get a varying way into its next operation (possibly committing
            // it without acknowledging it) before it dies.
            std::thread::sleep(Duration::from_micros((round as u64 * 397) % 3000));
            child.kill().unwrap();
            killed = true;
        }
    }
    let exit = child.wait().unwrap();
    assert!(
        killed,
        "round {round}: the child stopped by itself ({exit}) after {} acks",
        acks.lines
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit.signal(), Some(9), "round {round}: killed by SIGKILL");
    }
    acks
}

fn integrity_ok(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let fk_violations: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(fk_violations, 0);
}

fn of_round(rollouts: Vec<Rollout>, round: usize) -> Vec<Rollout> {
    rollouts
        .into_iter()
        .filter(|r| r.input["round"] == json!(round))
        .collect()
}

/// The verdict the watchdog must give an unfinished attempt of `rollout`.
fn expected_verdict(rollout: &Rollout) -> AttemptStatus {
    if rollout.config.timeout_seconds.is_some() {
        AttemptStatus::Timeout
    } else {
        AttemptStatus::Unresponsive
    }
}

/// Checks the reopened store after round `round`; returns how many attempts the watchdog
/// (or the first lazy scan) found unfinished.
async fn check_round(db: &Path, round: usize, acks: &Acks) -> usize {
    integrity_ok(db);
    let store = SqliteLightningStore::open_with(
        db,
        SqliteOptions {
            // Only the first operation scans lazily; `run_watchdog` does the rest.
            scan_debounce_seconds: 1e9,
            sweep_interval: None,
            synchronous_full: false,
            upgrade_schema: true,
        },
    )
    .unwrap();

    // 1. Every acknowledged write is there.
    for (rid, i) in &acks.enqueued {
        let r = store.get_rollout_by_id(rid).await.unwrap();
        let r = r.unwrap_or_else(|| panic!("round {round}: acked rollout {rid} lost"));
        assert_eq!(r.input, json!({"round": round, "i": i}));
        assert_eq!(r.config, config(*i));
    }
    for ((rid, aid), seq) in &acks.dequeued {
        let attempts = store.list_attempts(rid).await.unwrap();
        let a = attempts.iter().find(|a| &a.attempt_id == aid);
        let a = a.unwrap_or_else(|| panic!("round {round}: acked attempt {rid}/{aid} lost"));
        assert_eq!(a.sequence_id, *seq);
        assert_eq!(a.worker_id.as_deref(), Some("child"));
    }
    for ((rid, aid), ids) in &acks.spans {
        let stored: BTreeSet<String> = store
            .list_spans(rid, Some(aid))
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.span_id)
            .collect();
        assert!(
            ids.is_subset(&stored),
            "round {round}: acked spans of {rid}/{aid} lost: {ids:?} vs {stored:?}"
        );
    }
    for ((rid, aid), acked) in &acks.statuses {
        let attempts = store.list_attempts(rid).await.unwrap();
        let a = attempts.iter().find(|a| &a.attempt_id == aid).unwrap();
        assert_eq!(
            a.status, *acked,
            "round {round}: acked status of {rid}/{aid}"
        );
    }

    // 2. After the deadlines, the watchdog finishes every unfinished attempt by the rules.
    let rollouts = of_round(
        store
            .query_rollouts(RolloutQuery::all())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|r| r.rollout().clone())
            .collect(),
        round,
    );
    assert!(rollouts.len() >= acks.enqueued.len());
    let mut latest: BTreeMap<String, Attempt> = BTreeMap::new();
    let mut deadline = now_seconds();
    for r in &rollouts {
        if let Some(a) = store.get_latest_attempt(&r.rollout_id).await.unwrap() {
            if let Some(d) = lifecycle::watchdog_deadline(r, &a) {
                deadline = deadline.max(d);
            }
            latest.insert(r.rollout_id.clone(), a);
        }
    }
    let unfinished_before = latest.values().filter(|a| !a.status.is_finished()).count();
    let wait = (deadline - now_seconds()).max(0.0) + 0.05;
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    store.run_watchdog().await.unwrap();

    let mut requeued = BTreeSet::new();
    for r in &rollouts {
        let r = store
            .get_rollout_by_id(&r.rollout_id)
            .await
            .unwrap()
            .unwrap();
        let attempts = store.list_attempts(&r.rollout_id).await.unwrap();
        let Some(last) = attempts.last() else {
            assert_eq!(r.status, RolloutStatus::Queuing, "never dequeued");
            requeued.insert(r.rollout_id.clone());
            continue;
        };
        assert_eq!(attempts.len() as u32, last.sequence_id);
        let expected_rollout = match last.status {
            AttemptStatus::Succeeded => RolloutStatus::Succeeded,
            AttemptStatus::Failed | AttemptStatus::Timeout | AttemptStatus::Unresponsive => {
                if last.status != AttemptStatus::Failed {
                    assert_eq!(last.status, expected_verdict(&r), "{}", r.rollout_id);
                }
                if last.sequence_id < MAX_ATTEMPTS {
                    RolloutStatus::Requeuing
                } else {
                    RolloutStatus::Failed
                }
            }
            other => panic!(
                "round {round}: {}/{} still {other} after the watchdog",
                r.rollout_id, last.attempt_id
            ),
        };
        assert_eq!(
            r.status, expected_rollout,
            "round {round}: {}",
            r.rollout_id
        );
        if last.status == AttemptStatus::Timeout {
            assert!(last.end_time.is_some(), "timeout is final (Q8)");
        }
        if expected_rollout == RolloutStatus::Requeuing {
            requeued.insert(r.rollout_id.clone());
        }
        // Earlier attempts keep their status (the first of a retried rollout failed).
        for earlier in &attempts[..attempts.len() - 1] {
            assert_eq!(earlier.status, AttemptStatus::Failed);
        }
    }

    // 3. Requeued (and never dequeued) rollouts are dispatched again, history kept; finishing
    //    them leaves nothing for the next round.
    let mut dispatched = BTreeSet::new();
    while let Some(a) = store.dequeue_rollout(Some("parent")).await.unwrap() {
        let rid = a.rollout.rollout_id.clone();
        let history = store.list_attempts(&rid).await.unwrap();
        assert_eq!(history.len() as u32, a.attempt.sequence_id);
        assert_eq!(history.last().unwrap().attempt_id, a.attempt.attempt_id);
        store
            .update_attempt(
                &rid,
                &a.attempt.attempt_id,
                status(AttemptStatus::Succeeded),
            )
            .await
            .unwrap();
        dispatched.insert(rid);
    }
    assert_eq!(
        dispatched, requeued,
        "round {round}: requeued rollouts dispatched"
    );
    let open = store
        .query_rollouts(RolloutQuery::with_status(&[
            RolloutStatus::Queuing,
            RolloutStatus::Requeuing,
            RolloutStatus::Preparing,
            RolloutStatus::Running,
        ]))
        .await
        .unwrap();
    assert_eq!(open.total, 0, "round {round}: nothing left in flight");
    store.close().await.unwrap();
    unfinished_before
}

#[test]
fn sigkill_mid_run_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut unfinished = 0;
    for round in 0..ROUNDS {
        // Kill points vary from round to round (and fall anywhere within an operation).
        let kill_after = 12 + (round * 37) % 61;
        let acks = run_child_and_kill(&db, round, kill_after);
        assert!(acks.lines >= kill_after);
        let recovered = rt.block_on(check_round(&db, round, &acks));
        eprintln!(
            "round {round}: {} acks before SIGKILL, {} rollouts, {recovered} unfinished attempts \
             recovered",
            acks.lines,
            acks.enqueued.len()
        );
        unfinished += recovered;
    }
    assert!(
        unfinished > 0,
        "the runs left unfinished attempts to recover"
    );
}
