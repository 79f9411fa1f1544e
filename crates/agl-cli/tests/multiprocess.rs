//! Multi-process training through `agl store`: a trainer and two `agl runner` processes share
//! one store server; one runner is killed with SIGKILL while it holds an attempt. Its attempt
//! must become `unresponsive`, the other runner must retry the rollout, and the training must
//! finish with every rollout terminal and the same results as an in-process run.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use agl_core::{AttemptStatus, RolloutStatus, WorkerStatus};
use agl_server::StoreClient;
use agl_store::{LightningStore, RolloutQuery};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;
use common::{Reaper, agl_command as agl, start_store};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn start_runner(url: &str) -> Reaper {
    Reaper(
        agl()
            .args(["runner", "--store-url", url, "--workers", "1"])
            .arg("--max-idle-ms")
            .arg("5")
            .arg("--data")
            .arg(data())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

const TRAIN_ARGS: &[&str] = &[
    "--limit",
    "48",
    "--dev-limit",
    "40",
    "--epochs",
    "2",
    "--batch-questions",
    "16",
    "--seed",
    "5",
];

fn report_without_timing(path: &Path) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("seconds");
    let runs = v["runs"].as_object_mut().unwrap();
    for run in runs.values_mut() {
        run["train"]
            .as_object_mut()
            .unwrap()
            .remove("rollouts_per_second");
        // The kernel's statistics are the trainer's own (null when runner processes held the
        // kernels): measurements, not results.
        run.as_object_mut().unwrap().remove("kernel");
    }
    // The in-process run reports its worker count; the remote one ran with none in-process.
    v["config"]["train"]
        .as_object_mut()
        .unwrap()
        .remove("workers");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_runner_attempts_become_unresponsive_and_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, url) = start_store(&["--scan-debounce", "0"]);
    let client = StoreClient::new(&url).unwrap();
    let victim = start_runner(&url);
    let _survivor = start_runner(&url);
    let victim_worker = format!("Worker-{}-0", victim.0.id());

    let report = dir.path().join("remote.json");
    let mut trainer = Reaper(
        agl()
            .arg("train")
            .args(TRAIN_ARGS)
            .args(["--store-url", &url, "--workers", "0"])
            .args(["--unresponsive-seconds", "1.5"])
            .arg("--report")
            .arg(&report)
            .arg("--data")
            .arg(data())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    // Freeze the victim; if it holds an attempt (its worker is busy) kill it, otherwise let it
    // go on and try again. SIGSTOP first makes "holds an attempt" a stable observation.
    let deadline = Instant::now() + Duration::from_secs(120);
    let killed_attempt = loop {
        assert!(
            Instant::now() < deadline,
            "never caught the victim mid-rollout"
        );
        assert!(
            trainer.0.try_wait().unwrap().is_none(),
            "training ended before the victim could be killed"
        );
        tokio::time::sleep(Duration::from_millis(15)).await;
        signal(&victim.0, Signal::SIGSTOP);
        // Long enough for a report the victim sent just before the stop to reach the store.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let worker = client.get_worker_by_id(&victim_worker).await.unwrap();
        match worker {
            Some(w) if w.status == WorkerStatus::Busy && w.current_attempt_id.is_some() => {
                signal(&victim.0, Signal::SIGKILL);
                break (w.current_rollout_id.unwrap(), w.current_attempt_id.unwrap());
            }
            _ => signal(&victim.0, Signal::SIGCONT),
        }
    };

    // The training completes with the survivor alone.
    let started = Instant::now();
    let status = loop {
        if let Some(s) = trainer.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "training did not finish after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "agl train failed after a runner was killed"
    );

    // The killed attempt is unresponsive; the rollout was retried by the survivor and
    // succeeded.
    let (rollout_id, attempt_id) = killed_attempt;
    let attempts = client.list_attempts(&rollout_id).await.unwrap();
    let dead = attempts
        .iter()
        .find(|a| a.attempt_id == attempt_id)
        .expect("the killed attempt is stored");
    assert_eq!(dead.status, AttemptStatus::Unresponsive, "{attempts:?}");
    assert_eq!(dead.worker_id.as_deref(), Some(victim_worker.as_str()));
    let last = attempts.last().unwrap();
    assert!(last.sequence_id > dead.sequence_id, "{attempts:?}");
    assert_eq!(last.status, AttemptStatus::Succeeded);
    assert_ne!(last.worker_id.as_deref(), Some(victim_worker.as_str()));
    let rollout = client
        .get_rollout_by_id(&rollout_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rollout.status, RolloutStatus::Succeeded);

    // Every rollout is terminal (succeeded: the survivor retried whatever the victim held).
    let all = client.query_rollouts(RolloutQuery::all()).await.unwrap();
    assert!(all.total >= 48 * 8 * 2, "{} rollouts", all.total);
    let unfinished: Vec<_> = all
        .items
        .iter()
        .filter(|r| r.rollout().status != RolloutStatus::Succeeded)
        .map(|r| (r.rollout().rollout_id.clone(), r.rollout().status))
        .collect();
    assert!(unfinished.is_empty(), "not succeeded: {unfinished:?}");

    // The results equal an in-process run with the same seed: where a rollout ran does not
    // change what it computed.
    let local = dir.path().join("local.json");
    let o = agl()
        .arg("train")
        .args(TRAIN_ARGS)
        .arg("--report")
        .arg(&local)
        .arg("--data")
        .arg(data())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        report_without_timing(&report),
        report_without_timing(&local)
    );
}

#[test]
fn trainer_spawned_runner_processes_give_the_in_process_results() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let path = dir.path().join(format!("{name}.json"));
        let o = agl()
            .arg("train")
            .args(TRAIN_ARGS)
            .args(extra)
            .arg("--report")
            .arg(&path)
            .arg("--data")
            .arg(data())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        report_without_timing(&path)
    };
    let spawned = run("spawned", &["--runner-processes", "2", "--workers", "1"]);
    let local = run("local", &["--workers", "2"]);
    assert_eq!(spawned, local);
}

#[test]
fn runner_without_a_server_fails_with_one_line() {
    let o = agl()
        .args([
            "runner",
            "--store-url",
            "http://127.0.0.1:9",
            "--connect-timeout",
            "0.3",
        ])
        .arg("--data")
        .arg(data())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("http://127.0.0.1:9") && err.contains("did not answer"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_server_gracefully_and_keeps_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.sqlite");
    let mut child = agl()
        .args(["store", "--port", "0", "--db"])
        .arg(&db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("SQLite"), "{line}");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let client = StoreClient::new(&url).unwrap();
    let requests = (0..50)
        .map(|i| agl_core::EnqueueRolloutRequest::new(serde_json::json!(i)))
        .collect();
    client.enqueue_many(requests).await.unwrap();
    signal(&child, Signal::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agl store stopped"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = agl_store::SqliteLightningStore::open(&db).unwrap();
    let page = store.query_rollouts(RolloutQuery::all()).await.unwrap();
    assert_eq!(page.total, 50);
    store.close().await.unwrap();
}

#[test]
fn store_refuses_a_foreign_db_file_with_one_line_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("notes.txt");
    std::fs::write(&db, b"not a database at all, just some text").unwrap();
    let o = agl()
        .args(["store", "--port", "0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("notes.txt"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        b"not a database at all, just some text"
    );
}
