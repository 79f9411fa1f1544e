#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Integration tests of the SQLite backend: the generic conformance suite, persistence across
//! reopen, refusal of foreign or newer files, and atomic dequeue across tasks and connections.
//! Throughput is measured by `benches/store.rs` and `agl bench store`, not here.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agl_core::{
    AttemptStatus, Attributes, EnqueueRolloutRequest, NamedResources, Resource, RolloutConfig,
    RolloutMode, RolloutStatus, Span, WorkerStatus,
};
use agl_store::conformance::CASES;
use agl_store::{
    AttemptUpdate, LightningStore, RolloutQuery, RolloutUpdate, SpanQuery, SqliteLightningStore,
    SqliteOptions, StoreError,
};
use serde_json::json;

fn options() -> SqliteOptions {
    SqliteOptions {
        scan_debounce_seconds: 0.0,
        ..SqliteOptions::default()
    }
}

fn fresh(dir: &tempfile::TempDir, name: &str) -> SqliteLightningStore {
    SqliteLightningStore::open_with(dir.path().join(name), options()).unwrap()
}

fn succeeded() -> AttemptUpdate {
    AttemptUpdate {
        status: Some(AttemptStatus::Succeeded),
        ..AttemptUpdate::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (i, (name, case)) in CASES.iter().enumerate() {
        let store = fresh(&dir, &format!("case-{i}.db"));
        if let Err(e) = case(&store).await {
            failures.push(format!("{name}: {e}"));
        }
        store.close().await.unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

fn llm(endpoint: &str) -> NamedResources {
    let resource: Resource = serde_json::from_value(json!({
        "resource_type": "llm", "endpoint": endpoint, "model": "m"
    }))
    .unwrap();
    NamedResources::from([("main_llm".to_string(), resource)])
}

#[tokio::test]
async fn reopen_preserves_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    let v1 = store.add_resources(llm("http://a/v1")).await.unwrap();
    store
        .update_resources("fixed", llm("http://b/v1"))
        .await
        .unwrap();
    let fixed = store
        .update_resources("fixed", llm("http://c/v1"))
        .await
        .unwrap();
    assert_eq!(fixed.version, 2);
    let ids: Vec<String> = store
        .enqueue_many(
            (0..5)
                .map(|i| EnqueueRolloutRequest {
                    mode: Some(RolloutMode::Val),
                    metadata: Some(json!({"i": i}).as_object().unwrap().clone()),
                    ..EnqueueRolloutRequest::new(json!({"task": i}))
                })
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();
    // Work on the first one: two spans, a sequence counter at 7, a worker, success.
    let a = store.dequeue_rollout(Some("w-1")).await.unwrap().unwrap();
    assert_eq!(a.rollout.rollout_id, ids[0]);
    assert_eq!(a.rollout.resources_id.as_deref(), Some("fixed"));
    let (rid, aid) = (a.rollout.rollout_id.clone(), a.attempt.attempt_id.clone());
    store
        .add_spans(vec![
            Span::new(rid.as_str(), aid.as_str(), 7, "first", Attributes::new()),
            Span::new(rid.as_str(), aid.as_str(), 2, "second", Attributes::new()),
        ])
        .await
        .unwrap();
    store.update_attempt(&rid, &aid, succeeded()).await.unwrap();
    store
        .update_worker("w-2", Some(json!({"gpu": 1})))
        .await
        .unwrap();
    assert_eq!(
        store
            .get_next_span_sequence_id("ro-none", "at-x")
            .await
            .unwrap(),
        1
    );
    // Cancel the fourth (its queue entry becomes stale) and requeue the second by hand after
    // dequeuing it (it goes to the tail).
    store
        .update_rollout(
            &ids[3],
            RolloutUpdate {
                status: Some(RolloutStatus::Cancelled),
                ..RolloutUpdate::default()
            },
        )
        .await
        .unwrap();
    let second = store.dequeue_rollout(None).await.unwrap().unwrap();
    assert_eq!(second.rollout.rollout_id, ids[1]);
    store
        .update_rollout(
            &ids[1],
            RolloutUpdate {
                status: Some(RolloutStatus::Requeuing),
                ..RolloutUpdate::default()
            },
        )
        .await
        .unwrap();
    let rollouts_before = store.query_rollouts(RolloutQuery::all()).await.unwrap();
    let spans_before = store.list_spans(&rid, None).await.unwrap();
    let attempts_before = store.list_attempts(&rid).await.unwrap();
    let workers_before = store.list_workers().await.unwrap();
    let stats_before = store.statistics().await.unwrap();
    drop(store);

    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    assert_eq!(store.path(), path.as_path());
    assert_eq!(store.schema_version(), agl_store::sqlite::SCHEMA_VERSION);
    assert_eq!(
        store.query_rollouts(RolloutQuery::all()).await.unwrap(),
        rollouts_before
    );
    assert_eq!(store.list_spans(&rid, None).await.unwrap(), spans_before);
    let names: Vec<&str> = spans_before.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["second", "first"], "spans ordered by sequence_id");
    assert_eq!(store.list_attempts(&rid).await.unwrap(), attempts_before);
    assert_eq!(store.list_workers().await.unwrap(), workers_before);
    let w1 = store.get_worker_by_id("w-1").await.unwrap().unwrap();
    assert_eq!(w1.status, WorkerStatus::Idle);
    let stats = store.statistics().await.unwrap();
    assert_eq!(
        (
            stats.total_rollouts,
            stats.total_attempts,
            stats.total_spans
        ),
        (
            stats_before.total_rollouts,
            stats_before.total_attempts,
            stats_before.total_spans
        )
    );
    assert_eq!(stats.rollouts_by_status, stats_before.rollouts_by_status);
    // Sequence counters continue where they were (rollout and unknown rollout).
    assert_eq!(
        store.get_next_span_sequence_id(&rid, &aid).await.unwrap(),
        8
    );
    assert_eq!(
        store
            .get_next_span_sequence_id("ro-none", "at-x")
            .await
            .unwrap(),
        2
    );
    // Resources, including which one is the latest.
    assert_eq!(
        store.get_latest_resources().await.unwrap(),
        Some(fixed.clone())
    );
    assert_eq!(
        store.get_resources_by_id(&v1.resources_id).await.unwrap(),
        Some(v1)
    );
    // Queue order: 3 and 5, the stale entry of the cancelled 4 skipped, then the requeued 2
    // with its attempt history.
    let mut order = Vec::new();
    while let Some(a) = store.dequeue_rollout(None).await.unwrap() {
        order.push((a.rollout.rollout_id, a.attempt.sequence_id));
    }
    assert_eq!(
        order,
        vec![
            (ids[2].clone(), 1),
            (ids[4].clone(), 1),
            (ids[1].clone(), 2)
        ]
    );
    assert_eq!(
        store.list_attempts(&ids[1]).await.unwrap()[0],
        second.attempt
    );
}

#[tokio::test]
async fn newer_schema_is_refused_and_left_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let store = SqliteLightningStore::open(&path).unwrap();
    store.close().await.unwrap();
    drop(store);
    let newer = agl_store::sqlite::SCHEMA_VERSION + 1;
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", newer).unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteLightningStore::open(&path).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(msg.contains(&format!("schema version {newer}")), "{msg}");
    assert!(
        msg.contains(&format!(
            "version {} that",
            agl_store::sqlite::SCHEMA_VERSION
        )),
        "{msg}"
    );
    assert!(msg.contains("new.db"), "names the file: {msg}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

/// What versions 2 and 3 of the schema changed, undone: a store back at version 1.
const DOWNGRADE_TO_V1: &str = "
    CREATE INDEX spans_by_rollout ON spans(rollout_seq, seq);
    DROP INDEX rollouts_by_start;
    DROP INDEX rollouts_by_end;
    DROP INDEX rollouts_by_mode_start;
    PRAGMA user_version = 1;
    PRAGMA wal_checkpoint(TRUNCATE);
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_store_is_migrated_and_answers_as_before() {
    // Also opened without the upgrade (`upgrade_schema: false`), which leaves it at version 1.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    let requests = (0..12)
        .map(|i| EnqueueRolloutRequest {
            mode: [Some(RolloutMode::Train), Some(RolloutMode::Val), None][i % 3],
            ..EnqueueRolloutRequest::new(json!(i))
        })
        .collect();
    store.enqueue_many(requests).await.unwrap();
    let dequeued = store.dequeue_many(7, Some("w-1")).await.unwrap();
    // Spans of two rollouts, interleaved, with sequence ids out of insertion order.
    let mut span_queries = Vec::new();
    for a in dequeued.iter().take(2) {
        span_queries.push(SpanQuery::of(&a.rollout.rollout_id, None));
        span_queries.push(SpanQuery::of(
            &a.rollout.rollout_id,
            Some(&a.attempt.attempt_id),
        ));
    }
    for k in 0..6i64 {
        for a in dequeued.iter().take(2) {
            // k = 4 names an attempt that does not exist: refused, nothing stored.
            let attempt = if k == 4 {
                "other"
            } else {
                a.attempt.attempt_id.as_str()
            };
            let result = store
                .add_span(Span::new(
                    a.rollout.rollout_id.as_str(),
                    attempt,
                    10 - k,
                    &format!("s{k}"),
                    Attributes::new(),
                ))
                .await;
            assert_eq!(result.is_ok(), k != 4, "{result:?}");
        }
    }
    for a in dequeued.iter().step_by(2) {
        store
            .update_attempt(&a.rollout.rollout_id, &a.attempt.attempt_id, succeeded())
            .await
            .unwrap();
    }
    let mut spans_before = Vec::new();
    for q in &span_queries {
        let page = store.query_spans(q.clone()).await.unwrap();
        spans_before.push(page);
    }
    assert_eq!(spans_before[0].items.len(), 5, "{:?}", spans_before[0]);
    let pages = [
        RolloutQuery::all(),
        RolloutQuery {
            status_in: Some(vec![RolloutStatus::Succeeded]),
            sort: agl_store::Sort::desc("start_time"),
            ..RolloutQuery::default()
        },
        RolloutQuery {
            mode_in: Some(vec![RolloutMode::Val]),
            sort: agl_store::Sort::desc("end_time"),
            window: agl_store::Window {
                limit: Some(3),
                offset: 1,
            },
            ..RolloutQuery::default()
        },
    ];
    let mut before = Vec::new();
    for q in &pages {
        before.push(store.query_rollouts(q.clone()).await.unwrap());
    }
    let stats = store.statistics().await.unwrap();
    store.close().await.unwrap();
    drop(store);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(DOWNGRADE_TO_V1).unwrap();
    }

    // Opened as it is, it stays a version 1 store and answers the same.
    let as_is = SqliteLightningStore::open_with(
        &path,
        SqliteOptions {
            upgrade_schema: false,
            ..options()
        },
    )
    .unwrap();
    assert_eq!(as_is.schema_version(), 1);
    for (q, page) in span_queries.iter().zip(&spans_before) {
        assert_eq!(&as_is.query_spans(q.clone()).await.unwrap(), page, "{q:?}");
    }
    for (q, page) in pages.iter().zip(&before) {
        assert_eq!(
            &as_is.query_rollouts(q.clone()).await.unwrap(),
            page,
            "{q:?}"
        );
    }
    as_is.close().await.unwrap();
    drop(as_is);
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1, "not upgraded");

    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    assert_eq!(store.schema_version(), agl_store::sqlite::SCHEMA_VERSION);
    for (q, page) in pages.iter().zip(&before) {
        assert_eq!(
            &store.query_rollouts(q.clone()).await.unwrap(),
            page,
            "{q:?}"
        );
    }
    for (q, page) in span_queries.iter().zip(&spans_before) {
        assert_eq!(&store.query_spans(q.clone()).await.unwrap(), page, "{q:?}");
    }
    let mut after = store.statistics().await.unwrap();
    after.uptime = stats.uptime;
    assert_eq!(after, stats);
    // The migrated store goes on: a new rollout and a finished one.
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("new")))
        .await
        .unwrap();
    let a = store.dequeue_rollout(None).await.unwrap().unwrap();
    store
        .update_attempt(&a.rollout.rollout_id, &a.attempt.attempt_id, succeeded())
        .await
        .unwrap();
    let stats = store.statistics().await.unwrap();
    assert_eq!(stats.total_rollouts, 13);
    assert_eq!(stats.rollouts_by_status[&RolloutStatus::Succeeded], 5);
    let page = store
        .query_rollouts(RolloutQuery::with_status(&[RolloutStatus::Queuing]))
        .await
        .unwrap();
    assert_eq!((page.total, page.items.len()), (5, 5));
    store.close().await.unwrap();
}

