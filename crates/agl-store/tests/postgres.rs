#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The PostgreSQL backend against a real server: `scripts/ci/postgres.sh` starts a throwaway
//! cluster and runs these tests with `AGL_TEST_POSTGRES_URL` set (they fail without it: the
//! `postgres-tests` feature was asked for, so skipping would hide that nothing ran).

use agl_store::LightningStore;
use agl_store::conformance::CASES;
use agl_store::postgres::{
    PostgresLightningStore, PostgresOptions, PostgresUrl, SCHEMA_VERSION, prepare, schema_name,
};
use tokio_postgres::{Client, NoTls};

fn url() -> String {
    std::env::var("AGL_TEST_POSTGRES_URL")
        .expect("AGL_TEST_POSTGRES_URL is not set: run these tests through scripts/ci/postgres.sh")
}

/// A fresh store in its own partition, as the conformance suite wants it (debounce 0, no
/// background sweeper).
async fn fresh_store(what: &str) -> PostgresLightningStore {
    let spec = format!("{}?partition={}", url(), fresh_partition(what));
    let url: PostgresUrl = spec.parse().unwrap();
    PostgresLightningStore::open(
        &url,
        PostgresOptions {
            scan_debounce_seconds: 0.0,
            sweep_interval: None,
            ..PostgresOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("opening {spec}: {e}"))
}

async fn connect() -> Client {
    let url = url();
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A partition no other test (or earlier run) uses.
fn fresh_partition(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}_{}_{nanos}", std::process::id())
}

async fn meta_version(client: &Client, schema: &str) -> String {
    client
        .query_one(
            &format!("SELECT value FROM {schema}.agl_meta WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_new_partition_is_created_then_reopened_as_it_is() {
    let mut client = connect().await;
    let schema = schema_name(&fresh_partition("new")).unwrap();
    assert_eq!(prepare(&mut client, &schema).await.unwrap(), 0);
    assert_eq!(
        meta_version(&client, &schema).await,
        SCHEMA_VERSION.to_string()
    );
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 8, "seven store tables and agl_meta");
    assert_eq!(prepare(&mut client, &schema).await.unwrap(), SCHEMA_VERSION);
}

#[tokio::test]
async fn a_schema_that_is_not_a_store_is_refused_untouched() {
    let mut client = connect().await;
    let schema = schema_name(&fresh_partition("foreign")).unwrap();
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.users (name TEXT); \
             INSERT INTO {schema}.users VALUES ('ada');"
        ))
        .await
        .unwrap();
    let e = prepare(&mut client, &schema).await.unwrap_err().to_string();
    assert!(e.contains("not an agl store") && e.contains("users"), "{e}");
    let rows: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, ["users"]);
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {schema}.users"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_newer_store_is_refused_untouched() {
    let mut client = connect().await;
    let schema = schema_name(&fresh_partition("newer")).unwrap();
    prepare(&mut client, &schema).await.unwrap();
    client
        .execute(
            &format!("UPDATE {schema}.agl_meta SET value = '99' WHERE key = 'schema_version'"),
            &[],
        )
        .await
        .unwrap();
    let e = prepare(&mut client, &schema).await.unwrap_err().to_string();
    assert!(e.contains("schema version 99, newer than"), "{e}");
    assert_eq!(meta_version(&client, &schema).await, "99");
}

#[tokio::test]
async fn servers_opening_one_new_store_at_once_create_it_once() {
    let schema = schema_name(&fresh_partition("race")).unwrap();
    let mut opens = Vec::new();
    for _ in 0..6 {
        let schema = schema.clone();
        opens.push(tokio::spawn(async move {
            let mut client = connect().await;
            prepare(&mut client, &schema).await
        }));
    }
    let mut created = 0;
    for open in opens {
        match open.await.unwrap() {
            Ok(0) => created += 1,
            Ok(v) => assert_eq!(v, SCHEMA_VERSION),
            Err(e) => panic!("a concurrent open failed: {e}"),
        }
    }
    assert_eq!(created, 1, "exactly one opener creates the store");
}

#[tokio::test]
async fn partitions_are_separate_stores() {
    let mut client = connect().await;
    let (a, b) = (
        schema_name(&fresh_partition("a")).unwrap(),
        schema_name(&fresh_partition("b")).unwrap(),
    );
    prepare(&mut client, &a).await.unwrap();
    prepare(&mut client, &b).await.unwrap();
    client
        .execute(
            &format!(
                "INSERT INTO {a}.rollouts (rollout_id, input, start_time, status, config) \
                 VALUES ('ro-1', 'null', 0, 'queuing', '{{}}')"
            ),
            &[],
        )
        .await
        .unwrap();
    let count = |s: String| {
        let client = &client;
        async move {
            client
                .query_one(&format!("SELECT count(*) FROM {s}.rollouts"), &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    assert_eq!(count(a).await, 1);
    assert_eq!(count(b).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes() {
    let mut failures = Vec::new();
    for (name, case) in CASES {
        let store = fresh_store("conf").await;
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

/// Three servers' stores on one partition (each its own pool), as `agl store` processes
/// sharing a database have.
async fn three_servers(what: &str) -> Vec<std::sync::Arc<PostgresLightningStore>> {
    let spec = format!("{}?partition={}", url(), fresh_partition(what));
    let url: PostgresUrl = spec.parse().unwrap();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let options = PostgresOptions {
            scan_debounce_seconds: f64::INFINITY,
            sweep_interval: None,
            pool_size: 4,
            ..PostgresOptions::default()
        };
        stores.push(std::sync::Arc::new(
            PostgresLightningStore::open(&url, options).await.unwrap(),
        ));
    }
    stores
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_never_dequeue_one_rollout_twice() {
    let stores = three_servers("claims").await;
    let requests = (0..120)
        .map(|i| agl_core::EnqueueRolloutRequest::new(serde_json::json!(i)))
        .collect();
    let enqueued = stores[0].enqueue_many(requests).await.unwrap();
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for w in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let worker = format!("s{s}-w{w}");
                let mut got = Vec::new();
                while let Some(a) = store.dequeue_rollout(Some(&worker)).await.unwrap() {
                    got.push(a.rollout.rollout_id);
                }
                got
            }));
        }
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.unwrap());
    }
    let mut unique = claimed.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), claimed.len(), "a rollout was dequeued twice");
    let mut ids: Vec<String> = enqueued.into_iter().map(|r| r.rollout_id).collect();
    ids.sort();
    assert_eq!(unique, ids, "every rollout dequeued exactly once");
    let stats = stores[2].statistics().await.unwrap();
    assert_eq!(stats.total_attempts, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_issue_each_span_sequence_id_once() {
    let stores = three_servers("sequences").await;
    let r = stores[0]
        .start_rollout(
            agl_core::EnqueueRolloutRequest::new(serde_json::json!(1)),
            None,
        )
        .await
        .unwrap();
    let (rid, aid) = (r.rollout.rollout_id, r.attempt.attempt_id);
    let mut tasks = Vec::new();
    for store in &stores {
        for _ in 0..3 {
            let (store, rid, aid) = (store.clone(), rid.clone(), aid.clone());
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..20 {
                    if i % 4 == 0 {
                        let first = store
                            .get_next_span_sequence_ids(&rid, &aid, 3)
                            .await
                            .unwrap();
                        got.extend(first..first + 3);
                    } else {
                        got.push(store.get_next_span_sequence_id(&rid, &aid).await.unwrap());
                    }
                }
                got
            }));
        }
    }
    let mut issued = Vec::new();
    for t in tasks {
        issued.extend(t.await.unwrap());
    }
    issued.sort_unstable();
    let expected: Vec<i64> = (1..=issued.len() as i64).collect();
    assert_eq!(issued, expected, "ids 1..=n, each once");
}