fn wal_and_shm_absent(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    !PathBuf::from(wal).exists() && !PathBuf::from(shm).exists()
}

#[test]
fn garbage_file_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = SqliteLightningStore::open(&path).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("not a SQLite database"), "{msg}");
    assert!(msg.contains("notes.txt"), "names the file: {msg}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
    assert!(wal_and_shm_absent(&path));
}

#[test]
fn foreign_sqlite_database_is_refused_and_left_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.sqlite");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT);")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = SqliteLightningStore::open(&path).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("not an agl store"), "{msg}");
    assert!(msg.contains("other.sqlite"), "names the file: {msg}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(wal_and_shm_absent(&path));
}

#[test]
fn missing_directory_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/s.db");
    let msg = SqliteLightningStore::open(&path).unwrap_err().to_string();
    assert!(msg.contains("no/such/dir/s.db"), "{msg}");
}

async fn drain(store: Arc<dyn LightningStore>, worker: String) -> Vec<String> {
    let mut got = Vec::new();
    while let Some(a) = store.dequeue_rollout(Some(&worker)).await.unwrap() {
        store
            .update_attempt(&a.rollout.rollout_id, &a.attempt.attempt_id, succeeded())
            .await
            .unwrap();
        got.push(a.rollout.rollout_id);
    }
    got
}