/// Sweeping is idempotent: three servers scanning at once move each due attempt exactly once
/// (each verdict is re-judged under the row lock, rows another server holds are skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_sweeping_at_once_time_out_each_attempt_once() {
    let stores = three_servers("sweep").await;
    let config = agl_core::RolloutConfig {
        timeout_seconds: Some(0.05),
        max_attempts: 2,
        retry_condition: vec![agl_core::AttemptStatus::Timeout],
        ..agl_core::RolloutConfig::default()
    };
    let requests = (0..60)
        .map(|i| agl_core::EnqueueRolloutRequest {
            config: Some(config.clone()),
            ..agl_core::EnqueueRolloutRequest::new(serde_json::json!(i))
        })
        .collect();
    stores[0].enqueue_many(requests).await.unwrap();
    while stores[1]
        .dequeue_rollout(Some("w"))
        .await
        .unwrap()
        .is_some()
    {}
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut sweeps = Vec::new();
    for store in &stores {
        for _ in 0..2 {
            let store = store.clone();
            sweeps.push(tokio::spawn(
                async move { store.run_watchdog().await.unwrap() },
            ));
        }
    }
    let mut moved = 0;
    for s in sweeps {
        moved += s.await.unwrap();
    }
    // Rows a sweep skipped because another held them were moved by that other one; a later
    // scan finds nothing left to move.
    moved += stores[2].run_watchdog().await.unwrap();
    assert_eq!(moved, 60, "each of the 60 attempts moved once");
    let stats = stores[0].statistics().await.unwrap();
    assert_eq!(
        stats.attempts_by_status[&agl_core::AttemptStatus::Timeout],
        60
    );
    assert_eq!(
        stats.rollouts_by_status[&agl_core::RolloutStatus::Requeuing],
        60
    );
    assert_eq!(
        stats.total_attempts, 60,
        "no attempt was created by a sweep"
    );
    assert_eq!(stores[1].run_watchdog().await.unwrap(), 0);
}

#[tokio::test]
async fn an_open_that_must_not_create_refuses_a_missing_store_and_creates_nothing() {
    let client = connect().await;
    let partition = fresh_partition("nocreate");
    let schema = schema_name(&partition).unwrap();
    let url: PostgresUrl = format!("{}?partition={partition}", url()).parse().unwrap();
    let look = || PostgresOptions {
        sweep_interval: None,
        create_missing: false,
        ..PostgresOptions::default()
    };
    let schema_exists = || async {
        client
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
            .await
            .unwrap()
            .is_some()
    };
    let e = PostgresLightningStore::open(&url, look())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no agl store") && e.contains("does not exist") && e.contains(&schema),
        "{e}"
    );
    assert!(!schema_exists().await, "nothing was created");
    // An empty schema is refused too, and left empty.
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let e = PostgresLightningStore::open(&url, look())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("is empty"), "{e}");
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "the empty schema stays empty");
    // Once a store exists there, the same open works and sees it.
    let created = PostgresLightningStore::open(&url, PostgresOptions::default())
        .await
        .unwrap();
    created
        .enqueue_rollout(agl_core::EnqueueRolloutRequest::new(serde_json::json!(1)))
        .await
        .unwrap();
    created.close().await.unwrap();
    let looked = PostgresLightningStore::open(&url, look()).await.unwrap();
    assert_eq!(looked.statistics().await.unwrap().total_rollouts, 1);
}

/// With a 10 s lazy-scan debounce and no calls, only the background sweeper (the async one)
/// can notice a 0.2 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_sweeper_times_out_attempts_without_any_call() {
    let spec = format!("{}?partition={}", url(), fresh_partition("sweeper"));
    let url: PostgresUrl = spec.parse().unwrap();
    let store = PostgresLightningStore::open(
        &url,
        PostgresOptions {
            scan_debounce_seconds: 10.0,
            sweep_interval: Some(std::time::Duration::from_millis(50)),
            ..PostgresOptions::default()
        },
    )
    .await
    .unwrap();
    let request = agl_core::EnqueueRolloutRequest {
        config: Some(agl_core::RolloutConfig {
            timeout_seconds: Some(0.2),
            ..agl_core::RolloutConfig::default()
        }),
        ..agl_core::EnqueueRolloutRequest::new(serde_json::json!("slow"))
    };
    store.start_rollout(request, None).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    // statistics() never runs the lazy scan.
    let stats = store.statistics().await.unwrap();
    assert_eq!(
        stats.attempts_by_status[&agl_core::AttemptStatus::Timeout],
        1,
        "{stats:?}"
    );
    assert_eq!(
        stats.rollouts_by_status[&agl_core::RolloutStatus::Failed],
        1,
        "{stats:?}"
    );
    store.close().await.unwrap();
}