fn assert_each_once(results: Vec<Vec<String>>, expected: &[String]) {
    let mut seen = HashSet::new();
    for id in results.into_iter().flatten() {
        assert!(seen.insert(id.clone()), "rollout {id} dispatched twice");
    }
    assert_eq!(seen.len(), expected.len(), "every rollout dispatched once");
    assert!(expected.iter().all(|id| seen.contains(id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dequeue_from_eight_tasks_never_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn LightningStore> = Arc::new(fresh(&dir, "c.db"));
    let ids: Vec<String> = store
        .enqueue_many(
            (0..400)
                .map(|i| EnqueueRolloutRequest::new(json!(i)))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|w| tokio::spawn(drain(Arc::clone(&store), format!("w-{w}"))))
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_each_once(results, &ids);
    let done = store
        .wait_for_rollouts(&ids, Some(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(done.len(), ids.len());
    assert!(done.iter().all(|r| r.status == RolloutStatus::Succeeded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_on_one_file_never_dequeue_the_same_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a: Arc<dyn LightningStore> =
        Arc::new(SqliteLightningStore::open_with(&path, options()).unwrap());
    let b: Arc<dyn LightningStore> =
        Arc::new(SqliteLightningStore::open_with(&path, options()).unwrap());
    let ids: Vec<String> = a
        .enqueue_many(
            (0..300)
                .map(|i| EnqueueRolloutRequest::new(json!(i)))
                .collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.rollout_id)
        .collect();
    let mut tasks = Vec::new();
    for w in 0..4 {
        tasks.push(tokio::spawn(drain(Arc::clone(&a), format!("a-{w}"))));
        tasks.push(tokio::spawn(drain(Arc::clone(&b), format!("b-{w}"))));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_each_once(results, &ids);
    // What one connection wrote, the other reads.
    let stats = b.statistics().await.unwrap();
    assert_eq!(stats.total_attempts, 300);
    assert_eq!(stats.rollouts_by_status[&RolloutStatus::Succeeded], 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_sees_rollouts_finished_by_another_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wait.db");
    let a = SqliteLightningStore::open_with(&path, options()).unwrap();
    let b = SqliteLightningStore::open_with(&path, options()).unwrap();
    let r = a
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .unwrap();
    let ids = vec![r.rollout_id.clone()];
    let waiter = tokio::spawn(async move {
        let done = a
            .wait_for_rollouts(&ids, Some(Duration::from_secs(20)))
            .await
            .unwrap();
        done.len()
    });
    let got = b.dequeue_rollout(None).await.unwrap().unwrap();
    b.update_attempt(&got.rollout.rollout_id, "latest", succeeded())
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap(), 1);
}

#[tokio::test]
async fn close_checkpoints_and_refuses_later_operations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closed.db");
    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("kept")))
        .await
        .unwrap();
    store.close().await.unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal_len = std::fs::metadata(PathBuf::from(wal))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(wal_len, 0, "the WAL was checkpointed and truncated");
    assert_eq!(
        store.get_rollout_by_id(&r.rollout_id).await.unwrap_err(),
        StoreError::Closed
    );
    assert_eq!(
        store.dequeue_rollout(None).await.unwrap_err(),
        StoreError::Closed
    );
    store.close().await.unwrap();
    drop(store);
    // The file alone holds the data.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM rollouts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn corrupt_row_is_reported_with_table_and_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.db");
    let store = SqliteLightningStore::open_with(&path, options()).unwrap();
    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute(
            "UPDATE rollouts SET config = '{not json' WHERE rollout_id = ?1",
            [&r.rollout_id],
        )
        .unwrap();
    }
    let err = store.get_rollout_by_id(&r.rollout_id).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(
        msg.contains("rollouts") && msg.contains(&r.rollout_id),
        "{msg}"
    );
    assert!(msg.contains("config"), "{msg}");
}

#[tokio::test]
async fn background_sweeper_times_out_without_requests() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteLightningStore::open_with(
        dir.path().join("sweep.db"),
        SqliteOptions {
            scan_debounce_seconds: 3600.0,
            sweep_interval: Some(Duration::from_millis(50)),
            synchronous_full: true,
            upgrade_schema: true,
        },
    )
    .unwrap();
    let a = store
        .start_rollout(
            EnqueueRolloutRequest {
                config: Some(RolloutConfig {
                    timeout_seconds: Some(0.1),
                    ..RolloutConfig::default()
                }),
                ..EnqueueRolloutRequest::new(json!(1))
            },
            None,
        )
        .await
        .unwrap();
    let rid = a.rollout.rollout_id;
    // The lazy scan already ran once (first call) and is debounced for an hour: only the
    // background sweeper can notice the timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stats = store.statistics().await.unwrap();
        if stats.attempts_by_status[&AttemptStatus::Timeout] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sweeper never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = store.get_rollout_by_id(&rid).await.unwrap().unwrap();
    assert_eq!(r.status, RolloutStatus::Failed);
}
